/*
 * pool.c: a parallel-for over a few threads: workers take item indices from a shared counter.
 * Enough for hashing and reading files in parallel; the first failure wins and its message is
 * carried back to the calling thread.
 */
#include "zck_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct par {
    size_t n;
    atomic_size_t next;
    int (*fn)(void *, size_t);
    void *ctx;
    zck__first_error err;
};

void zck__first_error_init(zck__first_error *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    atomic_init(&f->failed, 0);
}

void zck__first_error_record(zck__first_error *f, int rc)
{
    pthread_mutex_lock(&f->mu);
    if (!f->rc) {
        f->rc = rc;
        snprintf(f->msg, sizeof f->msg, "%s", zr_err_msg());
    }
    pthread_mutex_unlock(&f->mu);
    atomic_store(&f->failed, 1);
}

int zck__first_error_result(const zck__first_error *f)
{
    return f->rc ? zr_err_set(f->rc, "%s", f->msg) : 0;
}

void zck__first_error_destroy(zck__first_error *f) { pthread_mutex_destroy(&f->mu); }

static void *worker(void *arg)
{
    struct par *p = arg;
    for (;;) {
        if (atomic_load(&p->err.failed))
            break;
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n)
            break;
        int rc = p->fn(p->ctx, i);
        if (rc < 0)
            zck__first_error_record(&p->err, rc);
    }
    return NULL;
}

int zck__parallel(size_t n, unsigned jobs, int (*fn)(void *ctx, size_t i), void *ctx)
{
    if (jobs < 1)
        jobs = 1;
    if (jobs > n)
        jobs = (unsigned)n;
    if (jobs <= 1) {
        for (size_t i = 0; i < n; i++)
            ZR_TRY(fn(ctx, i));
        return 0;
    }
    struct par p = {.n = n, .fn = fn, .ctx = ctx};
    atomic_init(&p.next, 0);
    zck__first_error_init(&p.err);
    pthread_t *th = calloc(jobs, sizeof *th);
    if (!th) {
        zck__first_error_destroy(&p.err);
        return zr_err_set(ZR_ENOMEM, "out of memory starting %u threads", jobs);
    }
    unsigned started = 0;
    for (; started < jobs - 1; started++)
        if (pthread_create(&th[started], NULL, worker, &p))
            break;
    worker(&p); /* the calling thread works too */
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    int rc = zck__first_error_result(&p.err);
    zck__first_error_destroy(&p.err);
    return rc;
}
