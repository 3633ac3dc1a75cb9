/*
 * files.c: the extra files of a checkpoint (zck.h, zck_extra_file): small files such as the
 * run's tokenizer.json recorded beside the shards. The manifest lists them in "files" as
 * {"file": name, "bytes": N, "sha256": hex} (format 1.1), SHA256SUMS has a line for each, the
 * verifier checks them like shards, and zck_ckpt_file_read returns one verified. The manifest's
 * list itself is parsed and written by filelist.c.
 */
#include "zck_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

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
        rc = zck__file_name_check(f[i].name, "extra file", ZR_EINVAL);
        for (size_t j = 0; j < i && !rc; j++)
            if (!strcmp(f[j].name, f[i].name))
                rc = zr_err_set(ZR_EINVAL, "extra file '%s' given twice", f[i].name);
        if (!rc && f[i].bytes > ZCK_MAX_FILE_BYTES)
            rc = zr_err_set(ZR_EINVAL, "extra file '%s': %zu bytes, at most %zu", f[i].name,
                            f[i].bytes, ZCK_MAX_FILE_BYTES);
        char *p = rc ? NULL : zck_path_join(staging, f[i].name);
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

/* Extra file name of the checkpoint r has open, read and checked against its manifest. */
static int file_read(char **out, size_t *n_bytes, const zck_reader *r, const char *name)
{
    const char *dir = zck_reader_path(r);
    const zck_manifest *m = zck__reader_manifest(r);
    const zck__file *f = NULL;
    for (size_t i = 0; i < m->nfiles; i++)
        if (!strcmp(m->files[i].file, name))
            f = &m->files[i];
    char *p = f ? zck_path_join(dir, name) : NULL, *buf = NULL;
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
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *n_bytes = n;
    return 0;
}

int zck_ckpt_file_read(char **out, size_t *n_bytes, const char *ckpt, const char *name)
{
    zck_reader *r;
    ZR_TRY(zck_reader_open(&r, ckpt));
    int rc = file_read(out, n_bytes, r, name);
    zck_reader_free(r);
    return rc;
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
        ZR_TRY(file_read(&data, &bytes, r, zck_reader_file_name(r, i)));
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
