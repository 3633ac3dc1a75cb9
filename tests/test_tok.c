/*
 * test_tok.c: the byte-level BPE tokenizer (formats/tokenizer.c and friends) and ztok.
 *   - C only: a tokenizer.json the Hugging Face library trained (tests/data/tok/hf_bpe.json)
 *     encodes tests/data/tok/text.txt (ASCII, accents, CJK, emoji, digits, whitespace runs,
 *     contractions, <|endoftext|>, CR LF) to exactly the ids the library gave (hf_bpe.ids),
 *     and decodes back to the text; training is deterministic and round-trips; other model
 *     types, normalizers and bad files are refused naming the field; token files of both
 *     versions load in zr_data_open, which refuses a vocabulary larger than the model's.
 *   - ztok through the binary (ZT_ZTOK): train, encode with --val-fraction, decode, a FIFO.
 *   - the library itself as the oracle (build/venv, tests/tok/oracle.py; skipped without):
 *     GPT-2's tokenizer, tokenizers the library trained (ByteLevel, and Sequence[Split,
 *     ByteLevel]) and ztok's own output (loaded by the library) give the same ids.
 */
#include "ckutil.h"
#include "zfmt.h"
#include "zr.h"

#include <jansson.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char *data_path(const char *name)
{
    static char buf[4][4096];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, sizeof buf[0], "%s/tests/data/tok/%s", zt_root(), name);
    return p;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void encode_file(zfmt_tok_ids *out, zfmt_tok *t, const char *path)
{
    char *text = zt_slurp(path);
    ZT_OK(zfmt_tok_encode(out, t, text, strlen(text), NULL));
    free(text);
}

static void check_roundtrip(zfmt_tok *t, const zfmt_tok_ids *ids, const char *path)
{
    char *text = zt_slurp(path), *back;
    size_t n;
    ZT_OK(zfmt_tok_decode(&back, &n, t, ids->id, ids->n));
    ZT_CHECK_EQ(n, strlen(text));
    ZT_CHECK(!memcmp(back, text, n));
    free(back);
    free(text);
}

ZT_TEST(tok_hf_fixture_exact_ids)
{
    zfmt_tok *t;
    ZT_OK(zfmt_tok_load(&t, data_path("hf_bpe.json")));
    ZT_CHECK_EQ(zfmt_tok_vocab(t), 700);
    ZT_CHECK_EQ(zfmt_tok_id(t, "<|endoftext|>"), 0);
    zfmt_tok_ids ids = {0};
    encode_file(&ids, t, data_path("text.txt"));
    char *want = zt_slurp(data_path("hf_bpe.ids")), *p = want;
    size_t k = 0;
    for (char *end; *p && *p != '\n'; p = end, k++) {
        unsigned long v = strtoul(p, &end, 10);
        ZT_CHECK(end != p);
        ZT_CHECK(k < ids.n);
        if (ids.id[k] != v)
            ZT_FAIL("id %zu: ztok %u, the library %lu", k, ids.id[k], v);
    }
    ZT_CHECK_EQ(k, ids.n);
    ZT_CHECK(k > 300);
    check_roundtrip(t, &ids, data_path("text.txt"));
    /* a second encoding (from the word cache) is the same */
    zfmt_tok_ids again = {0};
    encode_file(&again, t, data_path("text.txt"));
    ZT_CHECK_EQ(again.n, ids.n);
    ZT_CHECK(!memcmp(again.id, ids.id, ids.n * sizeof *ids.id));
    zfmt_tok_ids_free(&again);
    zfmt_tok_ids_free(&ids);
    free(want);
    zfmt_tok_free(t);
}

ZT_TEST(tok_train_deterministic_roundtrip)
{
    const char *files[] = {data_path("text.txt"), data_path("text.txt")};
    zfmt_tok_train_opts o = ZFMT_TOK_TRAIN_OPTS_INIT;
    o.vocab = 400;
    ZT_OK(zfmt_tok_train("a.json", files, 2, &o));
    ZT_OK(zfmt_tok_train("b.json", files, 2, &o));
    char *a = zt_slurp("a.json"), *b = zt_slurp("b.json");
    ZT_CHECK(!strcmp(a, b));
    ZT_CHECK(strstr(a, "\"type\": \"BPE\"") && strstr(a, "\"use_regex\": true"));
    free(a);
    free(b);
    zfmt_tok *t;
    ZT_OK(zfmt_tok_load(&t, "a.json"));
    ZT_CHECK_EQ(zfmt_tok_vocab(t), 400);
    ZT_CHECK_EQ(zfmt_tok_id(t, "<|endoftext|>"), 399);
    ZT_CHECK_EQ(zfmt_tok_id(t, "A"), 'A'); /* ids 0..255 are the bytes */
    zfmt_tok_ids ids = {0};
    encode_file(&ids, t, data_path("text.txt"));
    ZT_CHECK(ids.n < 1000); /* merges were learned: fewer ids than bytes */
    check_roundtrip(t, &ids, data_path("text.txt"));
    /* the first merge is the most frequent pair; "Ġt" or so: two bytes, id 256 */
    ZT_CHECK(ids.n > 0);
    zfmt_tok_ids_free(&ids);
    zfmt_tok_free(t);
    /* no special token; the smallest vocabulary; bad ones */
    o.special = "";
    o.vocab = 256;
    ZT_OK(zfmt_tok_train("c.json", files, 1, &o));
    ZT_OK(zfmt_tok_load(&t, "c.json"));
    ZT_CHECK_EQ(zfmt_tok_vocab(t), 256);
    zfmt_tok_free(t);
    o.special = "<|endoftext|>";
    ZT_ERR(zfmt_tok_train("d.json", files, 1, &o), ZR_EINVAL, "vocabulary 256: expected 257");
    ZT_CHECK(access("d.json", F_OK) != 0);
    /* the special token's text is not learned: no merge of its pieces */
    zt_write_file("sp.txt", "xy<|endoftext|>xy <|endoftext|> zq<|endoftext|>\n");
    const char *sp[] = {"sp.txt"};
    o.vocab = 300;
    ZT_OK(zfmt_tok_train("sp.json", sp, 1, &o));
    char *j = zt_slurp("sp.json");
    ZT_CHECK(!strstr(j, "\"<|\"") && !strstr(j, "\"endoftext\"") && !strstr(j, "\"en\""));
    free(j);
    ZT_OK(zfmt_tok_load(&t, "sp.json"));
    ZT_CHECK_EQ(zfmt_tok_vocab(t), 260); /* 3 merges: x y, " " z, " z" q */
    zfmt_tok_free(t);
}

/* A tokenizer.json with a replaced part (the text "MODEL" / "PRE" / "NORM" stand for them). */
static void write_json(const char *path, const char *model, const char *pre, const char *norm)
{
    char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],"
             "\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":null,"
             "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":%s}", norm, pre, model);
    zt_write_file(path, buf);
}

#define BL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"
#define BPE "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"

ZT_TEST(tok_refuses_other_tokenizers)
{
    zfmt_tok *t = NULL;
    write_json("ok.json", BPE, BL, "null");
    ZT_OK(zfmt_tok_load(&t, "ok.json"));
    zfmt_tok_ids ids = {0};
    ZT_OK(zfmt_tok_encode(&ids, t, "abab ba", 7, NULL));
    ZT_CHECK_EQ(ids.n, 4); /* "ab" "ab", then " ba": " " has no entry (dropped), "b" "a" */
    ZT_CHECK(ids.id[0] == 2 && ids.id[1] == 2 && ids.id[2] == 1 && ids.id[3] == 0);
    ZT_ERR(zfmt_tok_encode(&ids, t, "a\xff", 2, NULL), ZR_EINVAL,
           "not UTF-8 text: invalid byte 0xff at offset 1");
    zfmt_tok_ids_free(&ids);
    zfmt_tok_free(t);
    /* the same with the merges as lists */
    write_json("ok2.json", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
               "\"merges\":[[\"a\",\"b\"]]}", BL, "null");
    ZT_OK(zfmt_tok_load(&t, "ok2.json"));
    zfmt_tok_free(t);
    t = NULL;
    write_json("wp.json", "{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}", BL, "null");
    ZT_ERR(zfmt_tok_load(&t, "wp.json"), ZR_EUNSUPPORTED,
           "wp.json: model of type 'WordPiece' is not supported");
    write_json("ug.json", "{\"type\":\"Unigram\",\"vocab\":[]}", BL, "null");
    ZT_ERR(zfmt_tok_load(&t, "ug.json"), ZR_EUNSUPPORTED, "model of type 'Unigram'");
    write_json("nfc.json", BPE, BL, "{\"type\":\"NFC\"}");
    ZT_ERR(zfmt_tok_load(&t, "nfc.json"), ZR_EUNSUPPORTED, "normalizer of type 'NFC'");
    write_json("ws.json", BPE, "{\"type\":\"Whitespace\"}", "null");
    ZT_ERR(zfmt_tok_load(&t, "ws.json"), ZR_EUNSUPPORTED, "pre_tokenizer of type 'Whitespace'");
    write_json("m.json", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}",
               BL, "null");
    ZT_ERR(zfmt_tok_load(&t, "m.json"), ZR_ECORRUPT,
           "model.merges[0]: 'ab' (the merged token) is not in the vocab");
    write_json("d.json", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}", BL,
               "null");
    ZT_ERR(zfmt_tok_load(&t, "d.json"), ZR_ECORRUPT, "id 0 is given to two tokens");
    zt_write_file("j.json", "{\"model\": ");
    ZT_ERR(zfmt_tok_load(&t, "j.json"), ZR_ECORRUPT, "j.json:1: not a tokenizer.json");
    ZT_CHECK_EQ(mkfifo("fifo.json", 0644), 0);
    ZT_ERR(zfmt_tok_load(&t, "fifo.json"), ZR_ECORRUPT, "FIFO");
    ZT_ERR(zfmt_tok_load(&t, "missing.json"), ZR_ENOTFOUND, "missing.json");
    ZT_CHECK(!t);
}

/* A tokenizer.json into path: vocab "a" * 2^k for k < n_vocab (id k), merges "a"*2^k
 * "a"*2^k for k < 11 (a chain a a -> aa, aa aa -> aaaa, ... up to a 2049-byte merge). */
static void write_long_merges(const char *path, int n_vocab)
{
    size_t cap = 64 * 1024, w = 0;
    char *j = malloc(cap), *doc = malloc(cap + 512), a[1 << 11];
    ZT_CHECK(j && doc);
    memset(a, 'a', sizeof a);
    w += (size_t)snprintf(j + w, cap - w, "{\"type\":\"BPE\",\"vocab\":{");
    for (int k = 0; k < n_vocab; k++)
        w += (size_t)snprintf(j + w, cap - w, "%s\"%.*s\":%d", k ? "," : "", 1 << k, a, k);
    w += (size_t)snprintf(j + w, cap - w, "},\"merges\":[");
    for (int k = 0; k < 11; k++)
        w += (size_t)snprintf(j + w, cap - w, "%s\"%.*s %.*s\"", k ? "," : "", 1 << k, a,
                              1 << k, a);
    snprintf(j + w, cap - w, "]}");
    snprintf(doc, cap + 512,
             "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],"
             "\"normalizer\":null,\"pre_tokenizer\":" BL ",\"post_processor\":null,"
             "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":%s}", j);
    zt_write_file(path, doc);
    free(doc);
    free(j);
}

/* Merges of any length (they were cut at 1023 bytes and refused as "neither \"a b\" nor ..."):
 * the chain up to a 2049-byte merge loads and encodes as the library does (2048 a: one token;
 * 2047: the powers of two, largest first); a long merge whose result is missing names its
 * index, the token cut. */
ZT_TEST(tok_long_merges)
{
    char a[2048];
    memset(a, 'a', sizeof a);
    write_long_merges("long.json", 12);
    zfmt_tok *t = NULL;
    ZT_OK(zfmt_tok_load(&t, "long.json"));
    zfmt_tok_ids ids = {0};
    ZT_OK(zfmt_tok_encode(&ids, t, a, 2048, NULL));
    ZT_CHECK(ids.n == 1 && ids.id[0] == 11);
    zfmt_tok_ids_free(&ids);
    ZT_OK(zfmt_tok_encode(&ids, t, a, 2047, NULL));
    ZT_CHECK_EQ(ids.n, 11);
    for (size_t i = 0; i < ids.n; i++)
        ZT_CHECK_EQ(ids.id[i], 10 - i);
    zfmt_tok_ids_free(&ids);
    zfmt_tok_free(t);
    t = NULL;
    /* without the token of 2048 a: merge 10 (2049 bytes) is named */
    write_long_merges("long2.json", 11);
    ZT_ERR(zfmt_tok_load(&t, "long2.json"), ZR_ECORRUPT, "long2.json: model.merges[10]: 'aaaa");
    ZT_CHECK(strstr(zr_err_msg(), "...' (the merged token) is not in the vocab"));
    ZT_CHECK(!t);
}

/* A tokenizer with an id beyond 65535: token files switch to uint32 (version 2). */
ZT_TEST(tok_files_uint32_and_vocab_checks)
{
    zt_write_file("big.json",
                  "{\"added_tokens\":[{\"id\":70000,\"content\":\"<|big|>\",\"special\":true}],"
                  "\"normalizer\":null,\"pre_tokenizer\":" BL ",\"decoder\":{\"type\":"
                  "\"ByteLevel\"},\"model\":" BPE "}");
    zfmt_tok *t;
    ZT_OK(zfmt_tok_load(&t, "big.json"));
    ZT_CHECK_EQ(zfmt_tok_vocab(t), 70001);
    char text[400] = "";
    for (int i = 0; i < 40; i++)
        strcat(text, i % 3 ? "ab<|big|>" : "ba");
    zt_write_file("in.txt", text);
    const char *files[] = {"in.txt"};
    zfmt_tok_file_opts o = ZFMT_TOK_FILE_OPTS_INIT;
    o.val_fraction = 0.25;
    zfmt_tok_file_stats st;
    ZT_OK(zfmt_tok_encode_files(&st, t, files, 1, "tok.bin", "tok_val.bin", &o));
    ZT_CHECK_EQ(st.version, 2);
    ZT_CHECK_EQ(st.tokens + st.val_tokens, 14 * 2 + 26 * 2); /* "ba": b a; "ab<|big|>": ab, big */
    zfmt_tok_ids a = {0}, b = {0};
    uint32_t vocab;
    ZT_OK(zfmt_tok_file_read(&a, &vocab, "tok.bin"));
    ZT_CHECK_EQ(vocab, 70001);
    ZT_OK(zfmt_tok_file_read(&b, &vocab, "tok_val.bin"));
    ZT_CHECK_EQ(a.n, st.tokens);
    ZT_CHECK_EQ(b.n, st.val_tokens);
    ZT_CHECK(a.id[0] == 1 && a.id[1] == 0 && a.id[2] == 2 && a.id[3] == 70000);
    /* the engine reads version 2; the header's vocabulary must fit the model */
    zr_data *d = NULL;
    ZT_OK(zr_data_open(&d, "tok.bin", 70001, 8, 1));
    int32_t x[9];
    zr_data_sample(d, 0, x);
    for (int k = 0; k < 9; k++)
        ZT_CHECK(x[k] == 0 || x[k] == 1 || x[k] == 2 || x[k] == 70000);
    zr_data_free(d);
    d = NULL;
    ZT_ERR(zr_data_open(&d, "tok.bin", 50000, 8, 1), ZR_EINVAL,
           "'tok.bin' was written for a vocabulary of 70001 tokens, the model has 50000");
    ZT_CHECK(!d);
    zt_truncate("tok.bin", 1024 + 4 * a.n - 2);
    ZT_ERR(zfmt_tok_file_read(&b, &vocab, "tok.bin"), ZR_ECORRUPT,
           "llm.c token file 'tok.bin': truncated (header says");
    zfmt_tok_ids_free(&a);
    zfmt_tok_ids_free(&b);
    zfmt_tok_free(t);
}

ZT_TEST(tok_cli_train_encode_decode)
{
    const char *z = zt_bin("ZT_ZTOK"), *txt = data_path("text.txt");
    ZT_CHECK_EQ(sh("%s train %s %s --vocab 300 -o t.json > train.log 2>&1", z, txt, txt), 0);
    zt_file_has("train.log", "wrote t.json: vocabulary 300");
    ZT_CHECK_EQ(sh("%s encode --tokenizer t.json %s %s -o tokens.bin --val-fraction 0.1 "
                   "> enc.log 2>&1", z, txt, txt), 0);
    char *log = zt_slurp("enc.log");
    ZT_CHECK(strstr(log, "tokens.bin: ") && strstr(log, "(uint16,") &&
             strstr(log, "tokens_val.bin: "));
    free(log);
    /* both files together decode to the two copies of the text */
    ZT_CHECK_EQ(sh("%s decode --tokenizer t.json tokens.bin > a.txt && %s decode --tokenizer "
                   "t.json tokens_val.bin -o b.txt && cat a.txt b.txt > ab.txt && cat %s %s | "
                   "cmp -s - ab.txt", z, z, txt, txt), 0);
    /* the token file trains: zr_data reads it with the tokenizer's vocabulary */
    zr_data *d;
    ZT_OK(zr_data_open(&d, "tokens.bin", 300, 16, 1));
    zr_data_free(d);
    /* errors: a FIFO (no hang), a missing option, a WordPiece tokenizer, not UTF-8 */
    ZT_CHECK_EQ(mkfifo("fifo", 0644), 0);
    ZT_CHECK_EQ(sh("timeout 20 %s encode --tokenizer t.json fifo -o x.bin 2> e.log", z), 2);
    log = zt_slurp("e.log");
    ZT_CHECK(strstr(log, "ztok: error: ") && strstr(log, "fifo is a FIFO"));
    free(log);
    ZT_CHECK_EQ(sh("timeout 20 %s train fifo --vocab 300 -o x.json 2> e.log", z), 2);
    ZT_CHECK_EQ(sh("%s train %s -o x.json 2> e.log", z, txt), 2);
    zt_file_has("e.log", "missing --vocab N");
    write_json("wp.json", "{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}", BL, "null");
    ZT_CHECK_EQ(sh("%s encode --tokenizer wp.json %s -o x.bin 2> e.log", z, txt), 2);
    zt_file_has("e.log", "model of type 'WordPiece' is not supported");
    zt_write_file("bad.txt", "ok \xc3\x28 bad");
    ZT_CHECK_EQ(sh("%s encode --tokenizer t.json bad.txt -o x.bin 2> e.log", z), 2);
    zt_file_has("e.log", "bad.txt: text: not UTF-8 text: invalid byte 0xc3 at offset 3");
    ZT_CHECK(access("x.bin", F_OK) != 0 && access("x.json", F_OK) != 0);
    ZT_CHECK_EQ(sh("%s decode --tokenizer t.json tokens.bin tokens.bin 2> e.log", z), 2);
    zt_file_has("e.log", "unexpected argument tokens.bin");
    /* decode takes one token file, and its usage says so */
    ZT_CHECK_EQ(sh("%s decode --help > h.txt", z), 0);
    zt_file_has("h.txt", "usage: ztok decode --tokenizer FILE FILE [-o FILE]");
}

/* ztok's outputs: never one of its inputs, nor the other output, nor a FIFO or directory (refused
 * before any work, naming both paths); an existing file is replaced by a rename, whole. */
ZT_TEST(tok_cli_outputs_refused)
{
    const char *z = zt_bin("ZT_ZTOK"), *txt = data_path("text.txt");
    ZT_CHECK_EQ(sh("cp %s c.txt && %s train c.txt --vocab 300 -o t.json > /dev/null && %s encode "
                   "--tokenizer t.json c.txt -o toks.bin > /dev/null && cp t.json t.orig && cp "
                   "toks.bin toks.orig", txt, z, z), 0);
    static const struct {
        const char *args, *text;
    } cases[] = {
        {"encode --tokenizer t.json c.txt -o c.txt", "-o c.txt is the same file as the input c.txt"},
        {"encode --tokenizer t.json c.txt -o ./t.json",
         "-o ./t.json is the same file as the input t.json"},
        {"train c.txt --vocab 300 -o c.txt", "-o c.txt is the same file as the input c.txt"},
        {"train c.txt --vocab 300 -o link.txt", "-o link.txt is the same file as the input c.txt"},
        {"decode --tokenizer t.json toks.bin -o toks.bin",
         "-o toks.bin is the same file as the input toks.bin"},
        {"decode --tokenizer t.json toks.bin -o t.json",
         "-o t.json is the same file as the input t.json"},
        {"encode --tokenizer t.json c.txt --val-fraction 0.5 --val-output c.txt -o x.bin",
         "--val-output c.txt is the same file as the input c.txt"},
        {"encode --tokenizer t.json c.txt --val-fraction 0.5 --val-output x.bin -o ./x.bin",
         "the validation output x.bin is the same file as -o ./x.bin"},
        {"encode --tokenizer t.json c.txt --val-output v.bin -o x.bin",
         "--val-output v.bin without --val-fraction"},
        {"decode --tokenizer t.json toks.bin -o fifo", "-o fifo is a FIFO, not a regular file"},
        {"encode --tokenizer t.json c.txt -o fifo", "-o fifo is a FIFO, not a regular file"},
        {"train c.txt --vocab 300 -o dir", "-o dir is a directory, not a regular file"},
    };
    ZT_CHECK_EQ(symlink("c.txt", "link.txt"), 0);
    ZT_CHECK_EQ(mkfifo("fifo", 0644), 0);
    ZT_CHECK_EQ(mkdir("dir", 0755), 0);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out;
        char args[512];
        snprintf(args, sizeof args, "%s < /dev/null", cases[i].args);
        int st = zt_run(&out, z, args);
        if (st != 2 || !strstr(out, cases[i].text))
            ZT_FAIL("ztok %s: status %d (expected 2), output:\n%s\n(expected: %s)",
                    cases[i].args, st, out, cases[i].text);
        free(out);
    }
    /* nothing replaced, nothing written */
    ZT_CHECK(zt_same_file("c.txt", txt) && zt_same_file("t.json", "t.orig") &&
             zt_same_file("toks.bin", "toks.orig"));
    struct stat st;
    ZT_CHECK(lstat("fifo", &st) == 0 && S_ISFIFO(st.st_mode));
    ZT_CHECK(lstat("link.txt", &st) == 0 && S_ISLNK(st.st_mode));
    ZT_CHECK(access("x.bin", F_OK) != 0 && access("v.bin", F_OK) != 0);
    /* an existing output is replaced by a new file renamed over it: a hard link to the old one
     * keeps the old bytes (decode used to truncate and rewrite the file in place) */
    zt_write_file("old.txt", "old text\n");
    ZT_CHECK_EQ(link("old.txt", "keep.txt"), 0);
    ZT_CHECK_EQ(sh("%s decode --tokenizer t.json toks.bin -o old.txt && cmp -s old.txt c.txt",
                   z), 0);
    zt_file_has("keep.txt", "old text\n");
}

/* A token file's header is checked against its size before its tokens are read: a valid
 * header before a 5 GB (sparse) tail is refused at once; an id beyond the header's vocabulary
 * and an id the tokenizer lacks name the token file and the position. */
ZT_TEST(tok_file_header_before_tokens)
{
    const char *z = zt_bin("ZT_ZTOK"), *txt = data_path("text.txt");
    ZT_CHECK_EQ(sh("%s train %s --vocab 300 -o t.json > /dev/null && %s encode --tokenizer "
                   "t.json %s -o toks.bin > /dev/null", z, txt, z, txt), 0);
    zt_truncate("toks.bin", (uint64_t)5 << 30);
    zfmt_tok_ids ids = {0};
    uint32_t vocab;
    double t0 = zt_now_s();
    ZT_ERR(zfmt_tok_file_read(&ids, &vocab, "toks.bin"), ZR_ECORRUPT,
           "llm.c token file 'toks.bin': 53687");
    ZT_CHECK(zt_now_s() - t0 < 1.0); /* the whole file read took seconds */
    ZT_CHECK(!ids.id);
    /* 10 uint16 tokens, the last 65535; the header says vocabulary 300, then 0 (not said) */
    int32_t h[256] = {20240520, 1, 10, 300};
    uint16_t tk[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 65535};
    char buf[sizeof h + sizeof tk];
    memcpy(buf, h, sizeof h);
    memcpy(buf + sizeof h, tk, sizeof tk);
    zt_write_bytes("bad.bin", buf, sizeof buf);
    h[3] = 0;
    memcpy(buf, h, sizeof h);
    zt_write_bytes("bad0.bin", buf, sizeof buf);
    ZT_CHECK_EQ(sh("%s decode --tokenizer t.json bad.bin 2> e.log", z), 2);
    zt_file_has("e.log", "llm.c token file 'bad.bin': id 65535 (position 9) is beyond the "
                "vocabulary of 300 its header declares");
    ZT_CHECK_EQ(sh("%s decode --tokenizer t.json bad0.bin 2> e.log", z), 2);
    zt_file_has("e.log", "ztok: error: bad0.bin: id 65535 (position 9) is not in the tokenizer "
                "t.json (vocab 300)");
}

/* ---------------------------------------------------------------- the library as oracle */

static const char *venv_python(void)
{
    const char *py = zt_venv_python("tokenizers");
    if (!py)
        ZT_SKIP("no build/venv with the tokenizers library (make oracle-venv; PyPI unreachable?)");
    return py;
}

/* ztok's ids for text with tokenizer tok are exactly the library's */
static void same_as_library(const char *py, const char *tok, const char *text)
{
    char oracle[4096];
    snprintf(oracle, sizeof oracle, "%s/tests/tok/oracle.py", zt_root());
    ZT_CHECK_EQ(sh("%s encode --tokenizer %s %s -o o.bin > /dev/null", zt_bin("ZT_ZTOK"), tok, text), 0);
    if (sh("%s %s compare %s %s o.bin > cmp.log 2>&1", py, oracle, tok, text) != 0) {
        char *log = zt_slurp("cmp.log");
        ZT_FAIL("%s on %s:\n%s", tok, text, log);
    }
}

ZT_TEST(tok_oracle_same_ids_as_library)
{
    const char *py = venv_python(), *txt = data_path("text.txt");
    char oracle[4096];
    snprintf(oracle, sizeof oracle, "%s/tests/tok/oracle.py", zt_root());
    /* a corpus: the text's words shuffled into 3000 lines (deterministic) */
    ZT_CHECK_EQ(sh("%s -c \"import random; random.seed(3); w=open('%s',encoding='utf-8')"
                   ".read().split(); f=open('corpus.txt','w',encoding='utf-8'); "
                   "[f.write(' '.join(random.choice(w) for _ in range(random.randint(2,12)))"
                   "+random.choice(['\\n',' ','. ','\\n\\n','  '])) for _ in range(3000)]\"",
                   py, txt), 0);
    same_as_library(py, data_path("hf_bpe.json"), txt);
    same_as_library(py, data_path("hf_bpe.json"), "corpus.txt");
    ZT_CHECK_EQ(sh("%s %s train corpus.txt hf.json 800", py, oracle), 0);
    same_as_library(py, "hf.json", txt);
    ZT_CHECK_EQ(sh("%s %s train corpus.txt split.json 800 split", py, oracle), 0);
    same_as_library(py, "split.json", txt);
    same_as_library(py, "split.json", "corpus.txt");
    /* add_prefix_space (a space before each text between added tokens) */
    ZT_CHECK_EQ(sh("%s -c \"import json; d=json.load(open('hf.json')); "
                   "d['pre_tokenizer']['add_prefix_space']=True; "
                   "json.dump(d, open('prefix.json','w'))\"", py), 0);
    same_as_library(py, "prefix.json", txt);
    /* ztok's own tokenizer loads in the library and gives the same ids */
    ZT_CHECK_EQ(sh("%s train corpus.txt --vocab 800 -o mine.json > /dev/null", zt_bin("ZT_ZTOK")), 0);
    same_as_library(py, "mine.json", txt);
    same_as_library(py, "mine.json", "corpus.txt");
    /* GPT-2's tokenizer (from the GPT-2 ranks the openai-whisper package ships) */
    int rc = sh("%s %s gpt2 gpt2.json", py, oracle);
    if (rc == 77) {
        fprintf(stderr, "  note: openai-whisper not installed: GPT-2's tokenizer not compared\n");
        return;
    }
    ZT_CHECK_EQ(rc, 0);
    zfmt_tok *t;
    ZT_OK(zfmt_tok_load(&t, "gpt2.json"));
    ZT_CHECK_EQ(zfmt_tok_vocab(t), 50257);
    zfmt_tok_ids ids = {0};
    ZT_OK(zfmt_tok_encode(&ids, t, "Hello world", 11, NULL));
    ZT_CHECK(ids.n == 2 && ids.id[0] == 15496 && ids.id[1] == 995); /* GPT-2's own ids */
    zfmt_tok_ids_free(&ids);
    zfmt_tok_free(t);
    same_as_library(py, "gpt2.json", txt);
    same_as_library(py, "gpt2.json", "corpus.txt");
}

/* ---------------------------------------------------------------- zrun --tokenizer */

#define TINY "--model gpt2:layers=1,heads=2,dim=32,ctx=32,vocab=300 --batch 4 --threads 1"

static size_t problems_naming(const char *ckpt, const char *file, zck_problem_kind kind)
{
    zck_report *rep;
    ZT_OK(zck_verify(&rep, ckpt, NULL));
    size_t hits = 0;
    for (size_t i = 0; i < zck_report_count(rep); i++) {
        const zck_problem *p = zck_report_get(rep, i);
        hits += !strcmp(p->file, file) && p->kind == kind;
    }
    zck_report_free(rep);
    return hits;
}

/* tok.json (vocabulary 300, trained on the test text) and tok.bin (the text 3 times) */
static void make_tok_and_data(void)
{
    const char *txt = data_path("text.txt");
    const char *files[] = {txt, txt, txt};
    zfmt_tok_train_opts to = ZFMT_TOK_TRAIN_OPTS_INIT;
    to.vocab = 300;
    ZT_OK(zfmt_tok_train("tok.json", files, 1, &to));
    zfmt_tok *t;
    ZT_OK(zfmt_tok_load(&t, "tok.json"));
    zfmt_tok_file_opts fo = ZFMT_TOK_FILE_OPTS_INIT;
    zfmt_tok_file_stats st;
    ZT_OK(zfmt_tok_encode_files(&st, t, files, 3, "tok.bin", NULL, &fo));
    zfmt_tok_free(t);
}

ZT_TEST(tok_zrun_records_tokenizer_in_checkpoints)
{
    make_tok_and_data();
    zt_zrun_ok("--nproc 2 " TINY " --data tok.bin --tokenizer tok.json --ckpt-dir run "
               "--steps 2", "a.log");
    char *want = zt_slurp("tok.json"), *got;
    size_t n;
    ZT_OK(zck_ckpt_file_read(&got, &n, "run", "tokenizer.json"));
    ZT_CHECK(n == strlen(want) && !memcmp(got, want, n));
    free(got);
    ZT_CHECK_EQ(zt_verify_count("run", 0), 0);
    zt_file_has("run/step-00000002/SHA256SUMS", "  tokenizer.json\n");
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, "run"));
    ZT_CHECK(!strcmp(zck_reader_version(r), "1.1"));
    ZT_CHECK_EQ(zck_reader_n_files(r), 1);
    zck_reader_free(r);
    if (getenv("ZT_ZCKPT")) { /* zckpt inspect lists it */
        char *out;
        ZT_CHECK_EQ(zt_zckpt(&out, "inspect run"), 0);
        ZT_CHECK(strstr(out, "\nfiles        tokenizer.json, "));
        free(out);
        ZT_CHECK_EQ(zt_zckpt(&out, "inspect run --json"), 0);
        ZT_CHECK(strstr(out, "\"file\": \"tokenizer.json\""));
        free(out);
    }
    /* a resume without --tokenizer keeps it; a reshard carries it */
    zt_zrun_ok("--nproc 1 " TINY " --data tok.bin --ckpt-dir run --steps 3", "b.log");
    ZT_OK(zck_ckpt_file_read(&got, &n, "run/step-00000003", "tokenizer.json"));
    ZT_CHECK(n == strlen(want) && !memcmp(got, want, n));
    free(got);
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ZT_OK(zck_reshard(NULL, "run", "run3", 3, &ro));
    ZT_OK(zck_ckpt_file_read(&got, &n, "run3", "tokenizer.json"));
    ZT_CHECK(n == strlen(want) && !memcmp(got, want, n));
    free(got);
    ZT_CHECK_EQ(zt_verify_count("run3", 0), 0);
    /* an archive holds it, verifies it while streaming, and unpacks it */
    ZT_OK(zfmt_pack("run", "run.tar", NULL));
    zck_report *rep;
    ZT_OK(zfmt_archive_verify(&rep, "run.tar", NULL));
    ZT_CHECK_EQ(zck_report_count(rep), 0);
    zck_report_free(rep);
    ZT_OK(zfmt_unpack("run.tar", "un", NULL));
    ZT_OK(zck_ckpt_file_read(&got, &n, "un", "tokenizer.json"));
    ZT_CHECK(n == strlen(want) && !memcmp(got, want, n));
    free(got);
    /* damage is found and named */
    zt_flip_byte("run3/step-00000003/tokenizer.json", 10);
    ZT_CHECK_EQ(problems_naming("run3", "tokenizer.json", ZCK_PROB_HASH), 1);
    ZT_ERR(zck_ckpt_file_read(&got, &n, "run3", "tokenizer.json"), ZR_ECORRUPT,
           "tokenizer.json: SHA-256");
    ZT_CHECK_EQ(unlink("run3/step-00000003/tokenizer.json"), 0);
    ZT_CHECK_EQ(problems_naming("run3", "tokenizer.json", ZCK_PROB_MISSING), 1);
    ZT_ERR(zck_ckpt_file_read(&got, &n, "run3", "tokenizer.json"), ZR_ECORRUPT,
           "listed in the manifest, missing");
    ZT_ERR(zck_ckpt_file_read(&got, &n, "run3", "vocab.txt"), ZR_ENOTFOUND, "has no vocab.txt");
    free(want);
}

ZT_TEST(tok_zrun_refuses_vocabulary_mismatch)
{
    make_tok_and_data();
    /* tokenizer vocabulary 300 > model 256 */
    ZT_CHECK_EQ(zt_zrun("--nproc 2 --model gpt2:layers=1,heads=2,dim=32,ctx=32,vocab=256 "
                        "--batch 4 --threads 1 --tokenizer tok.json --ckpt-dir run --steps 2",
                        "a.log"), 2);
    zt_file_has("a.log", "the tokenizer tok.json has a vocabulary of 300 tokens, the model only "
                         "256");
    zt_file_lacks("a.log", "step      1");
    /* the token file's header says 300 too */
    ZT_CHECK_EQ(zt_zrun("--model gpt2:layers=1,heads=2,dim=32,ctx=32,vocab=256 --batch 4 "
                        "--threads 1 --data tok.bin --ckpt-dir run --steps 2", "b.log"), 2);
    zt_file_has("b.log", "'tok.bin' was written for a vocabulary of 300 tokens, the model has "
                         "256");
    /* the hint names the option that sets it (it named a --vocab zrun does not have) */
    zt_file_has("b.log", "256 (a vocabulary that large: zrun --model ...,vocab=300)");
    zt_file_lacks("b.log", "zrun --vocab");
    ZT_CHECK(access("run/latest", F_OK) != 0);
    /* data encoded with another tokenizer (its header says 300) than the one given (260) */
    zt_write_file("sp.txt", "xy<|endoftext|>xy <|endoftext|> zq<|endoftext|>\n");
    const char *sp[] = {"sp.txt"};
    zfmt_tok_train_opts to = ZFMT_TOK_TRAIN_OPTS_INIT;
    to.vocab = 300;
    ZT_OK(zfmt_tok_train("other.json", sp, 1, &to));
    ZT_CHECK_EQ(zt_zrun("--model gpt2:layers=1,heads=2,dim=32,ctx=32,vocab=300 --batch 4 "
                        "--threads 1 --data tok.bin --tokenizer other.json --ckpt-dir run "
                        "--steps 2", "d.log"), 2);
    zt_file_has("d.log", "tok.bin was encoded with a tokenizer of 300 tokens, --tokenizer "
                         "other.json has 260");
    ZT_CHECK(access("run/latest", F_OK) != 0);
    /* a WordPiece tokenizer is refused before anything starts */
    write_json("wp.json", "{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}", BL, "null");
    ZT_CHECK_EQ(zt_zrun("--tokenizer wp.json --ckpt-dir run2 --steps 1", "c.log"), 2);
    zt_file_has("c.log",
                "zrun: error: --tokenizer: wp.json: model of type 'WordPiece' is not supported");
    ZT_CHECK(access("run2", F_OK) != 0);
    /* a FIFO is refused without blocking, the option named */
    ZT_CHECK_EQ(mkfifo("tf", 0644), 0);
    ZT_CHECK_EQ(zt_zrun("--tokenizer tf --ckpt-dir run2 --steps 1", "f.log"), 2);
    zt_file_has("f.log", "zrun: error: --tokenizer: tf is a FIFO, not a regular file");
}

/* A valid tokenizer.json over the 64 MiB a checkpoint's extra file may hold (its bytes
 * padded with blanks before the last brace) is refused before the first step, naming the
 * option, the file and the limit: it used to train and fail at the first save (issue 24). */
ZT_TEST(tok_zrun_refuses_tokenizer_too_big_before_training)
{
    make_tok_and_data();
    char *json = zt_slurp("tok.json");
    size_t n = strlen(json);
    while (n && json[n - 1] != '}')
        n--;
    ZT_CHECK(n > 0);
    FILE *f = fopen("big.json", "wb");
    ZT_CHECK(f != NULL);
    fwrite(json, 1, n - 1, f);
    for (int i = 0; i < 65; i++) {
        static char blanks[1 << 20];
        memset(blanks, ' ', sizeof blanks);
        fwrite(blanks, 1, sizeof blanks, f);
    }
    fputs("}\n", f);
    ZT_CHECK_EQ(fclose(f), 0);
    free(json);
    struct stat st;
    ZT_CHECK_EQ(stat("big.json", &st), 0);
    char want[160];
    snprintf(want, sizeof want, "zrun: error: --tokenizer big.json: %lld bytes, at most 67108864",
             (long long)st.st_size);
    ZT_CHECK_EQ(zt_zrun("--nproc 2 " TINY " --data tok.bin --tokenizer big.json --ckpt-dir run "
                        "--steps 2 --save-every 0", "a.log"), 2);
    zt_file_has("a.log", want);
    zt_file_lacks("a.log", "step      1");
    zt_file_lacks("a.log", "extra file 'tokenizer.json'");
    ZT_CHECK(access("run", F_OK) != 0);
    /* the library refuses it too, before anything starts */
    zr_train_opts o = ZR_TRAIN_OPTS_INIT;
    o.ckpt_dir = "run";
    char *big = malloc((size_t)st.st_size);
    ZT_CHECK(big != NULL);
    f = fopen("big.json", "rb");
    ZT_CHECK(f && fread(big, 1, (size_t)st.st_size, f) == (size_t)st.st_size);
    fclose(f);
    o.tokenizer_json = big;
    o.tokenizer_bytes = (size_t)st.st_size;
    o.tokenizer_vocab = 300;
    o.tokenizer_path = "big.json";
    zr_train_result r;
    snprintf(want, sizeof want, "--tokenizer big.json: %lld bytes; every checkpoint",
             (long long)st.st_size);
    ZT_ERR(zr_train(&r, &o), ZR_EINVAL, want);
    ZT_CHECK(access("run", F_OK) != 0);
    free(big);
}

/* Data read as bytes (a text file, the synthetic corpus) beside a BPE tokenizer, given or the
 * checkpoint's: refused before any step, naming ztok encode (the model trained on byte ids and
 * every checkpoint named the tokenizer, with which zgen then encoded prompts; issue 24). */
ZT_TEST(tok_zrun_refuses_byte_data_with_tokenizer)
{
    make_tok_and_data();
    const char *txt = data_path("text.txt");
    char args[8192];
    snprintf(args, sizeof args, TINY " --data %s --tokenizer tok.json --ckpt-dir run --steps 2",
             txt);
    ZT_CHECK_EQ(zt_zrun(args, "a.log"), 2);
    zt_file_has("a.log", "is read as raw bytes (token ids 0-255), but the run has a BPE "
                         "tokenizer (--tokenizer tok.json)");
    zt_file_has("a.log", "ztok encode --tokenizer tok.json");
    zt_file_lacks("a.log", "step      1");
    ZT_CHECK(access("run/latest", F_OK) != 0);
    ZT_CHECK_EQ(zt_zrun("--nproc 2 " TINY " --tokenizer tok.json --ckpt-dir run --steps 2",
                        "b.log"), 2);
    zt_file_has("b.log", "--data synthetic is a corpus of byte tokens, but the run has a BPE "
                         "tokenizer (--tokenizer tok.json)");
    zt_file_lacks("b.log", "step      1");
    ZT_CHECK(access("run/latest", F_OK) != 0);
    /* a resume without --tokenizer keeps the checkpoint's: text data is refused too */
    zt_zrun_ok(TINY " --data tok.bin --tokenizer tok.json --ckpt-dir run --steps 2", "c.log");
    snprintf(args, sizeof args, TINY " --data %s --ckpt-dir run --steps 4", txt);
    ZT_CHECK_EQ(zt_zrun(args, "d.log"), 2);
    zt_file_has("d.log", "but the run has a BPE tokenizer (the checkpoint's ");
    zt_file_has("d.log", "step-00000002/tokenizer.json)");
    ZT_CHECK(access("run/step-00000004", F_OK) != 0);
}

ZT_TEST(tok_ckpt_extra_file_names_checked)
{
    static const uint64_t sizes[] = {100, 7};
    zck_layout *L = zt_layout(2, sizes);
    ZT_OK(zck__mkdir_for_tests("run"));
    char *stg;
    ZT_OK(zck_staging_create(&stg, "run", 5, 1));
    zck_shard *sh = zt_write_rank(stg, L, 1, 0, 3, NULL);
    zck_commit_opts co = ZCK_COMMIT_OPTS_INIT;
    co.step = 5;
    zck_extra_file bad[] = {{"../x", "a", 1}};
    co.files = bad;
    co.n_files = 1;
    ZT_ERR(zck_commit(NULL, "run", stg, L, &sh, 1, &co), ZR_EINVAL,
           "'../x' is not a name for an extra file");
    zck_extra_file two[] = {{"a.json", "{}", 2}, {"SHA256SUMS", "x", 1}};
    co.files = two;
    co.n_files = 2;
    ZT_ERR(zck_commit(NULL, "run", stg, L, &sh, 1, &co), ZR_EINVAL, "'SHA256SUMS' is not a name");
    two[1].name = "b.txt";
    ZT_OK(zck_commit(NULL, "run", stg, L, &sh, 1, &co));
    ZT_CHECK_EQ(zt_verify_count("run", 0), 0);
    char *got;
    size_t n;
    ZT_OK(zck_ckpt_file_read(&got, &n, "run", "b.txt"));
    ZT_CHECK(n == 1 && got[0] == 'x');
    free(got);
    /* a checkpoint without extra files stays version 1.0; an extra file nobody listed is
     * still reported */
    zt_write_file("run/step-00000005/c.txt", "stray");
    ZT_CHECK_EQ(problems_naming("run", "c.txt", ZCK_PROB_UNLISTED), 1);
    zck_shard_free(sh);
    free(stg);
    zck_layout_free(L);
}

/* zgen encodes the prompt and decodes the continuation with the run's tokenizer; the Hugging
 * Face export carries it; the tokenizer's oracle loads the exported one. */
ZT_TEST(tok_zgen_and_hf_export_use_the_runs_tokenizer)
{
    const char *zgen = zt_bin("ZT_ZGEN");
    make_tok_and_data();
    zt_zrun_ok("--nproc 1 " TINY " --data tok.bin --tokenizer tok.json --ckpt-dir run "
               "--steps 2", "a.log");
    const char *prompt = "The cat sat";
    ZT_CHECK_EQ(sh("%s run --prompt '%s' --tokens 6 --temperature 0 --json > g.json 2> g.err",
                   zgen, prompt), 0);
    json_error_t je;
    json_t *j = json_load_file("g.json", 0, &je);
    ZT_CHECK(j);
    /* the prompt's ids are the tokenizer's, its text comes back whole */
    zfmt_tok *t;
    ZT_OK(zfmt_tok_load(&t, "tok.json"));
    zfmt_tok_ids v = {0};
    ZT_OK(zfmt_tok_encode(&v, t, prompt, strlen(prompt), NULL));
    json_t *pids = json_object_get(j, "prompt_ids");
    ZT_CHECK_EQ(json_array_size(pids), v.n);
    ZT_CHECK(v.n < strlen(prompt)); /* merges were used: not one id per byte */
    for (size_t i = 0; i < v.n; i++)
        ZT_CHECK_EQ(json_integer_value(json_array_get(pids, i)), v.id[i]);
    ZT_CHECK(!strcmp(json_string_value(json_object_get(j, "prompt")), prompt));
    /* the continuation's text is the decoding of its ids */
    json_t *ids = json_object_get(j, "ids");
    ZT_CHECK_EQ(json_array_size(ids), 6);
    uint32_t out[6];
    for (size_t i = 0; i < 6; i++)
        out[i] = (uint32_t)json_integer_value(json_array_get(ids, i));
    char *text;
    size_t n;
    ZT_OK(zfmt_tok_decode(&text, &n, t, out, 6));
    const char *got = json_string_value(json_object_get(j, "text"));
    ZT_CHECK(got && strlen(got) == n && !memcmp(got, text, n));
    free(text);
    zfmt_tok_ids_free(&v);
    zfmt_tok_free(t);
    json_decref(j);
    /* a damaged tokenizer in the checkpoint is refused, naming it */
    ZT_OK(zfmt_hf_export("run", "hf", NULL));
    char *want = zt_slurp("tok.json"), *exp = zt_slurp("hf/tokenizer.json");
    ZT_CHECK(!strcmp(want, exp));
    free(want);
    free(exp);
    zt_flip_byte("run/step-00000002/tokenizer.json", 5);
    ZT_CHECK_EQ(sh("%s run --prompt x --tokens 2 > g.out 2> g.err", zgen), 1);
    zt_file_has("g.err", "tokenizer.json");
    ZT_ERR(zfmt_hf_export("run", "hf2", NULL), ZR_ECORRUPT, "tokenizer.json");
}

/* zrun --sample-every encodes its prompt and decodes the samples with the run's tokenizer, the
 * one given and, on a resume without --tokenizer, the checkpoint's */
ZT_TEST(tok_zrun_samples_through_the_tokenizer)
{
    make_tok_and_data();
    zt_zrun_ok("--nproc 2 --zero 3 " TINY " --data tok.bin --tokenizer tok.json --ckpt-dir run "
               "--steps 2 --sample-every 2 --sample-tokens 4 --prompt 'The cat sat'", "a.log");
    zt_zrun_ok("--nproc 1 " TINY " --data tok.bin --ckpt-dir run --steps 4 --sample-every 2 "
               "--sample-tokens 4 --prompt 'The cat sat'", "b.log");
    const char *logs[] = {"a.log", "b.log"};
    for (int k = 0; k < 2; k++) {
        char *log = zt_slurp(logs[k]);
        if (!strstr(log, "sample at step 2: The cat sat") &&
            !strstr(log, "sample at step 4: The cat sat"))
            ZT_FAIL("%s: no sample decoded through the tokenizer:\n%s", logs[k], log);
        free(log);
    }
    /* the prompt is checked in tokens against the context: 33 tokens > ctx 32 */
    char longp[200] = "";
    for (int i = 0; i < 40; i++)
        strcat(longp, " x");
    char args[1024];
    snprintf(args, sizeof args, "--nproc 1 " TINY " --data tok.bin --tokenizer tok.json "
             "--ckpt-dir run2 --steps 2 --sample-every 1 --prompt '%s'", longp);
    ZT_CHECK(zt_zrun(args, "c.log") != 0);
    char *log = zt_slurp("c.log");
    ZT_CHECK(strstr(log, "--prompt: ") && strstr(log, "tokens, more than the model's context"));
    free(log);
}
