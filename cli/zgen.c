/*
 * zgen.c: sampling from a checkpoint. Options in one table (zgen_table, which also makes
 * --help). Reads only the parameters of the checkpoint (a run directory's latest, any world
 * size or stage, imported or resharded), hashing every file it reads against the manifest
 * (zr_gen_load_params), and continues the prompt with the KV-cache generator of core/
 * (zr_gen_run). Text goes through the text codec below, the one place that turns text into
 * token ids and back: the checkpoint's tokenizer.json (zrun --tokenizer, verified against the
 * manifest) when it has one, else bytes for byte models, else ids only. Exit codes: 0 ok, 1 the
 * checkpoint is missing, damaged or not a model of the family table (GPT-2, Llama), 2 usage or
 * any other error.
 */
#include "common.h"
#include "opts.h"
#include "zfmt.h"
#include "zr.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "zgen"
#define ZGEN_EOS "<|endoftext|>" /* the end-of-text token of GPT-2's tokenizer and ztok's */

typedef struct {
    const char *path, *prompt, *prompt_ids;
    uint32_t tokens, top_k;
    float temperature, top_p;
    uint64_t seed;
    int json, ignore_eos;
} zgen_args;
#define ZCLI_ARGS zgen_args

static void args_init(zgen_args *a)
{
    *a = (zgen_args){.tokens = 64, .temperature = 0.8f, .top_k = 40, .top_p = 1.0f,
                         .seed = 1337};
}

static const zcli_opt zgen_table[] = {
    ZCLI_POSITIONAL("RUN_OR_CHECKPOINT", path),
    ZCLI_STRING("--prompt", prompt, "TEXT", "",
                "the text to continue: encoded by the checkpoint's tokenizer, or for byte "
                "models its bytes are the token ids"),
    ZCLI_STRING("--prompt-ids", prompt_ids, "IDS", "",
                "the prompt as token ids, comma-separated (1,2,3): needed for a model with a "
                "vocabulary beyond bytes and no tokenizer"),
    ZCLI_INTEGER(U32, "--tokens", tokens, "N", 1, 1u << 24, NULL, "tokens to generate"),
    ZCLI_REAL(FLOAT, "--temperature", temperature, "T", 0, 1000, NULL,
              "softmax temperature; 0: greedy (the most likely token each time)"),
    ZCLI_INTEGER(U32, "--top-k", top_k, "K", 0, UINT32_MAX, NULL,
                 "sample among the K most likely tokens (0: all)"),
    ZCLI_REAL(FLOAT, "--top-p", top_p, "P", 0, 1, NULL,
              "nucleus sampling, after the temperature and top-k: sample among the fewest most "
              "likely tokens whose probabilities sum to at least P (0 < P <= 1; 1: off)"),
    ZCLI_INTEGER(U64, "--seed", seed, "S", 0, UINT64_MAX, NULL,
                 "the sampler's random numbers: the same seed gives the same text"),
    ZCLI_FLAG("--ignore-eos", ignore_eos,
              "go on past the tokenizer's end-of-text token (<|endoftext|>) instead of stopping "
              "after it"),
    ZCLI_FLAG("--json", json,
              "print one JSON object (checkpoint, prompt, prompt_ids, ids, logprobs, text, "
              "tokens, stop, tokens_per_s, and the sampling options) instead of the text"),
};
static const zcli_opts zgen_opts = {PROG, NULL, zgen_table, sizeof zgen_table / sizeof *zgen_table};

static void usage(void)
{
    zgen_args defaults;
    args_init(&defaults);
    fputs("usage: zgen RUN_OR_CHECKPOINT (--prompt TEXT | --prompt-ids IDS) [OPTIONS]\n"
          "\n"
          "Continue a prompt with the model (GPT-2 or Llama) of a checkpoint (a run directory: "
          "the\ncheckpoint its latest names), reading only its parameters, verified (SHA-256) as "
          "they\nare read.\n\n", stdout);
    zcli_opts_help(stdout, &zgen_opts, &defaults);
    fputs("\nPrints the prompt and its continuation as text, through the run's tokenizer when "
          "the\ncheckpoint has one (zrun --tokenizer), else as bytes for byte models (vocabulary "
          "256, or\ntrained on the synthetic corpus; an id >= 256 prints as <|id|>), else as "
          "token ids.\n"
          "Exit status: 0 done, 1 the checkpoint is missing, damaged or not a GPT-2 or Llama, 2 "
          "usage or\nother errors.\n", stdout);
}

/* ------------------------------------------------------------------ the text codec */

/* How text and token ids map, both ways: the checkpoint's tokenizer, else the bytes of a byte
 * model, else none (ids only: encode fails, decode gives no text). */
typedef struct {
    zfmt_tok *tok; /* the run's tokenizer, or NULL */
    int bytes;     /* without a tokenizer: the model reads bytes */
    int32_t eos;   /* the tokenizer's end-of-text token (<|endoftext|>), or -1 */
} codec;

static int has_text(const codec *c) { return c->tok || c->bytes; }

/* encode: text[len] -> *ids, *n; decode: ids[n] -> *text (malloc'ed, NUL-terminated), *len;
 * without text (ids only) decode gives *text NULL. */
static int text_codec(const codec *c, int encode, const char **text, size_t *len,
                      int32_t **ids, size_t *n)
{
    if (!has_text(c)) {
        if (encode)
            return zcli_fail(PROG, "give the prompt as token ids: --prompt-ids 464,318",
                             "this model's vocabulary is not bytes and the checkpoint has no "
                             "tokenizer: --prompt TEXT cannot be encoded");
        *text = NULL;
        *len = 0;
        return ZCLI_OK;
    }
    if (c->tok && encode) {
        zfmt_tok_ids v = {0};
        if (zfmt_tok_encode(&v, c->tok, *text, *len, NULL) < 0) {
            zfmt_tok_ids_free(&v);
            return zcli_fail_lib(PROG, "give the prompt as UTF-8 text, or as --prompt-ids");
        }
        *ids = (int32_t *)v.id; /* ids are below the model's vocabulary (< 2^31): same bits */
        *n = v.n;
        return ZCLI_OK;
    }
    if (c->tok) {
        char *t;
        if (zfmt_tok_decode(&t, len, c->tok, (const uint32_t *)*ids, *n) < 0)
            return zcli_fail_lib(PROG, NULL);
        *text = t;
        return ZCLI_OK;
    }
    if (encode) {
        if (zr_gen_bytes_encode(ids, *text, *len) < 0)
            return zcli_fail_lib(PROG, NULL);
        *n = *len;
        return ZCLI_OK;
    }
    char *t = malloc(16 * *n + 1);
    if (!t)
        return zcli_fail(PROG, NULL, "out of memory");
    *len = zr_gen_bytes_decode(t, 16 * *n + 1, *ids, *n);
    *text = t;
    return ZCLI_OK;
}

/* A byte model: vocabulary 256, or trained on the synthetic corpus (its bytes). */
static int is_byte_model(const zr_gpt2_config *c, zck_reader *rd)
{
    if (c->vocab == 256)
        return 1;
    json_t *j = json_loads(zck_reader_training_json(rd), 0, NULL);
    const char *data = json_string_value(json_object_get(j, "data"));
    int bytes = data && !strcmp(data, "synthetic");
    json_decref(j);
    return bytes;
}

/* The checkpoint's tokenizer.json, verified, into c->tok; none is fine (ZR_ENOTFOUND). */
static int load_tokenizer(codec *c, const char *ckpt, uint32_t vocab)
{
    char *json = NULL, name[4200];
    size_t n = 0;
    int rc = zck_ckpt_file_read(&json, &n, ckpt, "tokenizer.json");
    if (rc == ZR_ENOTFOUND) {
        zr_err_clear();
        return 0;
    }
    snprintf(name, sizeof name, "%s/tokenizer.json", ckpt);
    if (!rc)
        rc = zfmt_tok_load_mem(&c->tok, json, n, name);
    free(json);
    if (!rc && zfmt_tok_vocab(c->tok) > vocab)
        rc = zr_err_set(ZR_ECORRUPT, "%s: the tokenizer's vocabulary (%u) is larger than the "
                        "model's (%u)", name, zfmt_tok_vocab(c->tok), vocab);
    if (!rc)
        c->eos = (int32_t)zfmt_tok_id(c->tok, ZGEN_EOS);
    return rc;
}

/* ------------------------------------------------------------------ arguments */

/* "1,2,3" -> ids, each 0..V-1 */
static int parse_ids(const char *s, uint32_t V, int32_t **out, size_t *n)
{
    size_t cap = 1;
    for (const char *c = s; *c; c++)
        cap += *c == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return zcli_fail(PROG, NULL, "out of memory");
    size_t k = 0;
    for (const char *c = s;; c++) {
        char *end;
        errno = 0;
        long long v = strtoll(c, &end, 10);
        if (end == c || errno || (*end && *end != ',') || (*c < '0' || *c > '9')) {
            free(ids);
            return zcli_fail(PROG, "write the ids as 464,318,257", "--prompt-ids: '%s' is "
                             "not a comma-separated list of token ids", s);
        }
        if (v >= (long long)V) {
            free(ids);
            return zcli_fail(PROG, NULL, "--prompt-ids: id %lld (number %zu) is not below the "
                             "model's vocabulary of %u", v, k + 1, V);
        }
        ids[k++] = (int32_t)v;
        c = end;
        if (!*c)
            break;
    }
    *out = ids;
    *n = k;
    return ZCLI_OK;
}

/* ------------------------------------------------------------------ generation */

typedef struct {
    const codec *c; /* print text (else ids) */
    size_t n;       /* printed so far */
} emitter;

static void emit(void *ctx, int32_t id)
{
    emitter *e = ctx;
    const char *t = NULL;
    size_t len = 0;
    int32_t *p = &id;
    size_t one = 1;
    if (has_text(e->c) && text_codec(e->c, 0, &t, &len, &p, &one) == ZCLI_OK) {
        fwrite(t, 1, len, stdout);
        free((char *)t);
    } else if (!has_text(e->c))
        printf(&" %d"[e->n == 0], id);
    fflush(stdout);
    e->n++;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A JSON string of bytes that may not be UTF-8: each invalid byte becomes U+FFFD. */
static json_t *json_bytes(const char *s, size_t n)
{
    char *u = malloc(3 * n + 1);
    if (!u)
        return NULL;
    json_t *j = json_stringn(u, zr_gen_utf8_repair(u, s, n));
    free(u);
    return j;
}

static json_t *json_ids(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* The log-probabilities as the shortest decimals that read back as the same floats. */
static json_t *json_logprobs(const float *lp, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, zck_json_real_f32(lp[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* What generation made: out[n] with their log-probabilities lp[n], ended by eos or not. */
typedef struct {
    const int32_t *out;
    const float *lp;
    size_t n;
    int at_eos;
} gen_result;

static int print_json(const zgen_args *a, const char *ckpt, const int32_t *prompt, size_t np,
                      const gen_result *r, const codec *c, double tps)
{
    const char *pt = NULL, *ot = NULL;
    const int32_t *out = r->out;
    size_t pl = 0, ol = 0, n = r->n;
    int32_t *pp = (int32_t *)prompt, *op = (int32_t *)out;
    if (text_codec(c, 0, &pt, &pl, &pp, &np))
        return ZCLI_ERROR;
    if (text_codec(c, 0, &ot, &ol, &op, &n)) {
        free((char *)pt);
        return ZCLI_ERROR;
    }
    json_t *j = json_pack(
        "{s:s, s:o, s:o, s:o, s:o, s:o, s:I, s:s, s:f, s:o, s:I, s:o, s:I, s:o}",
        "checkpoint", ckpt, "prompt", pt ? json_bytes(pt, pl) : json_null(), "prompt_ids",
        json_ids(prompt, np), "ids", json_ids(out, n), "logprobs", json_logprobs(r->lp, n),
        "text", ot ? json_bytes(ot, ol) : json_null(), "tokens", (json_int_t)n, "stop",
        r->at_eos ? "eos" : "tokens", "tokens_per_s", tps, "temperature",
        zck_json_real_f32(a->temperature), "top_k", (json_int_t)a->top_k, "top_p",
        zck_json_real_f32(a->top_p), "seed", (json_int_t)a->seed, "eos_id",
        c->eos < 0 || a->ignore_eos ? json_null() : json_integer(c->eos));
    free((char *)pt);
    free((char *)ot);
    char *s = j ? zck_json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!s)
        return zcli_fail(PROG, NULL, "out of memory");
    puts(s);
    free(s);
    return ZCLI_OK;
}

/* The checkpoint's parameters and config; its resolved path into ckpt (malloc'ed); how its
 * text is coded into *c. */
static int load(const char *path, float **params, zr_gpt2_config *cfg, char **ckpt, codec *c)
{
    zck_reader *rd;
    if (zck_reader_open(&rd, path) < 0)
        return ZCLI_FOUND;
    *ckpt = strdup(zck_reader_path(rd));
    int rc = *ckpt ? zr_gen_load_params(params, cfg, *ckpt, 2) : zr_err_set(ZR_ENOMEM, "out "
                                                                            "of memory");
    if (!rc)
        c->bytes = is_byte_model(cfg, rd);
    if (!rc)
        rc = load_tokenizer(c, *ckpt, cfg->vocab);
    zck_reader_free(rd);
    return rc < 0 ? (rc == ZR_ENOMEM || rc == ZR_EIO ? ZCLI_ERROR : ZCLI_FOUND) : ZCLI_OK;
}

/* The prompt's ids from --prompt or --prompt-ids, checked against the model. */
static int prompt_ids(const zgen_args *a, const zr_gpt2_config *cfg, const codec *c,
                      int32_t **ids, size_t *n)
{
    if (a->prompt && a->prompt_ids) /* neither: main said so before reading the checkpoint */
        return zcli_fail(PROG, "give the text to continue with --prompt TEXT, or its ids with "
                         "--prompt-ids 1,2,3", "--prompt and --prompt-ids are exclusive");
    if (a->prompt_ids && parse_ids(a->prompt_ids, cfg->vocab, ids, n))
        return ZCLI_ERROR;
    if (a->prompt) {
        size_t len = strlen(a->prompt);
        if (!len)
            return zcli_fail(PROG, "give at least one character", "--prompt: empty prompt");
        const char *t = a->prompt;
        if (text_codec(c, 1, &t, &len, ids, n))
            return ZCLI_ERROR;
    }
    if (*n > cfg->ctx) {
        free(*ids);
        *ids = NULL;
        return zcli_fail(PROG, "shorten the prompt (generation past the context slides its "
                         "window; the prompt itself must fit)", "the prompt has %zu tokens, "
                         "more than the model's context of %u", *n, cfg->ctx);
    }
    return ZCLI_OK;
}

/* Generate a->tokens after the prompt (fewer when the end-of-text token comes) with the
 * options of a, printed as they come or as one JSON object. */
static int generate(const zgen_args *a, zr_gen *g, const char *ckpt, const codec *c,
                    const int32_t *prompt, size_t np)
{
    int32_t *out = malloc((size_t)a->tokens * sizeof *out);
    float *lp = malloc((size_t)a->tokens * sizeof *lp);
    if (!out || !lp) {
        free(out);
        free(lp);
        return zcli_fail(PROG, NULL, "out of memory");
    }
    emitter e = {c, 0};
    zr_sample_opts so = ZR_SAMPLE_OPTS_INIT;
    so.temperature = a->temperature;
    so.top_k = a->top_k;
    so.top_p = a->top_p;
    so.seed = a->seed;
    so.eos = a->ignore_eos ? -1 : c->eos;
    so.logprobs = lp;
    gen_result r = {out, lp, 0, 0};
    so.n_out = &r.n;
    if (!a->json) { /* the prompt, then each token as it comes */
        so.emit = emit;
        so.emit_ctx = &e;
        for (size_t i = 0; i < np; i++)
            emit(&e, prompt[i]);
    }
    double t0 = now_s();
    int rc = ZCLI_OK;
    if (zr_gen_run(g, out, prompt, np, a->tokens, &so) < 0) {
        if (!a->json)
            putchar('\n');
        rc = zcli_fail_lib(PROG, NULL);
    }
    double dt = now_s() - t0, tps = (double)r.n / (dt > 0 ? dt : 1e-9);
    r.at_eos = r.n > 0 && out[r.n - 1] == so.eos;
    if (!rc && a->json)
        rc = print_json(a, ckpt, prompt, np, &r, c, tps);
    else if (!rc) {
        putchar('\n');
        fflush(stdout);
        fprintf(stderr, PROG ": %zu token%s at %.1f tokens/s from %s%s\n", r.n,
                r.n == 1 ? "" : "s", tps, ckpt,
                r.at_eos ? " (stopped at the end-of-text token " ZGEN_EOS ")" : "");
    }
    free(out);
    free(lp);
    return rc;
}

int main(int argc, char **argv)
{
    zgen_args a;
    args_init(&a);
    int rc = zcli_opts_parse(&zgen_opts, &a, argc, argv);
    if (rc == ZCLI_OPTS_HELP)
        usage();
    if (rc)
        return rc == ZCLI_OPTS_HELP ? ZCLI_OK : rc;
    if (!a.prompt && !a.prompt_ids) /* before the checkpoint is read */
        return zcli_fail(PROG, "give the text to continue with --prompt TEXT, or its ids with "
                         "--prompt-ids 1,2,3", "no prompt");
    if (!(a.top_p > 0)) /* the parser took [0, 1]; 0 (or a number that is 0 as a float) is not */
        return zcli_fail(PROG, "give a number above 0 and at most 1 (1: off)", "--top-p %g: "
                         "a nucleus of probability 0 holds no token", (double)a.top_p);
    float *params = NULL;
    zr_gpt2_config cfg;
    char *ckpt = NULL;
    codec c = {NULL, 0, -1};
    int32_t *prompt = NULL;
    size_t np = 0;
    zr_gen *g = NULL;
    if ((rc = load(a.path, &params, &cfg, &ckpt, &c))) {
        zcli_fail_ckpt(PROG, NULL);
        goto out;
    }
    if ((rc = prompt_ids(&a, &cfg, &c, &prompt, &np)))
        goto out;
    if (zr_gen_new(&g, &cfg, params) < 0) {
        rc = zcli_fail_lib(PROG, NULL);
        goto out;
    }
    rc = generate(&a, g, ckpt, &c, prompt, np);
out:
    zr_gen_free(g);
    free(prompt);
    free(params);
    free(ckpt);
    zfmt_tok_free(c.tok);
    return rc;
}
