/*
 * train_int.h: the checks of train.c that the audit (audit.c) applies too, so that both refuse
 * the same resumes with the same words. Internal to core/train (double underscore: not for
 * cli/). Each returns 0 or ZR_EINVAL (resume_path: the errors of zck_resume_pick) with the
 * message zr_train would give.
 */
#ifndef ZR_TRAIN_INT_H
#define ZR_TRAIN_INT_H

#include "model.h"
#include "section.h"
#include "train.h"
#include "zero.h"

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

/* The dry run's figures besides the engine's (memplan.c): one rank's host staging for
 * asynchronous saves (b: its zr_zero_plan; on_gpu: a pinned copy of its partitions instead of
 * the bounded buffer), and the process's own bytes (code, libraries, BLAS buffers, the data,
 * the communication segment) for this model and shape. */
uint64_t zr_train__save_staging(const zr_train_opts *o, const zr_zero_bytes *b, int on_gpu);
uint64_t zr_train__baseline(const zr_gpt2_config *cfg, uint32_t micro_batch, uint32_t seq,
                            const zr_train_opts *o, int world);

#endif
