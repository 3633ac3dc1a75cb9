/*
 * test_formats.c: the converters of formats/ (zfmt.h): element conversion against known values
 * and exhaustively, the GPT-2 layout and its config JSON, safetensors export read back by an
 * independent Python reader (tests/formats/st_read.py), imports from a hand-made Hugging Face
 * directory, from llm.c model files and from our own safetensors, and the refusal of damaged
 * sources and malformed files with messages that name what is wrong.
 */
#include "ckutil.h"
#include "zfmt.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>

static const zfmt_gpt2_config tiny = {2, 2, 8, 16, 11}; /* layers heads dim ctx vocab */

/* ---------------------------------------------------------------- small helpers */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to16(float f, zck_dtype t)
{
    uint16_t h;
    ZT_OK(zfmt_convert(&h, t, &f, ZCK_F32, 1));
    return h;
}

static uint32_t from16(uint16_t h, zck_dtype t)
{
    float f;
    ZT_OK(zfmt_convert(&f, ZCK_F32, &h, t, 1));
    return f2u(f);
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static void sha_hex(char out[65], const void *p, size_t n)
{
    zck_sha256 *h;
    ZT_OK(zck_sha256_new(&h));
    zck_sha256_update(h, p, n);
    zck_sha256_hex(h, out);
    zck_sha256_free(h);
}

static int have_python(void)
{
    return system("python3 -c 'import json, struct, hashlib' >/dev/null 2>&1") == 0;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ZT_CHECK(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)sz + 1);
    ZT_CHECK(p);
    ZT_CHECK(fread(p, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    p[sz] = 0;
    *n = (size_t)sz;
    return p;
}

static void spit(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    ZT_CHECK(f);
    ZT_CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
}

/* no entry of dir starts with prefix */
static void check_no_file_like(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    ZT_CHECK(d);
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, prefix, strlen(prefix)))
            ZT_FAIL("%s/%s left behind", dir, de->d_name);
    closedir(d);
}

/* ---------------------------------------------------------------- a GPT-2 checkpoint */

/* deterministic non-zero value of element i of (group g, state s) */
static float val(uint64_t seed, size_t g, size_t s, uint64_t i)
{
    uint64_t h = zt_mix(seed * 1000003 + g * 7919 + s * 104729 + i * 31 + 1);
    float v = (float)((double)(h >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    return v == 0.0f ? 0.5f : v;
}

static void val_fill(void *ctx, const zck_layout *L, size_t g, size_t s, uint64_t start,
                     uint64_t count, void *dst)
{
    (void)L;
    float *b = dst;
    for (uint64_t i = 0; i < count; i++)
        b[i] = val(*(const uint64_t *)ctx, g, s, start + i);
}

/* Save a checkpoint of layout L (GPT-2 config c) at step 5 by world ranks, as an engine would,
 * its elements from fill. */
static char *save_layout(const char *run, const zck_layout *L, const zfmt_gpt2_config *c,
                         uint32_t world, zt_fill_fn fill, void *ctx)
{
    char *model;
    ZT_OK(zfmt_gpt2_config_to_json(&model, c));
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = 5;
    o.world = world;
    o.zero_stage = 3;
    o.model_json = model;
    o.training_json = "{\"optimizer_step\":5}";
    char *final = zt_save_as(run, L, &o, fill, ctx);
    free(model);
    return final;
}

/* Save a GPT-2 checkpoint of config c (its own layout, f32 states) holding val. */
static char *save_gpt2(const char *run, const zfmt_gpt2_config *c, uint32_t world, uint64_t seed)
{
    zck_layout *L;
    ZT_OK(zfmt_gpt2_layout(&L, c));
    char *final = save_layout(run, L, c, world, val_fill, &seed);
    zck_layout_free(L);
    return final;
}

/* Elements of a whole tensor of a state (f32 states only), through zck_reader_read_range. */
static float *read_tensor(zck_reader *r, const char *name, const char *state,
                          zck_tensor_info *out)
{
    const zck_layout *L = zck_reader_layout(r);
    size_t s;
    ZT_OK(zck_layout_find_state(L, &s, state));
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++) {
            zck_tensor_info ti;
            zck_layout_tensor(L, g, t, &ti);
            if (strcmp(ti.name, name))
                continue;
            float *p = malloc(ti.numel * 4 + 4);
            ZT_CHECK(p);
            ZT_OK(zck_reader_read_range(r, g, s, ti.offset, ti.numel, p));
            if (out)
                *out = ti;
            return p;
        }
    ZT_FAIL("no tensor %s", name);
}

/* ---------------------------------------------------------------- conversion */

ZT_TEST(formats_convert_known_values)
{
    /* f32 -> bf16 */
    ZT_CHECK_EQ(to16(1.0f, ZCK_BF16), 0x3f80);
    ZT_CHECK_EQ(to16(-2.5f, ZCK_BF16), 0xc020);
    ZT_CHECK_EQ(to16(65504.0f, ZCK_BF16), 0x4780); /* 65504 needs 11 bits: rounds to 65536 */
    ZT_CHECK_EQ(to16(u2f(0x3f808000), ZCK_BF16), 0x3f80); /* tie, even below */
    ZT_CHECK_EQ(to16(u2f(0x3f818000), ZCK_BF16), 0x3f82); /* tie, even above */
    ZT_CHECK_EQ(to16(u2f(0x3f808001), ZCK_BF16), 0x3f81); /* just above the tie */
    ZT_CHECK_EQ(to16(u2f(0x3f807fff), ZCK_BF16), 0x3f80);
    ZT_CHECK_EQ(to16(u2f(0xbf818000), ZCK_BF16), 0xbf82); /* negative tie */
    ZT_CHECK_EQ(to16(INFINITY, ZCK_BF16), 0x7f80);
    ZT_CHECK_EQ(to16(-INFINITY, ZCK_BF16), 0xff80);
    ZT_CHECK_EQ(to16(u2f(0x7f7fffff), ZCK_BF16), 0x7f80); /* FLT_MAX rounds to infinity */
    ZT_CHECK_EQ(to16(1e-40f, ZCK_BF16), f2u(1e-40f) >> 16); /* subnormals keep their top bits */
    uint16_t nb = to16(NAN, ZCK_BF16);
    ZT_CHECK((nb & 0x7f80) == 0x7f80 && (nb & 0x7f));
    nb = to16(u2f(0x7f800001), ZCK_BF16); /* NaN whose payload is only in the dropped bits */
    ZT_CHECK((nb & 0x7f80) == 0x7f80 && (nb & 0x7f));
    nb = to16(u2f(0xffffffff), ZCK_BF16); /* all-ones NaN must not carry into the sign */
    ZT_CHECK((nb & 0x7f80) == 0x7f80 && (nb & 0x7f));
    /* bf16 -> f32 */
    ZT_CHECK_EQ(from16(0x3f80, ZCK_BF16), f2u(1.0f));
    ZT_CHECK_EQ(from16(0xc020, ZCK_BF16), f2u(-2.5f));
    ZT_CHECK_EQ(from16(0x7f80, ZCK_BF16), f2u(INFINITY));
    ZT_CHECK(isnan(u2f(from16(0x7fc0, ZCK_BF16))));

    /* f32 -> f16 */
    ZT_CHECK_EQ(to16(1.0f, ZCK_F16), 0x3c00);
    ZT_CHECK_EQ(to16(-2.5f, ZCK_F16), 0xc100);
    ZT_CHECK_EQ(to16(65504.0f, ZCK_F16), 0x7bff);
    ZT_CHECK_EQ(to16(65519.0f, ZCK_F16), 0x7bff); /* below the tie */
    ZT_CHECK_EQ(to16(65520.0f, ZCK_F16), 0x7c00); /* the tie rounds to even: infinity */
    ZT_CHECK_EQ(to16(1e6f, ZCK_F16), 0x7c00);
    ZT_CHECK_EQ(to16(-1e6f, ZCK_F16), 0xfc00);
    ZT_CHECK_EQ(to16(INFINITY, ZCK_F16), 0x7c00);
    ZT_CHECK_EQ(to16(-INFINITY, ZCK_F16), 0xfc00);
    ZT_CHECK_EQ(to16(0.0f, ZCK_F16), 0x0000);
    ZT_CHECK_EQ(to16(-0.0f, ZCK_F16), 0x8000);
    ZT_CHECK_EQ(to16(u2f(0x3f801000), ZCK_F16), 0x3c00); /* 1 + 2^-11: tie, even below */
    ZT_CHECK_EQ(to16(u2f(0x3f803000), ZCK_F16), 0x3c02); /* 1 + 3 * 2^-11: tie, even above */
    /* subnormals: the smallest is 2^-24 ~ 5.96e-8 */
    ZT_CHECK_EQ(to16(1e-8f, ZCK_F16), 0x0000);   /* 0.17 of the smallest: rounds to zero */
    ZT_CHECK_EQ(to16(-1e-8f, ZCK_F16), 0x8000);
    ZT_CHECK_EQ(to16(1e-7f, ZCK_F16), 0x0002);   /* 1.68 units */
    ZT_CHECK_EQ(to16(6e-8f, ZCK_F16), 0x0001);
    ZT_CHECK_EQ(to16(ldexpf(1, -24), ZCK_F16), 0x0001);
    ZT_CHECK_EQ(to16(ldexpf(1, -25), ZCK_F16), 0x0000);     /* half a unit: tie to even 0 */
    ZT_CHECK_EQ(to16(ldexpf(3, -26), ZCK_F16), 0x0001);     /* 0.75 units */
    ZT_CHECK_EQ(to16(ldexpf(3, -25), ZCK_F16), 0x0002);     /* 1.5 units: tie to even 2 */
    ZT_CHECK_EQ(to16(ldexpf(1023, -24), ZCK_F16), 0x03ff);  /* the largest subnormal */
    ZT_CHECK_EQ(to16(ldexpf(2047, -25), ZCK_F16), 0x0400);  /* 1023.5 units: up to normal */
    ZT_CHECK_EQ(to16(ldexpf(1, -14), ZCK_F16), 0x0400);     /* the smallest normal */
    uint16_t nh = to16(NAN, ZCK_F16);
    ZT_CHECK((nh & 0x7c00) == 0x7c00 && (nh & 0x3ff));
    nh = to16(u2f(0x7f800001), ZCK_F16);
    ZT_CHECK((nh & 0x7c00) == 0x7c00 && (nh & 0x3ff));
    /* f16 -> f32 */
    ZT_CHECK_EQ(from16(0x3c00, ZCK_F16), f2u(1.0f));
    ZT_CHECK_EQ(from16(0xc100, ZCK_F16), f2u(-2.5f));
    ZT_CHECK_EQ(from16(0x7bff, ZCK_F16), f2u(65504.0f));
    ZT_CHECK_EQ(from16(0x0001, ZCK_F16), f2u(ldexpf(1, -24)));
    ZT_CHECK_EQ(from16(0x03ff, ZCK_F16), f2u(ldexpf(1023, -24)));
    ZT_CHECK_EQ(from16(0x8000, ZCK_F16), f2u(-0.0f));
    ZT_CHECK_EQ(from16(0x7c00, ZCK_F16), f2u(INFINITY));
    ZT_CHECK_EQ(from16(0xfc00, ZCK_F16), f2u(-INFINITY));
    ZT_CHECK(isnan(u2f(from16(0x7e00, ZCK_F16))));
    ZT_CHECK(isnan(u2f(from16(0x7c01, ZCK_F16))));
    /* bf16 <-> f16 through f32 */
    uint16_t x = 0x3f80, y;
    ZT_OK(zfmt_convert(&y, ZCK_F16, &x, ZCK_BF16, 1));
    ZT_CHECK_EQ(y, 0x3c00);
    x = 0x7bff; /* 65504 in f16 -> 65536 in bf16 */
    ZT_OK(zfmt_convert(&y, ZCK_BF16, &x, ZCK_F16, 1));
    ZT_CHECK_EQ(y, 0x4780);

    /* same dtype is a copy, for any dtype; other pairs are refused */
    int64_t a[3] = {1, -2, 3}, b[3] = {0};
    ZT_OK(zfmt_convert(b, ZCK_I64, a, ZCK_I64, 3));
    ZT_CHECK(!memcmp(a, b, sizeof a));
    float f = 1;
    int32_t i32;
    ZT_ERR(zfmt_convert(&i32, ZCK_I32, &f, ZCK_F32, 1), ZR_EUNSUPPORTED, "f32 to i32");
    /* unaligned buffers are fine */
    unsigned char raw[9] = {0}, out[5];
    float one = 1.0f;
    memcpy(raw + 1, &one, 4);
    ZT_OK(zfmt_convert(out + 1, ZCK_BF16, raw + 1, ZCK_F32, 1));
    ZT_CHECK(out[1] == 0x80 && out[2] == 0x3f);
}

ZT_TEST(formats_convert_exhaustive_16bit)
{
    /* every f16 and bf16 value survives 16 -> f32 -> 16 (NaNs stay NaN) */
    for (uint32_t v = 0; v < 65536; v++) {
        for (int k = 0; k < 2; k++) {
            zck_dtype t = k ? ZCK_BF16 : ZCK_F16;
            uint16_t h = (uint16_t)v, back;
            float f;
            ZT_OK(zfmt_convert(&f, ZCK_F32, &h, t, 1));
            ZT_OK(zfmt_convert(&back, t, &f, ZCK_F32, 1));
            uint16_t expmask = k ? 0x7f80 : 0x7c00, manmask = k ? 0x7f : 0x3ff;
            int nan = (h & expmask) == expmask && (h & manmask);
            if (nan) {
                if (!isnan(f) || (back & expmask) != expmask || !(back & manmask))
                    ZT_FAIL("%s NaN 0x%04x lost (0x%04x)", k ? "bf16" : "f16", h, back);
            } else if (back != h) {
                ZT_FAIL("%s 0x%04x -> %g -> 0x%04x", k ? "bf16" : "f16", h, (double)f, back);
            }
        }
    }
#ifdef __FLT16_MAX__
    /* against the compiler's own conversion (round to nearest even) on many f32 patterns */
    for (uint64_t i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)zt_mix(i + 17);
        if (i & 1) /* half of them near f16's range, where the interesting cases are */
            u = (u & 0x807fffffu) | ((uint32_t)(100 + (zt_mix(i) % 45)) << 23);
        float f = u2f(u);
        if (isnan(f))
            continue;
        _Float16 ref = (_Float16)f;
        uint16_t want, got = to16(f, ZCK_F16);
        memcpy(&want, &ref, 2);
        if (got != want)
            ZT_FAIL("f32 0x%08x (%g): f16 0x%04x, compiler says 0x%04x", u, (double)f, got,
                    want);
    }
#endif
}

/* ---------------------------------------------------------------- GPT-2 layout and config */

ZT_TEST(formats_gpt2_layout)
{
    zck_layout *L;
    ZT_OK(zfmt_gpt2_layout(&L, &tiny));
    size_t L_ = tiny.layers, C = tiny.dim;
    ZT_CHECK_EQ(zck_layout_n_groups(L), 2 + L_ + 1);
    ZT_CHECK_EQ(zck_layout_n_states(L), 3);
    const char *states[] = {"param", "exp_avg", "exp_avg_sq"};
    for (size_t s = 0; s < 3; s++) {
        ZT_CHECK(!strcmp(zck_layout_state_name(L, s), states[s]));
        ZT_CHECK_EQ(zck_layout_state_dtype(L, s), ZCK_F32);
    }
    const char *groups[] = {"wte", "wpe", "h.0", "h.1", "ln_f"};
    uint64_t total = 0;
    for (size_t g = 0; g < 5; g++) {
        ZT_CHECK(!strcmp(zck_layout_group_name(L, g), groups[g]));
        total += zck_layout_group_numel(L, g);
    }
    ZT_CHECK_EQ(zck_layout_group_numel(L, 0), 11 * 8);
    ZT_CHECK_EQ(zck_layout_group_numel(L, 1), 16 * 8);
    ZT_CHECK_EQ(zck_layout_group_numel(L, 2), 12 * C * C + 13 * C);
    ZT_CHECK_EQ(zck_layout_group_n_tensors(L, 2), 12);
    ZT_CHECK_EQ(zck_layout_group_numel(L, 4), 2 * C);
    ZT_CHECK_EQ(total, 11 * 8 + 16 * 8 + L_ * (12 * C * C + 13 * C) + 2 * C);
    const struct {
        const char *name;
        size_t ndim;
        uint64_t d0, d1;
    } want[] = {
        {"wte", 2, 11, 8},                  {"wpe", 2, 16, 8},
        {"h.0.ln_1.weight", 1, 8, 0},       {"h.0.ln_1.bias", 1, 8, 0},
        {"h.0.attn.c_attn.weight", 2, 24, 8}, {"h.0.attn.c_attn.bias", 1, 24, 0},
        {"h.0.attn.c_proj.weight", 2, 8, 8}, {"h.0.attn.c_proj.bias", 1, 8, 0},
        {"h.0.ln_2.weight", 1, 8, 0},       {"h.0.ln_2.bias", 1, 8, 0},
        {"h.0.mlp.c_fc.weight", 2, 32, 8},  {"h.0.mlp.c_fc.bias", 1, 32, 0},
        {"h.0.mlp.c_proj.weight", 2, 8, 32}, {"h.0.mlp.c_proj.bias", 1, 8, 0},
        {"h.1.ln_1.weight", 1, 8, 0},       {"h.1.attn.c_attn.weight", 2, 24, 8},
        {"ln_f.weight", 1, 8, 0},           {"ln_f.bias", 1, 8, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        int found = 0;
        for (size_t g = 0; g < zck_layout_n_groups(L); g++)
            for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++) {
                zck_tensor_info ti;
                zck_layout_tensor(L, g, t, &ti);
                if (strcmp(ti.name, want[i].name))
                    continue;
                found = 1;
                ZT_CHECK_EQ(ti.ndim, want[i].ndim);
                ZT_CHECK_EQ(ti.shape[0], want[i].d0);
                if (ti.ndim == 2)
                    ZT_CHECK_EQ(ti.shape[1], want[i].d1);
                ZT_CHECK_EQ(ti.numel, want[i].d0 * (want[i].ndim == 2 ? want[i].d1 : 1));
                ZT_CHECK_EQ(ti.dtype, ZCK_F32);
            }
        if (!found)
            ZT_FAIL("tensor %s missing from the layout", want[i].name);
    }
    zck_layout_free(L);

    /* bad configs */
    zfmt_gpt2_config c = tiny;
    c.layers = 0;
    ZT_ERR(zfmt_gpt2_layout(&L, &c), ZR_EINVAL, "layers");
    c = tiny;
    c.vocab = 0;
    ZT_ERR(zfmt_gpt2_layout(&L, &c), ZR_EINVAL, "vocab");
    c = tiny;
    c.heads = 3;
    ZT_ERR(zfmt_gpt2_layout(&L, &c), ZR_EINVAL, "not a multiple of heads");
    c = (zfmt_gpt2_config){100, 1, 1u << 20, 1, 1};
    ZT_ERR(zfmt_gpt2_layout(&L, &c), ZR_EINVAL, "too large");
}

ZT_TEST(formats_gpt2_config_json)
{
    char *j;
    ZT_OK(zfmt_gpt2_config_to_json(&j, &tiny));
    ZT_CHECK(!strcmp(j, "{\"arch\":\"gpt2\",\"layers\":2,\"heads\":2,\"dim\":8,\"ctx\":16,"
                        "\"vocab\":11}"));
    zfmt_gpt2_config c;
    ZT_OK(zfmt_gpt2_config_from_json(&c, j));
    ZT_CHECK(!memcmp(&c, &tiny, sizeof c));
    free(j);
    /* extra fields are fine, the order does not matter */
    ZT_OK(zfmt_gpt2_config_from_json(&c, "{\"vocab\":50257,\"ctx\":1024,\"dim\":768,\"heads\":12,"
                                         "\"layers\":12,\"arch\":\"gpt2\",\"note\":\"x\"}"));
    ZT_CHECK(c.layers == 12 && c.heads == 12 && c.dim == 768 && c.ctx == 1024 &&
             c.vocab == 50257);
    const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"arch\":\"gpt2\",\"layers\":2,\"dim\":8,\"ctx\":16,\"vocab\":11}", "'heads'"},
        {"{\"layers\":2,\"heads\":2,\"dim\":8,\"ctx\":16,\"vocab\":11}", "'arch'"},
        {"{\"arch\":\"llama\",\"layers\":2,\"heads\":2,\"dim\":8,\"ctx\":16,\"vocab\":11}",
         "llama"},
        {"{\"arch\":\"gpt2\",\"layers\":\"2\",\"heads\":2,\"dim\":8,\"ctx\":16,\"vocab\":11}",
         "'layers'"},
        {"{\"arch\":\"gpt2\",\"layers\":2,\"heads\":2,\"dim\":8.5,\"ctx\":16,\"vocab\":11}",
         "'dim'"},
        {"{\"arch\":\"gpt2\",\"layers\":2,\"heads\":2,\"dim\":8,\"ctx\":-1,\"vocab\":11}", "'ctx'"},
        {"{\"arch\":\"gpt2\",\"layers\":2,\"heads\":3,\"dim\":8,\"ctx\":16,\"vocab\":11}",
         "multiple"},
        {"{\"arch\":\"gpt2\",\"layers\":2,\"layers\":3,\"heads\":2,\"dim\":8,\"ctx\":16,"
         "\"vocab\":11}", "invalid JSON"},
        {"[1, 2]", "not a JSON object"},
        {"{", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ZT_ERR(zfmt_gpt2_config_from_json(&c, bad[i].json), ZR_EINVAL, bad[i].msg);
    zfmt_gpt2_config z = tiny;
    z.dim = 0;
    ZT_ERR(zfmt_gpt2_config_to_json(&j, &z), ZR_EINVAL, "dim");
}

/* ---------------------------------------------------------------- safetensors export */

static const char *st_name(zck_dtype t)
{
    switch (t) {
    case ZCK_F32: return "F32";
    case ZCK_BF16: return "BF16";
    case ZCK_F16: return "F16";
    default: ZT_FAIL("dtype %d in a GPT-2 export", (int)t);
    }
}

/* Run the Python reader on file and compare what it prints with the checkpoint's tensors. */
static void check_listing(const char *ckpt, const char *file, int dtype, int params_only,
                          int numpy)
{
    char cmd[8192];
    const char *py = numpy ? zt_venv_python("safetensors numpy") : "python3";
    ZT_CHECK(py);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/formats/st_read.py' %s'%s' > listing.txt", py,
             zt_root(), numpy ? "--numpy " : "", file);
    ZT_CHECK_EQ(system(cmd), 0);
    size_t len;
    char *text = (char *)slurp("listing.txt", &len), *line = text, *next;

    zck_reader *r;
    ZT_OK(zck_reader_open(&r, ckpt));
    const zck_layout *L = zck_reader_layout(r);
    size_t n = 0;
    for (size_t s = 0; s < zck_layout_n_states(L); s++) {
        const char *sn = zck_layout_state_name(L, s);
        if (params_only && strcmp(sn, "param"))
            continue;
        for (size_t g = 0; g < zck_layout_n_groups(L); g++)
            for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++) {
                zck_tensor_info ti;
                zck_layout_tensor(L, g, t, &ti);
                zck_dtype st = zck_layout_state_dtype(L, s);
                zck_dtype ot = dtype < 0 ? st : (zck_dtype)dtype;
                size_t bytes = ti.numel * zck_dtype_size(ot);
                unsigned char *raw = malloc(ti.numel * 4 + 4), *conv = malloc(bytes + 4);
                ZT_CHECK(raw && conv);
                ZT_OK(zck_reader_read_range(r, g, s, ti.offset, ti.numel, raw));
                ZT_OK(zfmt_convert(conv, ot, raw, st, ti.numel));
                char hex[65], want[1024], shape[128];
                sha_hex(hex, conv, bytes);
                snprintf(shape, sizeof shape, "%llu", (unsigned long long)ti.shape[0]);
                if (ti.ndim == 2)
                    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), ",%llu",
                             (unsigned long long)ti.shape[1]);
                if (!strcmp(sn, "param"))
                    snprintf(want, sizeof want, "%s\t%s\t%s\t%s", ti.name, st_name(ot), shape,
                             hex);
                else
                    snprintf(want, sizeof want, "%s/%s\t%s\t%s\t%s", sn, ti.name, st_name(ot),
                             shape, hex);
                ZT_CHECK(line && *line);
                next = strchr(line, '\n');
                ZT_CHECK(next);
                *next = 0;
                if (strcmp(line, want))
                    ZT_FAIL("%s: tensor %zu: reader says '%s', checkpoint '%s'", file, n, line,
                            want);
                line = next + 1;
                n++;
                free(raw);
                free(conv);
            }
    }
    /* then the metadata */
    char want[4096];
    int seen = 0;
    for (; *line; line = next + 1) {
        next = strchr(line, '\n');
        ZT_CHECK(next);
        *next = 0;
        if (!strcmp(line, "__metadata__\tformat\tzero") ||
            !strcmp(line, "__metadata__\tzero.step\t5"))
            seen++;
        else if (snprintf(want, sizeof want, "__metadata__\tzero.model\t%s",
                          zck_reader_model_json(r)) > 0 && !strcmp(line, want))
            seen++;
        else
            ZT_FAIL("%s: unexpected line '%s'", file, line);
    }
    ZT_CHECK_EQ(seen, 3);
    zck_reader_free(r);
    free(text);
}

typedef struct {
    int calls;
    uint64_t last_done, last_total;
    int export_done;
} prog_seen;

static void on_progress(void *ctx, const char *what, uint64_t done, uint64_t total)
{
    prog_seen *p = ctx;
    p->calls++;
    ZT_CHECK(done <= total);
    if (!strcmp(what, "export")) {
        ZT_CHECK(done >= p->last_done || p->last_total != total);
        p->last_done = done;
        p->last_total = total;
        p->export_done = done == total;
    }
}

ZT_TEST(formats_safetensors_export)
{
    if (!have_python())
        ZT_SKIP("python3 is missing");
    char *ck = save_gpt2("run", &tiny, 3, 77);

    /* as stored, every state, with a progress callback */
    zfmt_st_opts o = ZFMT_ST_OPTS_INIT;
    prog_seen ps = {0};
    o.progress.fn = on_progress;
    o.progress.ctx = &ps;
    ZT_OK(zfmt_safetensors_export(ck, "all.safetensors", &o));
    ZT_CHECK(ps.calls >= 2 && ps.export_done);
    check_listing(ck, "all.safetensors", -1, 0, 0);
    /* the header is padded so that the data starts at a multiple of 8 */
    size_t n;
    unsigned char *f = slurp("all.safetensors", &n);
    uint64_t hl = 0;
    for (int b = 7; b >= 0; b--)
        hl = hl << 8 | f[b];
    ZT_CHECK_EQ((8 + hl) % 8, 0);
    ZT_CHECK_EQ(f[8], '{');
    free(f);

    /* bf16, a tiny buffer (chunks cross tensor and shard boundaries), from the run directory */
    o = (zfmt_st_opts)ZFMT_ST_OPTS_INIT;
    o.dtype = ZCK_BF16;
    o.buf_bytes = 240;
    ZT_OK(zfmt_safetensors_export("run", "bf16.safetensors", &o));
    check_listing(ck, "bf16.safetensors", ZCK_BF16, 0, 0);

    /* params only, f16 */
    o = (zfmt_st_opts)ZFMT_ST_OPTS_INIT;
    o.params_only = 1;
    o.dtype = ZCK_F16;
    ZT_OK(zfmt_safetensors_export(ck, "p16.safetensors", &o));
    check_listing(ck, "p16.safetensors", ZCK_F16, 1, 0);
    o.dtype = -1;
    ZT_OK(zfmt_safetensors_export(ck, "params.safetensors", &o));
    check_listing(ck, "params.safetensors", -1, 1, 0);
    /* overwriting is atomic: the old file is replaced whole */
    ZT_OK(zfmt_safetensors_export(ck, "params.safetensors", &o));
    check_listing(ck, "params.safetensors", -1, 1, 0);
    check_no_file_like(".", "params.safetensors.tmp");

    /* the real library, in the oracles' venv (make oracle-venv, which make test runs) */
    if (zt_venv_python("safetensors numpy")) {
        check_listing(ck, "all.safetensors", -1, 0, 1);
        check_listing(ck, "p16.safetensors", ZCK_F16, 1, 1);
    } else {
        fprintf(stderr, "  note: no build/venv with safetensors and numpy (make oracle-venv), "
                "checked with st_read.py only\n");
    }

    /* bad options */
    o = (zfmt_st_opts)ZFMT_ST_OPTS_INIT;
    o.dtype = ZCK_I32;
    ZT_ERR(zfmt_safetensors_export(ck, "x.safetensors", &o), ZR_EINVAL, "dtype");
    ZT_ERR(zfmt_safetensors_export("nowhere", "x.safetensors", NULL), ZR_ENOTFOUND, "nowhere");
    ZT_CHECK(file_size("x.safetensors") < 0);
    free(ck);
}

ZT_TEST(formats_export_refuses_corrupt_source)
{
    char *ck = save_gpt2("run", &tiny, 3, 5);
    char shard[4096];
    snprintf(shard, sizeof shard, "%s/shard-00001-of-00003.bin", ck);
    zt_flip_byte(shard, 100);
    ZT_ERR(zfmt_safetensors_export(ck, "out.safetensors", NULL), ZR_ECORRUPT,
           "shard-00001-of-00003.bin");
    ZT_CHECK(strstr(zr_err_msg(), "sha256"));
    ZT_CHECK(file_size("out.safetensors") < 0);
    check_no_file_like(".", "out.safetensors");
    ZT_ERR(zfmt_llmc_export("run", "out.bin", NULL), ZR_ECORRUPT, "shard-00001-of-00003.bin");
    ZT_CHECK(file_size("out.bin") < 0);
    check_no_file_like(".", "out.bin");
    /* a missing shard is named too */
    zt_flip_byte(shard, 100);
    snprintf(shard, sizeof shard, "%s/shard-00002-of-00003.bin", ck);
    ZT_CHECK(unlink(shard) == 0);
    ZT_ERR(zfmt_safetensors_export(ck, "out.safetensors", NULL), ZR_ECORRUPT,
           "shard-00002-of-00003.bin");
    check_no_file_like(".", "out.safetensors");
    free(ck);
}

/* ---------------------------------------------------------------- a safetensors writer */

typedef struct {
    char name[96];
    const char *dtype;         /* "F32", "BF16", "F16" */
    size_t ndim;
    uint64_t shape[4];
    unsigned char *data;
    size_t bytes;
} st_ent;

/* Write a safetensors file by hand: entries in order, contiguous; meta is the text of the
 * __metadata__ object or NULL. */
static void st_write(const char *path, const st_ent *e, size_t n, const char *meta)
{
    size_t cap = 1024 + n * 256 + (meta ? strlen(meta) : 0), at = 0;
    char *h = malloc(cap);
    ZT_CHECK(h);
    uint64_t off = 0;
    at += (size_t)snprintf(h + at, cap - at, "{");
    for (size_t i = 0; i < n; i++) {
        at += (size_t)snprintf(h + at, cap - at, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                               i ? "," : "", e[i].name, e[i].dtype);
        for (size_t d = 0; d < e[i].ndim; d++)
            at += (size_t)snprintf(h + at, cap - at, "%s%llu", d ? "," : "",
                                   (unsigned long long)e[i].shape[d]);
        at += (size_t)snprintf(h + at, cap - at, "],\"data_offsets\":[%llu,%llu]}",
                               (unsigned long long)off, (unsigned long long)(off + e[i].bytes));
        off += e[i].bytes;
    }
    if (meta)
        at += (size_t)snprintf(h + at, cap - at, "%s\"__metadata__\":%s", n ? "," : "", meta);
    at += (size_t)snprintf(h + at, cap - at, "}");
    ZT_CHECK(at < cap);
    FILE *f = fopen(path, "wb");
    ZT_CHECK(f);
    unsigned char len8[8];
    for (int b = 0; b < 8; b++)
        len8[b] = (unsigned char)((uint64_t)at >> (8 * b));
    ZT_CHECK(fwrite(len8, 1, 8, f) == 8 && fwrite(h, 1, at, f) == at);
    for (size_t i = 0; i < n; i++)
        ZT_CHECK(fwrite(e[i].data, 1, e[i].bytes, f) == e[i].bytes);
    fclose(f);
    free(h);
}

/* A value exactly representable in f32, bf16 and f16, for element i of a tensor in our
 * [out, in] orientation. */
static float hfval(const char *name, uint64_t i)
{
    int k = (int)((name_hash(name) + i * 37) % 255) - 127;
    return (float)(k ? k : 1) / 64.0f;
}

/* Fill an entry with hfval of tensor ours (shape in our orientation), stored as dtype,
 * transposed ([in, out]) when asked. */
static void ent_fill(st_ent *e, const char *file_name, const char *ours, const char *dtype,
                     size_t ndim, const uint64_t *shape, int transpose)
{
    snprintf(e->name, sizeof e->name, "%s", file_name);
    e->dtype = dtype;
    e->ndim = ndim;
    uint64_t numel = 1;
    for (size_t d = 0; d < ndim; d++) {
        e->shape[d] = transpose ? shape[ndim - 1 - d] : shape[d];
        numel *= shape[d];
    }
    size_t es = strcmp(dtype, "F32") ? 2 : 4;
    e->bytes = numel * es;
    e->data = malloc(e->bytes + 1);
    ZT_CHECK(e->data);
    for (uint64_t j = 0; j < numel; j++) {
        /* element j of the file; its index in our orientation */
        uint64_t i = j;
        if (transpose) {
            uint64_t O = shape[0], I = shape[1], a = j / O, b = j % O; /* file [I, O] */
            i = b * I + a;
            (void)O;
        }
        float v = hfval(ours, i);
        if (es == 4) {
            memcpy(e->data + j * 4, &v, 4);
        } else {
            uint16_t h = !strcmp(dtype, "BF16") ? (uint16_t)(f2u(v) >> 16) : to16(v, ZCK_F16);
            memcpy(e->data + j * 2, &h, 2);
        }
    }
}

typedef struct {
    const char *omit;         /* our name of a tensor to leave out */
    const char *untransposed; /* a Conv1D weight written [out, in] (wrong for HF) */
    const char *extra;        /* an extra tensor name */
    int dup_wte;              /* wte.weight twice, with and without the prefix */
    int ours;                 /* our own names and orientation, no buffers, no lm_head */
} hf_opts;

static int is_conv1d(const char *kind)
{
    return !strcmp(kind, "attn.c_attn.weight") || !strcmp(kind, "attn.c_proj.weight") ||
           !strcmp(kind, "mlp.c_fc.weight") || !strcmp(kind, "mlp.c_proj.weight");
}

/* The tensors of a GPT-2 of config c as Hugging Face writes them (or in our names). */
static void make_model(const char *path, const zfmt_gpt2_config *c, const hf_opts *o,
                       const char *meta)
{
    zck_layout *L;
    ZT_OK(zfmt_gpt2_layout(&L, c));
    st_ent *e = calloc(256, sizeof *e);
    ZT_CHECK(e);
    size_t n = 0, k = 0;
    for (size_t g = 0; g < zck_layout_n_groups(L); g++) {
        for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++, k++) {
            zck_tensor_info ti;
            zck_layout_tensor(L, g, t, &ti);
            if (o->omit && !strcmp(o->omit, ti.name))
                continue;
            const char *kind = strchr(ti.name, '.');
            int conv = !strncmp(ti.name, "h.", 2) && is_conv1d(strchr(kind + 1, '.') + 1);
            char fname[96];
            if (o->ours) {
                snprintf(fname, sizeof fname, "%s", ti.name);
            } else {
                const char *base = !strcmp(ti.name, "wte") ? "wte.weight"
                                   : !strcmp(ti.name, "wpe") ? "wpe.weight" : ti.name;
                /* the "transformer." prefix on every other name */
                snprintf(fname, sizeof fname, "%s%s", k % 2 ? "" : "transformer.", base);
            }
            /* a few tensors in 16-bit types */
            const char *dt = !strcmp(ti.name, "wpe") || !strcmp(ti.name, "h.1.mlp.c_fc.bias")
                                 ? "F16"
                             : !strcmp(ti.name, "h.0.ln_1.weight") ||
                                     !strcmp(ti.name, "h.1.attn.c_attn.weight")
                                 ? "BF16"
                                 : "F32";
            int tr = conv && !o->ours &&
                     !(o->untransposed && !strcmp(o->untransposed, ti.name));
            ent_fill(&e[n++], fname, ti.name, dt, ti.ndim, ti.shape, tr);
        }
        /* the causal-mask buffers after each block */
        if (!o->ours && !strncmp(zck_layout_group_name(L, g), "h.", 2)) {
            char nm[96];
            uint64_t sh4[4] = {1, 1, c->ctx, c->ctx};
            snprintf(nm, sizeof nm, "%s.attn.bias", zck_layout_group_name(L, g));
            ent_fill(&e[n++], nm, "bias", "F32", 4, sh4, 0);
            snprintf(nm, sizeof nm, "transformer.%s.attn.masked_bias",
                     zck_layout_group_name(L, g));
            ent_fill(&e[n++], nm, "masked", "F32", 0, sh4, 0);
        }
    }
    if (!o->ours) {
        uint64_t sh[2] = {c->vocab, c->dim};
        ent_fill(&e[n++], "lm_head.weight", "wte", "F32", 2, sh, 0);
        if (o->dup_wte)
            ent_fill(&e[n++], "wte.weight", "wte", "F32", 2, sh, 0);
    }
    if (o->extra) {
        uint64_t sh = c->dim;
        ent_fill(&e[n++], o->extra, o->extra, "F32", 1, &sh, 0);
    }
    st_write(path, e, n, meta);
    for (size_t i = 0; i < n; i++)
        free(e[i].data);
    free(e);
    zck_layout_free(L);
}

/* dir/config.json of a GPT-2 of config c: architectures [arch], model_type gpt2, the shape,
 * then the fields in extra (",\"name\":value..." or ""). */
static void write_gpt2_config(const char *dir, const zfmt_gpt2_config *c, const char *arch,
                              const char *extra)
{
    char p[512], cfg[1024];
    snprintf(cfg, sizeof cfg, "{\"architectures\":[\"%s\"],\"model_type\":\"gpt2\","
             "\"n_layer\":%u,\"n_head\":%u,\"n_embd\":%u,\"n_positions\":%u,\"n_ctx\":%u,"
             "\"vocab_size\":%u%s}\n", arch, c->layers, c->heads, c->dim, c->ctx, c->ctx,
             c->vocab, extra);
    snprintf(p, sizeof p, "%s/config.json", dir);
    zt_write_file(p, cfg);
}

static void make_hf(const char *dir, const zfmt_gpt2_config *c, const hf_opts *o)
{
    ZT_CHECK(mkdir(dir, 0755) == 0);
    char p[512];
    write_gpt2_config(dir, c, "GPT2LMHeadModel",
                      ",\"n_inner\":null,\"activation_function\":\"gelu_new\"");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    make_model(p, c, o, "{\"format\":\"pt\"}");
}

/* The imported checkpoint holds hfval in every param, zeros in the optimizer states. */
static void check_imported(const char *run, const zfmt_gpt2_config *c, uint32_t world,
                           const char *src)
{
    ZT_CHECK_EQ(zt_verify_count(run, 0), 0);
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, run));
    ZT_CHECK_EQ(zck_reader_step(r), 0);
    ZT_CHECK_EQ(zck_reader_world(r), world);
    char *model;
    ZT_OK(zfmt_gpt2_config_to_json(&model, c));
    ZT_CHECK(!strcmp(zck_reader_model_json(r), model));
    free(model);
    char tj[1024];
    snprintf(tj, sizeof tj, "{\"optimizer_step\":0,\"imported_from\":\"%s\"}", src);
    if (strcmp(zck_reader_training_json(r), tj))
        ZT_FAIL("training section %s, expected %s", zck_reader_training_json(r), tj);
    const zck_layout *L = zck_reader_layout(r);
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++) {
            zck_tensor_info ti;
            zck_layout_tensor(L, g, t, &ti);
            const char *states[] = {"param", "exp_avg", "exp_avg_sq"};
            for (size_t s = 0; s < 3; s++) {
                float *p = read_tensor(r, ti.name, states[s], NULL);
                for (uint64_t i = 0; i < ti.numel; i++) {
                    float want = s ? 0.0f : hfval(ti.name, i);
                    if (f2u(p[i]) != f2u(want))
                        ZT_FAIL("%s %s[%llu] = %g, expected %g", states[s], ti.name,
                                (unsigned long long)i, (double)p[i], (double)want);
                }
                free(p);
            }
        }
    zck_reader_free(r);
}

ZT_TEST(formats_import_hf)
{
    hf_opts o = {0};
    make_hf("hf", &tiny, &o);
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    io.world = 2;
    ZT_OK(zfmt_import("hf", "run", &io));
    check_imported("run", &tiny, 2, "hf");
    /* a spot check of the transposition, by hand: ours[o][i] = file[i][o] */
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, "run"));
    zck_tensor_info ti;
    float *w = read_tensor(r, "h.1.mlp.c_proj.weight", "param", &ti);
    ZT_CHECK(ti.shape[0] == 8 && ti.shape[1] == 32);
    size_t n;
    unsigned char *f = slurp("hf/model.safetensors", &n);
    uint64_t hl = 0;
    for (int b = 7; b >= 0; b--)
        hl = hl << 8 | f[b];
    char *hdr = strndup((char *)f + 8, hl);
    char *at = strstr(hdr, "h.1.mlp.c_proj.weight\"");
    ZT_CHECK(at);
    at = strstr(at, "\"shape\":[32,8]");
    ZT_CHECK(at);
    unsigned long long b0 = 0;
    ZT_CHECK(sscanf(strstr(at, "data_offsets") + 15, "%llu", &b0) == 1);
    float fv[32 * 8];
    memcpy(fv, f + 8 + hl + b0, sizeof fv);
    for (size_t oi = 0; oi < 8; oi++)
        for (size_t ii = 0; ii < 32; ii++)
            ZT_CHECK_EQ(f2u(w[oi * 32 + ii]), f2u(fv[ii * 8 + oi]));
    free(hdr);
    free(f);
    free(w);
    zck_reader_free(r);

    /* a second import into the same run directory is refused */
    ZT_ERR(zfmt_import("hf", "run", &io), ZR_EEXIST, "already holds a checkpoint");
    /* so is one into a directory with only a step directory in it */
    ZT_CHECK(mkdir("run2", 0755) == 0 && mkdir("run2/step-00000007", 0755) == 0);
    ZT_ERR(zfmt_import("hf", "run2", &io), ZR_EEXIST, "step-00000007");
    /* world 1 and 3 write the same values */
    io.world = 3;
    ZT_OK(zfmt_import("hf", "run3", &io));
    check_imported("run3", &tiny, 3, "hf");
    io.world = 0;
    ZT_ERR(zfmt_import("hf", "run4", &io), ZR_EINVAL, "world");
}

static int fail_op(zck_op op, const char *path, void *ctx)
{
    const zck_op *want = ctx;
    return op == *want && (op != ZCK_OP_WRITE || strstr(path, "shard-00001")) ? EIO : 0;
}

/* Import writes two ranks at once on two threads and reads safetensors tensors in chunks of 1M
 * elements: its world-4 shards are the bytes a reshard of its world-1 import writes (the
 * reshard's own writer path), with wte (1.28M elements) read in two chunks and split between
 * ranks. */
ZT_TEST(formats_import_parallel_ranks_same_bytes)
{
    static const zfmt_gpt2_config big = {1, 2, 64, 16, 20000};
    hf_opts o = {0};
    make_hf("hf", &big, &o);
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    io.world = 1;
    ZT_OK(zfmt_import("hf", "r1", &io));
    io.world = 4;
    ZT_OK(zfmt_import("hf", "r4", &io));
    check_imported("r4", &big, 4, "hf");
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    char *rs;
    ZT_OK(zck_reshard(&rs, "r1", "rs", 4, &ro));
    for (uint32_t r = 0; r < 4; r++) {
        char a[256], b[256];
        snprintf(a, sizeof a, "r4/step-00000000/shard-%05u-of-00004.bin", r);
        snprintf(b, sizeof b, "%s/shard-%05u-of-00004.bin", rs, r);
        if (!zt_same_file(a, b))
            ZT_FAIL("%s differs from %s", a, b);
    }
    free(rs);
}

ZT_TEST(formats_import_failure_leaves_nothing)
{
    hf_opts o = {0};
    make_hf("hf", &tiny, &o);
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    io.world = 3;
    /* a shard write fails (rank 1), then the commit's rename fails: no checkpoint, no latest,
     * no staging directory left; the next import works */
    const zck_op ops[] = {ZCK_OP_WRITE, ZCK_OP_RENAME};
    for (size_t i = 0; i < 2; i++) {
        zck_fault_set(fail_op, (void *)&ops[i]);
        ZT_ERR(zfmt_import("hf", "run", &io), ZR_EIO, NULL);
        zck_fault_set(NULL, NULL);
        check_no_file_like("run", ".tmp-step");
        check_no_file_like("run", "step-");
        check_no_file_like("run", "latest");
    }
    ZT_OK(zfmt_import("hf", "run", &io));
    check_imported("run", &tiny, 3, "hf");
}

ZT_TEST(formats_import_hf_errors)
{
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    io.world = 2;
    const struct {
        hf_opts o;
        int code;
        const char *a, *b;
    } cases[] = {
        {{.omit = "h.1.mlp.c_fc.bias"}, ZR_ECORRUPT, "tensor 'h.1.mlp.c_fc.bias' missing", NULL},
        {{.omit = "wte"}, ZR_ECORRUPT, "tensor 'wte' missing", NULL},
        {{.untransposed = "h.0.attn.c_attn.weight"}, ZR_ECORRUPT, "h.0.attn.c_attn.weight",
         "shape [24, 8], expected [8, 24]"},
        {{.extra = "h.7.ln_1.weight"}, ZR_ECORRUPT, "unexpected tensor 'h.7.ln_1.weight'",
         NULL},
        {{.extra = "transformer.h.0.attn.c_attn.biass"}, ZR_ECORRUPT, "unexpected tensor",
         NULL},
        {{.dup_wte = 1}, ZR_ECORRUPT, "tensor 'wte' duplicated", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[32];
        snprintf(dir, sizeof dir, "hf%zu", i);
        make_hf(dir, &tiny, &cases[i].o);
        ZT_ERR(zfmt_import(dir, "run", &io), cases[i].code, cases[i].a);
        if (cases[i].b && !strstr(zr_err_msg(), cases[i].b))
            ZT_FAIL("message '%s' lacks '%s'", zr_err_msg(), cases[i].b);
        char file[64];
        snprintf(file, sizeof file, "%s/model.safetensors", dir);
        if (!strstr(zr_err_msg(), file))
            ZT_FAIL("message '%s' does not name %s", zr_err_msg(), file);
        ZT_CHECK(file_size("run") < 0); /* nothing written */
    }
    /* config.json problems */
    hf_opts o = {0};
    make_hf("hfc", &tiny, &o);
    zt_write_file("hfc/config.json", "{\"n_layer\":2,\"n_head\":2,\"n_embd\":8,\"vocab_size\":11}");
    ZT_ERR(zfmt_import("hfc", "run", &io), ZR_ECORRUPT, "'n_ctx'");
    ZT_CHECK(strstr(zr_err_msg(), "hfc/config.json"));
    zt_write_file("hfc/config.json", "{\"n_layer\":3,\"n_head\":2,\"n_embd\":8,\"n_ctx\":16,"
                                     "\"vocab_size\":11}");
    ZT_ERR(zfmt_import("hfc", "run", &io), ZR_ECORRUPT, "tensor 'h.2.ln_1.weight' missing");
    zt_write_file("hfc/config.json", "{\"n_layer\":2,\"n_head\":3,\"n_embd\":8,\"n_ctx\":16,"
                                     "\"vocab_size\":11}");
    ZT_ERR(zfmt_import("hfc", "run", &io), ZR_ECORRUPT, "not a multiple of heads");
    ZT_CHECK(unlink("hfc/config.json") == 0);
    ZT_ERR(zfmt_import("hfc", "run", &io), ZR_ENOTFOUND, "hfc/config.json");
    ZT_ERR(zfmt_import("nothing-here", "run", &io), ZR_ENOTFOUND, "nothing-here");
    ZT_CHECK(file_size("run") < 0);
}

/* GPT-2 config.json fields that change the maths: each refused naming config.json, the field
 * and its value, nothing written; transformers' defaults, written out or left out, and the
 * values that are the same maths in float32 are accepted. */
ZT_TEST(formats_import_hf_gpt2_refuses_naming_the_field)
{
    hf_opts o = {0};
    make_hf("hf", &tiny, &o);
    static const struct {
        const char *arch, *extra;
        int code;
        const char *msg;
    } bad[] = {
        {"GPT2LMHeadModel", ",\"activation_function\":\"gelu\"", ZR_EUNSUPPORTED,
         "field 'activation_function' is \"gelu\": not supported"},
        {"GPT2LMHeadModel", ",\"activation_function\":\"relu\"", ZR_EUNSUPPORTED,
         "field 'activation_function' is \"relu\""},
        {"GPT2LMHeadModel", ",\"activation_function\":null", ZR_EUNSUPPORTED,
         "field 'activation_function' is null"},
        {"GPT2LMHeadModel", ",\"layer_norm_epsilon\":1e-6", ZR_EUNSUPPORTED,
         "field 'layer_norm_epsilon' is 1e-6"},
        {"GPT2LMHeadModel", ",\"layer_norm_epsilon\":\"1e-5\"", ZR_EUNSUPPORTED,
         "field 'layer_norm_epsilon' is \"1e-5\""},
        {"GPT2LMHeadModel", ",\"scale_attn_weights\":false", ZR_EUNSUPPORTED,
         "field 'scale_attn_weights' is false"},
        {"GPT2LMHeadModel", ",\"scale_attn_by_inverse_layer_idx\":true", ZR_EUNSUPPORTED,
         "field 'scale_attn_by_inverse_layer_idx' is true"},
        {"GPT2LMHeadModel", ",\"add_cross_attention\":true", ZR_EUNSUPPORTED,
         "field 'add_cross_attention' is true"},
        {"GPT2LMHeadModel", ",\"n_inner\":16", ZR_EUNSUPPORTED, "field 'n_inner' is 16"},
        {"GPT2LMHeadModel", ",\"n_inner\":32.0", ZR_EUNSUPPORTED, "field 'n_inner' is 32.0"},
        {"GPT2LMHeadModel", ",\"tie_word_embeddings\":false", ZR_EUNSUPPORTED,
         "field 'tie_word_embeddings' is false"},
        {"GPT2ForSequenceClassification", "", ZR_EUNSUPPORTED,
         "field 'architectures' is \"GPT2ForSequenceClassification\""},
        {"LlamaForCausalLM", "", ZR_ECORRUPT,
         "field 'architectures' (LlamaForCausalLM) and field 'model_type' (gpt2) disagree"},
    };
    struct stat st;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_gpt2_config("hf", &tiny, bad[i].arch, bad[i].extra);
        ZT_ERR(zfmt_import("hf", "run", NULL), bad[i].code, bad[i].msg);
        if (!strstr(zr_err_msg(), "hf/config.json"))
            ZT_FAIL("message '%s' does not name hf/config.json", zr_err_msg());
        ZT_CHECK(lstat("run", &st) < 0); /* nothing written */
    }
    /* through the program: the message and a non-zero exit, nothing written */
    write_gpt2_config("hf", &tiny, "GPT2LMHeadModel", ",\"scale_attn_weights\":false");
    char *out = NULL;
    ZT_CHECK(zt_zckpt(&out, "import hf -o run") != 0);
    ZT_CHECK(strstr(out, "hf/config.json") && strstr(out, "'scale_attn_weights'"));
    free(out);
    ZT_CHECK(lstat("run", &st) < 0);
    /* accepted: no field; transformers' defaults written out; the same maths */
    static const struct {
        const char *arch, *extra;
    } good[] = {
        {"GPT2LMHeadModel", ""},
        {"GPT2LMHeadModel", ",\"activation_function\":\"gelu_new\",\"layer_norm_epsilon\":1e-05,"
                            "\"scale_attn_weights\":true,\"scale_attn_by_inverse_layer_idx\":false,"
                            "\"reorder_and_upcast_attn\":false,\"add_cross_attention\":false,"
                            "\"n_inner\":null,\"tie_word_embeddings\":true"},
        {"GPT2LMHeadModel", ",\"activation_function\":\"gelu_pytorch_tanh\",\"n_inner\":32,"
                            "\"layer_norm_epsilon\":0.00001,\"reorder_and_upcast_attn\":true"},
        {"GPT2LMHeadModel", ",\"activation_function\":\"gelu_python_tanh\","
                            "\"layer_norm_epsilon\":null"},
        {"GPT2LMHeadModel", ",\"activation_function\":\"gelu_fast\""},
        {"GPT2Model", ""},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        char run[32];
        snprintf(run, sizeof run, "ok%zu", i);
        write_gpt2_config("hf", &tiny, good[i].arch, good[i].extra);
        ZT_OK(zfmt_import("hf", run, NULL));
        check_imported(run, &tiny, 1, "hf");
    }
}

ZT_TEST(formats_import_our_safetensors)
{
    /* export -> import round trip through the zero.model metadata */
    char *ck = save_gpt2("src", &tiny, 3, 9);
    zfmt_st_opts so = ZFMT_ST_OPTS_INIT;
    ZT_OK(zfmt_safetensors_export(ck, "m.safetensors", &so)); /* optimizer states too: ignored */
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    io.world = 2;
    ZT_OK(zfmt_import("m.safetensors", "run", &io));
    zck_reader *a, *b;
    ZT_OK(zck_reader_open(&a, ck));
    ZT_OK(zck_reader_open(&b, "run"));
    const zck_layout *L = zck_reader_layout(a);
    for (size_t g = 0; g < zck_layout_n_groups(L); g++) {
        uint64_t n = zck_layout_group_numel(L, g);
        float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
        ZT_OK(zck_reader_read_range(a, g, 0, 0, n, x));
        ZT_OK(zck_reader_read_range(b, g, 0, 0, n, y));
        ZT_OK(zck_reader_read_range(b, g, 2, 0, n, z));
        ZT_CHECK(!memcmp(x, y, n * 4));
        for (uint64_t i = 0; i < n; i++)
            ZT_CHECK_EQ(f2u(z[i]), 0);
        free(x);
        free(y);
        free(z);
    }
    zck_reader_free(a);
    zck_reader_free(b);

    /* a bare file in our names: the config comes from the shapes and the heads option */
    hf_opts o = {.ours = 1};
    make_model("bare.safetensors", &tiny, &o, NULL);
    ZT_ERR(zfmt_import("bare.safetensors", "run2", &io), ZR_EINVAL, "heads");
    io.heads = 2;
    ZT_OK(zfmt_import("bare.safetensors", "run2", &io));
    check_imported("run2", &tiny, 2, "bare.safetensors");
    free(ck);
}

ZT_TEST(formats_import_rejects_bad_safetensors)
{
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    io.heads = 2;
    const char *ok_e = "\"wte\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    const struct {
        const char *header;   /* NULL: the length field itself is the case */
        uint64_t hlen;        /* 0: the header's own length */
        size_t data_bytes;
        int code;
        const char *msg;
    } cases[] = {
        {"{}", 1000, 0, ZR_ECORRUPT, "header length 1000 is impossible"},
        {"{\"wte\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 4, ZR_ECORRUPT,
         "outside the data buffer of 4 bytes"},
        {"{\"wte\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8, ZR_ECORRUPT,
         "8 bytes in data_offsets, but its shape and dtype F32 make 12"},
        {"{\"wte\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12,
         ZR_ECORRUPT, "bytes [0, 4) of the data buffer belong to no tensor"},
        {"{\"wte\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"wpe\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12,
         ZR_ECORRUPT, "overlap"},
        {"{\"wte\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 16,
         ZR_ECORRUPT, "8 bytes after the last tensor"},
        {"{\"wte\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}", 0, 2,
         ZR_EUNSUPPORTED, "dtype 'BOOL'"},
        {"{\"wte\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 0, 8,
         ZR_ECORRUPT, "unexpected field 'x'"},
        {"{\"wte\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8,
         ZR_ECORRUPT, "shape[0]"},
        {"{\"wte\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 0, 8,
         ZR_ECORRUPT, "outside the data buffer"},
        {"{\"wte\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 0, 8, ZR_ECORRUPT,
         "'data_offsets'"},
        {"{\"wte\":{},\"wte\":{}}", 0, 0, ZR_ECORRUPT, "invalid JSON"},
        {"{\"wte\":", 0, 0, ZR_ECORRUPT, "invalid JSON"},
        {"[]", 0, 0, ZR_ECORRUPT, "not a JSON object"},
        {"{\"__metadata__\":{\"a\":1}}", 0, 0, ZR_ECORRUPT, "__metadata__ field 'a'"},
        {NULL, 0, 0, ZR_ECORRUPT, "too short"},
    };
    (void)ok_e;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[32];
        snprintf(path, sizeof path, "bad%zu.safetensors", i);
        unsigned char buf[1024] = {0};
        size_t n;
        if (!cases[i].header) {
            n = 5; /* shorter than the length field */
        } else {
            size_t hl = strlen(cases[i].header);
            uint64_t field = cases[i].hlen ? cases[i].hlen : hl;
            for (int b = 0; b < 8; b++)
                buf[b] = (unsigned char)(field >> (8 * b));
            memcpy(buf + 8, cases[i].header, hl);
            n = 8 + hl + cases[i].data_bytes;
        }
        spit(path, buf, n);
        ZT_ERR(zfmt_import(path, "run", &io), cases[i].code, cases[i].msg);
        if (!strstr(zr_err_msg(), path))
            ZT_FAIL("message '%s' does not name %s", zr_err_msg(), path);
    }
    /* a valid file that is not a GPT-2 */
    char good[256];
    int hl = snprintf(good + 8, sizeof good - 8, "{%s}", ok_e);
    memset(good, 0, 8);
    good[0] = (char)hl;
    memset(good + 8 + hl, 0, 8);
    spit("small.safetensors", good, 8 + (size_t)hl + 8);
    ZT_ERR(zfmt_import("small.safetensors", "run", &io), ZR_ECORRUPT, "tensor 'wpe' missing");
    ZT_CHECK(file_size("run") < 0);
}

/* ---------------------------------------------------------------- llm.c */

/* b (an import of what a holds) has a's params (state 0) in every group, and with
 * zero_states, zeros in state 1 */
static void expect_same_params(zck_reader *a, zck_reader *b, int zero_states, const char *what)
{
    const zck_layout *L = zck_reader_layout(a);
    for (size_t g = 0; g < zck_layout_n_groups(L); g++) {
        uint64_t m = zck_layout_group_numel(L, g);
        float *x = malloc(m * 4), *y = malloc(m * 4);
        ZT_CHECK(x && y);
        ZT_OK(zck_reader_read_range(a, g, 0, 0, m, x));
        ZT_OK(zck_reader_read_range(b, g, 0, 0, m, y));
        if (memcmp(x, y, m * 4))
            ZT_FAIL("%s: group %s differs after export and import", what,
                    zck_layout_group_name(L, g));
        if (zero_states) {
            ZT_OK(zck_reader_read_range(b, g, 1, 0, m, y));
            for (uint64_t i = 0; i < m; i++)
                ZT_CHECK_EQ(f2u(y[i]), 0);
        }
        free(x);
        free(y);
    }
}

ZT_TEST(formats_llmc_roundtrip)
{
    char *ck = save_gpt2("src", &tiny, 2, 31);
    ZT_OK(zfmt_llmc_export(ck, "model.bin", NULL));
    const uint64_t V = 11, Vp = 128, C = 8, T = 16, Ln = 2;
    /* the 16 arrays of llm.c, by hand */
    const uint64_t sizes[16] = {Vp * C,     T * C,     Ln * C,    Ln * C,
                                Ln * 3 * C * C, Ln * 3 * C, Ln * C * C, Ln * C,
                                Ln * C,     Ln * C,    Ln * 4 * C * C, Ln * 4 * C,
                                Ln * 4 * C * C, Ln * C, C,         C};
    uint64_t total = 0, off[16];
    for (int i = 0; i < 16; i++) {
        off[i] = total;
        total += sizes[i];
    }
    size_t n;
    unsigned char *f = slurp("model.bin", &n);
    ZT_CHECK_EQ(n, 1024 + total * 4);
    int32_t h[256];
    memcpy(h, f, sizeof h);
    ZT_CHECK_EQ(h[0], 20240326);
    ZT_CHECK_EQ(h[1], 3);
    ZT_CHECK_EQ(h[2], T);
    ZT_CHECK_EQ(h[3], V);
    ZT_CHECK_EQ(h[4], Ln);
    ZT_CHECK_EQ(h[5], 2);
    ZT_CHECK_EQ(h[6], C);
    ZT_CHECK_EQ(h[7], Vp);
    for (int i = 8; i < 256; i++)
        ZT_CHECK_EQ(h[i], 0);
    const float *p = (const float *)(f + 1024);
    /* wte: V rows, then zero rows up to Vp */
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, ck));
    float *t = read_tensor(r, "wte", "param", NULL);
    ZT_CHECK(!memcmp(p, t, V * C * 4));
    for (uint64_t i = V * C; i < Vp * C; i++)
        ZT_CHECK_EQ(f2u(p[i]), 0);
    free(t);
    /* layer 1's attn.c_attn.bias: the second slice of array 5 */
    t = read_tensor(r, "h.1.attn.c_attn.bias", "param", NULL);
    ZT_CHECK(!memcmp(p + off[5] + 3 * C, t, 3 * C * 4));
    free(t);
    t = read_tensor(r, "h.0.mlp.c_proj.weight", "param", NULL);
    ZT_CHECK(!memcmp(p + off[12], t, C * 4 * C * 4));
    free(t);
    t = read_tensor(r, "ln_f.bias", "param", NULL);
    ZT_CHECK(!memcmp(p + off[15], t, C * 4));
    free(t);

    /* import at world 1 and 3: the params are the original ones, the states zero */
    for (uint32_t w = 1; w <= 3; w += 2) {
        char run[32];
        snprintf(run, sizeof run, "run%u", w);
        zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
        io.world = w;
        ZT_OK(zfmt_import("model.bin", run, &io));
        ZT_CHECK_EQ(zt_verify_count(run, 0), 0);
        zck_reader *b;
        ZT_OK(zck_reader_open(&b, run));
        ZT_CHECK_EQ(zck_reader_world(b), w);
        ZT_CHECK(!strcmp(zck_reader_model_json(b), zck_reader_model_json(r)));
        expect_same_params(r, b, 1, run);
        zck_reader_free(b);
    }

    /* a version 1 file (no padded vocabulary) of the same model */
    int32_t h1[256];
    memcpy(h1, h, sizeof h1);
    h1[1] = 1;
    h1[7] = 0;
    FILE *v1 = fopen("v1.bin", "wb");
    ZT_CHECK(v1);
    fwrite(h1, 4, 256, v1);
    fwrite(p, 4, V * C, v1);
    fwrite(p + off[1], 4, total - off[1], v1);
    fclose(v1);
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    io.world = 2;
    ZT_OK(zfmt_import("v1.bin", "runv1", &io));
    zck_reader *b;
    ZT_OK(zck_reader_open(&b, "runv1"));
    expect_same_params(r, b, 0, "runv1");
    zck_reader_free(b);
    zck_reader_free(r);

    /* damaged files */
    spit("trunc.bin", f, n - 4);
    ZT_ERR(zfmt_import("trunc.bin", "runx", &io), ZR_ECORRUPT, "trunc.bin: truncated");
    h1[1] = 5;
    spit("v5.bin", h1, sizeof h1);
    ZT_ERR(zfmt_import("v5.bin", "runx", &io), ZR_EVERSION, "version 5");
    memcpy(f, (int32_t[]){12345}, 4);
    spit("badmagic.bin", f, n);
    ZT_ERR(zfmt_import("badmagic.bin", "runx", &io), ZR_ECORRUPT, "badmagic.bin");
    ZT_CHECK(strstr(zr_err_msg(), "magic"));
    ZT_CHECK(file_size("runx") < 0);
    free(f);
    free(ck);
}

ZT_TEST(formats_llmc_export_refuses_non_gpt2)
{
    /* a checkpoint whose model section is not a GPT-2 */
    const uint64_t sizes[] = {100, 10};
    zck_layout *L = zt_layout(2, sizes);
    char *p = zt_save("run", L, 2, 1, 3, 0);
    ZT_ERR(zfmt_llmc_export(p, "m.bin", NULL), ZR_EINVAL, "arch");
    ZT_CHECK(strstr(zr_err_msg(), p));
    ZT_CHECK(file_size("m.bin") < 0);
    check_no_file_like(".", "m.bin");
    zck_layout_free(L);
    free(p);
}

/* Whether the JSON header of the safetensors file at path (after its 8-byte length) has text. */
static int st_has(const char *path, const char *text)
{
    char *t = zt_slurp(path);
    int has = t && strstr(t + 8, text) != NULL;
    free(t);
    return has;
}

/* An HF export without a dtype writes the tensors as stored, and config.json's torch_dtype says
 * what they are: a checkpoint whose param state is bf16 gives bfloat16 (it said float32). */
ZT_TEST(formats_hf_export_dtype_as_stored)
{
    zck_gpt2_config c = {.layers = 1, .heads = 2, .dim = 8, .ctx = 8, .vocab = 256};
    zck_layout *A, *L;
    ZT_OK(zck_gpt2_layout(&A, &c));
    ZT_OK(zck_layout_new(&L));
    ZT_OK(zck_layout_add_state(L, "param", ZCK_BF16));
    for (size_t g = 0; g < zck_layout_n_groups(A); g++) {
        size_t gi;
        ZT_OK(zck_layout_add_group(L, &gi, zck_layout_group_name(A, g)));
        for (size_t t = 0; t < zck_layout_group_n_tensors(A, g); t++) {
            zck_tensor_info ti;
            zck_layout_tensor(A, g, t, &ti);
            ZT_OK(zck_layout_add_tensor(L, gi, ti.name, ti.dtype, ti.ndim, ti.shape));
        }
    }
    uint64_t seed = 7;
    free(save_layout("run", L, &c, 1, zt_seed_fill, &seed));
    ZT_OK(zfmt_hf_export("run", "as", NULL));
    zt_file_has("as/config.json", "\"torch_dtype\": \"bfloat16\"");
    ZT_CHECK(st_has("as/model.safetensors", "\"dtype\":\"BF16\""));
    ZT_CHECK(!st_has("as/model.safetensors", "\"dtype\":\"F32\""));
    /* converted: what it was converted to */
    zfmt_hf_opts h = ZFMT_HF_OPTS_INIT;
    h.dtype = ZCK_F32;
    ZT_OK(zfmt_hf_export("run", "f32", &h));
    zt_file_has("f32/config.json", "\"torch_dtype\": \"float32\"");
    ZT_CHECK(st_has("f32/model.safetensors", "\"dtype\":\"F32\"") &&
             !st_has("f32/model.safetensors", "\"dtype\":\"BF16\""));
    zck_layout_free(A);
    zck_layout_free(L);
}
