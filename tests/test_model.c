/*
 * test_model.c: the GPT-2 model of core/model/model.c. Its arena layout against the checkpoint naming
 * contract (zfmt_gpt2_layout); its loss, probabilities and the gradient of every parameter of
 * every tensor against a double-precision reference forward written here (finite differences);
 * determinism of init, forward and gradient accumulation; that plain SGD on a fixed batch
 * learns; and argument errors.
 *
 * The reference finds every tensor through zfmt_gpt2_layout's names and offsets, never through
 * model.c's arithmetic, so a wrong offset in model.c shows up as a gradient mismatch too. The
 * layer functions are static in model.c, so layers are checked through the whole model: each
 * mismatch is reported with the tensor's name, which points at the layer (ln_1, attn.c_attn,
 * attention, mlp.c_fc, gelu, ln_f, the tied head with softmax cross-entropy, the embeddings).
 */
#include "ckutil.h"
#include "harness.h"
#include "zfmt.h"
#include "zr.h"

#include <math.h>

static const char *const kinds[12] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias",
};

static zr_model *new_model(uint32_t L, uint32_t NH, uint32_t C, uint32_t ctx, uint32_t V,
                           size_t max_B)
{
    zr_gpt2_config c = ZR_GPT2(L, NH, C, ctx, V);
    zr_model *m;
    ZT_OK(zr_model_new(&m, &c, max_B));
    return m;
}

static zck_layout *new_layout(const zr_gpt2_config *c)
{
    zfmt_gpt2_config f = {c->layers, c->heads, c->dim, c->ctx, c->vocab};
    zck_layout *lay;
    ZT_OK(zfmt_gpt2_layout(&lay, &f));
    return lay;
}

/* small deterministic generator for test data */
static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}
static double rng_unit(uint64_t *s) { return (double)rng_next(s) / 2147483648.0 * 2 - 1; }

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* A tensor of the layout: its group, and its offset in the whole arena (groups end to end). */
typedef struct {
    char name[64];
    size_t group;
    uint64_t arena_off, numel;
} tinfo;

static size_t layout_tensors(tinfo *out, size_t cap, const zck_layout *lay)
{
    size_t n = 0;
    uint64_t base = 0;
    for (size_t g = 0; g < zck_layout_n_groups(lay); g++) {
        for (size_t t = 0; t < zck_layout_group_n_tensors(lay, g); t++) {
            zck_tensor_info ti;
            zck_layout_tensor(lay, g, t, &ti);
            ZT_CHECK(n < cap);
            snprintf(out[n].name, sizeof out[n].name, "%s", ti.name);
            out[n].group = g;
            out[n].arena_off = base + ti.offset;
            out[n].numel = ti.numel;
            n++;
        }
        base += zck_layout_group_numel(lay, g);
    }
    return n;
}

/* ---------------------------------------------------------------- layout */

ZT_TEST(model_layout_matches_zfmt)
{
    const zr_gpt2_config cfgs[] = {ZR_GPT2(1, 1, 4, 3, 5), ZR_GPT2(3, 4, 16, 7, 50),
                                   ZR_GPT2(2, 3, 24, 16, 257)};
    for (size_t k = 0; k < sizeof cfgs / sizeof *cfgs; k++) {
        const zr_gpt2_config *c = &cfgs[k];
        zr_model *m = new_model(c->layers, c->heads, c->dim, c->ctx, c->vocab, 2);
        zck_layout *lay = new_layout(c);
        ZT_CHECK_EQ(zr_model_n_groups(m), zck_layout_n_groups(lay));
        ZT_CHECK(!memcmp(zr_model_config(m), c, sizeof *c));
        uint64_t total = 0;
        for (size_t g = 0; g < zr_model_n_groups(m); g++) {
            ZT_CHECK_EQ(zr_model_group_numel(m, g), zck_layout_group_numel(lay, g));
            /* groups lie end to end in both arenas */
            ZT_CHECK(zr_model_param(m, g) == zr_model_param(m, 0) + total);
            ZT_CHECK(zr_model_grad(m, g) == zr_model_grad(m, 0) + total);
            total += zr_model_group_numel(m, g);
        }
        ZT_CHECK_EQ(zr_model_numel(m), total);
        uint64_t pb, gb, ab;
        zr_model_bytes(m, &pb, &gb, &ab);
        ZT_CHECK(pb >= total * 4 && gb >= total * 4 && ab > 0);

        /* Tensor offsets, through init_weights: at zfmt's offset of each tensor the model must
         * have put what that tensor gets (LayerNorm weights 1, biases 0, weights N(0, 0.02),
         * residual projections N(0, 0.02/sqrt(2L))). */
        zr_model_init_weights(m, 7);
        const float *p = zr_model_param(m, 0);
        tinfo ts[64];
        size_t nt = layout_tensors(ts, 64, lay);
        ZT_CHECK_EQ(nt, 12 * c->layers + 4);
        for (size_t i = 0; i < nt; i++) {
            const float *x = p + ts[i].arena_off;
            uint64_t n = ts[i].numel;
            if (ends_with(ts[i].name, "ln_1.weight") || ends_with(ts[i].name, "ln_2.weight") ||
                !strcmp(ts[i].name, "ln_f.weight")) {
                for (uint64_t j = 0; j < n; j++)
                    if (x[j] != 1.0f)
                        ZT_FAIL("config %zu: %s[%llu] = %g, expected 1", k, ts[i].name,
                                (unsigned long long)j, x[j]);
                continue;
            }
            if (ends_with(ts[i].name, ".bias")) {
                for (uint64_t j = 0; j < n; j++)
                    if (x[j] != 0.0f)
                        ZT_FAIL("config %zu: %s[%llu] = %g, expected 0", k, ts[i].name,
                                (unsigned long long)j, x[j]);
                continue;
            }
            double want = ends_with(ts[i].name, "c_proj.weight") ? 0.02 / sqrt(2.0 * c->layers)
                                                                  : 0.02;
            double s1 = 0, s2 = 0;
            for (uint64_t j = 0; j < n; j++) {
                if (x[j] == 0.0f || fabsf(x[j]) > 10 * want)
                    ZT_FAIL("config %zu: %s[%llu] = %g, not a N(0, %g) draw", k, ts[i].name,
                            (unsigned long long)j, x[j], want);
                s1 += x[j];
                s2 += (double)x[j] * x[j];
            }
            if (n >= 256) { /* sample std within 25%: > 5 standard errors at n = 256 */
                double mean = s1 / n, sd = sqrt(s2 / n - mean * mean);
                if (fabs(sd - want) > 0.25 * want || fabs(mean) > 5 * want / sqrt((double)n))
                    ZT_FAIL("config %zu: %s: mean %g std %g, expected N(0, %g)", k, ts[i].name,
                            mean, sd, want);
            }
        }
        zck_layout_free(lay);
        zr_model_free(m);
    }
}

/* ---------------------------------------------------------------- double reference */

typedef struct {
    size_t L, NH, C, V;
    uint64_t wte, wpe, lnf_w, lnf_b, h[4][12]; /* arena offsets, from zfmt_gpt2_layout */
} ref_model;

static void ref_init(ref_model *r, const zr_gpt2_config *c)
{
    memset(r, 0, sizeof *r);
    ZT_CHECK(c->layers <= 4);
    r->L = c->layers;
    r->NH = c->heads;
    r->C = c->dim;
    r->V = c->vocab;
    zck_layout *lay = new_layout(c);
    tinfo ts[64];
    size_t nt = layout_tensors(ts, 64, lay);
    for (size_t i = 0; i < nt; i++) {
        const char *n = ts[i].name;
        unsigned l;
        int pos = 0;
        if (!strcmp(n, "wte"))
            r->wte = ts[i].arena_off;
        else if (!strcmp(n, "wpe"))
            r->wpe = ts[i].arena_off;
        else if (!strcmp(n, "ln_f.weight"))
            r->lnf_w = ts[i].arena_off;
        else if (!strcmp(n, "ln_f.bias"))
            r->lnf_b = ts[i].arena_off;
        else if (sscanf(n, "h.%u.%n", &l, &pos) == 1 && pos > 0 && l < 4) {
            size_t k = 0;
            while (k < 12 && strcmp(n + pos, kinds[k]))
                k++;
            ZT_CHECK(k < 12);
            r->h[l][k] = ts[i].arena_off;
        } else
            ZT_FAIL("unexpected tensor %s", n);
    }
    zck_layout_free(lay);
}

static void ref_ln(double *out, const double *x, const double *w, const double *b, size_t N,
                   size_t C)
{
    for (size_t n = 0; n < N; n++) {
        double mu = 0, var = 0;
        for (size_t i = 0; i < C; i++)
            mu += x[n * C + i];
        mu /= C;
        for (size_t i = 0; i < C; i++)
            var += (x[n * C + i] - mu) * (x[n * C + i] - mu);
        var /= C;
        for (size_t i = 0; i < C; i++)
            out[n * C + i] = (x[n * C + i] - mu) / sqrt(var + 1e-5) * w[i] + b[i];
    }
}

/* out[N, OC] = x[N, IC] W[OC, IC]^T + b (b may be NULL) */
static void ref_linear(double *out, const double *x, const double *W, const double *b, size_t N,
                       size_t IC, size_t OC)
{
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double s = b ? b[o] : 0;
            for (size_t i = 0; i < IC; i++)
                s += x[n * IC + i] * W[o * IC + i];
            out[n * OC + o] = s;
        }
}

static double ref_gelu(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* Mean cross-entropy of the model with parameters p (the whole arena, in double); the
 * probabilities go to probs [B*T, V] when not NULL. */
static double ref_loss(const ref_model *r, const double *p, const int32_t *in, const int32_t *tg,
                       size_t B, size_t T, double *probs)
{
    size_t C = r->C, V = r->V, N = B * T;
    double *x = malloc(N * C * sizeof *x), *h = malloc(N * C * sizeof *x);
    double *qkv = malloc(N * 3 * C * sizeof *x), *y = malloc(N * C * sizeof *x);
    double *f = malloc(N * 4 * C * sizeof *x), *lg = malloc(N * V * sizeof *x);
    for (size_t n = 0; n < N; n++)
        for (size_t i = 0; i < C; i++)
            x[n * C + i] = p[r->wte + (size_t)in[n] * C + i] + p[r->wpe + (n % T) * C + i];
    for (size_t l = 0; l < r->L; l++) {
        const uint64_t *o = r->h[l];
        ref_ln(h, x, p + o[0], p + o[1], N, C);
        ref_linear(qkv, h, p + o[2], p + o[3], N, C, 3 * C);
        zt_ref_attention(y, qkv, qkv + C, qkv + 2 * C,
                         &(zt_attn_shape){B, T, r->NH, r->NH, C / r->NH, 3 * C, 3 * C});
        ref_linear(h, y, p + o[4], p + o[5], N, C, C);
        for (size_t i = 0; i < N * C; i++)
            x[i] += h[i];
        ref_ln(h, x, p + o[6], p + o[7], N, C);
        ref_linear(f, h, p + o[8], p + o[9], N, C, 4 * C);
        for (size_t i = 0; i < N * 4 * C; i++)
            f[i] = ref_gelu(f[i]);
        ref_linear(h, f, p + o[10], p + o[11], N, 4 * C, C);
        for (size_t i = 0; i < N * C; i++)
            x[i] += h[i];
    }
    ref_ln(h, x, p + r->lnf_w, p + r->lnf_b, N, C);
    ref_linear(lg, h, p + r->wte, NULL, N, C, V);
    double loss = zt_ref_xent(lg, tg, N, V, probs);
    free(x);
    free(h);
    free(qkv);
    free(y);
    free(f);
    free(lg);
    return loss;
}

/* Parameters for the gradient check: larger than init's so that every path carries signal
 * (attention not uniform, GELU off its linear part), LayerNorm weights around 1. */
static void set_check_params(zr_model *m, const zck_layout *lay, uint64_t seed)
{
    float *p = zr_model_param(m, 0);
    tinfo ts[64];
    size_t nt = layout_tensors(ts, 64, lay);
    for (size_t i = 0; i < nt; i++) {
        int lnw = ends_with(ts[i].name, "ln_1.weight") || ends_with(ts[i].name, "ln_2.weight") ||
                  !strcmp(ts[i].name, "ln_f.weight");
        for (uint64_t j = 0; j < ts[i].numel; j++)
            p[ts[i].arena_off + j] = (float)((lnw ? 1.0 : 0.0) + 0.4 * rng_unit(&seed));
    }
}

/* ---------------------------------------------------------------- gradients */

/*
 * Every parameter's gradient from zr_model_backward against a central difference of the double
 * reference loss (h = 1e-5: truncation ~1e-10, rounding ~1e-11, far below fp32's error).
 * Bound per element: |g - g_ref| <= 1e-6 + 1e-4 |g_ref|; fp32 forward and backward on these
 * sizes (sums of <= 4C terms of magnitude ~1) agree to ~1e-7 absolute (measured worst: 9e-8).
 * The float loss must be within 1e-5 relative of the double one (measured: 5e-8), and the
 * probabilities within 1e-6 absolute.
 */
static void grad_check(uint32_t L, uint32_t NH, uint32_t C, uint32_t ctx, uint32_t V,
                       size_t max_B, size_t B, size_t T, uint64_t per_tensor, uint64_t seed)
{
    zr_model *m = new_model(L, NH, C, ctx, V, max_B);
    const zr_gpt2_config *c = zr_model_config(m);
    zck_layout *lay = new_layout(c);
    ref_model r;
    ref_init(&r, c);
    set_check_params(m, lay, seed);
    int32_t in[256], tg[256];
    ZT_CHECK(B * T <= 256);
    for (size_t i = 0; i < B * T; i++) {
        in[i] = (int32_t)(rng_next(&seed) % V);
        tg[i] = (int32_t)(rng_next(&seed) % V);
    }
    uint64_t n = zr_model_numel(m);
    const float *pf = zr_model_param(m, 0);
    double *pd = malloc(n * sizeof *pd), *probs = malloc(B * T * V * sizeof *probs);
    for (uint64_t i = 0; i < n; i++)
        pd[i] = pf[i];
    double ref = ref_loss(&r, pd, in, tg, B, T, probs);
    /* the model at 1, 2 and 3 threads (zrun's default is 2): each against the reference */
    float *gt[3];
    char what[64];
    snprintf(what, sizeof what, "B=%zu T=%zu", B, T);
    zt_grads_at_threads(m, in, tg, B, T, V, ref, probs, what, gt);

    tinfo ts[64];
    size_t nt = layout_tensors(ts, 64, lay), kinds_seen = 0;
    const double h = 1e-5;
    for (size_t k = 0; k < nt; k++) {
        /* all elements, or per_tensor of them spread evenly, the first and last among them */
        uint64_t nj = ts[k].numel < per_tensor ? ts[k].numel : per_tensor, nz = 0;
        for (uint64_t jj = 0; jj < nj; jj++) {
            uint64_t j = nj > 1 ? jj * (ts[k].numel - 1) / (nj - 1) : 0;
            uint64_t i = ts[k].arena_off + j;
            double save = pd[i];
            pd[i] = save + h;
            double lp = ref_loss(&r, pd, in, tg, B, T, NULL);
            pd[i] = save - h;
            double lm = ref_loss(&r, pd, in, tg, B, T, NULL);
            pd[i] = save;
            double fd = (lp - lm) / (2 * h);
            for (int t = 0; t < 3; t++)
                if (fabs(gt[t][i] - fd) > 1e-6 + 1e-4 * fabs(fd))
                    ZT_FAIL("B=%zu T=%zu, %d threads: d loss / d %s[%llu] = %.9g, finite "
                            "difference %.9g", B, T, t + 1, ts[k].name, (unsigned long long)j,
                            gt[t][i], fd);
            nz += fabs(fd) > 1e-4;
        }
        /* every tensor must carry signal to be a real check: rows of wte no token touches
         * still get gradient through the tied head; wpe rows at t >= T get none; the key third
         * of c_attn.bias gets exactly 0 (it shifts a softmax row by a constant) */
        if (strcmp(ts[k].name, "wpe") && nz < nj / 2)
            ZT_FAIL("%s: only %llu of %llu gradients are non-negligible", ts[k].name,
                    (unsigned long long)nz, (unsigned long long)nj);
        kinds_seen++;
    }
    ZT_CHECK_EQ(kinds_seen, 12 * L + 4);
    /* positions t >= T exist in wpe but take no part: exactly zero gradient */
    const float *gwpe = gt[0] + (zr_model_grad(m, 1) - zr_model_grad(m, 0));
    for (size_t i = T * C; i < (size_t)ctx * C; i++)
        ZT_CHECK(gwpe[i] == 0.0f);
    for (int t = 0; t < 3; t++)
        free(gt[t]);
    free(pd);
    free(probs);
    zck_layout_free(lay);
    zr_model_free(m);
}

ZT_TEST(model_grad_check)
{
    /* every parameter: L=2, NH=2, C=8, ctx 6 > T, V=11; the activation arena holds max_B 3 */
    grad_check(2, 2, 8, 6, 11, 3, 2, 5, UINT64_MAX, 1);
    grad_check(2, 2, 8, 6, 11, 3, 3, 2, UINT64_MAX, 2); /* another B, T in the same arena */
    grad_check(1, 4, 8, 4, 7, 1, 1, 4, UINT64_MAX, 3);  /* head size 2, a single sequence */
    /* head size 12: the 8-wide inner loops and their scalar tails; 40 elements of each
     * tensor */
    grad_check(1, 2, 24, 5, 13, 2, 2, 5, 40, 4);
    /* T = 140 > 2 x 64: attention in three blocks of rows and columns (64, 64, 12), the
     * causal mask inside the diagonal blocks, and blocks below it; 24 elements of each tensor */
    grad_check(1, 2, 8, 150, 11, 1, 1, 140, 24, 5);
}

/* ---------------------------------------------------------------- determinism */

ZT_TEST(model_determinism)
{
    zr_model *a = new_model(2, 2, 16, 8, 32, 2), *b = new_model(2, 2, 16, 8, 32, 2);
    size_t n = zr_model_numel(a), bytes = n * sizeof(float);
    zr_model_init_weights(a, 42);
    zr_model_init_weights(b, 42);
    ZT_CHECK(!memcmp(zr_model_param(a, 0), zr_model_param(b, 0), bytes));
    zr_model_init_weights(b, 43);
    ZT_CHECK(memcmp(zr_model_param(a, 0), zr_model_param(b, 0), bytes));
    /* init overwrites everything: whatever was there before does not matter */
    memset(zr_model_param(b, 0), 0x7f, bytes);
    zr_model_init_weights(b, 42);
    ZT_CHECK(!memcmp(zr_model_param(a, 0), zr_model_param(b, 0), bytes));

    int32_t in[16], tg[16];
    uint64_t s = 5;
    for (int i = 0; i < 16; i++) {
        in[i] = (int32_t)(rng_next(&s) % 32);
        tg[i] = (int32_t)(rng_next(&s) % 32);
    }
    float l1, l2;
    ZT_OK(zr_model_forward(a, in, tg, 2, 8, &l1));
    float *p1 = malloc(16 * 32 * sizeof(float));
    memcpy(p1, zr_model_probs(a), 16 * 32 * sizeof(float));
    ZT_OK(zr_model_forward(a, in, tg, 2, 8, &l2));
    ZT_CHECK(!memcmp(&l1, &l2, sizeof l1));
    ZT_CHECK(!memcmp(p1, zr_model_probs(a), 16 * 32 * sizeof(float)));
    ZT_CHECK(l1 > 3.0f && l1 < 4.0f); /* ~ln 32 = 3.47 at init */

    /* without targets: same probabilities, loss 0 */
    float l3 = -1;
    ZT_OK(zr_model_forward(b, in, NULL, 2, 8, &l3));
    ZT_CHECK(l3 == 0.0f);
    ZT_CHECK(!memcmp(p1, zr_model_probs(b), 16 * 32 * sizeof(float)));

    /* accumulation: backward(0.5) twice == backward(1) once (up to BLAS summation order) */
    float *g1 = malloc(bytes);
    zr_model_zero_grad(a);
    ZT_OK(zr_model_backward(a, 0.5f));
    ZT_OK(zr_model_backward(a, 0.5f));
    memcpy(g1, zr_model_grad(a, 0), bytes);
    ZT_CHECK(!memcmp(p1, zr_model_probs(a), 16 * 32 * sizeof(float))); /* backward keeps them */
    zr_model_zero_grad(a);
    ZT_OK(zr_model_backward(a, 1.0f));
    const float *g2 = zr_model_grad(a, 0);
    double gmax = 0;
    for (size_t i = 0; i < n; i++)
        gmax = fabs(g2[i]) > gmax ? fabs(g2[i]) : gmax;
    ZT_CHECK(gmax > 0);
    for (size_t i = 0; i < n; i++)
        if (fabs(g1[i] - g2[i]) > 1e-6 * gmax)
            ZT_FAIL("grad[%zu]: 2 x backward(0.5) = %.9g, backward(1) = %.9g", i, g1[i], g2[i]);
    /* and the same again: the gradient is a function of the step only */
    zr_model_zero_grad(a);
    ZT_OK(zr_model_backward(a, 1.0f));
    memcpy(g1, zr_model_grad(a, 0), bytes);
    zr_model_zero_grad(a);
    ZT_OK(zr_model_forward(a, in, tg, 2, 8, &l2));
    ZT_OK(zr_model_backward(a, 1.0f));
    ZT_CHECK(!memcmp(g1, zr_model_grad(a, 0), bytes));
    zr_model_zero_grad(a);
    for (size_t i = 0; i < n; i++)
        ZT_CHECK(zr_model_grad(a, 0)[i] == 0.0f);
    free(g1);
    free(p1);
    zr_model_free(a);
    zr_model_free(b);
}

/* ---------------------------------------------------------------- training */

ZT_TEST(model_sgd_learns_fixed_batch)
{
    enum { B = 4, T = 16, V = 64 };
    zr_model *m = new_model(2, 2, 32, T, V, B);
    zr_model_init_weights(m, 1);
    int32_t tok[B * T + 1], tg[B * T];
    uint64_t s = 9;
    for (int i = 0; i <= B * T; i++)
        tok[i] = (int32_t)(rng_next(&s) % V);
    for (int i = 0; i < B * T; i++)
        tg[i] = tok[i + 1];
    uint64_t n = zr_model_numel(m);
    float first = 0, loss = 0;
    for (int step = 0; step < 40; step++) {
        zr_model_zero_grad(m);
        ZT_OK(zr_model_forward(m, tok, tg, B, T, &loss));
        ZT_CHECK(isfinite(loss));
        if (step == 0)
            first = loss;
        ZT_OK(zr_model_backward(m, 1.0f));
        float *p = zr_model_param(m, 0);
        const float *g = zr_model_grad(m, 0);
        for (uint64_t i = 0; i < n; i++)
            p[i] -= 0.1f * g[i];
    }
    ZT_CHECK(fabsf(first - logf(V)) < 0.1f); /* init: nearly uniform predictions */
    if (!(loss < 0.7f * first))
        ZT_FAIL("loss %g after 40 SGD steps, from %g: expected a 30%% drop", loss, first);
    zr_model_free(m);
}

/* ---------------------------------------------------------------- errors */

ZT_TEST(model_errors)
{
    zr_model *m;
    zr_gpt2_config c = ZR_GPT2(2, 3, 8, 4, 11);
    ZT_ERR(zr_model_new(&m, &c, 1), ZR_EINVAL, "dim 8 is not a multiple of heads 3");
    c = (zr_gpt2_config)ZR_GPT2(0, 2, 8, 4, 11);
    ZT_ERR(zr_model_new(&m, &c, 1), ZR_EINVAL, "layers is 0");
    c = (zr_gpt2_config)ZR_GPT2(1, 2, 8, 4, 0);
    ZT_ERR(zr_model_new(&m, &c, 1), ZR_EINVAL, "vocab is 0");
    c = (zr_gpt2_config)ZR_GPT2(1, 2, 8, 4, 11);
    ZT_ERR(zr_model_new(&m, &c, 0), ZR_EINVAL, "max batch 0");
    c = (zr_gpt2_config)ZR_GPT2(1, 1, 8, 1u << 20, 11);
    ZT_ERR(zr_model_new(&m, &c, 1u << 12), ZR_EINVAL, "BLAS int range");

    m = new_model(1, 2, 8, 4, 11, 2);
    zr_model_init_weights(m, 1);
    int32_t in[12] = {1, 2, 3, 4, 5, 6, 7, 8, 99, -5, 0, 1}, tg[12] = {0};
    float loss;
    ZT_ERR(zr_model_backward(m, 1.0f), ZR_EINVAL, "no forward");
    ZT_ERR(zr_model_forward(m, in, tg, 3, 4, &loss), ZR_EINVAL,
           "B = 3 out of range (expected 1..2)");
    ZT_ERR(zr_model_forward(m, in, tg, 0, 4, &loss), ZR_EINVAL, "B = 0 out of range");
    ZT_ERR(zr_model_forward(m, in, tg, 2, 5, &loss), ZR_EINVAL,
           "T = 5 out of range (expected 1..4");
    ZT_ERR(zr_model_forward(m, in, tg, 2, 0, &loss), ZR_EINVAL, "T = 0 out of range");
    in[3] = 11;
    ZT_ERR(zr_model_forward(m, in, tg, 2, 4, &loss), ZR_EINVAL,
           "inputs[3] = 11 is not a token id (vocab 11)");
    in[3] = -1;
    ZT_ERR(zr_model_forward(m, in, tg, 2, 4, &loss), ZR_EINVAL, "inputs[3] = -1");
    in[3] = 4;
    ZT_OK(zr_model_forward(m, in, tg, 2, 4, &loss)); /* the ids only up to B*T count */
    tg[7] = 11;
    ZT_ERR(zr_model_forward(m, in, tg, 2, 4, &loss), ZR_EINVAL, "targets[7] = 11");
    /* a rejected forward leaves the previous one in place for backward */
    ZT_OK(zr_model_backward(m, 1.0f));
    ZT_OK(zr_model_forward(m, in, NULL, 2, 4, &loss));
    ZT_ERR(zr_model_backward(m, 1.0f), ZR_EINVAL, "had no targets");
    zr_model_free(m);
}

/* a params hook lending another model's arena, whose params_done fails at call fail_at */
typedef struct {
    zr_model *src;
    int done, fail_at;
} failing_lender;

static int fl_params(void *ctx, size_t g, const float **out)
{
    *out = zr_model_param(((failing_lender *)ctx)->src, g);
    return 0;
}

static int fl_params_done(void *ctx, size_t g)
{
    failing_lender *l = ctx;
    if (++l->done == l->fail_at)
        return zr_err_set(ZR_EIO, "lender: releasing group %zu failed", g);
    return 0;
}

ZT_TEST(model_params_done_failure_is_returned)
{
    zr_model *src = new_model(1, 2, 8, 4, 11, 2), *m;
    zr_model_init_weights(src, 1);
    failing_lender l = {src, 0, 2};
    zr_model_hooks hk = {.ctx = &l, .params = fl_params, .params_done = fl_params_done};
    zr_gpt2_config c = ZR_GPT2(1, 2, 8, 4, 11);
    ZT_OK(zr_model_new_ext(&m, &c, 2, 4, &hk));
    int32_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[8] = {0};
    float loss;
    /* the forward's second release (wte's, after the embedding) fails: the forward says so */
    ZT_ERR(zr_model_forward(m, in, tg, 2, 4, &loss), ZR_EIO, "releasing group 0 failed");
    l.done = 0;
    l.fail_at = 0;
    ZT_OK(zr_model_forward(m, in, tg, 2, 4, &loss));
    /* and the backward's first */
    l.fail_at = l.done + 1;
    ZT_ERR(zr_model_backward(m, 1.0f), ZR_EIO, "lender: releasing group");
    zr_model_free(m);
    zr_model_free(src);
}
