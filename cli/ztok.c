/*
 * ztok.c: the tokenizer CLI (byte-level BPE, Hugging Face tokenizer.json): train one on text
 * files, encode text files into llm.c token files for `zrun --data`, decode a token file back to
 * text. Each subcommand declares its options in a table (cli/opts.h) and calls formats/
 * (zfmt.h, "byte-level BPE tokenizer"). Exit codes: 0 ok, 2 usage, I/O or any other error.
 * Outputs: see "outputs" below.
 */
#include "common.h"
#include "opts.h"
#include "zfmt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "ztok"

typedef struct {
    zcli_list files;          /* the positional arguments of train and encode */
    const char *in;           /* decode's one token file */
    const char *out, *tokenizer, *val_out, *special;
    uint32_t vocab;
    double val_fraction;
} ztok_args;
#define ZCLI_ARGS ztok_args

static void args_init(ztok_args *a)
{
    *a = (ztok_args){.special = "<|endoftext|>"};
}

/* The library's last error, with a hint when the input is damaged (not a checkpoint). */
static int fail_lib(void)
{
    return zcli_fail_lib(PROG, zr_err_code() == ZR_ECORRUPT
                                   ? "the file is damaged, or is not a file ztok reads" : NULL);
}

/* ------------------------------------------------------------------ outputs
 * Every output is written under a temporary name and renamed into place, so an existing regular
 * file is replaced whole (no --force needed), or not at all. Refused before any work: an output
 * that is one of the command's inputs or the other output, and one that exists but is not a
 * regular file (the rename would replace a FIFO, a device, a directory or a symbolic link). */

/* out (described by what: "-o", "--val-output") may be written: not one of the n inputs in,
 * not a non-regular file; else the error is printed and false returned */
static bool output_ok(const char *what, const char *out, const char *const *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (in[i] && zck_same_file(out, in[i])) {
            zcli_fail(PROG, "choose another output path", "%s %s is the same file as the input "
                      "%s: it would be replaced", what, out, in[i]);
            return false;
        }
    if (zck_check_output(out) < 0) {
        zr_err_prefix("%s ", what);
        zcli_fail_lib(PROG, "choose another output path");
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ train */

static int cmd_train(const void *args)
{
    const ztok_args *a = args;
    if (!output_ok("-o", a->out, (const char *const *)a->files.v, a->files.n))
        return ZCLI_ERROR;
    zfmt_tok_train_opts o = ZFMT_TOK_TRAIN_OPTS_INIT;
    zcli_bar bar;
    o.vocab = a->vocab;
    o.special = a->special;
    o.progress = zcli_progress_init(&bar);
    int rc = zfmt_tok_train(a->out, a->files.v, a->files.n, &o);
    zcli_progress_end(&bar);
    if (rc < 0)
        return fail_lib();
    zfmt_tok *t;
    if (zfmt_tok_load(&t, a->out) < 0) /* what was written must read back */
        return fail_lib();
    printf("wrote %s: vocabulary %u\n", a->out, zfmt_tok_vocab(t));
    zfmt_tok_free(t);
    return ZCLI_OK;
}

/* ------------------------------------------------------------------ encode */

/* "tokens.bin" -> "tokens_val.bin"; "tokens" -> "tokens_val" */
static char *val_name(const char *out)
{
    size_t n = strlen(out);
    const char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    size_t stem = dot && (!slash || dot > slash) && dot != out ? (size_t)(dot - out) : n;
    char *s = malloc(n + 5);
    if (s)
        snprintf(s, n + 5, "%.*s_val%s", (int)stem, out, out + stem);
    return s;
}

static int cmd_encode(const void *args)
{
    const ztok_args *a = args;
    if (a->val_out && !(a->val_fraction > 0))
        return zcli_fail(PROG, "add --val-fraction F, or leave --val-output out",
                         "--val-output %s without --val-fraction: no validation file is written",
                         a->val_out);
    char *val = a->val_out ? strdup(a->val_out) : val_name(a->out);
    const char **in = malloc((a->files.n + 1) * sizeof *in);
    if (!val || !in) {
        free(val);
        free(in);
        return zcli_fail(PROG, NULL, "out of memory");
    }
    in[0] = a->tokenizer;
    memcpy(in + 1, a->files.v, a->files.n * sizeof *in);
    bool ok = output_ok("-o", a->out, in, a->files.n + 1);
    if (ok && a->val_fraction > 0) {
        ok = output_ok(a->val_out ? "--val-output" : "the validation file", val, in,
                       a->files.n + 1);
        if (ok && zck_same_file(val, a->out)) {
            zcli_fail(PROG, "choose another --val-output", "the validation output %s is the "
                      "same file as -o %s", val, a->out);
            ok = false;
        }
    }
    free(in);
    zfmt_tok *t;
    if (!ok || zfmt_tok_load(&t, a->tokenizer) < 0) {
        free(val);
        return ok ? fail_lib() : ZCLI_ERROR;
    }
    zfmt_tok_file_opts o = ZFMT_TOK_FILE_OPTS_INIT;
    zfmt_tok_file_stats st;
    zcli_bar bar;
    o.val_fraction = a->val_fraction;
    o.progress = zcli_progress_init(&bar);
    int rc = zfmt_tok_encode_files(&st, t, a->files.v, a->files.n, a->out, val, &o);
    zcli_progress_end(&bar);
    zfmt_tok_free(t);
    if (rc < 0) {
        free(val);
        return fail_lib();
    }
    printf("%s: %llu tokens (%s, %.2f bytes/token) from %llu bytes\n", a->out,
           (unsigned long long)st.tokens, st.version == 2 ? "uint32" : "uint16",
           st.tokens ? (double)st.bytes / (double)(st.tokens + st.val_tokens) : 0.0,
           (unsigned long long)st.bytes);
    if (st.val_tokens)
        printf("%s: %llu tokens\n", val, (unsigned long long)st.val_tokens);
    free(val);
    return ZCLI_OK;
}

/* ------------------------------------------------------------------ decode */

static int cmd_decode(const void *args)
{
    const ztok_args *a = args;
    const char *in[] = {a->in, a->tokenizer};
    if (a->out && !output_ok("-o", a->out, in, 2))
        return ZCLI_ERROR;
    zfmt_tok *t;
    if (zfmt_tok_load(&t, a->tokenizer) < 0)
        return fail_lib();
    char *text = NULL;
    size_t n = 0;
    int rc = zfmt_tok_file_decode(&text, &n, t, a->in);
    zfmt_tok_free(t);
    if (rc == 0 && a->out)
        rc = zck_write_file_atomic(a->out, text, n); /* a temporary renamed into place */
    else if (rc == 0 && (fwrite(text, 1, n, stdout) != n || fflush(stdout) != 0))
        rc = zr_err_sys(errno, "standard output");
    free(text);
    return rc < 0 ? fail_lib() : ZCLI_OK;
}

/* ------------------------------------------------------------------ options */

#define OPT_TOKENIZER                                                                           \
    {.name = "--tokenizer", .kind = ZCLI_OPT_STRING, .flags = ZCLI_OPT_REQUIRED,               \
     .off = offsetof(ztok_args, tokenizer), .meta = "FILE",                                     \
     .help = "a Hugging Face tokenizer.json (byte-level BPE)"}
#define OPT_OUTPUT(flags_, mt, txt)                                                             \
    {.name = "-o", .alias = "--output", .kind = ZCLI_OPT_STRING, .flags = flags_,              \
     .off = offsetof(ztok_args, out), .meta = mt, .help = txt}

static const zcli_opt train_opts[] = {
    ZCLI_POSITIONALS("CORPUS", files),
    {.name = "--vocab", .kind = ZCLI_OPT_U32, .flags = ZCLI_OPT_REQUIRED,
     .off = offsetof(ztok_args, vocab), .meta = "N", .lo = 256, .hi = 1 << 24,
     .help = "vocabulary size: the 256 bytes, the merges, the special token"},
    OPT_OUTPUT(ZCLI_OPT_REQUIRED, "FILE", "the tokenizer.json to write"),
    ZCLI_STRING("--special", special, "TEXT", NULL,
                "the special token given the last id (\"\": none)"),
};
static const zcli_opt encode_opts[] = {
    OPT_TOKENIZER,
    ZCLI_POSITIONALS("FILE", files),
    OPT_OUTPUT(ZCLI_OPT_REQUIRED, "FILE", "the token file to write (llm.c format)"),
    ZCLI_REAL(DOUBLE, "--val-fraction", val_fraction, "F", 0, 0.99, NULL,
              "put the last F of the tokens into the validation file instead"),
    ZCLI_STRING("--val-output", val_out, "FILE", "OUT with _val before its suffix",
                "the validation token file (only with --val-fraction)"),
};
static const zcli_opt decode_opts[] = {
    OPT_TOKENIZER,
    ZCLI_POSITIONAL("FILE", in),
    OPT_OUTPUT(0, "FILE", "write the text here (atomically)"),
};

#define TABLE(t) ZCLI_TABLE(t)

static const zcli_command commands[] = {
    {"train", cmd_train, TABLE(train_opts),
     "Train a byte-level BPE tokenizer on the UTF-8 text files CORPUS... and write it as a\n"
     "Hugging Face tokenizer.json (BPE model, ByteLevel pre-tokenizer with GPT-2's split\n"
     "pattern, ByteLevel decoder). Ids 0-255 are the bytes, then the merges in the order\n"
     "learned (most frequent pair first; ties to the smallest pair of ids), then the special\n"
     "token. Written atomically.\n"},
    {"encode", cmd_encode, TABLE(encode_opts),
     "Encode UTF-8 text files (concatenated) into an llm.c token file for `zrun --data`:\n"
     "uint16 tokens (version 1), or uint32 (version 2) when the vocabulary exceeds 65536.\n"
     "The ids are exactly those of the Hugging Face tokenizers library. Written atomically.\n"},
    {"decode", cmd_decode, TABLE(decode_opts),
     "Decode a token file back to text (standard output unless -o; a file is written\n"
     "atomically).\n"},
};
#define N_COMMANDS (sizeof commands / sizeof *commands)

static void usage(FILE *f)
{
    zcli_commands_usage(f, PROG, "Byte-level BPE tokenizers (Hugging Face tokenizer.json) and "
                        "llm.c token files.", commands, N_COMMANDS,
                        "Exit status: 0 ok, 2 usage or I/O error.");
}

int main(int argc, char **argv)
{
    if (argc < 2 || zcli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? ZCLI_ERROR : ZCLI_OK;
    }
    const zcli_command *cmd = zcli_command_find(PROG, commands, N_COMMANDS, argv[1]);
    if (!cmd) {
        usage(stderr);
        return ZCLI_ERROR;
    }
    zcli_opts p = zcli_command_opts(PROG, cmd);
    ztok_args args, defaults;
    args_init(&args);
    args_init(&defaults);
    int rc = zcli_opts_parse(&p, &args, argc - 1, argv + 1);
    if (rc == ZCLI_OPTS_HELP) {
        zcli_command_help(stdout, &p, cmd->help, &defaults);
        rc = ZCLI_OK;
    } else if (rc == 0) {
        rc = cmd->fn(&args);
    }
    zcli_list_free(&args.files);
    return rc;
}
