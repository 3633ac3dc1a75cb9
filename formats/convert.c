/*
 * convert.c: element conversion between f32, bf16 and f16 (zfmt_convert). f32 -> bf16 and
 * f32 -> f16 round to nearest, ties to even; NaN stays NaN (quieted), infinities stay
 * infinite, f16 subnormals are produced and read exactly, values beyond f16's range become
 * infinity. bf16 <-> f16 goes through f32, which is exact on the way in, so it rounds once.
 * Bit patterns are moved with memcpy: buffers need no alignment.
 */
#include "fmtutil.h"

#include <string.h>

static uint32_t f32_bits(const unsigned char *p)
{
    uint32_t x;
    memcpy(&x, p, 4);
    return x;
}

static uint16_t u16_bits(const unsigned char *p)
{
    uint16_t x;
    memcpy(&x, p, 2);
    return x;
}

static uint16_t f32_to_bf16(uint32_t x)
{
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((x >> 16) | 0x0040u);
    /* round to nearest even on the 16 dropped bits; overflow carries into infinity */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static uint32_t bf16_to_f32(uint16_t h) { return (uint32_t)h << 16; }

static uint16_t f32_to_f16(uint32_t x)
{
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x47800000u) /* >= 65536 (and infinity): beyond rounding range */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* normal in f16 (>= 2^-14) */
        /* rebias the exponent (127 -> 15) and keep 10 mantissa bits; a carry out of the
         * mantissa moves to the next exponent, and 65520 and above round to infinity */
        uint32_t r = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    if (ax < 0x33000000u) /* below 2^-25: rounds to zero (2^-25 itself is a tie, to even 0) */
        return sign;
    /* subnormal: value / 2^-24 = m * 2^(e - 126), e in [102, 112], so shift in [14, 24] */
    uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e, r = m >> shift, rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u)))
        r++; /* may become 0x400, the smallest normal: the right encoding */
    return (uint16_t)(sign | r);
}

static uint32_t f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) /* infinity or NaN (payload kept, so NaN stays NaN) */
        return sign | 0x7f800000u | (m << 13);
    if (e)
        return sign | ((e + 112) << 23) | (m << 13);
    if (!m)
        return sign;
    /* subnormal m * 2^-24: normalize so the leading bit lands on bit 10 */
    uint32_t e32 = 113;
    while (!(m & 0x400u)) {
        m <<= 1;
        e32--;
    }
    return sign | (e32 << 23) | ((m & 0x3ffu) << 13);
}

static int convertible(zck_dtype t) { return t == ZCK_F32 || t == ZCK_BF16 || t == ZCK_F16; }

int zfmt_convert(void *dst, zck_dtype dst_t, const void *src, zck_dtype src_t, size_t n)
{
    if ((unsigned)dst_t >= ZCK_DTYPE_COUNT || (unsigned)src_t >= ZCK_DTYPE_COUNT)
        return zr_err_set(ZR_EINVAL, "convert: unknown dtype %d or %d", (int)src_t, (int)dst_t);
    if (dst_t == src_t) {
        memmove(dst, src, n * zck_dtype_size(src_t));
        return 0;
    }
    if (!convertible(dst_t) || !convertible(src_t))
        return zr_err_set(ZR_EUNSUPPORTED, "convert: %s to %s is not supported (only between "
                          "f32, bf16 and f16)", zck_dtype_name(src_t), zck_dtype_name(dst_t));
    const unsigned char *s = src;
    unsigned char *d = dst;
    size_t ss = zck_dtype_size(src_t), ds = zck_dtype_size(dst_t);
    for (size_t i = 0; i < n; i++, s += ss, d += ds) {
        uint32_t f = src_t == ZCK_F32    ? f32_bits(s)
                     : src_t == ZCK_BF16 ? bf16_to_f32(u16_bits(s))
                                         : f16_to_f32(u16_bits(s));
        if (dst_t == ZCK_F32) {
            memcpy(d, &f, 4);
        } else {
            uint16_t h = dst_t == ZCK_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
            memcpy(d, &h, 2);
        }
    }
    return 0;
}
