/*
 * resume.c: the one resume policy of a run directory, shared by a plain `--resume auto` and by
 * the restart supervisor. The run resumes from the newest step directory that passes the
 * check the caller asks for (full by default: what `zckpt verify` checks, every shard hashed
 * and manifest.json against SHA256SUMS) and whose name agrees with the step its manifest
 * holds. Every newer step directory is damaged: each is moved aside to damaged-step-N
 * (damaged-step-N.2, ... if taken), kept for inspection and out of the way of the resumed run,
 * which saves that step again. `latest` is rewritten to name the pick. What was done is told
 * to the caller line by line (the library prints nothing). The check of each candidate
 * (check_dir) is also zck_resume_check's, for a resume that names its checkpoint: the one check
 * of every resume. Only proven damage moves a directory aside: a check that cannot run (out of
 * memory, a read the system refuses) stops the pick with that error.
 */
#include "zck_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef zck__stepdir cand;

#define ZCK__RESUME_TICK_S 5.0 /* seconds between the lines of a long hash */

/* The step directories of run_dir, newest first; *n 0 (and 0 returned) when run_dir is
 * absent. */
static int list_steps(cand **out, size_t *n, const char *run_dir)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(run_dir);
    if (!d)
        return errno == ENOENT ? 0 : zr_err_sys(errno, "%s: opendir", run_dir);
    cand *v = NULL;
    size_t k = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        uint64_t s;
        struct stat st;
        char *p = NULL;
        if (!zck__parse_step_name(de->d_name, &s))
            continue;
        if (!(p = zck_path_join(run_dir, de->d_name)))
            rc = ZR_ENOMEM;
        else if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rc = zck__steps_add(&v, &k, &cap, s, de->d_name);
        free(p);
    }
    closedir(d);
    if (rc) {
        zck__steps_free(v, k);
        return rc;
    }
    zck__steps_sort_desc(v, k);
    *out = v;
    *n = k;
    return 0;
}

static void say(const zck_resume_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A line through o->say every few seconds while the shards are hashed (on a terminal or not:
 * a resume hashing terabytes is seen to be busy). */
typedef struct {
    const zck_resume_opts *o;
    const char *dir;
    double t0, last;
} ticker;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void tick(void *ctx, const char *what, uint64_t done, uint64_t total)
{
    (void)what;
    ticker *t = ctx;
    double now = mono_s();
    if (now - t->last < ZCK__RESUME_TICK_S || done >= total)
        return;
    t->last = now;
    double el = now - t->t0, rate = el > 0 ? (double)done / el : 0;
    say(t->o, "checking %s: %.1f of %.1f GiB hashed (%.0f%%, %.0f MiB/s%s%.0f s left)",
        t->dir, (double)done / (1 << 30), (double)total / (1 << 30),
        total ? 100.0 * (double)done / (double)total : 100.0, rate / (1 << 20),
        rate > 0 ? ", about " : "", rate > 0 ? (double)(total - done) / rate : 0.0);
}

/*
 * The one check of a checkpoint directory (zck_resume_check, each candidate of
 * zck_resume_pick): what is wrong with it into why ("" when it passes the check of o->verify),
 * cheap checks first and no hashing once one failed. Negative when the check could not run (out
 * of memory, a read the system refused, the directory removed meanwhile): no verdict then.
 */
static int check_dir(char *why, size_t cap, const char *dir, const zck_resume_opts *o)
{
    why[0] = 0;
    zck_report *rep = NULL;
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    vo.quick = o->verify != ZCK_RESUME_VERIFY_FULL;
    vo.jobs = o->jobs ? o->jobs : 1;
    vo.io.io = ZCK_IO_BUFFERED; /* the load that follows finds the shards in the page cache */
    vo.cheap_first = 1;
    vo.precheck = o->precheck;
    vo.precheck_ctx = o->precheck_ctx;
    ticker tk = {o, dir, mono_s(), mono_s()};
    vo.progress = (zck_progress){tick, &tk};
    ZR_TRY(zck_verify(&rep, dir, &vo));
    for (size_t i = 0; i < zck_report_count(rep); i++) {
        const zck_problem *p = zck_report_get(rep, i);
        if (p->kind == ZCK_PROB_IO) { /* the system refused a read: no sign of damage */
            int rc = zr_err_set(ZR_EIO, "%s/%s: unreadable: %s (not a sign of damage: fix the "
                                "cause and run again; nothing was moved)", dir, p->file,
                                p->detail);
            zck_report_free(rep);
            return rc;
        }
    }
    if (zck_report_count(rep)) {
        const zck_problem *p = zck_report_get(rep, 0);
        size_t more = zck_report_count(rep) - 1;
        snprintf(why, cap, "%s: %s: %s%s", p->file, zck_problem_kind_name(p->kind), p->detail,
                 more ? " (and more)" : "");
        zck_report_free(rep);
        return 0;
    }
    zck_report_free(rep);
    const char *base = strrchr(dir, '/');
    uint64_t step;
    if (!zck__parse_step_name(base ? base + 1 : dir, &step))
        return 0; /* a copy under another name: no name to agree with */
    zck_manifest *m = NULL;
    int rc = zck__manifest_load(&m, dir);
    if (rc && !zck__is_damage(rc))
        return rc;
    if (rc) {
        snprintf(why, cap, "manifest.json: %s", zr_err_msg());
        zr_err_clear();
        return 0;
    }
    if (m->step != step)
        snprintf(why, cap, "manifest.json: step %llu, the directory name says %llu (renamed?)",
                 (unsigned long long)m->step, (unsigned long long)step);
    zck__manifest_free(m);
    return 0;
}

/* Rename run_dir/name to damaged-name, damaged-name.2, ... (never replacing anything); the
 * new path into to. */
static int move_aside(char *to, size_t cap, const char *run_dir, const char *name)
{
    char *from = zck_path_join(run_dir, name);
    if (!from)
        return ZR_ENOMEM;
    int rc = ZR_EEXIST;
    for (int k = 1; k < 1000 && rc == ZR_EEXIST; k++) {
        if (k == 1)
            snprintf(to, cap, "%s/damaged-%s", run_dir, name);
        else
            snprintf(to, cap, "%s/damaged-%s.%d", run_dir, name, k);
        struct stat st;
        rc = lstat(to, &st) == 0 ? ZR_EEXIST : zck_rename_noreplace(from, to);
        if (rc == ZR_EEXIST)
            zr_err_clear();
    }
    if (!rc)
        rc = zck_fsync_dir(run_dir);
    else if (rc == ZR_EEXIST)
        rc = zr_err_set(ZR_EEXIST, "%s: damaged-%s.2 .. .999 all taken", from, name);
    free(from);
    return rc;
}

static void say(const zck_resume_opts *o, const char *fmt, ...)
{
    if (!o->say)
        return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->say(o->say_ctx, line);
}

/* The step latest names, or UINT64_MAX when there is no readable latest. */
static uint64_t latest_step(const char *run_dir)
{
    char *p = NULL;
    uint64_t s = UINT64_MAX;
    if (zck_latest(&p, run_dir) == 0) {
        const char *base = strrchr(p, '/');
        if (!zck__parse_step_name(base ? base + 1 : p, &s))
            s = UINT64_MAX;
    }
    zr_err_clear();
    free(p);
    return s;
}

/* After the pick v[i]: move the newer v[0..i) aside, make latest name the pick, and say the
 * note of an interrupted commit when that is what happened. */
static int settle(const char *run_dir, const cand *v, size_t i, char (*why)[1024],
                  const zck_resume_opts *o)
{
    uint64_t ls = latest_step(run_dir);
    for (size_t j = 0; j < i; j++) {
        char to[4200] = "";
        if (!o->dry_run)
            ZR_TRY(move_aside(to, sizeof to, run_dir, v[j].name));
        say(o, "%s/%s does not verify (%s): %s%s; falling back to an older checkpoint",
            run_dir, v[j].name, why[j], o->dry_run ? "it would be moved aside" : "moved aside to ",
            to);
    }
    if (ls == UINT64_MAX || ls < v[i].step)
        say(o, "note: %s/%s is complete and newer than what %s/latest names (its commit was "
               "interrupted): resuming from it", run_dir, v[i].name, run_dir);
    if (ls != v[i].step && !o->dry_run)
        ZR_TRY(zck__write_latest(run_dir, v[i].name));
    return 0;
}

int zck_resume_pick(char **out, const char *run_dir, const zck_resume_opts *opts)
{
    zck_resume_opts def = ZCK_RESUME_OPTS_INIT;
    const zck_resume_opts *o = opts ? opts : &def;
    *out = NULL;
    if (o->verify < ZCK_RESUME_VERIFY_FULL || o->verify > ZCK_RESUME_VERIFY_OFF)
        return zr_err_set(ZR_EINVAL, "resume verify mode %d: expected 0 (full), 1 (quick) or "
                          "2 (off)", o->verify);
    cand *v = NULL;
    size_t n = 0, i = 0;
    ZR_TRY(list_steps(&v, &n, run_dir));
    char (*why)[1024] = calloc(n ? n : 1, sizeof *why);
    int rc = why ? 0 : zr_err_set(ZR_ENOMEM, "out of memory");
    for (i = 0; i < n && !rc; i++) {
        char *dir = zck_path_join(run_dir, v[i].name);
        if (!dir) {
            rc = ZR_ENOMEM;
            break;
        }
        rc = check_dir(why[i], sizeof why[i], dir, o);
        free(dir);
        if (!rc && !why[i][0])
            break;
    }
    if (rc || !n)
        goto out;
    if (i == n) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: none of its %zu checkpoint%s verifies (newest %s: "
                        "%s); not starting over from scratch (move the run directory away to "
                        "do that)", run_dir, n, n == 1 ? "" : "s", v[0].name, why[0]);
        goto out;
    }
    ZR_TRY_GOTO(settle(run_dir, v, i, why, o), rc, out);
    if (!(*out = zck_path_join(run_dir, v[i].name)))
        rc = ZR_ENOMEM;
out:
    free(why);
    zck__steps_free(v, n);
    return rc;
}

int zck_resume_check(char **out, const char *path, const zck_resume_opts *opts)
{
    zck_resume_opts def = ZCK_RESUME_OPTS_INIT;
    const zck_resume_opts *o = opts ? opts : &def;
    *out = NULL;
    char *dir = NULL, why[1024];
    ZR_TRY(zck__resolve(&dir, path));
    int rc = check_dir(why, sizeof why, dir, o);
    if (!rc && why[0])
        rc = zr_err_set(ZR_ECORRUPT, "%s: %s", dir, why);
    if (rc)
        free(dir);
    else
        *out = dir;
    return rc;
}
