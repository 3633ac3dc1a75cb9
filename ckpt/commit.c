/*
 * commit.c: the commit protocol. The shards gathered from all ranks are checked against the
 * layout, manifest.json and SHA256SUMS are written and fsynced into the staging directory, the
 * directory is fsynced and renamed to step-<step>, the run directory is fsynced, and `latest`
 * is replaced by write-temp + fsync + rename + fsync. A crash at any instant leaves `latest`
 * naming a complete checkpoint. Retention and garbage collection run after the commit and never
 * touch what `latest` names.
 */
#include "zck_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int cmp_rank(const void *a, const void *b)
{
    const zck_shard *x = *(zck_shard *const *)a, *y = *(zck_shard *const *)b;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

int zck_commit(char **out, const char *run_dir, const char *staging_dir, const zck_layout *L,
               zck_shard *const *shards, size_t n_shards, const zck_commit_opts *opts)
{
    zck_commit_opts def = ZCK_COMMIT_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (opts->zero_stage < 0 || opts->zero_stage > 3)
        return zr_err_set(ZR_EINVAL, "zero stage %d: expected 0..3", opts->zero_stage);
    if (!L->ng || !L->ns)
        return zr_err_set(ZR_EINVAL, "layout has no groups or no states");
    for (size_t g = 0; g < L->ng; g++)
        if (!L->g[g].numel)
            return zr_err_set(ZR_EINVAL, "group '%s' has no elements", L->g[g].name);

    char producer[64], created[32], dirname[32];
    snprintf(producer, sizeof producer, "zero %s", ZERO_VERSION);
    if (opts->step > (uint64_t)INT64_MAX)
        return zr_err_set(ZR_EINVAL, "step %llu: at most 2^63-1",
                          (unsigned long long)opts->step);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    zck_step_dirname(dirname, opts->step);

    zck_manifest m = {0};
    m.step = opts->step;
    m.world = opts->world;
    m.stage = opts->zero_stage;
    m.created = created;
    m.producer = (char *)(opts->producer ? opts->producer : producer);
    m.model_json = (char *)opts->model_json;
    m.training_json = (char *)opts->training_json;
    m.L = (zck_layout *)L;
    m.nshards = n_shards;
    char *text = NULL, *sums = NULL, *final = NULL, *mpath = NULL, *spath = NULL;
    int rc = 0;
    if (!(m.shards = malloc((n_shards ? n_shards : 1) * sizeof *m.shards))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    memcpy(m.shards, shards, n_shards * sizeof *shards);
    qsort(m.shards, n_shards, sizeof *m.shards, cmp_rank);
    ZR_TRY_GOTO(zck__manifest_index(&m, staging_dir), rc, out);
    ZR_TRY_GOTO(zck__files_write(&m.files, staging_dir, opts->files, opts->n_files), rc, out);
    m.nfiles = opts->n_files;

    /* every shard file is in the staging directory with its listed size */
    for (size_t i = 0; i < n_shards; i++) {
        char *p = zck_path_join(staging_dir, m.shards[i]->file);
        struct stat st;
        if (!p) {
            rc = ZR_ENOMEM;
            goto out;
        }
        if (stat(p, &st) < 0)
            rc = zr_err_sys(errno, "%s: shard of rank %u", p, m.shards[i]->rank);
        else if ((uint64_t)st.st_size != m.shards[i]->bytes)
            rc = zr_err_set(ZR_ECORRUPT, "%s: %lld bytes on disk, rank %u reported %llu", p,
                            (long long)st.st_size, m.shards[i]->rank,
                            (unsigned long long)m.shards[i]->bytes);
        free(p);
        if (rc)
            goto out;
    }

    ZR_TRY_GOTO(zck__manifest_dump(&text, &m), rc, out);
    size_t cap = (n_shards + m.nfiles + 1) * 340 + 1, len = 0;
    if (!(sums = malloc(cap))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    sums[0] = 0;
    /* manifest.json is listed too, so that a hand edit of the manifest is caught */
    char mhex[65];
    zck__sha *mh = NULL;
    ZR_TRY_GOTO(zck__sha_new(&mh), rc, out);
    zck__sha_update(mh, text, strlen(text));
    zck__sha_hex(mh, mhex);
    zck__sha_free(mh);
    len += (size_t)snprintf(sums + len, cap - len, "%s  manifest.json\n", mhex);
    for (size_t i = 0; i < n_shards; i++)
        len += (size_t)snprintf(sums + len, cap - len, "%s  %s\n", m.shards[i]->sha256,
                                m.shards[i]->file);
    for (size_t i = 0; i < m.nfiles; i++)
        len += (size_t)snprintf(sums + len, cap - len, "%s  %s\n", m.files[i].sha256,
                                m.files[i].file);
    if (!(mpath = zck_path_join(staging_dir, "manifest.json")) ||
        !(spath = zck_path_join(staging_dir, "SHA256SUMS")) ||
        !(final = zck_path_join(run_dir, dirname))) {
        rc = ZR_ENOMEM;
        goto out;
    }
    ZR_TRY_GOTO(zck__write_small(mpath, text, strlen(text)), rc, out);
    ZR_TRY_GOTO(zck__write_small(spath, sums, len), rc, out);
    ZR_TRY_GOTO(zck_fsync_dir(staging_dir), rc, out);
    struct stat st;
    if (lstat(final, &st) == 0) {
        rc = zr_err_set(ZR_EEXIST, "%s: a checkpoint for step %llu already exists", final,
                        (unsigned long long)opts->step);
        goto out;
    }
    ZR_TRY_GOTO(zck_rename_noreplace(staging_dir, final), rc, out);
    ZR_TRY_GOTO(zck_fsync_dir(run_dir), rc, out);
    ZR_TRY_GOTO(zck__write_latest(run_dir, dirname), rc, out);
    zck_prune_opts po = ZCK_PRUNE_OPTS_INIT;
    po.keep_last = opts->keep_last;
    po.gc_tmp = opts->gc_tmp;
    if (zck__housekeeping(run_dir, opts->step, opts->step, dirname, NULL, &po, NULL) < 0)
        zr_log(ZR_LOG_WARN, "checkpoint %s committed, but cleaning up older ones failed: %s",
               final, zr_err_msg());
    if (out) {
        *out = final;
        final = NULL;
    }
out:
    if (m.index)
        for (size_t i = 0; i < L->ng * L->ns; i++)
            free(m.index[i]);
    free(m.index);
    free(m.index_n);
    free(m.shards);
    zck__files_free(m.files, m.nfiles);
    free(text);
    free(sums);
    free(final);
    free(mpath);
    free(spath);
    return rc;
}
