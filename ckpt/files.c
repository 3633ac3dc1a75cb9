/*
 * files.c: the extra files of a checkpoint (zck.h, zck_extra_file): small files such as the
 * run's tokenizer.json recorded beside the shards. The manifest lists them in "files" as
 * {"file": name, "bytes": N, "sha256": hex} (format 1.1), SHA256SUMS has a line for each, the
 * verifier checks them like shards, and zck_ckpt_file_read returns one verified.
 */
#include "zck_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int zck__file_name_check(const char *name, const char *what)
{
    size_t n = strlen(name);
    bool ok = n > 0 && n < 128 && name[0] != '.' && strcmp(name, "manifest.json") &&
              strcmp(name, "SHA256SUMS") && strncmp(name, "shard-", 6);
    for (size_t i = 0; ok && i < n; i++) {
        char c = name[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    }
    return ok ? 0 : zr_err_set(ZR_EINVAL, "%s: '%.128s' is not a name for an extra file of a "
                               "checkpoint ([A-Za-z0-9._-], not hidden, not manifest.json, "
                               "SHA256SUMS or shard-*)", what, name);
}

void zck__files_free(zck__file *f, size_t n)
{
    for (size_t i = 0; f && i < n; i++)
        free(f[i].file);
    free(f);
}

static bool is_hex64(const char *s)
{
    if (strlen(s) != 64)
        return false;
    for (size_t i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

int zck__files_parse(zck__file **out, size_t *n, json_t *arr, const char *what)
{
    size_t k = json_array_size(arr);
    if (!json_is_array(arr) || k > ZCK_MAX_FILES)
        return zr_err_set(ZR_ECORRUPT, "%s: files: expected an array of at most %d entries",
                          what, ZCK_MAX_FILES);
    zck__file *f = calloc(k ? k : 1, sizeof *f);
    if (!f)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < k && !rc; i++) {
        json_t *e = json_array_get(arr, i), *b = json_object_get(e, "bytes");
        const char *name = json_string_value(json_object_get(e, "file"));
        const char *sha = json_string_value(json_object_get(e, "sha256"));
        char ctx[300];
        snprintf(ctx, sizeof ctx, "%s: files[%zu]", what, i);
        if (!name || !sha || !is_hex64(sha) || !json_is_integer(b) || json_integer_value(b) < 0 ||
            (uint64_t)json_integer_value(b) > ZCK_MAX_FILE_BYTES) {
            rc = zr_err_set(ZR_ECORRUPT, "%s: expected {\"file\", \"bytes\" (at most %zu), "
                            "\"sha256\" (64 hex)}", ctx, ZCK_MAX_FILE_BYTES);
            break;
        }
        if (zck__file_name_check(name, ctx) < 0) {
            rc = ZR_ECORRUPT;
            zr_err_set(ZR_ECORRUPT, "%s", zr_err_msg());
            break;
        }
        for (size_t j = 0; j < i && !rc; j++)
            if (!strcmp(f[j].file, name))
                rc = zr_err_set(ZR_ECORRUPT, "%s: '%s' is listed twice", ctx, name);
        if (!rc && !(f[i].file = strdup(name)))
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        f[i].bytes = (uint64_t)json_integer_value(b);
        memcpy(f[i].sha256, sha, 65);
    }
    if (rc) {
        zck__files_free(f, k);
        return rc;
    }
    *out = f;
    *n = k;
    return 0;
}

json_t *zck__files_json(const zck__file *f, size_t n)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++)
        if (json_array_append_new(arr, json_pack("{s:s, s:I, s:s}", "file", f[i].file, "bytes",
                                                 (json_int_t)f[i].bytes, "sha256",
                                                 f[i].sha256))) {
            json_decref(arr);
            return NULL;
        }
    return arr;
}

static void sha_hex(char out[65], const void *data, size_t n)
{
    zck__sha *h;
    if (zck__sha_new(&h) < 0) {
        out[0] = 0;
        return;
    }
    zck__sha_update(h, data, n);
    zck__sha_hex(h, out);
    zck__sha_free(h);
}

int zck__files_write(zck__file **out, const char *staging, const zck_extra_file *f, size_t n)
{
    *out = NULL;
    if (n > ZCK_MAX_FILES)
        return zr_err_set(ZR_EINVAL, "%zu extra files: at most %d", n, ZCK_MAX_FILES);
    if (!n)
        return 0;
    zck__file *d = calloc(n, sizeof *d);
    if (!d)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = zck__file_name_check(f[i].name, "extra file");
        for (size_t j = 0; j < i && !rc; j++)
            if (!strcmp(f[j].name, f[i].name))
                rc = zr_err_set(ZR_EINVAL, "extra file '%s' given twice", f[i].name);
        if (!rc && f[i].bytes > ZCK_MAX_FILE_BYTES)
            rc = zr_err_set(ZR_EINVAL, "extra file '%s': %zu bytes, at most %zu", f[i].name,
                            f[i].bytes, ZCK_MAX_FILE_BYTES);
        char *p = rc ? NULL : zck__path_join(staging, f[i].name);
        if (!rc && !p)
            rc = ZR_ENOMEM;
        if (!rc)
            rc = zck__write_small(p, f[i].data, f[i].bytes);
        free(p);
        if (!rc && !(d[i].file = strdup(f[i].name)))
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        d[i].bytes = f[i].bytes;
        sha_hex(d[i].sha256, f[i].data, f[i].bytes);
        if (!rc && !d[i].sha256[0])
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
    }
    if (rc) {
        zck__files_free(d, n);
        return rc;
    }
    *out = d;
    return 0;
}

int zck_ckpt_file_read(char **out, size_t *n_bytes, const char *ckpt, const char *name)
{
    zck_reader *r;
    ZR_TRY(zck_reader_open(&r, ckpt));
    const char *dir = zck_reader_path(r);
    const zck_manifest *m = zck__reader_manifest(r);
    const zck__file *f = NULL;
    for (size_t i = 0; i < m->nfiles; i++)
        if (!strcmp(m->files[i].file, name))
            f = &m->files[i];
    char *p = f ? zck__path_join(dir, name) : NULL, *buf = NULL;
    size_t n = 0;
    int rc = !f ? zr_err_set(ZR_ENOTFOUND, "%s: the checkpoint has no %s", dir, name)
             : !p ? ZR_ENOMEM : zck__read_small(&buf, &n, p, ZCK_MAX_FILE_BYTES);
    if (rc == ZR_ENOTFOUND && f)
        rc = zr_err_set(ZR_ECORRUPT, "%s: listed in the manifest, missing", p);
    char hex[65];
    if (!rc && n != f->bytes)
        rc = zr_err_set(ZR_ECORRUPT, "%s: %zu bytes, the manifest says %llu", p, n,
                        (unsigned long long)f->bytes);
    if (!rc) {
        sha_hex(hex, buf, n);
        if (strcmp(hex, f->sha256))
            rc = zr_err_set(ZR_ECORRUPT, "%s: SHA-256 %.16s..., the manifest says %.16s...", p,
                            hex, f->sha256);
    }
    free(p);
    zck_reader_free(r);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *n_bytes = n;
    return 0;
}

int zck__files_carry(zck_commit_opts *co, const zck_reader *r)
{
    size_t n = zck_reader_n_files(r);
    co->files = NULL;
    co->n_files = 0;
    if (!n)
        return 0;
    zck_extra_file *f = calloc(n, sizeof *f);
    if (!f)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    co->files = f;
    for (size_t i = 0; i < n; i++) {
        char *data;
        size_t bytes;
        ZR_TRY(zck_ckpt_file_read(&data, &bytes, zck_reader_path(r), zck_reader_file_name(r, i)));
        f[i] = (zck_extra_file){zck_reader_file_name(r, i), data, bytes};
        co->n_files++;
    }
    return 0;
}

void zck__files_carry_free(zck_commit_opts *co)
{
    for (size_t i = 0; i < co->n_files; i++)
        free((void *)co->files[i].data);
    free((void *)co->files);
    co->files = NULL;
    co->n_files = 0;
}
