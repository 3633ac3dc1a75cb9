/*
 * test_manifest.c: the manifest validator, data-driven. A real checkpoint's manifest is mutated
 * one field at a time (set or delete through a JSON pointer); each case names the error code
 * and text it must produce. Also: version rules end to end, and the shard JSON that ranks
 * exchange (the fuzz corpus is replayed by test_fuzz.c).
 */
#include "ckutil.h"
#include "zck_int.h"

#include <jansson.h>

typedef struct {
    const char *path;   /* JSON pointer; "" is the root */
    const char *value;  /* JSON text to set, NULL to delete */
    int code;           /* 0: must be accepted */
    const char *text;
} mutation;

static const mutation cases[] = {
    {"/format", "\"zzz\"", ZR_ECORRUPT, "format 'zzz' is not 'zckpt'"},
    {"/version", "\"2.0\"", ZR_EVERSION, "format version 2.0 is not supported: this reader "
                                         "reads version 1.x"},
    {"/version", "\"1\"", ZR_ECORRUPT, "is not MAJOR.MINOR"},
    {"/version", "\"1.7\"", 0, NULL},
    {"/version", "\" 1.0\"", ZR_ECORRUPT, "is not MAJOR.MINOR"},
    {"/version", "\"+1.0\"", ZR_ECORRUPT, "is not MAJOR.MINOR"},
    {"/version", "\"01.0\"", ZR_ECORRUPT, "is not MAJOR.MINOR"},
    {"/version", "\"1.0.1\"", ZR_ECORRUPT, "is not MAJOR.MINOR"},
    {"/version", "\"99999999999.0\"", ZR_ECORRUPT, "is not MAJOR.MINOR"},
    {"/some_future_field", "{\"x\":[1,2]}", 0, NULL},
    {"/shards/0/some_future_field", "1", 0, NULL},
    {"/step", "-1", ZR_ECORRUPT, "field 'step': -1 out of range"},
    {"/step", "\"5\"", ZR_ECORRUPT, "field 'step': expected an integer, found a string"},
    {"/step", "1.5", ZR_ECORRUPT, "expected an integer, found a real number"},
    {"/world_size", "0", ZR_ECORRUPT, "field 'world_size': 0 out of range"},
    {"/world_size", "3", ZR_ECORRUPT, "2 shards listed for world size 3"},
    {"/zero_stage", "4", ZR_ECORRUPT, "field 'zero_stage': 4 out of range [0, 3]"},
    {"/file_align", "512", ZR_ECORRUPT, "field 'file_align'"},
    {"/partition_align", "0", ZR_ECORRUPT, "field 'partition_align'"},
    {"/model", "[]", ZR_ECORRUPT, "field 'model': expected an object, found an array"},
    {"/training", NULL, ZR_ECORRUPT, "missing field 'training'"},
    {"/created", "7", ZR_ECORRUPT, "field 'created': expected a string"},
    {"/dtypes/f32", "8", ZR_ECORRUPT, "'f32' is 8 bytes, expected 4"},
    {"/dtypes/bf16", NULL, ZR_ECORRUPT, "dtype 'bf16' missing from the dtypes table"},
    {"/states/0/dtype", "\"f128\"", ZR_ECORRUPT, "unknown dtype 'f128'"},
    {"/states/1/name", "\"param\"", ZR_ECORRUPT, "state 'param' declared twice"},
    {"/states/0/name", "\"a/b\"", ZR_ECORRUPT, "state name 'a/b'"},
    {"/states", "[]", ZR_ECORRUPT, "field 'states': empty"},
    {"/groups", "[]", ZR_ECORRUPT, "field 'groups': empty"},
    {"/groups/0/numel", "101", ZR_ECORRUPT, "numel 101, but its tensors hold 100 elements"},
    {"/groups/0/numel", "9223372036854775807", ZR_ECORRUPT, "field 'numel'"},
    {"/groups/0/numel", "123456789012345678901234567890", ZR_ECORRUPT, "invalid JSON"},
    {"/groups/0/tensors/0/shape", "[-1]", ZR_ECORRUPT, "non-negative integers"},
    {"/groups/0/tensors/0/shape", "[1,1,1,1,1,1,1,1,1]", ZR_ECORRUPT, "9 dimensions, at most 8"},
    {"/groups/0/tensors/0/offset", "3", ZR_ECORRUPT, "offset 3, expected 0"},
    {"/groups/0/tensors/1/name", "\"h0.w\"", ZR_ECORRUPT, "tensor 'h0.w' declared twice"},
    {"/groups/1/name", "\"h0\"", ZR_ECORRUPT, "group 'h0' declared twice"},
    {"/groups/1/tensors/0/dtype", "\"q4\"", ZR_ECORRUPT, "groups[1].tensors[0]: unknown dtype"},
    {"/shards", "[]", ZR_ECORRUPT, "0 shards listed for world size 2"},
    {"/shards/0", "7", ZR_ECORRUPT, "shards[0]: expected an object, found an integer"},
    {"/shards/0/file", "\"../etc/passwd\"", ZR_ECORRUPT, "not a plain file name"},
    {"/shards/0/file", "\"/etc/passwd\"", ZR_ECORRUPT, "not a plain file name"},
    {"/shards/0/file", "\"sub/dir.bin\"", ZR_ECORRUPT, "not a plain file name"},
    {"/shards/0/file", "\"..\"", ZR_ECORRUPT, "not a plain file name"},
    {"/shards/0/file", "\"manifest.json\"", ZR_ECORRUPT, "not a plain file name"},
    {"/shards/0/file", "\"\"", ZR_ECORRUPT, "not a plain file name"},
    {"/shards/1/file", "\"shard-00000-of-00002.bin\"", ZR_ECORRUPT, "listed twice"},
    {"/shards/1/rank", "0", ZR_ECORRUPT, "rank 0 listed twice"},
    {"/shards/0/rank", "5", ZR_ECORRUPT, "rank 5 is not below the world size"},
    {"/shards/0/sha256", "\"XYZ\"", ZR_ECORRUPT, "expected 64 lowercase hex digits"},
    {"/shards/0/bytes", "1", ZR_ECORRUPT, "beyond the file's 1 bytes"},
    {"/shards/0/bytes", "1048576", ZR_ECORRUPT, "listed size 1048576 bytes, but its extents"},
    {"/shards/0/bytes", "-4096", ZR_ECORRUPT, "field 'bytes'"},
    {"/shards/0/extents/0/offset", "100", ZR_ECORRUPT, "offset 100 is not a multiple of 4096"},
    {"/shards/0/extents/0/offset", "9223372036854775807", ZR_ECORRUPT, "field 'offset'"},
    {"/shards/0/extents/0/offset", "1048576", ZR_ECORRUPT, "beyond the file's"},
    {"/shards/0/extents/0/count", "0", ZR_ECORRUPT, "field 'count': 0 out of range"},
    {"/shards/0/extents/0/count", "1000", ZR_ECORRUPT, "outside group 'h0' of 100 elements"},
    {"/shards/0/extents/0/group", "9", ZR_ECORRUPT, "group 9 does not exist"},
    {"/shards/0/extents/0/state", "9", ZR_ECORRUPT, "state 9 does not exist"},
    {"/shards/0/extents/0/start", "1", ZR_ECORRUPT, "elements [0, 1) stored in no shard"},
    {"/shards/1/extents/0", NULL, ZR_ECORRUPT, "stored in no shard"},
    {"/shards/0/extents/1/offset", "0", ZR_ECORRUPT, "overlap in the file"},
    {"/shards/0/extents/0/start", "\"0\"", ZR_ECORRUPT, "extents[0]: field 'start': expected "
                                                       "an integer"},
    {"", "[]", ZR_ECORRUPT, "expected a JSON object at the top, found an array"},
};

/* Walk a JSON pointer to the parent of its last token. */
static json_t *walk(json_t *root, const char *path, char *last)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    char *slash = strrchr(buf, '/');
    ZT_CHECK(slash);
    snprintf(last, 64, "%s", slash + 1);
    *slash = 0;
    json_t *cur = root;
    for (char *save = NULL, *tok = strtok_r(buf, "/", &save); tok;
         tok = strtok_r(NULL, "/", &save))
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok))
                                 : json_object_get(cur, tok);
    ZT_CHECK(cur);
    return cur;
}

static char *mutate(const char *base, const mutation *mu)
{
    json_error_t e;
    json_t *root = json_loads(base, 0, &e);
    ZT_CHECK(root);
    json_t *val = NULL;
    if (mu->value) {
        val = json_loads(mu->value, JSON_DECODE_ANY, &e);
        if (!val) { /* not representable (a number too big): splice the text in by hand */
            json_decref(root);
            return NULL;
        }
    }
    if (!*mu->path) {
        json_decref(root);
        root = val;
    } else {
        char last[64];
        json_t *parent = walk(root, mu->path, last);
        if (json_is_array(parent)) {
            if (val)
                ZT_CHECK(json_array_set_new(parent, (size_t)atoi(last), val) == 0);
            else
                ZT_CHECK(json_array_remove(parent, (size_t)atoi(last)) == 0);
        } else if (val)
            ZT_CHECK(json_object_set_new(parent, last, val) == 0);
        else
            ZT_CHECK(json_object_del(parent, last) == 0);
    }
    char *txt = json_dumps(root, JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
    json_decref(root);
    return txt;
}

static char *base_manifest(char **ckpt)
{
    const uint64_t sizes[] = {100, 7};
    zck_layout *L = zt_layout(2, sizes);
    *ckpt = zt_save("run", L, 2, 5, 1, 0);
    zck_layout_free(L);
    char path[512], *txt;
    snprintf(path, sizeof path, "%s/manifest.json", *ckpt);
    ZT_OK(zck__read_small(&txt, NULL, path, 1 << 24));
    return txt;
}

ZT_TEST(manifest_mutations)
{
    char *ckpt, *base = base_manifest(&ckpt);
    const char *corpus = getenv("ZT_WRITE_CORPUS"); /* regenerate fuzz seeds when set */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const mutation *mu = &cases[i];
        char *txt = mutate(base, mu);
        if (!txt) { /* value not representable by Jansson: replace the number in the text */
            const char *key = strrchr(mu->path, '/') + 1;
            char pat[80];
            snprintf(pat, sizeof pat, "\"%s\": ", key);
            char *at = strstr(base, pat);
            ZT_CHECK(at);
            at += strlen(pat);
            size_t pre = (size_t)(at - base), digits = strspn(at, "0123456789");
            txt = malloc(strlen(base) + strlen(mu->value) + 1);
            memcpy(txt, base, pre);
            strcpy(txt + pre, mu->value);
            strcat(txt, at + digits);
        }
        if (corpus) {
            char p[512];
            snprintf(p, sizeof p, "%s/mutation-%02zu.json", corpus, i);
            zt_write_file(p, txt);
        }
        zck_manifest *m = NULL;
        zr_err_clear();
        int rc = zck__manifest_parse(&m, txt, strlen(txt), "manifest.json");
        if (rc != mu->code)
            ZT_FAIL("case %zu (%s = %s): got %s, expected %s: %s", i, mu->path,
                    mu->value ? mu->value : "(deleted)", zr_err_name(rc), zr_err_name(mu->code),
                    zr_err_msg());
        if (mu->text && !strstr(zr_err_msg(), mu->text))
            ZT_FAIL("case %zu (%s): message '%s' lacks '%s'", i, mu->path, zr_err_msg(),
                    mu->text);
        if (rc)
            ZT_CHECK(!strncmp(zr_err_msg(), "manifest.json", 13)); /* the file is named */
        zck__manifest_free(m);
        free(txt);
    }
    if (corpus) {
        char p[512];
        snprintf(p, sizeof p, "%s/valid.json", corpus);
        zt_write_file(p, base);
    }
    free(base);
    free(ckpt);
}

ZT_TEST(manifest_on_disk_errors_name_the_file)
{
    char *ckpt, *base = base_manifest(&ckpt);
    char mp[512];
    snprintf(mp, sizeof mp, "%s/manifest.json", ckpt);
    zck_reader *r;
    /* version 2.0 refused with both versions named */
    mutation v2 = {"/version", "\"2.0\"", 0, NULL};
    char *txt = mutate(base, &v2);
    zt_write_file(mp, txt);
    free(txt);
    ZT_ERR(zck_reader_open(&r, ckpt), ZR_EVERSION, "format version 2.0 is not supported");
    ZT_CHECK(strstr(zr_err_msg(), mp));
    ZT_CHECK(strstr(zr_err_msg(), "1.x"));
    /* a minor version from the future with unknown fields is read */
    mutation v17 = {"/version", "\"1.9\"", 0, NULL};
    txt = mutate(base, &v17);
    zt_write_file(mp, txt);
    free(txt);
    ZT_OK(zck_reader_open(&r, ckpt));
    ZT_CHECK(!strcmp(zck_reader_version(r), "1.9"));
    zck_reader_free(r);
    zt_check_content(ckpt, 1);
    /* bad JSON names file, line and column */
    zt_write_file(mp, "{\n  \"format\": \"zckpt\",\n  oops\n}\n");
    ZT_ERR(zck_reader_open(&r, ckpt), ZR_ECORRUPT, "manifest.json:3:");
    ZT_CHECK(strstr(zr_err_msg(), "invalid JSON"));
    zt_write_file(mp, "{\"format\":\"zckpt\",\"format\":\"zckpt\"}");
    ZT_ERR(zck_reader_open(&r, ckpt), ZR_ECORRUPT, "duplicate object key");
    /* no manifest at all */
    ZT_CHECK(unlink(mp) == 0);
    ZT_ERR(zck_reader_open(&r, ckpt), ZR_ENOTFOUND, "is not a committed checkpoint");
    ZT_ERR(zck_reader_open(&r, "no-such-dir"), ZR_ENOTFOUND, "no-such-dir");
    /* latest naming something odd */
    zt_write_file("run/latest", "../../etc\n");
    ZT_ERR(zck_reader_open(&r, "run"), ZR_ECORRUPT, "expected a name like step-00001000");
    free(base);
    free(ckpt);
}

ZT_TEST(shard_json_roundtrip)
{
    const uint64_t sizes[] = {300, 5};
    zck_layout *L = zt_layout(2, sizes);
    ZT_OK(zck__mkdir("stage"));
    zck_shard *s = zt_write_rank("stage", L, 3, 1, 9, NULL);
    char *j, *j2;
    zck_shard *s2;
    ZT_OK(zck_shard_to_json(&j, s));
    ZT_OK(zck_shard_from_json(&s2, j, strlen(j)));
    ZT_OK(zck_shard_to_json(&j2, s2));
    ZT_CHECK(!strcmp(j, j2));
    ZT_CHECK(!strcmp(zck_shard_file(s2), "shard-00001-of-00003.bin"));
    ZT_CHECK_EQ(zck_shard_bytes(s2) % 4096, 0);
    char hex[65];
    ZT_OK(zck_sha256_file(hex, "stage/shard-00001-of-00003.bin", NULL));
    ZT_CHECK(!strcmp(hex, zck_shard_sha256(s2)));
    ZT_ERR(zck_shard_from_json(&s2, "{\"file\":1}", 10), ZR_ECORRUPT,
           "field 'file': expected a string");
    free(j);
    free(j2);
    zck_shard_free(s);
    zck_shard_free(s2);
    zck_layout_free(L);
}
