/*
 * zrcuda.h: internal header of the CUDA backend (core/device/cuda/, built into build/libzr_cuda.so).
 * Nothing here is exported: the shared object is compiled with hidden visibility and exports
 * only the getter of device.h (ZR_DEVICE_SYMBOL).
 *
 *   runtime.cu  errors, device selection, memory, streams and events, the ops table
 *   kernels.cu  the elementwise, row and reduction kernels of the model (and their launchers)
 *   model.cu    the device model (devmodel.h): buffers, hooks, the head, cuBLAS matmuls,
 *               attention, GPT-2's forward and backward
 *   llama.cu    the Llama family's forward and backward on the same model
 *   optim.cu    AdamW, the sum of squares (the CPU's bits) and y += x
 *   nccl.cu     the communicator
 *   testk.cu    the per-layer entry points of zr_device_kernels (tests/gpu/kernels.c)
 */
#ifndef ZR_CUDA_INTERNAL_H
#define ZR_CUDA_INTERNAL_H

#include "device.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

/* ---------------------------------------------------------------- errors (runtime.cu) */

/* Format the message, hand it to the installed handler (or keep it thread-locally), return
 * code. */
int zrc_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* ZR_EDEVICE "cuda: <what>: <cudaGetErrorString> (<cudaGetErrorName>)" */
int zrc_cuda_err(cudaError_t e, const char *what);
int zrc_cublas_err(cublasStatus_t s, const char *what);

#define ZRC_CU(call, what)                                                                     \
    do {                                                                                       \
        cudaError_t zrc_e_ = (call);                                                           \
        if (zrc_e_ != cudaSuccess)                                                             \
            return zrc_cuda_err(zrc_e_, (what));                                               \
    } while (0)
/* after a kernel launch: a bad configuration shows here, a fault at the next sync */
#define ZRC_LAUNCHED(what) ZRC_CU(cudaGetLastError(), (what))
#define ZRC_TRY(x)                                                                             \
    do {                                                                                       \
        int zrc_rc_ = (x);                                                                     \
        if (zrc_rc_ < 0)                                                                       \
            return zrc_rc_;                                                                    \
    } while (0)

/* ---------------------------------------------------------------- device and memory */

/* Make the selected GPU (ops->init; GPU 0 before) current on this thread. */
int zrc_ensure_device(void);
/* Device memory through the tracked allocator (ops->mem_stats counts it). */
int zrc_malloc(void **out, size_t bytes, const char *what);
void zrc_free(void *p);

/* ---------------------------------------------------------------- kernels (kernels.cu) */
/* Every launcher enqueues on s and returns 0 or ZR_EDEVICE (a launch error). Shapes as in
 * core/model/model.c: N = B T rows, C channels, NH heads, hs = C / NH, V vocabulary. */

int zrk_cast_bf16(bf16 *dst, const float *src, size_t n, cudaStream_t s);
int zrk_to_f32(float *dst, const bf16 *src, size_t n, cudaStream_t s);
int zrk_fill(float *dst, float v, size_t n, cudaStream_t s);

/* out[n, c] = wte[tok[n], c] + wpe[n % T, c] (wpe NULL: the embedding alone) */
int zrk_encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe,
                        size_t N, size_t T, size_t C, cudaStream_t s);
/* dwte[uniq[u], c] += sum of dout[pos[j], c] for j in [seg[u], seg[u+1]) (positions of token
 * uniq[u], ascending), for u < U */
int zrk_encoder_backward_wte(float *dwte, const float *dout, const int32_t *pos,
                             const int32_t *uniq, const int32_t *seg, size_t U, size_t C,
                             cudaStream_t s);
/* dwpe[t, c] += sum over b (in order) of dout[b T + t, c] */
int zrk_encoder_backward_wpe(float *dwpe, const float *dout, size_t B, size_t T, size_t C,
                             cudaStream_t s);

/* out (bf16) = (inp - mean) rstd w + b per row; mean, rstd fp32 */
int zrk_layernorm_forward(bf16 *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, size_t N, size_t C, cudaStream_t s);
/* dinp += ..., dw += ..., db += ... (partial: zrk_partial_floats(N, 2C) floats of scratch) */
int zrk_layernorm_backward(float *dinp, float *dw, float *db, float *partial, const float *dout,
                           const float *inp, const float *mean, const float *rstd,
                           const float *w, size_t N, size_t C, cudaStream_t s);

/* db[j] += sum over the N rows of x[n, j] (fixed order: row chunks, then chunks in order);
 * partial: zrk_partial_floats(N, OC) floats */
int zrk_colsum_f32(float *db, float *partial, const float *x, size_t N, size_t OC,
                   cudaStream_t s);
int zrk_colsum_bf16(float *db, float *partial, const bf16 *x, size_t N, size_t OC,
                    cudaStream_t s);
size_t zrk_partial_floats(size_t N, size_t cols);

/* out[n, j] = (res ? res[n, j] : 0) + (bias ? bias[j] : 0), fp32: the rows a matmul adds onto */
int zrk_rows_init(float *out, const float *res, const float *bias, size_t N, size_t OC,
                  cudaStream_t s);
/* pre = bf16(x + bias), act = bf16(gelu(x + bias)) */
int zrk_bias_gelu(bf16 *pre, bf16 *act, const float *x, const float *bias, size_t N, size_t OC,
                  cudaStream_t s);
/* dx = bf16(dout * gelu'(pre)) */
int zrk_gelu_backward(bf16 *dx, const float *dout, const bf16 *pre, size_t n, cudaStream_t s);

/* x [N, 3C] fp32 (+ bias [3C] if not NULL) -> q, k, v [B, NH, T, hs] bf16 */
int zrk_qkv_permute(bf16 *q, bf16 *k, bf16 *v, const float *x, const float *bias, size_t B,
                    size_t T, size_t C, size_t NH, cudaStream_t s);
/* dst [B, NH, T, hs] <- src rows of stride ld (head h at columns h hs) */
int zrk_heads_permute(bf16 *dst, const bf16 *src, size_t ld, size_t B, size_t T, size_t C,
                      size_t NH, cudaStream_t s);
/* dst rows of stride ld <- src [B, NH, T, hs] */
int zrk_heads_unpermute(bf16 *dst, size_t ld, const bf16 *src, size_t B, size_t T, size_t C,
                        size_t NH, cudaStream_t s);
/* P = causal softmax of each row of S [BNH, T, T] (already scaled), zeros above the diagonal */
int zrk_attn_softmax_forward(bf16 *P, const float *S, size_t BNH, size_t T, cudaStream_t s);
/* dS = P (dP - D) scale, D_t = sum_j P[t, j] dP[t, j]; zeros above the diagonal */
int zrk_attn_softmax_backward(bf16 *dS, const float *dP, const bf16 *P, size_t BNH, size_t T,
                              float scale, cudaStream_t s);

/* One chunk of the head: logits [rows, ldl] fp32 -> d [rows, ldd] bf16 = p - onehot(target)
 * (p alone without targets), losses[rows] = log(sum) - (logit[target] - max) */
int zrk_xent_forward(bf16 *d, size_t ldd, float *losses, const float *logits, size_t ldl,
                     const int32_t *targets, size_t rows, size_t V, cudaStream_t s);
/* dst [rows, V] fp32 = d + onehot(target) (probabilities back from the head's d) */
int zrk_probs_export(float *dst, const bf16 *d, size_t ldd, const int32_t *targets, size_t rows,
                     size_t V, cudaStream_t s);
/* out[0] = sum of x[0, n) in double (fixed tree) */
int zrk_sum_f64(double *out, const float *x, size_t n, cudaStream_t s);

/* Llama. RMSNorm: out (bf16) = x r w per row, rstd[N] = r = 1 / sqrt(mean(x^2) + eps) (fp32);
 * backward: dinp += r w d - x r^3 sum(w d x) / C, dw += column sums of d x r (partial:
 * zrk_partial_floats(N, C) floats). */
int zrk_rmsnorm_forward(bf16 *out, float *rstd, const float *inp, const float *w, size_t N,
                        size_t C, float eps, cudaStream_t s);
int zrk_rmsnorm_backward(float *dinp, float *dw, float *partial, const float *dout,
                         const float *inp, const float *rstd, const float *w, size_t N, size_t C,
                         cudaStream_t s);
/* Rows x [N, QL] fp32 of q (H heads), k, v (KV heads each, hd channels a head) -> q [B, H, T,
 * hd], k, v [B, KV, T, hd] bf16, q and k turned by the rotary angles of position t = n mod T
 * (rotate-half; cos_t, sin_t [T, hd / 2]). The backward: dq, dk turned back, dv, into rows
 * dx [N, QL] bf16. */
int zrk_rope_permute(bf16 *q, bf16 *k, bf16 *v, const float *x, const float *cos_t,
                     const float *sin_t, size_t B, size_t T, size_t H, size_t KV, size_t hd,
                     cudaStream_t s);
int zrk_rope_unpermute(bf16 *dx, const bf16 *dq, const bf16 *dk, const bf16 *dv,
                       const float *cos_t, const float *sin_t, size_t B, size_t T, size_t H,
                       size_t KV, size_t hd, cudaStream_t s);
/* SwiGLU on n elements: gate = bf16(g), up = bf16(u), h = bf16(silu(g) u); backward from dh
 * (fp32): dgate = dh up silu'(gate), dup = dh silu(gate) (bf16, gate and up as kept). */
int zrk_swiglu_forward(bf16 *gate, bf16 *up, bf16 *h, const float *g, const float *u, size_t n,
                       cudaStream_t s);
int zrk_swiglu_backward(bf16 *dgate, bf16 *dup, const float *dh, const bf16 *gate,
                        const bf16 *up, size_t n, cudaStream_t s);

/* ---------------------------------------------------------------- optimizer (optim.cu) */

int zrc_adamw(float *param, const float *grad, float *m, float *v, size_t n, uint64_t t,
              float lr, float grad_scale, int decay, const zr_adamw_hp *hp, zr_dev_stream *s);
int zrc_sumsq(const float *x, size_t n, double *out, zr_dev_stream *s);
/* y[i] += x[i] (ops->add) */
int zrc_add(float *y, const float *x, size_t n, zr_dev_stream *s);

/* ---------------------------------------------------------------- matmuls (model.cu) */

/* Row-major C[M, N] = alpha op(A)[M, K] op(B)[K, N] + beta C (op transposes when ta / tb),
 * fp32 accumulation, `batch` products at strides sA, sB, sC elements (cuBLAS, column-major,
 * through C^T = op(B)^T op(A)^T). Types: CUDA_R_16BF or CUDA_R_32F. */
int zrc_gemm(cublasHandle_t h, int ta, int tb, size_t M, size_t N, size_t K, float alpha,
             const void *A, cudaDataType_t at, size_t lda, long long sA, const void *B,
             cudaDataType_t bt, size_t ldb, long long sB, float beta, void *C,
             cudaDataType_t ct, size_t ldc, long long sC, int batch);
/* A cuBLAS handle on stream s with its workspace (model.cu); free with zrc_blas_free. */
int zrc_blas_new(cublasHandle_t *h, void **workspace, cudaStream_t s);
void zrc_blas_free(cublasHandle_t h, void *workspace);

/* Causal self-attention on permuted q, k, v [B, NH, T, hs] bf16: P [B, NH, T, T] bf16 out,
 * S scratch [B, NH, T, T] fp32, yp scratch [B, NH, T, hs] bf16, y [N, C] bf16 out. */
int zrc_attention_forward(cublasHandle_t h, cudaStream_t s, bf16 *y, bf16 *P, float *S, bf16 *yp,
                          const bf16 *q, const bf16 *k, const bf16 *v, size_t B, size_t T,
                          size_t C, size_t NH);
/* Backward from dy [N, C] bf16: dqkv [N, 3C] bf16 out; scratch dyp [B,NH,T,hs] bf16,
 * dP [B,NH,T,T] fp32, dS [B,NH,T,T] bf16, dqkvp [3, B,NH,T,hs] bf16. */
int zrc_attention_backward(cublasHandle_t h, cudaStream_t s, bf16 *dqkv, const bf16 *dy,
                           const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *P, bf16 *dyp,
                           float *dP, bf16 *dS, bf16 *dqkvp, size_t B, size_t T, size_t C,
                           size_t NH);

/* Causal grouped-query attention (Llama; GPT-2 is KV = H): q [B, H, T, hd], k, v [B, KV, T,
 * hd] bf16 (hd = C / H; the H / KV query heads of KV head j are heads j H/KV ..): P [B, H, T,
 * T] bf16 out, S scratch [B, H, T, T] fp32, yp scratch [B, H, T, hd] bf16, y [N, C] bf16 out.
 * Backward from dy [N, C] bf16: dq [B, H, T, hd], dk, dv [B, KV, T, hd] bf16 out (dk and dv
 * summed over each group's heads); scratch dyp [B, H, T, hd] bf16, dP [B, H, T, T] fp32, dS
 * [B, H, T, T] bf16. No copy of K or V per query head. */
int zrc_gqa_forward(cublasHandle_t h, cudaStream_t s, bf16 *y, bf16 *P, float *S, bf16 *yp,
                    const bf16 *q, const bf16 *k, const bf16 *v, size_t B, size_t T, size_t C,
                    size_t H, size_t KV);
int zrc_gqa_backward(cublasHandle_t h, cudaStream_t s, bf16 *dq, bf16 *dk, bf16 *dv,
                     const bf16 *dy, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *P,
                     bf16 *dyp, float *dP, bf16 *dS, size_t B, size_t T, size_t C, size_t H,
                     size_t KV);
/* The rotary table of c (zr__rope_table: cos and sin [T, hd / 2]) into device memory. */
int zrc_rope_upload(float *cos_dev, float *sin_dev, size_t T, size_t hd, double theta);

/* Rows of the head's logits scratch: at most ZRC_XENT_BYTES of fp32 logits. */
#define ZRC_XENT_BYTES ((size_t)256 << 20)
size_t zrc_xent_chunk_rows(size_t N, size_t Vp);
/* The vocabulary padded to a multiple of 64: the row stride of the head's matrices, so that
 * every row of a bf16 operand starts 128-byte aligned. */
static inline size_t zrc_pad_vocab(size_t V) { return (V + 63) / 64 * 64; }

/* Host-side plan of the embedding's backward: for the N tokens, the positions sorted by token
 * (stable: ascending within a token), the distinct tokens in ascending order and where each
 * one's positions start; ints[3 N + 1] receive pos[N], uniq[U], seg[U + 1]; returns U.
 * counts: scratch of V ints, zeroed on entry and on return. */
size_t zrc_token_plan(const int32_t *tok, size_t N, size_t V, int32_t *pos, int32_t *uniq,
                      int32_t *seg, int32_t *counts);

/* ---------------------------------------------------------------- model (model.cu) */

uint64_t zrc_activation_bytes(const zr_config *c, const zr_model_offsets *off, size_t max_B,
                              size_t max_T, zr_recompute rc);
int zrc_model_new(zr_dev_model **out, const zr_config *c, const zr_model_offsets *off,
                  size_t max_B, size_t max_T, const zr_model_hooks *hooks, zr_recompute rc);
void zrc_model_free(zr_dev_model *m);
zr_dev_stream *zrc_model_stream(zr_dev_model *m);
size_t zrc_model_n_groups(const zr_dev_model *m);
uint64_t zrc_model_group_numel(const zr_dev_model *m, size_t g);
uint64_t zrc_model_numel(const zr_dev_model *m);
size_t zrc_model_fetch_order(const zr_dev_model *m, int backward, size_t *order);
float *zrc_model_param(zr_dev_model *m, size_t g);
float *zrc_model_grad(zr_dev_model *m, size_t g);
int zrc_model_zero_grad(zr_dev_model *m);
int zrc_model_forward(zr_dev_model *m, const int32_t *inputs, const int32_t *targets, size_t B,
                      size_t T, float *loss);
int zrc_model_loss(zr_dev_model *m, float *loss);
int zrc_model_backward(zr_dev_model *m, float scale);
int zrc_model_probs(zr_dev_model *m, float *host_dst);
void zrc_model_bytes(const zr_dev_model *m, uint64_t *params, uint64_t *grads, uint64_t *acts);

/* ---------------------------------------------------------------- communicator (nccl.cu) */

int zrc_comm_unique_id(void *id, size_t cap);
int zrc_comm_new(zr_dev_comm **out, const void *id, size_t id_bytes, int rank, int world);
void zrc_comm_free(zr_dev_comm *c);
int zrc_comm_rank(const zr_dev_comm *c);
int zrc_comm_world(const zr_dev_comm *c);
zr_dev_stream *zrc_comm_stream(zr_dev_comm *c);
int zrc_comm_wait(zr_dev_comm *c, int (*check)(void *ctx), void *ctx);
int zrc_all_reduce(zr_dev_comm *c, const void *send, void *recv, size_t n, zr_dev_dtype dt);
int zrc_reduce_scatter(zr_dev_comm *c, const void *send, void *recv, size_t n, zr_dev_dtype dt);
int zrc_all_gather(zr_dev_comm *c, const void *send, void *recv, size_t n, size_t elem_bytes);
int zrc_broadcast(zr_dev_comm *c, void *buf, size_t bytes, int root);
int zrc_gather(zr_dev_comm *c, const void *send, void *recv, size_t bytes, int root);
int zrc_barrier(zr_dev_comm *c);
const char *zrc_nccl_version(void);

/* ---------------------------------------------------------------- tests (testk.cu) */

extern const zr_device_kernels zrc_kernels;

#endif
