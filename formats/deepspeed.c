/*
 * deepspeed.c: DeepSpeed ZeRO checkpoints (save_checkpoint's folders, stages 1, 2 and 3, fp32
 * and bf16) read without Python: the tag folder `latest` names, its model-states file(s) and
 * one optimizer-states file per data-parallel rank, each a torch.save zip whose data.pkl goes
 * through the restricted unpickler (docs/FORMAT.md, "Foreign checkpoints").
 *
 * The fp32 master weights are rebuilt as DeepSpeed's zero_to_fp32.py does:
 *  - stages 1 and 2: per parameter group, the ranks' single_partition_of_fp32_groups[g]
 *    (padding stripped) end to end, in rank order, hold the group's parameters in param_shapes
 *    order, each followed by its param_alignment_paddings entry;
 *  - stage 3: every parameter is cut into W pieces of ceil(numel / W) (the last one padded);
 *    rank r's fp32_flat_groups (its sub-groups end to end) hold its piece of each parameter in
 *    param_shapes order.
 * What verify checks, cheap first: `latest` names a tag folder; the model states name the world
 * size and the parameters; every rank's optimizer file (and at stage 3 model file) is present;
 * every file opens as a zip and its pickle names only allowed globals; the stage and partition
 * counts agree; the partitions hold every parameter with no gap and no element left over (up to
 * DeepSpeed's own alignment of 2W elements at stages 1-2); exp_avg and exp_avg_sq match their
 * partitions; then (unless quick) every record's CRC-32.
 */
#include "foreign.h"
#include "fmtutil.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


typedef struct {
    char file[256];
    zfmt__zip *z;
    zfmt__pickle *pk;
    const zfmt__pv *osd;            /* optimizer_state_dict */
    const zfmt__pv *const *flat;    /* per group (stages 1-2) or sub-group (stage 3) */
    const zfmt__pv *const *m_items; /* the torch optimizer's state dict's items (key, value) */
    const zfmt__pv *groups;         /* the torch optimizer's param_groups */
    size_t ng, nm;
    uint64_t total; /* elements in flat, all groups */
} ds_rank;

struct zfmt__ds {
    char *dir, *tag;
    int stage, bf16;
    uint32_t world;
    zfmt__zip *mz;
    zfmt__pickle *mpk;
    const zfmt__pv *model;
    zfmt__ds_param *p;
    size_t np, n_groups;
    ds_rank *r;
    int64_t step;
    int u_dir;     /* a universal checkpoint folder (ds_universal.c) */
    zfmt__dsu *u;  /* its reader, once open */
};

void zfmt__ds_free(zfmt__ds *d)
{
    if (!d)
        return;
    for (uint32_t i = 0; d->r && i < d->world; i++) {
        zfmt__pickle_free(d->r[i].pk);
        zfmt__zip_free(d->r[i].z);
    }
    free(d->r);
    zfmt__dsu_free(d->u);
    free(d->p);
    zfmt__pickle_free(d->mpk);
    zfmt__zip_free(d->mz);
    free(d->dir);
    free(d->tag);
    free(d);
}

/* `latest` (when dir has one) names the tag folder; else `latest_universal` (what
 * ds_to_universal.py writes beside the universal folder) names a universal one */
static int find_tag(zfmt__ds *d, const char *path, zck_report *rep)
{
    const char *file = "latest";
    char *lp = zck_path_join(path, file), *txt = NULL;
    size_t n = 0;
    if (!lp)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    struct stat st;
    int has = lstat(lp, &st) == 0;
    if (!has) {
        free(lp);
        file = "latest_universal";
        if (!(lp = zck_path_join(path, file)))
            return zr_err_set(ZR_ENOMEM, "out of memory");
        has = lstat(lp, &st) == 0;
    }
    int rc = has ? zfmt__read_file(&txt, &n, lp) : 0;
    free(lp);
    if (!has) { /* the tag folder itself */
        d->dir = strdup(path);
        d->tag = strdup("");
        return d->dir && d->tag ? 0 : zr_err_set(ZR_ENOMEM, "out of memory");
    }
    if (rc)
        return zck_report_add(rep, ZCK_PROB_IO, file, "%s", zr_err_msg()) ? -1 : 1;
    while (n && isspace((unsigned char)txt[n - 1]))
        txt[--n] = 0;
    char shown[128];
    if (!n || n > 200 || strchr(txt, '/') || !strcmp(txt, "..") || !strcmp(txt, ".")) {
        rc = zck_report_add(rep, ZCK_PROB_MANIFEST, file, "'%s' is not a tag folder's name",
                            zr_printable(shown, sizeof shown, txt));
        free(txt);
        return rc ? -1 : 1;
    }
    d->tag = txt;
    if (!(d->dir = zck_path_join(path, txt)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    if (stat(d->dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return zck_report_add(rep, ZCK_PROB_MISSING, file, "names tag '%s', which does not "
                              "exist in %s", zr_printable(shown, sizeof shown, txt), path)
                   ? -1 : 1;
    return 0;
}

/* "zero_pp_rank_R_mp_rank_NN_optim_states.pt" and its kin: *rank, *mp, *bf16; 1 when name is
 * kind's ("optim", "model"), with (pp 1) or without (pp 0) the zero_pp_rank part */
static int parse_name(const char *name, const char *kind, int pp, unsigned *rank, unsigned *mp,
                      int *bf16)
{
    char tail[64];
    int k = 0;
    *bf16 = !strncmp(name, "bf16_", 5);
    const char *s = name + (*bf16 ? 5 : 0);
    *rank = 0;
    if (pp) {
        if (sscanf(s, "zero_pp_rank_%u_mp_rank_%u_%n", rank, mp, &k) != 2 || !k)
            return 0;
    } else if (sscanf(s, "mp_rank_%u_%n", mp, &k) != 1 || !k) {
        return 0;
    }
    snprintf(tail, sizeof tail, "%s_states.pt", kind);
    return !strcmp(s + k, tail) && (pp || !*bf16);
}

/* The folder's files: model states of rank 0 (stage 3) or of the model (stages 1-2), one
 * optimizer file per rank. Missing or extra ones into rep. */
static int scan(zfmt__ds *d, zck_report *rep, char *model_file, size_t cap, int *optim_bf16)
{
    DIR *dh = opendir(d->dir);
    if (!dh)
        return zr_err_sys(errno, "%s", d->dir);
    struct dirent *e;
    unsigned r, mp;
    int bf, n_optim = 0, rc = 0;
    model_file[0] = 0;
    *optim_bf16 = -1;
    while (!rc && (e = readdir(dh))) {
        if (parse_name(e->d_name, "model", 0, &r, &mp, &bf) && mp == 0 && !model_file[0])
            snprintf(model_file, cap, "%s", e->d_name);
        else if (parse_name(e->d_name, "model", 1, &r, &mp, &bf) && mp == 0 && r == 0)
            snprintf(model_file, cap, "%s", e->d_name);
        else if (parse_name(e->d_name, "optim", 1, &r, &mp, &bf) && mp == 0) {
            if (*optim_bf16 >= 0 && *optim_bf16 != bf)
                rc = zck_report_add(rep, ZCK_PROB_UNLISTED, e->d_name, "bf16 and fp32 "
                                    "optimizer files mixed in one tag folder");
            *optim_bf16 = bf;
            n_optim++;
        }
        if (!rc && (parse_name(e->d_name, "model", 0, &r, &mp, &bf) ||
                    parse_name(e->d_name, "optim", 1, &r, &mp, &bf)) && mp != 0)
            rc = zck_report_add(rep, ZCK_PROB_UNLISTED, e->d_name, "model-parallel rank %u: "
                                "tensor or pipeline parallel checkpoints are not read", mp);
    }
    closedir(dh);
    if (!rc && !model_file[0])
        rc = zck_report_add(rep, ZCK_PROB_MISSING, "mp_rank_00_model_states.pt", "no model "
                            "states file in %s (mp_rank_00_model_states.pt, or at stage 3 "
                            "zero_pp_rank_0_mp_rank_00_model_states.pt)", d->dir);
    if (!rc && !n_optim && !d->u_dir)
        rc = zck_report_add(rep, ZCK_PROB_MISSING, "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                            "no optimizer states file in %s: not a ZeRO checkpoint", d->dir);
    return rc ? -1 : !model_file[0] || (!n_optim && !d->u_dir);
}

/* param_shapes: a list of dicts name -> torch.Size, the groups */
static int read_params(zfmt__ds *d, zck_report *rep, const char *mf)
{
    const zfmt__pv *ps = zfmt__pv_get(d->model, "param_shapes");
    int64_t w;
    if (!ps || ps->kind != ZFMT__PK_LIST || !ps->n ||
        !zfmt__pv_int(zfmt__pv_get(d->model, "dp_world_size"), &w) || w < 1 ||
        w > ZCK_MAX_WORLD)
        return zck_report_add(rep, ZCK_PROB_MANIFEST, mf, "no param_shapes or dp_world_size: "
                              "not a DeepSpeed model states file") ? -1 : 1;
    d->world = (uint32_t)w;
    zfmt__pv_int(zfmt__pv_get(d->model, "global_steps"), &d->step);
    size_t n = 0;
    for (size_t g = 0; g < ps->n; g++)
        n += ps->items[g]->kind == ZFMT__PK_DICT ? ps->items[g]->n / 2 : 0;
    if (!(d->p = calloc(n + 1, sizeof *d->p)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    d->n_groups = ps->n;
    for (size_t g = 0; g < ps->n; g++) {
        const zfmt__pv *gd = ps->items[g];
        for (size_t i = 0; gd->kind == ZFMT__PK_DICT && i + 1 < gd->n; i += 2) {
            zfmt__ds_param *p = &d->p[d->np++];
            const zfmt__pv *sh = gd->items[i + 1];
            if (gd->items[i]->kind != ZFMT__PK_STR || sh->kind != ZFMT__PK_TUPLE ||
                sh->n > ZCK_MAX_DIMS)
                return zck_report_add(rep, ZCK_PROB_MANIFEST, mf, "param_shapes: an entry "
                                      "that is not name -> shape") ? -1 : 1;
            p->name = gd->items[i]->s;
            p->group = g;
            p->ndim = sh->n;
            p->numel = 1;
            for (size_t k = 0; k < sh->n; k++) {
                if (sh->items[k]->kind != ZFMT__PK_INT || sh->items[k]->i < 0 ||
                    sh->items[k]->i > (int64_t)1 << 40)
                    return zck_report_add(rep, ZCK_PROB_MANIFEST, mf, "param_shapes: '%s' has "
                                          "a bad dimension", p->name) ? -1 : 1;
                p->shape[k] = (uint64_t)sh->items[k]->i;
                p->numel *= p->shape[k];
            }
        }
    }
    return 0;
}

/* a 1-D float32 tensor (a flat partition), or NULL */
static const zfmt__pv *flat_f32(const zfmt__pv *t)
{
    return t && t->kind == ZFMT__PK_TENSOR && t->dtype_known && t->dtype == ZCK_F32 &&
                   (t->ndim == 1 ? t->stride[0] == 1 : t->ndim == 0)
               ? t
               : NULL;
}

static uint64_t t_numel(const zfmt__pv *t) { return t->ndim ? t->size[0] : 1; }

/* the zip holds tensor t's storage record, of the size its pickle declares */
static int has_record(const zfmt__zip *z, const zfmt__pv *t)
{
    char rec[128];
    snprintf(rec, sizeof rec, "data/%s", t->storage->s);
    const zfmt__zip_entry *e = zfmt__zip_find(z, rec);
    return e && e->size == (uint64_t)t->storage->i * zck_dtype_size(t->dtype);
}

/* rank r's optimizer file: stage, partition count, its flat partitions */
static int read_rank(zfmt__ds *d, uint32_t r, int bf16, zck_report *rep)
{
    ds_rank *x = &d->r[r];
    snprintf(x->file, sizeof x->file, "%szero_pp_rank_%u_mp_rank_00_optim_states.pt",
             bf16 ? "bf16_" : "", r);
    char *path = zck_path_join(d->dir, x->file);
    struct stat st;
    int absent = path && stat(path, &st) < 0;
    free(path);
    if (absent)
        return zck_report_add(rep, ZCK_PROB_MISSING, x->file, "rank %u's optimizer states "
                              "(the model states say %u ranks)", r, d->world) ? -1 : 1;
    int rc = zfmt__ds_load(&x->z, &x->pk, d->dir, x->file, rep);
    if (rc)
        return rc;
    const zfmt__pv *root = zfmt__pickle_root(x->pk);
    int64_t stage, pc = -1;
    x->osd = zfmt__pv_get(root, "optimizer_state_dict");
    const zfmt__pv *pcv = zfmt__pv_get(x->osd, "partition_count");
    if (pcv && pcv->kind == ZFMT__PK_LIST)
        for (size_t i = 0; i < pcv->n; i++)
            pc = pcv->items[i]->kind == ZFMT__PK_INT && pcv->items[i]->i > pc ? pcv->items[i]->i
                                                                               : pc;
    else
        zfmt__pv_int(pcv, &pc);
    /* DeepSpeed's BF16_Optimizer (bf16 with fp32 gradient accumulation at stages 0-1) writes
     * no zero_stage, its partitions laid out as stage 1's */
    if (!zfmt__pv_get(x->osd, "zero_stage") &&
        zfmt__pv_get(x->osd, "single_partition_of_fp32_groups") && pcv)
        stage = 1;
    else if (!zfmt__pv_int(zfmt__pv_get(x->osd, "zero_stage"), &stage) || stage < 1 ||
             stage > 3)
        return zck_report_add(rep, ZCK_PROB_MANIFEST, x->file, "no zero_stage of 1 to 3 and no "
                              "BF16_Optimizer partitions: not a ZeRO optimizer file") ? -1 : 1;
    if (d->stage && stage != d->stage)
        return zck_report_add(rep, ZCK_PROB_MANIFEST, x->file, "zero_stage %lld, rank 0's is "
                              "%d (files of two saves?)", (long long)stage, d->stage) ? -1 : 1;
    d->stage = (int)stage;
    if (pc != (int64_t)d->world)
        return zck_report_add(rep, ZCK_PROB_MANIFEST, x->file, "partition_count %lld, the model "
                              "states say %u ranks", (long long)pc, d->world) ? -1 : 1;
    const zfmt__pv *fl = zfmt__pv_get(x->osd, stage == 3 ? "fp32_flat_groups"
                                                         : "single_partition_of_fp32_groups");
    const zfmt__pv *inner = zfmt__pv_get(x->osd, stage == 3 ? "optimizer_state_dict"
                                                            : "base_optimizer_state");
    const zfmt__pv *ms = zfmt__pv_get(inner, "state");
    if (!fl || fl->kind != ZFMT__PK_LIST || !fl->n || !ms || ms->kind != ZFMT__PK_DICT)
        return zck_report_add(rep, ZCK_PROB_MANIFEST, x->file, "no %s or optimizer state",
                              stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups")
                   ? -1 : 1;
    for (size_t g = 0; g < fl->n; g++) {
        if (!flat_f32(fl->items[g]))
            return zck_report_add(rep, ZCK_PROB_MANIFEST, x->file, "partition %zu is not a flat "
                                  "float32 tensor", g) ? -1 : 1;
        if (!has_record(x->z, fl->items[g]))
            return zck_report_add(rep, ZCK_PROB_TRUNCATED, x->file, "partition %zu: its storage "
                                  "record data/%s is missing or not the size the pickle says",
                                  g, fl->items[g]->storage->s) ? -1 : 1;
        x->total += t_numel(fl->items[g]);
    }
    x->flat = (const zfmt__pv *const *)fl->items;
    x->ng = fl->n;
    x->m_items = (const zfmt__pv *const *)ms->items;
    x->nm = ms->n / 2;
    x->groups = zfmt__pv_get(inner, "param_groups");
    return 0;
}

/* the torch optimizer's state of group g: exp_avg or exp_avg_sq (NULL when absent) */
static const zfmt__pv *moment(const ds_rank *x, size_t g, const char *which)
{
    for (size_t i = 0; i < x->nm; i++)
        if (x->m_items[2 * i]->kind == ZFMT__PK_INT && x->m_items[2 * i]->i == (int64_t)g)
            return flat_f32(zfmt__pv_get(x->m_items[2 * i + 1], which));
    return NULL;
}

/* The partitions hold every parameter: offsets of each (stages 1-2: in its group's whole flat;
 * stage 3: in every rank's flat); exp_avg and exp_avg_sq sized as their partitions. */
static int check_layout(zfmt__ds *d, zck_report *rep)
{
    uint32_t W = d->world;
    const ds_rank *r0 = &d->r[0];
    for (uint32_t r = 1; r < W; r++)
        if (d->r[r].ng != r0->ng || (d->stage == 3 && d->r[r].total != r0->total))
            return zck_report_add(rep, ZCK_PROB_COVERAGE, d->r[r].file, "%zu partitions of %llu "
                                  "elements, rank 0 has %zu of %llu", d->r[r].ng,
                                  (unsigned long long)d->r[r].total, r0->ng,
                                  (unsigned long long)r0->total);
    if (d->stage == 3) {
        uint64_t off = 0;
        for (size_t i = 0; i < d->np; i++) {
            d->p[i].off = off;
            off += (d->p[i].numel + W - 1) / W;
        }
        if (off != r0->total)
            return zck_report_add(rep, ZCK_PROB_COVERAGE, r0->file, "the parameters need %llu "
                                  "elements per rank, fp32_flat_groups hold %llu",
                                  (unsigned long long)off, (unsigned long long)r0->total);
    } else {
        if (r0->ng != d->n_groups)
            return zck_report_add(rep, ZCK_PROB_COVERAGE, r0->file, "%zu partitions, "
                                  "param_shapes has %zu groups", r0->ng, d->n_groups);
        const zfmt__pv *pad = zfmt__pv_get(r0->osd, "param_alignment_paddings");
        size_t k = 0;
        for (size_t g = 0; g < d->n_groups; g++) {
            uint64_t off = 0, have = 0;
            const zfmt__pv *gp = pad && pad->kind == ZFMT__PK_LIST && g < pad->n ? pad->items[g]
                                                                                : NULL;
            for (size_t j = 0; k < d->np && d->p[k].group == g; k++, j++) {
                int64_t a = 0;
                d->p[k].off = off;
                off += d->p[k].numel;
                if (gp && gp->kind == ZFMT__PK_LIST && j < gp->n && zfmt__pv_int(gp->items[j], &a) &&
                    a > 0)
                    off += (uint64_t)a;
            }
            for (uint32_t r = 0; r < W; r++)
                have += t_numel(d->r[r].flat[g]);
            /* DeepSpeed pads a group to a multiple of 2W: up to that many elements may remain */
            if (have < off || have - off >= 2 * (uint64_t)W)
                return zck_report_add(rep, ZCK_PROB_COVERAGE, r0->file, "group %zu: the ranks' "
                                      "partitions hold %llu elements, its parameters %llu", g,
                                      (unsigned long long)have, (unsigned long long)off);
        }
    }
    /* exp_avg, exp_avg_sq: as long as the partition (stages 1-2: plus the group's padding) */
    for (uint32_t r = 0; r < W; r++)
        for (size_t g = 0; g < d->r[r].ng; g++) {
            const zfmt__pv *m = moment(&d->r[r], g, "exp_avg"), *v = moment(&d->r[r], g,
                                                                               "exp_avg_sq");
            uint64_t n = t_numel(d->r[r].flat[g]);
            if (!m || !v || t_numel(m) < n || t_numel(v) != t_numel(m) ||
                t_numel(m) - n >= 2 * (uint64_t)W || !has_record(d->r[r].z, m) ||
                !has_record(d->r[r].z, v))
                return zck_report_add(rep, ZCK_PROB_COVERAGE, d->r[r].file, "group %zu: "
                                      "exp_avg and exp_avg_sq missing, without their storage "
                                      "records, or not the partition's %llu elements", g, (unsigned long long)n);
        }
    return 0;
}

int zfmt__ds_open(zfmt__ds **out, const char *path, zck_report *rep, int crc,
                  const zck_progress *progress)
{
    *out = NULL;
    zfmt__ds *d = calloc(1, sizeof *d);
    if (!d)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    char mf[256];
    int bf16 = 0, rc = find_tag(d, path, rep);
    d->u_dir = !rc && zfmt__dsu_is(d->dir);
    if (!rc)
        rc = scan(d, rep, mf, sizeof mf, &bf16);
    if (!rc)
        rc = zfmt__ds_load(&d->mz, &d->mpk, d->dir, mf, rep);
    if (!rc) {
        d->model = zfmt__pickle_root(d->mpk);
        rc = read_params(d, rep, mf);
    }
    uint64_t hashed = 0;
    if (!rc && d->u_dir) { /* the rest is ds_universal.c's */
        rc = zfmt__dsu_open(&d->u, d->dir, d->p, d->np, d->world, rep, crc, &hashed, progress);
        d->stage = d->u ? zfmt__dsu_stage(d->u) : 0;
    } else if (!rc && !(d->r = calloc(d->world, sizeof *d->r))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    }
    d->bf16 = bf16 > 0;
    /* every rank's file is looked at, so that each missing one is named */
    int any = 0;
    for (uint32_t r = 0; !rc && d->r && r < d->world; r++) {
        int k = read_rank(d, r, d->bf16, rep);
        if (k < 0)
            rc = k;
        any |= k;
    }
    if (!rc && d->stage == 3)
        for (uint32_t r = 1; r < d->world && !rc; r++) {
            char name[128], *p;
            struct stat st;
            snprintf(name, sizeof name, "zero_pp_rank_%u_mp_rank_00_model_states.pt", r);
            if (!(p = zck_path_join(d->dir, name)))
                rc = zr_err_set(ZR_ENOMEM, "out of memory");
            else if (stat(p, &st) < 0)
                rc = zck_report_add(rep, ZCK_PROB_MISSING, name, "rank %u's model states "
                                    "(stage 3 writes one per rank)", r);
            free(p);
        }
    if (!rc && !any && !d->u)
        rc = check_layout(d, rep);
    if (!rc && crc) {
        rc = zfmt__ds_crc_all(d->mz, mf, rep, &hashed);
        for (uint32_t r = 0; d->r && r < d->world && rc >= 0; r++) {
            /* a file whose pickle did not load was reported already */
            int k = d->r[r].pk ? zfmt__ds_crc_all(d->r[r].z, d->r[r].file, rep, &hashed) : 0;
            rc = k < 0 ? k : rc | k;
            if (progress && progress->fn)
                progress->fn(progress->ctx, "checking CRC-32", r + 1, d->world);
        }
    }
    zck_report_add_bytes_hashed(rep, hashed);
    if (rc < 0 || zck_report_count(rep)) {
        zfmt__ds_free(d);
        return rc < 0 ? rc : 1;
    }
    *out = d;
    return 0;
}

int zfmt__ds_verify(zck_report *rep, const char *path, const zck_verify_opts *o)
{
    zfmt__ds *d = NULL;
    int rc = zfmt__ds_open(&d, path, rep, !o->quick, &o->progress);
    zfmt__ds_free(d);
    return rc < 0 ? rc : 0;
}

/* ---------------------------------------------------------------- reading the weights */

size_t zfmt__ds_params(const zfmt__ds *d, const zfmt__ds_param **out)
{
    *out = d->p;
    return d->np;
}

int zfmt__ds_stage(const zfmt__ds *d) { return d->stage; }
int zfmt__ds_universal(const zfmt__ds *d) { return d->u != NULL; }
int zfmt__ds_bf16(const zfmt__ds *d) { return d->bf16; }
const char *zfmt__ds_tag(const zfmt__ds *d) { return d->tag; }
uint32_t zfmt__ds_world(const zfmt__ds *d) { return d->world; }
int64_t zfmt__ds_step(const zfmt__ds *d) { return d->step; }
const zfmt__pv *zfmt__ds_model_states(const zfmt__ds *d) { return d->model; }

/* n elements of rank x's flat (its partitions end to end) from element at, of state which
 * (NULL: the fp32 weights; "exp_avg", "exp_avg_sq") */
static int rank_read(const ds_rank *x, const char *which, uint64_t at, float *dst, uint64_t n)
{
    for (size_t g = 0; g < x->ng && n; g++) {
        const zfmt__pv *t = which ? moment(x, g, which) : x->flat[g];
        uint64_t len = t_numel(x->flat[g]);
        if (at >= len) {
            at -= len;
            continue;
        }
        uint64_t k = len - at < n ? len - at : n;
        char rec[128];
        snprintf(rec, sizeof rec, "data/%s", t->storage->s);
        const zfmt__zip_entry *e = zfmt__zip_find(x->z, rec);
        if (!e)
            return zr_err_set(ZR_ECORRUPT, "%s: no record %s", x->file, rec);
        ZR_TRY(zfmt__zip_read(x->z, e, ((uint64_t)t->i + at) * 4, dst, (size_t)k * 4));
        dst += k;
        n -= k;
        at = 0;
    }
    return n ? zr_err_set(ZR_ECORRUPT, "%s: the partitions end before their parameters",
                          x->file)
             : 0;
}

int zfmt__ds_read(const zfmt__ds *d, size_t i, const char *which, uint64_t from, float *dst,
                  uint64_t n)
{
    if (d->u)
        return zfmt__dsu_read(d->u, i, which, from, dst, n);
    const zfmt__ds_param *p = &d->p[i];
    uint32_t W = d->world;
    if (d->stage == 3) { /* rank r holds elements [r pn, (r + 1) pn) at its offset p->off */
        uint64_t pn = (p->numel + W - 1) / W;
        while (n) {
            uint32_t r = (uint32_t)(from / pn);
            uint64_t in = from % pn, k = pn - in < n ? pn - in : n;
            ZR_TRY(rank_read(&d->r[r], which, p->off + in, dst, k));
            from += k;
            dst += k;
            n -= k;
        }
        return 0;
    }
    /* stages 1-2: the group's flat is the ranks' partitions end to end */
    uint64_t at = p->off + from;
    for (uint32_t r = 0; r < W && n; r++) {
        uint64_t len = t_numel(d->r[r].flat[p->group]);
        if (at >= len) {
            at -= len;
            continue;
        }
        uint64_t k = len - at < n ? len - at : n;
        /* a rank's read inside one group: offset by the earlier groups of that rank */
        uint64_t before = 0;
        for (size_t g = 0; g < p->group; g++)
            before += t_numel(d->r[r].flat[g]);
        ZR_TRY(rank_read(&d->r[r], which, before + at, dst, k));
        dst += k;
        n -= k;
        at = 0;
    }
    return n ? zr_err_set(ZR_ECORRUPT, "%s: the partitions end before '%s'", d->dir, p->name) : 0;
}

int zfmt__ds_adam(const zfmt__ds *d, int64_t *step, const zfmt__pv **param_groups)
{
    if (d->u)
        return zfmt__dsu_adam(d->u, step, param_groups);
    const ds_rank *x = &d->r[0];
    if (!x->nm)
        return zr_err_set(ZR_ECORRUPT, "%s: the optimizer has no state (no step was taken)",
                          x->file);
    for (size_t i = 0; i < x->nm; i++) {
        int64_t s;
        ZR_TRY(zfmt__ds_step_value(x->z, x->file, zfmt__pv_get(x->m_items[2 * i + 1], "step"), &s));
        if (i && s != *step)
            return zr_err_set(ZR_ECORRUPT, "%s: the optimizer's groups took %lld and %lld steps",
                              x->file, (long long)*step, (long long)s);
        *step = s;
    }
    *param_groups = x->groups && x->groups->kind == ZFMT__PK_LIST ? x->groups : NULL;
    return 0;
}

/* ---------------------------------------------------------------- CRC of the weights only */

typedef struct {
    const zfmt__ds *d;
    uint32_t first, step;
    int rc;
    char msg[512], file[256];
    uint64_t hashed;
} crc_job;

/* ranks first, first + step, ...: the records of their fp32 partitions */
static void *crc_weights(void *p)
{
    crc_job *j = p;
    for (uint32_t r = j->first; r < j->d->world && !j->rc; r += j->step) {
        const ds_rank *x = &j->d->r[r];
        for (size_t g = 0; g < x->ng && !j->rc; g++) {
            char rec[128];
            snprintf(rec, sizeof rec, "data/%s", x->flat[g]->storage->s);
            int seen = 0; /* sub-groups may share one storage: check it once */
            for (size_t h = 0; h < g; h++)
                seen |= x->flat[h]->storage->s == x->flat[g]->storage->s ||
                        !strcmp(x->flat[h]->storage->s, x->flat[g]->storage->s);
            const zfmt__zip_entry *e = zfmt__zip_find(x->z, rec);
            if (seen || !e)
                continue;
            if ((j->rc = zfmt__zip_check_crc(x->z, e))) {
                snprintf(j->msg, sizeof j->msg, "%s", zr_err_msg());
                snprintf(j->file, sizeof j->file, "%s", x->file);
            }
            j->hashed += e->size;
        }
    }
    return NULL;
}

int zfmt__ds_check_weights(const zfmt__ds *d, zck_report *rep)
{
    if (d->u)
        return zfmt__dsu_check_weights(d->u, rep);
    enum { T = 2 };
    crc_job jobs[T];
    pthread_t th[T];
    int started[T] = {0};
    for (uint32_t t = 0; t < T; t++) {
        jobs[t] = (crc_job){.d = d, .first = t, .step = T};
        started[t] = t > 0 && pthread_create(&th[t], NULL, crc_weights, &jobs[t]) == 0;
    }
    crc_weights(&jobs[0]);
    for (uint32_t t = 1; t < T; t++)
        if (started[t])
            pthread_join(th[t], NULL);
        else
            crc_weights(&jobs[t]);
    uint64_t hashed = 0;
    for (uint32_t t = 0; t < T; t++) {
        hashed += jobs[t].hashed;
        if (jobs[t].rc == ZR_ECORRUPT)
            ZR_TRY(zck_report_add(rep, ZCK_PROB_HASH, jobs[t].file, "%s", jobs[t].msg));
        else if (jobs[t].rc)
            return zr_err_set(jobs[t].rc, "%s", jobs[t].msg);
    }
    zck_report_add_bytes_hashed(rep, hashed);
    return 0;
}
