/*
 * dcp.c: PyTorch Distributed Checkpoint (torch.distributed.checkpoint) directories, read
 * without Python: `.metadata` (a pickle of Metadata, protocol 4 or 5) through the restricted
 * unpickler, and the items of `__R_N.distcp` files, each a complete torch.save zip at
 * [offset, offset + length) of its file (docs/FORMAT.md, "Foreign checkpoints").
 *
 * What verify checks, cheap first: the metadata parses and names only allowed classes; every
 * tensor's chunks tile its box (inside it, no overlap, no gap: their volumes sum to the
 * tensor's); every chunk and bytes item has a storage entry and no entry is left over; every
 * file named exists and holds its items; no .distcp file is left unnamed; then (unless quick)
 * every item opens as a zip, a tensor item holds one tensor of the chunk's dtype and sizes, and
 * every record's CRC-32 matches. DCP itself records no content hash, so the CRC-32s torch.save
 * writes are the only check of the bytes.
 */
#include "foreign.h"
#include "fmtutil.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DCP_MAX_METADATA ((uint64_t)256 << 20)
#define DCP_PICKLE_BUDGET ((size_t)1 << 30)
#define ITEM_PICKLE_BUDGET ((size_t)16 << 20)

static uint64_t volume(size_t nd, const uint64_t *s);

typedef struct {
    uint64_t off[ZCK_MAX_DIMS], size[ZCK_MAX_DIMS];
    const char *file; /* borrowed from the pickle; NULL: no storage entry */
    uint64_t at, len;
} dcp_chunk;

typedef struct {
    const char *fqn; /* borrowed */
    int is_bytes;
    zck_dtype dtype;
    int dtype_known;
    const char *dtype_name;
    size_t ndim;
    uint64_t size[ZCK_MAX_DIMS];
    dcp_chunk *c;
    size_t nc;
} dcp_item;

struct zfmt__dcp {
    char *dir;
    zfmt__pickle *pk;
    dcp_item *it;
    size_t n;
};

void zfmt__dcp_free(zfmt__dcp *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++)
        free(d->it[i].c);
    free(d->it);
    zfmt__pickle_free(d->pk);
    free(d->dir);
    free(d);
}

static int bad(const char *what, const char *fqn)
{
    char shown[200];
    return zr_err_set(ZR_ECORRUPT, ".metadata: %s%s%s%s", what, fqn ? " ('" : "",
                      fqn ? zr_printable(shown, sizeof shown, fqn) : "", fqn ? "')" : "");
}

/* a tuple of at most ZCK_MAX_DIMS non-negative ints into v[]; -1 otherwise */
static int dims(const zfmt__pv *t, size_t *n, uint64_t *v)
{
    if (!t || t->kind != ZFMT__PK_TUPLE || t->n > ZCK_MAX_DIMS)
        return -1;
    for (size_t k = 0; k < t->n; k++) {
        if (t->items[k]->kind != ZFMT__PK_INT || t->items[k]->i < 0)
            return -1;
        v[k] = (uint64_t)t->items[k]->i;
    }
    *n = t->n;
    return 0;
}

static int tensor_item(dcp_item *it, const zfmt__pv *md)
{
    const zfmt__pv *props = zfmt__pv_attr(md, "properties"), *chunks = zfmt__pv_attr(md, "chunks");
    if (dims(zfmt__pv_attr(md, "size"), &it->ndim, it->size) || !chunks ||
        chunks->kind != ZFMT__PK_LIST || !zfmt__pv_is(props, "torch.distributed.checkpoint."
                                                             "metadata.TensorProperties"))
        return bad("a tensor without size, chunks or properties", it->fqn);
    /* TensorProperties pickles its state as a tuple (dtype, layout, ...) or a dict */
    const zfmt__pv *st = props->state, *dt = NULL;
    if (st && st->kind == ZFMT__PK_TUPLE && st->n)
        dt = st->items[0];
    else
        dt = zfmt__pv_get(st, "dtype");
    if (!dt || dt->kind != ZFMT__PK_GLOBAL || strncmp(dt->s, "torch.", 6))
        return bad("a tensor without a dtype", it->fqn);
    if (volume(it->ndim, it->size) > ((uint64_t)1 << 56))
        return bad("a tensor of more than 2^56 elements", it->fqn);
    it->dtype_name = dt->s + 6;
    it->dtype_known = zfmt__torch_dtype(&it->dtype, it->dtype_name);
    if (chunks->n > ((size_t)1 << 24))
        return bad("more than 2^24 chunks", it->fqn);
    if (!(it->c = calloc(chunks->n ? chunks->n : 1, sizeof *it->c)))
        return zr_err_set(ZR_ENOMEM, ".metadata: out of memory");
    it->nc = chunks->n;
    for (size_t k = 0; k < chunks->n; k++) {
        size_t no = 0, ns = 0;
        const zfmt__pv *ch = chunks->items[k];
        if (dims(zfmt__pv_attr(ch, "offsets"), &no, it->c[k].off) ||
            dims(zfmt__pv_attr(ch, "sizes"), &ns, it->c[k].size) || no != it->ndim ||
            ns != it->ndim)
            return bad("a chunk without offsets and sizes of the tensor's rank", it->fqn);
    }
    return 0;
}

/* the item of fqn (items sorted by fqn) */
static dcp_item *find_item(zfmt__dcp *d, const char *fqn)
{
    size_t lo = 0, hi = d->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(d->it[mid].fqn, fqn);
        if (!c)
            return &d->it[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int cmp_item(const void *a, const void *b)
{
    return strcmp(((const dcp_item *)a)->fqn, ((const dcp_item *)b)->fqn);
}

/* storage_data: MetadataIndex(fqn, offset) -> _StorageInfo(relative_path, offset, length) */
static int storage_entries(zfmt__dcp *d, const zfmt__pv *sd, zck_report *rep)
{
    for (size_t i = 0; i + 1 < sd->n; i += 2) {
        const zfmt__pv *key = sd->items[i], *info = sd->items[i + 1];
        const zfmt__pv *fqn = zfmt__pv_attr(key, "fqn"), *off = zfmt__pv_attr(key, "offset"),
                       *path = zfmt__pv_attr(info, "relative_path");
        int64_t at, len;
        if (!fqn || fqn->kind != ZFMT__PK_STR || !path || path->kind != ZFMT__PK_STR ||
            !zfmt__pv_int(zfmt__pv_attr(info, "offset"), &at) ||
            !zfmt__pv_int(zfmt__pv_attr(info, "length"), &len) || at < 0 || len < 0)
            return bad("a storage entry without fqn, relative_path, offset and length", NULL);
        if (!path->len || strchr(path->s, '/') || !strcmp(path->s, "..") ||
            !strcmp(path->s, "."))
            return bad("a storage entry whose relative_path is not a file name", fqn->s);
        dcp_item *it = find_item(d, fqn->s);
        dcp_chunk *c = NULL;
        uint64_t o[ZCK_MAX_DIMS];
        size_t no = 0;
        if (it && it->is_bytes && (!off || off->kind == ZFMT__PK_NONE))
            c = it->c;
        else if (it && !it->is_bytes && !dims(off, &no, o) && no == it->ndim)
            for (size_t k = 0; k < it->nc && !c; k++)
                if (!memcmp(it->c[k].off, o, no * sizeof *o))
                    c = &it->c[k];
        char shown[200];
        if (!c) {
            ZR_TRY(zck_report_add(rep, ZCK_PROB_COVERAGE, ".metadata", "storage entry for "
                                  "'%s' matches no chunk of the state dict",
                                  zr_printable(shown, sizeof shown, fqn->s)));
            continue;
        }
        if (c->file) {
            ZR_TRY(zck_report_add(rep, ZCK_PROB_COVERAGE, ".metadata", "two storage entries "
                                  "for one chunk of '%s'",
                                  zr_printable(shown, sizeof shown, fqn->s)));
            continue;
        }
        c->file = path->s;
        c->at = (uint64_t)at;
        c->len = (uint64_t)len;
    }
    return 0;
}

int zfmt__dcp_open(zfmt__dcp **out, const char *dir, zck_report *rep)
{
    *out = NULL;
    zfmt__dcp *d = calloc(1, sizeof *d);
    char *path = zck_path_join(dir, ".metadata"), *buf = NULL;
    size_t n = 0;
    int rc = 0;
    if (!d || !path || !(d->dir = strdup(dir)))
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    struct stat st;
    if (!rc && stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > DCP_MAX_METADATA)
        rc = zr_err_set(ZR_ECORRUPT, "%s: %llu bytes, at most %llu read", path,
                        (unsigned long long)st.st_size, (unsigned long long)DCP_MAX_METADATA);
    if (!rc)
        rc = zfmt__read_file(&buf, &n, path);
    if (!rc)
        rc = zfmt__pickle_load(&d->pk, buf, n, path, DCP_PICKLE_BUDGET);
    free(buf);
    free(path);
    const zfmt__pv *root = rc ? NULL : zfmt__pickle_root(d->pk), *sdm = NULL, *sd = NULL;
    if (!rc && (!zfmt__pv_is(root, "torch.distributed.checkpoint.metadata.Metadata") ||
                !(sdm = zfmt__pv_attr(root, "state_dict_metadata")) || sdm->kind != ZFMT__PK_DICT ||
                !(sd = zfmt__pv_attr(root, "storage_data")) || sd->kind != ZFMT__PK_DICT))
        rc = bad("not a DCP Metadata with state_dict_metadata and storage_data", NULL);
    if (!rc && !(d->it = calloc(sdm->n / 2 + 1, sizeof *d->it)))
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i + 1 < sdm->n; i += 2) {
        dcp_item *it = &d->it[d->n++];
        const zfmt__pv *k = sdm->items[i], *v = sdm->items[i + 1];
        if (k->kind != ZFMT__PK_STR)
            rc = bad("a state-dict key that is not a string", NULL);
        else if ((it->fqn = k->s), zfmt__pv_is(v, "torch.distributed.checkpoint.metadata."
                                                  "BytesStorageMetadata")) {
            it->is_bytes = 1;
            it->nc = 1;
            if (!(it->c = calloc(1, sizeof *it->c)))
                rc = zr_err_set(ZR_ENOMEM, "out of memory");
        } else if (zfmt__pv_is(v, "torch.distributed.checkpoint.metadata.TensorStorageMetadata"))
            rc = tensor_item(it, v);
        else
            rc = bad("an entry that is neither a tensor nor bytes", k->s);
    }
    if (!rc) {
        qsort(d->it, d->n, sizeof *d->it, cmp_item);
        for (size_t i = 1; i < d->n && !rc; i++)
            if (!strcmp(d->it[i - 1].fqn, d->it[i].fqn))
                rc = bad("two entries of one name", d->it[i].fqn);
    }
    if (!rc)
        rc = storage_entries(d, sd, rep);
    if (rc) {
        zfmt__dcp_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

/* ---------------------------------------------------------------- coverage */

static uint64_t volume(size_t nd, const uint64_t *s)
{
    uint64_t v = 1;
    for (size_t k = 0; k < nd; k++)
        v = s[k] && v > UINT64_MAX / s[k] ? UINT64_MAX : v * s[k];
    return v;
}

static int overlap(size_t nd, const dcp_chunk *a, const dcp_chunk *b)
{
    for (size_t k = 0; k < nd; k++)
        if (a->off[k] >= b->off[k] + b->size[k] || b->off[k] >= a->off[k] + a->size[k])
            return 0;
    return 1;
}

static int item_coverage(const dcp_item *it, zck_report *rep)
{
    char shown[200], s1[96];
    zr_printable(shown, sizeof shown, it->fqn);
    if (it->is_bytes)
        return it->c[0].file ? 0 : zck_report_add(rep, ZCK_PROB_COVERAGE, ".metadata", "bytes "
                                                  "item '%s' has no storage entry", shown);
    uint64_t sum = 0, whole = volume(it->ndim, it->size);
    for (size_t k = 0; k < it->nc; k++) {
        const dcp_chunk *c = &it->c[k];
        for (size_t j = 0; j < it->ndim; j++)
            if (c->off[j] > it->size[j] || c->size[j] > it->size[j] - c->off[j]) {
                zfmt__shape_str(s1, sizeof s1, it->ndim, c->off);
                return zck_report_add(rep, ZCK_PROB_COVERAGE, ".metadata", "'%s': the chunk at "
                                      "%s reaches outside the tensor", shown, s1);
            }
        if (!c->file) {
            zfmt__shape_str(s1, sizeof s1, it->ndim, c->off);
            ZR_TRY(zck_report_add(rep, ZCK_PROB_COVERAGE, ".metadata", "'%s': the chunk at %s "
                                  "has no storage entry", shown, s1));
        }
        uint64_t v = volume(it->ndim, c->size);
        sum = sum > UINT64_MAX - v ? UINT64_MAX : sum + v;
        for (size_t j = 0; j < k && it->nc <= 4096; j++)
            if (v && volume(it->ndim, it->c[j].size) && overlap(it->ndim, c, &it->c[j])) {
                zfmt__shape_str(s1, sizeof s1, it->ndim, c->off);
                return zck_report_add(rep, ZCK_PROB_COVERAGE, ".metadata", "'%s': the chunk at "
                                      "%s overlaps another", shown, s1);
            }
    }
    if (sum != whole)
        return zck_report_add(rep, ZCK_PROB_COVERAGE, ".metadata", "'%s': its chunks cover "
                              "%llu of its %llu elements (a chunk missing from the metadata?)",
                              shown, (unsigned long long)sum, (unsigned long long)whole);
    return 0;
}

/* ---------------------------------------------------------------- files and items */

typedef struct {
    char name[256];
    uint64_t need; /* bytes the items reach */
    int fd;
    uint64_t size;
} dcp_file;

static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const dcp_file *)a)->name, ((const dcp_file *)b)->name);
}

static dcp_file *file_of(dcp_file *f, size_t n, const char *name)
{
    dcp_file key;
    snprintf(key.name, sizeof key.name, "%s", name);
    return bsearch(&key, f, n, sizeof *f, cmp_file);
}

/* The files the entries name: each opened (missing, short: problems), *out sorted by name. */
static int open_files(const zfmt__dcp *d, dcp_file **out, size_t *nf, zck_report *rep)
{
    size_t cap = 0;
    for (size_t i = 0; i < d->n; i++)
        cap += d->it[i].nc;
    dcp_file *f = calloc(cap + 1, sizeof *f);
    if (!f)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < d->n; i++)
        for (size_t k = 0; k < d->it[i].nc; k++) {
            const dcp_chunk *c = &d->it[i].c[k];
            if (!c->file)
                continue;
            dcp_file *x = NULL;
            for (size_t j = 0; j < n && !x; j++) /* few files: linear */
                if (!strcmp(f[j].name, c->file))
                    x = &f[j];
            if (!x) {
                x = &f[n++];
                snprintf(x->name, sizeof x->name, "%s", c->file);
                x->fd = -1;
            }
            x->need = c->at + c->len > x->need ? c->at + c->len : x->need;
        }
    qsort(f, n, sizeof *f, cmp_file);
    for (size_t j = 0; j < n; j++) {
        char *p = zck_path_join(d->dir, f[j].name);
        if (!p)
            return zr_err_set(ZR_ENOMEM, "out of memory");
        int rc = zck_open_regular(&f[j].fd, p, ZCK_NOFOLLOW, &f[j].size);
        free(p);
        if (rc == ZR_ENOTFOUND)
            ZR_TRY(zck_report_add(rep, ZCK_PROB_MISSING, f[j].name, "named by .metadata, "
                                  "absent"));
        else if (rc)
            ZR_TRY(zck_report_add(rep, ZCK_PROB_IO, f[j].name, "%s", zr_err_msg()));
        else if (f[j].size < f[j].need)
            ZR_TRY(zck_report_add(rep, ZCK_PROB_TRUNCATED, f[j].name, "%llu bytes, its items "
                                  "reach byte %llu", (unsigned long long)f[j].size,
                                  (unsigned long long)f[j].need));
        zr_err_clear();
    }
    *out = f;
    *nf = n;
    return 0;
}

static void close_files(dcp_file *f, size_t n)
{
    for (size_t j = 0; f && j < n; j++)
        if (f[j].fd >= 0)
            close(f[j].fd);
    free(f);
}

/* .distcp files in the directory that no entry names */
static int unlisted(const zfmt__dcp *d, dcp_file *f, size_t nf, zck_report *rep)
{
    DIR *dh = opendir(d->dir);
    if (!dh)
        return zr_err_sys(errno, "%s", d->dir);
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(dh))) {
        size_t l = strlen(e->d_name);
        if (l > 7 && !strcmp(e->d_name + l - 7, ".distcp") && !file_of(f, nf, e->d_name))
            rc = zck_report_add(rep, ZCK_PROB_UNLISTED, e->d_name, "a .distcp file that "
                                ".metadata does not name (another save's?)");
    }
    closedir(dh);
    return rc;
}

/* The tensor of a tensor item's zip (its data.pkl), checked against the chunk. */
int zfmt__dcp_item_tensor(zfmt__zip *z, const char *fqn, zck_dtype dt, size_t nd,
                          const uint64_t *size, zfmt__pickle **pk, const zfmt__pv **t)
{
    const zfmt__zip_entry *e = zfmt__zip_find(z, "data.pkl");
    char *b = NULL, shown[200];
    zr_printable(shown, sizeof shown, fqn);
    if (!e)
        return zr_err_set(ZR_ECORRUPT, "%s: the item of '%s' has no data.pkl", z->path, shown);
    ZR_TRY(zfmt__zip_slurp(z, e, ITEM_PICKLE_BUDGET, &b));
    int rc = zfmt__pickle_load(pk, b, (size_t)e->size, z->path, ITEM_PICKLE_BUDGET);
    free(b);
    ZR_TRY(rc);
    *t = zfmt__pickle_root(*pk);
    const zfmt__pv *v = *t;
    if (v->kind != ZFMT__PK_TENSOR || !v->dtype_known || v->dtype != dt || v->ndim != nd ||
        memcmp(v->size, size, nd * sizeof *size))
        return zr_err_set(ZR_ECORRUPT, "%s: the item of '%s' is not the chunk .metadata "
                          "describes", z->path, shown);
    const zfmt__zip_entry *se;
    char rec[128];
    snprintf(rec, sizeof rec, "data/%s", v->storage->s);
    if (!(se = zfmt__zip_find(z, rec)) ||
        se->size != (uint64_t)v->storage->i * zck_dtype_size(v->dtype))
        return zr_err_set(ZR_ECORRUPT, "%s: the item of '%s' lacks its storage record or its "
                          "size differs", z->path, shown);
    return 0;
}

static int check_item(const zfmt__dcp *d, const dcp_item *it, const dcp_chunk *c, dcp_file *f,
                      zck_report *rep, uint64_t *hashed)
{
    zfmt__zip *z = NULL;
    char where[512];
    snprintf(where, sizeof where, "%s/%s", d->dir, c->file);
    int rc = zfmt__zip_open_slice(&z, f->fd, where, c->at, c->len);
    zfmt__pickle *pk = NULL;
    const zfmt__pv *t;
    for (size_t r = 0; !rc && r < z->n; r++) { /* the bytes first: damage is a CRC mismatch */
        rc = zfmt__zip_check_crc(z, &z->e[r]);
        *hashed += z->e[r].size;
    }
    if (!rc && !it->is_bytes && it->dtype_known)
        rc = zfmt__dcp_item_tensor(z, it->fqn, it->dtype, it->ndim, c->size, &pk, &t);
    zfmt__pickle_free(pk);
    zfmt__zip_free(z);
    if (rc == ZR_ECORRUPT) {
        char shown[200];
        const char *m = zr_err_msg();
        rc = zck_report_add(rep, strstr(m, "CRC-32") ? ZCK_PROB_HASH
                                 : strstr(m, "truncated") ? ZCK_PROB_TRUNCATED : ZCK_PROB_IO,
                            c->file, "item '%s' at byte %llu: %s",
                            zr_printable(shown, sizeof shown, it->fqn),
                            (unsigned long long)c->at, zr_err_msg());
    }
    return rc;
}

int zfmt__dcp_verify(zck_report *rep, const char *dir, const zck_verify_opts *o,
                     zfmt__dcp **keep)
{
    zfmt__dcp *d = NULL;
    if (keep)
        *keep = NULL;
    int rc = zfmt__dcp_open(&d, dir, rep);
    if (rc == ZR_ECORRUPT || rc == ZR_ENOTFOUND) {
        int unsafe = strstr(zr_err_msg(), "not allowed") != NULL;
        rc = zck_report_add(rep, unsafe ? ZCK_PROB_UNSAFE : ZCK_PROB_MANIFEST, ".metadata", "%s",
                            zr_err_msg());
        return rc;
    }
    ZR_TRY(rc);
    for (size_t i = 0; i < d->n && !rc; i++)
        rc = item_coverage(&d->it[i], rep);
    dcp_file *f = NULL;
    size_t nf = 0;
    if (!rc)
        rc = open_files(d, &f, &nf, rep);
    if (!rc)
        rc = unlisted(d, f, nf, rep);
    uint64_t hashed = 0;
    for (size_t i = 0; !rc && !o->quick && i < d->n; i++)
        for (size_t k = 0; !rc && k < d->it[i].nc; k++) {
            const dcp_chunk *c = &d->it[i].c[k];
            dcp_file *x = c->file ? file_of(f, nf, c->file) : NULL;
            if (x && x->fd >= 0 && x->size >= c->at + c->len)
                rc = check_item(d, &d->it[i], c, x, rep, &hashed);
            if (o->progress.fn)
                o->progress.fn(o->progress.ctx, "checking items", i + 1, d->n);
        }
    zck_report_add_bytes_hashed(rep, hashed);
    close_files(f, nf);
    if (keep && !rc)
        *keep = d;
    else
        zfmt__dcp_free(d);
    return rc;
}

/* ---------------------------------------------------------------- reading the tensors */

size_t zfmt__dcp_n(const zfmt__dcp *d) { return d->n; }

int zfmt__dcp_tensor(const zfmt__dcp *d, size_t i, const char **fqn, zck_dtype *dt,
                     size_t *ndim, const uint64_t **size)
{
    const dcp_item *it = &d->it[i];
    *fqn = it->fqn;
    if (it->is_bytes)
        return 1;
    if (!it->dtype_known)
        return zr_err_set(ZR_EUNSUPPORTED, "%s: '%s' is %s, a dtype zero does not read", d->dir,
                          it->fqn, it->dtype_name);
    *dt = it->dtype;
    *ndim = it->ndim;
    *size = it->size;
    return 0;
}

/* chunk c of item it into o, the tensor starting at byte base of o (row-major); or, with o
 * NULL, into memory at mem (the whole tensor, row-major) */
static int copy_chunk(const zfmt__dcp *d, const dcp_item *it, const dcp_chunk *c, zfmt__out *o,
                      uint64_t base, char *buf, size_t cap, char *mem)
{
    char *path = zck_path_join(d->dir, c->file);
    int fd = -1;
    if (!path)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = zck_open_regular(&fd, path, ZCK_NOFOLLOW, NULL);
    zfmt__zip *z = NULL;
    zfmt__pickle *pk = NULL;
    const zfmt__pv *t = NULL;
    if (!rc)
        rc = zfmt__zip_open_slice(&z, fd, path, c->at, c->len);
    if (!rc)
        rc = zfmt__dcp_item_tensor(z, it->fqn, it->dtype, it->ndim, c->size, &pk, &t);
    size_t nd = it->ndim, es = zck_dtype_size(it->dtype);
    /* the item's tensor row-major contiguous (DCP clones what it saves) */
    uint64_t want = 1;
    for (size_t k = nd; !rc && k-- > 0;) {
        if (c->size[k] > 1 && (uint64_t)t->stride[k] != want)
            rc = zr_err_set(ZR_EUNSUPPORTED, "%s: the item of '%s' is not contiguous", path,
                            it->fqn);
        want *= c->size[k];
    }
    const zfmt__zip_entry *e = NULL;
    if (!rc) {
        char rec[128];
        snprintf(rec, sizeof rec, "data/%s", t->storage->s);
        e = zfmt__zip_find(z, rec);
    }
    /* runs: the innermost dimensions the chunk covers whole are contiguous in the output too */
    size_t j = nd ? nd - 1 : 0;
    uint64_t run = nd ? c->size[j] : 1, outer = 1, stride_out[ZCK_MAX_DIMS];
    while (nd && j > 0 && c->size[j] == it->size[j]) {
        j--;
        run *= c->size[j];
    }
    for (size_t k = nd, s = 1; k-- > 0;) {
        stride_out[k] = s;
        s *= it->size[k];
    }
    for (size_t k = 0; k < j; k++)
        outer *= c->size[k];
    uint64_t idx[ZCK_MAX_DIMS] = {0};
    for (uint64_t q = 0; !rc && q < outer && run; q++) {
        uint64_t at = 0;
        for (size_t k = 0; k < nd; k++)
            at += (c->off[k] + (k < j ? idx[k] : 0)) * stride_out[k];
        for (uint64_t done = 0; !rc && done < run;) {
            size_t n = (size_t)((run - done) * es < cap ? (run - done) * es : cap / es * es);
            char *dst = o ? buf : mem + (at + done) * es;
            rc = zfmt__zip_read(z, e, ((uint64_t)t->i + q * run + done) * es, dst, n);
            if (!rc && o)
                rc = zfmt__out_pwrite(o, buf, n, base + (at + done) * es);
            done += n / es;
        }
        for (size_t k = j; k-- > 0;) { /* the next outer index */
            if (++idx[k] < c->size[k])
                break;
            idx[k] = 0;
        }
    }
    zfmt__pickle_free(pk);
    zfmt__zip_free(z);
    if (fd >= 0)
        close(fd);
    free(path);
    return rc;
}

int zfmt__dcp_copy(const zfmt__dcp *d, size_t i, zfmt__out *o, uint64_t base, void *buf,
                   size_t cap)
{
    const dcp_item *it = &d->it[i];
    for (size_t k = 0; k < it->nc; k++)
        ZR_TRY(copy_chunk(d, it, &it->c[k], o, base, buf, cap, NULL));
    return 0;
}

int zfmt__dcp_read(const zfmt__dcp *d, size_t i, void *dst)
{
    const dcp_item *it = &d->it[i];
    for (size_t k = 0; k < it->nc; k++)
        ZR_TRY(copy_chunk(d, it, &it->c[k], NULL, 0, NULL, SIZE_MAX, dst));
    return 0;
}

int zfmt__dcp_value(const zfmt__dcp *d, size_t i, zfmt__pickle **pk)
{
    const dcp_item *it = &d->it[i];
    *pk = NULL;
    if (!it->is_bytes || !it->c[0].file)
        return zr_err_set(ZR_EINVAL, "%s: '%s' is not a bytes item with its bytes", d->dir,
                          it->fqn);
    char *path = zck_path_join(d->dir, it->c[0].file);
    int fd = -1;
    if (!path)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = zck_open_regular(&fd, path, ZCK_NOFOLLOW, NULL);
    zfmt__zip *z = NULL;
    const zfmt__zip_entry *e = NULL;
    char *b = NULL;
    if (!rc)
        rc = zfmt__zip_open_slice(&z, fd, path, it->c[0].at, it->c[0].len);
    if (!rc && !(e = zfmt__zip_find(z, "data.pkl")))
        rc = zr_err_set(ZR_ECORRUPT, "%s: the item of '%s' has no data.pkl", path, it->fqn);
    if (!rc)
        rc = zfmt__zip_slurp(z, e, ITEM_PICKLE_BUDGET, &b);
    if (!rc)
        rc = zfmt__pickle_load(pk, b, (size_t)e->size, path, ITEM_PICKLE_BUDGET);
    free(b);
    zfmt__zip_free(z);
    if (fd >= 0)
        close(fd);
    free(path);
    return rc;
}

long zfmt__dcp_find(const zfmt__dcp *d, const char *fqn)
{
    const dcp_item *it = find_item((zfmt__dcp *)d, fqn);
    return it ? (long)(it - d->it) : -1;
}

size_t zfmt__dcp_chunks(const zfmt__dcp *d, size_t i) { return d->it[i].nc; }
const char *zfmt__dcp_dtype_name(const zfmt__dcp *d, size_t i) { return d->it[i].dtype_name; }
