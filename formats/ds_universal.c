/*
 * ds_universal.c: DeepSpeed universal checkpoints (the folders DeepSpeed's ds_to_universal.py
 * writes from a ZeRO checkpoint, docs/FORMAT.md section 17) read without Python. deepspeed.c
 * reads the model states file copied into the folder (the parameters, their shapes and order,
 * the world size) and hands the rest to this file:
 *
 *   <folder>/zero/optimizer_state.pt        zero_stage, partition_count, param_groups; at stage 3
 *                                           also the torch optimizer's state (its step)
 *   <folder>/zero/<param>/fp32.pt           the fp32 master weights of one parameter
 *   <folder>/zero/<param>/exp_avg.pt        AdamW's moments
 *   <folder>/zero/<param>/exp_avg_sq.pt
 *   <folder>/zero/<param>/step.pt           stages 1-2: the optimizer's step (each parameter's)
 *
 * Each is a torch.save zip; at stages 1-2 its pickle is a dict whose 'param' is the full tensor
 * (with 'cat_dim' and flags for tensor-parallel merging), at stage 3 the bare tensor, flat.
 * What verify checks: optimizer_state.pt loads and names a stage and the model states' world
 * size; every parameter the model states list has its folder and files; every tensor is
 * float32, contiguous, of the parameter's shape (stage 3: its element count, flat), its
 * storage record present and as large as the pickle says; every parameter's step is the same;
 * then (unless quick) every record's CRC-32. Files of names the model states do not list as
 * trainable (a tied head, buffers: fp32.pt alone) are not read.
 */
#include "foreign.h"
#include "fmtutil.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { ST_FP32, ST_EXP_AVG, ST_EXP_AVG_SQ, ST_N };
static const char *const state_file[ST_N] = {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"};

struct zfmt__dsu {
    char *dir;
    int stage;
    const zfmt__ds_param *p;
    size_t np;
    zfmt__zip *oz; /* zero/optimizer_state.pt */
    zfmt__pickle *opk;
    const zfmt__pv *groups; /* its param_groups */
    int64_t step;           /* stages 1-2: every step.pt's */
    int has_step;
    /* the state file read last (zfmt__dsu_read goes through a parameter in order) */
    pthread_mutex_t mu;
    size_t ci;
    int cs;
    zfmt__zip *cz;
    zfmt__pickle *cpk;
    const zfmt__pv *ct;
};

int zfmt__dsu_is(const char *dir)
{
    char p[8192];
    struct stat st;
    int n = snprintf(p, sizeof p, "%s/zero/optimizer_state.pt", dir);
    if (n > 0 && (size_t)n < sizeof p && stat(p, &st) == 0)
        return 1;
    n = snprintf(p, sizeof p, "%s/zero", dir);
    return n > 0 && (size_t)n < sizeof p && stat(p, &st) == 0 && S_ISDIR(st.st_mode) &&
           zfmt__ds_files_in(dir);
}

void zfmt__dsu_free(zfmt__dsu *u)
{
    if (!u)
        return;
    zfmt__pickle_free(u->cpk);
    zfmt__zip_free(u->cz);
    zfmt__pickle_free(u->opk);
    zfmt__zip_free(u->oz);
    pthread_mutex_destroy(&u->mu);
    free(u->dir);
    free(u);
}

/* "zero/<name>/<file>" */
static void rel_name(char *buf, size_t cap, const char *name, const char *file)
{
    snprintf(buf, cap, "zero/%s%s%s", name, file ? "/" : "", file ? file : "");
}

/* The tensor of a state file: the dict's 'param' (stages 1-2) or the bare tensor (stage 3),
 * float32, row-major, of parameter p's shape (stage 3: flat), its storage record in z as
 * large as the pickle says. NULL with the reason in why. */
static const zfmt__pv *state_tensor(const zfmt__zip *z, const zfmt__pv *root,
                                    const zfmt__ds_param *p, char *why, size_t cap)
{
    const zfmt__pv *t = root && root->kind == ZFMT__PK_DICT ? zfmt__pv_get(root, "param") : root;
    char d[96];
    if (!t || t->kind != ZFMT__PK_TENSOR) {
        zfmt__pv_describe(root, d, sizeof d);
        snprintf(why, cap, "holds %s, not a tensor or a dict with one as 'param'", d);
        return NULL;
    }
    if (!t->dtype_known || t->dtype != ZCK_F32) {
        snprintf(why, cap, "a %s tensor, not float32", t->dtype_name ? t->dtype_name : "?");
        return NULL;
    }
    int flat = t->ndim == 1 && p->ndim != 1 && t->size[0] == p->numel;
    int same = t->ndim == p->ndim;
    for (size_t k = 0; same && k < p->ndim; k++)
        same = t->size[k] == p->shape[k];
    if (!same && !flat) {
        char a[96] = "", b[96] = "";
        for (size_t k = 0; k < t->ndim; k++)
            snprintf(a + strlen(a), sizeof a - strlen(a), "%s%llu", k ? ", " : "",
                     (unsigned long long)t->size[k]);
        for (size_t k = 0; k < p->ndim; k++)
            snprintf(b + strlen(b), sizeof b - strlen(b), "%s%llu", k ? ", " : "",
                     (unsigned long long)p->shape[k]);
        snprintf(why, cap, "shape [%s], the model states say [%s]", a, b);
        return NULL;
    }
    int64_t want = 1;
    for (size_t k = t->ndim; k-- > 0;) {
        if (t->size[k] > 1 && t->stride[k] != want) {
            snprintf(why, cap, "a tensor that is not row-major contiguous");
            return NULL;
        }
        want *= (int64_t)t->size[k];
    }
    char rec[160];
    snprintf(rec, sizeof rec, "data/%s", t->storage->s);
    const zfmt__zip_entry *e = zfmt__zip_find(z, rec);
    if (!e || e->size != (uint64_t)t->storage->i * 4 ||
        (uint64_t)t->i + p->numel > (uint64_t)t->storage->i) {
        snprintf(why, cap, "its storage record %s is missing or smaller than the tensor", rec);
        return NULL;
    }
    return t;
}

/* state s of parameter i: opened, its pickle loaded and its tensor checked; problems into rep
 * (1: reported) */
static int load_state(const zfmt__dsu *u, size_t i, int s, zfmt__zip **z, zfmt__pickle **pk,
                      const zfmt__pv **t, zck_report *rep)
{
    char rel[1024], why[256];
    rel_name(rel, sizeof rel, u->p[i].name, state_file[s]);
    *z = NULL;
    *pk = NULL;
    int rc = zfmt__ds_load(z, pk, u->dir, rel, rep);
    if (rc)
        return rc;
    if (!(*t = state_tensor(*z, zfmt__pickle_root(*pk), &u->p[i], why, sizeof why)))
        return zck_report_add(rep, ZCK_PROB_MANIFEST, rel, "%s", why) ? -1 : 1;
    return 0;
}

/* every parameter's folder and files; the CRC-32s when crc */
static int check_param(zfmt__dsu *u, size_t i, zck_report *rep, int crc, uint64_t *hashed)
{
    const zfmt__ds_param *p = &u->p[i];
    char rel[1024], *path;
    struct stat st;
    if (strchr(p->name, '/') || !strcmp(p->name, "..") || !strcmp(p->name, "."))
        return zck_report_add(rep, ZCK_PROB_MANIFEST, "zero", "parameter name '%s' cannot be "
                              "a folder's", p->name) ? -1 : 1;
    rel_name(rel, sizeof rel, p->name, NULL);
    if (!(path = zck_path_join(u->dir, rel)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int absent = stat(path, &st) < 0 || !S_ISDIR(st.st_mode);
    free(path);
    if (absent)
        return zck_report_add(rep, ZCK_PROB_MISSING, rel, "the folder of parameter '%s', which the "
                              "model states list", p->name) ? -1 : 1;
    int any = 0;
    for (int s = 0; s < ST_N + (u->stage < 3); s++) {
        zfmt__zip *z = NULL;
        zfmt__pickle *pk = NULL;
        const zfmt__pv *t;
        int rc;
        rel_name(rel, sizeof rel, p->name, s < ST_N ? state_file[s] : "step.pt");
        if (!(path = zck_path_join(u->dir, rel)))
            return zr_err_set(ZR_ENOMEM, "out of memory");
        absent = stat(path, &st) < 0 && errno == ENOENT;
        free(path);
        if (absent) {
            static const char *const what[] = {"fp32 master weights", "first moment (exp_avg)",
                                               "second moment (exp_avg_sq)", "optimizer step"};
            if (zck_report_add(rep, ZCK_PROB_MISSING, rel, "the %s of '%s'", what[s],
                               p->name))
                return -1;
            any = 1;
            continue;
        }
        if (s < ST_N) {
            rc = load_state(u, i, s, &z, &pk, &t, rep);
        } else { /* step.pt: the optimizer's step, an int or a 0-d tensor */
            int64_t v;
            rc = zfmt__ds_load(&z, &pk, u->dir, rel, rep);
            if (!rc && zfmt__ds_step_value(z, rel, zfmt__pickle_root(pk), &v) < 0)
                rc = zck_report_add(rep, ZCK_PROB_MANIFEST, rel, "%s", zr_err_msg()) ? -1 : 1;
            else if (!rc && u->has_step && v != u->step)
                rc = zck_report_add(rep, ZCK_PROB_MANIFEST, rel, "step %lld, the parameters "
                                    "before it took %lld (files of two saves?)", (long long)v,
                                    (long long)u->step) ? -1 : 1;
            else if (!rc) {
                u->step = v;
                u->has_step = 1;
            }
        }
        if (!rc && crc)
            rc = zfmt__ds_crc_all(z, rel, rep, hashed);
        zfmt__pickle_free(pk);
        zfmt__zip_free(z);
        if (rc < 0)
            return rc;
        any |= rc;
    }
    return any;
}

int zfmt__dsu_open(zfmt__dsu **out, const char *dir, const zfmt__ds_param *p, size_t np,
                   uint32_t world, zck_report *rep, int crc, uint64_t *hashed,
                   const zck_progress *progress)
{
    *out = NULL;
    zfmt__dsu *u = calloc(1, sizeof *u);
    if (!u || !(u->dir = strdup(dir))) {
        free(u);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&u->mu, NULL);
    u->p = p;
    u->np = np;
    u->ci = (size_t)-1;
    const char *of = "zero/optimizer_state.pt";
    int64_t stage = 0, pc = -1;
    int rc = zfmt__ds_load(&u->oz, &u->opk, dir, of, rep);
    if (!rc) {
        const zfmt__pv *root = zfmt__pickle_root(u->opk), *pcv = zfmt__pv_get(root,
                                                                             "partition_count");
        u->groups = zfmt__pv_get(root, "param_groups");
        if (pcv && pcv->kind == ZFMT__PK_LIST)
            for (size_t k = 0; k < pcv->n; k++)
                pc = pcv->items[k]->kind == ZFMT__PK_INT && pcv->items[k]->i > pc
                         ? pcv->items[k]->i
                         : pc;
        else
            zfmt__pv_int(pcv, &pc);
        /* DeepSpeed's BF16_Optimizer writes no zero_stage; its partitions are stage 1's (and
         * ds_to_universal.py takes a missing one as 1 too) */
        if (!zfmt__pv_get(root, "zero_stage") && pcv)
            stage = 1;
        else if (!zfmt__pv_int(zfmt__pv_get(root, "zero_stage"), &stage))
            stage = 0;
        if (stage < 1 || stage > 3 || !u->groups || u->groups->kind != ZFMT__PK_LIST)
            rc = zck_report_add(rep, ZCK_PROB_MANIFEST, of, "no zero_stage of 1 to 3 or no "
                                "param_groups: not a universal checkpoint's optimizer state")
                     ? -1 : 1;
        else if (pc != (int64_t)world)
            rc = zck_report_add(rep, ZCK_PROB_MANIFEST, of, "partition_count %lld, the model "
                                "states say %u ranks (files of two saves?)", (long long)pc,
                                world) ? -1 : 1;
        else if (crc)
            rc = zfmt__ds_crc_all(u->oz, of, rep, hashed);
    }
    u->stage = (int)stage;
    /* every parameter is looked at (its stage-dependent files once the stage is known), so
     * that each damage is named */
    for (size_t i = 0; rc >= 0 && i < np; i++) {
        if (!u->stage)
            u->stage = 1; /* optimizer_state.pt unread: the files of stages 1-2 are expected */
        int k = check_param(u, i, rep, crc, hashed);
        rc = k < 0 ? k : rc | k;
        if (progress && progress->fn)
            progress->fn(progress->ctx, "checking parameters", i + 1, np);
    }
    if (rc < 0 || zck_report_count(rep)) {
        zfmt__dsu_free(u);
        return rc < 0 ? rc : 1;
    }
    *out = u;
    return 0;
}

int zfmt__dsu_stage(const zfmt__dsu *u) { return u->stage; }

/* the first problem of a report, as an error (a state file damaged after the verification) */
static int reported(zck_report *rep, int rc)
{
    if (rc > 0) {
        const zck_problem *q = zck_report_get(rep, 0);
        rc = zr_err_set(ZR_ECORRUPT, "%s: %s", q->file, q->detail);
    }
    return rc;
}

int zfmt__dsu_read(zfmt__dsu *u, size_t i, const char *which, uint64_t from, float *dst,
                   uint64_t n)
{
    int s = !which ? ST_FP32 : !strcmp(which, "exp_avg") ? ST_EXP_AVG
            : !strcmp(which, "exp_avg_sq")               ? ST_EXP_AVG_SQ
                                                         : -1;
    if (s < 0 || i >= u->np || from + n > u->p[i].numel)
        return zr_err_set(ZR_EINVAL, "%s: no state '%s' of parameter %zu elements [%llu, +%llu)",
                          u->dir, which, i, (unsigned long long)from, (unsigned long long)n);
    pthread_mutex_lock(&u->mu);
    int rc = 0;
    if (u->ci != i || u->cs != s) {
        zfmt__pickle_free(u->cpk);
        zfmt__zip_free(u->cz);
        u->cpk = NULL;
        u->cz = NULL;
        u->ci = (size_t)-1;
        zck_report *rep;
        rc = zck_report_new(&rep);
        if (!rc) {
            rc = reported(rep, load_state(u, i, s, &u->cz, &u->cpk, &u->ct, rep));
            zck_report_free(rep);
        }
        if (!rc) {
            u->ci = i;
            u->cs = s;
        }
    }
    if (!rc) {
        char rec[160];
        snprintf(rec, sizeof rec, "data/%s", u->ct->storage->s);
        rc = zfmt__zip_read(u->cz, zfmt__zip_find(u->cz, rec), ((uint64_t)u->ct->i + from) * 4,
                            dst, (size_t)n * 4);
    }
    pthread_mutex_unlock(&u->mu);
    return rc;
}

int zfmt__dsu_adam(const zfmt__dsu *u, int64_t *step, const zfmt__pv **param_groups)
{
    const char *of = "zero/optimizer_state.pt";
    *param_groups = u->groups;
    if (u->stage < 3) {
        if (!u->has_step)
            return zr_err_set(ZR_ECORRUPT, "%s: no step.pt (no step was taken)", u->dir);
        *step = u->step;
        return 0;
    }
    /* stage 3: rank 0's torch optimizer state, each sub-group's step */
    const zfmt__pv *osd = zfmt__pv_get(zfmt__pickle_root(u->opk), "optimizer_state_dict");
    const zfmt__pv *st = zfmt__pv_get(osd, "state");
    if (!st || st->kind != ZFMT__PK_DICT || !st->n)
        return zr_err_set(ZR_ECORRUPT, "%s/%s: the optimizer has no state (no step was taken)",
                          u->dir, of);
    for (size_t k = 0; k + 1 < st->n; k += 2) {
        int64_t s;
        ZR_TRY(zfmt__ds_step_value(u->oz, of, zfmt__pv_get(st->items[k + 1], "step"), &s));
        if (k && s != *step)
            return zr_err_set(ZR_ECORRUPT, "%s/%s: the optimizer's groups took %lld and %lld "
                              "steps", u->dir, of, (long long)*step, (long long)s);
        *step = s;
    }
    return 0;
}

int zfmt__dsu_check_weights(const zfmt__dsu *u, zck_report *rep)
{
    uint64_t hashed = 0;
    int any = 0;
    for (size_t i = 0; i < u->np; i++) {
        zfmt__zip *z;
        zfmt__pickle *pk;
        const zfmt__pv *t;
        char rel[1024];
        int rc = load_state(u, i, ST_FP32, &z, &pk, &t, rep);
        rel_name(rel, sizeof rel, u->p[i].name, state_file[ST_FP32]);
        if (!rc)
            rc = zfmt__ds_crc_all(z, rel, rep, &hashed);
        zfmt__pickle_free(pk);
        zfmt__zip_free(z);
        if (rc < 0)
            return rc;
        any |= rc;
    }
    zck_report_add_bytes_hashed(rep, hashed);
    return 0;
}
