/*
 * writer.c: the rank-local shard writer. Extents stream through the I/O engine's staging
 * buffers at ZCK_FILE_ALIGN boundaries; SHA-256 is computed over the bytes as they are copied
 * into the buffers (one pass over the data), and the file is fsynced before its description
 * (zck_shard) is handed out.
 */
#include "zck_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct zck_writer {
    zck_layout *L;
    uint32_t world, rank;
    char *path;
    zck__io *io;
    zck__sha *sha;
    unsigned char *buf;  /* current staging buffer */
    size_t bsz, fill;
    uint64_t boff;       /* file offset of buf[0] */
    zck_shard *shard;
    uint64_t left;       /* bytes still due for the current extent */
    int done, failed;
};

int zck__mkdir_p(const char *path)
{
    char *p = strdup(path);
    if (!p)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0;
    size_t n = strlen(p);
    for (size_t i = 1; i <= n && !rc; i++) {
        if (p[i] != '/' && p[i] != 0)
            continue;
        char c = p[i];
        p[i] = 0;
        struct stat st;
        if (stat(p, &st) < 0) {
            rc = zck__mkdir(p);
            char *slash = strrchr(p, '/');
            if (!rc && slash) {
                *slash = 0;
                rc = zck_fsync_dir(slash == p ? "/" : p);
                *slash = '/';
            } else if (!rc)
                rc = zck_fsync_dir(".");
        }
        p[i] = c;
    }
    free(p);
    return rc;
}

int zck_staging_create(char **out, const char *run_dir, uint64_t step, uint64_t nonce)
{
    char name[64];
    snprintf(name, sizeof name, ".tmp-step-%08llu-%016llx", (unsigned long long)step,
             (unsigned long long)nonce);
    ZR_TRY(zck__mkdir_p(run_dir));
    char *p = zck_path_join(run_dir, name);
    if (!p)
        return ZR_ENOMEM;
    int rc = zck__mkdir(p);
    if (!rc)
        rc = zck_fsync_dir(run_dir);
    if (rc) {
        free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void zck_staging_remove(const char *staging_dir)
{
    if (!staging_dir)
        return;
    int code = zr_err_code();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zr_err_msg());
    if (zck__rmtree(staging_dir) < 0)
        zr_log(ZR_LOG_WARN, "%s: could not remove the staging directory of a failed save: %s",
               staging_dir, zr_err_msg());
    if (code)
        zr_err_set(code, "%s", msg); /* the save's error, not the cleanup's */
    else
        zr_err_clear();
}

int zck_writer_open(zck_writer **out, const char *staging_dir, const zck_layout *L,
                    uint32_t world, uint32_t rank, const zck_io_opts *opts)
{
    if (world < 1 || world > ZCK_MAX_WORLD || rank >= world)
        return zr_err_set(ZR_EINVAL, "rank %u of world %u: expected 0 <= rank < world <= %u",
                          rank, world, ZCK_MAX_WORLD);
    if (!L->ng || !L->ns)
        return zr_err_set(ZR_EINVAL, "layout has %zu groups and %zu states: both must be "
                          "non-empty", L->ng, L->ns);
    zck_writer *w = calloc(1, sizeof *w);
    if (!w)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0;
    char name[64];
    snprintf(name, sizeof name, "shard-%05u-of-%05u.bin", rank, world);
    w->world = world;
    w->rank = rank;
    if (!(w->shard = calloc(1, sizeof *w->shard)) || !(w->shard->file = strdup(name))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto fail;
    }
    w->shard->rank = rank;
    ZR_TRY_GOTO(zck_layout_copy(&w->L, L), rc, fail);
    if (!(w->path = zck_path_join(staging_dir, name))) {
        rc = ZR_ENOMEM;
        goto fail;
    }
    ZR_TRY_GOTO(zck__sha_new(&w->sha), rc, fail);
    ZR_TRY_GOTO(zck__io_open(&w->io, w->path, ZCK__IO_WRITE, opts), rc, fail);
    w->bsz = zck__io_buf_bytes(w->io);
    ZR_TRY_GOTO(zck__io_wbuf(w->io, &w->buf), rc, fail);
    *out = w;
    return 0;
fail:
    if (w->io) {
        zck__io_close(w->io);
        unlink(w->path);
    }
    zck__sha_free(w->sha);
    zck_layout_free(w->L);
    zck_shard_free(w->shard);
    free(w->path);
    free(w);
    return rc;
}

int zck_writer_direct(const zck_writer *w) { return zck__io_direct(w->io); }

static int usable(zck_writer *w)
{
    if (w->done)
        return zr_err_set(ZR_EINVAL, "%s: writer already finished", w->path);
    if (w->failed)
        return zr_err_set(ZR_EINVAL, "%s: writer failed earlier", w->path);
    return 0;
}

/* The buffer is full: send it and take the next one. */
static int flush(zck_writer *w)
{
    ZR_TRY(zck__io_wsubmit(w->io, w->fill, w->boff));
    w->boff += w->fill;
    w->fill = 0;
    return zck__io_wbuf(w->io, &w->buf);
}

/* Append n bytes (data, or zeros when data is NULL), hashing them on the way. */
static int append(zck_writer *w, const unsigned char *data, size_t n)
{
    const size_t piece = 256 << 10; /* hash and copy while the bytes are in cache */
    while (n) {
        if (w->fill == w->bsz)
            ZR_TRY(flush(w));
        size_t k = w->bsz - w->fill;
        if (k > n)
            k = n;
        if (k > piece)
            k = piece;
        unsigned char *dst = w->buf + w->fill;
        if (data) {
            memcpy(dst, data, k);
            data += k;
        } else
            memset(dst, 0, k);
        zck__sha_update(w->sha, dst, k);
        w->fill += k;
        n -= k;
    }
    return 0;
}

static int pad_to_align(zck_writer *w)
{
    uint64_t pos = w->boff + w->fill;
    size_t pad = (size_t)((ZCK_FILE_ALIGN - pos % ZCK_FILE_ALIGN) % ZCK_FILE_ALIGN);
    return append(w, NULL, pad);
}

int zck_writer_begin(zck_writer *w, size_t group, size_t state, uint64_t start, uint64_t count)
{
    ZR_TRY(usable(w));
    if (w->left)
        return zr_err_set(ZR_EINVAL, "%s: new extent while the previous one still needs %llu "
                          "bytes", w->path, (unsigned long long)w->left);
    if (group >= w->L->ng || state >= w->L->ns)
        return zr_err_set(ZR_EINVAL, "%s: no %s %zu", w->path,
                          group >= w->L->ng ? "group" : "state",
                          group >= w->L->ng ? group : state);
    uint64_t numel = w->L->g[group].numel;
    if (count == 0 || start > numel || count > numel - start)
        return zr_err_set(ZR_EINVAL, "%s: extent [%llu, %llu) of group '%s' (%llu elements): "
                          "empty or out of range", w->path, (unsigned long long)start,
                          (unsigned long long)(start + count), w->L->g[group].name,
                          (unsigned long long)numel);
    int rc = pad_to_align(w);
    if (rc) {
        w->failed = 1;
        return rc;
    }
    zck__extent e = {(uint32_t)group, (uint32_t)state, start, count, w->boff + w->fill};
    ZR_TRY(zck__shard_add_extent(w->shard, &e));
    w->left = count * zck_dtype_size(w->L->s[state].dtype);
    return 0;
}

int zck_writer_write(zck_writer *w, const void *data, size_t n_bytes)
{
    ZR_TRY(usable(w));
    if (n_bytes > w->left)
        return zr_err_set(ZR_EINVAL, "%s: %zu bytes written to an extent that takes %llu more",
                          w->path, n_bytes, (unsigned long long)w->left);
    int rc = append(w, data, n_bytes);
    if (rc) {
        w->failed = 1;
        return rc;
    }
    w->left -= n_bytes;
    return 0;
}

int zck_writer_put(zck_writer *w, size_t group, size_t state, uint64_t start, uint64_t count,
                   const void *data)
{
    ZR_TRY(zck_writer_begin(w, group, state, start, count));
    return zck_writer_write(w, data, count * zck_dtype_size(w->L->s[state].dtype));
}

int zck_writer_finish(zck_writer *w, zck_shard **out)
{
    ZR_TRY(usable(w));
    if (w->left)
        return zr_err_set(ZR_EINVAL, "%s: finished with %llu bytes of the last extent missing",
                          w->path, (unsigned long long)w->left);
    int rc = 0;
    ZR_TRY_GOTO(pad_to_align(w), rc, fail);
    if (w->fill) {
        ZR_TRY_GOTO(zck__io_wsubmit(w->io, w->fill, w->boff), rc, fail);
        w->boff += w->fill;
        w->fill = 0;
    }
    ZR_TRY_GOTO(zck__io_drain(w->io), rc, fail);
    ZR_TRY_GOTO(zck__io_truncate(w->io, w->boff), rc, fail);
    ZR_TRY_GOTO(zck__io_fsync(w->io), rc, fail);
    rc = zck__io_close(w->io);
    w->io = NULL;
    if (rc)
        goto fail;
    w->shard->bytes = w->boff;
    zck__sha_hex(w->sha, w->shard->sha256);
    w->done = 1;
    *out = w->shard;
    w->shard = NULL;
    return 0;
fail:
    w->failed = 1;
    return rc;
}

void zck_writer_free(zck_writer *w)
{
    if (!w)
        return;
    if (w->io)
        zck__io_close(w->io);
    if (!w->done && w->path && unlink(w->path) < 0 && errno != ENOENT)
        zr_log(ZR_LOG_WARN, "%s: could not remove unfinished shard: %s", w->path,
               strerror(errno));
    zck__sha_free(w->sha);
    zck_layout_free(w->L);
    zck_shard_free(w->shard);
    free(w->path);
    free(w);
}
