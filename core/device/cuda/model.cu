/*
 * model.cu: the device model (devmodel.h) and GPT-2 on it. What does not depend on the family
 * (construction, arenas, hooks, token staging, the chunked head and its backward, the groups,
 * the matmul helpers) is here and shared with the Llama family's llama.cu, which the
 * zrc_model_* calls hand a Llama to. GPT-2 on the GPU with zr_model's contract (zr.h; device.h
 * says what differs): the same groups and tensor offsets (zr_model_offsets' GPT-2 part,
 * handed over by the host: the table of names and shapes is ckpt's, never restated here), the
 * same hooks and fetch order, the same forward (mean cross-entropy) and backward(scale) adding
 * into fp32 gradients.
 *
 * Precision: fp32 master parameters (own arena or lent), each group's weights cast to bf16 in
 * a scratch slot when the group is fetched; matmuls in cuBLAS with bf16 operands and fp32
 * accumulation (CUBLAS_COMPUTE_32F). Kept in fp32: the residual stream (encoded, res2, res3),
 * LayerNorm statistics, the pre-bias matmul outputs, attention scores, the head's logits (per
 * chunk), losses, every gradient that is summed (the residual stream's, LayerNorm's input
 * gradient, all parameter gradients). Kept in bf16: what a matmul reads (LayerNorm outputs,
 * q/k/v, attention probabilities and output, GELU input and output, the head's dlogits and the
 * gradients flowing into matmuls). Vectors (biases, LayerNorm weights) are read in fp32
 * straight from the fp32 parameters.
 *
 * Attention is matmul-based: per (b, h), S = q k^T / sqrt(hs) (strided batched cuBLAS, fp32
 * out), a causal softmax kernel to P (bf16, kept for backward), y = P v; backward
 * dv = P^T dy, dP = dy v^T, dS = P (dP - D) / sqrt(hs), dq = dS k, dk = dS^T q. It computes
 * the whole T x T (the upper half is masked), O(T^2) memory per layer: the simple, correct
 * first version; a fused (flash) kernel is the next step for speed.
 *
 * The head is tied to wte and chunked over rows: per chunk of at most ZRC_XENT_BYTES of fp32
 * logits, logits = lnf wte^T (cuBLAS), then one kernel per row computes max, sum, loss and
 * d = p - onehot (bf16, [N, Vp], kept for backward, which applies scale / N as the GEMMs'
 * alpha). The embedding's backward is deterministic: the host sorts the positions by token at
 * forward time (counting sort) and a kernel sums each token's positions in order.
 *
 * Every kernel and cuBLAS call runs on the model's one stream; the host returns as soon as the
 * work is enqueued, except where a result is read (the loss, the probabilities).
 */
#include "devmodel.h"
#include "model_check.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BUF_ALIGN 256                      /* every buffer of the arena */
#define BLAS_WORKSPACE ((size_t)32 << 20) /* cuBLAS workspace per handle */

/* ---------------------------------------------------------------- matmuls */

int zrc_blas_new(cublasHandle_t *h, void **workspace, cudaStream_t s)
{
    *h = NULL;
    *workspace = NULL;
    cublasStatus_t st = cublasCreate(h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        *h = NULL;
        return zrc_cublas_err(st, "cublasCreate");
    }
    int rc = zrc_malloc(workspace, BLAS_WORKSPACE, "the cuBLAS workspace");
    if (!rc && (st = cublasSetStream(*h, s)) != CUBLAS_STATUS_SUCCESS)
        rc = zrc_cublas_err(st, "cublasSetStream");
    if (!rc && (st = cublasSetWorkspace(*h, *workspace, BLAS_WORKSPACE)) != CUBLAS_STATUS_SUCCESS)
        rc = zrc_cublas_err(st, "cublasSetWorkspace");
    if (rc) {
        zrc_blas_free(*h, *workspace);
        *h = NULL;
        *workspace = NULL;
    }
    return rc;
}

void zrc_blas_free(cublasHandle_t h, void *workspace)
{
    if (h)
        cublasDestroy(h);
    zrc_free(workspace);
}

int zrc_gemm(cublasHandle_t h, int ta, int tb, size_t M, size_t N, size_t K, float alpha,
             const void *A, cudaDataType_t at, size_t lda, long long sA, const void *B,
             cudaDataType_t bt, size_t ldb, long long sB, float beta, void *C,
             cudaDataType_t ct, size_t ldc, long long sC, int batch)
{
    if (!M || !N || batch < 1)
        return 0;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
        return zrc_err(ZR_EINVAL, "cuda: matmul %zu x %zu x %zu exceeds cuBLAS's int range", M,
                       N, K);
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first */
    cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st;
    if (batch == 1)
        st = cublasGemmEx(h, opb, opa, (int)N, (int)M, (int)K, &alpha, B, bt, (int)ldb, A, at,
                          (int)lda, &beta, C, ct, (int)ldc, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmStridedBatchedEx(h, opb, opa, (int)N, (int)M, (int)K, &alpha, B, bt,
                                        (int)ldb, sB, A, at, (int)lda, sA, &beta, C, ct,
                                        (int)ldc, sC, batch, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "matmul %zu x %zu x %zu (batch %d)", M, N, K, batch);
        return zrc_cublas_err(st, what);
    }
    return 0;
}

#define BF ZRC_BF
#define F32 ZRC_F32

int zrc_mm_fwd(cublasHandle_t h, void *out, cudaDataType_t ot, size_t ldo, float beta,
               const bf16 *inp, const bf16 *W, size_t N, size_t IC, size_t OC)
{
    return zrc_gemm(h, 0, 1, N, OC, IC, 1.0f, inp, BF, IC, 0, W, BF, IC, 0, beta, out, ot, ldo, 0,
                    1);
}

int zrc_mm_dinp(cublasHandle_t h, void *dinp, cudaDataType_t dt, float beta, const bf16 *dout,
                size_t ldd, const bf16 *W, size_t N, size_t IC, size_t OC, float alpha)
{
    return zrc_gemm(h, 0, 0, N, IC, OC, alpha, dout, BF, ldd, 0, W, BF, IC, 0, beta, dinp, dt, IC,
                    0, 1);
}

int zrc_mm_dw(cublasHandle_t h, float *dW, const bf16 *dout, size_t ldd, const bf16 *inp,
              size_t N, size_t IC, size_t OC, float alpha)
{
    return zrc_gemm(h, 1, 0, OC, IC, N, alpha, dout, BF, ldd, 0, inp, BF, IC, 0, 1.0f, dW, F32, IC,
                    0, 1);
}

/* GPT-2's matmuls: dense rows */
#define mm_fwd(h, out, ot, beta, inp, W, N, IC, OC)                                           \
    zrc_mm_fwd(h, out, ot, OC, beta, inp, W, N, IC, OC)
#define mm_dinp(h, dinp, dt, dout, W, N, IC, OC, alpha)                                        \
    zrc_mm_dinp(h, dinp, dt, 0.0f, dout, OC, W, N, IC, OC, alpha)
#define mm_dw(h, dW, dout, inp, N, IC, OC, alpha) zrc_mm_dw(h, dW, dout, OC, inp, N, IC, OC, alpha)

/* ---------------------------------------------------------------- attention */

/* The G = H / KV query heads sharing KV head j are contiguous in [B, H, T, hd]: a group's G T
 * rows are one matrix against that head's [T, hd], every product one strided batched GEMM over
 * the B KV groups (GPT-2: KV = H, G = 1). */
typedef struct {
    size_t G, GT, BKV, hd;
    long long sq, skv, sp;
    float scale;
} gqa_geom;

static int gqa_geom_of(gqa_geom *g, size_t B, size_t T, size_t C, size_t H, size_t KV)
{
    g->G = H / KV;
    g->GT = g->G * T;
    g->BKV = B * KV;
    g->hd = C / H;
    g->sq = (long long)(g->GT * g->hd);
    g->skv = (long long)(T * g->hd);
    g->sp = (long long)(g->GT * T);
    g->scale = 1.0f / sqrtf((float)g->hd);
    if (g->BKV > INT_MAX || g->GT > INT_MAX)
        return zrc_err(ZR_EINVAL, "cuda: attention batch %zu x %zu exceeds cuBLAS's range",
                       g->BKV, g->GT);
    return 0;
}

int zrc_gqa_forward(cublasHandle_t h, cudaStream_t s, bf16 *y, bf16 *P, float *S, bf16 *yp,
                    const bf16 *q, const bf16 *k, const bf16 *v, size_t B, size_t T, size_t C,
                    size_t H, size_t KV)
{
    gqa_geom g;
    ZRC_TRY(gqa_geom_of(&g, B, T, C, H, KV));
    int nb = (int)g.BKV;
    /* S = scale q k^T */
    ZRC_TRY(zrc_gemm(h, 0, 1, g.GT, T, g.hd, g.scale, q, BF, g.hd, g.sq, k, BF, g.hd, g.skv, 0.0f,
                     S, F32, T, g.sp, nb));
    ZRC_TRY(zrk_attn_softmax_forward(P, S, B * H, T, s));
    /* yp = P v */
    ZRC_TRY(zrc_gemm(h, 0, 0, g.GT, g.hd, T, 1.0f, P, BF, T, g.sp, v, BF, g.hd, g.skv, 0.0f, yp,
                     BF, g.hd, g.sq, nb));
    return zrk_heads_unpermute(y, C, yp, B, T, C, H, s);
}

int zrc_gqa_backward(cublasHandle_t h, cudaStream_t s, bf16 *dq, bf16 *dk, bf16 *dv,
                     const bf16 *dy, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *P,
                     bf16 *dyp, float *dP, bf16 *dS, size_t B, size_t T, size_t C, size_t H,
                     size_t KV)
{
    gqa_geom g;
    ZRC_TRY(gqa_geom_of(&g, B, T, C, H, KV));
    int nb = (int)g.BKV;
    ZRC_TRY(zrk_heads_permute(dyp, dy, C, B, T, C, H, s));
    /* dv = P^T dy (the group's heads summed by the GEMM), dP = dy v^T */
    ZRC_TRY(zrc_gemm(h, 1, 0, T, g.hd, g.GT, 1.0f, P, BF, T, g.sp, dyp, BF, g.hd, g.sq, 0.0f, dv,
                     BF, g.hd, g.skv, nb));
    ZRC_TRY(zrc_gemm(h, 0, 1, g.GT, T, g.hd, 1.0f, dyp, BF, g.hd, g.sq, v, BF, g.hd, g.skv, 0.0f,
                     dP, F32, T, g.sp, nb));
    ZRC_TRY(zrk_attn_softmax_backward(dS, dP, P, B * H, T, g.scale, s));
    /* dq = dS k, dk = dS^T q (summed over the group's heads) */
    ZRC_TRY(zrc_gemm(h, 0, 0, g.GT, g.hd, T, 1.0f, dS, BF, T, g.sp, k, BF, g.hd, g.skv, 0.0f, dq,
                     BF, g.hd, g.sq, nb));
    return zrc_gemm(h, 1, 0, T, g.hd, g.GT, 1.0f, dS, BF, T, g.sp, q, BF, g.hd, g.sq, 0.0f, dk, BF,
                    g.hd, g.skv, nb);
}

int zrc_attention_forward(cublasHandle_t h, cudaStream_t s, bf16 *y, bf16 *P, float *S, bf16 *yp,
                          const bf16 *q, const bf16 *k, const bf16 *v, size_t B, size_t T,
                          size_t C, size_t NH)
{
    return zrc_gqa_forward(h, s, y, P, S, yp, q, k, v, B, T, C, NH, NH);
}

int zrc_attention_backward(cublasHandle_t h, cudaStream_t s, bf16 *dqkv, const bf16 *dy,
                           const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *P, bf16 *dyp,
                           float *dP, bf16 *dS, bf16 *dqkvp, size_t B, size_t T, size_t C,
                           size_t NH)
{
    size_t NC = B * T * C;
    bf16 *dq = dqkvp, *dk = dqkvp + NC, *dv = dqkvp + 2 * NC;
    ZRC_TRY(zrc_gqa_backward(h, s, dq, dk, dv, dy, q, k, v, P, dyp, dP, dS, B, T, C, NH, NH));
    ZRC_TRY(zrk_heads_unpermute(dqkv, 3 * C, dq, B, T, C, NH, s));
    ZRC_TRY(zrk_heads_unpermute(dqkv + C, 3 * C, dk, B, T, C, NH, s));
    return zrk_heads_unpermute(dqkv + 2 * C, 3 * C, dv, B, T, C, NH, s);
}

size_t zrc_xent_chunk_rows(size_t N, size_t Vp)
{
    size_t rows = ZRC_XENT_BYTES / (sizeof(float) * Vp);
    if (rows < 1)
        rows = 1;
    return rows < N ? rows : N;
}

size_t zrc_token_plan(const int32_t *tok, size_t N, size_t V, int32_t *pos, int32_t *uniq,
                      int32_t *seg, int32_t *counts)
{
    for (size_t n = 0; n < N; n++)
        counts[tok[n]]++;
    size_t U = 0;
    int32_t run = 0;
    for (size_t v = 0; v < V; v++)
        if (counts[v]) {
            uniq[U] = (int32_t)v;
            seg[U++] = run;
            int32_t c = counts[v];
            counts[v] = run; /* the token's write cursor */
            run += c;
        }
    seg[U] = run;
    for (size_t n = 0; n < N; n++)
        pos[counts[tok[n]]++] = (int32_t)n;
    for (size_t u = 0; u < U; u++)
        counts[uniq[u]] = 0;
    return U;
}

/* ---------------------------------------------------------------- layout */

uint64_t zrc_group_offset(const zr_dev_model *m, size_t g)
{
    size_t L = m->c.layers;
    if (m->c.family == ZR_FAMILY_LLAMA) { /* embed_tokens, layers.<l>, norm, lm_head */
        if (g == 0)
            return m->loff.embed;
        if (g <= L)
            return m->loff.layer0 + (g - 1) * m->loff.layer_numel;
        return g == L + 1 ? m->loff.norm : m->loff.head;
    }
    if (g < 2)
        return g ? m->off.wpe : m->off.wte;
    if (g == L + 2)
        return m->off.ln_f;
    return m->off.h0 + (g - 2) * m->off.layer_numel; /* h.<g-2> */
}
#define group_offset zrc_group_offset

void *zrc_carve(unsigned char *base, size_t *off, double *total, size_t bytes)
{
    *off = (*off + BUF_ALIGN - 1) / BUF_ALIGN * BUF_ALIGN;
    void *p = base ? base + *off : NULL;
    *off += bytes;
    *total += (double)bytes + BUF_ALIGN;
    return p;
}

#define CARVE ZRC_CARVE

/* the head's rows dl holds: all, or one chunk with layer recompute */
static size_t zrc_dl_rows(const zr_dev_model *m)
{
    return m->recompute == ZR_RECOMPUTE_LAYER ? m->xent_rows : m->max_N;
}

void zrc_carve_common(zr_dev_model *m, unsigned char *base, size_t *offp, double *total,
                      size_t att)
{
    size_t N = m->max_N, C = m->c.dim, off = *offp;
    m->lnf = CARVE(bf16, N * C);
    m->lnf_rstd = CARVE(float, N);
    m->dl = CARVE(bf16, zrc_dl_rows(m) * m->Vp);
    m->losses = CARVE(float, N);
    m->loss_sum = CARVE(double, 1);
    m->tok = CARVE(int32_t, 5 * N + 1);
    m->wslot = CARVE(bf16, m->layer_numel);
    m->wte_bf = CARVE(bf16, (size_t)m->c.vocab * C);
    m->S = CARVE(float, att);
    m->dS = CARVE(bf16, att);
    m->tmp = CARVE(bf16, N * C);
    m->logits = CARVE(float, m->xent_rows * m->Vp);
    m->dres = CARVE(float, N * C);
    m->dC = CARVE(float, N * C);
    m->dres_bf = CARVE(bf16, N * C);
    m->datty = CARVE(bf16, N * C);
    *offp = off;
}

static size_t acts_layout(zr_dev_model *m, unsigned char *base, double *total)
{
    size_t L = m->c.layers, C = m->c.dim, NH = m->c.heads, T = m->max_T;
    size_t N = m->max_N, off = 0;
    size_t att = m->max_B * NH * T * T; /* counted in double below as well */
    *total = 0;
    *total += (double)m->max_B * NH * T * T * (double)(L * 2 + 6); /* overflow guard */
    m->encoded = CARVE(float, N * C);
    layer_acts a; /* with recompute, the buffers the layers share (see devmodel.h) */
    int sel = m->recompute == ZR_RECOMPUTE_SELECTIVE; /* (carving without a base gives NULL) */
    bf16 *shared_att = sel ? CARVE(bf16, att) : NULL;
    for (size_t l = 0; l < L; l++) {
        if (l == 0 || m->recompute != ZR_RECOMPUTE_LAYER) {
            a.ln1 = CARVE(bf16, N * C);
            a.ln1_mean = CARVE(float, N);
            a.ln1_rstd = CARVE(float, N);
            a.q = CARVE(bf16, N * C);
            a.k = CARVE(bf16, N * C);
            a.v = CARVE(bf16, N * C);
            a.att = sel ? shared_att : CARVE(bf16, att);
            a.atty = CARVE(bf16, N * C);
            a.res2 = CARVE(float, N * C);
            a.ln2 = CARVE(bf16, N * C);
            a.ln2_mean = CARVE(float, N);
            a.ln2_rstd = CARVE(float, N);
            a.fch = CARVE(bf16, N * 4 * C);
            a.fch_gelu = CARVE(bf16, N * 4 * C);
        }
        a.res3 = CARVE(float, N * C);
        if (base)
            m->layer[l] = a;
    }
    zrc_carve_common(m, base, &off, total, att);
    m->lnf_mean = CARVE(float, N);
    m->scratch = CARVE(float, N * 4 * C);
    m->d4C = CARVE(bf16, N * 4 * C);
    m->dqkvp = CARVE(bf16, 3 * N * C);
    m->dqkv = CARVE(bf16, 3 * N * C);
    m->partial = CARVE(float, zrk_partial_floats(N, 4 * C));
    return off;
}

static void setup_shape(zr_dev_model *m, const zr_config *c, const zr_model_offsets *off,
                        size_t max_B, size_t max_T, zr_recompute rc)
{
    m->c = *c;
    m->recompute = rc;
    m->max_B = max_B;
    m->max_T = max_T;
    m->max_N = max_B * max_T;
    m->Vp = zrc_pad_vocab(c->vocab);
    m->xent_rows = zrc_xent_chunk_rows(m->max_N, m->Vp);
    m->off = off->gpt2;
    m->loff = off->llama;
    m->n_groups = off->n_groups;
    m->numel = off->numel;
    m->layer_numel = c->family == ZR_FAMILY_LLAMA ? off->llama.layer_numel
                                                  : off->gpt2.layer_numel;
}

/* the activations of the model's family */
static size_t layout(zr_dev_model *m, unsigned char *base, double *total)
{
    if (m->c.family == ZR_FAMILY_LLAMA)
        return zrc_llama_acts_layout(m, base, total);
    return acts_layout(m, base, total);
}

uint64_t zrc_activation_bytes(const zr_config *c, const zr_model_offsets *off, size_t max_B,
                              size_t max_T, zr_recompute rc)
{
    zr_dev_model m;
    memset(&m, 0, sizeof m);
    setup_shape(&m, c, off, max_B, max_T, rc);
    double total;
    return layout(&m, NULL, &total);
}

/* ---------------------------------------------------------------- construction */

/* What a new model refuses: the config (the family's checks), the sizes, the hooks, offsets of
 * another family or count, sizes beyond cuBLAS's int range. */
static int model_problem(const zr_config *c, const zr_model_offsets *off, size_t max_B,
                         size_t max_T, const zr_model_hooks *hooks)
{
    char why[160];
    int llama = c->family == ZR_FAMILY_LLAMA;
    if (zr__config_problem(why, sizeof why, c) ||
        (llama && zrc_llama_problem(why, sizeof why, c)) ||
        zr__new_problem(why, sizeof why, max_B, max_T, c->ctx, hooks))
        return zrc_err(ZR_EINVAL, "%s", why);
    uint32_t groups = c->layers + (llama ? (c->tied ? 2u : 3u) : 3u);
    if (off->family != c->family || off->n_groups != groups || !off->numel)
        return zrc_err(ZR_EINVAL, "model: offsets of another model (family %d, %u groups; the "
                       "config has family %d, %u groups)", (int)off->family, off->n_groups,
                       (int)c->family, groups);
    size_t wide = llama ? (c->ffn > c->dim ? 2 * (size_t)c->ffn : 4 * (size_t)c->dim)
                        : 4 * (size_t)c->dim;
    if ((double)max_B * max_T > INT_MAX / 4 || zrc_pad_vocab(c->vocab) > INT_MAX ||
        wide > INT_MAX)
        return zrc_err(ZR_EINVAL, "model: batch %zu x seq %zu, vocab %u or width %zu exceeds "
                       "cuBLAS's int range", max_B, max_T, c->vocab, wide);
    return 0;
}

int zrc_model_new(zr_dev_model **out, const zr_config *c, const zr_model_offsets *off,
                  size_t max_B, size_t max_T, const zr_model_hooks *hooks,
                  zr_recompute recompute)
{
    *out = NULL;
    ZRC_TRY(model_problem(c, off, max_B, max_T, hooks));
    if (recompute != ZR_RECOMPUTE_NONE && recompute != ZR_RECOMPUTE_LAYER &&
        recompute != ZR_RECOMPUTE_SELECTIVE)
        return zrc_err(ZR_EINVAL, "model: recompute mode %d (none 0, layer 1, selective 2)",
                       (int)recompute);
    ZRC_TRY(zrc_ensure_device());

    zr_dev_model *m = (zr_dev_model *)calloc(1, sizeof *m);
    if (!m)
        return zrc_err(ZR_ENOMEM, "model: out of memory");
    setup_shape(m, c, off, max_B, max_T, recompute);
    if (hooks)
        m->h = *hooks;
    m->fwd_targets = -1;
    double acts_d;
    size_t abytes = layout(m, NULL, &acts_d);
    double numel_d = (double)m->numel;
    if (numel_d * sizeof(float) > 0x1p50 || acts_d > 0x1p50) {
        free(m);
        return zrc_err(ZR_EINVAL, "model: %.3g parameters and %.3g bytes of activations "
                       "(batch %zu): too large", numel_d, acts_d, max_B);
    }
    int rc = 0;
    if (c->family == ZR_FAMILY_LLAMA)
        m->ll = (ll_acts *)calloc(c->layers, sizeof *m->ll);
    else
        m->layer = (layer_acts *)calloc(c->layers, sizeof *m->layer);
    m->counts = (int32_t *)calloc(c->vocab, sizeof *m->counts);
    if ((!m->layer && !m->ll) || !m->counts)
        rc = zrc_err(ZR_ENOMEM, "model: out of memory");
    cudaError_t e;
    if (!rc && (e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking)) != cudaSuccess)
        rc = zrc_cuda_err(e, "model stream");
    if (!rc && (e = cudaEventCreateWithFlags(&m->staged, cudaEventDisableTiming)) != cudaSuccess)
        rc = zrc_cuda_err(e, "model event");
    if (!rc && (e = cudaHostAlloc((void **)&m->host_tok, (5 * m->max_N + 1) * sizeof(int32_t),
                                  cudaHostAllocDefault)) != cudaSuccess)
        rc = zrc_cuda_err(e, "pinned token buffer");
    if (!rc)
        rc = zrc_blas_new(&m->blas, &m->blas_ws, m->stream);
    if (!rc && !m->h.params) {
        m->pbytes = m->numel * sizeof(float);
        rc = zrc_malloc((void **)&m->params, m->pbytes, "the parameter arena");
        if (!rc && (e = cudaMemset(m->params, 0, m->pbytes)) != cudaSuccess)
            rc = zrc_cuda_err(e, "zeroing the parameter arena");
    }
    if (!rc && !m->h.grads) {
        m->gbytes = m->numel * sizeof(float);
        rc = zrc_malloc((void **)&m->grads, m->gbytes, "the gradient arena");
        if (!rc && (e = cudaMemset(m->grads, 0, m->gbytes)) != cudaSuccess)
            rc = zrc_cuda_err(e, "zeroing the gradient arena");
    }
    if (!rc)
        rc = zrc_malloc((void **)&m->acts_mem, abytes, "activations and scratch");
    if (!rc) {
        m->acts_bytes = abytes;
        layout(m, m->acts_mem, &acts_d);
        /* the head's padding columns are never read; zero dl once so they hold no garbage */
        if ((e = cudaMemset(m->dl, 0, zrc_dl_rows(m) * m->Vp * sizeof(bf16))) != cudaSuccess)
            rc = zrc_cuda_err(e, "zeroing the head's buffer");
    }
    if (!rc && m->ll)
        rc = zrc_llama_setup(m);
    if (!rc && (e = cudaDeviceSynchronize()) != cudaSuccess)
        rc = zrc_cuda_err(e, "model setup");
    if (rc) {
        zrc_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void zrc_model_free(zr_dev_model *m)
{
    if (!m)
        return;
    zrc_ensure_device();
    if (m->stream)
        cudaStreamSynchronize(m->stream);
    zrc_blas_free(m->blas, m->blas_ws);
    zrc_free(m->acts_mem);
    zrc_free(m->params);
    zrc_free(m->grads);
    if (m->host_tok)
        cudaFreeHost(m->host_tok);
    if (m->staged)
        cudaEventDestroy(m->staged);
    if (m->stream)
        cudaStreamDestroy(m->stream);
    free(m->layer);
    free(m->ll);
    free(m->counts);
    free(m);
}

zr_dev_stream *zrc_model_stream(zr_dev_model *m) { return (zr_dev_stream *)m->stream; }
size_t zrc_model_n_groups(const zr_dev_model *m) { return m->n_groups; }
uint64_t zrc_model_numel(const zr_dev_model *m) { return m->numel; }

/* the groups lie end to end in layout order */
uint64_t zrc_model_group_numel(const zr_dev_model *m, size_t g)
{
    if (g >= m->n_groups)
        return 0;
    return (g + 1 < m->n_groups ? group_offset(m, g + 1) : m->numel) - group_offset(m, g);
}

float *zrc_model_param(zr_dev_model *m, size_t g)
{
    return m->params && g < zrc_model_n_groups(m) ? m->params + group_offset(m, g) : NULL;
}

float *zrc_model_grad(zr_dev_model *m, size_t g)
{
    return m->grads && g < zrc_model_n_groups(m) ? m->grads + group_offset(m, g) : NULL;
}

size_t zrc_model_fetch_order(const zr_dev_model *m, int backward, size_t *order)
{
    if (m->c.family == ZR_FAMILY_LLAMA)
        return zrc_llama_fetch_order(m, backward, order);
    size_t L = m->c.layers, n = 0;
    if (!backward) { /* wte and wpe, the blocks, ln_f, wte again (the head) */
        for (size_t g = 0; g < L + 3; g++)
            order[n++] = g;
        order[n++] = 0;
    } else { /* the head (wte), ln_f, the blocks last to first */
        order[n++] = 0;
        for (size_t g = L + 3; g-- > 2;)
            order[n++] = g;
    }
    return n;
}

int zrc_model_zero_grad(zr_dev_model *m)
{
    ZRC_TRY(zrc_ensure_device());
    if (m->grads)
        ZRC_CU(cudaMemsetAsync(m->grads, 0, m->numel * sizeof(float), m->stream), "zero_grad");
    return 0;
}

void zrc_model_bytes(const zr_dev_model *m, uint64_t *params, uint64_t *grads, uint64_t *acts)
{
    if (params)
        *params = m->pbytes;
    if (grads)
        *grads = m->gbytes;
    if (acts)
        *acts = m->acts_bytes;
}

/* ---------------------------------------------------------------- hooks */

/* Group g's buffer: what the hook (params or grads, named by what) lends, or the model's own
 * arena at g's offset when there is no hook. */
template <typename F, typename H>
static int lend(zr_dev_model *m, H hook, F *own, size_t g, F **out, const char *what)
{
    if (!hook) {
        *out = own + group_offset(m, g);
        return 0;
    }
    *out = NULL;
    int rc = hook(m->h.ctx, g, out);
    if (!rc && !*out)
        rc = zrc_err(ZR_EINVAL, "model: the %s hook lent no buffer for group %zu", what, g);
    return rc;
}

int zrc_params_get(zr_dev_model *m, size_t g, const float **out)
{
    return lend<const float>(m, m->h.params, m->params, g, out, "params");
}

int zrc_params_put(zr_dev_model *m, size_t g)
{
    return m->h.params_done ? m->h.params_done(m->h.ctx, g) : 0;
}

int zrc_grads_get(zr_dev_model *m, size_t g, float **out)
{
    return lend<float>(m, m->h.grads, m->grads, g, out, "grads");
}

int zrc_grads_put(zr_dev_model *m, size_t g)
{
    return m->h.grads_done ? m->h.grads_done(m->h.ctx, g) : 0;
}

/* ---------------------------------------------------------------- forward and backward */

static int check_tokens(const int32_t *tok, size_t n, uint32_t V, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (tok[i] < 0 || (uint32_t)tok[i] >= V)
            return zrc_err(ZR_EINVAL, "forward: %s[%zu] = %d is not a token id (vocab %u)", what,
                           i, tok[i], V);
    return 0;
}

#define W16(P16, kind) ((P16) + m->off.blk[ZR_BLK_##kind]) /* a bf16 weight in the fetched slot */
#define V32(P, kind) ((P) + m->off.blk[ZR_BLK_##kind]) /* an fp32 vector or gradient */

int zrc_forward_begin(zr_dev_model *m, const int32_t *inputs, const int32_t *targets, size_t B,
                      size_t T)
{
    size_t V = m->c.vocab, N = B * T, maxN = m->max_N;
    if (B < 1 || B > m->max_B)
        return zrc_err(ZR_EINVAL, "forward: batch B = %zu out of range (expected 1..%zu)", B,
                       m->max_B);
    if (T < 1 || T > m->max_T)
        return zrc_err(ZR_EINVAL, "forward: sequence length T = %zu out of range (expected "
                       "1..%zu)", T, m->max_T);
    ZRC_TRY(check_tokens(inputs, N, m->c.vocab, "inputs"));
    if (targets)
        ZRC_TRY(check_tokens(targets, N, m->c.vocab, "targets"));
    ZRC_TRY(zrc_ensure_device());
    /* tokens, targets and the embedding-backward plan, staged through pinned memory */
    if (m->staged_pending) {
        ZRC_CU(cudaEventSynchronize(m->staged), "waiting for the token buffer");
        m->staged_pending = 0;
    }
    int32_t *ht = m->host_tok;
    memcpy(ht, inputs, N * sizeof *ht);
    if (targets)
        memcpy(ht + maxN, targets, N * sizeof *ht);
    m->U = zrc_token_plan(inputs, N, V, ht + 2 * maxN, ht + 3 * maxN, ht + 4 * maxN, m->counts);
    ZRC_CU(cudaMemcpyAsync(m->tok, ht, (5 * maxN + 1) * sizeof *ht, cudaMemcpyHostToDevice,
                           m->stream), "copying tokens");
    ZRC_CU(cudaEventRecord(m->staged, m->stream), "cudaEventRecord");
    m->staged_pending = 1;
    m->B = B;
    m->T = T;
    m->has_targets = targets != NULL;
    m->fwd_targets = -1; /* until this forward completes */
    return 0;
}

/* the head's chunk of rows r0 .. r0 + rows: logits, then dl (where the mode keeps it) and the
 * losses */
static int head_chunk(zr_dev_model *m, const bf16 *W, size_t r0, size_t rows, int targets)
{
    size_t C = m->c.dim, V = m->c.vocab, Vp = m->Vp;
    const int32_t *d_targets = targets ? m->tok + m->max_N + r0 : NULL;
    bf16 *dl = m->recompute == ZR_RECOMPUTE_LAYER ? m->dl : m->dl + r0 * Vp;
    ZRC_TRY(zrc_gemm(m->blas, 0, 1, rows, V, C, 1.0f, m->lnf + r0 * C, BF, C, 0, W, BF, C, 0,
                     0.0f, m->logits, F32, Vp, 0, 1));
    return zrk_xent_forward(dl, Vp, m->losses + r0, m->logits, Vp, d_targets, rows, V,
                            m->stream);
}

int zrc_head_forward(zr_dev_model *m, const bf16 *W, size_t N, int targets)
{
    for (size_t r0 = 0; r0 < N; r0 += m->xent_rows) {
        size_t rows = N - r0 < m->xent_rows ? N - r0 : m->xent_rows;
        ZRC_TRY(head_chunk(m, W, r0, rows, targets));
    }
    if (targets)
        ZRC_TRY(zrk_sum_f64(m->loss_sum, m->losses, N, m->stream));
    return 0;
}

/* A block's forward from res with its parameters P (fp32) and m->wslot (their bf16 cast, made
 * by the caller), into a's buffers; out: also its output a->res3 (not when recomputing: the
 * backward has it). */
static int layer_forward(zr_dev_model *m, layer_acts *a, const float *res, const float *P,
                         size_t B, size_t T, int out)
{
    size_t C = m->c.dim, NH = m->c.heads, N = B * T;
    cudaStream_t s = m->stream;
    cublasHandle_t h = m->blas;
    const bf16 *W = m->wslot;
    ZRC_TRY(zrk_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, res, V32(P, LN1W),
                                  V32(P, LN1B), N, C, s));
    ZRC_TRY(mm_fwd(h, m->scratch, F32, 0.0f, a->ln1, W16(W, QKVW), N, C, 3 * C));
    ZRC_TRY(zrk_qkv_permute(a->q, a->k, a->v, m->scratch, V32(P, QKVB), B, T, C, NH, s));
    ZRC_TRY(zrc_attention_forward(h, s, a->atty, a->att, m->S, m->tmp, a->q, a->k, a->v, B, T,
                                  C, NH));
    /* res2 = res + c_proj(atty) */
    ZRC_TRY(zrk_rows_init(a->res2, res, V32(P, ATTPROJB), N, C, s));
    ZRC_TRY(mm_fwd(h, a->res2, F32, 1.0f, a->atty, W16(W, ATTPROJW), N, C, C));
    ZRC_TRY(zrk_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, V32(P, LN2W),
                                  V32(P, LN2B), N, C, s));
    ZRC_TRY(mm_fwd(h, m->scratch, F32, 0.0f, a->ln2, W16(W, FCW), N, C, 4 * C));
    ZRC_TRY(zrk_bias_gelu(a->fch, a->fch_gelu, m->scratch, V32(P, FCB), N, 4 * C, s));
    if (!out)
        return 0;
    /* res3 = res2 + mlp */
    ZRC_TRY(zrk_rows_init(a->res3, a->res2, V32(P, FCPROJB), N, C, s));
    return mm_fwd(h, a->res3, F32, 1.0f, a->fch_gelu, W16(W, FCPROJW), N, 4 * C, C);
}

static int gpt2_forward(zr_dev_model *m, size_t B, size_t T)
{
    size_t L = m->c.layers, C = m->c.dim, V = m->c.vocab, N = B * T;
    cudaStream_t s = m->stream;
    const float *wte, *wpe, *P;
    ZRC_TRY(zrc_params_get(m, 0, &wte));
    ZRC_TRY(zrc_params_get(m, 1, &wpe));
    ZRC_TRY(zrk_encoder_forward(m->encoded, m->tok, wte, wpe, N, T, C, s));
    ZRC_TRY(zrc_params_put(m, 1));
    ZRC_TRY(zrc_params_put(m, 0));
    const float *res = m->encoded;
    for (size_t l = 0; l < L; l++) {
        ZRC_TRY(zrc_params_get(m, l + 2, &P));
        ZRC_TRY(zrk_cast_bf16(m->wslot, P, m->layer_numel, s));
        ZRC_TRY(layer_forward(m, &m->layer[l], res, P, B, T, 1));
        ZRC_TRY(zrc_params_put(m, l + 2));
        res = m->layer[l].res3;
    }
    m->held = L - 1;
    ZRC_TRY(zrc_params_get(m, L + 2, &P));
    ZRC_TRY(zrk_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, res, P + m->off.lnf_w,
                                  P + m->off.lnf_b, N, C, s));
    ZRC_TRY(zrc_params_put(m, L + 2));
    /* the head, tied to wte, in chunks of rows */
    ZRC_TRY(zrc_params_get(m, 0, &wte));
    ZRC_TRY(zrk_cast_bf16(m->wte_bf, wte, V * C, s));
    ZRC_TRY(zrc_head_forward(m, m->wte_bf, N, m->has_targets));
    return zrc_params_put(m, 0);
}

int zrc_model_forward(zr_dev_model *m, const int32_t *inputs, const int32_t *targets, size_t B,
                      size_t T, float *loss)
{
    ZRC_TRY(zrc_forward_begin(m, inputs, targets, B, T));
    if (m->c.family == ZR_FAMILY_LLAMA)
        ZRC_TRY(zrc_llama_forward(m, B, T));
    else
        ZRC_TRY(gpt2_forward(m, B, T));
    m->fwd_targets = m->has_targets;
    if (loss)
        return zrc_model_loss(m, loss);
    return 0;
}

int zrc_model_loss(zr_dev_model *m, float *loss)
{
    *loss = 0.0f;
    if (m->fwd_targets < 0)
        return zrc_err(ZR_EINVAL, "loss: no forward");
    if (!m->fwd_targets)
        return 0;
    ZRC_TRY(zrc_ensure_device());
    double sum = 0.0;
    ZRC_CU(cudaMemcpyAsync(&sum, m->loss_sum, sizeof sum, cudaMemcpyDeviceToHost, m->stream),
           "reading the loss");
    ZRC_CU(cudaStreamSynchronize(m->stream), "forward");
    *loss = (float)(sum / (double)(m->B * m->T));
    return 0;
}

int zrc_model_probs(zr_dev_model *m, float *host_dst)
{
    if (m->fwd_targets < 0)
        return zrc_err(ZR_EINVAL, "probs: no forward");
    ZRC_TRY(zrc_ensure_device());
    int again = m->recompute == ZR_RECOMPUTE_LAYER; /* dl of each chunk computed again */
    size_t N = m->B * m->T, V = m->c.vocab;
    size_t rows_max = again ? m->xent_rows : m->xent_rows * m->Vp / V;
    const int32_t *tg = m->fwd_targets ? m->tok + m->max_N : NULL;
    for (size_t r0 = 0; r0 < N; r0 += rows_max) {
        size_t rows = N - r0 < rows_max ? N - r0 : rows_max;
        if (again) /* the head's matrix is still in wte_bf from the forward */
            ZRC_TRY(head_chunk(m, m->wte_bf, r0, rows, m->fwd_targets));
        ZRC_TRY(zrk_probs_export(m->logits, again ? m->dl : m->dl + r0 * m->Vp, m->Vp,
                                 tg ? tg + r0 : NULL, rows, V, m->stream));
        ZRC_CU(cudaMemcpyAsync(host_dst + r0 * V, m->logits, rows * V * sizeof(float),
                               cudaMemcpyDeviceToHost, m->stream), "reading probabilities");
        ZRC_CU(cudaStreamSynchronize(m->stream), "reading probabilities");
    }
    return 0;
}

int zrc_backward_check(const zr_dev_model *m)
{
    if (m->fwd_targets < 0)
        return zrc_err(ZR_EINVAL, "backward: no forward to differentiate");
    if (m->fwd_targets == 0)
        return zrc_err(ZR_EINVAL, "backward: the last forward had no targets (no loss)");
    return zrc_ensure_device();
}

int zrc_head_backward(zr_dev_model *m, const bf16 *W, float *dW, size_t N, float k)
{
    size_t C = m->c.dim, V = m->c.vocab, Vp = m->Vp;
    int again = m->recompute == ZR_RECOMPUTE_LAYER;
    for (size_t r0 = 0; r0 < N; r0 += m->xent_rows) {
        size_t rows = N - r0 < m->xent_rows ? N - r0 : m->xent_rows;
        if (again)
            ZRC_TRY(head_chunk(m, W, r0, rows, 1));
        const bf16 *dl = again ? m->dl : m->dl + r0 * Vp;
        ZRC_TRY(zrc_gemm(m->blas, 0, 0, rows, C, V, k, dl, BF, Vp, 0, W, BF, C, 0, 0.0f,
                         m->dC + r0 * C, F32, C, 0, 1));
        ZRC_TRY(zrc_gemm(m->blas, 1, 0, V, C, rows, k, dl, BF, Vp, 0, m->lnf + r0 * C, BF, C, 0,
                         1.0f, dW, F32, C, 0, 1));
    }
    return 0;
}

int zrc_recompute_due(const zr_dev_model *m, size_t l)
{
    return m->recompute != ZR_RECOMPUTE_NONE && m->held != l;
}

static int gpt2_backward(zr_dev_model *m, float scale)
{
    size_t B = m->B, T = m->T, N = B * T, L = m->c.layers, C = m->c.dim, NH = m->c.heads;
    size_t V = m->c.vocab, maxN = m->max_N;
    cudaStream_t s = m->stream;
    cublasHandle_t h = m->blas;
    const float *res_last = m->layer[L - 1].res3;
    const float *wte, *P;
    float *dwte, *dwpe, *G;

    /* head: dlnf = k d wte (into dC), dwte += k d^T lnf, k = scale / N; wte's gradient buffer
     * stays until the embedding adds its part */
    ZRC_TRY(zrc_params_get(m, 0, &wte));
    ZRC_TRY(zrc_grads_get(m, 0, &dwte));
    ZRC_TRY(zrk_cast_bf16(m->wte_bf, wte, V * C, s));
    ZRC_TRY(zrc_head_backward(m, m->wte_bf, dwte, N, scale / (float)N));
    ZRC_TRY(zrc_params_put(m, 0));
    ZRC_CU(cudaMemsetAsync(m->dres, 0, N * C * sizeof(float), s), "zeroing dres");
    ZRC_TRY(zrc_params_get(m, L + 2, &P));
    ZRC_TRY(zrc_grads_get(m, L + 2, &G));
    ZRC_TRY(zrk_layernorm_backward(m->dres, G + m->off.lnf_w, G + m->off.lnf_b, m->partial, m->dC,
                                   res_last, m->lnf_mean, m->lnf_rstd, P + m->off.lnf_w, N, C, s));
    ZRC_TRY(zrc_params_put(m, L + 2));
    ZRC_TRY(zrc_grads_put(m, L + 2));

    for (size_t l = L; l-- > 0;) {
        layer_acts *a = &m->layer[l];
        const float *res = l ? m->layer[l - 1].res3 : m->encoded;
        const bf16 *W = m->wslot;
        ZRC_TRY(zrc_params_get(m, l + 2, &P));
        ZRC_TRY(zrc_grads_get(m, l + 2, &G));
        ZRC_TRY(zrk_cast_bf16(m->wslot, P, m->layer_numel, s));
        if (zrc_recompute_due(m, l)) { /* inside this fetch of the block: no second gather */
            if (m->recompute == ZR_RECOMPUTE_LAYER)
                ZRC_TRY(layer_forward(m, a, res, P, B, T, 0));
            else /* the probabilities again; the output goes to datty, free until below */
                ZRC_TRY(zrc_attention_forward(h, s, m->datty, a->att, m->S, m->tmp, a->q, a->k,
                                              a->v, B, T, C, NH));
            m->held = l;
        }
        /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))) */
        ZRC_TRY(zrk_cast_bf16(m->dres_bf, m->dres, N * C, s));
        ZRC_TRY(mm_dinp(h, m->scratch, F32, m->dres_bf, W16(W, FCPROJW), N, 4 * C, C, 1.0f));
        ZRC_TRY(mm_dw(h, V32(G, FCPROJW), m->dres_bf, a->fch_gelu, N, 4 * C, C, 1.0f));
        ZRC_TRY(zrk_colsum_f32(V32(G, FCPROJB), m->partial, m->dres, N, C, s));
        ZRC_TRY(zrk_gelu_backward(m->d4C, m->scratch, a->fch, N * 4 * C, s));
        ZRC_TRY(mm_dinp(h, m->dC, F32, m->d4C, W16(W, FCW), N, C, 4 * C, 1.0f));
        ZRC_TRY(mm_dw(h, V32(G, FCW), m->d4C, a->ln2, N, C, 4 * C, 1.0f));
        ZRC_TRY(zrk_colsum_bf16(V32(G, FCB), m->partial, m->d4C, N, 4 * C, s));
        ZRC_TRY(zrk_layernorm_backward(m->dres, V32(G, LN2W), V32(G, LN2B), m->partial, m->dC,
                                       a->res2, a->ln2_mean, a->ln2_rstd, V32(P, LN2W), N, C,
                                       s));
        /* attention: res2 = res + c_proj(attn(c_attn(ln_1(res)))) */
        ZRC_TRY(zrk_cast_bf16(m->dres_bf, m->dres, N * C, s));
        ZRC_TRY(mm_dinp(h, m->datty, BF, m->dres_bf, W16(W, ATTPROJW), N, C, C, 1.0f));
        ZRC_TRY(mm_dw(h, V32(G, ATTPROJW), m->dres_bf, a->atty, N, C, C, 1.0f));
        ZRC_TRY(zrk_colsum_f32(V32(G, ATTPROJB), m->partial, m->dres, N, C, s));
        ZRC_TRY(zrc_attention_backward(h, s, m->dqkv, m->datty, a->q, a->k, a->v, a->att, m->tmp,
                                       m->S, m->dS, m->dqkvp, B, T, C, NH));
        ZRC_TRY(mm_dinp(h, m->dC, F32, m->dqkv, W16(W, QKVW), N, C, 3 * C, 1.0f));
        ZRC_TRY(mm_dw(h, V32(G, QKVW), m->dqkv, a->ln1, N, C, 3 * C, 1.0f));
        ZRC_TRY(zrk_colsum_bf16(V32(G, QKVB), m->partial, m->dqkv, N, 3 * C, s));
        ZRC_TRY(zrk_layernorm_backward(m->dres, V32(G, LN1W), V32(G, LN1B), m->partial, m->dC,
                                       res, a->ln1_mean, a->ln1_rstd, V32(P, LN1W), N, C, s));
        ZRC_TRY(zrc_params_put(m, l + 2));
        ZRC_TRY(zrc_grads_put(m, l + 2));
    }
    ZRC_TRY(zrc_grads_get(m, 1, &dwpe));
    const int32_t *ti = m->tok;
    ZRC_TRY(zrk_encoder_backward_wte(dwte, m->dres, ti + 2 * maxN, ti + 3 * maxN, ti + 4 * maxN,
                                     m->U, C, s));
    ZRC_TRY(zrk_encoder_backward_wpe(dwpe, m->dres, B, T, C, s));
    ZRC_TRY(zrc_grads_put(m, 1));
    ZRC_TRY(zrc_grads_put(m, 0));
    return 0;
}

int zrc_model_backward(zr_dev_model *m, float scale)
{
    ZRC_TRY(zrc_backward_check(m));
    if (m->c.family == ZR_FAMILY_LLAMA)
        return zrc_llama_backward(m, scale);
    return gpt2_backward(m, scale);
}
