/*
 * data.c: token sources for training (zr.h, "data"): the built-in synthetic corpus, any file
 * as raw bytes, and llm.c's token files; and the sampling rule that makes the sequence of
 * training samples a function of (seed, sample index) alone.
 *
 * Sampling. Sample i of a source of N tokens, for sequences of T tokens, is the T+1 tokens at
 * [s, s + T] (inputs and their next-token targets) with
 *     s = mix(mix(seed) ^ i) mod (N - T)
 * where mix(x) is the first output of splitmix64 seeded with x: z = x + 0x9E3779B97F4A7C15,
 * z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9, z = (z ^ z >> 27) * 0x94D049BB133111EB, z ^ z >> 31.
 * mix is a bijection, so within one seed distinct indices hash to distinct values. Any rank
 * can draw any sample, so a global batch is the same whatever the world size.
 *
 * Synthetic corpus ("synthetic"). 1048576 byte tokens (vocab 256) of English-like text,
 * generated at open in a few milliseconds from a fixed internal seed (the run's seed only
 * chooses sample positions): every run, on every machine, trains on the same bytes.
 *   - Words: a fixed list of 64 lowercase English words of 1 to 6 letters ("the", "cat",
 *     "walked", ...; the table words[] below).
 *   - Grammar: a first-order Markov chain over the words. Each word has 4 distinct successors,
 *     drawn once from the fixed seed, taken with probabilities 1/2, 1/4, 1/8, 1/8. The text
 *     starts with "The".
 *   - Punctuation: after each word, with probability 1/16 a sentence ends: "." then "\n" (1 in
 *     4) or " " (3 in 4), and the next word is capitalized; with probability 1/16 a comma and a
 *     space follow; otherwise a space.
 *   - The last word is cut where the corpus reaches its length.
 * Its entropy rate is 2.47 bits per word (1.75 for the successor, 0.72 for punctuation) over
 * 4.78 bytes per word: 0.36 nats per byte. The empirical entropy of a byte given the 0, 1, 2,
 * 3 bytes before it is 2.89, 1.88, 0.98, 0.59 nats, so even a model that learns only short-range
 * statistics ends far below ln(256) = 5.55, the loss of a uniform guess. Measured: the tiny
 * model (8 x 128 tokens a step, AdamW, lr 3e-3 with warmup and cosine decay) goes from a loss
 * of 5.53 to 0.86 in 300 steps.
 *
 * Validation (zr_data_hold_out): the synthetic corpus is generated SYNTH_VAL_TOKENS further,
 * and that continuation is held out (training's 1048576 tokens unchanged); a file's last tenth
 * of tokens is held out, and training samples from the first part only. zr_data_window gives
 * evenly spaced sequences of the held-out part: a fixed evaluation set.
 *
 * Raw bytes: any file, memory-mapped, each byte a token (vocab 256).
 *
 * llm.c token files (what llm.c's dev/data scripts and `ztok encode` write): int32 header[256]
 * (little-endian) with header[0] = 20240520, header[1] = version, header[2] = N, header[3] = the
 * tokenizer's vocabulary (0: not said; llm.c writes 0), then N tokens: uint16 for version 1,
 * uint32 for version 2 (ztok's variant for vocabularies over 65536); the file size must be
 * exactly 1024 + width N bytes. A file is read as one when its magic matches, and refused as
 * damaged when only the magic is wrong (version 1 and the size agreeing with header[2]).
 * A header vocabulary larger than the model's is refused, and every token is checked against
 * the model's vocabulary at open.
 */
#include "model.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MODEL_MAGIC 20240326 /* llm.c's model file: a common mistake to pass as data */

#define SYNTH_TOKENS ((size_t)1 << 20)
#define SYNTH_VAL_TOKENS ((size_t)1 << 17) /* the held-out continuation (zr_data_hold_out) */
#define HOLD_OUT_DIV 10                    /* a file's held-out tail: a tenth of its tokens */
#define SYNTH_SEED 0x7a65726f2d646174ull /* "zero-dat": fixed, independent of the run seed */

struct zr_data {
    const uint8_t *base; /* tokens: bytes (width 1), little-endian uint16 (2) or uint32 (4) */
    int width;
    uint32_t hdr_vocab;  /* a token file's header vocabulary, 0: not said */
    uint64_t n;          /* tokens */
    uint32_t T;
    uint64_t seed;
    void *map;           /* file mapping, or NULL */
    size_t map_bytes;
    uint8_t *owned;      /* synthetic corpus, or NULL */
    char *desc;
    uint64_t held;       /* tokens held out past n (zr_data_hold_out; 0: none) */
};

/* ---------------------------------------------------------------- hashing */

#define GAMMA 0x9E3779B97F4A7C15ull

static uint64_t fin64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t mix(uint64_t x) { return fin64(x + GAMMA); }

/* splitmix64: state advances by gamma, output is the finalizer of the state */
static uint64_t rng_next(uint64_t *s)
{
    *s += GAMMA;
    return fin64(*s);
}

/* ---------------------------------------------------------------- synthetic corpus */

#define N_WORDS 64
#define N_SUCC 4
static const char *const words[N_WORDS] = {
    "the",    "a",      "cat",    "dog",    "bird",   "fish",   "man",    "woman",
    "boy",    "girl",   "sun",    "moon",   "tree",   "river",  "house",  "road",
    "sat",    "ran",    "saw",    "ate",    "sang",   "swam",   "walked", "found",
    "on",     "in",     "under",  "over",   "near",   "with",   "from",   "to",
    "big",    "small",  "red",    "blue",   "green",  "old",    "young",  "quiet",
    "and",    "but",    "then",   "so",     "very",   "not",    "is",     "was",
    "day",    "night",  "rain",   "wind",   "song",   "book",   "home",   "field",
    "slowly", "fast",   "far",    "away",   "again",  "here",   "there",  "now",
};

/* Fill out[0, n) with the corpus (out has room for n + 16 bytes: a step writes at most 9). */
static void synth_generate(uint8_t *out, size_t n)
{
    uint64_t s = SYNTH_SEED;
    uint8_t succ[N_WORDS][N_SUCC];
    for (size_t w = 0; w < N_WORDS; w++)
        for (size_t k = 0; k < N_SUCC; k++) {
            uint8_t c;
            int again;
            do { /* distinct successors */
                c = (uint8_t)(rng_next(&s) % N_WORDS);
                again = 0;
                for (size_t j = 0; j < k; j++)
                    again |= succ[w][j] == c;
            } while (again);
            succ[w][k] = c;
        }
    size_t pos = 0, w = 0;
    int cap = 1;
    while (pos < n) {
        const char *word = words[w];
        size_t len = strlen(word);
        memcpy(out + pos, word, len);
        if (cap)
            out[pos] = (uint8_t)(out[pos] - 'a' + 'A');
        pos += len;
        uint64_t r = rng_next(&s);
        unsigned punct = (unsigned)(r >> 8) & 15;
        if (punct == 0) { /* end of sentence */
            out[pos++] = '.';
            out[pos++] = ((r >> 12) & 3) == 0 ? '\n' : ' ';
            cap = 1;
        } else if (punct == 1) {
            out[pos++] = ',';
            out[pos++] = ' ';
            cap = 0;
        } else {
            out[pos++] = ' ';
            cap = 0;
        }
        /* successor 0, 1, 2, 3 with probability 1/2, 1/4, 1/8, 1/8 */
        static const uint8_t pick[8] = {0, 0, 0, 0, 1, 1, 2, 3};
        w = succ[w][pick[r & 7]];
    }
}

/* ---------------------------------------------------------------- files */

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int set_desc(zr_data *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int set_desc(zr_data *d, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    d->desc = n < 0 ? NULL : malloc((size_t)n + 1);
    if (d->desc)
        vsnprintf(d->desc, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return d->desc ? 0 : zr_err_set(ZR_ENOMEM, "out of memory");
}

/* Map the file read-only into d->map (left NULL for an empty file). */
static int map_file(zr_data *d, const char *path)
{
    int fd, rc = 0;
    uint64_t size;
    if ((rc = zck_open_regular(&fd, path, ZCK_FOLLOW, &size)) < 0) {
        char msg[1024]; /* copied: formatting zr_err_msg() into itself is undefined */
        snprintf(msg, sizeof msg, "%s", zr_err_msg());
        /* a FIFO or device given as --data is a usage mistake, not a corrupt file */
        return zr_err_set(rc == ZR_ECORRUPT ? ZR_EINVAL : rc, "data file '%s': %s", path, msg);
    }
    d->map_bytes = (size_t)size;
    if (!d->map_bytes)
        goto out;
    void *p = mmap(NULL, d->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        rc = zr_err_sys(errno, "data file '%s': mmap of %zu bytes", path, d->map_bytes);
        goto out;
    }
    d->map = p;
out:
    close(fd);
    return rc;
}

static uint32_t token_at(const zr_data *d, uint64_t i)
{
    const uint8_t *t = d->base + i * (uint64_t)d->width;
    return d->width == 1 ? t[0] : d->width == 2 ? (uint32_t)t[0] | (uint32_t)t[1] << 8 : le32(t);
}

/* Every token below vocab: the max first (a loop the compiler vectorizes), the position only
 * when something is bad. */
static int check_tokens(const zr_data *d, const char *path, uint32_t vocab)
{
    uint32_t max = 0;
    if (d->width == 2) {
        const uint8_t *t = d->base;
        for (uint64_t i = 0; i < d->n; i++) {
            uint32_t v = (uint32_t)t[2 * i] | (uint32_t)t[2 * i + 1] << 8;
            max = v > max ? v : max;
        }
    } else {
        for (uint64_t i = 0; i < d->n; i++) {
            uint32_t v = token_at(d, i);
            max = v > max ? v : max;
        }
    }
    if (max >= vocab)
        for (uint64_t i = 0; i < d->n; i++)
            if (token_at(d, i) >= vocab)
                return zr_err_set(ZR_EINVAL, "llm.c token file '%s': token %u at position %llu "
                                  "is out of the model's vocabulary (vocab %u)", path,
                                  token_at(d, i), (unsigned long long)i, vocab);
    return 0;
}

/* Validate an llm.c token file whose magic matched, and point d at its tokens. */
static int open_llmc(zr_data *d, const char *path, uint32_t vocab)
{
    zck_token_header h;
    ZR_TRY(zck_token_header_parse(&h, d->map, d->map_bytes, path));
    uint32_t hdr_vocab = h.vocab;
    if (hdr_vocab > vocab)
        return zr_err_set(ZR_EINVAL, "llm.c token file '%s' was written for a vocabulary of %u "
                          "tokens, the model has %u (a vocabulary that large: zrun --model "
                          "...,vocab=%u)", path, hdr_vocab, vocab, hdr_vocab);
    d->base = (const uint8_t *)d->map + ZCK_TOKENS_HEADER_BYTES;
    d->width = h.width;
    d->hdr_vocab = hdr_vocab;
    d->n = h.count;
    if (d->n < (uint64_t)d->T + 1)
        return zr_err_set(ZR_EINVAL, "llm.c token file '%s': %llu tokens, a sample needs T+1 = "
                          "%llu", path, (unsigned long long)d->n, (unsigned long long)d->T + 1);
    ZR_TRY(check_tokens(d, path, vocab));
    return set_desc(d, "llm.c token file '%s' (%llu tokens)", path, (unsigned long long)d->n);
}

static int open_file(zr_data *d, const char *path, uint32_t vocab)
{
    ZR_TRY(map_file(d, path));
    const uint8_t *p = d->map;
    size_t size = d->map_bytes;
    if (size >= 4 && le32(p) == ZCK_TOKENS_MAGIC)
        return open_llmc(d, path, vocab);
    /* an llm.c token file in all but its magic: damaged, not text */
    if (size >= ZCK_TOKENS_HEADER_BYTES && le32(p + 4) == ZCK_TOKENS_U16 &&
        (int32_t)le32(p + 8) >= 0 && ZCK_TOKENS_HEADER_BYTES + 2 * (uint64_t)le32(p + 8) == size)
        return zr_err_set(ZR_ECORRUPT, "llm.c token file '%s': bad magic %u (expected %d)", path,
                          le32(p), ZCK_TOKENS_MAGIC);
    if (size >= 4 && le32(p) == LLMC_MODEL_MAGIC)
        return zr_err_set(ZR_EINVAL, "data file '%s' is an llm.c model file, not a token file",
                          path);
    if (vocab < 256)
        return zr_err_set(ZR_EINVAL, "data file '%s': raw bytes need vocab >= 256 (model vocab "
                          "%u)", path, vocab);
    d->base = p;
    d->width = 1;
    d->n = size;
    if (d->n < (uint64_t)d->T + 1)
        return zr_err_set(ZR_EINVAL, "data file '%s': %llu tokens (bytes), a sample needs T+1 = "
                          "%llu", path, (unsigned long long)d->n, (unsigned long long)d->T + 1);
    return set_desc(d, "file '%s' as raw bytes (%llu tokens)", path, (unsigned long long)d->n);
}

static int open_synthetic(zr_data *d, uint32_t vocab)
{
    if (vocab < 256)
        return zr_err_set(ZR_EINVAL, "synthetic corpus: byte tokens need vocab >= 256 (model "
                          "vocab %u)", vocab);
    /* the training part, then its continuation, which only zr_data_hold_out hands out */
    d->owned = malloc(SYNTH_TOKENS + SYNTH_VAL_TOKENS + 16);
    if (!d->owned)
        return zr_err_set(ZR_ENOMEM, "out of memory (synthetic corpus, %zu bytes)",
                          SYNTH_TOKENS + SYNTH_VAL_TOKENS);
    synth_generate(d->owned, SYNTH_TOKENS + SYNTH_VAL_TOKENS);
    d->base = d->owned;
    d->width = 1;
    d->n = SYNTH_TOKENS;
    if (d->n < (uint64_t)d->T + 1)
        return zr_err_set(ZR_EINVAL, "synthetic corpus: %llu tokens, a sample needs T+1 = %llu",
                          (unsigned long long)d->n, (unsigned long long)d->T + 1);
    return set_desc(d, "synthetic corpus (%llu tokens)", (unsigned long long)d->n);
}

/* ---------------------------------------------------------------- public */

int zr_data_open(zr_data **out, const char *spec, uint32_t vocab, uint32_t T, uint64_t seed)
{
    assert(spec);
    if (!T)
        return zr_err_set(ZR_EINVAL, "data '%s': sequence length T is 0 (expected >= 1)", spec);
    zr_data *d = calloc(1, sizeof *d);
    if (!d)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    d->T = T;
    d->seed = seed;
    int rc = !strcmp(spec, "synthetic") ? open_synthetic(d, vocab) : open_file(d, spec, vocab);
    if (rc < 0) {
        zr_data_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void zr_data_free(zr_data *d)
{
    if (!d)
        return;
    if (d->map)
        munmap(d->map, d->map_bytes);
    free(d->owned);
    free(d->desc);
    free(d);
}

const char *zr_data_describe(const zr_data *d) { return d->desc; }

uint64_t zr_data_tokens(const zr_data *d) { return d->n; }

uint32_t zr_data_vocab(const zr_data *d) { return d->hdr_vocab; }

int zr_data_is_bytes(const zr_data *d) { return d->width == 1; }

/* The T+1 tokens from position s. */
static void copy_tokens(const zr_data *d, uint64_t s, int32_t *tokens)
{
    const uint8_t *p = d->base + s * (uint64_t)d->width;
    if (d->width == 1)
        for (uint32_t k = 0; k <= d->T; k++)
            tokens[k] = p[k];
    else if (d->width == 2)
        for (uint32_t k = 0; k <= d->T; k++)
            tokens[k] = (int32_t)((uint32_t)p[2 * k] | (uint32_t)p[2 * k + 1] << 8);
    else
        for (uint32_t k = 0; k <= d->T; k++)
            tokens[k] = (int32_t)token_at(d, s + k);
}

void zr_data_sample(const zr_data *d, uint64_t index, int32_t *tokens)
{
    /* N >= T + 1 was checked at open, so N - T >= 1 and [s, s + T] lies inside */
    copy_tokens(d, mix(mix(d->seed) ^ index) % (d->n - d->T), tokens);
}

/* ---------------------------------------------------------------- validation */

int zr_data_hold_out(zr_data **val, zr_data *d)
{
    if (d->held)
        return zr_err_set(ZR_EINVAL, "%s: a validation part is held out already", d->desc);
    uint64_t held = d->owned ? SYNTH_VAL_TOKENS : d->n / HOLD_OUT_DIV;
    uint64_t keep = d->owned ? d->n : d->n - held;
    if (held < (uint64_t)d->T + 1 || keep < (uint64_t)d->T + 1)
        return zr_err_set(ZR_EINVAL, "%s: too short to hold out a validation part (%llu "
                          "tokens) and keep a training part, each of at least T+1 = %llu "
                          "tokens: give --val-data FILE", d->desc, (unsigned long long)held,
                          (unsigned long long)d->T + 1);
    zr_data *v = calloc(1, sizeof *v);
    if (!v)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    v->base = d->base + keep * (uint64_t)d->width;
    v->width = d->width;
    v->n = held;
    v->T = d->T;
    v->seed = d->seed;
    v->held = held; /* a view: never split again */
    /* the descriptions: "<what> (N tokens)" of d's, with the counts after the split */
    char *what = strndup(d->desc, strcspn(d->desc, "(") - (strchr(d->desc, '(') ? 1 : 0));
    char *old = d->desc;
    int rc = what ? set_desc(v, "the held-out %s of %s (%llu tokens)",
                             d->owned ? "continuation" : "tail", what, (unsigned long long)held)
                  : zr_err_set(ZR_ENOMEM, "out of memory");
    if (!rc && !(rc = set_desc(d, "%s (%llu tokens; %llu %s held out for validation)", what,
                               (unsigned long long)keep, (unsigned long long)held,
                               d->owned ? "more" : "after them")))
        free(old);
    else
        d->desc = old;
    free(what);
    if (rc) {
        zr_data_free(v);
        return rc;
    }
    d->n = keep;
    d->held = held;
    *val = v;
    return 0;
}

void zr_data_window(const zr_data *d, uint64_t i, uint64_t count, int32_t *tokens)
{
    assert(i < count);
    /* evenly spaced starts over [0, N - T]: the first at 0, the last at most N - T - 1 */
    copy_tokens(d, (uint64_t)((unsigned __int128)i * (d->n - d->T) / count), tokens);
}
