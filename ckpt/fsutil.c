/*
 * fsutil.c: the fault-injection hook and the small filesystem operations of the commit
 * protocol (fsync of files and directories, rename, mkdir, removal), each reporting errno
 * failures with the path named, and the one way every checkpoint or data file is opened for
 * reading (zck_open_regular: regular files only, never through a symbolic link, never blocking).
 */
#include "zck_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static zck_fault_fn fault_fn;
static void *fault_ctx;

void zck_fault_set(zck_fault_fn fn, void *ctx)
{
    fault_fn = fn;
    fault_ctx = ctx;
}

int zck__fault(zck_op op, const char *path)
{
    return fault_fn ? fault_fn(op, path, fault_ctx) : 0;
}

char *zck_path_join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *p = malloc(na + nb + 2);
    if (!p) {
        zr_err_set(ZR_ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(p, a, na);
    size_t k = na;
    if (na && a[na - 1] != '/')
        p[k++] = '/';
    memcpy(p + k, b, nb + 1);
    return p;
}

int zck_fsync_dir(const char *dir)
{
    int e = zck__fault(ZCK_OP_OPEN, dir);
    int fd = e ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return zr_err_sys(e ? e : errno, "%s: open directory", dir);
    e = zck__fault(ZCK_OP_FSYNC, dir);
    if (e || fsync(fd) < 0) {
        e = e ? e : errno;
        close(fd);
        return zr_err_sys(e, "%s: fsync directory", dir);
    }
    close(fd);
    return 0;
}

int zck__mkdir(const char *path)
{
    int e = zck__fault(ZCK_OP_MKDIR, path);
    if (e || (mkdir(path, 0777) < 0 && errno != EEXIST))
        return zr_err_sys(e ? e : errno, "%s: mkdir", path);
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return zr_err_set(ZR_EEXIST, "%s: exists and is not a directory", path);
    return 0;
}

int zck__rename(const char *from, const char *to)
{
    int e = zck__fault(ZCK_OP_RENAME, from);
    if (e || rename(from, to) < 0)
        return zr_err_sys(e ? e : errno, "rename %s -> %s", from, to);
    return 0;
}

int zck_rename_noreplace(const char *from, const char *to)
{
    int e = zck__fault(ZCK_OP_RENAME, from);
    if (e)
        return zr_err_sys(e, "rename %s -> %s", from, to);
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno == EEXIST)
        return zr_err_set(ZR_EEXIST, "%s: already exists", to);
    if (errno != EINVAL && errno != ENOSYS)
        return zr_err_sys(errno, "rename %s -> %s", from, to);
    /* a filesystem without RENAME_NOREPLACE: check, then rename */
    struct stat st;
    if (lstat(to, &st) == 0)
        return zr_err_set(ZR_EEXIST, "%s: already exists", to);
    if (rename(from, to) < 0)
        return zr_err_sys(errno, "rename %s -> %s", from, to);
    return 0;
}

int zck__rmtree(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? 0 : zr_err_sys(errno, "%s: opendir", path);
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char *p = zck_path_join(path, de->d_name);
        if (!p) {
            rc = ZR_ENOMEM;
            break;
        }
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rc = zck__rmtree(p);
        else {
            int e = zck__fault(ZCK_OP_UNLINK, p);
            if (e || unlink(p) < 0)
                rc = zr_err_sys(e ? e : errno, "%s: unlink", p);
        }
        free(p);
        if (rc)
            break;
    }
    closedir(d);
    if (!rc) {
        int e = zck__fault(ZCK_OP_UNLINK, path);
        if (e || rmdir(path) < 0)
            rc = zr_err_sys(e ? e : errno, "%s: rmdir", path);
    }
    return rc;
}

int zck_remove_tree(const char *path) { return zck__rmtree(path); }

int zck__write_small(const char *path, const void *data, size_t len)
{
    int e = zck__fault(ZCK_OP_OPEN, path);
    int fd = e ? -1 : open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return zr_err_sys(e ? e : errno, "%s: create", path);
    const char *p = data;
    size_t done = 0;
    while (done < len) {
        e = zck__fault(ZCK_OP_WRITE, path);
        ssize_t k = e ? -1 : write(fd, p + done, len - done);
        if (k < 0) {
            if (!e && errno == EINTR)
                continue;
            e = e ? e : errno;
            close(fd);
            return zr_err_sys(e, "%s: write", path);
        }
        done += (size_t)k;
    }
    e = zck__fault(ZCK_OP_FSYNC, path);
    if (e || fsync(fd) < 0) {
        e = e ? e : errno;
        close(fd);
        return zr_err_sys(e, "%s: fsync", path);
    }
    if (close(fd) < 0)
        return zr_err_sys(errno, "%s: close", path);
    return 0;
}

int zck_write_file_atomic(const char *path, const void *data, size_t len)
{
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) + 1 : 0; /* the directory, its '/' included */
    char *dir = dl ? strndup(path, dl) : strdup("."), *tmp = malloc(strlen(path) + 40);
    int rc = 0;
    if (!dir || !tmp) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    snprintf(tmp, strlen(path) + 40, "%.*s.%s.tmp-%ld", (int)dl, path, path + dl,
             (long)getpid());
    unlink(tmp); /* a temporary of ours left by a crash, or a FIFO that would block the open */
    if ((rc = zck__write_small(tmp, data, len)) || (rc = zck__rename(tmp, path)) ||
        (rc = zck_fsync_dir(dir))) {
        unlink(tmp);
        zr_err_prefix("%s: ", path);
    }
out:
    free(dir);
    free(tmp);
    return rc;
}

const char *zck__file_type_name(mode_t m)
{
    return S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISDIR(m) ? "a directory"
         : S_ISLNK(m) ? "a symbolic link" : "not a plain file";
}

char *zck_path_resolve(const char *path)
{
    char *r = realpath(path, NULL);
    if (r || errno != ENOENT)
        return r;
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    char *rd = dir ? realpath(dir[0] ? dir : "/", NULL) : NULL;
    if (rd && asprintf(&r, "%s/%s", strcmp(rd, "/") ? rd : "", slash ? slash + 1 : path) < 0)
        r = NULL;
    free(dir);
    free(rd);
    return r;
}

int zck_same_file(const char *a, const char *b)
{
    struct stat x, y;
    int ea = stat(a, &x), eb = stat(b, &y);
    if (!ea || !eb)
        return !ea && !eb && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
    char *ra = zck_path_resolve(a), *rb = zck_path_resolve(b);
    int same = ra && rb ? !strcmp(ra, rb) : !strcmp(a, b);
    free(ra);
    free(rb);
    return same;
}

int zck_check_output(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return zr_err_set(ZR_EINVAL, "%s is %s, not a regular file", path,
                          zck__file_type_name(st.st_mode));
    return 0;
}

int zck_open_regular(int *out, const char *path, int nofollow, uint64_t *bytes)
{
    /* O_NONBLOCK: opening a FIFO with no writer would wait forever; O_NOFOLLOW: a symbolic link
     * as the last component fails with ELOOP instead of reaching any file */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
    struct stat st;
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
            return zr_err_set(ZR_ECORRUPT, "%s is a symbolic link, not a regular file", path);
        return zr_err_sys(e, "%s: open", path);
    }
    int fl;
    if (fstat(fd, &st) < 0 || (fl = fcntl(fd, F_GETFL)) < 0 ||
        (S_ISREG(st.st_mode) && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)) {
        int e = errno;
        close(fd);
        return zr_err_sys(e, "%s: stat", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return zr_err_set(ZR_ECORRUPT, "%s is %s, not a regular file", path,
                          zck__file_type_name(st.st_mode));
    }
    if (bytes)
        *bytes = (uint64_t)st.st_size;
    *out = fd;
    return 0;
}

int zck__read_small(char **out, size_t *len, const char *path, size_t max)
{
    int e = zck__fault(ZCK_OP_OPEN, path), fd;
    uint64_t size;
    if (e)
        return zr_err_sys(e, "%s: open", path);
    ZR_TRY(zck_open_regular(&fd, path, ZCK_NOFOLLOW, &size));
    if (size > max) {
        close(fd);
        return zr_err_set(ZR_ECORRUPT, "%s: %llu bytes, more than the %zu this file may have",
                          path, (unsigned long long)size, max);
    }
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        close(fd);
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", path);
    }
    size_t done = 0;
    while (done < (size_t)size) {
        e = zck__fault(ZCK_OP_READ, path);
        ssize_t k = e ? -1 : read(fd, buf + done, (size_t)size - done);
        if (k < 0 && !e && errno == EINTR)
            continue;
        if (k <= 0) {
            e = e ? e : k == 0 ? EIO : errno;
            free(buf);
            close(fd);
            return zr_err_sys(e, "%s: read", path);
        }
        done += (size_t)k;
    }
    close(fd);
    buf[done] = 0;
    *out = buf;
    if (len)
        *len = done;
    return 0;
}

/* One existing component p of the way to path's parent: a directory, or a symbolic link to
 * one (followed, as mkdir -p does); else what it is, named. */
static int parent_is_dir(const char *p, const struct stat *st, const char *path)
{
    struct stat t;
    if (S_ISDIR(st->st_mode) || (S_ISLNK(st->st_mode) && stat(p, &t) == 0 && S_ISDIR(t.st_mode)))
        return 0;
    if (!S_ISLNK(st->st_mode))
        return zr_err_set(ZR_EINVAL, "%s: %s is %s, not a directory: cannot make the "
                          "directories it should hold", path, p,
                          S_ISREG(st->st_mode) ? "a file" : zck__file_type_name(st->st_mode));
    char to[1024];
    ssize_t n = readlink(p, to, sizeof to - 1);
    to[n < 0 ? 0 : n] = 0;
    return zr_err_set(ZR_EINVAL, "%s: %s is a symbolic link to '%s', %s: cannot make the "
                      "directories it should hold", path, p, to,
                      stat(p, &t) < 0 ? "which does not exist" : "not a directory");
}

int zck_make_parents(char **made, const char *path)
{
    if (made)
        *made = NULL;
    char *p = strdup(path);
    if (!p)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') /* "out/" names out itself */
        p[--n] = 0;
    char *last = strrchr(p, '/');
    n = last ? (size_t)(last - p) : 0; /* the parent is p[0, n) */
    int rc = 0;
    for (size_t i = 1; i <= n && !rc; i++) {
        if (i < n && p[i] != '/')
            continue;
        if (p[i - 1] == '/') /* "a//b": the same component again */
            continue;
        char c = p[i];
        p[i] = 0;
        struct stat st;
        if (lstat(p, &st) == 0)
            rc = parent_is_dir(p, &st, path);
        else if (errno != ENOENT)
            rc = zr_err_sys(errno, "%s", p);
        else if (!(rc = zck__mkdir(p))) {
            char *slash = strrchr(p, '/');
            if (slash)
                *slash = 0;
            rc = zck_fsync_dir(!slash ? "." : slash == p ? "/" : p);
            if (slash)
                *slash = '/';
            if (!rc && made && !*made && !(*made = strdup(p)))
                rc = zr_err_set(ZR_ENOMEM, "out of memory");
        }
        p[i] = c;
    }
    free(p);
    return rc;
}

void zck_unmake_parents(const char *made, const char *path)
{
    if (!made)
        return;
    char *p = strdup(path);
    size_t m = strlen(made);
    while (p) {
        size_t n = strlen(p);
        while (n > 1 && p[n - 1] == '/')
            p[--n] = 0;
        char *slash = strrchr(p, '/');
        if (!slash)
            break;
        *slash = 0; /* p: the next directory up */
        if (strlen(p) < m || strncmp(p, made, m) || (p[m] && p[m] != '/') || rmdir(p) < 0)
            break;
    }
    free(p);
}

bool zck__is_damage(int rc)
{
    return rc == ZR_ECORRUPT || rc == ZR_EVERSION || rc == ZR_ENOTFOUND;
}

bool zck__vanished(const char *dir)
{
    struct stat st;
    return lstat(dir, &st) < 0 && (errno == ENOENT || errno == ENOTDIR);
}

int zck__vanished_err(const char *dir)
{
    return zr_err_set(ZR_ENOTFOUND, "%s: the checkpoint directory vanished while it was being "
                      "read (removed meanwhile, probably pruned by the retention of a job "
                      "saving into its run directory): this says nothing about damage", dir);
}
