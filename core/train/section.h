/*
 * section.h: internal to core/train (and its tests and fuzz target): the training section of
 * a manifest as a resumed run reads it.
 */
#ifndef ZR_TRAIN_SECTION_H
#define ZR_TRAIN_SECTION_H

#include <stdint.h>

typedef struct {
    uint64_t optimizer_step, next_sample; /* in: the run's; out: the section's where it says */
    uint64_t seed, batch, seq;            /* in: the run's; out: the section's where it says */
    int order_known;  /* 1 when seed, batch and seq were each absent or a valid integer */
    char *data;       /* the section's "data" string (malloc'ed), NULL when it has none */
    char *run_id;     /* the run id of the invocation that saved it (malloc'ed), or NULL */
    /* validation (zrun --eval-every): the last evaluation and the best so far, each present
     * when the section has a finite number for it and a non-negative integer step; val_set the
     * evaluation set they were measured on (malloc'ed, or NULL) */
    int has_val, has_best;
    double val_loss, best_val_loss;
    uint64_t val_step, best_val_step;
    char *val_set;
    /* the learning-rate schedule it was trained with: sched_known 1 when steps, warmup, lr and
     * min_lr_ratio are all present and valid (non-negative integers, finite numbers) */
    int sched_known;
    uint64_t steps, warmup;
    double lr, min_lr_ratio;
} zr_train__section;

/* Parse the training section (JSON object text). ZR_ECORRUPT "training section unreadable" or
 * naming the field when optimizer_step or next_sample is not a non-negative integer; a bad seed,
 * batch or seq only leaves order_known 0, a bad schedule field sched_known 0, a bad validation
 * field has_val or has_best 0. Free
 * s->data, s->run_id and s->val_set with zr_train__section_clear, whatever
 * the result. */
int zr_train__section_parse(zr_train__section *s, const char *json);
void zr_train__section_clear(zr_train__section *s);

#endif
