/*
 * test_hf.c: `zckpt export --format hf` (zfmt_hf_export): what transformers reads (config.json
 * and model.safetensors in Hugging Face's GPT-2 names), checked three ways: the export imports
 * back to the same tensors bit for bit, checkpoints of any world size export the same bytes,
 * and an independent numpy forward of the exported directory (Hugging Face's GPT-2 maths,
 * config read by transformers' GPT2Config) gives zero's next-token probabilities. Llama the
 * same way (LlamaForCausalLM names, shards with an index at --shard-size, bf16), plus the
 * import of Hugging Face directories made by numpy + safetensors + LlamaConfig against a numpy
 * forward of transformers' Llama maths (tests/formats/hf_llama_ref.py), and the config fields
 * that change the maths refused naming the field.
 */
#include "ckutil.h"
#include "harness.h"
#include "zfmt.h"
#include "zr.h"

#include <dirent.h>
#include <sys/stat.h>

/* a GPT-2 of 2 layers, 2 heads, width 16, context 16, vocabulary 256 */
static const char *const SPEC = "gpt2:layers=2,heads=2,dim=16,ctx=16,vocab=256";

/* A trained run of model spec: 6 steps of zrun at world w, stage s, saved at step 6. */
static void train_model(const char *run, const char *spec, int world, int stage)
{
    char args[512], log[64];
    snprintf(args, sizeof args, "--model %s --nproc %d --zero %d --steps 6 --save-every 6 "
             "--batch 4 --seq 16 --ckpt-dir %s", spec, world, stage, run);
    snprintf(log, sizeof log, "%s.log", run);
    zt_zrun_ok(args, log);
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
    zt_write_file("tok.json", "{\"model\": {\"type\": \"BPE\"}}\n");
    o.tokenizer_json = "tok.json";
    ZT_OK(zfmt_hf_export("run", "hf2", &o)); /* an earlier export is replaced */
    ZT_CHECK(lstat("hf2/tokenizer.json", &st) == 0);
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

/* zero's next-token probabilities of the run's model for tokens, into probs.bin */
static void zero_probs(const char *run, const int32_t *tokens, size_t T)
{
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
    float loss;
    ZT_OK(zr_model_forward(m, tokens, NULL, 1, T, &loss));
    FILE *f = fopen("probs.bin", "wb");
    ZT_CHECK(f && fwrite(zr_model_probs(m), 4, T * c.vocab, f) == T * c.vocab);
    fclose(f);
    zr_model_free(m);
    zck_reader_free(r);
}

/* zero's probabilities of run's model for tokens against tests/formats/<script> given args,
 * the tokens and the probabilities' file: it exits 0 when they agree within 1e-4. */
static void reference_agrees(const char *py, const char *run, const int32_t *tokens, size_t T,
                             const char *script, const char *args)
{
    zero_probs(run, tokens, T);
    char cmd[8192], list[256] = "";
    for (size_t i = 0; i < T; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? "," : "",
                 tokens[i]);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/formats/%s' %s %s probs.bin > ref.txt 2>&1", py,
             zt_root(), script, args, list);
    int rc = system(cmd);
    char *txt = zt_slurp("ref.txt");
    if (rc != 0)
        ZT_FAIL("the reference disagrees (%s %s): %s", script, args, txt);
    fprintf(stderr, "  %s %s: %s", script, args, strstr(txt, "max |") ? strstr(txt, "max |")
                                                                        : txt);
    free(txt);
}

ZT_TEST(hf_export_matches_reference_forward)
{
    const char *py = zt_venv_python("numpy safetensors transformers");
    if (!py)
        ZT_SKIP("no build/venv with numpy, safetensors and transformers (make oracle-venv; PyPI "
                "unreachable?)");
    train("run", 2, 3);
    ZT_OK(zfmt_hf_export("run", "hf", NULL));
    const int32_t tokens[] = {3, 17, 0, 255, 5, 5, 122, 11, 200, 1, 8, 2};
    reference_agrees(py, "run", tokens, sizeof tokens / sizeof *tokens, "hf_gpt2_ref.py", "hf");
}

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

/* zero's probabilities of run's model against the reference forward of Hugging Face directory
 * dir (tests/formats/hf_llama_ref.py: float64 numpy following transformers' Llama maths, config
 * read by transformers' LlamaConfig): within 1e-4, and so the first-step loss. */
static void llama_check(const char *py, const char *run, const char *dir)
{
    const int32_t tokens[] = {3, 17, 0, 63, 5, 5, 42, 11, 20, 1, 8, 2, 60, 33};
    char args[128];
    snprintf(args, sizeof args, "check %s", dir);
    reference_agrees(py, run, tokens, sizeof tokens / sizeof *tokens, "hf_llama_ref.py", args);
}

/* A Hugging Face Llama made by numpy + safetensors + transformers' LlamaConfig imports to the
 * reference's model (tied, untied; one f32 file, f16 shards); a Llama trained by zrun exports
 * to a directory whose reference forward is zero's. */
ZT_TEST(hf_llama_import_export_match_reference_forward)
{
    const char *py = zt_venv_python("numpy safetensors transformers");
    if (!py)
        ZT_SKIP("no build/venv with numpy, safetensors and transformers (make oracle-venv; PyPI "
                "unreachable?)");
    for (int tied = 0; tied < 2; tied++) {
        char cmd[8192], dir[32], run[32];
        snprintf(dir, sizeof dir, "hf%d", tied);
        snprintf(run, sizeof run, "run%d", tied);
        snprintf(cmd, sizeof cmd, "'%s' '%s/tests/formats/hf_llama_ref.py' make %s %d %d %d "
                 "> make.txt 2>&1", py, zt_root(), dir, 7 + tied, tied, tied);
        if (system(cmd) != 0)
            ZT_FAIL("hf_llama_ref.py make: %s", zt_slurp("make.txt"));
        ZT_OK(zfmt_import(dir, run, NULL));
        llama_check(py, run, dir);
    }
    train_model("trained", LLAMA, 1, 0);
    ZT_OK(zfmt_hf_export("trained", "exported", NULL));
    llama_check(py, "trained", "exported");
}
