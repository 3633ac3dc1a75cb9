/*
 * zero_dev.c: the ZeRO stages on a device (zero.h's device engine: its operations table, in
 * zero_int.h, chosen by zr_zero_new when given a device). The layout of the states is the
 * host engine's (zero_int.h's common part): full buffers of W P_g elements per group (zero
 * padding past numel_g) so that collectives work in place on whole groups, own partitions of
 * P_g elements, an ordinary slot size for the stage-2/3 buffers and buffers of their own for
 * groups larger than a slot (the token embedding). The stream discipline (device.h, the
 * model's hook contract):
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
#include "zero_int.h"

#include <stdio.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GRAD_SLOTS 3
#define CH_FLOATS ((size_t)1 << 20) /* staging chunk: 4 MiB (with NVMe: --aio-block-size) */

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
    zr_zero b; /* first: zero.h's handle (the swap files and regions are its) */
    const zr_device_ops *ops;
    zr_dev_comm *dc;  /* NCCL (NULL: staged over b.comm, which also runs the small ones) */
    zr_dev_stream *ms, *cs, *xs;
    zr_dev_event *e_m, *e_c, *e_x[2];
    /* where the moments and the stage-3 parameter partitions live (ZR_OFFLOAD_*) */
    int opt_at, par_at;
    float *gstage;          /* partitions on NVMe: pinned, one on its way to a gather */
    zr_dev_event *e_g;      /* its upload done */
    dbuf *B;                /* each group's buffers */
    float *hbuf;                                 /* pinned: staged collectives */
    size_t hbuf_floats;
    slot_t *ps, *gs;                             /* ordinary slots */
    size_t nps, ngs;
    /* free buffers, oldest freed first: the next user waits the least for its `freed` */
    struct ring {
        slot_t **s;
        size_t cap, head, n;
    } pfree, gfree;
    uint64_t b_params, b_grads, b_opt, b_bufs, b_pinned;
} zr_zdev;

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

static const zr_zero_ops dev_ops;
static void dev_free(zr_zero *zz);

/* The swap files of what lives on NVMe, and the staging of the partitions' gathers. */
static int open_swaps(zr_zdev *d, const zr_zero_opts *o)
{
    if (d->opt_at == ZR_OFFLOAD_NVME) {
        ZR_TRY(zr__zero_opt_region(&d->b));
        ZR_TRY(zr__zero_swap_open(&d->b.osw, o->swap_dir, "optimizer.swap", 2 * d->b.oreg,
                                  o->aio_depth, d->b.chunk));
    }
    if (d->par_at != ZR_OFFLOAD_NVME)
        return 0;
    uint64_t maxP = 0;
    for (size_t g = 0; g < d->b.ng; g++)
        maxP = d->b.G[g].P > maxP ? d->b.G[g].P : maxP;
    ZR_TRY(zr__zero_param_region(&d->b));
    ZR_TRY(zr__zero_swap_open(&d->b.psw, o->swap_dir, "params.swap", d->b.poff[d->b.ng],
                              o->aio_depth, d->b.chunk));
    ZR_TRY(host_alloc(d, &d->gstage, zr__zero_grain_up(maxP)));
    return d->ops->event_new(&d->e_g);
}

static int alloc_states(zr_zdev *d);

int zr__zero_dev_new(zr_zero **out, zr_comm *comm, const zck_layout *L, const zr_zero_opts *o,
                     const zr_device_ops *ops, zr_dev_comm *dc)
{
    *out = NULL;
    if (o->offload_params != ZR_OFFLOAD_NONE && o->stage != 3)
        return zr_err_set(ZR_EINVAL, "--offload-params needs --zero 3");
    if (o->offload_params != ZR_OFFLOAD_NONE && o->offload_optimizer == ZR_OFFLOAD_NONE)
        return zr_err_set(ZR_EINVAL, "--offload-params %s on the GPU needs --offload-optimizer "
                          "cpu or nvme (AdamW runs on the CPU, where the parameters live)",
                          o->offload_params == ZR_OFFLOAD_NVME ? "nvme" : "cpu");
    int nvme = o->offload_optimizer == ZR_OFFLOAD_NVME || o->offload_params == ZR_OFFLOAD_NVME;
    if (nvme)
        ZR_TRY(zr__zero_check_swap_opts(o));
    zr_zdev *d = calloc(1, sizeof *d);
    if (!d)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    d->ops = ops;
    d->b.comm = comm;
    d->dc = zr_comm_world(comm) > 1 ? dc : NULL;
    d->opt_at = o->offload_optimizer;
    d->par_at = o->offload_params;
    int rc = zr__zero_base_init(&d->b, &dev_ops, L, zr_comm_world(comm), zr_comm_rank(comm), o);
    d->b.chunk = nvme ? o->aio_block / sizeof(float) : CH_FLOATS;
    if (!rc && !(d->B = calloc(d->b.ng ? d->b.ng : 1, sizeof *d->B)))
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    if (!rc)
        rc = open_swaps(d, o);
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
    if (!rc)
        rc = alloc_states(d);
    if (rc) {
        dev_free(&d->b);
        return rc;
    }
    *out = &d->b;
    return 0;
}

/* The states where they live, the stage-2/3 buffers and the pinned staging. */
static int alloc_states(zr_zdev *d)
{
    int s = d->b.stage, rc = 0;
    rc = s < 3                          ? dev_alloc(d, &d->b.fullp, d->b.sum_full, &d->b_params)
         : d->par_at == ZR_OFFLOAD_CPU  ? host_alloc(d, &d->b.ownp, d->b.sum_P)
         : d->par_at == ZR_OFFLOAD_NVME ? 0
                                        : dev_alloc(d, &d->b.ownp, d->b.sum_P, &d->b_params);
    if (!rc)
        rc = s < 2 ? dev_alloc(d, &d->b.fullg, d->b.sum_full, &d->b_grads)
                   : dev_alloc(d, &d->b.owng, d->b.sum_P, &d->b_grads);
    uint64_t mv = s == 0 ? d->b.sum_full : d->b.sum_P;
    if (!rc && d->opt_at == ZR_OFFLOAD_CPU) {
        rc = host_alloc(d, &d->b.m, mv);
        if (!rc) /* counted as pinned host memory, not device memory */
            rc = host_alloc(d, &d->b.v, mv);
    } else if (!rc && d->opt_at == ZR_OFFLOAD_NONE) {
        rc = dev_alloc(d, &d->b.m, mv, &d->b_opt);
        if (!rc)
            rc = dev_alloc(d, &d->b.v, mv, &d->b_opt);
    }
    /* buffers: stage 2-3 gradient slots, stage 3 gather slots (prefetch + 2: the model holds
     * at most two groups) */
    if (!rc && s >= 2) {
        d->ngs = GRAD_SLOTS;
        d->nps = s == 3 ? d->b.prefetch + 2 : 0;
        d->gs = calloc(d->ngs, sizeof *d->gs);
        d->ps = calloc(d->nps ? d->nps : 1, sizeof *d->ps);
        d->gfree.cap = d->ngs;
        d->pfree.cap = d->nps;
        d->gfree.s = calloc(d->ngs, sizeof *d->gfree.s);
        d->pfree.s = calloc(d->nps ? d->nps : 1, sizeof *d->pfree.s);
        if (!d->gs || !d->ps || !d->gfree.s || !d->pfree.s)
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        for (size_t i = 0; i < d->ngs && !rc; i++)
            rc = slot_init(d, &d->gs[i], d->b.slot);
        for (size_t i = 0; i < d->nps && !rc; i++)
            rc = slot_init(d, &d->ps[i], d->b.slot);
        for (size_t g = 0; g < d->b.ng && !rc; g++) {
            if (!d->b.G[g].big)
                continue;
            rc = slot_init(d, &d->B[g].gb, d->b.G[g].full);
            if (!rc && s == 3)
                rc = slot_init(d, &d->B[g].pb, d->b.G[g].full);
        }
    }
    /* pinned staging: chunks for copies; whole groups for staged collectives */
    if (!rc)
        rc = host_alloc(d, &d->b.xbuf, 8 * d->b.chunk);
    if (!rc && !d->dc && d->b.W > 1) {
        for (size_t g = 0; g < d->b.ng; g++)
            if (d->b.G[g].full > d->hbuf_floats)
                d->hbuf_floats = d->b.G[g].full;
        if (d->hbuf_floats < CH_FLOATS && d->b.stage == 0)
            d->hbuf_floats = CH_FLOATS; /* the stage-0 all-reduce streams in chunks */
        rc = host_alloc(d, &d->hbuf, d->hbuf_floats);
    }
    return rc;
}

static void dev_free(zr_zero *zz)
{
    zr_zdev *d = (zr_zdev *)zz;
    const zr_device_ops *ops = d->ops;
    /* not ms: the model (freed first) drained and destroyed its stream */
    zck_swap_close(d->b.osw, 1); /* scratch, removed; their transfers may use the staging */
    zck_swap_close(d->b.psw, 1);
    d->b.osw = d->b.psw = NULL;
    if (d->e_g)
        ops->event_sync(d->e_g);
    if (d->cs)
        ops->stream_sync(d->cs);
    if (d->xs)
        ops->stream_sync(d->xs);
    ops->free(d->b.fullp);
    ops->free(d->b.fullg);
    if (d->par_at == ZR_OFFLOAD_CPU)
        ops->host_free(d->b.ownp);
    else
        ops->free(d->b.ownp);
    ops->host_free(d->gstage);
    if (d->e_g)
        ops->event_free(d->e_g);
    ops->free(d->b.owng);
    if (d->opt_at == ZR_OFFLOAD_CPU) {
        ops->host_free(d->b.m);
        ops->host_free(d->b.v);
    } else if (d->opt_at == ZR_OFFLOAD_NONE) {
        ops->free(d->b.m);
        ops->free(d->b.v);
    }
    for (size_t i = 0; d->gs && i < d->ngs; i++)
        slot_free(d, &d->gs[i]);
    for (size_t i = 0; d->ps && i < d->nps; i++)
        slot_free(d, &d->ps[i]);
    for (size_t g = 0; d->B && g < d->b.ng; g++) {
        slot_free(d, &d->B[g].gb);
        slot_free(d, &d->B[g].pb);
    }
    ops->host_free(d->b.xbuf);
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
    free(d->B);
    zr__zero_base_free(&d->b);
    free(d);
}

static void dev_mem(const zr_zero *zz, zr_zero_bytes *out)
{
    const zr_zdev *d = (const zr_zdev *)zz;
    memset(out, 0, sizeof *out);
    out->params = d->b_params;
    out->grads = d->b_grads;
    out->optimizer = d->b_opt;
    out->buffers = d->b_bufs;
    out->pinned = d->b_pinned;
    out->nvme = (d->b.osw ? zck_swap_size(d->b.osw) : 0) +
                (d->b.psw ? zck_swap_size(d->b.psw) : 0);
}

/* ---------------------------------------------------------------- where the states are */

/* Where state s (0 param, 1 exp_avg, 2 exp_avg_sq) lives: device memory (NONE), pinned host
 * memory (CPU) or a swap file (NVME); in a swap file, the float offset there of group g's opt
 * range. */
static int place(const zr_zdev *d, int s) { return s == 0 ? d->par_at : d->opt_at; }
static int on_host(const zr_zdev *d, int s) { return place(d, s) == ZR_OFFLOAD_CPU; }
static int on_nvme(const zr_zdev *d, int s) { return place(d, s) == ZR_OFFLOAD_NVME; }
static zck_swap *swap_of(const zr_zdev *d, int s) { return s == 0 ? d->b.psw : d->b.osw; }
static uint64_t swap_at(const zr_zdev *d, size_t g, int s)
{
    uint64_t off;
    zr__zero_swap_of(&d->b, g, s, &off);
    return off;
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
    if (d->b.W == 1 || !n)
        return 0;
    ZR_TRY(after_model(d));
    if (d->dc)
        return d->ops->all_reduce(d->dc, buf, buf, (size_t)n, ZR_DEV_F32);
    for (uint64_t at = 0; at < n; at += d->hbuf_floats) {
        uint64_t c = n - at < d->hbuf_floats ? n - at : d->hbuf_floats;
        ZR_TRY(d2h(d, d->hbuf, buf + at, c));
        ZR_TRY(zr_comm_all_reduce(d->b.comm, d->hbuf, d->hbuf, (size_t)c, ZR_COMM_F32));
        ZR_TRY(h2d(d, buf + at, d->hbuf, c));
    }
    return 0;
}

/* buf holds W P; this rank's sum lands at buf + rank P */
static int c_reduce_scatter(zr_zdev *d, float *buf, uint64_t P)
{
    if (d->b.W == 1)
        return 0;
    ZR_TRY(after_model(d));
    float *mine = buf + (size_t)d->b.rank * P;
    if (d->dc)
        return d->ops->reduce_scatter(d->dc, buf, mine, (size_t)P, ZR_DEV_F32);
    float *hm = d->hbuf + (size_t)d->b.rank * P;
    ZR_TRY(d2h(d, d->hbuf, buf, (uint64_t)d->b.W * P));
    ZR_TRY(zr_comm_reduce_scatter(d->b.comm, d->hbuf, hm, (size_t)P, ZR_COMM_F32));
    return h2d(d, mine, hm, P);
}

/* recv[W P] = every rank's send[P] (send == recv + rank P: in place). With host, send is
 * pinned host memory (an offloaded partition): uploaded into its place of recv (on the comm
 * stream with NCCL), then gathered in place. */
static int c_all_gather(zr_zdev *d, const float *send, int host, float *recv, uint64_t P)
{
    float *mine = recv + (size_t)d->b.rank * P;
    size_t bytes = (size_t)P * sizeof(float);
    int kind = host ? ZR_DEV_H2D : ZR_DEV_D2D;
    if (d->b.W == 1) /* a copy, ordered on the model's stream */
        return send == mine ? 0 : d->ops->memcpy(mine, send, bytes, kind, d->ms);
    ZR_TRY(after_model(d));
    if (d->dc) {
        if (host)
            ZR_TRY(d->ops->memcpy(mine, send, bytes, ZR_DEV_H2D, d->cs));
        return d->ops->all_gather(d->dc, host ? mine : send, recv, (size_t)P, sizeof(float));
    }
    float *hm = d->hbuf + (size_t)d->b.rank * P;
    if (host)
        memcpy(hm, send, bytes);
    else
        ZR_TRY(d2h(d, hm, send, P));
    ZR_TRY(zr_comm_all_gather(d->b.comm, hm, d->hbuf, (size_t)P, sizeof(float)));
    return h2d(d, recv, d->hbuf, (uint64_t)d->b.W * P);
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
    for (size_t g = 0; g < d->b.ng; g++) {
        d->B[g].pb.busy = d->B[g].gb.busy = 0;
        d->B[g].plent = d->B[g].glent = NULL;
    }
}

/* Gather group g's parameters into s: after the buffer's last readers (freed), marked ready. */
static int gather_into(zr_zdev *d, size_t g, slot_t *s)
{
    const zr_zpart *p = &d->b.G[g];
    if (d->dc)
        ZR_TRY(d->ops->stream_wait(d->cs, s->freed));
    if (d->par_at == ZR_OFFLOAD_NVME) { /* read the partition, upload it, gather */
        uint64_t t;
        ZR_TRY(d->ops->event_sync(d->e_g)); /* the last upload from the staging is done */
        ZR_TRY(zck_swap_read(d->b.psw, d->gstage, zr__zero_grain_up(p->P) * sizeof(float),
                             d->b.poff[g] * sizeof(float), &t));
        ZR_TRY(zck_swap_wait(d->b.psw, t));
        ZR_TRY(c_all_gather(d, d->gstage, 1, s->buf, p->P));
        ZR_TRY(d->ops->event_record(d->e_g, d->b.W > 1 && d->dc ? d->cs : d->ms));
    } else
        ZR_TRY(c_all_gather(d, d->b.ownp + p->ooff, d->par_at == ZR_OFFLOAD_CPU, s->buf, p->P));
    return d->ops->event_record(s->ready, d->dc ? d->cs : d->ms);
}

/* Stage 3's gather buffers for the schedule (zr__zero_issue_more): a free one for group g,
 * and its gather issued. */
static void *dev_gather_buf(zr_zero *zz, size_t g)
{
    zr_zdev *d = (zr_zdev *)zz;
    if (!d->b.G[g].big)
        return ring_take(&d->pfree);
    if (d->B[g].pb.busy)
        return NULL;
    d->B[g].pb.busy = 1;
    return &d->B[g].pb;
}

static int dev_gather(zr_zero *zz, zr_zentry *e)
{
    return gather_into((zr_zdev *)zz, e->g, e->buf);
}

static int hook_params(void *ctx, size_t g, const float **out)
{
    zr_zdev *d = ctx;
    if (d->b.stage < 3) {
        *out = d->b.fullp + d->b.G[g].foff;
        return 0;
    }
    zr_zentry *e;
    ZR_TRY(zr__zero_fetch(&d->b, g, &e));
    slot_t *s = e->buf;
    if (d->dc)
        ZR_TRY(d->ops->stream_wait(d->ms, s->ready));
    d->B[g].plent = s;
    d->b.cursor++;
    *out = s->buf;
    return 0;
}

static int hook_params_done(void *ctx, size_t g)
{
    zr_zdev *d = ctx;
    dbuf *b = &d->B[g];
    if (d->b.stage < 3 || !b->plent)
        return 0;
    slot_t *s = b->plent;
    b->plent = NULL;
    ZR_TRY(d->ops->event_record(s->freed, d->ms));
    if (d->b.G[g].big)
        s->busy = 0;
    else
        ring_put(&d->pfree, s);
    return zr__zero_issue_more(&d->b, d->b.cursor + d->b.prefetch);
}

static int hook_grads(void *ctx, size_t g, float **out)
{
    zr_zdev *d = ctx;
    const zr_zpart *p = &d->b.G[g];
    dbuf *b = &d->B[g];
    if (d->b.stage < 2) {
        *out = d->b.fullg + p->foff;
        return 0;
    }
    slot_t *s;
    if (p->big) {
        if (b->gb.busy)
            return zr_err_set(ZR_ERROR, "ZeRO-%d: group %zu's gradient buffer is still lent",
                              d->b.stage, g);
        s = &b->gb;
        s->busy = 1;
    } else {
        if (!(s = ring_take(&d->gfree)))
            return zr_err_set(ZR_ERROR, "ZeRO-%d: no gradient buffer free for group %zu",
                              d->b.stage, g);
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
    const zr_zpart *p = &d->b.G[g];
    dbuf *b = &d->B[g];
    if (d->b.stage < 2)
        return 0;
    slot_t *s = b->glent;
    b->glent = NULL;
    if (!s)
        return zr_err_set(ZR_ERROR, "ZeRO-%d: group %zu's gradient was not lent", d->b.stage, g);
    /* reduce-scatter in place, then this rank's part added into its gradient partition (the
     * micro-batches accumulate there), on the comm stream with NCCL */
    ZR_TRY(c_reduce_scatter(d, s->buf, p->P));
    zr_dev_stream *st = d->dc ? d->cs : d->ms;
    ZR_TRY(d->ops->add(d->b.owng + p->ooff, s->buf + (size_t)d->b.rank * p->P, (size_t)p->P, st));
    ZR_TRY(d->ops->event_record(s->freed, st));
    if (p->big)
        s->busy = 0;
    else
        ring_put(&d->gfree, s);
    return 0;
}

static void dev_hooks(zr_zero *zz, zr_model_hooks *h)
{
    *h = (zr_model_hooks){
        .ctx = zz,
        .params = hook_params,
        .params_done = hook_params_done,
        .grads = hook_grads,
        .grads_done = hook_grads_done,
    };
}

static int dev_attach(zr_zero *zz, const zr_model *m, zr_dev_model *dm, size_t *fwd, size_t *nf,
                      size_t *bwd, size_t *nb)
{
    zr_zdev *d = (zr_zdev *)zz;
    (void)m;
    d->ms = d->ops->model_stream(dm);
    *nf = d->ops->model_fetch_order(dm, 0, fwd);
    *nb = d->ops->model_fetch_order(dm, 1, bwd);
    return 0;
}

/* ---------------------------------------------------------------- the step */

static int dev_begin_step(zr_zero *zz)
{
    zr_zdev *d = (zr_zdev *)zz;
    ZR_TRY(model_after_comm(d)); /* the last step's gathers (publish) before the forward */
    if (d->b.stage >= 2)
        reset_buffers(d);
    if (d->b.stage < 2)
        ZR_TRY(d->ops->memset(d->b.fullg, 0, (size_t)d->b.sum_full * sizeof(float), d->ms));
    else
        ZR_TRY(d->ops->memset(d->b.owng, 0, (size_t)d->b.sum_P * sizeof(float), d->ms));
    return d->b.stage == 3 ? zr__zero_sched_start(&d->b) : 0;
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

static int dev_reduce(zr_zero *zz)
{
    zr_zdev *d = (zr_zdev *)zz;
    if (d->b.stage == 0)
        ZR_TRY(c_all_reduce(d, d->b.fullg, d->b.sum_full));
    else if (d->b.stage == 1)
        for (size_t g = 0; g < d->b.ng; g++)
            ZR_TRY(c_reduce_scatter(d, d->b.fullg + d->b.G[g].foff, d->b.G[g].P));
    if (d->dc) { /* every reduction done (a failed or aborted NCCL call surfaces here) */
        peer_check k = {d->b.comm, 0};
        ZR_TRY(d->ops->comm_wait(d->dc, check_peers, &k));
    }
    return model_after_comm(d);
}

static int dev_sumsq_range(zr_zero *zz, const float *x, size_t n, double *out)
{
    zr_zdev *d = (zr_zdev *)zz;
    return d->ops->sumsq(x, n, out, d->ms);
}

/* The host's small collectives, on the calling thread. */
static int dev_gather_f64(zr_zero *zz, const double *mine, size_t n, double *all)
{
    return zr_comm_all_gather(zz->comm, mine, all, n, sizeof(double));
}

static int dev_broadcast(zr_zero *zz, void *buf, size_t bytes, int root)
{
    return zr_comm_broadcast(zz->comm, buf, bytes, root);
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
    size_t nc = 0, ch = d->b.chunk;
    zr_zchunk *c = NULL;
    ZR_TRY(zr__zero_chunks(&d->b, ch, &c, &nc));
    int rc = 0;
    if (d->ms) { /* the gradients are complete on ms */
        rc = ops->event_record(d->e_m, d->ms);
        if (!rc)
            rc = ops->stream_wait(d->xs, d->e_m);
    }
    /* swap tickets of each set and file (0 params, 1 moments): reads, write-backs */
    uint64_t rt[2][2] = {{0, 0}, {0, 0}}, wt[2][2] = {{0, 0}, {0, 0}};
    const int dev_par = !on_host(d, 0) && !on_nvme(d, 0); /* params on the device */
#define BUF(k, i) (d->b.xbuf + ((size_t)((k) % 2) * 4 + (i)) * ch) /* i: 0 p, 1 g, 2 m, 3 v */
#define STAGED(k, s) BUF(k, (s) == 0 ? 0 : (s) + 1)
    for (size_t k = 0; k <= nc && !rc; k++) {
        if (k < nc) { /* set k%2 was last used by chunk k-2, whose upload xs ordered before */
            const zr_zchunk *e = &c[k];
            if (dev_par)
                rc = ops->memcpy(BUF(k, 0), zr__zero_state(&d->b, e->g, 0) + e->off,
                                 e->cnt * sizeof(float), ZR_DEV_D2H, d->xs);
            if (!rc)
                rc = ops->memcpy(BUF(k, 1), zr__zero_state(&d->b, e->g, 3) + e->off,
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
                                       zr__zero_grain_up(e->cnt) * sizeof(float),
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
                ptr[s] = s == 0 && dev_par ? BUF(j, 0) : zr__zero_state(&d->b, e->g, s) + e->off;
        }
        if (rc)
            break;
        uint64_t lo, n;
        zr_zero_opt_range(&d->b, e->g, &lo, &n);
        adam_ctx a = {d, ptr[0], BUF(j, 1), ptr[1], ptr[2], t, lr, clip, hp};
        rc = zr__zero_tensors(d->b.L, e->g, lo + e->off, e->cnt, adam_host, &a);
        if (!rc && dev_par)
            rc = ops->memcpy(zr__zero_state(&d->b, e->g, 0) + e->off, BUF(j, 0),
                             e->cnt * sizeof(float), ZR_DEV_H2D, d->xs);
        for (int s = 0; s <= 2 && !rc; s++)
            if (on_nvme(d, s))
                rc = zck_swap_write(swap_of(d, s), STAGED(j, s),
                                    zr__zero_grain_up(e->cnt) * sizeof(float),
                                    (swap_at(d, e->g, s) + e->off) * sizeof(float),
                                    &wt[j % 2][s > 0]);
        /* the set is next written by chunk j+2's download, enqueued after this upload on
         * xs; the host touches it again only once that download is done */
    }
#undef STAGED
#undef BUF
    if (!rc)
        rc = ops->stream_sync(d->xs);
    if (!rc && d->b.osw)
        rc = zck_swap_wait(d->b.osw, UINT64_MAX);
    if (!rc && d->b.psw)
        rc = zck_swap_wait(d->b.psw, UINT64_MAX);
    free(c);
    return rc;
}

static int dev_adamw(zr_zero *zz, uint64_t t, float lr, float clip, const zr_adamw_hp *hp)
{
    zr_zdev *d = (zr_zdev *)zz;
    if (d->opt_at != ZR_OFFLOAD_NONE)
        return adamw_offloaded(d, t, lr, clip, hp);
    for (size_t g = 0; g < d->b.ng; g++) {
        uint64_t lo, n;
        zr_zero_opt_range(&d->b, g, &lo, &n);
        if (!n)
            continue;
        adam_ctx a = {d,  zr__zero_state(zz, g, 0), zr__zero_state(zz, g, 3),
                      zr__zero_state(zz, g, 1), zr__zero_state(zz, g, 2), t, lr, clip, hp};
        ZR_TRY(zr__zero_tensors(d->b.L, g, lo, n, adam_dev, &a));
    }
    return 0;
}

static int dev_publish(zr_zero *zz)
{
    zr_zdev *d = (zr_zdev *)zz;
    if (d->b.stage != 1 && d->b.stage != 2)
        return 0;
    for (size_t g = 0; g < d->b.ng; g++) {
        float *full = d->b.fullp + d->b.G[g].foff;
        ZR_TRY(c_all_gather(d, full + (size_t)d->b.rank * d->b.G[g].P, 0, full, d->b.G[g].P));
    }
    return 0; /* the next step's begin orders ms after these */
}

/* ---------------------------------------------------------------- states in and out */

/* Host data into device memory dst[0, n), chunk by chunk: produce(ctx, off, cnt, buf) fills
 * a staging chunk; the upload of one chunk overlaps the production of the next. */
static int upload(zr_zdev *d, float *dst, uint64_t n, zr_zproduce_fn f, void *ctx)
{
    const zr_device_ops *ops = d->ops;
    for (uint64_t off = 0, k = 0; off < n; off += d->b.chunk, k++) {
        uint64_t cnt = n - off < d->b.chunk ? n - off : d->b.chunk;
        float *b = d->b.xbuf + (k % 2) * d->b.chunk;
        if (k >= 2) /* this set's previous upload has been read */
            ZR_TRY(ops->event_sync(d->e_x[k % 2]));
        ZR_TRY(f(ctx, off, cnt, b));
        ZR_TRY(ops->memcpy(dst + off, b, (size_t)cnt * sizeof(float), ZR_DEV_H2D, d->xs));
        ZR_TRY(ops->event_record(d->e_x[k % 2], d->xs));
    }
    return ops->stream_sync(d->xs);
}

static int dev_init_params(zr_zero *zz, zr_zero_fill_fn fill, void *ctx)
{
    zr_zdev *d = (zr_zdev *)zz;
    for (size_t g = 0; g < d->b.ng; g++) {
        uint64_t lo = 0, n = d->b.G[g].numel;
        if (d->b.stage == 3)
            zr_zero_opt_range(&d->b, g, &lo, &n);
        zr_zfill f = {fill, ctx, g, lo};
        if (on_nvme(d, 0)) {
            ZR_TRY(zr__zero_swap_fill(d->b.psw, d->b.xbuf, d->b.chunk, swap_at(d, g, 0), n,
                                      zr__zero_produce_fill, &f));
            continue;
        }
        float *dst = d->b.stage < 3 ? d->b.fullp + d->b.G[g].foff : d->b.ownp + d->b.G[g].ooff;
        if (on_host(d, 0)) {
            if (n)
                fill(ctx, g, lo, n, dst);
            continue;
        }
        ZR_TRY(upload(d, dst, n, zr__zero_produce_fill, &f));
    }
    return 0; /* the moments: zero on the device (dev_alloc) and in a fresh swap file */
}

static int dev_load(zr_zero *zz, zck_reader *rd, int verify, unsigned jobs)
{
    zr_zdev *d = (zr_zdev *)zz;
    (void)jobs;
    if (verify)
        return zr_err_set(ZR_EINVAL, "ZeRO on a device: verify the checkpoint before loading "
                          "it (the device load does not hash)");
    size_t st[3];
    ZR_TRY(zr__zero_find_states(rd, st));
    for (size_t g = 0; g < d->b.ng; g++) {
        uint64_t lo, n;
        zr_zero_opt_range(&d->b, g, &lo, &n);
        for (int s = 0; s < 3; s++) {
            uint64_t a = lo, cnt = n;
            float *dst = zr__zero_state(&d->b, g, s);
            if (s == 0 && d->b.stage < 3) { /* stages 0-2 hold every parameter */
                a = 0;
                cnt = d->b.G[g].numel;
                dst = d->b.fullp + d->b.G[g].foff;
            }
            if (!cnt)
                continue;
            zr_zread r = {rd, g, st[s], a};
            if (on_host(d, s))
                ZR_TRY(zck_reader_read_range(rd, g, st[s], a, cnt, dst));
            else if (!on_nvme(d, s)) /* those below */
                ZR_TRY(upload(d, dst, cnt, zr__zero_produce_read, &r));
        }
    }
    return zr__zero_load_swaps(&d->b, rd, st);
}

/* A save's reads after the states as the last enqueued step left them. */
static int dev_save_begin(zr_zero *zz)
{
    zr_zdev *d = (zr_zdev *)zz;
    if (!d->ms)
        return 0;
    ZR_TRY(d->ops->event_record(d->e_m, d->ms));
    return d->ops->stream_wait(d->xs, d->e_m);
}

static int dev_sink_state(zr_zero *zz, int s, const float *src, uint64_t n,
                          const zr_zero_sink *w)
{
    zr_zdev *d = (zr_zdev *)zz;
    const zr_device_ops *ops = d->ops;
    const uint64_t ch = d->b.chunk;
    if (on_host(d, s))
        return w->write(w->ctx, src, (size_t)n * sizeof(float));
    /* the download of chunk k+1 overlaps the sink's write of chunk k */
    uint64_t nck = (n + ch - 1) / ch;
    for (uint64_t k = 0; k <= nck; k++) {
        if (k < nck) {
            uint64_t off = k * ch, cnt = n - off < ch ? n - off : ch;
            ZR_TRY(ops->memcpy(d->b.xbuf + (k % 2) * ch, src + off, (size_t)cnt * sizeof(float),
                               ZR_DEV_D2H, d->xs));
            ZR_TRY(ops->event_record(d->e_x[k % 2], d->xs));
        }
        if (k == 0)
            continue;
        uint64_t j = k - 1, off = j * ch;
        uint64_t cnt = n - off < ch ? n - off : ch;
        ZR_TRY(ops->event_sync(d->e_x[j % 2]));
        ZR_TRY(w->write(w->ctx, d->b.xbuf + (j % 2) * ch, (size_t)cnt * sizeof(float)));
    }
    return 0;
}

static const zr_zero_ops dev_ops = {
    .free = dev_free,
    .hooks = dev_hooks,
    .attach = dev_attach,
    .init_params = dev_init_params,
    .load = dev_load,
    .save_begin = dev_save_begin,
    .sink_state = dev_sink_state,
    .adamw = dev_adamw,
    .begin_step = dev_begin_step,
    .reduce = dev_reduce,
    .publish = dev_publish,
    .gather_f64 = dev_gather_f64,
    .broadcast = dev_broadcast,
    .mem = dev_mem,
    .sumsq_range = dev_sumsq_range,
    .gather_buf = dev_gather_buf,
    .gather = dev_gather,
};
