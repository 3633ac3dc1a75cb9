/*
 * train.c: the training loop at world 1. Parameters, gradients and AdamW states live in flat
 * group arenas (the layout of zr_gpt2_layout), so that ZeRO partitioning later changes which
 * range of a group a rank owns, not the code that does the math. Each optimizer step runs
 * micro-batches of samples drawn by global sample index, clips by the global gradient norm and
 * updates every tensor with AdamW (weight decay on matrices only). Checkpoints go through ckpt/
 * only: params, exp_avg, exp_avg_sq per group, the model config and the training state (step,
 * schedule, data position; the run has no other randomness) in the manifest sections. A resume
 * restores all of it, so training continues as if it had never stopped.
 */
#include "zr.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    size_t group;
    uint64_t offset, numel; /* elements, within the group */
    int decay;              /* matrices (ndim >= 2) get weight decay */
} span;

typedef struct {
    const zr_train_opts *o;
    zr_gpt2_config cfg;
    zr_model *model;
    zck_layout *L;
    float *m, *v;           /* AdamW states, all groups end to end (same offsets as params) */
    uint64_t *goff;         /* group offsets into m and v */
    size_t ng;
    span *spans;
    size_t nspans;
    uint32_t T, mb, n_micro;
    uint64_t step, next_sample;
    int32_t *tokens, *inputs, *targets;
    zr_data *data;
    FILE *jlog;
} run;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static float *arena(size_t n_floats)
{
    size_t align = (size_t)2 << 20, bytes = (n_floats * sizeof(float) + align - 1) / align * align;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes ? bytes : align))
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 0, bytes);
    return p;
}

/* ---------------------------------------------------------------- checkpoints */

static int training_json(char **out, const run *r, float loss)
{
    const zr_train_opts *o = r->o;
    json_t *j = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:f, s:f, s:s, "
                          "s:f}",
                          "step", (json_int_t)r->step, "optimizer_step", (json_int_t)r->step,
                          "next_sample", (json_int_t)r->next_sample, "seed", (json_int_t)o->seed,
                          "batch", (json_int_t)o->batch, "seq", (json_int_t)r->T, "lr",
                          (double)o->lr, "min_lr_ratio", (double)o->min_lr_ratio, "warmup",
                          (json_int_t)o->warmup, "steps", (json_int_t)o->steps, "weight_decay",
                          (double)o->weight_decay, "grad_clip", (double)o->grad_clip, "data",
                          o->data, "loss", (double)loss);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!s)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    *out = s;
    return 0;
}

static int save(run *r, float loss, char *path_out, size_t cap)
{
    const zr_train_opts *o = r->o;
    char *staging = NULL, *model = NULL, *train = NULL, *final = NULL;
    zck_writer *w = NULL;
    zck_shard *sh = NULL;
    uint64_t nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e6);
    int rc = 0;
    ZR_TRY_GOTO(zck_staging_create(&staging, o->ckpt_dir, r->step, nonce), rc, out);
    ZR_TRY_GOTO(zck_writer_open(&w, staging, r->L, 1, 0, NULL), rc, out);
    for (size_t g = 0; g < r->ng; g++) {
        uint64_t n = zr_model_group_numel(r->model, g);
        ZR_TRY_GOTO(zck_writer_put(w, g, 0, 0, n, zr_model_param(r->model, g)), rc, out);
        ZR_TRY_GOTO(zck_writer_put(w, g, 1, 0, n, r->m + r->goff[g]), rc, out);
        ZR_TRY_GOTO(zck_writer_put(w, g, 2, 0, n, r->v + r->goff[g]), rc, out);
    }
    ZR_TRY_GOTO(zck_writer_finish(w, &sh), rc, out);
    ZR_TRY_GOTO(zr_gpt2_config_to_json(&model, &r->cfg), rc, out);
    ZR_TRY_GOTO(training_json(&train, r, loss), rc, out);
    zck_commit_opts co = ZCK_COMMIT_OPTS_INIT;
    co.step = r->step;
    co.world = 1;
    co.zero_stage = o->zero_stage;
    co.model_json = model;
    co.training_json = train;
    co.keep_last = o->keep_last;
    ZR_TRY_GOTO(zck_commit(&final, o->ckpt_dir, staging, r->L, &sh, 1, &co), rc, out);
    snprintf(path_out, cap, "%s", final);
out:
    zck_writer_free(w);
    zck_shard_free(sh);
    free(staging);
    free(model);
    free(train);
    free(final);
    return rc;
}

static int json_u64(const json_t *j, const char *key, uint64_t *out)
{
    json_t *v = json_object_get(j, key);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return zr_err_set(ZR_ECORRUPT, "training section: '%s' is not a non-negative integer",
                          key);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Check that the checkpoint holds this model: same groups, sizes, tensors, and f32 states. */
static int check_layout(const zck_layout *ck, const zck_layout *want, const char *path)
{
    if (zck_layout_n_groups(ck) != zck_layout_n_groups(want))
        return zr_err_set(ZR_EINVAL, "%s: checkpoint has %zu parameter groups, this model %zu "
                          "(another model shape)", path, zck_layout_n_groups(ck),
                          zck_layout_n_groups(want));
    for (size_t g = 0; g < zck_layout_n_groups(want); g++) {
        if (strcmp(zck_layout_group_name(ck, g), zck_layout_group_name(want, g)) ||
            zck_layout_group_numel(ck, g) != zck_layout_group_numel(want, g) ||
            zck_layout_group_n_tensors(ck, g) != zck_layout_group_n_tensors(want, g))
            return zr_err_set(ZR_EINVAL, "%s: group %zu is '%s' of %llu elements, this model "
                              "expects '%s' of %llu (another model shape)", path, g,
                              zck_layout_group_name(ck, g),
                              (unsigned long long)zck_layout_group_numel(ck, g),
                              zck_layout_group_name(want, g),
                              (unsigned long long)zck_layout_group_numel(want, g));
        for (size_t t = 0; t < zck_layout_group_n_tensors(want, g); t++) {
            zck_tensor_info a, b;
            zck_layout_tensor(ck, g, t, &a);
            zck_layout_tensor(want, g, t, &b);
            if (strcmp(a.name, b.name) || a.numel != b.numel || a.offset != b.offset)
                return zr_err_set(ZR_EINVAL, "%s: tensor '%s' where this model has '%s'", path,
                                  a.name, b.name);
        }
    }
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

/* Find what to resume from: NULL path when starting fresh. */
static int resume_path(char **out, const zr_train_opts *o)
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
    if (!strcmp(o->resume, "auto")) {
        /* the newest complete checkpoint: normally what latest names, or a newer one whose
         * commit was interrupted after its directory was renamed into place */
        int is_latest = 1;
        int rc = zck_resume_point(out, &is_latest, o->ckpt_dir);
        if (rc == ZR_ENOTFOUND) {
            zr_err_clear();
            *out = NULL;
            return 0;
        }
        if (!rc && !is_latest && o->log)
            fprintf(o->log, "note: %s is complete and newer than what %s/latest names (its "
                            "commit was interrupted): resuming from it\n", *out, o->ckpt_dir);
        if (rc)
            zr_err_prefix("--resume auto: ");
        return rc;
    }
    if (!(*out = strdup(o->resume)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    return 0;
}

static int load(run *r, zck_reader *rd)
{
    const zck_layout *L = zck_reader_layout(rd);
    ZR_TRY(check_layout(L, r->L, zck_reader_path(rd)));
    size_t sp, sm, sv;
    zck_layout_find_state(L, &sp, "param");
    zck_layout_find_state(L, &sm, "exp_avg");
    zck_layout_find_state(L, &sv, "exp_avg_sq");
    zck_read_req *q = calloc(3 * r->ng, sizeof *q);
    if (!q)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t g = 0; g < r->ng; g++) {
        uint64_t n = zr_model_group_numel(r->model, g);
        q[3 * g] = (zck_read_req){g, sp, 0, n, zr_model_param(r->model, g)};
        q[3 * g + 1] = (zck_read_req){g, sm, 0, n, r->m + r->goff[g]};
        q[3 * g + 2] = (zck_read_req){g, sv, 0, n, r->v + r->goff[g]};
    }
    zck_read_opts ro = ZCK_READ_OPTS_INIT; /* every file hashed while it is read */
    ro.jobs = r->o->threads > 0 ? (unsigned)r->o->threads : 1;
    int rc = zck_reader_read(rd, q, 3 * r->ng, &ro);
    free(q);
    if (rc)
        return rc;
    json_error_t je;
    json_t *t = json_loads(zck_reader_training_json(rd), 0, &je);
    if (!t)
        return zr_err_set(ZR_ECORRUPT, "%s: training section unreadable", zck_reader_path(rd));
    rc = json_u64(t, "optimizer_step", &r->step);
    if (!rc)
        rc = json_u64(t, "next_sample", &r->next_sample);
    /* a different seed, batch, sequence length or data source changes which samples come
     * next: allowed (a deliberate change), but said */
    uint64_t seed = r->o->seed, batch = r->o->batch, seq = r->T;
    json_t *dv = json_object_get(t, "data");
    if (!rc && !json_u64(t, "seed", &seed) && !json_u64(t, "batch", &batch) &&
        !json_u64(t, "seq", &seq) && r->o->log &&
        (seed != r->o->seed || batch != r->o->batch || seq != r->T ||
         (json_is_string(dv) && strcmp(json_string_value(dv), r->o->data))))
        fprintf(r->o->log, "note: the checkpoint was trained with seed %llu, batch %llu, seq "
                           "%llu, data %s; this run uses seed %llu, batch %u, seq %u, data %s: "
                           "the sample order continues differently\n",
                (unsigned long long)seed, (unsigned long long)batch, (unsigned long long)seq,
                json_is_string(dv) ? json_string_value(dv) : "?",
                (unsigned long long)r->o->seed, r->o->batch, r->T, r->o->data);
    json_decref(t);
    if (rc)
        zr_err_prefix("%s: ", zck_reader_path(rd));
    return rc;
}

/* ---------------------------------------------------------------- the loop */

static int build_spans(run *r)
{
    for (size_t g = 0; g < r->ng; g++)
        r->nspans += zck_layout_group_n_tensors(r->L, g);
    if (!(r->spans = calloc(r->nspans, sizeof *r->spans)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t g = 0; g < r->ng; g++)
        for (size_t t = 0; t < zck_layout_group_n_tensors(r->L, g); t++) {
            zck_tensor_info ti;
            zck_layout_tensor(r->L, g, t, &ti);
            r->spans[k++] = (span){g, ti.offset, ti.numel, ti.ndim >= 2};
        }
    return 0;
}

/* One optimizer step; *loss is the mean loss of the global batch before the update. */
static int train_step(run *r, float *loss, float *lr_out, float *norm_out)
{
    const zr_train_opts *o = r->o;
    zr_model_zero_grad(r->model);
    double sum = 0;
    const uint32_t T = r->T;
    for (uint32_t k = 0; k < r->n_micro; k++) {
        for (uint32_t b = 0; b < r->mb; b++) {
            uint64_t idx = r->next_sample + (uint64_t)k * r->mb + b;
            zr_data_sample(r->data, idx, r->tokens);
            memcpy(r->inputs + (size_t)b * T, r->tokens, T * sizeof *r->tokens);
            memcpy(r->targets + (size_t)b * T, r->tokens + 1, T * sizeof *r->tokens);
        }
        float l;
        ZR_TRY(zr_model_forward(r->model, r->inputs, r->targets, r->mb, T, &l));
        ZR_TRY(zr_model_backward(r->model, 1.0f / (float)r->n_micro));
        sum += l;
    }
    *loss = (float)(sum / r->n_micro);
    /* global gradient norm, then clip by scaling the gradients inside the update */
    double sq = 0;
    for (size_t g = 0; g < r->ng; g++)
        sq += zr_sumsq(zr_model_grad(r->model, g), zr_model_group_numel(r->model, g));
    float norm = (float)sqrt(sq);
    float scale = 1.0f;
    if (o->grad_clip > 0 && norm > o->grad_clip)
        scale = o->grad_clip / (norm + 1e-6f);
    float lr = zr_lr_at(r->step, o->warmup, o->steps, o->lr, o->min_lr_ratio);
    zr_adamw_hp hp = ZR_ADAMW_HP_INIT;
    hp.weight_decay = o->weight_decay;
    for (size_t k = 0; k < r->nspans; k++) {
        const span *sp = &r->spans[k];
        uint64_t at = r->goff[sp->group] + sp->offset;
        zr_adamw_update(zr_model_param(r->model, sp->group) + sp->offset,
                        zr_model_grad(r->model, sp->group) + sp->offset, r->m + at, r->v + at,
                        sp->numel, r->step + 1, lr, scale, sp->decay, &hp);
    }
    r->step++;
    r->next_sample += o->batch;
    *lr_out = lr;
    *norm_out = norm;
    return 0;
}

static void log_step(run *r, float loss, float lr, float norm, double dt)
{
    const zr_train_opts *o = r->o;
    double tps = (double)o->batch * r->T / (dt > 0 ? dt : 1e-9);
    if (o->log)
        fprintf(o->log, "step %6llu/%llu | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | "
                        "%.1f ms\n", (unsigned long long)r->step, (unsigned long long)o->steps,
                loss, lr, norm, tps, dt * 1e3);
    if (r->jlog) {
        uint64_t pb, gb, ab;
        zr_model_bytes(r->model, &pb, &gb, &ab);
        fprintf(r->jlog, "{\"step\":%llu,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,"
                         "\"tokens_per_s\":%.1f,\"step_ms\":%.3f,\"mem\":{\"params\":%llu,"
                         "\"grads\":%llu,\"optimizer\":%llu,\"activations\":%llu}}\n",
                (unsigned long long)r->step, loss, lr, norm, tps, dt * 1e3,
                (unsigned long long)pb, (unsigned long long)gb, (unsigned long long)(2 * pb),
                (unsigned long long)ab);
        fflush(r->jlog);
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

static int check_opts(const zr_train_opts *o)
{
    if (o->batch < 1)
        return zr_err_set(ZR_EINVAL, "--batch %u: at least 1", o->batch);
    if (o->micro_batch && o->batch % o->micro_batch)
        return zr_err_set(ZR_EINVAL, "--batch %u is not a multiple of --micro-batch %u",
                          o->batch, o->micro_batch);
    if (o->steps < 1)
        return zr_err_set(ZR_EINVAL, "--steps must be at least 1");
    if (!(o->lr > 0) || !(o->min_lr_ratio >= 0 && o->min_lr_ratio <= 1))
        return zr_err_set(ZR_EINVAL, "--lr must be positive (min ratio in [0, 1])");
    if (!(o->weight_decay >= 0) || !(o->grad_clip >= 0))
        return zr_err_set(ZR_EINVAL, "weight decay and gradient clipping must be >= 0");
    if (o->zero_stage < 0 || o->zero_stage > 3)
        return zr_err_set(ZR_EINVAL, "--zero %d: expected 0..3", o->zero_stage);
    if (!o->ckpt_dir || !o->ckpt_dir[0])
        return zr_err_set(ZR_EINVAL, "--ckpt-dir: empty");
    return 0;
}

static void free_run(run *r)
{
    zr_model_free(r->model);
    zck_layout_free(r->L);
    free(r->m);
    free(r->v);
    free(r->goff);
    free(r->spans);
    free(r->tokens);
    free(r->inputs);
    free(r->targets);
    zr_data_free(r->data);
    if (r->jlog)
        fclose(r->jlog);
}

int zr_train(zr_train_result *out, const zr_train_opts *o)
{
    memset(out, 0, sizeof *out);
    ZR_TRY(check_opts(o));
    run r;
    memset(&r, 0, sizeof r);
    r.o = o;
    zck_reader *rd = NULL;
    char *from = NULL;
    int rc = 0;
    zr_set_threads(o->threads > 0 ? o->threads : 1);

    /* what to resume from, and the model: the checkpoint's unless --model says (and agrees) */
    ZR_TRY_GOTO(resume_path(&from, o), rc, out);
    if (from)
        ZR_TRY_GOTO(zck_reader_open(&rd, from), rc, out);
    if (o->model) {
        ZR_TRY_GOTO(zr_gpt2_config_parse(&r.cfg, o->model), rc, out);
        zr_gpt2_config ck;
        if (rd && zr_gpt2_config_from_json(&ck, zck_reader_model_json(rd)) == 0 &&
            memcmp(&ck, &r.cfg, sizeof ck)) {
            rc = zr_err_set(ZR_EINVAL, "%s: checkpoint of another model shape (layers %u heads "
                            "%u dim %u ctx %u vocab %u; --model says %u %u %u %u %u)",
                            zck_reader_path(rd), ck.layers, ck.heads, ck.dim, ck.ctx, ck.vocab,
                            r.cfg.layers, r.cfg.heads, r.cfg.dim, r.cfg.ctx, r.cfg.vocab);
            goto out;
        }
        zr_err_clear();
    } else if (rd) {
        if ((rc = zr_gpt2_config_from_json(&r.cfg, zck_reader_model_json(rd))) < 0) {
            zr_err_prefix("%s: model section: ", zck_reader_path(rd));
            goto out;
        }
    } else
        ZR_TRY_GOTO(zr_gpt2_config_parse(&r.cfg, "tiny"), rc, out);
    r.T = o->seq ? o->seq : r.cfg.ctx;
    if (r.T > r.cfg.ctx) {
        rc = zr_err_set(ZR_EINVAL, "--seq %u is longer than the model's context %u", r.T,
                        r.cfg.ctx);
        goto out;
    }
    r.mb = o->micro_batch ? o->micro_batch : o->batch;
    r.n_micro = o->batch / r.mb;
    ZR_TRY_GOTO(zr_data_open(&r.data, o->data, r.cfg.vocab, r.T, o->seed), rc, out);
    ZR_TRY_GOTO(zr_gpt2_layout(&r.L, &r.cfg), rc, out);
    ZR_TRY_GOTO(zr_model_new(&r.model, &r.cfg, r.mb), rc, out);
    r.ng = zr_model_n_groups(r.model);
    uint64_t total = zr_model_numel(r.model);
    if (!(r.goff = calloc(r.ng, sizeof *r.goff)) || !(r.m = arena(total)) ||
        !(r.v = arena(total)) || !(r.tokens = malloc((r.T + 1) * sizeof *r.tokens)) ||
        !(r.inputs = malloc((size_t)r.mb * r.T * sizeof *r.inputs)) ||
        !(r.targets = malloc((size_t)r.mb * r.T * sizeof *r.targets))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory for a model of %llu parameters",
                        (unsigned long long)total);
        goto out;
    }
    for (size_t g = 1; g < r.ng; g++)
        r.goff[g] = r.goff[g - 1] + zr_model_group_numel(r.model, g - 1);
    ZR_TRY_GOTO(build_spans(&r), rc, out);
    if (rd) {
        double t0 = now_s();
        ZR_TRY_GOTO(load(&r, rd), rc, out);
        if (o->log)
            fprintf(o->log, "resumed from %s (verified, %.2f s): step %llu, next sample %llu\n",
                    zck_reader_path(rd), now_s() - t0, (unsigned long long)r.step,
                    (unsigned long long)r.next_sample);
    } else
        zr_model_init_weights(r.model, o->seed);
    if (o->log_json)
        make_parent_dirs(o->log_json); /* fopen says what is wrong if this was not enough */
    if (o->log_json && !(r.jlog = fopen(o->log_json, "a"))) {
        rc = zr_err_sys(errno, "%s: open for appending", o->log_json);
        goto out;
    }
    if (o->log && !rd)
        fprintf(o->log, "training a %u-layer GPT-2 (%llu parameters) on %s, %llu steps, batch "
                        "%u x %u tokens\n", r.cfg.layers, (unsigned long long)total,
                zr_data_describe(r.data), (unsigned long long)o->steps, o->batch, r.T);

    out->start_step = r.step;
    double t_start = now_s(), slowest = 0;
    float loss = 0;
    uint64_t done_here = 0;
    while (r.step < o->steps) {
        if ((o->stop && *o->stop) || (o->stop_after && done_here >= o->stop_after) ||
            (o->time_limit > 0 && now_s() - t_start + 2 * slowest + 1.0 > o->time_limit)) {
            out->stopped = 1;
            break;
        }
        double t0 = now_s();
        float lr, norm;
        ZR_TRY_GOTO(train_step(&r, &loss, &lr, &norm), rc, out);
        double dt = now_s() - t0;
        if (dt > slowest)
            slowest = dt;
        done_here++;
        log_step(&r, loss, lr, norm, dt);
        if (o->save_every && r.step % o->save_every == 0 && r.step < o->steps)
            ZR_TRY_GOTO(save(&r, loss, out->ckpt, sizeof out->ckpt), rc, out);
    }
    /* the final (or stopping) checkpoint, unless this exact step was just saved */
    if (done_here && !(o->save_every && r.step % o->save_every == 0 && r.step < o->steps))
        ZR_TRY_GOTO(save(&r, loss, out->ckpt, sizeof out->ckpt), rc, out);
    out->step = r.step;
    out->loss = loss;
    if (o->log && !done_here)
        fprintf(o->log, "nothing to do: %llu of %llu steps already done%s%s\n",
                (unsigned long long)r.step, (unsigned long long)o->steps,
                from ? "; newest checkpoint " : "", from ? from : "");
    else if (o->log)
        fprintf(o->log, "%s at step %llu/%llu, loss %.4f%s%s\n",
                out->stopped ? "stopped" : "done", (unsigned long long)r.step,
                (unsigned long long)o->steps, loss, out->ckpt[0] ? "; checkpoint " : "",
                out->ckpt);
out:
    zck_reader_free(rd);
    free(from);
    free_run(&r);
    return rc;
}
