/*
 * eval.h: internal to core/train: the validation loss of zrun --eval-every, on a fixed set of
 * held-out sequences (eval.c).
 */
#ifndef ZR_TRAIN_EVAL_H
#define ZR_TRAIN_EVAL_H

#include "device.h"
#include "model.h"
#include "train.h"
#include "zero.h"

#include <jansson.h>

typedef struct zr_eval zr_eval;

/* What an evaluation runs on: the ZeRO engine and this rank's model (the CPU model, or dmodel
 * on dev). */
typedef struct {
    zr_zero *zero;
    zr_model *model;
    const zr_device_ops *dev;
    zr_dev_model *dmodel;
    int rank, W;
} zr_eval_io;

/* The validation data: o->val_data (opened as --data is, same checks; "synthetic": its
 * held-out continuation), else the held-out part of train (zr_data_hold_out, which training
 * then never samples). Without o->val_data the hold-out is made even when o->eval_every is 0,
 * so the sample order does not depend on it; only a training file too short to hold out a part
 * is then kept whole (an error with o->eval_every). Sequences of T tokens, o->eval_batches x
 * o->batch of them. *out is freed with zr_train__eval_free, before train. */
int zr_train__eval_open(zr_eval **out, const zr_train_opts *o, zr_data *train, uint32_t vocab,
                        uint32_t T);
void zr_train__eval_free(zr_eval *e);
/* "64 sequences of 128 tokens from the held-out tail of file 'x' ...". */
const char *zr_train__eval_describe(const zr_eval *e);
/* The evaluation set as a resumed run compares it: "val_data|sequences|T". */
const char *zr_train__eval_set(const zr_eval *e);
/* The mean loss over the evaluation set, the same bits on every rank and at every world size
 * and stage (a forward of one sequence at a time; each rank takes sequences rank, rank + W, ...;
 * the per-sequence losses gathered and summed in sequence order). Every rank calls it between
 * steps. */
int zr_train__eval_run(zr_eval *e, const zr_eval_io *io, double *out);

/* The run's validation record: the last evaluation and the best so far (kept across resumes
 * in the training section), now: evaluated at the step being logged. */
typedef struct {
    int has_val, has_best, now;
    double val, best;
    uint64_t val_step, best_step;
} zr_val_record;
/* An evaluation at step: the last one, the best when lower (or the first finite one). */
void zr_train__val_note(zr_val_record *v, uint64_t step, double loss);
/* The record into the training section j: val_loss, val_step, best_val_loss, best_val_step,
 * val_set (set: the evaluation set, or NULL); nothing for what it does not have. */
int zr_train__val_to_json(json_t *j, const zr_val_record *v, const char *set);

#endif
