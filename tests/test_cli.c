/*
 * test_cli.c: the zckpt program itself (the binary named by ZT_ZCKPT, as make test sets it):
 * help and usage errors, exit codes, every corruption class seen through `verify` (exit 1, the
 * file named), JSON output that parses, reshard/consolidate/diff/prune end to end.
 */
#include "ckutil.h"
#include "zfmt.h"

#include <jansson.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>

static const uint64_t sizes[] = {20000, 65, 3};

/* Run zckpt with the given arguments (a shell fragment); output (stdout+stderr) in *out. */
static int zckpt(char **out, const char *fmt, ...)
{
    const char *bin = getenv("ZT_ZCKPT");
    if (!bin)
        ZT_SKIP("ZT_ZCKPT is not set (run through make test)");
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin, args);
    FILE *p = popen(cmd, "r");
    ZT_CHECK(p);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while ((k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}


static void expect(int code, const char *text, const char *args)
{
    char *o;
    int rc = zckpt(&o, "%s", args);
    if (rc != code || (text && !strstr(o, text)))
        ZT_FAIL("zckpt %s: exit %d (expected %d), output lacks '%s':\n%s", args, rc, code,
                text ? text : "", o);
    free(o);
}

static json_t *json_of(const char *args)
{
    char *o;
    zckpt(&o, "%s", args);
    json_error_t e;
    json_t *j = json_loads(o, 0, &e);
    if (!j)
        ZT_FAIL("zckpt %s: output is not JSON (%s):\n%s", args, e.text, o);
    free(o);
    return j;
}

ZT_TEST(cli_help_and_usage_errors)
{
    expect(0, "usage: zckpt COMMAND", "--help");
    expect(2, "usage: zckpt COMMAND", "");
    expect(2, "unknown command 'frobnicate'", "frobnicate");
    const char *cmds[] = {"ls", "inspect", "verify", "reshard", "consolidate", "export",
                          "import", "pack", "unpack", "diff", "prune"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char a[64];
        snprintf(a, sizeof a, "%s --help", cmds[i]);
        expect(0, "usage: zckpt", a);
        snprintf(a, sizeof a, "%s", cmds[i]);
        expect(2, "error: missing", a);
    }
    expect(2, "--world '0': expected an integer from 1", "reshard x --world 0 -o y");
    expect(2, "--buffer 'lots': expected a size", "reshard x --world 2 -o y --buffer lots");
    expect(2, "unknown option --bogus", "verify x --bogus");
    expect(2, "no-such-dir", "verify no-such-dir");
    expect(0, "format 1.0", "--version");
}

ZT_TEST(cli_verify_reports_every_corruption_class)
{
    zck_layout *L = zt_layout(3, sizes);
    char *p = zt_save("run", L, 3, 7, 1, 0);
    char a[512];
    snprintf(a, sizeof a, "verify %s", p);
    expect(0, "sound", a);
    expect(0, "sound", "verify run --quick");
    json_t *j = json_of("verify run --json");
    ZT_CHECK(json_is_true(json_object_get(j, "sound")));
    json_decref(j);

    char f[512];
    snprintf(f, sizeof f, "%s/shard-00002-of-00003.bin", p);
    zt_flip_byte(f, 10);
    expect(1, "shard-00002-of-00003.bin: hash mismatch", "verify run");
    j = json_of("verify run --json --jobs 1");
    ZT_CHECK(json_is_false(json_object_get(j, "sound")));
    json_t *pr = json_array_get(json_object_get(j, "problems"), 0);
    ZT_CHECK(!strcmp(json_string_value(json_object_get(pr, "kind")), "hash mismatch"));
    ZT_CHECK(!strcmp(json_string_value(json_object_get(pr, "file")),
                     "shard-00002-of-00003.bin"));
    json_decref(j);
    zt_flip_byte(f, 10);

    snprintf(f, sizeof f, "%s/shard-00001-of-00003.bin", p);
    zt_truncate(f, 4096);
    expect(1, "shard-00001-of-00003.bin: truncated", "verify run --quick");
    ZT_CHECK(unlink(f) == 0);
    expect(1, "shard-00001-of-00003.bin: missing", "verify run");
    snprintf(f, sizeof f, "%s/stray", p);
    zt_write_file(f, "x");
    expect(1, "stray: unlisted file", "verify run");
    snprintf(f, sizeof f, "%s/manifest.json", p);
    zt_write_file(f, "{\"format\": \"zckpt\", \"version\": \"2.0\"}");
    expect(1, "manifest.json: bad manifest", "verify run");
    expect(1, "version 2.0 is not supported", "verify run");
    expect(2, "version 2.0", "inspect run");
    free(p);
    zck_layout_free(L);
}

ZT_TEST(cli_ls_inspect_reshard_diff_prune)
{
    zck_layout *L = zt_layout(3, sizes);
    for (uint64_t s = 1; s <= 3; s++)
        free(zt_save("run", L, 2, s, 1, 0));
    expect(0, "step-00000003", "ls run");
    json_t *j = json_of("ls run --json");
    ZT_CHECK(!strcmp(json_string_value(json_object_get(j, "latest")), "step-00000003"));
    ZT_CHECK_EQ(json_array_size(json_object_get(j, "checkpoints")), 3);
    json_decref(j);
    expect(0, "world        2 ranks, ZeRO stage 3", "inspect run");
    j = json_of("inspect run --tensors --json");
    json_t *t = json_array_get(json_object_get(json_array_get(json_object_get(j, "groups"), 0),
                                               "tensors"), 0);
    ZT_CHECK(!strcmp(json_string_value(json_object_get(t, "name")), "h0.w"));
    ZT_CHECK_EQ(json_array_size(json_object_get(t, "shards")), 2);
    json_decref(j);
    expect(0, "h0.w", "inspect run --tensors");

    expect(0, "world 5 checkpoint", "reshard run --world 5 -o r5 --buffer 2M --jobs 2");
    expect(2, "r5: already exists", "reshard run --world 3 -o r5");
    expect(2, "r5: is the source", "reshard r5 --world 3 -o r5 --force"); /* issue 13 */
    expect(0, "world 3 checkpoint", "reshard run --world 3 -o r5 --force");
    expect(0, "match", "diff run r5");
    expect(0, "world 1 checkpoint", "consolidate r5 -o one");
    expect(2, "apply to safetensors output only", "consolidate r5 -o two --dtype bf16");
    j = json_of("diff run one --json");
    ZT_CHECK(json_is_true(json_object_get(j, "match")));
    json_decref(j);
    free(zt_save("other", L, 2, 3, 2, 0));
    expect(1, "DIFFER", "diff run other");
    expect(0, "would remove run/step-00000001", "prune run --keep-last 2 --dry-run");
    expect(0, "removed run/step-00000001", "prune run --keep-last 2");
    expect(0, "nothing to remove", "prune run --keep-last 2");
    zck_layout_free(L);
}

ZT_TEST(cli_pack_unpack_export_import)
{
    /* a GPT-2-shaped checkpoint through the formats commands */
    zfmt_gpt2_config c = {2, 2, 8, 16, 11};
    zck_layout *L;
    ZT_OK(zfmt_gpt2_layout(&L, &c));
    char *staging, *model;
    ZT_OK(zfmt_gpt2_config_to_json(&model, &c));
    ZT_OK(zck_staging_create(&staging, "run", 5, 1));
    zck_shard *sh[2];
    for (uint32_t r = 0; r < 2; r++)
        sh[r] = zt_write_rank(staging, L, 2, r, 3, NULL);
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = 5;
    o.world = 2;
    o.model_json = model;
    ZT_OK(zck_commit(NULL, "run", staging, L, sh, 2, &o));
    expect(0, "archive of run", "pack run -o run.tar.gz");
    expect(2, "already exists", "pack run -o run.tar.gz");
    expect(0, "sound", "verify run.tar.gz");
    expect(0, "unpacked and verified", "unpack run.tar.gz -o copy");
    expect(0, "match", "diff run copy");
    expect(0, "llm.c GPT-2 model file", "export run -o m.bin --format llmc");
    expect(0, "imported", "import m.bin -o imported --world 3");
    expect(0, "safetensors of run", "export run -o m.safetensors --format safetensors");
    expect(0, "imported", "import m.safetensors -o imported2");
    expect(0, "step-00000000", "ls imported");
    /* the imported params equal the source's; the optimizer states start at zero */
    json_t *j = json_of("diff run imported --json");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(j, "entries"), i, e) {
        const char *st = json_string_value(json_object_get(e, "state"));
        if (!strcmp(st, "param") && !json_is_true(json_object_get(e, "match")))
            ZT_FAIL("param of %s differs after export/import",
                    json_string_value(json_object_get(e, "tensor")));
    }
    json_decref(j);
    expect(0, "safetensors of run", "consolidate run -o all.safetensors --dtype bf16");
    for (uint32_t r = 0; r < 2; r++)
        zck_shard_free(sh[r]);
    free(staging);
    free(model);
    zck_layout_free(L);
}
