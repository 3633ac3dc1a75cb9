/*
 * zero.c: the ZeRO stages (zero.h): storage by stage, the model's hooks, and the comm thread
 * that runs every collective in issue order (stage 2's reduce-scatters and stage 3's gathers
 * in the background, the rest waited for at once).
 */
#include "zero.h"
#include "zero_dev.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define QCAP 256           /* comm ops queued at most (the issuer waits for room) */
#define GRAD_SLOTS 3       /* stage 2-3: gradient buffers of ordinary groups */
#define BIG_ARRAY (4u << 20) /* arrays from this many bytes up are 2 MiB aligned, THP advised */
#define SWAP_GRAIN 1024u     /* floats: 4 KiB, the swap files' alignment */

static uint64_t grain_up(uint64_t floats)
{
    return (floats + SWAP_GRAIN - 1) / SWAP_GRAIN * SWAP_GRAIN;
}

typedef struct {
    union { /* zr_zpart's fields, by name here (C11 anonymous members) */
        zr_zpart part;
        struct {
            uint64_t numel, P, full; /* full = W P */
            uint64_t lo, n;          /* this rank's partition */
            uint64_t foff, ooff;     /* offsets in the full and the own (P per group) arenas */
            int big;                 /* larger than a slot: buffers of its own */
        };
    };
    float *pbig, *gbig;      /* big groups' buffers (stage 3 params, stage 2-3 grads) */
    int pbig_busy, gbig_busy;
    float *plent, *glent;    /* what the model holds now */
} grp;

enum { OP_GATHER, OP_RS_GRAD, OP_ALLREDUCE, OP_RS_INPLACE, OP_AG_INPLACE, OP_GATHER_F64,
       OP_BCAST };

typedef struct {
    int kind;
    size_t g;
    float *buf;
    const void *send;
    void *recv;
    size_t n;
    int root;
    uint64_t seq;
} op;

typedef struct {
    size_t g;
    float *buf;
    uint64_t seq; /* 0: not issued */
} entry;

struct zr_zero {
    zr_zdev *dev; /* a device engine (zero_dev.c): every call below goes there */
    zr_comm *comm;
    int rank, W, stage;
    unsigned prefetch;
    size_t ng;
    grp *G;
    uint64_t sum_full, sum_P, slot; /* slot: elements of an ordinary gather/grad buffer */
    const zck_layout *L;
    float *fullp, *fullg, *ownp, *owng, *m, *v;
    /* offload to NVMe */
    int off_opt, off_par;
    zck_swap *osw, *psw;      /* exp_avg region then exp_avg_sq region; param partitions */
    uint64_t *soff, *poff;    /* per group, float offsets inside a region */
    uint64_t oreg, preg;      /* floats per region */
    size_t chunk;             /* floats per staging chunk (multiple of SWAP_GRAIN) */
    unsigned nbufs, aio_depth;
    float *cbuf, *gstage;     /* nbufs x 3 chunks; one partition for offloaded gathers */
    size_t bytes_cbuf, bytes_gstage;
    size_t bytes_fullp, bytes_fullg, bytes_ownp, bytes_owng, bytes_mv;
    float **pslots, **gslots; /* free lists (stack) */
    size_t n_pslots, n_gslots, pfree, gfree;
    float *slot_mem;
    size_t bytes_slots, bytes_big;
    /* stage 3 schedule */
    entry *sched;
    size_t n_sched, cursor, issued;
    /* comm thread */
    pthread_t th;
    int th_started, quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op q[QCAP];
    size_t qhead, qlen;
    uint64_t next_seq, done_seq;
    int err;          /* sticky: the first failed collective */
    char errmsg[512];
};

static void reset_buffers_locked(zr_zero *z);

/* A device engine's call goes to zero_dev.c. */
#define DEV_RETURN(call)                                                                       \
    do {                                                                                       \
        if (z->dev)                                                                            \
            return call;                                                                       \
    } while (0)
#define DEV_DO(call)                                                                           \
    do {                                                                                       \
        if (z->dev) {                                                                          \
            call;                                                                              \
            return;                                                                            \
        }                                                                                      \
    } while (0)

/* ---------------------------------------------------------------- sizes */

static void *alloc_array(size_t *bytes)
{
    size_t n = *bytes ? *bytes : 64;
    void *p = NULL;
    if (n >= BIG_ARRAY) { /* 2 MiB aligned, whole pages, huge pages advised */
        n = (n + 4095) & ~(size_t)4095;
        if (posix_memalign(&p, (size_t)2 << 20, n))
            return NULL;
#ifdef MADV_HUGEPAGE
        madvise(p, n, MADV_HUGEPAGE);
#endif
    } else { /* 4 KiB aligned: staging chunks go straight to O_DIRECT swap files */
        n = (n + 63) & ~(size_t)63;
        if (posix_memalign(&p, 4096, n))
            return NULL;
    }
    memset(p, 0, n);
    *bytes = n;
    return p;
}

/* Partition every group; sum_full, sum_P, slot and each group's offsets. */
int zr__zero_parts(const zck_layout *L, int W, int rank, zr_zpart **out, uint64_t *sum_full,
                   uint64_t *sum_P, uint64_t *slot)
{
    size_t ng = zck_layout_n_groups(L);
    zr_zpart *G = calloc(ng ? ng : 1, sizeof *G);
    if (!G)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    *sum_full = *sum_P = *slot = 0;
    for (size_t g = 0; g < ng; g++) {
        zr_zpart *p = &G[g];
        p->numel = zck_layout_group_numel(L, g);
        uint64_t s0, c0;
        zck_partition(p->numel, (uint32_t)W, 0, ZR_ZERO_ALIGN, &s0, &c0);
        p->P = c0 ? c0 : ZR_ZERO_ALIGN;
        p->full = (uint64_t)W * p->P;
        zck_partition(p->numel, (uint32_t)W, (uint32_t)rank, ZR_ZERO_ALIGN, &p->lo, &p->n);
        p->foff = *sum_full;
        p->ooff = *sum_P;
        *sum_full += p->full;
        *sum_P += p->P;
    }
    /* ordinary buffers hold the largest group past the embeddings; bigger groups (GPT-2's
     * token embedding) get buffers of their own */
    for (size_t g = ng > 2 ? 2 : 0; g < ng; g++)
        if (G[g].full > *slot)
            *slot = G[g].full;
    for (size_t g = 0; g < ng; g++)
        G[g].big = G[g].full > *slot;
    *out = G;
    return 0;
}

int zr__zero_schedule(const size_t *fwd, size_t nf, const size_t *bwd, size_t nb,
                      unsigned n_micro, size_t **out, size_t *n)
{
    *n = (size_t)n_micro * (nf + nb);
    size_t *s = calloc(*n ? *n : 1, sizeof *s), k = 0;
    if (!(*out = s))
        return zr_err_set(ZR_ENOMEM, "out of memory for the ZeRO-3 schedule");
    for (unsigned i = 0; i < n_micro; i++) {
        memcpy(s + k, fwd, nf * sizeof *s);
        memcpy(s + k + nf, bwd, nb * sizeof *s);
        k += nf + nb;
    }
    return 0;
}

int zr__zero_tensors(const zck_layout *L, size_t g, uint64_t a0, uint64_t cnt, zr_ztensor_fn f,
                     void *ctx)
{
    for (size_t k = 0; k < zck_layout_group_n_tensors(L, g); k++) {
        zck_tensor_info ti;
        zck_layout_tensor(L, g, k, &ti);
        uint64_t a = ti.offset > a0 ? ti.offset : a0;
        uint64_t b = ti.offset + ti.numel < a0 + cnt ? ti.offset + ti.numel : a0 + cnt;
        if (a < b)
            ZR_TRY(f(ctx, a - a0, b - a, ti.ndim >= 2));
    }
    return 0;
}

int zr__zero_chunks(const zck_layout *L, int W, int rank, int stage, uint64_t chunk,
                    zr_zchunk **out, size_t *n)
{
    size_t ng = zck_layout_n_groups(L), cnt = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        cnt = 0;
        for (size_t g = 0; g < ng; g++) {
            uint64_t lo = 0, m = zck_layout_group_numel(L, g);
            if (stage > 0)
                zck_partition(m, (uint32_t)W, (uint32_t)rank, ZR_ZERO_ALIGN, &lo, &m);
            for (uint64_t off = 0; off < m; off += chunk, cnt++)
                if (pass)
                    (*out)[cnt] = (zr_zchunk){g, off, m - off < chunk ? m - off : chunk};
        }
        if (!pass && !(*out = calloc(cnt ? cnt : 1, sizeof **out)))
            return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    *n = cnt;
    return 0;
}

int zr__zero_part_sumsq(const zck_layout *L, int W, int q, float *const *base, zr_zsumsq_fn sq,
                        void *ctx, double *out)
{
    double s = 0;
    for (size_t g = 0; g < zck_layout_n_groups(L); g++) {
        uint64_t lo, n;
        zck_partition(zck_layout_group_numel(L, g), (uint32_t)W, (uint32_t)q, ZR_ZERO_ALIGN,
                      &lo, &n);
        double x = 0;
        if (n)
            ZR_TRY(sq(ctx, base[g] + lo, (size_t)n, &x));
        s += x;
    }
    *out = s;
    return 0;
}

int zr__zero_swap_fill(zck_swap *sw, float *stage, uint64_t win, uint64_t at, uint64_t n,
                       zr_zproduce_fn produce, void *ctx)
{
    uint64_t t[2] = {0, 0};
    for (uint64_t off = 0, k = 0; off < n; off += win, k++) {
        uint64_t cnt = n - off < win ? n - off : win;
        float *b = stage + (k % 2) * win;
        ZR_TRY(zck_swap_wait(sw, t[k % 2])); /* this window's last write is done */
        memset(b + cnt, 0, (grain_up(cnt) - cnt) * sizeof(float));
        ZR_TRY(produce(ctx, off, cnt, b));
        ZR_TRY(zck_swap_write(sw, b, grain_up(cnt) * sizeof(float), (at + off) * sizeof(float),
                              &t[k % 2]));
    }
    return zck_swap_wait(sw, UINT64_MAX);
}

int zr__zero_swap_to_sink(zck_swap *sw, float *stage, uint64_t win, uint64_t first, uint64_t n,
                          const zr_zero_sink *w)
{
    uint64_t end = first + n, t[2] = {0, 0}, a = first / SWAP_GRAIN * SWAP_GRAIN;
    ZR_TRY(zck_swap_read(sw, stage, grain_up(end - a < win ? end - a : win) * sizeof(float),
                         a * sizeof(float), &t[0]));
    for (uint64_t at = a, k = 0; at < end; at += win, k++) {
        uint64_t next = at + win;
        if (next < end)
            ZR_TRY(zck_swap_read(sw, stage + ((k + 1) % 2) * win,
                                 grain_up(end - next < win ? end - next : win) * sizeof(float),
                                 next * sizeof(float), &t[(k + 1) % 2]));
        ZR_TRY(zck_swap_wait(sw, t[k % 2]));
        const float *b = stage + (k % 2) * win;
        uint64_t from = at < first ? first : at, to = next < end ? next : end;
        ZR_TRY(w->write(w->ctx, b + (from - at), (size_t)(to - from) * sizeof(float)));
    }
    return 0;
}

int zr__zero_check_swap_opts(const zr_zero_opts *o)
{
    if (!o->swap_dir || !o->swap_dir[0])
        return zr_err_set(ZR_EINVAL, "offload to nvme needs --nvme-path DIR");
    if (o->aio_block < 4096 || o->aio_block % 4096 || o->aio_block > ((size_t)256 << 20))
        return zr_err_set(ZR_EINVAL, "--aio-block-size %zu: expected a multiple of 4096 up to "
                          "256 MiB", o->aio_block);
    if (o->aio_depth < 1 || o->aio_depth > 1024)
        return zr_err_set(ZR_EINVAL, "--aio-queue-depth %u: expected 1..1024", o->aio_depth);
    return 0;
}

static int size_groups(zr_zero *z, const zck_layout *L)
{
    z->ng = zck_layout_n_groups(L);
    zr_zpart *pp;
    ZR_TRY(zr__zero_parts(L, z->W, z->rank, &pp, &z->sum_full, &z->sum_P, &z->slot));
    if (!(z->G = calloc(z->ng ? z->ng : 1, sizeof *z->G))) {
        free(pp);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    for (size_t g = 0; g < z->ng; g++)
        z->G[g].part = pp[g];
    free(pp);
    /* swap regions: each group's opt range (param partition) from a 4 KiB boundary */
    if (z->off_opt || z->off_par) {
        if (!(z->soff = calloc(z->ng + 1, sizeof *z->soff)) ||
            !(z->poff = calloc(z->ng + 1, sizeof *z->poff)))
            return zr_err_set(ZR_ENOMEM, "out of memory");
        for (size_t g = 0; g < z->ng; g++) {
            const grp *p = &z->G[g];
            z->soff[g + 1] = z->soff[g] + grain_up(z->stage == 0 ? p->numel : p->P);
            z->poff[g + 1] = z->poff[g] + grain_up(p->P);
        }
        z->oreg = z->soff[z->ng];
        z->preg = z->poff[z->ng];
    }
    return 0;
}

static size_t round_bytes(uint64_t floats)
{
    size_t b = (size_t)floats * sizeof(float);
    if (!b)
        b = 64;
    return b >= BIG_ARRAY ? (b + 4095) & ~(size_t)4095 : (b + 63) & ~(size_t)63;
}

static void account(const zr_zero *z, zr_zero_bytes *out)
{
    memset(out, 0, sizeof *out);
    int s = z->stage;
    out->params = s < 3 ? round_bytes(z->sum_full) : round_bytes(z->sum_P);
    out->grads = s < 2 ? round_bytes(z->sum_full) : round_bytes(z->sum_P);
    out->optimizer = 2 * (s == 0 ? round_bytes(z->sum_full) : round_bytes(z->sum_P));
    uint64_t slots = 0, big = 0;
    if (s >= 2)
        slots += (uint64_t)GRAD_SLOTS * z->slot;
    if (s == 3)
        slots += (uint64_t)(z->prefetch + 2) * z->slot;
    for (size_t g = 0; g < z->ng; g++)
        if (z->G[g].big)
            big += (s >= 2 ? z->G[g].full : 0) + (s == 3 ? z->G[g].full : 0);
    out->buffers = (slots ? round_bytes(slots) : 0) + big * sizeof(float);
    if (z->off_opt) {
        out->optimizer = 0;
        out->nvme += 2 * z->oreg * sizeof(float);
    }
    if (z->off_par) {
        out->params = 0;
        out->nvme += z->preg * sizeof(float);
        uint64_t maxP = 0;
        for (size_t g = 0; g < z->ng; g++)
            maxP = z->G[g].P > maxP ? z->G[g].P : maxP;
        out->buffers += round_bytes(grain_up(maxP));
    }
    if (z->off_opt || z->off_par)
        out->buffers += round_bytes((uint64_t)z->nbufs * 3 * z->chunk);
}

/* The offload settings into z (before sizing). */
static int offload_setup(zr_zero *z, const zr_zero_opts *o)
{
    z->off_opt = o->offload_optimizer;
    z->off_par = o->offload_params;
    if (z->off_par && o->stage != 3)
        return zr_err_set(ZR_EINVAL, "--offload-params nvme needs --zero 3 (at stages 0-2 "
                          "every rank holds all parameters)");
    if (!z->off_opt && !z->off_par)
        return 0;
    ZR_TRY(zr__zero_check_swap_opts(o));
    if (o->buffers < 2 || o->buffers > 64)
        return zr_err_set(ZR_EINVAL, "--offload-buffers %u: expected 2..64 (double buffering "
                          "at least)", o->buffers);
    z->chunk = o->aio_block / sizeof(float);
    z->nbufs = o->buffers;
    z->aio_depth = o->aio_depth;
    return 0;
}

int zr_zero_plan(zr_zero_bytes *out, const zck_layout *L, int world, int rank,
                 const zr_zero_opts *o)
{
    zr_zero z;
    memset(&z, 0, sizeof z);
    z.W = world;
    z.rank = rank;
    z.stage = o->stage;
    z.prefetch = o->stage == 3 ? o->prefetch : 0;
    int rc = offload_setup(&z, o);
    if (!rc)
        rc = size_groups(&z, L);
    if (!rc)
        account(&z, out);
    free(z.G);
    free(z.soff);
    free(z.poff);
    return rc;
}

void zr_zero_mem(const zr_zero *z, zr_zero_bytes *out)
{
    DEV_DO(zd_mem(z->dev, out));
    memset(out, 0, sizeof *out);
    int s = z->stage;
    out->params = s < 3 ? z->bytes_fullp : z->bytes_ownp;
    out->grads = s < 2 ? z->bytes_fullg : z->bytes_owng;
    out->optimizer = z->bytes_mv;
    out->buffers = z->bytes_slots + z->bytes_big + z->bytes_cbuf + z->bytes_gstage;
    if (z->osw)
        out->nvme += zck_swap_size(z->osw);
    if (z->psw)
        out->nvme += zck_swap_size(z->psw);
}

/* ---------------------------------------------------------------- the comm thread */

static int run_op(zr_zero *z, op *o)
{
    zr_comm *c = z->comm;
    int rc = 0;
    switch (o->kind) {
    case OP_GATHER: {
        const grp *p = &z->G[o->g];
        const float *mine = z->ownp ? z->ownp + p->ooff : z->gstage;
        uint64_t t;
        if (!z->ownp) /* offloaded: the partition comes from its swap file first */
            rc = zck_swap_read(z->psw, z->gstage, grain_up(p->P) * sizeof(float),
                               z->poff[o->g] * sizeof(float), &t);
        if (!rc && !z->ownp)
            rc = zck_swap_wait(z->psw, t);
        if (!rc)
            rc = zr_comm_all_gather(c, mine, o->buf, p->P, sizeof(float));
        break;
    }
    case OP_RS_GRAD: {
        grp *p = &z->G[o->g];
        float *mine = o->buf + (size_t)z->rank * p->P;
        rc = zr_comm_reduce_scatter(c, o->buf, mine, p->P, ZR_COMM_F32);
        if (!rc) {
            float *restrict acc = z->owng + p->ooff;
            const float *restrict x = mine;
            for (uint64_t i = 0; i < p->P; i++)
                acc[i] += x[i];
        }
        break;
    }
    case OP_ALLREDUCE:
        rc = zr_comm_all_reduce(c, o->send, o->recv, o->n, ZR_COMM_F32);
        break;
    case OP_RS_INPLACE:
        rc = zr_comm_reduce_scatter(c, o->buf, o->buf + (size_t)z->rank * o->n, o->n,
                                    ZR_COMM_F32);
        break;
    case OP_AG_INPLACE:
        rc = zr_comm_all_gather(c, o->buf + (size_t)z->rank * o->n, o->buf, o->n,
                                sizeof(float));
        break;
    case OP_GATHER_F64:
        rc = zr_comm_all_gather(c, o->send, o->recv, o->n, sizeof(double));
        break;
    case OP_BCAST:
        rc = zr_comm_broadcast(c, o->recv, o->n, o->root);
        break;
    }
    return rc;
}

/* a buffer back to its free list (mutex held) */
static void release_grad_buf(zr_zero *z, size_t g, float *buf)
{
    grp *p = &z->G[g];
    if (p->big)
        p->gbig_busy = 0;
    else
        z->gslots[z->gfree++] = buf;
}

static void *comm_main(void *arg)
{
    zr_zero *z = arg;
    pthread_mutex_lock(&z->mu);
    for (;;) {
        while (!z->qlen && !z->quit)
            pthread_cond_wait(&z->cv, &z->mu);
        if (!z->qlen && z->quit)
            break;
        op o = z->q[z->qhead];
        int failed = z->err != 0;
        pthread_mutex_unlock(&z->mu);
        int rc = failed ? 0 : run_op(z, &o);
        char msg[sizeof z->errmsg];
        if (rc)
            snprintf(msg, sizeof msg, "%s", zr_err_msg());
        pthread_mutex_lock(&z->mu);
        if (rc && !z->err) {
            z->err = rc;
            snprintf(z->errmsg, sizeof z->errmsg, "%s", msg);
        }
        if (o.kind == OP_RS_GRAD)
            release_grad_buf(z, o.g, o.buf);
        z->qhead = (z->qhead + 1) % QCAP;
        z->qlen--;
        z->done_seq = o.seq;
        pthread_cond_broadcast(&z->cv);
    }
    pthread_mutex_unlock(&z->mu);
    return NULL;
}

/* The sticky error as this thread's error (mutex held). */
static int sticky(zr_zero *z)
{
    return zr_err_set(z->err, "%s", z->errmsg);
}

/* Queue an op (mutex held); its sequence number. */
static int submit_locked(zr_zero *z, op o, uint64_t *seq)
{
    while (z->qlen == QCAP && !z->err)
        pthread_cond_wait(&z->cv, &z->mu);
    if (z->err)
        return sticky(z);
    o.seq = ++z->next_seq;
    z->q[(z->qhead + z->qlen) % QCAP] = o;
    z->qlen++;
    pthread_cond_broadcast(&z->cv);
    if (seq)
        *seq = o.seq;
    return 0;
}

static int wait_locked(zr_zero *z, uint64_t seq)
{
    while (z->done_seq < seq && !z->err)
        pthread_cond_wait(&z->cv, &z->mu);
    return z->err ? sticky(z) : 0;
}

/* Run an op and wait for it (and everything before it). */
static int run_sync(zr_zero *z, op o)
{
    pthread_mutex_lock(&z->mu);
    uint64_t seq = 0;
    int rc = submit_locked(z, o, &seq);
    if (!rc)
        rc = wait_locked(z, seq);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

static int drain(zr_zero *z)
{
    pthread_mutex_lock(&z->mu);
    int rc = wait_locked(z, z->next_seq);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

/* ---------------------------------------------------------------- construction */

static int open_swaps(zr_zero *z, const char *dir)
{
    char path[4096];
    if (z->off_opt) {
        snprintf(path, sizeof path, "%s/optimizer.swap", dir);
        ZR_TRY(zck_swap_open(&z->osw, path, 2 * z->oreg * sizeof(float), z->aio_depth,
                             z->chunk * sizeof(float)));
    }
    if (z->off_par) {
        snprintf(path, sizeof path, "%s/params.swap", dir);
        ZR_TRY(zck_swap_open(&z->psw, path, z->preg * sizeof(float), z->aio_depth,
                             z->chunk * sizeof(float)));
    }
    return 0;
}

int zr_zero_new(zr_zero **out, zr_comm *comm, const zck_layout *L, const zr_zero_opts *o)
{
    *out = NULL;
    if (o->stage < 0 || o->stage > 3)
        return zr_err_set(ZR_EINVAL, "--zero %d: expected 0..3", o->stage);
    zr_zero *z = calloc(1, sizeof *z);
    if (!z)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    z->comm = comm;
    z->rank = zr_comm_rank(comm);
    z->W = zr_comm_world(comm);
    z->stage = o->stage;
    z->L = L;
    z->prefetch = o->stage == 3 ? o->prefetch : 0;
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    int rc = offload_setup(z, o);
    if (!rc)
        rc = size_groups(z, L);
    if (rc) {
        zr_zero_free(z);
        return rc;
    }
    int s = z->stage, ok = 1;
#define ARR(ptr, floats, bytesvar)                                                             \
    do {                                                                                       \
        z->bytesvar = (size_t)(floats) * sizeof(float);                                        \
        ok = ok && (z->ptr = alloc_array(&z->bytesvar)) != NULL;                               \
    } while (0)
    if (s < 3)
        ARR(fullp, z->sum_full, bytes_fullp);
    else if (!z->off_par)
        ARR(ownp, z->sum_P, bytes_ownp);
    if (s < 2)
        ARR(fullg, z->sum_full, bytes_fullg);
    else
        ARR(owng, z->sum_P, bytes_owng);
    if (!z->off_opt) {
        size_t mvb = 0;
        ARR(m, s == 0 ? z->sum_full : z->sum_P, bytes_mv);
        mvb = z->bytes_mv;
        ARR(v, s == 0 ? z->sum_full : z->sum_P, bytes_mv);
        z->bytes_mv += mvb;
    }
    if (z->off_opt || z->off_par)
        ARR(cbuf, (size_t)z->nbufs * 3 * z->chunk, bytes_cbuf);
    if (z->off_par) {
        uint64_t maxP = 0;
        for (size_t g = 0; g < z->ng; g++)
            maxP = z->G[g].P > maxP ? z->G[g].P : maxP;
        ARR(gstage, grain_up(maxP), bytes_gstage);
    }
#undef ARR
    if (ok && s >= 2) {
        z->n_gslots = GRAD_SLOTS;
        z->n_pslots = s == 3 ? z->prefetch + 2 : 0;
        size_t n = z->n_gslots + z->n_pslots;
        z->bytes_slots = (size_t)z->slot * n * sizeof(float);
        ok = (z->slot_mem = alloc_array(&z->bytes_slots)) != NULL &&
             (z->gslots = calloc(n, sizeof *z->gslots)) != NULL &&
             (z->pslots = calloc(n, sizeof *z->pslots)) != NULL;
        if (ok)
            reset_buffers_locked(z); /* no thread yet */
        for (size_t g = 0; ok && g < z->ng; g++) {
            grp *p = &z->G[g];
            if (!p->big)
                continue;
            size_t b = (size_t)p->full * sizeof(float);
            ok = (p->gbig = alloc_array(&b)) != NULL;
            z->bytes_big += b;
            if (ok && s == 3) {
                b = (size_t)p->full * sizeof(float);
                ok = (p->pbig = alloc_array(&b)) != NULL;
                z->bytes_big += b;
            }
        }
    }
    if (!ok) {
        zr_zero_free(z);
        return zr_err_set(ZR_ENOMEM, "out of memory for the ZeRO stage %d states of %llu "
                          "parameters on rank %d of %d", s, (unsigned long long)z->sum_full,
                          z->rank, z->W);
    }
    if ((rc = open_swaps(z, o->swap_dir))) {
        zr_zero_free(z);
        return rc;
    }
    if ((rc = pthread_create(&z->th, NULL, comm_main, z))) {
        zr_zero_free(z);
        return zr_err_sys(rc, "starting the comm thread");
    }
    z->th_started = 1;
    *out = z;
    return 0;
}

void zr_zero_free(zr_zero *z)
{
    if (!z)
        return;
    if (z->dev) {
        zd_free(z->dev);
        free(z);
        return;
    }
    if (z->th_started) {
        pthread_mutex_lock(&z->mu);
        z->quit = 1;
        pthread_cond_broadcast(&z->cv);
        pthread_mutex_unlock(&z->mu);
        pthread_join(z->th, NULL);
    }
    for (size_t g = 0; z->G && g < z->ng; g++) {
        free(z->G[g].pbig);
        free(z->G[g].gbig);
    }
    free(z->G);
    free(z->fullp);
    free(z->fullg);
    free(z->ownp);
    free(z->owng);
    free(z->m);
    free(z->v);
    free(z->slot_mem);
    free(z->pslots);
    free(z->gslots);
    free(z->sched);
    zck_swap_close(z->osw, 1); /* scratch: removed */
    zck_swap_close(z->psw, 1);
    free(z->soff);
    free(z->poff);
    free(z->cbuf);
    free(z->gstage);
    pthread_mutex_destroy(&z->mu);
    pthread_cond_destroy(&z->cv);
    free(z);
}

int zr_zero_new_device(zr_zero **out, zr_comm *comm, const zck_layout *L,
                       const zr_zero_opts *o, const zr_device_ops *ops, zr_dev_comm *dc)
{
    *out = NULL;
    zr_zero *z = calloc(1, sizeof *z);
    if (!z)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    z->comm = comm; /* the host's small collectives; the rest is the device engine's */
    int rc = zd_new(&z->dev, comm, L, o, ops, dc);
    if (rc) {
        free(z);
        return rc;
    }
    *out = z;
    return 0;
}

int zr_zero_attach_device(zr_zero *z, zr_dev_model *m, unsigned n_micro)
{
    return zd_attach(z->dev, m, n_micro);
}

void zr_zero_attach(zr_zero *z, const zr_model *m, unsigned n_micro)
{
    if (z->stage != 3)
        return;
    size_t fwd[1024], bwd[1024];
    size_t L = zr_model_config(m)->layers;
    assert(L + 4 <= 1024);
    size_t nf = zr_model_fetch_order(m, 0, fwd), nb = zr_model_fetch_order(m, 1, bwd);
    free(z->sched);
    z->sched = NULL;
    z->n_sched = 0;
    size_t *order, n;
    if (zr__zero_schedule(fwd, nf, bwd, nb, n_micro, &order, &n))
        return; /* begin_step reports it */
    if ((z->sched = calloc(n ? n : 1, sizeof *z->sched))) {
        z->n_sched = n;
        for (size_t k = 0; k < n; k++)
            z->sched[k].g = order[k];
    }
    free(order);
}

/* ---------------------------------------------------------------- ranges */

void zr_zero_part_range(const zr_zero *z, size_t g, uint64_t *lo, uint64_t *n)
{
    DEV_DO(zd_part_range(z->dev, g, lo, n));
    *lo = z->G[g].lo;
    *n = z->G[g].n;
}

void zr_zero_opt_range(const zr_zero *z, size_t g, uint64_t *lo, uint64_t *n)
{
    DEV_DO(zd_opt_range(z->dev, g, lo, n));
    if (z->stage == 0) {
        *lo = 0;
        *n = z->G[g].numel;
    } else
        zr_zero_part_range(z, g, lo, n);
}

float *zr_zero_param(zr_zero *z, size_t g)
{
    const grp *p = &z->G[g];
    if (z->off_par)
        return NULL;
    if (z->stage == 0)
        return z->fullp + p->foff;
    return z->stage < 3 ? z->fullp + p->foff + p->lo : z->ownp + p->ooff;
}

float *zr_zero_grad(zr_zero *z, size_t g)
{
    const grp *p = &z->G[g];
    if (z->stage == 0)
        return z->fullg + p->foff;
    return z->stage < 2 ? z->fullg + p->foff + p->lo : z->owng + p->ooff;
}

float *zr_zero_exp_avg(zr_zero *z, size_t g)
{
    if (z->off_opt)
        return NULL;
    return z->m + (z->stage == 0 ? z->G[g].foff : z->G[g].ooff);
}

float *zr_zero_exp_avg_sq(zr_zero *z, size_t g)
{
    if (z->off_opt)
        return NULL;
    return z->v + (z->stage == 0 ? z->G[g].foff : z->G[g].ooff);
}

float *zr_zero_full_params(zr_zero *z, size_t g)
{
    return z->stage < 3 ? z->fullp + z->G[g].foff : NULL;
}

/* ---------------------------------------------------------------- hooks */

/* Issue the schedule's gathers in order up to cursor + prefetch, while buffers allow (mutex
 * held). The entry at the cursor is always issuable: the model holds at most two groups. */
static int issue_more_locked(zr_zero *z, size_t upto)
{
    while (z->issued < z->n_sched && z->issued <= upto) {
        entry *e = &z->sched[z->issued];
        grp *p = &z->G[e->g];
        if (p->big) {
            if (p->pbig_busy)
                break;
            p->pbig_busy = 1;
            e->buf = p->pbig;
        } else {
            if (!z->pfree)
                break;
            e->buf = z->pslots[--z->pfree];
        }
        op o = {.kind = OP_GATHER, .g = e->g, .buf = e->buf};
        ZR_TRY(submit_locked(z, o, &e->seq));
        z->issued++;
    }
    return 0;
}

static int hook_params(void *ctx, size_t g, const float **out)
{
    zr_zero *z = ctx;
    if (z->stage < 3) {
        *out = z->fullp + z->G[g].foff;
        return 0;
    }
    pthread_mutex_lock(&z->mu);
    int rc = 0;
    size_t c = z->cursor;
    if (c >= z->n_sched || z->sched[c].g != g) {
        rc = zr_err_set(ZR_ERROR, "ZeRO-3: the model asked for group %zu out of the gather "
                        "schedule (position %zu of %zu)", g, c, z->n_sched);
        goto out;
    }
    if ((rc = issue_more_locked(z, c + z->prefetch)))
        goto out;
    if (z->issued <= c) {
        rc = zr_err_set(ZR_ERROR, "ZeRO-3: no gather buffer free for group %zu", g);
        goto out;
    }
    if ((rc = wait_locked(z, z->sched[c].seq)))
        goto out;
    z->G[g].plent = z->sched[c].buf;
    z->cursor++;
    *out = z->G[g].plent;
out:
    pthread_mutex_unlock(&z->mu);
    return rc;
}

static void hook_params_done(void *ctx, size_t g)
{
    zr_zero *z = ctx;
    if (z->stage < 3)
        return;
    pthread_mutex_lock(&z->mu);
    grp *p = &z->G[g];
    if (p->plent) {
        if (p->big)
            p->pbig_busy = 0;
        else
            z->pslots[z->pfree++] = p->plent;
        p->plent = NULL;
        /* an error here resurfaces at the next fetch or wait */
        issue_more_locked(z, z->cursor + z->prefetch);
    }
    pthread_mutex_unlock(&z->mu);
}

static int hook_grads(void *ctx, size_t g, float **out)
{
    zr_zero *z = ctx;
    grp *p = &z->G[g];
    if (z->stage < 2) {
        *out = z->fullg + p->foff;
        return 0;
    }
    pthread_mutex_lock(&z->mu);
    int rc = 0;
    if (p->big) {
        while (p->gbig_busy && !z->err)
            pthread_cond_wait(&z->cv, &z->mu);
        if (!z->err) {
            p->gbig_busy = 1;
            p->glent = p->gbig;
        }
    } else {
        while (!z->gfree && !z->err)
            pthread_cond_wait(&z->cv, &z->mu);
        if (!z->err)
            p->glent = z->gslots[--z->gfree];
    }
    if (z->err)
        rc = sticky(z);
    pthread_mutex_unlock(&z->mu);
    if (rc)
        return rc;
    memset(p->glent, 0, (size_t)p->full * sizeof(float));
    *out = p->glent;
    return 0;
}

static int hook_grads_done(void *ctx, size_t g)
{
    zr_zero *z = ctx;
    grp *p = &z->G[g];
    if (z->stage < 2)
        return 0;
    pthread_mutex_lock(&z->mu);
    op o = {.kind = OP_RS_GRAD, .g = g, .buf = p->glent};
    p->glent = NULL;
    int rc = submit_locked(z, o, NULL);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

void zr_zero_hooks(zr_zero *z, zr_model_hooks *h)
{
    DEV_DO(zd_hooks(z->dev, h));
    memset(h, 0, sizeof *h);
    h->ctx = z; /* at every stage: the model has no arenas of its own */
    h->params = hook_params;
    h->params_done = hook_params_done;
    h->grads = hook_grads;
    h->grads_done = hook_grads_done;
}

/* ---------------------------------------------------------------- the step */

/* Every buffer free again: between steps nothing is in flight and the model holds nothing,
 * even when the last step failed half-way (mutex held). */
static void reset_buffers_locked(zr_zero *z)
{
    size_t n = z->n_gslots + z->n_pslots;
    z->gfree = z->pfree = 0;
    for (size_t i = 0; i < n; i++) {
        float *b = z->slot_mem + (size_t)i * z->slot;
        if (i < z->n_gslots)
            z->gslots[z->gfree++] = b;
        else
            z->pslots[z->pfree++] = b;
    }
    for (size_t g = 0; g < z->ng; g++) {
        grp *p = &z->G[g];
        p->pbig_busy = p->gbig_busy = 0;
        p->plent = p->glent = NULL;
    }
}

int zr_zero_begin_step(zr_zero *z)
{
    DEV_RETURN(zd_begin_step(z->dev));
    ZR_TRY(drain(z));
    if (z->stage >= 2) {
        pthread_mutex_lock(&z->mu);
        reset_buffers_locked(z);
        pthread_mutex_unlock(&z->mu);
    }
    if (z->stage < 2)
        memset(z->fullg, 0, (size_t)z->sum_full * sizeof(float));
    else
        memset(z->owng, 0, (size_t)z->sum_P * sizeof(float));
    if (z->stage == 3) {
        if (!z->sched)
            return zr_err_set(ZR_ENOMEM, "out of memory for the ZeRO-3 schedule");
        /* the first gathers start now, overlapping the batch's sampling */
        pthread_mutex_lock(&z->mu);
        z->cursor = z->issued = 0;
        int rc = z->prefetch ? issue_more_locked(z, z->prefetch - 1) : 0;
        pthread_mutex_unlock(&z->mu);
        return rc;
    }
    return 0;
}

int zr_zero_reduce(zr_zero *z)
{
    DEV_RETURN(zd_reduce(z->dev));
    if (z->stage == 0)
        return run_sync(z, (op){.kind = OP_ALLREDUCE, .send = z->fullg, .recv = z->fullg,
                                .n = z->sum_full});
    if (z->stage == 1) {
        pthread_mutex_lock(&z->mu);
        int rc = 0;
        for (size_t g = 0; g < z->ng && !rc; g++)
            rc = submit_locked(z, (op){.kind = OP_RS_INPLACE, .buf = z->fullg + z->G[g].foff,
                                       .n = z->G[g].P}, NULL);
        pthread_mutex_unlock(&z->mu);
        if (rc)
            return rc;
    }
    return drain(z);
}

static int host_sumsq(void *ctx, const float *x, size_t n, double *out)
{
    (void)ctx;
    *out = zr_sumsq(x, n);
    return 0;
}

int zr_zero_sumsq(zr_zero *z, double *out)
{
    DEV_RETURN(zd_sumsq(z->dev, out));
    float **base = calloc(z->ng ? z->ng : 1, sizeof *base);
    double *all = calloc((size_t)z->W, sizeof *all);
    int rc = 0;
    if (!base || !all) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    double total = 0, x;
    if (z->stage == 0) { /* every partition is here: the same sums as the ranks of stage 1+ */
        for (size_t g = 0; g < z->ng; g++)
            base[g] = z->fullg + z->G[g].foff;
        for (int q = 0; q < z->W; q++) {
            zr__zero_part_sumsq(z->L, z->W, q, base, host_sumsq, NULL, &x);
            total += x;
        }
    } else {
        for (size_t g = 0; g < z->ng; g++) /* element i of group g at base[g][i] */
            base[g] = zr_zero_grad(z, g) - z->G[g].lo;
        double mine = 0;
        zr__zero_part_sumsq(z->L, z->W, z->rank, base, host_sumsq, NULL, &mine);
        if ((rc = zr_zero_gather_f64(z, &mine, 1, all)))
            goto out;
        for (int q = 0; q < z->W; q++)
            total += all[q];
    }
    *out = total;
out:
    free(base);
    free(all);
    return rc;
}

int zr_zero_publish(zr_zero *z)
{
    DEV_RETURN(zd_publish(z->dev));
    if (z->stage != 1 && z->stage != 2)
        return 0;
    pthread_mutex_lock(&z->mu);
    int rc = 0;
    for (size_t g = 0; g < z->ng && !rc; g++)
        rc = submit_locked(z, (op){.kind = OP_AG_INPLACE, .buf = z->fullp + z->G[g].foff,
                                   .n = z->G[g].P}, NULL);
    pthread_mutex_unlock(&z->mu);
    return rc ? rc : drain(z);
}

int zr_zero_gather_f64(zr_zero *z, const double *mine, size_t n, double *all)
{
    DEV_RETURN(zr_comm_all_gather(z->comm, mine, all, n, sizeof(double)));
    return run_sync(z, (op){.kind = OP_GATHER_F64, .send = mine, .recv = all, .n = n});
}

int zr_zero_broadcast(zr_zero *z, void *buf, size_t bytes, int root)
{
    DEV_RETURN(zr_comm_broadcast(z->comm, buf, bytes, root));
    return run_sync(z, (op){.kind = OP_BCAST, .recv = buf, .n = bytes, .root = root});
}

/* ---------------------------------------------------------------- states, offloaded or not */

int zr_zero_offloaded(const zr_zero *z)
{
    DEV_RETURN(zd_offloaded(z->dev));
    return z->off_opt || z->off_par;
}

int zr_zero_check_swap(zr_zero *z)
{
    DEV_RETURN(zd_check_swap(z->dev));
    if (z->osw)
        ZR_TRY(zck_swap_check(z->osw));
    if (z->psw)
        ZR_TRY(zck_swap_check(z->psw));
    return 0;
}

/* Where state s (0 param, 1 exp_avg, 2 exp_avg_sq) of group g lives: in memory (element `lo`
 * of the opt range at *mem), or in a swap file (element lo at float *off of *sw). */
static void locate(zr_zero *z, size_t g, int s, float **mem, zck_swap **sw, uint64_t *off)
{
    *mem = NULL;
    *sw = NULL;
    *off = 0;
    if (s == 0 && z->off_par) {
        *sw = z->psw;
        *off = z->poff[g];
    } else if (s > 0 && z->off_opt) {
        *sw = z->osw;
        *off = (s == 2 ? z->oreg : 0) + z->soff[g];
    } else
        *mem = s == 0 ? zr_zero_param(z, g) : s == 1 ? zr_zero_exp_avg(z, g)
                                                     : zr_zero_exp_avg_sq(z, g);
}

int zr__zero_produce_fill(void *ctx, uint64_t off, uint64_t cnt, float *dst)
{
    zr_zfill *f = ctx;
    f->fill(f->ctx, f->g, f->lo + off, cnt, dst);
    return 0;
}

int zr__zero_produce_read(void *ctx, uint64_t off, uint64_t cnt, float *dst)
{
    zr_zread *r = ctx;
    return zck_reader_read_range(r->rd, r->g, r->st, r->lo + off, cnt, dst);
}

int zr_zero_init_params(zr_zero *z, zr_zero_fill_fn fill, void *ctx)
{
    DEV_RETURN(zd_init_params(z->dev, fill, ctx));
    for (size_t g = 0; g < z->ng; g++) {
        uint64_t lo, n;
        float *full = zr_zero_full_params(z, g);
        if (full) {
            fill(ctx, g, 0, z->G[g].numel, full);
            continue;
        }
        zr_zero_opt_range(z, g, &lo, &n);
        if (!z->off_par) {
            if (n)
                fill(ctx, g, lo, n, zr_zero_param(z, g));
            continue;
        }
        /* chunk by chunk into the swap file, two staging chunks in turn */
        zr_zfill fr = {fill, ctx, g, lo};
        ZR_TRY(zr__zero_swap_fill(z->psw, z->cbuf, z->chunk, z->poff[g], n,
                                  zr__zero_produce_fill, &fr));
    }
    return 0;
}

int zr_zero_load(zr_zero *z, zck_reader *rd, int verify, unsigned jobs)
{
    if (z->dev && verify)
        return zr_err_set(ZR_EINVAL, "ZeRO on a device: verify the checkpoint before loading "
                          "it (the device load does not hash)");
    DEV_RETURN(zd_load(z->dev, rd));
    const zck_layout *L = zck_reader_layout(rd);
    size_t st[3];
    static const char *names[3] = {"param", "exp_avg", "exp_avg_sq"};
    for (int s = 0; s < 3; s++)
        if (zck_layout_find_state(L, &st[s], names[s]) < 0)
            return zr_err_set(ZR_EINVAL, "%s: no state '%s'", zck_reader_path(rd), names[s]);
    /* what lives in memory: one read (hashing every touched file when asked) */
    zck_read_req *q = calloc(3 * z->ng, sizeof *q);
    if (!q)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t nq = 0;
    for (size_t g = 0; g < z->ng; g++) {
        uint64_t lo, n;
        float *full = zr_zero_full_params(z, g);
        if (full) /* stages 0-2 hold every parameter */
            q[nq++] = (zck_read_req){g, st[0], 0, z->G[g].numel, full};
        zr_zero_opt_range(z, g, &lo, &n);
        for (int s = full ? 1 : 0; s < 3 && n; s++) {
            float *mem;
            zck_swap *sw;
            uint64_t off;
            locate(z, g, s, &mem, &sw, &off);
            if (mem)
                q[nq++] = (zck_read_req){g, st[s], lo, n, mem};
        }
    }
    zck_read_opts ro = ZCK_READ_OPTS_INIT;
    ro.verify = verify;
    ro.jobs = jobs ? jobs : 1;
    int rc = zck_reader_read(rd, q, nq, &ro);
    free(q);
    if (rc)
        return rc;
    /* what lives in swap files: chunk by chunk, checkpoint -> staging -> swap */
    for (size_t g = 0; g < z->ng; g++) {
        uint64_t lo, n;
        zr_zero_opt_range(z, g, &lo, &n);
        for (int s = 0; s < 3 && n; s++) {
            float *mem;
            zck_swap *sw;
            uint64_t base;
            locate(z, g, s, &mem, &sw, &base);
            if (!sw)
                continue;
            zr_zread r = {rd, g, st[s], lo};
            ZR_TRY(zr__zero_swap_fill(sw, z->cbuf, z->chunk, base, n, zr__zero_produce_read,
                                      &r));
        }
    }
    return 0;
}

static int writer_begin(void *ctx, size_t g, size_t s, uint64_t start, uint64_t count)
{
    return zck_writer_begin(ctx, g, s, start, count);
}

static int writer_write(void *ctx, const void *data, size_t bytes)
{
    return zck_writer_write(ctx, data, bytes);
}

int zr_zero_save(zr_zero *z, zck_writer *w)
{
    zr_zero_sink k = {w, writer_begin, writer_write};
    return zr_zero_save_to(z, &k);
}

uint64_t zr_zero_part_floats(const zr_zero *z)
{
    DEV_RETURN(zd_part_floats(z->dev));
    uint64_t n = 0;
    for (size_t g = 0; g < z->ng; g++)
        n += 3 * z->G[g].n;
    return n;
}

int zr_zero_save_to(zr_zero *z, const zr_zero_sink *w)
{
    DEV_RETURN(zd_save_to(z->dev, w));
    for (size_t g = 0; g < z->ng; g++) {
        uint64_t plo, pn, olo, on;
        zr_zero_part_range(z, g, &plo, &pn);
        zr_zero_opt_range(z, g, &olo, &on);
        if (!pn)
            continue;
        for (int s = 0; s < 3; s++) {
            float *mem;
            zck_swap *sw;
            uint64_t base;
            locate(z, g, s, &mem, &sw, &base);
            ZR_TRY(w->begin(w->ctx, g, (size_t)s, plo, pn));
            if (mem) {
                ZR_TRY(w->write(w->ctx, mem + (plo - olo), (size_t)pn * sizeof(float)));
                continue;
            }
            /* straight from the swap file */
            ZR_TRY(zr__zero_swap_to_sink(sw, z->cbuf, z->chunk, base + (plo - olo), pn, w));
        }
    }
    return 0;
}

typedef struct {
    float *p, *m, *v;
    const float *g;
    uint64_t t;
    float lr, clip;
    const zr_adamw_hp *hp;
} adam_args;

static int adam_part(void *ctx, uint64_t at, uint64_t cnt, int decay)
{
    const adam_args *a = ctx;
    zr_adamw_update(a->p + at, a->g + at, a->m + at, a->v + at, (size_t)cnt, a->t, a->lr,
                    a->clip, decay, a->hp);
    return 0;
}

/* AdamW over elements [a0, a0+cnt) of group g's opt range: p, m, v point at element a0. */
static void adamw_range(zr_zero *z, size_t g, uint64_t a0, uint64_t cnt, float *p, float *m,
                        float *v, uint64_t t, float lr, float clip, const zr_adamw_hp *hp)
{
    uint64_t lo, n;
    zr_zero_opt_range(z, g, &lo, &n);
    adam_args a = {p, m, v, zr_zero_grad(z, g) + (a0 - lo), t, lr, clip, hp};
    zr__zero_tensors(z->L, g, a0, cnt, adam_part, &a);
}

int zr_zero_adamw(zr_zero *z, uint64_t t, float lr, float clip, const zr_adamw_hp *hp)
{
    DEV_RETURN(zd_adamw(z->dev, t, lr, clip, hp));
    if (!z->off_opt && !z->off_par) {
        for (size_t g = 0; g < z->ng; g++) {
            uint64_t lo, n;
            zr_zero_opt_range(z, g, &lo, &n);
            if (n)
                adamw_range(z, g, lo, n, zr_zero_param(z, g), zr_zero_exp_avg(z, g),
                            zr_zero_exp_avg_sq(z, g), t, lr, clip, hp);
        }
        return 0;
    }
    /* streamed: every chunk of every group in one pipeline over the staging sets; chunk k
     * uses set k mod nbufs, read nbufs-1 chunks ahead, written back right after its update */
    size_t nc = 0;
    zr_zchunk *c = NULL;
    ZR_TRY(zr__zero_chunks(z->L, z->W, z->rank, z->stage, z->chunk, &c, &nc));
    /* tickets per (staging set, file): index 2 set + (0 params, 1 optimizer) */
    uint64_t *rt = calloc(4 * (size_t)z->nbufs, sizeof *rt), *wt = rt ? rt + 2 * z->nbufs : NULL;
    int rc = rt ? 0 : zr_err_set(ZR_ENOMEM, "out of memory");
    /* the swap file and staging slot of state s (1 m, 2 v, 0 p) of chunk i */
#define SLOT(i, s) (z->cbuf + ((size_t)((i) % z->nbufs) * 3 + (s)) * z->chunk)
    size_t ahead = 0;
    for (size_t i = 0; i < nc && !rc; i++) {
        /* keep the reads nbufs-1 chunks ahead */
        for (; !rc && ahead < nc && ahead < i + z->nbufs; ahead++) {
            size_t set = ahead % z->nbufs;
            for (int f = 0; f < 2 && !rc; f++) { /* the set's last write-back first */
                zck_swap *sw = f == 0 ? z->psw : z->osw;
                if (sw && wt[2 * set + f])
                    rc = zck_swap_wait(sw, wt[2 * set + f]);
            }
            for (int s = 0; s < 3 && !rc; s++) {
                float *mem;
                zck_swap *sw;
                uint64_t base;
                locate(z, c[ahead].g, s, &mem, &sw, &base);
                if (sw)
                    rc = zck_swap_read(sw, SLOT(ahead, s),
                                       grain_up(c[ahead].cnt) * sizeof(float),
                                       (base + c[ahead].off) * sizeof(float),
                                       &rt[2 * set + (s > 0)]);
            }
        }
        if (rc)
            break;
        size_t set = i % z->nbufs, g = c[i].g;
        uint64_t lo, n;
        zr_zero_opt_range(z, g, &lo, &n);
        float *ptr[3];
        for (int s = 0; s < 3 && !rc; s++) {
            float *mem;
            zck_swap *sw;
            uint64_t base;
            locate(z, g, s, &mem, &sw, &base);
            ptr[s] = mem ? mem + c[i].off : SLOT(i, s);
            if (sw)
                rc = zck_swap_wait(sw, rt[2 * set + (s > 0)]);
        }
        if (rc)
            break;
        adamw_range(z, g, lo + c[i].off, c[i].cnt, ptr[0], ptr[1], ptr[2], t, lr, clip, hp);
        for (int s = 0; s < 3 && !rc; s++) {
            float *mem;
            zck_swap *sw;
            uint64_t base;
            locate(z, g, s, &mem, &sw, &base);
            if (sw)
                rc = zck_swap_write(sw, SLOT(i, s), grain_up(c[i].cnt) * sizeof(float),
                                    (base + c[i].off) * sizeof(float), &wt[2 * set + (s > 0)]);
        }
    }
#undef SLOT
    for (int s = 0; s < 2 && !rc; s++) { /* everything written back */
        zck_swap *sw = s ? z->osw : z->psw;
        if (sw)
            rc = zck_swap_wait(sw, UINT64_MAX);
    }
    free(rt);
    free(c);
    return rc;
}
