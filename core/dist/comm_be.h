/*
 * comm_be.h: the communicator's backends other than shm (comm.h), private to core/dist: the
 * operations table comm.c calls through, and the ABI of the MPI backend, a shared object
 * (build/libzr_mpi.so, core/dist/comm_mpi.c) that comm.c loads with dlopen when the ranks come
 * from mpirun or srun, so that libzr and the programs linking it never link MPI.
 *
 * comm.c checks every argument and handles a world of one and counts of zero; a backend runs
 * the collective on a valid call of a world >= 2. Sizes: reductions in elements of es bytes
 * (4: f32, 8: f64), all_gather, broadcast and gather in bytes (all_gather: bytes per rank).
 * Same contract as comm.h: sums in rank order, ((x_0 + x_1) + x_2) + ..., the same bits on
 * every rank; a mismatch in the calls fails on every rank with ZR_ECOMM; after an error only
 * close.
 */
#ifndef ZR_COMM_BE_H
#define ZR_COMM_BE_H

#include <stddef.h>

typedef struct {
    const char *name; /* "tcp", "mpi" */
    int (*all_reduce)(void *h, const void *send, void *recv, size_t n, size_t es);
    int (*reduce_scatter)(void *h, const void *send, void *recv, size_t n, size_t es);
    int (*all_gather)(void *h, const void *send, void *recv, size_t bytes);
    int (*broadcast)(void *h, void *buf, size_t bytes, int root);
    int (*gather)(void *h, const void *send, void *recv, size_t bytes, int root);
    int (*barrier)(void *h);
    int (*check)(void *h);
    void (*close)(void *h);
} zr_comm_be;

/* ---------------------------------------------------------------- the MPI backend's ABI */

#define ZR_MPI_LIB "libzr_mpi.so"      /* next to the running program */
#define ZR_MPI_SYMBOL "zr_mpi_backend" /* const zr_mpi_plugin *zr_mpi_backend(void) */
#define ZR_MPI_ABI 1u

/* What the program lends the backend: its error state (the message lands in zr_err_msg of the
 * calling thread; returns code) and its reduction kernel (out[i] = ((src[0][i] + src[1][i]) +
 * ...) + src[W-1][i], W >= 2, out may be one of the sources), so both backends sum alike. */
typedef struct {
    int (*error)(int code, const char *msg);
    void (*sum)(size_t es, void *out, const void *const *src, int W, size_t n);
} zr_mpi_host;

typedef struct {
    unsigned abi;   /* ZR_MPI_ABI */
    unsigned size;  /* sizeof(zr_mpi_plugin) */
    /* MPI_Init_thread (serialized calls from any thread) and the world's rank and size;
     * window_bytes: the most bytes one message of a collective moves (larger calls stream in
     * windows). *version: the MPI library's version string (borrowed). */
    int (*open)(void **h, int *rank, int *world, const char **version, size_t window_bytes,
                const zr_mpi_host *host);
    zr_comm_be be;
} zr_mpi_plugin;

typedef const zr_mpi_plugin *(*zr_mpi_getter)(void);

#endif
