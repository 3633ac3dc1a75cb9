/*
 * fmtutil.c: helpers the converters share (see fmtutil.h): the output file that is written
 * under a temporary name and renamed into place only when complete and durable, opening a
 * source checkpoint after a full verification, throttled progress, full reads, and output
 * directories built under a temporary name and renamed into place.
 */
#include "fmtutil.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- atomic output file */

struct zfmt__out {
    char *final, *tmp;
    int fd;
    int committed;
};

int zfmt__out_open(zfmt__out **out, const char *final_path)
{
    zfmt__out *o = calloc(1, sizeof *o);
    if (!o)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    o->fd = -1;
    size_t n = strlen(final_path) + 32;
    if (!(o->final = strdup(final_path)) || !(o->tmp = malloc(n))) {
        zfmt__out_free(o);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    snprintf(o->tmp, n, "%s.tmp-%ld", final_path, (long)getpid());
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o->fd < 0) {
        int rc = zr_err_sys(errno, "%s: create", o->tmp);
        free(o->tmp);
        o->tmp = NULL; /* nothing of ours to remove */
        zfmt__out_free(o);
        return rc;
    }
    *out = o;
    return 0;
}

int zfmt__out_write(zfmt__out *o, const void *data, size_t n_bytes)
{
    const unsigned char *p = data;
    while (n_bytes) {
        ssize_t k = write(o->fd, p, n_bytes);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return zr_err_sys(errno, "%s: write", o->tmp);
        }
        p += k;
        n_bytes -= (size_t)k;
    }
    return 0;
}

/* Start the write-back of a large piece now, while the rest is read (the commit's fsync waits
 * for it); best effort. */
static void start_writeback(zfmt__out *o, uint64_t at, uint64_t n_bytes)
{
#ifdef SYNC_FILE_RANGE_WRITE
    if (n_bytes >= ((uint64_t)1 << 20))
        sync_file_range(o->fd, (off_t)at, (off_t)n_bytes, SYNC_FILE_RANGE_WRITE);
#else
    (void)o;
    (void)at;
    (void)n_bytes;
#endif
}

int zfmt__out_pwrite(zfmt__out *o, const void *data, size_t n_bytes, uint64_t at)
{
    const unsigned char *p = data;
    uint64_t from = at;
    size_t left = n_bytes;
    while (left) {
        ssize_t k = pwrite(o->fd, p, left, (off_t)at);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return zr_err_sys(errno, "%s: write", o->tmp);
        }
        p += k;
        at += (uint64_t)k;
        left -= (size_t)k;
    }
    start_writeback(o, from, n_bytes);
    return 0;
}

int zfmt__fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    const char *dir = dirname(copy);
    int rc = 0, fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        rc = zr_err_sys(errno, "%s: open directory", dir);
    else if (fsync(fd) < 0 && errno != EINVAL)
        rc = zr_err_sys(errno, "%s: fsync directory", dir);
    if (fd >= 0)
        close(fd);
    free(copy);
    return rc;
}

int zfmt__out_commit(zfmt__out *o)
{
    if (fsync(o->fd) < 0)
        return zr_err_sys(errno, "%s: fsync", o->tmp);
    int fd = o->fd;
    o->fd = -1;
    if (close(fd) < 0)
        return zr_err_sys(errno, "%s: close", o->tmp);
    if (rename(o->tmp, o->final) < 0)
        return zr_err_sys(errno, "%s: rename to %s", o->tmp, o->final);
    o->committed = 1;
    return zfmt__fsync_dir_of(o->final);
}

void zfmt__out_free(zfmt__out *o)
{
    if (!o)
        return;
    if (o->fd >= 0)
        close(o->fd);
    if (o->tmp && !o->committed)
        unlink(o->tmp);
    free(o->tmp);
    free(o->final);
    free(o);
}

/* ---------------------------------------------------------------- sources and progress */

struct zfmt__verify {
    pthread_t th;
    char *dir;
    int rc;
    char msg[1024];
};

int zfmt__report_err(const zck_report *rep, const char *dir)
{
    size_t n = zck_report_count(rep);
    if (!n)
        return 0;
    const zck_problem *p = zck_report_get(rep, 0);
    if (n > 1)
        return zr_err_set(ZR_ECORRUPT, "%s/%s: %s: %s (and %zu more problems: run verify on %s)",
                          dir, p->file, zck_problem_kind_name(p->kind), p->detail, n - 1, dir);
    return zr_err_set(ZR_ECORRUPT, "%s/%s: %s: %s", dir, p->file, zck_problem_kind_name(p->kind),
                      p->detail);
}

static void *verify_main(void *arg)
{
    zfmt__verify *v = arg;
    zck_report *rep = NULL;
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    vo.jobs = 2;                /* two hash threads beside the export's reads */
    vo.io.io = ZCK_IO_BUFFERED; /* share the page cache with the export's reads */
    int rc = zck_verify(&rep, v->dir, &vo);
    if (!rc)
        rc = zfmt__report_err(rep, v->dir);
    if (rc) {
        v->rc = rc;
        snprintf(v->msg, sizeof v->msg, "%s", zr_err_msg());
    }
    zck_report_free(rep);
    return NULL;
}

int zfmt__open_verifying(zck_reader **out, zfmt__verify **vout, const char *ckpt)
{
    zck_reader *r = NULL;
    zfmt__verify *v = NULL;
    int rc = 0;
    ZR_TRY_GOTO(zck_reader_open(&r, ckpt), rc, fail);
    /* verify the directory the reader resolved, so that a `latest` that moves in between
     * cannot make us verify one checkpoint and export another */
    if (!(v = calloc(1, sizeof *v)) || !(v->dir = strdup(zck_reader_path(r)))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto fail;
    }
    if (pthread_create(&v->th, NULL, verify_main, v)) {
        rc = zr_err_set(ZR_ERROR, "could not start the verification thread");
        goto fail;
    }
    *out = r;
    *vout = v;
    return 0;
fail:
    if (v)
        free(v->dir);
    free(v);
    zck_reader_free(r);
    return rc;
}

int zfmt__verify_join(zfmt__verify *v)
{
    if (!v)
        return 0;
    pthread_join(v->th, NULL);
    int rc = v->rc ? zr_err_set(v->rc, "%s", v->msg) : 0;
    free(v->dir);
    free(v);
    return rc;
}

int zfmt__verify_settle(zfmt__verify *v, int rc)
{
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", zr_err_msg());
    int vrc = zfmt__verify_join(v);
    if (vrc)
        return vrc;
    zr_err_set(rc, "%s", keep);
    return rc;
}

#define PROG_EVERY ((uint64_t)4 << 20)

void zfmt__prog_init(zfmt__prog *pr, const zck_progress *p, const char *what, uint64_t total)
{
    pr->p = p && p->fn ? p : NULL;
    pr->what = what;
    pr->done = pr->last = 0;
    pr->total = total;
    if (pr->p)
        pr->p->fn(pr->p->ctx, what, 0, total);
}

void zfmt__prog_add(zfmt__prog *pr, uint64_t n_bytes)
{
    pr->done += n_bytes;
    if (pr->p && (pr->done - pr->last >= PROG_EVERY || pr->done == pr->total)) {
        pr->last = pr->done;
        pr->p->fn(pr->p->ctx, pr->what, pr->done, pr->total);
    }
}

int zfmt__pread_full(int fd, void *dst, size_t n, uint64_t off, const char *path)
{
    unsigned char *p = dst;
    while (n) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return zr_err_sys(errno, "%s: read at byte %llu", path, (unsigned long long)off);
        }
        if (k == 0)
            return zr_err_set(ZR_ECORRUPT, "%s: truncated: end of file at byte %llu, %zu more "
                              "bytes expected", path, (unsigned long long)off, n);
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

char *zfmt__json_dump(const json_t *j, size_t flags)
{
    return zck_json_dumps(j, flags);
}

void zfmt__shape_str(char *out, size_t n, size_t ndim, const uint64_t *shape)
{
    size_t at = 0;
    at += (size_t)snprintf(out, n, "[");
    for (size_t d = 0; d < ndim && at < n; d++)
        at += (size_t)snprintf(out + at, n - at, "%s%llu", d ? ", " : "",
                               (unsigned long long)shape[d]);
    if (at < n)
        snprintf(out + at, n - at, "]");
}

int zfmt__err_recode(int code)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zr_err_msg());
    return zr_err_set(code, "%s", msg);
}

int zfmt__read_file(char **out, size_t *n_bytes, const char *path)
{
    int fd;
    uint64_t size;
    ZR_TRY(zck_open_regular(&fd, path, ZCK_FOLLOW, &size));
    char *buf = size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
    if (!buf) {
        close(fd);
        return zr_err_set(ZR_ENOMEM, "%s: out of memory (%llu bytes)", path,
                          (unsigned long long)size);
    }
    int rc = zfmt__pread_full(fd, buf, (size_t)size, 0, path);
    close(fd);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[size] = 0;
    *out = buf;
    *n_bytes = (size_t)size;
    return 0;
}

/* ---------------------------------------------------------------- output directories */

int zfmt__dir_check(const char *dir, int force, int (*ours)(const char *name), const char *what,
                    int *exists)
{
    struct stat st;
    *exists = 0;
    if (lstat(dir, &st) < 0) {
        if (errno == ENOENT)
            return 0;
        return zr_err_sys(errno, "%s", dir);
    }
    if (!S_ISDIR(st.st_mode))
        return zr_err_set(ZR_EEXIST, "%s exists and is not a directory%s", dir,
                          S_ISLNK(st.st_mode) ? " (a symbolic link)" : "");
    *exists = 1;
    DIR *d = opendir(dir);
    if (!d)
        return zr_err_sys(errno, "%s: open directory", dir);
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (!force) {
            rc = zr_err_set(ZR_EEXIST, "%s is not empty (it holds '%s')", dir, e->d_name);
            break;
        }
        struct stat es;
        if (!ours(e->d_name) || fstatat(dirfd(d), e->d_name, &es, AT_SYMLINK_NOFOLLOW) ||
            !S_ISREG(es.st_mode))
            rc = zr_err_set(ZR_EEXIST, "%s holds '%s', which %s does not write: not replacing "
                            "it", dir, e->d_name, what);
    }
    closedir(d);
    return rc;
}

void zfmt__dir_remove(const char *dir, int (*ours)(const char *name))
{
    char tmp[64];
    int n = snprintf(tmp, sizeof tmp, ".tmp-%ld", (long)getpid());
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        char name[256];
        snprintf(name, sizeof name, "%s", e->d_name);
        if (len > (size_t)n && !strcmp(name + len - (size_t)n, tmp))
            name[len - (size_t)n] = 0;
        if (strcmp(name, ".") && strcmp(name, "..") && ours(name))
            unlinkat(dirfd(d), e->d_name, 0);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

int zfmt__dir_put(const char *tmp, const char *dir, int exists, int (*ours)(const char *name))
{
    char old[4096];
    if (exists) {
        if ((size_t)snprintf(old, sizeof old, "%s.old-%ld", dir, (long)getpid()) >= sizeof old)
            return zr_err_set(ZR_EINVAL, "%s: path too long", dir);
        if (rename(dir, old) < 0)
            return zr_err_sys(errno, "%s: rename to %s", dir, old);
    }
    if (rename(tmp, dir) < 0) {
        int rc = zr_err_sys(errno, "%s: rename to %s", tmp, dir);
        if (exists && rename(old, dir) < 0)
            zr_err_prefix("(the old output is at %s) ", old);
        return rc;
    }
    int rc = zfmt__fsync_dir_of(dir);
    if (exists)
        zfmt__dir_remove(old, ours);
    return rc;
}

int zfmt__dir_tmp(char dir[4096], char tmp[4096], const char *out_dir)
{
    size_t n = strlen(out_dir);
    while (n > 1 && out_dir[n - 1] == '/')
        n--;
    if (n + 64 > 4096)
        return zr_err_set(ZR_EINVAL, "%s: path too long", out_dir);
    snprintf(dir, 4096, "%.*s", (int)n, out_dir);
    snprintf(tmp, 4096, "%s.tmp-%ld", dir, (long)getpid());
    return 0;
}

void zfmt__transpose(void *dst, const void *src, size_t O, size_t I, size_t es)
{
    const unsigned char *a = src;
    unsigned char *b = dst;
    if (es == 4) { /* f32, the common case: a constant size the compiler copies inline */
        for (size_t o = 0; o < O; o++)
            for (size_t i = 0; i < I; i++)
                memcpy(b + (i * O + o) * 4, a + (o * I + i) * 4, 4);
        return;
    }
    for (size_t o = 0; o < O; o++)
        for (size_t i = 0; i < I; i++)
            memcpy(b + (i * O + o) * es, a + (o * I + i) * es, es);
}
