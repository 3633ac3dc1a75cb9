/*
 * tokenizer.c: Hugging Face byte-level BPE tokenizers (zfmt.h, "byte-level BPE tokenizer"):
 * loading tokenizer.json, encoding, decoding.
 *
 * Encoding, as the `tokenizers` library does it for this family:
 *   1. added tokens (<|endoftext|>) are found in the raw text, leftmost and longest first; each
 *      is its own id and the text between them goes through 2-4;
 *   2. pre-tokenization: the text (a space prepended when add_prefix_space) is split into pieces
 *      by the pattern (GPT-2's for ByteLevel with use_regex; Split's regex in a Sequence), with
 *      PCRE2 in UTF and UCP mode, every gap between matches a piece of its own;
 *   3. each piece's bytes are its initial symbols (the vocab entry of each byte; a byte with no
 *      entry is dropped, as the library does without unk_token);
 *   4. BPE: repeatedly the adjacent pair with the lowest merge rank is merged, the leftmost of
 *      equal ranks first (a heap of candidate merges; stale entries are skipped when popped).
 *      With ignore_merges a piece that is a vocab entry as a whole is that entry.
 * Pieces seen before come from a cache (cleared when it grows past CACHE_MAX_WORDS).
 * Vocab entries are byte-level text (each byte a code point, GPT-2's bytes_to_unicode); they are
 * kept as raw bytes, so encoding and decoding work on bytes and never map text.
 */
#include "tok_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_MAX_WORDS ((size_t)1 << 18)
#define CACHE_MAX_IDS ((size_t)1 << 23)

typedef struct {
    char *content;
    size_t len;
    uint32_t id;
} added_token;

typedef struct {
    uint32_t id;
    int32_t prev, next;
    uint32_t len; /* 0: merged into the symbol before */
} sym;

typedef struct {
    uint32_t rank, pos, new_id;
} cand;

struct zfmt_tok {
    char *name;
    uint32_t vocab_n;
    uint32_t *tok_off, *tok_len;   /* id -> its bytes in tok_bytes; len UINT32_MAX: no such id */
    uint8_t *tok_bytes;
    zfmt__smap bytes_id;           /* raw bytes of a vocab entry -> id */
    uint32_t byte_id[256];
    zfmt__pmap merges;             /* (a, b) -> v rank, w merged id */
    bool ignore_merges, add_prefix_space, use_split;
    zfmt__split split;
    added_token *added;
    size_t n_added;
    bool added_first[256];
    zfmt__smap cache;              /* piece -> val: offset << 32 | count in cache_ids */
    uint32_t *cache_ids;
    size_t cache_n, cache_cap;
    sym *sy;
    size_t sy_cap;
    cand *hp;
    size_t hp_cap;
    uint8_t *tmp;                  /* a segment with its prefix space */
    size_t tmp_cap;
};

/* ---------------------------------------------------------------- loading */

static const char *type_of(json_t *o)
{
    json_t *t = json_is_object(o) ? json_object_get(o, "type") : NULL;
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static int refuse(const char *name, const char *field, json_t *o)
{
    const char *ty = type_of(o);
    if (ty)
        return zr_err_set(ZR_EUNSUPPORTED, "%s: %s of type '%s' is not supported (ztok reads "
                          "byte-level BPE tokenizers only)", name, field, ty);
    return zr_err_set(ZR_EUNSUPPORTED, "%s: %s is not supported (ztok reads byte-level BPE "
                      "tokenizers only)", name, field);
}

static bool flag(json_t *o, const char *key, bool def)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

/* ByteLevel, or Sequence [Split(regex, Isolated), ByteLevel(use_regex false)] */
static int load_pretok(zfmt_tok *t, json_t *pt)
{
    const char *ty = type_of(pt), *pattern = NULL;
    json_t *bl = pt;
    if (ty && !strcmp(ty, "Sequence")) {
        json_t *seq = json_object_get(pt, "pretokenizers");
        json_t *sp = json_array_get(seq, 0);
        bl = json_array_get(seq, 1);
        const char *st = type_of(sp), *beh = json_string_value(json_object_get(sp, "behavior"));
        json_t *pat = json_object_get(json_object_get(sp, "pattern"), "Regex");
        if (json_array_size(seq) != 2 || !st || strcmp(st, "Split") || !json_is_string(pat) ||
            !beh || strcmp(beh, "Isolated") || flag(sp, "invert", false) ||
            !type_of(bl) || strcmp(type_of(bl), "ByteLevel") || flag(bl, "use_regex", true) ||
            flag(bl, "add_prefix_space", false))
            return zr_err_set(ZR_EUNSUPPORTED, "%s: pre_tokenizer Sequence: only [Split (a "
                              "Regex pattern, behavior Isolated), ByteLevel (use_regex false, "
                              "add_prefix_space false)] is supported", t->name);
        pattern = json_string_value(pat);
    } else if (!ty || strcmp(ty, "ByteLevel")) {
        return refuse(t->name, "pre_tokenizer", pt);
    } else if (flag(bl, "use_regex", true)) {
        pattern = ZFMT__TOK_GPT2_PATTERN;
    }
    t->add_prefix_space = flag(bl, "add_prefix_space", false);
    if (pattern) {
        ZR_TRY(zfmt__split_init(&t->split, pattern, t->name));
        t->use_split = true;
    }
    return 0;
}

/* the fields of the tokenizer other than the model and added tokens */
static int load_pipeline(zfmt_tok *t, json_t *root)
{
    static const char *const must_be_null[] = {"truncation", "padding"};
    for (size_t i = 0; i < 2; i++)
        if (!json_is_null(json_object_get(root, must_be_null[i])) &&
            json_object_get(root, must_be_null[i]))
            return refuse(t->name, must_be_null[i], NULL);
    json_t *n = json_object_get(root, "normalizer");
    if (n && !json_is_null(n) &&
        !(type_of(n) && !strcmp(type_of(n), "Sequence") &&
          json_array_size(json_object_get(n, "normalizers")) == 0))
        return refuse(t->name, "normalizer", n);
    json_t *d = json_object_get(root, "decoder");
    if (!type_of(d) || strcmp(type_of(d), "ByteLevel"))
        return refuse(t->name, "decoder", d);
    json_t *pp = json_object_get(root, "post_processor");
    if (pp && !json_is_null(pp) && (!type_of(pp) || strcmp(type_of(pp), "ByteLevel")))
        return refuse(t->name, "post_processor", pp);
    json_t *pt = json_object_get(root, "pre_tokenizer");
    return load_pretok(t, pt);
}

static int check_model_options(zfmt_tok *t, json_t *m)
{
    if (!type_of(m) || strcmp(type_of(m), "BPE"))
        return refuse(t->name, "model", m);
    static const char *const null_or_empty[] = {"dropout", "continuing_subword_prefix",
                                                "end_of_word_suffix"};
    for (size_t i = 0; i < 3; i++) {
        json_t *v = json_object_get(m, null_or_empty[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !*json_string_value(v)))
            return zr_err_set(ZR_EUNSUPPORTED, "%s: model.%s is set; ztok supports byte-level "
                              "BPE without it", t->name, null_or_empty[i]);
    }
    if (flag(m, "byte_fallback", false))
        return zr_err_set(ZR_EUNSUPPORTED, "%s: model.byte_fallback is true; ztok supports "
                          "byte-level BPE without it", t->name);
    t->ignore_merges = flag(m, "ignore_merges", false);
    return 0;
}

/* Give id its text: raw bytes for a byte-level entry (also indexed by bytes), else the text. */
static int set_token(zfmt_tok *t, uint32_t id, const char *text, size_t n, bool byte_level,
                     size_t *used)
{
    if (t->tok_len[id] != UINT32_MAX)
        return zr_err_set(ZR_ECORRUPT, "%s: id %u is given to two tokens", t->name, id);
    uint8_t *dst = t->tok_bytes + *used;
    size_t k = n;
    if (!byte_level || !zfmt__tok_unmap(text, n, dst, &k)) {
        memcpy(dst, text, n);
        k = n;
        byte_level = false;
    }
    t->tok_off[id] = (uint32_t)*used;
    t->tok_len[id] = (uint32_t)k;
    *used += k;
    if (byte_level) {
        bool added;
        zfmt__smap_slot *s = zfmt__smap_put(&t->bytes_id, dst, k, zfmt__tok_hash(dst, k), id,
                                            &added);
        if (!s)
            return ZR_ENOMEM;
        if (!added)
            return zr_err_set(ZR_ECORRUPT, "%s: model.vocab: token '%s' appears twice", t->name,
                              text);
        if (k == 1)
            t->byte_id[dst[0]] = id;
    }
    return 0;
}

static int read_id(zfmt_tok *t, json_t *v, const char *what, const char *key, uint32_t *id)
{
    json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
    if (x < 0 || x >= ZFMT__TOK_MAX_ID)
        return zr_err_set(ZR_ECORRUPT, "%s: %s '%s': id is not an integer in [0, %u)", t->name,
                          what, key, ZFMT__TOK_MAX_ID);
    *id = (uint32_t)x;
    return 0;
}

/* the id table: vocab entries, then added tokens that are not in the vocab */
static int load_vocab(zfmt_tok *t, json_t *vocab)
{
    const char *key;
    json_t *v;
    size_t bytes = 0;
    uint32_t max = 0, id = 0;
    if (!json_is_object(vocab))
        return zr_err_set(ZR_ECORRUPT, "%s: model.vocab is not an object", t->name);
    json_object_foreach(vocab, key, v) {
        ZR_TRY(read_id(t, v, "model.vocab", key, &id));
        max = id > max ? id : max;
        bytes += strlen(key);
    }
    for (size_t i = 0; i < t->n_added; i++) {
        max = t->added[i].id > max ? t->added[i].id : max;
        bytes += t->added[i].len;
    }
    t->vocab_n = max + 1;
    t->tok_off = malloc(t->vocab_n * sizeof *t->tok_off);
    t->tok_len = malloc(t->vocab_n * sizeof *t->tok_len);
    t->tok_bytes = malloc(bytes + 1);
    if (!t->tok_off || !t->tok_len || !t->tok_bytes)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    memset(t->tok_len, 0xff, t->vocab_n * sizeof *t->tok_len);
    for (size_t b = 0; b < 256; b++)
        t->byte_id[b] = ZFMT__TOK_NONE;
    size_t used = 0;
    json_object_foreach(vocab, key, v) {
        ZR_TRY(read_id(t, v, "model.vocab", key, &id));
        ZR_TRY(set_token(t, id, key, strlen(key), true, &used));
    }
    for (size_t i = 0; i < t->n_added; i++)
        if (t->tok_len[t->added[i].id] == UINT32_MAX)
            ZR_TRY(set_token(t, t->added[i].id, t->added[i].content, t->added[i].len, false,
                             &used));
    return 0;
}

/* The id of the vocab entry tok[n] (its byte-level text) of merge i. */
static int vocab_lookup(zfmt_tok *t, const char *tok, size_t n, size_t i, uint32_t *id)
{
    size_t k;
    uint8_t *buf = malloc(n + 1);
    if (!buf)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    zfmt__smap_slot *s = NULL;
    if (zfmt__tok_unmap(tok, n, buf, &k))
        s = zfmt__smap_find(&t->bytes_id, buf, k, zfmt__tok_hash(buf, k));
    free(buf);
    if (!s)
        return zr_err_set(ZR_ECORRUPT, "%s: model.merges[%zu]: '%.*s%s' is not in the vocab",
                          t->name, i, n > 200 ? 200 : (int)n, tok, n > 200 ? "..." : "");
    *id = (uint32_t)s->val;
    return 0;
}

/* The two tokens of merge m (number i), "a b" or ["a", "b"], of any length: pointers into m's
 * strings, p[k] of len[k] bytes. */
static int merge_pair(const zfmt_tok *t, json_t *m, size_t i, const char *p[2], size_t len[2])
{
    const char *s = json_string_value(m), *sp = s ? strchr(s, ' ') : NULL;
    if (s && sp && !strchr(sp + 1, ' ')) {
        p[0] = s, len[0] = (size_t)(sp - s);
        p[1] = sp + 1, len[1] = strlen(sp + 1);
        return 0;
    }
    if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        for (int k = 0; k < 2; k++) {
            p[k] = json_string_value(json_array_get(m, (size_t)k));
            len[k] = strlen(p[k]);
        }
        return 0;
    }
    return zr_err_set(ZR_ECORRUPT, "%s: model.merges[%zu] is neither \"a b\" nor "
                      "[\"a\", \"b\"]", t->name, i);
}

static int load_merges(zfmt_tok *t, json_t *merges)
{
    if (!json_is_array(merges))
        return zr_err_set(ZR_ECORRUPT, "%s: model.merges is not an array", t->name);
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *pair[2] = {NULL, NULL};
        size_t plen[2] = {0, 0};
        ZR_TRY(merge_pair(t, m, i, pair, plen));
        uint32_t a, b;
        ZR_TRY(vocab_lookup(t, pair[0], plen[0], i, &a));
        ZR_TRY(vocab_lookup(t, pair[1], plen[1], i, &b));
        size_t la = t->tok_len[a], lb = t->tok_len[b];
        uint8_t *cat = malloc(la + lb + 1);
        if (!cat)
            return zr_err_set(ZR_ENOMEM, "out of memory");
        memcpy(cat, t->tok_bytes + t->tok_off[a], la);
        memcpy(cat + la, t->tok_bytes + t->tok_off[b], lb);
        zfmt__smap_slot *r = zfmt__smap_find(&t->bytes_id, cat, la + lb,
                                             zfmt__tok_hash(cat, la + lb));
        free(cat);
        if (!r) {
            int cut = plen[0] + plen[1] > 200;
            return zr_err_set(ZR_ECORRUPT, "%s: model.merges[%zu]: '%.*s%.*s%s' (the merged "
                              "token) is not in the vocab", t->name, i,
                              cut ? 100 : (int)plen[0], pair[0], cut ? 100 : (int)plen[1],
                              pair[1], cut ? "..." : "");
        }
        bool added;
        zfmt__pmap_slot *p = zfmt__pmap_put(&t->merges, a, b, &added);
        if (!p)
            return ZR_ENOMEM;
        p->v = (int64_t)i; /* a repeated pair takes its last rank, as the library's map does */
        p->w = (uint32_t)r->val;
    }
    return 0;
}

static int load_added(zfmt_tok *t, json_t *arr)
{
    if (arr && !json_is_null(arr) && !json_is_array(arr))
        return zr_err_set(ZR_ECORRUPT, "%s: added_tokens is not an array", t->name);
    size_t n = json_array_size(arr), i;
    json_t *a;
    if (n && !(t->added = calloc(n, sizeof *t->added)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    json_array_foreach(arr, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (!c || !*c)
            return zr_err_set(ZR_ECORRUPT, "%s: added_tokens[%zu] has no content", t->name, i);
        static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
        for (size_t k = 0; k < 3; k++)
            if (flag(a, flags[k], false))
                return zr_err_set(ZR_EUNSUPPORTED, "%s: added_tokens[%zu] ('%s'): %s is not "
                                  "supported", t->name, i, c, flags[k]);
        uint32_t id = 0;
        ZR_TRY(read_id(t, json_object_get(a, "id"), "added_tokens", c, &id));
        if (!(t->added[i].content = strdup(c)))
            return zr_err_set(ZR_ENOMEM, "out of memory");
        t->added[i].len = strlen(c);
        t->added[i].id = id;
        t->added_first[(uint8_t)c[0]] = true;
        t->n_added++;
    }
    return 0;
}

static int load_root(zfmt_tok *t, json_t *root)
{
    if (!json_is_object(root))
        return zr_err_set(ZR_ECORRUPT, "%s: not a JSON object", t->name);
    json_t *m = json_object_get(root, "model");
    ZR_TRY(check_model_options(t, m));
    ZR_TRY(load_pipeline(t, root));
    ZR_TRY(load_added(t, json_object_get(root, "added_tokens")));
    ZR_TRY(load_vocab(t, json_object_get(m, "vocab")));
    json_t *unk = json_object_get(m, "unk_token");
    if (unk && !json_is_null(unk))
        return zr_err_set(ZR_EUNSUPPORTED, "%s: model.unk_token is set; ztok supports "
                          "byte-level BPE without it", t->name);
    return load_merges(t, json_object_get(m, "merges"));
}

int zfmt_tok_load_mem(zfmt_tok **out, const char *json, size_t n_bytes, const char *name)
{
    zfmt_tok *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name))) {
        free(t);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    json_error_t jerr;
    json_t *root = json_loadb(json, n_bytes, JSON_REJECT_DUPLICATES, &jerr);
    int rc = root ? load_root(t, root)
                  : zr_err_set(ZR_ECORRUPT, "%s:%d: not a tokenizer.json: %s", name, jerr.line,
                               jerr.text);
    json_decref(root);
    if (rc < 0) {
        zfmt_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int zfmt_tok_load(zfmt_tok **out, const char *path)
{
    char *buf;
    size_t n;
    ZR_TRY(zfmt__read_file(&buf, &n, path));
    int rc = zfmt_tok_load_mem(out, buf, n, path);
    free(buf);
    return rc;
}

int zfmt_tok_read(char **out, size_t *n_bytes, uint32_t *vocab, const char *path)
{
    char *buf;
    size_t n;
    zfmt_tok *t;
    ZR_TRY(zfmt__read_file(&buf, &n, path));
    int rc = zfmt_tok_load_mem(&t, buf, n, path);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *vocab = zfmt_tok_vocab(t);
    zfmt_tok_free(t);
    *out = buf;
    *n_bytes = n;
    return 0;
}

void zfmt_tok_free(zfmt_tok *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    zfmt__split_free(&t->split);
    zfmt__smap_free(&t->bytes_id);
    zfmt__smap_free(&t->cache);
    zfmt__pmap_free(&t->merges);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_bytes);
    free(t->cache_ids);
    free(t->sy);
    free(t->hp);
    free(t->tmp);
    free(t->name);
    free(t);
}

uint32_t zfmt_tok_vocab(const zfmt_tok *t) { return t->vocab_n; }

int64_t zfmt_tok_id(const zfmt_tok *t, const char *text)
{
    size_t n = strlen(text);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, text, n))
            return t->added[i].id;
    zfmt__smap_slot *s = zfmt__smap_find(&t->bytes_id, (const uint8_t *)text, n,
                                         zfmt__tok_hash((const uint8_t *)text, n));
    return s ? (int64_t)s->val : -1;
}

/* ---------------------------------------------------------------- BPE */

static int push_ids(zfmt_tok_ids *v, const uint32_t *ids, size_t n)
{
    ZR_TRY(zfmt__grow((void **)&v->id, &v->cap, v->n + n, sizeof *v->id, 1024, "token ids"));
    memcpy(v->id + v->n, ids, n * sizeof *ids);
    v->n += n;
    return 0;
}

void zfmt_tok_ids_free(zfmt_tok_ids *v)
{
    free(v->id);
    memset(v, 0, sizeof *v);
}

static bool cand_less(const cand *x, const cand *y)
{
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i && cand_less(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c]))
            c++;
        if (!cand_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static void try_pair(zfmt_tok *t, size_t *nh, int32_t pos)
{
    int32_t nx = t->sy[pos].next;
    if (nx < 0)
        return;
    zfmt__pmap_slot *m = zfmt__pmap_find(&t->merges, t->sy[pos].id, t->sy[nx].id);
    if (m)
        heap_push(t->hp, nh, (cand){(uint32_t)m->v, (uint32_t)pos, m->w});
}

static int grow_work(zfmt_tok *t, size_t n)
{
    if (n <= t->sy_cap)
        return 0;
    size_t cap = n < 64 ? 64 : n * 2;
    sym *s = realloc(t->sy, cap * sizeof *s);
    if (s)
        t->sy = s;
    cand *h = s ? realloc(t->hp, 2 * cap * sizeof *h) : NULL;
    if (!h)
        return zr_err_set(ZR_ENOMEM, "out of memory (a word of %zu bytes)", n);
    t->hp = h;
    t->sy_cap = cap;
    return 0;
}

/* The ids of one piece into out (not cached). */
static int bpe_piece(zfmt_tok *t, const uint8_t *p, size_t n, zfmt_tok_ids *out)
{
    ZR_TRY(grow_work(t, n));
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = t->byte_id[p[i]];
        if (id == ZFMT__TOK_NONE)
            continue;
        t->sy[ns] = (sym){id, ns - 1, ns + 1, 1};
        ns++;
    }
    if (!ns)
        return 0;
    t->sy[ns - 1].next = -1;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        try_pair(t, &nh, i);
    while (nh) {
        cand c = heap_pop(t->hp, &nh);
        sym *s = &t->sy[c.pos];
        if (!s->len || s->next < 0)
            continue;
        sym *r = &t->sy[s->next];
        zfmt__pmap_slot *m = zfmt__pmap_find(&t->merges, s->id, r->id);
        if (!m || m->w != c.new_id)
            continue;
        s->id = c.new_id;
        s->len += r->len;
        r->len = 0;
        s->next = r->next;
        if (s->next >= 0)
            t->sy[s->next].prev = (int32_t)c.pos;
        if (s->prev >= 0)
            try_pair(t, &nh, s->prev);
        try_pair(t, &nh, (int32_t)c.pos);
    }
    for (int32_t i = 0; i >= 0; i = t->sy[i].next)
        ZR_TRY(push_ids(out, &t->sy[i].id, 1));
    return 0;
}

/* One piece: a single byte, the cache, a whole vocab entry (ignore_merges), else BPE. */
static int encode_piece(zfmt_tok *t, const uint8_t *p, size_t n, zfmt_tok_ids *out)
{
    if (n == 1 && t->byte_id[p[0]] != ZFMT__TOK_NONE)
        return push_ids(out, &t->byte_id[p[0]], 1);
    uint64_t h = zfmt__tok_hash(p, n);
    zfmt__smap_slot *s = zfmt__smap_find(&t->cache, p, n, h);
    if (s)
        return push_ids(out, t->cache_ids + (s->val >> 32), (size_t)(s->val & 0xffffffffu));
    size_t before = out->n;
    zfmt__smap_slot *whole = t->ignore_merges ? zfmt__smap_find(&t->bytes_id, p, n, h) : NULL;
    if (whole) {
        uint32_t id = (uint32_t)whole->val;
        ZR_TRY(push_ids(out, &id, 1));
    } else {
        ZR_TRY(bpe_piece(t, p, n, out));
    }
    size_t k = out->n - before;
    if (t->cache.n >= CACHE_MAX_WORDS || t->cache_n + k > CACHE_MAX_IDS) {
        zfmt__smap_clear(&t->cache);
        t->cache_n = 0;
    }
    if (zfmt__grow((void **)&t->cache_ids, &t->cache_cap, t->cache_n + k,
                   sizeof *t->cache_ids, 4096, "word cache") < 0) {
        zr_err_clear();
        return 0; /* the cache is an optimization: no room, no entry */
    }
    bool added;
    if (!zfmt__smap_put(&t->cache, p, n, h, (uint64_t)t->cache_n << 32 | k, &added))
        return 0;
    memcpy(t->cache_ids + t->cache_n, out->id + before, k * sizeof *out->id);
    t->cache_n += k;
    return 0;
}

/* progress through the text, every PROGRESS_BYTES */
#define PROGRESS_BYTES ((size_t)4 << 20)
typedef struct {
    const zck_progress *p;
    size_t total, next;
} enc_prog;

static void report(enc_prog *pr, size_t done)
{
    if (pr->p && pr->p->fn && done >= pr->next) {
        pr->p->fn(pr->p->ctx, "encode", done, pr->total);
        pr->next = done + PROGRESS_BYTES;
    }
}

/* text between added tokens (at offset base of the whole): prefix space, split, pieces */
static int encode_segment(zfmt_tok *t, const uint8_t *p, size_t n, zfmt_tok_ids *out,
                          enc_prog *pr, size_t base)
{
    if (!n)
        return 0;
    if (t->add_prefix_space && p[0] != ' ') {
        if (n + 1 > t->tmp_cap) {
            uint8_t *b = realloc(t->tmp, n + 1);
            if (!b)
                return zr_err_set(ZR_ENOMEM, "out of memory");
            t->tmp = b;
            t->tmp_cap = n + 1;
        }
        t->tmp[0] = ' ';
        memcpy(t->tmp + 1, p, n);
        p = t->tmp;
        n++;
        base--;
    }
    if (!t->use_split)
        return encode_piece(t, p, n, out);
    size_t pos = 0, s, e;
    while (zfmt__split_next(&t->split, p, n, &pos, &s, &e)) {
        ZR_TRY(encode_piece(t, p + s, e - s, out));
        report(pr, base + e);
    }
    return 0;
}

/* the longest added token at p, or NULL */
static const added_token *added_at(const zfmt_tok *t, const uint8_t *p, size_t n)
{
    const added_token *best = NULL;
    for (size_t i = 0; i < t->n_added; i++) {
        const added_token *a = &t->added[i];
        if (a->len <= n && (!best || a->len > best->len) && !memcmp(p, a->content, a->len))
            best = a;
    }
    return best;
}

int zfmt_tok_encode(zfmt_tok_ids *out, zfmt_tok *t, const char *text, size_t n_bytes,
                    const zck_progress *progress)
{
    const uint8_t *p = (const uint8_t *)text;
    ZR_TRY(zfmt__tok_check_utf8(p, n_bytes, "text"));
    enc_prog pr = {progress, n_bytes, PROGRESS_BYTES};
    size_t seg = 0;
    for (size_t i = 0; i < n_bytes;) {
        const added_token *a = t->added_first[p[i]] ? added_at(t, p + i, n_bytes - i) : NULL;
        if (!a) {
            i++;
            continue;
        }
        ZR_TRY(encode_segment(t, p + seg, i - seg, out, &pr, seg));
        ZR_TRY(push_ids(out, &a->id, 1));
        i += a->len;
        seg = i;
    }
    ZR_TRY(encode_segment(t, p + seg, n_bytes - seg, out, &pr, seg));
    if (progress && progress->fn)
        progress->fn(progress->ctx, "encode", n_bytes, n_bytes);
    return 0;
}

int zfmt_tok_decode(char **out, size_t *n_bytes, const zfmt_tok *t, const uint32_t *ids,
                    size_t n)
{
    return zfmt__tok_decode_from(out, n_bytes, t, ids, n, NULL);
}

const char *zfmt__tok_name(const zfmt_tok *t) { return t->name; }

int zfmt__tok_decode_from(char **out, size_t *n_bytes, const zfmt_tok *t, const uint32_t *ids,
                          size_t n, const char *src)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < t->vocab_n && t->tok_len[ids[i]] != UINT32_MAX) {
            total += t->tok_len[ids[i]];
            continue;
        }
        if (src)
            return zr_err_set(ZR_EINVAL, "%s: id %u (position %zu) is not in the tokenizer %s "
                              "(vocab %u)", src, ids[i], i, t->name, t->vocab_n);
        return zr_err_set(ZR_EINVAL, "%s: id %u (position %zu) is not in the tokenizer "
                          "(vocab %u)", t->name, ids[i], i, t->vocab_n);
    }
    char *s = malloc(total + 1);
    if (!s)
        return zr_err_set(ZR_ENOMEM, "out of memory (%zu bytes of text)", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s + k, t->tok_bytes + t->tok_off[ids[i]], t->tok_len[ids[i]]);
        k += t->tok_len[ids[i]];
    }
    s[k] = 0;
    *out = s;
    *n_bytes = k;
    return 0;
}
