/*
 * test_hf.c: `zckpt export --format hf` (zfmt_hf_export): what transformers reads (config.json
 * and model.safetensors in Hugging Face's GPT-2 names), checked three ways: the export imports
 * back to the same tensors bit for bit, checkpoints of any world size export the same bytes,
 * and an independent numpy forward of the exported directory (Hugging Face's GPT-2 maths,
 * config read by transformers' GPT2Config) gives zero's next-token probabilities.
 */
#include "ckutil.h"
#include "harness.h"
#include "zfmt.h"
#include "zr.h"

#include <dirent.h>
#include <sys/stat.h>

/* a GPT-2 of 2 layers, 2 heads, width 16, context 16, vocabulary 256 */
static const char *const SPEC = "gpt2:layers=2,heads=2,dim=16,ctx=16,vocab=256";

/* A trained run: 6 steps of zrun at world w, stage s, saved at step 6. */
static void train(const char *run, int world, int stage)
{
    char args[512], log[64];
    snprintf(args, sizeof args, "--model %s --nproc %d --zero %d --steps 6 --save-every 6 "
             "--batch 4 --seq 16 --ckpt-dir %s", SPEC, world, stage, run);
    snprintf(log, sizeof log, "%s.log", run);
    zt_zrun_ok(args, log);
}

static int same_file(const char *a, const char *b)
{
    char *x = zt_slurp(a), *y = zt_slurp(b);
    struct stat sa, sb;
    int same = stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_size == sb.st_size &&
               !memcmp(x, y, (size_t)sa.st_size);
    free(x);
    free(y);
    return same;
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
    char *a, *b;
    ZT_OK(zck_latest(&a, "run"));
    ZT_OK(zck_latest(&b, "back"));
    zck_reader *ra, *rb;
    ZT_OK(zck_reader_open(&ra, "run"));
    ZT_OK(zck_reader_open(&rb, "back"));
    const zck_layout *L = zck_reader_layout(ra);
    for (size_t g = 0; g < zck_layout_n_groups(L); g++) {
        uint64_t n = zck_layout_group_numel(L, g);
        float *x = malloc(n * 4), *y = malloc(n * 4);
        ZT_CHECK(x && y);
        zck_read_opts ro = ZCK_READ_OPTS_INIT;
        zck_read_req qa = {g, 0, 0, n, x}, qb = {g, 0, 0, n, y};
        ZT_OK(zck_reader_read(ra, &qa, 1, &ro));
        ZT_OK(zck_reader_read(rb, &qb, 1, &ro));
        if (memcmp(x, y, n * 4))
            ZT_FAIL("group %s differs after import -> export -> import",
                    zck_layout_group_name(L, g));
        free(x);
        free(y);
    }
    zck_reader_free(ra);
    zck_reader_free(rb);
    free(a);
    free(b);
    /* the same model at world 1 (resharded) exports the same bytes; so does the import */
    char *out;
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ZT_OK(zck_reshard(&out, "run", "one", 1, &ro));
    free(out);
    ZT_OK(zfmt_hf_export("one", "hf1", NULL));
    ZT_OK(zfmt_hf_export("back", "hf2", NULL));
    ZT_CHECK(same_file("hf/model.safetensors", "hf1/model.safetensors"));
    ZT_CHECK(same_file("hf/model.safetensors", "hf2/model.safetensors"));
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

ZT_TEST(hf_export_matches_reference_forward)
{
    const char *py = zt_venv_python("numpy safetensors transformers");
    if (!py)
        ZT_SKIP("no build/venv with numpy, safetensors and transformers (make oracle-venv; PyPI "
                "unreachable?)");
    train("run", 2, 3);
    ZT_OK(zfmt_hf_export("run", "hf", NULL));
    const int32_t tokens[] = {3, 17, 0, 255, 5, 5, 122, 11, 200, 1, 8, 2};
    size_t T = sizeof tokens / sizeof *tokens;
    zero_probs("run", tokens, T);
    char cmd[8192], list[256] = "";
    for (size_t i = 0; i < T; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? "," : "",
                 tokens[i]);
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/formats/hf_gpt2_ref.py' hf %s probs.bin "
             "> ref.txt 2>&1", py, zt_root(), list);
    int rc = system(cmd);
    char *txt = zt_slurp("ref.txt");
    if (rc != 0)
        ZT_FAIL("the reference disagrees: %s", txt);
    fprintf(stderr, "  %s", txt);
    free(txt);
}
