/*
 * test_hf.c: `zckpt export --format hf` (zfmt_hf_export) and `zckpt import` of Hugging Face
 * directories. The C side checks the files (config.json, Hugging Face's GPT-2 and Llama names,
 * shards with an index at --shard-size, bf16), that an export imports back to the same tensors
 * bit for bit, that checkpoints of any world size export the same bytes, and that the config
 * fields that change the maths are refused naming the field. The oracle is transformers itself
 * on PyTorch (tests/formats/hf_torch.py, in the oracle venv; skipped with one line without it):
 * exports load with from_pretrained and give zero's logits, and directories that
 * transformers' save_pretrained writes import to zero models with transformers' loss.
 */
#include "ckutil.h"
#include "harness.h"
#include "zfmt.h"
#include "zr.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>

/* a GPT-2 of 2 layers, 2 heads, width 16, context 16, vocabulary 256 */
static const char *const SPEC = "gpt2:layers=2,heads=2,dim=16,ctx=16,vocab=256";

/* A trained run of model spec: 6 steps of zrun at world w, stage s, saved at step 6. */
static void train_model(const char *run, const char *spec, int world, int stage)
{
    char log[64];
    snprintf(log, sizeof log, "%s.log", run);
    zt_zrunf_ok(log, "--model %s --nproc %d --zero %d --steps 6 --save-every 6 --batch 4 "
                "--seq 16 --ckpt-dir %s", spec, world, stage, run);
}

static void train(const char *run, int world, int stage) { train_model(run, SPEC, world, stage); }

/* The checkpoints latest names in runs a and b hold the same params, bit for bit. */
static void same_params(const char *a, const char *b)
{
    zck_reader *ra, *rb;
    ZT_OK(zck_reader_open(&ra, a));
    ZT_OK(zck_reader_open(&rb, b));
    const zck_layout *L = zck_reader_layout(ra);
    ZT_CHECK_EQ(zck_layout_n_groups(L), zck_layout_n_groups(zck_reader_layout(rb)));
    for (size_t g = 0; g < zck_layout_n_groups(L); g++) {
        uint64_t n = zck_layout_group_numel(L, g);
        ZT_CHECK_EQ(n, zck_layout_group_numel(zck_reader_layout(rb), g));
        float *x = malloc(n * 4), *y = malloc(n * 4);
        ZT_CHECK(x && y);
        zck_read_opts ro = ZCK_READ_OPTS_INIT;
        zck_read_req qa = {g, 0, 0, n, x}, qb = {g, 0, 0, n, y};
        ZT_OK(zck_reader_read(ra, &qa, 1, &ro));
        ZT_OK(zck_reader_read(rb, &qb, 1, &ro));
        if (memcmp(x, y, n * 4))
            ZT_FAIL("group %s differs between %s and %s", zck_layout_group_name(L, g), a, b);
        free(x);
        free(y);
    }
    ZT_CHECK(!strcmp(zck_reader_model_json(ra), zck_reader_model_json(rb)));
    zck_reader_free(ra);
    zck_reader_free(rb);
}

/* A tokenizer.json of 256 tokens (the bytes, no merge, no special token): the model's vocabulary */
static void byte_tokenizer(const char *path)
{
    zt_write_file("tok.txt", "a b\n");
    const char *files[] = {"tok.txt"};
    zfmt_tok_train_opts o = ZFMT_TOK_TRAIN_OPTS_INIT;
    o.vocab = 256;
    o.special = "";
    ZT_OK(zfmt_tok_train(path, files, 1, &o));
}

/* Entries of dir whose name starts with prefix (temporary files left behind). */
static int count_like(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    ZT_CHECK(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

ZT_TEST(hf_export_round_trip_and_world_sizes)
{
    train("run", 2, 3);
    ZT_OK(zfmt_hf_export("run", "hf", NULL));
    char *cfg = zt_slurp("hf/config.json");
    ZT_CHECK(strstr(cfg, "\"model_type\": \"gpt2\""));
    ZT_CHECK(strstr(cfg, "\"n_embd\": 16") && strstr(cfg, "\"vocab_size\": 256"));
    ZT_CHECK(strstr(cfg, "\"activation_function\": \"gelu_new\""));
    free(cfg);
    /* import -> the same params as the run's checkpoint, bit for bit */
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    ZT_OK(zfmt_import("hf", "back", &io));
    same_params("run", "back");
    /* the same model at world 1 (resharded) exports the same bytes; so does the import */
    char *out;
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ZT_OK(zck_reshard(&out, "run", "one", 1, &ro));
    free(out);
    ZT_OK(zfmt_hf_export("one", "hf1", NULL));
    ZT_OK(zfmt_hf_export("back", "hf2", NULL));
    ZT_CHECK(zt_same_file("hf/model.safetensors", "hf1/model.safetensors"));
    ZT_CHECK(zt_same_file("hf/model.safetensors", "hf2/model.safetensors"));
    /* bf16 export: half the bytes of the weights */
    zfmt_hf_opts ho = ZFMT_HF_OPTS_INIT;
    ho.dtype = ZCK_BF16;
    ZT_OK(zfmt_hf_export("run", "hf16", &ho));
    zt_file_has("hf16/config.json", "\"torch_dtype\": \"bfloat16\"");
}

/* config.json of dir read with Jansson: its bos_token_id and eos_token_id are both want (-1:
 * both null); its layer_norm_epsilon (GPT-2) or rms_norm_eps (Llama) reads 1e-5, written so. */
static void config_eos_is(const char *dir, json_int_t want)
{
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        ZT_FAIL("%s: %s", path, je.text);
    const char *keys[] = {"bos_token_id", "eos_token_id"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(j, keys[i]);
        if (want < 0 ? !json_is_null(v) : !json_is_integer(v) || json_integer_value(v) != want)
            ZT_FAIL("%s: %s is %s, expected %lld", path, keys[i], json_dumps(v, JSON_ENCODE_ANY),
                    (long long)want);
    }
    json_t *eps = json_object_get(j, "layer_norm_epsilon");
    if (!eps)
        eps = json_object_get(j, "rms_norm_eps");
    ZT_CHECK(json_is_real(eps) && json_real_value(eps) == 1e-5);
    zt_file_has(path, "_eps");
    char *text = zt_slurp(path);
    ZT_CHECK(strstr(text, "\": 1e-5,") && !strstr(text, "00000"));
    free(text);
    json_decref(j);
}

/* The exports' config.json names the tokenizer's end-of-text token <|endoftext|> as bos and eos:
 * the checkpoint's tokenizer (zrun --tokenizer), or the one given; null without one. */
ZT_TEST(hf_export_config_names_end_of_text)
{
    zt_write_file("c.txt", "the cat sat on the mat.<|endoftext|>the dog sat on the log.\n");
    const char *files[] = {"c.txt"};
    zfmt_tok_train_opts to = ZFMT_TOK_TRAIN_OPTS_INIT; /* special token <|endoftext|>, last */
    to.vocab = 270;
    ZT_OK(zfmt_tok_train("tok.json", files, 1, &to));
    zfmt_tok *t;
    ZT_OK(zfmt_tok_load(&t, "tok.json"));
    int64_t eos = zfmt_tok_id(t, "<|endoftext|>");
    ZT_CHECK(eos > 255);
    zfmt_tok_file_opts fo = ZFMT_TOK_FILE_OPTS_INIT;
    zfmt_tok_file_stats st;
    const char *many[] = {"c.txt", "c.txt", "c.txt", "c.txt", "c.txt", "c.txt", "c.txt", "c.txt"};
    ZT_OK(zfmt_tok_encode_files(&st, t, many, 8, "c.bin", NULL, &fo));
    zfmt_tok_free(t);
    zt_zrunf_ok("g.log", "--model gpt2:layers=1,heads=2,dim=16,ctx=16,vocab=272 --steps 2 "
                "--batch 2 --seq 16 --data c.bin --tokenizer tok.json --ckpt-dir g");
    ZT_OK(zfmt_hf_export("g", "hfg", NULL));
    config_eos_is("hfg", eos);
    ZT_CHECK(zt_same_file("hfg/tokenizer.json", "tok.json"));
    /* through zckpt, and a Llama */
    char *out;
    ZT_CHECK_EQ(zt_zckpt(&out, "export g --format hf -o hfz"), 0);
    free(out);
    config_eos_is("hfz", eos);
    zt_zrunf_ok("l.log", "--model llama:layers=1,heads=2,kv_heads=1,dim=16,ffn=32,ctx=16,"
                "vocab=272 --steps 2 --batch 2 --seq 16 --data c.bin --tokenizer tok.json "
                "--ckpt-dir l");
    ZT_OK(zfmt_hf_export("l", "hfl", NULL));
    config_eos_is("hfl", eos);
    /* a run without a tokenizer: null; the tokenizer given names it; one without the token:
     * null */
    train("run", 1, 0);
    ZT_OK(zfmt_hf_export("run", "hfn", NULL));
    config_eos_is("hfn", -1);
    zt_write_file("small.txt", "a b<|endoftext|>\n");
    const char *sf[] = {"small.txt"};
    to.vocab = 257; /* the bytes, then <|endoftext|>: 256 */
    ZT_OK(zfmt_tok_train("t257.json", sf, 1, &to));
    train_model("r257", "gpt2:layers=1,heads=2,dim=16,ctx=16,vocab=257", 1, 0);
    zfmt_hf_opts ho = ZFMT_HF_OPTS_INIT;
    ho.tokenizer_json = "t257.json";
    ZT_OK(zfmt_hf_export("r257", "hft", &ho));
    config_eos_is("hft", 256);
    byte_tokenizer("bytes.json");
    ho.tokenizer_json = "bytes.json";
    ZT_OK(zfmt_hf_export("run", "hfb", &ho));
    config_eos_is("hfb", -1);
}

ZT_TEST(hf_export_refuses_and_leaves_nothing)
{
    train("run", 2, 1);
    /* a corrupt shard: nothing appears, nothing temporary is left */
    char *ck;
    ZT_OK(zck_latest(&ck, "run"));
    char shard[4096];
    snprintf(shard, sizeof shard, "%s/shard-00001-of-00002.bin", ck);
    zt_flip_byte(shard, 64);
    ZT_ERR(zfmt_hf_export("run", "hf", NULL), ZR_ECORRUPT, "shard-00001-of-00002.bin");
    struct stat st;
    ZT_CHECK(lstat("hf", &st) < 0);
    ZT_CHECK_EQ(count_like(".", "hf."), 0);
    zt_flip_byte(shard, 64);
    free(ck);
    /* an existing directory: refused unless --force, and then only when it holds an export */
    ZT_CHECK(mkdir("hf", 0755) == 0);
    zt_write_file("hf/notes.txt", "mine\n");
    ZT_ERR(zfmt_hf_export("run", "hf", NULL), ZR_EEXIST, "not empty");
    zfmt_hf_opts o = ZFMT_HF_OPTS_INIT;
    o.force = 1;
    ZT_ERR(zfmt_hf_export("run", "hf", &o), ZR_EEXIST, "notes.txt");
    ZT_CHECK(lstat("hf/notes.txt", &st) == 0);
    ZT_OK(zfmt_hf_export("run", "hf2", NULL));
    ZT_ERR(zfmt_hf_export("run", "hf2", NULL), ZR_EEXIST, "not empty");
    byte_tokenizer("tok.json");
    o.tokenizer_json = "tok.json";
    ZT_OK(zfmt_hf_export("run", "hf2", &o)); /* an earlier export is replaced */
    ZT_CHECK(zt_same_file("hf2/tokenizer.json", "tok.json"));
    ZT_CHECK_EQ(count_like(".", "hf2."), 0);
    /* a file or a link where the directory goes */
    zt_write_file("plain", "x\n");
    ZT_ERR(zfmt_hf_export("run", "plain", &o), ZR_EEXIST, "not a directory");
    ZT_CHECK(symlink("hf2", "link") == 0);
    ZT_ERR(zfmt_hf_export("run", "link", &o), ZR_EEXIST, "symbolic link");
    /* a checkpoint that is not there */
    ZT_ERR(zfmt_hf_export("nowhere", "hf3", NULL), ZR_ENOTFOUND, "nowhere");
    /* through the program: usage and the hint */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s export run --format hf -o hf2 > out.txt 2>&1",
             getenv("ZT_ZCKPT"));
    ZT_CHECK(WEXITSTATUS(system(cmd)) == 2);
    zt_file_has("out.txt", "--force");
    snprintf(cmd, sizeof cmd, "%s export run --format llmc -o x.bin --tokenizer tok.json "
             "> out.txt 2>&1", getenv("ZT_ZCKPT"));
    ZT_CHECK(WEXITSTATUS(system(cmd)) == 2);
}

/* --tokenizer FILE is loaded as a tokenizer and must fit the model's vocabulary: anything else
 * is refused naming the file, before anything is written; it is a usage error with a format
 * that has no tokenizer. */
ZT_TEST(hf_export_checks_the_given_tokenizer)
{
    train("run", 1, 1);
    char big[4096];
    snprintf(big, sizeof big, "%s/tests/data/tok/hf_bpe.json", zt_root());
    zt_write_file("notjson.json", "{\"model\": \n");
    zt_write_file("text.json", "just some words\n");
    const unsigned char bin[] = {0x7f, 'E', 'L', 'F', 0, 1, 2, 0xff, 0xfe, 0};
    zt_write_bytes("bin.json", bin, sizeof bin);
    zt_write_file("other.json", "{\"model\": {\"type\": \"BPE\"}}\n");
    ZT_CHECK(mkfifo("fifo.json", 0644) == 0); /* refused without blocking on an open */
    const char *bad[] = {"notjson.json", "text.json", "bin.json", "other.json", "fifo.json"};
    const int code[] = {ZR_EINVAL, ZR_EINVAL, ZR_EINVAL, ZR_EUNSUPPORTED, ZR_EINVAL};
    zfmt_hf_opts o = ZFMT_HF_OPTS_INIT;
    struct stat st;
    char *out;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        o.tokenizer_json = bad[i];
        ZT_ERR(zfmt_hf_export("run", "hf", &o), code[i], bad[i]);
        ZT_CHECK(lstat("hf", &st) < 0);
        ZT_CHECK_EQ(zt_zckpt(&out, "export run --format hf -o hf --tokenizer %s", bad[i]), 2);
        if (!strstr(out, bad[i]) || strstr(out, "zckpt verify"))
            ZT_FAIL("export --tokenizer %s:\n%s", bad[i], out);
        free(out);
        ZT_CHECK(lstat("hf", &st) < 0);
    }
    ZT_CHECK_EQ(count_like(".", "hf."), 0);
    /* a sound tokenizer.json of 700 tokens for a model of 256: both numbers said */
    o.tokenizer_json = big;
    ZT_ERR(zfmt_hf_export("run", "hf", &o), ZR_EINVAL, "vocabulary of 700 tokens, the model only "
           "256");
    ZT_CHECK_EQ(zt_zckpt(&out, "export run --format hf -o hf --tokenizer %s", big), 2);
    ZT_CHECK(strstr(out, big) && strstr(out, "700") && strstr(out, "256"));
    free(out);
    ZT_CHECK(lstat("hf", &st) < 0);
    /* one that fits goes in as it is */
    byte_tokenizer("tok.json");
    ZT_CHECK_EQ(zt_zckpt(&out, "export run --format hf -o hf --tokenizer tok.json"), 0);
    free(out);
    ZT_CHECK(zt_same_file("hf/tokenizer.json", "tok.json"));
    /* formats without a tokenizer: a usage error, nothing written */
    const char *fmts[] = {"safetensors -o x.safetensors", "llmc -o x.bin"};
    for (size_t i = 0; i < 2; i++) {
        ZT_CHECK_EQ(zt_zckpt(&out, "export run --format %s --tokenizer tok.json", fmts[i]), 2);
        if (!strstr(out, "--tokenizer applies to --format hf only"))
            ZT_FAIL("export --format %s --tokenizer:\n%s", fmts[i], out);
        free(out);
    }
    ZT_CHECK(lstat("x.safetensors", &st) < 0 && lstat("x.bin", &st) < 0);
}

/* What zero computes for tokens [T] with the model latest names in run, for tests/formats/
 * hf_torch.py check: OUT.tokens; OUT.logits [T, V] from the KV-cache forward (zr_gen, as zgen);
 * OUT.probs [T, V] from the training forward; OUT.loss, the training loss of tokens[1:] after
 * tokens[:-1]. */
static void zero_outputs(const char *run, const char *out, const int32_t *tokens, size_t T)
{
    zr_set_threads(2); /* zrun's default --threads */
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, run));
    zr_gpt2_config c;
    ZT_OK(zr_gpt2_config_from_json(&c, zck_reader_model_json(r)));
    zr_model *m;
    ZT_OK(zr_model_new(&m, &c, 1));
    const zck_layout *L = zck_reader_layout(r);
    for (size_t g = 0; g < zck_layout_n_groups(L); g++) {
        zck_read_opts ro = ZCK_READ_OPTS_INIT;
        zck_read_req q = {g, 0, 0, zck_layout_group_numel(L, g), zr_model_param(m, g)};
        ZT_OK(zck_reader_read(r, &q, 1, &ro));
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.tokens", out);
    zt_write_bytes(path, tokens, T * sizeof *tokens);
    float *logits = malloc(T * c.vocab * sizeof *logits), loss;
    zr_gen *g;
    ZT_CHECK(logits);
    ZT_OK(zr_gen_new(&g, &c, zr_model_param(m, 0)));
    for (size_t t = 0; t < T; t++) {
        const float *lg;
        ZT_OK(zr_gen_feed(g, tokens + t, 1, &lg));
        memcpy(logits + t * c.vocab, lg, c.vocab * sizeof *lg);
    }
    snprintf(path, sizeof path, "%s.logits", out);
    zt_write_bytes(path, logits, T * c.vocab * sizeof *logits);
    ZT_OK(zr_model_forward(m, tokens, tokens + 1, 1, T - 1, &loss));
    snprintf(path, sizeof path, "%s.loss", out);
    char text[64];
    snprintf(text, sizeof text, "%.9g\n", loss);
    zt_write_file(path, text);
    ZT_OK(zr_model_forward(m, tokens, NULL, 1, T, &loss));
    snprintf(path, sizeof path, "%s.probs", out);
    zt_write_bytes(path, zr_model_probs(m), T * c.vocab * sizeof(float));
    free(logits);
    zr_gen_free(g);
    zr_model_free(m);
    zck_reader_free(r);
}

/* tests/formats/hf_torch.py with args (one shell fragment) in the oracle venv: skips the test
 * with one line when there is no venv or it has no torch and transformers (exit 77); fails it
 * with the output unless it exits 0; else prints its lines (the measured differences). */
static void hf_torch(const char *args)
{
    char *txt = zt_py_script("json", "hf_torch.py", args);
    fprintf(stderr, "%s", txt);
    free(txt);
}

/* n Hugging Face directories dirs[i] against the runs runs[i] (the same model in zero):
 * transformers' from_pretrained of each gives zero's logits, probabilities and loss on tokens
 * (each below the vocabulary), zero computing on 2 threads as zrun does by default. */
static void torch_agrees(const char *const *dirs, const char *const *runs,
                         size_t n, const int32_t *tokens, size_t T)
{
    char args[8192] = "check";
    for (size_t i = 0; i < n; i++) {
        char out[64];
        snprintf(out, sizeof out, "zero%zu", i);
        zero_outputs(runs[i], out, tokens, T);
        snprintf(args + strlen(args), sizeof args - strlen(args), " %s %s", dirs[i], out);
    }
    hf_torch(args);
}

static const int32_t TOKENS[] = {3, 17, 0, 63, 5, 5, 42, 11, 20, 1, 8, 2, 60, 33};
#define N_TOKENS (sizeof TOKENS / sizeof *TOKENS)

/* ---------------------------------------------------------------- Llama */

/* grouped-query attention: 4 heads sharing 2 KV heads of 4 channels */
#define LLAMA "llama:layers=2,heads=4,kv_heads=2,dim=16,ffn=40,ctx=16,vocab=256"

/* The safetensors header of path (after its 8-byte length) as text. */
static char *st_header(const char *path)
{
    char *b = zt_slurp(path);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)(unsigned char)b[i] << (8 * i);
    char *h = malloc(n + 1);
    ZT_CHECK(h);
    memcpy(h, b + 8, n);
    h[n] = 0;
    free(b);
    return h;
}

/* Files of a Hugging Face export: export run to dir (shard_bytes), import it back into back:
 * the same params. */
static void llama_round_trip(const char *run, const char *dir, const char *back,
                             uint64_t shard_bytes)
{
    zfmt_hf_opts o = ZFMT_HF_OPTS_INIT;
    o.shard_bytes = shard_bytes;
    ZT_OK(zfmt_hf_export(run, dir, &o));
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    io.world = 2;
    ZT_OK(zfmt_import(dir, back, &io));
    same_params(run, back);
}

ZT_TEST(hf_llama_export_import_round_trip)
{
    train_model("run", LLAMA, 2, 3);
    llama_round_trip("run", "hf", "back", ZFMT_HF_SHARD_DEFAULT);
    char *cfg = zt_slurp("hf/config.json");
    const char *want[] = {"\"architectures\": [\n    \"LlamaForCausalLM\"\n  ]",
                          "\"model_type\": \"llama\"", "\"hidden_size\": 16",
                          "\"intermediate_size\": 40", "\"num_hidden_layers\": 2",
                          "\"num_attention_heads\": 4", "\"num_key_value_heads\": 2",
                          "\"max_position_embeddings\": 16", "\"vocab_size\": 256",
                          "\"rms_norm_eps\": 1e-5", "\"rope_theta\": 10000.0",
                          "\"tie_word_embeddings\": false", "\"hidden_act\": \"silu\"",
                          "\"rope_scaling\": null", "\"torch_dtype\": \"float32\""};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(cfg, want[i]))
            ZT_FAIL("hf/config.json lacks %s:\n%s", want[i], cfg);
    free(cfg);
    char *h = st_header("hf/model.safetensors");
    ZT_CHECK(strstr(h, "\"model.layers.1.self_attn.k_proj.weight\":{\"dtype\":\"F32\","
                       "\"shape\":[8,16]"));
    ZT_CHECK(strstr(h, "\"lm_head.weight\"") && strstr(h, "\"model.embed_tokens.weight\""));
    free(h);
    /* the import exports the same bytes */
    ZT_OK(zfmt_hf_export("back", "hf2", NULL));
    ZT_CHECK(zt_same_file("hf/model.safetensors", "hf2/model.safetensors"));
    /* sharded at 4 KiB: shards of at most 4 KiB (a larger tensor alone) and the index */
    llama_round_trip("run", "hs", "back_s", 4096);
    struct stat st;
    ZT_CHECK(lstat("hs/model.safetensors", &st) < 0);
    int n = count_like("hs", "model-");
    ZT_CHECK(n > 2);
    char *idx = zt_slurp("hs/model.safetensors.index.json");
    char name[128];
    snprintf(name, sizeof name, "\"lm_head.weight\": \"model-%05d-of-%05d.safetensors\"", n,
             n);
    ZT_CHECK(strstr(idx, name) && strstr(idx, "\"total_size\": "));
    free(idx);
    /* a shard size that would make more than 512 files (each stays open until the source
     * verified): 60 layers of 9 tensors, each its own file */
    zt_zrun_ok("--model llama:layers=60,heads=2,kv_heads=1,dim=8,ffn=8,ctx=8,vocab=256 --steps 1 "
               "--batch 1 --seq 8 --ckpt-dir deep", "deep.log");
    zfmt_hf_opts tiny = ZFMT_HF_OPTS_INIT;
    tiny.shard_bytes = 8;
    ZT_ERR(zfmt_hf_export("deep", "h8", &tiny), ZR_EINVAL, "543 files (at most 512)");
    ZT_CHECK(lstat("h8", &st) < 0 && count_like(".", "h8.") == 0);
    /* bf16: half the bytes; import and export again give the same bytes */
    zfmt_hf_opts o = ZFMT_HF_OPTS_INIT;
    o.dtype = ZCK_BF16;
    ZT_OK(zfmt_hf_export("run", "h16", &o));
    ZT_OK(zfmt_import("h16", "b16", NULL));
    ZT_OK(zfmt_hf_export("b16", "h16b", &o));
    ZT_CHECK(zt_same_file("h16/model.safetensors", "h16b/model.safetensors"));
    /* tied: no lm_head.weight */
    train_model("tied", LLAMA ",tied=1", 1, 0);
    llama_round_trip("tied", "ht", "back_t", ZFMT_HF_SHARD_DEFAULT);
    cfg = zt_slurp("ht/config.json");
    ZT_CHECK(strstr(cfg, "\"tie_word_embeddings\": true"));
    free(cfg);
    h = st_header("ht/model.safetensors");
    ZT_CHECK(!strstr(h, "lm_head"));
    free(h);
}

/* Rewrite dir/config.json from text with the first `from` replaced by `to`. */
static void edit_config(const char *dir, const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (!at)
        ZT_FAIL("config.json has no %s", from);
    size_t n = strlen(text) + strlen(to) + 1;
    char *s = malloc(n), path[512];
    ZT_CHECK(s);
    snprintf(s, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    snprintf(path, sizeof path, "%s/config.json", dir);
    zt_write_file(path, s);
    free(s);
}

ZT_TEST(hf_llama_import_refuses_naming_the_field)
{
    train_model("run", LLAMA, 1, 0);
    ZT_OK(zfmt_hf_export("run", "hf", NULL));
    char *cfg = zt_slurp("hf/config.json");
    static const struct {
        const char *from, *to;
        int code;
        const char *msg;
    } bad[] = {
        {"\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}",
         ZR_EUNSUPPORTED, "'rope_scaling'"},
        {"\"rope_scaling\": null", "\"rope_scaling\": null, \"sliding_window\": 8",
         ZR_EUNSUPPORTED, "'sliding_window'"},
        {"\"rope_scaling\": null", "\"rope_parameters\": {\"rope_type\": \"yarn\"}",
         ZR_EUNSUPPORTED, "'rope_parameters'"},
        {"\"attention_bias\": false", "\"attention_bias\": true", ZR_EUNSUPPORTED,
         "'attention_bias'"},
        {"\"mlp_bias\": false", "\"mlp_bias\": true", ZR_EUNSUPPORTED, "'mlp_bias'"},
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", ZR_EUNSUPPORTED,
         "'hidden_act'"},
        {"\"head_dim\": 4", "\"head_dim\": 8", ZR_EUNSUPPORTED, "'head_dim'"},
        {"\"LlamaForCausalLM\"", "\"MistralForCausalLM\"", ZR_EUNSUPPORTED,
         "MistralForCausalLM"},
        {"\"model_type\": \"llama\"", "\"model_type\": \"mistral\"", ZR_EUNSUPPORTED,
         "mistral"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", ZR_ECORRUPT,
         "not a multiple of kv_heads"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 4", ZR_ECORRUPT,
         "'model.layers.0.self_attn.k_proj.weight' has shape [8, 16], expected [16, 16]"},
        {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3", ZR_ECORRUPT,
         "'layers.2.input_layernorm.weight' missing"},
        {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1", ZR_ECORRUPT,
         "unexpected tensor 'model.layers.1."},
        {"\"rms_norm_eps\": 1e-5", "\"rms_norm_eps\": -1", ZR_ECORRUPT, "'rms_norm_eps'"},
        {"\"hidden_size\": 16", "\"hidden_size\": 16.5", ZR_ECORRUPT, "'hidden_size'"},
    };
    struct stat st;
    /* "swish" is transformers' other name of SiLU: the same model */
    edit_config("hf", cfg, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"swish\"");
    ZT_OK(zfmt_import("hf", "swish", NULL));
    ZT_CHECK(lstat("swish/latest", &st) == 0);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        edit_config("hf", cfg, bad[i].from, bad[i].to);
        ZT_ERR(zfmt_import("hf", "bad", NULL), bad[i].code, bad[i].msg);
        ZT_CHECK(lstat("bad/latest", &st) < 0);
    }
    /* through the program: the message and a non-zero exit */
    char *out = NULL;
    ZT_CHECK(zt_zckpt(&out, "import hf -o bad") != 0);
    ZT_CHECK(strstr(out, "hidden_size"));
    free(out);
    zt_write_file("hf/config.json", cfg);
    free(cfg);
    /* shards: a tensor the index puts in a file that lacks it; a file name outside the
     * directory; a missing shard */
    ZT_CHECK(zt_zckpt(&out, "export run --format hf -o hs --shard-size 4K") == 0);
    free(out);
    int n = count_like("hs", "model-");
    char *idx = zt_slurp("hs/model.safetensors.index.json"), to[256];
    snprintf(to, sizeof to, "\"weight_map\": {\n    \"model.extra.weight\": "
             "\"model-00001-of-%05d.safetensors\",", n);
    char *at = strstr(idx, "\"weight_map\": {");
    ZT_CHECK(at);
    FILE *f = fopen("hs/model.safetensors.index.json", "w");
    ZT_CHECK(f && fprintf(f, "%.*s%s%s", (int)(at - idx), idx, to, at + 15) > 0);
    fclose(f);
    ZT_ERR(zfmt_import("hs", "bad", NULL), ZR_ECORRUPT, "'model.extra.weight'");
    snprintf(to, sizeof to, "\"weight_map\": {\n    \"model.extra.weight\": \"../x\",");
    f = fopen("hs/model.safetensors.index.json", "w");
    ZT_CHECK(f && fprintf(f, "%.*s%s%s", (int)(at - idx), idx, to, at + 15) > 0);
    fclose(f);
    ZT_ERR(zfmt_import("hs", "bad", NULL), ZR_ECORRUPT, "expected a file name");
    zt_write_file("hs/model.safetensors.index.json", idx);
    free(idx);
    char shard[64];
    snprintf(shard, sizeof shard, "hs/model-00002-of-%05d.safetensors", n);
    ZT_CHECK(unlink(shard) == 0);
    zr_err_clear();
    ZT_CHECK(zfmt_import("hs", "bad", NULL) < 0 && strstr(zr_err_msg(), shard));
    ZT_CHECK(unlink("hs/model.safetensors.index.json") == 0);
    ZT_ERR(zfmt_import("hs", "bad", NULL), ZR_ENOTFOUND, "model.safetensors.index.json");
    ZT_CHECK(lstat("bad/latest", &st) < 0);
}

/* zckpt export --format hf of trained models (GPT-2 trained at world 2 stage 3; Llama with
 * grouped-query attention, untied and tied, the untied one in shards with an index) loads with
 * GPT2LMHeadModel / LlamaForCausalLM.from_pretrained and gives zero's logits. */
ZT_TEST(hf_torch_export_loads_with_the_same_logits)
{
    train("gpt2", 2, 3);
    train_model("untied", LLAMA, 1, 0);
    train_model("tied", LLAMA ",tied=1", 2, 2);
    ZT_OK(zfmt_hf_export("gpt2", "hf_gpt2", NULL));
    zfmt_hf_opts o = ZFMT_HF_OPTS_INIT;
    o.shard_bytes = 16384;
    ZT_OK(zfmt_hf_export("untied", "hf_untied", &o));
    ZT_CHECK(access("hf_untied/model.safetensors.index.json", F_OK) == 0);
    ZT_OK(zfmt_hf_export("tied", "hf_tied", NULL));
    const char *dirs[] = {"hf_gpt2", "hf_untied", "hf_tied"}, *runs[] = {"gpt2", "untied", "tied"};
    torch_agrees(dirs, runs, 3, TOKENS, N_TOKENS);
}

/* Directories transformers writes itself (save_pretrained of a seeded LlamaForCausalLM with
 * grouped-query attention, untied and tied, or GPT2LMHeadModel; float32, bfloat16 and float16;
 * sharded with an index) import with zckpt import to zero models whose loss, logits and
 * probabilities are transformers'; exported again by zckpt (their logits are larger than those
 * of the briefly trained models above), they load in transformers with the same logits. */
ZT_TEST(hf_torch_import_gives_the_same_loss)
{
    static const char *const kinds[] = {"llama-float32-untied", "llama-bfloat16-tied",
                                        "llama-bfloat16-untied", "llama-float16-tied-swish",
                                        "gpt2-float32", "gpt2-bfloat16"};
    enum { N = sizeof kinds / sizeof *kinds, X = 2 };
    const char *dirs[N + X], *runs[N + X];
    char args[4096] = "make", names[N][2][32];
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i][0], sizeof names[i][0], "hf%zu", i);
        snprintf(names[i][1], sizeof names[i][1], "run%zu", i);
        dirs[i] = names[i][0];
        runs[i] = names[i][1];
        snprintf(args + strlen(args), sizeof args - strlen(args), " %s %s %zu", kinds[i],
                 dirs[i], 11 + i);
    }
    hf_torch(args);
    for (size_t i = 0; i < N; i++) {
        char *out;
        int rc = zt_zckpt(&out, "import %s -o %s --world %zu", dirs[i], runs[i], 1 + i % 2);
        if (rc != 0)
            ZT_FAIL("zckpt import %s (%s): %s", dirs[i], kinds[i], out);
        free(out);
    }
    /* back out: the untied Llama (from float32) in shards, the tied one (from bfloat16) */
    static const char *const again[X] = {"ex0", "ex1"};
    for (size_t i = 0; i < X; i++) {
        char *out;
        if (zt_zckpt(&out, "export %s --format hf -o %s --shard-size 20000", runs[i], again[i]))
            ZT_FAIL("zckpt export %s: %s", runs[i], out);
        free(out);
        dirs[N + i] = again[i];
        runs[N + i] = runs[i];
    }
    ZT_CHECK(access("ex0/model.safetensors.index.json", F_OK) == 0);
    torch_agrees(dirs, runs, N + X, TOKENS, N_TOKENS);
}

/* The audit of issue 24: a transformers GPT-2 of width 48 imported, then zrun at its default
 * --threads 2 on a corpus of one byte ('a') and a batch of 2 x 16 tokens (fewer rows than the
 * matmuls' output channels: the column split of kernels.c's gemm). Its first-step loss, before
 * the update, is transformers' on the same tokens (it was 5.77 to 5.90 against 5.170056). */
ZT_TEST(hf_torch_zrun_default_threads_first_loss)
{
    hf_torch("make gpt2-float32-wide hfw 7");
    char *out;
    if (zt_zckpt(&out, "import hfw -o imp --world 1"))
        ZT_FAIL("zckpt import: %s", out);
    free(out);
    char corpus[20001];
    memset(corpus, 'a', 20000);
    corpus[20000] = 0;
    zt_write_file("a.txt", corpus);
    zt_zrunf_ok("zrun.log", "--resume imp --data a.txt --steps 1 --batch 2 --lr 1e-6 "
                "--log-json imp/train.jsonl");
    json_error_t je;
    json_t *line = json_load_file("imp/train.jsonl", JSON_DISABLE_EOF_CHECK, &je);
    ZT_CHECK(line && json_integer_value(json_object_get(line, "step")) == 1);
    double zero = json_number_value(json_object_get(line, "loss"));
    json_decref(line);
    hf_torch("loss hfw 97 16");
    char *txt = zt_slurp("py.txt");
    double hf = strtod(txt, NULL);
    free(txt);
    if (!(fabs(zero - hf) <= 1e-5 * fabs(hf)))
        ZT_FAIL("first-step loss: zrun %.7f, transformers %.7f", zero, hf);
}
