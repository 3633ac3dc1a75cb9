/*
 * devmodel.h: the device model of the CUDA backend, shared by model.cu (GPT-2, and everything
 * that does not depend on the family: construction, arenas, hooks, token staging, the chunked
 * head, the groups) and llama.cu (the Llama family's layers, forward and backward). Internal to
 * core/device/cuda/.
 */
#ifndef ZR_CUDA_DEVMODEL_H
#define ZR_CUDA_DEVMODEL_H

#include "zrcuda.h"

/* GPT-2: what one block keeps from forward for backward */
typedef struct {
    bf16 *ln1;
    float *ln1_mean, *ln1_rstd;
    bf16 *q, *k, *v; /* [B, NH, T, hs] each */
    bf16 *att;       /* [B, NH, T, T] */
    bf16 *atty;      /* [N, C] */
    float *res2;     /* [N, C] */
    bf16 *ln2;
    float *ln2_mean, *ln2_rstd;
    bf16 *fch, *fch_gelu; /* [N, 4C] */
    float *res3;          /* [N, C] */
} layer_acts;

/* Llama: what one layer keeps from forward for backward (hd = C / H, KVD = KV hd) */
typedef struct {
    bf16 *xn1;
    float *rstd1;       /* RMSNorm before attention: output [N, C], 1 / rms [N] */
    bf16 *q, *k, *v;    /* after the rotation: q [B, H, T, hd], k and v [B, KV, T, hd] */
    bf16 *att;          /* [B, H, T, T] */
    bf16 *atty;         /* [N, C] */
    float *res2;        /* [N, C] */
    bf16 *xn2;
    float *rstd2;       /* RMSNorm before the MLP */
    bf16 *gate, *up, *hmlp; /* [N, I]: gate(x), up(x), silu(gate) up */
    float *res3;        /* [N, C] */
} ll_acts;

/*
 * Recompute (zr_recompute, device.h's model_new): with ZR_RECOMPUTE_LAYER every layer's entry
 * in layer / ll points to ONE set of buffers but its own res3 (the layer's output, the next
 * one's input), and dl holds one chunk of the head's rows; the backward runs a layer's forward
 * again (without its output: the res3 it has) before the layer's backward, and the head's logits
 * of each chunk again before the chunk's backward. With ZR_RECOMPUTE_SELECTIVE the layers share
 * one att buffer, which the backward fills again from the layer's q, k and v (the attention's
 * output of that recompute goes to the datty scratch). Same kernels on the same inputs: the same
 * bits as without recompute. `held` is the layer whose activations the shared buffers hold (the
 * forward leaves the last; a second backward of one forward recomputes it).
 */
struct zr_dev_model {
    zr_config c;
    zr_recompute recompute;
    size_t held;
    size_t max_B, max_T, max_N, Vp, xent_rows;
    zr_model_hooks h;
    zr_gpt2_offsets off;   /* GPT-2: from the host (the layout of ckpt's family table) */
    zr_llama_offsets loff; /* Llama: the same */
    size_t n_groups;
    uint64_t numel, layer_numel; /* all groups; one block group */
    float *params, *grads; /* own arenas, or NULL */
    size_t pbytes, gbytes;

    unsigned char *acts_mem;
    size_t acts_bytes;
    float *encoded; /* [N, C] */
    layer_acts *layer; /* GPT-2 */
    ll_acts *ll;       /* Llama */
    float *rope_cos, *rope_sin; /* Llama: [max_T, hd / 2] */
    bf16 *lnf;
    float *lnf_mean, *lnf_rstd;
    bf16 *dl;         /* [N, Vp]: p - onehot (p without targets); [xent_rows, Vp] with layer */
    float *losses;    /* [N] */
    double *loss_sum; /* [1] */
    int32_t *tok;     /* inputs [maxN], targets [maxN], pos [maxN], uniq [maxN], seg [maxN+1] */
    bf16 *wslot;      /* [layer_numel]: the fetched block's parameters in bf16 */
    bf16 *wte_bf;     /* [V, C]: the head's matrix in bf16 */
    float *scratch;   /* GPT-2 [N, 4C]: pre-bias matmul outputs, the GELU's incoming gradient;
                       * Llama [N, max(QL, 2I)]: q k v before the rotation, gate and up, dh */
    float *S;         /* [B, NH, T, T]: scores, then dP */
    bf16 *dS;         /* [B, NH, T, T] */
    bf16 *tmp;        /* [N, C]: permuted y (forward), permuted dy (backward) */
    float *logits;    /* [xent_rows, Vp] */
    float *dres, *dC; /* [N, C] */
    bf16 *dres_bf, *datty; /* [N, C] */
    bf16 *d4C;             /* GPT-2 [N, 4C]; Llama [N, 2I]: dgate, dup */
    bf16 *dqkvp;           /* GPT-2 [3, B, NH, T, hs]; Llama dq [B,H,T,hd], dk, dv [B,KV,T,hd] */
    bf16 *dqkv;            /* GPT-2 [N, 3C]; Llama [N, QL] */
    float *partial;        /* column-sum chunks */

    int32_t *host_tok; /* pinned mirror of tok */
    int32_t *counts;   /* [V] host scratch of the token plan */
    cudaEvent_t staged;
    int staged_pending;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;

    size_t B, T, U;
    int has_targets; /* the forward under way has targets */
    int fwd_targets; /* -1: no complete forward; 0: without targets; 1: with */
};

/* ------------------------------------------------------- shared by the families (model.cu) */

#define ZRC_BF CUDA_R_16BF
#define ZRC_F32 CUDA_R_32F

/* out[N, OC] (+)= inp[N, IC] W[OC, IC]^T (beta 0 or 1; out fp32 or bf16, row stride ldo) */
int zrc_mm_fwd(cublasHandle_t h, void *out, cudaDataType_t ot, size_t ldo, float beta,
               const bf16 *inp, const bf16 *W, size_t N, size_t IC, size_t OC);
/* dinp[N, IC] = alpha dout[N, OC] W[OC, IC] + beta dinp (dout rows of stride ldd) */
int zrc_mm_dinp(cublasHandle_t h, void *dinp, cudaDataType_t dt, float beta, const bf16 *dout,
                size_t ldd, const bf16 *W, size_t N, size_t IC, size_t OC, float alpha);
/* dW[OC, IC] += alpha dout^T inp (dout rows of stride ldd) */
int zrc_mm_dw(cublasHandle_t h, float *dW, const bf16 *dout, size_t ldd, const bf16 *inp,
              size_t N, size_t IC, size_t OC, float alpha);

/* Next buffer of an arena (base NULL: only counts); *total in double for overflow checks. */
void *zrc_carve(unsigned char *base, size_t *off, double *total, size_t bytes);
#define ZRC_CARVE(type, n) ((type *)zrc_carve(base, &off, total, (size_t)(n) * sizeof(type)))
/* The buffers both families carve alike (the final norm's output and 1 / rms or rstd, the
 * head's, the tokens, the weight slot, attention scratch of att elements, the residual
 * stream's gradients), from *off on. */
void zrc_carve_common(zr_dev_model *m, unsigned char *base, size_t *off, double *total,
                      size_t att);

/* Where group g starts in an arena (either family). */
uint64_t zrc_group_offset(const zr_dev_model *m, size_t g);
/* The hooks, or the own arenas (device.h's stream contract). */
int zrc_params_get(zr_dev_model *m, size_t g, const float **out);
int zrc_params_put(zr_dev_model *m, size_t g);
int zrc_grads_get(zr_dev_model *m, size_t g, float **out);
int zrc_grads_put(zr_dev_model *m, size_t g);

/* A forward's checks (B, T, token ids; zr_model_forward's messages) and the tokens, targets
 * and the embedding-backward plan staged to the device (m->tok) through pinned memory. */
int zrc_forward_begin(zr_dev_model *m, const int32_t *inputs, const int32_t *targets, size_t B,
                      size_t T);
/* The head on the final norm's output m->lnf [N, C] bf16 with W [V, C] bf16 (wte, embed_tokens
 * or lm_head), in chunks of m->xent_rows rows: m->dl, m->losses, and the loss sum when there
 * are targets. */
int zrc_head_forward(zr_dev_model *m, const bf16 *W, size_t N, int targets);
/* Its backward: m->dC [N, C] = k dl W (overwritten), dW += k dl^T lnf (with layer recompute,
 * each chunk's dl computed again first). */
int zrc_head_backward(zr_dev_model *m, const bf16 *W, float *dW, size_t N, float k);
/* Whether the backward of layer l must run its forward (layer) or its attention (selective)
 * again first: the shared buffers hold another layer. */
int zrc_recompute_due(const zr_dev_model *m, size_t l);
/* The checks of a backward: a complete forward with targets. */
int zrc_backward_check(const zr_dev_model *m);

/* ---------------------------------------------------------------- Llama (llama.cu) */

/* The activations (as recompute says: the comment above struct zr_dev_model). */
size_t zrc_llama_acts_layout(zr_dev_model *m, unsigned char *base, double *total);
/* the config's own checks (KV divides H, hd even, ffn), 1 with why filled */
int zrc_llama_problem(char *why, size_t cap, const zr_config *c);
size_t zrc_llama_fetch_order(const zr_dev_model *m, int backward, size_t *order);
/* the rotary table into m->rope_cos / rope_sin (synchronous, at construction) */
int zrc_llama_setup(zr_dev_model *m);
int zrc_llama_forward(zr_dev_model *m, size_t B, size_t T);
int zrc_llama_backward(zr_dev_model *m, float scale);

#endif
