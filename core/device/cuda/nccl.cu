/*
 * nccl.cu: the communicator of device.h on NCCL: comm.h's collectives (all_reduce,
 * reduce_scatter, all_gather, broadcast, gather, barrier) on device buffers, enqueued on the
 * communicator's own stream so that they overlap the model's stream, and comm_wait, which
 * waits for them without hanging on a peer that failed (NCCL's asynchronous error, or the
 * caller's check: the launcher's abort record).
 *
 * Bootstrap: ncclGetUniqueId on one rank, its 128 bytes handed to every rank by the launcher
 * (not wired yet: docs/GPU.md), ncclCommInitRank on each.
 *
 * Built without NCCL (no nccl.h where the Makefile looked: -DZR_NO_NCCL), every function
 * returns ZR_EUNSUPPORTED.
 */
#include "zrcuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef ZR_NO_NCCL
#include <nccl.h>

struct zr_dev_comm {
    ncclComm_t comm;
    cudaStream_t stream;
    float *scratch; /* the barrier's element */
    int rank, world, aborted;
    const char *why; /* what aborted it */
};

const char *zrc_nccl_version(void)
{
    static char v[64];
    snprintf(v, sizeof v, "NCCL %d.%d.%d", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return v;
}

static int nccl_err(zr_dev_comm *c, ncclResult_t r, const char *what)
{
    const char *last = c && c->comm ? ncclGetLastError(c->comm) : NULL;
    return zrc_err(ZR_ECOMM, "nccl: %s: %s%s%s", what, ncclGetErrorString(r),
                   last && *last ? ": " : "", last && *last ? last : "");
}

#define NCCL_TRY(c, call, what)                                                                \
    do {                                                                                       \
        ncclResult_t zrc_r_ = (call);                                                          \
        if (zrc_r_ != ncclSuccess)                                                             \
            return nccl_err((c), zrc_r_, (what));                                              \
    } while (0)

int zrc_comm_unique_id(void *id, size_t cap)
{
    if (cap < sizeof(ncclUniqueId))
        return zrc_err(ZR_EINVAL, "nccl: unique id needs %zu bytes, given %zu",
                       sizeof(ncclUniqueId), cap);
    ZRC_TRY(zrc_ensure_device());
    ncclUniqueId u;
    NCCL_TRY(NULL, ncclGetUniqueId(&u), "ncclGetUniqueId");
    memcpy(id, &u, sizeof u);
    return 0;
}

int zrc_comm_new(zr_dev_comm **out, const void *id, size_t id_bytes, int rank, int world)
{
    *out = NULL;
    if (id_bytes != sizeof(ncclUniqueId))
        return zrc_err(ZR_EINVAL, "nccl: unique id of %zu bytes (expected %zu)", id_bytes,
                       sizeof(ncclUniqueId));
    if (world < 1 || rank < 0 || rank >= world)
        return zrc_err(ZR_EINVAL, "nccl: rank %d of world %d", rank, world);
    ZRC_TRY(zrc_ensure_device());
    zr_dev_comm *c = (zr_dev_comm *)calloc(1, sizeof *c);
    if (!c)
        return zrc_err(ZR_ENOMEM, "nccl: out of memory");
    c->rank = rank;
    c->world = world;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    int rc = 0;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        rc = zrc_cuda_err(e, "comm stream");
    if (!rc)
        rc = zrc_malloc((void **)&c->scratch, sizeof(float), "the barrier");
    if (!rc) {
        ncclResult_t r = ncclCommInitRank(&c->comm, world, u, rank);
        if (r != ncclSuccess) {
            c->comm = NULL;
            char what[64];
            snprintf(what, sizeof what, "ncclCommInitRank (rank %d of %d)", rank, world);
            rc = nccl_err(NULL, r, what);
        }
    }
    if (rc) {
        zrc_comm_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void zrc_comm_free(zr_dev_comm *c)
{
    if (!c)
        return;
    zrc_ensure_device();
    if (c->comm) {
        if (c->aborted)
            ncclCommAbort(c->comm);
        else {
            cudaStreamSynchronize(c->stream);
            ncclCommDestroy(c->comm);
        }
    }
    zrc_free(c->scratch);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

int zrc_comm_rank(const zr_dev_comm *c) { return c->rank; }
int zrc_comm_world(const zr_dev_comm *c) { return c->world; }
zr_dev_stream *zrc_comm_stream(zr_dev_comm *c) { return (zr_dev_stream *)c->stream; }

/* An error while collectives may be in flight: abort now, so that the kernels of this
 * communicator stop and the streams that wait for them drain (comm_free only frees). */
static void abort_now(zr_dev_comm *c, const char *why)
{
    if (!c->aborted)
        c->why = why;
    c->aborted = 1;
    if (c->comm) {
        ncclCommAbort(c->comm);
        c->comm = NULL;
    }
}

static int usable(zr_dev_comm *c)
{
    if (c->aborted)
        return zrc_err(ZR_ECOMM, "nccl: the communicator was aborted after an error (%s)",
                       c->why ? c->why : "?");
    return zrc_ensure_device();
}

int zrc_comm_wait(zr_dev_comm *c, int (*check)(void *ctx), void *ctx)
{
    ZRC_TRY(usable(c));
    for (unsigned spins = 0;; spins++) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady) {
            abort_now(c, "a CUDA error while waiting for a collective");
            return zrc_cuda_err(e, "waiting for a collective");
        }
        ncclResult_t ar = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &ar);
        if (r != ncclSuccess || (ar != ncclSuccess && ar != ncclInProgress)) {
            int rc = nccl_err(c, r != ncclSuccess ? r : ar, "a collective failed");
            abort_now(c, "a collective failed");
            return rc;
        }
        if (check) {
            int rc = check(ctx);
            if (rc) {
                abort_now(c, "the job failed elsewhere: a peer is gone, or this rank failed");
                return rc < 0 ? rc : zrc_err(ZR_ECOMM, "nccl: the job was aborted");
            }
        }
        if (spins > 1000) { /* after a short spin, sleep 100 us between polls */
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

static int dtype(zr_dev_dtype dt, ncclDataType_t *out)
{
    switch (dt) {
    case ZR_DEV_F32:
        *out = ncclFloat32;
        return 0;
    case ZR_DEV_F64:
        *out = ncclFloat64;
        return 0;
    case ZR_DEV_BF16:
        *out = ncclBfloat16;
        return 0;
    }
    return zrc_err(ZR_EINVAL, "nccl: dtype %d", (int)dt);
}

int zrc_all_reduce(zr_dev_comm *c, const void *send, void *recv, size_t n, zr_dev_dtype dt)
{
    ncclDataType_t t = ncclFloat32;
    ZRC_TRY(dtype(dt, &t));
    ZRC_TRY(usable(c));
    if (!n)
        return 0;
    NCCL_TRY(c, ncclAllReduce(send, recv, n, t, ncclSum, c->comm, c->stream), "all_reduce");
    return 0;
}

int zrc_reduce_scatter(zr_dev_comm *c, const void *send, void *recv, size_t n, zr_dev_dtype dt)
{
    ncclDataType_t t = ncclFloat32;
    ZRC_TRY(dtype(dt, &t));
    ZRC_TRY(usable(c));
    if (!n)
        return 0;
    NCCL_TRY(c, ncclReduceScatter(send, recv, n, t, ncclSum, c->comm, c->stream),
             "reduce_scatter");
    return 0;
}

int zrc_all_gather(zr_dev_comm *c, const void *send, void *recv, size_t n, size_t elem_bytes)
{
    ZRC_TRY(usable(c));
    if (!n || !elem_bytes)
        return 0;
    NCCL_TRY(c, ncclAllGather(send, recv, n * elem_bytes, ncclInt8, c->comm, c->stream),
             "all_gather");
    return 0;
}

int zrc_broadcast(zr_dev_comm *c, void *buf, size_t bytes, int root)
{
    if (root < 0 || root >= c->world)
        return zrc_err(ZR_EINVAL, "nccl: broadcast root %d of world %d", root, c->world);
    ZRC_TRY(usable(c));
    if (!bytes)
        return 0;
    NCCL_TRY(c, ncclBroadcast(buf, buf, bytes, ncclInt8, root, c->comm, c->stream), "broadcast");
    return 0;
}

int zrc_gather(zr_dev_comm *c, const void *send, void *recv, size_t bytes, int root)
{
    if (root < 0 || root >= c->world)
        return zrc_err(ZR_EINVAL, "nccl: gather root %d of world %d", root, c->world);
    return zrc_all_gather(c, send, recv, bytes, 1); /* recv: W bytes on every rank */
}

int zrc_barrier(zr_dev_comm *c)
{
    ZRC_TRY(usable(c));
    NCCL_TRY(c, ncclAllReduce(c->scratch, c->scratch, 1, ncclFloat32, ncclSum, c->comm,
                              c->stream), "barrier");
    return zrc_comm_wait(c, NULL, NULL);
}

#else /* ZR_NO_NCCL */

struct zr_dev_comm {
    int unused;
};

const char *zrc_nccl_version(void) { return "without NCCL"; }

static int no_nccl(void)
{
    return zrc_err(ZR_EUNSUPPORTED, "nccl: this CUDA backend was built without NCCL (no "
                   "nccl.h when it was compiled)");
}

int zrc_comm_unique_id(void *, size_t) { return no_nccl(); }
int zrc_comm_new(zr_dev_comm **out, const void *, size_t, int, int)
{
    *out = NULL;
    return no_nccl();
}
void zrc_comm_free(zr_dev_comm *) {}
int zrc_comm_rank(const zr_dev_comm *) { return 0; }
int zrc_comm_world(const zr_dev_comm *) { return 1; }
zr_dev_stream *zrc_comm_stream(zr_dev_comm *) { return NULL; }
int zrc_comm_wait(zr_dev_comm *, int (*)(void *), void *) { return no_nccl(); }
int zrc_all_reduce(zr_dev_comm *, const void *, void *, size_t, zr_dev_dtype) { return no_nccl(); }
int zrc_reduce_scatter(zr_dev_comm *, const void *, void *, size_t, zr_dev_dtype)
{
    return no_nccl();
}
int zrc_all_gather(zr_dev_comm *, const void *, void *, size_t, size_t) { return no_nccl(); }
int zrc_broadcast(zr_dev_comm *, void *, size_t, int) { return no_nccl(); }
int zrc_gather(zr_dev_comm *, const void *, void *, size_t, int) { return no_nccl(); }
int zrc_barrier(zr_dev_comm *) { return no_nccl(); }

#endif
