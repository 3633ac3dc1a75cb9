/*
 * train.c: the training loop, at any world size and ZeRO stage (zero.h keeps the states where
 * the stage says and moves them; comm.h connects the ranks). Each optimizer step runs
 * micro-batches of samples drawn by global sample index (rank r takes its slice of each
 * micro-batch), reduces the gradients, clips by the global gradient norm and updates this
 * rank's range of every tensor with AdamW (weight decay on matrices only). Checkpoints go
 * through ckpt/ only: every rank writes its partition of params, exp_avg and exp_avg_sq of
 * every group, rank 0 commits with the model config and the training state (step, schedule,
 * data position; the run has no other randomness). A resume, at any world size and stage,
 * verifies the whole checkpoint first (each file hashed once, by one rank; every rank agrees
 * on the verdict), then reads the ranges this rank now owns straight from the old shards.
 */
#include "comm.h"
#include "device.h"
#include "sample.h"
#include "eval.h"
#include "saver.h"
#include "zero.h"
#include "model.h"
#include "section.h"
#include "train.h"
#include "train_int.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Wall-clock time, ISO 8601 UTC with milliseconds: "2025-01-31T12:34:56.789Z". */
static const char *iso_time(char buf[32])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, 32 - n, ".%03ldZ", ts.tv_nsec / 1000000);
    return buf;
}

/* ---------------------------------------------------------------- checkpoints */

static int training_json(char **out, const run *r, float loss)
{
    const zr_train_opts *o = r->o;
    /* the float32 options and loss as the shortest decimals that read back as them */
    json_t *j = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:I, s:I, s:o, s:o, s:s, "
                          "s:o, s:s}",
                          "step", (json_int_t)r->step, "optimizer_step", (json_int_t)r->step,
                          "next_sample", (json_int_t)r->next_sample, "seed", (json_int_t)o->seed,
                          "batch", (json_int_t)o->batch, "seq", (json_int_t)r->T, "lr",
                          zck_json_real_f32(o->lr), "min_lr_ratio",
                          zck_json_real_f32(o->min_lr_ratio), "warmup", (json_int_t)o->warmup,
                          "steps", (json_int_t)o->steps, "weight_decay",
                          zck_json_real_f32(o->weight_decay), "grad_clip",
                          zck_json_real_f32(o->grad_clip), "data", o->data, "loss",
                          zck_json_real_f32(loss), "run_id", r->run_id);
    if (j && zr_train__val_to_json(j, &r->val, zr_train__eval_set(r->eval)))
        json_decref(j), j = NULL;
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!s)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    *out = s;
    return 0;
}

/* This rank's shard of the checkpoint into staging; *json describes it. */
static int write_shard(run *r, const char *staging, char **json)
{
    zck_writer *w = NULL;
    zck_shard *sh = NULL;
    int rc = 0;
    ZR_TRY_GOTO(zck_writer_open(&w, staging, r->L, (uint32_t)r->W, (uint32_t)r->rank, NULL), rc,
                out);
    ZR_TRY_GOTO(zr_zero_save(r->zero, w), rc, out);
    ZR_TRY_GOTO(zck_writer_finish(w, &sh), rc, out);
    ZR_TRY_GOTO(zck_shard_to_json(json, sh), rc, out);
out:
    zck_writer_free(w);
    zck_shard_free(sh);
    return rc;
}

/*
 * A message that one rank sends to all: status (0 or a ZR_E* code) and text (a path, a shard
 * description or an error message). Every rank calls it with the same root; *text_out is the
 * root's text (malloc'ed). Returns the root's status, with its message set as the error.
 */
/* Collectives of the trainer: through the ZeRO comm thread once it runs (ordered with the
 * stage's own), on the communicator directly before. */
static int bcast(run *r, void *buf, size_t bytes, int root)
{
    return r->zero ? zr_zero_broadcast(r->zero, buf, bytes, root)
                   : zr_comm_broadcast(r->comm, buf, bytes, root);
}

static int gather_f64(run *r, const double *mine, size_t n, double *all)
{
    return r->zero ? zr_zero_gather_f64(r->zero, mine, n, all)
                   : zr_comm_all_gather(r->comm, mine, all, n, sizeof(double));
}

static int share_text(run *r, int root, int status, const char *text, char **text_out)
{
    double hdr[2] = {(double)status, text ? (double)strlen(text) : 0};
    int rc = bcast(r, hdr, sizeof hdr, root);
    if (rc)
        return rc;
    size_t len = (size_t)hdr[1];
    char *buf = malloc(len + 1);
    if (!buf)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    if (r->rank == root)
        memcpy(buf, text, len);
    buf[len] = 0;
    if (len && (rc = bcast(r, buf, len, root))) {
        free(buf);
        return rc;
    }
    if ((int)hdr[0]) {
        rc = zr_err_set((int)hdr[0], "%s", buf);
        free(buf);
        return rc;
    }
    if (text_out)
        *text_out = buf;
    else
        free(buf);
    return 0;
}

/* 32 bits of FNV-1a of an error message (exact in a double), to compare the ranks' errors */
static double msg_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; s && *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return (double)h;
}

/* A rank's local result, agreed: every rank learns the first failing rank's error. When every
 * rank failed with that very message (a bad option, a checkpoint that does not fit), it stays
 * as it is, so that all ranks print the same line (the launcher prints it once, "all N
 * ranks"); otherwise every rank, that one included, says whose it is: "rank K: ...". */
static int agree(run *r, int rc)
{
    char *msg = rc ? strdup(zr_err_msg()) : NULL;
    double mine[2] = {rc, rc ? msg_hash(msg) : 0}, *all = calloc(2 * (size_t)r->W, sizeof *all);
    if (!all) {
        free(msg);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    int crc = gather_f64(r, mine, 2, all);
    int first = -1, same = 1;
    for (int q = 0; !crc && q < r->W && first < 0; q++)
        if (all[2 * q] != 0)
            first = q;
    for (int q = 0; !crc && first >= 0 && q < r->W; q++)
        same = same && all[2 * q] != 0 && all[2 * q + 1] == all[2 * first + 1];
    free(all);
    if (!crc && first >= 0) {
        crc = share_text(r, first, rc ? rc : ZR_ERROR, msg ? msg : "", NULL);
        if (crc && r->W > 1 && !same)
            zr_err_prefix("rank %d: ", first);
    }
    free(msg);
    return crc;
}

/* Rank 0 makes the staging directory of a save of this step and tells the others. */
static int make_staging(run *r, char **staging)
{
    char *local = NULL;
    uint64_t nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e6);
    int lrc = r->rank == 0 ? zck_staging_create(&local, r->o->ckpt_dir, r->step, nonce) : 0;
    int rc = share_text(r, 0, lrc, lrc ? zr_err_msg() : local, staging);
    free(local);
    return rc;
}

/* Every rank's shard written (lrc: this rank's result, json its description): agree, collect
 * the descriptions at rank 0, which commits step `step` with the training section `train`;
 * everyone learns the checkpoint's path (or the error). */
static int commit_shards(run *r, int lrc, const char *json, const char *staging, uint64_t step,
                         const char *train, char *path_out, size_t cap)
{
    const zr_train_opts *o = r->o;
    char *model = NULL, *final = NULL, *res = NULL;
    char **jsons = NULL;
    zck_shard **sh = NULL;
    int rc = 0;
    ZR_TRY_GOTO(agree(r, lrc), rc, out);
    if (!(jsons = calloc((size_t)r->W, sizeof *jsons)) ||
        !(sh = calloc((size_t)r->W, sizeof *sh))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    for (int q = 0; q < r->W; q++)
        ZR_TRY_GOTO(share_text(r, q, 0, json, &jsons[q]), rc, out);
    lrc = 0;
    if (r->rank == 0) {
        for (int q = 0; q < r->W && !lrc; q++)
            lrc = zck_shard_from_json(&sh[q], jsons[q], strlen(jsons[q]));
        if (!lrc)
            lrc = zr_gpt2_config_to_json(&model, &r->cfg);
        if (!lrc) {
            zck_commit_opts co = ZCK_COMMIT_OPTS_INIT;
            co.step = step;
            co.world = (uint32_t)r->W;
            co.zero_stage = o->zero_stage;
            co.model_json = model;
            co.training_json = train;
            co.keep_last = o->keep_last;
            zck_extra_file tok = {"tokenizer.json", o->tokenizer_json, o->tokenizer_bytes};
            if (!o->tokenizer_json)
                tok = (zck_extra_file){"tokenizer.json", r->ck_tokenizer, r->ck_tokenizer_bytes};
            co.files = &tok;
            co.n_files = tok.data ? 1 : 0;
            lrc = zck_commit(&final, o->ckpt_dir, staging, r->L, sh, (size_t)r->W, &co);
        }
    }
    ZR_TRY_GOTO(share_text(r, 0, lrc, lrc ? zr_err_msg() : final, &res), rc, out);
    snprintf(path_out, cap, "%s", res);
out:
    if (rc && r->rank == 0) /* every rank gave up on it: no staging left behind */
        zck_staging_remove(staging);
    for (int q = 0; jsons && q < r->W; q++)
        free(jsons[q]);
    for (int q = 0; sh && q < r->W; q++)
        zck_shard_free(sh[q]);
    free(jsons);
    free(sh);
    free(model);
    free(final);
    free(res);
    return rc;
}

/* A synchronous save: training waits for the files, their fsync and the commit. */
static int save_sync(run *r, float loss, char *path_out, size_t cap)
{
    char *staging = NULL, *json = NULL, *train = NULL;
    double t0 = now_s();
    int rc = 0;
    ZR_TRY_GOTO(make_staging(r, &staging), rc, out);
    ZR_TRY_GOTO(training_json(&train, r, loss), rc, out);
    int lrc = write_shard(r, staging, &json);
    ZR_TRY_GOTO(commit_shards(r, lrc, json, staging, r->step, train, path_out, cap), rc, out);
    r->save_s = now_s() - t0;
    r->blocked_s = r->save_s;
    if (r->log)
        fprintf(r->log, "saved %s (%.2f s)\n", path_out, r->save_s);
out:
    free(staging);
    free(json);
    free(train);
    return rc;
}

/* The asynchronous save in flight, once every rank's shard is durable (or any failed): wait
 * for this rank's writer, then commit as a synchronous save does. */
static int finish_pending(run *r, char *path_out, size_t cap)
{
    if (!r->pend.staging)
        return 0;
    int st = zr_saver_wait(r->saver);
    char *json = NULL;
    int lrc = st == ZR_SAVER_DONE ? zr_saver_take(r->saver, &json) : st < 0 ? st : ZR_ERROR;
    if (!lrc && !json)
        lrc = zr_err_set(ZR_ERROR, "checkpoint writer: no shard");
    int rc = commit_shards(r, lrc, json, r->pend.staging, r->pend.step, r->pend.train, path_out,
                           cap);
    if (!rc && r->log)
        fprintf(r->log, "saved %s (asynchronous: training blocked %.3f s; written in %.2f s; "
                        "%zu chunks buffered)\n",
                path_out, r->pend.blocked_s, now_s() - r->pend.t0, r->pend.copied);
    free(json);
    free(r->pend.staging);
    free(r->pend.train);
    memset(&r->pend, 0, sizeof r->pend);
    return rc;
}

/* An asynchronous save: snapshot this rank's partitions (the part training waits for), finish
 * the previous save if one is still in flight, then write this one in the background. */
static int save_async(run *r, float loss, char *path_out, size_t cap)
{
    double t0 = now_s();
    char *train = NULL, *staging = NULL;
    int rc = 0;
    ZR_TRY_GOTO(agree(r, zr_saver_snapshot(r->saver, r->zero)), rc, out);
    ZR_TRY_GOTO(finish_pending(r, path_out, cap), rc, out);
    ZR_TRY_GOTO(training_json(&train, r, loss), rc, out);
    ZR_TRY_GOTO(make_staging(r, &staging), rc, out);
    ZR_TRY_GOTO(agree(r, zr_saver_write(r->saver, staging)), rc, out);
    r->pend.staging = staging;
    r->pend.train = train;
    r->pend.step = r->step;
    r->pend.t0 = t0;
    r->pend.blocked_s = r->blocked_s = now_s() - t0;
    staging = train = NULL;
out:
    if (rc && r->rank == 0)
        zck_staging_remove(staging);
    free(staging);
    free(train);
    return rc;
}

static int save(run *r, float loss, char *path_out, size_t cap)
{
    return r->saver ? save_async(r, loss, path_out, cap) : save_sync(r, loss, path_out, cap);
}

/* Check that the checkpoint holds this model: same groups, sizes, tensors, and f32 states. */
int zr_train__check_layout(const zck_layout *ck, const zck_layout *want, const char *path)
{
    ZR_TRY(zr_gpt2_layout_check(ck, want, path));
    static const char *states[3] = {"param", "exp_avg", "exp_avg_sq"};
    for (size_t s = 0; s < 3; s++) {
        size_t idx;
        if (zck_layout_find_state(ck, &idx, states[s]) < 0 ||
            zck_layout_state_dtype(ck, idx) != ZCK_F32)
            return zr_err_set(ZR_EINVAL, "%s: no f32 state '%s' in the checkpoint", path,
                              states[s]);
    }
    return 0;
}

static void say_line(void *ctx, const char *line)
{
    if (ctx)
        fprintf(ctx, "%s\n", line);
}

/* Find what to resume from: NULL path when starting fresh. With "auto", the pick of
 * zck_resume_pick (damaged newer checkpoints moved aside, said on log; nothing changed when
 * dry); with a path, that checkpoint through zck_resume_check; either checked as
 * --verify-on-resume says, by the one check of ckpt/resume.c. */
_Static_assert((int)ZR_VERIFY_FULL == (int)ZCK_RESUME_VERIFY_FULL &&
               (int)ZR_VERIFY_QUICK == (int)ZCK_RESUME_VERIFY_QUICK &&
               (int)ZR_VERIFY_OFF == (int)ZCK_RESUME_VERIFY_OFF,
               "ZR_VERIFY_* and ZCK_RESUME_VERIFY_* must agree");

/* The run's own cheap check of a candidate, before any hashing: its model (--model, else the
 * checkpoint's model section) and that model's layout against the checkpoint's. */
static int model_fits(void *ctx, const zck_reader *rd)
{
    zr_gpt2_config cfg;
    zck_layout *want = NULL;
    ZR_TRY(zr_train__pick_config(&cfg, ctx, (zck_reader *)rd));
    ZR_TRY(zr_gpt2_layout(&want, &cfg));
    int rc = zr_train__check_layout(zck_reader_layout(rd), want, zck_reader_path(rd));
    zck_layout_free(want);
    return rc;
}

int zr_train__resume_path(char **out, const zr_train_opts *o, FILE *log, int dry)
{
    *out = NULL;
    if (!o->resume || !strcmp(o->resume, "never")) {
        zck_run_list *l = NULL;
        if (zck_run_list_open(&l, o->ckpt_dir) == 0 && l->n) {
            size_t n = l->n;
            zck_run_list_free(l);
            return zr_err_set(ZR_EEXIST, "--resume never: %s already holds %zu checkpoint%s; a "
                              "fresh run needs its own --ckpt-dir", o->ckpt_dir, n,
                              n == 1 ? "" : "s");
        }
        zck_run_list_free(l);
        zr_err_clear();
        return 0;
    }
    zck_resume_opts ro = ZCK_RESUME_OPTS_INIT;
    ro.verify = o->verify_on_resume; /* ZR_VERIFY_* == ZCK_RESUME_VERIFY_* */
    ro.jobs = o->threads > 0 ? (unsigned)o->threads : 1;
    ro.dry_run = dry;
    ro.say = say_line;
    ro.say_ctx = log;
    if (!dry) { /* the audit and --dry-run say each reason their own way */
        ro.precheck = model_fits;
        ro.precheck_ctx = (void *)o;
    }
    /* a path (a run or step directory, a copy elsewhere) goes through the pick's own check */
    int auto_ = !strcmp(o->resume, "auto");
    int rc = auto_ ? zck_resume_pick(out, o->ckpt_dir, &ro)
                   : zck_resume_check(out, o->resume, &ro);
    if (rc)
        zr_err_prefix("--resume %s: ", auto_ ? "auto" : o->resume);
    return rc;
}

static int load_training(run *r, zck_reader *rd);

/* What --verify-on-resume checked, for the resume line. */
static const char *verify_words[3] = {"every file hashed", "quick check (files present, sizes)",
                                      "quick check, no hashing (--verify-on-resume off)"};

static int load(run *r, zck_reader *rd)
{
    ZR_TRY(zr_train__check_layout(zck_reader_layout(rd), r->L, zck_reader_path(rd)));
    unsigned jobs = r->o->threads > 0 ? (unsigned)r->o->threads : 1;
    /* checked as --verify-on-resume says already, by rank 0 (zr_train__resume_path) */
    int rc = zr_zero_load(r->zero, rd, 0, jobs);
    return rc ? rc : load_training(r, rd);
}

/* The validation record of the section: kept when it was measured on this run's evaluation
 * set, else dropped (said when this run evaluates). */
static void load_val(run *r, const zr_train__section *s)
{
    const char *set = zr_train__eval_set(r->eval);
    if (!s->has_val && !s->has_best)
        return;
    if (s->val_set && !strcmp(s->val_set, set)) {
        r->val.has_val = s->has_val;
        r->val.val = s->val_loss;
        r->val.val_step = s->val_step;
        r->val.has_best = s->has_best;
        r->val.best = s->best_val_loss;
        r->val.best_step = s->best_val_step;
    } else if (r->log && r->o->eval_every)
        fprintf(r->log, "note: the checkpoint's validation losses were measured on another "
                        "evaluation set (%s; now %s): the best so far starts again\n",
                s->val_set ? s->val_set : "?", set);
}

/* The training section: step, data position; differences from this run's options said. */
static int load_training(run *r, zck_reader *rd)
{
    zr_train__section s = {.optimizer_step = r->step, .next_sample = r->next_sample,
                           .seed = r->o->seed, .batch = r->o->batch, .seq = r->T};
    int rc = zr_train__section_parse(&s, zck_reader_training_json(rd));
    if (rc) {
        zr_train__section_clear(&s);
        zr_err_prefix("%s: ", zck_reader_path(rd));
        return rc;
    }
    r->step = s.optimizer_step;
    r->next_sample = s.next_sample;
    /* a different seed, batch, sequence length or data source changes which samples come
     * next: allowed (a deliberate change), but said */
    if (s.run_id)
        snprintf(r->ck_run_id, sizeof r->ck_run_id, "%s", s.run_id);
    load_val(r, &s);
    if (s.order_known && r->log &&
        (s.seed != r->o->seed || s.batch != r->o->batch || s.seq != r->T ||
         (s.data && strcmp(s.data, r->o->data))))
        fprintf(r->log, "note: the checkpoint was trained with seed %llu, batch %llu, seq "
                        "%llu, data %s; this run uses seed %llu, batch %u, seq %u, data %s: "
                        "the sample order continues differently\n",
                (unsigned long long)s.seed, (unsigned long long)s.batch,
                (unsigned long long)s.seq, s.data ? s.data : "?",
                (unsigned long long)r->o->seed, r->o->batch, r->T, r->o->data);
    zr_train__schedule_note(r->log, &s, r->o, r->step);
    zr_train__section_clear(&s);
    return 0;
}

/* ---------------------------------------------------------------- the loop */

/* One optimizer step; *loss is the mean loss of the global batch before the update.
 * *stop: whether any rank wants to stop after this step (want_stop is this rank's wish). */
/* The asynchronous save in flight, as one number every rank can compare: 0 none, 1 writing,
 * 2 durable, -1 failed. */
static double saver_state(run *r)
{
    if (!r->saver || !r->pend.staging)
        return 0;
    int st = zr_saver_status(r->saver);
    zr_err_clear();
    return st < 0 ? -1 : st == ZR_SAVER_DONE ? 2 : 1;
}

/* *saves: the agreed state of the save in flight: 2 when every rank's shard is durable, -1
 * when any rank's write failed, else 0 or 1. */
static int forward_backward(run *r, float scale, float *loss)
{
    if (r->dev) {
        ZR_TRY(r->dev->model_forward(r->dmodel, r->inputs, r->targets, r->mb, r->T, loss));
        return r->dev->model_backward(r->dmodel, scale);
    }
    ZR_TRY(zr_model_forward(r->model, r->inputs, r->targets, r->mb, r->T, loss));
    return zr_model_backward(r->model, scale);
}

/* One optimizer step: 0 done; 1 when the loss or the gradient norm is not finite (the run
 * diverged; nothing updated, the step not counted); < 0 an error. */
static int train_step(run *r, int want_stop, int *stop, int *saves, float *loss,
                      float *lr_out, float *norm_out)
{
    const zr_train_opts *o = r->o;
    ZR_TRY(zr_zero_check_swap(r->zero)); /* a vanished or truncated swap file stops here */
    ZR_TRY(zr_zero_begin_step(r->zero));
    double sum = 0;
    const uint32_t T = r->T;
    const float scale = 1.0f / (float)((uint64_t)r->n_micro * (uint64_t)r->W);
    for (uint32_t k = 0; k < r->n_micro; k++) {
        for (uint32_t b = 0; b < r->mb; b++) {
            /* micro-batch k is samples [k W mb, (k+1) W mb) of the step; rank r takes its
             * mb of them */
            uint64_t idx = r->next_sample + ((uint64_t)k * r->W + r->rank) * r->mb + b;
            zr_data_sample(r->data, idx, r->tokens);
            memcpy(r->inputs + (size_t)b * T, r->tokens, T * sizeof *r->tokens);
            memcpy(r->targets + (size_t)b * T, r->tokens + 1, T * sizeof *r->tokens);
        }
        float l;
        ZR_TRY(forward_backward(r, scale, &l));
        sum += l;
    }
    ZR_TRY(zr_zero_reduce(r->zero));
    /* the global gradient norm (the same bits on every rank), the batch's mean loss and the
     * stop wish, agreed */
    double sq, mine[3] = {sum, want_stop ? 1.0 : 0.0, saver_state(r)};
    ZR_TRY(zr_zero_sumsq(r->zero, &sq));
    double *all = calloc(3 * (size_t)r->W, sizeof *all);
    if (!all)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = gather_f64(r, mine, 3, all);
    double total = 0, sv = 2;
    *stop = 0;
    for (int q = 0; q < r->W; q++) {
        total += all[3 * q];
        *stop |= all[3 * q + 1] != 0;
        sv = all[3 * q + 2] < sv ? all[3 * q + 2] : sv;
    }
    *saves = (int)sv;
    free(all);
    if (rc)
        return rc;
    *loss = (float)(total / ((double)r->n_micro * r->W));
    float norm = (float)sqrt(sq);
    *norm_out = norm;
    if (!isfinite(*loss) || !isfinite(norm))
        return 1; /* diverged (every rank sees the same sums): nothing applied */
    float clip = 1.0f;
    if (o->grad_clip > 0 && norm > o->grad_clip)
        clip = o->grad_clip / (norm + 1e-6f);
    float lr = zr_lr_at(r->step, o->warmup, o->steps, o->lr, o->min_lr_ratio);
    zr_adamw_hp hp = ZR_ADAMW_HP_INIT;
    hp.weight_decay = o->weight_decay;
    if (r->saver) { /* the save in flight no longer reads what the update changes */
        size_t copied;
        double waited;
        ZR_TRY(zr_saver_protect(r->saver));
        zr_saver_protect_stats(r->saver, &copied, &waited);
        r->pend.blocked_s += waited;
        r->pend.copied += copied;
    }
    ZR_TRY(zr_zero_adamw(r->zero, r->step + 1, lr, clip, &hp));
    ZR_TRY(zr_zero_publish(r->zero));
    r->step++;
    r->next_sample += o->batch;
    *lr_out = lr;
    *norm_out = norm;
    return 0;
}

/* This process's peak resident set, bytes. */
static uint64_t rss_peak(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0 : (uint64_t)ru.ru_maxrss * 1024;
}

/* After each record: the JSON log flushed. A write that failed (a full disk, /dev/full) is
 * said once on the step log and the JSON log closed: training and its checkpoints go on, and
 * the last line says the log is incomplete. */
static void json_log_flush(run *r)
{
    if (!r->jlog || (fflush(r->jlog) == 0 && !ferror(r->jlog)))
        return;
    int e = errno;
    fclose(r->jlog);
    r->jlog = NULL;
    r->jlog_lost = r->step ? r->step : 1;
    if (r->log)
        fprintf(r->log, "warning: --log-json %s: write failed (%s): no more JSON records from "
                        "step %llu on; training goes on\n", r->o->log_json, strerror(e),
                (unsigned long long)r->jlog_lost);
}

/* The step's line on the terminal (before its save, if any) and, with save_ms (how long a
 * save at this step blocked training; 0 without one), its JSON line (after it). */
static void log_step(run *r, int json, float loss, float lr, float norm, double dt,
                     double save_ms)
{
    const zr_train_opts *o = r->o;
    double tps = (double)o->batch * r->T / (dt > 0 ? dt : 1e-9);
    zr_zero_bytes zb;
    zr_zero_mem(r->zero, &zb);
    uint64_t ab, unused[2];
    if (r->dev)
        r->dev->model_bytes(r->dmodel, &unused[0], &unused[1], &ab);
    else
        zr_model_bytes(r->model, NULL, NULL, &ab);
    double mib = 1.0 / (1 << 20);
    char nvme[48] = "", pinned[48] = "";
    if (zb.nvme)
        snprintf(nvme, sizeof nvme, " | nvme %.1f", zb.nvme * mib);
    if (zb.pinned)
        snprintf(pinned, sizeof pinned, " | pinned %.1f", zb.pinned * mib);
    char val[64] = "";
    if (r->val.now)
        snprintf(val, sizeof val, " | val %.4f", r->val.val);
    if (r->log && !json)
        fprintf(r->log, "step %6llu/%llu | loss %.4f%s | lr %.2e | norm %.3f | %8.0f tok/s | "
                        "%.1f ms | %s MiB p %.1f g %.1f o %.1f b %.1f a %.1f%s%s\n",
                (unsigned long long)r->step, (unsigned long long)o->steps, loss, val, lr, norm,
                tps,
                dt * 1e3, r->dev ? "gpu/rank" : "mem/rank", zb.params * mib, zb.grads * mib,
                zb.optimizer * mib, zb.buffers * mib, ab * mib, nvme, pinned);
    if (r->jlog && json) {
        /* the values as the shortest decimals that read back the same (float32 but val) */
        char when[32], vl[40], l[40], lrs[40], ns[40];
        zck_json_real_text(vl, sizeof vl, r->val.val, 0);
        zck_json_real_text(l, sizeof l, loss, 1);
        zck_json_real_text(lrs, sizeof lrs, lr, 1);
        zck_json_real_text(ns, sizeof ns, norm, 1);
        if (r->val.now && isfinite(r->val.val))
            snprintf(val, sizeof val, "\"val_loss\":%s,", vl);
        else
            snprintf(val, sizeof val, "%s", r->val.now ? "\"val_loss\":null," : "");
        fprintf(r->jlog, "{\"step\":%llu,\"loss\":%s,%s\"lr\":%s,\"grad_norm\":%s,"
                         "\"tokens_per_s\":%.1f,\"step_ms\":%.3f,\"save_blocked_ms\":%.3f,"
                         "\"world\":%d,\"zero\":%d,\"device\":\"%s\","
                         "\"mem\":{\"params\":%llu,\"grads\":%llu,\"optimizer\":%llu,"
                         "\"buffers\":%llu,\"activations\":%llu,\"nvme\":%llu,"
                         "\"pinned\":%llu},"
                         "\"rss_peak\":%llu,\"time\":\"%s\",\"run_id\":\"%s\"}\n",
                (unsigned long long)r->step, l, val, lrs, ns, tps, dt * 1e3, save_ms, r->W,
                o->zero_stage, r->dev ? r->dev->name : "cpu", (unsigned long long)zb.params,
                (unsigned long long)zb.grads,
                (unsigned long long)zb.optimizer, (unsigned long long)zb.buffers,
                (unsigned long long)ab, (unsigned long long)zb.nvme,
                (unsigned long long)zb.pinned,
                (unsigned long long)rss_peak(), iso_time(when), r->run_id);
        json_log_flush(r);
    }
}

/* mkdir -p of the directory part of path (best effort) */
static void make_parent_dirs(const char *path)
{
    char *p = strdup(path);
    if (!p)
        return;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0777);
            *s = '/';
        }
    free(p);
}

/* The validation options (--eval-every and its companions). */
/* an enum option a library caller passes: v in lo..hi, whose names are `names` */
static int enum_ok(int v, int lo, int hi, const char *opt, const char *names)
{
    if (v < lo || v > hi)
        return zr_err_set(ZR_EINVAL, "%s %d: expected %s (%d..%d)", opt, v, names, lo, hi);
    return 0;
}

static int check_eval_opts(const zr_train_opts *o)
{
    if (o->val_data && !o->val_data[0])
        return zr_err_set(ZR_EINVAL, "--val-data: empty");
    if (!o->eval_every)
        return 0;
    if (o->eval_batches < 1)
        return zr_err_set(ZR_EINVAL, "--eval-batches 0: at least 1 (with --eval-every)");
    if ((uint64_t)o->eval_batches * o->batch > (1u << 24))
        return zr_err_set(ZR_EINVAL, "--eval-batches %u x --batch %u: %llu sequences per "
                          "evaluation, at most %u", o->eval_batches, o->batch,
                          (unsigned long long)o->eval_batches * o->batch, 1u << 24);
    return 0;
}

/* Every option, whatever the world size: ZR_EINVAL naming the first bad one. */
int zr_train__check_opts(const zr_train_opts *o)
{
    if (o->batch < 1)
        return zr_err_set(ZR_EINVAL, "--batch %u: at least 1", o->batch);
    if (o->steps < 1)
        return zr_err_set(ZR_EINVAL, "--steps must be at least 1");
    if (!(o->lr > 0) || !isfinite(o->lr))
        return zr_err_set(ZR_EINVAL, "--lr %g: expected a finite number > 0", (double)o->lr);
    if (!(o->min_lr_ratio >= 0 && o->min_lr_ratio <= 1))
        return zr_err_set(ZR_EINVAL, "--min-lr-ratio %g: expected 0..1",
                          (double)o->min_lr_ratio);
    if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
        return zr_err_set(ZR_EINVAL, "--weight-decay %g: expected a finite number >= 0",
                          (double)o->weight_decay);
    if (!(o->grad_clip >= 0) || !isfinite(o->grad_clip))
        return zr_err_set(ZR_EINVAL, "--grad-clip %g: expected a finite number >= 0",
                          (double)o->grad_clip);
    if (!(o->time_limit >= 0) || !isfinite(o->time_limit))
        return zr_err_set(ZR_EINVAL, "--time-limit %g: expected a finite number >= 0",
                          o->time_limit);
    if (o->zero_stage < 0 || o->zero_stage > 3)
        return zr_err_set(ZR_EINVAL, "--zero %d: expected 0..3", o->zero_stage);
    if (o->threads < 0 || o->threads > 4096)
        return zr_err_set(ZR_EINVAL, "--threads %d: expected 1..4096 (0: 1)", o->threads);
    if (!o->ckpt_dir || !o->ckpt_dir[0])
        return zr_err_set(ZR_EINVAL, "--ckpt-dir: empty");
    if (!o->data || !o->data[0])
        return zr_err_set(ZR_EINVAL, "--data: empty");
    ZR_TRY(check_eval_opts(o));
    if (o->tokenizer_json && o->tokenizer_bytes > ZCK_MAX_FILE_BYTES)
        return zr_err_set(ZR_EINVAL, "--tokenizer %s: %zu bytes; every checkpoint records it as "
                          "the extra file tokenizer.json, of at most %zu bytes (64 MiB)",
                          o->tokenizer_path ? o->tokenizer_path : "(given)", o->tokenizer_bytes,
                          ZCK_MAX_FILE_BYTES);
    ZR_TRY(enum_ok(o->verify_on_resume, ZR_VERIFY_FULL, ZR_VERIFY_OFF, "--verify-on-resume",
                   "ZR_VERIFY_FULL, _QUICK or _OFF"));
    ZR_TRY(enum_ok(o->device, ZR_DEVICE_CPU, ZR_DEVICE_AUTO, "--device",
                   "ZR_DEVICE_CPU, _CUDA or _AUTO"));
    if (o->async_save < -1 || o->async_save > 1)
        return zr_err_set(ZR_EINVAL, "--async-save %d: expected -1 (auto), 0 (off) or 1 (on)",
                          o->async_save);
    if (o->save_buffer && o->save_buffer < 4096)
        return zr_err_set(ZR_EINVAL, "--save-buffer %zu: expected 0 (the default) or at "
                          "least 4096 bytes", o->save_buffer);
    ZR_TRY(enum_ok(o->offload_optimizer, ZR_OFFLOAD_NONE, ZR_OFFLOAD_NVME,
                   "--offload-optimizer", "ZR_OFFLOAD_NONE, _CPU or _NVME"));
    ZR_TRY(enum_ok(o->offload_params, ZR_OFFLOAD_NONE, ZR_OFFLOAD_NVME, "--offload-params",
                   "ZR_OFFLOAD_NONE, _CPU or _NVME"));
    if (o->offload_params != ZR_OFFLOAD_NONE && o->zero_stage != 3)
        return zr_err_set(ZR_EINVAL, "--offload-params needs ZeRO stage 3, not %d",
                          o->zero_stage);
    if (!o->sample_every && o->sample_prompt)
        return zr_err_set(ZR_EINVAL, "--prompt sets the prompt of the samples: add "
                          "--sample-every N");
    if (o->sample_every && o->sample_tokens < 1)
        return zr_err_set(ZR_EINVAL, "--sample-tokens 0: at least 1");
    if (o->sample_every && o->sample_prompt && !o->sample_prompt[0])
        return zr_err_set(ZR_EINVAL, "--prompt: empty (the samples need at least one byte)");
    if (o->offload_optimizer != ZR_OFFLOAD_NVME && o->offload_params != ZR_OFFLOAD_NVME)
        return 0;
    if (!o->nvme_path || !o->nvme_path[0])
        return zr_err_set(ZR_EINVAL, "offload to nvme needs --nvme-path DIR");
    if (o->aio_depth < 1)
        return zr_err_set(ZR_EINVAL, "--aio-queue-depth 0: at least 1");
    if (o->offload_buffers < 2)
        return zr_err_set(ZR_EINVAL, "--offload-buffers %u: at least 2", o->offload_buffers);
    if (!o->aio_block || o->aio_block % 4096)
        return zr_err_set(ZR_EINVAL, "--aio-block-size %zu: expected a multiple of 4096",
                          o->aio_block);
    return 0;
}

/* The options that depend on the world size W. */
int zr_train__check_world(const zr_train_opts *o, int W)
{
    if (o->batch % (uint32_t)W) {
        uint64_t below = o->batch / (uint32_t)W * (uint64_t)W, above = below + (uint64_t)W;
        char use[64];
        if (below)
            snprintf(use, sizeof use, "use --batch %llu or %llu", (unsigned long long)below,
                     (unsigned long long)above);
        else
            snprintf(use, sizeof use, "use --batch %llu", (unsigned long long)above);
        return zr_err_set(ZR_EINVAL, "--batch %u is not a multiple of the world size %d (each "
                          "rank takes an equal share of the global batch): %s", o->batch, W,
                          use);
    }
    uint32_t per_rank = o->batch / (uint32_t)W;
    if (o->micro_batch && per_rank % o->micro_batch)
        return zr_err_set(ZR_EINVAL, "--micro-batch %u does not divide the %u sequences per "
                          "rank (--batch %u over %d rank%s)", o->micro_batch, per_rank,
                          o->batch, W, W == 1 ? "" : "s");
    return 0;
}

typedef struct {
    const zr_model *m;
    uint64_t seed;
} init_ctx;

static void init_fill(void *ctx, size_t g, uint64_t off, uint64_t n, float *dst)
{
    const init_ctx *c = ctx;
    zr_model_init_range(c->m, c->seed, g, off, n, dst);
}

static zr_zero_opts zero_opts(const zr_train_opts *o)
{
    zr_zero_opts zo = ZR_ZERO_OPTS_INIT;
    zo.stage = o->zero_stage;
    zo.prefetch = o->prefetch;
    zo.live_params = o->max_live_params;
    zo.offload_optimizer = o->offload_optimizer;
    zo.offload_params = o->offload_params;
    zo.swap_dir = o->nvme_path;
    zo.aio_depth = o->aio_depth;
    zo.aio_block = o->aio_block;
    zo.buffers = o->offload_buffers;
    return zo;
}

/* Remove the regular files of a swap directory (ours, or a crashed run's). */
static void swap_dir_clean(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
}

/*
 * This rank's swap directory, <nvme_path>/zrun-swap-rank<r>: created, or taken over from a
 * crashed run (the pid in its `owner` file is gone: its files are removed, never mixed with
 * new state, and the log says so); refused while a live process owns it.
 */
static int swap_dir_claim(run *r)
{
    const char *base = r->o->nvme_path;
    char *dir = NULL;
    if (!base || !base[0])
        return zr_err_set(ZR_EINVAL, "offload to nvme needs --nvme-path DIR");
    if (mkdir(base, 0777) < 0 && errno != EEXIST)
        return zr_err_sys(errno, "--nvme-path %s: create", base);
    if (asprintf(&dir, "%s/zrun-swap-rank%d", base, r->rank) < 0)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    char owner[4200];
    snprintf(owner, sizeof owner, "%s/owner", dir);
    int rc = 0;
    if (mkdir(dir, 0700) < 0) {
        if (errno != EEXIST) {
            rc = zr_err_sys(errno, "%s: create", dir);
            goto out;
        }
        long pid = 0;
        int ofd = -1;
        FILE *f = zck_open_regular(&ofd, owner, ZCK_NOFOLLOW, NULL) == 0 ? fdopen(ofd, "r")
                                                                         : NULL;
        zr_err_clear(); /* no owner file (or not a regular one): nobody holds it */
        if (f) {
            if (fscanf(f, "%ld", &pid) != 1)
                pid = 0;
            fclose(f);
        } else if (ofd >= 0)
            close(ofd);
        if (pid > 0 && pid != (long)getpid() &&
            (kill((pid_t)pid, 0) == 0 || errno == EPERM)) {
            rc = zr_err_set(ZR_EEXIST, "%s is in use by a running process (pid %ld); give "
                            "this run another --nvme-path", dir, pid);
            goto out; /* not ours: left alone */
        }
        zr_log(ZR_LOG_WARN, "%s: stale swap directory of a run that did not finish%s%.0ld%s: "
               "its files are removed", dir, pid ? " (pid " : "", pid, pid ? ")" : "");
        swap_dir_clean(dir);
    }
    r->swap_dir = dir; /* ours from here: removed at the end */
    dir = NULL;
    unlink(owner); /* whatever was there (a FIFO would block the open) */
    int wfd = open(owner, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *f = wfd >= 0 ? fdopen(wfd, "w") : NULL;
    if (!f && wfd >= 0)
        close(wfd);
    if (!f || fprintf(f, "%ld\n", (long)getpid()) < 0 || fclose(f) != 0)
        rc = zr_err_sys(errno, "%s: write", owner);
out:
    free(dir);
    return rc;
}

static void swap_dir_release(run *r)
{
    if (!r->swap_dir)
        return;
    swap_dir_clean(r->swap_dir); /* scratch: the swap files went with the ZeRO state */
    rmdir(r->swap_dir);
    free(r->swap_dir);
}

static int fail_now(void *ctx)
{
    (void)ctx;
    return ZR_ECOMM;
}

/* failed: a collective may still be in flight on the device communicator: abort it first
 * (comm_wait aborts when its check fails while work is pending), so that freeing the model
 * and the buffers, which drains their streams, cannot wait for a peer that is gone */
static void free_run(run *r, int failed)
{
    if (failed && r->dcomm) {
        int keep = zr_err_code();
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zr_err_msg());
        r->dev->comm_wait(r->dcomm, fail_now, NULL);
        if (keep)
            zr_err_set(keep, "%s", msg); /* the run's error, not the abort's */
    }
    zr_saver_free(r->saver); /* a write still running is joined, never committed */
    if (r->rank == 0)
        zck_staging_remove(r->pend.staging);
    zck_run_unlock(r->lock);
    free(r->pend.staging);
    free(r->pend.train);
    zr_model_free(r->model);
    if (r->dmodel)
        r->dev->model_free(r->dmodel);
    zr_zero_free(r->zero); /* after the model: its comm thread may still hold lent buffers */
    if (r->dcomm)
        r->dev->comm_free(r->dcomm);
    swap_dir_release(r);
    zr_comm_close(r->comm);
    zck_layout_free(r->L);
    free(r->tokens);
    free(r->inputs);
    free(r->targets);
    zr_train__eval_free(r->eval); /* before the data it may borrow from */
    zr_data_free(r->data);
    free(r->ck_tokenizer);
    if (r->codec.ops)
        r->codec.ops->close(r->codec.ctx);
    if (r->jlog)
        fclose(r->jlog);
    zck_reader_free(r->rd);
    free(r->from);
}

/* The device (o->device): cpu; cuda, which every rank must be able to use; or auto: cuda
 * when every rank can, else cpu. Then this rank's GPU (ZR_LOCAL_RANK, else the rank, modulo
 * the GPUs: ranks beyond the GPUs share them) and, with several ranks, the device
 * communicator: NCCL when every rank has a GPU of its own (no two ranks of a host on one
 * device index of the same CUDA_VISIBLE_DEVICES; its unique id from rank 0 through the host
 * communicator: shm on one node, TCP across nodes), else none (collectives staged through
 * host memory over the host communicator). ZR_DEVICE_COMM=nccl or shm overrides the choice. */
static int open_device(run *r)
{
    const zr_train_opts *o = r->o;
    if (o->device == ZR_DEVICE_CPU)
        return 0;
    const zr_device_ops *ops = NULL;
    int lrc = o->device == ZR_DEVICE_AUTO && !zr_device_cuda_available() ? ZR_EUNSUPPORTED
                                                                         : zr_device_open(&ops);
    if (o->device == ZR_DEVICE_AUTO) {
        double mine = lrc ? 0 : 1, *all = calloc((size_t)r->W, sizeof *all);
        if (!all)
            return zr_err_set(ZR_ENOMEM, "out of memory");
        int rc = gather_f64(r, &mine, 1, all), every = 1;
        for (int q = 0; q < r->W; q++)
            every &= all[q] != 0;
        free(all);
        if (rc)
            return rc;
        zr_err_clear();
        if (!every)
            return 0; /* the CPU engine */
    }
    ZR_TRY(agree(r, lrc));
    r->dev = ops;
    int local = r->rank, idx = 0, count = 1, has_local = 0;
    char name[96] = "?";
    uint64_t fb = 0, tb = 0;
    lrc = zr_env_int(&local, &has_local, ZR_ENV_LOCAL_RANK, 0, 1 << 20);
    if (!lrc)
        lrc = ops->probe(&count);
    if (!lrc)
        lrc = ops->init(local, &idx);
    if (!lrc)
        lrc = ops->info(name, sizeof name, &fb, &tb);
    ZR_TRY(agree(r, lrc));
    /* a GPU of its own for every rank: no two ranks of a host on the same device (its index
     * among the devices CUDA_VISIBLE_DEVICES shows it, which a scheduler may set per rank) */
    int nccl = r->W > 1;
    if (nccl) {
        enum { KEY = 160 };
        char key[KEY], host[64] = "?", *all = calloc((size_t)r->W, KEY);
        if (!all)
            return zr_err_set(ZR_ENOMEM, "out of memory");
        const char *vis = zr_env(ZR_ENV_CUDA_VISIBLE_DEVICES);
        gethostname(host, sizeof host - 1);
        memset(key, 0, sizeof key);
        snprintf(key, sizeof key, "%s|%.80s|%d", host, vis ? vis : "*", idx);
        int rc = zr_comm_all_gather(r->comm, key, all, 1, KEY);
        for (int q = 0; !rc && q < r->W; q++)
            for (int p = 0; p < q; p++)
                if (!strncmp(all + (size_t)q * KEY, all + (size_t)p * KEY, KEY))
                    nccl = 0;
        free(all);
        if (rc)
            return rc;
    }
    const char *mode = zr_env(ZR_ENV_DEVICE_COMM);
    lrc = 0;
    if (mode && !strcmp(mode, "nccl"))
        nccl = r->W > 1;
    else if (mode && !strcmp(mode, "shm"))
        nccl = 0;
    else if (mode && *mode)
        lrc = zr_err_set(ZR_EINVAL, "ZR_DEVICE_COMM=%s: expected nccl or shm", mode);
    ZR_TRY(agree(r, lrc)); /* the same choice on every rank, or none goes on */
    if (nccl) {
        char id[ZR_NCCL_ID_BYTES];
        memset(id, 0, sizeof id);
        ZR_TRY(agree(r, r->rank == 0 ? ops->comm_unique_id(id, sizeof id) : 0));
        ZR_TRY(bcast(r, id, sizeof id, 0));
        ZR_TRY(agree(r, ops->comm_new(&r->dcomm, id, sizeof id, r->rank, r->W)));
    }
    snprintf(r->dev_name, sizeof r->dev_name, "%s (GPU %d: %s, %.1f GiB%s)", ops->name, idx,
             name, tb / 1073741824.0,
             r->W == 1 ? "" : nccl ? "; NCCL" : "; collectives staged over shm");
    return 0;
}

/* The model config: --model, else the checkpoint's, else tiny; a checkpoint of another shape
 * than --model says is refused. */
int zr_train__pick_config(zr_gpt2_config *cfg, const zr_train_opts *o, zck_reader *rd)
{
    if (o->model) {
        ZR_TRY(zr_gpt2_config_parse(cfg, o->model));
        zr_gpt2_config ck;
        if (rd && zr_gpt2_config_from_json(&ck, zck_reader_model_json(rd)) == 0 &&
            memcmp(&ck, cfg, sizeof ck)) {
            char *want = NULL;
            int rc = zr_gpt2_config_to_json(&want, cfg);
            rc = zr_err_set(ZR_EINVAL, "%s: checkpoint of another model shape (%s; --model "
                            "says %s)", zck_reader_path(rd), zck_reader_model_json(rd),
                            rc ? "?" : want);
            free(want);
            return rc;
        }
        zr_err_clear();
        return 0;
    }
    if (rd) {
        int rc = zr_gpt2_config_from_json(cfg, zck_reader_model_json(rd));
        if (rc < 0)
            zr_err_prefix("%s: model section: ", zck_reader_path(rd));
        return rc;
    }
    return zr_gpt2_config_parse(cfg, "tiny");
}

/* The sequence length: --seq, else the model's context, which it may not exceed. */
int zr_train__seq(uint32_t *out, const zr_train_opts *o, const zr_gpt2_config *cfg)
{
    *out = o->seq ? o->seq : cfg->ctx;
    if (*out > cfg->ctx)
        return zr_err_set(ZR_EINVAL, "--seq %u is longer than the model's context %u", *out,
                          cfg->ctx);
    return 0;
}

void zr_mem_plan_free(zr_mem_plan *p)
{
    if (!p)
        return;
    free(p->from);
    free(p->rank);
    memset(p, 0, sizeof *p);
}

/* The ZeRO formula's bytes per parameter for params, grads and AdamW states: a + b / W. */
static const double per_param[4][2] = {{16, 0}, {8, 8}, {4, 12}, {0, 16}};

int zr_train_mem_plan(zr_mem_plan *out, const zr_train_opts *o, int world)
{
    memset(out, 0, sizeof *out);
    ZR_TRY(zr_train__check_opts(o));
    ZR_TRY(zr_train__check_world(o, world));
    zck_reader *rd = NULL;
    zck_layout *L = NULL;
    zr_gpt2_config cfg;
    int rc = 0;
    ZR_TRY_GOTO(zr_train__resume_path(&out->from, o, NULL, 1), rc, out);
    if (out->from)
        ZR_TRY_GOTO(zck_reader_open(&rd, out->from), rc, out);
    ZR_TRY_GOTO(zr_train__pick_config(&cfg, o, rd), rc, out);
    ZR_TRY_GOTO(zr_train__seq(&out->seq, o, &cfg), rc, out);
    out->layers = cfg.layers;
    out->llama = cfg.family == ZR_FAMILY_LLAMA;
    out->zero_stage = o->zero_stage;
    out->world = world;
    out->micro_batch = o->micro_batch ? o->micro_batch : o->batch / (uint32_t)world;
    ZR_TRY_GOTO(zr_gpt2_layout(&L, &cfg), rc, out);
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        out->numel += zck_layout_group_numel(L, g);
    /* on a GPU: the device model's activations (bf16 copies, the T x T attention) */
    const zr_device_ops *ops = NULL;
    if (o->device == ZR_DEVICE_CUDA ||
        (o->device == ZR_DEVICE_AUTO && zr_device_cuda_available()))
        ZR_TRY_GOTO(zr_device_open(&ops), rc, out);
    out->on_gpu = ops != NULL;
    uint64_t acts = zr_model_activation_bytes(&cfg, out->micro_batch, out->seq);
    if (ops)
        ZR_TRY_GOTO(zr_device_activation_bytes(&acts, ops, &cfg, out->micro_batch, out->seq),
                    rc, out);
    out->per_param[0] = per_param[o->zero_stage][0];
    out->per_param[1] = per_param[o->zero_stage][1];
    out->formula_bytes = (out->per_param[0] + out->per_param[1] / world) * (double)out->numel;
    if (!(out->rank = calloc((size_t)world, sizeof *out->rank))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    zr_zero_opts zo = zero_opts(o);
    zo.swap_dir = "(dry run)";
    for (int q = 0; q < world; q++) {
        zr_zero_bytes b;
        ZR_TRY_GOTO(zr_zero_plan(&b, L, world, q, &zo), rc, out);
        zr_rank_mem *m = &out->rank[q];
        m->params = b.params;
        m->grads = b.grads;
        m->optimizer = b.optimizer;
        m->buffers = b.buffers;
        m->activations = acts;
        m->swap_staging = b.swap_staging;
        m->pinned = b.pinned;
        m->save_staging = zr_train__save_staging(o, &b, ops != NULL);
        m->baseline = zr_train__baseline(&cfg, out->micro_batch, out->seq, o, world);
        m->total = b.params + b.grads + b.optimizer + b.buffers + acts + m->save_staging +
                   m->pinned + m->baseline;
    }
out:
    zck_reader_free(rd);
    zck_layout_free(L);
    if (rc)
        zr_mem_plan_free(out);
    return rc;
}

static int dry_run(const zr_train_opts *o, int world, FILE *f,
                   void (*print)(const zr_mem_plan *, FILE *))
{
    zr_mem_plan p;
    ZR_TRY(zr_train_mem_plan(&p, o, world));
    print(&p, f);
    zr_mem_plan_free(&p);
    return 0;
}

int zr_train_dry_run_json(const zr_train_opts *o, int world, FILE *f)
{
    return dry_run(o, world, f, zr_mem_plan_json);
}

int zr_train_dry_run(const zr_train_opts *o, int world, FILE *f)
{
    return dry_run(o, world, f, zr_mem_plan_print);
}

void zr_mem_plan_print(const zr_mem_plan *p, FILE *f)
{
    double mib = 1.0 / (1 << 20);
    fprintf(f, "dry run: %s %u layers, %llu parameters, ZeRO stage %d, world %d, "
               "micro-batch %u x %u tokens per rank, on %s%s%s\n", p->llama ? "Llama" : "GPT-2",
            p->layers,
            (unsigned long long)p->numel, p->zero_stage, p->world, p->micro_batch, p->seq,
            p->on_gpu ? "the GPU (device memory; activations in bf16 and fp32)" : "the CPU",
            p->from ? "; resuming from " : "", p->from ? p->from : "");
    fprintf(f, "expected bytes per rank (MiB): formula %g + %g/W bytes per parameter for "
               "params, grads and AdamW states\n", p->per_param[0], p->per_param[1]);
    fprintf(f, "  rank      params       grads   optimizer     buffers  activations  "
               "save staging  process     total   formula\n");
    for (int q = 0; q < p->world; q++) {
        const zr_rank_mem *m = &p->rank[q];
        fprintf(f, "  %4d %11.1f %11.1f %11.1f %11.1f %12.1f %13.1f %8.1f %9.1f %9.1f\n", q,
                m->params * mib, m->grads * mib, m->optimizer * mib, m->buffers * mib,
                m->activations * mib, m->save_staging * mib, (m->baseline + m->pinned) * mib,
                m->total * mib, p->formula_bytes * mib);
    }
}

/* ---------------------------------------------------------------- the run, top to bottom */

/* The world (the launcher's ranks, else one rank), the options it constrains, the device. */
static int open_world(run *r)
{
    ZR_TRY(zr_comm_open_env(&r->comm));
    r->rank = zr_comm_rank(r->comm);
    r->W = zr_comm_world(r->comm);
    r->log = r->rank == 0 ? r->o->log : NULL;
    ZR_TRY(zr_train__check_world(r->o, r->W));
    zr_set_threads(r->o->threads > 0 ? r->o->threads : 1);
    return open_device(r);
}

/* The tokenizer: the one given fits the model's vocabulary; without one, a resume keeps the
 * checkpoint's tokenizer.json (read verified), recorded again in each new checkpoint. */
static int pick_tokenizer(run *r)
{
    const zr_train_opts *o = r->o;
    if (o->tokenizer_json) {
        if (o->tokenizer_vocab > r->cfg.vocab)
            return zr_err_set(ZR_EINVAL, "the tokenizer %s has a vocabulary of %u tokens, the "
                              "model only %u (--model ...,vocab=%u)",
                              o->tokenizer_path ? o->tokenizer_path : "", o->tokenizer_vocab,
                              r->cfg.vocab, o->tokenizer_vocab);
        return 0;
    }
    if (!r->from)
        return 0;
    int rc = zck_ckpt_file_read(&r->ck_tokenizer, &r->ck_tokenizer_bytes, r->from,
                                "tokenizer.json");
    return rc == ZR_ENOTFOUND ? 0 : rc;
}

/* The samples' codec: the caller's over the run's tokenizer (given, or the checkpoint's),
 * else bytes. */
static int open_codec(run *r)
{
    const zr_train_opts *o = r->o;
    const char *json = o->tokenizer_json ? o->tokenizer_json : r->ck_tokenizer;
    size_t n = o->tokenizer_json ? o->tokenizer_bytes : r->ck_tokenizer_bytes;
    if (!json || !o->text_codec)
        return 0;
    ZR_TRY(o->text_codec->open(&r->codec.ctx, json, n));
    r->codec.ops = o->text_codec;
    return 0;
}

static const char *sample_prompt(const zr_train_opts *o)
{
    return o->sample_prompt ? o->sample_prompt : "the ";
}

/* What to resume from (rank 0 decides for all; the others learn its pick or its error), then
 * the model and the shapes. Returns this rank's result, still to be agreed. */
static int pick_start(run *r)
{
    const zr_train_opts *o = r->o;
    char *from = NULL, *shared = NULL;
    int lrc = 0;
    if (r->rank == 0) /* one job per run directory, before any staging or housekeeping */
        lrc = zck_run_lock(&r->lock, o->ckpt_dir, "zrun");
    if (r->rank == 0 && !lrc)
        lrc = zr_train__resume_path(&from, o, r->log, 0);
    lrc = share_text(r, 0, lrc, lrc ? zr_err_msg() : (from ? from : ""), &shared);
    free(from);
    if (lrc)
        return lrc;
    if (shared[0])
        r->from = shared;
    else
        free(shared);
    lrc = r->from ? zck_reader_open(&r->rd, r->from) : 0;
    if (!lrc)
        lrc = zr_train__pick_config(&r->cfg, o, r->rd);
    if (!lrc)
        lrc = zr_train__seq(&r->T, o, &r->cfg);
    if (!lrc)
        lrc = pick_tokenizer(r);
    if (!lrc && o->sample_every)
        lrc = open_codec(r);
    if (!lrc && o->sample_every)
        lrc = zr_train__sample_check(&r->cfg, sample_prompt(o), &r->codec);
    r->mb = o->micro_batch ? o->micro_batch : o->batch / (uint32_t)r->W;
    r->n_micro = o->batch / (uint32_t)r->W / r->mb;
    return lrc;
}

/* The data, the ZeRO engine (on the device, with its offload), the saver, the model and the
 * batch buffers. Returns this rank's result, still to be agreed. */
static int build_engine(run *r)
{
    const zr_train_opts *o = r->o;
    int offloaded = o->offload_optimizer == ZR_OFFLOAD_NVME ||
                    o->offload_params == ZR_OFFLOAD_NVME;
    ZR_TRY(zr_data_open(&r->data, o->data, r->cfg.vocab, r->T, o->seed));
    ZR_TRY(zr_train__check_bytes_data(o, zr_data_is_bytes(r->data),
                                      r->ck_tokenizer ? zck_reader_path(r->rd) : NULL));
    uint32_t dv = zr_data_vocab(r->data);
    if (o->tokenizer_json && dv && dv != o->tokenizer_vocab)
        return zr_err_set(ZR_EINVAL, "%s was encoded with a tokenizer of %u tokens, --tokenizer "
                          "%s has %u: encode the data with this tokenizer (ztok encode)",
                          o->data, dv, o->tokenizer_path ? o->tokenizer_path : "",
                          o->tokenizer_vocab);
    ZR_TRY(zr_train__eval_open(&r->eval, o, r->data, r->cfg.vocab, r->T));
    ZR_TRY(zr_gpt2_layout(&r->L, &r->cfg));
    if (offloaded)
        ZR_TRY(swap_dir_claim(r));
    zr_zero_opts zo = zero_opts(o);
    zo.swap_dir = r->swap_dir;
    ZR_TRY(zr_zero_new(&r->zero, r->comm, r->L, &zo, r->dev, r->dcomm));
    /* asynchronous saves need a host copy of this rank's partitions: by default not when the
     * states were moved to NVMe to free that memory */
    if (o->async_save > 0 || (o->async_save < 0 && !offloaded)) {
        ZR_TRY(zr_saver_new(&r->saver, r->L, r->W, r->rank, o->save_buffer));
        ZR_TRY(zr_saver_prepare(r->saver, r->zero)); /* faulted in before the first step */
    }
    zr_model_hooks h;
    zr_zero_hooks(r->zero, &h);
    if (r->dev) { /* the CPU model only gives the initial values: the smallest one */
        ZR_TRY(zr_device_model_new(r->dev, &r->dmodel, &r->cfg, r->mb, r->T, &h));
        ZR_TRY(zr_zero_attach(r->zero, NULL, r->dmodel, r->n_micro));
        ZR_TRY(zr_model_new_ext(&r->model, &r->cfg, 1, 1, &h));
    } else {
        ZR_TRY(zr_model_new_ext(&r->model, &r->cfg, r->mb, r->T, &h));
        ZR_TRY(zr_zero_attach(r->zero, r->model, NULL, r->n_micro));
    }
    r->ng = zr_model_n_groups(r->model);
    if (!(r->tokens = malloc((r->T + 1) * sizeof *r->tokens)) ||
        !(r->inputs = malloc((size_t)r->mb * r->T * sizeof *r->inputs)) ||
        !(r->targets = malloc((size_t)r->mb * r->T * sizeof *r->targets)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    return 0;
}

/* r->run_id: o->run_id (only [A-Za-z0-9._-] kept, which JSON takes as it is), else 16 random
 * hex digits. */
static void set_run_id(run *r)
{
    const char *id = r->o->run_id;
    size_t n = 0;
    for (; id && *id && n + 1 < sizeof r->run_id; id++)
        if ((*id >= 'a' && *id <= 'z') || (*id >= 'A' && *id <= 'Z') ||
            (*id >= '0' && *id <= '9') || strchr("._-", *id))
            r->run_id[n++] = *id;
    r->run_id[n] = 0;
    if (n)
        return;
    uint64_t v = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e9);
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&v, sizeof v, 1, f) != 1)
            v ^= (uint64_t)clock();
        fclose(f);
    }
    snprintf(r->run_id, sizeof r->run_id, "%016llx", (unsigned long long)v);
}

/* The highest step of the step records already in the JSON log (0: none, no log yet, or a
 * log that is not a regular file: a FIFO or a device such as /dev/stdout holds no history, and
 * reading one could block or never end). Only the bytes there at the start are read. */
static uint64_t logged_max_step(const char *path)
{
    int fd;
    uint64_t left;
    if (zck_open_regular(&fd, path, ZCK_FOLLOW, &left) < 0) {
        zr_err_clear();
        return 0;
    }
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return 0;
    }
    char *line = NULL;
    size_t cap = 0;
    uint64_t max = 0;
    ssize_t len;
    while (left && (len = getline(&line, &cap, f)) > 0) {
        left -= (uint64_t)len < left ? (uint64_t)len : left;
        json_t *j = json_loads(line, 0, NULL);
        json_t *st = json_object_get(j, "step");
        if (json_is_integer(st) && !json_object_get(j, "event") &&
            json_integer_value(st) > 0 && (uint64_t)json_integer_value(st) > max)
            max = (uint64_t)json_integer_value(st);
        json_decref(j);
    }
    free(line);
    fclose(f);
    return max;
}

/* The JSON log at path is not a file of the run directory's own (a shard would take the log's
 * lines, `latest` would lose them at the next save): the first name below ckpt_dir on its way,
 * symbolic links resolved, is not one run_owns. The log's directory exists. */
static int json_log_not_the_runs(const char *path, const char *ckpt_dir)
{
    char *log = zck_path_resolve(path), *rund = realpath(ckpt_dir, NULL);
    size_t n = rund ? strlen(rund) : 0;
    int rc = 0;
    if (log && rund && !strncmp(log, rund, n) && log[n] == '/') {
        const char *first = log + n + 1; /* the entry of the run directory on the log's way */
        int len = (int)strcspn(first, "/");
        if (zck_run_owns(first, (size_t)len) || (len == 9 && !memcmp(first, "train.svg", 9)))
            rc = zr_err_set(ZR_EINVAL, "--log-json %s: inside the checkpoint directory %s, on "
                            "'%.*s', which the run manages (step directories, latest, .lock, "
                            "train.svg, temporaries): give another path, such as the default "
                            "%s/train.jsonl", path, ckpt_dir, len, first, ckpt_dir);
    }
    free(log);
    free(rund);
    return rc;
}

/* The JSON log opened for appending (parent directories made): a regular file, created when
 * missing, or a pipe or FIFO whose reader is already there; a FIFO nobody reads is refused at
 * once rather than waited on, and so is a file of the run directory's own. */
static int open_json_log(FILE **out, const char *path, const char *ckpt_dir)
{
    *out = NULL;
    if (!path[0])
        return zr_err_set(ZR_EINVAL, "--log-json: empty path (give a file, or none)");
    make_parent_dirs(path); /* open says what is wrong if this was not enough */
    ZR_TRY(json_log_not_the_runs(path, ckpt_dir));
    /* the run directory holds no symbolic links: one there would have zrun append outside it */
    int in_run = zr_train__log_in_run(path, ckpt_dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC |
                            (in_run ? O_NOFOLLOW : 0), 0644);
    if (fd < 0 && errno == ELOOP && in_run)
        return zr_err_set(ZR_EINVAL, "--log-json %s: a symbolic link inside the run directory "
                          "%s, whose files are its own (zrun would append to the file it "
                          "names): remove the link, or give --log-json that file's path",
                          path, ckpt_dir);
    if (fd < 0 && errno == ENXIO)
        return zr_err_set(ZR_EINVAL, "--log-json %s: a FIFO that no process reads (start its "
                          "reader first, or give a file)", path);
    if (fd < 0)
        return zr_err_sys(errno, "%s: open for appending", path);
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 || !(*out = fdopen(fd, "a"))) {
        int e = errno;
        close(fd);
        return zr_err_sys(e, "%s: open for appending", path);
    }
    return 0;
}

/* A resume behind the JSON log's last step (a crash after steps the checkpoint does not hold):
 * the steps redone said, one "resume" record in the log and a line on the step log. */
static void log_redone(run *r, uint64_t logged)
{
    if (!r->rd || logged <= r->step)
        return;
    uint64_t k = logged - r->step;
    char when[32];
    if (r->jlog) {
        fprintf(r->jlog, "{\"event\":\"resume\",\"time\":\"%s\",\"run_id\":\"%s\","
                         "\"from_step\":%llu,\"redone_steps\":%llu,\"logged_step\":%llu,"
                         "\"checkpoint_run_id\":\"%s\"}\n",
                iso_time(when), r->run_id, (unsigned long long)r->step,
                (unsigned long long)k, (unsigned long long)logged, r->ck_run_id);
        json_log_flush(r);
    }
    if (r->log)
        fprintf(r->log, "note: %s already holds steps up to %llu: steps %llu-%llu are redone "
                        "(%llu step%s), and appear again in it\n", r->o->log_json,
                (unsigned long long)logged, (unsigned long long)r->step + 1,
                (unsigned long long)logged, (unsigned long long)k, k == 1 ? "" : "s");
}

/* The states from the checkpoint (*ckpt_error set when that fails), or each rank initializes
 * what it holds; then the JSON log and the first lines. */
static int resume_or_init(run *r, int *ckpt_error)
{
    const zr_train_opts *o = r->o;
    if (r->rd) {
        double t0 = now_s();
        int rc = agree(r, load(r, r->rd));
        *ckpt_error = rc != 0;
        if (rc)
            return rc;
        if (r->log)
            fprintf(r->log, "resumed from %s (world %u, ZeRO %d; %s, %.2f s) at world %d, "
                            "ZeRO %d: continuing at step %llu, next sample %llu\n",
                    zck_reader_path(r->rd), zck_reader_world(r->rd),
                    zck_reader_zero_stage(r->rd), verify_words[o->verify_on_resume],
                    now_s() - t0, r->W, o->zero_stage, (unsigned long long)r->step + 1,
                    (unsigned long long)r->next_sample);
    } else {
        init_ctx ic = {r->model, o->seed};
        ZR_TRY(agree(r, zr_zero_init_params(r->zero, init_fill, &ic)));
    }
    int lrc = 0;
    if (o->log_json && r->rank == 0) {
        uint64_t logged = r->rd ? logged_max_step(o->log_json) : 0;
        if (!(lrc = open_json_log(&r->jlog, o->log_json, o->ckpt_dir)))
            log_redone(r, logged);
    }
    ZR_TRY(agree(r, lrc));
    if (r->log && r->dev)
        fprintf(r->log, "device: %s\n", r->dev_name);
    if (r->log && !r->rd)
        fprintf(r->log, "training a %u-layer %s (%llu parameters) on %s, %llu steps, batch "
                        "%u x %u tokens, %d rank%s, ZeRO stage %d\n", r->cfg.layers,
                r->cfg.family == ZR_FAMILY_LLAMA ? "Llama" : "GPT-2",
                (unsigned long long)zr_model_numel(r->model), zr_data_describe(r->data),
                (unsigned long long)o->steps, o->batch, r->T, r->W, r->W == 1 ? "" : "s",
                o->zero_stage);
    if (r->log && o->eval_every)
        fprintf(r->log, "validation every %llu steps and at the last: %s\n",
                (unsigned long long)o->eval_every, zr_train__eval_describe(r->eval));
    return 0;
}

/* The run diverged at step r->step + 1: the asynchronous save of an earlier step still in
 * flight is committed (its state was sound), nothing of this step is saved, and the error names
 * the step and the newest checkpoint, which is left as it is. */
static int diverged(run *r, zr_train_result *out, float loss, float norm)
{
    ZR_TRY(finish_pending(r, out->ckpt, sizeof out->ckpt));
    char *latest = NULL;
    if (zck_latest(&latest, r->o->ckpt_dir) < 0)
        zr_err_clear();
    int rc = zr_err_set(ZR_ERROR, "step %llu: the loss is %g and the gradient norm %g: the "
                        "run diverged and stops without saving this step; %s%s (lower --lr or "
                        "set --grad-clip%s)", (unsigned long long)r->step + 1,
                        isnan(loss) ? NAN : (double)loss, isnan(norm) ? NAN : (double)norm,
                        latest ? "the newest checkpoint stays " : "no checkpoint was saved yet",
                        latest ? latest : "", latest ? ", and run again to resume from it" : "");
    free(latest);
    return rc;
}

/* Every sample_every steps: the parameters gathered to rank 0 (every rank takes part), which
 * prints the greedy continuation of the prompt after the step line and logs it as an event. */
static int sample_now(run *r)
{
    const zr_train_opts *o = r->o;
    if (!o->sample_every || r->step % o->sample_every)
        return 0;
    zr_train__sampler *s = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t len = 0;
    int rc = agree(r, zr_train__sample_begin(&s, r->zero, r->L, &r->cfg, r->rank, r->W));
    if (!rc)
        rc = zr_train__sample_gather(s, r->zero);
    if (!rc)
        rc = agree(r, r->rank == 0 ? zr_train__sample_text(s, sample_prompt(o), &r->codec,
                                                           o->sample_tokens, &text, &len, &ids)
                                   : 0);
    zr_train__sample_free(s);
    if (rc || r->rank != 0)
        return rc;
    const char *pr = sample_prompt(o);
    size_t plen = strlen(pr);
    if (r->log) { /* one line: control characters (newlines too) shown as '?' */
        char *p = malloc(len + 1);
        for (size_t i = 0; p && i <= len; i++)
            p[i] = i < len && !text[i] ? '?' : text[i];
        if (p)
            fprintf(r->log, "sample at step %llu: %s\n", (unsigned long long)r->step,
                    zr_printable(p, len + 1, p));
        free(p);
    }
    char *u = malloc(3 * (len + plen) + 2), *up = u ? u + 3 * len + 1 : NULL;
    if (u && r->jlog) {
        char when[32];
        json_t *a = json_array();
        for (uint32_t i = 0; i < o->sample_tokens; i++)
            json_array_append_new(a, json_integer(ids[i]));
        json_t *j = json_pack("{s:s, s:I, s:o, s:o, s:o, s:s, s:s}", "event", "sample", "step",
                              (json_int_t)r->step, "prompt",
                              json_stringn(up, zr_gen_utf8_repair(up, pr, plen)), "ids", a,
                              "text", json_stringn(u, zr_gen_utf8_repair(u, text, len)),
                              "time", iso_time(when), "run_id", r->run_id);
        char *line = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (line)
            fprintf(r->jlog, "%s\n", line);
        json_log_flush(r);
        free(line);
        json_decref(j);
    }
    free(u);
    free(text);
    free(ids);
    return 0;
}

/* Rank 0 redraws RUN/train.svg from the JSON log (at each save and at the end); a failure is
 * said, and training goes on. */
static void plot(run *r)
{
    if (!r->jlog)
        return;
    char *svg = NULL;
    if (asprintf(&svg, "%s/train.svg", r->o->ckpt_dir) < 0)
        return;
    if (zr_plot_write(NULL, r->o->log_json, svg) && r->log)
        fprintf(r->log, "warning: %s not drawn: %s\n", svg, zr_err_msg());
    zr_err_clear();
    free(svg);
}

/* Validation every eval_every steps and at the last step (before the step's line, which
 * shows it, and its save, which records it). */
static int eval_if_due(run *r)
{
    const zr_train_opts *o = r->o;
    r->val.now = 0;
    if (!o->eval_every || (r->step % o->eval_every && r->step < o->steps))
        return 0;
    zr_eval_io io = {r->zero, r->model, r->dev, r->dmodel, r->rank, r->W};
    double v;
    ZR_TRY(zr_train__eval_run(r->eval, &io, &v));
    zr_train__val_note(&r->val, r->step, v);
    return 0;
}

/* Steps until the end, a stop (signal, --stop-after, time limit) or an error; saves every
 * save_every steps. *done: steps taken here, *saved_now: the last one was just saved. */
static int train_loop(run *r, zr_train_result *out, float *loss, uint64_t *done,
                      int *saved_now)
{
    const zr_train_opts *o = r->o;
    double t_start = now_s(), slowest = 0;
    while (r->step < o->steps) {
        if (o->stop_after && *done >= o->stop_after) {
            out->stopped = 1;
            break;
        }
        /* a signal, or no time for another step after this one */
        double t0 = now_s(), el = t0 - t_start;
        int sig = o->stop && *o->stop, tl = o->time_limit > 0;
        if (r->W == 1 && (sig || (tl && el + 2 * slowest + 1.0 > o->time_limit))) {
            out->stopped = 1; /* nothing to agree on: stop before the step */
            break;
        }
        int wish = sig || (tl && el + 3 * slowest + 1.0 > o->time_limit);
        float lr = 0, norm = 0;
        int stop = 0, saves = 0, st = train_step(r, wish, &stop, &saves, loss, &lr, &norm);
        if (st)
            return st < 0 ? st : diverged(r, out, *loss, norm);
        /* an asynchronous save whose shards are all durable is committed at this step
         * boundary; a failed one stops the run here, naming the file, without a commit */
        if (saves == 2 || saves < 0)
            ZR_TRY(finish_pending(r, out->ckpt, sizeof out->ckpt));
        double dt = now_s() - t0;
        if (dt > slowest)
            slowest = dt;
        (*done)++;
        ZR_TRY(eval_if_due(r));
        log_step(r, 0, *loss, lr, norm, dt, 0);
        *saved_now = 0;
        if (o->save_every && r->step % o->save_every == 0 && r->step < o->steps) {
            ZR_TRY(save(r, *loss, out->ckpt, sizeof out->ckpt));
            *saved_now = 1;
        }
        log_step(r, 1, *loss, lr, norm, dt, *saved_now ? r->blocked_s * 1e3 : 0);
        ZR_TRY(sample_now(r));
        if (*saved_now)
            plot(r);
        if (stop && r->step < o->steps) {
            out->stopped = 1;
            break;
        }
    }
    return 0;
}

/* The final (or stopping) checkpoint, unless this exact step was just saved; then no save is
 * left in flight; the summary line. */
static int finish(run *r, zr_train_result *out, float loss, uint64_t done, int saved_now)
{
    const zr_train_opts *o = r->o;
    if (done && !saved_now)
        ZR_TRY(save(r, loss, out->ckpt, sizeof out->ckpt));
    ZR_TRY(finish_pending(r, out->ckpt, sizeof out->ckpt));
    if (done)
        plot(r);
    out->step = r->step;
    out->loss = loss;
    if (r->log && !done)
        fprintf(r->log, "nothing to do: %llu of %llu steps already done%s%s\n",
                (unsigned long long)r->step, (unsigned long long)o->steps,
                r->from ? "; newest checkpoint " : "", r->from ? r->from : "");
    else if (r->log)
        fprintf(r->log, "%s at step %llu/%llu, loss %.4f, peak RSS %.1f MiB (rank 0)%s%s\n",
                out->stopped ? "stopped" : "done", (unsigned long long)r->step,
                (unsigned long long)o->steps, loss, rss_peak() / 1048576.0,
                out->ckpt[0] ? "; checkpoint " : "", out->ckpt);
    if (r->log && r->jlog_lost)
        fprintf(r->log, "warning: the JSON log %s lacks the records from step %llu on (its "
                        "write failed)\n", o->log_json, (unsigned long long)r->jlog_lost);
    return 0;
}

int zr_train(zr_train_result *out, const zr_train_opts *o)
{
    memset(out, 0, sizeof *out);
    ZR_TRY(zr_train__check_opts(o));
    run r;
    memset(&r, 0, sizeof r);
    r.o = o;
    set_run_id(&r);
    int rc = 0, saved_now = 0;
    float loss = 0;
    uint64_t done = 0;
    ZR_TRY_GOTO(open_world(&r), rc, out);
    /* a failure picking, opening or loading the checkpoint (and checking the model and the
     * tokenizer beside it) is the checkpoint's part; the data and the engine are not */
    out->ckpt_error = 1;
    ZR_TRY_GOTO(agree(&r, pick_start(&r)), rc, out);
    out->ckpt_error = 0;
    ZR_TRY_GOTO(agree(&r, build_engine(&r)), rc, out);
    ZR_TRY_GOTO(resume_or_init(&r, &out->ckpt_error), rc, out);
    zr_train__retain_at_start(r.log, r.lock, o, r.rd ? zck_reader_path(r.rd) : NULL);
    out->start_step = r.step;
    ZR_TRY_GOTO(train_loop(&r, out, &loss, &done, &saved_now), rc, out);
    ZR_TRY_GOTO(finish(&r, out, loss, done, saved_now), rc, out);
out:
    free_run(&r, rc != 0);
    return rc;
}
