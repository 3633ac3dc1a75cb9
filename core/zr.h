/*
 * zr.h: the public interface of core/, the training engine: the GPT-2 model (forward and
 * backward in C, matmuls through BLAS), AdamW, the LR schedule, data, and the training loop
 * that saves and resumes through ckpt/ (zck.h). core/ uses only ckpt/'s public API.
 *
 * Conventions are ckpt's: 0 or a negative ZR_E* code with a one-line message (zr_err_msg()),
 * outputs through the first argument, the library never prints errors and never exits (the
 * training loop's per-step log line goes to a caller-chosen stream).
 */
#ifndef ZR_H
#define ZR_H

#include "zck.h"

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- model configuration */

typedef struct {
    uint32_t layers, heads, dim, ctx, vocab; /* L, NH, C, maximum T, V */
} zr_gpt2_config;

/*
 * "tiny" (L=4, NH=4, C=128, T=128, V=256: the default run), "gpt2" (12, 12, 768, 1024, 50257),
 * "gpt2-medium" (24, 16, 1024, 1024, 50257), or fields: "gpt2:layers=4,heads=4,dim=256,ctx=128,
 * vocab=256" (fields not given keep the tiny values). ZR_EINVAL naming the bad part; dim must
 * be a multiple of heads.
 */
int zr_gpt2_config_parse(zr_gpt2_config *out, const char *spec);
/* The manifest's model section, exactly as formats/ writes it:
 * {"arch":"gpt2","layers":L,"heads":NH,"dim":C,"ctx":T,"vocab":V}. */
int zr_gpt2_config_to_json(char **out, const zr_gpt2_config *c);
int zr_gpt2_config_from_json(zr_gpt2_config *out, const char *json);
/* The checkpoint layout: the GPT-2 naming contract of docs/FORMAT.md (the same groups, tensor
 * names, shapes [out, in] and states param/exp_avg/exp_avg_sq f32 as zfmt_gpt2_layout). */
int zr_gpt2_layout(zck_layout **out, const zr_gpt2_config *c);

/* ---------------------------------------------------------------- model */

/*
 * The model owns one parameter arena and one gradient arena (huge-page advised), each holding
 * the groups of zr_gpt2_layout end to end in layout order: group g's tensors are contiguous at
 * zr_model_param(m, g), in the layout's tensor order and shapes, row-major. Activations for up
 * to max_B sequences of up to ctx tokens are allocated once at creation and reused.
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
 */
typedef struct {
    void *ctx;
    int (*params)(void *ctx, size_t g, const float **out);
    void (*params_done)(void *ctx, size_t g);
    int (*grads)(void *ctx, size_t g, float **out);
    int (*grads_done)(void *ctx, size_t g);
} zr_model_hooks;
/* As zr_model_new, activations sized for max_T <= ctx tokens per sequence, with hooks (or
 * NULL). */
int zr_model_new_ext(zr_model **out, const zr_gpt2_config *c, size_t max_B, size_t max_T,
                     const zr_model_hooks *hooks);
/* The groups a forward (backward 0) or backward (1) asks for, in order, into order[] (room for
 * layers + 4); returns the count. A group may appear twice (wte: embedding and head). */
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
 * and biases 0. Deterministic: same seed, same bits, and each element depends only on (seed,
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
/* Probabilities of the last forward, [B*T, V] (borrowed, valid until the next forward). */
const float *zr_model_probs(const zr_model *m);
void zr_model_zero_grad(zr_model *m);
/* Backward of the last forward (which had targets): grads += scale * d(mean loss)/d(params).
 * The trainer passes scale = 1 / micro-batches so accumulated grads are those of the mean
 * loss over the whole global batch. */
int zr_model_backward(zr_model *m, float scale);
/* Bytes held: parameters, gradients (0 for a lent side), activations (the memory report). */
/* The activation bytes a model would allocate for max_B x max_T, without allocating. */
uint64_t zr_model_activation_bytes(const zr_gpt2_config *c, size_t max_B, size_t max_T);
void zr_model_bytes(const zr_model *m, uint64_t *params, uint64_t *grads, uint64_t *acts);
/* BLAS threads (and any other threads the model uses). */
void zr_set_threads(int n);

/* ---------------------------------------------------------------- optimizer */

typedef struct {
    float beta1, beta2, eps, weight_decay;
} zr_adamw_hp;
#define ZR_ADAMW_HP_INIT {0.9f, 0.95f, 1e-8f, 0.1f}

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
void zr_data_sample(const zr_data *d, uint64_t index, int32_t *tokens /* T+1 */);

/* ---------------------------------------------------------------- training */

typedef struct {
    const char *model;       /* zr_gpt2_config_parse spec; NULL: the checkpoint's when resuming,
                                else "tiny" */
    const char *data;        /* "synthetic" (default) or a file */
    uint32_t batch;          /* global batch, sequences per optimizer step */
    uint32_t micro_batch;    /* sequences per forward on each rank; 0: the rank's whole share
                                (batch / world) */
    uint32_t seq;            /* tokens per sequence; 0: the model's ctx */
    uint64_t steps;          /* optimizer steps of the whole run: the LR schedule's horizon */
    float lr, min_lr_ratio;
    uint64_t warmup;
    float weight_decay, grad_clip; /* grad_clip 0: no clipping */
    uint64_t seed;
    const char *ckpt_dir;    /* run directory */
    uint64_t save_every;     /* 0: only at the end */
    unsigned keep_last;      /* 0: keep every checkpoint */
    const char *resume;      /* "auto" (latest when present), "never", or a checkpoint path */
    const char *log_json;    /* one JSON object per step appended here, or NULL */
    int threads;
    uint64_t stop_after;     /* end this invocation after this many more steps (0: no limit) */
    double time_limit;       /* seconds: save and stop before this wall-clock budget (0: none) */
    int zero_stage;          /* 0-3: what each rank holds (see docs/ARCHITECTURE.md) */
    FILE *log;               /* a line per step and a summary, or NULL */
    volatile int *stop;      /* set asynchronously (signal): finish the step, save, return */
    unsigned prefetch;       /* ZeRO-3: group gathers in flight ahead of use */
    /* offload (ZR_OFFLOAD_*): optimizer states, and at stage 3 parameter partitions; on the CPU
     * device "cpu" is where they are anyway. nvme: swap files in <nvme_path>/zrun-swap-rank<r>,
     * aio_block bytes per request and staging chunk, aio_depth requests in flight,
     * offload_buffers staging sets (>= 2). */
    int offload_optimizer, offload_params;
    const char *nvme_path;
    unsigned aio_depth, offload_buffers;
    size_t aio_block;
    /* saves: asynchronous (1: a snapshot of each rank's partitions into host staging, then a
     * background writer; committed at a later step boundary once every rank's shard is
     * durable), synchronous (0), or -1: asynchronous unless states are offloaded to NVMe
     * (the staging copy would bring back the memory offload freed); how a resume verifies the
     * checkpoint (ZR_VERIFY_*) */
    int async_save;
    int verify_on_resume;
    /* where the model trains (ZR_DEVICE_*): the CPU engine, a CUDA GPU per rank (the backend
     * library, device.h; ranks beyond the GPUs share them), or auto: cuda when a GPU can be
     * used, else cpu */
    int device;
} zr_train_opts;
enum { ZR_DEVICE_CPU = 0, ZR_DEVICE_CUDA = 1, ZR_DEVICE_AUTO = 2 };
enum { ZR_VERIFY_FULL = 0, ZR_VERIFY_QUICK = 1, ZR_VERIFY_OFF = 2 };
enum { ZR_OFFLOAD_NONE = 0, ZR_OFFLOAD_CPU = 1, ZR_OFFLOAD_NVME = 2 };
#define ZR_TRAIN_OPTS_INIT                                                                     \
    {NULL, "synthetic", 8, 0, 0, 200, 1e-3f, 0.1f, 20, 0.1f, 1.0f, 1337, "runs/default", 0, 3, \
     "auto", NULL, 2, 0, 0.0, 0, NULL, NULL, 2, 0, 0, NULL, 8, 4, (size_t)1 << 20, -1,       \
     ZR_VERIFY_FULL, ZR_DEVICE_CPU}

typedef struct {
    uint64_t step;           /* optimizer steps completed */
    uint64_t start_step;     /* where this invocation began */
    float loss;              /* loss of the last step */
    char ckpt[4096];         /* the last checkpoint written ("" if none) */
    int stopped;             /* 1 when stopped early (signal, --stop-after, time limit) */
} zr_train_result;

/* Train (resuming per opts->resume), save every save_every steps and at the end or when
 * stopped. A bad config, missing data, a checkpoint of another model shape, or a corrupt
 * checkpoint fails before any step, naming what and where. The world is the launcher's
 * (ZR_RANK / ZR_WORLD / ZR_COMM_SHM in the environment, see zr_launch), else one rank; every
 * rank calls zr_train with the same options, and rank 0 alone logs and commits. A rank's
 * failure is every rank's: each returns an error naming the rank that failed first. */
int zr_train(zr_train_result *out, const zr_train_opts *opts);
/* Print the per-rank memory a run of these options would hold at this world size (params,
 * grads, optimizer states, buffers, activations, against the ZeRO formula), allocating
 * nothing. */
int zr_train_dry_run(const zr_train_opts *opts, int world, FILE *out);

/* ---------------------------------------------------------------- launcher */

/*
 * Run nproc ranks of a program on this node (shm communicator) and wait for them.
 * zr_launch creates the communicator segment (nproc > 1), then starts nproc children that
 * execve(argv[0], argv) (a path: no PATH search) with ZR_RANK=r, ZR_WORLD=nproc,
 * ZR_LOCAL_RANK=r and ZR_COMM_SHM=<segment name> in their environment (ZR_COMM_SHM absent at
 * nproc 1; several nodes: see nnodes below), stdin on
 * /dev/null, every descriptor above 2 closed, each in a process group of its own (so a terminal's Ctrl-C reaches the launcher
 * alone, which forwards it once), and a parent-death signal of SIGTERM.
 *
 * Output (nproc > 1): each rank's stdout and stderr come through pipes and are copied line by
 * line to the launcher's stdout and stderr, each line prefixed "[rank r] "; stderr of every
 * rank is shown, stdout of rank 0 only unless log_all_ranks. A partial last line is completed
 * with a newline at EOF; a line longer than 64 KiB is cut into lines of 64 KiB. At nproc 1 the
 * child writes to the launcher's stdout and stderr directly (no prefix, no pipes).
 *
 * Signals: SIGINT, SIGTERM and SIGUSR1 received by the launcher while it runs are forwarded to
 * every rank's process group (zr_launch installs handlers for them and SIGCHLD and restores the
 * previous ones before it returns; one zr_launch at a time per process).
 *
 * Failure: when a rank exits non-zero or is killed while others run, the launcher marks the
 * segment aborted (the others' collectives fail at once naming that rank), prints
 * "zrun: rank R exited with status S" or "zrun: rank R was killed by signal N (SIGKILL)" to
 * stderr (nproc > 1; the first failing rank only), sends SIGTERM to every rank's process group,
 * and SIGKILL to what is left after kill_grace_s seconds (at once when kill_grace_s <= 0).
 *
 * *exit_code: 0 when every rank exited 0; otherwise the first failing rank's status as a shell
 * reports it: its exit status, or 128 + N when killed by signal N. The segment is unlinked
 * before zr_launch returns, in every case. Returns 0 when the ranks ran (whatever they
 * returned), or ZR_EINVAL / ZR_EIO / ZR_ENOMEM when the launch itself failed (options, shared
 * memory, pipes, fork); ranks already started are then killed and reaped. A rank whose execve
 * fails prints why and exits 127.
 */
typedef struct {
    int nproc;           /* ranks, >= 1 */
    int log_all_ranks;   /* show every rank's stdout, not only rank 0's */
    double kill_grace_s; /* SIGTERM to SIGKILL, after a failure */
    /* several nodes (nnodes > 1): this launcher runs global ranks node_rank nproc ..
     * node_rank nproc + nproc - 1 of a world of nnodes nproc, connected over TCP through
     * master ("HOST:PORT", where global rank 0 listens) instead of shared memory
     * (ZR_COMM_TCP in the ranks' environment); output prefixes and messages name global
     * ranks. The other nodes' launchers are started the same way; a rank that fails on one
     * node makes the ranks of the others fail when their connections close. */
    int nnodes, node_rank;
    const char *master;
} zr_launch_opts;
#define ZR_LAUNCH_OPTS_INIT {1, 0, 5.0, 1, 0, NULL}

int zr_launch(int *exit_code, const zr_launch_opts *o, char *const argv[]);

#ifdef __cplusplus
}
#endif
#endif
