/*
 * filelist.c: the manifest's list of extra files ("files", format 1.1; zck.h, zck_extra_file):
 * parsing and checking it, writing it, and the rule for their names. files.c writes and reads
 * the files themselves.
 */
#include "zck_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int zck__file_name_check(const char *name, const char *what, int code)
{
    size_t n = strlen(name);
    bool ok = n > 0 && n < 128 && name[0] != '.' && strcmp(name, "manifest.json") &&
              strcmp(name, "SHA256SUMS") && strncmp(name, "shard-", 6);
    for (size_t i = 0; ok && i < n; i++) {
        char c = name[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    }
    return ok ? 0 : zr_err_set(code, "%s: '%.128s' is not a name for an extra file of a "
                               "checkpoint ([A-Za-z0-9._-], not hidden, not manifest.json, "
                               "SHA256SUMS or shard-*)", what, name);
}

void zck__files_free(zck__file *f, size_t n)
{
    for (size_t i = 0; f && i < n; i++)
        free(f[i].file);
    free(f);
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
        if (!name || !sha || !zck__is_sha256_hex(sha) || !json_is_integer(b) || json_integer_value(b) < 0 ||
            (uint64_t)json_integer_value(b) > ZCK_MAX_FILE_BYTES) {
            rc = zr_err_set(ZR_ECORRUPT, "%s: expected {\"file\", \"bytes\" (at most %zu), "
                            "\"sha256\" (64 hex)}", ctx, ZCK_MAX_FILE_BYTES);
            break;
        }
        if ((rc = zck__file_name_check(name, ctx, ZR_ECORRUPT)) < 0)
            break;
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

