/*
 * train.h: the training loop of core/ (part of the public zr.h): options, the loop that trains,
 * saves and resumes through ckpt/, and the dry run's memory plan.
 */
#ifndef ZR_TRAIN_H
#define ZR_TRAIN_H

#include "zck.h"

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- training */

/* A tokenizer for the samples' text, given by the caller (zrun passes formats/' byte-level
 * BPE; core/ does not read tokenizer.json itself): open a codec of a tokenizer.json's bytes,
 * encode text into ids (*ids malloc'ed), decode ids into bytes (*text malloc'ed), close. Each
 * returns 0 or a ZR_E* code with the message set. */
typedef struct zr_text_codec {
    int (*open)(void **ctx, const char *json, size_t n_bytes);
    int (*encode)(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n);
    int (*decode)(void *ctx, const int32_t *ids, size_t n, char **text, size_t *len);
    void (*close)(void *ctx);
} zr_text_codec;

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
    uint64_t max_live_params; /* ZeRO 2-3 on the CPU: the ordinary gather and gradient buffers'
                              * parameters at most (0: a quarter of the rank's partition; zero.h) */
    /* offload (model.h's ZR_OFFLOAD_*): optimizer states, and at stage 3 parameter partitions;
     * on the CPU device "cpu" is where they are anyway. nvme: swap files in
     * <nvme_path>/zrun-swap-rank<r>, aio_block bytes per request and staging chunk, aio_depth
     * requests in flight, offload_buffers staging sets (>= 2). */
    int offload_optimizer, offload_params;
    /* what the forward keeps for the backward (model.h's ZR_RECOMPUTE_*: none, layer,
     * selective); the CPU engine only */
    int recompute;
    const char *nvme_path;
    unsigned aio_depth, offload_buffers;
    size_t aio_block;
    /* saves: asynchronous (1: a snapshot of each rank's partitions into host staging, then a
     * background writer; committed at a later step boundary once every rank's shard is
     * durable), synchronous (0), or -1: asynchronous unless states are offloaded to NVMe
     * (the staging copy would bring back the memory offload freed); how a resume verifies the
     * checkpoint (ZR_VERIFY_*) */
    int async_save;
    /* asynchronous saves on the CPU engine: no copy of the states; chunks not yet written
     * when the next optimizer update comes are copied into a buffer of at most this many
     * bytes per rank (0: the larger of 64 MiB and 5 % of the rank's states; else >= 4096) */
    size_t save_buffer;
    int verify_on_resume;
    /* where the model trains (ZR_DEVICE_*): the CPU engine, a CUDA GPU per rank (the backend
     * library, device.h; ranks beyond the GPUs share them), or auto: cuda when a GPU can be
     * used, else cpu */
    int device;
    /* this invocation's id in the --log-json records and the checkpoint's training section
     * (zrun: random per invocation, ZR_RUN_ID for its ranks); NULL: one made here */
    const char *run_id;
    /* samples during training: every sample_every steps (0: none) rank 0 prints the greedy
     * continuation of sample_prompt (bytes as token ids; NULL: "the ") by sample_tokens tokens
     * after the step line, and logs it as a "sample" event in the JSON log; every rank takes
     * part (at stage 3 the parameters are gathered to rank 0) */
    uint64_t sample_every;
    const char *sample_prompt;
    uint32_t sample_tokens;
    /* validation (zrun --eval-every): every eval_every steps (0: never) and at the last step,
     * the mean loss over eval_batches x batch fixed sequences of val_data (NULL: the held-out
     * part of data, which training never samples; see zr_data_hold_out) */
    uint64_t eval_every;
    uint32_t eval_batches;
    const char *val_data;
    /* the run's tokenizer.json (zrun --tokenizer; NULL: none given): its bytes are recorded in
     * every checkpoint as "tokenizer.json" (zck_extra_file), and tokenizer_vocab (its largest
     * id + 1) must not exceed the model's vocabulary, checked before any step. A resume without
     * one keeps the checkpoint's. */
    const char *tokenizer_json;
    size_t tokenizer_bytes;
    uint32_t tokenizer_vocab;
    const char *tokenizer_path; /* for messages */
    /* how samples (sample_every) turn text into token ids and back when the run has a
     * tokenizer (the one given above, or the checkpoint's on a resume); NULL, or no tokenizer:
     * the prompt's bytes are its ids */
    const struct zr_text_codec *text_codec;
} zr_train_opts;
enum { ZR_DEVICE_CPU = 0, ZR_DEVICE_CUDA = 1, ZR_DEVICE_AUTO = 2 };
enum { ZR_VERIFY_FULL = 0, ZR_VERIFY_QUICK = 1, ZR_VERIFY_OFF = 2 };
#define ZR_TRAIN_OPTS_INIT                                                                     \
    {.data = "synthetic", .batch = 8, .steps = 200, .lr = 1e-3f, .min_lr_ratio = 0.1f,         \
     .warmup = 20, .weight_decay = 0.1f, .grad_clip = 1.0f, .seed = 1337,                      \
     .ckpt_dir = "runs/default", .keep_last = 3, .resume = "auto", .threads = 2,               \
     .prefetch = 2, .offload_optimizer = ZR_OFFLOAD_NONE, .offload_params = ZR_OFFLOAD_NONE,   \
     .aio_depth = 8, .offload_buffers = 4, .aio_block = (size_t)1 << 20, .async_save = -1,     \
     .verify_on_resume = ZR_VERIFY_FULL, .device = ZR_DEVICE_CPU, .sample_tokens = 32,       \
     .eval_batches = 8}

typedef struct {
    uint64_t step;           /* optimizer steps completed */
    uint64_t start_step;     /* where this invocation began */
    float loss;              /* loss of the last step */
    char ckpt[4096];         /* the last checkpoint written ("" if none) */
    int stopped;             /* 1 when stopped early (signal, --stop-after, time limit) */
    int ckpt_error;          /* on failure, 1 when the error came from the checkpoint's part of
                                the start: picking, opening, verifying or loading the checkpoint
                                to resume from (and the model and tokenizer checks beside them);
                                0 when from the data, the engine or later. A ZR_ECORRUPT with 1
                                is a damaged checkpoint (zrun's hint: verify it) */
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
 * nothing: zr_train_mem_plan, then zr_mem_plan_print. */
int zr_train_dry_run(const zr_train_opts *opts, int world, FILE *out);
/* The same as one JSON object (zr_mem_plan_json). */
int zr_train_dry_run_json(const zr_train_opts *opts, int world, FILE *out);

/* zrun --memory-limit: a configuration the planner considered (zr_train_plan_memory). */
typedef struct {
    uint32_t micro_batch;
    int zero_stage, recompute, offload_optimizer, offload_params;
    uint64_t bytes;          /* the dry run's peak per rank (the largest rank's total) */
    double cost;             /* the speed model's step time, relative (planner.c) */
} zr_plan_pick;
/* The fastest configuration of o (its stage, micro-batch, recompute and offload options
 * replaced; NVMe only with o->nvme_path) whose dry-run peak per rank is at most limit bytes
 * at this world size: *out, and *runner_up (may be NULL; zeroed when there is none): the
 * fastest that did not fit when it is faster, else the next best that fits. Said on log (may
 * be NULL): the choice, its bytes and the runner-up rejected and why. ZR_EINVAL, naming the
 * smallest limit that would work, when nothing fits; the errors of zr_train_mem_plan for o. */
int zr_train_plan_memory(zr_plan_pick *out, zr_plan_pick *runner_up, const zr_train_opts *o,
                         int world, uint64_t limit, FILE *log);
/* "--zero 3 --micro-batch 4 --recompute layer [--offload-optimizer nvme ...]" into buf */
void zr_plan_pick_print(const zr_plan_pick *c, char *buf, size_t cap);

/* One rank's bytes by category, as the dry run counts them. */
typedef struct {
    uint64_t params, grads, optimizer, buffers, activations, total;
    /* of buffers: the NVMe swap staging (the rest: gather and gradient buffers); and besides:
     * asynchronous saves' host staging (the CPU: the bounded buffer), pinned host memory (a
     * GPU), the process's own (code, libraries, BLAS and communication buffers, the data) */
    uint64_t swap_staging, save_staging, pinned, baseline;
} zr_rank_mem;

typedef struct {
    char *from;              /* the checkpoint a resume would read (opts->resume), or NULL */
    uint32_t layers, micro_batch, seq;
    int llama;               /* the model family: GPT-2 (0) or Llama (1) */
    int recompute;           /* ZR_RECOMPUTE_*: what the activations keep */
    uint64_t numel;          /* parameters */
    int zero_stage, world, on_gpu;
    double per_param[2];     /* the ZeRO formula: a + b / W bytes per parameter */
    double formula_bytes;    /* that formula for this model and world, per rank */
    zr_rank_mem *rank;       /* [world] */
} zr_mem_plan;

/* The dry run's accounting without printing: the same checks of the options and the world as
 * zr_train, the checkpoint opts->resume names (a run directory's pick is made with nothing
 * moved), the model, then each rank's bytes (zr_zero_plan). *out is the caller's to release
 * with zr_mem_plan_free (also on failure, when it holds nothing). ZR_EINVAL for an option. */
int zr_train_mem_plan(zr_mem_plan *out, const zr_train_opts *opts, int world);
void zr_mem_plan_print(const zr_mem_plan *p, FILE *out); /* zrun --dry-run's table */
void zr_mem_plan_json(const zr_mem_plan *p, FILE *out);  /* zrun --dry-run --json */
void zr_mem_plan_free(zr_mem_plan *p); /* its members; accepts NULL */

/* ---------------------------------------------------------------- plots */

typedef struct {
    size_t records;          /* step records drawn */
    size_t skipped;          /* lines that were not a JSON object (a truncated last line) */
    size_t marks;            /* resumes and world-size changes marked */
} zr_plot_info;

/* Draw the JSON log at log_path (zrun --log-json's records) as an SVG at svg_path: panels for
 * the loss (training and validation), the learning rate and tokens/s against the step, each
 * invocation's steps a line of its own, resumes and world-size changes marked by labelled
 * vertical lines; long logs decimated (each series keeps the lowest and highest of each bucket
 * of points). Lines that are not JSON objects and values that are not finite are skipped. The
 * file is written beside svg_path and renamed over it. ZR_ENOTFOUND for a missing log,
 * ZR_ECORRUPT for one that is not a regular file, ZR_EINVAL when it has no step record or
 * svg_path is the log itself (zr_plot_check_target), I/O errors naming the file. info (may be
 * NULL): what was drawn. */
int zr_plot_write(zr_plot_info *info, const char *log_path, const char *svg_path);
/* ZR_EINVAL naming both when svg_path is the log at log_path (the same device and inode): the
 * drawing renamed over it would replace the log. 0 otherwise (also when either is missing). */
int zr_plot_check_target(const char *log_path, const char *svg_path);

/* ---------------------------------------------------------------- the audit before a resume */

typedef struct {
    uint32_t world;          /* ranks of the resume; 0: the checkpoint's */
    int zero_stage;          /* -1: the checkpoint's */
    uint32_t batch;          /* global batch; 0: the checkpoint's training section, else 8 */
    const char *model;       /* a zr_gpt2_config_parse spec; NULL: the checkpoint's */
    unsigned jobs;           /* files hashed in parallel */
    uint64_t memory_limit;   /* bytes per rank: what zrun --memory-limit would pick (0: no) */
} zr_audit_opts;
#define ZR_AUDIT_OPTS_INIT {0, -1, 0, NULL, 2, 0}

typedef struct {
    char *ckpt;              /* the checkpoint a resume would read; NULL: none */
    int picked;              /* 1: picked from a run directory by zck_resume_pick */
    uint64_t step;           /* its step */
    zck_namelist said;       /* the resume policy's lines (newer damaged checkpoints that a
                                resume would move aside, an interrupted commit) */
    zck_report *report;      /* the full verification of ckpt: of a pick, empty (the pick
                                is zck_verify's full check); NULL without a checkpoint */
    zck_namelist reasons;    /* why a resume would fail, one line each; none: resumable */
    uint32_t world, batch;   /* what was checked (options, else the checkpoint's) */
    int zero_stage;
    char model[128];         /* "layers 2 heads 2 dim 64 ctx 64 vocab 256", "" when unknown */
    int has_mem;             /* mem holds the plan (the checks it needs passed) */
    zr_mem_plan mem;
    /* with memory_limit: the planner's choice and runner-up (has_pick; runner_up's
     * micro_batch 0: none); when nothing fits, a reason names the smallest limit */
    int has_pick;
    zr_plan_pick pick, runner_up;
} zr_audit;

/* Whether a resume from path (a run directory: the checkpoint zck_resume_pick would pick, in a
 * dry run that moves nothing; or a checkpoint directory) would succeed at o's world, stage,
 * batch and model: the checkpoint verified in full, then the same checks zr_train applies
 * before a resume (its option and world checks, the communicator's world limit, the model
 * against the checkpoint's shape and layout, the sequence length), a live job holding the run
 * directory, and the memory per rank (zr_train_mem_plan). Returns 0 when the audit ran,
 * whatever it found (*out's reasons empty: resumable); ZR_ENOTFOUND when path does not exist,
 * ZR_EINVAL for bad options, I/O errors as they come. Free *out with zr_audit_free. */
int zr_audit_run(zr_audit **out, const char *path, const zr_audit_opts *o);
void zr_audit_free(zr_audit *a);

/* ---------------------------------------------------------------- restarts */

typedef struct {
    int nproc;               /* ranks of the first launch (>= 1) */
    int nproc_on_restart;    /* ranks from the first restart on (0: nproc) */
    int log_all_ranks;       /* zr_launch_opts.log_all_ranks */
    int nnodes, node_rank;   /* zr_launch_opts: several nodes */
    const char *master;
    unsigned max_restarts;   /* restarts after a failed job (0: none) */
    double backoff_s;        /* seconds before a restart, 0..86400 */
    const char *ckpt_dir;    /* the run directory a restart resumes from */
    int verify;              /* ZR_VERIFY_*: how the restart checks the checkpoints */
    unsigned jobs;           /* files hashed in parallel for that check */
    const char *program;     /* the ranks' executable (a path); NULL: this program */
    volatile int *stop;      /* set asynchronously (a signal): no restart after this launch */
    FILE *log;               /* a line per restart and per damaged checkpoint, or NULL */
    const char *name;        /* prefix of those lines ("zrun" -> "zrun: restart 1 of 2 ..."),
                                or NULL */
} zr_supervise_opts;
#define ZR_SUPERVISE_OPTS_INIT                                                                 \
    {.nproc = 1, .nnodes = 1, .backoff_s = 1.0, .ckpt_dir = "runs/default",                   \
     .verify = ZR_VERIFY_FULL, .jobs = 2}

/* Run a job and restart it when it fails: start the ranks with zr_launch (o->nproc, nodes,
 * output as zr_launch says; argv is the ranks' argument vector, argv[0] replaced by
 * o->program); when the job fails and restarts are left, pick the checkpoint with
 * zck_resume_pick (o->ckpt_dir, o->verify: damaged newer ones are moved aside, each said on
 * o->log), wait o->backoff_s (cut short by *o->stop, which then ends the job), and start the
 * ranks again with "--resume PATH" (no checkpoint yet: nothing) and "--nproc N" appended.
 * *exit_code: the last job's status as zr_launch reports it (0: the job succeeded). Returns 0
 * when the jobs ran, whatever they returned; ZR_ECORRUPT when the run directory has
 * checkpoints but none verifies (no fresh start from scratch); ZR_EINVAL for bad options; the
 * errors of zr_launch when a launch itself failed. */
int zr_supervise(int *exit_code, const zr_supervise_opts *o, char *const argv[]);

#ifdef __cplusplus
}
#endif
#endif
