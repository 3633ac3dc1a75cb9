/*
 * zero_dev.c: the ZeRO stages on a device (zero_dev.h). The layout of the states is zero.c's:
 * full buffers of W P_g elements per group (zero padding past numel_g) so that collectives
 * work in place on whole groups, own partitions of P_g elements, an ordinary slot size for the
 * stage-2/3 buffers and buffers of their own for groups larger than a slot (the token
 * embedding). The stream discipline (device.h, the model's hook contract):
 *
 *   ms  the model's stream: forward, backward, gradient zeroing, AdamW, sums of squares;
 *   cs  the communicator's stream (NCCL only): every collective waits first for the work
 *       enqueued on ms so far (an event), and ms waits for cs where it reads a result (a
 *       gather buffer's `ready` event, or a join after the step's reductions);
 *   xs  a copy stream for checkpoints, init and the offloaded optimizer.
 *
 * A buffer (gather slot or gradient slot) carries two events: `ready` (its gather is done, on
 * cs) and `freed` (the last reader or the reduction that consumed it is done). The host never
 * waits to hand a buffer out: the stream that next writes it waits for `freed`. Without NCCL
 * (ranks sharing a GPU, or ZR_DEVICE_COMM=shm) every collective is staged through pinned host
 * memory over the shm communicator, synchronously after ms has drained, so the events are not
 * needed (they are recorded all the same: harmless).
 */
#include "zero_dev.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GRAD_SLOTS 3
#define CH_FLOATS ((size_t)1 << 20) /* staging chunk: 4 MiB (with NVMe: --aio-block-size) */
#define GRAIN 1024u                 /* floats: 4 KiB, the swap file's alignment */

static uint64_t grain_up(uint64_t floats) { return (floats + GRAIN - 1) / GRAIN * GRAIN; }

typedef struct {
    float *buf;
    zr_dev_event *ready, *freed;
    int busy; /* big buffers: lent now */
} slot_t;

typedef struct {
    slot_t pb, gb;           /* a big group's own buffers (stage 3 params, stage 2-3 grads) */
    slot_t *plent, *glent;   /* what the model holds now */
} dbuf;

typedef struct {
    size_t g;
    slot_t *s; /* NULL: not issued */
} dentry;

struct zr_zdev {
    const zr_device_ops *ops;
    zr_comm *comm;    /* shm: staged collectives and the host's small ones */
    zr_dev_comm *dc;  /* NCCL (NULL: staged) */
    zr_dev_stream *ms, *cs, *xs;
    zr_dev_event *e_m, *e_c, *e_x[2];
    int rank, W, stage, off_cpu, off_nvme;
    int off_par;            /* stage 3: the parameter partitions in pinned host memory */
    int off_par_nvme;       /* stage 3: the parameter partitions in a swap file */
    zck_swap *osw;          /* off_nvme: exp_avg region, then exp_avg_sq region */
    zck_swap *psw;          /* off_par_nvme: the partitions, group g from float poff[g] */
    uint64_t *poff;
    float *gstage;          /* off_par_nvme: pinned, one partition on its way to a gather */
    zr_dev_event *e_g;      /* its upload done */
    uint64_t *soff, oreg;   /* per group: float offset of its opt range in a region */
    size_t ch;              /* floats per staging chunk */
    unsigned prefetch;
    const zck_layout *L;
    size_t ng;
    zr_zpart *G; /* each group's partition */
    dbuf *B;     /* and buffers */
    uint64_t sum_full, sum_P, slot;
    float *fullp, *fullg, *ownp, *owng, *m, *v; /* device (m, v: pinned host with off_cpu) */
    float *hbuf;                                 /* pinned: staged collectives */
    size_t hbuf_floats;
    float *xbuf;                                 /* pinned: 2 sets of 4 chunks */
    slot_t *ps, *gs;                             /* ordinary slots */
    size_t nps, ngs;
    /* free buffers, oldest freed first: the next user waits the least for its `freed` */
    struct ring {
        slot_t **s;
        size_t cap, head, n;
    } pfree, gfree;
    dentry *sched;
    size_t n_sched, cursor, issued;
    int hook_err;        /* a failure in params_done (which cannot return it), for the next */
    char hook_msg[512];  /* params hook to return with its message */
    uint64_t b_params, b_grads, b_opt, b_bufs, b_pinned;
};

/* ---------------------------------------------------------------- memory */

static int dev_alloc(zr_zdev *d, float **p, uint64_t floats, uint64_t *acct)
{
    size_t bytes = (size_t)(floats ? floats : 1) * sizeof(float);
    ZR_TRY(d->ops->malloc((void **)p, bytes));
    if (acct)
        *acct += bytes;
    return d->ops->memset(*p, 0, bytes, NULL); /* padding and moments start at zero */
}

static int host_alloc(zr_zdev *d, float **p, uint64_t floats)
{
    size_t bytes = (size_t)(floats ? floats : 1) * sizeof(float);
    ZR_TRY(d->ops->host_alloc((void **)p, bytes));
    memset(*p, 0, bytes);
    d->b_pinned += bytes;
    return 0;
}

static int slot_init(zr_zdev *d, slot_t *s, uint64_t floats)
{
    ZR_TRY(dev_alloc(d, &s->buf, floats, &d->b_bufs));
    ZR_TRY(d->ops->event_new(&s->ready));
    return d->ops->event_new(&s->freed);
}

static void slot_free(zr_zdev *d, slot_t *s)
{
    d->ops->free(s->buf);
    if (s->ready)
        d->ops->event_free(s->ready);
    if (s->freed)
        d->ops->event_free(s->freed);
    memset(s, 0, sizeof *s);
}

static int size_groups(zr_zdev *d)
{
    d->ng = zck_layout_n_groups(d->L);
    ZR_TRY(zr__zero_parts(d->L, d->W, d->rank, &d->G, &d->sum_full, &d->sum_P, &d->slot));
    if (!(d->B = calloc(d->ng ? d->ng : 1, sizeof *d->B)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    return 0;
}

int zd_new(zr_zdev **out, zr_comm *comm, const zck_layout *L, const zr_zero_opts *o,
           const zr_device_ops *ops, zr_dev_comm *dc)
{
    *out = NULL;
    if (o->stage < 0 || o->stage > 3)
        return zr_err_set(ZR_EINVAL, "ZeRO stage %d: expected 0..3", o->stage);
    if (o->offload_params && o->stage != 3)
        return zr_err_set(ZR_EINVAL, "--offload-params needs --zero 3");
    if (o->offload_params && !o->offload_optimizer)
        return zr_err_set(ZR_EINVAL, "--offload-params %s on the GPU needs --offload-optimizer "
                          "cpu or nvme (AdamW runs on the CPU, where the parameters live)",
                          o->offload_params == 1 ? "nvme" : "cpu");
    int nvme = o->offload_optimizer == 1 || o->offload_params == 1;
    if (nvme)
        ZR_TRY(zr__zero_check_swap_opts(o));
    zr_zdev *d = calloc(1, sizeof *d);
    if (!d)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    d->ops = ops;
    d->comm = comm;
    d->dc = zr_comm_world(comm) > 1 ? dc : NULL;
    d->rank = zr_comm_rank(comm);
    d->W = zr_comm_world(comm);
    d->stage = o->stage;
    d->prefetch = o->stage == 3 ? o->prefetch : 0;
    d->off_cpu = o->offload_optimizer == 2;
    d->off_nvme = o->offload_optimizer == 1;
    d->off_par = o->offload_params == 2;
    d->off_par_nvme = o->offload_params == 1;
    d->ch = nvme ? o->aio_block / sizeof(float) : CH_FLOATS;
    d->L = L;
    int rc = size_groups(d);
    if (!rc && d->off_nvme) { /* each group's opt range from a 4 KiB boundary */
        if (!(d->soff = calloc(d->ng + 1, sizeof *d->soff)))
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        for (size_t g = 0; !rc && g < d->ng; g++)
            d->soff[g + 1] = d->soff[g] + grain_up(d->stage == 0 ? d->G[g].numel : d->G[g].P);
        d->oreg = rc ? 0 : d->soff[d->ng];
        char path[4096];
        snprintf(path, sizeof path, "%s/optimizer.swap", o->swap_dir);
        if (!rc)
            rc = zck_swap_open(&d->osw, path, 2 * d->oreg * sizeof(float), o->aio_depth,
                               d->ch * sizeof(float));
    }
    if (!rc && d->off_par_nvme) { /* each group's partition from a 4 KiB boundary */
        uint64_t maxP = 0;
        if (!(d->poff = calloc(d->ng + 1, sizeof *d->poff)))
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        for (size_t g = 0; !rc && g < d->ng; g++) {
            d->poff[g + 1] = d->poff[g] + grain_up(d->G[g].P);
            maxP = d->G[g].P > maxP ? d->G[g].P : maxP;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/params.swap", o->swap_dir);
        if (!rc)
            rc = zck_swap_open(&d->psw, path, d->poff[d->ng] * sizeof(float), o->aio_depth,
                               d->ch * sizeof(float));
        if (!rc)
            rc = host_alloc(d, &d->gstage, grain_up(maxP));
        if (!rc)
            rc = ops->event_new(&d->e_g);
    }
    if (!rc && d->dc)
        d->cs = ops->comm_stream(d->dc);
    if (!rc)
        rc = ops->stream_new(&d->xs);
    for (int i = 0; i < 2 && !rc; i++)
        rc = ops->event_new(&d->e_x[i]);
    if (!rc)
        rc = ops->event_new(&d->e_m);
    if (!rc)
        rc = ops->event_new(&d->e_c);
    /* the states */
    int s = d->stage;
    if (!rc)
        rc = s < 3              ? dev_alloc(d, &d->fullp, d->sum_full, &d->b_params)
             : d->off_par       ? host_alloc(d, &d->ownp, d->sum_P)
             : d->off_par_nvme  ? 0
                                : dev_alloc(d, &d->ownp, d->sum_P, &d->b_params);
    if (!rc)
        rc = s < 2 ? dev_alloc(d, &d->fullg, d->sum_full, &d->b_grads)
                   : dev_alloc(d, &d->owng, d->sum_P, &d->b_grads);
    uint64_t mv = s == 0 ? d->sum_full : d->sum_P;
    if (!rc && d->off_cpu) {
        rc = host_alloc(d, &d->m, mv);
        if (!rc) /* counted as pinned host memory, not device memory */
            rc = host_alloc(d, &d->v, mv);
    } else if (!rc && !d->off_nvme) {
        rc = dev_alloc(d, &d->m, mv, &d->b_opt);
        if (!rc)
            rc = dev_alloc(d, &d->v, mv, &d->b_opt);
    }
    /* buffers: stage 2-3 gradient slots, stage 3 gather slots (prefetch + 2: the model holds
     * at most two groups) */
    if (!rc && s >= 2) {
        d->ngs = GRAD_SLOTS;
        d->nps = s == 3 ? d->prefetch + 2 : 0;
        d->gs = calloc(d->ngs, sizeof *d->gs);
        d->ps = calloc(d->nps ? d->nps : 1, sizeof *d->ps);
        d->gfree.cap = d->ngs;
        d->pfree.cap = d->nps;
        d->gfree.s = calloc(d->ngs, sizeof *d->gfree.s);
        d->pfree.s = calloc(d->nps ? d->nps : 1, sizeof *d->pfree.s);
        if (!d->gs || !d->ps || !d->gfree.s || !d->pfree.s)
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        for (size_t i = 0; i < d->ngs && !rc; i++)
            rc = slot_init(d, &d->gs[i], d->slot);
        for (size_t i = 0; i < d->nps && !rc; i++)
            rc = slot_init(d, &d->ps[i], d->slot);
        for (size_t g = 0; g < d->ng && !rc; g++) {
            if (!d->G[g].big)
                continue;
            rc = slot_init(d, &d->B[g].gb, d->G[g].full);
            if (!rc && s == 3)
                rc = slot_init(d, &d->B[g].pb, d->G[g].full);
        }
    }
    /* pinned staging: chunks for copies; whole groups for staged collectives */
    if (!rc)
        rc = host_alloc(d, &d->xbuf, 8 * d->ch);
    if (!rc && !d->dc && d->W > 1) {
        for (size_t g = 0; g < d->ng; g++)
            if (d->G[g].full > d->hbuf_floats)
                d->hbuf_floats = d->G[g].full;
        if (d->hbuf_floats < CH_FLOATS && d->stage == 0)
            d->hbuf_floats = CH_FLOATS; /* the stage-0 all-reduce streams in chunks */
        rc = host_alloc(d, &d->hbuf, d->hbuf_floats);
    }
    if (rc) {
        zd_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void zd_free(zr_zdev *d)
{
    if (!d)
        return;
    const zr_device_ops *ops = d->ops;
    /* not ms: the model (freed first) drained and destroyed its stream */
    zck_swap_close(d->osw, 1); /* scratch, removed; their transfers may use the staging */
    zck_swap_close(d->psw, 1);
    d->osw = d->psw = NULL;
    if (d->e_g)
        ops->event_sync(d->e_g);
    if (d->cs)
        ops->stream_sync(d->cs);
    if (d->xs)
        ops->stream_sync(d->xs);
    ops->free(d->fullp);
    ops->free(d->fullg);
    if (d->off_par)
        ops->host_free(d->ownp);
    else
        ops->free(d->ownp);
    ops->host_free(d->gstage);
    if (d->e_g)
        ops->event_free(d->e_g);
    free(d->poff);
    ops->free(d->owng);
    if (d->off_cpu) {
        ops->host_free(d->m);
        ops->host_free(d->v);
    } else if (!d->off_nvme) {
        ops->free(d->m);
        ops->free(d->v);
    }
    for (size_t i = 0; d->gs && i < d->ngs; i++)
        slot_free(d, &d->gs[i]);
    for (size_t i = 0; d->ps && i < d->nps; i++)
        slot_free(d, &d->ps[i]);
    for (size_t g = 0; d->B && g < d->ng; g++) {
        slot_free(d, &d->B[g].gb);
        slot_free(d, &d->B[g].pb);
    }
    ops->host_free(d->xbuf);
    ops->host_free(d->hbuf);
    for (int i = 0; i < 2; i++)
        if (d->e_x[i])
            ops->event_free(d->e_x[i]);
    if (d->e_m)
        ops->event_free(d->e_m);
    if (d->e_c)
        ops->event_free(d->e_c);
    if (d->xs)
        ops->stream_free(d->xs);
    free(d->gs);
    free(d->ps);
    free(d->gfree.s);
    free(d->pfree.s);
    free(d->sched);
    free(d->G);
    free(d->B);
    free(d->soff);
    free(d);
}

void zd_mem(const zr_zdev *d, zr_zero_bytes *out)
{
    memset(out, 0, sizeof *out);
    out->params = d->b_params;
    out->grads = d->b_grads;
    out->optimizer = d->b_opt;
    out->buffers = d->b_bufs;
    out->pinned = d->b_pinned;
    out->nvme = (d->osw ? zck_swap_size(d->osw) : 0) + (d->psw ? zck_swap_size(d->psw) : 0);
}

int zd_offloaded(const zr_zdev *d) { return d->off_nvme || d->off_par_nvme; }

int zd_check_swap(zr_zdev *d)
{
    if (d->osw)
        ZR_TRY(zck_swap_check(d->osw));
    return d->psw ? zck_swap_check(d->psw) : 0;
}

/* ---------------------------------------------------------------- ranges and pointers */

void zd_part_range(const zr_zdev *d, size_t g, uint64_t *lo, uint64_t *n)
{
    *lo = d->G[g].lo;
    *n = d->G[g].n;
}

void zd_opt_range(const zr_zdev *d, size_t g, uint64_t *lo, uint64_t *n)
{
    if (d->stage == 0) {
        *lo = 0;
        *n = d->G[g].numel;
    } else
        zd_part_range(d, g, lo, n);
}

uint64_t zd_part_floats(const zr_zdev *d)
{
    uint64_t n = 0;
    for (size_t g = 0; g < d->ng; g++)
        n += 3 * d->G[g].n;
    return n;
}

/* Element `lo` of group g's opt range for state s (0 param, 1 exp_avg, 2 exp_avg_sq, 3 grad):
 * device memory, or pinned host memory for the moments with the optimizer offloaded. */
static float *state_ptr(zr_zdev *d, size_t g, int s)
{
    const zr_zpart *p = &d->G[g];
    int st = d->stage;
    switch (s) {
    case 0:
        if (d->off_par_nvme)
            return NULL;
        return st == 0 ? d->fullp + p->foff : st < 3 ? d->fullp + p->foff + p->lo
                                                     : d->ownp + p->ooff;
    case 3:
        return st == 0 ? d->fullg + p->foff : st < 2 ? d->fullg + p->foff + p->lo
                                                     : d->owng + p->ooff;
    default:
        if (d->off_nvme)
            return NULL;
        return (s == 1 ? d->m : d->v) + (st == 0 ? p->foff : p->ooff);
    }
}

/* State s (0 param, 1 exp_avg, 2 exp_avg_sq) in pinned host memory, not on the device. */
static int on_host(const zr_zdev *d, int s)
{
    return s == 0 ? d->off_par : d->off_cpu && (s == 1 || s == 2);
}

/* State s of group g in a swap file (the moments, or the stage-3 parameter partitions): its
 * file, and the float offset there of the start of the group's opt range. */
static int on_nvme(const zr_zdev *d, int s)
{
    return s == 0 ? d->off_par_nvme : d->off_nvme && (s == 1 || s == 2);
}
static zck_swap *swap_of(const zr_zdev *d, int s) { return s == 0 ? d->psw : d->osw; }
static uint64_t swap_at(const zr_zdev *d, size_t g, int s)
{
    return s == 0 ? d->poff[g] : (s == 2 ? d->oreg : 0) + d->soff[g];
}

/* ---------------------------------------------------------------- collectives */

/* cs waits for the work enqueued on ms so far (NCCL); staged: ms drained */
static int after_model(zr_zdev *d)
{
    if (!d->ms)
        return 0;
    if (!d->dc)
        return d->ops->stream_sync(d->ms);
    ZR_TRY(d->ops->event_record(d->e_m, d->ms));
    return d->ops->stream_wait(d->cs, d->e_m);
}

/* ms waits for everything enqueued on cs so far */
static int model_after_comm(zr_zdev *d)
{
    if (!d->dc || !d->ms)
        return 0;
    ZR_TRY(d->ops->event_record(d->e_c, d->cs));
    return d->ops->stream_wait(d->ms, d->e_c);
}

static int h2d(zr_zdev *d, float *dst, const float *src, uint64_t n)
{
    return d->ops->memcpy(dst, src, (size_t)n * sizeof(float), ZR_DEV_H2D, NULL);
}

static int d2h(zr_zdev *d, float *dst, const float *src, uint64_t n)
{
    return d->ops->memcpy(dst, src, (size_t)n * sizeof(float), ZR_DEV_D2H, NULL);
}

/* buf[n] summed over ranks, in place */
static int c_all_reduce(zr_zdev *d, float *buf, uint64_t n)
{
    if (d->W == 1 || !n)
        return 0;
    ZR_TRY(after_model(d));
    if (d->dc)
        return d->ops->all_reduce(d->dc, buf, buf, (size_t)n, ZR_DEV_F32);
    for (uint64_t at = 0; at < n; at += d->hbuf_floats) {
        uint64_t c = n - at < d->hbuf_floats ? n - at : d->hbuf_floats;
        ZR_TRY(d2h(d, d->hbuf, buf + at, c));
        ZR_TRY(zr_comm_all_reduce(d->comm, d->hbuf, d->hbuf, (size_t)c, ZR_COMM_F32));
        ZR_TRY(h2d(d, buf + at, d->hbuf, c));
    }
    return 0;
}

/* buf holds W P; this rank's sum lands at buf + rank P */
static int c_reduce_scatter(zr_zdev *d, float *buf, uint64_t P)
{
    if (d->W == 1)
        return 0;
    ZR_TRY(after_model(d));
    float *mine = buf + (size_t)d->rank * P;
    if (d->dc)
        return d->ops->reduce_scatter(d->dc, buf, mine, (size_t)P, ZR_DEV_F32);
    float *hm = d->hbuf + (size_t)d->rank * P;
    ZR_TRY(d2h(d, d->hbuf, buf, (uint64_t)d->W * P));
    ZR_TRY(zr_comm_reduce_scatter(d->comm, d->hbuf, hm, (size_t)P, ZR_COMM_F32));
    return h2d(d, mine, hm, P);
}

/* recv[W P] = every rank's send[P] (send == recv + rank P: in place). With host, send is
 * pinned host memory (an offloaded partition): uploaded into its place of recv (on the comm
 * stream with NCCL), then gathered in place. */
static int c_all_gather(zr_zdev *d, const float *send, int host, float *recv, uint64_t P)
{
    float *mine = recv + (size_t)d->rank * P;
    size_t bytes = (size_t)P * sizeof(float);
    int kind = host ? ZR_DEV_H2D : ZR_DEV_D2D;
    if (d->W == 1) /* a copy, ordered on the model's stream */
        return send == mine ? 0 : d->ops->memcpy(mine, send, bytes, kind, d->ms);
    ZR_TRY(after_model(d));
    if (d->dc) {
        if (host)
            ZR_TRY(d->ops->memcpy(mine, send, bytes, ZR_DEV_H2D, d->cs));
        return d->ops->all_gather(d->dc, host ? mine : send, recv, (size_t)P, sizeof(float));
    }
    float *hm = d->hbuf + (size_t)d->rank * P;
    if (host)
        memcpy(hm, send, bytes);
    else
        ZR_TRY(d2h(d, hm, send, P));
    ZR_TRY(zr_comm_all_gather(d->comm, hm, d->hbuf, (size_t)P, sizeof(float)));
    return h2d(d, recv, d->hbuf, (uint64_t)d->W * P);
}

/* ---------------------------------------------------------------- hooks */

static void ring_put(struct ring *r, slot_t *s) { r->s[(r->head + r->n++) % r->cap] = s; }

static slot_t *ring_take(struct ring *r)
{
    if (!r->n)
        return NULL;
    slot_t *s = r->s[r->head];
    r->head = (r->head + 1) % r->cap;
    r->n--;
    return s;
}

static void reset_buffers(zr_zdev *d)
{
    d->pfree.head = d->pfree.n = d->gfree.head = d->gfree.n = 0;
    for (size_t i = 0; i < d->nps; i++)
        ring_put(&d->pfree, &d->ps[i]);
    for (size_t i = 0; i < d->ngs; i++)
        ring_put(&d->gfree, &d->gs[i]);
    for (size_t g = 0; g < d->ng; g++) {
        d->B[g].pb.busy = d->B[g].gb.busy = 0;
        d->B[g].plent = d->B[g].glent = NULL;
    }
}

/* Gather group g's parameters into s: after the buffer's last readers (freed), marked ready. */
static int gather_into(zr_zdev *d, size_t g, slot_t *s)
{
    const zr_zpart *p = &d->G[g];
    if (d->dc)
        ZR_TRY(d->ops->stream_wait(d->cs, s->freed));
    if (d->off_par_nvme) { /* read the partition, upload it, gather */
        uint64_t t;
        ZR_TRY(d->ops->event_sync(d->e_g)); /* the last upload from the staging is done */
        ZR_TRY(zck_swap_read(d->psw, d->gstage, grain_up(p->P) * sizeof(float),
                             d->poff[g] * sizeof(float), &t));
        ZR_TRY(zck_swap_wait(d->psw, t));
        ZR_TRY(c_all_gather(d, d->gstage, 1, s->buf, p->P));
        ZR_TRY(d->ops->event_record(d->e_g, d->W > 1 && d->dc ? d->cs : d->ms));
    } else
        ZR_TRY(c_all_gather(d, d->ownp + p->ooff, d->off_par, s->buf, p->P));
    return d->ops->event_record(s->ready, d->dc ? d->cs : d->ms);
}

/* Issue the schedule's gathers up to position upto, while buffers allow (zero.c's rule). */
static int issue_more(zr_zdev *d, size_t upto)
{
    while (d->issued < d->n_sched && d->issued <= upto) {
        dentry *e = &d->sched[d->issued];
        dbuf *b = &d->B[e->g];
        slot_t *s;
        if (d->G[e->g].big) {
            if (b->pb.busy)
                break;
            s = &b->pb;
            s->busy = 1;
        } else {
            if (!(s = ring_take(&d->pfree)))
                break;
        }
        e->s = s;
        ZR_TRY(gather_into(d, e->g, s));
        d->issued++;
    }
    return 0;
}

static int hook_params(void *ctx, size_t g, const float **out)
{
    zr_zdev *d = ctx;
    if (d->stage < 3) {
        *out = d->fullp + d->G[g].foff;
        return 0;
    }
    if (d->hook_err)
        return zr_err_set(d->hook_err, "%s", d->hook_msg);
    size_t c = d->cursor;
    if (c >= d->n_sched || d->sched[c].g != g)
        return zr_err_set(ZR_ERROR, "ZeRO-3: the model asked for group %zu out of the gather "
                          "schedule (position %zu of %zu)", g, c, d->n_sched);
    ZR_TRY(issue_more(d, c + d->prefetch));
    if (d->issued <= c)
        return zr_err_set(ZR_ERROR, "ZeRO-3: no gather buffer free for group %zu", g);
    slot_t *s = d->sched[c].s;
    if (d->dc)
        ZR_TRY(d->ops->stream_wait(d->ms, s->ready));
    d->B[g].plent = s;
    d->cursor++;
    *out = s->buf;
    return 0;
}

static void hook_params_done(void *ctx, size_t g)
{
    zr_zdev *d = ctx;
    dbuf *b = &d->B[g];
    if (d->stage < 3 || !b->plent)
        return;
    slot_t *s = b->plent;
    b->plent = NULL;
    int rc = d->ops->event_record(s->freed, d->ms);
    if (!rc) {
        if (d->G[g].big)
            s->busy = 0;
        else
            ring_put(&d->pfree, s);
        rc = issue_more(d, d->cursor + d->prefetch);
    }
    if (rc && !d->hook_err) { /* returned by the next fetch, with its cause */
        d->hook_err = rc;
        snprintf(d->hook_msg, sizeof d->hook_msg, "%s", zr_err_msg());
    }
}

static int hook_grads(void *ctx, size_t g, float **out)
{
    zr_zdev *d = ctx;
    const zr_zpart *p = &d->G[g];
    dbuf *b = &d->B[g];
    if (d->stage < 2) {
        *out = d->fullg + p->foff;
        return 0;
    }
    slot_t *s;
    if (p->big) {
        if (b->gb.busy)
            return zr_err_set(ZR_ERROR, "ZeRO-%d: group %zu's gradient buffer is still lent",
                              d->stage, g);
        s = &b->gb;
        s->busy = 1;
    } else {
        if (!(s = ring_take(&d->gfree)))
            return zr_err_set(ZR_ERROR, "ZeRO-%d: no gradient buffer free for group %zu",
                              d->stage, g);
    }
    /* the buffer's last reduction done before it is zeroed for this group */
    ZR_TRY(d->ops->stream_wait(d->ms, s->freed));
    ZR_TRY(d->ops->memset(s->buf, 0, (size_t)p->full * sizeof(float), d->ms));
    b->glent = s;
    *out = s->buf;
    return 0;
}

static int hook_grads_done(void *ctx, size_t g)
{
    zr_zdev *d = ctx;
    const zr_zpart *p = &d->G[g];
    dbuf *b = &d->B[g];
    if (d->stage < 2)
        return 0;
    slot_t *s = b->glent;
    b->glent = NULL;
    if (!s)
        return zr_err_set(ZR_ERROR, "ZeRO-%d: group %zu's gradient was not lent", d->stage, g);
    /* reduce-scatter in place, then this rank's part added into its gradient partition (the
     * micro-batches accumulate there), on the comm stream with NCCL */
    ZR_TRY(c_reduce_scatter(d, s->buf, p->P));
    zr_dev_stream *st = d->dc ? d->cs : d->ms;
    ZR_TRY(d->ops->add(d->owng + p->ooff, s->buf + (size_t)d->rank * p->P, (size_t)p->P, st));
    ZR_TRY(d->ops->event_record(s->freed, st));
    if (p->big)
        s->busy = 0;
    else
        ring_put(&d->gfree, s);
    return 0;
}

void zd_hooks(zr_zdev *d, zr_model_hooks *h)
{
    memset(h, 0, sizeof *h);
    h->ctx = d;
    h->params = hook_params;
    h->params_done = hook_params_done;
    h->grads = hook_grads;
    h->grads_done = hook_grads_done;
}

int zd_attach(zr_zdev *d, zr_dev_model *m, unsigned n_micro)
{
    d->ms = d->ops->model_stream(m);
    if (d->stage != 3)
        return 0;
    size_t L = d->ng, *fwd = calloc(2 * (L + 4), sizeof *fwd);
    if (!fwd)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t *bwd = fwd + L + 4;
    size_t nf = d->ops->model_fetch_order(m, 0, fwd), nb = d->ops->model_fetch_order(m, 1, bwd);
    free(d->sched);
    d->sched = NULL;
    size_t *order;
    int rc = zr__zero_schedule(fwd, nf, bwd, nb, n_micro, &order, &d->n_sched);
    free(fwd);
    ZR_TRY(rc);
    if (!(d->sched = calloc(d->n_sched ? d->n_sched : 1, sizeof *d->sched))) {
        free(order);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    for (size_t k = 0; k < d->n_sched; k++)
        d->sched[k].g = order[k];
    free(order);
    return 0;
}

/* ---------------------------------------------------------------- the step */

int zd_begin_step(zr_zdev *d)
{
    ZR_TRY(model_after_comm(d)); /* the last step's gathers (publish) before the forward */
    if (d->hook_err) /* a failed step is not retried: the run stops */
        return zr_err_set(d->hook_err, "%s", d->hook_msg);
    if (d->stage >= 2)
        reset_buffers(d);
    if (d->stage < 2)
        ZR_TRY(d->ops->memset(d->fullg, 0, (size_t)d->sum_full * sizeof(float), d->ms));
    else
        ZR_TRY(d->ops->memset(d->owng, 0, (size_t)d->sum_P * sizeof(float), d->ms));
    if (d->stage == 3) {
        d->cursor = d->issued = 0;
        for (size_t k = 0; k < d->n_sched; k++)
            d->sched[k].s = NULL;
        if (d->prefetch) /* the first gathers overlap the batch's sampling */
            ZR_TRY(issue_more(d, d->prefetch - 1));
    }
    return 0;
}

/* comm_wait's check: the host communicator's news of a dead peer, every 50 ms at most (a
 * peer lost inside an NCCL call would otherwise leave this rank waiting for its launcher) */
typedef struct {
    zr_comm *comm;
    double next; /* seconds, CLOCK_MONOTONIC */
} peer_check;

static int check_peers(void *ctx)
{
    peer_check *k = ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    if (now < k->next)
        return 0;
    k->next = now + 0.05;
    return zr_comm_check(k->comm);
}

int zd_reduce(zr_zdev *d)
{
    if (d->stage == 0)
        ZR_TRY(c_all_reduce(d, d->fullg, d->sum_full));
    else if (d->stage == 1)
        for (size_t g = 0; g < d->ng; g++)
            ZR_TRY(c_reduce_scatter(d, d->fullg + d->G[g].foff, d->G[g].P));
    if (d->dc) { /* every reduction done (a failed or aborted NCCL call surfaces here) */
        peer_check k = {d->comm, 0};
        ZR_TRY(d->ops->comm_wait(d->dc, check_peers, &k));
    }
    return model_after_comm(d);
}

static int dev_sumsq(void *ctx, const float *x, size_t n, double *out)
{
    zr_zdev *d = ctx;
    return d->ops->sumsq(x, n, out, d->ms);
}

/* Sum of squares of rank q's partition of every group, in group order (zero.c's sums). */
static int part_sumsq(zr_zdev *d, float *const *base, int q, double *out)
{
    return zr__zero_part_sumsq(d->L, d->W, q, base, dev_sumsq, d, out);
}

int zd_sumsq(zr_zdev *d, double *out)
{
    float **base = calloc(d->ng ? d->ng : 1, sizeof *base);
    double *all = calloc((size_t)d->W, sizeof *all);
    int rc = 0;
    if (!base || !all) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    double total = 0, x;
    if (d->stage == 0) {
        for (size_t g = 0; g < d->ng; g++)
            base[g] = d->fullg + d->G[g].foff;
        for (int q = 0; q < d->W && !rc; q++)
            if (!(rc = part_sumsq(d, base, q, &x)))
                total += x;
    } else {
        for (size_t g = 0; g < d->ng; g++) /* element i of group g at base[g][i] */
            base[g] = state_ptr(d, g, 3) - d->G[g].lo;
        double mine = 0;
        if (!(rc = part_sumsq(d, base, d->rank, &mine)))
            rc = zr_comm_all_gather(d->comm, &mine, all, 1, sizeof(double));
        for (int q = 0; q < d->W && !rc; q++)
            total += all[q];
    }
    *out = total;
out:
    free(base);
    free(all);
    return rc;
}

typedef struct {
    zr_zdev *d;
    float *p, *g, *m, *v;
    uint64_t t;
    float lr, clip;
    const zr_adamw_hp *hp;
} adam_ctx;

/* AdamW on one tensor's part (zr__zero_tensors), on the device or on the host */
static int adam_dev(void *ctx, uint64_t at, uint64_t cnt, int decay)
{
    adam_ctx *a = ctx;
    return a->d->ops->adamw(a->p + at, a->g + at, a->m + at, a->v + at, (size_t)cnt, a->t,
                            a->lr, a->clip, decay, a->hp, a->d->ms);
}

static int adam_host(void *ctx, uint64_t at, uint64_t cnt, int decay)
{
    adam_ctx *a = ctx;
    zr_adamw_update(a->p + at, a->g + at, a->m + at, a->v + at, (size_t)cnt, a->t, a->lr,
                    a->clip, decay, a->hp);
    return 0;
}

/* ZeRO-Offload: chunk k's params and grads come down on xs into staging set k mod 2 (and its
 * moments from the swap file, with NVMe) while the CPU updates chunk k-1; the updated params
 * go back up on xs (and the moments back to the swap file). */
static int adamw_offloaded(zr_zdev *d, uint64_t t, float lr, float clip, const zr_adamw_hp *hp)
{
    const zr_device_ops *ops = d->ops;
    size_t nc = 0, ch = d->ch;
    zr_zchunk *c = NULL;
    ZR_TRY(zr__zero_chunks(d->L, d->W, d->rank, d->stage, ch, &c, &nc));
    int rc = 0;
    if (d->ms) { /* the gradients are complete on ms */
        rc = ops->event_record(d->e_m, d->ms);
        if (!rc)
            rc = ops->stream_wait(d->xs, d->e_m);
    }
    /* swap tickets of each set and file (0 params, 1 moments): reads, write-backs */
    uint64_t rt[2][2] = {{0, 0}, {0, 0}}, wt[2][2] = {{0, 0}, {0, 0}};
    const int dev_par = !on_host(d, 0) && !on_nvme(d, 0); /* params on the device */
#define BUF(k, i) (d->xbuf + ((size_t)((k) % 2) * 4 + (i)) * ch) /* i: 0 p, 1 g, 2 m, 3 v */
#define STAGED(k, s) BUF(k, (s) == 0 ? 0 : (s) + 1)
    for (size_t k = 0; k <= nc && !rc; k++) {
        if (k < nc) { /* set k%2 was last used by chunk k-2, whose upload xs ordered before */
            const zr_zchunk *e = &c[k];
            if (dev_par)
                rc = ops->memcpy(BUF(k, 0), state_ptr(d, e->g, 0) + e->off,
                                 e->cnt * sizeof(float), ZR_DEV_D2H, d->xs);
            if (!rc)
                rc = ops->memcpy(BUF(k, 1), state_ptr(d, e->g, 3) + e->off,
                                 e->cnt * sizeof(float), ZR_DEV_D2H, d->xs);
            if (!rc)
                rc = ops->event_record(d->e_x[k % 2], d->xs);
            for (int s = 0; s <= 2 && !rc; s++) { /* after the set's last write-back */
                if (!on_nvme(d, s))
                    continue;
                int f = s > 0;
                if (wt[k % 2][f])
                    rc = zck_swap_wait(swap_of(d, s), wt[k % 2][f]);
                if (!rc)
                    rc = zck_swap_read(swap_of(d, s), STAGED(k, s),
                                       grain_up(e->cnt) * sizeof(float),
                                       (swap_at(d, e->g, s) + e->off) * sizeof(float),
                                       &rt[k % 2][f]);
            }
        }
        if (rc || k == 0)
            continue;
        size_t j = k - 1; /* update chunk j on the CPU, then upload it */
        const zr_zchunk *e = &c[j];
        if ((rc = ops->event_sync(d->e_x[j % 2])))
            break;
        float *ptr[3];
        for (int s = 0; s <= 2 && !rc; s++) {
            if (on_nvme(d, s)) {
                ptr[s] = STAGED(j, s);
                rc = zck_swap_wait(swap_of(d, s), rt[j % 2][s > 0]);
            } else
                ptr[s] = s == 0 && dev_par ? BUF(j, 0) : state_ptr(d, e->g, s) + e->off;
        }
        if (rc)
            break;
        uint64_t lo, n;
        zd_opt_range(d, e->g, &lo, &n);
        adam_ctx a = {d, ptr[0], BUF(j, 1), ptr[1], ptr[2], t, lr, clip, hp};
        rc = zr__zero_tensors(d->L, e->g, lo + e->off, e->cnt, adam_host, &a);
        if (!rc && dev_par)
            rc = ops->memcpy(state_ptr(d, e->g, 0) + e->off, BUF(j, 0),
                             e->cnt * sizeof(float), ZR_DEV_H2D, d->xs);
        for (int s = 0; s <= 2 && !rc; s++)
            if (on_nvme(d, s))
                rc = zck_swap_write(swap_of(d, s), STAGED(j, s),
                                    grain_up(e->cnt) * sizeof(float),
                                    (swap_at(d, e->g, s) + e->off) * sizeof(float),
                                    &wt[j % 2][s > 0]);
        /* the set is next written by chunk j+2's download, enqueued after this upload on
         * xs; the host touches it again only once that download is done */
    }
#undef STAGED
#undef BUF
    if (!rc)
        rc = ops->stream_sync(d->xs);
    if (!rc && d->osw)
        rc = zck_swap_wait(d->osw, UINT64_MAX);
    if (!rc && d->psw)
        rc = zck_swap_wait(d->psw, UINT64_MAX);
    free(c);
    return rc;
}

int zd_adamw(zr_zdev *d, uint64_t t, float lr, float clip, const zr_adamw_hp *hp)
{
    if (d->off_cpu || d->off_nvme)
        return adamw_offloaded(d, t, lr, clip, hp);
    for (size_t g = 0; g < d->ng; g++) {
        uint64_t lo, n;
        zd_opt_range(d, g, &lo, &n);
        if (!n)
            continue;
        adam_ctx a = {d,  state_ptr(d, g, 0), state_ptr(d, g, 3), state_ptr(d, g, 1),
                      state_ptr(d, g, 2), t, lr, clip, hp};
        ZR_TRY(zr__zero_tensors(d->L, g, lo, n, adam_dev, &a));
    }
    return 0;
}

int zd_publish(zr_zdev *d)
{
    if (d->stage != 1 && d->stage != 2)
        return 0;
    for (size_t g = 0; g < d->ng; g++) {
        float *full = d->fullp + d->G[g].foff;
        ZR_TRY(c_all_gather(d, full + (size_t)d->rank * d->G[g].P, 0, full, d->G[g].P));
    }
    return 0; /* the next step's begin orders ms after these */
}

/* ---------------------------------------------------------------- states in and out */

/* Host data into device memory dst[0, n), chunk by chunk: produce(ctx, off, cnt, buf) fills
 * a staging chunk; the upload of one chunk overlaps the production of the next. */
static int upload(zr_zdev *d, float *dst, uint64_t n, zr_zproduce_fn f, void *ctx)
{
    const zr_device_ops *ops = d->ops;
    for (uint64_t off = 0, k = 0; off < n; off += d->ch, k++) {
        uint64_t cnt = n - off < d->ch ? n - off : d->ch;
        float *b = d->xbuf + (k % 2) * d->ch;
        if (k >= 2) /* this set's previous upload has been read */
            ZR_TRY(ops->event_sync(d->e_x[k % 2]));
        ZR_TRY(f(ctx, off, cnt, b));
        ZR_TRY(ops->memcpy(dst + off, b, (size_t)cnt * sizeof(float), ZR_DEV_H2D, d->xs));
        ZR_TRY(ops->event_record(d->e_x[k % 2], d->xs));
    }
    return ops->stream_sync(d->xs);
}

int zd_init_params(zr_zdev *d, zr_zero_fill_fn fill, void *ctx)
{
    for (size_t g = 0; g < d->ng; g++) {
        uint64_t lo = 0, n = d->G[g].numel;
        if (d->stage == 3)
            zd_opt_range(d, g, &lo, &n);
        zr_zfill f = {fill, ctx, g, lo};
        if (on_nvme(d, 0)) {
            ZR_TRY(zr__zero_swap_fill(d->psw, d->xbuf, d->ch, d->poff[g], n,
                                      zr__zero_produce_fill, &f));
            continue;
        }
        float *dst = d->stage < 3 ? d->fullp + d->G[g].foff : d->ownp + d->G[g].ooff;
        if (on_host(d, 0)) {
            if (n)
                fill(ctx, g, lo, n, dst);
            continue;
        }
        ZR_TRY(upload(d, dst, n, zr__zero_produce_fill, &f));
    }
    return 0; /* the moments: zero on the device (dev_alloc) and in a fresh swap file */
}

int zd_load(zr_zdev *d, zck_reader *rd)
{
    const zck_layout *L = zck_reader_layout(rd);
    size_t st[3];
    static const char *names[3] = {"param", "exp_avg", "exp_avg_sq"};
    for (int s = 0; s < 3; s++)
        if (zck_layout_find_state(L, &st[s], names[s]) < 0)
            return zr_err_set(ZR_EINVAL, "%s: no state '%s'", zck_reader_path(rd), names[s]);
    for (size_t g = 0; g < d->ng; g++) {
        uint64_t lo, n;
        zd_opt_range(d, g, &lo, &n);
        for (int s = 0; s < 3; s++) {
            uint64_t a = lo, cnt = n;
            float *dst = state_ptr(d, g, s);
            if (s == 0 && d->stage < 3) { /* stages 0-2 hold every parameter */
                a = 0;
                cnt = d->G[g].numel;
                dst = d->fullp + d->G[g].foff;
            }
            if (!cnt)
                continue;
            zr_zread r = {rd, g, st[s], a};
            if (on_host(d, s))
                ZR_TRY(zck_reader_read_range(rd, g, st[s], a, cnt, dst));
            else if (on_nvme(d, s))
                ZR_TRY(zr__zero_swap_fill(swap_of(d, s), d->xbuf, d->ch, swap_at(d, g, s), cnt,
                                          zr__zero_produce_read, &r));
            else
                ZR_TRY(upload(d, dst, cnt, zr__zero_produce_read, &r));
        }
    }
    return 0;
}

int zd_save_to(zr_zdev *d, const zr_zero_sink *w)
{
    const zr_device_ops *ops = d->ops;
    const uint64_t ch = d->ch;
    if (d->ms) { /* the states as the last enqueued step left them */
        ZR_TRY(ops->event_record(d->e_m, d->ms));
        ZR_TRY(ops->stream_wait(d->xs, d->e_m));
    }
    for (size_t g = 0; g < d->ng; g++) {
        uint64_t plo, pn, olo, on;
        zd_part_range(d, g, &plo, &pn);
        zd_opt_range(d, g, &olo, &on);
        if (!pn)
            continue;
        for (int s = 0; s < 3; s++) {
            ZR_TRY(w->begin(w->ctx, g, (size_t)s, plo, pn));
            if (on_nvme(d, s)) {
                ZR_TRY(zr__zero_swap_to_sink(swap_of(d, s), d->xbuf, d->ch,
                                             swap_at(d, g, s) + (plo - olo), pn, w));
                continue;
            }
            const float *src = state_ptr(d, g, s) + (plo - olo);
            if (on_host(d, s)) {
                ZR_TRY(w->write(w->ctx, src, (size_t)pn * sizeof(float)));
                continue;
            }
            /* the download of chunk k+1 overlaps the sink's write of chunk k */
            uint64_t nck = (pn + ch - 1) / ch;
            for (uint64_t k = 0; k <= nck; k++) {
                if (k < nck) {
                    uint64_t off = k * ch, cnt = pn - off < ch ? pn - off : ch;
                    ZR_TRY(ops->memcpy(d->xbuf + (k % 2) * ch, src + off,
                                       (size_t)cnt * sizeof(float), ZR_DEV_D2H, d->xs));
                    ZR_TRY(ops->event_record(d->e_x[k % 2], d->xs));
                }
                if (k == 0)
                    continue;
                uint64_t j = k - 1, off = j * ch;
                uint64_t cnt = pn - off < ch ? pn - off : ch;
                ZR_TRY(ops->event_sync(d->e_x[j % 2]));
                ZR_TRY(w->write(w->ctx, d->xbuf + (j % 2) * ch, (size_t)cnt * sizeof(float)));
            }
        }
    }
    return 0;
}
