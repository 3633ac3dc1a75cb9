/*
 * comm.c: the `shm` communicator (comm.h): CPU ranks of one node meeting in one POSIX shared
 * memory segment, and the world of one.
 *
 * The segment (created by zr_comm_shm_create, opened by every rank by name):
 *
 *   header page(s)  magic, version, world, sizes, the creator (launcher) pid and start time,
 *                   the abort record, the death notice, the barrier (arrival counter,
 *                   generation word, sleepers);
 *                   then one 128-byte record per rank: its pid and start time (written at open)
 *                   and two call descriptors (one per half, below)
 *   data            world areas of seg_bytes each; rank q writes only area q. Each area is two
 *                   halves of H = seg_bytes / 2 bytes.
 *
 * Every collective streams through the segment in rounds. Round k uses half k % 2 of every area
 * (k counts rounds over the communicator's life, so it continues from one call to the next):
 * each rank copies what the others need into its own area, all ranks meet at a barrier, each
 * rank reads (and reduces) what it needs from the others' areas (its own part it reads from its
 * own buffer: nothing is staged for oneself). One barrier per round is
 * enough: a rank writes half h again in round k + 2 only after passing the barrier of round
 * k + 1, which every rank reaches only after it finished reading round k. all_reduce has a
 * second barrier inside its round (reduced pieces are published for the others to copy out),
 * which keeps the same property. No call ends with a barrier of its own.
 *
 * Reductions: element i is ((x_0 + x_1) + x_2) + ... in rank order, computed by exactly one rank
 * (the owner of the piece that holds it) and copied bit for bit to the others, so results never
 * depend on timing, chunking or which rank computed what. all_reduce splits each window into W
 * pieces like reduce_scatter (rank r reduces piece r) and copies the pieces back like all_gather;
 * since every element is summed in rank order either way, its bits are those of reduce_scatter
 * followed by all_gather. The kernels sum a block at a time into a stack buffer (which lets the
 * destination alias a source, for the in-place forms, and lets gcc vectorize without alias
 * checks: the adds are element-wise, so the order per element is kept).
 *
 * The first round of each call also publishes a descriptor (op, count, dtype or element size or
 * root); after the first barrier every rank compares them, so mismatched calls fail with
 * ZR_ECOMM on every rank instead of corrupting data or hanging.
 *
 * Barrier: arrivals fetch_add one 64-bit counter; barrier k (counted per communicator, the same
 * on every rank) is complete when it reaches k * W, and the last arrival stores k in the 32-bit
 * generation word. Waiters spin on that word for a few microseconds (not when the world has
 * more ranks than the node has CPUs), then poll it with sched_yield() between checks for up to
 * 1 ms (a peer that the scheduler put on the same CPU, as futex wake-ups tend to, runs at once
 * instead of waiting for our time slice to end), then sleep on it with FUTEX_WAIT (shared futex,
 * 50 ms timeout); the last arrival calls FUTEX_WAKE only when someone sleeps (a sleepers counter,
 * seq_cst on both sides, so no wake-up is lost). Between sleeps a waiter checks the abort record
 * (set by the launcher through zr_comm_shm_abort, which also wakes every sleeper) and, every
 * 50 ms, that each peer and the creator still live: /proc/<pid>/stat gone, a zombie, or a
 * different start time (pid reused) means dead; without /proc, kill(pid, 0) == ESRCH. The
 * first rank to find a death writes it in the segment's death notice (and wakes the sleepers),
 * so that every rank names that cause, not a rank that exited after noticing. So a dead peer
 * fails the call with ZR_EIO within about 100 ms, and there is no overall timeout:
 * a long wait for a live, slow peer is legitimate. A peer that died before it opened the
 * communicator (its pid not yet recorded) is noticed through the launcher's abort record only.
 *
 * A communicator is used by one thread at a time; it must not be carried across fork().
 */
#include "comm.h"
#include "comm_be.h"
#include "comm_tcp.h"

#include <dlfcn.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x4d53525au   /* "ZRSM" */
#define SHM_VERSION 1u
#define SHM_MAX_WORLD 1024
#define SHM_DEFAULT_SEG ((size_t)4 << 20)
#define RANK_REC 128            /* bytes per rank record in the header */
#define RANK_REC_AT 512         /* first rank record */
#define SLEEP_NS 50000000L      /* futex sleep and liveness check period: 50 ms */
#define SPIN_PAUSES 2000u       /* pause first: a few microseconds */
#define SPIN_NS 1000000L        /* then yield for up to 1 ms before sleeping */
#define RED_BLK 2048            /* elements summed per block in the stack buffer */

typedef struct {
    uint32_t op, aux;           /* op code; dtype, element size or root */
    uint64_t n;
} call_desc;

typedef struct {
    _Atomic int32_t pid;        /* 0 until the rank opens */
    int32_t pad;
    uint64_t start;             /* start time (/proc/<pid>/stat field 22), 0 if unknown */
    call_desc desc[2];          /* this rank's current call, per half */
} rank_rec;

typedef struct {
    uint32_t magic, version, world, pad0;
    uint64_t hdr_bytes, seg_bytes, total_bytes;
    int32_t creator_pid, pad1;
    uint64_t creator_start;
    /* abort record: 0, or 1 << 63 | (rank << 32) | (uint32_t)status */
    _Atomic uint64_t abort_word;
    /* death notice: the first rank that finds a peer dead writes why here (0 none, 1 being
     * written, 2 ready), so every rank names the same cause (not a rank that exited after it
     * noticed) */
    _Atomic uint32_t note_state;
    char note[300];
    /* the barrier, on its own cache line */
    _Atomic uint64_t arrived __attribute__((aligned(64)));
    _Atomic uint32_t gen;
    _Atomic uint32_t sleepers;
} shm_hdr;

_Static_assert(sizeof(shm_hdr) <= RANK_REC_AT, "header too large");
_Static_assert(sizeof(rank_rec) <= RANK_REC, "rank record too large");

struct zr_comm {
    int rank, world;
    const zr_comm_be *be;       /* tcp (comm_tcp.c) or mpi (comm_mpi.c); NULL: shm */
    void *bh;                   /* the backend's handle */
    /* shm only */
    shm_hdr *h;
    size_t map_bytes;
    char *data;
    size_t seg, half;           /* bytes per area, per half */
    uint64_t bar_seq;           /* barriers passed */
    uint64_t round;             /* rounds done (selects the half) */
    unsigned spin_pauses;       /* pause instructions before yielding */
    int dead;                   /* an error left the communicator unusable */
    int dead_code;
    char dead_msg[512];
};

enum { OP_ALL_REDUCE = 1, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_GATHER, OP_BARRIER };

static const char *op_name(uint32_t op)
{
    static const char *const names[] = {"?", "all_reduce", "reduce_scatter", "all_gather",
                                        "broadcast", "gather", "barrier"};
    return op < sizeof names / sizeof *names ? names[op] : "?";
}

/* ---------------------------------------------------------------- small helpers */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static size_t dtype_size(zr_comm_dtype dt) { return dt == ZR_COMM_F64 ? 8 : 4; }

/* "SIGKILL" for 9 and so on; "SIG?" for a number the C library does not name. */
const char *zr__signal_name(int s)
{
    static __thread char buf[16];
    const char *a = sigabbrev_np(s);
    snprintf(buf, sizeof buf, "SIG%s", a ? a : "?");
    return buf;
}

/* "exited with status 3" / "was killed by signal 9 (SIGKILL)" for a wait() status */
static void describe_status(char *buf, size_t cap, int status)
{
    if (WIFEXITED(status))
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(status),
                 zr__signal_name(WTERMSIG(status)));
    else
        snprintf(buf, cap, "failed (wait status %d)", status);
}

/*
 * Read /proc/<pid>/stat: state, start time (field 22) and, for a zombie, the exit code
 * (field 52, a wait() status; -1 when absent). 0 on success, -1 when the file cannot be read
 * (errno kept).
 */
static int proc_stat(int pid, char *state, uint64_t *start, int *exit_code)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t k;
    do
        k = read(fd, buf, sizeof buf - 1);
    while (k < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (k <= 0) {
        errno = k < 0 ? e : ENOENT;
        return -1;
    }
    buf[k] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2]) {
        errno = EINVAL;
        return -1;
    }
    *state = p[2];
    *start = 0;
    *exit_code = -1;
    /* fields after ')': token 0 is field 3 (state) */
    int tok = 0;
    for (char *s = p + 2; *s; tok++) {
        char *end;
        if (tok == 19)
            *start = strtoull(s, &end, 10);
        else if (tok == 49)
            *exit_code = (int)strtol(s, &end, 10);
        end = strchr(s, ' ');
        if (!end)
            break;
        s = end + 1;
    }
    return 0;
}

static uint64_t self_start(void)
{
    char st;
    uint64_t start = 0;
    int ec;
    if (proc_stat((int)getpid(), &st, &start, &ec) < 0)
        return 0;
    return start;
}

/* 1 when process pid (started at `start`, 0: unknown) is gone or a zombie; why in buf. */
static int process_dead(int pid, uint64_t start, char *why, size_t cap)
{
    char st;
    uint64_t s;
    int ec;
    why[0] = 0;
    if (proc_stat(pid, &st, &s, &ec) == 0) {
        if (start && s && s != start)
            return 1; /* the pid now names another process */
        if (st == 'Z' || st == 'X') {
            if (ec >= 0) {
                char d[96];
                describe_status(d, sizeof d, ec);
                snprintf(why, cap, " (%s)", d);
            }
            return 1;
        }
        return 0;
    }
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return 1;
    return 0;
}

/* ---------------------------------------------------------------- futex */

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected, long ns)
{
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ---------------------------------------------------------------- failure */

static rank_rec *rec(shm_hdr *h, int r)
{
    return (rank_rec *)((char *)h + RANK_REC_AT + (size_t)r * RANK_REC);
}

/* Record the error that ends the communicator; return its code. */
static int comm_fail(zr_comm *c, int code, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int comm_fail(zr_comm *c, int code, const char *op, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->dead = 1;
    c->dead_code = code;
    snprintf(c->dead_msg, sizeof c->dead_msg, "%s", msg);
    return zr_err_set(code, "%s: %s", op, msg);
}

/* ZR_EIO (and the communicator dead) when the launcher marked the job aborted */
static int check_abort(zr_comm *c, const char *op)
{
    uint64_t a = atomic_load_explicit(&c->h->abort_word, memory_order_acquire);
    if (!a)
        return 0;
    int rank = (int)((a >> 32) & 0x7fffffff);
    int status = (int)(uint32_t)a;
    char d[96];
    describe_status(d, sizeof d, status);
    return comm_fail(c, ZR_EIO, op, "rank %d %s (reported by the launcher)", rank, d);
}

/* publish the first death found, for the other ranks */
static void publish_note(zr_comm *c, const char *msg)
{
    uint32_t expect = 0;
    if (!atomic_compare_exchange_strong(&c->h->note_state, &expect, 1))
        return;
    snprintf(c->h->note, sizeof c->h->note, "%s (noticed by rank %d)", msg, c->rank);
    atomic_store(&c->h->note_state, 2);
    futex_wake_all(&c->h->gen);
}

static int check_note(zr_comm *c, const char *op)
{
    if (atomic_load_explicit(&c->h->note_state, memory_order_acquire) != 2)
        return 0;
    return comm_fail(c, ZR_EIO, op, "%.300s", c->h->note);
}

/* ZR_EIO (and the communicator dead) when a peer or the creator is gone */
static int check_peers(zr_comm *c, const char *op)
{
    char why[128], msg[256];
    ZR_TRY(check_note(c, op));
    for (int q = 0; q < c->world; q++) {
        if (q == c->rank)
            continue;
        rank_rec *R = rec(c->h, q);
        int pid = atomic_load(&R->pid);
        if (pid > 0 && process_dead(pid, R->start, why, sizeof why)) {
            snprintf(msg, sizeof msg, "rank %d (pid %d) died%s", q, pid, why);
            publish_note(c, msg);
            return comm_fail(c, ZR_EIO, op, "%s", msg);
        }
    }
    int cp = c->h->creator_pid;
    if (cp > 0 && cp != (int)getpid()) {
        int is_rank = 0;
        for (int q = 0; q < c->world; q++)
            if (atomic_load(&rec(c->h, q)->pid) == cp)
                is_rank = 1;
        if (!is_rank && process_dead(cp, c->h->creator_start, why, sizeof why)) {
            snprintf(msg, sizeof msg, "the launcher (pid %d) is gone%s", cp, why);
            publish_note(c, msg);
            return comm_fail(c, ZR_EIO, op, "%s", msg);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- barrier */

/* A barrier every rank reached succeeds, even when the launcher marked the job aborted
 * meanwhile: the round's writes are all there (a root that wrote its broadcast and exited
 * leaves them readable in the segment), so a rank relaying a failed peer's error text gets it
 * rather than the abort; the abort fails the next call (enter) or a wait that never ends. */

static int barrier(zr_comm *c, const char *op)
{
    shm_hdr *h = c->h;
    uint64_t k = ++c->bar_seq;
    uint32_t want = (uint32_t)k;
    uint64_t a = atomic_fetch_add(&h->arrived, 1) + 1;
    if (a == k * (uint64_t)c->world) {
        atomic_store(&h->gen, want);
        if (atomic_load(&h->sleepers))
            futex_wake_all(&h->gen);
        return 0;
    }
#define BAR_DONE() ((int32_t)(atomic_load_explicit(&h->gen, memory_order_acquire) - want) >= 0)
    /* a few microseconds of pause (when every rank can have a CPU) */
    for (unsigned i = 0; i < c->spin_pauses; i++) {
        if (BAR_DONE())
            return 0;
        cpu_relax();
    }
    /* then yield until SPIN_NS: a peer that shares this CPU runs at once */
    int64_t t0 = now_ns();
    for (;;) {
        if (BAR_DONE())
            return 0;
        ZR_TRY(check_abort(c, op));
        if (now_ns() - t0 > SPIN_NS)
            break;
        sched_yield();
    }
    int64_t last_check = now_ns();
    for (;;) {
        uint32_t g = atomic_load(&h->gen);
        if ((int32_t)(g - want) >= 0)
            return 0;
        ZR_TRY(check_abort(c, op));
        atomic_fetch_add(&h->sleepers, 1);
        futex_wait(&h->gen, g, SLEEP_NS);
        atomic_fetch_sub(&h->sleepers, 1);
        if (BAR_DONE())
            return 0;
        ZR_TRY(check_abort(c, op));
        ZR_TRY(check_note(c, op));
        int64_t t = now_ns();
        if (t - last_check >= SLEEP_NS) {
            last_check = t;
            ZR_TRY(check_peers(c, op));
        }
    }
#undef BAR_DONE
}

/* ---------------------------------------------------------------- rounds */

static char *area(zr_comm *c, int q, int half)
{
    return c->data + (size_t)q * c->seg + (size_t)half * c->half;
}

/* Start a round: its half. The first round of a call publishes the call's descriptor. */
static int round_begin(zr_comm *c, int first, uint32_t op, uint32_t aux, uint64_t n)
{
    int half = (int)(c->round++ & 1);
    if (first) {
        call_desc *d = &rec(c->h, c->rank)->desc[half];
        d->op = op;
        d->aux = aux;
        d->n = n;
    }
    return half;
}

/* After the first barrier of a call: every rank made the same call. */
static int check_descs(zr_comm *c, int half, const char *op)
{
    const call_desc *me = &rec(c->h, c->rank)->desc[half];
    for (int q = 0; q < c->world; q++) {
        const call_desc *d = &rec(c->h, q)->desc[half];
        if (d->op != me->op || d->aux != me->aux || d->n != me->n)
            return comm_fail(c, ZR_ECOMM, op,
                             "collective mismatch: rank %d called %s(n=%" PRIu64 ", %u) while "
                             "rank %d called %s(n=%" PRIu64 ", %u)",
                             q, op_name(d->op), d->n, d->aux, c->rank, op_name(me->op), me->n,
                             me->aux);
    }
    return 0;
}

/* The barrier after a round's writes; after the first round's, a check that every rank made
 * the same call. */
static int round_wait(zr_comm *c, int half, int first, const char *op)
{
    ZR_TRY(barrier(c, op));
    return first ? check_descs(c, half, op) : 0;
}

static int enter(zr_comm *c, const char *op)
{
    if (c->dead)
        return zr_err_set(c->dead_code, "%s: communicator unusable after an earlier error: %s",
                          op, c->dead_msg);
    ZR_TRY(check_abort(c, op));
    return check_note(c, op);
}

/* ---------------------------------------------------------------- reduction kernels */

/*
 * out1[i] (and out2[i] when out2) = ((src[0][i] + src[1][i]) + src[2][i]) + ..., W >= 2.
 * A block is summed into a stack buffer before it is stored, so out1 or out2 may be one of the
 * sources (the same elements: in place), and the loops vectorize without alias checks.
 */
#define DEFINE_SUM(NAME, T)                                                                    \
    static void NAME(T *out1, T *out2, const T *const *src, int W, size_t n)                   \
    {                                                                                          \
        T acc[RED_BLK] __attribute__((aligned(64)));                                           \
        for (size_t b = 0; b < n; b += RED_BLK) {                                              \
            size_t m = n - b < RED_BLK ? n - b : RED_BLK;                                      \
            const T *s0 = src[0] + b, *s1 = src[1] + b;                                        \
            for (size_t i = 0; i < m; i++)                                                     \
                acc[i] = s0[i] + s1[i];                                                        \
            for (int q = 2; q < W; q++) {                                                      \
                const T *s = src[q] + b;                                                       \
                for (size_t i = 0; i < m; i++)                                                 \
                    acc[i] += s[i];                                                            \
            }                                                                                  \
            memcpy(out1 + b, acc, m * sizeof(T));                                              \
            if (out2)                                                                          \
                memcpy(out2 + b, acc, m * sizeof(T));                                          \
        }                                                                                      \
    }
DEFINE_SUM(sum_f32, float)
DEFINE_SUM(sum_f64, double)

static void reduce(zr_comm_dtype dt, void *out1, void *out2, const void *const *src, int W,
                   size_t n)
{
    if (dt == ZR_COMM_F64)
        sum_f64(out1, out2, (const double *const *)src, W, n);
    else
        sum_f32(out1, out2, (const float *const *)src, W, n);
}

/* ---------------------------------------------------------------- argument checks */

static int check_dtype(zr_comm_dtype dt, const char *op)
{
    if (dt != ZR_COMM_F32 && dt != ZR_COMM_F64)
        return zr_err_set(ZR_EINVAL, "%s: unknown dtype %d", op, (int)dt);
    return 0;
}

/* a * b bytes without overflow */
static int mul_ok(size_t *out, size_t a, size_t b, const char *op)
{
    if (b && a > SIZE_MAX / b)
        return zr_err_set(ZR_EINVAL, "%s: size overflows", op);
    *out = a * b;
    return 0;
}

/* ---------------------------------------------------------------- collectives */

/* A collective in a world of one: recv gets send (they may be the same buffer). */
static int world_of_one(void *recv, const void *send, size_t bytes)
{
    if (send != recv)
        memmove(recv, send, bytes);
    return 0;
}

/* The shm loops of all_reduce and reduce_scatter (after reduction(): n > 0 elements of es bytes,
 * a world of two or more, entered). */
static int shm_all_reduce(zr_comm *c, const char *in, char *out, size_t n, zr_comm_dtype dt,
                          size_t es)
{
    const char *op = "all_reduce";
    const int W = c->world, r = c->rank;
    /* a window of W pieces of cw elements (multiple of 16) fills one half */
    size_t cw = (c->half / ((size_t)W * es)) & ~(size_t)15;
    const void *src[SHM_MAX_WORLD];
    for (size_t off = 0; off < n;) {
        size_t m = n - off < cw * (size_t)W ? n - off : cw * (size_t)W;
        int half = round_begin(c, off == 0, OP_ALL_REDUCE, (uint32_t)dt, n);
        size_t a = m * (size_t)r / (size_t)W, b = m * (size_t)(r + 1) / (size_t)W;
        char *mine = area(c, r, half);
        /* the window, less my own piece (which I read from send) */
        memcpy(mine, in + off * es, a * es);
        memcpy(mine + b * es, in + (off + b) * es, (m - b) * es);
        ZR_TRY(round_wait(c, half, off == 0, op));
        for (int q = 0; q < W; q++)
            src[q] = q == r ? (const void *)(in + (off + a) * es) : area(c, q, half) + a * es;
        /* piece r: into my area for the others, and into recv */
        reduce(dt, mine + a * es, out + (off + a) * es, src, W, b - a);
        ZR_TRY(barrier(c, op));
        for (int q = 0; q < W; q++) {
            if (q == r)
                continue;
            size_t qa = m * (size_t)q / (size_t)W, qb = m * (size_t)(q + 1) / (size_t)W;
            memcpy(out + (off + qa) * es, area(c, q, half) + qa * es, (qb - qa) * es);
        }
        off += m;
    }
    return 0;
}

static int shm_reduce_scatter(zr_comm *c, const char *in, char *out, size_t n,
                              zr_comm_dtype dt, size_t es)
{
    const char *op = "reduce_scatter";
    const int W = c->world, r = c->rank;
    size_t cw = (c->half / ((size_t)W * es)) & ~(size_t)15; /* elements per piece per round */
    const void *src[SHM_MAX_WORLD];
    for (size_t off = 0; off < n; off += cw) {
        size_t cur = n - off < cw ? n - off : cw;
        int half = round_begin(c, off == 0, OP_REDUCE_SCATTER, (uint32_t)dt, n);
        char *mine = area(c, r, half);
        for (int d = 0; d < W; d++)
            if (d != r)
                memcpy(mine + (size_t)d * cw * es, in + ((size_t)d * n + off) * es, cur * es);
        ZR_TRY(round_wait(c, half, off == 0, op));
        for (int q = 0; q < W; q++)
            src[q] = q == r ? (const void *)(in + ((size_t)r * n + off) * es)
                            : area(c, q, half) + (size_t)r * cw * es;
        reduce(dt, out + off * es, NULL, src, W, cur);
    }
    return 0;
}

/* all_reduce (kind OP_ALL_REDUCE) or reduce_scatter of n elements of dt (n per rank in
 * all_reduce, n per destination in reduce_scatter): the checks, the calls that end here
 * (nothing to send, or a world of one: recv gets send), then the loaded backend or the shm
 * loops. */
static int reduction(zr_comm *c, const void *send, void *recv, size_t n, zr_comm_dtype dt,
                     uint32_t kind)
{
    int ar = kind == OP_ALL_REDUCE;
    const char *op = ar ? "all_reduce" : "reduce_scatter";
    ZR_TRY(check_dtype(dt, op));
    if (!n)
        return 0;
    size_t total = 0, es = dtype_size(dt);
    ZR_TRY(mul_ok(&total, n, es * (size_t)c->world, op));
    if (!send || !recv)
        return zr_err_set(ZR_EINVAL, "%s: NULL buffer", op);
    if (c->world <= 1)
        return world_of_one(recv, send, n * es);
    if (c->be)
        return (ar ? c->be->all_reduce : c->be->reduce_scatter)(c->bh, send, recv, n, es);
    ZR_TRY(enter(c, op));
    return ar ? shm_all_reduce(c, send, recv, n, dt, es)
              : shm_reduce_scatter(c, send, recv, n, dt, es);
}

int zr_comm_all_reduce(zr_comm *c, const void *send, void *recv, size_t n, zr_comm_dtype dt)
{
    return reduction(c, send, recv, n, dt, OP_ALL_REDUCE);
}

int zr_comm_reduce_scatter(zr_comm *c, const void *send, void *recv, size_t n,
                           zr_comm_dtype dt)
{
    return reduction(c, send, recv, n, dt, OP_REDUCE_SCATTER);
}

/* The gathers' round: bytes [off, off + cur) of every rank's piece of bytes into out (rank q's
 * at q * bytes), the others' from their areas, this rank's own from in. */
static void collect(zr_comm *c, int half, char *out, const char *in, size_t bytes, size_t off,
                    size_t cur)
{
    for (int q = 0; q < c->world; q++) {
        char *dst = out + (size_t)q * bytes + off;
        if (q != c->rank)
            memcpy(dst, area(c, q, half), cur);
        else if (dst != in + off)
            memmove(dst, in + off, cur);
    }
}

int zr_comm_all_gather(zr_comm *c, const void *send, void *recv, size_t n, size_t elem_bytes)
{
    const char *op = "all_gather";
    if (!n || !elem_bytes)
        return 0;
    size_t bytes = 0, total;
    ZR_TRY(mul_ok(&bytes, n, elem_bytes, op));
    ZR_TRY(mul_ok(&total, bytes, (size_t)c->world, op));
    if (!send || !recv)
        return zr_err_set(ZR_EINVAL, "%s: NULL buffer", op);
    if (elem_bytes > UINT32_MAX)
        return zr_err_set(ZR_EINVAL, "%s: element size %zu too large", op, elem_bytes);
    char *out = recv;
    const char *in = send;
    if (c->world == 1)
        return world_of_one(out, in, bytes);
    if (c->be)
        return c->be->all_gather(c->bh, send, recv, bytes);
    ZR_TRY(enter(c, op));
    const int r = c->rank;
    size_t chunk = c->half & ~(size_t)63;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t cur = bytes - off < chunk ? bytes - off : chunk;
        int half = round_begin(c, off == 0, OP_ALL_GATHER, (uint32_t)elem_bytes, n);
        memcpy(area(c, r, half), in + off, cur);
        ZR_TRY(round_wait(c, half, off == 0, op));
        collect(c, half, out, in, bytes, off, cur);
    }
    return 0;
}

int zr_comm_broadcast(zr_comm *c, void *buf, size_t bytes, int root)
{
    const char *op = "broadcast";
    if (root < 0 || root >= c->world)
        return zr_err_set(ZR_EINVAL, "%s: root %d outside the world of %d", op, root, c->world);
    if (!bytes || c->world == 1)
        return 0;
    if (!buf)
        return zr_err_set(ZR_EINVAL, "%s: NULL buffer", op);
    if (c->be)
        return c->be->broadcast(c->bh, buf, bytes, root);
    ZR_TRY(enter(c, op));
    char *p = buf;
    size_t chunk = c->half & ~(size_t)63;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t cur = bytes - off < chunk ? bytes - off : chunk;
        int half = round_begin(c, off == 0, OP_BROADCAST, (uint32_t)root, bytes);
        if (c->rank == root)
            memcpy(area(c, root, half), p + off, cur);
        ZR_TRY(round_wait(c, half, off == 0, op));
        if (c->rank != root)
            memcpy(p + off, area(c, root, half), cur);
    }
    return 0;
}

int zr_comm_gather(zr_comm *c, const void *send, void *recv, size_t bytes, int root)
{
    const char *op = "gather";
    if (root < 0 || root >= c->world)
        return zr_err_set(ZR_EINVAL, "%s: root %d outside the world of %d", op, root, c->world);
    if (!bytes)
        return 0;
    size_t total;
    ZR_TRY(mul_ok(&total, bytes, (size_t)c->world, op));
    if (!send || (c->rank == root && !recv))
        return zr_err_set(ZR_EINVAL, "%s: NULL buffer", op);
    const char *in = send;
    char *out = recv;
    if (c->world == 1)
        return world_of_one(out, in, bytes);
    if (c->be)
        return c->be->gather(c->bh, send, recv, bytes, root);
    ZR_TRY(enter(c, op));
    const int r = c->rank;
    size_t chunk = c->half & ~(size_t)63;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t cur = bytes - off < chunk ? bytes - off : chunk;
        int half = round_begin(c, off == 0, OP_GATHER, (uint32_t)root, bytes);
        if (r != root)
            memcpy(area(c, r, half), in + off, cur);
        ZR_TRY(round_wait(c, half, off == 0, op));
        if (r == root)
            collect(c, half, out, in, bytes, off, cur);
    }
    return 0;
}

int zr_comm_barrier(zr_comm *c)
{
    const char *op = "barrier";
    if (c->world == 1)
        return 0;
    if (c->be)
        return c->be->barrier(c->bh);
    ZR_TRY(enter(c, op));
    int half = round_begin(c, 1, OP_BARRIER, 0, 0);
    return round_wait(c, half, 1, op);
}

int zr_comm_check(zr_comm *c)
{
    if (c->world == 1)
        return 0;
    if (c->be)
        return c->be->check(c->bh);
    if (c->dead)
        return zr_err_set(c->dead_code, "communicator unusable after an earlier error: %s",
                          c->dead_msg);
    ZR_TRY(check_abort(c, "check"));
    return check_peers(c, "check");
}

/* ---------------------------------------------------------------- open and close */

int zr_comm_rank(const zr_comm *c) { return c->rank; }
int zr_comm_world(const zr_comm *c) { return c->world; }

/* The token every rank of a TCP job puts in its hello: FNV-1a of the job's identity (ZR_JOB_ID,
 * else Slurm's job and step, else PMIx's namespace under mpirun), the master and the world, so
 * a rank of another job that reaches the same port is turned away. */
static uint64_t job_token(const char *master, int world)
{
    char id[512];
    const char *job = zr_env(ZR_ENV_JOB_ID), *sj = zr_env(ZR_ENV_SLURM_JOB_ID);
    if (job)
        snprintf(id, sizeof id, "zr:%s", job);
    else if (sj)
        snprintf(id, sizeof id, "slurm:%s.%s", sj,
                 zr_env(ZR_ENV_SLURM_STEP_ID) ? zr_env(ZR_ENV_SLURM_STEP_ID) : "");
    else if (zr_env(ZR_ENV_PMIX_NAMESPACE))
        snprintf(id, sizeof id, "pmix:%s", zr_env(ZR_ENV_PMIX_NAMESPACE));
    else
        id[0] = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s|%s|%d", id, master, world);
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = buf; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return h;
}

static int open_shm(zr_comm *c, const char *name, int rank, int world)
{
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return zr_err_set(ZR_EIO, "ZR_COMM_SHM='%s': cannot open the shared segment: %s", name,
                          strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(shm_hdr)) {
        close(fd);
        return zr_err_set(ZR_EIO, "ZR_COMM_SHM='%s': not a communicator segment (too small)",
                          name);
    }
    shm_hdr hd;
    ssize_t k;
    do
        k = pread(fd, &hd, sizeof hd, 0);
    while (k < 0 && errno == EINTR);
    if (k != (ssize_t)sizeof hd || hd.magic != SHM_MAGIC) {
        close(fd);
        return zr_err_set(ZR_EIO, "ZR_COMM_SHM='%s': not a communicator segment (bad magic)",
                          name);
    }
    if (hd.version != SHM_VERSION) {
        close(fd);
        return zr_err_set(ZR_EIO, "ZR_COMM_SHM='%s': segment version %u, this build knows %u",
                          name, hd.version, SHM_VERSION);
    }
    if ((int)hd.world != world) {
        close(fd);
        return zr_err_set(ZR_EIO, "ZR_COMM_SHM='%s': segment made for a world of %u, "
                                  "ZR_WORLD is %d",
                          name, hd.world, world);
    }
    if (hd.total_bytes != (uint64_t)st.st_size || hd.seg_bytes < 256u * (uint64_t)world ||
        hd.seg_bytes % 4096 || hd.hdr_bytes < RANK_REC_AT + (uint64_t)world * RANK_REC ||
        hd.total_bytes != hd.hdr_bytes + (uint64_t)world * hd.seg_bytes) {
        close(fd);
        return zr_err_set(ZR_EIO, "ZR_COMM_SHM='%s': segment sizes inconsistent", name);
    }
    void *p = mmap(NULL, hd.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return zr_err_set(ZR_EIO, "ZR_COMM_SHM='%s': mmap of %" PRIu64 " bytes: %s", name,
                          hd.total_bytes, strerror(e));
    c->h = p;
    c->map_bytes = hd.total_bytes;
    c->data = (char *)p + hd.hdr_bytes;
    c->seg = hd.seg_bytes;
    c->half = hd.seg_bytes / 2;
    rank_rec *R = rec(c->h, rank);
    R->start = self_start();
    int32_t expect = 0;
    if (!atomic_compare_exchange_strong(&R->pid, &expect, (int32_t)getpid())) {
        munmap(p, c->map_bytes);
        c->h = NULL;
        return zr_err_set(ZR_EIO, "ZR_COMM_SHM='%s': rank %d was already opened by pid %d",
                          name, rank, expect);
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    c->spin_pauses = cpus > 0 && world > cpus ? 0 : SPIN_PAUSES;
    return 0;
}

static zr_comm *env_comm; /* zr_comm_env */

/* ---------------------------------------------------------------- the mpi backend */

int zr__next_to_exe(char *buf, size_t cap, const char *file)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return zr_err_sys(errno, "cannot find the running executable (/proc/self/exe)");
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    size_t dir = slash ? (size_t)(slash - exe) : 0;
    int w = slash ? snprintf(buf, cap, "%.*s/%s", (int)dir, exe, file)
                  : snprintf(buf, cap, "./%s", file);
    if (w < 0 || (size_t)w >= cap)
        return zr_err_set(ZR_EINVAL, "the path of %s next to %s does not fit in %zu bytes",
                          file, exe, cap);
    return 0;
}

int zr__backend_load(void **sym, const char *path, const char *symbol, int global,
                     const char *who, const char *what)
{
    *sym = NULL;
    dlerror();
    void *h = dlopen(path, RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
    if (!h) {
        const char *e = dlerror();
        return zr_err_set(ZR_EUNSUPPORTED, "%s: cannot load the %s: %s", who, what,
                          e ? e : path);
    }
    *sym = dlsym(h, symbol);
    return 0;
}

static int mpi_error(int code, const char *msg) { return zr_err_set(code, "%s", msg); }

static void mpi_sum(size_t es, void *out, const void *const *src, int W, size_t n)
{
    reduce(es == 8 ? ZR_COMM_F64 : ZR_COMM_F32, out, NULL, src, W, n);
}

/* libzr_mpi.so next to the program, loaded once (RTLD_GLOBAL: Open MPI's components resolve
 * MPI's symbols through it) and kept for the life of the process, as MPI must be */
static int mpi_plugin(const zr_mpi_plugin **out)
{
    static const zr_mpi_plugin *loaded;
    if (loaded) {
        *out = loaded;
        return 0;
    }
    char path[4200];
    ZR_TRY(zr__next_to_exe(path, sizeof path, ZR_MPI_LIB));
    if (access(path, F_OK) != 0)
        return zr_err_set(ZR_EUNSUPPORTED, "mpi: no MPI backend %s (make builds it next to "
                          "the programs with Open MPI, which make deps installs; or run with "
                          "--comm tcp)", path);
    void *sym;
    ZR_TRY(zr__backend_load(&sym, path, ZR_MPI_SYMBOL, 1, "mpi", "MPI backend"));
    zr_mpi_getter get; /* dlsym returns void *; the getter is a function (POSIX allows it) */
    memcpy(&get, &sym, sizeof get);
    const zr_mpi_plugin *p = sym ? get() : NULL;
    if (!p || p->abi != ZR_MPI_ABI || p->size < sizeof *p)
        return zr_err_set(ZR_EUNSUPPORTED, "mpi: %s is not this build's MPI backend (ABI %u, "
                          "expected %u): rebuild with make", path, p ? p->abi : 0, ZR_MPI_ABI);
    *out = loaded = p;
    return 0;
}

/* The mpi backend into c: MPI's world must be the one ZR_WORLD and ZR_RANK name, when set. */
static int open_mpi(zr_comm *c, int rank, int world, int has_r, int has_w)
{
    static const zr_mpi_host host = {mpi_error, mpi_sum};
    const zr_mpi_plugin *p;
    ZR_TRY(mpi_plugin(&p));
    int win = 64 << 20, has;
    ZR_TRY(zr_env_int(&win, &has, ZR_ENV_COMM_MPI_WINDOW, 1024, 1 << 30));
    /* more ranks than CPUs on this node: Open MPI's busy polling takes the CPUs from the ranks
     * that compute (an 8-rank job on 2 CPUs with polling forced ran 3 to 4 s per step instead
     * of 0.03 to 0.15 s); Open MPI yields by itself only when it knows the node oversubscribed
     * (not with a host file that claims more slots). Ask it to yield, as the shm backend stops
     * spinning; the user's own setting wins. */
    int local = 0, has_l;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    ZR_TRY(zr_env_int(&local, &has_l, ZR_ENV_OMPI_LOCAL_SIZE, 1, 1 << 20));
    if (has_l && cpus > 0 && local > cpus)
        setenv(zr_env_name(ZR_ENV_OMPI_YIELD), "1", 0);
    const char *ver = "";
    int r = 0, w = 0;
    ZR_TRY(p->open(&c->bh, &r, &w, &ver, (size_t)win, &host));
    c->be = &p->be;
    if ((has_w && w != world) || (has_r && r != rank)) {
        p->be.close(c->bh);
        c->be = NULL;
        return zr_err_set(ZR_EINVAL, "mpi: MPI says rank %d of %d, the environment rank %d of "
                          "%d (ZR_RANK, ZR_WORLD): ranks started by another MPI's launcher than "
                          "the one libzr_mpi.so was built with (%s)?", r, w, rank, world, ver);
    }
    c->rank = r;
    c->world = w;
    zr_log(ZR_LOG_INFO, "communicator: mpi, rank %d of %d (%s)", r, w, ver);
    return 0;
}

int zr_comm_open_env(zr_comm **out)
{
    *out = NULL;
    int world = 1, rank = 0, has_w, has_r;
    ZR_TRY(zr_env_int(&world, &has_w, ZR_ENV_WORLD, 1, SHM_MAX_WORLD));
    ZR_TRY(zr_env_int(&rank, &has_r, ZR_ENV_RANK, 0, SHM_MAX_WORLD - 1));
    if (!has_w)
        world = 1;
    if (has_r && rank >= world)
        return zr_err_set(ZR_EINVAL, "ZR_RANK=%d outside the world of %d (ZR_WORLD)", rank,
                          world);
    const char *kind = zr_env(ZR_ENV_COMM);
    int mpi = kind && !strcmp(kind, "mpi");
    if (kind && !mpi)
        return zr_err_set(ZR_EINVAL, "ZR_COMM='%s': expected mpi (or unset)", kind);
    if (world > 1 && !has_r && !mpi)
        return zr_err_set(ZR_EINVAL, "ZR_RANK is not set (ZR_WORLD=%d)", world);
    const char *name = zr_env(ZR_ENV_COMM_SHM), *tcp = zr_env(ZR_ENV_COMM_TCP);
    if (tcp && !*tcp)
        tcp = NULL;
    if (world > 1 && !mpi && !tcp && (!name || !*name))
        return zr_err_set(ZR_EINVAL, "ZR_COMM_SHM is not set (ZR_WORLD=%d)", world);
    int timeout = 300, has_t;
    ZR_TRY(zr_env_int(&timeout, &has_t, ZR_ENV_COMM_TCP_TIMEOUT, 1, 86400));
    zr_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    c->rank = world > 1 ? rank : 0;
    c->world = world;
    int rc = 0;
    if (mpi)
        rc = open_mpi(c, rank, world, has_r, has_w);
    else if (world > 1 && tcp) {
        zr_tcp *t = NULL;
        rc = ztcp_open(&t, tcp, rank, world, timeout, job_token(tcp, world));
        c->be = t ? &ztcp_be : NULL;
        c->bh = t;
    } else if (world > 1)
        rc = open_shm(c, name, rank, world);
    if (rc < 0) {
        free(c);
        return rc;
    }
    if (c->world == 1 && c->be) { /* mpirun -np 1: nothing to talk to */
        c->be->close(c->bh);
        c->be = NULL;
    }
    *out = c;
    env_comm = c;
    return 0;
}

zr_comm *zr_comm_env(void) { return env_comm; }

void zr_comm_close(zr_comm *c)
{
    if (!c)
        return;
    if (c == env_comm)
        env_comm = NULL;
    if (c->h)
        munmap(c->h, c->map_bytes);
    if (c->be)
        c->be->close(c->bh);
    free(c);
}

/* ---------------------------------------------------------------- segment management */

/* 1 when /dev/shm/<d> (a name "zr-<pid>-<hex>") is a communicator segment of this user whose
 * creator (a launcher) is dead: a launcher killed by SIGKILL cannot unlink its segment. */
static int shm_stale(const char *d)
{
    int pid;
    unsigned x;
    char tail;
    if (sscanf(d, "zr-%d-%8x%c", &pid, &x, &tail) != 2 || pid <= 0)
        return 0;
    char name[300];
    snprintf(name, sizeof name, "/%s", d);
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0)
        return 0;
    struct stat st;
    int stale = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        (size_t)st.st_size >= sizeof(shm_hdr)) {
        shm_hdr *h = mmap(NULL, sizeof(shm_hdr), PROT_READ, MAP_SHARED, fd, 0);
        if (h != MAP_FAILED) {
            char why[96];
            stale = h->magic == SHM_MAGIC && h->creator_pid == pid &&
                    process_dead(h->creator_pid, h->creator_start, why, sizeof why);
            munmap(h, sizeof(shm_hdr));
        }
    }
    close(fd);
    return stale;
}

int zr_comm_shm_reclaim(void)
{
    DIR *dir = opendir("/dev/shm");
    if (!dir)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)))
        if (!strncmp(e->d_name, "zr-", 3) && shm_stale(e->d_name)) {
            char name[300];
            snprintf(name, sizeof name, "/%s", e->d_name);
            if (shm_unlink(name) == 0)
                n++;
        }
    closedir(dir);
    return n;
}

int zr_comm_check_world(int world)
{
    if (world < 1 || world > SHM_MAX_WORLD)
        return zr_err_set(ZR_EINVAL, "world %d outside [1, %d]", world, SHM_MAX_WORLD);
    return 0;
}

int zr_comm_shm_create(char **name_out, int world, size_t seg_bytes)
{
    zr_comm_shm_reclaim(); /* what launchers killed by SIGKILL left behind */
    *name_out = NULL;
    ZR_TRY(zr_comm_check_world(world));
    if (!seg_bytes)
        seg_bytes = SHM_DEFAULT_SEG;
    /* each half must hold W pieces of 16 doubles; whole pages */
    size_t min_seg = (size_t)world * 2 * 16 * 8;
    if (seg_bytes < min_seg)
        seg_bytes = min_seg;
    if (seg_bytes > ((size_t)1 << 34))
        return zr_err_set(ZR_EINVAL, "segment of %zu bytes per rank is too large", seg_bytes);
    seg_bytes = (seg_bytes + 4095) & ~(size_t)4095;
    size_t hdr_bytes = (RANK_REC_AT + (size_t)world * RANK_REC + 4095) & ~(size_t)4095;
    size_t total = hdr_bytes + (size_t)world * seg_bytes;

    char name[64];
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                     ((uint64_t)getpid() << 40) ^ ((uint64_t)(uintptr_t)&ts) ^
                     ((uint64_t)attempt * 0x9E3779B97F4A7C15ull);
        x ^= x >> 29;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 32;
        snprintf(name, sizeof name, "/zr-%d-%08x", (int)getpid(), (unsigned)x);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST)
            return zr_err_set(ZR_EIO, "shm_open %s: %s", name, strerror(errno));
    }
    if (fd < 0)
        return zr_err_set(ZR_EIO, "shm_open: no free name");
    int rc = 0;
    if (ftruncate(fd, (off_t)total) < 0) {
        rc = zr_err_set(ZR_EIO, "shared segment %s: ftruncate to %zu bytes: %s", name, total,
                        strerror(errno));
        goto fail;
    }
    /* reserve the memory now: a full /dev/shm fails here, not with SIGBUS inside a call */
    int e = posix_fallocate(fd, 0, (off_t)total);
    if (e && e != EOPNOTSUPP && e != EINVAL) {
        rc = zr_err_set(ZR_EIO, "shared segment %s: cannot reserve %zu bytes (%d ranks x %zu "
                                "KiB) in /dev/shm: %s",
                        name, total, world, seg_bytes >> 10, strerror(e));
        goto fail;
    }
    shm_hdr *h = mmap(NULL, hdr_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) {
        rc = zr_err_set(ZR_EIO, "shared segment %s: mmap: %s", name, strerror(errno));
        goto fail;
    }
    memset(h, 0, hdr_bytes);
    h->version = SHM_VERSION;
    h->world = (uint32_t)world;
    h->hdr_bytes = hdr_bytes;
    h->seg_bytes = seg_bytes;
    h->total_bytes = total;
    h->creator_pid = (int32_t)getpid();
    h->creator_start = self_start();
    atomic_thread_fence(memory_order_seq_cst);
    h->magic = SHM_MAGIC;
    munmap(h, hdr_bytes);
    close(fd);
    *name_out = strdup(name);
    if (!*name_out) {
        shm_unlink(name);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    return 0;
fail:
    close(fd);
    shm_unlink(name);
    return rc;
}

void zr_comm_shm_abort(const char *name, int rank, int status)
{
    if (!name)
        return;
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) < 0 || (size_t)st.st_size < RANK_REC_AT) {
        close(fd);
        return;
    }
    shm_hdr *h = mmap(NULL, RANK_REC_AT, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (h == MAP_FAILED)
        return;
    if (h->magic == SHM_MAGIC) {
        uint64_t want = (1ull << 63) | ((uint64_t)(uint32_t)rank << 32) | (uint32_t)status,
                 expect = 0;
        /* the first abort wins: it names the rank that failed first */
        atomic_compare_exchange_strong(&h->abort_word, &expect, want);
        futex_wake_all(&h->gen);
    }
    munmap(h, RANK_REC_AT);
}

void zr_comm_shm_unlink(const char *name)
{
    if (name)
        shm_unlink(name);
}
