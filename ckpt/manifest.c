/*
 * manifest.c: manifest.json <-> zck_manifest, with complete validation: every field's type and
 * range, names, the dtype table, group/tensor consistency, and the shard list (ranks, file
 * names, sizes, extents inside their files, every (group, state) covered exactly once). This
 * file is the one adapter for Jansson's conventions.
 */
#include "zck_int.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CORRUPT(...) zr_err_set(ZR_ECORRUPT, __VA_ARGS__)

static const char *jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Fetch obj[key] of the given type; ctx names obj in the message. */
static int get(json_t **out, json_t *obj, const char *key, json_type type, const char *ctx)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return CORRUPT("%s: missing field '%s'", ctx, key);
    if (json_typeof(v) != type && !(type == JSON_TRUE && json_is_boolean(v))) {
        static const char *names[] = {"an object", "an array", "a string", "an integer",
                                      "a real number", "a boolean", "a boolean", "null"};
        return CORRUPT("%s: field '%s': expected %s, found %s", ctx, key, names[type], jtype(v));
    }
    *out = v;
    return 0;
}

/* obj's field key: a non-empty array (of at least one `noun`). */
static int get_list(json_t **out, json_t *obj, const char *key, const char *noun, const char *ctx)
{
    ZR_TRY(get(out, obj, key, JSON_ARRAY, ctx));
    if (json_array_size(*out) == 0)
        return CORRUPT("%s: field '%s': empty (at least one %s is required)", ctx, key, noun);
    return 0;
}

/* Item i of the array arr, which must be an object. item_ctx gets its name for the messages
 * that follow: "<ctx><field>[i]" (field ": states", ".extents"). */
static int get_item(json_t **out, char *item_ctx, size_t cap, json_t *arr, size_t i,
                    const char *ctx, const char *field)
{
    snprintf(item_ctx, cap, "%s%s[%zu]", ctx, field, i);
    json_t *o = json_array_get(arr, i);
    if (!json_is_object(o))
        return CORRUPT("%s: expected an object, found %s", item_ctx, jtype(o));
    *out = o;
    return 0;
}

static int get_u64(uint64_t *out, json_t *obj, const char *key, uint64_t lo, uint64_t hi,
                   const char *ctx)
{
    json_t *v;
    ZR_TRY(get(&v, obj, key, JSON_INTEGER, ctx));
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi)
        return CORRUPT("%s: field '%s': %lld out of range [%llu, %llu]", ctx, key, (long long)x,
                       (unsigned long long)lo, (unsigned long long)hi);
    *out = (uint64_t)x;
    return 0;
}

static int get_str(const char **out, json_t *obj, const char *key, const char *ctx)
{
    json_t *v;
    ZR_TRY(get(&v, obj, key, JSON_STRING, ctx));
    *out = json_string_value(v);
    return 0;
}

/* Turn the last error (from a layout adder) into corruption of the manifest at ctx. */
static int corrupt_at(const char *ctx)
{
    if (zr_err_code() == ZR_ENOMEM) /* no sign of damage */
        return ZR_ENOMEM;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zr_err_msg());
    return CORRUPT("%s: %s", ctx, msg);
}

/* ---------------------------------------------------------------- shards */

int zck__shard_add_extent(zck_shard *s, const zck__extent *e)
{
    ZR_TRY(zr_array_grow(&s->ext, &s->capext, s->next, sizeof *s->ext));
    s->ext[s->next++] = *e;
    return 0;
}

void zck_shard_free(zck_shard *s)
{
    if (!s)
        return;
    free(s->file);
    free(s->ext);
    free(s);
}

const char *zck_shard_file(const zck_shard *s) { return s->file; }
uint64_t zck_shard_bytes(const zck_shard *s) { return s->bytes; }
const char *zck_shard_sha256(const zck_shard *s) { return s->sha256; }
uint32_t zck_shard_rank(const zck_shard *s) { return s->rank; }
size_t zck_shard_n_extents(const zck_shard *s) { return s->next; }

void zck_shard_extent(const zck_shard *s, size_t i, zck_extent_info *out)
{
    const zck__extent *e = &s->ext[i];
    *out = (zck_extent_info){e->group, e->state, e->start, e->count, e->offset};
}

json_t *zck__shard_json(const zck_shard *s)
{
    json_t *ext = json_array();
    for (size_t i = 0; ext && i < s->next; i++) {
        const zck__extent *e = &s->ext[i];
        json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I}", "group", (json_int_t)e->group,
                              "state", (json_int_t)e->state, "start", (json_int_t)e->start,
                              "count", (json_int_t)e->count, "offset", (json_int_t)e->offset);
        if (!o || json_array_append_new(ext, o)) {
            json_decref(ext);
            return NULL;
        }
    }
    if (!ext)
        return NULL;
    return json_pack("{s:s, s:I, s:I, s:s, s:o}", "file", s->file, "rank", (json_int_t)s->rank,
                     "bytes", (json_int_t)s->bytes, "sha256", s->sha256, "extents", ext);
}

int zck__shard_parse(zck_shard **out, json_t *obj, const char *ctx)
{
    if (!json_is_object(obj))
        return CORRUPT("%s: expected an object, found %s", ctx, jtype(obj));
    zck_shard *s = calloc(1, sizeof *s);
    if (!s)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0;
    const char *file, *sha;
    uint64_t rank;
    json_t *ext;
    ZR_TRY_GOTO(get_str(&file, obj, "file", ctx), rc, fail);
    if (!zck__file_name_ok(file)) {
        rc = CORRUPT("%s: file name '%s' is not a plain file name (no '/', no leading '.', not "
                     "manifest.json or SHA256SUMS)", ctx, file);
        goto fail;
    }
    ZR_TRY_GOTO(get_u64(&rank, obj, "rank", 0, ZCK_MAX_WORLD - 1, ctx), rc, fail);
    ZR_TRY_GOTO(get_u64(&s->bytes, obj, "bytes", 0, (uint64_t)1 << 62, ctx), rc, fail);
    ZR_TRY_GOTO(get_str(&sha, obj, "sha256", ctx), rc, fail);
    if (!zck__is_sha256_hex(sha)) {
        rc = CORRUPT("%s: field 'sha256': expected 64 lowercase hex digits, found '%.80s'", ctx,
                     sha);
        goto fail;
    }
    memcpy(s->sha256, sha, 65);
    s->rank = (uint32_t)rank;
    if (!(s->file = strdup(file))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto fail;
    }
    ZR_TRY_GOTO(get(&ext, obj, "extents", JSON_ARRAY, ctx), rc, fail);
    for (size_t i = 0; i < json_array_size(ext); i++) {
        char ectx[256];
        json_t *eo;
        ZR_TRY_GOTO(get_item(&eo, ectx, sizeof ectx, ext, i, ctx, ".extents"), rc, fail);
        zck__extent e;
        uint64_t g, st;
        ZR_TRY_GOTO(get_u64(&g, eo, "group", 0, UINT32_MAX, ectx), rc, fail);
        ZR_TRY_GOTO(get_u64(&st, eo, "state", 0, UINT32_MAX, ectx), rc, fail);
        ZR_TRY_GOTO(get_u64(&e.start, eo, "start", 0, ZCK__MAX_NUMEL, ectx), rc, fail);
        ZR_TRY_GOTO(get_u64(&e.count, eo, "count", 1, ZCK__MAX_NUMEL, ectx), rc, fail);
        ZR_TRY_GOTO(get_u64(&e.offset, eo, "offset", 0, (uint64_t)1 << 62, ectx), rc, fail);
        e.group = (uint32_t)g;
        e.state = (uint32_t)st;
        ZR_TRY_GOTO(zck__shard_add_extent(s, &e), rc, fail);
    }
    *out = s;
    return 0;
fail:
    zck_shard_free(s);
    return rc;
}

int zck_shard_to_json(char **out, const zck_shard *s)
{
    json_t *o = zck__shard_json(s);
    char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!txt)
        return zr_err_set(ZR_ENOMEM, "out of memory serializing shard %s", s->file);
    *out = txt; /* json_dumps uses malloc unless the allocator was replaced */
    return 0;
}

int zck_shard_from_json(zck_shard **out, const char *json, size_t len)
{
    json_error_t jerr;
    json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return CORRUPT("shard record: invalid JSON at %d:%d: %s", jerr.line, jerr.column,
                       jerr.text);
    int rc = zck__shard_parse(out, o, "shard record");
    json_decref(o);
    return rc;
}

/* ---------------------------------------------------------------- manifest */

void zck__manifest_free(zck_manifest *m)
{
    if (!m)
        return;
    free(m->created);
    free(m->producer);
    free(m->model_json);
    free(m->training_json);
    if (m->index && m->L)
        for (size_t i = 0; i < m->L->ng * m->L->ns; i++)
            free(m->index[i]);
    free(m->index);
    free(m->index_n);
    zck_layout_free(m->L);
    for (size_t i = 0; i < m->nshards; i++)
        zck_shard_free(m->shards[i]);
    free(m->shards);
    zck__files_free(m->files, m->nfiles);
    free(m);
}

static int cmp_ref(const void *a, const void *b)
{
    const zck__extref *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

typedef struct {
    uint64_t a, b;
    size_t i;
} brange;

static int cmp_brange(const void *a, const void *b)
{
    const brange *x = a, *y = b;
    return x->a < y->a ? -1 : x->a > y->a;
}

/* Ranks below the world size and unique, file names unique (sorted: O(n log n)). */
static int check_ranks_files(const zck_manifest *m, const char *what)
{
    unsigned char *seen = calloc(m->world ? m->world : 1, 1);
    if (!seen)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->nshards; i++) {
        const zck_shard *s = m->shards[i];
        if (s->rank >= m->world || seen[s->rank]) {
            free(seen);
            return CORRUPT("%s: shards[%zu] (%s): rank %u %s", what, i, s->file, s->rank,
                           s->rank >= m->world ? "is not below the world size" : "listed twice");
        }
        seen[s->rank] = 1;
    }
    free(seen);
    const char **files = malloc((m->nshards ? m->nshards : 1) * sizeof *files), *dup;
    if (!files)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->nshards; i++)
        files[i] = m->shards[i]->file;
    dup = zck__first_duplicate(files, m->nshards);
    free(files);
    if (dup)
        return CORRUPT("%s: shard file '%s' listed twice", what, dup);
    return 0;
}

int zck__manifest_index(zck_manifest *m, const char *what)
{
    const zck_layout *L = m->L;
    size_t ng = L->ng, ns = L->ns;
    if (m->nshards != m->world)
        return CORRUPT("%s: %zu shards listed for world size %u (expected one per rank)", what,
                       m->nshards, m->world);
    ZR_TRY(check_ranks_files(m, what));

    /* per shard: extents in range, aligned, inside the file, not overlapping, size exact */
    size_t *cnt = calloc(ng * ns > 0 ? ng * ns : 1, sizeof *cnt);
    if (!cnt)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < m->nshards && !rc; i++) {
        const zck_shard *s = m->shards[i];
        brange *br = calloc(s->next ? s->next : 1, sizeof *br);
        if (!br) {
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
            break;
        }
        for (size_t k = 0; k < s->next && !rc; k++) {
            const zck__extent *e = &s->ext[k];
            if (e->group >= ng || e->state >= ns) {
                rc = CORRUPT("%s: %s extent %zu: %s %u does not exist (%zu %s)", what, s->file,
                             k, e->group >= ng ? "group" : "state",
                             e->group >= ng ? e->group : e->state, e->group >= ng ? ng : ns,
                             e->group >= ng ? "groups" : "states");
                break;
            }
            uint64_t numel = L->g[e->group].numel;
            if (e->start > numel || e->count > numel - e->start) {
                rc = CORRUPT("%s: %s extent %zu: elements [%llu, %llu) outside group '%s' of "
                             "%llu elements", what, s->file, k, (unsigned long long)e->start,
                             (unsigned long long)(e->start + e->count), L->g[e->group].name,
                             (unsigned long long)numel);
                break;
            }
            if (e->offset % ZCK_FILE_ALIGN) {
                rc = CORRUPT("%s: %s extent %zu: offset %llu is not a multiple of %u", what,
                             s->file, k, (unsigned long long)e->offset, ZCK_FILE_ALIGN);
                break;
            }
            uint64_t nb = e->count * zck_dtype_size(L->s[e->state].dtype);
            if (e->offset > s->bytes || nb > s->bytes - e->offset) {
                rc = CORRUPT("%s: %s extent %zu: bytes [%llu, %llu) beyond the file's %llu "
                             "bytes", what, s->file, k, (unsigned long long)e->offset,
                             (unsigned long long)(e->offset + nb), (unsigned long long)s->bytes);
                break;
            }
            br[k] = (brange){e->offset, e->offset + nb, k};
            cnt[e->group * ns + e->state]++;
        }
        if (!rc) {
            qsort(br, s->next, sizeof *br, cmp_brange);
            uint64_t end = 0;
            for (size_t k = 0; k < s->next; k++) {
                if (k && br[k].a < br[k - 1].b) {
                    rc = CORRUPT("%s: %s: extents %zu and %zu overlap in the file", what,
                                 s->file, br[k - 1].i, br[k].i);
                    break;
                }
                end = br[k].b;
            }
            uint64_t want = (end + ZCK_FILE_ALIGN - 1) / ZCK_FILE_ALIGN * ZCK_FILE_ALIGN;
            if (!rc && s->bytes != want)
                rc = CORRUPT("%s: %s: listed size %llu bytes, but its extents end at %llu "
                             "(expected %llu: the end padded to %u)", what, s->file,
                             (unsigned long long)s->bytes, (unsigned long long)end,
                             (unsigned long long)want, ZCK_FILE_ALIGN);
        }
        free(br);
    }
    if (rc) {
        free(cnt);
        return rc;
    }

    /* build the index and check that each (group, state) is tiled exactly */
    m->index = calloc(ng * ns > 0 ? ng * ns : 1, sizeof *m->index);
    m->index_n = calloc(ng * ns > 0 ? ng * ns : 1, sizeof *m->index_n);
    if (!m->index || !m->index_n) {
        free(cnt);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < ng * ns; i++)
        if (cnt[i] && !(m->index[i] = calloc(cnt[i], sizeof **m->index))) {
            free(cnt);
            return zr_err_set(ZR_ENOMEM, "out of memory");
        }
    free(cnt);
    for (size_t i = 0; i < m->nshards; i++)
        for (size_t k = 0; k < m->shards[i]->next; k++) {
            const zck__extent *e = &m->shards[i]->ext[k];
            size_t x = e->group * ns + e->state;
            m->index[x][m->index_n[x]++] = (zck__extref){e->start, e->count, e->offset,
                                                          (uint32_t)i};
        }
    for (size_t g = 0; g < ng; g++)
        for (size_t st = 0; st < ns; st++) {
            size_t x = g * ns + st;
            zck__extref *r = m->index[x];
            if (m->index_n[x]) /* r is NULL when no extent covers it: qsort(NULL, 0) is UB */
                qsort(r, m->index_n[x], sizeof *r, cmp_ref);
            uint64_t expect = 0;
            for (size_t k = 0; k < m->index_n[x]; k++) {
                if (r[k].start < expect)
                    return CORRUPT("%s: group '%s' state '%s': elements [%llu, %llu) stored "
                                   "twice (in %s and %s)", what, L->g[g].name, L->s[st].name,
                                   (unsigned long long)r[k].start,
                                   (unsigned long long)(expect < r[k].start + r[k].count
                                                            ? expect : r[k].start + r[k].count),
                                   m->shards[r[k - 1].shard]->file, m->shards[r[k].shard]->file);
                if (r[k].start > expect)
                    break;
                expect = r[k].start + r[k].count;
            }
            if (expect != L->g[g].numel) {
                uint64_t gap_end = L->g[g].numel;
                for (size_t k = 0; k < m->index_n[x]; k++)
                    if (r[k].start > expect) {
                        gap_end = r[k].start;
                        break;
                    }
                return CORRUPT("%s: group '%s' state '%s': elements [%llu, %llu) stored in no "
                               "shard", what, L->g[g].name, L->s[st].name,
                               (unsigned long long)expect, (unsigned long long)gap_end);
            }
        }
    return 0;
}

static int parse_layout(zck_layout **out, json_t *root, const char *what)
{
    zck_layout *L;
    ZR_TRY(zck_layout_new(&L));
    L->unchecked = true; /* names checked all at once below: a linear check per name is O(n^2) */
    int rc = 0;
    char ctx[512];
    json_t *dt, *states, *groups;
    uint64_t palign;
    ZR_TRY_GOTO(get_u64(&palign, root, "partition_align", 1, 1u << 20, what), rc, fail);
    L->palign = (uint32_t)palign;
    ZR_TRY_GOTO(get(&dt, root, "dtypes", JSON_OBJECT, what), rc, fail);
    /* every dtype the table names that we know must have our size; unknown ones are only an
     * error when something uses them (checked through zck_dtype_parse below) */
    const char *key;
    json_t *val;
    json_object_foreach(dt, key, val) {
        zck_dtype t;
        snprintf(ctx, sizeof ctx, "%s: dtypes", what);
        if (!json_is_integer(val)) {
            rc = CORRUPT("%s: field '%s': expected an integer, found %s", ctx, key, jtype(val));
            goto fail;
        }
        if (zck_dtype_parse(&t, key) == 0 &&
            json_integer_value(val) != (json_int_t)zck_dtype_size(t)) {
            rc = CORRUPT("%s: '%s' is %lld bytes, expected %zu", ctx, key,
                         (long long)json_integer_value(val), zck_dtype_size(t));
            goto fail;
        }
    }
    zr_err_clear();

    ZR_TRY_GOTO(get_list(&states, root, "states", "state", what), rc, fail);
    for (size_t i = 0; i < json_array_size(states); i++) {
        json_t *so;
        const char *name, *dtn;
        zck_dtype t;
        ZR_TRY_GOTO(get_item(&so, ctx, sizeof ctx, states, i, what, ": states"), rc, fail);
        ZR_TRY_GOTO(get_str(&name, so, "name", ctx), rc, fail);
        ZR_TRY_GOTO(get_str(&dtn, so, "dtype", ctx), rc, fail);
        if (zck_dtype_parse(&t, dtn) < 0 || zck_layout_add_state(L, name, t) < 0) {
            rc = corrupt_at(ctx);
            goto fail;
        }
        if (!json_object_get(dt, dtn)) {
            rc = CORRUPT("%s: dtype '%s' missing from the dtypes table", ctx, dtn);
            goto fail;
        }
    }

    ZR_TRY_GOTO(get_list(&groups, root, "groups", "group", what), rc, fail);
    for (size_t g = 0; g < json_array_size(groups); g++) {
        json_t *go, *tensors;
        const char *name;
        uint64_t numel;
        ZR_TRY_GOTO(get_item(&go, ctx, sizeof ctx, groups, g, what, ": groups"), rc, fail);
        ZR_TRY_GOTO(get_str(&name, go, "name", ctx), rc, fail);
        ZR_TRY_GOTO(get_u64(&numel, go, "numel", 1, ZCK__MAX_NUMEL, ctx), rc, fail);
        if (zck_layout_add_group(L, NULL, name) < 0) {
            rc = corrupt_at(ctx);
            goto fail;
        }
        ZR_TRY_GOTO(get(&tensors, go, "tensors", JSON_ARRAY, ctx), rc, fail);
        for (size_t t = 0; t < json_array_size(tensors); t++) {
            json_t *to, *shape;
            const char *tname, *dtn;
            uint64_t off, dims[ZCK_MAX_DIMS];
            zck_dtype dtype;
            char tctx[600];
            ZR_TRY_GOTO(get_item(&to, tctx, sizeof tctx, tensors, t, ctx, ".tensors"), rc, fail);
            ZR_TRY_GOTO(get_str(&tname, to, "name", tctx), rc, fail);
            ZR_TRY_GOTO(get_str(&dtn, to, "dtype", tctx), rc, fail);
            ZR_TRY_GOTO(get(&shape, to, "shape", JSON_ARRAY, tctx), rc, fail);
            ZR_TRY_GOTO(get_u64(&off, to, "offset", 0, ZCK__MAX_NUMEL, tctx), rc, fail);
            size_t nd = json_array_size(shape);
            if (nd > ZCK_MAX_DIMS) {
                rc = CORRUPT("%s: field 'shape': %zu dimensions, at most %d", tctx, nd,
                             ZCK_MAX_DIMS);
                goto fail;
            }
            for (size_t d = 0; d < nd; d++) {
                json_t *v = json_array_get(shape, d);
                if (!json_is_integer(v) || json_integer_value(v) < 0) {
                    rc = CORRUPT("%s: field 'shape': expected an array of non-negative integers",
                                 tctx);
                    goto fail;
                }
                dims[d] = (uint64_t)json_integer_value(v);
            }
            if (zck_dtype_parse(&dtype, dtn) < 0 ||
                zck_layout_add_tensor(L, g, tname, dtype, nd, dims) < 0) {
                rc = corrupt_at(tctx);
                goto fail;
            }
            if (!json_object_get(dt, dtn)) {
                rc = CORRUPT("%s: dtype '%s' missing from the dtypes table", tctx, dtn);
                goto fail;
            }
            const zck__tensor *T = &L->g[g].t[t];
            if (T->offset != off) {
                rc = CORRUPT("%s: offset %llu, expected %llu (tensors are laid end to end)",
                             tctx, (unsigned long long)off, (unsigned long long)T->offset);
                goto fail;
            }
        }
        if (L->g[g].numel != numel) {
            rc = CORRUPT("%s: numel %llu, but its tensors hold %llu elements", ctx,
                         (unsigned long long)numel, (unsigned long long)L->g[g].numel);
            goto fail;
        }
    }
    L->unchecked = false;
    if (zck__layout_check_unique(L) < 0) {
        rc = zr_err_code() == ZR_ENOMEM ? ZR_ENOMEM : corrupt_at(what);
        goto fail;
    }
    *out = L;
    return 0;
fail:
    zck_layout_free(L);
    return rc;
}

static char *dup_compact(json_t *v)
{
    char *s = zck_json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER); /* reals exact, shortest */
    if (!s)
        zr_err_set(ZR_ENOMEM, "out of memory");
    return s;
}

/* "MAJOR.MINOR": each 1-6 decimal digits, no sign, no spaces, no leading zeros */
static bool parse_num(const char **p, int *out)
{
    const char *s = *p;
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n > 6 || (n > 1 && s[0] == '0'))
        return false;
    int v = 0;
    for (size_t i = 0; i < n; i++)
        v = v * 10 + (s[i] - '0');
    *out = v;
    *p = s + n;
    return true;
}

static bool parse_version(const char *v, int *major, int *minor)
{
    return parse_num(&v, major) && *v++ == '.' && parse_num(&v, minor) && *v == 0;
}

/* The training section's counters, where present, are integers in [0, ZCK_MAX_COUNTER]: the
 * engine adds to them, and one of 2^63 or more would be written back as a negative number. */
static int check_counters(json_t *training, int code, const char *what)
{
    static const char *const keys[] = {"step", "optimizer_step", "next_sample"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        json_t *v = json_object_get(training, keys[i]);
        if (!v)
            continue;
        if (!json_is_integer(v))
            return zr_err_set(code, "%s: training.%s: expected an integer, found %s", what,
                              keys[i], jtype(v));
        json_int_t x = json_integer_value(v);
        if (x < 0 || (uint64_t)x > ZCK_MAX_COUNTER)
            return zr_err_set(code, "%s: training.%s: %lld out of range [0, 2^62] (a counter "
                              "of 2^63 or more wraps to negative)", what, keys[i], (long long)x);
    }
    return 0;
}

/* Jansson reports some failed allocations as bad input ("invalid token" where the copy of a
 * string could not be allocated): its allocations go through this, which notes a failure for
 * the thread, so that running out of memory is never taken for damage. malloc and free
 * underneath, as before: what Jansson returns is still freed with free. */
static _Thread_local int jansson_oom;

static void *noting_malloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        jansson_oom = 1;
    return p;
}

static void noting_alloc_init(void) { json_set_alloc_funcs(noting_malloc, free); }

int zck__manifest_parse(zck_manifest **out, const char *text, size_t len, const char *what)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, noting_alloc_init);
    jansson_oom = 0;
    json_error_t jerr;
    ZR_TRY(zck__manifest_bound(text, len, what));
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    /* Jansson leaves the message empty where an allocation fails (lex_init, json_object) */
    if (!root && (jansson_oom || json_error_code(&jerr) == json_error_out_of_memory ||
                  !jerr.text[0]))
        return zr_err_set(ZR_ENOMEM, "%s: out of memory while parsing its %zu bytes (no sign "
                          "of damage)", what, len);
    if (!root)
        return CORRUPT("%s:%d:%d: invalid JSON: %s", what, jerr.line, jerr.column, jerr.text);
    zck_manifest *m = calloc(1, sizeof *m);
    int rc = 0;
    if (!m) {
        json_decref(root);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    if (!json_is_object(root)) {
        rc = CORRUPT("%s: expected a JSON object at the top, found %s", what, jtype(root));
        goto fail;
    }
    const char *fmt, *ver, *created, *producer;
    ZR_TRY_GOTO(get_str(&fmt, root, "format", what), rc, fail);
    if (strcmp(fmt, ZCK_FORMAT_NAME)) {
        rc = CORRUPT("%s: format '%.64s' is not '%s'", what, fmt, ZCK_FORMAT_NAME);
        goto fail;
    }
    ZR_TRY_GOTO(get_str(&ver, root, "version", what), rc, fail);
    if (!parse_version(ver, &m->major, &m->minor)) {
        rc = CORRUPT("%s: version '%.32s' is not MAJOR.MINOR", what, ver);
        goto fail;
    }
    if (m->major != ZCK_VERSION_MAJOR) {
        rc = zr_err_set(ZR_EVERSION, "%s: format version %s is not supported: this reader "
                        "reads version %d.x (it writes %d.%d)", what, ver, ZCK_VERSION_MAJOR,
                        ZCK_VERSION_MAJOR, ZCK_VERSION_MINOR);
        goto fail;
    }
    strcpy(m->version, ver);
    uint64_t world, stage, falign;
    json_t *model, *training, *shards;
    ZR_TRY_GOTO(get_u64(&m->step, root, "step", 0, (uint64_t)INT64_MAX, what), rc, fail);
    ZR_TRY_GOTO(get_str(&created, root, "created", what), rc, fail);
    ZR_TRY_GOTO(get_str(&producer, root, "producer", what), rc, fail);
    ZR_TRY_GOTO(get_u64(&world, root, "world_size", 1, ZCK_MAX_WORLD, what), rc, fail);
    ZR_TRY_GOTO(get_u64(&stage, root, "zero_stage", 0, 3, what), rc, fail);
    ZR_TRY_GOTO(get_u64(&falign, root, "file_align", ZCK_FILE_ALIGN, ZCK_FILE_ALIGN, what), rc,
                fail);
    ZR_TRY_GOTO(get(&model, root, "model", JSON_OBJECT, what), rc, fail);
    ZR_TRY_GOTO(get(&training, root, "training", JSON_OBJECT, what), rc, fail);
    ZR_TRY_GOTO(check_counters(training, ZR_ECORRUPT, what), rc, fail);
    m->world = (uint32_t)world;
    m->stage = (int)stage;
    if (!(m->created = strdup(created)) || !(m->producer = strdup(producer)) ||
        !(m->model_json = dup_compact(model)) || !(m->training_json = dup_compact(training))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto fail;
    }
    ZR_TRY_GOTO(parse_layout(&m->L, root, what), rc, fail);
    ZR_TRY_GOTO(get(&shards, root, "shards", JSON_ARRAY, what), rc, fail);
    size_t n = json_array_size(shards);
    if (n > ZCK_MAX_WORLD) {
        rc = CORRUPT("%s: %zu shards, more than the largest world size", what, n);
        goto fail;
    }
    m->shards = calloc(n ? n : 1, sizeof *m->shards);
    if (!m->shards) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        char ctx[512];
        snprintf(ctx, sizeof ctx, "%s: shards[%zu]", what, i);
        ZR_TRY_GOTO(zck__shard_parse(&m->shards[i], json_array_get(shards, i), ctx), rc, fail);
        m->nshards++;
    }
    json_t *files = json_object_get(root, "files");
    if (files)
        ZR_TRY_GOTO(zck__files_parse(&m->files, &m->nfiles, files, what), rc, fail);
    for (size_t i = 0; i < m->nfiles; i++)
        for (size_t k = 0; k < m->nshards; k++)
            if (!strcmp(m->files[i].file, m->shards[k]->file)) {
                rc = CORRUPT("%s: files[%zu]: '%s' is also a shard's file", what, i,
                             m->files[i].file);
                goto fail;
            }
    ZR_TRY_GOTO(zck__manifest_index(m, what), rc, fail);
    json_decref(root);
    *out = m;
    return 0;
fail:
    json_decref(root);
    zck__manifest_free(m);
    return rc;
}

static json_t *load_obj(const char *txt)
{
    json_error_t jerr;
    return json_loads(txt && *txt ? txt : "{}", JSON_REJECT_DUPLICATES, &jerr);
}

int zck__manifest_dump(char **out, const zck_manifest *m)
{
    const zck_layout *L = m->L;
    json_t *model = load_obj(m->model_json), *training = load_obj(m->training_json);
    if (!json_is_object(model) || !json_is_object(training)) {
        json_decref(model);
        json_decref(training);
        return zr_err_set(ZR_EINVAL, "the %s section must be a JSON object",
                          !json_is_object(model) ? "model" : "training");
    }
    int crc = check_counters(training, ZR_EINVAL, "checkpoint to write");
    if (crc) {
        json_decref(model);
        json_decref(training);
        return crc;
    }
    json_t *root = json_object(), *dt = json_object(), *states = json_array(),
           *groups = json_array(), *shards = json_array();
    int bad = !root || !dt || !states || !groups || !shards;
    bool used[ZCK_DTYPE_COUNT] = {false};
    for (size_t s = 0; s < L->ns; s++) {
        used[L->s[s].dtype] = true;
        bad |= json_array_append_new(states, json_pack("{s:s, s:s}", "name", L->s[s].name,
                                                       "dtype", zck_dtype_name(L->s[s].dtype)));
    }
    for (size_t g = 0; g < L->ng; g++) {
        json_t *tens = json_array();
        bad |= !tens;
        for (size_t t = 0; t < L->g[g].nt; t++) {
            const zck__tensor *T = &L->g[g].t[t];
            json_t *shape = json_array();
            for (size_t d = 0; d < T->ndim; d++)
                bad |= json_array_append_new(shape, json_integer((json_int_t)T->shape[d]));
            used[T->dtype] = true;
            bad |= json_array_append_new(tens, json_pack("{s:s, s:s, s:o, s:I}", "name",
                                                         T->name, "dtype",
                                                         zck_dtype_name(T->dtype), "shape",
                                                         shape, "offset",
                                                         (json_int_t)T->offset));
        }
        bad |= json_array_append_new(groups, json_pack("{s:s, s:I, s:o}", "name", L->g[g].name,
                                                       "numel", (json_int_t)L->g[g].numel,
                                                       "tensors", tens));
    }
    for (int t = 0; t < ZCK_DTYPE_COUNT; t++)
        if (used[t])
            bad |= json_object_set_new(dt, zck_dtype_name((zck_dtype)t),
                                       json_integer((json_int_t)zck_dtype_size((zck_dtype)t)));
    for (size_t i = 0; i < m->nshards; i++)
        bad |= json_array_append_new(shards, zck__shard_json(m->shards[i]));
    char ver[16];
    /* 1.1: with extra files (a 1.0 reader reads the shards but reports the files unlisted) */
    snprintf(ver, sizeof ver, "%d.%d", ZCK_VERSION_MAJOR,
             m->nfiles ? ZCK_VERSION_MINOR_FILES : ZCK_VERSION_MINOR);
    bad |= json_object_set_new(root, "format", json_string(ZCK_FORMAT_NAME));
    bad |= json_object_set_new(root, "version", json_string(ver));
    bad |= json_object_set_new(root, "step", json_integer((json_int_t)m->step));
    bad |= json_object_set_new(root, "created", json_string(m->created));
    bad |= json_object_set_new(root, "producer", json_string(m->producer));
    bad |= json_object_set_new(root, "world_size", json_integer(m->world));
    bad |= json_object_set_new(root, "zero_stage", json_integer(m->stage));
    bad |= json_object_set_new(root, "partition_align", json_integer(L->palign));
    bad |= json_object_set_new(root, "file_align", json_integer(ZCK_FILE_ALIGN));
    bad |= json_object_set_new(root, "model", model);
    bad |= json_object_set_new(root, "training", training);
    bad |= json_object_set_new(root, "dtypes", dt);
    bad |= json_object_set_new(root, "states", states);
    bad |= json_object_set_new(root, "groups", groups);
    bad |= json_object_set_new(root, "shards", shards);
    if (m->nfiles)
        bad |= json_object_set_new(root, "files", zck__files_json(m->files, m->nfiles));
    /* each real the shortest decimal that reads back as the same double: exact */
    char *txt = bad ? NULL : zck_json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!txt)
        return zr_err_set(ZR_ENOMEM, "out of memory serializing the manifest");
    size_t n = strlen(txt);
    if (n + 1 > ZCK_MAX_MANIFEST_BYTES) {
        free(txt);
        return zr_err_set(ZR_EINVAL, "manifest of %zu bytes: more than the %zu a reader accepts "
                          "(fewer tensors or ranks)", n + 1, ZCK_MAX_MANIFEST_BYTES);
    }
    char *t2 = realloc(txt, n + 2);
    if (!t2) {
        free(txt);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    t2[n] = '\n';
    t2[n + 1] = 0;
    *out = t2;
    return 0;
}
