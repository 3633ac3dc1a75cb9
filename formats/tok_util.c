/*
 * tok_util.c: the pieces the byte-level BPE files share (tok_int.h): hash maps of byte strings
 * and of id pairs, GPT-2's byte-to-unicode mapping, the pre-tokenizer's split with PCRE2 (UTF +
 * UCP: Unicode categories from the library, not hand-typed ranges), UTF-8 validation and whole
 * file reads.
 */
#include "tok_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- hashing */

uint64_t zfmt__tok_hash(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, p, n);
    h = (h ^ v) * 0x94d049bb133111ebull;
    return h ^ (h >> 32);
}

/* ---------------------------------------------------------------- byte strings -> value */

zfmt__smap_slot *zfmt__smap_find(const zfmt__smap *m, const uint8_t *p, size_t n, uint64_t h)
{
    if (!m->cap)
        return NULL;
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        zfmt__smap_slot *s = &m->s[i];
        if (!s->used)
            return NULL;
        if (s->h == h && s->len == n && !memcmp(m->arena + s->off, p, n))
            return s;
    }
}

static int smap_grow(zfmt__smap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    zfmt__smap_slot *s = calloc(cap, sizeof *s);
    if (!s)
        return zr_err_set(ZR_ENOMEM, "out of memory (hash table of %zu entries)", cap);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->s[i].used)
            continue;
        size_t j = m->s[i].h & (cap - 1);
        while (s[j].used)
            j = (j + 1) & (cap - 1);
        s[j] = m->s[i];
    }
    free(m->s);
    m->s = s;
    m->cap = cap;
    return 0;
}

zfmt__smap_slot *zfmt__smap_put(zfmt__smap *m, const uint8_t *p, size_t n, uint64_t h,
                                uint64_t val, bool *added)
{
    zfmt__smap_slot *s = zfmt__smap_find(m, p, n, h);
    *added = false;
    if (s)
        return s;
    if ((m->n + 1) * 2 > m->cap && smap_grow(m) < 0)
        return NULL;
    if (m->arena_n + n > m->arena_cap) {
        size_t cap = m->arena_cap ? m->arena_cap : 4096;
        while (cap < m->arena_n + n)
            cap *= 2;
        if (cap > UINT32_MAX) {
            zr_err_set(ZR_ENOMEM, "hash table keys over 4 GiB");
            return NULL;
        }
        uint8_t *a = realloc(m->arena, cap);
        if (!a) {
            zr_err_set(ZR_ENOMEM, "out of memory (%zu bytes of keys)", cap);
            return NULL;
        }
        m->arena = a;
        m->arena_cap = cap;
    }
    size_t i = h & (m->cap - 1);
    while (m->s[i].used)
        i = (i + 1) & (m->cap - 1);
    s = &m->s[i];
    if (n)
        memcpy(m->arena + m->arena_n, p, n);
    *s = (zfmt__smap_slot){.h = h, .off = (uint32_t)m->arena_n, .len = (uint32_t)n, .val = val,
                           .used = true};
    m->arena_n += n;
    m->n++;
    *added = true;
    return s;
}

void zfmt__smap_clear(zfmt__smap *m)
{
    if (m->s)
        memset(m->s, 0, m->cap * sizeof *m->s);
    m->n = 0;
    m->arena_n = 0;
}

void zfmt__smap_free(zfmt__smap *m)
{
    free(m->s);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- pairs -> value */

static size_t pair_slot(uint64_t key, size_t cap)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 31)) & (cap - 1);
}

zfmt__pmap_slot *zfmt__pmap_find(const zfmt__pmap *m, uint32_t a, uint32_t b)
{
    if (!m->cap)
        return NULL;
    uint64_t key = ((uint64_t)a << 32 | b) + 1;
    for (size_t i = pair_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->s[i].key == key)
            return &m->s[i];
        if (!m->s[i].key)
            return NULL;
    }
}

zfmt__pmap_slot *zfmt__pmap_put(zfmt__pmap *m, uint32_t a, uint32_t b, bool *added)
{
    zfmt__pmap_slot *f = zfmt__pmap_find(m, a, b);
    *added = false;
    if (f)
        return f;
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        zfmt__pmap_slot *s = calloc(cap, sizeof *s);
        if (!s) {
            zr_err_set(ZR_ENOMEM, "out of memory (pair table of %zu entries)", cap);
            return NULL;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->s[i].key)
                continue;
            size_t j = pair_slot(m->s[i].key, cap);
            while (s[j].key)
                j = (j + 1) & (cap - 1);
            s[j] = m->s[i];
        }
        free(m->s);
        m->s = s;
        m->cap = cap;
    }
    uint64_t key = ((uint64_t)a << 32 | b) + 1;
    size_t i = pair_slot(key, m->cap);
    while (m->s[i].key)
        i = (i + 1) & (m->cap - 1);
    m->s[i] = (zfmt__pmap_slot){.key = key};
    m->n++;
    *added = true;
    return &m->s[i];
}

void zfmt__pmap_free(zfmt__pmap *m)
{
    free(m->s);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- byte-level mapping */

/* Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves; the other 68 bytes, in byte
 * order, for 256, 257, ... (GPT-2's bytes_to_unicode). */
static bool printable(unsigned b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* byte -> code point, code point -> byte (-1 for none): built once */
static uint16_t byte_cp[256];
static int16_t cp_byte[256 + 68];
static pthread_once_t cp_once = PTHREAD_ONCE_INIT;
static void cp_init(void)
{
    memset(cp_byte, 0xff, sizeof cp_byte);
    uint16_t k = 256;
    for (unsigned b = 0; b < 256; b++) {
        byte_cp[b] = printable(b) ? (uint16_t)b : k++;
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

uint32_t zfmt__tok_byte_cp(uint8_t b)
{
    pthread_once(&cp_once, cp_init);
    return byte_cp[b];
}

bool zfmt__tok_unmap(const char *s, size_t n, uint8_t *out, size_t *out_n)
{
    pthread_once(&cp_once, cp_init);
    const uint8_t *p = (const uint8_t *)s;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        if (p[i] < 0x80)
            cp = p[i++];
        else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n)
            cp = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F), i += 2;
        else
            return false; /* 3- and 4-byte sequences are beyond the 324 code points */
        if (cp >= sizeof cp_byte / sizeof *cp_byte || cp_byte[cp] < 0)
            return false;
        out[k++] = (uint8_t)cp_byte[cp];
    }
    *out_n = k;
    return true;
}

char *zfmt__tok_map(const uint8_t *p, size_t n)
{
    char *s = malloc(2 * n + 1), *q = s;
    if (!s)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = zfmt__tok_byte_cp(p[i]);
        if (cp < 0x80) {
            *q++ = (char)cp;
        } else {
            *q++ = (char)(0xC0 | cp >> 6);
            *q++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *q = 0;
    return s;
}

/* ---------------------------------------------------------------- splitting */

int zfmt__split_init(zfmt__split *s, const char *pattern, const char *what)
{
    int err;
    PCRE2_SIZE off;
    memset(s, 0, sizeof *s);
    s->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &err, &off, NULL);
    if (!s->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return zr_err_set(ZR_EUNSUPPORTED, "%s: the split pattern does not compile with PCRE2 "
                          "at offset %zu: %s", what, (size_t)off, (const char *)msg);
    }
    s->jit = pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE) == 0;
    s->md = pcre2_match_data_create_from_pattern(s->re, NULL);
    if (!s->md) {
        zfmt__split_free(s);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    return 0;
}

void zfmt__split_free(zfmt__split *s)
{
    if (s->md)
        pcre2_match_data_free(s->md);
    if (s->re)
        pcre2_code_free(s->re);
    memset(s, 0, sizeof *s);
}

/* the length of the UTF-8 character at p (valid text) */
static size_t utf8_len(uint8_t c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

bool zfmt__split_next(zfmt__split *s, const uint8_t *text, size_t n, size_t *pos, size_t *start,
                      size_t *end)
{
    if (*pos >= n)
        return false;
    int rc = s->jit ? pcre2_jit_match(s->re, text, n, *pos, 0, s->md, NULL)
                    : pcre2_match(s->re, text, n, *pos, PCRE2_NO_UTF_CHECK, s->md, NULL);
    size_t ms = n, me = n;
    if (rc >= 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        ms = ov[0];
        me = ov[1];
    }
    if (ms > *pos) { /* the gap before the match is a piece */
        *start = *pos;
        *end = ms;
        *pos = ms;
        return true;
    }
    if (me == ms) /* an empty match: one character, so the loop moves on */
        me = ms + utf8_len(text[ms]);
    *start = ms;
    *end = me;
    *pos = me;
    return true;
}

int zfmt__tok_check_utf8(const uint8_t *p, size_t n, const char *what)
{
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint8_t c = p[i];
        size_t k = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        bool ok = k && i + k <= n;
        for (size_t j = 1; ok && j < k; j++)
            ok = (p[i + j] & 0xC0) == 0x80;
        if (ok && k == 3)
            ok = !(c == 0xE0 && p[i + 1] < 0xA0) && !(c == 0xED && p[i + 1] >= 0xA0);
        if (ok && k == 4)
            ok = !(c == 0xF0 && p[i + 1] < 0x90) && !(c == 0xF4 && p[i + 1] >= 0x90);
        if (!ok)
            return zr_err_set(ZR_EINVAL, "%s: not UTF-8 text: invalid byte 0x%02x at offset %zu",
                              what, c, i);
        i += k;
    }
    return 0;
}

int zfmt__grow(void **p, size_t *cap, size_t need, size_t elem, size_t first, const char *what)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : first;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return zr_err_set(ZR_ENOMEM, "out of memory (%s: %zu entries)", what, c);
    *p = q;
    *cap = c;
    return 0;
}
