/*
 * test_comm.c: the shm communicator (core/dist/comm.h) and the launcher (zr_launch, core/zr.h).
 *
 * Communicator: worlds of 1 to 4 forked ranks on a small segment (64 KiB per rank, so sizes
 * above it stream in several rounds cheaply) run every collective, out of place and in place,
 * f32 and f64, at counts 1, 7, 1009 and 20011, and compare with sums computed here in rank order
 * (exact bits; inputs of random sign and exponent, so another order would give other bits);
 * all_reduce must equal reduce_scatter + all_gather bit for bit. Mismatched calls fail on every
 * rank. A rank that dies (exits, or is killed mid-collective), a launcher that marks the job
 * aborted, or a launcher that disappears makes the others' calls fail with ZR_EIO naming it,
 * within seconds. The environment's errors.
 *
 * Launcher: /bin/sh ranks: environment, prefixes, which stdout is shown, partial lines, only the
 * rank's own descriptors inherited, the segment unlinked, a failing rank stopping the others
 * (SIGTERM, then SIGKILL after the grace), exit codes, an exec failure, signal forwarding and
 * restored handlers; and the test binary itself launched as real communicator ranks.
 */
#include "ckutil.h"
#include "comm.h"
#include "harness.h"
#include "zr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define SEG (64 * 1024)
#define MAXW 4

/* ---------------------------------------------------------------- helpers */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static uint64_t mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* input element j of rank r: random sign, mantissa and exponent in [2^-20, 2^20) */
static double val(int r, size_t j, uint64_t salt)
{
    uint64_t h = mix(mix(salt) ^ ((uint64_t)r << 48) ^ j);
    double m = 1.0 + (double)(h >> 11 & 0xFFFFFFFFFull) / 68719476736.0;
    int e = (int)(h % 41) - 20;
    return ldexp((h >> 63) ? -m : m, e);
}

static void fill(void *buf, zr_comm_dtype dt, int r, size_t off, size_t n, uint64_t salt)
{
    for (size_t j = 0; j < n; j++) {
        if (dt == ZR_COMM_F64)
            ((double *)buf)[j] = val(r, off + j, salt);
        else
            ((float *)buf)[j] = (float)val(r, off + j, salt);
    }
}

/* expected sums of elements [off, off + n) over W ranks, in rank order (or reversed) */
static void expect_sum(void *buf, zr_comm_dtype dt, int W, size_t off, size_t n, uint64_t salt,
                       int reversed)
{
    for (size_t j = 0; j < n; j++) {
        if (dt == ZR_COMM_F64) {
            double s = val(reversed ? W - 1 : 0, off + j, salt);
            for (int q = 1; q < W; q++)
                s += val(reversed ? W - 1 - q : q, off + j, salt);
            ((double *)buf)[j] = s;
        } else {
            float s = (float)val(reversed ? W - 1 : 0, off + j, salt);
            for (int q = 1; q < W; q++)
                s += (float)val(reversed ? W - 1 - q : q, off + j, salt);
            ((float *)buf)[j] = s;
        }
    }
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ZT_CHECK(p);
    return p;
}

static void clear_env(void)
{
    unsetenv("ZR_RANK");
    unsetenv("ZR_WORLD");
    unsetenv("ZR_COMM_SHM");
    unsetenv("ZR_COMM_TCP");
}

typedef void (*rank_fn)(zr_comm *c, int r, int W, void *ctx);

static int use_tcp; /* run_world over the tcp backend (ZR_COMM_TCP) instead of shm */

/* Fork W ranks (over a fresh segment of seg bytes per rank when W > 1, or over TCP on a free
 * local port with use_tcp); each runs fn and must exit 0. */
static void run_world(int W, size_t seg, rank_fn fn, void *ctx)
{
    char *name = NULL, master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", use_tcp ? zt_free_port() : 0);
    if (W > 1 && !use_tcp)
        ZT_OK(zr_comm_shm_create(&name, W, seg));
    pid_t pids[MAXW + 1];
    fflush(NULL);
    for (int r = 0; r < W; r++) {
        pids[r] = fork();
        ZT_CHECK(pids[r] >= 0);
        if (pids[r] == 0) {
            if (W > 1)
                zt_set_rank_env(name, r, W);
            else
                clear_env();
            if (use_tcp)
                setenv("ZR_COMM_TCP", master, 1);
            zr_comm *c;
            ZT_OK(zr_comm_open_env(&c));
            ZT_CHECK_EQ(zr_comm_rank(c), r);
            ZT_CHECK_EQ(zr_comm_world(c), W);
            fn(c, r, W, ctx);
            zr_comm_close(c);
            fflush(NULL);
            _exit(0);
        }
    }
    /* reaped in the order they end: the first rank that fails ends the others at once (a rank
     * whose peer died before the rendezvous would otherwise wait out the TCP timeout) */
    int bad = -1, bad_st = 0;
    for (int left = W; left > 0; left--) {
        int st;
        pid_t p;
        while ((p = waitpid(-1, &st, 0)) < 0 && errno == EINTR)
            ;
        ZT_CHECK(p > 0);
        int r = 0;
        while (r < W && pids[r] != p)
            r++;
        ZT_CHECK(r < W);
        pids[r] = -1;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && bad < 0) {
            bad = r;
            bad_st = st;
            for (int q = 0; q < W; q++)
                if (pids[q] > 0)
                    kill(pids[q], SIGKILL);
        }
    }
    zr_comm_shm_unlink(name);
    free(name);
    if (bad >= 0)
        ZT_FAIL("world %d: rank %d ended with wait status %d", W, bad, bad_st);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *s = xmalloc(cap);
    size_t k;
    while ((k = fread(s + len, 1, cap - len - 1, f)) > 0) {
        len += k;
        if (cap - len < 2) {
            cap *= 2;
            s = realloc(s, cap);
            ZT_CHECK(s);
        }
    }
    fclose(f);
    s[len] = 0;
    return s;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* ---------------------------------------------------------------- every op, every world */

typedef struct {
    zr_comm_dtype dt;
    size_t n;
    uint64_t salt;
} op_case;

static void check_bits(const void *got, const void *want, size_t bytes, const char *what, int r,
                       size_t n)
{
    if (memcmp(got, want, bytes)) {
        size_t i = 0;
        while (((const char *)got)[i] == ((const char *)want)[i])
            i++;
        ZT_FAIL("%s, rank %d, n %zu: bytes differ from offset %zu", what, r, n, i);
    }
}

static void ops_rank(zr_comm *c, int r, int W, void *ctx)
{
    const op_case *k = ctx;
    const zr_comm_dtype dt = k->dt;
    const size_t n = k->n, es = dt == ZR_COMM_F64 ? 8 : 4, Wn = (size_t)W * n;
    char *in = xmalloc(Wn * es), *in_copy = xmalloc(Wn * es), *buf = xmalloc(Wn * es);
    char *exp = xmalloc(Wn * es), *got = xmalloc(Wn * es), *rs = xmalloc(n * es);
    fill(in, dt, r, 0, Wn, k->salt);
    memcpy(in_copy, in, Wn * es);
    expect_sum(exp, dt, W, 0, Wn, k->salt, 0);

    /* all_reduce of n, out of place and in place */
    memset(got, 0xAB, Wn * es);
    ZT_OK(zr_comm_all_reduce(c, in, got, n, dt));
    check_bits(got, exp, n * es, "all_reduce", r, n);
    check_bits(in, in_copy, Wn * es, "all_reduce send buffer", r, n);
    memcpy(buf, in, n * es);
    ZT_OK(zr_comm_all_reduce(c, buf, buf, n, dt));
    check_bits(buf, exp, n * es, "all_reduce in place", r, n);

    /* reduce_scatter of W n, out of place and in place */
    memset(rs, 0xCD, n * es);
    ZT_OK(zr_comm_reduce_scatter(c, in, rs, n, dt));
    check_bits(rs, exp + (size_t)r * n * es, n * es, "reduce_scatter", r, n);
    check_bits(in, in_copy, Wn * es, "reduce_scatter send buffer", r, n);
    memcpy(buf, in, Wn * es);
    ZT_OK(zr_comm_reduce_scatter(c, buf, buf + (size_t)r * n * es, n, dt));
    check_bits(buf + (size_t)r * n * es, exp + (size_t)r * n * es, n * es,
               "reduce_scatter in place", r, n);

    /* all_gather of the reduce_scatter result == all_reduce of W n, bit for bit */
    memset(got, 0xEF, Wn * es);
    ZT_OK(zr_comm_all_gather(c, rs, got, n, es));
    char *ar = xmalloc(Wn * es);
    ZT_OK(zr_comm_all_reduce(c, in, ar, Wn, dt));
    check_bits(ar, exp, Wn * es, "all_reduce of W n", r, Wn);
    check_bits(got, ar, Wn * es, "reduce_scatter + all_gather vs all_reduce", r, n);
    /* in place all_gather */
    memset(buf, 0x11, Wn * es);
    memcpy(buf + (size_t)r * n * es, rs, n * es);
    ZT_OK(zr_comm_all_gather(c, buf + (size_t)r * n * es, buf, n, es));
    check_bits(buf, exp, Wn * es, "all_gather in place", r, n);

    /* all_gather of odd-sized elements (3 bytes) */
    size_t eb = 3, gb = n * eb;
    unsigned char *mine = xmalloc(gb), *all = xmalloc((size_t)W * gb);
    for (size_t j = 0; j < gb; j++)
        mine[j] = (unsigned char)mix(k->salt ^ ((uint64_t)r << 40) ^ j);
    ZT_OK(zr_comm_all_gather(c, mine, all, n, eb));
    for (int q = 0; q < W; q++)
        for (size_t j = 0; j < gb; j++)
            if (all[(size_t)q * gb + j] != (unsigned char)mix(k->salt ^ ((uint64_t)q << 40) ^ j))
                ZT_FAIL("all_gather of 3-byte elements: rank %d, piece %d, byte %zu", r, q, j);

    /* broadcast and gather from every root, odd byte counts */
    size_t bb = n * es + 3;
    unsigned char *b = xmalloc(bb), *g = xmalloc((size_t)W * bb);
    for (int root = 0; root < W; root++) {
        for (size_t j = 0; j < bb; j++)
            b[j] = r == root ? (unsigned char)mix(k->salt + (uint64_t)root * 7 + j) : 0x5A;
        ZT_OK(zr_comm_broadcast(c, b, bb, root));
        for (size_t j = 0; j < bb; j++)
            if (b[j] != (unsigned char)mix(k->salt + (uint64_t)root * 7 + j))
                ZT_FAIL("broadcast from %d: rank %d, byte %zu", root, r, j);
        for (size_t j = 0; j < bb; j++)
            b[j] = (unsigned char)mix(k->salt ^ ((uint64_t)r << 32) ^ j);
        memset(g, 0x77, (size_t)W * bb);
        ZT_OK(zr_comm_gather(c, b, r == root ? g : NULL, bb, root));
        if (r == root)
            for (int q = 0; q < W; q++)
                for (size_t j = 0; j < bb; j++)
                    if (g[(size_t)q * bb + j] !=
                        (unsigned char)mix(k->salt ^ ((uint64_t)q << 32) ^ j))
                        ZT_FAIL("gather at %d: piece of rank %d, byte %zu", root, q, j);
        ZT_OK(zr_comm_barrier(c));
    }
    /* a count of 0 is a no-op */
    ZT_OK(zr_comm_all_reduce(c, NULL, NULL, 0, dt));
    ZT_OK(zr_comm_barrier(c));
    free(in);
    free(in_copy);
    free(buf);
    free(exp);
    free(got);
    free(rs);
    free(ar);
    free(mine);
    free(all);
    free(b);
    free(g);
}

ZT_TEST(comm_every_op_every_world_exact_bits)
{
    const size_t sizes[] = {1, 7, 1009, 20011}; /* 20011 f32 > 64 KiB: several rounds */
    int order_matters = 0;
    for (int W = 1; W <= MAXW; W++)
        for (int d = 0; d < 2; d++)
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                op_case k = {d ? ZR_COMM_F64 : ZR_COMM_F32, sizes[s],
                             (uint64_t)(W * 100 + d * 10) + s};
                run_world(W, SEG, ops_rank, &k);
                /* the reference is order-sensitive: another order changes some bits */
                if (W >= 3 && sizes[s] >= 1009) {
                    size_t es = d ? 8 : 4, m = sizes[s];
                    char *a = xmalloc(m * es), *b = xmalloc(m * es);
                    expect_sum(a, k.dt, W, 0, m, k.salt, 0);
                    expect_sum(b, k.dt, W, 0, m, k.salt, 1);
                    order_matters += memcmp(a, b, m * es) != 0;
                    free(a);
                    free(b);
                }
            }
    ZT_CHECK_EQ(order_matters, 8);
}

/* the default segment (4 MiB per rank) and a count that needs several rounds of it */
ZT_TEST(comm_default_segment_large_counts)
{
    op_case k = {ZR_COMM_F32, 600001, 77}; /* about 4.6 MiB: 3 all_reduce windows */
    run_world(2, 0, ops_rank, &k);
}

/* ---------------------------------------------------------------- mismatched calls */

static void mismatch_rank(zr_comm *c, int r, int W, void *ctx)
{
    (void)W;
    int kind = *(int *)ctx;
    float x[8] = {0};
    if (kind == 0)
        ZT_ERR(zr_comm_all_reduce(c, x, x, r ? 6 : 5, ZR_COMM_F32), ZR_ECOMM,
               "collective mismatch");
    else if (kind == 1)
        ZT_ERR(r ? zr_comm_broadcast(c, x, 8, 0) : zr_comm_barrier(c), ZR_ECOMM,
               "collective mismatch");
    else
        ZT_ERR(zr_comm_all_reduce(c, x, x, 4, r ? ZR_COMM_F64 : ZR_COMM_F32), ZR_ECOMM,
               "collective mismatch");
    /* the communicator is dead from then on */
    ZT_ERR(zr_comm_barrier(c), ZR_ECOMM, "unusable after an earlier error");
}

ZT_TEST(comm_mismatched_calls_fail_on_every_rank)
{
    for (int kind = 0; kind < 3; kind++)
        run_world(2, SEG, mismatch_rank, &kind);
}

/* ---------------------------------------------------------------- the tcp backend */

/* the same checks over TCP (ranks on several nodes): the hub's sums in rank order give the
 * shm backend's bits; 200011 elements span several 256 KiB chunks */
ZT_TEST(comm_tcp_every_op_exact_bits)
{
    use_tcp = 1;
    const size_t sizes[] = {1, 1009, 200011};
    for (int W = 2; W <= 3; W++)
        for (int d = 0; d < 2; d++)
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
                op_case k = {d ? ZR_COMM_F64 : ZR_COMM_F32, sizes[s],
                             (uint64_t)(W * 100 + d * 10) + s + 5000};
                run_world(W, 0, ops_rank, &k);
            }
    for (int kind = 0; kind < 3; kind++)
        run_world(2, 0, mismatch_rank, &kind);
}

/* How a rank of the dead-peer tests (three ranks) begins: n floats of r + 1, all-reduced while
 * every rank is alive (6 everywhere); the buffer, for the call that meets the death. */
static float *sum_while_alive(zr_comm *c, int r, size_t n)
{
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(r + 1);
    ZT_OK(zr_comm_all_reduce(c, x, x, n, ZR_COMM_F32));
    ZT_CHECK(x[n - 1] == 6.0f);
    return x;
}

static void tcp_death_rank(zr_comm *c, int r, int W, void *ctx)
{
    (void)W;
    (void)ctx;
    size_t n = 300000; /* several chunks */
    float *x = sum_while_alive(c, r, n);
    if (r == 2)
        _exit(7);
    sleep_ms(200);
    double t0 = zt_now_s();
    ZT_ERR(zr_comm_all_reduce(c, x, x, n, ZR_COMM_F32), ZR_EIO,
           r == 0 ? "tcp: rank 2 is gone" : "rank 2 is gone");
    if (zt_now_s() - t0 > 3.0)
        ZT_FAIL("rank %d noticed the death after %.2f s", r, zt_now_s() - t0);
    ZT_ERR(zr_comm_barrier(c), ZR_EIO, "unusable after an earlier error");
    free(x);
}

ZT_TEST(comm_tcp_dead_peer_and_rendezvous_errors)
{
    use_tcp = 1;
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", zt_free_port());
    /* a rank that exits: rank 0 (the hub) names it, and tells rank 1 why */
    pid_t pids[3];
    fflush(NULL);
    for (int r = 0; r < 3; r++)
        if ((pids[r] = fork()) == 0) {
            zt_set_rank_env(NULL, r, 3);
            setenv("ZR_COMM_TCP", master, 1);
            zr_comm *c;
            ZT_OK(zr_comm_open_env(&c));
            tcp_death_rank(c, r, 3, NULL);
            _exit(0);
        }
    for (int r = 0; r < 3; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        ZT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == (r == 2 ? 7 : 0));
    }
    /* nobody listening, nobody connecting, a malformed address: errors within the timeout */
    zr_comm *c;
    setenv("ZR_COMM_TCP_TIMEOUT", "1", 1);
    snprintf(master, sizeof master, "127.0.0.1:%d", zt_free_port());
    setenv("ZR_COMM_TCP", master, 1);
    zt_set_rank_env(NULL, 1, 2);
    double t0 = zt_now_s();
    ZT_ERR(zr_comm_open_env(&c), ZR_EIO, "cannot reach rank 0");
    zt_set_rank_env(NULL, 0, 2);
    ZT_ERR(zr_comm_open_env(&c), ZR_EIO, "only 0 of the 1 other ranks connected");
    ZT_CHECK(zt_now_s() - t0 < 5.0);
    setenv("ZR_COMM_TCP", "no-port-here", 1);
    ZT_ERR(zr_comm_open_env(&c), ZR_EINVAL, "expected HOST:PORT");
    setenv("ZR_COMM_TCP", "127.0.0.1:99999", 1);
    ZT_ERR(zr_comm_open_env(&c), ZR_EINVAL, "1..65535");
    unsetenv("ZR_COMM_TCP_TIMEOUT");
    clear_env();
}

/* zr_comm_check: nothing on a healthy world; a peer gone is noticed without a collective */
static void check_rank(zr_comm *c, int r, int W, void *ctx)
{
    (void)W;
    (void)ctx;
    ZT_OK(zr_comm_check(c));
    ZT_OK(zr_comm_barrier(c));
    ZT_OK(zr_comm_check(c));
    ZT_OK(zr_comm_barrier(c)); /* rank 1 leaves only after rank 0's checks */
    if (r == 1)
        _exit(0); /* gone, between calls */
    double t0 = zt_now_s();
    while (zr_comm_check(c) == 0) {
        if (zt_now_s() - t0 > 3.0)
            ZT_FAIL("rank %d: the dead peer went unnoticed for 3 s", r);
        sleep_ms(20);
    }
    ZT_CHECK_EQ(zr_err_code(), ZR_EIO);
    ZT_CHECK(strstr(zr_err_msg(), use_tcp ? "rank 1 is gone" : "rank 1 (pid") != NULL);
    ZT_ERR(zr_comm_barrier(c), ZR_EIO, "unusable after an earlier error");
}

ZT_TEST(comm_check_notices_a_dead_peer)
{
    for (use_tcp = 0; use_tcp < 2; use_tcp++)
        run_world(2, SEG, check_rank, NULL);
    use_tcp = 0;
}

/* ---------------------------------------------------------------- argument and env errors */

ZT_TEST(comm_world_of_one_and_env_errors)
{
    clear_env();
    zr_comm *c;
    ZT_OK(zr_comm_open_env(&c));
    ZT_CHECK_EQ(zr_comm_world(c), 1);
    ZT_CHECK_EQ(zr_comm_rank(c), 0);
    ZT_ERR(zr_comm_broadcast(c, NULL, 4, 1), ZR_EINVAL, "root 1 outside the world of 1");
    ZT_ERR(zr_comm_all_reduce(c, NULL, NULL, 4, (zr_comm_dtype)7), ZR_EINVAL, "dtype");
    zr_comm_close(c);
    zr_comm_close(NULL);

    setenv("ZR_WORLD", "2", 1);
    ZT_ERR(zr_comm_open_env(&c), ZR_EINVAL, "ZR_RANK is not set");
    setenv("ZR_RANK", "2", 1);
    ZT_ERR(zr_comm_open_env(&c), ZR_EINVAL, "ZR_RANK=2 outside the world of 2");
    setenv("ZR_RANK", "x1", 1);
    ZT_ERR(zr_comm_open_env(&c), ZR_EINVAL, "ZR_RANK='x1'");
    setenv("ZR_RANK", "1", 1);
    ZT_ERR(zr_comm_open_env(&c), ZR_EINVAL, "ZR_COMM_SHM is not set");
    setenv("ZR_WORLD", "two", 1);
    ZT_ERR(zr_comm_open_env(&c), ZR_EINVAL, "ZR_WORLD='two'");
    setenv("ZR_WORLD", "0", 1);
    ZT_ERR(zr_comm_open_env(&c), ZR_EINVAL, "ZR_WORLD='0'");
    zt_set_rank_env("/zr-no-such-segment", 1, 2);
    ZT_ERR(zr_comm_open_env(&c), ZR_EIO, "cannot open the shared segment");

    char *name;
    ZT_OK(zr_comm_shm_create(&name, 3, SEG));
    ZT_CHECK(!strncmp(name, "/zr-", 4));
    zt_set_rank_env(name, 1, 2);
    ZT_ERR(zr_comm_open_env(&c), ZR_EIO, "world of 3");
    zt_set_rank_env(name, 1, 3);
    ZT_OK(zr_comm_open_env(&c));
    zr_comm *c2;
    ZT_ERR(zr_comm_open_env(&c2), ZR_EIO, "rank 1 was already opened by pid");
    zr_comm_close(c);
    zr_comm_shm_unlink(name);
    int fd = shm_open(name, O_RDONLY, 0);
    ZT_CHECK(fd < 0 && errno == ENOENT);
    free(name);
    /* a segment that is not ours */
    int f = shm_open("/zr-test-bogus", O_RDWR | O_CREAT | O_TRUNC, 0600);
    ZT_CHECK(f >= 0);
    ZT_CHECK(ftruncate(f, 8192) == 0);
    close(f);
    zt_set_rank_env("/zr-test-bogus", 0, 2);
    ZT_ERR(zr_comm_open_env(&c), ZR_EIO, "bad magic");
    shm_unlink("/zr-test-bogus");
    ZT_ERR(zr_comm_shm_create(&name, 0, 0), ZR_EINVAL, "world 0");
    clear_env();
}

/* ---------------------------------------------------------------- dead peers */

typedef struct {
    int mode; /* 0: rank 2 exits 7 between calls; 1: rank 2 is SIGKILLed inside a call */
} death_case;

static void death_rank(zr_comm *c, int r, int W, void *ctx)
{
    (void)W;
    const death_case *k = ctx;
    size_t n = 50000; /* several rounds */
    float *x = sum_while_alive(c, r, n);
    if (r == 2) {
        if (k->mode == 0)
            _exit(7);
        /* enter the next call at once and wait there to be killed */
        zr_comm_all_reduce(c, x, x, n, ZR_COMM_F32);
        _exit(99);
    }
    sleep_ms(300); /* mode 1: rank 2 is waiting inside all_reduce, then killed */
    double t0 = zt_now_s();
    ZT_ERR(zr_comm_all_reduce(c, x, x, n, ZR_COMM_F32), ZR_EIO, "rank 2 (pid");
    double dt = zt_now_s() - t0;
    ZT_CHECK(strstr(zr_err_msg(), "died"));
    if (k->mode == 0 && !strstr(zr_err_msg(), "exited with status 7"))
        fprintf(stderr, "  note: no exit status in '%s'\n", zr_err_msg());
    if (dt > 3.0)
        ZT_FAIL("rank %d noticed the death after %.2f s", r, dt);
    ZT_ERR(zr_comm_barrier(c), ZR_EIO, "unusable after an earlier error: rank 2");
    free(x);
}

static void death_world(int mode)
{
    char *name;
    ZT_OK(zr_comm_shm_create(&name, 3, SEG));
    death_case k = {mode};
    pid_t pids[3];
    fflush(NULL);
    for (int r = 0; r < 3; r++) {
        if ((pids[r] = fork()) == 0) {
            zr_comm *c = zt_open_rank(name, r, 3);
            death_rank(c, r, 3, &k);
            _exit(0);
        }
    }
    int st;
    if (mode == 1) {
        sleep_ms(150);
        kill(pids[2], SIGKILL);
        waitpid(pids[2], &st, 0); /* reaped: the pid is gone, not a zombie */
        ZT_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    }
    /* mode 0: rank 2 stays a zombie until ranks 0 and 1 are done */
    for (int r = 0; r < 2; r++) {
        waitpid(pids[r], &st, 0);
        ZT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    if (mode == 0) {
        waitpid(pids[2], &st, 0);
        ZT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 7);
    }
    zr_comm_shm_unlink(name);
    free(name);
}

ZT_TEST(comm_dead_peer_exit_fails_others_quickly) { death_world(0); }

ZT_TEST(comm_dead_peer_sigkill_mid_collective) { death_world(1); }

ZT_TEST(comm_launcher_abort_wakes_waiters)
{
    char *name;
    ZT_OK(zr_comm_shm_create(&name, 2, SEG));
    pid_t pids[2];
    fflush(NULL);
    for (int r = 0; r < 2; r++) {
        if ((pids[r] = fork()) == 0) {
            zr_comm *c = zt_open_rank(name, r, 2);
            if (r == 1) {
                sleep_ms(20000); /* alive, never calls: only the abort ends rank 0's wait */
                _exit(0);
            }
            double t0 = zt_now_s();
            ZT_ERR(zr_comm_barrier(c), ZR_EIO,
                   "barrier: rank 1 exited with status 3 (reported by the launcher)");
            double dt = zt_now_s() - t0;
            ZT_CHECK(dt > 0.25 && dt < 2.0);
            /* later calls fail too */
            float x = 1;
            ZT_ERR(zr_comm_all_reduce(c, &x, &x, 1, ZR_COMM_F32), ZR_EIO, "rank 1");
            _exit(0);
        }
    }
    sleep_ms(400);
    zr_comm_shm_abort(name, 1, 3 << 8);
    int st;
    waitpid(pids[0], &st, 0);
    ZT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    kill(pids[1], SIGKILL);
    waitpid(pids[1], &st, 0);
    /* a second abort does not replace the first */
    zr_comm_shm_abort(name, 0, 9);
    zr_comm_shm_unlink(name);
    zr_comm_shm_abort(name, 0, 9); /* unlinked: nothing to do */
    free(name);
}

ZT_TEST(comm_launcher_gone_fails_ranks)
{
    int p[2];
    ZT_CHECK(pipe(p) == 0);
    fflush(NULL);
    pid_t mid = fork();
    if (mid == 0) {
        /* the "launcher": creates the segment, starts two ranks, disappears */
        char *name;
        ZT_OK(zr_comm_shm_create(&name, 2, SEG));
        dprintf(p[1], "%s\n", name);
        for (int r = 0; r < 2; r++) {
            if (fork() == 0) {
                zr_comm *c = zt_open_rank(name, r, 2);
                if (r == 1) {
                    close(p[1]);
                    sleep_ms(20000);
                    _exit(0);
                }
                double t0 = zt_now_s();
                int rc = zr_comm_barrier(c);
                dprintf(p[1], "%d %.3f %s\n", rc, zt_now_s() - t0, zr_err_msg());
                _exit(0);
            }
        }
        sleep_ms(300);
        _exit(0);
    }
    close(p[1]);
    int st;
    waitpid(mid, &st, 0);
    char buf[2048] = "";
    size_t len = 0;
    double t0 = zt_now_s();
    while (count_of(buf, "\n") < 2 && zt_now_s() - t0 < 10) {
        ssize_t k = read(p[0], buf + len, sizeof buf - 1 - len);
        if (k <= 0)
            break;
        len += (size_t)k;
        buf[len] = 0;
    }
    buf[len] = 0;
    char name[256] = "";
    int rc = 0;
    double dt = 0;
    char msg[1024] = "";
    ZT_CHECK(sscanf(buf, "%255s %d %lf %1023[^\n]", name, &rc, &dt, msg) == 4);
    zr_comm_shm_unlink(name);
    if (rc != ZR_EIO || !strstr(msg, "the launcher (pid") || !strstr(msg, "is gone"))
        ZT_FAIL("rank 0 got %d '%s'", rc, msg);
    ZT_CHECK(dt < 3.0);
    close(p[0]);
}

/* ---------------------------------------------------------------- the launcher */

typedef struct {
    int rc, code;
    double secs;
    char *out, *err;
} launched;

/* zr_launch with our stdout and stderr going to files */
static launched launch(const zr_launch_opts *o, const char *const *argv)
{
    launched L = {0};
    fflush(NULL);
    int so = dup(1), se = dup(2);
    int fo = open("launch.out", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open("launch.err", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ZT_CHECK(so >= 0 && se >= 0 && fo >= 0 && fe >= 0);
    dup2(fo, 1);
    dup2(fe, 2);
    double t0 = zt_now_s();
    L.rc = zr_launch(&L.code, o, (char *const *)argv);
    L.secs = zt_now_s() - t0;
    fflush(NULL);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    close(fo);
    close(fe);
    L.out = slurp("launch.out");
    L.err = slurp("launch.err");
    ZT_CHECK(L.out && L.err);
    return L;
}

/* nproc ranks of /bin/sh -c script through launch, every rank's stdout shown when
 * log_all_ranks */
static launched launch_sh(int nproc, int log_all_ranks, const char *script)
{
    zr_launch_opts o = ZR_LAUNCH_OPTS_INIT;
    o.nproc = nproc;
    o.log_all_ranks = log_all_ranks;
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    return launch(&o, argv);
}

static void launched_free(launched *L)
{
    free(L->out);
    free(L->err);
}

static void show(const launched *L)
{
    fprintf(stderr, "  rc %d, exit code %d, %.2f s\n  --- stdout:\n%s  --- stderr:\n%s", L->rc,
            L->code, L->secs, L->out, L->err);
}

#define EXPECT(L, cond)                                                                        \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            show(&(L));                                                                        \
            ZT_FAIL("check failed: %s", #cond);                                                \
        }                                                                                      \
    } while (0)

ZT_TEST(launch_runs_ranks_with_prefixed_output)
{
    struct sigaction before, after;
    sigaction(SIGTERM, NULL, &before);
    launched L = launch_sh(3, 0,
                           "echo \"out $ZR_RANK $ZR_WORLD $ZR_COMM_SHM\"; echo \"err $ZR_RANK\" >&2;"
                           " ls -l /proc/$$/fd; printf \"partial $ZR_RANK\"");
    sigaction(SIGTERM, NULL, &after);
    EXPECT(L, L.rc == 0 && L.code == 0);
    /* stdout: rank 0 only, prefixed, the partial line completed */
    EXPECT(L, !strncmp(L.out, "[rank 0] out 0 3 /zr-", 21));
    EXPECT(L, strstr(L.out, "\n[rank 0] partial 0\n"));
    EXPECT(L, !strstr(L.out, "[rank 1]") && !strstr(L.out, "[rank 2]"));
    /* every line of stdout is prefixed */
    for (const char *p = L.out; *p; p = strchr(p, '\n') + 1)
        EXPECT(L, !strncmp(p, "[rank 0] ", 9));
    /* the rank has its two pipes and /dev/null on stdin, nothing else of ours or of the
     * caller's (launch.out and launch.err are inheritable here); sh may keep fds of its own
     * from 10 up */
    EXPECT(L, count_of(L.out, "pipe:[") == 2);
    EXPECT(L, strstr(L.out, " 0 -> /dev/null\n"));
    EXPECT(L, strstr(L.out, " 1 -> pipe:[") && strstr(L.out, " 2 -> pipe:["));
    EXPECT(L, !strstr(L.out, "launch.out") && !strstr(L.out, "launch.err"));
    for (int fd = 3; fd < 10; fd++) {
        char s[32];
        snprintf(s, sizeof s, " %d -> ", fd);
        EXPECT(L, !strstr(L.out, s));
    }
    /* stderr: every rank */
    for (int r = 0; r < 3; r++) {
        char want[64];
        snprintf(want, sizeof want, "[rank %d] err %d\n", r, r);
        EXPECT(L, strstr(L.err, want));
    }
    EXPECT(L, !strstr(L.err, "zrun:"));
    /* the segment is gone */
    char name[128];
    ZT_CHECK(sscanf(L.out, "[rank 0] out 0 3 %127s", name) == 1);
    ZT_CHECK(shm_open(name, O_RDONLY, 0) < 0 && errno == ENOENT);
    ZT_CHECK(before.sa_handler == after.sa_handler);
    launched_free(&L);
}

ZT_TEST(launch_log_all_ranks_and_single_rank)
{
    launched L = launch_sh(4, 1, "echo line1 $ZR_RANK; printf 'no newline'");
    EXPECT(L, L.rc == 0 && L.code == 0);
    for (int r = 0; r < 4; r++) {
        char want[64];
        snprintf(want, sizeof want, "[rank %d] line1 %d\n", r, r);
        EXPECT(L, strstr(L.out, want));
        snprintf(want, sizeof want, "[rank %d] no newline\n", r);
        EXPECT(L, strstr(L.out, want));
    }
    EXPECT(L, count_of(L.out, "\n") == 8);
    launched_free(&L);

    /* one rank: no prefix, no segment, the caller's ZR_COMM_SHM removed */
    setenv("ZR_COMM_SHM", "/stale", 1);
    L = launch_sh(1, 0, "echo \"$ZR_RANK $ZR_WORLD ${ZR_COMM_SHM-unset}\"; echo e >&2");
    EXPECT(L, L.rc == 0 && L.code == 0);
    EXPECT(L, !strcmp(L.out, "0 1 unset\n"));
    EXPECT(L, !strcmp(L.err, "e\n"));
    launched_free(&L);
    unsetenv("ZR_COMM_SHM");

    /* a single failing rank: its code, no message of ours */
    L = launch_sh(1, 0, "exit 4");
    EXPECT(L, L.rc == 0 && L.code == 4 && !*L.err);
    launched_free(&L);
}

ZT_TEST(launch_failing_rank_stops_the_others)
{
    /* ranks 0 and 2 would sleep 60 s (sh forks sleep: the process group is signalled) */
    launched L = launch_sh(3, 0,
                           "if [ $ZR_RANK = 1 ]; then sleep 0.2; echo dying >&2; exit 3; fi; "
                           "sleep 60; echo survived");
    EXPECT(L, L.rc == 0 && L.code == 3);
    EXPECT(L, L.secs < 15.0);
    EXPECT(L, strstr(L.err, "zrun: rank 1 exited with status 3; stopping the other 2 ranks\n"));
    EXPECT(L, strstr(L.err, "[rank 1] dying\n") &&
                  strstr(L.err, "[rank 1] dying\n") < strstr(L.err, "zrun: rank 1"));
    EXPECT(L, !strstr(L.out, "survived"));
    EXPECT(L, count_of(L.err, "zrun:") == 1);
    launched_free(&L);
}

/* The launcher names the rank whose error the others relay ("error: rank K: ..."), not the
 * rank it saw exit first; an error every rank printed is one line with "(all N ranks)" on the
 * error line, not on its hint (issue 24). */
ZT_TEST(launch_blames_the_rank_the_error_came_from)
{
    /* rank 0 failed; rank 1 relays its error and exits first */
    launched L = launch_sh(2, 0,
                           "echo 'zrun: error: rank 0: boom' >&2; echo 'hint: do this' >&2; "
                           "if [ $ZR_RANK = 0 ]; then sleep 0.2; fi; exit 2");
    EXPECT(L, L.rc == 0 && L.code == 2);
    EXPECT(L, strstr(L.err, "zrun: error: rank 0: boom (all 2 ranks)\nhint: do this\n"));
    EXPECT(L, count_of(L.err, "boom") == 1 && count_of(L.err, "do this") == 1);
    EXPECT(L, strstr(L.err, "zrun: rank 0 failed first (the error above); rank 1 exited with "
                            "status 2"));
    EXPECT(L, !strstr(L.err, "zrun: rank 1 exited"));
    launched_free(&L);
    /* every rank found the same problem: said once, and so is who failed */
    L = launch_sh(3, 0,
                  "echo 'zrun: error: bad option' >&2; echo 'hint: fix it' >&2; "
                  "if [ $ZR_RANK != 2 ]; then sleep 0.2; fi; exit 2");
    EXPECT(L, L.rc == 0 && L.code == 2);
    EXPECT(L, strstr(L.err, "zrun: error: bad option (all 3 ranks)\nhint: fix it\n"));
    EXPECT(L, !strstr(L.err, "fix it (all") && count_of(L.err, "bad option") == 1);
    EXPECT(L, strstr(L.err, "zrun: all 3 ranks failed with the error above (rank 2 exited with "
                            "status 2 first)"));
    EXPECT(L, !strstr(L.err, "zrun: rank 2 exited"));
    launched_free(&L);
    /* errors of their own, different: each said, the first exit named */
    L = launch_sh(2, 0,
                  "echo \"zrun: error: mine is $ZR_RANK\" >&2; "
                  "if [ $ZR_RANK = 0 ]; then sleep 0.2; fi; exit 3");
    EXPECT(L, L.code == 3);
    EXPECT(L, strstr(L.err, "[rank 0] zrun: error: mine is 0\n") &&
                  strstr(L.err, "[rank 1] zrun: error: mine is 1\n"));
    EXPECT(L, strstr(L.err, "zrun: rank 1 exited with status 3"));
    launched_free(&L);
}

/* a rank that fails, run by the launcher: the status and time it ends with, what it says */
typedef struct {
    double grace_s;
    const char *argv[4];
    int code;
    double min_s, max_s;
    const char *says[2];
} launch_death;

ZT_TEST(launch_grace_then_sigkill_and_signal_deaths)
{
    static const launch_death cases[] = {
        /* rank 0 ignores SIGTERM (so does its sleep): SIGKILL after the grace */
        {0.5,
         {"/bin/sh", "-c",
          "if [ $ZR_RANK = 1 ]; then sleep 0.2; exit 1; fi; trap '' TERM; sleep 60", NULL},
         1, 0.6, 5.0,
         {"zrun: rank 1 exited with status 1; stopping the other 1 rank\n",
          "zrun: rank 0 still running 0.5 s after SIGTERM: sending SIGKILL"}},
        /* a rank killed by a signal: 128 + N */
        {5.0, {"/bin/sh", "-c", "if [ $ZR_RANK = 1 ]; then sleep 0.1; kill -9 $$; fi; sleep 60", NULL},
         128 + 9, 0, 5.0, {"zrun: rank 1 was killed by signal 9 (SIGKILL)", "zrun: rank 1"}},
        /* a program that cannot be executed */
        {5.0, {"/nonexistent/zr-prog", "x", NULL}, 127, 0, 60.0,
         {"cannot execute /nonexistent/zr-prog: No such file or directory", "zrun: rank "}},
    };
    zr_launch_opts o = ZR_LAUNCH_OPTS_INIT;
    o.nproc = 2;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const launch_death *k = &cases[i];
        o.kill_grace_s = k->grace_s;
        launched L = launch(&o, k->argv);
        EXPECT(L, L.rc == 0 && L.code == k->code);
        EXPECT(L, L.secs >= k->min_s && L.secs < k->max_s);
        EXPECT(L, strstr(L.err, k->says[0]) && strstr(L.err, k->says[1]));
        launched_free(&L);
    }

    /* options the launcher refuses */
    int code;
    o.nproc = 0;
    ZT_ERR(zr_launch(&code, &o, (char *const *)cases[0].argv), ZR_EINVAL, "nproc 0");
    o.nproc = 2;
    const char *none[] = {NULL};
    ZT_ERR(zr_launch(&code, &o, (char *const *)none), ZR_EINVAL, "no program");
}

ZT_TEST(launch_forwards_signals)
{
    pid_t me = getpid();
    fflush(NULL);
    pid_t helper = fork();
    if (helper == 0) {
        sleep_ms(500);
        kill(me, SIGTERM);
        _exit(0);
    }
    launched L = launch_sh(2, 1, "trap 'echo got-term; exit 0' TERM; sleep 30 & wait");
    waitpid(helper, NULL, 0);
    EXPECT(L, L.rc == 0 && L.code == 0);
    EXPECT(L, strstr(L.out, "[rank 0] got-term\n") && strstr(L.out, "[rank 1] got-term\n"));
    EXPECT(L, L.secs < 10.0);
    /* our SIGTERM disposition is back to the default */
    struct sigaction sa;
    sigaction(SIGTERM, NULL, &sa);
    ZT_CHECK(sa.sa_handler == SIG_DFL);
    launched_free(&L);
}

/* ---------------------------------------------------------------- launcher + communicator */

/*
 * The test binary launched as real ranks: under zr_launch, ZT_COMM_E2E is set and this test
 * acts as a rank (zt runs it in a forked child, so the process that opens the communicator is
 * not the one the launcher started, as with any program that forks).
 *   ok:    every rank all_reduces and checks the sum; exit code 0.
 *   abort: rank 2 exits 5 before it opens the communicator; ranks 0 and 1, waiting in
 *          all_reduce, learn it from the launcher's abort record and write what they got to
 *          files in ZT_COMM_DIR.
 */
/* a rank's outcome for the test's parent: "rc message" in dir/rank<r>.txt, whole or absent */
static void write_result(const char *dir, int r, int rc)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/rank%d.txt", dir, r);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    ZT_CHECK(f);
    fprintf(f, "%d %s\n", rc, zr_err_msg());
    fclose(f);
    rename(tmp, path);
}

static void e2e_rank(const char *mode)
{
    zr_comm *c;
    int r = atoi(getenv("ZR_RANK"));
    const char *dir = getenv("ZT_COMM_DIR");
    if (!strcmp(mode, "abort") && r == 2) {
        sleep_ms(500);
        _exit(5);
    }
    ZT_OK(zr_comm_open_env(&c));
    int W = zr_comm_world(c);
    double x[100];
    for (int i = 0; i < 100; i++)
        x[i] = r * 1000 + i;
    int rc = zr_comm_all_reduce(c, x, x, 100, ZR_COMM_F64);
    if (!strcmp(mode, "ok")) {
        ZT_OK(rc);
        for (int i = 0; i < 100; i++)
            ZT_CHECK(x[i] == 1000.0 * W * (W - 1) / 2 + (double)W * i);
        ZT_OK(zr_comm_barrier(c));
    } else
        write_result(dir, r, rc);
    zr_comm_close(c);
}

/* under the launcher (ZT_COMM_E2E and ZR_WORLD set) this process is a rank: act as one, say 1 */
static int e2e_as_rank(void)
{
    const char *mode = getenv("ZT_COMM_E2E");
    if (!mode || !getenv("ZR_WORLD"))
        return 0;
    e2e_rank(mode);
    return 1;
}

static launched e2e_launch(const char *test, const char *mode, int nproc)
{
    char cwd[4096];
    ZT_CHECK(getcwd(cwd, sizeof cwd));
    setenv("ZT_COMM_E2E", mode, 1);
    setenv("ZT_COMM_DIR", cwd, 1);
    zr_launch_opts o = ZR_LAUNCH_OPTS_INIT;
    o.nproc = nproc;
    const char *argv[] = {"/proc/self/exe", test, NULL};
    launched L = launch(&o, argv);
    unsetenv("ZT_COMM_E2E");
    return L;
}

ZT_TEST(launch_e2e_ok)
{
    if (e2e_as_rank())
        return;
    launched L = e2e_launch("launch_e2e_ok", "ok", 3);
    EXPECT(L, L.rc == 0 && L.code == 0);
    EXPECT(L, strstr(L.out, "[rank 0] PASS launch_e2e_ok"));
    EXPECT(L, strstr(L.out, "[rank 0] 1 passed, 0 failed"));
    launched_free(&L);
}

ZT_TEST(launch_e2e_abort)
{
    if (e2e_as_rank())
        return;
    launched L = e2e_launch("launch_e2e_abort", "abort", 3);
    /* rank 2's zt reports its test's exit 5 as a failure: zt exits 1 */
    EXPECT(L, L.rc == 0 && L.code == 1);
    EXPECT(L, strstr(L.err, "zrun: rank 2 exited with status 1"));
    EXPECT(L, L.secs < 10.0);
    /* ranks 0 and 1 (zt's test children, which the launcher's SIGTERM to zt does not reach)
     * failed their all_reduce naming rank 2 */
    for (int r = 0; r < 2; r++) {
        char path[64];
        snprintf(path, sizeof path, "rank%d.txt", r);
        char *s = NULL;
        double t0 = zt_now_s();
        while (!(s = slurp(path)) && zt_now_s() - t0 < 5)
            sleep_ms(20);
        if (!s)
            EXPECT(L, !"rank result file");
        int rc = 0;
        if (sscanf(s, "%d", &rc) != 1 || rc != ZR_EIO ||
            (!strstr(s, "rank 2 exited with status 1 (reported by the launcher)") &&
             !strstr(s, "rank 2 exited with status 5 (reported")))
            ZT_FAIL("rank %d: %s", r, s);
        free(s);
    }
    launched_free(&L);
}

/* issue 13: a launcher killed by SIGKILL leaves its segment in /dev/shm; the next launch (any
 * zr_comm_shm_create) reclaims it, and never a live launcher's */
ZT_TEST(comm_stale_segments_are_reclaimed)
{
    int pfd[2];
    ZT_CHECK(pipe(pfd) == 0);
    pid_t p = fork();
    ZT_CHECK(p >= 0);
    if (p == 0) { /* a "launcher" that dies without unlinking */
        char *nm = NULL;
        if (zr_comm_shm_create(&nm, 2, 0) != 0)
            _exit(1);
        (void)!write(pfd[1], nm, strlen(nm) + 1);
        pause();
        _exit(0);
    }
    close(pfd[1]);
    char dead[64] = {0};
    ZT_CHECK(read(pfd[0], dead, sizeof dead - 1) > 0);
    close(pfd[0]);
    char *live = NULL;
    ZT_OK(zr_comm_shm_create(&live, 2, 0)); /* ours, alive */
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", dead);
    ZT_CHECK(access(path, F_OK) == 0);
    kill(p, SIGKILL);
    ZT_CHECK(waitpid(p, NULL, 0) == p);
    ZT_CHECK(access(path, F_OK) == 0); /* left behind */
    ZT_CHECK(zr_comm_shm_reclaim() >= 1);
    ZT_CHECK(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "/dev/shm%s", live);
    ZT_CHECK(access(path, F_OK) == 0); /* a live creator's segment stays */
    zr_comm_shm_unlink(live);
    free(live);
}

/* the environment of rank r of two in job `job` meeting over TCP at master */
static void tcp_rank_env(const char *master, const char *job, int r)
{
    zt_set_rank_env(NULL, r, 2);
    setenv("ZR_COMM_TCP", master, 1);
    setenv("ZR_JOB_ID", job, 1);
}

/* a child that is rank r of job `job`: opens the communicator, meets at a barrier, exits 0 */
static pid_t tcp_job_rank(const char *master, const char *job, int r)
{
    pid_t p = fork();
    if (p == 0) {
        tcp_rank_env(master, job, r);
        zr_comm *c;
        ZT_OK(zr_comm_open_env(&c));
        ZT_OK(zr_comm_barrier(c));
        zr_comm_close(c);
        _exit(0);
    }
    return p;
}

/* issue 13: the TCP rendezvous turns away a rank of another job (another job token) and a
 * client that connects and says nothing, without waiting on it, and the job's own ranks meet */
ZT_TEST(comm_tcp_rendezvous_turns_away_strangers)
{
    char master[64];
    int port = zt_free_port();
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    double t0 = zt_now_s();
    fflush(NULL);
    pid_t hub = tcp_job_rank(master, "job-a", 0);
    /* a silent client: connects and sends nothing */
    int s = -1;
    for (int i = 0; i < 100 && s < 0; i++) {
        s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
            close(s);
            s = -1;
            sleep_ms(20);
        }
    }
    ZT_CHECK(s >= 0);
    /* rank 1 of another job on the same port: turned away, it fails */
    pid_t other = fork();
    if (other == 0) {
        tcp_rank_env(master, "job-b", 1);
        setenv("ZR_COMM_TCP_TIMEOUT", "3", 1);
        zr_comm *c;
        _exit(zr_comm_open_env(&c) == 0 ? 0 : 3);
    }
    int st;
    ZT_CHECK(waitpid(other, &st, 0) == other);
    ZT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3);
    /* the job's own rank 1 joins at once, the silent client still connected */
    pid_t mine = tcp_job_rank(master, "job-a", 1);
    ZT_CHECK(waitpid(mine, &st, 0) == mine && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ZT_CHECK(waitpid(hub, &st, 0) == hub && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(s);
    if (zt_now_s() - t0 > 5.0)
        ZT_FAIL("the rendezvous took %.1f s: a silent client held it up", zt_now_s() - t0);
    clear_env();
}

/* zt_free_port holds the port it returns until the test ends, so that no other process takes
 * it before rank 0 listens (the TCP tests lost it now and then when another test's connection or
 * bind got it first: rank 0 then failed with "cannot listen on port ...: Address already in
 * use"): a plain bind of it fails, a bind to port 0 is never given it, and rank 0's hub still
 * listens on it and its job meets there. */
ZT_TEST(comm_tcp_free_port_is_held_for_rank_0)
{
    int port = zt_free_port();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    ZT_CHECK(s >= 0);
    ZT_CHECK(bind(s, (struct sockaddr *)&a, sizeof a) < 0 && errno == EADDRINUSE);
    close(s);
    for (int i = 0; i < 1000; i++) {
        s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in any = {.sin_family = AF_INET};
        any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof any;
        ZT_CHECK(s >= 0 && bind(s, (struct sockaddr *)&any, sizeof any) == 0);
        ZT_CHECK(getsockname(s, (struct sockaddr *)&any, &len) == 0);
        ZT_CHECK(ntohs(any.sin_port) != port);
        close(s);
    }
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    fflush(NULL);
    pid_t r0 = tcp_job_rank(master, "job", 0), r1 = tcp_job_rank(master, "job", 1);
    int st;
    ZT_CHECK(waitpid(r0, &st, 0) == r0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ZT_CHECK(waitpid(r1, &st, 0) == r1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    clear_env();
}

/* ---------------------------------------------------------------- the mpi backend */

/*
 * The test binary as MPI ranks (mpirun -np W zt TEST with ZT_COMM_MPI set): ZR_COMM=mpi, as
 * zrun sets it. ops: every op of every case, exact bits (as the shm backend's test);
 * mismatch: rank 0 all_reduces while the others call barrier: every rank fails with ZR_ECOMM
 * naming both calls, and writes what it got to rank<r>.txt in ZT_COMM_DIR.
 */
static void mpi_rank(const char *mode)
{
    setenv("ZR_COMM", "mpi", 1);
    zr_comm *c;
    ZT_OK(zr_comm_open_env(&c));
    int r = zr_comm_rank(c), W = zr_comm_world(c);
    ZT_CHECK_EQ(r, atoi(getenv("OMPI_COMM_WORLD_RANK")));
    ZT_CHECK_EQ(W, atoi(getenv("OMPI_COMM_WORLD_SIZE")));
    if (!strcmp(mode, "ops")) {
        static const size_t ns[] = {1, 7, 1009, 20011};
        for (int d = 0; d < 2; d++)
            for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
                op_case k = {d ? ZR_COMM_F64 : ZR_COMM_F32, ns[i], 1000 + i * 2 + (size_t)d};
                ops_rank(c, r, W, &k);
            }
        ZT_OK(zr_comm_check(c));
        zr_comm_close(c);
        return;
    }
    double x[10] = {0};
    int rc = r == 0 ? zr_comm_all_reduce(c, x, x, 10, ZR_COMM_F64) : zr_comm_barrier(c);
    write_result(getenv("ZT_COMM_DIR"), r, rc);
    /* later calls fail with the same error; check says so too */
    ZT_CHECK_EQ(zr_comm_barrier(c), ZR_ECOMM);
    ZT_CHECK_EQ(zr_comm_check(c), ZR_ECOMM);
    zr_comm_close(c);
}

/* mpirun -np W [mca] zt test (mode in ZT_COMM_MPI); its exit status, output in log */
static int mpi_world(const char *test, const char *mode, int W, const char *mca, const char *log)
{
    if (system("command -v mpirun >/dev/null 2>&1") != 0)
        ZT_SKIP("no mpirun (make deps installs openmpi-bin)");
    char cwd[4096], exe[4096], cmd[12000];
    ZT_CHECK(getcwd(cwd, sizeof cwd));
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ZT_CHECK(k > 0);
    exe[k] = 0;
    snprintf(cmd, sizeof cmd, ZT_MPI_ENV "ZT_COMM_MPI=%s ZT_COMM_DIR=%s timeout 120 mpirun "
             "--oversubscribe --allow-run-as-root --bind-to none -np %d %s %s %s > %s 2>&1", mode,
             cwd, W, mca, exe, test, log);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

ZT_TEST(comm_mpi_every_op_exact_bits)
{
    const char *mode = getenv("ZT_COMM_MPI");
    if (mode && getenv("OMPI_COMM_WORLD_RANK")) {
        mpi_rank(mode);
        return;
    }
    /* 2 ranks over shared memory with one window per call; 4 over TCP only, in windows of
     * 1 KiB (every call of the larger counts streams) */
    static const struct {
        int W;
        const char *mca;
    } runs[] = {{2, ""}, {4, "--mca btl tcp,self -x ZR_COMM_MPI_WINDOW=1024"}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        int st = mpi_world("comm_mpi_every_op_exact_bits", "ops", runs[i].W, runs[i].mca,
                           "ops.log");
        char *s = slurp("ops.log");
        if (st != 0 || count_of(s, "1 passed, 0 failed") != runs[i].W)
            ZT_FAIL("mpirun -np %d %s: status %d:\n%s", runs[i].W, runs[i].mca, st, s);
        free(s);
    }
}

ZT_TEST(comm_mpi_mismatched_calls_fail_on_every_rank)
{
    const char *mode = getenv("ZT_COMM_MPI");
    if (mode && getenv("OMPI_COMM_WORLD_RANK")) {
        mpi_rank(mode);
        return;
    }
    double t0 = zt_now_s();
    mpi_world("comm_mpi_mismatched_calls_fail_on_every_rank", "mismatch", 3, "", "mm.log");
    ZT_CHECK(zt_now_s() - t0 < 60);
    for (int r = 0; r < 3; r++) {
        char path[32];
        snprintf(path, sizeof path, "rank%d.txt", r);
        char *s = slurp(path);
        if (!s)
            ZT_FAIL("rank %d wrote nothing:\n%s", r, slurp("mm.log"));
        int rc = 0;
        if (sscanf(s, "%d", &rc) != 1 || rc != ZR_ECOMM || !strstr(s, "collective mismatch") ||
            !strstr(s, "all_reduce(n=10") || !strstr(s, "barrier(n=0"))
            ZT_FAIL("rank %d: %s", r, s);
        free(s);
    }
}
