/*
 * ds_files.c: what the DeepSpeed readers share, below both the ZeRO reader (deepspeed.c) and the
 * universal-checkpoint reader (ds_universal.c), so that neither calls into the other's file
 * helpers: opening one torch.save file of a checkpoint (its zip and pickle, damage reported as
 * a problem of that file), the CRC-32 of every record, the optimizer's step in any of the forms
 * DeepSpeed stores it, and whether a folder holds DeepSpeed's rank files.
 */
#include "foreign.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DS_PICKLE_BUDGET ((size_t)256 << 20)
#define DS_MAX_PKL ((size_t)64 << 20)

int zfmt__ds_load(zfmt__zip **z, zfmt__pickle **pk, const char *dir, const char *file,
                  zck_report *rep)
{
    char *path = zck_path_join(dir, file), *b = NULL;
    if (!path)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = zfmt__zip_open(z, path);
    const zfmt__zip_entry *e = rc ? NULL : zfmt__zip_find(*z, "data.pkl");
    if (!rc && !e)
        rc = zr_err_set(ZR_ECORRUPT, "%s: no data.pkl record: not a torch.save file", path);
    if (!rc) /* damaged bytes are named as such, not as the pickle they garble */
        rc = zfmt__zip_check_crc(*z, e);
    if (!rc)
        rc = zfmt__zip_slurp(*z, e, DS_MAX_PKL, &b);
    if (!rc)
        rc = zfmt__pickle_load(pk, b, (size_t)e->size, path, DS_PICKLE_BUDGET);
    free(b);
    free(path);
    if (rc == ZR_ENOTFOUND)
        return zck_report_add(rep, ZCK_PROB_MISSING, file, "%s", zr_err_msg()) ? -1 : 1;
    if (rc == ZR_ECORRUPT || rc == ZR_EUNSUPPORTED) {
        const char *m = zr_err_msg();
        zck_problem_kind k = strstr(m, "not allowed") ? ZCK_PROB_UNSAFE
                             : strstr(m, "CRC-32") ? ZCK_PROB_HASH
                             : strstr(m, "truncated") || strstr(m, "no end of central")
                                 ? ZCK_PROB_TRUNCATED
                                 : ZCK_PROB_IO;
        return zck_report_add(rep, k, file, "%s", m) ? -1 : 1;
    }
    return rc;
}

int zfmt__ds_crc_all(const zfmt__zip *z, const char *file, zck_report *rep, uint64_t *hashed)
{
    for (size_t i = 0; z && i < z->n; i++) {
        int rc = zfmt__zip_check_crc(z, &z->e[i]);
        *hashed += z->e[i].size;
        if (rc == ZR_ECORRUPT)
            return zck_report_add(rep, ZCK_PROB_HASH, file, "%s", zr_err_msg()) ? -1 : 1;
        ZR_TRY(rc);
    }
    return 0;
}

int zfmt__ds_step_value(const zfmt__zip *z, const char *file, const zfmt__pv *v, int64_t *out)
{
    if (zfmt__pv_int(v, out))
        return 0;
    double f = -1;
    if (v && v->kind == ZFMT__PK_FLOAT) {
        f = v->f;
    } else if (v && v->kind == ZFMT__PK_TENSOR && v->ndim == 0 &&
               (v->dtype == ZCK_F32 || v->dtype == ZCK_F64 || v->dtype == ZCK_I64)) {
        char rec[128];
        snprintf(rec, sizeof rec, "data/%s", v->storage->s);
        const zfmt__zip_entry *e = zfmt__zip_find(z, rec);
        if (!e)
            return zr_err_set(ZR_ECORRUPT, "%s: no record %s (the optimizer's step)", file,
                              rec);
        size_t es = zck_dtype_size(v->dtype);
        unsigned char b[8];
        ZR_TRY(zfmt__zip_read(z, e, (uint64_t)v->i * es, b, es));
        if (v->dtype == ZCK_F32) {
            float g;
            memcpy(&g, b, 4);
            f = g;
        } else if (v->dtype == ZCK_F64) {
            memcpy(&f, b, 8);
        } else {
            memcpy(out, b, 8);
            f = (double)*out;
        }
    }
    if (!(f >= 0 && f <= 9007199254740992.0) || f != (double)(int64_t)f)
        return zr_err_set(ZR_ECORRUPT, "%s: the optimizer's step is not a count of steps",
                          file);
    *out = (int64_t)f;
    return 0;
}

int zfmt__ds_files_in(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        found = n > 16 && (!strcmp(e->d_name + n - 16, "_model_states.pt") ||
                           !strcmp(e->d_name + n - 16, "_optim_states.pt"));
    }
    closedir(d);
    return found;
}
