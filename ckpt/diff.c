/*
 * diff.c: compare two checkpoints tensor by tensor and state by state through their logical
 * layouts, so that checkpoints of different world sizes (or shard layouts, or storage dtypes)
 * compare equal when they hold the same values. Reads in bounded chunks.
 */
#include "zck_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double half_to_f64(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

double zck_dtype_get_f64(zck_dtype t, const void *base, size_t i)
{
    const unsigned char *p = (const unsigned char *)base + i * zck_dtype_size(t);
    switch (t) {
    case ZCK_F32: { float f; memcpy(&f, p, 4); return f; }
    case ZCK_F64: { double d; memcpy(&d, p, 8); return d; }
    case ZCK_BF16: {
        uint16_t b;
        memcpy(&b, p, 2);
        uint32_t u = (uint32_t)b << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case ZCK_F16: { uint16_t h; memcpy(&h, p, 2); return half_to_f64(h); }
    case ZCK_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case ZCK_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case ZCK_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case ZCK_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case ZCK_I8: return (int8_t)p[0];
    case ZCK_U8: return p[0];
    default: return NAN;
    }
}

void zck_diff_free(zck_diff *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++) {
        free(d->e[i].tensor);
        free(d->e[i].state);
        free(d->e[i].note);
    }
    free(d->e);
    free(d);
}

static int add_entry(zck_diff *d, const char *tensor, const char *state, uint64_t numel,
                     const char *note, zck_diff_entry **out)
{
    zck_diff_entry *nv = realloc(d->e, (d->n + 1) * sizeof *nv);
    if (!nv)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    d->e = nv;
    zck_diff_entry *e = &d->e[d->n];
    memset(e, 0, sizeof *e);
    e->numel = numel;
    e->match = note[0] == 0;
    if (!(e->tensor = strdup(tensor)) || !(e->state = strdup(state)) ||
        !(e->note = strdup(note))) {
        free(e->tensor);
        free(e->state);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    d->n++;
    if (!e->match)
        d->all_match = 0;
    if (out)
        *out = e;
    return 0;
}

/* Find tensor `name` in L: group and tensor info. */
static bool find_tensor(const zck_layout *L, const char *name, size_t *g, zck_tensor_info *ti)
{
    for (size_t gg = 0; gg < zck_layout_n_groups(L); gg++)
        for (size_t t = 0; t < zck_layout_group_n_tensors(L, gg); t++) {
            zck_layout_tensor(L, gg, t, ti);
            if (!strcmp(ti->name, name)) {
                *g = gg;
                return true;
            }
        }
    return false;
}

static int compare(zck_reader *ra, zck_reader *rb, size_t ga, size_t sa, size_t gb, size_t sb,
                   uint64_t off_a, uint64_t off_b, uint64_t numel, const zck_diff_opts *o,
                   unsigned char *bufa, unsigned char *bufb, size_t per, zck_diff_entry *e,
                   uint64_t *done)
{
    zck_dtype ta = zck_layout_state_dtype(zck_reader_layout(ra), sa);
    zck_dtype tb = zck_layout_state_dtype(zck_reader_layout(rb), sb);
    size_t da = zck_dtype_size(ta), db = zck_dtype_size(tb);
    for (uint64_t i = 0; i < numel; i += per) {
        uint64_t k = numel - i < per ? numel - i : per;
        zck_read_opts ro = ZCK_READ_OPTS_INIT;
        ro.verify = 0;
        ro.jobs = 1;
        ro.io.io = ZCK_IO_BUFFERED; /* from the page cache the verification filled */
        zck_read_req qa = {ga, sa, off_a + i, k, bufa}, qb = {gb, sb, off_b + i, k, bufb};
        ZR_TRY(zck_reader_read(ra, &qa, 1, &ro));
        ZR_TRY(zck_reader_read(rb, &qb, 1, &ro));
        if (ta == tb && !memcmp(bufa, bufb, k * da))
            ; /* identical bits: nothing to measure */
        else
            for (uint64_t x = 0; x < k; x++) {
                double a = zck_dtype_get_f64(ta, bufa, x), b = zck_dtype_get_f64(tb, bufb, x);
                if (ta == tb && !memcmp(bufa + x * da, bufb + x * db, da))
                    continue;
                if (isnan(a) && isnan(b))
                    continue;
                double d = fabs(a - b);
                if (isnan(d))
                    e->max_abs = NAN;
                else if (!isnan(e->max_abs) && d > e->max_abs)
                    e->max_abs = d;
                if (!(d <= o->atol + o->rtol * fabs(b)))
                    e->n_differ++;
            }
        *done += k * (da + db);
        if (o->progress.fn)
            o->progress.fn(o->progress.ctx, "diff", *done, 0);
    }
    if (e->n_differ)
        e->match = 0;
    return 0;
}

int zck_diff_run(zck_diff **out, const char *a, const char *b, const zck_diff_opts *opts)
{
    zck_diff_opts def = ZCK_DIFF_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (opts->verify) {
        ZR_TRY(zck__verify_or_fail(a, 2, NULL));
        ZR_TRY(zck__verify_or_fail(b, 2, NULL));
    }
    zck_reader *ra = NULL, *rb = NULL;
    zck_diff *d = calloc(1, sizeof *d);
    size_t buf = opts->buf_bytes ? opts->buf_bytes : def.buf_bytes;
    size_t per = buf / 2 / 8;
    unsigned char *bufa = malloc(per * 8), *bufb = malloc(per * 8);
    int rc = 0;
    if (!d || !bufa || !bufb || per == 0) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    d->all_match = 1;
    ZR_TRY_GOTO(zck_reader_open(&ra, a), rc, out);
    ZR_TRY_GOTO(zck_reader_open(&rb, b), rc, out);
    const zck_layout *La = zck_reader_layout(ra), *Lb = zck_reader_layout(rb);
    uint64_t done = 0;
    for (size_t g = 0; g < zck_layout_n_groups(La); g++)
        for (size_t t = 0; t < zck_layout_group_n_tensors(La, g); t++) {
            zck_tensor_info ta, tb;
            zck_layout_tensor(La, g, t, &ta);
            size_t gb;
            bool in_b = find_tensor(Lb, ta.name, &gb, &tb);
            bool same_shape = in_b && ta.ndim == tb.ndim &&
                              !memcmp(ta.shape, tb.shape, ta.ndim * sizeof *ta.shape);
            for (size_t s = 0; s < zck_layout_n_states(La); s++) {
                const char *sn = zck_layout_state_name(La, s);
                size_t sb;
                char note[256] = "";
                if (!in_b)
                    snprintf(note, sizeof note, "only in A");
                else if (!same_shape)
                    snprintf(note, sizeof note, "shape differs");
                else if (zck_layout_find_state(Lb, &sb, sn) < 0)
                    snprintf(note, sizeof note, "state only in A");
                zck_diff_entry *e;
                ZR_TRY_GOTO(add_entry(d, ta.name, sn, ta.numel, note, &e), rc, out);
                if (!note[0])
                    ZR_TRY_GOTO(compare(ra, rb, g, s, gb, sb, ta.offset, tb.offset, ta.numel,
                                        opts, bufa, bufb, per, e, &done), rc, out);
                if (!e->match)
                    d->all_match = 0;
            }
        }
    /* what B has that A does not */
    for (size_t g = 0; g < zck_layout_n_groups(Lb); g++)
        for (size_t t = 0; t < zck_layout_group_n_tensors(Lb, g); t++) {
            zck_tensor_info tb, ta;
            zck_layout_tensor(Lb, g, t, &tb);
            size_t ga;
            bool in_a = find_tensor(La, tb.name, &ga, &ta);
            for (size_t s = 0; s < zck_layout_n_states(Lb); s++) {
                size_t sa;
                const char *sn = zck_layout_state_name(Lb, s);
                if (!in_a)
                    ZR_TRY_GOTO(add_entry(d, tb.name, sn, tb.numel, "only in B", NULL), rc, out);
                else if (zck_layout_find_state(La, &sa, sn) < 0)
                    ZR_TRY_GOTO(add_entry(d, tb.name, sn, tb.numel, "state only in B", NULL),
                                rc, out);
            }
        }
    zr_err_clear();
    *out = d;
    d = NULL;
out:
    zck_diff_free(d);
    zck_reader_free(ra);
    zck_reader_free(rb);
    free(bufa);
    free(bufb);
    return rc;
}
