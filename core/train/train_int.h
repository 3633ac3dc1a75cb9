/*
 * train_int.h: internal to core/train (double underscore: not for cli/). First the checks of
 * a run that the audit (audit.c) applies too, so that both refuse the same resumes with the
 * same words: each returns 0 or ZR_EINVAL (resume_path: the errors of zck_resume_pick) with
 * the message zr_train would give. Then one run's state (run) and the functions the files of
 * zr_train share: collective.c, save.c, resume.c, engine.c, tokenizer.c, jsonlog.c, sample.c.
 */
#ifndef ZR_TRAIN_INT_H
#define ZR_TRAIN_INT_H

#include "model.h"
#include "section.h"
#include "train.h"
#include "zero.h"
#include "comm.h"
#include "device.h"
#include "eval.h"
#include "sample.h"
#include "saver.h"

#include <stdio.h>
#include <time.h>

/* Every option, whatever the world size: the first bad one named. */
int zr_train__check_opts(const zr_train_opts *o);
/* The options that depend on the world size W (batch and micro-batch shares). */
int zr_train__check_world(const zr_train_opts *o, int W);
/* The model: o->model (refused when rd holds another shape), else rd's, else tiny. */
int zr_train__pick_config(zr_gpt2_config *cfg, const zr_train_opts *o, zck_reader *rd);
/* The checkpoint's layout ck against the model's: groups, sizes, tensors, f32 states. */
int zr_train__check_layout(const zck_layout *ck, const zck_layout *want, const char *path);
/* The sequence length: o->seq, else the model's context, which it may not exceed. */
int zr_train__seq(uint32_t *out, const zr_train_opts *o, const zr_gpt2_config *cfg);
/* What o->resume resumes from (*out NULL: a fresh start); "auto": zck_resume_pick with
 * o->verify_on_resume, its lines on log, nothing moved when dry. */
int zr_train__resume_path(char **out, const zr_train_opts *o, FILE *log, int dry);
/* A BPE tokenizer (o's, or that of the checkpoint ck resumed from: NULL when it has none)
 * beside data read as bytes (runchecks.c): refused, naming ztok encode. */
int zr_train__check_bytes_data(const zr_train_opts *o, int data_is_bytes, const char *ck);
/* 1 when the directory of the file at path (which need not exist) is ckpt_dir or below it,
 * symbolic links on the way resolved: the JSON log is then one of the run's files, opened
 * without following a link (runchecks.c). */
int zr_train__log_in_run(const char *path, const char *ckpt_dir);
/* On a resume at step (the steps done), when o's schedule (--steps, --lr, --warmup,
 * --min-lr-ratio) differs from the one the checkpoint's training section s records: one note
 * on log giving both and the learning rate of the next step under each (runchecks.c). */
void zr_train__schedule_note(FILE *log, const zr_train__section *s, const zr_train_opts *o,
                             uint64_t step);
/* Rank 0 (lk: its lock of the run directory; NULL elsewhere: nothing done), before the first
 * save: --keep-last applied to the checkpoints already there (never what latest names, nor
 * from, the checkpoint resumed from; stale temporaries collected), so a restart with a lower K
 * after a full disk frees space first. What went is said on log; a failure is a warning. */
void zr_train__retain_at_start(FILE *log, const zck_lock *lk, const zr_train_opts *o,
                               const char *from);

/* "none", "layer" or "selective" (ZR_RECOMPUTE_*; options.c) */
const char *zr_train__recompute_name(int recompute);

/* The dry run's figures besides the engine's (memplan.c): one rank's host staging for
 * asynchronous saves (b: its zr_zero_plan; on_gpu: a pinned copy of its partitions instead of
 * the bounded buffer), and the process's own bytes (code, libraries, BLAS buffers, the data,
 * the communication segment) for this model and shape. */
uint64_t zr_train__save_staging(const zr_train_opts *o, const zr_zero_bytes *b, int on_gpu);
uint64_t zr_train__baseline(const zr_gpt2_config *cfg, uint32_t micro_batch, uint32_t seq,
                            const zr_train_opts *o, int world);

/* ---------------------------------------------------------------- one run (zr_train) */

typedef struct {
    const zr_train_opts *o;
    zr_gpt2_config cfg;
    zr_model *model;         /* the CPU model; on a device only its shape (init values) */
    const zr_device_ops *dev; /* the device (NULL: the CPU engine) */
    zr_dev_model *dmodel;    /* the model on it */
    zr_dev_comm *dcomm;      /* its communicator (NULL: none, or staged over shm) */
    char dev_name[160];      /* "cuda: NVIDIA H200 ..." for the first line */
    zck_layout *L;
    zr_comm *comm;
    zr_zero *zero;
    int rank, W;
    size_t ng;
    char *swap_dir;          /* this rank's offload directory (NULL: none) */
    char *from;              /* the checkpoint resumed from (NULL: a fresh start) */
    zck_reader *rd;          /* it, open */
    uint32_t T, mb, n_micro; /* mb: sequences per forward on this rank */
    uint64_t step, next_sample;
    int32_t *tokens, *inputs, *targets;
    zr_data *data;
    FILE *jlog, *log;        /* log: o->log on rank 0, else NULL */
    uint64_t jlog_lost;      /* the step from which the JSON log failed (0: it did not) */
    double save_s;           /* the last synchronous save's duration */
    double blocked_s;        /* how long the last save blocked training */
    zr_saver *saver;         /* asynchronous saves (NULL: synchronous) */
    zck_lock *lock;      /* rank 0: the run directory, for the job's life */
    struct {                 /* the asynchronous save in flight */
        char *staging, *train;
        uint64_t step;
        double t0, blocked_s;
        size_t copied;       /* chunks of 64 KiB copied into the bounded buffer */
    } pend;
    char run_id[40];         /* this invocation's (o->run_id, else made here) */
    char ck_run_id[40];      /* the run id recorded in the checkpoint resumed from ("": none) */
    char *ck_tokenizer;      /* the tokenizer.json of the checkpoint resumed from (NULL: none) */
    zr_train__codec codec;   /* the samples' text: the run's tokenizer, or bytes */
    size_t ck_tokenizer_bytes;
    zr_eval *eval;           /* validation data and set (--eval-every, eval.c) */
    zr_val_record val;       /* the last and best validation loss */
} run;

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Wall-clock time, ISO 8601 UTC with milliseconds: "2025-01-31T12:34:56.789Z". */
static inline const char *iso_time(char buf[32])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, 32 - n, ".%03ldZ", ts.tv_nsec / 1000000);
    return buf;
}

/* collective.c */
/* Collectives of the trainer: through the ZeRO comm thread once it runs (ordered with the
 * stage's own), on the communicator directly before. */
int zr_train__bcast(run *r, void *buf, size_t bytes, int root);
int zr_train__gather_f64(run *r, const double *mine, size_t n, double *all);
/*
 * A message that one rank sends to all: status (0 or a ZR_E* code) and text (a path, a shard
 * description or an error message). Every rank calls it with the same root; *text_out is the
 * root's text (malloc'ed). Returns the root's status, with its message set as the error.
 */
int zr_train__share_text(run *r, int root, int status, const char *text, char **text_out);
/* A rank's local result, agreed: every rank learns the first failing rank's error. When every
 * rank failed with that very message (a bad option, a checkpoint that does not fit), it stays
 * as it is, so that all ranks print the same line (the launcher prints it once, "all N
 * ranks"); otherwise every rank, that one included, says whose it is: "rank K: ...". */
int zr_train__agree(run *r, int rc);

/* save.c */
/* The asynchronous save in flight, once every rank's shard is durable (or any failed): wait
 * for this rank's writer, then commit as a synchronous save does. */
int zr_train__finish_pending(run *r, char *path_out, size_t cap);
int zr_train__save(run *r, float loss, char *path_out, size_t cap);

/* resume.c */
/* What to resume from (rank 0 decides for all; the others learn its pick or its error), then
 * the model and the shapes. Returns this rank's result, still to be agreed. */
int zr_train__pick_start(run *r);
/* The states from the checkpoint (*ckpt_error set when that fails), or each rank initializes
 * what it holds; then the JSON log and the first lines. */
int zr_train__resume_or_init(run *r, int *ckpt_error);

/* engine.c */
zr_zero_opts zr_train__zero_opts(const zr_train_opts *o);
/* failed: a collective may still be in flight on the device communicator: abort it first
 * (comm_wait aborts when its check fails while work is pending), so that freeing the model
 * and the buffers, which drains their streams, cannot wait for a peer that is gone */
void zr_train__free_run(run *r, int failed);
/* The world (the launcher's ranks, else one rank), the options it constrains, the device. */
int zr_train__open_world(run *r);
/* The data, the ZeRO engine (on the device, with its offload), the saver, the model and the
 * batch buffers. Returns this rank's result, still to be agreed. */
int zr_train__build_engine(run *r);

/* tokenizer.c */
/* The tokenizer: the one given fits the model's vocabulary; without one, a resume keeps the
 * checkpoint's tokenizer.json (read verified), recorded again in each new checkpoint. */
int zr_train__pick_tokenizer(run *r);
/* The samples' codec: the caller's over the run's tokenizer (given, or the checkpoint's),
 * else bytes. */
int zr_train__open_codec(run *r);

/* jsonlog.c */
/* This process's peak resident set, bytes. */
uint64_t zr_train__rss_peak(void);
/* After each record: the JSON log flushed. A write that failed (a full disk, /dev/full) is
 * said once on the step log and the JSON log closed: training and its checkpoints go on, and
 * the last line says the log is incomplete. */
void zr_train__json_log_flush(run *r);
/* The step's line on the terminal (before its save, if any) and, with save_ms (how long a
 * save at this step blocked training; 0 without one), its JSON line (after it). */
void zr_train__log_step(run *r, int json, float loss, float lr, float norm, double dt,
                     double save_ms);
/* r->run_id: o->run_id (only [A-Za-z0-9._-] kept, which JSON takes as it is), else 16 random
 * hex digits. */
void zr_train__set_run_id(run *r);
/* The highest step of the step records already in the JSON log (0: none, no log yet, or a
 * log that is not a regular file: a FIFO or a device such as /dev/stdout holds no history, and
 * reading one could block or never end). Only the bytes there at the start are read. */
uint64_t zr_train__logged_max_step(const char *path);
/* The JSON log opened for appending (parent directories made): a regular file, created when
 * missing, or a pipe or FIFO whose reader is already there; a FIFO nobody reads is refused at
 * once rather than waited on, and so is a file of the run directory's own. */
int zr_train__open_json_log(FILE **out, const char *path, const char *ckpt_dir);
/* A resume behind the JSON log's last step (a crash after steps the checkpoint does not hold):
 * the steps redone said, one "resume" record in the log and a line on the step log. */
void zr_train__log_redone(run *r, uint64_t logged);

/* sample.c */
const char *zr_train__sample_prompt(const zr_train_opts *o);
/* Every sample_every steps: the parameters gathered to rank 0 (every rank takes part), which
 * prints the greedy continuation of the prompt after the step line and logs it as an event. */
int zr_train__sample_now(run *r);

#endif
