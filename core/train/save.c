/*
 * save.c: a checkpoint of the run (train_int.h): every rank writes its shard into the staging
 * directory rank 0 made, rank 0 commits once every rank's shard is durable. Synchronous, or
 * asynchronous through the saver (saver.h), whose save in flight is finished here.
 */
#include "train_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Rank 0 makes the staging directory of a save of this step and tells the others. */
static int make_staging(run *r, char **staging)
{
    char *local = NULL;
    uint64_t nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e6);
    int lrc = r->rank == 0 ? zck_staging_create(&local, r->o->ckpt_dir, r->step, nonce) : 0;
    int rc = zr_train__share_text(r, 0, lrc, lrc ? zr_err_msg() : local, staging);
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
    ZR_TRY_GOTO(zr_train__agree(r, lrc), rc, out);
    if (!(jsons = calloc((size_t)r->W, sizeof *jsons)) ||
        !(sh = calloc((size_t)r->W, sizeof *sh))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    for (int q = 0; q < r->W; q++)
        ZR_TRY_GOTO(zr_train__share_text(r, q, 0, json, &jsons[q]), rc, out);
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
    ZR_TRY_GOTO(zr_train__share_text(r, 0, lrc, lrc ? zr_err_msg() : final, &res), rc, out);
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
int zr_train__finish_pending(run *r, char *path_out, size_t cap)
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
    ZR_TRY_GOTO(zr_train__agree(r, zr_saver_snapshot(r->saver, r->zero)), rc, out);
    ZR_TRY_GOTO(zr_train__finish_pending(r, path_out, cap), rc, out);
    ZR_TRY_GOTO(training_json(&train, r, loss), rc, out);
    ZR_TRY_GOTO(make_staging(r, &staging), rc, out);
    ZR_TRY_GOTO(zr_train__agree(r, zr_saver_write(r->saver, staging)), rc, out);
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

int zr_train__save(run *r, float loss, char *path_out, size_t cap)
{
    return r->saver ? save_async(r, loss, path_out, cap) : save_sync(r, loss, path_out, cap);
}
