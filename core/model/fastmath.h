/*
 * fastmath.h: core-internal elementwise math that the compiler can vectorize (not part of zr.h).
 *
 * zr_expf(x): e^x without a libm call or a branch, so that a loop calling it vectorizes (SSE2,
 * or AVX2 in a target_clones copy). x = k ln2 + r with k = round(x / ln2) and |r| <= ln2 / 2
 * (Cody-Waite: ln2 split in a 16-bit head, exact in k * head, and a tail); e^r = 1 + r + r^2 q(r),
 * q a degree-4 polynomial fitted here for the least maximum relative error on [-0.35, 0.35]
 * (3.3e-9 in exact arithmetic: 0.06 ulp); then the result is scaled by 2^k in two exact steps,
 * 2^(k/2) and 2^(k - k/2), so that every k from -150 to 128 works without a branch: results
 * that overflow become +inf, results in the subnormal range round once, in the last step.
 *
 * Error, measured once over all 2^32 floats against e^x in double rounded to float (and
 * checked on a dense sample by tests/test_engine_parts.c on every build):
 *   - at most 1 ulp where e^x is a normal float (glibc's expf: 0.5 ulp, correctly rounded
 *     in practice); the relative error is at most 8.2e-8;
 *   - where e^x is subnormal (x < -87.34), at most one subnormal step (1.4e-45) off;
 *   - x <= -104 (e^x < 2^-150, which rounds to 0) gives 0, -inf included; x > 88.72 (e^x >
 *     FLT_MAX) gives +inf, +inf included; NaN gives NaN.
 * No operation here can be contracted into an FMA under -std=c11 (-ffp-contract=off), and none
 * is one, so a scalar, SSE2 and AVX2 copy of a loop give the same bits.
 */
#ifndef ZR_FASTMATH_H
#define ZR_FASTMATH_H

#include <stdint.h>
#include <string.h>

/*
 * ZR_VEC_CLONES on a hot elementwise function: GCC compiles it twice, for AVX2 (8 floats a
 * vector) and for the build's baseline (x86-64: SSE2, 4 floats), and picks one when the program
 * loads (an ifunc, from what the CPU reports), so the binary still runs on any x86-64. The two
 * copies give the same bits: AVX2 brings no FMA ("avx2" does not enable it, and -std=c11 keeps
 * contraction off), GCC does not reorder float sums without -ffast-math, and the loops that sum
 * spell their lanes out (eight partial sums), so the order is the code's, not the vector width's.
 * Elsewhere (other architectures, compilers without target_clones) it is empty, as it is with
 * -DZR_VEC_CLONES= (the baseline copy only).
 */
#if !defined(ZR_VEC_CLONES) && defined(__x86_64__) && defined(__linux__) && \
    defined(__has_attribute)
#if __has_attribute(target_clones)
#define ZR_VEC_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef ZR_VEC_CLONES
#define ZR_VEC_CLONES
#endif

static inline uint32_t zr__f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float zr__u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float zr_expf(float x)
{
    const float log2e = 0x1.715476p+0f;    /* 1 / ln 2 */
    const float ln2_hi = 0x1.62e4p-1f;     /* ln 2 to 16 bits: k * ln2_hi is exact */
    const float ln2_lo = 0x1.7f7d1cp-20f;  /* ln 2 - ln2_hi */
    const float shift = 0x1.8p23f;         /* adding it rounds to an integer (|v| < 2^22) */
    /* x clamped to [-104, 89], which keeps k in [-150, 128]; a NaN passes (its comparisons
     * are false). Selects through integer masks: a float ?: here becomes a branch that GCC 12
     * duplicates the following arithmetic into, and then it does not vectorize the loop. */
    uint32_t lo = -(uint32_t)(x < -104.0f), hi = -(uint32_t)(x > 89.0f);
    x = zr__u2f((zr__f2u(x) & ~(lo | hi)) | (zr__f2u(-104.0f) & lo) | (zr__f2u(89.0f) & hi));
    float kf = x * log2e + shift;
    int32_t k = (int32_t)(zr__f2u(kf) - zr__f2u(shift)); /* round(x / ln 2) */
    kf -= shift;
    float r = (x - kf * ln2_hi) - kf * ln2_lo;
    float q = 0x1.6a1a8ep-10f;
    q = q * r + 0x1.123fb6p-7f;
    q = q * r + 0x1.555916p-5f;
    q = q * r + 0x1.55548ap-3f;
    q = q * r + 0x1.fffffcp-2f;
    float p = 1.0f + (r + (r * r) * q); /* e^r, in [0.70, 1.42] */
    int32_t k1 = k / 2, k2 = k - k1;    /* each in [-75, 64]: 2^k1 and 2^k2 are normal */
    return p * zr__u2f((uint32_t)(k1 + 127) << 23) * zr__u2f((uint32_t)(k2 + 127) << 23);
}

#endif
