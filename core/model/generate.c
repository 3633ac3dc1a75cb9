/*
 * generate.c: inference and sampling for the GPT-2 of model.c and the Llama of llama.c (zr.h,
 * "generation"), from a full fp32 parameter arena in the checkpoint layout (zr_gpt2_offsets;
 * zr_llama_offsets). Llama's cache holds the KV heads only (grouped-query attention: query
 * head h reads KV head h / (H / KV)), its keys rotated at their cache position. A KV cache keeps, per layer,
 * the keys and values of every position fed so far, so a new token costs one position's
 * forward (its attention reads the cached positions): generating n tokens costs O(n) forwards
 * of one position, not O(n^2). The maths is model.c's (pre-LN blocks, tanh GELU, tied head;
 * its LayerNorm and GELU are model.c's functions; Llama's RMSNorm is llama.c's);
 * the loops are written for a few rows at a time, matmuls through cblas_sgemm with the rows
 * fed in one call (the prompt) or one (each new token).
 *
 * Sampling: temperature 0 is the argmax (lowest id on a tie); otherwise softmax(logits / T)
 * over the top_k largest logits (0: all), cut to the nucleus of top_p (the fewest best tokens
 * whose probabilities reach top_p; transformers' order: temperature, top-k, top-p), one uniform
 * draw from an RNG of our own (splitmix64, integer arithmetic only) picking by the cumulative
 * sum in a fixed order, so a seed gives the same tokens on any machine for the same logits.
 * zr_gen_run stops after an end-of-text id when given one, and gives each token's
 * log-probability under the model (before temperature) when asked.
 *
 * Past the context: zr_gen_run keeps a sliding window. When the cache is full it keeps the
 * newest ctx/2 tokens of the text, recomputes the cache from them and goes on (a recompute every
 * ctx/2 tokens: the cost stays linear).
 *
 * Shapes in comments: n new rows, C channels, NH heads, hs = C / NH, V vocabulary, ctx the
 * cache's positions.
 */
#include "model_int.h"
#include "fastmath.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct zr_gen {
    zr_gpt2_config c;
    zr_gpt2_offsets off;     /* GPT-2 */
    zr_llama_offsets loff;  /* Llama */
    float *rcos, *rsin;      /* Llama: the rotary table [ctx, hd / 2] */
    const float *p;          /* the parameter arena (borrowed) */
    size_t pos;              /* positions in the cache */
    size_t max_rows;         /* rows a feed computes at once */
    float *kcache, *vcache;  /* [L, ctx, KVD] each (KVD = C for GPT-2) */
    /* [max_rows, C], [.., C], [.., 3C] (Llama: q [.., C]), [.., C], [.., 4C] (Llama: gate and
     * up [.., 2I]) */
    float *x, *ln, *qkv, *y, *h;
    float *att;              /* [ctx]: one attention row */
    float *logits;           /* [V] */
};

#define ROWS_MAX 64 /* rows per chunk of a long feed (the prompt) */

/* The parameters' offsets of c's family. */
static int gen_offsets(zr_gen *g, const zr_config *c)
{
    if (c->family == ZR_FAMILY_LLAMA) {
        ZR_TRY(zr_llama_offsets_get(&g->loff, c));
        size_t half = c->dim / c->heads / 2;
        if (!(g->rcos = malloc(c->ctx * half * sizeof(float) + 1)) ||
            !(g->rsin = malloc(c->ctx * half * sizeof(float) + 1)))
            return zr_err_set(ZR_ENOMEM, "generate: out of memory");
        zr__llama_rope_table(g->rcos, g->rsin, c->ctx, 2 * half, c->rope_theta);
        return 0;
    }
    return zr_gpt2_offsets_get(&g->off, c);
}

int zr_gen_new(zr_gen **out, const zr_gpt2_config *c, const float *params)
{
    assert(out && c && params);
    *out = NULL;
    zr_gen *g = calloc(1, sizeof *g);
    if (!g)
        return zr_err_set(ZR_ENOMEM, "generate: out of memory");
    g->c = *c;
    g->p = params;
    int rc = gen_offsets(g, c);
    if (rc < 0) {
        zr_gen_free(g);
        return rc;
    }
    int llama = c->family == ZR_FAMILY_LLAMA;
    size_t C = c->dim, L = c->layers, T = c->ctx, R = T < ROWS_MAX ? T : ROWS_MAX;
    size_t KVD = llama ? (size_t)c->kv_heads * (C / c->heads) : C;
    size_t HW = llama ? 2 * (size_t)c->ffn : 4 * C;
    g->max_rows = R;
    double cache = 2.0 * L * T * KVD * sizeof(float);
    if (cache > 0x1p40) {
        zr_gen_free(g);
        return zr_err_set(ZR_EINVAL, "generate: a KV cache of %.3g bytes (layers %zu, ctx %zu, "
                          "dim %zu) is too large", cache, L, T, KVD);
    }
    g->kcache = malloc(L * T * KVD * sizeof(float));
    g->vcache = malloc(L * T * KVD * sizeof(float));
    g->x = malloc(R * C * sizeof(float));
    g->ln = malloc(R * C * sizeof(float));
    g->qkv = malloc(R * 3 * C * sizeof(float));
    g->y = malloc(R * C * sizeof(float));
    g->h = malloc(R * HW * sizeof(float));
    g->att = malloc(T * sizeof(float));
    g->logits = malloc((size_t)c->vocab * sizeof(float));
    if (!g->kcache || !g->vcache || !g->x || !g->ln || !g->qkv || !g->y || !g->h || !g->att ||
        !g->logits) {
        zr_gen_free(g);
        return zr_err_set(ZR_ENOMEM, "generate: out of memory for a KV cache of %.1f MiB",
                          cache / (1 << 20));
    }
    *out = g;
    return 0;
}

void zr_gen_free(zr_gen *g)
{
    if (!g)
        return;
    free(g->kcache);
    free(g->vcache);
    free(g->x);
    free(g->ln);
    free(g->qkv);
    free(g->y);
    free(g->h);
    free(g->att);
    free(g->logits);
    free(g->rcos);
    free(g->rsin);
    free(g);
}

void zr_gen_reset(zr_gen *g) { g->pos = 0; }
size_t zr_gen_pos(const zr_gen *g) { return g->pos; }

/* ---------------------------------------------------------------- one chunk of rows */

/* out[n, OC] = (acc ? out : bias) + in[n, IC] W[OC, IC]^T (+ bias when acc) */
static void linear(float *out, const float *in, const float *W, const float *bias, size_t n,
                   size_t IC, size_t OC, int acc)
{
    for (size_t r = 0; r < n; r++)
        for (size_t o = 0; o < OC; o++)
            out[r * OC + o] = acc ? out[r * OC + o] + bias[o] : bias[o];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)OC, (int)IC, 1.0f, in,
                (int)IC, W, (int)IC, 1.0f, out, (int)OC);
}

/* y[r] = softmax(q k^T / sqrt(hs)) v per head over the cached positions 0..pos0 + r of layer
 * caches K, V [ctx, KVD]; q in qkv, rows qs apart; query head h reads KV head h / group
 * (grouped-query attention; GPT-2: group 1, KVD = C). */
static void attend(zr_gen *g, const float *K, const float *V, size_t pos0, size_t n, size_t qs,
                   size_t KVD, size_t group)
{
    size_t C = g->c.dim, NH = g->c.heads, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (size_t r = 0; r < n; r++) {
        size_t len = pos0 + r + 1;
        for (size_t h = 0; h < NH; h++) {
            const float *q = g->qkv + r * qs + h * hs;
            float *y = g->y + r * C + h * hs, maxv = -INFINITY, sum = 0;
            size_t kh = h / group * hs;
            for (size_t t = 0; t < len; t++) {
                const float *k = K + t * KVD + kh;
                float s = 0;
                for (size_t i = 0; i < hs; i++)
                    s += q[i] * k[i];
                g->att[t] = s * scale;
                maxv = g->att[t] > maxv ? g->att[t] : maxv;
            }
            for (size_t t = 0; t < len; t++) {
                g->att[t] = zr_expf(g->att[t] - maxv);
                sum += g->att[t];
            }
            memset(y, 0, hs * sizeof *y);
            for (size_t t = 0; t < len; t++) {
                const float *v = V + t * KVD + kh;
                float w = g->att[t] / sum;
                for (size_t i = 0; i < hs; i++)
                    y[i] += w * v[i];
            }
        }
    }
}

/* Rows pos .. pos+n-1 (n <= max_rows) through the blocks: the cache filled, g->x the last
 * residual stream of each row. */
static void forward_rows(zr_gen *g, const int32_t *tok, size_t n)
{
    size_t C = g->c.dim, L = g->c.layers, T = g->c.ctx, pos = g->pos;
    const zr_gpt2_offsets *o = &g->off;
    const float *wte = g->p + o->wte, *wpe = g->p + o->wpe;
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < C; i++)
            g->x[r * C + i] = wte[(size_t)tok[r] * C + i] + wpe[(pos + r) * C + i];
    for (size_t l = 0; l < L; l++) {
        const float *P = g->p + o->h0 + l * o->layer_numel;
#define W(kind) (P + o->blk[ZR_BLK_##kind])
        float *K = g->kcache + l * T * C, *V = g->vcache + l * T * C;
        zr__layernorm_forward(g->ln, NULL, NULL, g->x, W(LN1W), W(LN1B), n, C);
        linear(g->qkv, g->ln, W(QKVW), W(QKVB), n, C, 3 * C, 0);
        for (size_t r = 0; r < n; r++) {
            memcpy(K + (pos + r) * C, g->qkv + r * 3 * C + C, C * sizeof(float));
            memcpy(V + (pos + r) * C, g->qkv + r * 3 * C + 2 * C, C * sizeof(float));
        }
        attend(g, K, V, pos, n, 3 * C, C, 1);
        linear(g->x, g->y, W(ATTPROJW), W(ATTPROJB), n, C, C, 1);
        zr__layernorm_forward(g->ln, NULL, NULL, g->x, W(LN2W), W(LN2B), n, C);
        linear(g->h, g->ln, W(FCW), W(FCB), n, C, 4 * C, 0);
        zr__gelu_forward(g->h, g->h, n * 4 * C);
        linear(g->x, g->h, W(FCPROJW), W(FCPROJB), n, 4 * C, C, 1);
#undef W
    }
    g->pos += n;
}

/* ---------------------------------------------------------------- Llama rows */

/* out[n, OC] (rows ldo apart) = beta out + in[n, IC] W[OC, IC]^T */
static void mm(float *out, const float *in, const float *W, size_t n, size_t IC, size_t OC,
               size_t ldo, float beta)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)OC, (int)IC, 1.0f, in,
                (int)IC, W, (int)IC, beta, out, (int)ldo);
}

/* Rotate-half rotary positions on nh heads of hd channels of row x at the table's row cs, sn. */
static void rope_row(float *x, size_t nh, size_t hd, const float *cs, const float *sn)
{
    size_t half = hd / 2;
    for (size_t h = 0; h < nh; h++, x += hd)
        for (size_t i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cs[i] - x2 * sn[i];
            x[i + half] = x2 * cs[i] + x1 * sn[i];
        }
}

/* Llama's rows pos .. pos+n-1 through the blocks (llama.c's maths): the cache filled, g->x the
 * last residual stream of each row. */
static void llama_rows(zr_gen *g, const int32_t *tok, size_t n)
{
    const zr_config *c = &g->c;
    size_t C = c->dim, T = c->ctx, H = c->heads, KV = c->kv_heads, hd = C / H, KVD = KV * hd;
    size_t FF = c->ffn, half = hd / 2, pos = g->pos;
    const zr_llama_offsets *o = &g->loff;
    float eps = (float)c->norm_eps;
    for (size_t r = 0; r < n; r++)
        memcpy(g->x + r * C, g->p + o->embed + (size_t)tok[r] * C, C * sizeof(float));
    for (size_t l = 0; l < c->layers; l++) {
        const float *P = g->p + o->layer0 + l * o->layer_numel;
#define W(which) (P + o->role[ZR_LL_##which])
        float *K = g->kcache + l * T * KVD, *V = g->vcache + l * T * KVD;
        zr__rmsnorm_forward(g->ln, NULL, g->x, W(LN1), n, C, eps);
        mm(g->qkv, g->ln, W(Q), n, C, C, C, 0.0f);
        mm(K + pos * KVD, g->ln, W(K), n, C, KVD, KVD, 0.0f);
        mm(V + pos * KVD, g->ln, W(V), n, C, KVD, KVD, 0.0f);
        for (size_t r = 0; r < n; r++) {
            const float *cs = g->rcos + (pos + r) * half, *sn = g->rsin + (pos + r) * half;
            rope_row(g->qkv + r * C, H, hd, cs, sn);
            rope_row(K + (pos + r) * KVD, KV, hd, cs, sn);
        }
        attend(g, K, V, pos, n, C, KVD, H / KV);
        mm(g->x, g->y, W(O), n, C, C, C, 1.0f);
        zr__rmsnorm_forward(g->ln, NULL, g->x, W(LN2), n, C, eps);
        float *gate = g->h, *up = g->h + n * FF;
        mm(gate, g->ln, W(GATE), n, C, FF, FF, 0.0f);
        mm(up, g->ln, W(UP), n, C, FF, FF, 0.0f);
        for (size_t i = 0; i < n * FF; i++)
            gate[i] = gate[i] / (1.0f + zr_expf(-gate[i])) * up[i];
        mm(g->x, gate, W(DOWN), n, FF, C, C, 1.0f);
#undef W
    }
    g->pos += n;
}

int zr_gen_feed(zr_gen *g, const int32_t *tok, size_t n, const float **logits)
{
    assert(g && (tok || !n));
    size_t C = g->c.dim, V = g->c.vocab;
    if (n == 0)
        return zr_err_set(ZR_EINVAL, "generate: no tokens to feed");
    if (n > g->c.ctx - g->pos)
        return zr_err_set(ZR_EINVAL, "generate: %zu positions past the %zu in the cache exceed "
                          "the context of %u", n, g->pos, g->c.ctx);
    for (size_t i = 0; i < n; i++)
        if (tok[i] < 0 || (uint32_t)tok[i] >= V)
            return zr_err_set(ZR_EINVAL, "generate: token %zu is %d, not an id of the "
                              "vocabulary (0..%zu)", i, tok[i], V - 1);
    size_t last = 0;
    for (size_t done = 0; done < n; done += last) {
        last = n - done < g->max_rows ? n - done : g->max_rows;
        if (g->c.family == ZR_FAMILY_LLAMA)
            llama_rows(g, tok + done, last);
        else
            forward_rows(g, tok + done, last);
    }
    /* the head on the last row: the final norm, then logits [V] = head [V, C] x (GPT-2: ln_f
     * and wte; Llama: norm and lm_head, or embed_tokens when tied) */
    const float *head;
    if (g->c.family == ZR_FAMILY_LLAMA) {
        zr__rmsnorm_forward(g->ln, NULL, g->x + (last - 1) * C, g->p + g->loff.norm, 1, C,
                            (float)g->c.norm_eps);
        head = g->p + g->loff.head;
    } else {
        const float *lnf = g->p + g->off.ln_f;
        zr__layernorm_forward(g->ln, NULL, NULL, g->x + (last - 1) * C, lnf + g->off.lnf_w,
                              lnf + g->off.lnf_b, 1, C);
        head = g->p + g->off.wte;
    }
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)V, (int)C, 1.0f, head, (int)C, g->ln, 1, 0.0f,
                g->logits, 1);
    if (logits)
        *logits = g->logits;
    return 0;
}

/* ---------------------------------------------------------------- random numbers, sampling */

/* splitmix64 (Steele, Lea, Flood 2014): state += golden; output mixed from it */
void zr_rng_seed(zr_rng *r, uint64_t seed) { r->s = seed; }

uint64_t zr_rng_next(zr_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double zr_rng_uniform(zr_rng *r) { return (double)(zr_rng_next(r) >> 11) * 0x1.0p-53; }

/* a before b: a larger logit, or the same and a lower id */
static int before(const float *lg, int32_t a, int32_t b)
{
    return lg[a] > lg[b] || (lg[a] == lg[b] && a < b);
}

/* The k best ids of logits [V], best first, into idx[k] (insertion into a sorted list: k is
 * small next to V). */
static void top_k(int32_t *idx, const float *lg, size_t V, size_t k)
{
    size_t have = 0;
    for (size_t v = 0; v < V; v++) {
        if (have == k && !before(lg, (int32_t)v, idx[k - 1]))
            continue;
        size_t i = have < k ? have++ : k - 1;
        while (i > 0 && before(lg, (int32_t)v, idx[i - 1])) {
            idx[i] = idx[i - 1];
            i--;
        }
        idx[i] = (int32_t)v;
    }
}

/* qsort_r's order: before() over the logits in ctx */
static int cmp_before(const void *a, const void *b, void *ctx)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return before(ctx, x, y) ? -1 : before(ctx, y, x) ? 1 : 0;
}

/* The k best ids of logits [V] into idx[k], best first (ties: the lower id) when sorted is set
 * (top_p needs the order) or k < V, else in id order. */
static void candidates(int32_t *idx, const float *lg, size_t V, size_t k, int sorted)
{
    if (k < V) {
        top_k(idx, lg, V, k);
        return;
    }
    for (size_t i = 0; i < k; i++)
        idx[i] = (int32_t)i;
    if (sorted)
        qsort_r(idx, k, sizeof *idx, cmp_before, (void *)lg);
}

/* The nucleus: how many of the weights w[k] (best first, sum their total) to keep: each token
 * whose better ones sum to less than top_p of the total (transformers' TopPLogitsWarper drops
 * a token when the ones no better than it sum to at most 1 - top_p), at least one. *sum becomes
 * the kept ones' total. */
static size_t nucleus(const double *w, size_t k, double top_p, double *sum)
{
    double acc = 0, cut = top_p * *sum;
    size_t keep = 0;
    while (keep < k && (keep == 0 || acc < cut))
        acc += w[keep++];
    *sum = acc;
    return keep;
}

static int check_opts(const zr_sample_opts *o)
{
    if (!(o->temperature >= 0) || !isfinite(o->temperature))
        return zr_err_set(ZR_EINVAL, "sample: temperature %g (expected a finite number >= 0)",
                          (double)o->temperature);
    if (!(o->top_p > 0 && o->top_p <= 1))
        return zr_err_set(ZR_EINVAL, "sample: top_p %g (expected a number above 0 and at most "
                          "1; 1: off)", (double)o->top_p);
    return 0;
}

int zr_sample_token(int32_t *out, const float *logits, uint32_t V, const zr_sample_opts *o,
                    zr_rng *rng)
{
    assert(out && logits && o && rng);
    ZR_TRY(check_opts(o));
    for (uint32_t v = 0; v < V; v++)
        if (!isfinite(logits[v]))
            return zr_err_set(ZR_EINVAL, "sample: logit %u is %g (the model's parameters are "
                              "not finite?)", v, (double)logits[v]);
    size_t k = o->top_k && o->top_k < V ? o->top_k : V;
    if (o->temperature == 0 || k == 1) {
        int32_t best = 0;
        for (uint32_t v = 1; v < V; v++)
            if (before(logits, (int32_t)v, best))
                best = (int32_t)v;
        *out = best;
        return 0;
    }
    int32_t *idx = calloc(k, sizeof *idx); /* calloc: GCC -O1 cannot see that k >= 1 */
    double *w = malloc(k * sizeof *w);
    if (!idx || !w) {
        free(idx);
        free(w);
        return zr_err_set(ZR_ENOMEM, "sample: out of memory");
    }
    int nuc = o->top_p < 1;
    candidates(idx, logits, V, k, nuc);
    float maxv = logits[idx[0]];
    for (size_t i = 1; i < k; i++)
        maxv = logits[idx[i]] > maxv ? logits[idx[i]] : maxv;
    double sum = 0;
    for (size_t i = 0; i < k; i++)
        sum += w[i] = exp(((double)logits[idx[i]] - maxv) / o->temperature);
    if (nuc)
        k = nucleus(w, k, o->top_p, &sum);
    double u = zr_rng_uniform(rng) * sum, acc = 0;
    *out = idx[k - 1];
    for (size_t i = 0; i < k; i++)
        if (u < (acc += w[i])) {
            *out = idx[i];
            break;
        }
    free(idx);
    free(w);
    return 0;
}

double zr_logprob(const float *logits, uint32_t V, int32_t id)
{
    assert(logits && id >= 0 && (uint32_t)id < V);
    double maxv = logits[0], sum = 0;
    for (uint32_t v = 1; v < V; v++)
        maxv = logits[v] > maxv ? logits[v] : maxv;
    for (uint32_t v = 0; v < V; v++)
        sum += exp((double)logits[v] - maxv);
    return (double)logits[id] - maxv - log(sum);
}

/* ---------------------------------------------------------------- the generation loop */

int zr_gen_run(zr_gen *g, int32_t *out, const int32_t *prompt, size_t n_prompt, size_t n_new,
               const zr_sample_opts *o)
{
    assert(g && out && prompt && o);
    size_t T = g->c.ctx;
    if (n_prompt == 0)
        return zr_err_set(ZR_EINVAL, "generate: empty prompt (at least one token)");
    if (n_prompt > T)
        return zr_err_set(ZR_EINVAL, "generate: the prompt has %zu tokens, more than the "
                          "model's context of %zu", n_prompt, T);
    int32_t *text = malloc((n_prompt + n_new) * sizeof *text);
    if (!text)
        return zr_err_set(ZR_ENOMEM, "generate: out of memory");
    memcpy(text, prompt, n_prompt * sizeof *text);
    size_t len = n_prompt;
    zr_rng rng;
    zr_rng_seed(&rng, o->seed);
    const float *logits;
    zr_gen_reset(g);
    if (o->n_out)
        *o->n_out = 0;
    int rc = zr_gen_feed(g, text, len, &logits);
    for (size_t i = 0; !rc && i < n_new; i++) {
        int32_t t;
        if ((rc = zr_sample_token(&t, logits, g->c.vocab, o, &rng)) < 0)
            break;
        out[i] = text[len++] = t;
        if (o->logprobs)
            o->logprobs[i] = (float)zr_logprob(logits, g->c.vocab, t);
        if (o->n_out)
            *o->n_out = i + 1;
        if (o->emit)
            o->emit(o->emit_ctx, t);
        if (i + 1 == n_new || t == o->eos)
            break;
        if (g->pos == T) { /* the window slides: the newest ctx/2 tokens again */
            size_t keep = T / 2 ? T / 2 : 1;
            zr_gen_reset(g);
            rc = zr_gen_feed(g, text + len - keep, keep, &logits);
        } else
            rc = zr_gen_feed(g, &t, 1, &logits);
    }
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- bytes as text */

int zr_gen_bytes_encode(int32_t **ids, const char *text, size_t len)
{
    if (!(*ids = malloc((len ? len : 1) * sizeof **ids)))
        return zr_err_set(ZR_ENOMEM, "out of memory for a prompt of %zu bytes", len);
    for (size_t i = 0; i < len; i++)
        (*ids)[i] = (unsigned char)text[i];
    return 0;
}

size_t zr_gen_bytes_decode(char *out, size_t cap, const int32_t *ids, size_t n)
{
    size_t w = 0;
    if (!cap)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char buf[24];
        size_t k = 1;
        if (ids[i] >= 0 && ids[i] < 256)
            buf[0] = (char)ids[i];
        else
            k = (size_t)snprintf(buf, sizeof buf, "<|%d|>", ids[i]);
        if (w + k >= cap)
            break;
        memcpy(out + w, buf, k);
        w += k;
    }
    out[w] = 0;
    return w;
}

/* ---------------------------------------------------------------- parameters of a checkpoint */

int zr_gen_load_params(float **out, zr_gpt2_config *cfg, const char *path, unsigned jobs)
{
    assert(out && cfg && path);
    *out = NULL;
    zck_reader *rd = NULL;
    zck_layout *want = NULL;
    zck_read_req *q = NULL;
    float *p = NULL;
    char *checked = NULL;
    int rc = 0;
    /* the one check before a checkpoint is trusted (a manifest edited after the commit,
     * presence, sizes), quick: the read below hashes every shard it touches */
    zck_resume_opts co = ZCK_RESUME_OPTS_INIT;
    co.verify = ZCK_RESUME_VERIFY_QUICK;
    ZR_TRY_GOTO(zck_resume_check(&checked, path, &co), rc, out);
    ZR_TRY_GOTO(zck_reader_open(&rd, checked), rc, out);
    const char *dir = zck_reader_path(rd);
    if (zr_gpt2_config_from_json(cfg, zck_reader_model_json(rd)) < 0) {
        rc = zr_err_code();
        zr_err_prefix("%s: ", dir);
        goto out;
    }
    ZR_TRY_GOTO(zr_gpt2_layout(&want, cfg), rc, out);
    const zck_layout *L = zck_reader_layout(rd);
    ZR_TRY_GOTO(zr_gpt2_layout_check(L, want, dir), rc, out);
    size_t st, ng = zck_layout_n_groups(L);
    if (zck_layout_find_state(L, &st, "param") < 0 || zck_layout_state_dtype(L, st) != ZCK_F32) {
        rc = zr_err_set(ZR_EINVAL, "%s: no f32 state 'param' in the checkpoint", dir);
        goto out;
    }
    uint64_t numel = 0;
    for (size_t g = 0; g < ng; g++)
        numel += zck_layout_group_numel(L, g);
    q = calloc(ng, sizeof *q);
    p = malloc(numel ? numel * sizeof *p : 1);
    if (!q || !p) {
        rc = zr_err_set(ZR_ENOMEM, "%s: out of memory for %.1f MiB of parameters", dir,
                        (double)numel * sizeof *p / (1 << 20));
        goto out;
    }
    /* the groups end to end in layout order: the arena of zr_gpt2_offsets */
    for (size_t g = 0, at = 0; g < ng; at += zck_layout_group_numel(L, g), g++)
        q[g] = (zck_read_req){g, st, 0, zck_layout_group_numel(L, g), p + at};
    zck_read_opts ro = ZCK_READ_OPTS_INIT;
    ro.verify = 1;
    ro.jobs = jobs ? jobs : 1;
    ZR_TRY_GOTO(zck_reader_read(rd, q, ng, &ro), rc, out);
    *out = p;
    p = NULL;
out:
    free(checked);
    free(p);
    free(q);
    zck_layout_free(want);
    zck_reader_free(rd);
    return rc;
}

size_t zr_gen_utf8_repair(char *out, const char *s, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        int ok = k && i + k <= n;
        for (size_t j = 1; ok && j < k; j++) {
            /* the second byte's range excludes overlong forms, surrogates and past U+10FFFF */
            unsigned char d = (unsigned char)s[i + j], lo = 0x80, hi = 0xbf;
            if (j == 1 && (c == 0xe0 || c == 0xf0))
                lo = c == 0xe0 ? 0xa0 : 0x90;
            if (j == 1 && (c == 0xed || c == 0xf4))
                hi = c == 0xed ? 0x9f : 0x8f;
            ok = d >= lo && d <= hi;
        }
        if (ok) {
            memcpy(out + w, s + i, k);
            w += k;
            i += k;
        } else {
            memcpy(out + w, "\xef\xbf\xbd", 3);
            w += 3;
            i++;
        }
    }
    out[w] = 0;
    return w;
}
