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
    char *p = zck_path_join(dir, name);
    struct stat st;
    bool r = p && lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
    free(p);
    return r;
}

/* A temporary of the format: a staging directory of step <= below (.tmp-step-N-*), an
 * unpack's (.tmp-unpack-*), a step directory being deleted (.del-step-*), a half-written
 * latest (.latest.tmp-*). */
static bool is_stale_tmp(const char *nm, uint64_t below)
{
    unsigned long long ts;
    char dash;
    return (sscanf(nm, ".tmp-step-%llu%c", &ts, &dash) == 2 && dash == '-' && ts <= below) ||
           !strncmp(nm, ".tmp-unpack-", 12) || !strncmp(nm, ".del-step-", 10) ||
           !strncmp(nm, ".latest.tmp-", 12);
}

static bool is_format_file(const char *nm)
{
    size_t n = strlen(nm);
    return !strcmp(nm, "manifest.json") || !strcmp(nm, "SHA256SUMS") ||
           (!strncmp(nm, "shard-", 6) && n > 10 && !strcmp(nm + n - 4, ".bin"));
}

/* dir holds only what the format writes: manifest.json, SHA256SUMS and shard-*.bin regular
 * files, and, when nest is set, step-* directories holding only those (an unpack's temporary).
 * Anything else (a user's file, a symlink, a subdirectory) keeps it from being deleted. */
static bool format_only(const char *dir, int nest)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool ok = true;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        const char *nm = de->d_name;
        uint64_t s;
        if (!strcmp(nm, ".") || !strcmp(nm, ".."))
            continue;
        char *p = zck_path_join(dir, nm);
        struct stat st;
        if (!p || lstat(p, &st) < 0)
            ok = false;
        else if (S_ISREG(st.st_mode))
            ok = is_format_file(nm);
        else
            ok = S_ISDIR(st.st_mode) && nest && zck__parse_step_name(nm, &s) && format_only(p, 0);
        free(p);
    }
    closedir(d);
    return ok;
}

/* What may be deleted under name in run_dir: a directory holding only the format's files, or
 * a half-written latest that is a regular file. Else it is left, with a warning. */
static bool ours_to_delete(const char *run_dir, const char *name)
{
    char *p = zck_path_join(run_dir, name);
    struct stat st;
    bool ok = false;
    if (p && lstat(p, &st) == 0)
        ok = S_ISDIR(st.st_mode) ? format_only(p, !strncmp(name, ".tmp-unpack-", 12))
                                 : S_ISREG(st.st_mode) && !strncmp(name, ".latest.tmp-", 12);
    if (p && !ok)
        zr_log(ZR_LOG_WARN, "%s: holds files zckpt did not write: left in place", p);
    free(p);
    return ok;
}

/* Remove a step directory by first renaming it out of sight (atomic and made durable), then
 * deleting it: a crash can never leave a half-emptied directory under a step- name. */
static int remove_step_dir(const char *run_dir, const char *name)
{
    char hidden[128];
    snprintf(hidden, sizeof hidden, ".del-%s-%ld", name, (long)getpid());
    char *from = zck_path_join(run_dir, name), *to = zck_path_join(run_dir, hidden);
    int rc = 0;
    if (!from || !to)
        rc = ZR_ENOMEM;
    else if (!(rc = zck__rename(from, to)) && !(rc = zck_fsync_dir(run_dir)))
        rc = zck__rmtree(to);
    free(from);
    free(to);
    return rc;
}

static int remove_any(const char *run_dir, const char *name)
{
    char *p = zck_path_join(run_dir, name);
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

int zck__housekeeping(const char *run_dir, uint64_t step, uint64_t tmp_below, const char *keep,
                      const char *keep2, const zck_prune_opts *o, zck_namelist *removed)
{
    DIR *d = opendir(run_dir);
    if (!d)
        return zr_err_sys(errno, "%s: opendir", run_dir);
    zck__stepdir *v = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) && !rc) {
        uint64_t s;
        const char *nm = de->d_name;
        if (zck__parse_step_name(nm, &s) && s <= step && is_dir_in(run_dir, nm))
            rc = zck__steps_add(&v, &n, &cap, s, nm);
        else if (o->gc_tmp && is_stale_tmp(nm, tmp_below) && ours_to_delete(run_dir, nm)) {
            rc = names_add(removed, nm);
            if (!rc && !o->dry_run)
                rc = remove_any(run_dir, nm);
        }
    }
    closedir(d);
    if (!rc && o->keep_last) {
        zck__steps_sort_desc(v, n);
        unsigned kept = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            bool every = o->keep_every && v[i].step % o->keep_every == 0;
            if (!strcmp(v[i].name, keep) || (keep2 && !strcmp(v[i].name, keep2)) ||
                kept < o->keep_last) {
                kept++;
                continue;
            }
            if (every || !ours_to_delete(run_dir, v[i].name))
                continue;
            rc = names_add(removed, v[i].name);
            if (!rc && !o->dry_run)
                rc = remove_step_dir(run_dir, v[i].name);
        }
    }
    zck__steps_free(v, n);
    return rc;
}

/* Retention under the run directory's lock (held by the caller), keeping also_keep too. */
static int prune_locked(zck_namelist *removed, const char *run_dir, const char *also_keep,
                        const zck_prune_opts *o)
{
    char *latest = NULL;
    int rc = zck_latest(&latest, run_dir);
    if (rc == ZR_ENOTFOUND) {
        /* nothing committed: no retention, but what failed saves left is collected */
        zr_err_clear();
        zck_prune_opts tmp_only = *o;
        tmp_only.keep_last = 0;
        rc = zck__housekeeping(run_dir, 0, UINT64_MAX, "", NULL, &tmp_only, removed);
    } else if (!rc) {
        const char *base = strrchr(latest, '/');
        base = base ? base + 1 : latest;
        uint64_t step = 0;
        /* under the lock no job is saving here: every staging directory is abandoned */
        rc = zck__parse_step_name(base, &step)
                 ? zck__housekeeping(run_dir, step, UINT64_MAX, base, also_keep, o, removed)
                 : zr_err_set(ZR_ECORRUPT, "%s/latest: not a step directory name", run_dir);
    }
    free(latest);
    return rc;
}

int zck_prune(zck_namelist *removed, const char *run_dir, const zck_prune_opts *o)
{
    zck_prune_opts def = ZCK_PRUNE_OPTS_INIT;
    if (!o)
        o = &def;
    struct stat st;
    if (stat(run_dir, &st) < 0)
        return zr_err_sys(errno, "%s", run_dir);
    zck_lock *lk = NULL;
    ZR_TRY(zck_run_lock(&lk, run_dir, "prune"));
    int rc = prune_locked(removed, run_dir, NULL, o);
    zck_run_unlock(lk);
    return rc;
}

int zck_prune_held(zck_namelist *removed, const zck_lock *held, const char *run_dir,
                   const char *also_keep, const zck_prune_opts *o)
{
    zck_prune_opts def = ZCK_PRUNE_OPTS_INIT;
    if (!held)
        return zr_err_set(ZR_EINVAL, "%s: retention without the run directory's lock", run_dir);
    if (also_keep) { /* a step directory's name, or a path ending in one */
        const char *b = strrchr(also_keep, '/');
        also_keep = b ? b + 1 : also_keep;
    }
    return prune_locked(removed, run_dir, also_keep, o ? o : &def);
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
        char *p = zck_path_join(dir, de->d_name);
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
    char *p = zck_path_join(run_dir, e->name);
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
    /* staging directories of any step are abandoned unless a live job holds the directory;
     * while one does, only those at or below latest (its own commits collect them) */
    rc = zck_run_lock_holder(&l->holder, run_dir);
    uint64_t latest_step = l->holder ? 0 : UINT64_MAX;
    if (l->latest && l->holder)
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
    free(l->holder);
    zck_namelist_free(&l->stale);
    zck_namelist_free(&l->foreign);
    free(l);
}

/* ---------------------------------------------------------------- replacing an output */

static bool has_manifest(const char *dir)
{
    char *p = zck_path_join(dir, "manifest.json");
    struct stat st;
    bool r = p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
    free(p);
    return r;
}

/* A run directory (a latest file, or step-N directories with manifests) or a checkpoint
 * directory (a manifest). */
static bool is_zckpt_dir(const char *dir)
{
    if (has_manifest(dir))
        return true;
    char *lp = zck_path_join(dir, "latest");
    struct stat st;
    bool r = lp && lstat(lp, &st) == 0 && S_ISREG(st.st_mode);
    free(lp);
    DIR *d = r ? NULL : opendir(dir);
    struct dirent *de;
    uint64_t s;
    while (d && !r && (de = readdir(d)))
        if (zck__parse_step_name(de->d_name, &s)) {
            char *p = zck_path_join(dir, de->d_name);
            r = p && has_manifest(p);
            free(p);
        }
    if (d)
        closedir(d);
    return r;
}

/* target (lstat'ed: a symlink is never followed) is src or one of its ancestors */
static int holds_source(bool *out, const struct stat *t, const char *src)
{
    *out = false;
    char *real = realpath(src, NULL);
    if (!real)
        return zr_err_sys(errno, "%s", src);
    for (;;) {
        struct stat st;
        if (stat(real, &st) == 0 && st.st_dev == t->st_dev && st.st_ino == t->st_ino) {
            *out = true;
            break;
        }
        char *slash = strrchr(real, '/');
        if (!slash || real[1] == 0)
            break;
        if (slash == real)
            slash[1] = 0; /* "/x" -> "/" */
        else
            *slash = 0;
    }
    free(real);
    return 0;
}

int zck_check_replaceable(const char *target, const char *src)
{
    struct stat t;
    if (lstat(target, &t) < 0)
        return errno == ENOENT ? 0 : zr_err_sys(errno, "%s", target);
    bool inside = false;
    if (src)
        ZR_TRY(holds_source(&inside, &t, src));
    if (inside)
        return zr_err_set(ZR_EEXIST, "%s: is the source %s or a directory holding it: refusing "
                          "to replace it", target, src);
    if (S_ISLNK(t.st_mode))
        return 0; /* replacing a symlink removes the link, never what it points to */
    if (!S_ISDIR(t.st_mode) || !is_zckpt_dir(target))
        return zr_err_set(ZR_EEXIST, "%s: not a zckpt run or checkpoint directory: refusing to "
                          "replace it (remove it yourself or choose another output)", target);
    char *holder = NULL;
    ZR_TRY(zck_run_lock_holder(&holder, target));
    if (holder) {
        int rc = zr_err_set(ZR_EBUSY, "%s: in use by %s: refusing to replace it", target,
                            holder);
        free(holder);
        return rc;
    }
    return 0;
}
