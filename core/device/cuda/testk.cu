/*
 * testk.cu: zr_device_kernels (device.h), each layer's forward and backward on fp32 device
 * buffers through the model's own kernels and cuBLAS calls, rounding to bf16 where the model
 * does, for tests/gpu/kernels.c to compare with CPU references. Synchronous; scratch is
 * allocated and freed per call; everything runs on the legacy default stream.
 */
#include "zrcuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BF CUDA_R_16BF
#define F32 CUDA_R_32F

namespace {

/* device scratch freed when the call returns, whatever the path */
struct scratch {
    void *p[16];
    int n = 0;
    cublasHandle_t h = NULL;
    void *ws = NULL;
    ~scratch()
    {
        cudaDeviceSynchronize();
        for (int i = 0; i < n; i++)
            zrc_free(p[i]);
        zrc_blas_free(h, ws);
    }
    template <typename T> int get(T **out, size_t count)
    {
        *out = NULL;
        if (n == 16)
            return zrc_err(ZR_ENOMEM, "cuda: test scratch exhausted");
        ZRC_TRY(zrc_malloc((void **)out, count ? count * sizeof(T) : sizeof(T), "test scratch"));
        p[n++] = *out;
        return 0;
    }
    int blas(void) { return zrc_blas_new(&h, &ws, 0); }
};

int finish(const char *what)
{
    ZRC_CU(cudaDeviceSynchronize(), what);
    return 0;
}

int upload_ints(scratch &sc, int32_t **out, const int32_t *host, size_t n)
{
    ZRC_TRY(sc.get(out, n));
    ZRC_CU(cudaMemcpy(*out, host, n * sizeof(int32_t), cudaMemcpyHostToDevice), "upload");
    return 0;
}

int t_encoder(float *out, float *dwte, float *dwpe, const int32_t *tokens_host, const float *wte,
              const float *wpe, const float *dout, size_t B, size_t T, size_t C, size_t V)
{
    ZRC_TRY(zrc_ensure_device());
    scratch sc;
    size_t N = B * T;
    int32_t *tok;
    ZRC_TRY(upload_ints(sc, &tok, tokens_host, N));
    if (out)
        ZRC_TRY(zrk_encoder_forward(out, tok, wte, wpe, N, T, C, 0));
    if (dout) {
        int32_t *plan = (int32_t *)malloc((3 * N + 1) * sizeof(int32_t));
        int32_t *counts = (int32_t *)calloc(V, sizeof(int32_t));
        if (!plan || !counts) {
            free(plan);
            free(counts);
            return zrc_err(ZR_ENOMEM, "cuda: out of memory");
        }
        size_t U = zrc_token_plan(tokens_host, N, V, plan, plan + N, plan + 2 * N, counts);
        int32_t *dplan;
        int rc = upload_ints(sc, &dplan, plan, 3 * N + 1);
        free(plan);
        free(counts);
        ZRC_TRY(rc);
        ZRC_TRY(zrk_encoder_backward_wte(dwte, dout, dplan, dplan + N, dplan + 2 * N, U, C, 0));
        ZRC_TRY(zrk_encoder_backward_wpe(dwpe, dout, B, T, C, 0));
    }
    return finish("encoder");
}

int t_layernorm(float *out, float *mean, float *rstd, float *dinp, float *dw, float *db,
                const float *inp, const float *w, const float *b, const float *dout, size_t N,
                size_t C)
{
    ZRC_TRY(zrc_ensure_device());
    scratch sc;
    bf16 *o;
    ZRC_TRY(sc.get(&o, N * C));
    ZRC_TRY(zrk_layernorm_forward(o, mean, rstd, inp, w, b, N, C, 0));
    if (out)
        ZRC_TRY(zrk_to_f32(out, o, N * C, 0));
    if (dout) {
        float *partial;
        ZRC_TRY(sc.get(&partial, zrk_partial_floats(N, 2 * C)));
        ZRC_TRY(zrk_layernorm_backward(dinp, dw, db, partial, dout, inp, mean, rstd, w, N, C, 0));
    }
    return finish("layernorm");
}

int t_matmul(float *out, float *dinp, float *dW, float *db, const float *inp, const float *W,
             const float *bias, const float *res, const float *dout, size_t N, size_t IC,
             size_t OC)
{
    ZRC_TRY(zrc_ensure_device());
    scratch sc;
    ZRC_TRY(sc.blas());
    bf16 *ib, *wb;
    ZRC_TRY(sc.get(&ib, N * IC));
    ZRC_TRY(sc.get(&wb, OC * IC));
    ZRC_TRY(zrk_cast_bf16(ib, inp, N * IC, 0));
    ZRC_TRY(zrk_cast_bf16(wb, W, OC * IC, 0));
    if (out) { /* as the model's c_proj: rows of res + bias, then += inp W^T */
        ZRC_TRY(zrk_rows_init(out, res, bias, N, OC, 0));
        ZRC_TRY(zrc_gemm(sc.h, 0, 1, N, OC, IC, 1.0f, ib, BF, IC, 0, wb, BF, IC, 0, 1.0f, out, F32,
                         OC, 0, 1));
    }
    if (dout) {
        bf16 *db16;
        ZRC_TRY(sc.get(&db16, N * OC));
        ZRC_TRY(zrk_cast_bf16(db16, dout, N * OC, 0));
        ZRC_TRY(zrc_gemm(sc.h, 0, 0, N, IC, OC, 1.0f, db16, BF, OC, 0, wb, BF, IC, 0, 0.0f, dinp,
                         F32, IC, 0, 1));
        ZRC_TRY(zrc_gemm(sc.h, 1, 0, OC, IC, N, 1.0f, db16, BF, OC, 0, ib, BF, IC, 0, 1.0f, dW,
                         F32, IC, 0, 1));
        if (db) {
            float *partial;
            ZRC_TRY(sc.get(&partial, zrk_partial_floats(N, OC)));
            ZRC_TRY(zrk_colsum_f32(db, partial, dout, N, OC, 0));
        }
    }
    return finish("matmul");
}

int t_attention(float *y, float *att, float *dqkv, const float *qkv, const float *dy, size_t B,
                size_t T, size_t C, size_t NH)
{
    if (!NH || C % NH)
        return zrc_err(ZR_EINVAL, "cuda: attention: C %zu is not a multiple of NH %zu", C, NH);
    ZRC_TRY(zrc_ensure_device());
    scratch sc;
    ZRC_TRY(sc.blas());
    size_t N = B * T, NC = N * C, A = B * NH * T * T;
    bf16 *q, *P, *yp, *yb;
    float *S;
    ZRC_TRY(sc.get(&q, 3 * NC));
    ZRC_TRY(sc.get(&P, A));
    ZRC_TRY(sc.get(&S, A));
    ZRC_TRY(sc.get(&yp, NC));
    ZRC_TRY(sc.get(&yb, NC));
    bf16 *k = q + NC, *v = q + 2 * NC;
    ZRC_TRY(zrk_qkv_permute(q, k, v, qkv, NULL, B, T, C, NH, 0));
    ZRC_TRY(zrc_attention_forward(sc.h, 0, yb, P, S, yp, q, k, v, B, T, C, NH));
    if (y)
        ZRC_TRY(zrk_to_f32(y, yb, NC, 0));
    if (att)
        ZRC_TRY(zrk_to_f32(att, P, A, 0));
    if (dy) {
        bf16 *dyb, *dS, *dqkvp, *dqkvb;
        ZRC_TRY(sc.get(&dyb, NC));
        ZRC_TRY(sc.get(&dS, A));
        ZRC_TRY(sc.get(&dqkvp, 3 * NC));
        ZRC_TRY(sc.get(&dqkvb, 3 * NC));
        ZRC_TRY(zrk_cast_bf16(dyb, dy, NC, 0));
        ZRC_TRY(zrc_attention_backward(sc.h, 0, dqkvb, dyb, q, k, v, P, yp, S, dS, dqkvp, B, T, C,
                                       NH));
        ZRC_TRY(zrk_to_f32(dqkv, dqkvb, 3 * NC, 0));
    }
    return finish("attention");
}

int t_gelu(float *out, float *dinp, const float *inp, const float *dout, size_t n)
{
    ZRC_TRY(zrc_ensure_device());
    scratch sc;
    bf16 *pre, *act;
    ZRC_TRY(sc.get(&pre, n));
    ZRC_TRY(sc.get(&act, n));
    ZRC_TRY(zrk_bias_gelu(pre, act, inp, NULL, 1, n, 0));
    if (out)
        ZRC_TRY(zrk_to_f32(out, act, n, 0));
    if (dout) {
        bf16 *dx;
        ZRC_TRY(sc.get(&dx, n));
        ZRC_TRY(zrk_gelu_backward(dx, dout, pre, n, 0));
        ZRC_TRY(zrk_to_f32(dinp, dx, n, 0));
    }
    return finish("gelu");
}

int t_classifier(float *losses, float *probs, float *dlnf, float *dwte, const float *lnf,
                 const float *wte, const int32_t *targets_host, size_t N, size_t C, size_t V,
                 float scale, size_t chunk_rows)
{
    ZRC_TRY(zrc_ensure_device());
    scratch sc;
    ZRC_TRY(sc.blas());
    size_t Vp = zrc_pad_vocab(V);
    size_t rows_max = chunk_rows ? chunk_rows : zrc_xent_chunk_rows(N, Vp);
    bf16 *lb, *wb, *dl;
    float *logits;
    int32_t *tg;
    ZRC_TRY(sc.get(&lb, N * C));
    ZRC_TRY(sc.get(&wb, V * C));
    ZRC_TRY(sc.get(&dl, N * Vp));
    ZRC_TRY(sc.get(&logits, rows_max * Vp));
    ZRC_TRY(upload_ints(sc, &tg, targets_host, N));
    ZRC_TRY(zrk_cast_bf16(lb, lnf, N * C, 0));
    ZRC_TRY(zrk_cast_bf16(wb, wte, V * C, 0));
    for (size_t r0 = 0; r0 < N; r0 += rows_max) {
        size_t rows = N - r0 < rows_max ? N - r0 : rows_max;
        ZRC_TRY(zrc_gemm(sc.h, 0, 1, rows, V, C, 1.0f, lb + r0 * C, BF, C, 0, wb, BF, C, 0, 0.0f,
                         logits, F32, Vp, 0, 1));
        ZRC_TRY(zrk_xent_forward(dl + r0 * Vp, Vp, losses + r0, logits, Vp, tg + r0, rows, V, 0));
        if (probs)
            ZRC_TRY(zrk_probs_export(probs + r0 * V, dl + r0 * Vp, Vp, tg + r0, rows, V, 0));
    }
    if (dlnf)
        for (size_t r0 = 0; r0 < N; r0 += rows_max) {
            size_t rows = N - r0 < rows_max ? N - r0 : rows_max;
            ZRC_TRY(zrc_gemm(sc.h, 0, 0, rows, C, V, scale, dl + r0 * Vp, BF, Vp, 0, wb, BF, C, 0,
                             0.0f, dlnf + r0 * C, F32, C, 0, 1));
            ZRC_TRY(zrc_gemm(sc.h, 1, 0, V, C, rows, scale, dl + r0 * Vp, BF, Vp, 0, lb + r0 * C,
                             BF, C, 0, 1.0f, dwte, F32, C, 0, 1));
        }
    return finish("classifier");
}

int t_rmsnorm(float *out, float *rstd, float *dinp, float *dw, const float *inp, const float *w,
              const float *dout, size_t N, size_t C, float eps)
{
    ZRC_TRY(zrc_ensure_device());
    scratch sc;
    bf16 *ob;
    float *r, *partial;
    ZRC_TRY(sc.get(&ob, N * C));
    ZRC_TRY(sc.get(&r, N));
    ZRC_TRY(sc.get(&partial, zrk_partial_floats(N, C)));
    ZRC_TRY(zrk_rmsnorm_forward(ob, r, inp, w, N, C, eps, 0));
    if (out)
        ZRC_TRY(zrk_to_f32(out, ob, N * C, 0));
    if (rstd)
        ZRC_CU(cudaMemcpy(rstd, r, N * sizeof(float), cudaMemcpyDeviceToDevice), "rstd");
    if (dout)
        ZRC_TRY(zrk_rmsnorm_backward(dinp, dw, partial, dout, inp, r, w, N, C, 0));
    return finish("rmsnorm");
}

/* the Llama layer's attention path: rotation and permutation, grouped-query attention, and
 * back (llama.cu's calls, in its order) */
int t_rope_attention(float *y, float *att, float *dqkv, const float *qkv, const float *dy,
                     size_t B, size_t T, size_t C, size_t H, size_t KV, double theta)
{
    ZRC_TRY(zrc_ensure_device());
    scratch sc;
    ZRC_TRY(sc.blas());
    size_t hd = C / H, KVD = KV * hd, N = B * T, QL = C + 2 * KVD, A = B * H * T * T;
    bf16 *q, *P, *yp, *yb;
    float *S, *cs;
    ZRC_TRY(sc.get(&q, N * QL));
    ZRC_TRY(sc.get(&P, A));
    ZRC_TRY(sc.get(&S, A));
    ZRC_TRY(sc.get(&yp, N * C));
    ZRC_TRY(sc.get(&yb, N * C));
    ZRC_TRY(sc.get(&cs, T * hd));
    bf16 *k = q + N * C, *v = k + N * KVD;
    float *cos_t = cs, *sin_t = cs + T * (hd / 2);
    ZRC_TRY(zrc_rope_upload(cos_t, sin_t, T, hd, theta));
    ZRC_TRY(zrk_rope_permute(q, k, v, qkv, cos_t, sin_t, B, T, H, KV, hd, 0));
    ZRC_TRY(zrc_gqa_forward(sc.h, 0, yb, P, S, yp, q, k, v, B, T, C, H, KV));
    if (y)
        ZRC_TRY(zrk_to_f32(y, yb, N * C, 0));
    if (att)
        ZRC_TRY(zrk_to_f32(att, P, A, 0));
    if (dy) {
        bf16 *dyb, *dS, *dp, *dx;
        ZRC_TRY(sc.get(&dyb, N * C));
        ZRC_TRY(sc.get(&dS, A));
        ZRC_TRY(sc.get(&dp, N * QL));
        ZRC_TRY(sc.get(&dx, N * QL));
        ZRC_TRY(zrk_cast_bf16(dyb, dy, N * C, 0));
        bf16 *dk = dp + N * C, *dv = dk + N * KVD;
        ZRC_TRY(zrc_gqa_backward(sc.h, 0, dp, dk, dv, dyb, q, k, v, P, yp, S, dS, B, T, C, H, KV));
        ZRC_TRY(zrk_rope_unpermute(dx, dp, dk, dv, cos_t, sin_t, B, T, H, KV, hd, 0));
        ZRC_TRY(zrk_to_f32(dqkv, dx, N * QL, 0));
    }
    return finish("rope attention");
}

int t_swiglu(float *h, float *dg, float *du, const float *g, const float *u, const float *dh,
             size_t n)
{
    ZRC_TRY(zrc_ensure_device());
    scratch sc;
    bf16 *gb, *ub, *hb;
    ZRC_TRY(sc.get(&gb, n));
    ZRC_TRY(sc.get(&ub, n));
    ZRC_TRY(sc.get(&hb, n));
    ZRC_TRY(zrk_swiglu_forward(gb, ub, hb, g, u, n, 0));
    if (h)
        ZRC_TRY(zrk_to_f32(h, hb, n, 0));
    if (dh) {
        bf16 *dgb, *dub;
        ZRC_TRY(sc.get(&dgb, n));
        ZRC_TRY(sc.get(&dub, n));
        ZRC_TRY(zrk_swiglu_backward(dgb, dub, dh, gb, ub, n, 0));
        ZRC_TRY(zrk_to_f32(dg, dgb, n, 0));
        ZRC_TRY(zrk_to_f32(du, dub, n, 0));
    }
    return finish("swiglu");
}

} /* namespace */

const zr_device_kernels zrc_kernels = {t_encoder, t_layernorm,      t_matmul,
                                       t_attention, t_gelu,        t_classifier,
                                       t_rmsnorm, t_rope_attention, t_swiglu};
