/*
 * zero_common.c: zero.h's functions over both engines (zero_int.h). Each call goes through the
 * operations table zr_zero_new chose (the host engine, zero.c; the device engine, zero_dev.c),
 * or is answered here from what the engines share: the partitions and ranges, the stage-3
 * gather schedule and its issue order, the global sum of squares, the swap files' regions
 * and windows, the optimizer's chunk list, the checkpoint producers.
 */
#include "zero_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- creation */

void zr_zero_free(zr_zero *z)
{
    if (z)
        z->ops->free(z);
}

int zr__zero_base_init(zr_zero *z, const zr_zero_ops *ops, const zck_layout *L, int W,
                       int rank, const zr_zero_opts *o)
{
    z->ops = ops;
    z->L = L;
    z->W = W;
    z->rank = rank;
    z->stage = o->stage;
    z->prefetch = o->stage == 3 ? o->prefetch : 0;
    z->ng = zck_layout_n_groups(L);
    return zr__zero_parts(L, W, rank, &z->G, &z->sum_full, &z->sum_P, &z->slot);
}

void zr__zero_base_free(zr_zero *z)
{
    free(z->G);
    free(z->soff);
    free(z->poff);
    free(z->sched);
    free(z->order);
    z->G = NULL;
    z->soff = z->poff = NULL;
    z->sched = NULL;
    z->order = NULL;
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
    /* ordinary buffers hold the largest group but the embeddings (GPT-2's wte and wpe, Llama's
     * embed_tokens and lm_head); bigger groups (the token embedding, an untied head) get a
     * gather buffer of their own and their gradient in pieces (zero.c) */
    static const char *const emb[] = {"wte", "wpe", "embed_tokens", "lm_head"};
    for (size_t g = 0; g < ng; g++) {
        const char *name = zck_layout_group_name(L, g);
        int skip = 0;
        for (size_t k = 0; k < sizeof emb / sizeof *emb && name; k++)
            skip |= !strcmp(name, emb[k]);
        if (!skip && G[g].full > *slot)
            *slot = G[g].full;
    }
    for (size_t g = 0; g < ng; g++)
        G[g].big = G[g].full > *slot;
    *out = G;
    return 0;
}

/* ---------------------------------------------------------------- ranges */

void zr_zero_part_range(const zr_zero *z, size_t g, uint64_t *lo, uint64_t *n)
{
    *lo = z->G[g].lo;
    *n = z->G[g].n;
}

void zr_zero_opt_range(const zr_zero *z, size_t g, uint64_t *lo, uint64_t *n)
{
    if (z->stage == 0) {
        *lo = 0;
        *n = z->G[g].numel;
    } else
        zr_zero_part_range(z, g, lo, n);
}

uint64_t zr_zero_part_floats(const zr_zero *z)
{
    uint64_t n = 0;
    for (size_t g = 0; g < z->ng; g++)
        n += 3 * z->G[g].n;
    return n;
}

/* ---------------------------------------------------------------- the model and the schedule */

void zr_zero_hooks(zr_zero *z, zr_model_hooks *h)
{
    z->ops->hooks(z, h);
}

/* The stage-3 schedule: n passes of the forward fetch order, each followed by the backward's
 * unless forward_only. */
static int build_sched(zr_zero *z, size_t n, int forward_only)
{
    size_t per = z->nf + (forward_only ? 0 : z->nb), total = n * per;
    free(z->sched);
    z->n_sched = 0;
    if (!(z->sched = calloc(total ? total : 1, sizeof *z->sched)))
        return zr_err_set(ZR_ENOMEM, "out of memory for the ZeRO-3 schedule");
    for (size_t k = 0; k < total; k++) {
        z->sched[k].g = z->order[k % per]; /* order: the forward's, then the backward's */
    }
    z->n_sched = total;
    return 0;
}

int zr_zero_attach(zr_zero *z, const zr_model *m, zr_dev_model *dm, unsigned n_micro)
{
    size_t cap = z->ng + 4, nf = 0, nb = 0;
    size_t *fwd = calloc(2 * cap, sizeof *fwd);
    if (!fwd)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t *bwd = fwd + cap;
    int rc = z->ops->attach(z, m, dm, fwd, &nf, bwd, &nb);
    free(z->sched);
    free(z->order);
    z->sched = NULL;
    z->order = NULL;
    z->n_sched = 0;
    if (rc) {
        free(fwd);
        return rc;
    }
    memmove(fwd + nf, bwd, nb * sizeof *fwd); /* forward order, then backward order */
    z->order = fwd;
    z->nf = nf;
    z->nb = nb;
    z->n_micro = n_micro;
    z->eval = 0;
    /* n_micro times the forward then the backward fetch order */
    return z->stage == 3 ? build_sched(z, n_micro, 0) : 0;
}

int zr_zero_begin_eval(zr_zero *z, unsigned n_forwards)
{
    if (z->stage == 3) {
        ZR_TRY(build_sched(z, n_forwards, 1));
        z->eval = 1;
    }
    return z->ops->begin_step(z);
}

int zr__zero_issue_more(zr_zero *z, size_t upto)
{
    while (z->issued < z->n_sched && z->issued <= upto) {
        zr_zentry *e = &z->sched[z->issued];
        if (!(e->buf = z->ops->gather_buf(z, e->g)))
            break;
        ZR_TRY(z->ops->gather(z, e));
        z->issued++;
    }
    return 0;
}

int zr__zero_fetch(zr_zero *z, size_t g, zr_zentry **out)
{
    size_t c = z->cursor;
    if (c >= z->n_sched || z->sched[c].g != g)
        return zr_err_set(ZR_ERROR, "ZeRO-3: the model asked for group %zu out of the gather "
                          "schedule (position %zu of %zu)", g, c, z->n_sched);
    ZR_TRY(zr__zero_issue_more(z, c + z->prefetch));
    if (z->issued <= c)
        return zr_err_set(ZR_ERROR, "ZeRO-3: no gather buffer free for group %zu", g);
    *out = &z->sched[c];
    return 0;
}

int zr__zero_sched_start(zr_zero *z)
{
    if (!z->sched)
        return zr_err_set(ZR_ENOMEM, "out of memory for the ZeRO-3 schedule");
    z->cursor = z->issued = 0;
    for (size_t k = 0; k < z->n_sched; k++) {
        z->sched[k].buf = NULL;
        z->sched[k].seq = 0;
    }
    /* the first gathers start now, overlapping the batch's sampling */
    return z->prefetch ? zr__zero_issue_more(z, z->prefetch - 1) : 0;
}

/* ---------------------------------------------------------------- the step */

int zr_zero_begin_step(zr_zero *z)
{
    if (z->eval) { /* after an evaluation: the step's schedule again */
        ZR_TRY(build_sched(z, z->n_micro, 0));
        z->eval = 0;
    }
    return z->ops->begin_step(z);
}
int zr_zero_reduce(zr_zero *z) { return z->ops->reduce(z); }
int zr_zero_publish(zr_zero *z) { return z->ops->publish(z); }

int zr_zero_adamw(zr_zero *z, uint64_t t, float lr, float clip, const zr_adamw_hp *hp)
{
    return z->ops->adamw(z, t, lr, clip, hp);
}

int zr_zero_gather_f64(zr_zero *z, const double *mine, size_t n, double *all)
{
    return z->ops->gather_f64(z, mine, n, all);
}

int zr_zero_broadcast(zr_zero *z, void *buf, size_t bytes, int root)
{
    return z->ops->broadcast(z, buf, bytes, root);
}

/* The sum of squares of rank q's partition of every group, in group order; base[g][i] is
 * element i of group g's gradient. */
static int part_sumsq(zr_zero *z, int q, float *const *base, double *out)
{
    double s = 0;
    for (size_t g = 0; g < z->ng; g++) {
        uint64_t lo, n;
        zck_partition(z->G[g].numel, (uint32_t)z->W, (uint32_t)q, ZR_ZERO_ALIGN, &lo, &n);
        double x = 0;
        if (n)
            ZR_TRY(z->ops->sumsq_range(z, base[g] + lo, (size_t)n, &x));
        s += x;
    }
    *out = s;
    return 0;
}

int zr_zero_sumsq(zr_zero *z, double *out)
{
    float **base = calloc(z->ng ? z->ng : 1, sizeof *base);
    double *all = calloc((size_t)z->W, sizeof *all);
    int rc = 0;
    if (!base || !all) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t g = 0; g < z->ng; g++) { /* element i of group g at base[g][i] */
        uint64_t lo, n;
        zr_zero_opt_range(z, g, &lo, &n);
        base[g] = zr__zero_state(z, g, 3) - lo;
    }
    double total = 0, x;
    if (z->stage == 0) { /* every partition is here: the same sums as the ranks of stage 1+ */
        for (int q = 0; q < z->W && !rc; q++)
            if (!(rc = part_sumsq(z, q, base, &x)))
                total += x;
    } else {
        double mine = 0;
        if (!(rc = part_sumsq(z, z->rank, base, &mine)))
            rc = zr_zero_gather_f64(z, &mine, 1, all);
        for (int q = 0; q < z->W && !rc; q++)
            total += all[q];
    }
    *out = total;
out:
    free(base);
    free(all);
    return rc;
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

int zr__zero_chunks(const zr_zero *z, uint64_t chunk, zr_zchunk **out, size_t *n)
{
    size_t cnt = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        cnt = 0;
        for (size_t g = 0; g < z->ng; g++) {
            uint64_t lo, m;
            zr_zero_opt_range(z, g, &lo, &m);
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

/* ---------------------------------------------------------------- states */

int zr_zero_init_params(zr_zero *z, zr_zero_fill_fn fill, void *ctx)
{
    return z->ops->init_params(z, fill, ctx);
}

int zr_zero_load(zr_zero *z, zck_reader *rd, int verify, unsigned jobs)
{
    return z->ops->load(z, rd, verify, jobs);
}

int zr__zero_find_states(zck_reader *rd, size_t st[3])
{
    static const char *names[3] = {"param", "exp_avg", "exp_avg_sq"};
    const zck_layout *L = zck_reader_layout(rd);
    for (int s = 0; s < 3; s++)
        if (zck_layout_find_state(L, &st[s], names[s]) < 0)
            return zr_err_set(ZR_EINVAL, "%s: no state '%s'", zck_reader_path(rd), names[s]);
    return 0;
}

int zr__zero_load_swaps(zr_zero *z, zck_reader *rd, const size_t st[3])
{
    for (size_t g = 0; g < z->ng; g++) {
        uint64_t lo, n, base;
        zr_zero_opt_range(z, g, &lo, &n);
        for (int s = 0; s < 3 && n; s++) {
            zck_swap *sw = zr__zero_swap_of(z, g, s, &base);
            zr_zread r = {rd, g, st[s], lo};
            if (sw)
                ZR_TRY(zr__zero_swap_fill(sw, z->xbuf, z->chunk, base, n, zr__zero_produce_read,
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

int zr_zero_save_to(zr_zero *z, const zr_zero_sink *w)
{
    if (z->ops->save_begin)
        ZR_TRY(z->ops->save_begin(z));
    for (size_t g = 0; g < z->ng; g++) {
        uint64_t plo, pn, olo, on, base;
        zr_zero_part_range(z, g, &plo, &pn);
        zr_zero_opt_range(z, g, &olo, &on);
        if (!pn)
            continue;
        for (int s = 0; s < 3; s++) {
            ZR_TRY(w->begin(w->ctx, g, (size_t)s, plo, pn));
            zck_swap *sw = zr__zero_swap_of(z, g, s, &base);
            if (sw) /* straight from the swap file */
                ZR_TRY(zr__zero_swap_to_sink(sw, z->xbuf, z->chunk, base + (plo - olo), pn, w));
            else
                ZR_TRY(z->ops->sink_state(z, s, zr__zero_state(z, g, s) + (plo - olo), pn, w));
        }
    }
    return 0;
}

void zr_zero_mem(const zr_zero *z, zr_zero_bytes *out)
{
    z->ops->mem(z, out);
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

/* ---------------------------------------------------------------- swap files */

int zr_zero_live_saves(const zr_zero *z)
{
    return z->ops->live_states && !zr_zero_offloaded(z);
}

int zr_zero_offloaded(const zr_zero *z)
{
    return z->osw || z->psw;
}

int zr_zero_check_swap(zr_zero *z)
{
    if (z->osw)
        ZR_TRY(zck_swap_check(z->osw));
    return z->psw ? zck_swap_check(z->psw) : 0;
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

/* Group g's range in a region: its opt range (params 0) or its partition (params 1). */
static int region(zr_zero *z, int params, uint64_t **out)
{
    uint64_t *off = calloc(z->ng + 1, sizeof *off);
    if (!(*out = off))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t g = 0; g < z->ng; g++) {
        const zr_zpart *p = &z->G[g];
        off[g + 1] = off[g] + zr__zero_grain_up(!params && z->stage == 0 ? p->numel : p->P);
    }
    return 0;
}

int zr__zero_opt_region(zr_zero *z)
{
    ZR_TRY(region(z, 0, &z->soff));
    z->oreg = z->soff[z->ng];
    return 0;
}

int zr__zero_param_region(zr_zero *z)
{
    return region(z, 1, &z->poff);
}

int zr__zero_swap_open(zck_swap **out, const char *swap_dir, const char *name, uint64_t floats,
                       unsigned depth, size_t chunk_floats)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", swap_dir, name);
    return zck_swap_open(out, path, floats * sizeof(float), depth, chunk_floats * sizeof(float));
}

float *zr__zero_state(const zr_zero *z, size_t g, int s)
{
    const zr_zpart *p = &z->G[g];
    int st = z->stage;
    switch (s) {
    case 0:
        if (st < 3)
            return z->fullp + p->foff + (st == 0 ? 0 : p->lo);
        return z->ownp ? z->ownp + p->ooff : NULL;
    case 3:
        if (st < 2)
            return z->fullg + p->foff + (st == 0 ? 0 : p->lo);
        return z->owng + p->ooff;
    default:
        if (!z->m)
            return NULL;
        return (s == 1 ? z->m : z->v) + (st == 0 ? p->foff : p->ooff);
    }
}

zck_swap *zr__zero_swap_of(const zr_zero *z, size_t g, int s, uint64_t *off)
{
    *off = 0;
    if (s == 0 && z->psw) {
        *off = z->poff[g];
        return z->psw;
    }
    if (s > 0 && z->osw) {
        *off = (s == 2 ? z->oreg : 0) + z->soff[g];
        return z->osw;
    }
    return NULL;
}

int zr__zero_swap_fill(zck_swap *sw, float *stage, uint64_t win, uint64_t at, uint64_t n,
                       zr_zproduce_fn produce, void *ctx)
{
    uint64_t t[2] = {0, 0};
    for (uint64_t off = 0, k = 0; off < n; off += win, k++) {
        uint64_t cnt = n - off < win ? n - off : win, up = zr__zero_grain_up(cnt);
        float *b = stage + (k % 2) * win;
        ZR_TRY(zck_swap_wait(sw, t[k % 2])); /* this window's last write is done */
        memset(b + cnt, 0, (up - cnt) * sizeof(float));
        ZR_TRY(produce(ctx, off, cnt, b));
        ZR_TRY(zck_swap_write(sw, b, up * sizeof(float), (at + off) * sizeof(float),
                              &t[k % 2]));
    }
    return zck_swap_wait(sw, UINT64_MAX);
}

int zr__zero_swap_to_sink(zck_swap *sw, float *stage, uint64_t win, uint64_t first, uint64_t n,
                          const zr_zero_sink *w)
{
    uint64_t end = first + n, t[2] = {0, 0}, a = first / ZR_ZERO_GRAIN * ZR_ZERO_GRAIN;
    ZR_TRY(zck_swap_read(sw, stage, zr__zero_grain_up(end - a < win ? end - a : win) *
                         sizeof(float), a * sizeof(float), &t[0]));
    for (uint64_t at = a, k = 0; at < end; at += win, k++) {
        uint64_t next = at + win;
        if (next < end)
            ZR_TRY(zck_swap_read(sw, stage + ((k + 1) % 2) * win,
                                 zr__zero_grain_up(end - next < win ? end - next : win) *
                                 sizeof(float), next * sizeof(float), &t[(k + 1) % 2]));
        ZR_TRY(zck_swap_wait(sw, t[k % 2]));
        const float *b = stage + (k % 2) * win;
        uint64_t from = at < first ? first : at, to = next < end ? next : end;
        ZR_TRY(w->write(w->ctx, b + (from - at), (size_t)(to - from) * sizeof(float)));
    }
    return 0;
}
