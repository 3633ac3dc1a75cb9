/*
 * foreign.c: the public entry points of the foreign-checkpoint readers (zfmt.h): which format
 * a path holds, and the dispatch to dcp.c and deepspeed.c.
 */
#include "foreign.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int has_file(const char *dir, const char *name)
{
    char p[8192];
    struct stat st;
    int n = snprintf(p, sizeof p, "%s/%s", dir, name);
    return n > 0 && (size_t)n < sizeof p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The tag that the small regular file dir/name holds (its first line) into tag[cap]; 1 when
 * there is one. A FIFO, a symlink or an empty file gives 0, never a hang. */
static int read_tag_file(const char *dir, const char *name, char *tag, size_t cap)
{
    char p[8192];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p)
        return 0;
    int fd = open(p, O_RDONLY | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, tag, cap - 1) : -1;
    close(fd);
    if (n <= 0)
        return 0;
    tag[n] = 0;
    tag[strcspn(tag, "\r\n")] = 0;
    return 1;
}

/* A save_dir: `latest` names a tag folder that is not one of ours (no manifest.json) and holds
 * DeepSpeed files, or DeepSpeed copied its zero_to_fp32.py beside it (the tag may be missing:
 * verify then says so). */
static int ds_save_dir(const char *path)
{
    char p[8192], tag[256];
    if (!read_tag_file(path, "latest", tag, sizeof tag))
        return 0;
    snprintf(p, sizeof p, "%s/%s", path, tag);
    if (!*tag || strchr(tag, '/') || has_file(p, "manifest.json"))
        return 0;
    return zfmt__ds_files_in(p) || has_file(path, "zero_to_fp32.py");
}

/* A save_dir without `latest` whose `latest_universal` names a universal checkpoint folder */
static int ds_universal_parent(const char *path)
{
    char p[8192], tag[256];
    if ((size_t)snprintf(p, sizeof p, "%s/latest", path) >= sizeof p || access(p, F_OK) == 0 ||
        !read_tag_file(path, "latest_universal", tag, sizeof tag))
        return 0;
    snprintf(p, sizeof p, "%s/%s", path, tag);
    /* a tag naming no folder: opened as one anyway, so that verify says so */
    return *tag && !strchr(tag, '/') && (zfmt__dsu_is(p) || access(p, F_OK) < 0);
}

zfmt_foreign_kind zfmt_foreign_detect(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode) || has_file(path, "manifest.json"))
        return ZFMT_FOREIGN_NONE;
    if (has_file(path, ".metadata"))
        return ZFMT_FOREIGN_DCP;
    if (zfmt__dsu_is(path) || ds_universal_parent(path))
        return ZFMT_FOREIGN_DS_UNIVERSAL;
    if (zfmt__ds_files_in(path) || ds_save_dir(path))
        return ZFMT_FOREIGN_DEEPSPEED;
    return ZFMT_FOREIGN_NONE;
}

const char *zfmt_foreign_name(zfmt_foreign_kind k)
{
    switch (k) {
    case ZFMT_FOREIGN_DCP: return "PyTorch DCP";
    case ZFMT_FOREIGN_DEEPSPEED: return "DeepSpeed ZeRO";
    case ZFMT_FOREIGN_DS_UNIVERSAL: return "DeepSpeed universal";
    case ZFMT_FOREIGN_NONE: break;
    }
    return "none";
}

int zfmt_foreign_verify(zck_report **out, const char *path, const zck_verify_opts *o)
{
    *out = NULL;
    zck_verify_opts dflt = ZCK_VERIFY_OPTS_INIT;
    zfmt_foreign_kind k = zfmt_foreign_detect(path);
    if (k == ZFMT_FOREIGN_NONE)
        return zr_err_set(ZR_ENOTFOUND, "%s: neither a DeepSpeed nor a DCP checkpoint", path);
    zck_report *rep;
    ZR_TRY(zck_report_new(&rep));
    int rc = k == ZFMT_FOREIGN_DCP ? zfmt__dcp_verify(rep, path, o ? o : &dflt, NULL)
                                   : zfmt__ds_verify(rep, path, o ? o : &dflt);
    if (rc) {
        zck_report_free(rep);
        return rc;
    }
    *out = rep;
    return 0;
}

/* ---------------------------------------------------------------- consolidate */

#define COPY_BUF ((size_t)8 << 20)

/* one tensor of the output: its name, dtype, shape and where its bytes come from */
typedef struct {
    const char *name;
    zck_dtype dtype;
    size_t ndim;
    uint64_t shape[ZCK_MAX_DIMS], bytes, at;
    size_t src;   /* DS: the parameter; DCP: the item */
} out_tensor;

/* the safetensors header of ts[0, n) (data offsets from 0), padded to 8 bytes */
static int st_header(char **out, size_t *len, out_tensor *ts, size_t n)
{
    json_t *h = json_object();
    uint64_t at = 0;
    int bad = !h;
    for (size_t i = 0; i < n && !bad; i++) {
        json_t *shape = json_array();
        for (size_t k = 0; k < ts[i].ndim && shape; k++)
            bad |= json_array_append_new(shape, json_integer((json_int_t)ts[i].shape[k]));
        ts[i].at = at;
        at += ts[i].bytes;
        bad |= !shape || json_object_set_new(h, ts[i].name, json_pack("{s:s, s:o, s:[I, I]}",
                  "dtype", zfmt__st_dtype_name(ts[i].dtype), "shape", shape, "data_offsets",
                  (json_int_t)ts[i].at, (json_int_t)at));
    }
    bad |= json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    char *txt = bad ? NULL : zfmt__json_dump(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!txt)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t l = strlen(txt), padded = (l + 7) / 8 * 8;
    char *b = malloc(8 + padded);
    if (!b) {
        free(txt);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    for (int k = 0; k < 8; k++)
        b[k] = (char)((uint64_t)padded >> (8 * k));
    memcpy(b + 8, txt, l);
    memset(b + 8 + l, ' ', padded - l);
    free(txt);
    *out = b;
    *len = 8 + padded;
    return 0;
}

static uint64_t numel_of(size_t nd, const uint64_t *s)
{
    uint64_t n = 1;
    for (size_t k = 0; k < nd; k++)
        n *= s[k];
    return n;
}

/* the tensors of a DeepSpeed checkpoint: its parameters, then the aliases of shared_params */
static int ds_tensors(const zfmt__ds *d, out_tensor **out, size_t *n)
{
    const zfmt__ds_param *p;
    size_t np = zfmt__ds_params(d, &p);
    const zfmt__pv *ms = zfmt__ds_model_states(d), *fz = zfmt__pv_get(ms, "frozen_param_shapes"),
                   *sh = zfmt__pv_get(ms, "shared_params");
    if (fz && fz->kind == ZFMT__PK_DICT && fz->n)
        return zr_err_set(ZR_EUNSUPPORTED, "frozen parameters (frozen_param_shapes) are not "
                          "read yet");
    size_t ns = sh && sh->kind == ZFMT__PK_DICT ? sh->n / 2 : 0;
    out_tensor *t = calloc(np + ns + 1, sizeof *t);
    if (!t)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < np; i++) {
        t[i] = (out_tensor){.name = p[i].name, .dtype = ZCK_F32, .ndim = p[i].ndim,
                            .bytes = p[i].numel * 4, .src = i};
        memcpy(t[i].shape, p[i].shape, sizeof t[i].shape);
    }
    size_t k = np;
    for (size_t s = 0; s < ns; s++) { /* name not stored -> the parameter holding it */
        const zfmt__pv *a = sh->items[2 * s], *b = sh->items[2 * s + 1];
        for (size_t i = 0; a->kind == ZFMT__PK_STR && b->kind == ZFMT__PK_STR && i < np; i++)
            if (!strcmp(p[i].name, b->s)) {
                t[k] = t[i];
                t[k++].name = a->s;
                break;
            }
    }
    *out = t;
    *n = k;
    return 0;
}

static int dcp_tensors(const zfmt__dcp *d, out_tensor **out, size_t *n)
{
    size_t ni = zfmt__dcp_n(d), k = 0;
    out_tensor *t = calloc(ni + 1, sizeof *t);
    if (!t)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < ni; i++) {
        const uint64_t *size;
        int rc = zfmt__dcp_tensor(d, i, &t[k].name, &t[k].dtype, &t[k].ndim, &size);
        if (rc < 0) {
            free(t);
            return rc;
        }
        if (rc == 1)
            continue; /* a bytes item: not a tensor */
        memcpy(t[k].shape, size, t[k].ndim * sizeof *size);
        t[k].bytes = numel_of(t[k].ndim, size) * zck_dtype_size(t[k].dtype);
        t[k++].src = i;
    }
    *out = t;
    *n = k;
    return 0;
}

static int write_ds(const zfmt__ds *d, const out_tensor *t, zfmt__out *o, uint64_t base,
                    float *buf, zfmt__prog *pr)
{
    uint64_t numel = t->bytes / 4, cap = COPY_BUF / 4;
    for (uint64_t at = 0; at < numel; at += cap) {
        uint64_t n = numel - at < cap ? numel - at : cap;
        ZR_TRY(zfmt__ds_read(d, t->src, NULL, at, buf, n));
        ZR_TRY(zfmt__out_pwrite(o, buf, (size_t)n * 4, base + t->at + at * 4));
        zfmt__prog_add(pr, n * 4);
    }
    return 0;
}

/* A problem found by the verification: the first, as an error */
static int first_problem(zck_report *rep, const char *path)
{
    const zck_problem *p = zck_report_get(rep, 0);
    int rc = zr_err_set(ZR_ECORRUPT, "%s: %s: %s: %s (%zu problem%s; zckpt verify lists them)",
                        path, p->file, zck_problem_kind_name(p->kind), p->detail,
                        zck_report_count(rep), zck_report_count(rep) == 1 ? "" : "s");
    return rc;
}

int zfmt__foreign_open(const char *path, int moments, const zck_progress *progress,
                       zfmt__ds **ds, zfmt__dcp **dcp)
{
    *ds = NULL;
    *dcp = NULL;
    zfmt_foreign_kind k = zfmt_foreign_detect(path);
    if (k == ZFMT_FOREIGN_NONE)
        return zr_err_set(ZR_ENOTFOUND, "%s: neither a DeepSpeed nor a DCP checkpoint", path);
    zck_report *rep = NULL;
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    if (progress)
        vo.progress = *progress;
    ZR_TRY(zck_report_new(&rep));
    /* DeepSpeed without the moments: every check but the CRC-32s, then those of the records
     * the weights come from (zckpt verify checks the others) */
    int rc = k == ZFMT_FOREIGN_DCP ? zfmt__dcp_verify(rep, path, &vo, dcp)
                                   : zfmt__ds_open(ds, path, rep, moments, progress);
    if (!rc && *ds && !moments)
        rc = zfmt__ds_check_weights(*ds, rep);
    if (rc >= 0 && zck_report_count(rep))
        rc = first_problem(rep, path);
    zck_report_free(rep);
    if (rc) {
        zfmt__ds_free(*ds);
        zfmt__dcp_free(*dcp);
        *ds = NULL;
        *dcp = NULL;
    }
    return rc;
}

/* The tensors t[i0, i1) as one safetensors file at out_file, hdr first (committed). */
static int write_st(const zfmt__ds *ds, const zfmt__dcp *dcp, out_tensor *t, size_t i0,
                    size_t i1, const char *out_file, void *buf, zfmt__prog *pr)
{
    char *hdr = NULL;
    size_t hl = 0;
    zfmt__out *o = NULL;
    int rc = st_header(&hdr, &hl, t + i0, i1 - i0);
    if (!rc)
        rc = zfmt__out_open(&o, out_file);
    if (!rc)
        rc = zfmt__out_pwrite(o, hdr, hl, 0);
    for (size_t i = i0; !rc && i < i1; i++)
        if (ds) {
            rc = write_ds(ds, &t[i], o, hl, buf, pr);
        } else {
            rc = zfmt__dcp_copy(dcp, t[i].src, o, hl + t[i].at, buf, COPY_BUF);
            zfmt__prog_add(pr, t[i].bytes);
        }
    if (!rc)
        rc = zfmt__out_commit(o);
    zfmt__out_free(o);
    free(hdr);
    return rc;
}

static int is_sharded_file(const char *name)
{
    return !strcmp(name, "model.safetensors") || !strcmp(name, "model.safetensors.index.json") ||
           zfmt__st_is_shard_name(name);
}

/* The shards of t[0, n) into directory dir (made here): file by file, then the index. */
static int write_shards(const zfmt__ds *ds, const zfmt__dcp *dcp, out_tensor *t, size_t n,
                        const char *dir, uint64_t shard_bytes, void *buf, zfmt__prog *pr)
{
    size_t *file = calloc(n + 1, sizeof *file), n_files = 1;
    json_t *wm = json_object();
    uint64_t total = 0;
    int rc = file && wm ? 0 : zr_err_set(ZR_ENOMEM, "out of memory");
    zfmt__st_split sp = {0};
    for (size_t i = 0; !rc && i < n; i++) {
        uint64_t at;
        file[i] = zfmt__st_split_next(&sp, t[i].bytes, shard_bytes, &at);
        total += t[i].bytes;
        n_files = file[i] + 1;
    }
    if (!rc && n_files > ZFMT__MAX_SHARDS)
        rc = zr_err_set(ZR_EINVAL, "consolidate: a shard size of %llu bytes makes %zu files (at "
                        "most %d): choose a larger one", (unsigned long long)shard_bytes, n_files,
                        ZFMT__MAX_SHARDS);
    if (!rc && mkdir(dir, 0755) < 0)
        rc = zr_err_sys(errno, "%s: create", dir);
    char path[4200], name[64];
    for (size_t k = 0, i0 = 0; !rc && k < n_files; k++) {
        size_t i1 = i0;
        while (i1 < n && file[i1] == k)
            i1++;
        zfmt__st_shard_path(name, sizeof name, NULL, k, n_files);
        for (size_t i = i0; !rc && i < i1; i++)
            if (json_object_get(wm, t[i].name))
                rc = zr_err_set(ZR_ECORRUPT, "tensor '%s' occurs twice", t[i].name);
            else if (json_object_set_new(wm, t[i].name, json_string(name)))
                rc = zr_err_set(ZR_ENOMEM, "out of memory");
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (!rc)
            rc = write_st(ds, dcp, t, i0, i1, path, buf, pr);
        i0 = i1;
    }
    if (!rc && n_files > 1) {
        zfmt__out *ix = NULL;
        rc = zfmt__st_index_open(&ix, dir, wm, total);
        if (!rc)
            rc = zfmt__out_commit(ix);
        zfmt__out_free(ix);
    }
    if (!rc)
        rc = zfmt__fsync_dir_of(path);
    json_decref(wm);
    free(file);
    return rc;
}

int zfmt_foreign_consolidate_sharded(const char *path, const char *out, uint64_t shard_bytes,
                                     int force, const zck_progress *progress)
{
    char dir[4096], tmp[4096];
    int exists = 0;
    if (shard_bytes == UINT64_MAX && force)
        return zr_err_set(ZR_EINVAL, "consolidate: force applies to a sharded output only");
    if (shard_bytes != UINT64_MAX) {
        if (!shard_bytes)
            return zr_err_set(ZR_EINVAL, "consolidate: a shard size of 0 bytes: at least 1");
        ZR_TRY(zfmt__dir_tmp(dir, tmp, out));
        ZR_TRY(zfmt__dir_check(dir, force, is_sharded_file, "a sharded consolidate", &exists));
    }
    /* verified first (CRC-32s and coverage): nothing unverified is written */
    zfmt__ds *ds = NULL;
    zfmt__dcp *dcp = NULL;
    int rc = zfmt__foreign_open(path, 0, progress, &ds, &dcp);
    out_tensor *t = NULL;
    size_t n = 0;
    if (!rc)
        rc = ds ? ds_tensors(ds, &t, &n) : dcp_tensors(dcp, &t, &n);
    void *buf = rc ? NULL : malloc(COPY_BUF);
    if (!rc && !buf)
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += t[i].bytes;
    zfmt__prog pr;
    zfmt__prog_init(&pr, progress, "writing", total);
    if (!rc && shard_bytes == UINT64_MAX) {
        rc = write_st(ds, dcp, t, 0, n, out, buf, &pr);
    } else if (!rc) {
        rc = write_shards(ds, dcp, t, n, tmp, shard_bytes, buf, &pr);
        if (!rc)
            rc = zfmt__dir_put(tmp, dir, exists, is_sharded_file);
        if (rc)
            zfmt__dir_remove(tmp, is_sharded_file);
    }
    free(buf);
    free(t);
    zfmt__ds_free(ds);
    zfmt__dcp_free(dcp);
    return rc;
}

int zfmt_foreign_consolidate(const char *path, const char *out_file, const zck_progress *progress)
{
    return zfmt_foreign_consolidate_sharded(path, out_file, UINT64_MAX, 0, progress);
}

/* ---------------------------------------------------------------- inspect */

static json_t *shape_json(size_t nd, const uint64_t *s)
{
    json_t *a = json_array();
    for (size_t k = 0; a && k < nd; k++)
        json_array_append_new(a, json_integer((json_int_t)s[k]));
    return a;
}

static json_t *ds_describe(const zfmt__ds *d, const char *path)
{
    const zfmt__ds_param *p;
    size_t np = zfmt__ds_params(d, &p);
    uint64_t numel = 0;
    json_t *ps = json_array();
    for (size_t i = 0; i < np; i++) {
        numel += p[i].numel;
        json_array_append_new(ps, json_pack("{s:s, s:o, s:I, s:I}", "name", p[i].name, "shape",
                                            shape_json(p[i].ndim, p[i].shape), "numel",
                                            (json_int_t)p[i].numel, "group",
                                            (json_int_t)p[i].group));
    }
    zfmt_foreign_kind k = zfmt__ds_universal(d) ? ZFMT_FOREIGN_DS_UNIVERSAL
                                                : ZFMT_FOREIGN_DEEPSPEED;
    return json_pack("{s:s, s:s, s:s, s:i, s:I, s:b, s:I, s:I, s:I, s:o}", "path", path, "format",
                     zfmt_foreign_name(k), "tag", zfmt__ds_tag(d), "stage", zfmt__ds_stage(d),
                     "world", (json_int_t)zfmt__ds_world(d), "bf16", zfmt__ds_bf16(d), "step",
                     (json_int_t)zfmt__ds_step(d), "parameters", (json_int_t)np, "numel",
                     (json_int_t)numel, "tensors", ps);
}

static json_t *dcp_describe(const zfmt__dcp *d, const char *path)
{
    json_t *ts = json_array(), *bytes = json_array();
    uint64_t numel = 0;
    for (size_t i = 0; i < zfmt__dcp_n(d); i++) {
        const char *fqn;
        zck_dtype dt = ZCK_F32;
        size_t nd = 0;
        const uint64_t *size = NULL;
        int rc = zfmt__dcp_tensor(d, i, &fqn, &dt, &nd, &size);
        if (rc == 1) {
            json_array_append_new(bytes, json_string(fqn));
            continue;
        }
        zr_err_clear();
        json_t *t = json_pack("{s:s, s:s}", "name", fqn, "dtype",
                              rc ? zfmt__dcp_dtype_name(d, i) : zck_dtype_name(dt));
        if (!rc) {
            json_object_set_new(t, "shape", shape_json(nd, size));
            numel += numel_of(nd, size);
        }
        json_object_set_new(t, "chunks", json_integer((json_int_t)zfmt__dcp_chunks(d, i)));
        json_array_append_new(ts, t);
    }
    return json_pack("{s:s, s:s, s:I, s:I, s:o, s:o}", "path", path, "format", "PyTorch DCP",
                     "tensors_count", (json_int_t)json_array_size(ts), "numel",
                     (json_int_t)numel, "tensors", ts, "bytes_items", bytes);
}

int zfmt_foreign_inspect(json_t **out, const char *path)
{
    *out = NULL;
    zfmt_foreign_kind k = zfmt_foreign_detect(path);
    if (k == ZFMT_FOREIGN_NONE)
        return zr_err_set(ZR_ENOTFOUND, "%s: neither a DeepSpeed nor a DCP checkpoint", path);
    zck_report *rep;
    ZR_TRY(zck_report_new(&rep));
    zfmt__ds *ds = NULL;
    zfmt__dcp *dcp = NULL;
    int rc = k == ZFMT_FOREIGN_DCP ? zfmt__dcp_open(&dcp, path, rep)
                                   : zfmt__ds_open(&ds, path, rep, 0, NULL);
    if (rc >= 0 && zck_report_count(rep))
        rc = first_problem(rep, path);
    zck_report_free(rep);
    if (!rc && !(*out = ds ? ds_describe(ds, path) : dcp_describe(dcp, path)))
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    zfmt__ds_free(ds);
    zfmt__dcp_free(dcp);
    return rc;
}
