/*
 * eval.c: the validation loss (eval.h). The evaluation set is fixed: eval_batches x batch
 * sequences of T tokens at evenly spaced positions of the validation data (zr_data_window), the
 * same whatever the seed, world size or stage. Each sequence goes through the model alone
 * (B = 1), so its loss does not depend on which rank computes it or with which others; the
 * losses are gathered and summed in sequence order in double. At stage 3 the forwards gather
 * the parameters through a forward-only schedule (zr_zero_begin_eval).
 */
#include "eval.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct zr_eval {
    zr_data *data;      /* NULL: no validation part (a short file, eval off) */
    zr_data *owner;     /* --val-data opened here (data itself, or what data is a view of) */
    uint32_t T;
    uint64_t seqs;      /* sequences per evaluation */
    int32_t *tokens;    /* T+1 */
    double *mine, *all; /* [seqs / W], [seqs] */
    char *desc, *set;
};

static int eval_strings(zr_eval *e, const zr_train_opts *o)
{
    const char *what = e->data ? zr_data_describe(e->data) : "nothing";
    if (asprintf(&e->desc, "%llu sequences of %u tokens from %s", (unsigned long long)e->seqs,
                 e->T, what) < 0) {
        e->desc = NULL;
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    if (asprintf(&e->set, "%s|%llu|%u", o->val_data ? o->val_data : "held-out",
                 (unsigned long long)e->seqs, e->T) < 0) {
        e->set = NULL;
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    return 0;
}

/* e->data: --val-data (the synthetic corpus: its held-out continuation), else the held-out
 * part of train. */
static int eval_data(zr_eval *e, const zr_train_opts *o, zr_data *train, uint32_t vocab)
{
    if (!o->val_data) {
        int rc = zr_data_hold_out(&e->data, train);
        if (rc && rc == ZR_EINVAL && !o->eval_every) {
            zr_err_clear(); /* too short to split, and no evaluation: trained on whole */
            return 0;
        }
        return rc;
    }
    int rc = zr_data_open(&e->owner, o->val_data, vocab, e->T, o->seed);
    if (rc) {
        zr_err_prefix("--val-data: ");
        return rc;
    }
    if (strcmp(o->val_data, "synthetic")) {
        e->data = e->owner;
        return 0;
    }
    return zr_data_hold_out(&e->data, e->owner);
}

int zr_train__eval_open(zr_eval **out, const zr_train_opts *o, zr_data *train, uint32_t vocab,
                        uint32_t T)
{
    zr_eval *e = calloc(1, sizeof *e);
    if (!e)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    e->T = T;
    e->seqs = (uint64_t)o->eval_batches * o->batch;
    int rc = eval_data(e, o, train, vocab);
    if (!rc)
        rc = eval_strings(e, o);
    if (!rc && o->eval_every &&
        (!(e->tokens = malloc((T + 1) * sizeof *e->tokens)) ||
         !(e->mine = calloc(e->seqs, sizeof *e->mine)) ||
         !(e->all = calloc(e->seqs, sizeof *e->all))))
        rc = zr_err_set(ZR_ENOMEM, "out of memory (evaluation of %llu sequences)",
                        (unsigned long long)e->seqs);
    if (rc) {
        zr_train__eval_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void zr_train__eval_free(zr_eval *e)
{
    if (!e)
        return;
    if (e->data != e->owner)
        zr_data_free(e->data); /* a view: before what it borrows from */
    zr_data_free(e->owner);
    free(e->tokens);
    free(e->mine);
    free(e->all);
    free(e->desc);
    free(e->set);
    free(e);
}

const char *zr_train__eval_describe(const zr_eval *e) { return e->desc; }

const char *zr_train__eval_set(const zr_eval *e) { return e->set; }

static int forward_one(const zr_eval_io *io, const int32_t *tokens, uint32_t T, float *loss)
{
    if (io->dev)
        return io->dev->model_forward(io->dmodel, tokens, tokens + 1, 1, T, loss);
    return zr_model_forward(io->model, tokens, tokens + 1, 1, T, loss);
}

int zr_train__eval_run(zr_eval *e, const zr_eval_io *io, double *out)
{
    if (!e->data || !e->tokens)
        return zr_err_set(ZR_EINVAL, "evaluation: no validation data was set up");
    /* the batch is a multiple of W (zr_train__check_world): every rank the same count */
    size_t W = (size_t)io->W, n = (size_t)(e->seqs / W);
    ZR_TRY(zr_zero_begin_eval(io->zero, (unsigned)n));
    for (size_t k = 0; k < n; k++) {
        float l;
        zr_data_window(e->data, (uint64_t)k * W + (uint64_t)io->rank, e->seqs, e->tokens);
        ZR_TRY(forward_one(io, e->tokens, e->T, &l));
        e->mine[k] = l;
    }
    ZR_TRY(zr_zero_gather_f64(io->zero, e->mine, n, e->all));
    double sum = 0; /* sequence i is rank i mod W's number i / W */
    for (uint64_t i = 0; i < e->seqs; i++)
        sum += e->all[(i % W) * n + i / W];
    *out = sum / (double)e->seqs;
    return 0;
}

void zr_train__val_note(zr_val_record *v, uint64_t step, double loss)
{
    v->has_val = v->now = 1;
    v->val = loss;
    v->val_step = step;
    if (isfinite(loss) && (!v->has_best || loss < v->best)) {
        v->has_best = 1;
        v->best = loss;
        v->best_step = step;
    }
}

int zr_train__val_to_json(json_t *j, const zr_val_record *v, const char *set)
{
    int bad = 0;
    if (v->has_val && isfinite(v->val)) {
        bad |= json_object_set_new(j, "val_loss", json_real(v->val));
        bad |= json_object_set_new(j, "val_step", json_integer((json_int_t)v->val_step));
    }
    if (v->has_best) {
        bad |= json_object_set_new(j, "best_val_loss", json_real(v->best));
        bad |= json_object_set_new(j, "best_val_step", json_integer((json_int_t)v->best_step));
    }
    if (set && (v->has_val || v->has_best))
        bad |= json_object_set_new(j, "val_set", json_string(set));
    return bad ? zr_err_set(ZR_ENOMEM, "out of memory") : 0;
}
