/*
 * reshard.c: rewrite a checkpoint for another world size. The source is verified (every shard
 * hashed) on a thread of its own while each new rank's shard is written in layout order, one
 * extent per (group, state), read from the source's logical ranges chunk by chunk; nothing is
 * committed unless the verification passes, and its error wins over the writers' (a corrupt
 * source is named as such). Threads write different new ranks; each owns one data buffer for
 * the whole run, so memory is bounded by the buffer size whatever the checkpoint size. The
 * result is committed like any save.
 */
#include "zck_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    zck_reader *r;
    const zck_layout *L;
    const char *staging;
    uint32_t world;
    size_t chunk_bytes;     /* per thread */
    zck_io_opts io;         /* source reads */
    zck_io_opts wio;        /* the new shards' writes */
    zck_shard **shards;
    atomic_uint next_rank;
    atomic_ullong done_bytes;
    atomic_uint running;
    zck__first_error err;
} job;

static int write_rank(job *j, uint32_t rank, unsigned char *buf)
{
    zck_writer *w = NULL;
    int rc = 0;
    ZR_TRY_GOTO(zck_writer_open(&w, j->staging, j->L, j->world, rank, &j->wio), rc, out);
    for (size_t g = 0; g < zck_layout_n_groups(j->L); g++)
        for (size_t s = 0; s < zck_layout_n_states(j->L); s++) {
            uint64_t a, n;
            zck_partition(zck_layout_group_numel(j->L, g), j->world, rank,
                          zck_layout_partition_align(j->L), &a, &n);
            if (!n)
                continue;
            size_t dsz = zck_dtype_size(zck_layout_state_dtype(j->L, s));
            uint64_t per = j->chunk_bytes / dsz;
            ZR_TRY_GOTO(zck_writer_begin(w, g, s, a, n), rc, out);
            for (uint64_t off = 0; off < n; off += per) {
                if (atomic_load(&j->err.failed)) {
                    rc = ZR_ERROR; /* another thread failed: its message wins */
                    goto out;
                }
                uint64_t k = n - off < per ? n - off : per;
                zck_read_req q = {g, s, a + off, k, buf};
                zck_read_opts ro = ZCK_READ_OPTS_INIT;
                ro.verify = 0;
                ro.jobs = 1;
                ro.io = j->io;
                ZR_TRY_GOTO(zck_reader_read(j->r, &q, 1, &ro), rc, out);
                ZR_TRY_GOTO(zck_writer_write(w, buf, k * dsz), rc, out);
                atomic_fetch_add(&j->done_bytes, k * dsz);
            }
        }
    ZR_TRY_GOTO(zck_writer_finish(w, &j->shards[rank]), rc, out);
out:
    zck_writer_free(w);
    return rc;
}

static void *worker(void *arg)
{
    job *j = arg;
    /* one buffer per thread for the whole run, huge-page advised (first touch of 4 KiB pages
     * costs ~3 s per GiB here) */
    size_t align = (size_t)2 << 20;
    size_t bytes = (j->chunk_bytes + align - 1) / align * align;
    unsigned char *buf = NULL;
    if (posix_memalign((void **)&buf, align, bytes)) {
        zck__first_error_record(&j->err, zr_err_set(ZR_ENOMEM, "out of memory for a %zu-byte "
                                                    "reshard buffer", bytes));
        atomic_fetch_sub(&j->running, 1);
        return NULL;
    }
    madvise(buf, bytes, MADV_HUGEPAGE);
    for (;;) {
        unsigned r = atomic_fetch_add(&j->next_rank, 1);
        if (r >= j->world || atomic_load(&j->err.failed))
            break;
        int rc = write_rank(j, r, buf);
        if (rc && rc != ZR_ERROR) {
            zck__first_error_record(&j->err, rc);
            break;
        }
        if (rc)
            break;
    }
    free(buf);
    atomic_fetch_sub(&j->running, 1);
    return NULL;
}

/* The source's verification, on its own thread. */
typedef struct {
    pthread_t th;
    int running;
    const char *path;
    zck__first_error *stop; /* the writers' error slot: a failure stops them early */
    int rc;
    char msg[1024];
} src_check;

static void *check_main(void *arg)
{
    src_check *c = arg;
    /* one hash thread: the writers have the other cores; buffered, so that the source read
     * once from the disk serves both */
    c->rc = zck__verify_or_fail(c->path, 1, NULL);
    if (c->rc) {
        snprintf(c->msg, sizeof c->msg, "%s", zr_err_msg());
        zck__first_error_record(c->stop, c->rc);
    }
    return NULL;
}

/* Wait for the verification: its failure replaces rc (and the message), else rc stays. */
static int check_settle(src_check *c, int rc)
{
    if (!c->running)
        return rc;
    pthread_join(c->th, NULL);
    c->running = 0;
    return c->rc ? zr_err_set(c->rc, "%s", c->msg) : rc;
}

int zck_reshard(char **out, const char *src, const char *out_run_dir, uint32_t world,
                const zck_reshard_opts *opts)
{
    zck_reshard_opts def = ZCK_RESHARD_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (world < 1 || world > ZCK_MAX_WORLD)
        return zr_err_set(ZR_EINVAL, "world size %u: expected 1..%u", world, ZCK_MAX_WORLD);
    unsigned jobs = opts->jobs ? opts->jobs : 1;
    if (jobs > world)
        jobs = world;
    size_t buf = opts->buf_bytes ? opts->buf_bytes : def.buf_bytes;
    if (buf < (size_t)jobs << 20)
        return zr_err_set(ZR_EINVAL, "reshard buffer of %zu bytes: at least 1 MiB per job "
                          "(%u jobs)", buf, jobs);
    zck_reader *r = NULL;
    ZR_TRY(zck_reader_open(&r, src));
    zck_lock *lk = NULL;
    char *staging = NULL;
    job j;
    memset(&j, 0, sizeof j);
    zck__first_error_init(&j.err);
    int rc = 0;
    src_check chk = {.path = zck_reader_path(r), .stop = &j.err};
    ZR_TRY_GOTO(zck_run_lock(&lk, out_run_dir, "reshard"), rc, out);
    if (opts->verify_source) {
        /* the directory the reader resolved: a `latest` that moves in between cannot make us
         * verify one checkpoint and reshard another */
        if (!pthread_create(&chk.th, NULL, check_main, &chk))
            chk.running = 1;
        else /* no thread: verify first, as one pass */
            ZR_TRY_GOTO(zck__verify_or_fail(chk.path, jobs, &opts->progress), rc, out);
    }

    uint64_t nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&j;
    ZR_TRY_GOTO(zck_staging_create(&staging, out_run_dir, zck_reader_step(r), nonce), rc, out);
    j.r = r;
    j.L = zck_reader_layout(r);
    j.staging = staging;
    j.world = world;
    j.chunk_bytes = buf / jobs / ZCK_FILE_ALIGN * ZCK_FILE_ALIGN;
    /* I/O rings: small next to the data buffer, but deep enough to keep the disk busy */
    zck_io_opts io = ZCK_IO_OPTS_INIT;
    io.buf_bytes = (size_t)1 << 20;
    io.queue_depth = 4;
    io.io = ZCK_IO_BUFFERED; /* source reads share the page cache with the verification */
    j.io = io;
    /* the new shards as a save writes them: O_DIRECT where the filesystem allows it, 4 MiB
     * buffers, 4 in flight (no page-cache copy, and the fsync at finish has little left) */
    j.wio = (zck_io_opts)ZCK_IO_OPTS_INIT;
    if (!(j.shards = calloc(world, sizeof *j.shards))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    uint64_t total = 0;
    for (size_t g = 0; g < zck_layout_n_groups(j.L); g++)
        for (size_t s = 0; s < zck_layout_n_states(j.L); s++)
            total += zck_layout_group_numel(j.L, g) *
                     zck_dtype_size(zck_layout_state_dtype(j.L, s));
    atomic_store(&j.running, jobs);
    pthread_t th[64];
    unsigned started = 0;
    if (jobs > 64)
        jobs = 64;
    for (; started < jobs; started++)
        if (pthread_create(&th[started], NULL, worker, &j)) {
            atomic_fetch_sub(&j.running, jobs - started);
            break;
        }
    if (!started) {
        rc = zr_err_set(ZR_ERROR, "could not start a thread");
        goto out;
    }
    while (atomic_load(&j.running)) { /* the calling thread reports progress */
        if (opts->progress.fn)
            opts->progress.fn(opts->progress.ctx, "reshard", atomic_load(&j.done_bytes), total);
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (unsigned t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    ZR_TRY_GOTO(check_settle(&chk, zck__first_error_result(&j.err)), rc, out);
    if (opts->progress.fn)
        opts->progress.fn(opts->progress.ctx, "reshard", total, total);
    zck_commit_opts co = ZCK_COMMIT_OPTS_INIT;
    co.step = zck_reader_step(r);
    co.world = world;
    co.zero_stage = zck_reader_zero_stage(r);
    co.model_json = zck_reader_model_json(r);
    co.training_json = zck_reader_training_json(r);
    rc = zck__files_carry(&co, r); /* the run's tokenizer.json and other extra files */
    if (rc == 0)
        rc = zck_commit(out, out_run_dir, staging, j.L, j.shards, world, &co);
    zck__files_carry_free(&co);
out:
    rc = check_settle(&chk, rc);
    if (rc)
        zck_staging_remove(staging);
    if (j.shards)
        for (uint32_t k = 0; k < world; k++)
            zck_shard_free(j.shards[k]);
    free(j.shards);
    zck__first_error_destroy(&j.err);
    free(staging);
    zck_reader_free(r);
    zck_run_unlock(lk);
    return rc;
}
