/*
 * resume.c: what a run starts from (train_int.h): the checkpoint to resume from (rank 0 picks,
 * every rank learns its pick or its error), its layout checked against the model's, its
 * training section (step, data position, validation record) and states loaded; else each rank
 * initializes its partitions.
 */
#include "train_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

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

typedef struct {
    const zr_model *m;
    uint64_t seed;
} init_ctx;

static void init_fill(void *ctx, size_t g, uint64_t off, uint64_t n, float *dst)
{
    const init_ctx *c = ctx;
    zr_model_init_range(c->m, c->seed, g, off, n, dst);
}

/* What to resume from (rank 0 decides for all; the others learn its pick or its error), then
 * the model and the shapes. Returns this rank's result, still to be agreed. */
int zr_train__pick_start(run *r)
{
    const zr_train_opts *o = r->o;
    char *from = NULL, *shared = NULL;
    int lrc = 0;
    if (r->rank == 0) /* one job per run directory, before any staging or housekeeping */
        lrc = zck_run_lock(&r->lock, o->ckpt_dir, "zrun");
    if (r->rank == 0 && !lrc)
        lrc = zr_train__resume_path(&from, o, r->log, 0);
    lrc = zr_train__share_text(r, 0, lrc, lrc ? zr_err_msg() : (from ? from : ""), &shared);
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
        lrc = zr_train__pick_tokenizer(r);
    if (!lrc && o->sample_every)
        lrc = zr_train__open_codec(r);
    if (!lrc && o->sample_every)
        lrc = zr_train__sample_check(&r->cfg, zr_train__sample_prompt(o), &r->codec);
    r->mb = o->micro_batch ? o->micro_batch : o->batch / (uint32_t)r->W;
    r->n_micro = o->batch / (uint32_t)r->W / r->mb;
    return lrc;
}

/* The states from the checkpoint (*ckpt_error set when that fails), or each rank initializes
 * what it holds; then the JSON log and the first lines. */
int zr_train__resume_or_init(run *r, int *ckpt_error)
{
    const zr_train_opts *o = r->o;
    if (r->rd) {
        double t0 = now_s();
        int rc = zr_train__agree(r, load(r, r->rd));
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
        ZR_TRY(zr_train__agree(r, zr_zero_init_params(r->zero, init_fill, &ic)));
    }
    int lrc = 0;
    if (o->log_json && r->rank == 0) {
        uint64_t logged = r->rd ? zr_train__logged_max_step(o->log_json) : 0;
        if (!(lrc = zr_train__open_json_log(&r->jlog, o->log_json, o->ckpt_dir)))
            zr_train__log_redone(r, logged);
    }
    ZR_TRY(zr_train__agree(r, lrc));
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
