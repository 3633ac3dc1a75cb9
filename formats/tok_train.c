/*
 * tok_train.c: byte-level BPE training (zfmt_tok_train) and writing the result as a Hugging
 * Face tokenizer.json.
 *
 * 1. Every file is split with GPT-2's pattern (tok_util.c) and its words counted (a word: the
 *    bytes of one piece; its count: how many times it occurs in all the files). Occurrences of
 *    the special token are cut out first (the text on either side is split on its own).
 * 2. Each word starts as its bytes (ids 0..255 are the bytes). Adjacent pairs are counted over
 *    the words, each weighted by the word's count; a pair also remembers the words it occurs in.
 * 3. Repeatedly the pair with the highest count is merged into a new token (id: the next one;
 *    the token already present when two merges spell the same bytes, as the library's trainer
 *    does), in every word that holds it, left to right; the counts of the neighbouring pairs are
 *    updated by the difference. Ties go to the smallest (left id, right id), so the result is a
 *    function of the corpus alone. The best pair comes from a heap whose entries may be stale
 *    (a count that went down since): popped, compared with the current count and pushed again.
 * 4. It stops at the target vocabulary (bytes + merges + the special token) or when no pair is
 *    left. The special token gets the last id.
 */
#include "tok_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t *s;          /* symbols */
    uint32_t n;
    uint64_t count;
    uint64_t stamp;       /* the last merge that visited the word */
} word;

typedef struct {
    uint32_t *w;
    size_t n, cap;
} wlist;

typedef struct {
    int64_t count;
    uint32_t a, b;
} hent;

typedef struct {
    word *words;
    size_t n_words;
    zfmt__pmap pairs;       /* (a, b) -> v count, w index into where */
    wlist *where;
    size_t n_where, cap_where;
    hent *heap;
    size_t n_heap, cap_heap;
    uint8_t **tok;          /* id -> bytes */
    uint32_t *tok_len;
    size_t n_tok, cap_tok;
    zfmt__smap tok_id;      /* bytes -> id */
    uint32_t (*merge)[2];
    size_t n_merges;
} trainer;

/* ---------------------------------------------------------------- counting words */

/* Count the pieces of text[0, n) into words. */
static int count_text(zfmt__smap *words, zfmt__split *sp, const uint8_t *text, size_t n,
                      zfmt__prog *pr, size_t *reported, size_t base)
{
    size_t pos = 0, s, e;
    while (zfmt__split_next(sp, text, n, &pos, &s, &e)) {
        bool added;
        zfmt__smap_slot *sl = zfmt__smap_put(words, text + s, e - s,
                                             zfmt__tok_hash(text + s, e - s), 0, &added);
        if (!sl)
            return ZR_ENOMEM;
        sl->val++;
        if (base + e - *reported >= ((size_t)1 << 20)) {
            zfmt__prog_add(pr, base + e - *reported);
            *reported = base + e;
        }
    }
    return 0;
}

/* Count the words of a file; the special token's occurrences are cut out first (the text
 * between them is counted), as the library's trainer does with added tokens. */
static int count_file(zfmt__smap *words, zfmt__split *sp, const char *path, const char *special,
                      zfmt__prog *pr)
{
    char *text;
    size_t n, reported = 0, k = special ? strlen(special) : 0;
    ZR_TRY(zfmt__read_file(&text, &n, path));
    int rc = zfmt__tok_check_utf8((const uint8_t *)text, n, path);
    for (size_t at = 0; rc == 0 && at <= n;) {
        const char *hit = k ? memmem(text + at, n - at, special, k) : NULL;
        size_t end = hit ? (size_t)(hit - text) : n;
        rc = count_text(words, sp, (const uint8_t *)text + at, end - at, pr, &reported, at);
        at = hit ? end + k : n + 1;
    }
    zfmt__prog_add(pr, n - reported);
    free(text);
    return rc;
}

/* ---------------------------------------------------------------- pair bookkeeping */

static bool hent_before(const hent *x, const hent *y)
{
    if (x->count != y->count)
        return x->count > y->count;
    return x->a != y->a ? x->a < y->a : x->b < y->b;
}

static int heap_push(trainer *tr, hent e)
{
    ZR_TRY(zfmt__grow((void **)&tr->heap, &tr->cap_heap, tr->n_heap + 1, sizeof *tr->heap, 4096,
                      "training heap"));
    size_t i = tr->n_heap++;
    while (i && hent_before(&e, &tr->heap[(i - 1) / 2])) {
        tr->heap[i] = tr->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    tr->heap[i] = e;
    return 0;
}

static hent heap_pop(trainer *tr)
{
    hent *h = tr->heap, top = h[0], last = h[--tr->n_heap];
    size_t i = 0, n = tr->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && hent_before(&h[c + 1], &h[c]))
            c++;
        if (!hent_before(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (n)
        h[i] = last;
    return top;
}

/* Add delta to the count of (a, b); a positive delta records word w and pushes the pair. */
static int pair_add(trainer *tr, uint32_t a, uint32_t b, int64_t delta, uint32_t w, bool push)
{
    bool added;
    zfmt__pmap_slot *p = zfmt__pmap_put(&tr->pairs, a, b, &added);
    if (!p)
        return ZR_ENOMEM;
    if (added) {
        ZR_TRY(zfmt__grow((void **)&tr->where, &tr->cap_where, tr->n_where + 1,
                          sizeof *tr->where, 4096, "training pairs"));
        p->w = (uint32_t)tr->n_where;
        tr->where[tr->n_where++] = (wlist){0};
    }
    p->v += delta;
    if (delta <= 0)
        return 0;
    wlist *l = &tr->where[p->w];
    if (!l->n || l->w[l->n - 1] != w) {
        ZR_TRY(zfmt__grow((void **)&l->w, &l->cap, l->n + 1, sizeof *l->w, 4, "training pairs"));
        l->w[l->n++] = w;
    }
    return push ? heap_push(tr, (hent){p->v, a, b}) : 0;
}

/* ---------------------------------------------------------------- tokens */

static int add_token(trainer *tr, const uint8_t *p, size_t n, uint32_t *id)
{
    bool added;
    zfmt__smap_slot *s = zfmt__smap_put(&tr->tok_id, p, n, zfmt__tok_hash(p, n), tr->n_tok,
                                        &added);
    if (!s)
        return ZR_ENOMEM;
    *id = (uint32_t)s->val;
    if (!added)
        return 0;
    if (tr->n_tok == tr->cap_tok) {
        size_t cap = tr->cap_tok ? tr->cap_tok * 2 : 1024;
        uint8_t **t = realloc(tr->tok, cap * sizeof *t);
        if (t)
            tr->tok = t;
        uint32_t *l = t ? realloc(tr->tok_len, cap * sizeof *l) : NULL;
        if (!l)
            return zr_err_set(ZR_ENOMEM, "out of memory");
        tr->tok_len = l;
        tr->cap_tok = cap;
    }
    if (!(tr->tok[tr->n_tok] = malloc(n ? n : 1)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    memcpy(tr->tok[tr->n_tok], p, n);
    tr->tok_len[tr->n_tok++] = (uint32_t)n;
    return 0;
}

/* words from the counted pieces; the byte tokens; the initial pair counts */
static int trainer_init(trainer *tr, const zfmt__smap *counts)
{
    for (unsigned b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        uint32_t id;
        ZR_TRY(add_token(tr, &c, 1, &id));
    }
    tr->words = calloc(counts->n ? counts->n : 1, sizeof *tr->words);
    if (!tr->words)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < counts->cap; i++) {
        const zfmt__smap_slot *s = &counts->s[i];
        if (!s->used || s->len < 2)
            continue; /* a one-byte word has no pair */
        word *w = &tr->words[tr->n_words];
        if (!(w->s = malloc(s->len * sizeof *w->s)))
            return zr_err_set(ZR_ENOMEM, "out of memory");
        const uint8_t *k = zfmt__smap_key(counts, s);
        for (uint32_t j = 0; j < s->len; j++)
            w->s[j] = k[j];
        w->n = s->len;
        w->count = s->val;
        tr->n_words++;
    }
    for (size_t wi = 0; wi < tr->n_words; wi++) {
        const word *w = &tr->words[wi];
        for (uint32_t j = 0; j + 1 < w->n; j++)
            ZR_TRY(pair_add(tr, w->s[j], w->s[j + 1], (int64_t)w->count, (uint32_t)wi, false));
    }
    for (size_t i = 0; i < tr->pairs.cap; i++) {
        const zfmt__pmap_slot *p = &tr->pairs.s[i];
        if (p->key && p->v > 0)
            ZR_TRY(heap_push(tr, (hent){p->v, (uint32_t)((p->key - 1) >> 32),
                                        (uint32_t)(p->key - 1)}));
    }
    return 0;
}

/* Replace (a, b) by c in word wi, left to right, updating the neighbours' counts. */
static int merge_word(trainer *tr, uint32_t wi, uint32_t a, uint32_t b, uint32_t c)
{
    word *w = &tr->words[wi];
    int64_t k = (int64_t)w->count;
    for (uint32_t i = 0; i + 1 < w->n; i++) {
        if (w->s[i] != a || w->s[i + 1] != b)
            continue;
        ZR_TRY(pair_add(tr, a, b, -k, wi, false));
        if (i > 0) {
            ZR_TRY(pair_add(tr, w->s[i - 1], a, -k, wi, false));
            ZR_TRY(pair_add(tr, w->s[i - 1], c, k, wi, true));
        }
        if (i + 2 < w->n) {
            ZR_TRY(pair_add(tr, b, w->s[i + 2], -k, wi, false));
            ZR_TRY(pair_add(tr, c, w->s[i + 2], k, wi, true));
        }
        w->s[i] = c;
        memmove(w->s + i + 1, w->s + i + 2, (w->n - i - 2) * sizeof *w->s);
        w->n--;
    }
    return 0;
}

/* The best pair, or false when none is left. */
static bool best_pair(trainer *tr, hent *out)
{
    while (tr->n_heap) {
        hent e = heap_pop(tr);
        zfmt__pmap_slot *p = zfmt__pmap_find(&tr->pairs, e.a, e.b);
        int64_t cur = p ? p->v : 0;
        if (cur == e.count && cur > 0) {
            *out = e;
            return true;
        }
        if (cur > 0 && cur < e.count && heap_push(tr, (hent){cur, e.a, e.b}) < 0)
            return false;
    }
    return false;
}

static int learn(trainer *tr, uint32_t n_merges, zfmt__prog *pr)
{
    if (!(tr->merge = malloc((n_merges ? n_merges : 1) * sizeof *tr->merge)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    hent e;
    while (tr->n_merges < n_merges && best_pair(tr, &e)) {
        size_t la = tr->tok_len[e.a], lb = tr->tok_len[e.b];
        uint8_t *cat = malloc(la + lb);
        if (!cat)
            return zr_err_set(ZR_ENOMEM, "out of memory");
        memcpy(cat, tr->tok[e.a], la);
        memcpy(cat + la, tr->tok[e.b], lb);
        uint32_t c;
        int rc = add_token(tr, cat, la + lb, &c);
        free(cat);
        ZR_TRY(rc);
        tr->merge[tr->n_merges][0] = e.a;
        tr->merge[tr->n_merges][1] = e.b;
        tr->n_merges++;
        uint64_t stamp = tr->n_merges;
        zfmt__pmap_slot *p = zfmt__pmap_find(&tr->pairs, e.a, e.b);
        wlist l = tr->where[p->w];
        tr->where[p->w] = (wlist){0}; /* merged everywhere: the list is done with */
        for (size_t i = 0; i < l.n; i++) {
            word *w = &tr->words[l.w[i]];
            if (w->stamp == stamp)
                continue;
            w->stamp = stamp;
            ZR_TRY(merge_word(tr, l.w[i], e.a, e.b, c));
        }
        free(l.w);
        zfmt__prog_add(pr, 1);
    }
    return 0;
}

static void trainer_free(trainer *tr)
{
    for (size_t i = 0; i < tr->n_words; i++)
        free(tr->words[i].s);
    free(tr->words);
    for (size_t i = 0; i < tr->n_where; i++)
        free(tr->where[i].w);
    free(tr->where);
    zfmt__pmap_free(&tr->pairs);
    free(tr->heap);
    for (size_t i = 0; i < tr->n_tok; i++)
        free(tr->tok[i]);
    free(tr->tok);
    free(tr->tok_len);
    zfmt__smap_free(&tr->tok_id);
    free(tr->merge);
}

/* ---------------------------------------------------------------- tokenizer.json */

static json_t *byte_level(void)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 1, "use_regex", 1);
}

static int set_mapped(json_t *obj, const uint8_t *p, size_t n, json_t *val)
{
    char *k = zfmt__tok_map(p, n);
    int rc = k && val ? json_object_set_new(obj, k, val) : -1;
    if (!k || !val)
        json_decref(val);
    free(k);
    return rc < 0 ? zr_err_set(ZR_ENOMEM, "out of memory") : 0;
}

static int build_json(json_t **out, const trainer *tr, const char *special)
{
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    json_t *root = json_object();
    int rc = vocab && merges && added && root ? 0 : zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < tr->n_tok && !rc; i++)
        rc = set_mapped(vocab, tr->tok[i], tr->tok_len[i], json_integer((json_int_t)i));
    for (size_t i = 0; i < tr->n_merges && !rc; i++) {
        char *a = zfmt__tok_map(tr->tok[tr->merge[i][0]], tr->tok_len[tr->merge[i][0]]);
        char *b = zfmt__tok_map(tr->tok[tr->merge[i][1]], tr->tok_len[tr->merge[i][1]]);
        json_t *m = a && b ? json_pack("[s, s]", a, b) : NULL;
        rc = m ? json_array_append_new(merges, m) : zr_err_set(ZR_ENOMEM, "out of memory");
        free(a);
        free(b);
    }
    if (!rc && special && *special && json_object_get(vocab, special))
        rc = zr_err_set(ZR_EINVAL, "the special token '%s' was also learned as a merge; choose "
                        "another special token", special);
    if (!rc && special && *special) {
        json_t *s = json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                              (json_int_t)tr->n_tok, "content", special, "single_word", 0,
                              "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
        rc = s && !json_array_append_new(added, s) &&
                     !json_object_set_new(vocab, special, json_integer((json_int_t)tr->n_tok))
                 ? 0 : zr_err_set(ZR_ENOMEM, "out of memory");
    }
    json_t *model = rc ? NULL : json_pack(
        "{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:O, s:O}", "type", "BPE", "dropout",
        "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
        "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    if (!rc && (!model ||
                json_object_set_new(root, "version", json_string("1.0")) ||
                json_object_set_new(root, "truncation", json_null()) ||
                json_object_set_new(root, "padding", json_null()) ||
                json_object_set(root, "added_tokens", added) ||
                json_object_set_new(root, "normalizer", json_null()) ||
                json_object_set_new(root, "pre_tokenizer", byte_level()) ||
                json_object_set_new(root, "post_processor", byte_level()) ||
                json_object_set_new(root, "decoder", byte_level()) ||
                json_object_set_new(root, "model", model)))
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    json_decref(vocab);
    json_decref(merges);
    json_decref(added);
    if (rc) {
        json_decref(root);
        return rc;
    }
    *out = root;
    return 0;
}

static int write_json(const char *path, json_t *root)
{
    char *text = zfmt__json_dump(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    if (!text)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    zfmt__out *o;
    int rc = zfmt__out_open(&o, path);
    if (rc == 0) {
        rc = zfmt__out_write(o, text, strlen(text));
        if (rc == 0)
            rc = zfmt__out_write(o, "\n", 1);
        if (rc == 0)
            rc = zfmt__out_commit(o);
        zfmt__out_free(o);
    }
    free(text);
    return rc;
}

int zfmt_tok_train(const char *out_json, const char *const *files, size_t n_files,
                   const zfmt_tok_train_opts *o)
{
    uint32_t n_special = o->special && *o->special ? 1 : 0;
    if (o->vocab < 256 + n_special || o->vocab > ZFMT__TOK_MAX_ID)
        return zr_err_set(ZR_EINVAL, "vocabulary %u: expected %u (the bytes%s) to %u", o->vocab,
                          256 + n_special, n_special ? " and the special token" : "",
                          ZFMT__TOK_MAX_ID);
    zfmt__split sp;
    ZR_TRY(zfmt__split_init(&sp, ZFMT__TOK_GPT2_PATTERN, "GPT-2 pattern"));
    zfmt__smap counts = {0};
    trainer tr = {0};
    zfmt__prog pr;
    zfmt__prog_init(&pr, &o->progress, "count", 0);
    int rc = 0;
    for (size_t i = 0; i < n_files && rc == 0; i++)
        rc = count_file(&counts, &sp, files[i], n_special ? o->special : NULL, &pr);
    zfmt__split_free(&sp);
    if (rc == 0)
        rc = trainer_init(&tr, &counts);
    zfmt__smap_free(&counts);
    zfmt__prog_init(&pr, &o->progress, "merge", o->vocab - 256 - n_special);
    if (rc == 0)
        rc = learn(&tr, o->vocab - 256 - n_special, &pr);
    json_t *root = NULL;
    if (rc == 0)
        rc = build_json(&root, &tr, n_special ? o->special : NULL);
    if (rc == 0)
        rc = write_json(out_json, root);
    json_decref(root);
    trainer_free(&tr);
    return rc;
}
