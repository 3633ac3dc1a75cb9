/*
 * llama.c: the Llama family on the CPU in fp32 (zr.h, "model"; a zr_model of family llama
 * calls here): token embedding, L pre-norm blocks (RMSNorm -> q, k, v projections -> rotary
 * positions on q and k (Hugging Face's rotate-half convention) -> causal grouped-query
 * attention -> o projection -> residual; RMSNorm -> SwiGLU MLP down(silu(gate(x)) * up(x)) ->
 * residual), a final RMSNorm, the head (lm_head, or the token embedding when tied), softmax and
 * mean cross-entropy; no biases. Each layer is a <layer>_forward / <layer>_backward pair; the
 * matmuls, the attention, the softmax cross-entropy, the head's backward, the arenas, the
 * initializer's stream and the ZeRO hooks are model.c's (model_int.h), shared with GPT-2.
 *
 * Memory as GPT-2's: one parameter and one gradient arena holding the layout's groups end to
 * end (embed_tokens, layers.0 ... layers.<L-1>, norm, lm_head unless tied; offsets from the
 * layout of ckpt's family table, never restated here), or what the hooks lend; activations for
 * max_B x max_T allocated once.
 *
 * Shapes in comments: B batch, T sequence, C channels, H query heads, KV key/value heads,
 * hd = C / H, KVD = KV hd, I the MLP width, V vocabulary, N = B T positions, QL = C + 2 KVD
 * (a row of q, k, v side by side).
 */
#include "model_int.h"
#include "model_check.h"
#include "par.h"

#include "fastmath.h" /* zr_expf */

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ROWS_GRAIN 8
#define ELEMS_GRAIN 4096
#define COLS_BLOCK 16
#define INIT_STD 0.02f /* Hugging Face's initializer_range */

/* The roles of a layer's tensors, bound by name to the family table's. */
enum { R_LN1 = ZR_LL_LN1, R_Q = ZR_LL_Q, R_K = ZR_LL_K, R_V = ZR_LL_V, R_O = ZR_LL_O,
       R_LN2 = ZR_LL_LN2, R_GATE = ZR_LL_GATE, R_UP = ZR_LL_UP, R_DOWN = ZR_LL_DOWN,
       R_COUNT = ZR_LL_ROLES };
static const char *const role_names[R_COUNT] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight",
};

/* What one layer keeps from forward for backward; each buffer sized for max_B x max_T. With
 * recompute (zr_recompute) the layers share layer 0's buffers of what is recomputed: all but
 * res3 (layer), att and hmlp (selective). */
typedef struct {
    float *rstd1, *xn1;      /* [N], [N, C]: RMSNorm before attention */
    float *qkv;              /* [N, QL]: q, k after the rotation, v */
    float *att;              /* [B, H, T, T] softmax weights */
    float *atty;             /* [N, C] attention output before o_proj */
    float *res2;             /* [N, C] residual after attention */
    float *rstd2, *xn2;      /* [N], [N, C]: RMSNorm before the MLP */
    float *gu;               /* [N, 2I]: a row's gate(x), then its up(x) (one matmul) */
    float *hmlp;             /* [N, I]: silu(gate) * up */
    float *res3;             /* [N, C] layer output */
} ll_acts;

struct zr__llama {
    zr_config c;
    size_t L, C, H, KV, hd, KVD, I, V, QL;
    size_t max_B, max_T;
    zr_recompute rc; /* what the backward recomputes */
    size_t held;     /* the layer whose activations the shared buffers hold */
    zr_model_hooks h;
    size_t n_groups;     /* L + 2, + 1 for lm_head unless tied */
    uint64_t *goff;      /* [n_groups + 1]: group starts in an arena, then the total */
    uint64_t role[R_COUNT]; /* a layer tensor's offset inside its group */
    float *params, *grads;
    size_t pbytes, gbytes;

    unsigned char *acts_mem;
    size_t acts_bytes;
    float *rope_cos, *rope_sin; /* [max_T, hd / 2] */
    float *encoded;             /* [N, C] */
    ll_acts *layer;             /* [L] */
    float *rstdf, *xnf;         /* [N], [N, C] */
    zr__head head;              /* logits, probabilities (model_int.h) */
    float *losses;              /* [N] */
    int32_t *inputs, *targets;  /* [N] */
    float *dres, *dC, *dqkv;    /* [N, C], [N, C], [N, QL] */
    float *dI;                  /* [N, I]: the gradient of hmlp */
    float *dgu;                 /* [N, 2I]: of gu */
    float *drow;                /* [B H, T] */

    size_t B, T;
    int fwd_targets; /* -1 none yet, 0 without targets, 1 with */
};

static size_t head_group(const zr__llama *m) { return m->c.tied ? 0 : m->L + 2; }

/* ---------------------------------------------------------------- memory */

static size_t acts_layout(zr__llama *m, unsigned char *base, double *total)
{
    size_t C = m->C, I = m->I, T = m->max_T, N = m->max_B * T, off = 0;
    *total = 0;
    m->rope_cos = zr__carve(base, &off, total, T * (m->hd / 2));
    m->rope_sin = zr__carve(base, &off, total, T * (m->hd / 2));
    m->encoded = zr__carve(base, &off, total, N * C);
    ll_acts a0 = {0};
    for (size_t l = 0; l < m->L; l++) {
        /* each layer's own buffers, or layer 0's where the recompute mode shares them */
        int own = l == 0 || m->rc == ZR_RECOMPUTE_NONE;
        int own_sel = l == 0 || m->rc != ZR_RECOMPUTE_LAYER;
#define CARVE(f, n, fresh) (a.f = (fresh) ? zr__carve(base, &off, total, (n)) : a0.f)
        ll_acts a;
        CARVE(rstd1, N, own_sel);
        CARVE(xn1, N * C, own_sel);
        CARVE(qkv, N * m->QL, own_sel);
        if (own)
            *total += (double)m->max_B * m->H * T * T * sizeof(float); /* may pass size_t */
        CARVE(att, m->max_B * m->H * T * T, own);
        CARVE(atty, N * C, own_sel);
        CARVE(res2, N * C, own_sel);
        CARVE(rstd2, N, own_sel);
        CARVE(xn2, N * C, own_sel);
        CARVE(gu, N * 2 * I, own_sel);
        CARVE(hmlp, N * I, own);
        CARVE(res3, N * C, 1);
#undef CARVE
        if (l == 0)
            a0 = a;
        if (base)
            m->layer[l] = a;
    }
    m->rstdf = zr__carve(base, &off, total, N);
    m->xnf = zr__carve(base, &off, total, N * C);
    zr__head_carve(&m->head, base, &off, total, N, m->V, m->rc);
    m->losses = zr__carve(base, &off, total, N);
    m->inputs = zr__carve(base, &off, total, N);
    m->targets = zr__carve(base, &off, total, N);
    m->dres = zr__carve(base, &off, total, N * C);
    m->dC = zr__carve(base, &off, total, N * C);
    m->dqkv = zr__carve(base, &off, total, N * m->QL);
    m->dI = zr__carve(base, &off, total, N * I);
    m->dgu = zr__carve(base, &off, total, N * 2 * I);
    m->drow = zr__carve(base, &off, total, m->max_B * m->H * T);
    return off;
}

static void set_dims(zr__llama *m, const zr_config *c, size_t max_B, size_t max_T,
                     zr_recompute recompute)
{
    m->c = *c;
    m->rc = recompute;
    m->L = c->layers;
    m->C = c->dim;
    m->H = c->heads;
    m->KV = c->kv_heads;
    m->hd = c->dim / c->heads;
    m->KVD = m->KV * m->hd;
    m->I = c->ffn;
    m->V = c->vocab;
    m->QL = m->C + 2 * m->KVD;
    m->max_B = max_B;
    m->max_T = max_T;
}

uint64_t zr__llama_activation_bytes(const zr_config *c, size_t max_B, size_t max_T,
                                    zr_recompute recompute)
{
    zr__llama m;
    memset(&m, 0, sizeof m);
    set_dims(&m, c, max_B, max_T, recompute);
    double total;
    size_t b = acts_layout(&m, NULL, &total);
    return (b + ZR__ARENA_ALIGN - 1) / ZR__ARENA_ALIGN * ZR__ARENA_ALIGN;
}

/* Group starts and the layer roles from the checkpoint layout (ckpt's family table). */
static int fill_offsets(zr__llama *m)
{
    zck_layout *lay = NULL;
    ZR_TRY(zr_gpt2_layout(&lay, &m->c));
    int rc = 0;
    m->n_groups = zck_layout_n_groups(lay);
    if (m->n_groups != m->L + (m->c.tied ? 2 : 3)) {
        rc = zr_err_set(ZR_EINVAL, "llama layout: %zu groups (the model expects %zu)",
                        m->n_groups, m->L + (m->c.tied ? 2 : 3));
        goto out;
    }
    m->goff = calloc(m->n_groups + 1, sizeof *m->goff);
    if (!m->goff) {
        rc = zr_err_set(ZR_ENOMEM, "model: out of memory");
        goto out;
    }
    for (size_t g = 0; g < m->n_groups; g++)
        m->goff[g + 1] = m->goff[g] + zck_layout_group_numel(lay, g);
    for (int r = 0; r < R_COUNT; r++) {
        size_t t = 0, nt = zck_layout_group_n_tensors(lay, 1);
        zck_tensor_info ti;
        char want[96];
        snprintf(want, sizeof want, "layers.0.%s", role_names[r]);
        for (; t < nt; t++) {
            zck_layout_tensor(lay, 1, t, &ti);
            if (!strcmp(ti.name, want))
                break;
        }
        if (t == nt) {
            rc = zr_err_set(ZR_ENOTFOUND, "llama layout: no tensor '%s'", want);
            goto out;
        }
        m->role[r] = ti.offset;
    }
    /* the forward and backward take q, k, v as one [QL, C] matrix and gate, up as one
     * [2I, C]: the family table keeps them adjacent, in that order */
    if (m->role[R_K] != m->role[R_Q] + m->C * m->C ||
        m->role[R_V] != m->role[R_K] + m->KVD * m->C ||
        m->role[R_UP] != m->role[R_GATE] + m->I * m->C)
        rc = zr_err_set(ZR_EINVAL, "llama layout: q, k, v or gate, up are not adjacent");
out:
    zck_layout_free(lay);
    return rc;
}

/* cos and sin of position t times theta^(-2i / hd), i < hd / 2 (rotate-half: channel i and
 * i + hd/2 of a head turn by the same angle). */
void zr__llama_rope_table(float *cos_t, float *sin_t, size_t T, size_t hd, double theta)
{
    zr__rope_table(cos_t, sin_t, T, hd, theta); /* model_check.h: shared with the device */
}

int zr_llama_offsets_get(zr_llama_offsets *out, const zr_config *c)
{
    zr__llama m;
    memset(&m, 0, sizeof m);
    set_dims(&m, c, 1, 1, ZR_RECOMPUTE_NONE);
    ZR_TRY(fill_offsets(&m));
    out->embed = m.goff[0];
    out->layer0 = m.goff[1];
    out->layer_numel = m.goff[2] - m.goff[1];
    out->norm = m.goff[m.L + 1];
    out->head = m.goff[head_group(&m)];
    out->numel = m.goff[m.n_groups];
    memcpy(out->role, m.role, sizeof out->role);
    free(m.goff);
    return 0;
}

/* Either family's offsets (here rather than in config.c, which llama.c calls). */
int zr_model_offsets_get(zr_model_offsets *out, const zr_config *c)
{
    zr_model_offsets o;
    memset(&o, 0, sizeof o); /* compared with memcmp (hostsim): no stray padding bytes */
    o.family = c->family;
    if (c->family == ZR_FAMILY_LLAMA) {
        ZR_TRY(zr_llama_offsets_get(&o.llama, c));
        o.n_groups = c->layers + (c->tied ? 2u : 3u);
        o.numel = o.llama.numel;
    } else {
        ZR_TRY(zr_gpt2_offsets_get(&o.gpt2, c));
        o.n_groups = c->layers + 3u;
        o.numel = o.gpt2.numel;
    }
    *out = o;
    return 0;
}

static int check_new(const zr_config *c, size_t max_B, size_t max_T, const zr_model_hooks *hooks)
{
    ZR_TRY(zr__check_new(max_B, max_T, c->ctx, hooks));
    /* BLAS takes int dimensions */
    if ((double)max_B * max_T > INT_MAX || c->vocab > INT_MAX || c->ffn > INT_MAX ||
        c->dim > INT_MAX / 3)
        return zr_err_set(ZR_EINVAL, "model: batch %zu x seq %zu, vocab %u, ffn %u or dim %u "
                          "exceeds the BLAS int range", max_B, max_T, c->vocab, c->ffn, c->dim);
    return 0;
}

int zr__llama_new(zr__llama **out, const zr_config *c, size_t max_B, size_t max_T,
                  const zr_model_hooks *hooks, zr_recompute recompute)
{
    *out = NULL;
    zck_layout *lay = NULL;
    ZR_TRY(zr_gpt2_layout(&lay, c)); /* the family table's checks, with its messages */
    zck_layout_free(lay);
    ZR_TRY(check_new(c, max_B, max_T, hooks));
    zr__llama *m = calloc(1, sizeof *m);
    if (!m)
        return zr_err_set(ZR_ENOMEM, "model: out of memory");
    set_dims(m, c, max_B, max_T, recompute);
    if (hooks)
        m->h = *hooks;
    m->fwd_targets = -1;
    double acts_d;
    size_t abytes = acts_layout(m, NULL, &acts_d);
    int rc = fill_offsets(m);
    if (rc < 0)
        goto fail;
    double numel_d = (double)m->goff[m->n_groups];
    if (numel_d * sizeof(float) > 0x1p60 || acts_d > 0x1p60) {
        rc = zr_err_set(ZR_EINVAL, "model: %.3g parameters and %.3g bytes of activations "
                        "(batch %zu): too large", numel_d, acts_d, max_B);
        goto fail;
    }
    if (!(m->layer = calloc(m->L, sizeof *m->layer))) {
        rc = zr_err_set(ZR_ENOMEM, "model: out of memory");
        goto fail;
    }
    rc = zr__arenas_alloc(&m->params, &m->pbytes, &m->grads, &m->gbytes, &m->acts_mem, &abytes,
                          m->goff[m->n_groups], &m->h, max_B, max_T);
    if (rc < 0)
        goto fail;
    m->acts_bytes = abytes;
    acts_layout(m, m->acts_mem, &acts_d);
    zr__llama_rope_table(m->rope_cos, m->rope_sin, m->max_T, m->hd, m->c.rope_theta);
    *out = m;
    return 0;
fail:
    zr__llama_free(m);
    return rc;
}

void zr__llama_free(zr__llama *m)
{
    if (!m)
        return;
    free(m->params);
    free(m->grads);
    free(m->acts_mem);
    free(m->layer);
    free(m->goff);
    free(m);
}

size_t zr__llama_n_groups(const zr__llama *m) { return m->n_groups; }
uint64_t zr__llama_numel(const zr__llama *m) { return m->goff[m->n_groups]; }
uint64_t zr__llama_group_numel(const zr__llama *m, size_t g)
{
    return m->goff[g + 1] - m->goff[g];
}
float *zr__llama_param(zr__llama *m, size_t g) { return m->params ? m->params + m->goff[g] : NULL; }
float *zr__llama_grad(zr__llama *m, size_t g) { return m->grads ? m->grads + m->goff[g] : NULL; }
const float *zr__llama_probs(const zr__llama *m) { return m->head.probs; }

void zr__llama_zero_grad(zr__llama *m)
{
    if (m->grads)
        zr__par_zero(m->grads, m->goff[m->n_groups]);
}

void zr__llama_bytes(const zr__llama *m, uint64_t *params, uint64_t *grads, uint64_t *acts)
{
    if (params)
        *params = m->pbytes;
    if (grads)
        *grads = m->gbytes;
    if (acts)
        *acts = m->acts_bytes;
}

size_t zr__llama_fetch_order(const zr__llama *m, int backward, size_t *order)
{
    size_t L = m->L, n = 0;
    if (!backward) { /* embedding, layers, norm, head */
        for (size_t g = 0; g < L + 2; g++)
            order[n++] = g;
        order[n++] = head_group(m);
    } else { /* head, norm, layers last to first; the embedding's backward reads none, but a
              * tied head's gradient pieces read it again when the probabilities are not kept */
        order[n++] = head_group(m);
        for (size_t g = L + 2; g-- > 1;)
            order[n++] = g;
        if (m->c.tied && !m->head.probs && zr__grad_piece_rows(&m->h, 0, m->C) > 0)
            order[n++] = 0;
    }
    return n;
}

/* Vectors (RMSNorm weights) 1, matrices N(0, 0.02); each element a function of (seed, its
 * arena index), as GPT-2's. */
void zr__llama_init_range(const zr__llama *m, uint64_t seed, size_t g, uint64_t off, uint64_t n,
                          float *dst)
{
    assert(g < m->n_groups && off + n <= zr__llama_group_numel(m, g));
    uint64_t base = m->goff[g];
    if (g == 0 || g == m->L + 2) { /* embed_tokens, lm_head */
        zr__fill_normal(dst, base + off, n, seed, INIT_STD);
        return;
    }
    if (g == m->L + 1) { /* norm */
        for (uint64_t i = 0; i < n; i++)
            dst[i] = 1.0f;
        return;
    }
    uint64_t len = m->goff[g + 1] - base;
    for (int r = 0; r < R_COUNT; r++) {
        uint64_t t0 = m->role[r], t1 = len;
        for (int r2 = 0; r2 < R_COUNT; r2++) /* the next tensor's start ends this one */
            if (m->role[r2] > t0 && m->role[r2] < t1)
                t1 = m->role[r2];
        uint64_t lo = off > t0 ? off : t0, hi = off + n < t1 ? off + n : t1;
        if (lo >= hi)
            continue;
        if (r == R_LN1 || r == R_LN2)
            for (uint64_t i = lo; i < hi; i++)
                dst[i - off] = 1.0f;
        else
            zr__fill_normal(dst + (lo - off), base + lo, hi - lo, seed, INIT_STD);
    }
}

/* ---------------------------------------------------------------- layers */

/* out[n, :] = emb[inp[n], :] */
typedef struct {
    float *out;
    const int32_t *inp;
    const float *emb;
    size_t N, C;
} embed_args;

static void embed_forward_rows(void *p, size_t n0, size_t n1)
{
    const embed_args *a = p;
    for (size_t n = n0; n < n1; n++)
        memcpy(a->out + n * a->C, a->emb + (size_t)a->inp[n] * a->C, a->C * sizeof(float));
}

/* demb[inp[n], :] += dout[n, :]: split by channel block, every position in order */
static void embed_backward_cols(void *p, size_t b0, size_t b1)
{
    const embed_args *a = p;
    size_t C = a->C, i0 = b0 * COLS_BLOCK, i1 = b1 * COLS_BLOCK < C ? b1 * COLS_BLOCK : C;
    for (size_t n = 0; n < a->N; n++) {
        const float *d = a->emb + n * C;
        float *de = a->out + (size_t)a->inp[n] * C;
        for (size_t i = i0; i < i1; i++)
            de[i] += d[i];
    }
}

/* RMSNorm: out = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps), per row of C. Backward:
 * dx += rstd (w dy) - x rstd^3 sum(w dy x) / C; dw += dy x rstd (split by channel block). */
typedef struct {
    float *out, *rstd, *dw;
    const float *inp, *w, *dout;
    size_t N, C;
    float eps;
} rms_args;

ZR_VEC_CLONES static void rmsnorm_forward_rows(void *p, size_t n0, size_t n1)
{
    const rms_args *a = p;
    size_t C = a->C;
    for (size_t n = n0; n < n1; n++) {
        const float *x = a->inp + n * C;
        float *o = a->out + n * C;
        float s = 1.0f / sqrtf(zr__dot8(x, x, C) / (float)C + a->eps);
        for (size_t i = 0; i < C; i++)
            o[i] = x[i] * s * a->w[i];
        if (a->rstd)
            a->rstd[n] = s;
    }
}

void zr__rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, size_t N,
                         size_t C, float eps)
{
    rms_args a = {out, rstd, NULL, inp, w, NULL, N, C, eps};
    par_for(N, ROWS_GRAIN, rmsnorm_forward_rows, &a);
}

ZR_VEC_CLONES static void rmsnorm_backward_rows(void *p, size_t n0, size_t n1)
{
    const rms_args *a = p;
    size_t C = a->C;
    for (size_t n = n0; n < n1; n++) {
        const float *x = a->inp + n * C, *d = a->dout + n * C;
        float *dx = a->out + n * C, s = a->rstd[n], dot = 0.0f;
        float acc[8] = {0};
        size_t i = 0;
        for (; i + 8 <= C; i += 8)
            for (size_t j = 0; j < 8; j++)
                acc[j] += a->w[i + j] * d[i + j] * x[i + j];
        dot = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; i < C; i++)
            dot += a->w[i] * d[i] * x[i];
        float k = s * s * s * dot / (float)C;
        for (i = 0; i < C; i++)
            dx[i] += s * a->w[i] * d[i] - x[i] * k;
    }
}

static void rmsnorm_backward_cols(void *p, size_t b0, size_t b1)
{
    const rms_args *a = p;
    size_t C = a->C, i0 = b0 * COLS_BLOCK, i1 = b1 * COLS_BLOCK < C ? b1 * COLS_BLOCK : C;
    for (size_t n = 0; n < a->N; n++) {
        const float *x = a->inp + n * C, *d = a->dout + n * C;
        float s = a->rstd[n];
        for (size_t i = i0; i < i1; i++)
            a->dw[i] += d[i] * x[i] * s;
    }
}

/* dinp += (the residual stream's gradient), dw += */
static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *rstd, const float *w, size_t N, size_t C)
{
    rms_args a = {dinp, (float *)rstd, dw, inp, w, dout, N, C, 0.0f};
    par_for(N, ROWS_GRAIN, rmsnorm_backward_rows, &a);
    par_for((C + COLS_BLOCK - 1) / COLS_BLOCK, 1, rmsnorm_backward_cols, &a);
}

/* Rotary positions on the q (H heads from column 0) and k (KV heads from column C) of each
 * row of x [N, QL], position t = n mod T: channels i and i + hd/2 of a head turn by angle
 * t theta^(-2i/hd). inverse: the transpose (the backward of the gradient). */
typedef struct {
    float *x;
    const float *cos, *sin;
    size_t T, QL, C, nheads, hd;
    int inverse;
} rope_args;

static void rope_rows(void *p, size_t n0, size_t n1)
{
    const rope_args *a = p;
    size_t half = a->hd / 2;
    float sgn = a->inverse ? -1.0f : 1.0f;
    for (size_t n = n0; n < n1; n++) {
        const float *c = a->cos + (n % a->T) * half, *s = a->sin + (n % a->T) * half;
        for (size_t h = 0; h < a->nheads; h++) {
            float *x = a->x + n * a->QL + h * a->hd; /* q heads, then k heads (contiguous) */
            for (size_t i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half], si = sgn * s[i];
                x[i] = x1 * c[i] - x2 * si;
                x[i + half] = x2 * c[i] + x1 * si;
            }
        }
    }
}

static void rope(const zr__llama *m, float *x, size_t N, size_t T, int inverse)
{
    /* q heads occupy columns [0, C), k heads [C, C + KVD): H + KV heads of hd in a row */
    rope_args a = {x, m->rope_cos, m->rope_sin, T, m->QL, m->C, m->H + m->KV, m->hd, inverse};
    par_for(N, ROWS_GRAIN, rope_rows, &a);
}

/* SwiGLU over rows of gu [N, 2I] (gate in columns [0, I), up in [I, 2I)): h = silu(g) u,
 * silu(g) = g sigmoid(g). Backward: du = dh silu(g); dg = dh u sigmoid(g) (1 + g (1 -
 * sigmoid(g))), into dgu laid out as gu. */
typedef struct {
    float *h, *dgu;
    const float *gu, *dh;
    size_t I;
} swiglu_args;

ZR_VEC_CLONES static void swiglu_forward_rows(void *p, size_t n0, size_t n1)
{
    const swiglu_args *a = p;
    size_t I = a->I;
    for (size_t n = n0; n < n1; n++) {
        const float *restrict g = a->gu + n * 2 * I, *restrict u = g + I;
        float *restrict h = a->h + n * I;
        for (size_t i = 0; i < I; i++)
            h[i] = g[i] / (1.0f + zr_expf(-g[i])) * u[i];
    }
}

/* rows n0..n1, columns i0..i1 of dh: a gemm hook on the matmul that computes dh */
ZR_VEC_CLONES static void swiglu_backward_block(void *p, size_t n0, size_t n1, size_t i0,
                                                size_t i1)
{
    const swiglu_args *a = p;
    size_t I = a->I;
    for (size_t n = n0; n < n1; n++) {
        const float *restrict g = a->gu + n * 2 * I, *restrict u = g + I;
        const float *restrict dh = a->dh + n * I;
        float *restrict dg = a->dgu + n * 2 * I, *restrict du = dg + I;
        for (size_t i = i0; i < i1; i++) {
            float sg = 1.0f / (1.0f + zr_expf(-g[i])), d = dh[i];
            du[i] = d * g[i] * sg;
            dg[i] = d * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
        }
    }
}



/* ---------------------------------------------------------------- forward and backward */

static zr__att_geom att_geom(const zr__llama *m)
{
    zr__att_geom g = {m->B, m->T, m->H, m->hd, m->H / m->KV, m->QL, m->C, m->C + m->KVD};
    return g;
}

/* hmlp = silu(gate) * up of gu: the forward's, and the selective recompute's */
static void swiglu_forward(const zr__llama *m, ll_acts *a)
{
    size_t N = m->B * m->T, I = m->I;
    swiglu_args sa = {a->hmlp, NULL, a->gu, NULL, I};
    par_for(N, ELEMS_GRAIN / I ? ELEMS_GRAIN / I : 1, swiglu_forward_rows, &sa);
}

/* One block: res3 = res2 + mlp(rms2(res2)), res2 = res + o(attn(rope(qkv(rms1(res))))). The
 * forward's, and the layer recompute's. */
static void layer_forward(zr__llama *m, ll_acts *a, const float *res, const float *P)
{
    size_t N = m->B * m->T, C = m->C, I = m->I, QL = m->QL;
    float eps = (float)m->c.norm_eps;
    zr__rmsnorm_forward(a->xn1, a->rstd1, res, P + m->role[R_LN1], N, C, eps);
    /* q, k, v in one matmul: their weights are one [QL, C] matrix (fill_offsets) */
    zr__gemm(0, 1, N, QL, C, a->xn1, C, P + m->role[R_Q], C, 0.0f, a->qkv, QL);
    rope(m, a->qkv, N, m->T, 0);
    zr__att_geom g = att_geom(m);
    zr__attention_forward(&g, a->atty, a->att, a->qkv);
    zr__matmul_forward(a->res2, res, a->atty, P + m->role[R_O], NULL, N, C, C);
    zr__rmsnorm_forward(a->xn2, a->rstd2, a->res2, P + m->role[R_LN2], N, C, eps);
    zr__gemm(0, 1, N, 2 * I, C, a->xn2, C, P + m->role[R_GATE], C, 0.0f, a->gu, 2 * I);
    swiglu_forward(m, a);
    zr__matmul_forward(a->res3, a->res2, a->hmlp, P + m->role[R_DOWN], NULL, N, I, C);
}

/* dres: the gradient of the layer's output in, of its input out; G: the layer's gradients.
 * again: recompute what the mode did not keep (the shared buffers hold another layer's). */
static void layer_backward(zr__llama *m, ll_acts *a, const float *res, const float *P, float *G,
                           int again)
{
    size_t N = m->B * m->T, C = m->C, I = m->I, QL = m->QL;
    if (again && m->rc == ZR_RECOMPUTE_LAYER)
        layer_forward(m, a, res, P);
    if (again && m->rc == ZR_RECOMPUTE_SELECTIVE)
        swiglu_forward(m, a);
    /* MLP */
    /* dI, then SwiGLU's backward into dgu on each block of dI once computed */
    swiglu_args sa = {NULL, m->dgu, a->gu, m->dI, I};
    zr__gemm_hook swb = {swiglu_backward_block, &sa};
    zr__matmul_backward_hooked(m->dI, G + m->role[R_DOWN], NULL, m->dres, a->hmlp,
                               P + m->role[R_DOWN], N, I, C, &swb);
    /* gate and up as one [2I, C] matrix, as in the forward */
    zr__gemm(0, 0, N, C, 2 * I, m->dgu, 2 * I, P + m->role[R_GATE], C, 0.0f, m->dC, C);
    zr__gemm(1, 0, 2 * I, C, N, m->dgu, 2 * I, a->xn2, C, 1.0f, G + m->role[R_GATE], C);
    rmsnorm_backward(m->dres, G + m->role[R_LN2], m->dC, a->res2, a->rstd2, P + m->role[R_LN2],
                     N, C);
    /* attention */
    zr__att_geom g = att_geom(m);
    if (again && m->rc == ZR_RECOMPUTE_SELECTIVE) /* att; its output (atty) into free dC */
        zr__attention_forward(&g, m->dC, a->att, a->qkv);
    zr__matmul_backward(m->dC, G + m->role[R_O], NULL, m->dres, a->atty, P + m->role[R_O], N, C,
                        C);
    zr__attention_backward(&g, m->dqkv, m->drow, m->dC, a->qkv, a->att, a->atty);
    rope(m, m->dqkv, N, m->T, 1);
    /* q, k, v as one [QL, C] matrix, as in the forward */
    zr__gemm(0, 0, N, C, QL, m->dqkv, QL, P + m->role[R_Q], C, 0.0f, m->dC, C);
    zr__gemm(1, 0, QL, C, N, m->dqkv, QL, a->xn1, C, 1.0f, G + m->role[R_Q], C);
    rmsnorm_backward(m->dres, G + m->role[R_LN1], m->dC, res, a->rstd1, P + m->role[R_LN1], N,
                     C);
}

static const float *own_param(const zr__llama *m, size_t g)
{
    return m->params ? m->params + m->goff[g] : NULL;
}

static float *own_grad(const zr__llama *m, size_t g)
{
    return m->grads ? m->grads + m->goff[g] : NULL;
}

int zr__llama_forward(zr__llama *m, const int32_t *inputs, const int32_t *targets, size_t B,
                      size_t T, float *loss)
{
    size_t L = m->L, C = m->C, V = m->V, N = B * T;
    /* a rejected forward leaves the previous one in place (nothing copied yet) */
    ZR_TRY(zr__forward_begin(m->inputs, m->targets, inputs, targets, B, T, m->max_B, m->max_T,
                             m->c.vocab));
    m->fwd_targets = -1; /* until this forward completes */
    m->B = B;
    m->T = T;
    const zr_model_hooks *h = &m->h;
    const float *P;
    ZR_TRY(zr__params_get(h, own_param(m, 0), 0, &P));
    embed_args ea = {m->encoded, m->inputs, P, N, C};
    par_for(N, ROWS_GRAIN, embed_forward_rows, &ea);
    ZR_TRY(zr__params_put(h, 0));
    const float *res = m->encoded;
    for (size_t l = 0; l < L; l++) {
        ZR_TRY(zr__params_get(h, own_param(m, l + 1), l + 1, &P));
        layer_forward(m, &m->layer[l], res, P);
        ZR_TRY(zr__params_put(h, l + 1));
        res = m->layer[l].res3;
    }
    m->held = L - 1;
    ZR_TRY(zr__params_get(h, own_param(m, L + 1), L + 1, &P));
    zr__rmsnorm_forward(m->xnf, m->rstdf, res, P, N, C, (float)m->c.norm_eps);
    ZR_TRY(zr__params_put(h, L + 1));
    size_t hg = head_group(m); /* logits [N, V] = xnf [N, C] W[V, C]^T */
    ZR_TRY(zr__params_get(h, own_param(m, hg), hg, &P));
    zr__head_forward(&m->head, m->losses, targets ? m->targets : NULL, P, m->xnf, N, C, V);
    ZR_TRY(zr__params_put(h, hg));
    *loss = zr__mean_loss(m->losses, N, targets != NULL);
    m->fwd_targets = targets != NULL;
    return 0;
}

int zr__llama_backward(zr__llama *m, float scale)
{
    ZR_TRY(zr__backward_check(m->fwd_targets));
    size_t N = m->B * m->T, L = m->L, C = m->C, hg = head_group(m);
    const zr_model_hooks *h = &m->h;
    const float *P, *res_last = L ? m->layer[L - 1].res3 : m->encoded;
    float *G = NULL, *demb = NULL;
    /* head; a tied head's gradient is the embedding's, kept until the embedding adds to it.
     * A gradient the hooks lend in pieces is added piece by piece: an untied head's right
     * away, the embedding's (with a tied head's) at the end. */
    int ph = zr__grad_piece_rows(h, hg, C) > 0, pe = zr__grad_piece_rows(h, 0, C) > 0;
    zr__grad_src src = {N, C, m->V, m->T, &m->head, NULL, m->xnf, m->targets, scale / (float)N,
                        NULL, NULL};
    ZR_TRY(zr__params_get(h, own_param(m, hg), hg, &P));
    if (!ph)
        ZR_TRY(zr__grads_get(h, own_grad(m, hg), hg, &G));
    zr__head_backward(&m->head, m->dC, G, m->targets, P, m->xnf, N, C, m->V, scale / (float)N);
    src.W = P; /* an untied head's pieces while the head is lent (they may recompute logits) */
    if (m->c.tied)
        demb = G;
    else if (ph)
        ZR_TRY(zr__grad_pieces(h, hg, &src));
    else
        ZR_TRY(zr__grads_put(h, hg));
    ZR_TRY(zr__params_put(h, hg));
    zr__par_zero(m->dres, N * C);
    ZR_TRY(zr__params_get(h, own_param(m, L + 1), L + 1, &P));
    ZR_TRY(zr__grads_get(h, own_grad(m, L + 1), L + 1, &G));
    rmsnorm_backward(m->dres, G, m->dC, res_last, m->rstdf, P, N, C);
    ZR_TRY(zr__params_put(h, L + 1));
    ZR_TRY(zr__grads_put(h, L + 1));
    for (size_t l = L; l-- > 0;) {
        ZR_TRY(zr__params_get(h, own_param(m, l + 1), l + 1, &P));
        ZR_TRY(zr__grads_get(h, own_grad(m, l + 1), l + 1, &G));
        /* what the mode did not keep, unless the shared buffers hold this layer's (model.c) */
        int again = m->rc != ZR_RECOMPUTE_NONE && m->held != l;
        m->held = l;
        layer_backward(m, &m->layer[l], l ? m->layer[l - 1].res3 : m->encoded, P, G, again);
        ZR_TRY(zr__params_put(h, l + 1));
        ZR_TRY(zr__grads_put(h, l + 1));
    }
    if (pe) { /* the embedding's rows (and a tied head's) piece by piece; a tied head without
               * the probabilities recomputes its logits from the embedding, fetched again
               * (zr__llama_fetch_order) */
        int refetch = m->c.tied && !m->head.probs;
        src.head = m->c.tied ? &m->head : NULL;
        src.W = NULL;
        if (refetch)
            ZR_TRY(zr__params_get(h, own_param(m, 0), 0, &src.W));
        src.dout = m->dres;
        src.inp = m->inputs;
        ZR_TRY(zr__grad_pieces(h, 0, &src));
        return refetch ? zr__params_put(h, 0) : 0;
    }
    if (!demb)
        ZR_TRY(zr__grads_get(h, own_grad(m, 0), 0, &demb));
    embed_args ea = {demb, m->inputs, m->dres, N, C};
    par_for((C + COLS_BLOCK - 1) / COLS_BLOCK, 1, embed_backward_cols, &ea);
    return zr__grads_put(h, 0);
}
