/*
 * par.h: core-internal parallel-for over a persistent pthread pool (not part of zr.h).
 *
 * par_for(n, grain, fn, ctx) splits [0, n) into nt contiguous chunks, chunk i = [n i / nt,
 * n (i+1) / nt), and runs fn(ctx, begin, end) on each: chunk 0 on the calling thread, chunk i
 * on worker i. nt is the thread setting (par_set_threads), lowered so that each chunk holds at
 * least `grain` items (nt 1: fn(ctx, 0, n) inline, waking nobody). It returns when every chunk
 * is done. The split depends on (n, grain, the thread setting) only: when the pool cannot
 * serve a call (a nested call from inside fn, another thread holding it, a worker that could
 * not be started) the calling thread runs the same chunks itself, one after the other. So a
 * kernel whose chunks write disjoint outputs gives the same bits for a given thread setting,
 * and one that computes each output element in a fixed order inside one chunk gives the same
 * bits whatever the setting.
 *
 * The pool starts lazily on the first call that needs it; workers park on a condition variable
 * between calls (after a short spin, some microseconds), so idle workers take no CPU from
 * anything else. Workers block every signal. After fork() the child starts a new pool when it
 * needs one.
 */
#ifndef ZR_PAR_H
#define ZR_PAR_H

#include <stddef.h>

typedef void (*par_fn)(void *ctx, size_t begin, size_t end);

/* Threads par_for uses, the caller included (n < 1 is ignored; at most PAR_MAX_THREADS). */
void par_set_threads(int n);
int par_threads(void);
void par_for(size_t n, size_t grain, par_fn fn, void *ctx);

#define PAR_MAX_THREADS 256

#endif
