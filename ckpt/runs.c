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
 * unpack's (.tmp-unpack-*), a step directory being deleted (.del-step-*, .del-damaged-step-*),
 * a half-written latest (.latest.tmp-*). */
static bool is_stale_tmp(const char *nm, uint64_t below)
{
    unsigned long long ts;
    char dash;
    return (sscanf(nm, ".tmp-step-%llu%c", &ts, &dash) == 2 && dash == '-' && ts <= below) ||
           !strncmp(nm, ".tmp-unpack-", 12) || !strncmp(nm, ".del-step-", 10) ||
           !strncmp(nm, ".del-damaged-step-", 18) || !strncmp(nm, ".latest.tmp-", 12);
}

/* A checkpoint the resume policy moved aside: a directory named damaged-step-N or
 * damaged-step-N.K (zck_resume_pick); *step its N. */
static bool parse_damaged(const char *nm, uint64_t *step)
{
    if (strncmp(nm, "damaged-", 8))
        return false;
    char base[32];
    size_t n = strcspn(nm + 8, ".");
    if (n >= sizeof base)
        return false;
    memcpy(base, nm + 8, n);
    base[n] = 0;
    const char *k = nm + 8 + n;
    if (*k && (!k[1] || strlen(k + 1) > 3 || strspn(k + 1, "0123456789") != strlen(k + 1)))
        return false;
    return zck__parse_step_name(base, step);
}

static bool is_format_file(const char *nm)
{
    size_t n = strlen(nm);
    return !strcmp(nm, "manifest.json") || !strcmp(nm, "SHA256SUMS") ||
           (!strncmp(nm, "shard-", 6) && n > 10 && !strcmp(nm + n - 4, ".bin"));
}

/* name is an extra file (tokenizer.json) that the manifest of the checkpoint read by r lists;
 * r may be NULL (no readable manifest: none is). */
static bool listed_extra(const zck_reader *r, const char *name)
{
    for (size_t i = 0; r && i < zck_reader_n_files(r); i++)
        if (!strcmp(zck_reader_file_name(r, i), name))
            return true;
    return false;
}

/* dir holds only what the format writes: manifest.json, SHA256SUMS and shard-*.bin regular
 * files, the extra files its manifest lists, and, when nest is set, step-* directories holding
 * only those (an unpack's temporary). Anything else (a user's file, a symlink, a subdirectory)
 * keeps it from being deleted. */
static bool format_only(const char *dir, int nest)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    zck_reader *r = NULL;
    if (zck_reader_open(&r, dir) < 0) { /* no manifest, or a damaged one: no extra files */
        r = NULL;
        zr_err_clear();
    }
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
            ok = is_format_file(nm) || listed_extra(r, nm);
        else
            ok = S_ISDIR(st.st_mode) && nest && zck__parse_step_name(nm, &s) && format_only(p, 0);
        free(p);
    }
    closedir(d);
    zck_reader_free(r);
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

/* zck_prune with o->damaged: every damaged-step-N directory that holds only the format's
 * files, and nothing else. */
static int prune_damaged(zck_namelist *removed, const char *run_dir, const zck_prune_opts *o)
{
    DIR *d = opendir(run_dir);
    if (!d)
        return zr_err_sys(errno, "%s: opendir", run_dir);
    zck_namelist found = {0, NULL};
    int rc = 0;
    struct dirent *de;
    uint64_t s;
    while (!rc && (de = readdir(d)))
        if (parse_damaged(de->d_name, &s) && is_dir_in(run_dir, de->d_name))
            rc = names_add(&found, de->d_name);
    closedir(d);
    for (size_t i = 0; i < found.n && !rc; i++) {
        if (!ours_to_delete(run_dir, found.name[i]))
            continue;
        rc = names_add(removed, found.name[i]);
        if (!rc && !o->dry_run)
            rc = remove_step_dir(run_dir, found.name[i]);
    }
    zck_namelist_free(&found);
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
    int rc = o->damaged ? prune_damaged(removed, run_dir, o)
                        : prune_locked(removed, run_dir, NULL, o);
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
    return s == ZCK_CKPT_COMPLETE     ? "complete"
           : s == ZCK_CKPT_INCOMPLETE ? "incomplete"
           : s == ZCK_CKPT_DAMAGED    ? "damaged (moved aside)"
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
    const zck_run_entry *x = a, *y = b; /* damaged-step-N before damaged-step-N.2 */
    return x->step < y->step ? -1 : x->step > y->step ? 1 : strcmp(x->name, y->name);
}

/* What ls says of a checkpoint the quick check found problems in ("" when none), each problem
 * with its file: the first one; when incomplete, every missing or short file (at most 8 named,
 * then their count). malloc'd, NULL on ENOMEM. */
static char *entry_detail(const zck_report *rep, bool incomplete)
{
    size_t n = zck_report_count(rep), shown = 0, more = 0;
    char buf[1200] = "";
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        const zck_problem *p = zck_report_get(rep, i);
        bool short_file = p->kind == ZCK_PROB_MISSING || p->kind == ZCK_PROB_TRUNCATED;
        if (i && (!incomplete || !short_file))
            continue;
        if (shown == 8 || len >= sizeof buf - 1) {
            more++;
            continue;
        }
        int k = snprintf(buf + len, sizeof buf - len, "%s%s: %s", shown ? "; " : "", p->file,
                         p->detail);
        len = k < 0 ? len : len + (size_t)k < sizeof buf ? len + (size_t)k : sizeof buf - 1;
        shown++;
    }
    char *out = NULL;
    if (more ? asprintf(&out, "%s; and %zu more", buf, more) < 0 : !(out = strdup(buf)))
        return NULL;
    return out;
}

/* A new zeroed entry named name (step s) at the end of *v (*n of them): *out. */
static int add_entry(zck_run_entry **out, zck_run_entry **v, size_t *n, const char *name,
                     uint64_t s)
{
    zck_run_entry *nv = realloc(*v, (*n + 1) * sizeof *nv);
    if (!nv)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    *v = nv;
    zck_run_entry *e = &nv[*n];
    memset(e, 0, sizeof *e);
    e->step = s;
    if (!(e->name = strdup(name)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    (*n)++;
    *out = e;
    return 0;
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
    if (zck_report_count(rep)) {
        const zck_problem *pb = zck_report_get(rep, 0);
        bool missing_manifest = pb->kind == ZCK_PROB_MANIFEST && strstr(pb->detail, ": missing");
        e->status = missing_manifest || pb->kind == ZCK_PROB_MISSING ||
                            pb->kind == ZCK_PROB_TRUNCATED ? ZCK_CKPT_INCOMPLETE
                                                           : ZCK_CKPT_CORRUPT;
    }
    e->detail = entry_detail(rep, e->status == ZCK_CKPT_INCOMPLETE);
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
            zck_run_entry *e;
            if (!(rc = add_entry(&e, &l->ckpt, &l->n, de->d_name, s))) {
                e->is_latest = l->latest && !strcmp(l->latest, de->d_name);
                rc = check_entry(e, run_dir);
            }
        } else if (parse_damaged(de->d_name, &s) && is_dir_in(run_dir, de->d_name)) {
            zck_run_entry *e;
            if (!(rc = add_entry(&e, &l->damaged, &l->n_damaged, de->d_name, s)) &&
                !(rc = check_entry(e, run_dir)))
                e->status = ZCK_CKPT_DAMAGED;
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
    if (l->n_damaged)
        qsort(l->damaged, l->n_damaged, sizeof *l->damaged, cmp_entry);
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
    for (size_t i = 0; i < l->n_damaged; i++) {
        free(l->damaged[i].name);
        free(l->damaged[i].detail);
    }
    free(l->ckpt);
    free(l->damaged);
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

/* ---------------------------------------------------------------- where outputs may go */

/* path with its directories resolved (symbolic links followed, as far as they exist; the rest
 * as written), its last component as written: what a rename over path replaces. malloc'd. */
static char *resolve_dirs(const char *path)
{
    char *p = strdup(path), *rest = strdup("");
    size_t n = p ? strlen(p) : 0;
    while (n > 1 && p[n - 1] == '/')
        p[--n] = 0;
    char *real = NULL;
    while (p && rest && !real) {
        char *slash = strrchr(p, '/');
        char *tail = NULL;
        if (asprintf(&tail, "%s%s%s", slash ? slash + 1 : p, rest[0] ? "/" : "", rest) < 0)
            break;
        free(rest);
        rest = tail;
        if (!slash)
            real = realpath(".", NULL);
        else if (slash == p)
            real = strdup("/");
        else {
            *slash = 0;
            real = realpath(p, NULL);
        }
        if (!real && errno != ENOENT && errno != ENOTDIR)
            break;
    }
    char *out = NULL;
    if (real && rest && asprintf(&out, "%s/%s", strcmp(real, "/") ? real : "", rest) < 0)
        out = NULL;
    free(p);
    free(rest);
    free(real);
    return out;
}

/* A run directory: a latest file, or step-N directories with manifests. */
static bool is_run_dir(const char *dir)
{
    return !has_manifest(dir) && is_zckpt_dir(dir);
}

/* A checkpoint directory wherever it is: manifest.json and SHA256SUMS (a manifest.json alone,
 * a web project's, does not make one). */
static bool is_ckpt_dir(const char *dir)
{
    char *p = zck_path_join(dir, "SHA256SUMS");
    struct stat st;
    bool r = p && lstat(p, &st) == 0 && S_ISREG(st.st_mode) && has_manifest(dir);
    free(p);
    return r;
}

int zck_check_unmanaged(const char *path)
{
    char *full = resolve_dirs(path);
    if (!full)
        return errno == ENOMEM ? zr_err_set(ZR_ENOMEM, "out of memory")
                               : zr_err_sys(errno, "%s: resolve", path);
    int rc = 0;
    for (size_t i = strlen(full); i-- > 0 && !rc;) {
        if (full[i] != '/')
            continue;
        const char *entry = full + i + 1; /* the entry of the directory full[0, i) on the way */
        int len = (int)strcspn(entry, "/");
        char *dir = strndup(full, i ? i : 1);
        if (!dir)
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        else if (is_ckpt_dir(dir))
            rc = zr_err_set(ZR_EINVAL, "%s: inside the checkpoint directory %s: refusing to "
                            "write there", path, dir);
        else if (zck_run_owns(entry, (size_t)len) && is_run_dir(dir))
            rc = zr_err_set(ZR_EINVAL, "%s: '%.*s' of the run directory %s is the run's own "
                            "(step directories, latest, .lock, temporaries): refusing to write "
                            "there", path, len, entry, dir);
        free(dir);
    }
    free(full);
    return rc;
}
