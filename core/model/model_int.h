/*
 * model_int.h: what the model families of core/model/ share (not part of zr.h). kernels.c holds
 * the kernels every family uses (matmuls on the par_for threads, causal attention, softmax
 * cross-entropy and the head's backward, the deterministic initializer, the arenas and the ZeRO
 * hooks); model.c holds GPT-2 and llama.c the Llama family on top of them. zr_model (model.c)
 * is the public handle: a Llama model is a zr_model whose calls go to its zr__llama.
 */
#ifndef ZR_MODEL_INT_H
#define ZR_MODEL_INT_H

#include "model.h"

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- memory and hooks */

/* A zeroed arena aligned to 2 MiB with huge pages advised; *bytes rounded up to 2 MiB. */
void *zr__arena_alloc(size_t *bytes);
#define ZR__ARENA_ALIGN ((size_t)2 << 20)
/* A model's three arenas: parameters and gradients of numel floats each (none for a side the
 * hooks lend: NULL, 0 bytes) and *abytes of activations; the byte counts rounded up to 2 MiB.
 * ZR_ENOMEM naming the sizes (batch max_B x seq max_T), with nothing left allocated. */
int zr__arenas_alloc(float **params, size_t *pbytes, float **grads, size_t *gbytes,
                     unsigned char **acts, size_t *abytes, uint64_t numel,
                     const zr_model_hooks *h, size_t max_B, size_t max_T);
/* Next buffer of an activation arena at *off: with base NULL only counts (the sizing pass);
 * *total adds the bytes in double so that callers can reject sizes past size_t. */
void *zr__carve(unsigned char *base, size_t *off, double *total, size_t numel);
/* x[0, n) = 0 on the par_for threads */
void zr__par_zero(float *x, size_t n);
/* Group g's parameters or gradient buffer: own (the own arena's group start) when the hooks
 * lend none, else what the hooks lend; the _put calls say the model is done with them. */
int zr__params_get(const zr_model_hooks *h, const float *own, size_t g, const float **out);
int zr__params_put(const zr_model_hooks *h, size_t g);
int zr__grads_get(const zr_model_hooks *h, float *own, size_t g, float **out);
int zr__grads_put(const zr_model_hooks *h, size_t g);
/* ZR_EINVAL when a token id is outside [0, V) ("forward: what[i] = x ...") */
int zr__check_tokens(const int32_t *tok, size_t n, uint32_t V, const char *what);
/* x[i] = std N(0, 1) for arena elements [first, first + n) of the stream of seed: each element
 * a function of (seed, its arena index) alone */
void zr__fill_normal(float *x, uint64_t first, uint64_t n, uint64_t seed, float std);

/* ---------------------------------------------------------------- steps */

/* ZR_EINVAL unless 1 <= max_B, 1 <= max_T <= ctx and hooks (may be NULL) come in pairs */
int zr__check_new(size_t max_B, size_t max_T, uint32_t ctx, const zr_model_hooks *hooks);
/* What a forward does first: ZR_EINVAL unless 1 <= B <= max_B, 1 <= T <= max_T and every token
 * id is below V; then the tokens are copied into in_copy (and tg_copy when targets). */
int zr__forward_begin(int32_t *in_copy, int32_t *tg_copy, const int32_t *inputs,
                      const int32_t *targets, size_t B, size_t T, size_t max_B, size_t max_T,
                      uint32_t V);
/* The mean of losses[0, N) summed in double (0 without targets) */
float zr__mean_loss(const float *losses, size_t N, int targets);
/* ZR_EINVAL unless the last forward (fwd_targets: -1 none, 0 without targets, 1 with) can be
 * differentiated */
int zr__backward_check(int fwd_targets);

/* ---------------------------------------------------------------- kernels */

/* C[M, N] = op(A) op(B) + beta C, row-major, on the par_for threads */
void zr__gemm(int ta, int tb, size_t M, size_t N, size_t K, const float *A, size_t lda,
              const float *B, size_t ldb, float beta, float *C, size_t ldc);
/* A hook on the block of C (rows r0..r1, columns c0..c1) one part of a matmul owns, run on the
 * thread that computes it: pre before its product, post right after (while the block is in that
 * thread's cache). The blocks are disjoint and cover C; an elementwise hook gives the same bits
 * as a separate pass over C. */
typedef struct {
    void (*fn)(void *ctx, size_t r0, size_t r1, size_t c0, size_t c1);
    void *ctx;
} zr__gemm_hook;
void zr__gemm_hooked(int ta, int tb, size_t M, size_t N, size_t K, const float *A, size_t lda,
                     const float *B, size_t ldb, float beta, float *C, size_t ldc,
                     const zr__gemm_hook *pre, const zr__gemm_hook *post);
/* model.c's LayerNorm over N rows of C (mean, rstd [N] kept when not NULL) and tanh GELU of n
 * elements (out may be inp), on the par_for threads: the training forward's, and inference's
 * (generate.c), so both compute the same numbers. */
void zr__layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *bias, size_t N, size_t C);
void zr__gelu_forward(float *out, const float *inp, size_t n);
/* llama.c's RMSNorm over N rows of C (rstd [N] kept when not NULL), on the par_for threads: the
 * training forward's and inference's */
void zr__rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, size_t N,
                         size_t C, float eps);
/* out[N, OC] = (res ? res : 0) + inp[N, IC] W[OC, IC]^T + (bias ? bias : 0) */
void zr__matmul_forward(float *out, const float *res, const float *inp, const float *W,
                        const float *bias, size_t N, size_t IC, size_t OC);
/* dinp[N, IC] = dout W (overwritten); dW += dout^T inp; db (may be NULL) += column sums */
void zr__matmul_backward(float *dinp, float *dW, float *db, const float *dout, const float *inp,
                         const float *W, size_t N, size_t IC, size_t OC);
/* An elementwise kernel over flat indices [i0, i1) of a [rows, ld] buffer (a par_for chunk
 * function) as a gemm hook: zr__elems_hook_fn runs it on each row's part of the block. */
typedef struct {
    void (*elems)(void *ctx, size_t i0, size_t i1);
    void *ctx;
    size_t ld;
} zr__elems_hook;
void zr__elems_hook_fn(void *hook, size_t r0, size_t r1, size_t c0, size_t c1);
/* the same with post (may be NULL) on each block of out / dinp once computed (see above) */
void zr__matmul_forward_hooked(float *out, const float *res, const float *inp, const float *W,
                               const float *bias, size_t N, size_t IC, size_t OC,
                               const zr__gemm_hook *post);
void zr__matmul_backward_hooked(float *dinp, float *dW, float *db, const float *dout,
                                const float *inp, const float *W, size_t N, size_t IC, size_t OC,
                                const zr__gemm_hook *post);

/* Causal attention over rows of a [N, ld] buffer: query head h at columns [h hs, (h+1) hs),
 * its key and value head h / grp at koff + (h / grp) hs and voff + (h / grp) hs (grp query
 * heads share a key/value head: grouped-query attention; GPT-2: grp 1, ld 3C, koff C,
 * voff 2C); the output [N, NH hs]. */
typedef struct {
    size_t B, T, NH, hs, grp, ld, koff, voff;
} zr__att_geom;
void zr__attention_forward(const zr__att_geom *g, float *out, float *att, const float *qkv);
/* dqkv [N, ld] (the q, k, v columns overwritten) from dout [N, NH hs]; rows: [B NH, T]; att
 * and y [N, NH hs]: what the forward wrote */
void zr__attention_backward(const zr__att_geom *g, float *dqkv, float *rows, const float *dout,
                            const float *qkv, const float *att, const float *y);

/* The head's state between forward and backward: logits [N, V] = x W^T, softmax, mean
 * cross-entropy, computed in chunks of rows_cap rows (at most 64 MiB of logits, at least one
 * row; a function of V alone when N is larger) in every recompute mode, so that each row gets
 * the same bits whichever mode keeps what (kernels.c). probs [N, V]: the
 * probabilities kept for the backward; NULL with zr_recompute layer, where only rmax and rsum
 * [N] (each row's maximum logit and sum of e^(logit - max)) are kept and the backward recomputes
 * each chunk's logits. chunk [rows_cap, V]: scratch, a chunk's logits and dlogits. */
typedef struct {
    float *probs, *chunk, *rmax, *rsum;
    size_t rows_cap;
} zr__head;
/* Carve a head's buffers for N positions (zr__carve: base NULL only counts): the probabilities
 * unless the mode is zr_recompute layer, which keeps each row's maximum and sum instead */
void zr__head_carve(zr__head *h, unsigned char *base, size_t *off, double *total, size_t N,
                    size_t V, zr_recompute rc);
/* losses[n] = -log p[n, targets[n]] (targets NULL: none), through W [V, C] and x [N, C] */
void zr__head_forward(const zr__head *h, float *losses, const int32_t *targets, const float *W,
                      const float *x, size_t N, size_t C, size_t V);
/* dlogits = k (probs - onehot(targets)) chunk by chunk; dx [N, C] = dlogits W (overwritten);
 * dW [V, C] += dlogits^T x (dW NULL: not computed). */
void zr__head_backward(const zr__head *h, float *dx, float *dW, const int32_t *targets,
                       const float *W, const float *x, size_t N, size_t C, size_t V, float k);
/* The gradient of a group of V rows of C (an embedding, a head, or both when tied) in the
 * pieces the hooks lend (model.h): the head's dW rows (head NULL: no head; W, x, targets and k
 * as zr__head_backward's; each piece recomputes its columns of dlogits), then the embedding's
 * rows from dout (the gradient at its output [N, C]: row inp[n], or n mod T without inp; dout
 * NULL: no embedding). zr__grad_piece_rows: rows per piece (a multiple of the 64-row blocks
 * the head's gradient and logits are computed in), 0 when group g has none. */
typedef struct {
    size_t N, C, V, T;
    const zr__head *head;
    const float *W, *x;
    const int32_t *targets;
    float k;
    const float *dout;
    const int32_t *inp;
} zr__grad_src;
uint64_t zr__grad_piece_rows(const zr_model_hooks *h, size_t g, size_t C);
int zr__grad_pieces(const zr_model_hooks *h, size_t g, const zr__grad_src *s);

/* Sums in a fixed order: eight partial sums over i mod 8, combined pairwise, then the tail
 * (the result does not depend on the vector width the compiler picks). */
static inline float zr__dot8(const float *restrict a, const float *restrict b, size_t n)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ---------------------------------------------------------------- the Llama family (llama.c) */

typedef struct zr__llama zr__llama;
int zr__llama_new(zr__llama **out, const zr_config *c, size_t max_B, size_t max_T,
                  const zr_model_hooks *hooks, zr_recompute recompute);
void zr__llama_free(zr__llama *m);
uint64_t zr__llama_activation_bytes(const zr_config *c, size_t max_B, size_t max_T,
                                    zr_recompute recompute);
size_t zr__llama_n_groups(const zr__llama *m);
uint64_t zr__llama_group_numel(const zr__llama *m, size_t g);
uint64_t zr__llama_numel(const zr__llama *m);
float *zr__llama_param(zr__llama *m, size_t g);
float *zr__llama_grad(zr__llama *m, size_t g);
size_t zr__llama_fetch_order(const zr__llama *m, int backward, size_t *order);
void zr__llama_init_range(const zr__llama *m, uint64_t seed, size_t g, uint64_t off, uint64_t n,
                          float *dst);
int zr__llama_forward(zr__llama *m, const int32_t *inputs, const int32_t *targets, size_t B,
                      size_t T, float *loss);
int zr__llama_backward(zr__llama *m, float scale);
const float *zr__llama_probs(const zr__llama *m);
void zr__llama_zero_grad(zr__llama *m);
void zr__llama_bytes(const zr__llama *m, uint64_t *params, uint64_t *grads, uint64_t *acts);

/* zr_llama_offsets (model.h) are computed in llama.c from the same layout as the model. */
/* The rotary table of llama.c: cos and sin [T, hd / 2] of position t times
 * theta^(-2i / hd) (angles in double, rounded to float). */
void zr__llama_rope_table(float *cos_t, float *sin_t, size_t T, size_t hd, double theta);

#endif
