/*
 * bench_ckpt.c: end-to-end throughput of the ckpt library on one filesystem, in one run.
 *
 * A layout of several groups with three f32 states (param, exp_avg, exp_avg_sq) totalling
 * --gib GiB is split over --shards ranks and filled once with non-zero pseudo-random bytes
 * (the virtual disk writes zeros faster). Then, timed separately:
 *   save    zck_staging_create + every rank's writer (open/put/finish; whole shards spread over
 *           --jobs pthreads) + zck_commit; bytes = sum of the shard files' sizes.
 *   verify  zck_verify, full hashing, jobs = --jobs.
 *   load    zck_reader_open + zck_reader_read of every (group, state) in full with verify=1,
 *           jobs = --jobs, into buffers touched beforehand; compared with the source afterwards.
 * Page caches are dropped before verify and load when the system allows it (cold_cache=).
 * Output: one key=value line per phase. Uses only the public API (zck.h).
 */
#include "zck.h"

#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define N_GROUPS 8
#define N_STATES 3

static const char *run_dir;
static int run_dir_made;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    if (remove(path) < 0 && errno != ENOENT)
        fprintf(stderr, "bench_ckpt: warning: cannot remove %s: %s\n", path, strerror(errno));
    return 0;
}

static void cleanup(void)
{
    if (run_dir && run_dir_made)
        nftw(run_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void die_lib(const char *what, const char *msg)
{
    fprintf(stderr, "bench_ckpt: error: %s%s%s\n", what ? what : "", what ? ": " : "", msg);
    cleanup();
    exit(1);
}

#define TRY(x)                                                                                 \
    do {                                                                                       \
        if ((x) < 0)                                                                           \
            die_lib(NULL, zr_err_msg());                                                       \
    } while (0)

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "bench_ckpt: error: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    cleanup();
    exit(1);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Page-aligned, as the engine's parameter and optimizer arenas are: the reader then reads
 * straight into them instead of copying through its staging ring. */
static void *xmalloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n ? n : 1))
        die("out of memory (%s)", "allocating benchmark buffers");
    return p;
}

/* xorshift64*, never producing a zero byte, so the disk sees incompressible, non-zero data */
static void fill_random(unsigned char *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        uint64_t v = x * 0x2545F4914F6CDD1Dull;
        v |= 0x0101010101010101ull; /* every byte odd: no zero bytes */
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (unsigned char)(0x5Bu + i);
}

/* ---------------------------------------------------------------- parallel save */

typedef struct {
    const char *staging;
    const zck_layout *L;
    uint32_t shards;
    unsigned char *(*src)[N_STATES];
    zck_shard **out;
    atomic_uint next;
    atomic_int stop;
    pthread_mutex_t mu;
    int rc;
    char msg[1024];
    atomic_int direct;  /* stays 1 while every writer used O_DIRECT */
} save_ctx;

static int write_rank(save_ctx *c, uint32_t rank)
{
    zck_writer *w;
    int rc = zck_writer_open(&w, c->staging, c->L, c->shards, rank, NULL);
    if (rc < 0)
        return rc;
    for (size_t g = 0; g < zck_layout_n_groups(c->L) && !rc; g++)
        for (size_t s = 0; s < zck_layout_n_states(c->L) && !rc; s++) {
            uint64_t a, n;
            zck_partition(zck_layout_group_numel(c->L, g), c->shards, rank,
                          zck_layout_partition_align(c->L), &a, &n);
            if (!n)
                continue;
            size_t dsz = zck_dtype_size(zck_layout_state_dtype(c->L, s));
            rc = zck_writer_put(w, g, s, a, n, c->src[g][s] + a * dsz);
        }
    if (!rc) {
        if (!zck_writer_direct(w))
            atomic_store(&c->direct, 0);
        rc = zck_writer_finish(w, &c->out[rank]);
    }
    zck_writer_free(w);
    return rc;
}

static void *save_worker(void *arg)
{
    save_ctx *c = arg;
    while (!atomic_load(&c->stop)) {
        unsigned r = atomic_fetch_add(&c->next, 1);
        if (r >= c->shards)
            break;
        int rc = write_rank(c, r);
        if (rc < 0) {
            pthread_mutex_lock(&c->mu);
            if (!c->rc) {
                c->rc = rc;
                snprintf(c->msg, sizeof c->msg, "rank %u: %s", r, zr_err_msg());
            }
            pthread_mutex_unlock(&c->mu);
            atomic_store(&c->stop, 1);
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- cache dropping */

static int drop_caches(void)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f)
        return 0;
    int ok = fputs("3\n", f) >= 0;
    if (fclose(f) != 0)
        ok = 0;
    return ok;
}

static unsigned long parse_num(const char *opt, const char *v, unsigned long lo, unsigned long hi)
{
    char *end;
    errno = 0;
    unsigned long x = v ? strtoul(v, &end, 10) : 0;
    if (!v || errno || *end || x < lo || x > hi)
        die("bad value for %s", opt);
    return x;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_ckpt DIR [--gib N (default 1)] [--shards 4] [--jobs 2]\n"
                    "DIR is the run directory: created, and removed at the end; it must not "
                    "exist or be empty.\n");
    exit(2);
}

int main(int argc, char **argv)
{
    unsigned long gib = 1, shards = 4, jobs = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gib"))
            gib = parse_num("--gib", i + 1 < argc ? argv[++i] : NULL, 1, 1024);
        else if (!strcmp(argv[i], "--shards"))
            shards = parse_num("--shards", i + 1 < argc ? argv[++i] : NULL, 1, 4096);
        else if (!strcmp(argv[i], "--jobs"))
            jobs = parse_num("--jobs", i + 1 < argc ? argv[++i] : NULL, 1, 256);
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            usage();
        else if (argv[i][0] == '-' || run_dir)
            usage();
        else
            run_dir = argv[i];
    }
    if (!run_dir)
        usage();
    struct stat st;
    if (stat(run_dir, &st) == 0) {
        if (rmdir(run_dir) < 0)
            die("%s exists and is not an empty directory; refusing to use (and remove) it",
                run_dir);
    }
    run_dir_made = 1;

    /* ---- layout: N_GROUPS groups, numel a multiple of shards * partition align so every
     * rank's share is equal, total close to gib GiB over the three f32 states */
    zck_layout *L;
    TRY(zck_layout_new(&L));
    TRY(zck_layout_add_state(L, "param", ZCK_F32));
    TRY(zck_layout_add_state(L, "exp_avg", ZCK_F32));
    TRY(zck_layout_add_state(L, "exp_avg_sq", ZCK_F32));
    uint64_t total_bytes = (uint64_t)gib << 30;
    uint64_t unit = (uint64_t)shards * zck_layout_partition_align(L);
    uint64_t per_group = total_bytes / (N_STATES * 4) / N_GROUPS / unit * unit;
    if (!per_group)
        die("%s: too many shards for the size", "--shards");
    for (size_t g = 0; g < N_GROUPS; g++) {
        char name[32];
        size_t gi;
        snprintf(name, sizeof name, "layers.%zu", g);
        TRY(zck_layout_add_group(L, &gi, name));
        /* a weight matrix and a bias, as a block of a model would have */
        uint64_t cols = 1024, rows = (per_group - cols) / cols;
        uint64_t wshape[2] = {rows, cols}, bshape[1] = {per_group - rows * cols};
        snprintf(name, sizeof name, "layers.%zu.weight", g);
        TRY(zck_layout_add_tensor(L, gi, name, ZCK_F32, 2, wshape));
        snprintf(name, sizeof name, "layers.%zu.bias", g);
        TRY(zck_layout_add_tensor(L, gi, name, ZCK_F32, 1, bshape));
    }

    /* ---- sources (filled once) and load destinations (touched once) */
    unsigned char *src[N_GROUPS][N_STATES], *dst[N_GROUPS][N_STATES];
    uint64_t data_bytes = 0;
    for (size_t g = 0; g < N_GROUPS; g++)
        for (size_t s = 0; s < N_STATES; s++) {
            size_t n = (size_t)per_group * 4;
            src[g][s] = xmalloc(n);
            fill_random(src[g][s], n, g * N_STATES + s + 1);
            dst[g][s] = xmalloc(n);
            memset(dst[g][s], 0, n);
            data_bytes += n;
        }
    printf("config gib=%lu shards=%lu jobs=%lu groups=%d states=%d data_bytes=%llu dir=%s\n",
           gib, shards, jobs, N_GROUPS, N_STATES, (unsigned long long)data_bytes, run_dir);
    fflush(stdout);

    /* ---- save */
    zck_shard **sh = calloc(shards, sizeof *sh);
    if (!sh)
        die("out of memory (%s)", "shards");
    double t0 = now();
    char *staging;
    TRY(zck_staging_create(&staging, run_dir, 1, 0xbe4c4));
    save_ctx sc = {.staging = staging, .L = L, .shards = (uint32_t)shards, .src = src,
                   .out = sh};
    atomic_init(&sc.direct, 1);
    atomic_init(&sc.next, 0);
    atomic_init(&sc.stop, 0);
    pthread_mutex_init(&sc.mu, NULL);
    unsigned nth = jobs < shards ? (unsigned)jobs : (unsigned)shards;
    pthread_t *th = calloc(nth, sizeof *th);
    if (!th)
        die("out of memory (%s)", "threads");
    for (unsigned i = 0; i < nth; i++)
        if (pthread_create(&th[i], NULL, save_worker, &sc))
            die("pthread_create failed (%s)", "save");
    for (unsigned i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    if (sc.rc)
        die_lib(NULL, sc.msg);
    double t_write = now() - t0;
    zck_commit_opts co = ZCK_COMMIT_OPTS_INIT;
    co.step = 1;
    co.world = (uint32_t)shards;
    co.zero_stage = 3;
    co.producer = "bench_ckpt";
    char *final;
    TRY(zck_commit(&final, run_dir, staging, L, sh, shards, &co));
    double t_save = now() - t0;
    uint64_t shard_bytes = 0;
    for (size_t r = 0; r < shards; r++) {
        shard_bytes += zck_shard_bytes(sh[r]);
        zck_shard_free(sh[r]);
    }
    free(sh);
    free(th);
    free(staging);
    printf("save_gbps=%.3f seconds=%.3f bytes=%llu writers_seconds=%.3f commit_seconds=%.3f "
           "direct=%s\n",
           shard_bytes / t_save / 1e9, t_save, (unsigned long long)shard_bytes, t_write,
           t_save - t_write, atomic_load(&sc.direct) ? "yes" : "no");
    fflush(stdout);

    /* ---- verify */
    int cold = drop_caches();
    printf("cold_cache=%s\n", cold ? "yes" : "no");
    fflush(stdout);
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    vo.quick = 0;
    vo.jobs = (unsigned)jobs;
    zck_report *rep;
    t0 = now();
    TRY(zck_verify(&rep, final, &vo));
    double t_verify = now() - t0;
    if (zck_report_count(rep)) {
        const zck_problem *p = zck_report_get(rep, 0);
        fprintf(stderr, "bench_ckpt: error: verify found %zu problem(s); first: %s: %s: %s\n",
                zck_report_count(rep), p->file, zck_problem_kind_name(p->kind), p->detail);
        cleanup();
        return 1;
    }
    uint64_t hashed = zck_report_bytes_hashed(rep);
    zck_report_free(rep);
    printf("verify_gbps=%.3f seconds=%.3f bytes=%llu\n", hashed / t_verify / 1e9, t_verify,
           (unsigned long long)hashed);
    fflush(stdout);

    /* ---- load with verification */
    if (cold)
        drop_caches();
    zck_read_req req[N_GROUPS * N_STATES];
    for (size_t g = 0; g < N_GROUPS; g++)
        for (size_t s = 0; s < N_STATES; s++)
            req[g * N_STATES + s] = (zck_read_req){g, s, 0, per_group, dst[g][s]};
    zck_read_opts ro = ZCK_READ_OPTS_INIT;
    ro.verify = 1;
    ro.jobs = (unsigned)jobs;
    t0 = now();
    zck_reader *rd;
    TRY(zck_reader_open(&rd, final));
    TRY(zck_reader_read(rd, req, N_GROUPS * N_STATES, &ro));
    double t_load = now() - t0;
    zck_reader_free(rd);
    /* every byte of every shard file is read and hashed; data_bytes of it reach the caller */
    printf("load_verify_gbps=%.3f seconds=%.3f bytes=%llu data_bytes=%llu\n",
           shard_bytes / t_load / 1e9, t_load, (unsigned long long)shard_bytes,
           (unsigned long long)data_bytes);
    fflush(stdout);
    for (size_t g = 0; g < N_GROUPS; g++)
        for (size_t s = 0; s < N_STATES; s++)
            if (memcmp(src[g][s], dst[g][s], (size_t)per_group * 4)) {
                fprintf(stderr, "bench_ckpt: error: loaded bytes of (%s, %s) differ from what "
                        "was saved\n", zck_layout_group_name(L, g), zck_layout_state_name(L, s));
                cleanup();
                return 1;
            }
    printf("load_check=ok\n");

    for (size_t g = 0; g < N_GROUPS; g++)
        for (size_t s = 0; s < N_STATES; s++) {
            free(src[g][s]);
            free(dst[g][s]);
        }
    free(final);
    zck_layout_free(L);
    cleanup();
    return 0;
}
