/*
 * test_engine_parts.c: the engine's parts that need no model (zr.h): model specs and their
 * errors, the model section JSON (read back by formats/ too) and the layout (spot checks; the
 * table itself is checked against docs/FORMAT.md in test_family.c), AdamW against a
 * double-precision reference, the LR schedule, the sum of squares, the vectorizable exp of the
 * model's loops (core/model/fastmath.h) against libm, the same bits from AdamW and the sum of
 * squares whatever the thread count, and the data sources: the synthetic corpus, raw-byte files
 * and llm.c token files with each kind of damage.
 */
#include "ckutil.h"
#include "fastmath.h"
#include "harness.h"
#include "zfmt.h"
#include "zr.h"

#include <float.h>
#include <math.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- helpers */

static int cfg_eq(const zr_gpt2_config *a, const zr_gpt2_config *b)
{
    return a->layers == b->layers && a->heads == b->heads && a->dim == b->dim &&
           a->ctx == b->ctx && a->vocab == b->vocab;
}

/* The sampling rule of data.c, written out again: start = mix(mix(seed) ^ i) mod (N - T). */
static uint64_t ref_mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t ref_start(uint64_t seed, uint64_t i, uint64_t N, uint64_t T)
{
    return ref_mix(ref_mix(seed) ^ i) % (N - T);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* ---------------------------------------------------------------- model specs */

typedef struct {
    const char *spec;
    zr_gpt2_config c;
} spec_case;

/* each spec parses to its config */
static void expect_parses(const spec_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        zr_gpt2_config c;
        ZT_OK(zr_gpt2_config_parse(&c, cases[i].spec));
        if (!cfg_eq(&c, &cases[i].c))
            ZT_FAIL("'%s' parsed as %u/%u/%u/%u/%u", cases[i].spec, c.layers, c.heads, c.dim,
                    c.ctx, c.vocab);
    }
}

ZT_TEST(engine_config_presets)
{
    static const spec_case cases[] = {
        {"tiny", ZR_GPT2(4, 4, 128, 128, 256)},
        {"gpt2", ZR_GPT2(12, 12, 768, 1024, 50257)},
        {"gpt2-medium", ZR_GPT2(24, 16, 1024, 1024, 50257)},
    };
    expect_parses(cases, sizeof cases / sizeof *cases);
}

ZT_TEST(engine_config_fields)
{
    static const spec_case cases[] = {
        {"gpt2:layers=2", ZR_GPT2(2, 4, 128, 128, 256)},
        {"gpt2:heads=8", ZR_GPT2(4, 8, 128, 128, 256)},
        {"gpt2:dim=256", ZR_GPT2(4, 4, 256, 128, 256)},
        {"gpt2:ctx=64", ZR_GPT2(4, 4, 128, 64, 256)},
        {"gpt2:vocab=50257", ZR_GPT2(4, 4, 128, 128, 50257)},
        {"gpt2:layers=4,heads=4,dim=256,ctx=128,vocab=256", ZR_GPT2(4, 4, 256, 128, 256)},
        /* any order */
        {"gpt2:vocab=512,ctx=32,dim=96,heads=3,layers=6", ZR_GPT2(6, 3, 96, 32, 512)},
        {"gpt2:layers=007", ZR_GPT2(7, 4, 128, 128, 256)},
        {"gpt2:heads=1,dim=1,ctx=1,vocab=4294967295", ZR_GPT2(4, 1, 1, 1, 4294967295u)},
    };
    expect_parses(cases, sizeof cases / sizeof *cases);
}

ZT_TEST(engine_config_errors)
{
    static const zt_refusal cases[] = {
        {"", "model '': unknown"},
        {"tiny2", "model 'tiny2': unknown (expected tiny, gpt2, gpt2-medium"},
        {"GPT2", "unknown"},
        {"gpt2-large", "unknown"},
        {"gpt2;layers=2", "unknown"},
        {"gpt2:", "model 'gpt2:': empty field"},
        {"gpt2:layers=2,", "empty field"},
        {"gpt2:,layers=2", "empty field"},
        {"gpt2:layers=2,,heads=2", "empty field"},
        {"gpt2:layers", "field 'layers' has no '='"},
        {"gpt2:depth=2", "model 'gpt2:depth=2': unknown field 'depth'"},
        {"gpt2:Layers=2", "unknown field 'Layers'"},
        {"gpt2:layers=2,width=3", "unknown field 'width'"},
        {"gpt2:layers=", "field 'layers' has no value"},
        {"gpt2:layers=x", "model 'gpt2:layers=x': field 'layers': 'x' is not a number"},
        {"gpt2:layers=-1", "field 'layers': '-1' is not a number"},
        {"gpt2:layers=+1", "field 'layers': '+1' is not a number"},
        {"gpt2:layers= 1", "field 'layers': ' 1' is not a number"},
        {"gpt2:layers=1.5", "field 'layers': '1.5' is not a number"},
        {"gpt2:dim=4k", "field 'dim': '4k' is not a number"},
        {"gpt2:ctx=0x10", "field 'ctx': '0x10' is not a number"},
        {"gpt2:vocab=4294967296", "field 'vocab': '4294967296' is too large"},
        {"gpt2:vocab=99999999999999999999999", "is too large"},
        {"gpt2:layers=0", "field 'layers' is 0 (expected >= 1)"},
        {"gpt2:heads=0", "field 'heads' is 0"},
        {"gpt2:dim=0", "field 'dim' is 0"},
        {"gpt2:ctx=0", "field 'ctx' is 0"},
        {"gpt2:vocab=0", "field 'vocab' is 0"},
        {"gpt2:layers=2,layers=3", "field 'layers' given twice"},
        {"gpt2:dim=100,heads=3", "model 'gpt2:dim=100,heads=3': dim 100 is not a multiple of "
                                 "heads 3"},
        {"gpt2:dim=130", "dim 130 is not a multiple of heads 4"},
        {"gpt2:dim=4294967295,heads=5", "tensors too large"},
        {"gpt2:layers=65536,dim=2097152,heads=16", "model too large"},
        /* a bound on the layout a spec or a config.json can ask for */
        {"gpt2:layers=65537", "field 'layers': '65537' is too large (at most 65536)"},
        {"gpt2:layers=4294967295,dim=1024,heads=16", "'4294967295' is too large (at most 65536)"},
    };
    zt_config_refusals(zr_gpt2_config_parse, cases, sizeof cases / sizeof *cases);
}

/* ---------------------------------------------------------------- model section JSON */

static const zr_gpt2_config some_configs[] = {
    ZR_GPT2(4, 4, 128, 128, 256),  ZR_GPT2(12, 12, 768, 1024, 50257),
    ZR_GPT2(24, 16, 1024, 1024, 50257),  ZR_GPT2(1, 1, 1, 1, 1),  ZR_GPT2(3, 2, 6, 5, 7),
    ZR_GPT2(2, 3, 96, 64, 50257),
    ZR_GPT2(48, 25, 1600, 1024, 50257),
};
#define N_SOME (sizeof some_configs / sizeof *some_configs)

ZT_TEST(engine_config_json)
{
    for (size_t i = 0; i < N_SOME; i++) {
        const zr_gpt2_config *c = &some_configs[i];
        char *a = NULL;
        ZT_OK(zr_gpt2_config_to_json(&a, c));
        zr_gpt2_config back;
        ZT_OK(zr_gpt2_config_from_json(&back, a));
        ZT_CHECK(cfg_eq(&back, c));
        zfmt_gpt2_config zb;
        ZT_OK(zfmt_gpt2_config_from_json(&zb, a)); /* the converters read it */
        ZT_CHECK(zb.layers == c->layers && zb.heads == c->heads && zb.dim == c->dim &&
                 zb.ctx == c->ctx && zb.vocab == c->vocab);
        free(a);
    }
    char *t = NULL;
    const zr_gpt2_config tiny = ZR_GPT2(4, 4, 128, 128, 256);
    ZT_OK(zr_gpt2_config_to_json(&t, &tiny));
    ZT_CHECK(!strcmp(t, "{\"arch\":\"gpt2\",\"layers\":4,\"heads\":4,\"dim\":128,\"ctx\":128,"
                        "\"vocab\":256}"));
    free(t);
    /* a bad config is refused, not written */
    const zr_gpt2_config bad[] = {ZR_GPT2(0, 4, 128, 128, 256), ZR_GPT2(4, 3, 128, 128, 256),
                                  ZR_GPT2(4, 4, 128, 128, 0)};
    for (size_t i = 0; i < 3; i++) {
        t = NULL;
        ZT_ERR(zr_gpt2_config_to_json(&t, &bad[i]), ZR_EINVAL, "gpt2 config: ");
        ZT_CHECK(!t);
    }
}

ZT_TEST(engine_config_from_json)
{
    zr_gpt2_config c;
    /* fields in any order, whitespace, extra fields ignored (the demo writes a "note") */
    ZT_OK(zr_gpt2_config_from_json(&c, "{ \"vocab\": 256, \"ctx\": 128, \"dim\": 64, \"heads\": "
                                       "4, \"layers\": 4, \"arch\": \"gpt2\", \"note\": \"x\" }"));
    const zr_gpt2_config want = ZR_GPT2(4, 4, 64, 128, 256);
    ZT_CHECK(cfg_eq(&c, &want));
    static const zt_refusal cases[] = {
        {"", "model section: invalid JSON"},
        {"{", "invalid JSON"},
        {"[1, 2]", "model section: not a JSON object"},
        {"{\"layers\":4,\"heads\":4,\"dim\":8,\"ctx\":8,\"vocab\":8}", "missing field 'arch'"},
        {"{\"arch\":\"mistral\",\"layers\":4,\"heads\":4,\"dim\":8,\"ctx\":8,\"vocab\":8}",
         "field 'arch': expected one of \"gpt2\", \"llama\", found mistral"},
        {"{\"arch\":\"llama\",\"layers\":4,\"heads\":4,\"dim\":8,\"ctx\":8,\"vocab\":8}",
         "missing field 'kv_heads'"},
        {"{\"arch\":5,\"layers\":4,\"heads\":4,\"dim\":8,\"ctx\":8,\"vocab\":8}",
         "found a non-string"},
        {"{\"arch\":\"gpt2\",\"layers\":4,\"dim\":8,\"ctx\":8,\"vocab\":8}",
         "missing field 'heads'"},
        {"{\"arch\":\"gpt2\",\"layers\":4,\"heads\":4,\"dim\":8,\"ctx\":8}",
         "missing field 'vocab'"},
        {"{\"arch\":\"gpt2\",\"layers\":\"4\",\"heads\":4,\"dim\":8,\"ctx\":8,\"vocab\":8}",
         "field 'layers': expected an integer in [1, 65536]"},
        {"{\"arch\":\"gpt2\",\"layers\":4.0,\"heads\":4,\"dim\":8,\"ctx\":8,\"vocab\":8}",
         "field 'layers': expected an integer"},
        {"{\"arch\":\"gpt2\",\"layers\":4,\"heads\":0,\"dim\":8,\"ctx\":8,\"vocab\":8}",
         "field 'heads': expected an integer"},
        {"{\"arch\":\"gpt2\",\"layers\":4,\"heads\":4,\"dim\":-8,\"ctx\":8,\"vocab\":8}",
         "field 'dim': expected an integer"},
        {"{\"arch\":\"gpt2\",\"layers\":4,\"heads\":4,\"dim\":8,\"ctx\":4294967296,\"vocab\":8}",
         "field 'ctx': expected an integer"},
        {"{\"arch\":\"gpt2\",\"layers\":4,\"heads\":3,\"dim\":8,\"ctx\":8,\"vocab\":8}",
         "model section: dim 8 is not a multiple of heads 3"},
        {"{\"arch\":\"gpt2\",\"layers\":4,\"layers\":5,\"heads\":4,\"dim\":8,\"ctx\":8,"
         "\"vocab\":8}", "invalid JSON"},
    };
    zt_config_refusals(zr_gpt2_config_from_json, cases, sizeof cases / sizeof *cases);
}

/* ---------------------------------------------------------------- layout */

ZT_TEST(engine_layout)
{
    for (size_t i = 0; i < N_SOME; i++) { /* the arena of zr_gpt2_offsets is the layout's */
        zck_layout *a = NULL;
        zr_gpt2_offsets o;
        ZT_OK(zr_gpt2_layout(&a, &some_configs[i]));
        ZT_OK(zr_gpt2_offsets_get(&o, &some_configs[i]));
        uint64_t numel = 0;
        for (size_t g = 0; g < zck_layout_n_groups(a); g++)
            numel += zck_layout_group_numel(a, g);
        ZT_CHECK_EQ(o.numel, numel);
        ZT_CHECK_EQ(o.layer_numel, zck_layout_group_numel(a, 2));
        zck_layout_free(a);
    }
    /* spot checks against the contract itself (tiny: C = 128, V = 256, T = 128) */
    const zr_gpt2_config tiny = ZR_GPT2(4, 4, 128, 128, 256);
    zck_layout *L;
    ZT_OK(zr_gpt2_layout(&L, &tiny));
    ZT_CHECK_EQ(zck_layout_n_groups(L), 4 + 3);
    ZT_CHECK(!strcmp(zck_layout_group_name(L, 0), "wte"));
    ZT_CHECK(!strcmp(zck_layout_group_name(L, 5), "h.3"));
    ZT_CHECK(!strcmp(zck_layout_group_name(L, 6), "ln_f"));
    ZT_CHECK_EQ(zck_layout_group_numel(L, 2), 12 * 128 * 128 + 13 * 128);
    zck_tensor_info t;
    zck_layout_tensor(L, 2, 10, &t);
    ZT_CHECK(!strcmp(t.name, "h.0.mlp.c_proj.weight"));
    ZT_CHECK(t.ndim == 2 && t.shape[0] == 128 && t.shape[1] == 512);
    ZT_CHECK_EQ(zck_layout_n_states(L), 3);
    ZT_CHECK(!strcmp(zck_layout_state_name(L, 2), "exp_avg_sq"));
    zck_layout_free(L);
    /* a bad config is refused, naming the field */
    const zr_gpt2_config bad = ZR_GPT2(4, 3, 128, 128, 256);
    L = NULL;
    ZT_ERR(zr_gpt2_layout(&L, &bad), ZR_EINVAL, "dim 128 is not a multiple of heads 3");
    ZT_CHECK(!L);
    const zr_gpt2_config zero = ZR_GPT2(4, 4, 128, 0, 256);
    ZT_ERR(zr_gpt2_layout(&L, &zero), ZR_EINVAL, "field 'ctx' is 0");
}

/* ---------------------------------------------------------------- AdamW */

/* The documented update in double, one element. */
static void ref_adamw(double *p, double g, double *m, double *v, uint64_t t, double lr,
                      double scale, int decay, const zr_adamw_hp *hp)
{
    double b1 = hp->beta1, b2 = hp->beta2;
    g *= scale;
    *m = b1 * *m + (1 - b1) * g;
    *v = b2 * *v + (1 - b2) * g * g;
    double mhat = *m / (1 - pow(b1, (double)t)), vhat = *v / (1 - pow(b2, (double)t));
    *p -= lr * (mhat / (sqrt(vhat) + hp->eps) + (decay ? hp->weight_decay * *p : 0));
}

static int close_to(double got, double want, double rtol, double atol)
{
    return fabs(got - want) <= atol + rtol * fabs(want);
}

ZT_TEST(engine_adamw_reference)
{
    enum { N = 37 }; /* not a multiple of any vector width: the tail runs too */
    const zr_adamw_hp hp = ZR_ADAMW_HP_INIT;
    ZT_CHECK(hp.beta1 == 0.9f && hp.beta2 == 0.95f && hp.eps == 1e-8f && hp.weight_decay == 0.1f);
    const struct {
        int decay;
        float scale, lr;
        uint64_t t0;
    } cases[] = {{0, 1.0f, 1e-2f, 1}, {1, 1.0f, 1e-2f, 1}, {1, 0.25f, 3e-3f, 1},
                 {0, 4.0f, 1e-3f, 1}, {1, 1.0f, 1e-2f, 10000}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float p[N], g[N], m[N], v[N];
        double rp[N], rm[N], rv[N];
        uint64_t s = 42 + c;
        for (size_t i = 0; i < N; i++) {
            p[i] = (float)((double)lcg(&s) / 2147483648.0 - 1.0); /* [-1, 1) */
            rp[i] = p[i];
            m[i] = v[i] = 0;
            rm[i] = rv[i] = 0;
        }
        for (uint64_t step = 0; step < 6; step++) {
            uint64_t t = cases[c].t0 + step;
            for (size_t i = 0; i < N; i++)
                g[i] = (float)((double)lcg(&s) / 2147483648.0 - 1.0) * 0.1f;
            float p0[N];
            memcpy(p0, p, sizeof p);
            zr_adamw_update(p, g, m, v, N, t, cases[c].lr, cases[c].scale, cases[c].decay, &hp);
            for (size_t i = 0; i < N; i++) {
                ref_adamw(&rp[i], g[i], &rm[i], &rv[i], t, cases[c].lr, cases[c].scale,
                          cases[c].decay, &hp);
                if (!close_to(p[i], rp[i], 1e-6, 1e-7) || !close_to(m[i], rm[i], 1e-5, 1e-12) ||
                    !close_to(v[i], rv[i], 1e-5, 1e-14))
                    ZT_FAIL("case %zu step %llu element %zu: param %.9g m %.9g v %.9g, "
                            "reference %.9g %.9g %.9g", c, (unsigned long long)step, i, p[i],
                            m[i], v[i], rp[i], rm[i], rv[i]);
                /* by hand at t = 1: mhat = g', vhat = g'^2, so the step is lr * sign(g) plus
                 * the decay lr * wd * p */
                if (t == 1) {
                    double want = p0[i] - cases[c].lr * (g[i] > 0 ? 1.0 : -1.0) -
                                  (cases[c].decay ? cases[c].lr * 0.1 * p0[i] : 0.0);
                    ZT_CHECK(close_to(p[i], want, 1e-6, 1e-6));
                }
            }
        }
    }
}

ZT_TEST(engine_adamw_split_is_exact)
{
    /* updating a range in pieces (as ZeRO ranks do) gives the same bits as in one call */
    enum { N = 1000 };
    const zr_adamw_hp hp = ZR_ADAMW_HP_INIT;
    static float p1[N], g[N], m1[N], v1[N], p2[N], m2[N], v2[N];
    uint64_t s = 7;
    for (size_t i = 0; i < N; i++) {
        p1[i] = p2[i] = (float)lcg(&s) / 2147483648.0f - 1.0f;
        m1[i] = m2[i] = (float)lcg(&s) / 2147483648.0f * 0.01f;
        v1[i] = v2[i] = (float)lcg(&s) / 2147483648.0f * 1e-4f;
        g[i] = (float)lcg(&s) / 2147483648.0f - 1.0f;
    }
    zr_adamw_update(p1, g, m1, v1, N, 7, 1e-3f, 0.5f, 1, &hp);
    const size_t cuts[] = {0, 1, 3, 64, 65, 333, 999, N};
    for (size_t k = 0; k + 1 < sizeof cuts / sizeof *cuts; k++) {
        size_t a = cuts[k], n = cuts[k + 1] - cuts[k];
        zr_adamw_update(p2 + a, g + a, m2 + a, v2 + a, n, 7, 1e-3f, 0.5f, 1, &hp);
    }
    ZT_CHECK(!memcmp(p1, p2, sizeof p1));
    ZT_CHECK(!memcmp(m1, m2, sizeof m1));
    ZT_CHECK(!memcmp(v1, v2, sizeof v1));
    zr_adamw_update(p1, g, m1, v1, 0, 8, 1e-3f, 1.0f, 1, &hp); /* n = 0 touches nothing */
    ZT_CHECK(!memcmp(p1, p2, sizeof p1));
}

/* ---------------------------------------------------------------- LR schedule and sumsq */

ZT_TEST(engine_lr_schedule)
{
    const float lr = 1e-3f, r = 0.1f;
    /* warmup 10, total 111: cosine over steps 10 .. 110, midpoint at 60 */
    const struct {
        uint64_t step;
        double want;
    } cases[] = {
        {0, 1e-4},                                            /* warmup: lr * 1/10 */
        {4, 5e-4},                                            /* lr * 5/10 */
        {9, 1e-3},                                            /* lr * 10/10: the peak */
        {10, 1e-3},                                           /* decay starts at the peak */
        {35, 1e-4 + 0.5 * (1 + cos(M_PI / 4)) * 9e-4},        /* a quarter of the way */
        {60, 5.5e-4},                                         /* midpoint: (lr + lr r) / 2 */
        {85, 1e-4 + 0.5 * (1 + cos(3 * M_PI / 4)) * 9e-4},    /* three quarters */
        {110, 1e-4},                                          /* step total - 1: the floor */
        {111, 1e-4},                                          /* after the end */
        {100000, 1e-4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        float got = zr_lr_at(cases[i].step, 10, 111, lr, r);
        if (!close_to(got, cases[i].want, 1e-6, 0))
            ZT_FAIL("step %llu: lr %.9g, expected %.9g", (unsigned long long)cases[i].step, got,
                    cases[i].want);
    }
    float prev = zr_lr_at(10, 10, 111, lr, r);
    for (uint64_t s = 11; s < 200; s++) { /* never rises after the peak */
        float cur = zr_lr_at(s, 10, 111, lr, r);
        ZT_CHECK(cur <= prev);
        prev = cur;
    }
    ZT_CHECK(zr_lr_at(0, 0, 100, lr, r) == lr);            /* no warmup: the peak first */
    ZT_CHECK(close_to(zr_lr_at(99, 0, 100, lr, 0.0f), 0, 0, 0)); /* floor 0 */
    ZT_CHECK(close_to(zr_lr_at(49, 1, 98, 2.0f, 0.0f), 1.0, 1e-7, 0)); /* midpoint of 1 .. 97 */
}

ZT_TEST(engine_sumsq)
{
    ZT_CHECK(zr_sumsq(NULL, 0) == 0.0);
    float x[1000];
    for (size_t i = 0; i < 1000; i++)
        x[i] = (float)(i + 1);
    for (size_t n = 0; n <= 20; n++) /* every tail length; small integers are exact */
        ZT_CHECK(zr_sumsq(x, n) == (double)n * (n + 1) * (2 * n + 1) / 6);
    ZT_CHECK(zr_sumsq(x, 1000) == 1000.0 * 1001 * 2001 / 6);
    ZT_CHECK(zr_sumsq(x + 3, 997) == 1000.0 * 1001 * 2001 / 6 - 14);
    /* accumulated in double: 1e6 values of 0.1f, which float accumulation would get wrong */
    size_t n = 1000000;
    float *y = malloc(n * sizeof *y);
    ZT_CHECK(y);
    for (size_t i = 0; i < n; i++)
        y[i] = 0.1f;
    double e = (double)0.1f * (double)0.1f * (double)n;
    ZT_CHECK(close_to(zr_sumsq(y, n), e, 1e-10, 0)); /* float sums drift by ~1e-3 */
    y[n - 1] = -3.0f; /* signs do not matter; the tail is counted */
    ZT_CHECK(close_to(zr_sumsq(y, n), e - (double)0.1f * 0.1f + 9.0, 1e-10, 0));
    free(y);
}

/* The documented sum of squares: blocks of 16384 elements, each in double as eight partial
 * sums over i mod 8 combined pairwise, then the block sums added in order. */
static double ref_sumsq(const float *x, size_t n)
{
    double total = 0.0;
    for (size_t b = 0; b < n; b += 16384) {
        size_t e = n - b < 16384 ? n : b + 16384, i = b;
        double s[8] = {0};
        for (; i + 8 <= e; i += 8)
            for (size_t k = 0; k < 8; k++)
                s[k] += (double)x[i + k] * x[i + k];
        for (; i < e; i++)
            s[0] += (double)x[i] * x[i];
        total += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
    return total;
}

ZT_TEST(engine_sumsq_and_adamw_threads)
{
    /* more blocks than one parallel region takes (1024 blocks of 16384), and a ragged tail */
    size_t n = 1024 * 16384 + 5 * 16384 + 77;
    float *x = malloc(n * sizeof *x);
    ZT_CHECK(x);
    uint64_t s = 3;
    for (size_t i = 0; i < n; i++)
        x[i] = ((float)lcg(&s) / 2147483648.0f - 1.0f) * (i % 1000 == 0 ? 1e3f : 1e-3f);
    const size_t lens[] = {0, 1, 9, 16384, 16385, 3 * 16384 + 11, n};
    double want[sizeof lens / sizeof *lens];
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++)
        want[k] = ref_sumsq(x, lens[k]);
    const int threads[] = {1, 2, 3, 4};
    for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
        zr_set_threads(threads[t]);
        for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
            double got = zr_sumsq(x, lens[k]);
            if (memcmp(&got, &want[k], sizeof got))
                ZT_FAIL("%d threads, n %zu: sumsq %.17g, expected %.17g", threads[t], lens[k],
                        got, want[k]);
        }
    }

    /* AdamW: the same bits on 1 and 3 threads (elementwise), over a range several threads
     * split */
    size_t na = 300007;
    const zr_adamw_hp hp = ZR_ADAMW_HP_INIT;
    float *p[2], *m[2], *v[2];
    for (int k = 0; k < 2; k++) {
        ZT_CHECK((p[k] = malloc(na * sizeof(float))) && (m[k] = calloc(na, sizeof(float))) &&
                 (v[k] = calloc(na, sizeof(float))));
        memcpy(p[k], x + 1000, na * sizeof(float));
        zr_set_threads(k ? 3 : 1);
        for (uint64_t t = 1; t <= 3; t++)
            zr_adamw_update(p[k], x + 5 * 16384 + t, m[k], v[k], na, t, 1e-3f, 0.7f, 1, &hp);
    }
    ZT_CHECK(!memcmp(p[0], p[1], na * sizeof(float)));
    ZT_CHECK(!memcmp(m[0], m[1], na * sizeof(float)));
    ZT_CHECK(!memcmp(v[0], v[1], na * sizeof(float)));
    ZT_CHECK(memcmp(p[0], x + 1000, na * sizeof(float))); /* it did update */
    for (int k = 0; k < 2; k++) {
        free(p[k]);
        free(m[k]);
        free(v[k]);
    }
    free(x);
}

/* ---------------------------------------------------------------- zr_expf */

/* distance in representable floats between two non-NaN floats (0 and -0 are 0 apart) */
static int64_t float_steps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    int64_t oa = ia < 0 ? -(int64_t)(ia & 0x7fffffff) : ia;
    int64_t ob = ib < 0 ? -(int64_t)(ib & 0x7fffffff) : ib;
    return oa > ob ? oa - ob : ob - oa;
}

/* zr_expf(x) against e^x in double rounded once: the worst distance in floats so far where
 * e^x is a normal float (worst[0]) and where it is 0, subnormal or inf (worst[1]) */
static void expf_check(float x, int64_t worst[2], float *worst_x)
{
    float y = zr_expf(x);
    if (isnan(x)) {
        if (!isnan(y))
            ZT_FAIL("zr_expf(NaN) = %a", y);
        return;
    }
    float ref = (float)exp((double)x);
    if (isnan(y) || isinf(y) != isinf(ref) || (y == 0.0f) != (ref == 0.0f) || y < 0.0f)
        ZT_FAIL("zr_expf(%a) = %a, expected %a", x, y, ref);
    int64_t d = float_steps(y, ref);
    int normal = ref >= FLT_MIN && !isinf(ref);
    if (d > worst[!normal]) {
        worst[!normal] = d;
        if (normal)
            *worst_x = x;
    }
}

ZT_TEST(engine_fast_expf)
{
    /* the bound of core/model/fastmath.h: within 1 ulp of e^x where e^x is a normal float, one step
     * where it is subnormal, the same 0 and inf; every 4099th float bit pattern (about 1M
     * values, each sign and magnitude) and chosen ones around the limits */
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 0x1p-149f, -0x1p-149f, 0x1p-24f,
                             -0x1p-25f, 88.0f, 88.72283f, 88.722839f, 88.7229f, 89.0f, 89.5f,
                             100.0f, 1e10f, FLT_MAX, -87.33654f, -87.3366f, -100.0f, -103.27893f,
                             -103.97208f, -103.972084f, -104.0f, -104.5f, -200.0f, -1e10f,
                             -FLT_MAX, 0.34657359f, -0.34657359f, 0.6931472f, -0.6931472f};
    int64_t worst[2] = {0, 0};
    float worst_x = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        uint32_t b = (uint32_t)u;
        float x;
        memcpy(&x, &b, sizeof x);
        expf_check(x, worst, &worst_x);
    }
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        expf_check(special[i], worst, &worst_x);
    if (worst[0] > 1 || worst[1] > 1)
        ZT_FAIL("zr_expf: %lld ulp from e^x at x = %a (bound 1); %lld steps where subnormal",
                (long long)worst[0], worst_x, (long long)worst[1]);
    ZT_CHECK(zr_expf(-INFINITY) == 0.0f);
    ZT_CHECK(isinf(zr_expf(INFINITY)) && zr_expf(INFINITY) > 0);
    ZT_CHECK(isnan(zr_expf(NAN)) && isnan(zr_expf(-NAN)));
    ZT_CHECK(zr_expf(0.0f) == 1.0f && zr_expf(-0.0f) == 1.0f);
    /* what the softmaxes rely on: terms e^(x - max) in (0, 1], the maximum's exactly 1 */
    for (float x = -30.0f; x <= 0.0f; x += 0.01f) {
        float y = zr_expf(x);
        ZT_CHECK(y > 0.0f && y <= 1.0f);
    }
}

/* ---------------------------------------------------------------- data */

#define SYNTH_N 1048576

ZT_TEST(engine_data_synthetic)
{
    const uint32_t T = 64;
    zr_data *a, *b, *c, *all;
    ZT_OK(zr_data_open(&a, "synthetic", 256, T, 1234));
    ZT_OK(zr_data_open(&b, "synthetic", 50257, T, 1234));
    ZT_OK(zr_data_open(&c, "synthetic", 256, T, 1235));
    ZT_CHECK(!strcmp(zr_data_describe(a), "synthetic corpus (1048576 tokens)"));
    ZT_CHECK_EQ(zr_data_tokens(a), SYNTH_N);
    /* T = N - 1 leaves one start position: sample 0 is the whole corpus */
    ZT_OK(zr_data_open(&all, "synthetic", 256, SYNTH_N - 1, 99));
    int32_t *corpus = malloc(SYNTH_N * sizeof *corpus);
    ZT_CHECK(corpus);
    zr_data_sample(all, 12345, corpus);
    ZT_CHECK(corpus[0] == 'T' && corpus[1] == 'h' && corpus[2] == 'e' && corpus[3] == ' ');
    /* text: letters, space, '.', ',', newline */
    size_t count[256] = {0};
    for (size_t i = 0; i < SYNTH_N; i++) {
        ZT_CHECK(corpus[i] >= 0 && corpus[i] < 256);
        int ch = corpus[i];
        ZT_CHECK((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == ' ' ||
                 ch == '.' || ch == ',' || ch == '\n');
        count[ch]++;
    }
    ZT_CHECK(count[' '] > SYNTH_N / 8 && count['.'] > 1000 && count['\n'] > 100);
    /* learnable: a byte given the previous one has under 2.2 nats of entropy (5.55 uniform) */
    static uint32_t pair[256][256];
    for (size_t i = 1; i < SYNTH_N; i++)
        pair[corpus[i - 1]][corpus[i]]++;
    double h = 0;
    for (int x = 0; x < 256; x++)
        for (int y = 0; y < 256; y++)
            if (pair[x][y])
                h -= pair[x][y] * log((double)pair[x][y] / (double)count[x]);
    h /= SYNTH_N - 1;
    if (!(h < 2.2))
        ZT_FAIL("bigram entropy %.3f nats", h);

    int32_t x[65], y[65];
    uint64_t first_start = 0;
    int starts_differ = 0, seeds_differ = 0;
    for (uint64_t i = 0; i < 200; i++) {
        zr_data_sample(a, i, x);
        zr_data_sample(b, i, y); /* same seed, another handle (and vocab): same tokens */
        ZT_CHECK(!memcmp(x, y, sizeof x));
        zr_data_sample(a, i, y); /* and again from the same handle */
        ZT_CHECK(!memcmp(x, y, sizeof x));
        uint64_t st = ref_start(1234, i, SYNTH_N, T);
        for (uint32_t k = 0; k <= T; k++)
            ZT_CHECK_EQ(x[k], corpus[st + k]);
        if (i == 0)
            first_start = st;
        else
            starts_differ |= st != first_start;
        zr_data_sample(c, i, y);
        seeds_differ |= ref_start(1235, i, SYNTH_N, T) != st;
        ZT_CHECK_EQ(y[0], corpus[ref_start(1235, i, SYNTH_N, T)]);
    }
    ZT_CHECK(starts_differ && seeds_differ);
    /* distinct indices give distinct starts (a bijection before the modulo) */
    for (uint64_t i = 0; i < 200; i++)
        for (uint64_t j = i + 1; j < 200; j++)
            ZT_CHECK(ref_start(1234, i, SYNTH_N, T) != ref_start(1234, j, SYNTH_N, T));
    free(corpus);
    zr_data_free(a);
    zr_data_free(b);
    zr_data_free(c);
    zr_data_free(all);

    /* byte tokens need a vocabulary of at least 256; a sample needs T + 1 tokens */
    zr_data *d = NULL;
    ZT_ERR(zr_data_open(&d, "synthetic", 255, T, 1), ZR_EINVAL,
           "synthetic corpus: byte tokens need vocab >= 256 (model vocab 255)");
    ZT_ERR(zr_data_open(&d, "synthetic", 256, SYNTH_N, 1), ZR_EINVAL,
           "synthetic corpus: 1048576 tokens, a sample needs T+1 = 1048577");
    ZT_ERR(zr_data_open(&d, "synthetic", 256, 0, 1), ZR_EINVAL, "T is 0");
    ZT_CHECK(!d);
    zr_data_free(NULL);
}

/* The data file at path opened for vocab V, context T and seed is described as desc, holds the N
 * tokens of want, and its first 300 samples are the windows of T + 1 of them at the starts the
 * reference draws for seed. */
static void expect_data(const char *path, uint32_t V, size_t T, uint64_t seed, const char *desc,
                        const int32_t *want, uint64_t N)
{
    zr_data *d;
    ZT_OK(zr_data_open(&d, path, V, T, seed));
    if (strcmp(zr_data_describe(d), desc))
        ZT_FAIL("'%s' is described as '%s', expected '%s'", path, zr_data_describe(d), desc);
    ZT_CHECK_EQ(zr_data_tokens(d), N);
    int32_t *x = malloc((T + 1) * sizeof *x);
    ZT_CHECK(x);
    for (uint64_t i = 0; i < 300; i++) {
        zr_data_sample(d, i, x);
        uint64_t st = ref_start(seed, i, N, T);
        for (size_t k = 0; k <= T; k++)
            ZT_CHECK_EQ(x[k], want[st + k]);
    }
    free(x);
    zr_data_free(d);
}

ZT_TEST(engine_data_text_file)
{
    enum { N = 5000, T = 100 };
    unsigned char bytes[N];
    uint64_t s = 3;
    for (size_t i = 0; i < N; i++)
        bytes[i] = (unsigned char)lcg(&s); /* every byte value, NUL and 0xff included */
    bytes[0] = 0;
    bytes[1] = 255;
    zt_write_bytes("corpus.txt", bytes, N);
    int32_t want[N];
    for (size_t i = 0; i < N; i++)
        want[i] = bytes[i];
    expect_data("corpus.txt", 256, T, 77, "file 'corpus.txt' as raw bytes (5000 tokens)", want,
                N);

    /* exactly T + 1 bytes: one possible sample, the whole file */
    zt_write_bytes("short.txt", bytes, T + 1);
    zr_data *d;
    ZT_OK(zr_data_open(&d, "short.txt", 256, T, 5));
    int32_t x[T + 1];
    for (uint64_t i = 0; i < 10; i++) {
        zr_data_sample(d, i, x);
        ZT_CHECK(!memcmp(x, want, sizeof x));
    }
    zr_data_free(d);

    d = NULL;
    zt_write_bytes("shorter.txt", bytes, T);
    ZT_ERR(zr_data_open(&d, "shorter.txt", 256, T, 5), ZR_EINVAL,
           "data file 'shorter.txt': 100 tokens (bytes), a sample needs T+1 = 101");
    zt_write_bytes("empty.txt", bytes, 0);
    ZT_ERR(zr_data_open(&d, "empty.txt", 256, T, 5), ZR_EINVAL,
           "'empty.txt': 0 tokens (bytes), a sample needs T+1 = 101");
    ZT_ERR(zr_data_open(&d, "corpus.txt", 200, T, 5), ZR_EINVAL,
           "data file 'corpus.txt': raw bytes need vocab >= 256 (model vocab 200)");
    ZT_ERR(zr_data_open(&d, "no-such-file", 256, T, 5), ZR_ENOTFOUND,
           "data file 'no-such-file'");
    ZT_CHECK_EQ(mkdir("adir", 0755), 0);
    ZT_ERR(zr_data_open(&d, "adir", 256, T, 5), ZR_EINVAL, "data file 'adir': adir is a directory, not a regular file");
    ZT_CHECK(!d);
}

/* An llm.c token file: header (magic, version, count) then the tokens. */
static void write_llmc(const char *path, int32_t magic, int32_t version, int32_t count,
                       const uint16_t *tok, size_t n_tok, size_t extra)
{
    size_t bytes = 1024 + 2 * n_tok + extra;
    unsigned char *buf = calloc(1, bytes);
    ZT_CHECK(buf);
    int32_t h[3] = {magic, version, count};
    memcpy(buf, h, sizeof h); /* little-endian hosts, as llm.c itself */
    memcpy(buf + 1024, tok, 2 * n_tok);
    zt_write_bytes(path, buf, bytes);
    free(buf);
}

/* n tokens below V drawn from the lcg seeded with seed */
static void random_tokens(uint16_t *tok, size_t n, uint64_t seed, uint32_t V)
{
    for (size_t i = 0; i < n; i++)
        tok[i] = (uint16_t)(lcg(&seed) % V);
}

ZT_TEST(engine_data_llmc_tokens)
{
    enum { N = 3000, T = 32, V = 50257 };
    uint16_t tok[N];
    random_tokens(tok, N, 11, V);
    tok[7] = V - 1; /* the largest valid token */
    write_llmc("tok.bin", 20240520, 1, N, tok, N, 0);
    int32_t want[N];
    for (size_t i = 0; i < N; i++)
        want[i] = tok[i];
    expect_data("tok.bin", V, T, 9, "llm.c token file 'tok.bin' (3000 tokens)", want, N);
    /* exactly T + 1 tokens */
    write_llmc("min.bin", 20240520, 1, T + 1, tok, T + 1, 0);
    zr_data *d;
    ZT_OK(zr_data_open(&d, "min.bin", V, T, 9));
    int32_t x[T + 1];
    zr_data_sample(d, 123, x);
    ZT_CHECK(!memcmp(x, want, sizeof x));
    zr_data_free(d);
}

ZT_TEST(engine_data_llmc_damaged)
{
    enum { N = 3000, T = 32, V = 1000 };
    uint16_t tok[N];
    random_tokens(tok, N, 12, V);
    zr_data *d = NULL;
    /* bad magic, the rest intact: damaged, not read as bytes */
    write_llmc("f.bin", 20240521, 1, N, tok, N, 0);
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_ECORRUPT,
           "llm.c token file 'f.bin': bad magic 20240521 (expected 20240520)");
    write_llmc("f.bin", 20240520, 3, N, tok, N, 0);
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_ECORRUPT,
           "llm.c token file 'f.bin': version 3 (expected 1, or 2 for uint32 tokens)");
    write_llmc("f.bin", 20240520, 1, N, tok, N - 5, 0); /* truncated: 5 tokens short */
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_ECORRUPT,
           "llm.c token file 'f.bin': truncated (header says 3000 tokens, 7024 bytes; file has "
           "7014)");
    write_llmc("f.bin", 20240520, 1, N, tok, N, 1); /* a byte too many */
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_ECORRUPT,
           "'f.bin': 1 bytes after the 3000 tokens the header declares");
    write_llmc("f.bin", 20240520, 1, -4, tok, N, 0);
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_ECORRUPT, "'f.bin': negative token count -4");
    int32_t h[2] = {20240520, 1};
    zt_write_bytes("f.bin", h, sizeof h); /* the header itself cut short */
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_ECORRUPT,
           "'f.bin': truncated header (8 bytes, expected 1024)");
    /* a token outside the vocabulary: the first one is named with its position */
    tok[1234] = V;
    tok[2000] = V + 500;
    write_llmc("f.bin", 20240520, 1, N, tok, N, 0);
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_EINVAL,
           "llm.c token file 'f.bin': token 1000 at position 1234 is out of the model's "
           "vocabulary (vocab 1000)");
    ZT_OK(zr_data_open(&d, "f.bin", V + 501, T, 1)); /* fine for a larger vocabulary */
    zr_data_free(d);
    d = NULL;
    /* too short for one sample */
    write_llmc("f.bin", 20240520, 1, T, tok, T, 0);
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_EINVAL,
           "llm.c token file 'f.bin': 32 tokens, a sample needs T+1 = 33");
    write_llmc("f.bin", 20240520, 1, 0, tok, 0, 0);
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_EINVAL, "0 tokens, a sample needs T+1");
    /* llm.c's model file is not data */
    write_llmc("f.bin", 20240326, 3, 1024, tok, 100, 0);
    ZT_ERR(zr_data_open(&d, "f.bin", V, T, 1), ZR_EINVAL,
           "data file 'f.bin' is an llm.c model file, not a token file");
    ZT_CHECK(!d);
}
