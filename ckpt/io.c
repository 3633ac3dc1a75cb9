/*
 * io.c: the libaio I/O engine. One open file, a ring of aligned staging buffers (huge-page
 * backed, recycled across opens) and up to queue_depth requests in flight. Files are opened
 * O_DIRECT where the filesystem allows it; where it refuses (tmpfs), the engine falls back to
 * buffered I/O through the same path and warns once. libaio's convention (return -errno, errno
 * untouched) stays inside this file.
 */
#include "zck_int.h"

#include <errno.h>
#include <fcntl.h>
#include <libaio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct zck__io {
    int fd;
    int direct;
    int writing;
    char *path;
    io_context_t ctx;
    size_t nbuf, bsz;
    unsigned char *mem;  /* nbuf * bsz bytes, 2 MiB aligned */
    struct iocb *cbs;
    int *busy;
    long *res;           /* completion result per buffer (read side) */
    size_t inflight;
    size_t cur;
    uint64_t alloc_end;  /* write side: the file is allocated (and sized) up to here */
    int no_prealloc;     /* the filesystem cannot fallocate */
};

/* ---- a small pool of (io context, staging arena) pairs. Opening many files must not pay for
 * io_setup/io_destroy each time (io_destroy waits for an RCU grace period, tens of ms) nor fault
 * in fresh pages (first touch of a 4 KiB page costs ~12 us here). */
#define POOL_SLOTS 16
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    io_context_t ctx;
    void *mem;
    size_t nbuf, bsz;
} pool[POOL_SLOTS];

/* io contexts do not survive fork(): a child drops what it inherited (the memory is its own
 * copy, the contexts belong to the parent) */
static void pool_prepare(void) { pthread_mutex_lock(&pool_mu); }
static void pool_parent(void) { pthread_mutex_unlock(&pool_mu); }
static void pool_child(void)
{
    for (int i = 0; i < POOL_SLOTS; i++) {
        free(pool[i].mem);
        pool[i].mem = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
}
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static void pool_init(void) { pthread_atfork(pool_prepare, pool_parent, pool_child); }

static int ring_get(zck__io *io)
{
    pthread_once(&pool_once, pool_init);
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < POOL_SLOTS; i++)
        if (pool[i].mem && pool[i].nbuf == io->nbuf && pool[i].bsz == io->bsz) {
            io->ctx = pool[i].ctx;
            io->mem = pool[i].mem;
            pool[i].mem = NULL;
            pthread_mutex_unlock(&pool_mu);
            return 0;
        }
    pthread_mutex_unlock(&pool_mu);
    size_t bytes = io->nbuf * io->bsz;
    size_t align = bytes >= (2u << 20) ? (2u << 20) : ZCK_FILE_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes))
        return zr_err_set(ZR_ENOMEM, "%s: out of memory for %zu I/O buffers of %zu bytes",
                          io->path, io->nbuf, io->bsz);
    if (align == (2u << 20))
        madvise(p, bytes, MADV_HUGEPAGE);
    io_context_t ctx = 0;
    int aerr = io_setup((int)io->nbuf, &ctx);
    if (aerr < 0) {
        free(p);
        return zr_err_sys(-aerr, "%s: io_setup(%zu) (see /proc/sys/fs/aio-max-nr)", io->path,
                          io->nbuf);
    }
    io->ctx = ctx;
    io->mem = p;
    return 0;
}

/* Give the ring back; the caller has drained every request. */
static void ring_put(zck__io *io)
{
    if (!io->mem)
        return;
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < POOL_SLOTS; i++)
        if (!pool[i].mem) {
            pool[i].ctx = io->ctx;
            pool[i].mem = io->mem;
            pool[i].nbuf = io->nbuf;
            pool[i].bsz = io->bsz;
            pthread_mutex_unlock(&pool_mu);
            return;
        }
    pthread_mutex_unlock(&pool_mu);
    io_destroy(io->ctx);
    free(io->mem);
}

void zck__warn_buffered(const char *path)
{
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        zr_log(ZR_LOG_WARN, "%s: filesystem refuses O_DIRECT, using buffered I/O", path);
}

static void free_struct(zck__io *io)
{
    free(io->path);
    free(io->cbs);
    free(io->busy);
    free(io->res);
    free(io);
}

/* The write side: O_DIRECT first when asked, buffered where the filesystem refuses it. */
static int open_write(zck__io *io, const char *path, int flags, bool direct)
{
    if (direct) {
        int de = zck__fault(ZCK_OP_OPEN_DIRECT, path);
        io->fd = de ? -1 : open(path, flags | O_DIRECT, 0644);
        if (de)
            errno = de;
        if (io->fd >= 0) {
            io->direct = 1;
            return 0;
        }
        if (errno != EINVAL)
            return zr_err_sys(errno, "%s: open", path);
        zck__warn_buffered(path);
    }
    if ((io->fd = open(path, flags, 0644)) < 0)
        return zr_err_sys(errno, "%s: open", path);
    return 0;
}

/* The read side: a regular file only (zck_open_regular), then O_DIRECT set on it when asked and
 * the filesystem allows it. */
static int open_read(zck__io *io, const char *path, bool direct)
{
    ZR_TRY(zck_open_regular(&io->fd, path, ZCK_NOFOLLOW, NULL));
    if (!direct)
        return 0;
    int de = zck__fault(ZCK_OP_OPEN_DIRECT, path), fl = fcntl(io->fd, F_GETFL);
    if (!de && fl >= 0 && fcntl(io->fd, F_SETFL, fl | O_DIRECT) == 0) {
        io->direct = 1;
        return 0;
    }
    de = de ? de : errno;
    if (de != EINVAL)
        return zr_err_sys(de, "%s: open", path);
    zck__warn_buffered(path);
    return 0;
}

int zck__io_open(zck__io **out, const char *path, int mode, const zck_io_opts *o)
{
    zck_io_opts def = ZCK_IO_OPTS_INIT;
    if (!o)
        o = &def;
    size_t bsz = o->buf_bytes ? o->buf_bytes : def.buf_bytes;
    size_t nbuf = o->queue_depth ? o->queue_depth : def.queue_depth;
    if (bsz % ZCK_FILE_ALIGN || bsz > ((size_t)1 << 30))
        return zr_err_set(ZR_EINVAL, "I/O buffer size %zu: expected a multiple of %u up to 1 GiB",
                          bsz, ZCK_FILE_ALIGN);
    if (nbuf > 256)
        return zr_err_set(ZR_EINVAL, "I/O queue depth %zu: expected 1..256", nbuf);

    zck__io *io = calloc(1, sizeof *io);
    if (!io)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    io->fd = -1;
    io->writing = mode == ZCK__IO_WRITE;
    io->nbuf = nbuf;
    io->bsz = bsz;
    int rc = 0;
    if (!(io->path = strdup(path)) || !(io->cbs = calloc(nbuf, sizeof *io->cbs)) ||
        !(io->busy = calloc(nbuf, sizeof *io->busy)) ||
        !(io->res = calloc(nbuf, sizeof *io->res))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto fail;
    }
    int flags = O_CLOEXEC | (io->writing ? O_WRONLY | O_CREAT | O_EXCL : O_RDONLY);
    int e = zck__fault(ZCK_OP_OPEN, path);
    if (e) {
        rc = zr_err_sys(e, "%s: open", path);
        goto fail;
    }
    if (io->writing)
        rc = open_write(io, path, flags, o->io == ZCK_IO_AUTO);
    else
        rc = open_read(io, path, o->io == ZCK_IO_AUTO);
    if (rc)
        goto fail;
    ZR_TRY_GOTO(ring_get(io), rc, fail);
    *out = io;
    return 0;
fail:
    if (io->fd >= 0) {
        close(io->fd);
        if (io->writing && rc != ZR_EEXIST)
            unlink(path);
    }
    free_struct(io);
    return rc;
}

int zck__io_direct(const zck__io *io) { return io->direct; }
size_t zck__io_buf_bytes(const zck__io *io) { return io->bsz; }

int zck__aio_getevents(struct io_context *ctx, long min, long max, struct io_event *ev,
                       const char *path)
{
    int n;
    do
        n = io_getevents(ctx, min, max, ev, NULL);
    while (n == -EINTR);
    return n < 0 ? zr_err_sys(-n, "%s: io_getevents", path) : n;
}

int zck__aio_submit(struct io_context *ctx, struct iocb *cb, int fd, int write, void *buf,
                    size_t len, uint64_t off, void *data)
{
    if (write)
        io_prep_pwrite(cb, fd, buf, len, (long long)off);
    else
        io_prep_pread(cb, fd, buf, len, (long long)off);
    cb->data = data;
    return io_submit(ctx, 1, &cb);
}

bool zck__aio_to_buffered(int fd, const char *path)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) != 0)
        return false;
    zck__warn_buffered(path);
    return true;
}

/* Wait for at least min completions; record each result. */
static int reap(zck__io *io, long min)
{
    struct io_event ev[64];
    int n = zck__aio_getevents(io->ctx, min, 64, ev, io->path);
    if (n < 0)
        return n;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        size_t b = (size_t)(uintptr_t)ev[i].data;
        long res = (long)ev[i].res;
        io->busy[b] = 0;
        io->res[b] = res;
        io->inflight--;
        if (io->writing && !rc) {
            size_t want = io->cbs[b].u.c.nbytes;
            if (res < 0)
                rc = zr_err_sys((int)-res, "%s: write at offset %lld", io->path,
                                (long long)io->cbs[b].u.c.offset);
            else if ((size_t)res != want)
                rc = zr_err_sys(ENOSPC, "%s: short write at offset %lld (%ld of %zu bytes)",
                                io->path, (long long)io->cbs[b].u.c.offset, res, want);
        }
    }
    return rc;
}

static int submit_to(zck__io *io, size_t b, unsigned char *buf, size_t len, uint64_t off);

static int submit(zck__io *io, size_t b, size_t len, uint64_t off)
{
    return submit_to(io, b, io->mem + b * io->bsz, len, off);
}

/* Submit slot b as a read or write of buf; retries a refused O_DIRECT once in buffered mode. */
static int submit_to(zck__io *io, size_t b, unsigned char *buf, size_t len, uint64_t off)
{
    int e = zck__fault(io->writing ? ZCK_OP_WRITE : ZCK_OP_READ, io->path);
    if (e)
        return zr_err_sys(e, "%s: %s at offset %llu", io->path, io->writing ? "write" : "read",
                          (unsigned long long)off);
    for (;;) {
        int n = zck__aio_submit(io->ctx, &io->cbs[b], io->fd, io->writing, buf, len, off,
                                (void *)(uintptr_t)b);
        if (n == 1)
            break;
        if (n == -EAGAIN && io->inflight) {
            ZR_TRY(reap(io, 1));
            continue;
        }
        if (n == -EINVAL && io->direct && zck__aio_to_buffered(io->fd, io->path)) {
            io->direct = 0;
            continue;
        }
        return zr_err_sys(n < 0 ? -n : EIO, "%s: io_submit", io->path);
    }
    io->busy[b] = 1;
    io->inflight++;
    return 0;
}

int zck__io_wbuf(zck__io *io, unsigned char **out)
{
    while (io->busy[io->cur])
        ZR_TRY(reap(io, 1));
    *out = io->mem + io->cur * io->bsz;
    return 0;
}

/* Grow the file ahead of the writes. A direct write past the end of the file is synchronous
 * on ext4 (io_submit waits for it), which would turn the queue into depth 1; writes inside an
 * allocated size are not. It also reports a full disk before the data is sent. */
static int prealloc(zck__io *io, uint64_t end)
{
    if (io->no_prealloc || end <= io->alloc_end)
        return 0;
    uint64_t step = (uint64_t)64 << 20, want = end - io->alloc_end;
    if (want < step)
        want = step;
    int ok = fallocate(io->fd, 0, (off_t)io->alloc_end, (off_t)want) == 0;
    if (!ok && (errno == ENOSPC || errno == EDQUOT) && want > end - io->alloc_end) {
        want = end - io->alloc_end; /* the step ahead does not fit: exactly what is needed */
        ok = fallocate(io->fd, 0, (off_t)io->alloc_end, (off_t)want) == 0;
    }
    if (!ok) {
        if (errno == ENOSPC || errno == EDQUOT || errno == EFBIG)
            return zr_err_sys(errno, "%s: allocating %llu bytes at offset %llu", io->path,
                              (unsigned long long)want, (unsigned long long)io->alloc_end);
        io->no_prealloc = 1; /* not supported here: plain appends then */
        return 0;
    }
    io->alloc_end += want;
    return 0;
}

int zck__io_truncate(zck__io *io, uint64_t size)
{
    if (io->alloc_end > size && ftruncate(io->fd, (off_t)size) < 0)
        return zr_err_sys(errno, "%s: truncate to %llu bytes", io->path,
                          (unsigned long long)size);
    io->alloc_end = size;
    return 0;
}

int zck__io_wsubmit(zck__io *io, size_t len, uint64_t off)
{
    ZR_TRY(prealloc(io, off + len));
    ZR_TRY(submit(io, io->cur, len, off));
    io->cur = (io->cur + 1) % io->nbuf;
    return 0;
}

int zck__io_drain(zck__io *io)
{
    int rc = 0;
    while (io->inflight) {
        int r = reap(io, 1);
        if (r && !rc)
            rc = r;
    }
    return rc;
}

int zck__io_fsync(zck__io *io)
{
    int e = zck__fault(ZCK_OP_FSYNC, io->path);
    if (e || fsync(io->fd) < 0)
        return zr_err_sys(e ? e : errno, "%s: fsync", io->path);
    return 0;
}

int zck__io_size(zck__io *io, uint64_t *out)
{
    struct stat st;
    if (fstat(io->fd, &st) < 0)
        return zr_err_sys(errno, "%s: stat", io->path);
    *out = (uint64_t)st.st_size;
    return 0;
}

/* One chunk of a span stream: where it lands and which bytes it must deliver. */
typedef struct {
    uint64_t off;
    size_t want;
    unsigned char *ptr;
} chunk;

int zck__io_read_spans(zck__io *io, const zck__span *spans, size_t n, zck__chunk_fn fn,
                       void *ctx)
{
    if (io->writing)
        return zr_err_set(ZR_EINVAL, "%s: read on a file opened for writing", io->path);
    chunk *q = calloc(io->nbuf, sizeof *q); /* q[slot]: what slot holds */
    size_t *order = calloc(io->nbuf, sizeof *order);
    if (!q || !order) {
        free(q);
        free(order);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    int rc = 0;
    size_t si = 0;            /* next span to issue from */
    uint64_t pos = n ? spans[0].a : 0;
    size_t head = 0, count = 0; /* FIFO of slots in issue order: order[head..head+count) */
    size_t nextbuf = 0;
    for (;;) {
        /* issue while slots are free and work remains */
        while (count < io->nbuf && si < n) {
            if (pos >= spans[si].b) {
                si++;
                if (si < n)
                    pos = spans[si].a;
                continue;
            }
            const zck__span *sp = &spans[si];
            uint64_t end = sp->b;
            size_t want = (size_t)(end - pos < io->bsz ? end - pos : io->bsz);
            size_t len = (want + ZCK_FILE_ALIGN - 1) / ZCK_FILE_ALIGN * ZCK_FILE_ALIGN;
            size_t b = nextbuf;
            nextbuf = (nextbuf + 1) % io->nbuf;
            q[b].off = pos;
            q[b].want = want;
            /* a span with a destination is read straight into it (its length is whole
             * blocks, see zck__span); others go through the ring */
            q[b].ptr = sp->dst ? sp->dst + (pos - sp->a) : io->mem + b * io->bsz;
            ZR_TRY_GOTO(submit_to(io, b, q[b].ptr, sp->dst ? want : len, pos), rc, out);
            order[(head + count) % io->nbuf] = b;
            count++;
            pos += want;
        }
        if (!count)
            break;
        size_t b = order[head];
        while (io->busy[b])
            ZR_TRY_GOTO(reap(io, 1), rc, out);
        long res = io->res[b];
        if (res < 0) {
            rc = zr_err_sys((int)-res, "%s: read at offset %llu", io->path,
                            (unsigned long long)q[b].off);
            goto out;
        }
        if ((size_t)res < q[b].want) {
            rc = zr_err_set(ZR_ECORRUPT, "%s: file ends early: %zu bytes wanted at offset %llu, "
                            "%ld read", io->path, q[b].want, (unsigned long long)q[b].off, res);
            goto out;
        }
        ZR_TRY_GOTO(fn(ctx, q[b].off, q[b].ptr, q[b].want), rc, out);
        head = (head + 1) % io->nbuf;
        count--;
    }
out:
    if (rc)
        zck__io_drain(io);
    free(q);
    free(order);
    return rc;
}

int zck__io_close(zck__io *io)
{
    if (!io)
        return 0;
    int rc = zck__io_drain(io);
    if (io->fd >= 0 && close(io->fd) < 0 && !rc)
        rc = zr_err_sys(errno, "%s: close", io->path);
    if (io->inflight) { /* requests we could not reap: this context cannot be reused */
        io_destroy(io->ctx);
        free(io->mem);
    } else
        ring_put(io);
    free_struct(io);
    return rc;
}
