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
#include "train_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    int rc = zr_train__gather_f64(r, mine, 3, all);
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

/* ---------------------------------------------------------------- the run, top to bottom */

/* The run diverged at step r->step + 1: the asynchronous save of an earlier step still in
 * flight is committed (its state was sound), nothing of this step is saved, and the error names
 * the step and the newest checkpoint, which is left as it is. */
static int diverged(run *r, zr_train_result *out, float loss, float norm)
{
    ZR_TRY(zr_train__finish_pending(r, out->ckpt, sizeof out->ckpt));
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
            ZR_TRY(zr_train__finish_pending(r, out->ckpt, sizeof out->ckpt));
        double dt = now_s() - t0;
        if (dt > slowest)
            slowest = dt;
        (*done)++;
        ZR_TRY(eval_if_due(r));
        zr_train__log_step(r, 0, *loss, lr, norm, dt, 0);
        *saved_now = 0;
        if (o->save_every && r->step % o->save_every == 0 && r->step < o->steps) {
            ZR_TRY(zr_train__save(r, *loss, out->ckpt, sizeof out->ckpt));
            *saved_now = 1;
        }
        zr_train__log_step(r, 1, *loss, lr, norm, dt, *saved_now ? r->blocked_s * 1e3 : 0);
        ZR_TRY(zr_train__sample_now(r));
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
        ZR_TRY(zr_train__save(r, loss, out->ckpt, sizeof out->ckpt));
    ZR_TRY(zr_train__finish_pending(r, out->ckpt, sizeof out->ckpt));
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
                (unsigned long long)o->steps, loss, zr_train__rss_peak() / 1048576.0,
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
    zr_train__set_run_id(&r);
    int rc = 0, saved_now = 0;
    float loss = 0;
    uint64_t done = 0;
    ZR_TRY_GOTO(zr_train__open_world(&r), rc, out);
    /* a failure picking, opening or loading the checkpoint (and checking the model and the
     * tokenizer beside it) is the checkpoint's part; the data and the engine are not */
    out->ckpt_error = 1;
    ZR_TRY_GOTO(zr_train__agree(&r, zr_train__pick_start(&r)), rc, out);
    out->ckpt_error = 0;
    ZR_TRY_GOTO(zr_train__agree(&r, zr_train__build_engine(&r)), rc, out);
    ZR_TRY_GOTO(zr_train__resume_or_init(&r, &out->ckpt_error), rc, out);
    zr_train__retain_at_start(r.log, r.lock, o, r.rd ? zck_reader_path(r.rd) : NULL);
    out->start_step = r.step;
    ZR_TRY_GOTO(train_loop(&r, out, &loss, &done, &saved_now), rc, out);
    ZR_TRY_GOTO(finish(&r, out, loss, done, saved_now), rc, out);
out:
    zr_train__free_run(&r, rc != 0);
    return rc;
}
