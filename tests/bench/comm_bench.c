/*
 * comm_bench.c: the shm communicator (core/dist/comm.h) at world 2 against a single-thread memcpy.
 *
 *   comm_bench [MiB (256)] [iterations (5)] [segment KiB per rank (0: the default, 4096)]
 *
 * The memcpy baseline runs first, alone: MiB bytes copied between two buffers filled with
 * non-zero data, once to warm up, then timed (the best of the iterations). Then the process creates the segment and forks:
 * the parent is rank 0, the child rank 1. Each collective moves MiB bytes in all (all_reduce:
 * MiB of f32 per rank; reduce_scatter: MiB sent per rank, MiB / W received; all_gather: MiB / W
 * sent, MiB received), is run once to warm up, then timed between barriers, the best of the
 * iterations (as for memcpy: the machine's noise only ever adds). Bandwidths as
 * nccl-tests defines them: algbw = bytes / time; busbw = algbw * 2 (W-1) / W for all_reduce and
 * algbw * (W-1) / W for reduce_scatter and all_gather (the traffic any rank must carry). The
 * last columns compare with the memcpy: busbw / memcpy bandwidth, time / memcpy time.
 */
#include "comm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define W 2

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fill(float *x, size_t n, int r)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((i * 2654435761u + (size_t)r * 97) % 1000 + 1) * 0.001f;
}

static void die(const char *what)
{
    fprintf(stderr, "comm_bench: %s: %s\n", what, zr_err_msg());
    exit(1);
}

typedef struct {
    const char *name;
    double t;        /* seconds per call */
    double factor;   /* busbw / algbw */
} result;

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    size_t seg_kib = argc > 3 ? strtoul(argv[3], NULL, 10) : 0;
    if (!mib || iters < 1) {
        fprintf(stderr, "usage: comm_bench [MiB] [iterations] [segment KiB]\n");
        return 2;
    }
    size_t bytes = mib << 20, n = bytes / sizeof(float);

    /* ---- memcpy baseline, alone */
    float *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        fprintf(stderr, "comm_bench: out of memory\n");
        return 1;
    }
    fill(a, n, 0);
    fill(b, n, 1);
    memcpy(b, a, bytes);
    double best_cp = 1e30;
    for (int i = 0; i < iters; i++) {
        double t0 = now_s();
        memcpy(b, a, bytes);
        __asm__ __volatile__("" : : "r"(b) : "memory");
        double t = now_s() - t0;
        if (t < best_cp)
            best_cp = t;
    }
    free(a);
    free(b);

    /* ---- the communicator */
    char *name;
    if (zr_comm_shm_create(&name, W, seg_kib << 10) < 0)
        die("shm_create");
    fflush(NULL);
    pid_t child = fork();
    if (child < 0)
        return 1;
    int r = child == 0 ? 1 : 0;
    char rs[8];
    snprintf(rs, sizeof rs, "%d", r);
    setenv("ZR_RANK", rs, 1);
    setenv("ZR_WORLD", "2", 1);
    setenv("ZR_COMM_SHM", name, 1);
    zr_comm *c;
    if (zr_comm_open_env(&c) < 0)
        die("open");
    float *send = malloc(bytes), *recv = malloc(bytes);
    if (!send || !recv) {
        fprintf(stderr, "comm_bench: out of memory\n");
        return 1;
    }
    fill(send, n, r);
    fill(recv, n, r + 2);
    result res[3] = {{"all_reduce", 0, 2.0 * (W - 1) / W},
                     {"reduce_scatter", 0, (double)(W - 1) / W},
                     {"all_gather", 0, (double)(W - 1) / W}};
    for (int op = 0; op < 3; op++) {
        res[op].t = 1e30;
        for (int i = -1; i < iters; i++) { /* i = -1: warm-up */
            if (zr_comm_barrier(c) < 0)
                die("barrier");
            double t0 = now_s();
            int rc = op == 0   ? zr_comm_all_reduce(c, send, recv, n, ZR_COMM_F32)
                     : op == 1 ? zr_comm_reduce_scatter(c, send, recv, n / W, ZR_COMM_F32)
                               : zr_comm_all_gather(c, send, recv, n / W, sizeof(float));
            if (rc < 0)
                die(res[op].name);
            if (zr_comm_barrier(c) < 0)
                die("barrier");
            double t = now_s() - t0;
            if (i >= 0 && t < res[op].t)
                res[op].t = t;
        }
    }
    zr_comm_close(c);
    free(send);
    free(recv);
    if (r == 1)
        _exit(0);
    int st;
    while (waitpid(child, &st, 0) < 0 && errno == EINTR)
        ;
    zr_comm_shm_unlink(name);
    free(name);
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        return 1;

    double cp_bw = (double)bytes / best_cp / 1e9;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    printf("shm communicator, world %d, %zu MiB, %d iterations, segment %zu KiB per rank, "
           "%ld CPUs\n",
           W, mib, iters, seg_kib ? seg_kib : 4096, cpus);
    printf("%-16s %10s %12s %12s %14s %12s\n", "op", "time ms", "algbw GB/s", "busbw GB/s",
           "busbw/memcpy", "t/memcpy");
    printf("%-16s %10.1f %12.2f %12s %14s %12s\n", "memcpy (1 thr)", best_cp * 1e3, cp_bw, "",
           "1.00", "1.00");
    for (int op = 0; op < 3; op++) {
        double alg = (double)bytes / res[op].t / 1e9, bus = alg * res[op].factor;
        printf("%-16s %10.1f %12.2f %12.2f %14.2f %12.2f\n", res[op].name, res[op].t * 1e3, alg,
               bus, bus / cp_bw, res[op].t / best_cp);
    }
    return 0;
}
