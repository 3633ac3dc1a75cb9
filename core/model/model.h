/*
 * model.h: the model maths of core/ (part of the public zr.h): model configuration, the GPT-2
 * model (forward and backward in C, matmuls through BLAS), AdamW, the LR schedule and the token
 * data. Nothing here knows of ranks, devices or communicators; core/model/ is compiled with
 * only its own folder and ckpt/ on the include path.
 */
#ifndef ZR_MODEL_H
#define ZR_MODEL_H

#include "zck.h"

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a state (the optimizer's moments, ZeRO-3's parameter partitions) lives: with the
 * engine that computes on it (host memory, or device memory on a device), in pinned host
 * memory, or in a swap file on NVMe. One encoding for zr_train_opts and the ZeRO engines. */
typedef enum { ZR_OFFLOAD_NONE = 0, ZR_OFFLOAD_CPU = 1, ZR_OFFLOAD_NVME = 2 } zr_offload;

/* What a training forward keeps for the backward (zrun --recompute): everything (none); only
 * each layer's input, the layer recomputed in the backward, and of the head's probabilities
 * each row's maximum and sum, the logits recomputed chunk by chunk (layer); everything but the
 * attention weights and the GELU/SwiGLU outputs, recomputed in the backward (selective). The
 * recompute runs the forward's kernels on the same inputs, so the gradients are the same bits. */
typedef enum {
    ZR_RECOMPUTE_NONE = 0,
    ZR_RECOMPUTE_LAYER = 1,
    ZR_RECOMPUTE_SELECTIVE = 2
} zr_recompute;

/* ---------------------------------------------------------------- model configuration */

/* The model families (ckpt's family table: "gpt2", "llama"). */
typedef enum { ZR_FAMILY_GPT2 = 0, ZR_FAMILY_LLAMA = 1 } zr_family;

/* A model's shape. GPT-2 uses the first five fields (family 0, the rest 0: a positional
 * {L, NH, C, T, V} is a GPT-2 config); Llama uses all of them. */
typedef struct {
    uint32_t layers, heads, dim, ctx, vocab; /* L, NH, C, maximum T, V */
    zr_family family;
    uint32_t kv_heads, ffn, tied;            /* Llama: KV heads, I (MLP width), head = embedding */
    double rope_theta, norm_eps;             /* Llama: rotary base, RMSNorm epsilon */
} zr_config;
/* A GPT-2 config as an initializer: ZR_GPT2(L, NH, C, T, V). */
#define ZR_GPT2(L, NH, C, T, V) {.layers = (L), .heads = (NH), .dim = (C), .ctx = (T), .vocab = (V)}
/* The name from before the Llama family, kept for GPT-2-only callers. */
typedef zr_config zr_gpt2_config;

/*
 * "tiny" (L=4, NH=4, C=128, T=128, V=256: the default run), "gpt2" (12, 12, 768, 1024, 50257),
 * "gpt2-medium" (24, 16, 1024, 1024, 50257), or fields: "gpt2:layers=4,heads=4,dim=256,ctx=128,
 * vocab=256" (fields not given keep the tiny values). Llama: "llama" (= "llama-tiny": L=4,
 * NH=4, KV=2, C=128, I=344, T=128, V=256), "llama-124m", "smollm-135m", "tinyllama-1.1b", or
 * "llama:layers=..,heads=..,kv_heads=..,dim=..,ffn=..,ctx=..,vocab=..,rope_theta=..,
 * norm_eps=..,tied=0|1" (fields not given keep llama-tiny's, rope_theta 10000, norm_eps 1e-5,
 * tied 0). ZR_EINVAL naming the bad part; dim must be a multiple of heads (Llama: heads a
 * multiple of kv_heads, dim / heads even). The zr_gpt2_config_* calls take every family.
 */
int zr_gpt2_config_parse(zr_gpt2_config *out, const char *spec);
/* The manifest's model section, through ckpt's family table (zck_arch_config_to_json, as
 * formats/ writes it): {"arch":"gpt2","layers":L,"heads":NH,"dim":C,"ctx":T,"vocab":V}, or
 * {"arch":"llama",...} with the llama fields. from_json takes any family. */
int zr_gpt2_config_to_json(char **out, const zr_gpt2_config *c);
int zr_gpt2_config_from_json(zr_gpt2_config *out, const char *json);
/* The checkpoint layout: the naming contract of docs/FORMAT.md of c's family, built by ckpt's
 * family table (zck_arch_layout; formats/' zfmt_gpt2_layout is the same call for GPT-2). */
int zr_gpt2_layout(zck_layout **out, const zr_gpt2_config *c);
/* Whether a checkpoint's layout ck has the groups and tensors of want (names, sizes, offsets:
 * the same model shape); states are not compared. ZR_EINVAL naming path and the first
 * difference ("another model shape"). */
int zr_gpt2_layout_check(const zck_layout *ck, const zck_layout *want, const char *path);

/* The roles the model's maths gives the tensors of a block (h.<l>), bound by name to ckpt's
 * family table in config.c. */
typedef enum {
    ZR_BLK_LN1W, ZR_BLK_LN1B, ZR_BLK_QKVW, ZR_BLK_QKVB, ZR_BLK_ATTPROJW, ZR_BLK_ATTPROJB,
    ZR_BLK_LN2W, ZR_BLK_LN2B, ZR_BLK_FCW, ZR_BLK_FCB, ZR_BLK_FCPROJW, ZR_BLK_FCPROJB,
    ZR_BLK_COUNT
} zr_gpt2_blk;

/* Where a parameter (or gradient) arena holding zr_gpt2_layout's groups end to end keeps each
 * tensor, in elements: computed from the layout, so the CPU model and the device models (which
 * get it through the device ABI) never restate the table. */
typedef struct {
    uint64_t wte, wpe, h0, ln_f;   /* group starts; block l starts at h0 + l * layer_numel */
    uint64_t layer_numel, numel;   /* one block group; all groups */
    uint64_t blk[ZR_BLK_COUNT];    /* a block tensor's offset inside its group, by role */
    uint64_t blk_numel[ZR_BLK_COUNT];
    uint64_t lnf_w, lnf_b;         /* offsets inside ln_f */
} zr_gpt2_offsets;
/* ZR_EINVAL as zr_gpt2_layout (or when the layout is not the groups the model addresses, or c
 * is not a GPT-2 config). */
int zr_gpt2_offsets_get(zr_gpt2_offsets *out, const zr_gpt2_config *c);

/* Where a Llama's tensors are in a full parameter arena (the layout's groups end to end): the
 * embedding, layer l's group at layer0 + l layer_numel with its tensors at role[ZR_LL_*]
 * inside it, the final norm, the head (the embedding when tied), numel in all. Computed from
 * the layout (ckpt's family table) by llama.c; the KV-cache generator and the device models
 * address the arena with it. ZR_EINVAL for a config that is not a valid Llama. */
enum { ZR_LL_LN1, ZR_LL_Q, ZR_LL_K, ZR_LL_V, ZR_LL_O, ZR_LL_LN2, ZR_LL_GATE, ZR_LL_UP,
       ZR_LL_DOWN, ZR_LL_ROLES };
typedef struct {
    uint64_t embed, layer0, layer_numel, norm, head, numel;
    uint64_t role[ZR_LL_ROLES];
} zr_llama_offsets;
int zr_llama_offsets_get(zr_llama_offsets *out, const zr_config *c);

/* The family-neutral description of a model's arena that the device ABI carries (device.h's
 * model_new): the family, its group count and size, and the offsets of that family (the other
 * member zeroed). Filled by zr_model_offsets_get from c (ZR_EINVAL as the family's call). */
typedef struct {
    zr_family family;
    uint32_t n_groups;
    uint64_t numel;
    zr_gpt2_offsets gpt2;   /* family ZR_FAMILY_GPT2 */
    zr_llama_offsets llama; /* family ZR_FAMILY_LLAMA */
} zr_model_offsets;
int zr_model_offsets_get(zr_model_offsets *out, const zr_config *c);

/* ---------------------------------------------------------------- model */

/*
 * The model owns one parameter arena and one gradient arena (huge-page advised), each holding
 * the groups of zr_gpt2_layout end to end in layout order: group g's tensors are contiguous at
 * zr_model_param(m, g), in the layout's tensor order and shapes, row-major. Activations for up
 * to max_B sequences of up to ctx tokens are allocated once at creation and reused.
 * The family of c decides the maths (GPT-2: model.c; Llama: llama.c, groups embed_tokens,
 * layers.<l>, norm, then lm_head unless tied); every call below works for both.
 */
typedef struct zr_model zr_model;
int zr_model_new(zr_model **out, const zr_gpt2_config *c, size_t max_B);

/*
 * Hooks (ZeRO): where the model finds a group's parameters and where it adds a group's
 * gradient, one group at a time, instead of its own arenas. params lends group g's whole
 * parameters (layout order, as in the arena) before the model reads them; params_done says they
 * are no longer read. The model asks in the order zr_model_fetch_order gives, at most two groups
 * at once (wte and wpe for the embedding). grads lends a buffer of group g's size that the
 * model adds scale x the gradient into (accumulation is the lender's business: a zeroed buffer
 * or the previous micro-batch's sums); grads_done says group g's gradient of this backward is
 * complete (wte's comes last: the head and the embedding both add to it). A hook returns 0 or
 * a ZR_E* code with the error set, which the forward or backward returns. Either pair may be
 * NULL: then that side lives in the model's own arena (zr_model_param/grad return NULL for a
 * side that is lent).
 * Pieces (optional, all three or none, with grads): grad_piece_numel says how many elements of
 * group g's gradient one piece may hold (0: none, grads lends the whole group). An embedding
 * (GPT-2's wte and wpe, Llama's embed_tokens, and lm_head) whose group has pieces gets its
 * gradient in pieces of whole rows at the end of the backward instead: grad_piece lends a
 * zeroed buffer for elements [off, off + n) of the group, the model adds every contribution
 * to those rows into it (the head's and the embedding's, in the order and with the bits of
 * the whole buffer), and grad_piece_done says the piece is complete. Pieces come in order and
 * one at a time.
 */
typedef struct {
    void *ctx;
    int (*params)(void *ctx, size_t g, const float **out);
    int (*params_done)(void *ctx, size_t g);
    int (*grads)(void *ctx, size_t g, float **out);
    int (*grads_done)(void *ctx, size_t g);
    uint64_t (*grad_piece_numel)(void *ctx, size_t g);
    int (*grad_piece)(void *ctx, size_t g, uint64_t off, uint64_t n, float **out);
    int (*grad_piece_done)(void *ctx, size_t g, uint64_t off, uint64_t n);
} zr_model_hooks;
/* As zr_model_new, activations sized for max_T <= ctx tokens per sequence, with hooks (or
 * NULL). */
int zr_model_new_ext(zr_model **out, const zr_gpt2_config *c, size_t max_B, size_t max_T,
                     const zr_model_hooks *hooks);
/* As zr_model_new_ext, keeping for the backward what rc says (zr_recompute). The parameters of
 * a recomputed layer are those the backward asks for anyway: the recompute runs inside the
 * backward's one request of the layer's group. zr_model_fetch_order is the same but for the
 * token embedding, asked for once more at the end of a layer backward whose gradient the hooks
 * take in pieces: the pieces recompute their logits through the tied head. */
int zr_model_new_recompute(zr_model **out, const zr_gpt2_config *c, size_t max_B, size_t max_T,
                           const zr_model_hooks *hooks, zr_recompute rc);
/* The groups a forward (backward 0) or backward (1) asks for, in order, into order[] (room for
 * layers + 4); returns the count. A group may appear twice (wte: embedding and head; in the
 * backward, the head and its gradient pieces: zr_model_new_recompute). */
size_t zr_model_fetch_order(const zr_model *m, int backward, size_t *order);
void zr_model_free(zr_model *m);
const zr_gpt2_config *zr_model_config(const zr_model *m);
size_t zr_model_n_groups(const zr_model *m);
uint64_t zr_model_group_numel(const zr_model *m, size_t g);
uint64_t zr_model_numel(const zr_model *m);       /* all groups */
float *zr_model_param(zr_model *m, size_t g);     /* borrowed; arena + group offset */
float *zr_model_grad(zr_model *m, size_t g);
/* GPT-2 initialization from seed alone: weights N(0, 0.02), the two residual projections
 * (attn.c_proj.weight, mlp.c_proj.weight) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1
 * and biases 0. Llama: every matrix N(0, 0.02) (Hugging Face's initializer_range), RMSNorm
 * weights 1. Deterministic: same seed, same bits, and each element depends only on (seed,
 * its index), so init_range of any part of a group gives the bits init_weights puts there.
 * init_weights fills the own parameter arena (nothing when parameters are lent). */
void zr_model_init_weights(zr_model *m, uint64_t seed);
void zr_model_init_range(const zr_model *m, uint64_t seed, size_t g, uint64_t off, uint64_t n,
                         float *dst);
/* Forward B sequences of T tokens (B <= max_B, T <= ctx): inputs [B*T] token ids < V; with
 * targets [B*T], *loss is the mean cross-entropy over the B*T positions (else *loss is 0 and
 * only logits are computed). ZR_EINVAL on sizes or token ids out of range. */
int zr_model_forward(zr_model *m, const int32_t *inputs, const int32_t *targets, size_t B,
                     size_t T, float *loss);
/* Probabilities of the last forward, [B*T, V] (borrowed, valid until the next forward); NULL
 * for a model created with ZR_RECOMPUTE_LAYER, which keeps one chunk of rows of them at a time
 * (zr_recompute). */
const float *zr_model_probs(const zr_model *m);
void zr_model_zero_grad(zr_model *m);
/* Backward of the last forward (which had targets): grads += scale * d(mean loss)/d(params).
 * The trainer passes scale = 1 / micro-batches so accumulated grads are those of the mean
 * loss over the whole global batch. */
int zr_model_backward(zr_model *m, float scale);
/* Bytes held: parameters, gradients (0 for a lent side), activations (the memory report). */
/* The activation bytes a model would allocate for max_B x max_T with recompute rc, without
 * allocating. */
uint64_t zr_model_activation_bytes(const zr_gpt2_config *c, size_t max_B, size_t max_T,
                                   zr_recompute rc);
void zr_model_bytes(const zr_model *m, uint64_t *params, uint64_t *grads, uint64_t *acts);
/* BLAS threads (and any other threads the model uses). */
void zr_set_threads(int n);

/* ---------------------------------------------------------------- optimizer */

typedef struct {
    float beta1, beta2, eps, weight_decay;
} zr_adamw_hp;
#define ZR_ADAMW_HP_INIT {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f}

/* One AdamW update of n elements (decoupled weight decay, bias correction with the 1-based
 * optimizer step t): g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * param -= lr * (mhat / (sqrt(vhat) + eps) + (decay ? wd * param : 0)). */
void zr_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, uint64_t t,
                     float lr, float grad_scale, int decay, const zr_adamw_hp *hp);
/* Sum of squares in double (for the global gradient norm). */
double zr_sumsq(const float *x, size_t n);
/* Learning rate after `step` completed optimizer steps (0-based): linear warmup
 * lr * (step + 1) / warmup for step < warmup, then cosine decay from lr to lr * min_ratio at
 * step = total - 1 (and lr * min_ratio after). */
float zr_lr_at(uint64_t step, uint64_t warmup, uint64_t total, float lr, float min_ratio);

/* ---------------------------------------------------------------- data */

/*
 * A token source. spec is "synthetic" (a built-in deterministic corpus, vocab 256, learnable:
 * see docs), or a file: an llm.c token file (int32 header[256] with magic 20240520, version 1,
 * header[2] = token count, then uint16 tokens) when its magic matches, else any file as raw
 * bytes (vocab 256). Sample `index` is T+1 consecutive tokens at a position that depends only
 * on (seed, index): the sequence of global batches is fixed by the seed and the global batch,
 * whatever the world size. ZR_ENOTFOUND / ZR_ECORRUPT naming the file; ZR_EINVAL when the data
 * has fewer than T+1 tokens or tokens >= vocab.
 */
typedef struct zr_data zr_data;
int zr_data_open(zr_data **out, const char *spec, uint32_t vocab, uint32_t T, uint64_t seed);
void zr_data_free(zr_data *d);
const char *zr_data_describe(const zr_data *d); /* "synthetic corpus (1048576 tokens)" ... */
uint64_t zr_data_tokens(const zr_data *d);
/* The vocabulary a token file's header names (ztok writes it), 0 when not said (llm.c's files,
 * raw bytes, the synthetic corpus). */
uint32_t zr_data_vocab(const zr_data *d);
/* 1 when the tokens are bytes (a file read as raw bytes, or the synthetic corpus), 0 for a
 * token file. */
int zr_data_is_bytes(const zr_data *d);
void zr_data_sample(const zr_data *d, uint64_t index, int32_t *tokens /* T+1 */);
/*
 * Validation data. zr_data_hold_out splits d: a file's last tenth of tokens (rounded down)
 * becomes *val, and d's samples come from the first part only from then on (zr_data_tokens
 * drops accordingly); the synthetic corpus holds out its own continuation (131072 more tokens
 * of the same text, generated past the 1048576 that training samples, which stay as they
 * are). *val borrows d's tokens: free it before d. ZR_EINVAL when either part would be shorter
 * than T+1 tokens, or d was split already.
 * zr_data_window: sequence i of `count` evenly spaced ones (the T+1 tokens at
 * floor(i (N - T) / count)), independent of the seed: a fixed evaluation set.
 */
int zr_data_hold_out(zr_data **val, zr_data *d);
void zr_data_window(const zr_data *d, uint64_t i, uint64_t count, int32_t *tokens /* T+1 */);

/* ---------------------------------------------------------------- generation (generate.c) */

/*
 * Inference with a KV cache over a full fp32 parameter arena in the layout of zr_gpt2_offsets
 * (what zr_model_param(m, 0) starts, or a checkpoint's "param" state of every group read end to
 * end): borrowed, it must outlive the generator. The cache holds the keys and values of up to
 * ctx positions per layer. ZR_EINVAL for a config zr_gpt2_offsets_get refuses, ZR_ENOMEM.
 */
typedef struct zr_gen zr_gen;
int zr_gen_new(zr_gen **out, const zr_gpt2_config *c, const float *params);
void zr_gen_free(zr_gen *g);
void zr_gen_reset(zr_gen *g);          /* empty the cache */
size_t zr_gen_pos(const zr_gen *g);    /* positions in the cache */
/* Feed n >= 1 tokens at positions pos .. pos+n-1 (pos + n <= ctx), each costing one position's
 * forward against the cache; *logits (may be NULL): the logits [V] of the last one (borrowed,
 * valid until the next feed). They equal zr_model_forward's at that position up to float
 * rounding. ZR_EINVAL for ids out of the vocabulary or positions past ctx (nothing fed). */
int zr_gen_feed(zr_gen *g, const int32_t *tok, size_t n, const float **logits);

/* splitmix64: the same numbers for a seed on every machine (integer arithmetic only). */
typedef struct {
    uint64_t s;
} zr_rng;
void zr_rng_seed(zr_rng *r, uint64_t seed);
uint64_t zr_rng_next(zr_rng *r);
double zr_rng_uniform(zr_rng *r); /* [0, 1), 53 bits of one draw */

typedef struct {
    float temperature;  /* 0: greedy (argmax, the lowest id on a tie) */
    uint32_t top_k;     /* sample among the k largest logits; 0: all */
    float top_p;        /* nucleus, after temperature and top_k: sample among the fewest most
                           likely tokens whose probabilities sum to at least top_p (0 < top_p
                           <= 1; 1: off) */
    uint64_t seed;      /* zr_gen_run's RNG */
    int32_t eos;        /* zr_gen_run stops after generating this id (end of text); -1: never */
    void (*emit)(void *ctx, int32_t id); /* zr_gen_run: each new token as it comes, or NULL */
    void *emit_ctx;
    float *logprobs;    /* zr_gen_run: [n_new], each new token's log-probability under the
                           model (log-softmax of its logits, before temperature), or NULL */
    size_t *n_out;      /* zr_gen_run: the tokens generated (n_new, fewer when eos came), or
                           NULL */
} zr_sample_opts;
#define ZR_SAMPLE_OPTS_INIT {.temperature = 0.8f, .top_k = 40, .top_p = 1.0f, .seed = 1337, \
                             .eos = -1}

/* One token from logits [V]: the argmax at temperature 0 (or top_k 1), else drawn from
 * softmax(logits / temperature) over the top_k largest (ties: lower id first), cut to the
 * nucleus of top_p (the order of Hugging Face transformers: temperature, top-k, top-p), with one
 * draw of rng. ZR_EINVAL for a negative temperature, a top_p outside (0, 1] or a logit that is
 * not finite. */
int zr_sample_token(int32_t *out, const float *logits, uint32_t V, const zr_sample_opts *o,
                    zr_rng *rng);
/* log softmax(logits [V])[id]: the log-probability of id under the model (<= 0). */
double zr_logprob(const float *logits, uint32_t V, int32_t id);
/* Continue prompt [n_prompt] (1..ctx tokens) by n_new tokens into out[n_new], from an empty
 * cache, the RNG seeded with o->seed; it stops early after a token o->eos (which is kept in
 * out; *o->n_out says how many). Past ctx positions the window slides: the cache is
 * recomputed from the newest ctx/2 tokens of the text, so the cost stays linear in n_new.
 * ZR_EINVAL for an empty or too long prompt or an id out of the vocabulary. */
int zr_gen_run(zr_gen *g, int32_t *out, const int32_t *prompt, size_t n_prompt, size_t n_new,
               const zr_sample_opts *o);
/* The parameters of a checkpoint (its directory, or a run directory through latest; any world
 * size, ZeRO stage or shard layout: zck_reader_read), only the "param" state, every shard file
 * it touches hashed against the manifest while reading (jobs files at once). *out: a malloc'ed
 * arena for zr_gen_new (free()), *cfg the model section's config. ZR_ENOTFOUND, ZR_ECORRUPT
 * (a damaged checkpoint: the file named), ZR_EVERSION, ZR_EINVAL (not a GPT-2 of the family
 * table, no f32 params), ZR_ENOMEM. */
int zr_gen_load_params(float **out, zr_gpt2_config *cfg, const char *path, unsigned jobs);
/* The bytes of text[len] as ids (the byte-level models' encoding) into *ids (malloc'ed, n = len).
 * ZR_ENOMEM. */
int zr_gen_bytes_encode(int32_t **ids, const char *text, size_t len);
/* Ids as bytes (the byte-level models: id < 256 is that byte; any other id "<|id|>") into out
 * (NUL-terminated, cut at cap; 16 n + 1 bytes always suffice). Returns the bytes written
 * without the NUL (the text may hold NUL bytes). */
size_t zr_gen_bytes_decode(char *out, size_t cap, const int32_t *ids, size_t n);
/* s[n] as valid UTF-8 into out (room for 3 n + 1): each byte that does not start a well-formed
 * sequence becomes U+FFFD. Returns the bytes written without the NUL (NUL bytes of s stay). */
size_t zr_gen_utf8_repair(char *out, const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
