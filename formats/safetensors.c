/*
 * safetensors.c: the safetensors format (Hugging Face): streaming export of a checkpoint
 * (zfmt_safetensors_export) and a strict reader of the header that the importer uses.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
 * {"<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {string: string}}, then the data buffer; offsets are relative to the start
 * of the data buffer. We lay tensors out contiguously in header order and pad the header with
 * spaces so that the data starts at a multiple of 8.
 */
#include "fmtutil.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* safetensors limits the header to 100 MB; we accept the same */
#define ST_MAX_HEADER ((uint64_t)100 << 20)

static const struct {
    zck_dtype t;
    const char *name;
} st_names[] = {
    {ZCK_F32, "F32"}, {ZCK_BF16, "BF16"}, {ZCK_F16, "F16"}, {ZCK_F64, "F64"}, {ZCK_I64, "I64"},
    {ZCK_I32, "I32"}, {ZCK_I16, "I16"},   {ZCK_U16, "U16"}, {ZCK_I8, "I8"},   {ZCK_U8, "U8"},
};
#define N_ST_NAMES (sizeof st_names / sizeof *st_names)

const char *zfmt__st_dtype_name(zck_dtype t)
{
    for (size_t i = 0; i < N_ST_NAMES; i++)
        if (st_names[i].t == t)
            return st_names[i].name;
    return NULL;
}

int zfmt__st_dtype_parse(zck_dtype *out, const char *name)
{
    for (size_t i = 0; i < N_ST_NAMES; i++)
        if (!strcmp(st_names[i].name, name)) {
            *out = st_names[i].t;
            return 0;
        }
    return zr_err_set(ZR_EUNSUPPORTED, "dtype '%s' is not supported", name);
}

/* ---------------------------------------------------------------- export */

typedef struct {
    size_t g, s;
    zck_tensor_info ti;
    zck_dtype out_t;
    uint64_t begin, end;  /* bytes in the data buffer of its file */
    size_t shard;         /* which file (Hugging Face shards) */
    char *name;
    int transposed;       /* Hugging Face names: a 2-D weight written [in, out] */
} item;

static int is_convertible(zck_dtype t) { return t == ZCK_F32 || t == ZCK_BF16 || t == ZCK_F16; }

/* The header of items it[0, n) (one file), padded with spaces to a multiple of 8 bytes
 * (malloc'ed); fam: Hugging Face's names (metadata format pt), NULL: ours. */
static int build_header(char **out, size_t *len, const item *it, size_t n, zck_reader *r,
                        const zfmt__hf_family *fam)
{
    json_t *root = json_object();
    int rc = 0;
    if (!root)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (json_object_get(root, it[i].name) || !strcmp(it[i].name, "__metadata__")) {
            rc = zr_err_set(ZR_EINVAL, "%s: tensor name '%s' occurs twice in the export (a "
                            "tensor's own name clashes with '<state>/<name>' or __metadata__)",
                            zck_reader_path(r), it[i].name);
            goto out;
        }
        json_t *shape = json_array();
        if (!shape) {
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
            goto out;
        }
        for (size_t d = 0; d < it[i].ti.ndim; d++) {
            size_t dd = it[i].transposed ? it[i].ti.ndim - 1 - d : d;
            json_array_append_new(shape, json_integer((json_int_t)it[i].ti.shape[dd]));
        }
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", zfmt__st_dtype_name(it[i].out_t),
                              "shape", shape, "data_offsets", (json_int_t)it[i].begin,
                              (json_int_t)it[i].end);
        if (!e || json_object_set_new(root, it[i].name, e)) {
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
            goto out;
        }
    }
    char step[32];
    snprintf(step, sizeof step, "%llu", (unsigned long long)zck_reader_step(r));
    json_t *meta = fam ? json_pack("{s:s}", "format", "pt")
                       : json_pack("{s:s, s:s, s:s}", "format", "zero", "zero.model",
                                   zck_reader_model_json(r), "zero.step", step);
    if (!meta || json_object_set_new(root, "__metadata__", meta)) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    char *text = zfmt__json_dump(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
    char *p = realloc(text, padded + 1);
    if (!p) {
        free(text);
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    memset(p + tl, ' ', padded - tl);
    p[padded] = 0;
    *out = p;
    *len = padded;
out:
    json_decref(root);
    return rc;
}

static void free_items(item *it, size_t n)
{
    for (size_t i = 0; it && i < n; i++)
        free(it[i].name);
    free(it);
}

/* The tensors to export in header order (state by state, then layout order); fam as above. */
static int plan_items(item **out, size_t *n_out, zck_reader *r, const zfmt_st_opts *o,
                      const zfmt__hf_family *fam)
{
    const zck_layout *L = zck_reader_layout(r);
    size_t ns = zck_layout_n_states(L), ng = zck_layout_n_groups(L), cap = 0, n = 0;
    for (size_t g = 0; g < ng; g++)
        cap += zck_layout_group_n_tensors(L, g);
    cap *= ns;
    item *it = calloc(cap ? cap : 1, sizeof *it);
    if (!it)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0, any_param = 0;
    uint64_t off = 0;
    for (size_t s = 0; s < ns; s++) {
        const char *sname = zck_layout_state_name(L, s);
        int is_param = !strcmp(sname, "param");
        any_param |= is_param;
        if (o->params_only && !is_param)
            continue;
        zck_dtype st = zck_layout_state_dtype(L, s);
        zck_dtype ot = o->dtype < 0 ? st : (zck_dtype)o->dtype;
        if (ot != st && !is_convertible(st)) {
            rc = zr_err_set(ZR_EUNSUPPORTED, "%s: state '%s' is stored as %s, which cannot be "
                            "converted to %s", zck_reader_path(r), sname, zck_dtype_name(st),
                            zck_dtype_name(ot));
            goto fail;
        }
        for (size_t g = 0; g < ng; g++)
            for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++) {
                item *x = &it[n++];
                x->g = g;
                x->s = s;
                x->out_t = ot;
                zck_layout_tensor(L, g, t, &x->ti);
                size_t len = strlen(sname) + strlen(x->ti.name) + 2 + 16;
                if (!(x->name = malloc(len))) {
                    rc = zr_err_set(ZR_ENOMEM, "out of memory");
                    goto fail;
                }
                if (fam)
                    ZR_TRY_GOTO(zfmt__hf_name(fam, x->name, len, x->ti.name, &x->transposed),
                                rc, fail);
                else if (is_param)
                    snprintf(x->name, len, "%s", x->ti.name);
                else
                    snprintf(x->name, len, "%s/%s", sname, x->ti.name);
                x->begin = off;
                off += x->ti.numel * zck_dtype_size(ot);
                x->end = off;
            }
    }
    if (o->params_only && !any_param) {
        rc = zr_err_set(ZR_ENOTFOUND, "%s: no state 'param' to export", zck_reader_path(r));
        goto fail;
    }
    *out = it;
    *n_out = n;
    return 0;
fail:
    free_items(it, n);
    return rc;
}

size_t zfmt__st_split_next(zfmt__st_split *s, uint64_t n_bytes, uint64_t limit, uint64_t *begin)
{
    if (limit && s->at && s->at + n_bytes > limit) {
        s->file++;
        s->at = 0;
    }
    *begin = s->at;
    s->at += n_bytes;
    return s->file;
}

/* Split items into files of at most limit bytes of data (0: one file); offsets become relative
 * to each file. Returns the number of files. */
static size_t assign_shards(item *it, size_t n, uint64_t limit)
{
    zfmt__st_split sp = {0};
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = it[i].end - it[i].begin;
        it[i].shard = zfmt__st_split_next(&sp, bytes, limit, &it[i].begin);
        it[i].end = it[i].begin + bytes;
    }
    return sp.file + 1;
}

static int is_digits(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return 0;
    return 1;
}

int zfmt__st_is_shard_name(const char *name)
{
    /* "model-" 5 "-of-" 5 ".safetensors" */
    return strlen(name) == 32 && !strncmp(name, "model-", 6) && is_digits(name + 6, 5) &&
           !strncmp(name + 11, "-of-", 4) && is_digits(name + 15, 5) &&
           !strcmp(name + 20, ".safetensors");
}

void zfmt__st_shard_path(char *out, size_t cap, const char *dir, size_t k, size_t n)
{
    const char *sep = dir ? "/" : "";
    dir = dir ? dir : "";
    if (n == 1)
        snprintf(out, cap, "%s%smodel.safetensors", dir, sep);
    else
        snprintf(out, cap, "%s%smodel-%05zu-of-%05zu.safetensors", dir, sep, k + 1, n);
}

int zfmt__st_index_open(zfmt__out **out, const char *dir, const json_t *weight_map,
                        uint64_t total)
{
    *out = NULL;
    json_t *root = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total,
                             "weight_map", (json_t *)weight_map);
    char *text = root ? zfmt__json_dump(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps leaves room for its NUL: a final newline in its place */
    int rc = zfmt__out_open(out, path);
    if (!rc)
        rc = zfmt__out_write(*out, text, n + 1);
    free(text);
    return rc;
}

/* Read tensor x whole (it is 2-D), write it transposed through dbuf (as wide as the tensor). */
static int write_transposed(zck_reader *r, const zck_read_opts *ro, const item *x,
                            zck_dtype st, void *whole, void *tmp, zfmt__out *f)
{
    zck_read_req q = {x->g, x->s, x->ti.offset, x->ti.numel, whole};
    ZR_TRY(zck_reader_read(r, &q, 1, ro));
    zfmt__transpose(tmp, whole, (size_t)x->ti.shape[0], (size_t)x->ti.shape[1],
                    zck_dtype_size(st));
    if (st != x->out_t) {
        int rc = zfmt_convert(whole, x->out_t, tmp, st, (size_t)x->ti.numel);
        if (rc) {
            zr_err_prefix("tensor '%s': ", x->name);
            return rc;
        }
        tmp = whole;
    }
    return zfmt__out_write(f, tmp, (size_t)x->ti.numel * zck_dtype_size(x->out_t));
}

/* An export in progress: the source, the plan, the working memory, the open files. */
typedef struct {
    zck_reader *r;
    zck_read_opts ro;
    const zfmt__hf_family *fam;
    item *it;
    size_t n, chunk, n_files;
    unsigned char *sbuf, *dbuf, *wbuf, *tbuf;
    zfmt__out **f;
    zfmt__prog pr;
    size_t buf_bytes;               /* ours: the one pass's working memory */
    const zck_progress *progress;   /* ours: the caller's */
} st_job;

static int write_item(st_job *j, const item *x, zfmt__out *f)
{
    zck_dtype st = zck_layout_state_dtype(zck_reader_layout(j->r), x->s);
    int conv = st != x->out_t;
    size_t ds = zck_dtype_size(x->out_t);
    if (x->transposed) {
        ZR_TRY(write_transposed(j->r, &j->ro, x, st, j->wbuf, j->tbuf, f));
        zfmt__prog_add(&j->pr, x->ti.numel * ds);
        return 0;
    }
    for (uint64_t done = 0; done < x->ti.numel;) {
        uint64_t k = x->ti.numel - done < j->chunk ? x->ti.numel - done : j->chunk;
        zck_read_req q = {x->g, x->s, x->ti.offset + done, k, j->sbuf};
        ZR_TRY(zck_reader_read(j->r, &q, 1, &j->ro));
        if (conv) {
            int rc = zfmt_convert(j->dbuf, x->out_t, j->sbuf, st, (size_t)k);
            if (rc) {
                zr_err_prefix("tensor '%s': ", x->name);
                return rc;
            }
        }
        ZR_TRY(zfmt__out_write(f, conv ? j->dbuf : j->sbuf, (size_t)k * ds));
        zfmt__prog_add(&j->pr, k * ds);
        done += k;
    }
    return 0;
}

/* Our single file in one pass (zck_verify_opts.each): every shard is read once (O_DIRECT,
 * several at once), hashed, and each piece of it, as the verification hands it over, is cut
 * into the tensors it overlaps and written at its place in f (data from byte base on),
 * converted through a small buffer where the export asks for another dtype. The pieces must
 * tile every exported tensor once; nothing is committed unless the verification passes. */
typedef struct {
    st_job *j;
    zfmt__out *f;
    uint64_t base;
    size_t *first;            /* [s * ng + g]: index of the first item of (g, s); SIZE_MAX */
    size_t slice;             /* elements converted at once */
    atomic_uint_least64_t done; /* data bytes written */
    zck_progress user;        /* the caller's progress: ticks of the pass, named "export" */
} st_pass;

static void pass_progress(void *ctx, const char *what, uint64_t done, uint64_t total)
{
    (void)what;
    const st_pass *ps = ctx;
    ps->user.fn(ps->user.ctx, "export", done, total);
}

/* Elements [a, b) of item x from src (as stored, dtype st) to their place in the file. */
static int pass_write(st_pass *ps, const item *x, zck_dtype st, const unsigned char *src,
                      uint64_t a, uint64_t b)
{
    size_t ds = zck_dtype_size(x->out_t), ss = zck_dtype_size(st);
    uint64_t at = ps->base + x->begin + (a - x->ti.offset) * ds;
    if (st == x->out_t)
        return zfmt__out_pwrite(ps->f, src, (size_t)(b - a) * ds, at);
    size_t slice = (size_t)(b - a) < ps->slice ? (size_t)(b - a) : ps->slice;
    unsigned char *buf = malloc(slice * ds); /* the thread's heap reuses it from call to call */
    if (!buf)
        return zr_err_set(ZR_ENOMEM, "out of memory (a conversion buffer of %zu bytes)",
                          slice * ds);
    int rc = 0;
    for (uint64_t done = 0; done < b - a && !rc;) {
        size_t k = (size_t)(b - a - done < slice ? b - a - done : slice);
        if ((rc = zfmt_convert(buf, x->out_t, src + done * ss, st, k)))
            zr_err_prefix("tensor '%s': ", x->name);
        else
            rc = zfmt__out_pwrite(ps->f, buf, k * ds, at + done * ds);
        done += k;
    }
    free(buf);
    return rc;
}

/* A piece of a shard: the exported tensors of its (group, state) that it overlaps. */
static int pass_piece(void *ctx, const zck_piece *p)
{
    st_pass *ps = ctx;
    const zck_layout *L = zck_reader_layout(ps->j->r);
    size_t ng = zck_layout_n_groups(L), ns = zck_layout_n_states(L);
    if (p->group >= ng || p->state >= ns)
        return zr_err_set(ZR_ECORRUPT, "%s: a shard holds group %zu, state %zu: not in the "
                          "manifest read first (changed meanwhile?)", zck_reader_path(ps->j->r),
                          p->group, p->state);
    size_t i = ps->first[p->state * ng + p->group];
    if (i == SIZE_MAX) /* a state not exported (--params-only): hashed, not written */
        return 0;
    zck_dtype st = zck_layout_state_dtype(L, p->state);
    const unsigned char *src = p->data;
    uint64_t pe = p->start + p->count;
    for (; i < ps->j->n && ps->j->it[i].g == p->group && ps->j->it[i].s == p->state; i++) {
        const item *x = &ps->j->it[i];
        uint64_t xe = x->ti.offset + x->ti.numel;
        uint64_t a = p->start > x->ti.offset ? p->start : x->ti.offset, b = pe < xe ? pe : xe;
        if (a >= b)
            continue;
        ZR_TRY(pass_write(ps, x, st, src + (a - p->start) * zck_dtype_size(st), a, b));
        atomic_fetch_add(&ps->done, (b - a) * zck_dtype_size(x->out_t));
    }
    return 0;
}

/* zck_verify's check that it reads the checkpoint the export planned from: the same shards,
 * hashes and model (a manifest replaced in between would mix two checkpoints). */
static int same_ckpt(void *ctx, const zck_reader *rd)
{
    const zck_reader *r = ctx;
    int same = zck_reader_n_shards(rd) == zck_reader_n_shards(r) &&
               zck_reader_step(rd) == zck_reader_step(r) &&
               !strcmp(zck_reader_model_json(rd), zck_reader_model_json(r));
    for (size_t i = 0; same && i < zck_reader_n_shards(r); i++)
        same = !strcmp(zck_shard_sha256(zck_reader_shard(rd, i)),
                       zck_shard_sha256(zck_reader_shard(r, i)));
    return same ? 0 : zr_err_set(ZR_ECORRUPT, "%s: the checkpoint changed while it was read "
                                 "(its manifest was replaced)", zck_reader_path(r));
}

static int write_in_one_pass(st_job *j, zfmt__out *f, uint64_t base)
{
    size_t buf_bytes = j->buf_bytes;
    const zck_progress *progress = j->progress;
    const zck_layout *L = zck_reader_layout(j->r);
    size_t ng = zck_layout_n_groups(L), ns = zck_layout_n_states(L);
    st_pass ps = {.j = j, .f = f, .base = base};
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    vo.cheap_first = 1; /* nothing is read for the export from a checkpoint already damaged */
    vo.precheck = same_ckpt;
    vo.precheck_ctx = j->r;
    vo.each = pass_piece;
    vo.each_ctx = &ps;
    if (progress && progress->fn) { /* the bytes read and hashed, all shards */
        uint64_t total = 0;
        for (size_t i = 0; i < zck_reader_n_shards(j->r); i++)
            total += zck_shard_bytes(zck_reader_shard(j->r, i));
        ps.user = *progress;
        vo.progress = (zck_progress){pass_progress, &ps};
        progress->fn(progress->ctx, "export", 0, total);
    }
    /* the read rings (jobs x queue depth buffers) and a conversion slice per job share
     * buf_bytes */
    size_t per = buf_bytes / (2 * vo.jobs * (vo.io.queue_depth + 1));
    per = per / ZCK_FILE_ALIGN * ZCK_FILE_ALIGN;
    vo.io.buf_bytes = per < ZCK_FILE_ALIGN ? ZCK_FILE_ALIGN
                      : per > ((size_t)4 << 20) ? (size_t)4 << 20 : per;
    ps.slice = buf_bytes / (2 * vo.jobs * 8);
    ps.slice = ps.slice < 1 ? 1 : ps.slice > ((size_t)1 << 17) ? (size_t)1 << 17 : ps.slice;
    atomic_init(&ps.done, 0);
    int rc = 0;
    zck_report *rep = NULL;
    if (!(ps.first = malloc(ng * ns * sizeof *ps.first + 1))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t k = 0; k < ng * ns; k++)
        ps.first[k] = SIZE_MAX;
    for (size_t i = j->n; i-- > 0;)
        ps.first[j->it[i].s * ng + j->it[i].g] = i;
    ZR_TRY_GOTO(zck_verify(&rep, zck_reader_path(j->r), &vo), rc, out);
    ZR_TRY_GOTO(zfmt__report_err(rep, zck_reader_path(j->r)), rc, out);
    uint64_t want = j->n ? j->it[j->n - 1].end : 0, done = atomic_load(&ps.done);
    if (done != want) /* the shards' extents must tile every exported tensor once */
        rc = zr_err_set(ZR_ECORRUPT, "%s: the shards hold %llu bytes of the tensors to export, "
                        "expected %llu (extents missing or overlapping)",
                        zck_reader_path(j->r), (unsigned long long)done,
                        (unsigned long long)want);
out:
    zck_report_free(rep);
    free(ps.first);
    return rc;
}

/* Working memory: one chunk as stored, plus one converted when converting; a whole tensor
 * twice for a transposed one. */
static int job_buffers(st_job *j, size_t buf_bytes)
{
    const zck_layout *L = zck_reader_layout(j->r);
    size_t max_ss = 1, max_ds = 1, max_tr = 0;
    for (size_t i = 0; i < j->n; i++) {
        const item *x = &j->it[i];
        size_t ss = zck_dtype_size(zck_layout_state_dtype(L, x->s));
        size_t es = ss > zck_dtype_size(x->out_t) ? ss : zck_dtype_size(x->out_t);
        size_t tb = x->transposed ? (size_t)x->ti.numel * es : 0;
        max_tr = tb > max_tr ? tb : max_tr;
        if (ss > max_ss)
            max_ss = ss;
        if (x->out_t != zck_layout_state_dtype(L, x->s) && zck_dtype_size(x->out_t) > max_ds)
            max_ds = zck_dtype_size(x->out_t);
    }
    j->chunk = buf_bytes / (max_ss + max_ds);
    if (!(j->sbuf = malloc(j->chunk * max_ss)) || !(j->dbuf = malloc(j->chunk * max_ds)) ||
        (max_tr && (!(j->wbuf = malloc(max_tr)) || !(j->tbuf = malloc(max_tr)))))
        return zr_err_set(ZR_ENOMEM, "out of memory (%zu bytes of buffers)", buf_bytes);
    j->ro = (zck_read_opts)ZCK_READ_OPTS_INIT;
    j->ro.verify = 0; /* verified in full alongside */
    j->ro.jobs = 1;
    size_t iob = buf_bytes / 8 / ZCK_FILE_ALIGN * ZCK_FILE_ALIGN;
    j->ro.io.buf_bytes = iob < ZCK_FILE_ALIGN ? ZCK_FILE_ALIGN
                         : iob > ((size_t)4 << 20) ? (size_t)4 << 20 : iob;
    j->ro.io.queue_depth = 2;
    j->ro.io.io = ZCK_IO_BUFFERED; /* from the page cache the verification filled */
    return 0;
}

/* File k of the export: out itself (ours), or a file in directory out (Hugging Face's). */
static void file_path(char *p, size_t cap, const st_job *j, const char *out, size_t k)
{
    if (!j->fam)
        snprintf(p, cap, "%s", out);
    else
        zfmt__st_shard_path(p, cap, out, k, j->n_files);
}

/* Write file k (items of shard k, consecutive) up to its commit. */
static int write_file(st_job *j, const char *out, size_t k, size_t *i)
{
    char path[4200];
    file_path(path, sizeof path, j, out, k);
    size_t i0 = *i, i1 = i0;
    while (i1 < j->n && j->it[i1].shard == k)
        i1++;
    char *header = NULL;
    size_t hlen = 0;
    ZR_TRY(build_header(&header, &hlen, j->it + i0, i1 - i0, j->r, j->fam));
    int rc = zfmt__out_open(&j->f[k], path);
    unsigned char len8[8];
    for (int b = 0; b < 8; b++)
        len8[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
    if (!rc)
        rc = zfmt__out_write(j->f[k], len8, 8);
    if (!rc)
        rc = zfmt__out_write(j->f[k], header, hlen);
    free(header);
    if (!j->fam && !rc) /* ours: one file, no transposed tensors */
        rc = write_in_one_pass(j, j->f[k], 8 + (uint64_t)hlen);
    for (size_t x = i0; j->fam && !rc && x < i1; x++)
        rc = write_item(j, &j->it[x], j->f[k]);
    *i = i1;
    return rc;
}

/* model.safetensors.index.json (opened as file n_files, committed with the others). */
static int write_index(st_job *j, const char *out)
{
    json_t *wm = json_object();
    uint64_t total = 0;
    int bad = !wm;
    char name[64];
    for (size_t i = 0; !bad && i < j->n; i++) {
        zfmt__st_shard_path(name, sizeof name, NULL, j->it[i].shard, j->n_files);
        bad = json_object_set_new(wm, j->it[i].name, json_string(name));
        total += j->it[i].end - j->it[i].begin;
    }
    int rc = bad ? zr_err_set(ZR_ENOMEM, "out of memory")
                 : zfmt__st_index_open(&j->f[j->n_files], out, wm, total);
    json_decref(wm);
    return rc;
}

/* The Hugging Face naming of the checkpoint's family. */
static int ckpt_family(const zfmt__hf_family **out, zck_reader *r)
{
    zck_arch_config a;
    if (zck_arch_config_from_json(&a, zck_reader_model_json(r), NULL) < 0) {
        zr_err_prefix("%s: ", zck_reader_path(r));
        return zfmt__err_recode(ZR_ECORRUPT);
    }
    if (!(*out = zfmt__hf_family_of(zck_arch_name(a.arch))))
        return zr_err_set(ZR_EUNSUPPORTED, "%s: model family '%s' has no Hugging Face naming",
                          zck_reader_path(r), zck_arch_name(a.arch));
    return 0;
}

static int st_export(const char *ckpt, const char *out, const zfmt_st_opts *o, int hf,
                     uint64_t shard_bytes);

int zfmt_safetensors_export(const char *ckpt, const char *out_file, const zfmt_st_opts *o)
{
    return st_export(ckpt, out_file, o, 0, 0);
}

int zfmt__st_export_hf(const char *ckpt, const char *out_dir, const zfmt_st_opts *o,
                       uint64_t shard_bytes)
{
    zfmt_st_opts opt = o ? *o : (zfmt_st_opts)ZFMT_ST_OPTS_INIT;
    opt.params_only = 1;
    return st_export(ckpt, out_dir, &opt, 1, shard_bytes);
}

static int st_export(const char *ckpt, const char *out, const zfmt_st_opts *o, int hf,
                     uint64_t shard_bytes)
{
    zfmt_st_opts def = ZFMT_ST_OPTS_INIT;
    if (!o)
        o = &def;
    zfmt_st_opts opt = *o;
    if (!opt.buf_bytes)
        opt.buf_bytes = def.buf_bytes;
    if (opt.dtype != -1 && opt.dtype != ZCK_F32 && opt.dtype != ZCK_BF16 && opt.dtype != ZCK_F16)
        return zr_err_set(ZR_EINVAL, "safetensors export: dtype %d: expected -1 (as stored), "
                          "f32, bf16 or f16", opt.dtype);
    if (opt.buf_bytes < 16)
        return zr_err_set(ZR_EINVAL, "safetensors export: buffer of %zu bytes: at least 16",
                          opt.buf_bytes);

    st_job j = {0};
    int rc = 0;
    zfmt__verify *v = NULL;
    if (hf) { /* read tensor by tensor, beside a verification of the source */
        ZR_TRY_GOTO(zfmt__open_verifying(&j.r, &v, ckpt), rc, out);
        ZR_TRY_GOTO(ckpt_family(&j.fam, j.r), rc, out);
    } else { /* one pass, the verification's own (write_in_one_pass) */
        ZR_TRY_GOTO(zck_reader_open(&j.r, ckpt), rc, out);
        j.buf_bytes = opt.buf_bytes;
        j.progress = &opt.progress;
    }
    ZR_TRY_GOTO(plan_items(&j.it, &j.n, j.r, &opt, j.fam), rc, out);
    uint64_t total = j.n ? j.it[j.n - 1].end : 0;
    j.n_files = hf ? assign_shards(j.it, j.n, shard_bytes) : 1;
    if (j.n_files > ZFMT__MAX_SHARDS) { /* each stays open until the source verified */
        rc = zr_err_set(ZR_EINVAL, "Hugging Face export: a shard size of %llu bytes makes %zu "
                        "files (at most %d): choose a larger one",
                        (unsigned long long)shard_bytes, j.n_files, ZFMT__MAX_SHARDS);
        goto out;
    }
    if (!(j.f = calloc(j.n_files + 1, sizeof *j.f))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    if (hf) {
        ZR_TRY_GOTO(job_buffers(&j, opt.buf_bytes), rc, out);
        zfmt__prog_init(&j.pr, &opt.progress, "export", total);
    }
    for (size_t k = 0, i = 0; k < j.n_files; k++)
        ZR_TRY_GOTO(write_file(&j, out, k, &i), rc, out);
    if (j.n_files > 1)
        ZR_TRY_GOTO(write_index(&j, out), rc, out);
    rc = zfmt__verify_join(v);
    v = NULL;
    for (size_t k = 0; !rc && k <= j.n_files; k++)
        if (j.f[k])
            rc = zfmt__out_commit(j.f[k]);
out:
    if (v) /* a failed export still joins the verification, whose finding explains it best */
        rc = zfmt__verify_settle(v, rc);
    for (size_t k = 0; j.f && k <= j.n_files; k++)
        zfmt__out_free(j.f[k]); /* removes the temporary file unless committed */
    free(j.f);
    free(j.sbuf);
    free(j.dbuf);
    free(j.wbuf);
    free(j.tbuf);
    free_items(j.it, j.n);
    zck_reader_free(j.r);
    return rc;
}

/* ---------------------------------------------------------------- reading */

void zfmt__st_free(zfmt__st_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    for (size_t i = 0; i < f->n; i++)
        free(f->e[i].name);
    free(f->e);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->path);
    free(f);
}

const char *zfmt__st_meta(const zfmt__st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key))
            return f->meta_vals[i];
    return NULL;
}

int zfmt__st_read(const zfmt__st_file *f, const zfmt__st_entry *e, void *dst)
{
    return zfmt__pread_full(f->fd, dst, (size_t)(e->end - e->begin), f->data_off + e->begin,
                            f->path);
}

static int json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_meta(zfmt__st_file *f, json_t *meta)
{
    if (!json_is_object(meta))
        return zr_err_set(ZR_ECORRUPT, "%s: __metadata__ is not an object", f->path);
    size_t n = json_object_size(meta);
    if (!(f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys)) ||
        !(f->meta_vals = calloc(n ? n : 1, sizeof *f->meta_vals)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return zr_err_set(ZR_ECORRUPT, "%s: __metadata__ field '%s' is not a string",
                              f->path, k);
        if (!(f->meta_keys[f->n_meta] = strdup(k)) ||
            !(f->meta_vals[f->n_meta] = strdup(json_string_value(v)))) {
            free(f->meta_keys[f->n_meta]);
            return zr_err_set(ZR_ENOMEM, "out of memory");
        }
        f->n_meta++;
    }
    return 0;
}

static int parse_entry(zfmt__st_file *f, zfmt__st_entry *e, const char *name, json_t *v,
                       uint64_t data_bytes)
{
    const char *p = f->path;
    if (!json_is_object(v))
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s': header entry is not an object", p, name);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s': unexpected field '%s'", p, name, k);
    }
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape");
    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s': field 'dtype' missing or not a string",
                          p, name);
    if (zfmt__st_dtype_parse(&e->dtype, json_string_value(dt)) < 0)
        return zr_err_set(ZR_EUNSUPPORTED, "%s: tensor '%s': dtype '%s' is not supported (F32, "
                          "BF16, F16, F64, I64, I32, I16, U16, I8, U8)", p, name,
                          json_string_value(dt));
    if (!json_is_array(sh) || json_array_size(sh) > ZCK_MAX_DIMS)
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s': field 'shape' missing, not an array or "
                          "with more than %d dimensions", p, name, ZCK_MAX_DIMS);
    e->ndim = json_array_size(sh);
    e->numel = 1;
    for (size_t d = 0; d < e->ndim; d++) {
        if (json_u64(json_array_get(sh, d), &e->shape[d]) < 0)
            return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s': shape[%zu] is not a non-negative "
                              "integer", p, name, d);
        if (__builtin_mul_overflow(e->numel, e->shape[d], &e->numel) ||
            e->numel > ((uint64_t)1 << 50))
            return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s': shape too large", p, name);
    }
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        json_u64(json_array_get(off, 0), &e->begin) < 0 ||
        json_u64(json_array_get(off, 1), &e->end) < 0)
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s': field 'data_offsets' is not [begin, "
                          "end] of non-negative integers", p, name);
    if (e->begin > e->end || e->end > data_bytes)
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s': data_offsets [%llu, %llu] outside the "
                          "data buffer of %llu bytes", p, name, (unsigned long long)e->begin,
                          (unsigned long long)e->end, (unsigned long long)data_bytes);
    uint64_t want = e->numel * zck_dtype_size(e->dtype);
    if (e->end - e->begin != want)
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s': %llu bytes in data_offsets, but its "
                          "shape and dtype %s make %llu", p, name,
                          (unsigned long long)(e->end - e->begin), json_string_value(dt),
                          (unsigned long long)want);
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const zfmt__st_entry *x = *(const zfmt__st_entry *const *)a;
    const zfmt__st_entry *y = *(const zfmt__st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors must tile the data buffer: no gap, no overlap, nothing after the last. */
static int check_tiling(const zfmt__st_file *f, uint64_t data_bytes)
{
    const zfmt__st_entry **v = malloc((f->n ? f->n : 1) * sizeof *v);
    if (!v)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < f->n; i++)
        v[i] = &f->e[i];
    qsort(v, f->n, sizeof *v, cmp_begin);
    uint64_t at = 0;
    int rc = 0;
    for (size_t i = 0; i < f->n && !rc; i++) {
        if (v[i]->begin > at)
            rc = zr_err_set(ZR_ECORRUPT, "%s: bytes [%llu, %llu) of the data buffer belong to "
                            "no tensor (before '%s')", f->path, (unsigned long long)at,
                            (unsigned long long)v[i]->begin, v[i]->name);
        else if (v[i]->begin < at)
            rc = zr_err_set(ZR_ECORRUPT, "%s: tensors '%s' and '%s' overlap in the data buffer",
                            f->path, v[i - 1]->name, v[i]->name);
        else
            at = v[i]->end;
    }
    if (!rc && at != data_bytes)
        rc = zr_err_set(ZR_ECORRUPT, "%s: %llu bytes after the last tensor (the tensors end at "
                        "%llu, the data buffer at %llu)", f->path,
                        (unsigned long long)(data_bytes - at), (unsigned long long)at,
                        (unsigned long long)data_bytes);
    free(v);
    return rc;
}

int zfmt__st_open(zfmt__st_file **out, const char *path)
{
    zfmt__st_file *f = calloc(1, sizeof *f);
    if (!f)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    f->fd = -1;
    char *text = NULL;
    json_t *root = NULL;
    int rc = 0;
    if (!(f->path = strdup(path))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto fail;
    }
    ZR_TRY_GOTO(zck_open_regular(&f->fd, path, ZCK_FOLLOW, &f->file_bytes), rc, fail);
    if (f->file_bytes < 8) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: %llu bytes: too short for a safetensors file (8-byte "
                        "header length first)", path, (unsigned long long)f->file_bytes);
        goto fail;
    }
    unsigned char len8[8];
    ZR_TRY_GOTO(zfmt__pread_full(f->fd, len8, 8, 0, path), rc, fail);
    uint64_t hlen = 0;
    for (int b = 7; b >= 0; b--)
        hlen = hlen << 8 | len8[b];
    if (hlen > f->file_bytes - 8 || hlen > ST_MAX_HEADER || hlen < 2) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: safetensors header length %llu is impossible (file "
                        "of %llu bytes, header at most %llu)", path, (unsigned long long)hlen,
                        (unsigned long long)f->file_bytes, (unsigned long long)ST_MAX_HEADER);
        goto fail;
    }
    f->data_off = 8 + hlen;
    if (!(text = malloc((size_t)hlen + 1))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto fail;
    }
    ZR_TRY_GOTO(zfmt__pread_full(f->fd, text, (size_t)hlen, 8, path), rc, fail);
    text[hlen] = 0;
    json_error_t jerr;
    if (!(root = json_loadb(text, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr))) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: safetensors header: invalid JSON at column %d: %s",
                        path, jerr.column, jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: safetensors header is not a JSON object", path);
        goto fail;
    }
    size_t cap = json_object_size(root);
    if (!(f->e = calloc(cap ? cap : 1, sizeof *f->e))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto fail;
    }
    uint64_t data_bytes = f->file_bytes - f->data_off;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (!strcmp(k, "__metadata__")) {
            ZR_TRY_GOTO(parse_meta(f, v), rc, fail);
            continue;
        }
        zfmt__st_entry *e = &f->e[f->n];
        if (!(e->name = strdup(k))) {
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
            goto fail;
        }
        f->n++;
        ZR_TRY_GOTO(parse_entry(f, e, k, v, data_bytes), rc, fail);
    }
    ZR_TRY_GOTO(check_tiling(f, data_bytes), rc, fail);
    json_decref(root);
    free(text);
    *out = f;
    return 0;
fail:
    json_decref(root);
    free(text);
    zfmt__st_free(f);
    return rc;
}
