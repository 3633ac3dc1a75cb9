/*
 * comm_mpi.c: the `mpi` backend of the communicator (comm_be.h, comm.h), built alone into
 * build/libzr_mpi.so against Open MPI (pkg-config ompi-c) and loaded by comm.c with dlopen
 * when the ranks were started by mpirun or srun (zrun --comm mpi, the default there), so that
 * libzr and every program that links it stay free of libmpi (docs/RUNNING.md says why).
 *
 * Each process is one rank of MPI_COMM_WORLD (a private duplicate of it, errors returned, not
 * fatal). Every collective begins with an MPI_Allgather of a 128-byte block per rank: a
 * descriptor (op, count, element size or root, call number), compared on every rank, so calls
 * that do not match (a collective out of order, another size) fail with ZR_ECOMM on every rank,
 * naming both calls, instead of hanging in or corrupting an MPI collective; and, for a small
 * call (at most 104 bytes of data per rank: a norm, a loss, a flag, a barrier), its whole data,
 * so that the call ends there in one round (reductions summed by every rank in rank order from
 * the blocks). Then the data of larger calls:
 *
 *   reduce_scatter  every rank sends piece d of its input to rank d (MPI_Isend / MPI_Irecv,
 *                   (W-1)/W of the input per rank, as a ring moves), and rank d sums the W
 *                   pieces it holds in rank order with the program's kernel: the shm
 *                   backend's bits exactly
 *   all_reduce      the same reduce-scatter of each window split in W pieces, then
 *                   MPI_Allgatherv of the reduced pieces: the bits of reduce_scatter +
 *                   all_gather, as comm.h promises, and of the shm backend
 *   all_gather      MPI_Allgather (data movement only)
 *   broadcast       MPI_Bcast; gather MPI_Gather; barrier: the descriptors' all-gather
 *
 * MPI's own reductions (MPI_Allreduce, MPI_Reduce_scatter_block) are not used: their order of
 * summation depends on the algorithm Open MPI picks for the size and the world, so the bits
 * would differ from the shm backend's and between worlds. A call moves at most window_bytes
 * per message (counts stay within MPI's int); larger calls stream window by window.
 *
 * A rank that dies: mpirun (or srun) ends the job and names it; the survivors' calls may fail
 * first with ZR_EIO carrying MPI's error string. After an error the communicator is dead:
 * close does not call MPI_Finalize (it would wait for the dead), so the process exits without
 * it and the launcher stops the job.
 */
#include "comm_be.h"
#include "zck.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OP_ALL_REDUCE = 1, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_GATHER, OP_BARRIER };
static const char *const op_names[] = {"?", "all_reduce", "reduce_scatter", "all_gather",
                                       "broadcast", "gather", "barrier"};
#define TAG 0x7a72
#define TRY(x)                                                                                 \
    do {                                                                                       \
        int try_rc_ = (x);                                                                     \
        if (try_rc_ < 0)                                                                       \
            return try_rc_;                                                                    \
    } while (0)

#define INLINE 104 /* payload bytes that ride with the descriptor */

/* What every rank contributes to the first step of a call: its descriptor, and the whole data
 * of a small call (128 bytes in all, the same size on every rank whatever the call) */
typedef struct {
    uint32_t op, aux; /* aux: element size, or the root */
    uint64_t n, seq;
    unsigned char data[INLINE];
} desc;

typedef struct {
    MPI_Comm comm;
    int rank, world;
    size_t win;           /* bytes per message at most */
    uint64_t seq;         /* collectives called */
    desc *descs;          /* W descriptors, with their inline payloads */
    char *tmp;            /* W windows: the pieces received for a reduction */
    size_t tmp_bytes;
    MPI_Request *req;     /* 2 W */
    const void **src;     /* W: the pieces summed */
    const void **sp;      /* W: what goes to rank q (exchange) */
    void **rp;            /* W: where rank q's piece lands */
    size_t *sb, *rb;      /* W: their bytes */
    int *counts, *displs; /* W */
    int own_init;         /* this backend called MPI_Init_thread (and finalizes) */
    int dead, dead_code;
    char dead_msg[400];
} mpi_comm;

static const zr_mpi_host *H;

static int fail(mpi_comm *m, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(mpi_comm *m, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m) {
        m->dead = 1;
        m->dead_code = code;
        snprintf(m->dead_msg, sizeof m->dead_msg, "%s", msg);
    }
    return H->error(code, msg);
}

/* an MPI call's result: 0, or the communicator dead with ZR_EIO and MPI's words */
static int mpi_ok(mpi_comm *m, int rc, const char *op, const char *call)
{
    if (rc == MPI_SUCCESS)
        return 0;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "error %d", rc);
    return fail(m, ZR_EIO, "%s: %s failed (a rank died or the network failed?): %s", op, call, s);
}
#define MPI_TRY(m, op, call)                                                                   \
    do {                                                                                       \
        int mpi_rc_ = mpi_ok((m), (call), (op), #call);                                        \
        if (mpi_rc_ < 0)                                                                       \
            return mpi_rc_;                                                                    \
    } while (0)

/* after an error: every later call fails with it */
static int dead_error(const mpi_comm *m, const char *op)
{
    if (!m->dead)
        return 0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s: communicator unusable after an earlier error: %s", op,
             m->dead_msg);
    return H->error(m->dead_code, msg);
}

/* The call's descriptor against every rank's: ZR_ECOMM on every rank when they differ. */
static int begin(mpi_comm *m, uint32_t op, uint32_t aux, uint64_t n, const void *payload,
                 size_t bytes)
{
    const char *name = op_names[op];
    TRY(dead_error(m, name));
    desc me;
    memset(&me, 0, sizeof me);
    me.op = op;
    me.aux = aux;
    me.n = n;
    me.seq = ++m->seq;
    if (payload && bytes <= INLINE)
        memcpy(me.data, payload, bytes);
    MPI_TRY(m, name, MPI_Allgather(&me, sizeof me, MPI_BYTE, m->descs, sizeof me, MPI_BYTE,
                                   m->comm));
    for (int q = 0; q < m->world; q++) {
        const desc *d = &m->descs[q];
        if (d->op != me.op || d->aux != me.aux || d->n != me.n || d->seq != me.seq)
            return fail(m, ZR_ECOMM,
                        "%s: collective mismatch: rank %d called %s(n=%llu, %u) as its call "
                        "#%llu while rank %d called %s(n=%llu, %u) as its call #%llu",
                        name, q, op_names[d->op < OP_BARRIER + 1 ? d->op : 0],
                        (unsigned long long)d->n, d->aux, (unsigned long long)d->seq, m->rank,
                        name, (unsigned long long)me.n, me.aux, (unsigned long long)me.seq);
    }
    return 0;
}

/* Every rank q != me sends m->sp[q] (m->sb[q] bytes) to q and receives m->rp[q] (m->rb[q]
 * bytes) from it. */
static int exchange(mpi_comm *m, const char *op)
{
    const void *const *send = m->sp;
    void *const *recv = m->rp;
    const size_t *sb = m->sb, *rb = m->rb;
    int k = 0;
    for (int q = 0; q < m->world; q++)
        if (q != m->rank && rb[q])
            MPI_TRY(m, op, MPI_Irecv(recv[q], (int)rb[q], MPI_BYTE, q, TAG, m->comm,
                                     &m->req[k++]));
    for (int q = 0; q < m->world; q++)
        if (q != m->rank && sb[q])
            MPI_TRY(m, op, MPI_Isend(send[q], (int)sb[q], MPI_BYTE, q, TAG, m->comm,
                                     &m->req[k++]));
    MPI_TRY(m, op, MPI_Waitall(k, m->req, MPI_STATUSES_IGNORE));
    return 0;
}

/* elements of es bytes per piece and window: at least 1 */
static size_t piece_numel(const mpi_comm *m, size_t es)
{
    size_t cw = m->win / ((size_t)m->world * es);
    return cw ? cw : 1;
}

static int be_reduce_scatter(void *h, const void *send, void *recv, size_t n, size_t es)
{
    mpi_comm *m = h;
    const int W = m->world, r = m->rank;
    const char *in = send;
    char *out = recv;
    int small = (size_t)W * n * es <= INLINE;
    TRY(begin(m, OP_REDUCE_SCATTER, (uint32_t)es, n, small ? send : NULL, (size_t)W * n * es));
    if (small) { /* every rank's input came with the descriptors */
        for (int q = 0; q < W; q++)
            m->src[q] = m->descs[q].data + (size_t)r * n * es;
        H->sum(es, out, m->src, W, n);
        return 0;
    }
    size_t cw = piece_numel(m, es);
    for (size_t off = 0; off < n; off += cw) {
        size_t cur = n - off < cw ? n - off : cw;
        for (int q = 0; q < W; q++) {
            m->sp[q] = in + ((size_t)q * n + off) * es;
            m->rp[q] = m->tmp + (size_t)q * cw * es;
            m->sb[q] = m->rb[q] = cur * es;
            m->src[q] = q == r ? m->sp[r] : m->rp[q];
        }
        TRY(exchange(m, "reduce_scatter"));
        H->sum(es, out + off * es, m->src, W, cur);
    }
    return 0;
}

/* Each window of up to W cw elements in W pieces, [m q / W, m (q+1) / W): piece q reduced by
 * rank q as in reduce_scatter, then every piece to every rank by MPI_Allgatherv. */
static int be_all_reduce(void *h, const void *send, void *recv, size_t n, size_t es)
{
    mpi_comm *m = h;
    const size_t W = (size_t)m->world, r = (size_t)m->rank, cw = piece_numel(m, es);
    const char *in = send;
    char *out = recv;
    int small = n * es <= INLINE;
    TRY(begin(m, OP_ALL_REDUCE, (uint32_t)es, n, small ? send : NULL, n * es));
    if (small) { /* every rank sums all inputs, in rank order: the same bits everywhere */
        for (size_t q = 0; q < W; q++)
            m->src[q] = m->descs[q].data;
        H->sum(es, out, m->src, (int)W, n);
        return 0;
    }
    for (size_t off = 0; off < n;) {
        size_t mw = n - off < cw * W ? n - off : cw * W;
        size_t a = mw * r / W, b = mw * (r + 1) / W;
        for (size_t q = 0; q < W; q++) {
            size_t qa = mw * q / W, qb = mw * (q + 1) / W;
            m->sp[q] = in + (off + qa) * es;
            m->sb[q] = (qb - qa) * es;
            m->rp[q] = m->tmp + q * cw * es;
            m->rb[q] = (b - a) * es;
            m->src[q] = q == r ? (const void *)(in + (off + a) * es) : m->rp[q];
            m->counts[q] = (int)((qb - qa) * es);
            m->displs[q] = (int)(qa * es);
        }
        TRY(exchange(m, "all_reduce"));
        H->sum(es, out + (off + a) * es, m->src, (int)W, b - a);
        MPI_TRY(m, "all_reduce", MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, out + off * es,
                                                m->counts, m->displs, MPI_BYTE, m->comm));
        off += mw;
    }
    return 0;
}

/* A datatype of `bytes` bytes whose extent is `stride` (piece q of a window lands at
 * q * stride): for windows of pieces larger than one window. */
static int strided(mpi_comm *m, const char *op, MPI_Datatype *t, size_t bytes, size_t stride)
{
    MPI_Datatype c;
    MPI_TRY(m, op, MPI_Type_contiguous((int)bytes, MPI_BYTE, &c));
    int rc = MPI_Type_create_resized(c, 0, (MPI_Aint)stride, t);
    MPI_Type_free(&c);
    MPI_TRY(m, op, rc);
    MPI_TRY(m, op, MPI_Type_commit(t));
    return 0;
}

static int be_all_gather(void *h, const void *send, void *recv, size_t bytes)
{
    mpi_comm *m = h;
    const char *op = "all_gather";
    const char *in = send;
    char *out = recv;
    TRY(begin(m, OP_ALL_GATHER, 0, bytes, send, bytes));
    if (bytes <= INLINE) {
        for (int q = 0; q < m->world; q++)
            memcpy(out + (size_t)q * bytes, m->descs[q].data, bytes);
        return 0;
    }
    int in_place = in == out + (size_t)m->rank * bytes;
    for (size_t off = 0; off < bytes; off += m->win) {
        size_t cur = bytes - off < m->win ? bytes - off : m->win;
        const void *s = in_place ? MPI_IN_PLACE : in + off;
        if (cur == bytes) {
            MPI_TRY(m, op, MPI_Allgather(s, (int)cur, MPI_BYTE, out, (int)cur, MPI_BYTE,
                                         m->comm));
            continue;
        }
        MPI_Datatype t;
        TRY(strided(m, op, &t, cur, bytes));
        int rc = MPI_Allgather(s, (int)cur, MPI_BYTE, out + off, 1, t, m->comm);
        MPI_Type_free(&t);
        MPI_TRY(m, op, rc);
    }
    return 0;
}

static int be_gather(void *h, const void *send, void *recv, size_t bytes, int root)
{
    mpi_comm *m = h;
    const char *op = "gather";
    const char *in = send;
    char *out = recv;
    TRY(begin(m, OP_GATHER, (uint32_t)root, bytes, send, bytes));
    if (bytes <= INLINE) {
        for (int q = 0; m->rank == root && q < m->world; q++)
            memcpy(out + (size_t)q * bytes, m->descs[q].data, bytes);
        return 0;
    }
    int at_root = m->rank == root, in_place = at_root && in == out + (size_t)root * bytes;
    for (size_t off = 0; off < bytes; off += m->win) {
        size_t cur = bytes - off < m->win ? bytes - off : m->win;
        const void *s = in_place ? MPI_IN_PLACE : in + off;
        if (cur == bytes || !at_root) {
            MPI_TRY(m, op, MPI_Gather(s, (int)cur, MPI_BYTE, at_root ? out : NULL, (int)cur,
                                      MPI_BYTE, root, m->comm));
            continue;
        }
        MPI_Datatype t;
        TRY(strided(m, op, &t, cur, bytes));
        int rc = MPI_Gather(s, (int)cur, MPI_BYTE, out + off, 1, t, root, m->comm);
        MPI_Type_free(&t);
        MPI_TRY(m, op, rc);
    }
    return 0;
}

static int be_broadcast(void *h, void *buf, size_t bytes, int root)
{
    mpi_comm *m = h;
    const char *op = "broadcast";
    TRY(begin(m, OP_BROADCAST, (uint32_t)root, bytes, m->rank == root ? buf : NULL, bytes));
    if (bytes <= INLINE) {
        if (m->rank != root)
            memcpy(buf, m->descs[root].data, bytes);
        return 0;
    }
    for (size_t off = 0; off < bytes; off += m->win) {
        size_t cur = bytes - off < m->win ? bytes - off : m->win;
        MPI_TRY(m, op, MPI_Bcast((char *)buf + off, (int)cur, MPI_BYTE, root, m->comm));
    }
    return 0;
}

static int be_barrier(void *h)
{
    mpi_comm *m = h;
    /* the descriptors' all-gather completes only when every rank has called: a barrier */
    return begin(m, OP_BARRIER, 0, 0, NULL, 0);
}

/* MPI cannot tell whether a peer lives without waiting for it: only an earlier error. */
static int be_check(void *h)
{
    return dead_error(h, "check");
}

static void free_bufs(mpi_comm *m)
{
    free(m->descs);
    free(m->tmp);
    free(m->req);
    free(m->src);
    free(m->sp);
    free(m->rp);
    free(m->sb);
    free(m->rb);
    free(m->counts);
    free(m->displs);
}

static void be_close(void *h)
{
    mpi_comm *m = h;
    if (!m)
        return;
    /* after an error a peer may be gone: MPI_Finalize could wait for it forever; exiting
     * without it makes mpirun end the job */
    if (!m->dead) {
        MPI_Comm_free(&m->comm);
        if (m->own_init)
            MPI_Finalize();
    }
    free_bufs(m);
    free(m);
}

static int be_open(void **out, int *rank, int *world, const char **version, size_t window_bytes,
                   const zr_mpi_host *host)
{
    H = host;
    *out = NULL;
    int fin = 0, init = 0, provided = 0;
    MPI_Finalized(&fin);
    if (fin)
        return H->error(ZR_EINVAL, "mpi: MPI was finalized in this process: one MPI "
                                   "communicator per process");
    MPI_Initialized(&init);
    mpi_comm *m = calloc(1, sizeof *m);
    if (!m)
        return H->error(ZR_ENOMEM, "mpi: out of memory");
    if (!init) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            free(m);
            return H->error(ZR_EIO, "mpi: MPI_Init_thread failed (started by mpirun or srun "
                                    "--mpi=pmix?)");
        }
        m->own_init = 1;
    } else
        MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED) {
        free(m);
        return fail(NULL, ZR_EUNSUPPORTED, "mpi: this MPI library gives thread level %d, the "
                    "engine needs MPI_THREAD_SERIALIZED (%d)", provided, MPI_THREAD_SERIALIZED);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->world);
    if (window_bytes > ((size_t)1 << 30))
        window_bytes = (size_t)1 << 30;
    m->win = window_bytes;
    size_t W = (size_t)m->world;
    size_t p4 = piece_numel(m, 4) * 4, p8 = piece_numel(m, 8) * 8;
    m->tmp_bytes = W * (p4 > p8 ? p4 : p8);
    m->descs = calloc(W, sizeof *m->descs);
    m->tmp = malloc(m->tmp_bytes);
    m->req = calloc(2 * W, sizeof *m->req);
    m->src = calloc(W, sizeof *m->src);
    m->sp = calloc(W, sizeof *m->sp);
    m->rp = calloc(W, sizeof *m->rp);
    m->sb = calloc(W, sizeof *m->sb);
    m->rb = calloc(W, sizeof *m->rb);
    m->counts = calloc(W, sizeof *m->counts);
    m->displs = calloc(W, sizeof *m->displs);
    if (!m->descs || !m->tmp || !m->req || !m->src || !m->sp || !m->rp || !m->sb || !m->rb ||
        !m->counts || !m->displs) {
        free_bufs(m);
        free(m);
        return fail(NULL, ZR_ENOMEM, "mpi: out of memory for the buffers of %d ranks", (int)W);
    }
    static char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(ver, &len);
    char *nl = strchr(ver, ',');
    if (nl)
        *nl = 0;
    *version = ver;
    *rank = m->rank;
    *world = m->world;
    *out = m;
    return 0;
}

static const zr_mpi_plugin plugin = {
    .abi = ZR_MPI_ABI,
    .size = sizeof(zr_mpi_plugin),
    .open = be_open,
    .be = {"mpi", be_all_reduce, be_reduce_scatter, be_all_gather, be_broadcast, be_gather,
           be_barrier, be_check, be_close},
};

__attribute__((visibility("default"))) const zr_mpi_plugin *zr_mpi_backend(void)
{
    return &plugin;
}
