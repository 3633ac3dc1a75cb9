/*
 * kernels.c: what the model families of core/model/ share (model_int.h): the arenas and the
 * ZeRO hooks, the deterministic initializer's stream, matmuls on the par_for threads (each part
 * one single-threaded cblas_sgemm), causal attention with grouped key/value heads, softmax
 * cross-entropy and the head's backward. model.c (GPT-2) and llama.c (Llama) compute with them;
 * neither calls into this file's callers, so the objects depend one way.
 *
 * Every loop here runs through par_for (par.h). Except in the matmuls, each output element is
 * computed by exactly one chunk in the order a single thread would use, so those results are
 * the same bits whatever the thread count (see model.c).
 */
#include "model_check.h"
#include "model_int.h"
#include "par.h"

#include "fastmath.h" /* zr_expf, ZR_VEC_CLONES */

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BUF_ALIGN 64 /* each activation buffer starts on a cache line */
#define HEAD_MAX_NUMEL ((size_t)1 << 24) /* the head's chunk: at most 64 MiB of rows */
#define ROWS_GRAIN 8  /* rows per chunk at least (rows of C floats) */
#define COLS_BLOCK 16 /* channels per unit of a column split */

static size_t col_blocks(size_t n) { return (n + COLS_BLOCK - 1) / COLS_BLOCK; }

/* ---------------------------------------------------------------- steps */

int zr__check_new(size_t max_B, size_t max_T, uint32_t ctx, const zr_model_hooks *hooks)
{
    char why[160];
    if (zr__new_problem(why, sizeof why, max_B, max_T, ctx, hooks))
        return zr_err_set(ZR_EINVAL, "%s", why);
    return 0;
}

int zr__forward_begin(int32_t *in_copy, int32_t *tg_copy, const int32_t *inputs,
                      const int32_t *targets, size_t B, size_t T, size_t max_B, size_t max_T,
                      uint32_t V)
{
    if (B < 1 || B > max_B)
        return zr_err_set(ZR_EINVAL, "forward: batch B = %zu out of range (expected 1..%zu)",
                          B, max_B);
    if (T < 1 || T > max_T)
        return zr_err_set(ZR_EINVAL, "forward: sequence length T = %zu out of range "
                          "(expected 1..%zu)", T, max_T);
    ZR_TRY(zr__check_tokens(inputs, B * T, V, "inputs"));
    if (targets)
        ZR_TRY(zr__check_tokens(targets, B * T, V, "targets"));
    memcpy(in_copy, inputs, B * T * sizeof *inputs);
    if (targets)
        memcpy(tg_copy, targets, B * T * sizeof *targets);
    return 0;
}

float zr__mean_loss(const float *losses, size_t N, int targets)
{
    double sum = 0.0;
    if (targets)
        for (size_t n = 0; n < N; n++)
            sum += losses[n];
    return (float)(sum / (double)N);
}

int zr__backward_check(int fwd_targets)
{
    if (fwd_targets < 0)
        return zr_err_set(ZR_EINVAL, "backward: no forward to differentiate");
    if (fwd_targets == 0)
        return zr_err_set(ZR_EINVAL, "backward: the last forward had no targets (no loss)");
    return 0;
}

/* A zeroed arena aligned to 2 MiB with huge pages advised; bytes rounded up to 2 MiB. */
void *zr__arena_alloc(size_t *bytes)
{
    size_t n = (*bytes + ZR__ARENA_ALIGN - 1) / ZR__ARENA_ALIGN * ZR__ARENA_ALIGN;
    void *p = NULL;
    if (n == 0 || posix_memalign(&p, ZR__ARENA_ALIGN, n))
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE); /* advice only: without THP the arena still works */
#endif
    memset(p, 0, n);
    *bytes = n;
    return p;
}

int zr__arenas_alloc(float **params, size_t *pbytes, float **grads, size_t *gbytes,
                     unsigned char **acts, size_t *abytes, uint64_t numel,
                     const zr_model_hooks *h, size_t max_B, size_t max_T)
{
    *pbytes = h->params ? 0 : numel * sizeof(float);
    *gbytes = h->grads ? 0 : numel * sizeof(float);
    uint64_t want = (uint64_t)*pbytes + *gbytes + *abytes;
    *params = *pbytes ? zr__arena_alloc(pbytes) : NULL;
    *grads = *gbytes ? zr__arena_alloc(gbytes) : NULL;
    *acts = zr__arena_alloc(abytes);
    if ((*pbytes && !*params) || (*gbytes && !*grads) || !*acts) {
        free(*params);
        free(*grads);
        free(*acts);
        *params = *grads = NULL;
        *acts = NULL;
        return zr_err_set(ZR_ENOMEM, "model: out of memory for %.1f MiB of parameters, "
                          "gradients and activations (batch %zu x seq %zu)",
                          (double)want / (1 << 20), max_B, max_T);
    }
    return 0;
}

/* Next buffer of the activation arena: with base NULL only counts (the sizing pass). */
void *zr__carve(unsigned char *base, size_t *off, double *total, size_t numel)
{
    *off = (*off + BUF_ALIGN - 1) / BUF_ALIGN * BUF_ALIGN;
    void *p = base ? base + *off : NULL;
    *off += numel * sizeof(float);
    *total += (double)numel * sizeof(float) + BUF_ALIGN;
    return p;
}

/* Group g's parameters and gradient buffer: the own arenas, or what the hooks lend. */
int zr__params_get(const zr_model_hooks *h, const float *own, size_t g, const float **out)
{
    if (!h->params) {
        *out = own;
        return 0;
    }
    *out = NULL;
    int rc = h->params(h->ctx, g, out);
    if (!rc && !*out)
        rc = zr_err_set(ZR_EINVAL, "model: the params hook lent no buffer for group %zu", g);
    return rc;
}

int zr__params_put(const zr_model_hooks *h, size_t g)
{
    return h->params_done ? h->params_done(h->ctx, g) : 0;
}

int zr__grads_get(const zr_model_hooks *h, float *own, size_t g, float **out)
{
    if (!h->grads) {
        *out = own;
        return 0;
    }
    *out = NULL;
    int rc = h->grads(h->ctx, g, out);
    if (!rc && !*out)
        rc = zr_err_set(ZR_EINVAL, "model: the grads hook lent no buffer for group %zu", g);
    return rc;
}

int zr__grads_put(const zr_model_hooks *h, size_t g)
{
    return h->grads_done ? h->grads_done(h->ctx, g) : 0;
}

/* x[0, n) = 0 on the par_for threads, in blocks of ZERO_BLOCK floats (64 KiB) */
#define ZERO_BLOCK ((size_t)16384)
typedef struct {
    float *x;
    size_t n;
} zero_args;

static void zero_blocks(void *p, size_t b0, size_t b1)
{
    const zero_args *a = p;
    size_t i0 = b0 * ZERO_BLOCK, i1 = b1 * ZERO_BLOCK < a->n ? b1 * ZERO_BLOCK : a->n;
    memset(a->x + i0, 0, (i1 - i0) * sizeof(float));
}

void zr__par_zero(float *x, size_t n)
{
    zero_args a = {x, n};
    par_for((n + ZERO_BLOCK - 1) / ZERO_BLOCK, 4, zero_blocks, &a);
}

/* splitmix64's output function: element i of a stream is mix64(key + (i + 1) * golden), so any
 * element can be drawn without drawing the ones before it. */
#define GOLDEN 0x9e3779b97f4a7c15ull
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* x[i] = std * N(0, 1) for arena elements [first, first + n): Box-Muller on draws 2j and 2j+1
 * of the stream, cos for even elements, sin for odd ones. */
static void fill_normal(float *x, uint64_t first, uint64_t n, uint64_t key, float std)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t e = first + i, j = e >> 1;
        uint64_t a = mix64(key + (2 * j + 1) * GOLDEN), b = mix64(key + (2 * j + 2) * GOLDEN);
        double u1 = (double)((a >> 11) + 1) * 0x1.0p-53; /* (0, 1]: log is finite */
        double u2 = (double)(b >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        x[i] = (float)(std * r * ((e & 1) ? sin(th) : cos(th)));
    }
}

/* The stream of seed: the key fill_normal draws with. */
static uint64_t init_key(uint64_t seed)
{
    return mix64(seed ^ 0x7a65726f2d677074ull); /* "zero-gpt" */
}

void zr__fill_normal(float *x, uint64_t first, uint64_t n, uint64_t seed, float std)
{
    fill_normal(x, first, n, init_key(seed), std);
}

/* the maximum of x[0, n), n >= 1 (exact: the order does not matter) */
static inline float max8(const float *restrict x, size_t n)
{
    float acc[8];
    for (size_t j = 0; j < 8; j++)
        acc[j] = x[0];
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++)
            acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (; i < n; i++)
        acc[0] = x[i] > acc[0] ? x[i] : acc[0];
    float m = acc[0];
    for (size_t j = 1; j < 8; j++)
        m = acc[j] > m ? acc[j] : m;
    return m;
}

/* x[0, n) = e^(x - maxv) / sum, in place, n >= 1, maxv = max8(x, n); returns the sum (>= 1:
 * the maximum's term) */
static inline float softmax_inplace(float *restrict x, size_t n, float maxv)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) {
            float e = zr_expf(x[i + j] - maxv);
            x[i + j] = e;
            acc[j] += e;
        }
    float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) {
        x[i] = zr_expf(x[i] - maxv);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (i = 0; i < n; i++)
        x[i] *= inv;
    return sum;
}

/*
 * C[M, N] = op(A)[M, K] op(B)[K, N] + beta C (row-major; op transposes when ta / tb) on the
 * par_for threads: C is split in blocks of GEMM_BLOCK rows (or columns, when it has more
 * columns than rows), each part one single-threaded cblas_sgemm over the whole K (zr_set_threads
 * keeps OpenBLAS at one thread, whose workers would otherwise spin between calls and take the
 * cores from these threads). OpenBLAS's bits depend on the blocks it is given, so matmul
 * results depend on the thread count; for a given count they are the same on every run.
 */
#define GEMM_BLOCK 16
typedef struct {
    int ta, tb, by_cols;
    size_t M, N, K;
    const float *A, *B;
    size_t lda, ldb, ldc;
    float beta;
    float *C;
    const zr__gemm_hook *pre, *post;
} gemm_args;

static void gemm_part(void *p, size_t b0, size_t b1)
{
    const gemm_args *g = p;
    size_t n = g->by_cols ? g->N : g->M;
    size_t i0 = b0 * GEMM_BLOCK, i1 = b1 * GEMM_BLOCK < n ? b1 * GEMM_BLOCK : n;
    const float *A = g->A, *B = g->B;
    float *C = g->C;
    size_t M = g->M, N = g->N;
    if (g->by_cols) { /* columns i0.. of op(B) and C */
        B += g->tb ? i0 * g->ldb : i0;
        C += i0;
        N = i1 - i0;
    } else { /* rows i0.. of op(A) and C */
        A += g->ta ? i0 : i0 * g->lda;
        C += i0 * g->ldc;
        M = i1 - i0;
    }
    /* the block of C this part owns: rows r0.., columns c0.. */
    size_t r0 = g->by_cols ? 0 : i0, c0 = g->by_cols ? i0 : 0;
    if (g->pre)
        g->pre->fn(g->pre->ctx, r0, r0 + M, c0, c0 + N);
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans,
                g->tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)g->K, 1.0f, A,
                (int)g->lda, B, (int)g->ldb, g->beta, C, (int)g->ldc);
    if (g->post)
        g->post->fn(g->post->ctx, r0, r0 + M, c0, c0 + N);
}

void zr__gemm_hooked(int ta, int tb, size_t M, size_t N, size_t K, const float *A, size_t lda,
                     const float *B, size_t ldb, float beta, float *C, size_t ldc,
                     const zr__gemm_hook *pre, const zr__gemm_hook *post)
{
    gemm_args g = {ta, tb, N > M, M, N, K, A, B, lda, ldb, ldc, beta, C, pre, post};
    size_t n = g.by_cols ? N : M;
    par_for((n + GEMM_BLOCK - 1) / GEMM_BLOCK, 1, gemm_part, &g);
}

void zr__elems_hook_fn(void *hook, size_t r0, size_t r1, size_t c0, size_t c1)
{
    const zr__elems_hook *h = hook;
    if (c0 == 0 && c1 == h->ld) { /* whole rows: one range */
        h->elems(h->ctx, r0 * h->ld, r1 * h->ld);
        return;
    }
    for (size_t r = r0; r < r1; r++)
        h->elems(h->ctx, r * h->ld + c0, r * h->ld + c1);
}

void zr__gemm(int ta, int tb, size_t M, size_t N, size_t K, const float *A, size_t lda,
              const float *B, size_t ldb, float beta, float *C, size_t ldc)
{
    zr__gemm_hooked(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, NULL, NULL);
}

/* out[n, :] = (res ? res[n, :] : 0) + bias, the rows a matmul then adds onto */
typedef struct {
    float *out;
    const float *res, *bias;
    size_t OC;
} bias_rows_args;

/* the block rows n0..n1, columns j0..j1 of out, before the matmul adds onto it (a gemm_part
 * fills the block it then computes, while it is in its cache) */
static void bias_block(void *p, size_t n0, size_t n1, size_t j0, size_t j1)
{
    const bias_rows_args *a = p;
    size_t OC = a->OC, w = (j1 - j0) * sizeof(float);
    for (size_t n = n0; n < n1; n++) {
        float *o = a->out + n * OC + j0;
        if (!a->res && !a->bias) {
            memset(o, 0, w);
        } else if (!a->res) {
            memcpy(o, a->bias + j0, w);
        } else if (!a->bias) {
            memcpy(o, a->res + n * OC + j0, w);
        } else {
            const float *r = a->res + n * OC + j0, *b = a->bias + j0;
            for (size_t j = 0; j < j1 - j0; j++)
                o[j] = r[j] + b[j];
        }
    }
}

/* out[N, OC] = (res ? res : 0) + inp[N, IC] W[OC, IC]^T + (b ? b[OC] : 0): res [N, OC] is the
 * residual the output adds onto (it may not alias out); then post, if any, on each block of
 * out as soon as it is computed. */
void zr__matmul_forward_hooked(float *out, const float *res, const float *inp, const float *W,
                               const float *bias, size_t N, size_t IC, size_t OC,
                               const zr__gemm_hook *post)
{
    bias_rows_args a = {out, res, bias, OC};
    zr__gemm_hook pre = {bias_block, &a};
    zr__gemm_hooked(0, 1, N, OC, IC, inp, IC, W, IC, 1.0f, out, OC, &pre, post);
}

void zr__matmul_forward(float *out, const float *res, const float *inp, const float *W,
                        const float *bias, size_t N, size_t IC, size_t OC)
{
    zr__matmul_forward_hooked(out, res, inp, W, bias, N, IC, OC, NULL);
}

/* db[OC] += column sums of dout [N, OC]: split by channel block, rows summed in order */
typedef struct {
    float *db;
    const float *dout;
    size_t N, OC;
} bias_grad_args;

ZR_VEC_CLONES static void bias_grad_cols(void *p, size_t b0, size_t b1)
{
    const bias_grad_args *a = p;
    size_t OC = a->OC, j0 = b0 * COLS_BLOCK, j1 = b1 * COLS_BLOCK < OC ? b1 * COLS_BLOCK : OC;
    float *db = a->db;
    for (size_t n = 0; n < a->N; n++) {
        const float *d = a->dout + n * OC;
        for (size_t j = j0; j < j1; j++)
            db[j] += d[j];
    }
}

/* dinp[N, IC] = dout W (overwritten); dW[OC, IC] += dout^T inp; db[OC] += column sums (no db:
 * no bias). */
void zr__matmul_backward_hooked(float *dinp, float *dW, float *db, const float *dout,
                                const float *inp, const float *W, size_t N, size_t IC, size_t OC,
                                const zr__gemm_hook *post)
{
    zr__gemm_hooked(0, 0, N, IC, OC, dout, OC, W, IC, 0.0f, dinp, IC, NULL, post);
    zr__gemm(1, 0, OC, IC, N, dout, OC, inp, IC, 1.0f, dW, IC);
    if (!db)
        return;
    bias_grad_args a = {db, dout, N, OC};
    par_for(col_blocks(OC), 1, bias_grad_cols, &a);
}

void zr__matmul_backward(float *dinp, float *dW, float *db, const float *dout,
                         const float *inp, const float *W, size_t N, size_t IC, size_t OC)
{
    zr__matmul_backward_hooked(dinp, dW, db, dout, inp, W, N, IC, OC, NULL);
}

/* Single-threaded sgemm, row-major, for the attention blocks (they run inside a par_for
 * chunk: zr_set_threads keeps OpenBLAS at one thread) */
static void sgemm1(int ta, int tb, size_t M, size_t N, size_t K, float alpha, const float *A,
                   size_t lda, const float *B, size_t ldb, float beta, float *C, size_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/*
 * Causal self-attention as small matmuls per (b, h) pair. For one pair, with q, k, v, y the
 * head's [T, hs] slices (row stride 3C, or C for y) and P its [T, T] block of att:
 *   forward:  S = q k^T / sqrt(hs); P = softmax of each row t over columns 0..t; y = P v
 *   backward: dv = P^T dy; dP = dy v^T; dS = P * (dP - D) / sqrt(hs) with
 *             D_t = sum_t2 P[t, t2] dP[t, t2] = dy_t . y_t; dq = dS k; dk = dS^T q
 * The T x T matrices are cut in square blocks of ATT_BLOCK: row block r only needs the column
 * blocks c <= r (causality), and each block product is one single-threaded sgemm. P is stored
 * with zeros above the diagonal inside the diagonal blocks (columns t < t2 < the block's end),
 * so those products can take whole blocks; columns past the block are never written or read.
 * The backward keeps one dP / dS block on its thread's stack (ATT_BLOCK^2 floats) and never
 * writes att (a second backward of the same forward must see it unchanged). It reads y, the
 * forward's output, for D, and keeps D in `rows` ([B NH, T]: row bh for pair bh).
 *
 * par_for splits the B NH pairs, whose outputs are disjoint (head h owns channels
 * [h hs, (h+1) hs) of q, k, v and y, at the positions of b). Each pair is computed by one
 * thread with the same calls whatever the thread count, so the bits do not depend on it.
 */
#define ATT_BLOCK 64

typedef struct {
    float *out, *att, *dqkv, *rows;
    const float *qkv, *dout, *y;
    zr__att_geom g;
} attention_args;

ZR_VEC_CLONES static void attention_forward_pairs(void *p, size_t bh0, size_t bh1)
{
    const attention_args *A = p;
    size_t T = A->g.T, NH = A->g.NH, hs = A->g.hs, C3 = A->g.ld, C = NH * hs;
    float scale = 1.0f / sqrtf((float)hs);
    for (size_t bh = bh0; bh < bh1; bh++) {
        size_t b = bh / NH, h = bh % NH, kv = h / A->g.grp * hs;
        const float *q = A->qkv + b * T * C3 + h * hs;
        const float *k = A->qkv + b * T * C3 + A->g.koff + kv;
        const float *v = A->qkv + b * T * C3 + A->g.voff + kv;
        float *P = A->att + bh * T * T, *y = A->out + b * T * C + h * hs;
        for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
            size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
            sgemm1(0, 1, r1 - r0, r1, hs, scale, q + r0 * C3, C3, k, C3, 0.0f, P + r0 * T, T);
            for (size_t t = r0; t < r1; t++) {
                float *row = P + t * T;
                softmax_inplace(row, t + 1, max8(row, t + 1));
                for (size_t t2 = t + 1; t2 < r1; t2++)
                    row[t2] = 0.0f;
            }
            sgemm1(0, 0, r1 - r0, hs, r1, 1.0f, P + r0 * T, T, v, C3, 0.0f, y + r0 * C, C);
        }
    }
}

void zr__attention_forward(const zr__att_geom *g, float *out, float *att, const float *qkv)
{
    attention_args a = {out, att, NULL, NULL, qkv, NULL, NULL, *g};
    par_for(g->B * g->NH, 1, attention_forward_pairs, &a);
}

/* One query head's backward (pair bh of head h); acc: its key/value head already holds the
 * gradients of an earlier head of its group, to be added to rather than overwritten. */
ZR_VEC_CLONES static void attention_backward_head(const attention_args *A, size_t bh, float *blk,
                                                 int acc)
{
    size_t T = A->g.T, NH = A->g.NH, hs = A->g.hs, C3 = A->g.ld, C = NH * hs;
    float scale = 1.0f / sqrtf((float)hs), b0 = acc ? 1.0f : 0.0f;
    size_t b = bh / NH, h = bh % NH, kvo = h / A->g.grp * hs, row0 = b * T * C3;
    const float *q = A->qkv + row0 + h * hs, *k = A->qkv + row0 + A->g.koff + kvo;
    const float *v = A->qkv + row0 + A->g.voff + kvo;
    const float *P = A->att + bh * T * T, *dy = A->dout + b * T * C + h * hs;
    const float *y = A->y + b * T * C + h * hs;
    float *dq = A->dqkv + row0 + h * hs, *dk = A->dqkv + row0 + A->g.koff + kvo;
    float *dv = A->dqkv + row0 + A->g.voff + kvo;
    float *D = A->rows + bh * T;
    for (size_t t = 0; t < T; t++)
        D[t] = zr__dot8(dy + t * C, y + t * C, hs);
    for (size_t c0 = 0; c0 < T; c0 += ATT_BLOCK) { /* dv[c] = P[c.., c]^T dy[c..] */
        size_t c1 = c0 + ATT_BLOCK < T ? c0 + ATT_BLOCK : T;
        sgemm1(1, 0, c1 - c0, hs, T - c0, 1.0f, P + c0 * T + c0, T, dy + c0 * C, C, b0,
               dv + c0 * C3, C3);
    }
    for (size_t r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        size_t r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, nr = r1 - r0;
        for (size_t c0 = 0; c0 <= r0; c0 += ATT_BLOCK) {
            size_t c1 = c0 + ATT_BLOCK < T ? c0 + ATT_BLOCK : T, nc = c1 - c0;
            sgemm1(0, 1, nr, nc, hs, 1.0f, dy + r0 * C, C, v + c0 * C3, C3, 0.0f, blk, nc);
            for (size_t i = 0; i < nr; i++) {
                const float *pr = P + (r0 + i) * T + c0;
                float *d = blk + i * nc, Di = D[r0 + i];
                /* in the diagonal block, columns past the row's own position are 0 */
                size_t end = c0 == r0 ? i + 1 : nc;
                for (size_t j = 0; j < end; j++)
                    d[j] = pr[j] * (d[j] - Di) * scale;
                for (size_t j = end; j < nc; j++)
                    d[j] = 0.0f;
            }
            sgemm1(0, 0, nr, hs, nc, 1.0f, blk, nc, k + c0 * C3, C3, c0 ? 1.0f : 0.0f,
                   dq + r0 * C3, C3);
            sgemm1(1, 0, nc, hs, nr, 1.0f, blk, nc, q + r0 * C3, C3,
                   c0 == r0 ? b0 : 1.0f, dk + c0 * C3, C3);
        }
    }
}

/* dqkv from dout; see above. Chunks are (b, key/value head) pairs, whose outputs are
 * disjoint; the grp query heads of one key/value head run in order inside the chunk. */
ZR_VEC_CLONES static void attention_backward_pairs(void *p, size_t p0, size_t p1)
{
    const attention_args *A = p;
    size_t grp = A->g.grp, KV = A->g.NH / grp;
    float blk[ATT_BLOCK * ATT_BLOCK]; /* dP, then dS, of one block */
    for (size_t pr = p0; pr < p1; pr++) {
        size_t b = pr / KV, kv = pr % KV;
        for (size_t j = 0; j < grp; j++)
            attention_backward_head(A, b * A->g.NH + kv * grp + j, blk, j > 0);
    }
}

void zr__attention_backward(const zr__att_geom *g, float *dqkv, float *rows, const float *dout,
                            const float *qkv, const float *att, const float *y)
{
    attention_args a = {NULL, (float *)att, dqkv, rows, qkv, dout, y, *g};
    par_for(g->B * (g->NH / g->grp), 1, attention_backward_pairs, &a);
}

/*
 * The head: logits [N, V] = x [N, C] W [V, C]^T, softmax, cross-entropy, and its backward, in
 * chunks of rows_cap rows (head_rows: a function of V alone when N is larger) in every
 * recompute mode, each chunk's logits in blocks of HEAD_ROWS columns counted from column 0, one
 * single-threaded sgemm per block. A column block's bits depend on the call alone, so the
 * logits of a chunk are the same whoever computes them: the forward, the backward recomputing
 * a chunk (zr_recompute layer: the full probabilities are not kept, only each row's maximum and
 * sum), or a ZeRO gradient piece recomputing its columns; and at any thread count.
 */
#define HEAD_ROWS 64

typedef struct {
    float *out; /* row 0 of the chunk, ld V */
    const float *x, *W;
    size_t rows, v0, v1, C, V;
} head_logits_args;

static void head_logits_blocks(void *p, size_t b0, size_t b1)
{
    const head_logits_args *a = p;
    for (size_t b = b0; b < b1; b++) {
        size_t j0 = a->v0 + b * HEAD_ROWS, j1 = j0 + HEAD_ROWS < a->v1 ? j0 + HEAD_ROWS : a->v1;
        sgemm1(0, 1, a->rows, j1 - j0, a->C, 1.0f, a->x, a->C, a->W + j0 * a->C, a->C, 0.0f,
               a->out + j0, a->V);
    }
}

/* out[r, v0:v1] = x[r, :] W[v0:v1, :]^T for r < rows (v0 a multiple of HEAD_ROWS) */
static void head_logits(float *out, const float *x, const float *W, size_t rows, size_t v0,
                        size_t v1, size_t C, size_t V)
{
    assert(v0 % HEAD_ROWS == 0);
    head_logits_args a = {out, x, W, rows, v0, v1, C, V};
    par_for((v1 - v0 + HEAD_ROWS - 1) / HEAD_ROWS, 1, head_logits_blocks, &a);
}

/* Rows of logits -> probabilities in place; losses[n] = -log p[n, targets[n]] when targets is
 * not NULL, computed from the logits (log-sum-exp) so that it stays finite; each row's maximum
 * and sum of e^(logit - max) into rmax, rsum when not NULL. */
typedef struct {
    float *probs, *losses, *rmax, *rsum;
    const int32_t *targets;
    size_t V;
} softmax_args;

ZR_VEC_CLONES static void softmax_xent_rows(void *p, size_t n0, size_t n1)
{
    const softmax_args *a = p;
    size_t V = a->V;
    const int32_t *targets = a->targets;
    for (size_t n = n0; n < n1; n++) {
        float *pr = a->probs + n * V;
        float maxv = max8(pr, V);
        float target_logit = targets ? pr[targets[n]] - maxv : 0.0f;
        float sum = softmax_inplace(pr, V, maxv);
        if (targets)
            a->losses[n] = logf(sum) - target_logit;
        if (a->rmax) {
            a->rmax[n] = maxv;
            a->rsum[n] = sum;
        }
    }
}

/* the head's chunk rows for N positions of vocabulary V (at most 64 MiB, at least 1 row) */
static size_t head_rows(size_t N, size_t V)
{
    size_t rows = V ? HEAD_MAX_NUMEL / V : 1;
    if (rows < 1)
        rows = 1;
    return rows > N ? N : rows;
}

void zr__head_carve(zr__head *h, unsigned char *base, size_t *off, double *total, size_t N,
                    size_t V, zr_recompute rc)
{
    int keep = rc != ZR_RECOMPUTE_LAYER;
    h->rows_cap = head_rows(N, V);
    h->probs = keep ? zr__carve(base, off, total, N * V) : NULL;
    h->rmax = keep ? NULL : zr__carve(base, off, total, N);
    h->rsum = keep ? NULL : zr__carve(base, off, total, N);
    h->chunk = zr__carve(base, off, total, h->rows_cap * V);
}

void zr__head_forward(const zr__head *h, float *losses, const int32_t *targets, const float *W,
                      const float *x, size_t N, size_t C, size_t V)
{
    for (size_t r0 = 0; r0 < N; r0 += h->rows_cap) {
        size_t rows = N - r0 < h->rows_cap ? N - r0 : h->rows_cap;
        float *out = h->probs ? h->probs + r0 * V : h->chunk;
        head_logits(out, x + r0 * C, W, rows, 0, V, C, V);
        softmax_args a = {out, losses + r0, h->probs ? NULL : h->rmax + r0,
                          h->probs ? NULL : h->rsum + r0, targets ? targets + r0 : NULL, V};
        par_for(rows, 1, softmax_xent_rows, &a);
    }
}

/* dlogits[r, v0:v1] = k (p[r, v0:v1] - onehot(targets[r])) for a chunk of rows (columns
 * [v0, v1): a piece of the vocabulary; the rest of the row is not written): p the kept
 * probabilities (probs), or e^(logit - rmax) / rsum from the logits in dlogits itself, as
 * softmax_inplace computes them */
typedef struct {
    float *dlogits;
    const float *probs, *rmax, *rsum;
    const int32_t *targets;
    size_t V, v0, v1;
    float k;
} dlogits_args;

ZR_VEC_CLONES static void dlogits_rows(void *p, size_t r0, size_t r1)
{
    const dlogits_args *a = p;
    size_t V = a->V;
    for (size_t r = r0; r < r1; r++) {
        float *dl = a->dlogits + r * V;
        if (a->probs) {
            const float *pr = a->probs + r * V;
            for (size_t v = a->v0; v < a->v1; v++)
                dl[v] = a->k * pr[v];
        } else {
            float maxv = a->rmax[r], inv = 1.0f / a->rsum[r];
            for (size_t v = a->v0; v < a->v1; v++)
                dl[v] = a->k * (zr_expf(dl[v] - maxv) * inv);
        }
        size_t t = (size_t)a->targets[r];
        if (t >= a->v0 && t < a->v1)
            dl[t] -= a->k;
    }
}

/* The chunk of rows r0.. (rows of them) of dlogits into h->chunk, columns [v0, v1) */
static void head_dlogits(const zr__head *h, const int32_t *targets, const float *W,
                         const float *x, size_t r0, size_t rows, size_t v0, size_t v1, size_t C,
                         size_t V, float k)
{
    if (!h->probs)
        head_logits(h->chunk, x + r0 * C, W, rows, v0, v1, C, V);
    dlogits_args da = {h->chunk, h->probs ? h->probs + r0 * V : NULL,
                       h->probs ? NULL : h->rmax + r0, h->probs ? NULL : h->rsum + r0,
                       targets + r0, V, v0, v1, k};
    par_for(rows, 1, dlogits_rows, &da);
}

/* dW[v0 + q, :] += dlogits[:, v0 + q]^T x for q in [0, n): one sgemm per block of HEAD_ROWS
 * rows counted from row 0 (v0 a multiple of it), the blocks on the par_for threads. OpenBLAS's
 * bits depend on the rows it is given at once, so fixed blocks make the head's gradient the
 * same whole or in pieces (zr__grad_pieces), at any thread count. */
typedef struct {
    float *dW; /* row v0 */
    const float *dl, *x;
    size_t v0, n, C, K, ld;
} head_dw_args;

static void head_dw_blocks(void *p, size_t b0, size_t b1)
{
    const head_dw_args *a = p;
    for (size_t b = b0; b < b1; b++) {
        size_t q0 = b * HEAD_ROWS, q1 = q0 + HEAD_ROWS < a->n ? q0 + HEAD_ROWS : a->n;
        sgemm1(1, 0, q1 - q0, a->C, a->K, 1.0f, a->dl + a->v0 + q0, a->ld, a->x, a->C, 1.0f,
               a->dW + q0 * a->C, a->C);
    }
}

static void head_dw(float *dW, const float *dlogits, const float *x, size_t v0, size_t v1,
                    size_t C, size_t rows, size_t V)
{
    head_dw_args a = {dW, dlogits, x, v0, v1 - v0, C, rows, V};
    par_for((v1 - v0 + HEAD_ROWS - 1) / HEAD_ROWS, 1, head_dw_blocks, &a);
}

void zr__head_backward(const zr__head *h, float *dx, float *dW, const int32_t *targets,
                       const float *W, const float *x, size_t N, size_t C, size_t V, float k)
{
    for (size_t r0 = 0; r0 < N; r0 += h->rows_cap) {
        size_t rows = N - r0 < h->rows_cap ? N - r0 : h->rows_cap;
        head_dlogits(h, targets, W, x, r0, rows, 0, V, C, V, k);
        zr__gemm(0, 0, rows, C, V, h->chunk, V, W, C, 0.0f, dx + r0 * C, C);
        if (dW)
            head_dw(dW, h->chunk, x + r0 * C, 0, V, C, rows, V);
    }
}

/* Rows [v0, v1) of the head's dW (piece: [v1 - v0, C]), the chunks of rows in the order
 * zr__head_backward adds them: dlogits recomputed for those columns only. */
static void head_grad_rows(float *piece, const zr__grad_src *s, size_t v0, size_t v1)
{
    size_t V = s->V, C = s->C, cap = s->head->rows_cap;
    for (size_t r0 = 0; r0 < s->N; r0 += cap) {
        size_t rows = s->N - r0 < cap ? s->N - r0 : cap;
        head_dlogits(s->head, s->targets, s->W, s->x, r0, rows, v0, v1, C, V, s->k);
        head_dw(piece, s->head->chunk, s->x + r0 * C, v0, v1, C, rows, V);
    }
}

/* piece[row(n) - v0, :] += dout[n, :] for the positions n whose row (inp[n], or n mod T without
 * inp) lies in [v0, v1): split by channel block, every position in order */
typedef struct {
    float *piece;
    const zr__grad_src *s;
    size_t v0, v1;
} embed_rows_args;

static void embed_grad_cols(void *p, size_t b0, size_t b1)
{
    const embed_rows_args *a = p;
    const zr__grad_src *s = a->s;
    size_t C = s->C, i0 = b0 * COLS_BLOCK, i1 = b1 * COLS_BLOCK < C ? b1 * COLS_BLOCK : C;
    for (size_t n = 0; n < s->N; n++) {
        size_t row = s->inp ? (size_t)s->inp[n] : n % s->T;
        if (row < a->v0 || row >= a->v1)
            continue;
        const float *d = s->dout + n * C;
        float *de = a->piece + (row - a->v0) * C;
        for (size_t i = i0; i < i1; i++)
            de[i] += d[i];
    }
}

uint64_t zr__grad_piece_rows(const zr_model_hooks *h, size_t g, size_t C)
{
    if (!h->grad_piece_numel || !C)
        return 0;
    return h->grad_piece_numel(h->ctx, g) / C / HEAD_ROWS * HEAD_ROWS;
}

int zr__grad_pieces(const zr_model_hooks *h, size_t g, const zr__grad_src *s)
{
    uint64_t per = zr__grad_piece_rows(h, g, s->C);
    if (!per)
        return zr_err_set(ZR_EINVAL, "model: group %zu's gradient has no pieces of a row", g);
    for (size_t v0 = 0; v0 < s->V; v0 += per) {
        size_t v1 = s->V - v0 < per ? s->V : v0 + per;
        uint64_t off = (uint64_t)v0 * s->C, n = (uint64_t)(v1 - v0) * s->C;
        float *piece = NULL;
        int rc = h->grad_piece(h->ctx, g, off, n, &piece);
        if (!rc && !piece)
            rc = zr_err_set(ZR_EINVAL, "model: the grad_piece hook lent no buffer for group "
                            "%zu", g);
        if (rc)
            return rc;
        if (s->head)
            head_grad_rows(piece, s, v0, v1);
        if (s->dout) {
            embed_rows_args a = {piece, s, v0, v1};
            par_for(col_blocks(s->C), 1, embed_grad_cols, &a);
        }
        ZR_TRY(h->grad_piece_done(h->ctx, g, off, n));
    }
    return 0;
}


int zr__check_tokens(const int32_t *tok, size_t n, uint32_t V, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (tok[i] < 0 || (uint32_t)tok[i] >= V)
            return zr_err_set(ZR_EINVAL, "forward: %s[%zu] = %d is not a token id (vocab %u)",
                              what, i, tok[i], V);
    return 0;
}
