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
    atomic_int stop;
    int (*fn)(void *, size_t);
    void *ctx;
    pthread_mutex_t mu;
    int rc;
    char msg[1024];
};

static void *worker(void *arg)
{
    struct par *p = arg;
    for (;;) {
        if (atomic_load(&p->stop))
            break;
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n)
            break;
        int rc = p->fn(p->ctx, i);
        if (rc < 0) {
            pthread_mutex_lock(&p->mu);
            if (!p->rc) {
                p->rc = rc;
                snprintf(p->msg, sizeof p->msg, "%s", zr_err_msg());
            }
            pthread_mutex_unlock(&p->mu);
            atomic_store(&p->stop, 1);
        }
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
    atomic_init(&p.stop, 0);
    pthread_mutex_init(&p.mu, NULL);
    pthread_t *th = calloc(jobs, sizeof *th);
    if (!th)
        return zr_err_set(ZR_ENOMEM, "out of memory starting %u threads", jobs);
    unsigned started = 0;
    for (; started < jobs - 1; started++)
        if (pthread_create(&th[started], NULL, worker, &p))
            break;
    worker(&p); /* the calling thread works too */
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    pthread_mutex_destroy(&p.mu);
    if (p.rc)
        return zr_err_set(p.rc, "%s", p.msg);
    return 0;
}
