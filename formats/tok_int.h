/*
 * tok_int.h: internals shared by the byte-level BPE files of formats/ (tokenizer.c: loading,
 * encoding, decoding; tok_train.c: training and writing tokenizer.json; tok_files.c: llm.c
 * token files). Not for cli/.
 */
#ifndef ZFMT_TOK_INT_H
#define ZFMT_TOK_INT_H

#include "fmtutil.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdbool.h>
#include <stdint.h>

/* GPT-2's pre-tokenizer pattern (what ByteLevel with use_regex splits with) */
#define ZFMT__TOK_GPT2_PATTERN \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define ZFMT__TOK_NONE UINT32_MAX
#define ZFMT__TOK_MAX_ID ((uint32_t)1 << 24) /* ids beyond are refused when loading */

/* ---------------------------------------------------------------- hash maps */

uint64_t zfmt__tok_hash(const uint8_t *p, size_t n);

/* byte strings -> uint64_t, keys copied into an arena */
typedef struct {
    uint64_t h;
    uint32_t off, len;
    uint64_t val;
    bool used;
} zfmt__smap_slot;
typedef struct {
    zfmt__smap_slot *s;
    size_t cap, n;
    uint8_t *arena;
    size_t arena_n, arena_cap;
} zfmt__smap;
/* The slot of key, or NULL. */
zfmt__smap_slot *zfmt__smap_find(const zfmt__smap *m, const uint8_t *p, size_t n, uint64_t h);
/* The slot of key, inserted with val when absent (*added says which); NULL when out of memory
 * (message set). */
zfmt__smap_slot *zfmt__smap_put(zfmt__smap *m, const uint8_t *p, size_t n, uint64_t h,
                                uint64_t val, bool *added);
void zfmt__smap_clear(zfmt__smap *m);
void zfmt__smap_free(zfmt__smap *m);
static inline const uint8_t *zfmt__smap_key(const zfmt__smap *m, const zfmt__smap_slot *s)
{
    return m->arena + s->off;
}

/* pairs of ids (a, b) -> (v, w) */
typedef struct {
    uint64_t key; /* (a << 32 | b) + 1; 0: empty */
    int64_t v;
    uint32_t w;
} zfmt__pmap_slot;
typedef struct {
    zfmt__pmap_slot *s;
    size_t cap, n;
} zfmt__pmap;
zfmt__pmap_slot *zfmt__pmap_find(const zfmt__pmap *m, uint32_t a, uint32_t b);
zfmt__pmap_slot *zfmt__pmap_put(zfmt__pmap *m, uint32_t a, uint32_t b, bool *added);
void zfmt__pmap_free(zfmt__pmap *m);

/* ---------------------------------------------------------------- bytes <-> byte-level text */

/* GPT-2's byte-to-unicode mapping: the code point that stands for byte b. */
uint32_t zfmt__tok_byte_cp(uint8_t b);
/* Byte-level text (UTF-8 of mapped code points) -> raw bytes into out (room for n bytes);
 * false when a code point is not one of the 256. */
bool zfmt__tok_unmap(const char *s, size_t n, uint8_t *out, size_t *out_n);
/* Raw bytes -> byte-level text (malloc'ed, NUL-terminated); NULL when out of memory. */
char *zfmt__tok_map(const uint8_t *p, size_t n);

/* ---------------------------------------------------------------- splitting */

/* The pre-tokenizer's regex (PCRE2, UTF + UCP, JIT when available) and its match data. */
typedef struct {
    pcre2_code *re;
    pcre2_match_data *md;
    bool jit;
} zfmt__split;
int zfmt__split_init(zfmt__split *s, const char *pattern, const char *what);
void zfmt__split_free(zfmt__split *s);
/* The next piece of text[0, n) at or after *pos: [*start, *end); false at the end. Pieces tile
 * the text (a gap between two matches is a piece of its own, as Split's "Isolated"). The text
 * must be valid UTF-8 (zfmt__tok_check_utf8). */
bool zfmt__split_next(zfmt__split *s, const uint8_t *text, size_t n, size_t *pos, size_t *start,
                      size_t *end);
/* ZR_EINVAL naming what and the byte offset of the first invalid UTF-8 sequence. */
int zfmt__tok_check_utf8(const uint8_t *p, size_t n, const char *what);

/* zfmt_tok_decode of ids read from src (a token file): an id the tokenizer does not have is
 * ZR_EINVAL naming src and the id's position (src NULL: naming the tokenizer, as
 * zfmt_tok_decode). */
int zfmt__tok_decode_from(char **out, size_t *n_bytes, const zfmt_tok *t, const uint32_t *ids,
                          size_t n, const char *src);
/* The name t was loaded as (its file's path; borrowed). */
const char *zfmt__tok_name(const zfmt_tok *t);

/* Make room for need elements of elem bytes in the array *p of *cap (doubling from first);
 * ZR_ENOMEM naming what. */
int zfmt__grow(void **p, size_t *cap, size_t need, size_t elem, size_t first, const char *what);

#endif
