/*
 * model.c: GPT-2 on the CPU in fp32 (zr.h, "model"): token + learned position embeddings,
 * L pre-LN blocks (ln_1 -> c_attn -> causal self-attention -> c_proj -> residual; ln_2 -> c_fc
 * -> GELU (tanh) -> c_proj -> residual), ln_f, logits through the tied token embedding, softmax
 * and mean cross-entropy. Each layer is a <layer>_forward / <layer>_backward pair; matmuls go to
 * cblas_sgemm, every other loop is plain C for the compiler to vectorize. Both run on the
 * zr_set_threads threads through par_for (par.h): matmuls as single-threaded sgemm calls on
 * blocks of the output, the other loops split so that their bits do not depend on the count.
 *
 * Memory: one parameter arena and one gradient arena holding the groups of the checkpoint
 * layout (zr_gpt2_layout: wte, wpe, h.0 ... h.<L-1>, ln_f) end to end, tensors in layout order,
 * weights [out, in] (or, with hooks, whatever buffers the trainer lends group by group: ZeRO);
 * one activation arena sized for max_B x max_T at creation and reused by every step. Tensor
 * offsets come from the layout (zr_gpt2_offsets_get: ckpt's family table), never restated here.
 *
 * Shapes in comments: B batch, T sequence, C channels, NH heads, hs = C / NH, V vocabulary,
 * N = B * T positions.
 */
#include "model_check.h"
#include "model_int.h"
#include "par.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LN_EPS 1e-5f
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */

/* The four matrices of a block (the rest are vectors: biases and LayerNorm weights). */
static int blk_is_matrix(int k)
{
    return k == ZR_BLK_QKVW || k == ZR_BLK_ATTPROJW || k == ZR_BLK_FCW || k == ZR_BLK_FCPROJW;
}

/* What one block keeps from forward for backward; each buffer sized for max_B x max_T. With
 * recompute (zr_recompute) the layers share layer 0's buffers of what is recomputed: all but
 * res3 (layer), att and fch_gelu (selective). */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; /* [N, C], [N], [N] */
    float *qkv;                       /* [N, 3C] */
    float *atty;                      /* [N, C]: attention output before c_proj */
    float *att;                       /* [B, NH, T, T]: softmax weights, row t valid to t */
    float *res2;                      /* [N, C]: residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* [N, C], [N], [N] */
    float *fch, *fch_gelu;            /* [N, 4C] before and after GELU */
    float *res3;                      /* [N, C]: block output */
} layer_acts;

struct zr_model {
    zr_gpt2_config c;
    size_t max_B, max_T;            /* activations sized for max_B sequences of max_T */
    zr_recompute rc;                /* what the backward recomputes */
    size_t held;                    /* the layer whose activations the shared buffers hold */
    zr_model_hooks h;               /* where parameters and gradients live (zr.h) */
    zr_gpt2_offsets off;            /* where each group and tensor is in an arena */
    float *params, *grads;          /* own arenas of numel floats, or NULL (hooks) */
    size_t pbytes, gbytes;          /* allocated size of each (2 MiB multiple, 0 if none) */

    unsigned char *acts_mem;
    size_t acts_bytes;                /* allocated size (2 MiB multiple) */
    float *encoded;                   /* [N, C] */
    layer_acts *layer;                /* [L], pointers into acts_mem */
    float *lnf, *lnf_mean, *lnf_rstd; /* [N, C], [N], [N] */
    zr__head head;                    /* logits, probabilities (model_int.h) */
    float *losses;                    /* [N] */
    int32_t *inputs, *targets;        /* [N] copies of the last forward's tokens */
    /* backward scratch */
    float *dres;    /* [N, C]: gradient of the residual stream */
    float *dC;      /* [N, C]: gradient of a layernorm output or of atty */
    float *dqkv;    /* [N, 3C] */
    float *d4C;     /* [N, 4C]: gradient of fch_gelu, then of fch (in place) */
    float *drow;    /* [max_B NH, max_T]: one attention row's datt and dpreatt per (b, h) */

    size_t B, T;     /* of the last forward */
    int fwd_targets; /* -1: no forward yet; 0: last forward had no targets; 1: it had */
    zr__llama *ll;   /* a Llama model: every call goes there (llama.c) */
};

/* ---------------------------------------------------------------- layout */

static uint64_t group_offset(const zr_model *m, size_t g)
{
    if (g < 2)
        return g ? m->off.wpe : m->off.wte;
    if (g == (size_t)m->c.layers + 2)
        return m->off.ln_f;
    return m->off.h0 + (g - 2) * m->off.layer_numel; /* h.<g-2> */
}

/* tensor `kind` of a block group whose parameters (or gradients) start at g */
#define TENSOR(g, kind) ((g) + m->off.blk[ZR_BLK_##kind])

/* ---------------------------------------------------------------- memory */


/* Lay the activation arena out (base NULL: only size it). *total, computed in double, lets the
 * caller reject configs whose size_t products would overflow. */
static size_t acts_layout(zr_model *m, unsigned char *base, double *total)
{
    size_t L = m->c.layers, C = m->c.dim, NH = m->c.heads, V = m->c.vocab, T = m->max_T;
    size_t N = m->max_B * T, off = 0;
    *total = 0;
    m->encoded = zr__carve(base, &off, total, N * C);
    layer_acts a0 = {0};
    for (size_t l = 0; l < L; l++) {
        /* each layer's own buffers, or layer 0's where the recompute mode shares them */
        int own = l == 0 || m->rc == ZR_RECOMPUTE_NONE;
        int own_sel = l == 0 || m->rc != ZR_RECOMPUTE_LAYER;
#define CARVE(f, n, fresh) (a.f = (fresh) ? zr__carve(base, &off, total, (n)) : a0.f)
        layer_acts a;
        CARVE(ln1, N * C, own_sel);
        CARVE(ln1_mean, N, own_sel);
        CARVE(ln1_rstd, N, own_sel);
        CARVE(qkv, N * 3 * C, own_sel);
        CARVE(atty, N * C, own_sel);
        /* the one product that can overflow size_t: counted in double for the caller */
        if (own)
            *total += (double)m->max_B * NH * T * T * sizeof(float);
        CARVE(att, m->max_B * NH * T * T, own);
        CARVE(res2, N * C, own_sel);
        CARVE(ln2, N * C, own_sel);
        CARVE(ln2_mean, N, own_sel);
        CARVE(ln2_rstd, N, own_sel);
        CARVE(fch, N * 4 * C, own_sel);
        CARVE(fch_gelu, N * 4 * C, own);
        CARVE(res3, N * C, 1);
#undef CARVE
        if (l == 0)
            a0 = a;
        if (base)
            m->layer[l] = a;
    }
    m->lnf = zr__carve(base, &off, total, N * C);
    m->lnf_mean = zr__carve(base, &off, total, N);
    m->lnf_rstd = zr__carve(base, &off, total, N);
    zr__head_carve(&m->head, base, &off, total, N, V, m->rc);
    m->losses = zr__carve(base, &off, total, N);
    m->inputs = zr__carve(base, &off, total, N);
    m->targets = zr__carve(base, &off, total, N);
    m->dres = zr__carve(base, &off, total, N * C);
    m->dC = zr__carve(base, &off, total, N * C);
    m->dqkv = zr__carve(base, &off, total, N * 3 * C);
    m->d4C = zr__carve(base, &off, total, N * 4 * C);
    m->drow = zr__carve(base, &off, total, m->max_B * NH * T);
    return off;
}

/* ---------------------------------------------------------------- construction */

/* A Llama model: the handle holds its config, the maths is llama.c's. */
static int llama_new(zr_model **out, const zr_config *c, size_t max_B, size_t max_T,
                     const zr_model_hooks *hooks, zr_recompute rc)
{
    zr_model *m = calloc(1, sizeof *m);
    if (!m)
        return zr_err_set(ZR_ENOMEM, "model: out of memory");
    m->c = *c;
    int err = zr__llama_new(&m->ll, c, max_B, max_T, hooks, rc);
    if (err < 0) {
        free(m);
        return err;
    }
    *out = m;
    return 0;
}

int zr_model_new(zr_model **out, const zr_gpt2_config *c, size_t max_B)
{
    return zr_model_new_ext(out, c, max_B, c ? c->ctx : 0, NULL);
}

int zr_model_new_ext(zr_model **out, const zr_gpt2_config *c, size_t max_B, size_t max_T,
                     const zr_model_hooks *hooks)
{
    return zr_model_new_recompute(out, c, max_B, max_T, hooks, ZR_RECOMPUTE_NONE);
}

int zr_model_new_recompute(zr_model **out, const zr_gpt2_config *c, size_t max_B, size_t max_T,
                           const zr_model_hooks *hooks, zr_recompute rc)
{
    assert(out && c);
    *out = NULL;
    if (rc < ZR_RECOMPUTE_NONE || rc > ZR_RECOMPUTE_SELECTIVE)
        return zr_err_set(ZR_EINVAL, "model: recompute mode %d (none 0, layer 1, selective 2)",
                          (int)rc);
    if (c->family == ZR_FAMILY_LLAMA)
        return llama_new(out, c, max_B, max_T, hooks, rc);
    char why[160];
    if (zr__config_problem(why, sizeof why, c))
        return zr_err_set(ZR_EINVAL, "%s", why);
    ZR_TRY(zr__check_new(max_B, max_T, c->ctx, hooks));
    /* BLAS takes int dimensions: N = max_B max_T rows, V and 4C columns */
    if ((double)max_B * max_T > INT_MAX || c->vocab > INT_MAX || c->dim > INT_MAX / 4)
        return zr_err_set(ZR_EINVAL, "model: batch %zu x seq %zu, vocab %u or 4 x dim %u "
                          "exceeds the BLAS int range", max_B, max_T, c->vocab, c->dim);

    zr_model *m = calloc(1, sizeof *m);
    if (!m)
        return zr_err_set(ZR_ENOMEM, "model: out of memory");
    m->c = *c;
    m->max_B = max_B;
    m->max_T = max_T;
    m->rc = rc;
    if (hooks)
        m->h = *hooks;
    m->fwd_targets = -1;
    uint64_t C = c->dim;
    /* sizes in double first: past 2^60 bytes the size_t arithmetic below could wrap */
    double numel_d = ((double)c->vocab + c->ctx + 2) * C +
                     (double)c->layers * (12.0 * C + 13) * C; /* the table's 12C^2 + 13C */
    double acts_d;
    size_t abytes = acts_layout(m, NULL, &acts_d);
    if (numel_d * sizeof(float) > 0x1p60 || acts_d > 0x1p60) {
        free(m);
        return zr_err_set(ZR_EINVAL, "model: %.3g parameters and %.3g bytes of activations "
                          "(batch %zu): too large", numel_d, acts_d, max_B);
    }
    int err = zr_gpt2_offsets_get(&m->off, c);
    if (err < 0) {
        free(m);
        return err;
    }
    if (!(m->layer = calloc(c->layers, sizeof *m->layer))) {
        zr_model_free(m);
        return zr_err_set(ZR_ENOMEM, "model: out of memory");
    }
    err = zr__arenas_alloc(&m->params, &m->pbytes, &m->grads, &m->gbytes, &m->acts_mem, &abytes,
                           m->off.numel, &m->h, max_B, max_T);
    if (err < 0) {
        zr_model_free(m);
        return err;
    }
    m->acts_bytes = abytes;
    acts_layout(m, m->acts_mem, &acts_d);
    *out = m;
    return 0;
}

uint64_t zr_model_activation_bytes(const zr_gpt2_config *c, size_t max_B, size_t max_T,
                                   zr_recompute rc)
{
    if (c->family == ZR_FAMILY_LLAMA)
        return zr__llama_activation_bytes(c, max_B, max_T, rc);
    zr_model m;
    memset(&m, 0, sizeof m);
    m.c = *c;
    m.max_B = max_B;
    m.max_T = max_T;
    m.rc = rc;
    double total;
    size_t b = acts_layout(&m, NULL, &total);
    return (b + ZR__ARENA_ALIGN - 1) / ZR__ARENA_ALIGN * ZR__ARENA_ALIGN;
}

void zr_model_free(zr_model *m)
{
    if (!m)
        return;
    zr__llama_free(m->ll);
    free(m->params);
    free(m->grads);
    free(m->acts_mem);
    free(m->layer);
    free(m);
}

const zr_gpt2_config *zr_model_config(const zr_model *m) { return &m->c; }

size_t zr_model_n_groups(const zr_model *m)
{
    return m->ll ? zr__llama_n_groups(m->ll) : (size_t)m->c.layers + 3;
}

uint64_t zr_model_numel(const zr_model *m)
{
    return m->ll ? zr__llama_numel(m->ll) : m->off.numel;
}

uint64_t zr_model_group_numel(const zr_model *m, size_t g)
{
    assert(g < zr_model_n_groups(m));
    if (m->ll)
        return zr__llama_group_numel(m->ll, g);
    if (g == (size_t)m->c.layers + 2)
        return m->off.numel - m->off.ln_f;
    return g < 2 ? group_offset(m, g + 1) - group_offset(m, g) : m->off.layer_numel;
}

float *zr_model_param(zr_model *m, size_t g)
{
    assert(g < zr_model_n_groups(m));
    if (m->ll)
        return zr__llama_param(m->ll, g);
    return m->params ? m->params + group_offset(m, g) : NULL;
}

float *zr_model_grad(zr_model *m, size_t g)
{
    assert(g < zr_model_n_groups(m));
    if (m->ll)
        return zr__llama_grad(m->ll, g);
    return m->grads ? m->grads + group_offset(m, g) : NULL;
}

size_t zr_model_fetch_order(const zr_model *m, int backward, size_t *order)
{
    if (m->ll)
        return zr__llama_fetch_order(m->ll, backward, order);
    size_t L = m->c.layers, n = 0;
    if (!backward) { /* wte and wpe (embedding), the blocks, ln_f, wte again (the head) */
        for (size_t g = 0; g < L + 3; g++)
            order[n++] = g;
        order[n++] = 0;
    } else { /* the head (wte), ln_f, the blocks last to first; the embedding reads none, but
              * the head's gradient pieces read wte again when the probabilities are not kept */
        order[n++] = 0;
        for (size_t g = L + 3; g-- > 2;)
            order[n++] = g;
        if (!m->head.probs && zr__grad_piece_rows(&m->h, 0, m->c.dim) > 0)
            order[n++] = 0;
    }
    return n;
}


static int params_get(zr_model *m, size_t g, const float **out)
{
    return zr__params_get(&m->h, m->params ? m->params + group_offset(m, g) : NULL, g, out);
}

static int params_put(zr_model *m, size_t g) { return zr__params_put(&m->h, g); }

static int grads_get(zr_model *m, size_t g, float **out)
{
    return zr__grads_get(&m->h, m->grads ? m->grads + group_offset(m, g) : NULL, g, out);
}

static int grads_put(zr_model *m, size_t g) { return zr__grads_put(&m->h, g); }


void zr_model_zero_grad(zr_model *m)
{
    if (m->ll)
        zr__llama_zero_grad(m->ll);
    else if (m->grads)
        zr__par_zero(m->grads, m->off.numel);
}

const float *zr_model_probs(const zr_model *m)
{
    return m->ll ? zr__llama_probs(m->ll) : m->head.probs;
}

void zr_model_bytes(const zr_model *m, uint64_t *params, uint64_t *grads, uint64_t *acts)
{
    if (m->ll) {
        zr__llama_bytes(m->ll, params, grads, acts);
        return;
    }
    if (params)
        *params = m->pbytes;
    if (grads)
        *grads = m->gbytes;
    if (acts)
        *acts = m->acts_bytes;
}

/* The par_for pool (par.h) gets the n threads; OpenBLAS stays at one (gemm splits matmuls over
 * the pool), so no BLAS worker spins between calls on a core the pool needs. Without a call,
 * OpenBLAS keeps its own default and everything else runs on the calling thread. */
void zr_set_threads(int n)
{
    if (n >= 1) {
        openblas_set_num_threads(1);
        par_set_threads(n);
    }
}

/* ---------------------------------------------------------------- initialization */


static void fill_const(float *x, uint64_t n, float v)
{
    for (uint64_t i = 0; i < n; i++)
        x[i] = v;
}

/* Each weight element is a function of (seed, its index in the arena) alone, so the bits do
 * not depend on the order or the part of the arena filled: a ZeRO rank initializes just its
 * partition. */
void zr_model_init_range(const zr_model *m, uint64_t seed, size_t g, uint64_t off, uint64_t n,
                         float *dst)
{
    assert(g < zr_model_n_groups(m) && off + n <= zr_model_group_numel(m, g));
    if (m->ll) {
        zr__llama_init_range(m->ll, seed, g, off, n, dst);
        return;
    }
    uint64_t base = group_offset(m, g), C = m->c.dim;
    float std = 0.02f, std_res = 0.02f / sqrtf(2.0f * (float)m->c.layers);
    if (g < 2) { /* wte, wpe */
        zr__fill_normal(dst, base + off, n, seed, std);
        return;
    }
    if (g == (size_t)m->c.layers + 2) { /* ln_f: weight 1, bias 0 */
        for (uint64_t i = 0; i < n; i++)
            dst[i] = off + i >= m->off.lnf_w && off + i < m->off.lnf_w + C ? 1.0f : 0.0f;
        return;
    }
    for (int k = 0; k < ZR_BLK_COUNT; k++) {
        uint64_t t0 = m->off.blk[k], t1 = t0 + m->off.blk_numel[k];
        uint64_t lo = off > t0 ? off : t0, hi = off + n < t1 ? off + n : t1;
        if (lo >= hi)
            continue;
        if (blk_is_matrix(k))
            zr__fill_normal(dst + (lo - off), base + lo, hi - lo, seed,
                        k == ZR_BLK_ATTPROJW || k == ZR_BLK_FCPROJW ? std_res : std);
        else
            fill_const(dst + (lo - off), hi - lo,
                       k == ZR_BLK_LN1W || k == ZR_BLK_LN2W ? 1.0f : 0.0f);
    }
}

void zr_model_init_weights(zr_model *m, uint64_t seed)
{
    for (size_t g = 0; g < zr_model_n_groups(m); g++) {
        float *p = zr_model_param(m, g);
        if (p)
            zr_model_init_range(m, seed, g, 0, zr_model_group_numel(m, g), p);
    }
}

/* ---------------------------------------------------------------- layers */

#include "fastmath.h" /* zr_expf: the exp the elementwise loops vectorize with */

/*
 * Every loop below runs through par_for (par.h) on the zr_set_threads threads. Except in the
 * matmuls (gemm), each output element is computed by exactly one chunk, in the same order as a
 * single thread would, so those results are the same bits whatever the thread count: per-row
 * kernels split rows; reductions over rows (bias gradients, LayerNorm dweight/dbias, the
 * embedding gradients) split the reduced outputs into blocks of COLS_BLOCK channels and each
 * block sums all rows in order; attention splits (b, h) pairs.
 */
#define ROWS_GRAIN 8       /* rows per chunk at least (rows of C floats) */
#define ELEMS_GRAIN 4096   /* elements per chunk at least (elementwise loops) */
#define COLS_BLOCK 16      /* channels per unit of a column split */

static size_t col_blocks(size_t n) { return (n + COLS_BLOCK - 1) / COLS_BLOCK; }

/* Sums over a row in a fixed order: eight partial sums over i mod 8 (the compiler vectorizes
 * them, 4 or 8 lanes, without -ffast-math), combined pairwise, then the tail. The order is
 * fixed by the code, not by the compiler, so the result does not depend on the vector width. */
static inline float sum8(const float *restrict x, size_t n)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++)
            acc[j] += x[i + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++)
        s += x[i];
    return s;
}


/* out[n, :] = wte[inp[n], :] + wpe[n % T, :] */
typedef struct {
    float *out;
    const int32_t *inp;
    const float *wte, *wpe;
    size_t T, C;
} encoder_fwd_args;

static void encoder_forward_rows(void *p, size_t n0, size_t n1)
{
    const encoder_fwd_args *a = p;
    size_t C = a->C;
    for (size_t n = n0; n < n1; n++) {
        float *o = a->out + n * C;
        const float *we = a->wte + (size_t)a->inp[n] * C, *pe = a->wpe + (n % a->T) * C;
        for (size_t i = 0; i < C; i++)
            o[i] = we[i] + pe[i];
    }
}

static void encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                            size_t B, size_t T, size_t C)
{
    encoder_fwd_args a = {out, inp, wte, wpe, T, C};
    par_for(B * T, ROWS_GRAIN, encoder_forward_rows, &a);
}

/* dwte[inp[n], :] += dout[n, :], dwpe[n % T, :] += dout[n, :]: split by channel, each chunk
 * adding every position in order (repeated tokens add to the same row); either may be NULL. */
typedef struct {
    float *dwte, *dwpe;
    const float *dout;
    const int32_t *inp;
    size_t N, T, C;
} encoder_bwd_args;

static void encoder_backward_cols(void *p, size_t b0, size_t b1)
{
    const encoder_bwd_args *a = p;
    size_t C = a->C, i0 = b0 * COLS_BLOCK, i1 = b1 * COLS_BLOCK < C ? b1 * COLS_BLOCK : C;
    for (size_t n = 0; n < a->N; n++) {
        const float *d = a->dout + n * C;
        float *dwe = a->dwte ? a->dwte + (size_t)a->inp[n] * C : NULL;
        float *dpe = a->dwpe ? a->dwpe + (n % a->T) * C : NULL;
        if (dwe && dpe) {
            for (size_t i = i0; i < i1; i++) {
                dwe[i] += d[i];
                dpe[i] += d[i];
            }
        } else if (dwe || dpe) { /* the other comes in pieces (zr__grad_pieces) */
            float *dst = dwe ? dwe : dpe;
            for (size_t i = i0; i < i1; i++)
                dst[i] += d[i];
        }
    }
}

static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                             size_t B, size_t T, size_t C)
{
    if (!dwte && !dwpe)
        return;
    encoder_bwd_args a = {dwte, dwpe, dout, inp, B * T, T, C};
    par_for(col_blocks(C), 1, encoder_backward_cols, &a);
}

/* out = (inp - mean) * rstd * w + b per row of C; mean, rstd [N] kept for backward (NULL: not
 * kept, as generate.c's inference). */
typedef struct {
    float *out, *mean, *rstd;
    const float *inp, *w, *bias;
    size_t C;
} layernorm_fwd_args;

ZR_VEC_CLONES static void layernorm_forward_rows(void *p, size_t n0, size_t n1)
{
    const layernorm_fwd_args *a = p;
    size_t C = a->C;
    const float *w = a->w, *bias = a->bias;
    for (size_t n = n0; n < n1; n++) {
        const float *x = a->inp + n * C;
        float *o = a->out + n * C;
        float mu = sum8(x, C) / (float)C;
        float acc[8] = {0}, var;
        size_t i = 0;
        for (; i + 8 <= C; i += 8) /* eight partial sums, as sum8 */
            for (size_t j = 0; j < 8; j++)
                acc[j] += (x[i + j] - mu) * (x[i + j] - mu);
        var = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; i < C; i++)
            var += (x[i] - mu) * (x[i] - mu);
        var /= (float)C; /* biased, as PyTorch */
        float s = 1.0f / sqrtf(var + LN_EPS);
        for (i = 0; i < C; i++)
            o[i] = (x[i] - mu) * s * w[i] + bias[i];
        if (a->mean) {
            a->mean[n] = mu;
            a->rstd[n] = s;
        }
    }
}

void zr__layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *bias, size_t N, size_t C)
{
    layernorm_fwd_args a = {out, mean, rstd, inp, w, bias, C};
    par_for(N, ROWS_GRAIN, layernorm_forward_rows, &a);
}

/* dinp += d/dinp, dw += , db += (dinp is accumulated: it is the residual stream's gradient).
 * One region in `parts` parts: part k takes the k-th share of the rows for dinp and the k-th
 * share of the channel blocks for dw and db (which only read the inputs, not dinp). */
typedef struct {
    float *dinp, *dw, *db;
    const float *dout, *inp, *mean, *rstd, *w;
    size_t N, C, parts;
} layernorm_bwd_args;

static void layernorm_backward_part(const layernorm_bwd_args *a, size_t k)
{
    size_t N = a->N, C = a->C, P = a->parts, CB = col_blocks(C);
    const float *w = a->w;
    for (size_t n = N * k / P; n < N * (k + 1) / P; n++) {
        const float *x = a->inp + n * C, *d = a->dout + n * C;
        float *dx = a->dinp + n * C, mu = a->mean[n], s = a->rstd[n];
        float dnorm_mean, dnorm_norm_mean, acc1[8] = {0}, acc2[8] = {0};
        size_t i = 0;
        for (; i + 8 <= C; i += 8) /* eight partial sums each, as sum8 */
            for (size_t j = 0; j < 8; j++) {
                float norm = (x[i + j] - mu) * s, dnorm = w[i + j] * d[i + j];
                acc1[j] += dnorm;
                acc2[j] += dnorm * norm;
            }
        dnorm_mean = ((acc1[0] + acc1[4]) + (acc1[1] + acc1[5])) +
                     ((acc1[2] + acc1[6]) + (acc1[3] + acc1[7]));
        dnorm_norm_mean = ((acc2[0] + acc2[4]) + (acc2[1] + acc2[5])) +
                          ((acc2[2] + acc2[6]) + (acc2[3] + acc2[7]));
        for (; i < C; i++) {
            float norm = (x[i] - mu) * s, dnorm = w[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= (float)C;
        dnorm_norm_mean /= (float)C;
        for (i = 0; i < C; i++) {
            float norm = (x[i] - mu) * s, dnorm = w[i] * d[i];
            dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
    size_t i0 = CB * k / P * COLS_BLOCK, i1 = CB * (k + 1) / P * COLS_BLOCK;
    if (i1 > C)
        i1 = C;
    for (size_t n = 0; n < N; n++) {
        const float *x = a->inp + n * C, *d = a->dout + n * C;
        float mu = a->mean[n], s = a->rstd[n];
        for (size_t i = i0; i < i1; i++) {
            float norm = (x[i] - mu) * s;
            a->db[i] += d[i];
            a->dw[i] += norm * d[i];
        }
    }
}

static void layernorm_backward_parts(void *p, size_t k0, size_t k1)
{
    for (size_t k = k0; k < k1; k++)
        layernorm_backward_part(p, k);
}

static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *mean, const float *rstd,
                               const float *w, size_t N, size_t C)
{
    size_t parts = (size_t)par_threads();
    if (parts > N / ROWS_GRAIN)
        parts = N / ROWS_GRAIN ? N / ROWS_GRAIN : 1;
    layernorm_bwd_args a = {dinp, dw, db, dout, inp, mean, rstd, w, N, C, parts};
    par_for(parts, 1, layernorm_backward_parts, &a);
}


/* tanh(sqrt(2/pi) (x + 0.044715 x^3)) as 1 - 2 / (e^2u + 1), through zr_expf, which
 * vectorizes (tanhf and expf are libm calls): the absolute error (~1e-7 near 0) is what the
 * GELU uses, 1 + tanh, and what the backward's 1 - tanh^2 sees; large |u| gives e^2u = inf or
 * 0, hence exactly +-1. */
static inline float gelu_tanh(float x)
{
    float u = GELU_K * (x + 0.044715f * x * x * x);
    return 1.0f - 2.0f / (zr_expf(2.0f * u) + 1.0f);
}

typedef struct {
    float *out;
    const float *inp;
} gelu_args;

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
ZR_VEC_CLONES static void gelu_forward_elems(void *p, size_t i0, size_t i1)
{
    const gelu_args *a = p;
    float *out = a->out;
    const float *inp = a->inp;
    for (size_t i = i0; i < i1; i++)
        out[i] = 0.5f * inp[i] * (1.0f + gelu_tanh(inp[i]));
}

void zr__gelu_forward(float *out, const float *inp, size_t n)
{
    gelu_args a = {out, inp};
    par_for(n, ELEMS_GRAIN, gelu_forward_elems, &a);
}

/* d[i] *= gelu'(inp[i]), in place */
ZR_VEC_CLONES static void gelu_backward_elems(void *p, size_t i0, size_t i1)
{
    const gelu_args *a = p;
    float *d = a->out;
    const float *inp = a->inp;
    for (size_t i = i0; i < i1; i++) {
        float x = inp[i];
        float th = gelu_tanh(x);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3 * 0.044715f * x * x);
        d[i] *= g;
    }
}



/* ---------------------------------------------------------------- forward and backward */


/* One block of the last forward's B x T: res3 = res2 + mlp(ln_2(res2)), res2 = res +
 * attn(ln_1(res)); P: the block's parameters. The forward's, and the backward's recompute. */
static void layer_forward(zr_model *m, layer_acts *a, const float *res, const float *P)
{
    size_t B = m->B, T = m->T, N = B * T, C = m->c.dim, NH = m->c.heads;
    zr__layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, res, TENSOR(P, LN1W),
                          TENSOR(P, LN1B), N, C);
    zr__matmul_forward(a->qkv, NULL, a->ln1, TENSOR(P, QKVW), TENSOR(P, QKVB), N, C, 3 * C);
    zr__att_geom ag = {B, T, NH, C / NH, 1, 3 * C, C, 2 * C};
    zr__attention_forward(&ag, a->atty, a->att, a->qkv);
    /* res2 = res + c_proj(atty) */
    zr__matmul_forward(a->res2, res, a->atty, TENSOR(P, ATTPROJW), TENSOR(P, ATTPROJB), N, C, C);
    zr__layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, TENSOR(P, LN2W),
                          TENSOR(P, LN2B), N, C);
    /* GELU on each block of fch as soon as the matmul has computed it */
    gelu_args ga = {a->fch_gelu, a->fch};
    zr__elems_hook gh = {gelu_forward_elems, &ga, 4 * C};
    zr__gemm_hook gelu = {zr__elems_hook_fn, &gh};
    zr__matmul_forward_hooked(a->fch, NULL, a->ln2, TENSOR(P, FCW), TENSOR(P, FCB), N, C, 4 * C,
                              &gelu);
    /* res3 = res2 + mlp */
    zr__matmul_forward(a->res3, a->res2, a->fch_gelu, TENSOR(P, FCPROJW), TENSOR(P, FCPROJB), N,
                       4 * C, C);
}

int zr_model_forward(zr_model *m, const int32_t *inputs, const int32_t *targets, size_t B,
                     size_t T, float *loss)
{
    assert(m && inputs && loss);
    if (m->ll)
        return zr__llama_forward(m->ll, inputs, targets, B, T, loss);
    size_t L = m->c.layers, C = m->c.dim, V = m->c.vocab, N = B * T;
    /* a rejected forward leaves the previous one in place (nothing copied yet) */
    ZR_TRY(zr__forward_begin(m->inputs, m->targets, inputs, targets, B, T, m->max_B, m->max_T,
                             m->c.vocab));
    m->fwd_targets = -1; /* until this forward completes */
    m->B = B;
    m->T = T;
    const float *wte, *wpe, *P;
    ZR_TRY(params_get(m, 0, &wte));
    ZR_TRY(params_get(m, 1, &wpe));
    encoder_forward(m->encoded, m->inputs, wte, wpe, B, T, C);
    ZR_TRY(params_put(m, 1));
    ZR_TRY(params_put(m, 0));
    const float *res = m->encoded;
    for (size_t l = 0; l < L; l++) {
        ZR_TRY(params_get(m, l + 2, &P));
        layer_forward(m, &m->layer[l], res, P);
        ZR_TRY(params_put(m, l + 2));
        res = m->layer[l].res3;
    }
    m->held = L - 1;
    ZR_TRY(params_get(m, L + 2, &P));
    zr__layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, res, P + m->off.lnf_w,
                          P + m->off.lnf_b,
                      N, C);
    ZR_TRY(params_put(m, L + 2));
    /* logits [N, V] = lnf [N, C] wte[V, C]^T: the head is tied to the token embedding */
    ZR_TRY(params_get(m, 0, &wte));
    zr__head_forward(&m->head, m->losses, targets ? m->targets : NULL, wte, m->lnf, N, C, V);
    ZR_TRY(params_put(m, 0));
    *loss = zr__mean_loss(m->losses, N, targets != NULL);
    m->fwd_targets = targets != NULL;
    return 0;
}

int zr_model_backward(zr_model *m, float scale)
{
    assert(m);
    if (m->ll)
        return zr__llama_backward(m->ll, scale);
    ZR_TRY(zr__backward_check(m->fwd_targets));
    size_t B = m->B, T = m->T, N = B * T, L = m->c.layers, C = m->c.dim, NH = m->c.heads;
    size_t V = m->c.vocab;
    const float *res_last = L ? m->layer[L - 1].res3 : m->encoded;
    const float *wte, *P;
    float *dwte, *dwpe, *G;

    /* head, in chunks of rows: dlogits = scale (probs - onehot) / N; dlnf = dlogits wte
     * (into dC); dwte += dlogits^T lnf. wte's gradient buffer stays until the embedding's
     * backward adds its second contribution; or, when the hooks lend wte's gradient in pieces,
     * both contributions are added piece by piece at the end. */
    int pw = zr__grad_piece_rows(&m->h, 0, C) > 0, pp = zr__grad_piece_rows(&m->h, 1, C) > 0;
    dwte = dwpe = NULL;
    ZR_TRY(params_get(m, 0, &wte));
    if (!pw)
        ZR_TRY(grads_get(m, 0, &dwte));
    zr__head_backward(&m->head, m->dC, dwte, m->targets, wte, m->lnf, N, C, V, scale / (float)N);
    ZR_TRY(params_put(m, 0));
    zr__par_zero(m->dres, N * C);
    ZR_TRY(params_get(m, L + 2, &P));
    ZR_TRY(grads_get(m, L + 2, &G));
    layernorm_backward(m->dres, G + m->off.lnf_w, G + m->off.lnf_b, m->dC, res_last, m->lnf_mean,
                       m->lnf_rstd, P + m->off.lnf_w, N, C);
    ZR_TRY(params_put(m, L + 2));
    ZR_TRY(grads_put(m, L + 2));

    /* blocks, last to first; dres holds the gradient of the block's output, then of its input */
    for (size_t l = L; l-- > 0;) {
        layer_acts *a = &m->layer[l];
        const float *res = l ? m->layer[l - 1].res3 : m->encoded;
        ZR_TRY(params_get(m, l + 2, &P));
        ZR_TRY(grads_get(m, l + 2, &G));
        /* what the mode did not keep, from the layer's input and parameters, unless the shared
         * buffers hold this layer's (the last one's after the forward; a second backward of the
         * same forward finds the first layer's there) */
        int again = m->rc != ZR_RECOMPUTE_NONE && m->held != l;
        m->held = l;
        if (again && m->rc == ZR_RECOMPUTE_LAYER)
            layer_forward(m, a, res, P);
        if (again && m->rc == ZR_RECOMPUTE_SELECTIVE)
            zr__gelu_forward(a->fch_gelu, a->fch, N * 4 * C);
        /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))) */
        gelu_args ga = {m->d4C, a->fch}; /* d4C *= gelu'(fch), on each block once computed */
        zr__elems_hook gh = {gelu_backward_elems, &ga, 4 * C};
        zr__gemm_hook gelu = {zr__elems_hook_fn, &gh};
        zr__matmul_backward_hooked(m->d4C, TENSOR(G, FCPROJW), TENSOR(G, FCPROJB), m->dres,
                                   a->fch_gelu, TENSOR(P, FCPROJW), N, 4 * C, C, &gelu);
        zr__matmul_backward(m->dC, TENSOR(G, FCW), TENSOR(G, FCB), m->d4C, a->ln2,
                        TENSOR(P, FCW), N, C, 4 * C);
        layernorm_backward(m->dres, TENSOR(G, LN2W), TENSOR(G, LN2B), m->dC, a->res2,
                           a->ln2_mean, a->ln2_rstd, TENSOR(P, LN2W), N, C);
        /* attention: res2 = res + c_proj(attn(c_attn(ln_1(res)))) */
        zr__att_geom ag = {B, T, NH, C / NH, 1, 3 * C, C, 2 * C};
        if (again && m->rc == ZR_RECOMPUTE_SELECTIVE) /* att; its output (atty) into free dC */
            zr__attention_forward(&ag, m->dC, a->att, a->qkv);
        zr__matmul_backward(m->dC, TENSOR(G, ATTPROJW), TENSOR(G, ATTPROJB), m->dres, a->atty,
                        TENSOR(P, ATTPROJW), N, C, C);
        zr__attention_backward(&ag, m->dqkv, m->drow, m->dC, a->qkv, a->att, a->atty);
        zr__matmul_backward(m->dC, TENSOR(G, QKVW), TENSOR(G, QKVB), m->dqkv, a->ln1,
                        TENSOR(P, QKVW), N, C, 3 * C);
        layernorm_backward(m->dres, TENSOR(G, LN1W), TENSOR(G, LN1B), m->dC, res,
                           a->ln1_mean, a->ln1_rstd, TENSOR(P, LN1W), N, C);
        ZR_TRY(params_put(m, l + 2));
        ZR_TRY(grads_put(m, l + 2));
    }
    if (!pp)
        ZR_TRY(grads_get(m, 1, &dwpe));
    encoder_backward(dwte, dwpe, m->dres, m->inputs, B, T, C);
    zr__grad_src src = {N, C, m->c.ctx, T, NULL, NULL, NULL, NULL, 0.0f, m->dres, NULL};
    ZR_TRY(pp ? zr__grad_pieces(&m->h, 1, &src) : grads_put(m, 1));
    if (!pw)
        return grads_put(m, 0);
    /* the head's rows of wte's gradient piece by piece: without the probabilities (layer)
     * each piece recomputes its logits, from wte (fetched again: zr_model_fetch_order) */
    int refetch = !m->head.probs;
    wte = NULL;
    if (refetch)
        ZR_TRY(params_get(m, 0, &wte));
    src = (zr__grad_src){N, C, V, T, &m->head, wte, m->lnf, m->targets, scale / (float)N, m->dres,
                         m->inputs};
    ZR_TRY(zr__grad_pieces(&m->h, 0, &src));
    return refetch ? params_put(m, 0) : 0;
}
