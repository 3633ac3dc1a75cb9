/*
 * runs.c: run directories as a whole: retention and garbage collection (after each commit and
 * on demand), and the listing of every checkpoint with a quick check of each.
 */
#include "zck_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void zck_namelist_free(zck_namelist *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->name[i]);
    free(l->name);
    l->name = NULL;
    l->n = 0;
}

static int names_add(zck_namelist *l, const char *name)
{
    if (!l)
        return 0;
    char **nv = realloc(l->name, (l->n + 1) * sizeof *nv);
    if (!nv)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    l->name = nv;
    if (!(l->name[l->n] = strdup(name)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    l->n++;
    return 0;
}

static bool is_dir_in(const char *dir, const char *name)
{
    char *p = zck__path_join(dir, name);
    struct stat st;
    bool r = p && lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
    free(p);
    return r;
}

static bool is_stale_tmp(const char *nm, uint64_t step)
{
    unsigned long long ts;
    char dash;
    return (sscanf(nm, ".tmp-step-%llu%c", &ts, &dash) == 2 && dash == '-' && ts <= step) ||
           !strncmp(nm, ".tmp-unpack-", 12) || !strncmp(nm, ".del-step-", 10) ||
           !strncmp(nm, ".latest.tmp-", 12);
}

/* Remove a step directory by first renaming it out of sight (atomic and made durable), then
 * deleting it: a crash can never leave a half-emptied directory under a step- name. */
static int remove_step_dir(const char *run_dir, const char *name)
{
    char hidden[128];
    snprintf(hidden, sizeof hidden, ".del-%s-%ld", name, (long)getpid());
    char *from = zck__path_join(run_dir, name), *to = zck__path_join(run_dir, hidden);
    int rc = 0;
    if (!from || !to)
        rc = ZR_ENOMEM;
    else if (!(rc = zck__rename(from, to)) && !(rc = zck__fsync_dir(run_dir)))
        rc = zck__rmtree(to);
    free(from);
    free(to);
    return rc;
}

static int remove_any(const char *run_dir, const char *name)
{
    char *p = zck__path_join(run_dir, name);
    if (!p)
        return ZR_ENOMEM;
    struct stat st;
    int rc = 0;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
        rc = zck__rmtree(p);
    else if (unlink(p) < 0 && errno != ENOENT)
        rc = zr_err_sys(errno, "%s: unlink", p);
    free(p);
    return rc;
}

typedef struct {
    uint64_t step;
    char *name;
} stepdir;

static int cmp_step_desc(const void *a, const void *b)
{
    const stepdir *x = a, *y = b;
    return x->step > y->step ? -1 : x->step < y->step;
}

int zck__housekeeping(const char *run_dir, uint64_t step, const char *keep,
                      const zck_prune_opts *o, zck_namelist *removed)
{
    DIR *d = opendir(run_dir);
    if (!d)
        return zr_err_sys(errno, "%s: opendir", run_dir);
    stepdir *v = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) && !rc) {
        uint64_t s;
        const char *nm = de->d_name;
        if (zck__parse_step_name(nm, &s) && s <= step && is_dir_in(run_dir, nm)) {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                stepdir *nv = realloc(v, cap * sizeof *v);
                if (!nv) {
                    rc = zr_err_set(ZR_ENOMEM, "out of memory");
                    break;
                }
                v = nv;
            }
            v[n].step = s;
            if (!(v[n].name = strdup(nm)))
                rc = zr_err_set(ZR_ENOMEM, "out of memory");
            else
                n++;
        } else if (o->gc_tmp && is_stale_tmp(nm, step)) {
            rc = names_add(removed, nm);
            if (!rc && !o->dry_run)
                rc = remove_any(run_dir, nm);
        }
    }
    closedir(d);
    if (!rc && o->keep_last) {
        if (n) /* qsort(NULL, 0, ...) is undefined */
            qsort(v, n, sizeof *v, cmp_step_desc);
        unsigned kept = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            bool every = o->keep_every && v[i].step % o->keep_every == 0;
            if (!strcmp(v[i].name, keep) || kept < o->keep_last) {
                kept++;
                continue;
            }
            if (every)
                continue;
            rc = names_add(removed, v[i].name);
            if (!rc && !o->dry_run)
                rc = remove_step_dir(run_dir, v[i].name);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
    return rc;
}

int zck_prune(zck_namelist *removed, const char *run_dir, const zck_prune_opts *o)
{
    zck_prune_opts def = ZCK_PRUNE_OPTS_INIT;
    if (!o)
        o = &def;
    char *latest = NULL;
    ZR_TRY(zck_latest(&latest, run_dir));
    const char *base = strrchr(latest, '/');
    base = base ? base + 1 : latest;
    uint64_t step = 0;
    int rc = zck__parse_step_name(base, &step)
                 ? zck__housekeeping(run_dir, step, base, o, removed)
                 : zr_err_set(ZR_ECORRUPT, "%s/latest: not a step directory name", run_dir);
    free(latest);
    return rc;
}

/* ---------------------------------------------------------------- listing */

const char *zck_ckpt_status_name(zck_ckpt_status s)
{
    return s == ZCK_CKPT_COMPLETE ? "complete" : s == ZCK_CKPT_INCOMPLETE ? "incomplete"
                                                                        : "corrupt";
}

static uint64_t dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    uint64_t sum = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char *p = zck__path_join(dir, de->d_name);
        struct stat st;
        if (p && lstat(p, &st) == 0 && S_ISREG(st.st_mode))
            sum += (uint64_t)st.st_size;
        free(p);
    }
    if (d)
        closedir(d);
    return sum;
}

static int cmp_entry(const void *a, const void *b)
{
    const zck_run_entry *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

static int check_entry(zck_run_entry *e, const char *run_dir)
{
    char *p = zck__path_join(run_dir, e->name);
    if (!p)
        return ZR_ENOMEM;
    e->bytes = dir_bytes(p);
    zck_reader *r = NULL;
    if (zck_reader_open(&r, p) == 0) {
        e->world = zck_reader_world(r);
        e->zero_stage = zck_reader_zero_stage(r);
        zck_reader_free(r);
    }
    zck_report *rep = NULL;
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    vo.quick = 1;
    int rc = zck_verify(&rep, p, &vo);
    free(p);
    if (rc)
        return rc;
    e->status = ZCK_CKPT_COMPLETE;
    const char *detail = "";
    if (zck_report_count(rep)) {
        const zck_problem *pb = zck_report_get(rep, 0);
        bool missing_manifest = pb->kind == ZCK_PROB_MANIFEST && strstr(pb->detail, ": missing");
        e->status = missing_manifest || pb->kind == ZCK_PROB_MISSING ||
                            pb->kind == ZCK_PROB_TRUNCATED ? ZCK_CKPT_INCOMPLETE
                                                           : ZCK_CKPT_CORRUPT;
        detail = pb->detail;
    }
    e->detail = strdup(detail);
    zck_report_free(rep);
    return e->detail ? 0 : zr_err_set(ZR_ENOMEM, "out of memory");
}

int zck_run_list_open(zck_run_list **out, const char *run_dir)
{
    DIR *d = opendir(run_dir);
    if (!d)
        return zr_err_sys(errno, "%s", run_dir);
    zck_run_list *l = calloc(1, sizeof *l);
    if (!l) {
        closedir(d);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    int rc = 0;
    char *latest = NULL;
    if (zck_latest(&latest, run_dir) == 0) {
        const char *base = strrchr(latest, '/');
        l->latest = strdup(base ? base + 1 : latest);
        free(latest);
    }
    zr_err_clear();
    struct dirent *de;
    uint64_t latest_step = UINT64_MAX;
    if (l->latest)
        zck__parse_step_name(l->latest, &latest_step);
    while ((de = readdir(d)) && !rc) {
        uint64_t s;
        if (zck__parse_step_name(de->d_name, &s) && is_dir_in(run_dir, de->d_name)) {
            zck_run_entry *nv = realloc(l->ckpt, (l->n + 1) * sizeof *nv);
            if (!nv) {
                rc = zr_err_set(ZR_ENOMEM, "out of memory");
                break;
            }
            l->ckpt = nv;
            zck_run_entry *e = &l->ckpt[l->n];
            memset(e, 0, sizeof *e);
            e->step = s;
            if (!(e->name = strdup(de->d_name))) {
                rc = zr_err_set(ZR_ENOMEM, "out of memory");
                break;
            }
            l->n++;
            e->is_latest = l->latest && !strcmp(l->latest, de->d_name);
            rc = check_entry(e, run_dir);
        } else if (de->d_name[0] == '.' && is_stale_tmp(de->d_name, latest_step)) {
            rc = names_add(&l->stale, de->d_name);
        } else if (zck__parse_step_name(de->d_name, &s)) {
            rc = names_add(&l->foreign, de->d_name);
        }
    }
    closedir(d);
    if (rc) {
        zck_run_list_free(l);
        return rc;
    }
    if (l->n) /* qsort(NULL, 0, ...) is undefined */
        qsort(l->ckpt, l->n, sizeof *l->ckpt, cmp_entry);
    *out = l;
    return 0;
}

void zck_run_list_free(zck_run_list *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++) {
        free(l->ckpt[i].name);
        free(l->ckpt[i].detail);
    }
    free(l->ckpt);
    free(l->latest);
    zck_namelist_free(&l->stale);
    zck_namelist_free(&l->foreign);
    free(l);
}

int zck_resume_point(char **out, int *is_latest, const char *run_dir)
{
    zck_run_list *l = NULL;
    int rc = zck_run_list_open(&l, run_dir);
    if (rc == ZR_ENOTFOUND)
        return zr_err_set(ZR_ENOTFOUND, "%s: no such run directory", run_dir);
    if (rc)
        return rc;
    if (!l->n) {
        zck_run_list_free(l);
        return zr_err_set(ZR_ENOTFOUND, "%s: no checkpoint", run_dir);
    }
    for (size_t i = l->n; i-- > 0;)
        if (l->ckpt[i].status == ZCK_CKPT_COMPLETE) {
            if (is_latest)
                *is_latest = l->ckpt[i].is_latest;
            *out = zck__path_join(run_dir, l->ckpt[i].name);
            zck_run_list_free(l);
            return *out ? 0 : ZR_ENOMEM;
        }
    rc = zr_err_set(ZR_ECORRUPT, "%s: %zu checkpoints, none complete (newest %s: %s)", run_dir,
                    l->n, l->ckpt[l->n - 1].name, l->ckpt[l->n - 1].detail);
    zck_run_list_free(l);
    return rc;
}
