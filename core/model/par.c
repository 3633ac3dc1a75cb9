/*
 * par.c: the persistent thread pool behind par_for (par.h).
 *
 * One caller at a time owns the pool (the busy flag; anyone else runs the chunks itself). The
 * owner publishes a job (fn, ctx, n, nt), sets pending to the number of started workers and
 * bumps the generation counter under the mutex, broadcasting to parked workers. Every started
 * worker answers every job: worker w < nt runs chunk w, the others only acknowledge; each
 * decrements pending, and the last one signals the owner. The owner runs chunk 0 (and any
 * chunk without a worker) and waits for pending to reach 0, so a job's fields are never
 * rewritten while a worker may still read them, and no worker can miss a generation. Both
 * sides spin briefly (PAR_SPIN pauses) before sleeping on their condition variable:
 * back-to-back regions pay no wake-up, and idle workers are soon asleep. A job with fn NULL
 * tells workers w >= nt to exit (the pool shrinking after par_set_threads lowered the setting).
 */
#include "par.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#define PAR_SPIN 500 /* pause instructions before parking: about 10 to 30 microseconds */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, done; /* workers wait on wake, the owner on done */
    _Atomic int threads;       /* the setting */
    _Atomic int busy;          /* 1 while a caller owns the pool */
    _Atomic uint64_t gen;      /* bumped once per job */
    _Atomic int pending;       /* workers yet to answer the current job */
    /* owned by the pool's owner (busy) */
    int workers; /* started: worker w = 1 .. workers */
    pthread_t tid[PAR_MAX_THREADS];
    uint64_t born[PAR_MAX_THREADS]; /* generation when worker w started */
    /* the current job: written by the owner before gen is bumped */
    par_fn fn;
    void *ctx;
    size_t n;
    int nt;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .wake = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER,
       .threads = 1};

static pthread_once_t par_once = PTHREAD_ONCE_INIT;

/* where chunk i of nt over [0, n) starts: floor(n i / nt), without overflowing n i */
static size_t chunk_at(size_t n, int i, int nt)
{
    size_t q = n / (size_t)nt, r = n % (size_t)nt;
    return q * (size_t)i + r * (size_t)i / (size_t)nt;
}

/* A fork()ed child has only the forking thread: forget the workers (their state died with the
 * parent's copy of them) and start afresh when needed. */
static void par_atfork_child(void)
{
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.wake, NULL);
    pthread_cond_init(&P.done, NULL);
    P.workers = 0;
    atomic_store(&P.pending, 0);
    atomic_store(&P.busy, 0);
}

static void par_init(void) { pthread_atfork(NULL, NULL, par_atfork_child); }

static void *worker(void *arg)
{
    int w = (int)(intptr_t)arg;
    uint64_t seen = P.born[w];
    for (;;) {
        uint64_t g;
        for (int i = 0; (g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen &&
                        i < PAR_SPIN; i++)
            cpu_relax();
        if (g == seen) {
            pthread_mutex_lock(&P.mu);
            while ((g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen)
                pthread_cond_wait(&P.wake, &P.mu);
            pthread_mutex_unlock(&P.mu);
        }
        seen = g;
        par_fn fn = P.fn;
        int nt = P.nt;
        if (fn && w < nt)
            fn(P.ctx, chunk_at(P.n, w, nt), chunk_at(P.n, w + 1, nt));
        int quit = !fn && w >= nt; /* read before answering: then the owner may move on */
        if (atomic_fetch_sub_explicit(&P.pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&P.mu);
            pthread_cond_signal(&P.done);
            pthread_mutex_unlock(&P.mu);
        }
        if (quit)
            return NULL;
    }
}

/* Owner: publish a job to every started worker and bump the generation. */
static void post(par_fn fn, void *ctx, size_t n, int nt)
{
    P.fn = fn;
    P.ctx = ctx;
    P.n = n;
    P.nt = nt;
    atomic_store_explicit(&P.pending, P.workers, memory_order_relaxed);
    pthread_mutex_lock(&P.mu);
    atomic_fetch_add_explicit(&P.gen, 1, memory_order_release);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
}

/* Owner: wait until every worker answered the current job. */
static void wait_done(void)
{
    for (int i = 0; atomic_load_explicit(&P.pending, memory_order_acquire) && i < PAR_SPIN; i++)
        cpu_relax();
    if (atomic_load_explicit(&P.pending, memory_order_acquire)) {
        pthread_mutex_lock(&P.mu);
        while (atomic_load_explicit(&P.pending, memory_order_acquire))
            pthread_cond_wait(&P.done, &P.mu);
        pthread_mutex_unlock(&P.mu);
    }
}

/* Owner: make the started workers exactly want - 1 (or fewer when pthread_create fails). */
static void resize(int want)
{
    if (P.workers > want - 1) {
        int keep = want - 1;
        post(NULL, NULL, 0, want); /* workers w >= want exit */
        wait_done();
        for (int w = keep + 1; w <= P.workers; w++)
            pthread_join(P.tid[w], NULL);
        P.workers = keep;
        return;
    }
    /* new workers block every signal (they inherit the creator's mask) */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (P.workers < want - 1) {
        int w = P.workers + 1;
        P.born[w] = atomic_load(&P.gen);
        if (pthread_create(&P.tid[w], NULL, worker, (void *)(intptr_t)w))
            break; /* fewer threads: the caller runs the other chunks (par_for) */
        P.workers = w;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void par_set_threads(int n)
{
    if (n < 1)
        return;
    atomic_store(&P.threads, n > PAR_MAX_THREADS ? PAR_MAX_THREADS : n);
}

int par_threads(void) { return atomic_load(&P.threads); }

/* chunks [first, nt) of the job, one after the other on the calling thread */
static void run_chunks(par_fn fn, void *ctx, size_t n, int nt, int first)
{
    for (int i = first; i < nt; i++)
        fn(ctx, chunk_at(n, i, nt), chunk_at(n, i + 1, nt));
}

void par_for(size_t n, size_t grain, par_fn fn, void *ctx)
{
    if (n == 0)
        return;
    size_t most = grain > 1 ? n / grain : n; /* chunks of at least grain items */
    int nt = atomic_load(&P.threads);
    if ((size_t)nt > most)
        nt = most > 1 ? (int)most : 1;
    if (nt <= 1) {
        fn(ctx, 0, n);
        return;
    }
    if (atomic_exchange_explicit(&P.busy, 1, memory_order_acquire)) {
        run_chunks(fn, ctx, n, nt, 0); /* the pool is taken: the same chunks, here */
        return;
    }
    pthread_once(&par_once, par_init);
    int want = atomic_load(&P.threads);
    if (P.workers != want - 1)
        resize(want);
    if (P.workers == 0) {
        run_chunks(fn, ctx, n, nt, 0);
    } else {
        post(fn, ctx, n, nt);
        fn(ctx, 0, chunk_at(n, 1, nt));
        run_chunks(fn, ctx, n, nt, P.workers + 1); /* chunks no worker exists for */
        wait_done();
    }
    atomic_store_explicit(&P.busy, 0, memory_order_release);
}
