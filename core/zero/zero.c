/*
 * zero.c: the host engine of the ZeRO stages (zero.h; its operations table in zero_int.h,
 * chosen by zr_zero_new without a device): storage by stage, the model's hooks, and the comm
 * thread that runs every collective in issue order (stage 2's reduce-scatters and stage 3's
 * gathers in the background, the rest waited for at once); zr_zero_plan, its sizes without
 * allocating.
 */
#include "zero_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define QCAP 256           /* comm ops queued at most (the issuer waits for room) */
#define GRAD_SLOTS 3       /* stage 2-3: gradient buffers of ordinary groups */
/* the default parameter budget of the ordinary buffers: the rank's partition / this, so that at
 * stage 3 they stay below a sixteenth of its model states (16 bytes per parameter) unless the
 * minimum of two gather and two gradient buffers is more */
#define DEFAULT_BUDGET_DIV 4
#define BIG_ARRAY (4u << 20) /* arrays from this many bytes up are 2 MiB aligned, THP advised */

/* A group's own buffers, when larger than a slot, and what the model holds now. A big group's
 * gradient comes in pieces of a gradient slot (the model's embeddings, zr_model_hooks); gbig
 * is made only when the model asks for one whole. */
typedef struct {
    float *pbig, *gbig; /* big groups' buffers (stage 3 params, stage 2-3 grads) */
    int pbig_busy, gbig_busy;
    float *plent, *glent; /* what the model holds now */
} grp;

enum { OP_GATHER, OP_RS_GRAD, OP_RS_PIECE, OP_ALLREDUCE, OP_RS_INPLACE, OP_AG_INPLACE,
       OP_GATHER_F64, OP_BCAST, OP_UPDATE };

typedef struct {
    int kind;
    size_t g;
    float *buf;
    uint64_t off; /* OP_RS_PIECE: the piece's first element in the group */
    const void *send;
    void *recv;
    size_t n;
    int root;
    uint64_t seq;
} op;

typedef struct {
    zr_zero b; /* first: zero.h's handle */
    grp *H;    /* b.ng */
    /* offload to NVMe: the swap files and regions are b's */
    int off_opt, off_par;
    uint64_t preg;            /* floats of the params' region */
    unsigned nbufs, aio_depth;
    uint64_t live_params;     /* zr_zero_opts' budget (0: the default) */
    float *gstage;            /* one partition for offloaded gathers (b.xbuf: nbufs x 3 chunks) */
    /* the streamed optimizer step: its chunks, read tickets (rt) and write-back tickets (wt)
     * per (staging set, file: 0 params, 1 optimizer), and how many chunks' optimizer states
     * were read ahead during the backward (pre) */
    zr_zchunk *ch;
    size_t nch, pre;
    int pre_done;             /* this step's read-ahead was started */
    /* stage 3 with NVMe (defer): each group's update deferred from the end of step s to just
     * before the first gather that needs it (an OP_UPDATE queued before that OP_GATHER), so
     * that the comm thread's I/O for it overlaps the forward of the groups before; upd[g]:
     * pending, with the step's arguments upd_*; gch[g]: the group's first chunk (ng + 1) */
    int defer;
    unsigned char *upd;
    size_t n_upd, *gch;
    uint64_t upd_t;
    float upd_lr, upd_clip;
    zr_adamw_hp upd_hp;
    uint64_t *rt, *wt;
    size_t bytes_xbuf, bytes_gstage;
    size_t bytes_fullp, bytes_fullg, bytes_ownp, bytes_owng, bytes_mv;
    float **pslots, **gslots; /* free lists (stack) */
    size_t n_pslots, n_gslots, pfree, gfree;
    float *slot_mem;
    size_t bytes_slots, bytes_big;
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
} zr_zhost;

static void reset_buffers_locked(zr_zhost *z);
static int update_group(zr_zhost *z, size_t g);

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

/* The partitions and the swap regions (offload to NVMe), after offload_setup. */
static int size_groups(zr_zhost *z, const zck_layout *L, int W, int rank, const zr_zero_opts *o)
{
    ZR_TRY(zr__zero_base_init(&z->b, z->b.ops, L, W, rank, o));
    if (z->off_opt)
        ZR_TRY(zr__zero_opt_region(&z->b));
    if (z->off_par) {
        ZR_TRY(zr__zero_param_region(&z->b));
        z->preg = z->b.poff[z->b.ng];
    }
    return 0;
}

/* Ordinary buffers at stages 2-3 under the parameter budget (zr_zero_opts.live_params):
 * gather buffers first (up to prefetch + 2), then gradient buffers (up to GRAD_SLOTS); at
 * least two of each (the model may hold two groups' parameters, and two groups' gradients,
 * at once). */
static void slot_counts(const zr_zhost *z, size_t *np, size_t *ng)
{
    int s = z->b.stage;
    *np = *ng = 0;
    if (s < 2)
        return;
    uint64_t budget = z->live_params ? z->live_params : z->b.sum_P / DEFAULT_BUDGET_DIV;
    uint64_t fit = z->b.slot ? budget / z->b.slot : GRAD_SLOTS + z->b.prefetch + 2;
    if (s == 3) {
        size_t want = z->b.prefetch + 2;
        *np = fit < 4 ? 2 : fit - 2 < want ? (size_t)(fit - 2) : want;
        fit = fit > *np ? fit - *np : 0;
    }
    *ng = fit < 2 ? 2 : fit < GRAD_SLOTS ? (size_t)fit : GRAD_SLOTS;
}

static size_t round_bytes(uint64_t floats)
{
    size_t b = (size_t)floats * sizeof(float);
    if (!b)
        b = 64;
    return b >= BIG_ARRAY ? (b + 4095) & ~(size_t)4095 : (b + 63) & ~(size_t)63;
}

static void account(const zr_zhost *z, zr_zero_bytes *out)
{
    memset(out, 0, sizeof *out);
    int s = z->b.stage;
    out->params = s < 3 ? round_bytes(z->b.sum_full) : round_bytes(z->b.sum_P);
    out->grads = s < 2 ? round_bytes(z->b.sum_full) : round_bytes(z->b.sum_P);
    out->optimizer = 2 * (s == 0 ? round_bytes(z->b.sum_full) : round_bytes(z->b.sum_P));
    uint64_t slots = 0, big = 0;
    size_t np, ng;
    slot_counts(z, &np, &ng);
    slots = (uint64_t)(np + ng) * z->b.slot;
    for (size_t g = 0; g < z->b.ng; g++) /* gradients: in pieces of a gradient slot */
        if (z->b.G[g].big && s == 3)
            big += z->b.G[g].full;
    out->buffers = (slots ? round_bytes(slots) : 0) + big * sizeof(float);
    if (z->off_opt) {
        out->optimizer = 0;
        out->nvme += 2 * z->b.oreg * sizeof(float);
    }
    if (z->off_par) {
        out->params = 0;
        out->nvme += z->preg * sizeof(float);
        uint64_t maxP = 0;
        for (size_t g = 0; g < z->b.ng; g++)
            maxP = z->b.G[g].P > maxP ? z->b.G[g].P : maxP;
        out->swap_staging += round_bytes(zr__zero_grain_up(maxP));
        out->buffers += round_bytes(zr__zero_grain_up(maxP));
    }
    if (z->off_opt || z->off_par) {
        size_t sets = round_bytes((uint64_t)z->nbufs * 3 * z->b.chunk);
        out->swap_staging += sets;
        out->buffers += sets;
    }
    for (size_t g = 0; g < z->b.ng; g++)
        out->part += 3 * z->b.G[g].n * sizeof(float);
}

/* The offload settings into z (before sizing). */
static int offload_setup(zr_zhost *z, const zr_zero_opts *o)
{
    z->off_opt = o->offload_optimizer == ZR_OFFLOAD_NVME; /* CPU: host memory, as NONE */
    z->off_par = o->offload_params == ZR_OFFLOAD_NVME;
    z->live_params = o->live_params;
    if (z->off_par && o->stage != 3)
        return zr_err_set(ZR_EINVAL, "--offload-params nvme needs --zero 3 (at stages 0-2 "
                          "every rank holds all parameters)");
    if (!z->off_opt && !z->off_par)
        return 0;
    ZR_TRY(zr__zero_check_swap_opts(o));
    if (o->buffers < 2 || o->buffers > 64)
        return zr_err_set(ZR_EINVAL, "--offload-buffers %u: expected 2..64 (double buffering "
                          "at least)", o->buffers);
    z->b.chunk = o->aio_block / sizeof(float);
    z->nbufs = o->buffers;
    z->aio_depth = o->aio_depth;
    z->defer = o->stage == 3;
    return 0;
}

int zr_zero_plan(zr_zero_bytes *out, const zck_layout *L, int world, int rank,
                 const zr_zero_opts *o)
{
    zr_zhost z;
    memset(&z, 0, sizeof z);
    int rc = offload_setup(&z, o);
    if (!rc)
        rc = size_groups(&z, L, world, rank, o);
    if (!rc)
        account(&z, out);
    zr__zero_base_free(&z.b);
    return rc;
}

static void host_mem(const zr_zero *zz, zr_zero_bytes *out)
{
    const zr_zhost *z = (const zr_zhost *)zz;
    memset(out, 0, sizeof *out);
    int s = z->b.stage;
    out->params = s < 3 ? z->bytes_fullp : z->bytes_ownp;
    out->grads = s < 2 ? z->bytes_fullg : z->bytes_owng;
    out->optimizer = z->bytes_mv;
    out->buffers = z->bytes_slots + z->bytes_big + z->bytes_xbuf + z->bytes_gstage;
    if (z->b.osw)
        out->nvme += zck_swap_size(z->b.osw);
    if (z->b.psw)
        out->nvme += zck_swap_size(z->b.psw);
}

/* ---------------------------------------------------------------- the comm thread */

static int run_op(zr_zhost *z, op *o)
{
    zr_comm *c = z->b.comm;
    int rc = 0;
    switch (o->kind) {
    case OP_GATHER: {
        const zr_zpart *p = &z->b.G[o->g];
        const float *mine = z->b.ownp ? z->b.ownp + p->ooff : z->gstage;
        uint64_t t;
        if (!z->b.ownp) /* offloaded: the partition comes from its swap file first */
            rc = zck_swap_read(z->b.psw, z->gstage, zr__zero_grain_up(p->P) * sizeof(float),
                               z->b.poff[o->g] * sizeof(float), &t);
        if (!rc && !z->b.ownp)
            rc = zck_swap_wait(z->b.psw, t);
        if (!rc)
            rc = zr_comm_all_gather(c, mine, o->buf, p->P, sizeof(float));
        break;
    }
    case OP_RS_GRAD: {
        const zr_zpart *p = &z->b.G[o->g];
        float *mine = o->buf + (size_t)z->b.rank * p->P;
        rc = zr_comm_reduce_scatter(c, o->buf, mine, p->P, ZR_COMM_F32);
        if (!rc) {
            float *restrict acc = z->b.owng + p->ooff;
            const float *restrict x = mine;
            for (uint64_t i = 0; i < p->P; i++)
                acc[i] += x[i];
        }
        break;
    }
    case OP_RS_PIECE: { /* all-reduced (the bits of a reduce-scatter), the own overlap kept */
        const zr_zpart *p = &z->b.G[o->g];
        rc = zr_comm_all_reduce(c, o->buf, o->buf, o->n, ZR_COMM_F32);
        uint64_t a = o->off > p->lo ? o->off : p->lo;
        uint64_t e = o->off + o->n < p->lo + p->n ? o->off + o->n : p->lo + p->n;
        if (!rc && a < e) {
            float *restrict acc = z->b.owng + p->ooff + (a - p->lo);
            const float *restrict x = o->buf + (a - o->off);
            for (uint64_t i = 0; i < e - a; i++)
                acc[i] += x[i];
        }
        break;
    }
    case OP_ALLREDUCE:
        rc = zr_comm_all_reduce(c, o->send, o->recv, o->n, ZR_COMM_F32);
        break;
    case OP_RS_INPLACE:
        rc = zr_comm_reduce_scatter(c, o->buf, o->buf + (size_t)z->b.rank * o->n, o->n,
                                    ZR_COMM_F32);
        break;
    case OP_AG_INPLACE:
        rc = zr_comm_all_gather(c, o->buf + (size_t)z->b.rank * o->n, o->buf, o->n,
                                sizeof(float));
        break;
    case OP_GATHER_F64:
        rc = zr_comm_all_gather(c, o->send, o->recv, o->n, sizeof(double));
        break;
    case OP_BCAST:
        rc = zr_comm_broadcast(c, o->recv, o->n, o->root);
        break;
    case OP_UPDATE:
        rc = update_group(z, o->g);
        break;
    }
    return rc;
}

/* a buffer back to its free list (mutex held) */
static void release_grad_buf(zr_zhost *z, size_t g, float *buf)
{
    if (buf == z->H[g].gbig)
        z->H[g].gbig_busy = 0;
    else
        z->gslots[z->gfree++] = buf;
}

static void *comm_main(void *arg)
{
    zr_zhost *z = arg;
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
        if (o.kind == OP_RS_GRAD || o.kind == OP_RS_PIECE)
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
static int sticky(zr_zhost *z)
{
    return zr_err_set(z->err, "%s", z->errmsg);
}

/* Queue an op (mutex held); its sequence number. */
static int submit_locked(zr_zhost *z, op o, uint64_t *seq)
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

static int wait_locked(zr_zhost *z, uint64_t seq)
{
    while (z->done_seq < seq && !z->err)
        pthread_cond_wait(&z->cv, &z->mu);
    return z->err ? sticky(z) : 0;
}

/* Run an op and wait for it (and everything before it). */
static int run_sync(zr_zhost *z, op o)
{
    pthread_mutex_lock(&z->mu);
    uint64_t seq = 0;
    int rc = submit_locked(z, o, &seq);
    if (!rc)
        rc = wait_locked(z, seq);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

static int drain(zr_zhost *z)
{
    pthread_mutex_lock(&z->mu);
    int rc = wait_locked(z, z->next_seq);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

/* ---------------------------------------------------------------- construction */

static int open_swaps(zr_zhost *z, const char *dir)
{
    if (z->off_opt)
        ZR_TRY(zr__zero_swap_open(&z->b.osw, dir, "optimizer.swap", 2 * z->b.oreg,
                                  z->aio_depth, z->b.chunk));
    if (z->off_par)
        ZR_TRY(zr__zero_swap_open(&z->b.psw, dir, "params.swap", z->preg, z->aio_depth,
                                  z->b.chunk));
    return 0;
}

static const zr_zero_ops host_ops;
static void host_free(zr_zero *zz);

int zr__zero_host_new(zr_zero **out, zr_comm *comm, const zck_layout *L, const zr_zero_opts *o)
{
    *out = NULL;
    zr_zhost *z = calloc(1, sizeof *z);
    if (!z)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    z->b.ops = &host_ops;
    z->b.comm = comm;
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    int rc = offload_setup(z, o);
    if (!rc)
        rc = size_groups(z, L, zr_comm_world(comm), zr_comm_rank(comm), o);
    if (!rc && !(z->H = calloc(z->b.ng ? z->b.ng : 1, sizeof *z->H)))
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    if (rc) {
        host_free(&z->b);
        return rc;
    }
    int s = z->b.stage, ok = 1;
#define ARR(lv, floats, bytesvar)                                                              \
    do {                                                                                       \
        z->bytesvar = (size_t)(floats) * sizeof(float);                                        \
        ok = ok && (lv = alloc_array(&z->bytesvar)) != NULL;                                   \
    } while (0)
    if (s < 3)
        ARR(z->b.fullp, z->b.sum_full, bytes_fullp);
    else if (!z->off_par)
        ARR(z->b.ownp, z->b.sum_P, bytes_ownp);
    if (s < 2)
        ARR(z->b.fullg, z->b.sum_full, bytes_fullg);
    else
        ARR(z->b.owng, z->b.sum_P, bytes_owng);
    if (!z->off_opt) {
        size_t mvb = 0;
        ARR(z->b.m, s == 0 ? z->b.sum_full : z->b.sum_P, bytes_mv);
        mvb = z->bytes_mv;
        ARR(z->b.v, s == 0 ? z->b.sum_full : z->b.sum_P, bytes_mv);
        z->bytes_mv += mvb;
    }
    if (z->off_opt || z->off_par)
        ARR(z->b.xbuf, (size_t)z->nbufs * 3 * z->b.chunk, bytes_xbuf);
    if (z->off_par) {
        uint64_t maxP = 0;
        for (size_t g = 0; g < z->b.ng; g++)
            maxP = z->b.G[g].P > maxP ? z->b.G[g].P : maxP;
        ARR(z->gstage, zr__zero_grain_up(maxP), bytes_gstage);
    }
#undef ARR
    if (ok && s >= 2) {
        slot_counts(z, &z->n_pslots, &z->n_gslots);
        size_t n = z->n_gslots + z->n_pslots;
        z->bytes_slots = (size_t)z->b.slot * n * sizeof(float);
        ok = (z->slot_mem = alloc_array(&z->bytes_slots)) != NULL &&
             (z->gslots = calloc(n, sizeof *z->gslots)) != NULL &&
             (z->pslots = calloc(n, sizeof *z->pslots)) != NULL;
        if (ok)
            reset_buffers_locked(z); /* no thread yet */
        for (size_t g = 0; ok && g < z->b.ng; g++) {
            grp *p = &z->H[g];
            if (!z->b.G[g].big || s != 3)
                continue;
            size_t b = (size_t)z->b.G[g].full * sizeof(float);
            ok = (p->pbig = alloc_array(&b)) != NULL;
            z->bytes_big += b;
        }
    }
    if (!ok) {
        host_free(&z->b);
        return zr_err_set(ZR_ENOMEM, "out of memory for the ZeRO stage %d states of %llu "
                          "parameters on rank %d of %d", s, (unsigned long long)z->b.sum_full,
                          z->b.rank, z->b.W);
    }
    if ((rc = open_swaps(z, o->swap_dir))) {
        host_free(&z->b);
        return rc;
    }
    if ((rc = pthread_create(&z->th, NULL, comm_main, z))) {
        host_free(&z->b);
        return zr_err_sys(rc, "starting the comm thread");
    }
    z->th_started = 1;
    *out = &z->b;
    return 0;
}

static void host_free(zr_zero *zz)
{
    zr_zhost *z = (zr_zhost *)zz;
    if (z->th_started) {
        pthread_mutex_lock(&z->mu);
        z->quit = 1;
        pthread_cond_broadcast(&z->cv);
        pthread_mutex_unlock(&z->mu);
        pthread_join(z->th, NULL);
    }
    for (size_t g = 0; z->H && g < z->b.ng; g++) {
        free(z->H[g].pbig);
        free(z->H[g].gbig);
    }
    free(z->H);
    free(z->b.fullp);
    free(z->b.fullg);
    free(z->b.ownp);
    free(z->b.owng);
    free(z->b.m);
    free(z->b.v);
    free(z->slot_mem);
    free(z->pslots);
    free(z->gslots);
    zck_swap_close(z->b.osw, 1); /* scratch: removed */
    zck_swap_close(z->b.psw, 1);
    zr__zero_base_free(&z->b);
    free(z->b.xbuf);
    free(z->gstage);
    free(z->ch);
    free(z->rt);
    free(z->upd);
    free(z->gch);
    pthread_mutex_destroy(&z->mu);
    pthread_cond_destroy(&z->cv);
    free(z);
}

static int host_attach(zr_zero *zz, const zr_model *m, zr_dev_model *dm, size_t *fwd,
                       size_t *nf, size_t *bwd, size_t *nb)
{
    (void)zz;
    (void)dm;
    *nf = zr_model_fetch_order(m, 0, fwd);
    *nb = zr_model_fetch_order(m, 1, bwd);
    return 0;
}

/* ---------------------------------------------------------------- where the states are */

/* ---------------------------------------------------------------- the streamed optimizer */

/* chunk i's staging slot of state s (0 p, 1 m, 2 v): set i mod nbufs */
static float *stage_slot(const zr_zhost *z, size_t i, int s)
{
    return z->b.xbuf + ((i % z->nbufs) * 3 + (size_t)s) * z->b.chunk;
}

/* The chunk list and ticket arrays, made at the first streamed step. */
static int stream_prepare(zr_zhost *z)
{
    if (z->rt)
        return 0;
    ZR_TRY(zr__zero_chunks(&z->b, z->b.chunk, &z->ch, &z->nch));
    if (!(z->rt = calloc(4 * (size_t)z->nbufs, sizeof *z->rt)) ||
        !(z->upd = calloc(z->b.ng + 1, 1)) || !(z->gch = calloc(z->b.ng + 1, sizeof *z->gch)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    z->wt = z->rt + 2 * z->nbufs;
    for (size_t i = z->nch; i-- > 0;) /* chunks come in group order */
        z->gch[z->ch[i].g] = i;
    for (size_t g = z->b.ng + 1, next = z->nch; g-- > 0;) { /* groups without chunks */
        if (g == z->b.ng || (g < z->b.ng && (z->gch[g] >= z->nch || z->ch[z->gch[g]].g != g)))
            z->gch[g] = next;
        next = z->gch[g];
    }
    return 0;
}

/* Reads of states [s0, s1) of chunk i into its staging set, after the set's last write-back. */
static int stream_read(zr_zhost *z, size_t i, int s0, int s1)
{
    size_t set = i % z->nbufs;
    for (int f = 0; f < 2; f++) {
        zck_swap *sw = f == 0 ? z->b.psw : z->b.osw;
        if (sw && z->wt[2 * set + f])
            ZR_TRY(zck_swap_wait(sw, z->wt[2 * set + f]));
    }
    for (int s = s0; s < s1; s++) {
        uint64_t base;
        zck_swap *sw = zr__zero_swap_of(&z->b, z->ch[i].g, s, &base);
        if (sw)
            ZR_TRY(zck_swap_read(sw, stage_slot(z, i, s),
                                 zr__zero_grain_up(z->ch[i].cnt) * sizeof(float),
                                 (base + z->ch[i].off) * sizeof(float), &z->rt[2 * set + (s > 0)]));
    }
    return 0;
}

/* At the start of the backward: the optimizer states (exp_avg, exp_avg_sq) of the first
 * nbufs chunks, read while the backward runs; they do not depend on the gradients. Only the
 * optimizer's swap file: the parameters' is the comm thread's during the backward. */
static int submit_updates(zr_zhost *z);
static int submit_update_locked(zr_zhost *z, size_t g);

static int stream_read_ahead(zr_zhost *z)
{
    z->pre_done = 1;
    if (z->defer) /* the staging sets are the deferred updates': any still pending go first */
        return submit_updates(z);
    if (!z->off_opt)
        return 0;
    ZR_TRY(stream_prepare(z));
    for (; z->pre < z->nch && z->pre < z->nbufs; z->pre++)
        ZR_TRY(stream_read(z, z->pre, 1, 3));
    return 0;
}

/* Nothing of the read-ahead left in flight (a step that ended before its update). */
static int stream_settle(zr_zhost *z)
{
    int rc = z->pre && z->b.osw ? zck_swap_wait(z->b.osw, UINT64_MAX) : 0;
    z->pre = 0;
    z->pre_done = 0;
    return rc;
}

/* ---------------------------------------------------------------- hooks */

/* Stage 3's gather buffers for the schedule (zr__zero_issue_more, with the mutex held): a free
 * one for group g, and its gather queued on the comm thread. */
static void *host_gather_buf(zr_zero *zz, size_t g)
{
    zr_zhost *z = (zr_zhost *)zz;
    grp *p = &z->H[g];
    if (z->b.G[g].big) {
        if (p->pbig_busy)
            return NULL;
        p->pbig_busy = 1;
        return p->pbig;
    }
    return z->pfree ? z->pslots[--z->pfree] : NULL;
}

static int host_gather(zr_zero *zz, zr_zentry *e)
{
    zr_zhost *z = (zr_zhost *)zz;
    op o = {.kind = OP_GATHER, .g = e->g, .buf = e->buf};
    ZR_TRY(submit_update_locked(z, e->g));
    return submit_locked(z, o, &e->seq);
}

static int hook_params(void *ctx, size_t g, const float **out)
{
    zr_zhost *z = ctx;
    if (z->b.stage < 3) {
        *out = z->b.fullp + z->b.G[g].foff;
        return 0;
    }
    pthread_mutex_lock(&z->mu);
    zr_zentry *e;
    int rc = zr__zero_fetch(&z->b, g, &e);
    if (!rc)
        rc = wait_locked(z, e->seq);
    if (!rc) {
        z->H[g].plent = e->buf;
        z->b.cursor++;
        *out = z->H[g].plent;
    }
    pthread_mutex_unlock(&z->mu);
    return rc;
}

static int hook_params_done(void *ctx, size_t g)
{
    zr_zhost *z = ctx;
    if (z->b.stage < 3)
        return 0;
    pthread_mutex_lock(&z->mu);
    grp *p = &z->H[g];
    int rc = 0;
    if (p->plent) {
        if (z->b.G[g].big)
            p->pbig_busy = 0;
        else
            z->pslots[z->pfree++] = p->plent;
        p->plent = NULL;
        rc = zr__zero_issue_more(&z->b, z->b.cursor + z->b.prefetch);
    }
    pthread_mutex_unlock(&z->mu);
    return rc;
}

/* An ordinary gradient slot, once the comm thread has given one back (mutex held). */
static int take_grad_slot_locked(zr_zhost *z, float **out)
{
    while (!z->gfree && !z->err)
        pthread_cond_wait(&z->cv, &z->mu);
    if (z->err)
        return sticky(z);
    *out = z->gslots[--z->gfree];
    return 0;
}

static int hook_grads(void *ctx, size_t g, float **out)
{
    zr_zhost *z = ctx;
    grp *p = &z->H[g];
    if (!z->pre_done)
        ZR_TRY(stream_read_ahead(z));
    if (z->b.stage < 2) {
        *out = z->b.fullg + z->b.G[g].foff;
        return 0;
    }
    pthread_mutex_lock(&z->mu);
    int rc = 0;
    if (z->b.G[g].big) { /* asked whole, not in pieces: a buffer of its own, made once */
        while (p->gbig_busy && !z->err)
            pthread_cond_wait(&z->cv, &z->mu);
        size_t b = (size_t)z->b.G[g].full * sizeof(float);
        if (!z->err && !p->gbig && (p->gbig = alloc_array(&b)) != NULL)
            z->bytes_big += b;
        if (!z->err && !p->gbig)
            rc = zr_err_set(ZR_ENOMEM, "out of memory for group %zu's gradient (%llu "
                            "parameters)", g, (unsigned long long)z->b.G[g].full);
        else if (!z->err) {
            p->gbig_busy = 1;
            p->glent = p->gbig;
        }
    } else {
        rc = take_grad_slot_locked(z, &p->glent);
    }
    if (z->err)
        rc = sticky(z);
    pthread_mutex_unlock(&z->mu);
    if (rc)
        return rc;
    memset(p->glent, 0, (size_t)z->b.G[g].full * sizeof(float));
    *out = p->glent;
    return 0;
}

/* A big group's gradient in pieces of an ordinary gradient slot (zr_model_hooks). */
static uint64_t hook_grad_piece_numel(void *ctx, size_t g)
{
    const zr_zhost *z = ctx;
    return z->b.stage >= 2 && z->b.G[g].big ? z->b.slot : 0;
}

static int hook_grad_piece(void *ctx, size_t g, uint64_t off, uint64_t n, float **out)
{
    zr_zhost *z = ctx;
    grp *p = &z->H[g];
    if (!z->pre_done)
        ZR_TRY(stream_read_ahead(z));
    if (hook_grad_piece_numel(z, g) < n || off + n > z->b.G[g].numel || p->glent)
        return zr_err_set(ZR_EINVAL, "zero: piece [%llu, +%llu) of group %zu's gradient: not "
                          "a piece this engine lends", (unsigned long long)off,
                          (unsigned long long)n, g);
    pthread_mutex_lock(&z->mu);
    int rc = take_grad_slot_locked(z, &p->glent);
    pthread_mutex_unlock(&z->mu);
    if (rc)
        return rc;
    memset(p->glent, 0, (size_t)n * sizeof(float));
    *out = p->glent;
    return 0;
}

static int hook_grad_piece_done(void *ctx, size_t g, uint64_t off, uint64_t n)
{
    zr_zhost *z = ctx;
    grp *p = &z->H[g];
    pthread_mutex_lock(&z->mu);
    op o = {.kind = OP_RS_PIECE, .g = g, .buf = p->glent, .off = off, .n = n};
    p->glent = NULL;
    int rc = o.buf ? submit_locked(z, o, NULL)
                   : zr_err_set(ZR_EINVAL, "zero: group %zu: no piece of its gradient lent", g);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

static int hook_grads_done(void *ctx, size_t g)
{
    zr_zhost *z = ctx;
    grp *p = &z->H[g];
    if (z->b.stage < 2)
        return 0;
    pthread_mutex_lock(&z->mu);
    op o = {.kind = OP_RS_GRAD, .g = g, .buf = p->glent};
    p->glent = NULL;
    int rc = submit_locked(z, o, NULL);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

static void host_hooks(zr_zero *zz, zr_model_hooks *h)
{
    *h = (zr_model_hooks){
        .ctx = zz, /* at every stage: the model has no arenas of its own */
        .params = hook_params,
        .params_done = hook_params_done,
        .grads = hook_grads,
        .grads_done = hook_grads_done,
        .grad_piece_numel = hook_grad_piece_numel,
        .grad_piece = hook_grad_piece,
        .grad_piece_done = hook_grad_piece_done,
    };
}

/* ---------------------------------------------------------------- the step */

/* Every buffer free again: between steps nothing is in flight and the model holds nothing,
 * even when the last step failed half-way (mutex held). */
static void reset_buffers_locked(zr_zhost *z)
{
    size_t n = z->n_gslots + z->n_pslots;
    z->gfree = z->pfree = 0;
    for (size_t i = 0; i < n; i++) {
        float *b = z->slot_mem + (size_t)i * z->b.slot;
        if (i < z->n_gslots)
            z->gslots[z->gfree++] = b;
        else
            z->pslots[z->pfree++] = b;
    }
    for (size_t g = 0; g < z->b.ng; g++) {
        grp *p = &z->H[g];
        p->pbig_busy = p->gbig_busy = 0;
        p->plent = p->glent = NULL;
    }
}

static int host_begin_step(zr_zero *zz)
{
    zr_zhost *z = (zr_zhost *)zz;
    ZR_TRY(drain(z));
    ZR_TRY(stream_settle(z));
    if (z->b.stage >= 2) {
        pthread_mutex_lock(&z->mu);
        reset_buffers_locked(z);
        pthread_mutex_unlock(&z->mu);
    }
    if (z->b.stage < 2)
        memset(z->b.fullg, 0, (size_t)z->b.sum_full * sizeof(float));
    else if (!z->n_upd)
        memset(z->b.owng, 0, (size_t)z->b.sum_P * sizeof(float));
    else /* a group whose update is deferred still needs its gradient: update_group zeroes it */
        for (size_t g = 0; g < z->b.ng; g++)
            if (!z->upd[g])
                memset(z->b.owng + z->b.G[g].ooff, 0, (size_t)z->b.G[g].P * sizeof(float));
    if (z->b.stage != 3)
        return 0;
    pthread_mutex_lock(&z->mu);
    int rc = zr__zero_sched_start(&z->b);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

/* One in-place collective (OP_RS_INPLACE, OP_AG_INPLACE) per group of the full buffer,
 * queued for the comm thread. */
static int submit_per_group(zr_zhost *z, int kind, float *full)
{
    pthread_mutex_lock(&z->mu);
    int rc = 0;
    for (size_t g = 0; g < z->b.ng && !rc; g++)
        rc = submit_locked(z, (op){.kind = kind, .buf = full + z->b.G[g].foff, .n = z->b.G[g].P},
                           NULL);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

static int host_reduce(zr_zero *zz)
{
    zr_zhost *z = (zr_zhost *)zz;
    if (z->b.stage == 0)
        return run_sync(z, (op){.kind = OP_ALLREDUCE, .send = z->b.fullg, .recv = z->b.fullg,
                                .n = z->b.sum_full});
    if (z->b.stage == 1)
        ZR_TRY(submit_per_group(z, OP_RS_INPLACE, z->b.fullg));
    ZR_TRY(submit_updates(z)); /* a step without a backward: the last step's updates first */
    return drain(z);
}

static int host_sumsq_range(zr_zero *zz, const float *x, size_t n, double *out)
{
    (void)zz;
    *out = zr_sumsq(x, n);
    return 0;
}

static int host_publish(zr_zero *zz)
{
    zr_zhost *z = (zr_zhost *)zz;
    if (z->b.stage != 1 && z->b.stage != 2)
        return 0;
    ZR_TRY(submit_per_group(z, OP_AG_INPLACE, z->b.fullp));
    return drain(z);
}

static int host_gather_f64(zr_zero *zz, const double *mine, size_t n, double *all)
{
    return run_sync((zr_zhost *)zz, (op){.kind = OP_GATHER_F64, .send = mine, .recv = all, .n = n});
}

static int host_broadcast(zr_zero *zz, void *buf, size_t bytes, int root)
{
    return run_sync((zr_zhost *)zz, (op){.kind = OP_BCAST, .recv = buf, .n = bytes, .root = root});
}

/* ---------------------------------------------------------------- states, offloaded or not */

static int host_settle(zr_zero *zz);

static int host_init_params(zr_zero *zz, zr_zero_fill_fn fill, void *ctx)
{
    zr_zhost *z = (zr_zhost *)zz;
    ZR_TRY(host_settle(zz));
    for (size_t g = 0; g < z->b.ng; g++) {
        uint64_t lo, n, off;
        if (z->b.stage < 3) { /* whole groups */
            fill(ctx, g, 0, z->b.G[g].numel, z->b.fullp + z->b.G[g].foff);
            continue;
        }
        zr_zero_opt_range(&z->b, g, &lo, &n);
        zck_swap *sw = zr__zero_swap_of(&z->b, g, 0, &off);
        if (!sw) {
            if (n)
                fill(ctx, g, lo, n, zr__zero_state(&z->b, g, 0));
            continue;
        }
        /* chunk by chunk into the swap file, two staging chunks in turn */
        zr_zfill fr = {fill, ctx, g, lo};
        ZR_TRY(zr__zero_swap_fill(sw, z->b.xbuf, z->b.chunk, off, n, zr__zero_produce_fill, &fr));
    }
    return 0;
}

static int host_load(zr_zero *zz, zck_reader *rd, int verify, unsigned jobs)
{
    zr_zhost *z = (zr_zhost *)zz;
    size_t st[3];
    ZR_TRY(host_settle(zz));
    ZR_TRY(zr__zero_find_states(rd, st));
    /* what lives in memory: one read (hashing every touched file when asked) */
    zck_read_req *q = calloc(3 * z->b.ng, sizeof *q);
    if (!q)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t nq = 0;
    for (size_t g = 0; g < z->b.ng; g++) {
        uint64_t lo, n;
        float *full = z->b.stage < 3 ? z->b.fullp + z->b.G[g].foff : NULL;
        if (full) /* stages 0-2 hold every parameter */
            q[nq++] = (zck_read_req){g, st[0], 0, z->b.G[g].numel, full};
        zr_zero_opt_range(&z->b, g, &lo, &n);
        for (int s = full ? 1 : 0; s < 3 && n; s++) {
            float *mem = zr__zero_state(&z->b, g, s); /* NULL: in a swap file */
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
    return zr__zero_load_swaps(&z->b, rd, st);
}

static int host_sink_state(zr_zero *zz, int s, const float *src, uint64_t n,
                           const zr_zero_sink *w)
{
    (void)zz;
    (void)s;
    return w->write(w->ctx, src, (size_t)n * sizeof(float));
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
static void adamw_range(zr_zhost *z, size_t g, uint64_t a0, uint64_t cnt, float *p,
                        float *m, float *v, uint64_t t, float lr, float clip,
                        const zr_adamw_hp *hp)
{
    uint64_t lo, n;
    zr_zero_opt_range(&z->b, g, &lo, &n);
    adam_args a = {p, m, v, zr__zero_state(&z->b, g, 3) + (a0 - lo), t, lr, clip, hp};
    zr__zero_tensors(z->b.L, g, a0, cnt, adam_part, &a);
}

/* The streamed update of chunks [i0, i1): one pipeline over the staging sets, chunk k in set k
 * mod nbufs, read nbufs-1 chunks ahead (the first z->pre ones' optimizer states already during
 * the backward), written back right after its update; everything written back at the end. */
static int stream_update(zr_zhost *z, size_t i0, size_t i1, uint64_t t, float lr, float clip,
                         const zr_adamw_hp *hp)
{
    int rc = 0;
    size_t ahead = i0;
    for (size_t i = i0; i < i1 && !rc; i++) {
        for (; !rc && ahead < i1 && ahead < i + z->nbufs; ahead++)
            rc = stream_read(z, ahead, 0, ahead < z->pre ? 1 : 3); /* read ahead: m, v */
        if (rc)
            break;
        size_t set = i % z->nbufs, g = z->ch[i].g;
        uint64_t lo, n;
        zr_zero_opt_range(&z->b, g, &lo, &n);
        float *ptr[3];
        for (int s = 0; s < 3 && !rc; s++) {
            uint64_t base;
            zck_swap *sw = zr__zero_swap_of(&z->b, g, s, &base);
            ptr[s] = sw ? stage_slot(z, i, s) : zr__zero_state(&z->b, g, s) + z->ch[i].off;
            if (sw)
                rc = zck_swap_wait(sw, z->rt[2 * set + (s > 0)]);
        }
        if (rc)
            break;
        adamw_range(z, g, lo + z->ch[i].off, z->ch[i].cnt, ptr[0], ptr[1], ptr[2], t, lr, clip,
                    hp);
        for (int s = 0; s < 3 && !rc; s++) {
            uint64_t base;
            zck_swap *sw = zr__zero_swap_of(&z->b, g, s, &base);
            if (sw)
                rc = zck_swap_write(sw, ptr[s], zr__zero_grain_up(z->ch[i].cnt) * sizeof(float),
                                    (base + z->ch[i].off) * sizeof(float),
                                    &z->wt[2 * set + (s > 0)]);
        }
    }
    for (int s = 0; s < 2; s++) { /* everything written back (and read: after a failure) */
        zck_swap *sw = s ? z->b.osw : z->b.psw;
        int rw = sw ? zck_swap_wait(sw, UINT64_MAX) : 0;
        rc = rc ? rc : rw;
    }
    memset(z->rt, 0, 4 * (size_t)z->nbufs * sizeof *z->rt);
    return rc;
}

/* On the comm thread: group g's deferred update, then its gradient zeroed for the step that
 * reads its parameters next (begin_step left it: the update needed it). */
static int update_group(zr_zhost *z, size_t g)
{
    ZR_TRY(stream_update(z, z->gch[g], z->gch[g + 1], z->upd_t, z->upd_lr, z->upd_clip,
                         &z->upd_hp));
    memset(z->b.owng + z->b.G[g].ooff, 0, (size_t)z->b.G[g].P * sizeof(float));
    return 0;
}

/* Group g's deferred update queued if it is pending (mutex held): before anything that reads
 * its parameters or states. */
static int submit_update_locked(zr_zhost *z, size_t g)
{
    if (!z->upd || !z->upd[g])
        return 0;
    z->upd[g] = 0;
    z->n_upd--;
    return submit_locked(z, (op){.kind = OP_UPDATE, .g = g}, NULL);
}

/* Every pending update queued, in group order. */
static int submit_updates(zr_zhost *z)
{
    pthread_mutex_lock(&z->mu);
    int rc = 0;
    for (size_t g = 0; g < z->b.ng && z->n_upd && !rc; g++)
        rc = submit_update_locked(z, g);
    pthread_mutex_unlock(&z->mu);
    return rc;
}

/* Every pending update done: zero_int.h's save_begin (a save, a sample, the end of training),
 * and before a load or an initialization replaces the states. */
static int host_settle(zr_zero *zz)
{
    zr_zhost *z = (zr_zhost *)zz;
    ZR_TRY(submit_updates(z));
    return drain(z);
}

static int host_adamw(zr_zero *zz, uint64_t t, float lr, float clip, const zr_adamw_hp *hp)
{
    zr_zhost *z = (zr_zhost *)zz;
    if (!z->off_opt && !z->off_par) {
        for (size_t g = 0; g < z->b.ng; g++) {
            uint64_t lo, n;
            zr_zero_opt_range(&z->b, g, &lo, &n);
            if (n)
                adamw_range(z, g, lo, n, zr__zero_state(&z->b, g, 0), zr__zero_state(&z->b, g, 1),
                            zr__zero_state(&z->b, g, 2), t, lr, clip, hp);
        }
        return 0;
    }
    ZR_TRY(stream_prepare(z));
    z->pre_done = 0;
    if (z->defer) { /* recorded: each group's update runs before its next gather */
        ZR_TRY(host_settle(zz)); /* none left of the step before (reduce saw to it) */
        z->upd_t = t;
        z->upd_lr = lr;
        z->upd_clip = clip;
        z->upd_hp = *hp;
        memset(z->upd, 1, z->b.ng);
        z->n_upd = z->b.ng;
        return 0;
    }
    /* streamed: every chunk of every group in one pipeline */
    int rc = stream_update(z, 0, z->nch, t, lr, clip, hp);
    z->pre = 0;
    return rc;
}

static const zr_zero_ops host_ops = {
    .free = host_free,
    .hooks = host_hooks,
    .attach = host_attach,
    .init_params = host_init_params,
    .load = host_load,
    .live_states = 1,
    .sink_state = host_sink_state,
    .adamw = host_adamw,
    .save_begin = host_settle,
    .begin_step = host_begin_step,
    .reduce = host_reduce,
    .publish = host_publish,
    .gather_f64 = host_gather_f64,
    .broadcast = host_broadcast,
    .mem = host_mem,
    .sumsq_range = host_sumsq_range,
    .gather_buf = host_gather_buf,
    .gather = host_gather,
};
