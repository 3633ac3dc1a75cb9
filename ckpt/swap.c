/*
 * swap.c: swap files for offload (zck.h, "swap files"): random-access reads and writes between
 * a preallocated scratch file and the caller's aligned buffers, through libaio, O_DIRECT where
 * the filesystem allows it (else buffered, with io.c's one-line warning), several requests in
 * flight. The same fault hook as every other storage operation of the library.
 */
#include "zck_int.h"

#include <errno.h>
#include <fcntl.h>
#include <libaio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    struct iocb cb;
    uint64_t id;  /* 0: free */
    int write;
} req;

struct zck_swap {
    int fd, direct;
    char *path;
    uint64_t size;
    dev_t dev;
    ino_t ino;
    io_context_t ctx;
    unsigned depth;
    size_t block;
    req *r;
    unsigned inflight;
    uint64_t next_id;
    int err;           /* sticky: the first failed transfer */
    char errmsg[512];
};

static int set_sticky(zck_swap *s, int rc)
{
    if (!s->err) {
        s->err = rc;
        snprintf(s->errmsg, sizeof s->errmsg, "%s", zr_err_msg());
    }
    return rc;
}

static int sticky(zck_swap *s)
{
    return zr_err_set(s->err, "%s", s->errmsg);
}

int zck_swap_open(zck_swap **out, const char *path, uint64_t bytes, unsigned depth,
                  size_t block)
{
    *out = NULL;
    if (bytes % ZCK_FILE_ALIGN || !bytes)
        return zr_err_set(ZR_EINVAL, "%s: swap size %llu is not a positive multiple of %u", path,
                          (unsigned long long)bytes, ZCK_FILE_ALIGN);
    if (depth < 1 || depth > 1024)
        return zr_err_set(ZR_EINVAL, "%s: queue depth %u: expected 1..1024", path, depth);
    if (block < ZCK_FILE_ALIGN || block % ZCK_FILE_ALIGN || block > ((size_t)1 << 30))
        return zr_err_set(ZR_EINVAL, "%s: block size %zu: expected a multiple of %u up to 1 GiB",
                          path, block, ZCK_FILE_ALIGN);
    zck_swap *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path)) || !(s->r = calloc(depth, sizeof *s->r))) {
        if (s)
            free(s->path);
        free(s);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    s->fd = -1;
    s->size = bytes;
    s->depth = depth;
    s->block = block;
    int rc = 0, e;
    /* a fresh file: whatever was at the path (a stale swap file) is replaced, never reused */
    if ((e = zck__fault(ZCK_OP_UNLINK, path)) || (unlink(path) < 0 && errno != ENOENT)) {
        rc = zr_err_sys(e ? e : errno, "%s: removing the old swap file", path);
        goto fail;
    }
    if ((e = zck__fault(ZCK_OP_OPEN, path))) {
        rc = zr_err_sys(e, "%s: create", path);
        goto fail;
    }
    int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    int de = zck__fault(ZCK_OP_OPEN_DIRECT, path);
    s->fd = de ? -1 : open(path, flags | O_DIRECT, 0600);
    if (de)
        errno = de;
    if (s->fd >= 0)
        s->direct = 1;
    else if (errno == EINVAL)
        zck__warn_buffered(path);
    else {
        rc = zr_err_sys(errno, "%s: create", path);
        goto fail;
    }
    if (s->fd < 0 && (s->fd = open(path, flags, 0600)) < 0) {
        rc = zr_err_sys(errno, "%s: create", path);
        goto fail;
    }
    /* all of it now: a full filesystem is found here, not half-way through training */
    if ((e = zck__fault(ZCK_OP_WRITE, path)) ||
        ((e = posix_fallocate(s->fd, 0, (off_t)bytes)) && e != EOPNOTSUPP && e != EINVAL)) {
        rc = zr_err_sys(e, "%s: allocating %llu bytes for swap", path,
                        (unsigned long long)bytes);
        goto fail_unlink;
    }
    if (e && ftruncate(s->fd, (off_t)bytes) < 0) {
        rc = zr_err_sys(errno, "%s: sizing to %llu bytes", path, (unsigned long long)bytes);
        goto fail_unlink;
    }
    struct stat st;
    if (fstat(s->fd, &st) < 0) {
        rc = zr_err_sys(errno, "%s: stat", path);
        goto fail_unlink;
    }
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    int aerr = io_setup((int)depth, &s->ctx);
    if (aerr < 0) {
        rc = zr_err_sys(-aerr, "%s: io_setup(%u) (see /proc/sys/fs/aio-max-nr)", path, depth);
        goto fail_unlink;
    }
    *out = s;
    return 0;
fail_unlink:
    unlink(path);
fail:
    if (s->fd >= 0)
        close(s->fd);
    free(s->r);
    free(s->path);
    free(s);
    return rc;
}

int zck_swap_direct(const zck_swap *s) { return s->direct; }
uint64_t zck_swap_size(const zck_swap *s) { return s->size; }
const char *zck_swap_path(const zck_swap *s) { return s->path; }

/* Reap at least min completions. */
static int reap(zck_swap *s, long min)
{
    struct io_event ev[64];
    int n = zck__aio_getevents(s->ctx, min, 64, ev, s->path);
    if (n < 0)
        return set_sticky(s, n);
    for (int i = 0; i < n; i++) {
        req *q = ev[i].data;
        long res = (long)ev[i].res;
        size_t want = q->cb.u.c.nbytes;
        const char *what = q->write ? "write" : "read";
        long long off = (long long)q->cb.u.c.offset;
        if (res < 0)
            set_sticky(s, zr_err_sys((int)-res, "%s: swap %s at offset %lld", s->path, what,
                                     off));
        else if ((size_t)res != want)
            set_sticky(s, zr_err_set(ZR_EIO, "%s: short swap %s at offset %lld (%ld of %zu "
                                     "bytes): the swap file was truncated or the disk is full",
                                     s->path, what, off, res, want));
        q->id = 0;
        s->inflight--;
    }
    return s->err ? sticky(s) : 0;
}

static int submit_one(zck_swap *s, int write, void *buf, size_t len, uint64_t off)
{
    while (s->inflight == s->depth)
        ZR_TRY(reap(s, 1));
    req *q = NULL;
    for (unsigned i = 0; i < s->depth && !q; i++)
        if (!s->r[i].id)
            q = &s->r[i];
    int e = zck__fault(write ? ZCK_OP_WRITE : ZCK_OP_READ, s->path);
    if (e)
        return set_sticky(s, zr_err_sys(e, "%s: swap %s at offset %llu", s->path,
                                        write ? "write" : "read", (unsigned long long)off));
    for (;;) {
        int n = zck__aio_submit(s->ctx, &q->cb, s->fd, write, buf, len, off, q);
        if (n == 1)
            break;
        if (n == -EAGAIN && s->inflight) {
            ZR_TRY(reap(s, 1));
            continue;
        }
        /* O_DIRECT refused after all: buffered from now on */
        if (n == -EINVAL && s->direct && zck__aio_to_buffered(s->fd, s->path)) {
            s->direct = 0;
            continue;
        }
        return set_sticky(s, zr_err_sys(n < 0 ? -n : EIO, "%s: io_submit", s->path));
    }
    q->id = ++s->next_id;
    q->write = write;
    s->inflight++;
    return 0;
}

static int transfer(zck_swap *s, int write, void *buf, size_t len, uint64_t off,
                    uint64_t *ticket)
{
    if (s->err)
        return sticky(s);
    if ((uintptr_t)buf % ZCK_FILE_ALIGN || len % ZCK_FILE_ALIGN || off % ZCK_FILE_ALIGN ||
        off + len > s->size)
        return zr_err_set(ZR_EINVAL, "%s: swap %s of %zu bytes at offset %llu: not aligned to "
                          "%u or past the end (%llu bytes)", s->path, write ? "write" : "read",
                          len, (unsigned long long)off, ZCK_FILE_ALIGN,
                          (unsigned long long)s->size);
    for (size_t done = 0; done < len;) {
        size_t n = len - done < s->block ? len - done : s->block;
        ZR_TRY(submit_one(s, write, (unsigned char *)buf + done, n, off + done));
        done += n;
    }
    if (ticket)
        *ticket = s->next_id;
    return 0;
}

int zck_swap_read(zck_swap *s, void *buf, size_t len, uint64_t off, uint64_t *ticket)
{
    return transfer(s, 0, buf, len, off, ticket);
}

int zck_swap_write(zck_swap *s, const void *buf, size_t len, uint64_t off, uint64_t *ticket)
{
    return transfer(s, 1, (void *)buf, len, off, ticket);
}

int zck_swap_wait(zck_swap *s, uint64_t ticket)
{
    for (;;) {
        int pending = 0;
        for (unsigned i = 0; i < s->depth && !pending; i++)
            pending = s->r[i].id && s->r[i].id <= ticket;
        if (!pending)
            return s->err ? sticky(s) : 0;
        ZR_TRY(reap(s, 1));
    }
}

int zck_swap_check(zck_swap *s)
{
    if (s->err)
        return sticky(s);
    struct stat st, fst;
    if (stat(s->path, &st) < 0 || st.st_dev != s->dev || st.st_ino != s->ino)
        return set_sticky(s, zr_err_set(ZR_EIO, "%s: the swap file vanished (removed or "
                                        "replaced while training)", s->path));
    if (fstat(s->fd, &fst) < 0)
        return set_sticky(s, zr_err_sys(errno, "%s: stat", s->path));
    if ((uint64_t)fst.st_size < s->size)
        return set_sticky(s, zr_err_set(ZR_EIO, "%s: the swap file was truncated (%llu of "
                                        "%llu bytes)", s->path,
                                        (unsigned long long)fst.st_size,
                                        (unsigned long long)s->size));
    return 0;
}

int zck_swap_close(zck_swap *s, int remove)
{
    if (!s)
        return 0;
    int rc = 0;
    while (s->inflight) {
        struct io_event ev[64];
        int n = io_getevents(s->ctx, 1, 64, ev, NULL);
        if (n < 0 && n != -EINTR)
            break;
        if (n > 0)
            s->inflight -= (unsigned)n;
    }
    io_destroy(s->ctx);
    if (close(s->fd) < 0)
        rc = zr_err_sys(errno, "%s: close", s->path);
    if (remove && unlink(s->path) < 0 && errno != ENOENT && !rc)
        rc = zr_err_sys(errno, "%s: remove", s->path);
    free(s->r);
    free(s->path);
    free(s);
    return rc;
}
