/*
 * mbound.c: the bound on what parsing a manifest may cost, checked before Jansson builds its
 * tree (each JSON value costs tens to hundreds of bytes there: 22 million empty objects in a
 * 64 MiB manifest would take 5 GB). One linear pass over the text, allocating nothing, knows
 * the format's shape (docs/FORMAT.md): every value where the format puts one (a group, a
 * tensor and its shape, a shard, an extent...) is the manifest's real content, whose cost is
 * that of the checkpoint it describes. Everything else (unknown fields, containers where a
 * number or a string belongs, items without the fields of their kind, a shape of more than
 * ZCK_MAX_DIMS, more shards than ZCK_MAX_WORLD) may hold at most ZCK__MAX_EXTRA values in all,
 * and the opaque model and training sections ZCK__MAX_OPAQUE each; beyond that the manifest
 * is refused, naming the field. Text that is not JSON is left to Jansson to report.
 */
#include "zck_int.h"

#include <stdio.h>
#include <string.h>

#define ZCK__MAX_EXTRA 65536u  /* values outside the format's shape, all fields together */
#define ZCK__MAX_OPAQUE 65536u /* values of the model section, and of the training section */
#define MAXD 16                /* the format's shape is 6 deep: deeper is extra or opaque */

typedef enum {
    K_ROOT, K_DTYPES, K_STATES, K_STATE, K_GROUPS, K_GROUP, K_TENSORS, K_TENSOR, K_SHAPE,
    K_SHARDS, K_SHARD, K_EXTENTS, K_EXTENT, K_FILES, K_FILE,
    K_SCALAR, /* a number or a string of the format */
    K_OPAQUE, /* the model or the training section */
    K_EXTRA,  /* not of the format */
} kind;

/* the fields of each object kind, and what each holds ("" ends the list) */
typedef struct {
    const char *key;
    kind k;
} field;
static const field root_f[] = {
    {"format", K_SCALAR}, {"version", K_SCALAR}, {"step", K_SCALAR}, {"created", K_SCALAR},
    {"producer", K_SCALAR}, {"world_size", K_SCALAR}, {"zero_stage", K_SCALAR},
    {"partition_align", K_SCALAR}, {"file_align", K_SCALAR}, {"model", K_OPAQUE},
    {"training", K_OPAQUE}, {"dtypes", K_DTYPES}, {"states", K_STATES}, {"groups", K_GROUPS},
    {"shards", K_SHARDS}, {"files", K_FILES}, {"", K_EXTRA}};
static const field state_f[] = {{"name", K_SCALAR}, {"dtype", K_SCALAR}, {"", K_EXTRA}};
static const field group_f[] = {
    {"name", K_SCALAR}, {"numel", K_SCALAR}, {"tensors", K_TENSORS}, {"", K_EXTRA}};
static const field tensor_f[] = {{"name", K_SCALAR}, {"dtype", K_SCALAR}, {"shape", K_SHAPE},
                                 {"offset", K_SCALAR}, {"", K_EXTRA}};
static const field shard_f[] = {{"file", K_SCALAR}, {"rank", K_SCALAR}, {"bytes", K_SCALAR},
                                {"sha256", K_SCALAR}, {"extents", K_EXTENTS}, {"", K_EXTRA}};
static const field extent_f[] = {{"group", K_SCALAR}, {"state", K_SCALAR}, {"start", K_SCALAR},
                                 {"count", K_SCALAR}, {"offset", K_SCALAR}, {"", K_EXTRA}};
static const field file_f[] = {
    {"file", K_SCALAR}, {"bytes", K_SCALAR}, {"sha256", K_SCALAR}, {"", K_EXTRA}};

static const field *fields_of(kind k)
{
    switch (k) {
    case K_ROOT: return root_f;
    case K_STATE: return state_f;
    case K_GROUP: return group_f;
    case K_TENSOR: return tensor_f;
    case K_SHARD: return shard_f;
    case K_EXTENT: return extent_f;
    case K_FILE: return file_f;
    default: return NULL;
    }
}

static size_t n_fields(const field *f)
{
    size_t n = 0;
    while (f[n].key[0])
        n++;
    return n;
}

/* what the items of an array kind are, and how many of them the format allows */
static kind item_of(kind k, uint64_t *max)
{
    *max = UINT64_MAX;
    switch (k) {
    case K_STATES: return K_STATE;
    case K_GROUPS: return K_GROUP;
    case K_TENSORS: return K_TENSOR;
    case K_SHAPE: *max = ZCK_MAX_DIMS; return K_SCALAR;
    case K_SHARDS: *max = ZCK_MAX_WORLD; return K_SHARD;
    case K_EXTENTS: return K_EXTENT;
    case K_FILES: *max = ZCK_MAX_FILES; return K_FILE;
    default: return K_EXTRA;
    }
}

static bool is_array_kind(kind k)
{
    return k == K_STATES || k == K_GROUPS || k == K_TENSORS || k == K_SHAPE || k == K_SHARDS ||
           k == K_EXTENTS || k == K_FILES;
}

typedef struct {
    kind k;
    bool obj;
    char key[40];      /* the member being read (objects), cut */
    uint64_t idx;      /* the item being read (arrays) */
    unsigned known;    /* fields of the format seen (objects) */
} frame;

typedef struct {
    const char *t, *what;
    size_t len, i;
    frame f[MAXD];
    int d;             /* frames in f */
    long depth;        /* nesting of the region below (extra or opaque), 0 outside one */
    kind region;       /* K_EXTRA or K_OPAQUE while depth > 0 */
    char rpath[200];   /* the field the region is */
    uint64_t extra, opaque[2];
    int which;         /* the opaque section of the region: 0 model, 1 training */
} scan;

/* the path of the value being read: groups[3].tensors[5].shape */
static void path_of(const scan *s, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int k = 0; k < s->d && n < cap; k++) {
        const frame *f = &s->f[k];
        int w = f->obj ? snprintf(out + n, cap - n, "%s%s", k ? "." : "", f->key)
                       : snprintf(out + n, cap - n, "[%llu]", (unsigned long long)f->idx);
        n += w > 0 ? (size_t)w : 0;
    }
}

static int refuse(scan *s, const char *path, uint64_t limit, const char *whatfor)
{
    return zr_err_set(ZR_ECORRUPT, "%s: field '%s': more than %llu JSON values %s: refused "
                      "before parsing (each would cost tens to hundreds of bytes of memory)",
                      s->what, path[0] ? path : "(top)", (unsigned long long)limit, whatfor);
}

/* one more value outside the format at path */
static int count_extra(scan *s, const char *path)
{
    if (++s->extra > ZCK__MAX_EXTRA)
        return refuse(s, path, ZCK__MAX_EXTRA, "that the format does not define (unknown "
                      "fields, or values not of the format's shape; all such fields together)");
    return 0;
}

/* one more value inside the region */
static int count_region(scan *s)
{
    if (s->region == K_EXTRA)
        return count_extra(s, s->rpath);
    if (++s->opaque[s->which] > ZCK__MAX_OPAQUE)
        return refuse(s, s->rpath, ZCK__MAX_OPAQUE, "in this section");
    return 0;
}

static void skip_ws(scan *s)
{
    while (s->i < s->len && strchr(" \t\r\n", s->t[s->i]) && s->t[s->i])
        s->i++;
}

/* a string at s->i (its opening quote); its content, cut, into key when key. false: no end */
static bool skip_string(scan *s, char *key, size_t cap)
{
    size_t n = 0;
    for (s->i++; s->i < s->len; s->i++) {
        char c = s->t[s->i];
        if (c == '"') {
            s->i++;
            if (key)
                key[n < cap ? n : cap - 1] = 0;
            return true;
        }
        if (c == '\\') {
            s->i++;
            c = 0; /* an escaped key is never one of the format's */
        }
        if (key && n + 1 < cap)
            key[n++] = c ? c : '\\';
    }
    return false;
}

/* the kind the format expects for the value now starting in the top frame */
static kind expected(scan *s)
{
    if (s->d == 0)
        return K_ROOT;
    frame *f = &s->f[s->d - 1];
    if (f->obj) {
        const field *fl = fields_of(f->k);
        for (size_t j = 0; fl && fl[j].key[0]; j++)
            if (!strcmp(fl[j].key, f->key)) {
                f->known++;
                return fl[j].k;
            }
        if (f->k == K_DTYPES) /* a dtype name and its size */
            return zck_dtype_parse(&(zck_dtype){0}, f->key) == 0 ? K_SCALAR : K_EXTRA;
        return K_EXTRA;
    }
    uint64_t max;
    kind k = item_of(f->k, &max);
    return f->idx < max ? k : K_EXTRA;
}

/* A value starts at s->i: a container is entered (a frame of the format, or a region), a
 * scalar skipped. *open: a container was entered. 1: the text is not JSON (Jansson says why). */
static int value(scan *s, bool *open)
{
    char c = s->t[s->i];
    *open = c == '{' || c == '[';
    if (s->depth) { /* inside a region: counted, not followed */
        ZR_TRY(count_region(s));
        if (*open) {
            s->depth++;
            s->i++;
            return 0;
        }
    } else {
        kind k = expected(s);
        char path[200] = ""; /* named only when needed: this runs for every value */
        bool fits = *open && ((c == '{') == (k == K_ROOT || k == K_DTYPES || fields_of(k))) &&
                    (k != K_SCALAR && k != K_EXTRA && k != K_OPAQUE) &&
                    (c == '[') == is_array_kind(k);
        if ((*open && (k == K_OPAQUE || !fits)) || (!*open && k != K_SCALAR && k != K_OPAQUE))
            path_of(s, path, sizeof path);
        if (*open && k == K_OPAQUE && c == '{') {
            s->region = K_OPAQUE;
            s->which = strcmp(s->f[s->d - 1].key, "model") != 0;
            s->depth = 1;
            snprintf(s->rpath, sizeof s->rpath, "%s", path);
            s->i++;
            return 0;
        }
        if (*open && !fits) {
            ZR_TRY(count_extra(s, path));
            s->region = K_EXTRA;
            s->depth = 1;
            snprintf(s->rpath, sizeof s->rpath, "%s", path);
            s->i++;
            return 0;
        }
        if (*open) {
            if (s->d == MAXD)
                return 1;
            s->f[s->d++] = (frame){.k = k, .obj = c == '{'};
            s->i++;
            return 0;
        }
        if (k != K_SCALAR && k != K_OPAQUE) /* a scalar where the format has none */
            ZR_TRY(count_extra(s, path));
    }
    if (c == '"')
        return skip_string(s, NULL, 0) ? 0 : 1;
    size_t i0 = s->i;
    while (s->i < s->len && !strchr(",]} \t\r\n", s->t[s->i]) && s->t[s->i])
        s->i++;
    return s->i > i0 ? 0 : 1;
}

/* A container closes (c is '}' or ']'): its frame or one level of the region left. */
static int close_one(scan *s, char c)
{
    if (s->depth) {
        s->depth--;
        return 0;
    }
    if (s->d == 0 || s->f[s->d - 1].obj != (c == '}'))
        return 1;
    frame *f = &s->f[--s->d];
    const field *fl = fields_of(f->k);
    if (f->obj && fl && f->k != K_ROOT && f->known < n_fields(fl)) { /* not an item of its kind */
        char path[200]; /* the item: groups[3] */
        path_of(s, path, sizeof path);
        ZR_TRY(count_extra(s, path));
    }
    return 0;
}

/* After a value: ',' (the next member or item), or the container's end. */
static int after_value(scan *s, bool *expect_key, bool *done)
{
    skip_ws(s);
    if (s->d == 0 && !s->depth) {
        *done = true;
        return 0;
    }
    if (s->i >= s->len)
        return 1;
    char c = s->t[s->i++];
    if (c == '}' || c == ']') {
        ZR_TRY(close_one(s, c));
        return after_value(s, expect_key, done);
    }
    if (c != ',')
        return 1;
    if (!s->depth) {
        frame *f = &s->f[s->d - 1];
        f->idx++;
        *expect_key = f->obj;
    } else
        *expect_key = false; /* keys inside a region are skipped as values (counted once) */
    return 0;
}

int zck__manifest_bound(const char *text, size_t len, const char *what)
{
    scan s = {.t = text, .what = what, .len = len};
    bool expect_key = false, done = false;
    while (!done) {
        skip_ws(&s);
        if (s.i >= s.len)
            return 0;
        if (expect_key) { /* "key": in a frame of the format */
            frame *f = &s.f[s.d - 1];
            if (s.t[s.i] == '}' && !s.depth) {
                s.i++;
                int rc = close_one(&s, '}');
                if (rc)
                    return rc < 0 ? rc : 0;
                rc = after_value(&s, &expect_key, &done);
                if (rc)
                    return rc < 0 ? rc : 0;
                continue;
            }
            if (s.t[s.i] != '"' || !skip_string(&s, f->key, sizeof f->key))
                return 0;
            skip_ws(&s);
            if (s.i >= s.len || s.t[s.i++] != ':')
                return 0;
            expect_key = false;
            continue;
        }
        char c = s.t[s.i];
        if (c == '}' || c == ']') { /* an empty container */
            s.i++;
            int rc = close_one(&s, c);
            if (!rc)
                rc = after_value(&s, &expect_key, &done);
            if (rc)
                return rc < 0 ? rc : 0;
            continue;
        }
        if (s.depth && c == '"') { /* a key inside a region: skipped with its ':' */
            size_t at = s.i;
            if (!skip_string(&s, NULL, 0))
                return 0;
            skip_ws(&s);
            if (s.i < s.len && s.t[s.i] == ':') {
                s.i++;
                continue;
            }
            s.i = at;
        }
        bool open;
        int rc = value(&s, &open);
        if (rc)
            return rc < 0 ? rc : 0;
        if (open) {
            expect_key = !s.depth && s.f[s.d - 1].obj;
            continue;
        }
        rc = after_value(&s, &expect_key, &done);
        if (rc)
            return rc < 0 ? rc : 0;
    }
    return 0;
}
