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
    /* this invocation's id in the --log-json records and the checkpoint's training section
     * (zrun: random per invocation, ZR_RUN_ID for its ranks); NULL: one made here */
    const char *run_id;
} zr_train_opts;
enum { ZR_DEVICE_CPU = 0, ZR_DEVICE_CUDA = 1, ZR_DEVICE_AUTO = 2 };
enum { ZR_VERIFY_FULL = 0, ZR_VERIFY_QUICK = 1, ZR_VERIFY_OFF = 2 };
enum { ZR_OFFLOAD_NONE = 0, ZR_OFFLOAD_CPU = 1, ZR_OFFLOAD_NVME = 2 };
#define ZR_TRAIN_OPTS_INIT                                                                     \
    {NULL, "synthetic", 8, 0, 0, 200, 1e-3f, 0.1f, 20, 0.1f, 1.0f, 1337, "runs/default", 0, 3, \
     "auto", NULL, 2, 0, 0.0, 0, NULL, NULL, 2, 0, 0, NULL, 8, 4, (size_t)1 << 20, -1,       \
     ZR_VERIFY_FULL, ZR_DEVICE_CPU, NULL}

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
    {1, 0, 0, 1, 0, NULL, 0, 1.0, "runs/default", ZR_VERIFY_FULL, 2, NULL, NULL, NULL, NULL}

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
