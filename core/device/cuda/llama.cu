/*
 * llama.cu: the Llama family on the GPU (issue 17), on model.cu's device model (devmodel.h):
 * the construction, arenas, hooks, token staging, the chunked head and its backward, the
 * embedding's deterministic backward and the matmul helpers are model.cu's, shared with GPT-2;
 * this file holds what differs: the activations, the fetch order, the rotary table, and the
 * layers' forward and backward (the maths of core/model/llama.c: RMSNorm -> q, k, v ->
 * rotate-half rotary positions on q and k -> causal grouped-query attention -> o -> residual;
 * RMSNorm -> SwiGLU down(silu(gate) up) -> residual; final RMSNorm; the head, lm_head or the
 * embedding when tied; no biases, no positions table).
 *
 * Precision as GPT-2's on the device: fp32 master parameters, the fetched layer cast to bf16,
 * matmuls with bf16 operands and fp32 accumulation; fp32 residual stream, RMSNorm statistics,
 * scores, logits, losses and every gradient that is summed; bf16 what a matmul reads (the norms'
 * outputs, q, k, v, probabilities, gate, up, silu(gate) up, the gradients flowing into matmuls).
 *
 * Grouped-query attention without copies of K and V (model.cu's zrc_gqa_forward / backward,
 * which GPT-2's attention is the KV = H case of): in [B, H, T, hd] the G = H / KV query heads
 * that share KV head j are contiguous, so the G T rows of a group are one matrix against that
 * head's [T, hd]: every product (S = q k^T, y = P v, and backward dv = P^T dy, dP = dy v^T,
 * dq = dS k, dk = dS^T q, the last two summing over the group inside the GEMM) is one strided
 * batched cuBLAS call over the B KV groups.
 *
 * These kernels have not run on a GPU yet: tests/gpu/kernels.c checks them against the CPU
 * model where one is present (tests/gpu/run.sh).
 */
#include "devmodel.h"
#include "model_check.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BF ZRC_BF
#define F32 ZRC_F32

/* The shape of the model's Llama. */
typedef struct {
    size_t L, C, H, KV, hd, KVD, I, QL, V;
} ll_dims;

static ll_dims dims(const zr_dev_model *m)
{
    const zr_config *c = &m->c;
    ll_dims d;
    d.L = c->layers;
    d.C = c->dim;
    d.H = c->heads;
    d.KV = c->kv_heads;
    d.hd = d.C / d.H;
    d.KVD = d.KV * d.hd;
    d.I = c->ffn;
    d.QL = d.C + 2 * d.KVD;
    d.V = c->vocab;
    return d;
}

int zrc_llama_problem(char *why, size_t cap, const zr_config *c)
{
    if (!c->kv_heads || c->heads % c->kv_heads)
        snprintf(why, cap, "model: heads %u is not a multiple of kv_heads %u", c->heads,
                 c->kv_heads);
    else if ((c->dim / c->heads) % 2)
        snprintf(why, cap, "model: dim / heads = %u is odd (rotary positions need pairs)",
                 c->dim / c->heads);
    else if (!c->ffn)
        snprintf(why, cap, "model: ffn is 0 (expected >= 1)");
    else if (!(c->norm_eps > 0.0) || !(c->rope_theta > 0.0))
        snprintf(why, cap, "model: norm_eps %g and rope_theta %g must be positive", c->norm_eps,
                 c->rope_theta);
    else
        return 0;
    return 1;
}

static size_t head_group(const zr_dev_model *m) { return m->c.tied ? 0 : (size_t)m->c.layers + 2; }

/* As core/model/llama.c: forward the embedding, the layers, the norm, the head; backward the
 * head, the norm, the layers last to first (the embedding's backward reads no parameters). */
size_t zrc_llama_fetch_order(const zr_dev_model *m, int backward, size_t *order)
{
    size_t L = m->c.layers, n = 0;
    if (!backward) {
        for (size_t g = 0; g < L + 2; g++)
            order[n++] = g;
        order[n++] = head_group(m);
    } else {
        order[n++] = head_group(m);
        for (size_t g = L + 2; g-- > 1;)
            order[n++] = g;
    }
    return n;
}

size_t zrc_llama_acts_layout(zr_dev_model *m, unsigned char *base, double *total)
{
    ll_dims d = dims(m);
    size_t N = m->max_N, T = m->max_T, off = 0, C = d.C, I = d.I;
    size_t att = m->max_B * d.H * T * T, wide = d.QL > 2 * I ? d.QL : 2 * I;
    *total = (double)m->max_B * d.H * T * T * (double)(d.L * 2 + 6); /* overflow guard */
    m->encoded = ZRC_CARVE(float, N * C);
    ll_acts a; /* with recompute, the buffers the layers share (devmodel.h) */
    int sel = m->recompute == ZR_RECOMPUTE_SELECTIVE; /* (carving without a base gives NULL) */
    bf16 *shared_att = sel ? ZRC_CARVE(bf16, att) : NULL;
    for (size_t l = 0; l < d.L; l++) {
        if (l == 0 || m->recompute != ZR_RECOMPUTE_LAYER) {
            a.xn1 = ZRC_CARVE(bf16, N * C);
            a.rstd1 = ZRC_CARVE(float, N);
            a.q = ZRC_CARVE(bf16, N * C);
            a.k = ZRC_CARVE(bf16, N * d.KVD);
            a.v = ZRC_CARVE(bf16, N * d.KVD);
            a.att = sel ? shared_att : ZRC_CARVE(bf16, att);
            a.atty = ZRC_CARVE(bf16, N * C);
            a.res2 = ZRC_CARVE(float, N * C);
            a.xn2 = ZRC_CARVE(bf16, N * C);
            a.rstd2 = ZRC_CARVE(float, N);
            a.gate = ZRC_CARVE(bf16, N * I);
            a.up = ZRC_CARVE(bf16, N * I);
            a.hmlp = ZRC_CARVE(bf16, N * I);
        }
        a.res3 = ZRC_CARVE(float, N * C);
        if (base)
            m->ll[l] = a;
    }
    zrc_carve_common(m, base, &off, total, att);
    m->scratch = ZRC_CARVE(float, N * wide);
    m->d4C = ZRC_CARVE(bf16, 2 * N * I);
    m->dqkvp = ZRC_CARVE(bf16, N * d.QL);
    m->dqkv = ZRC_CARVE(bf16, N * d.QL);
    m->partial = ZRC_CARVE(float, zrk_partial_floats(N, C));
    m->rope_cos = ZRC_CARVE(float, T * (d.hd / 2));
    m->rope_sin = ZRC_CARVE(float, T * (d.hd / 2));
    return off;
}

int zrc_rope_upload(float *cos_dev, float *sin_dev, size_t T, size_t hd, double theta)
{
    size_t n = T * (hd / 2);
    float *host = (float *)malloc(2 * n * sizeof(float) + 1);
    if (!host)
        return zrc_err(ZR_ENOMEM, "model: out of memory");
    zr__rope_table(host, host + n, T, hd, theta); /* core/model/llama.c's bits */
    cudaError_t e = cudaMemcpy(cos_dev, host, n * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(sin_dev, host + n, n * sizeof(float), cudaMemcpyHostToDevice);
    free(host);
    return e == cudaSuccess ? 0 : zrc_cuda_err(e, "copying the rotary table");
}

/* The rotary table, uploaded once. */
int zrc_llama_setup(zr_dev_model *m)
{
    ll_dims d = dims(m);
    return zrc_rope_upload(m->rope_cos, m->rope_sin, m->max_T, d.hd, m->c.rope_theta);
}

/* ---------------------------------------------------------------- layers */

#define W16(r) (m->wslot + m->loff.role[ZR_LL_##r]) /* a bf16 weight of the fetched layer */
#define V32(P, r) ((P) + m->loff.role[ZR_LL_##r])   /* an fp32 vector or gradient */

/* res3 = res2 + mlp(rms2(res2)), res2 = res + o(attn(rope(qkv(rms1(res))))), with P and
 * m->wslot (their bf16 cast, the caller's); out: also a->res3 (not when recomputing) */
static int layer_forward(zr_dev_model *m, const ll_dims *d, ll_acts *a, const float *res,
                         const float *P, size_t B, size_t T, int out)
{
    cublasHandle_t h = m->blas;
    cudaStream_t s = m->stream;
    size_t N = B * T, C = d->C, KVD = d->KVD, QL = d->QL, I = d->I;
    float eps = (float)m->c.norm_eps, *x = m->scratch;
    ZRC_TRY(zrk_rmsnorm_forward(a->xn1, a->rstd1, res, V32(P, LN1), N, C, eps, s));
    ZRC_TRY(zrc_mm_fwd(h, x, F32, QL, 0.0f, a->xn1, W16(Q), N, C, C));
    ZRC_TRY(zrc_mm_fwd(h, x + C, F32, QL, 0.0f, a->xn1, W16(K), N, C, KVD));
    ZRC_TRY(zrc_mm_fwd(h, x + C + KVD, F32, QL, 0.0f, a->xn1, W16(V), N, C, KVD));
    ZRC_TRY(zrk_rope_permute(a->q, a->k, a->v, x, m->rope_cos, m->rope_sin, B, T, d->H, d->KV,
                             d->hd, s));
    ZRC_TRY(zrc_gqa_forward(h, s, a->atty, a->att, m->S, m->tmp, a->q, a->k, a->v, B, T, C, d->H,
                            d->KV));
    ZRC_TRY(zrk_rows_init(a->res2, res, NULL, N, C, s));
    ZRC_TRY(zrc_mm_fwd(h, a->res2, F32, C, 1.0f, a->atty, W16(O), N, C, C));
    ZRC_TRY(zrk_rmsnorm_forward(a->xn2, a->rstd2, a->res2, V32(P, LN2), N, C, eps, s));
    ZRC_TRY(zrc_mm_fwd(h, x, F32, I, 0.0f, a->xn2, W16(GATE), N, C, I));
    ZRC_TRY(zrc_mm_fwd(h, x + N * I, F32, I, 0.0f, a->xn2, W16(UP), N, C, I));
    ZRC_TRY(zrk_swiglu_forward(a->gate, a->up, a->hmlp, x, x + N * I, N * I, s));
    if (!out)
        return 0;
    ZRC_TRY(zrk_rows_init(a->res3, a->res2, NULL, N, C, s));
    return zrc_mm_fwd(h, a->res3, F32, C, 1.0f, a->hmlp, W16(DOWN), N, I, C);
}

/* m->dres: the gradient of the layer's output in, of its input out; G: the layer's gradients */
static int layer_backward(zr_dev_model *m, const ll_dims *d, const ll_acts *a, const float *res,
                          const float *P, float *G, size_t B, size_t T)
{
    cublasHandle_t h = m->blas;
    cudaStream_t s = m->stream;
    size_t N = B * T, C = d->C, KVD = d->KVD, QL = d->QL, I = d->I;
    bf16 *dg = m->d4C, *du = m->d4C + N * I, *dx = m->dqkv;
    bf16 *dq = m->dqkvp, *dk = dq + N * C, *dv = dk + N * KVD;
    /* MLP: dh = dres down, then SwiGLU's backward, then gate and up */
    ZRC_TRY(zrk_cast_bf16(m->dres_bf, m->dres, N * C, s));
    ZRC_TRY(zrc_mm_dinp(h, m->scratch, F32, 0.0f, m->dres_bf, C, W16(DOWN), N, I, C, 1.0f));
    ZRC_TRY(zrc_mm_dw(h, V32(G, DOWN), m->dres_bf, C, a->hmlp, N, I, C, 1.0f));
    ZRC_TRY(zrk_swiglu_backward(dg, du, m->scratch, a->gate, a->up, N * I, s));
    ZRC_TRY(zrc_mm_dinp(h, m->dC, F32, 0.0f, dg, I, W16(GATE), N, C, I, 1.0f));
    ZRC_TRY(zrc_mm_dinp(h, m->dC, F32, 1.0f, du, I, W16(UP), N, C, I, 1.0f));
    ZRC_TRY(zrc_mm_dw(h, V32(G, GATE), dg, I, a->xn2, N, C, I, 1.0f));
    ZRC_TRY(zrc_mm_dw(h, V32(G, UP), du, I, a->xn2, N, C, I, 1.0f));
    ZRC_TRY(zrk_rmsnorm_backward(m->dres, V32(G, LN2), m->partial, m->dC, a->res2, a->rstd2,
                                 V32(P, LN2), N, C, s));
    /* attention: o, the grouped attention, the rotation back, q k v */
    ZRC_TRY(zrk_cast_bf16(m->dres_bf, m->dres, N * C, s));
    ZRC_TRY(zrc_mm_dinp(h, m->datty, BF, 0.0f, m->dres_bf, C, W16(O), N, C, C, 1.0f));
    ZRC_TRY(zrc_mm_dw(h, V32(G, O), m->dres_bf, C, a->atty, N, C, C, 1.0f));
    ZRC_TRY(zrc_gqa_backward(h, s, dq, dk, dv, m->datty, a->q, a->k, a->v, a->att, m->tmp, m->S,
                             m->dS, B, T, C, d->H, d->KV));
    ZRC_TRY(zrk_rope_unpermute(dx, dq, dk, dv, m->rope_cos, m->rope_sin, B, T, d->H, d->KV,
                               d->hd, s));
    ZRC_TRY(zrc_mm_dinp(h, m->dC, F32, 0.0f, dx, QL, W16(Q), N, C, C, 1.0f));
    ZRC_TRY(zrc_mm_dinp(h, m->dC, F32, 1.0f, dx + C, QL, W16(K), N, C, KVD, 1.0f));
    ZRC_TRY(zrc_mm_dinp(h, m->dC, F32, 1.0f, dx + C + KVD, QL, W16(V), N, C, KVD, 1.0f));
    ZRC_TRY(zrc_mm_dw(h, V32(G, Q), dx, QL, a->xn1, N, C, C, 1.0f));
    ZRC_TRY(zrc_mm_dw(h, V32(G, K), dx + C, QL, a->xn1, N, C, KVD, 1.0f));
    ZRC_TRY(zrc_mm_dw(h, V32(G, V), dx + C + KVD, QL, a->xn1, N, C, KVD, 1.0f));
    return zrk_rmsnorm_backward(m->dres, V32(G, LN1), m->partial, m->dC, res, a->rstd1,
                                V32(P, LN1), N, C, s);
}

/* ---------------------------------------------------------------- forward and backward */

int zrc_llama_forward(zr_dev_model *m, size_t B, size_t T)
{
    ll_dims d = dims(m);
    size_t N = B * T, hg = head_group(m);
    cudaStream_t s = m->stream;
    const float *P;
    ZRC_TRY(zrc_params_get(m, 0, &P));
    ZRC_TRY(zrk_encoder_forward(m->encoded, m->tok, P, NULL, N, T, d.C, s));
    ZRC_TRY(zrc_params_put(m, 0));
    const float *res = m->encoded;
    for (size_t l = 0; l < d.L; l++) {
        ZRC_TRY(zrc_params_get(m, l + 1, &P));
        ZRC_TRY(zrk_cast_bf16(m->wslot, P, m->layer_numel, s));
        ZRC_TRY(layer_forward(m, &d, &m->ll[l], res, P, B, T, 1));
        ZRC_TRY(zrc_params_put(m, l + 1));
        res = m->ll[l].res3;
    }
    m->held = d.L - 1;
    ZRC_TRY(zrc_params_get(m, d.L + 1, &P));
    ZRC_TRY(zrk_rmsnorm_forward(m->lnf, m->lnf_rstd, res, P, N, d.C, (float)m->c.norm_eps, s));
    ZRC_TRY(zrc_params_put(m, d.L + 1));
    ZRC_TRY(zrc_params_get(m, hg, &P));
    ZRC_TRY(zrk_cast_bf16(m->wte_bf, P, d.V * d.C, s));
    ZRC_TRY(zrc_head_forward(m, m->wte_bf, N, m->has_targets));
    return zrc_params_put(m, hg);
}

int zrc_llama_backward(zr_dev_model *m, float scale)
{
    ll_dims d = dims(m);
    size_t B = m->B, T = m->T, N = B * T, hg = head_group(m), maxN = m->max_N;
    cudaStream_t s = m->stream;
    const float *P;
    float *G, *demb = NULL;
    /* the head; a tied head's gradient is the embedding's, kept until the embedding adds its
     * part */
    ZRC_TRY(zrc_params_get(m, hg, &P));
    ZRC_TRY(zrc_grads_get(m, hg, &G));
    ZRC_TRY(zrk_cast_bf16(m->wte_bf, P, d.V * d.C, s));
    ZRC_TRY(zrc_head_backward(m, m->wte_bf, G, N, scale / (float)N));
    ZRC_TRY(zrc_params_put(m, hg));
    if (m->c.tied)
        demb = G;
    else
        ZRC_TRY(zrc_grads_put(m, hg));
    ZRC_CU(cudaMemsetAsync(m->dres, 0, N * d.C * sizeof(float), s), "zeroing dres");
    ZRC_TRY(zrc_params_get(m, d.L + 1, &P));
    ZRC_TRY(zrc_grads_get(m, d.L + 1, &G));
    ZRC_TRY(zrk_rmsnorm_backward(m->dres, G, m->partial, m->dC, m->ll[d.L - 1].res3,
                                 m->lnf_rstd, P, N, d.C, s));
    ZRC_TRY(zrc_params_put(m, d.L + 1));
    ZRC_TRY(zrc_grads_put(m, d.L + 1));
    for (size_t l = d.L; l-- > 0;) {
        ll_acts *a = &m->ll[l];
        const float *res = l ? m->ll[l - 1].res3 : m->encoded;
        ZRC_TRY(zrc_params_get(m, l + 1, &P));
        ZRC_TRY(zrc_grads_get(m, l + 1, &G));
        ZRC_TRY(zrk_cast_bf16(m->wslot, P, m->layer_numel, s));
        if (zrc_recompute_due(m, l)) { /* inside this fetch of the layer: no second gather */
            if (m->recompute == ZR_RECOMPUTE_LAYER)
                ZRC_TRY(layer_forward(m, &d, a, res, P, B, T, 0));
            else /* the probabilities again; the output goes to datty, free until then */
                ZRC_TRY(zrc_gqa_forward(m->blas, s, m->datty, a->att, m->S, m->tmp, a->q, a->k,
                                        a->v, B, T, d.C, d.H, d.KV));
            m->held = l;
        }
        ZRC_TRY(layer_backward(m, &d, a, res, P, G, B, T));
        ZRC_TRY(zrc_params_put(m, l + 1));
        ZRC_TRY(zrc_grads_put(m, l + 1));
    }
    if (!demb)
        ZRC_TRY(zrc_grads_get(m, 0, &demb));
    const int32_t *ti = m->tok;
    ZRC_TRY(zrk_encoder_backward_wte(demb, m->dres, ti + 2 * maxN, ti + 3 * maxN, ti + 4 * maxN,
                                     m->U, d.C, s));
    return zrc_grads_put(m, 0);
}
