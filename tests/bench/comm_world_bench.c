/*
 * comm_world_bench.c: reduce_scatter and all_gather bandwidth of one communicator backend at a
 * world of W ranks (core/dist/comm.h), for mpi_bench.sh.
 *
 *   comm_world_bench shm|tcp W [MiB (64)] [iterations (5)]   W ranks of itself through the
 *                                                            launcher (zr_launch): one node's
 *                                                            shm, or W one-rank "nodes" of the
 *                                                            TCP star on a free local port
 *   mpirun -np W comm_world_bench mpi - [MiB] [iterations]   one rank per MPI process
 *
 * MiB is the size of the full vector: reduce_scatter takes MiB of f32 per rank and leaves
 * MiB / W; all_gather takes MiB / W per rank and leaves MiB. Each op runs once to warm up, then
 * `iterations` times, each between two barriers; the best time counts (noise only adds).
 * Bandwidths as nccl-tests defines them: algbw = MiB / time, busbw = algbw (W-1) / W (the
 * traffic every rank must carry). Then the latency: the mean time of an all_reduce of 16 floats
 * over 1000 calls. Rank 0 prints one line per op.
 */
#include "comm.h"
#include "zr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "comm_world_bench: %s: %s\n", what, zr_err_msg());
    exit(1);
}

static void bench(const char *backend, size_t mib, int iters)
{
    zr_comm *c;
    if (zr_comm_open_env(&c) < 0)
        die("open");
    int W = zr_comm_world(c), r = zr_comm_rank(c);
    size_t n = (mib << 20) / sizeof(float) / (size_t)W; /* elements per rank's piece */
    float *full = malloc(n * W * sizeof(float)), *piece = malloc(n * sizeof(float));
    if (!full || !piece)
        die("out of memory");
    for (size_t i = 0; i < n * W; i++)
        full[i] = (float)((i * 2654435761u + (size_t)r * 97) % 1000 + 1) * 0.001f;
    for (size_t i = 0; i < n; i++)
        piece[i] = (float)i;
    for (int op = 0; op < 2; op++) {
        double best = 1e30;
        for (int k = 0; k <= iters; k++) {
            if (zr_comm_barrier(c) < 0)
                die("barrier");
            double t0 = now_s();
            int rc = op == 0 ? zr_comm_reduce_scatter(c, full, piece, n, ZR_COMM_F32)
                             : zr_comm_all_gather(c, piece, full, n, sizeof(float));
            if (rc < 0)
                die(op ? "all_gather" : "reduce_scatter");
            if (zr_comm_barrier(c) < 0)
                die("barrier");
            double t = now_s() - t0;
            if (k && t < best)
                best = t;
        }
        double bytes = (double)n * W * sizeof(float), algbw = bytes / best / 1e9;
        if (r == 0)
            printf("%-4s W=%d %-14s %7.1f MiB  %8.2f ms  algbw %6.2f GB/s  busbw %6.2f GB/s\n",
                   backend, W, op ? "all_gather" : "reduce_scatter", bytes / 1048576.0,
                   best * 1e3, algbw, algbw * (W - 1) / W);
    }
    /* latency: all_reduce of 16 floats (64 bytes), the mean of 1000 calls after 10 */
    double t0 = 0;
    for (int k = 0; k < 1010; k++) {
        if (k == 10 && zr_comm_barrier(c) == 0)
            t0 = now_s();
        if (zr_comm_all_reduce(c, full, piece, 16, ZR_COMM_F32) < 0)
            die("all_reduce");
    }
    double us = (now_s() - t0) / 1000 * 1e6;
    if (r == 0)
        printf("%-4s W=%d %-14s %7d B    %8.1f us per call\n", backend, W, "all_reduce", 64, us);
    free(full);
    free(piece);
    zr_comm_close(c);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (void *)&a, &len))
        die("no free port");
    close(fd);
    return ntohs(a.sin_port);
}

/* W ranks of this program (argv: "rank" instead of the backend) through the launcher: one
 * launcher of W ranks over shm, or W one-rank "nodes" over the TCP star */
static int launch(const char *backend, int W, char **argv)
{
    char *rank_argv[] = {"/proc/self/exe", "rank", argv[1], argv[2], argv[3], argv[4], NULL};
    zr_launch_opts o = ZR_LAUNCH_OPTS_INIT;
    int code = 0;
    if (!strcmp(backend, "shm")) {
        o.nproc = W;
        if (zr_launch(&code, &o, rank_argv) < 0)
            die("launch");
        return code;
    }
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    o.nnodes = W;
    o.master = master;
    fflush(NULL);
    for (int k = W - 1; k >= 0; k--) {
        o.node_rank = k;
        if (k && fork())
            continue;
        if (zr_launch(&code, &o, rank_argv) < 0)
            die("launch");
        if (k)
            _exit(code);
        break;
    }
    int st;
    while (wait(&st) > 0)
        code |= !WIFEXITED(st) || WEXITSTATUS(st);
    return code;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "shm") && strcmp(argv[1], "tcp") &&
                     strcmp(argv[1], "mpi") && strcmp(argv[1], "rank"))) {
        fprintf(stderr, "usage: comm_world_bench shm|tcp|mpi W|- [MiB] [iterations]\n");
        return 2;
    }
    int rank = !strcmp(argv[1], "rank"); /* started by launch(): argv[2] is the backend */
    const char *backend = rank ? argv[2] : argv[1];
    char **args = rank ? argv + 1 : argv;
    size_t mib = argc > 3 + rank && args[3] ? strtoul(args[3], NULL, 10) : 64;
    int iters = argc > 4 + rank && args[4] ? atoi(args[4]) : 5;
    if (!strcmp(backend, "mpi"))
        setenv("ZR_COMM", "mpi", 1);
    if (rank || !strcmp(backend, "mpi")) {
        bench(backend, mib, iters);
        return 0;
    }
    char *fwd[] = {argv[0], argv[1], argv[2], argc > 3 ? argv[3] : "64",
                   argc > 4 ? argv[4] : "5"};
    return launch(backend, atoi(argv[2]), fwd);
}
