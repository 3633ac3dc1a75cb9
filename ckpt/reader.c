/*
 * reader.c: open a checkpoint (validating its manifest completely before any shard is read) and
 * serve any logical range of any (group, state), whatever the shard layout. Each touched file
 * is streamed through the I/O engine once; with verification on, every touched file is read in
 * full and hashed in the same pass, and the read fails if any hash differs.
 */
#include "zck_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct zck_reader {
    char *dir;
    zck_manifest *m;
};

int zck__resolve(char **out, const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return zr_err_sys(errno, "%s", path);
    if (!S_ISDIR(st.st_mode))
        return zr_err_set(ZR_EINVAL, "%s: not a directory (expected a checkpoint or run "
                          "directory)", path);
    char *mp = zck_path_join(path, "manifest.json");
    if (!mp)
        return ZR_ENOMEM;
    int has_manifest = stat(mp, &st) == 0;
    free(mp);
    char *lp = zck_path_join(path, "latest");
    if (!lp)
        return ZR_ENOMEM;
    int has_latest = stat(lp, &st) == 0;
    free(lp);
    if (!has_manifest && has_latest)
        return zck_latest(out, path);
    if (!(*out = strdup(path)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    return 0;
}

int zck__manifest_load(zck_manifest **out, const char *dir)
{
    char *mp = zck_path_join(dir, "manifest.json"), *text = NULL;
    size_t len;
    if (!mp)
        return ZR_ENOMEM;
    int rc = zck__read_small(&text, &len, mp, ZCK_MAX_MANIFEST_BYTES);
    if (rc == ZR_ENOTFOUND && zck__vanished(dir))
        rc = zck__vanished_err(dir);
    else if (rc == ZR_ENOTFOUND)
        rc = zr_err_set(ZR_ENOTFOUND, "%s: missing: %s is not a committed checkpoint", mp, dir);
    if (!rc)
        rc = zck__manifest_parse(out, text, len, mp);
    free(text);
    free(mp);
    return rc;
}

int zck_reader_open(zck_reader **out, const char *path)
{
    zck_reader *r = calloc(1, sizeof *r);
    if (!r)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0;
    ZR_TRY_GOTO(zck__resolve(&r->dir, path), rc, fail);
    ZR_TRY_GOTO(zck__manifest_load(&r->m, r->dir), rc, fail);
    *out = r;
    return 0;
fail:
    zck_reader_free(r);
    return rc;
}

int zck__reader_borrow(zck_reader **out, const char *dir, zck_manifest *m)
{
    zck_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->dir = strdup(dir))) {
        free(r);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    r->m = m;
    *out = r;
    return 0;
}

void zck__reader_unborrow(zck_reader *r)
{
    if (r) {
        free(r->dir);
        free(r);
    }
}

int zck_reader_open_manifest(zck_reader **out, const char *text, size_t len, const char *what)
{
    zck_reader *r = calloc(1, sizeof *r);
    if (!r)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = zck__manifest_parse(&r->m, text, len, what);
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void zck_reader_free(zck_reader *r)
{
    if (!r)
        return;
    zck__manifest_free(r->m);
    free(r->dir);
    free(r);
}

const char *zck_reader_path(const zck_reader *r) { return r->dir; }
const zck_layout *zck_reader_layout(const zck_reader *r) { return r->m->L; }
uint64_t zck_reader_step(const zck_reader *r) { return r->m->step; }
uint32_t zck_reader_world(const zck_reader *r) { return r->m->world; }
int zck_reader_zero_stage(const zck_reader *r) { return r->m->stage; }
const char *zck_reader_version(const zck_reader *r) { return r->m->version; }
const char *zck_reader_created(const zck_reader *r) { return r->m->created; }
const char *zck_reader_producer(const zck_reader *r) { return r->m->producer; }
const char *zck_reader_model_json(const zck_reader *r) { return r->m->model_json; }
const char *zck_reader_training_json(const zck_reader *r) { return r->m->training_json; }
size_t zck_reader_n_shards(const zck_reader *r) { return r->m->nshards; }
size_t zck_reader_n_files(const zck_reader *r) { return r->m->nfiles; }
const char *zck_reader_file_name(const zck_reader *r, size_t i) { return r->m->files[i].file; }
uint64_t zck_reader_file_bytes(const zck_reader *r, size_t i) { return r->m->files[i].bytes; }
const char *zck_reader_file_sha256(const zck_reader *r, size_t i)
{
    return r->m->files[i].sha256;
}
const zck_manifest *zck__reader_manifest(const zck_reader *r) { return r->m; }
const zck_shard *zck_reader_shard(const zck_reader *r, size_t i) { return r->m->shards[i]; }

/* ---------------------------------------------------------------- reading */

typedef struct {
    uint64_t off, len;   /* bytes in the shard file */
    unsigned char *dst;
} piece;

typedef struct {
    piece *p;
    size_t n, cap;
    int touched;
} plan;

typedef struct {
    zck_reader *r;
    plan *plans;
    const zck_read_opts *o;
} read_ctx;

typedef struct {
    const plan *pl;
    size_t lo;
    zck__sha *sha;
} stream_ctx;

static int cmp_piece(const void *a, const void *b)
{
    const piece *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int on_chunk(void *vctx, uint64_t off, const unsigned char *p, size_t len)
{
    stream_ctx *c = vctx;
    if (c->sha)
        zck__sha_update(c->sha, p, len);
    uint64_t end = off + len;
    const plan *pl = c->pl;
    while (c->lo < pl->n && pl->p[c->lo].off + pl->p[c->lo].len <= off)
        c->lo++;
    for (size_t i = c->lo; i < pl->n && pl->p[i].off < end; i++) {
        const piece *q = &pl->p[i];
        uint64_t a = q->off > off ? q->off : off;
        uint64_t b = q->off + q->len < end ? q->off + q->len : end;
        unsigned char *to = q->dst + (a - q->off);
        const unsigned char *from = p + (a - off);
        if (a < b && to != from) /* not already read into place */
            memcpy(to, from, (size_t)(b - a));
    }
    return 0;
}

/*
 * The spans to stream for one file's sorted pieces. A piece whose destination and file offset
 * are both aligned to ZCK_FILE_ALIGN is read straight into its destination (whole blocks; its
 * unaligned tail goes through the ring). Everything else is read through the ring, in aligned
 * spans merged when they nearly touch. With whole set, the spans cover [0, bytes) completely
 * (so that the file can be hashed in the same pass).
 */
static size_t plan_spans(zck__span *sp, const plan *pl, uint64_t bytes, int whole)
{
    const uint64_t A = ZCK_FILE_ALIGN, slack = whole ? UINT64_MAX : (uint64_t)1 << 20;
    size_t ns = 0;
    uint64_t cur = 0; /* everything below is planned */
#define RING(a_, b_)                                                                           \
    do {                                                                                       \
        uint64_t ra_ = (a_), rb_ = (b_) > bytes ? bytes : (b_);                                \
        if (ra_ < cur)                                                                         \
            ra_ = cur;                                                                         \
        if (ra_ >= rb_)                                                                        \
            break;                                                                             \
        if (ns && !sp[ns - 1].dst && ra_ <= sp[ns - 1].b + (whole ? 0 : slack))               \
            sp[ns - 1].b = rb_;                                                                \
        else                                                                                   \
            sp[ns++] = (zck__span){ra_, rb_, NULL};                                            \
        cur = rb_;                                                                             \
    } while (0)
    for (size_t k = 0; k < pl->n; k++) {
        const piece *q = &pl->p[k];
        uint64_t end = q->off + q->len, whole_blocks = q->len / A * A;
        bool direct = q->off % A == 0 && (uintptr_t)q->dst % A == 0 && whole_blocks &&
                      q->off >= cur;
        if (whole)
            RING(cur, direct ? q->off : q->off / A * A); /* the gap before the piece */
        if (direct) {
            sp[ns++] = (zck__span){q->off, q->off + whole_blocks, q->dst};
            cur = q->off + whole_blocks;
            RING(cur, (end + A - 1) / A * A); /* the tail */
        } else
            RING(q->off / A * A, (end + A - 1) / A * A);
    }
    if (whole)
        RING(cur, bytes);
#undef RING
    return ns;
}

static int read_shard(void *vctx, size_t i)
{
    read_ctx *c = vctx;
    plan *pl = &c->plans[i];
    if (!pl->touched)
        return 0;
    const zck_shard *s = c->r->m->shards[i];
    char *path = zck_path_join(c->r->dir, s->file);
    if (!path)
        return ZR_ENOMEM;
    zck__io *io = NULL;
    stream_ctx sc = {pl, 0, NULL};
    zck__span *spans = NULL;
    size_t ns = 0;
    int rc = 0;
    ZR_TRY_GOTO(zck__io_open(&io, path, ZCK__IO_READ, &c->o->io), rc, out);
    uint64_t size;
    ZR_TRY_GOTO(zck__io_size(io, &size), rc, out);
    if (size != s->bytes) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: %s: %llu bytes on disk, manifest lists %llu", path,
                        size < s->bytes ? "truncated" : "size mismatch",
                        (unsigned long long)size, (unsigned long long)s->bytes);
        goto out;
    }
    qsort(pl->p, pl->n, sizeof *pl->p, cmp_piece);
    /* at most three spans per piece (a gap, the piece's direct part, its tail) plus the end */
    if (!(spans = malloc((3 * pl->n + 1) * sizeof *spans))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    if (c->o->verify)
        ZR_TRY_GOTO(zck__sha_new(&sc.sha), rc, out);
    ns = plan_spans(spans, pl, s->bytes, c->o->verify);
    ZR_TRY_GOTO(zck__io_read_spans(io, spans, ns, on_chunk, &sc), rc, out);
    if (sc.sha) {
        char hex[65];
        zck__sha_hex(sc.sha, hex);
        if (strcmp(hex, s->sha256))
            rc = zr_err_set(ZR_ECORRUPT, "%s: sha256 mismatch (manifest %.16s..., file "
                            "%.16s...)", path, s->sha256, hex);
    }
out:
    if (io) {
        int crc = zck__io_close(io);
        if (!rc)
            rc = crc;
    }
    if (rc && rc != ZR_ENOMEM && zck__vanished(c->r->dir))
        rc = zck__vanished_err(c->r->dir); /* pruned while read: no verdict of damage */
    zck__sha_free(sc.sha);
    free(spans);
    free(path);
    return rc;
}

static int plan_add(plan *pl, piece p)
{
    ZR_TRY(zr_array_grow(&pl->p, &pl->cap, pl->n, sizeof *pl->p));
    pl->p[pl->n++] = p;
    pl->touched = 1;
    return 0;
}

int zck_reader_read(zck_reader *r, const zck_read_req *reqs, size_t n_reqs,
                    const zck_read_opts *opts)
{
    zck_read_opts def = ZCK_READ_OPTS_INIT;
    if (!opts)
        opts = &def;
    const zck_manifest *m = r->m;
    const zck_layout *L = m->L;
    if (!r->dir)
        return zr_err_set(ZR_EINVAL, "this checkpoint was opened from its manifest alone: there "
                          "are no shard files to read");
    plan *plans = calloc(m->nshards ? m->nshards : 1, sizeof *plans);
    if (!plans)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t q = 0; q < n_reqs; q++) {
        const zck_read_req *rq = &reqs[q];
        if (rq->group >= L->ng || rq->state >= L->ns) {
            rc = zr_err_set(ZR_EINVAL, "%s: read request %zu: no %s %zu", r->dir, q,
                            rq->group >= L->ng ? "group" : "state",
                            rq->group >= L->ng ? rq->group : rq->state);
            goto out;
        }
        uint64_t numel = L->g[rq->group].numel;
        if (rq->start > numel || rq->count > numel - rq->start) {
            rc = zr_err_set(ZR_EINVAL, "%s: read request %zu: elements [%llu, %llu) outside "
                            "group '%s' of %llu", r->dir, q, (unsigned long long)rq->start,
                            (unsigned long long)(rq->start + rq->count), L->g[rq->group].name,
                            (unsigned long long)numel);
            goto out;
        }
        size_t x = rq->group * L->ns + rq->state;
        const zck__extref *ex = m->index[x];
        size_t ne = m->index_n[x], lo = 0, hi = ne;
        size_t dsz = zck_dtype_size(L->s[rq->state].dtype);
        uint64_t end = rq->start + rq->count;
        while (lo < hi) { /* first extent ending after start */
            size_t mid = (lo + hi) / 2;
            if (ex[mid].start + ex[mid].count <= rq->start)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (size_t k = lo; k < ne && ex[k].start < end; k++) {
            uint64_t a = ex[k].start > rq->start ? ex[k].start : rq->start;
            uint64_t b = ex[k].start + ex[k].count < end ? ex[k].start + ex[k].count : end;
            piece p = {ex[k].offset + (a - ex[k].start) * dsz, (b - a) * dsz,
                       (unsigned char *)rq->dst + (a - rq->start) * dsz};
            ZR_TRY_GOTO(plan_add(&plans[ex[k].shard], p), rc, out);
        }
    }
    read_ctx c = {r, plans, opts};
    rc = zck__parallel(m->nshards, opts->jobs, read_shard, &c);
out:
    for (size_t i = 0; i < m->nshards; i++)
        free(plans[i].p);
    free(plans);
    return rc;
}

int zck_reader_read_range(zck_reader *r, size_t group, size_t state, uint64_t start,
                          uint64_t count, void *dst)
{
    zck_read_req q = {group, state, start, count, dst};
    zck_read_opts o = ZCK_READ_OPTS_INIT;
    o.verify = 0;
    o.jobs = 1;
    return zck_reader_read(r, &q, 1, &o);
}
