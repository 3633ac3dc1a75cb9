/*
 * audit.c: the check before a resume (`zckpt audit`). Which checkpoint a resume would read (a
 * run directory's through zck_resume_pick, the call zrun makes, in a dry run that moves
 * nothing), its full verification, whether zr_train would accept it at a given world, ZeRO
 * stage, batch and model (train.c's own checks through train_int.h, never copies, so the audit
 * and the resume refuse the same things in the same words), and the memory per rank a resume
 * would need (the dry run's plan). Every reason a resume would fail is collected, not only the
 * first.
 */
#include "comm.h"
#include "model.h"
#include "train.h"
#include "train_int.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Append a formatted line to l. */
static int add_line(zck_namelist *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_line(zck_namelist *l, const char *fmt, ...)
{
    char **nv = realloc(l->name, (l->n + 1) * sizeof *nv);
    if (!nv)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    l->name = nv;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&l->name[l->n], fmt, ap);
    va_end(ap);
    if (n < 0)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    l->n++;
    return 0;
}

/* The library's last error as a reason; the error is consumed. */
static int add_reason(zr_audit *a)
{
    int rc = add_line(&a->reasons, "%s", zr_err_msg());
    if (!rc)
        zr_err_clear();
    return rc;
}

/* Each line of text (what the resume policy said) into l. */
static int add_lines(zck_namelist *l, const char *text)
{
    while (text && *text) {
        const char *nl = strchr(text, '\n');
        int len = nl ? (int)(nl - text) : (int)strlen(text);
        ZR_TRY(add_line(l, "%.*s", len, text));
        text += len + (nl != NULL);
    }
    return 0;
}

/* A run directory: the pick of `--resume auto` (full verification, nothing moved), what the
 * policy would do on a->said; no pick, or no checkpoint that verifies, is a reason. */
static int pick_from_run(zr_audit *a, const char *run_dir, const zr_audit_opts *o)
{
    zr_train_opts to = ZR_TRAIN_OPTS_INIT;
    to.ckpt_dir = run_dir;
    to.resume = "auto";
    to.verify_on_resume = ZR_VERIFY_FULL;
    to.threads = o->jobs ? (int)o->jobs : 1;
    char *said = NULL;
    size_t len = 0;
    FILE *log = open_memstream(&said, &len);
    if (!log)
        return zr_err_sys(errno, "open_memstream");
    int rc = zr_train__resume_path(&a->ckpt, &to, log, 1);
    fclose(log);
    int lrc = add_lines(&a->said, said);
    free(said);
    ZR_TRY(lrc);
    if (rc == ZR_ECORRUPT) /* checkpoints, none of them sound */
        return add_reason(a);
    ZR_TRY(rc);
    if (!a->ckpt)
        ZR_TRY(add_line(&a->reasons, "%s: no checkpoint to resume from (a resume would start "
                        "a fresh run)", run_dir));
    a->picked = a->ckpt != NULL;
    char *holder = NULL;
    ZR_TRY(zck_run_lock_holder(&holder, run_dir));
    if (holder)
        rc = add_line(&a->reasons, "%s: in use by %s (one job per run directory)", run_dir,
                      holder);
    free(holder);
    return rc;
}

/* A checkpoint directory: every check of `zckpt verify`, all hashes; any problem is a reason
 * (the resume policy would not resume from it either). */
static int verify_ckpt(zr_audit *a, const zr_audit_opts *o)
{
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    vo.jobs = o->jobs ? o->jobs : 1;
    vo.cheap_first = 1; /* the model and layout, sizes, SHA256SUMS before hours of hashing */
    ZR_TRY(zck_verify(&a->report, a->ckpt, &vo));
    size_t n = zck_report_count(a->report);
    if (n)
        ZR_TRY(add_line(&a->reasons, "%s does not verify: %zu problem%s", a->ckpt, n,
                        n == 1 ? "" : "s"));
    return 0;
}

/* The batch and sequence length recorded in the training section (left as they are when
 * absent or not numbers). */
static void recorded_training(const zck_reader *rd, uint32_t *batch, uint32_t *seq)
{
    json_t *t = json_loads(zck_reader_training_json(rd), 0, NULL);
    json_t *b = json_object_get(t, "batch"), *s = json_object_get(t, "seq");
    if (json_is_integer(b) && json_integer_value(b) > 0 && json_integer_value(b) <= UINT32_MAX)
        *batch = (uint32_t)json_integer_value(b);
    if (json_is_integer(s) && json_integer_value(s) > 0 && json_integer_value(s) <= UINT32_MAX)
        *seq = (uint32_t)json_integer_value(s);
    json_decref(t);
}

/* The model zr_train would build (train.c's pick), against the checkpoint's shape and layout,
 * and the sequence length. *ok: no reason found. */
static int check_model(zr_audit *a, const zr_train_opts *to, zck_reader *rd, int *ok)
{
    zr_gpt2_config cfg;
    zck_layout *L = NULL;
    uint32_t T;
    *ok = 0;
    if (zr_train__pick_config(&cfg, to, rd) < 0)
        return add_reason(a);
    int n = snprintf(a->model, sizeof a->model, "layers %u heads %u dim %u ctx %u vocab %u",
                     cfg.layers, cfg.heads, cfg.dim, cfg.ctx, cfg.vocab);
    if (cfg.family == ZR_FAMILY_LLAMA && n > 0 && (size_t)n < sizeof a->model)
        snprintf(a->model + n, sizeof a->model - (size_t)n, " (llama: kv_heads %u ffn %u%s)",
                 cfg.kv_heads, cfg.ffn, cfg.tied ? " tied" : "");
    if (zr_train__seq(&T, to, &cfg) < 0)
        return add_reason(a);
    if (zr_gpt2_layout(&L, &cfg) < 0)
        return add_reason(a);
    int rc = zr_train__check_layout(zck_reader_layout(rd), L, zck_reader_path(rd));
    zck_layout_free(L);
    if (rc < 0)
        return add_reason(a);
    *ok = 1;
    return 0;
}

/* What zr_train checks before a resume at a's world, stage, batch, and the memory plan when
 * those checks pass. */
static int check_resume(zr_audit *a, zck_reader *rd, const zr_audit_opts *o)
{
    zr_train_opts to = ZR_TRAIN_OPTS_INIT;
    uint32_t batch = to.batch, seq = 0;
    recorded_training(rd, &batch, &seq);
    a->world = o->world ? o->world : zck_reader_world(rd);
    a->zero_stage = o->zero_stage >= 0 ? o->zero_stage : zck_reader_zero_stage(rd);
    a->batch = o->batch ? o->batch : batch;
    to.batch = a->batch;
    to.seq = seq;
    to.zero_stage = a->zero_stage;
    to.model = o->model;
    to.resume = a->ckpt;
    to.threads = o->jobs ? (int)o->jobs : 1;
    int W = (int)a->world, ok = 1, model_ok;
    if (zr_comm_check_world(W) < 0) {
        ZR_TRY(add_reason(a));
        ok = 0;
    }
    if (zr_train__check_opts(&to) < 0 || zr_train__check_world(&to, W) < 0) {
        ZR_TRY(add_reason(a));
        ok = 0;
    }
    ZR_TRY(check_model(a, &to, rd, &model_ok));
    if (!ok || !model_ok)
        return 0;
    int rc = zr_train_mem_plan(&a->mem, &to, W);
    if (rc == ZR_ENOMEM)
        return rc;
    if (rc < 0)
        return add_reason(a);
    a->has_mem = 1;
    if (!o->memory_limit)
        return 0;
    rc = zr_train_plan_memory(&a->pick, &a->runner_up, &to, W, o->memory_limit, NULL);
    if (rc == ZR_ENOMEM)
        return rc;
    if (rc < 0)
        return add_reason(a);
    a->has_pick = 1;
    return 0;
}

int zr_audit_run(zr_audit **out, const char *path, const zr_audit_opts *opts)
{
    zr_audit_opts def = ZR_AUDIT_OPTS_INIT;
    const zr_audit_opts *o = opts ? opts : &def;
    *out = NULL;
    if (o->zero_stage > 3)
        return zr_err_set(ZR_EINVAL, "--zero %d: expected 0..3", o->zero_stage);
    struct stat st;
    if (stat(path, &st))
        return zr_err_sys(errno, "%s", path);
    if (!S_ISDIR(st.st_mode))
        return zr_err_set(ZR_EINVAL, "%s: not a run or checkpoint directory", path);
    zr_audit *a = calloc(1, sizeof *a);
    char *manifest = NULL;
    zck_reader *rd = NULL;
    int rc = 0;
    if (!a || asprintf(&manifest, "%s/manifest.json", path) < 0) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    if (stat(manifest, &st) == 0) { /* a checkpoint directory: that checkpoint */
        if (!(a->ckpt = strdup(path)))
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        else
            rc = verify_ckpt(a, o);
    } else { /* a run directory: the resume policy's pick, verified in full by the pick */
        rc = pick_from_run(a, path, o);
        if (!rc && a->ckpt)
            rc = zck_report_new(&a->report); /* nothing found: the pick passed */
    }
    if (rc || !a->ckpt)
        goto out;
    if (zck_reader_open(&rd, a->ckpt) < 0) {
        rc = add_reason(a);
        goto out;
    }
    a->step = zck_reader_step(rd);
    rc = check_resume(a, rd, o);
out:
    free(manifest);
    zck_reader_free(rd);
    if (rc)
        zr_audit_free(a);
    else
        *out = a;
    return rc;
}

void zr_audit_free(zr_audit *a)
{
    if (!a)
        return;
    free(a->ckpt);
    zck_namelist_free(&a->said);
    zck_namelist_free(&a->reasons);
    zck_report_free(a->report);
    zr_mem_plan_free(&a->mem);
    free(a);
}
