/*
 * test_cli.c: the zckpt program itself (the binary named by ZT_ZCKPT, as make test sets it):
 * help and usage errors, exit codes, every corruption class seen through `verify` (exit 1, the
 * file named), JSON output that parses, reshard/consolidate/diff/prune end to end.
 */
#include "ckutil.h"
#include "zfmt.h"

#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>

static const uint64_t sizes[] = {20000, 65, 3};


static void expect(int code, const char *text, const char *args)
{
    char *o;
    int rc = zt_zckpt(&o, "%s", args);
    if (rc != code || (text && !strstr(o, text)))
        ZT_FAIL("zckpt %s: exit %d (expected %d), output lacks '%s':\n%s", args, rc, code,
                text ? text : "", o);
    free(o);
}

static json_t *json_of(const char *args)
{
    char *o;
    zt_zckpt(&o, "%s", args);
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

/* A GPT-2-shaped run at step 5, world 2 (the formats commands read it). */
static void gpt2_run(const char *run)
{
    zfmt_gpt2_config c = {2, 2, 8, 16, 11};
    zck_layout *L;
    ZT_OK(zfmt_gpt2_layout(&L, &c));
    char *model;
    ZT_OK(zfmt_gpt2_config_to_json(&model, &c));
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = 5;
    o.world = 2;
    o.model_json = model;
    uint64_t seed = 3;
    free(zt_save_as(run, L, &o, zt_seed_fill, &seed));
    free(model);
    zck_layout_free(L);
}

ZT_TEST(cli_pack_unpack_export_import)
{
    /* a GPT-2-shaped checkpoint through the formats commands */
    gpt2_run("run");
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
}

/* ------------------------------------------------------------------ option tables */

static void expect_zrun(int code, const char *text, const char *args)
{
    char *o;
    int rc = zt_run(&o, zt_zrun_path(), args);
    if (rc != code || !strstr(o, text))
        ZT_FAIL("zrun %s: exit %d (expected %d), output lacks '%s':\n%s", args, rc, code, text,
                o);
    free(o);
}

/* Values outside an option's range are errors naming the option and the range: nothing
 * saturates, nothing becomes inf. (All of these fail before any training starts.) */
ZT_TEST(cli_option_values_out_of_range)
{
    expect_zrun(2, "zrun: error: --seed: 99999999999999999999 is out of range (0 to "
                   "18446744073709551615)", "--seed 99999999999999999999");
    expect_zrun(2, "zrun: error: --lr: 1e308 is out of range (0 to 3.40282e+38)", "--lr 1e308");
    expect_zrun(2, "--restart-backoff: 90000 is out of range (0 to 86400)",
                "--restart-backoff 90000");
    expect_zrun(2, "--steps '0': expected an integer >= 1", "--steps 0");
    expect_zrun(2, "--threads '257': expected an integer from 1 to 256", "--threads 257");
    expect_zrun(2, "--zero '-1': expected an integer from 0 to 3", "--zero -1");
    expect_zrun(2, "--weight-decay '-0.5': expected a non-negative number", "--weight-decay -0.5");
    expect_zrun(2, "--aio-block-size 6000: expected a multiple of 4096 up to 268435456",
                "--aio-block-size 6000");
    expect_zrun(2, "--async-save 'sometimes': expected auto, on or off",
                "--async-save sometimes");
    expect_zrun(2, "unknown option --bogus", "--bogus 1");
    expect_zrun(2, "--seed needs a value", "--seed");
    expect_zrun(2, "unexpected argument stray", "stray");
    expect_zrun(0, "usage: zrun", "--steps 5 --help");
    expect(2, "--atol: 1e999 is out of range (0 to 1.79769e+308)", "diff a b --atol 1e999");
    expect(2, "--jobs '65': expected an integer from 1 to 64", "reshard x --world 2 -o y --jobs 65");
    expect(2, "--format 'zip': expected zckpt or safetensors", "consolidate x -o y --format zip");
    expect(2, "--dtype 'f64': expected f32, bf16 or f16", "export x -o y --format llmc --dtype f64");
    expect(2, "missing --keep-last K", "prune r");
    expect(2, "unexpected argument c", "diff a b c");
}

/* name as a word of text: not part of a longer option name ("-o" is not in "--offload") */
static bool mentions(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = strstr(text, name); p; p = strstr(p + 1, name)) {
        char before = p == text ? ' ' : p[-1], after = p[n];
        if (before != '-' && !isalnum((unsigned char)before) && after != '-' &&
            !isalnum((unsigned char)after))
            return true;
    }
    return false;
}

/* Every option a --help lists (lines "  --name ..." or "  -o, --output ..."), found in docs;
 * returns how many were checked. */
static size_t check_listed(const char *help, const char *docs, const char *who)
{
    size_t n = 0;
    for (const char *l = help; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, "  -", 3))
            continue;
        const char *p = l + 2;
        for (;;) {
            char name[64];
            size_t k = strspn(p, "-abcdefghijklmnopqrstuvwxyz0123456789");
            ZT_CHECK(k > 1 && k < sizeof name);
            memcpy(name, p, k);
            name[k] = 0;
            if (!mentions(docs, name))
                ZT_FAIL("%s: option %s is not mentioned in README.md or docs/CLI.md", who,
                        name);
            n++;
            if (strncmp(p + k, ", -", 3))
                break;
            p += k + 2;
        }
    }
    return n;
}

/* Every command of a program (from its --help list) documented with each of its options;
 * returns the number of commands, adds the options to *opts. */
static size_t check_commands(const char *bin, const char *prog, const char *docs, size_t *opts)
{
    char *top, *help, args[256];
    ZT_CHECK_EQ(zt_run(&top, bin, "--help"), 0);
    const char *l = strstr(top, "commands:\n");
    ZT_CHECK(l);
    size_t cmds = 0;
    for (l = strchr(l, '\n') + 1; !strncmp(l, "  ", 2); l = strchr(l, '\n') + 1) {
        char cmd[32];
        size_t k = strcspn(l + 2, " \n");
        ZT_CHECK(k < sizeof cmd);
        memcpy(cmd, l + 2, k);
        cmd[k] = 0;
        snprintf(args, sizeof args, "%s --help", cmd);
        ZT_CHECK_EQ(zt_run(&help, bin, args), 0);
        char who[64];
        snprintf(who, sizeof who, "%s %s", prog, cmd);
        ZT_CHECK(strstr(help, "options:\n"));
        *opts += check_listed(help, docs, who);
        free(help);
        cmds++;
    }
    free(top);
    return cmds;
}

/* The option tables (through the --help they print) against the documentation. */
ZT_TEST(cli_every_option_is_documented)
{
    char path[4096], *readme, *cli, *help;
    snprintf(path, sizeof path, "%s/README.md", zt_root());
    readme = zt_slurp(path);
    snprintf(path, sizeof path, "%s/docs/CLI.md", zt_root());
    cli = zt_slurp(path);
    size_t cap = strlen(readme) + strlen(cli) + 2;
    char *docs = malloc(cap);
    snprintf(docs, cap, "%s\n%s", readme, cli);

    ZT_CHECK_EQ(zt_run(&help, zt_zrun_path(), "--help"), 0);
    ZT_CHECK(check_listed(help, docs, "zrun") >= 40);
    free(help);
    if (getenv("ZT_ZGEN")) { /* zgen's table too */
        ZT_CHECK_EQ(zt_run(&help, getenv("ZT_ZGEN"), "--help"), 0);
        ZT_CHECK(check_listed(help, docs, "zgen") >= 7);
        free(help);
    }

    /* the commands, from zckpt's and ztok's own lists, each with its table */
    size_t opts = 0;
    ZT_CHECK_EQ(check_commands(zt_bin("ZT_ZCKPT"), "zckpt", docs, &opts), 13);
    ZT_CHECK(opts >= 30);
    opts = 0;
    const char *ztok = getenv("ZT_ZTOK");
    if (ztok) {
        ZT_CHECK_EQ(check_commands(ztok, "ztok", docs, &opts), 3);
        ZT_CHECK(opts >= 10);
    }
    free(docs);
    free(cli);
    free(readme);
}

/* ---------------------------------------------------------------- audit */

#define AUDIT_MODEL "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256"

/* A run of the real zrun: 2 ranks, ZeRO 1, batch 4, checkpoints at steps 2 and 4. */
static void audit_make_run(void)
{
    zt_zrun_ok("--model " AUDIT_MODEL " --batch 4 --steps 4 --save-every 2 --keep-last 0 "
               "--threads 1 --nproc 2 --zero 1 --ckpt-dir run", "zrun.log");
}

ZT_TEST(cli_audit_sound_run)
{
    audit_make_run();
    expect(0, "checkpoint: run/step-00000004 (step 4), what a resume would pick", "audit run");
    expect(0, "resume at world 2, ZeRO stage 1, batch 4, model layers 2 heads 2 dim 32",
           "audit run");
    expect(0, "resumable: step 4", "audit run");
    /* the dry run's table, as zrun --dry-run prints it for this resume */
    char *o, *dry;
    ZT_CHECK_EQ(zt_zckpt(&o, "audit run --world 4 --zero 3"), 0);
    ZT_CHECK_EQ(zt_run(&dry, zt_zrun_path(), "--dry-run --nproc 4 --zero 3 --batch 4 "
                        "--seq 32 --ckpt-dir run"), 0);
    const char *table = strstr(dry, "dry run: ");
    ZT_CHECK(table);
    if (!strstr(o, table))
        ZT_FAIL("audit's memory differs from zrun --dry-run's:\n%s\n---\n%s", o, dry);
    ZT_CHECK(strstr(o, "\n     3 ")); /* rank 3 */
    free(o);
    free(dry);
    /* the dry run of a job of 2 nodes x 2 ranks plans for world 4, as the audit at --world 4 */
    ZT_CHECK_EQ(zt_zckpt(&o, "audit run --world 4 --zero 3"), 0);
    ZT_CHECK_EQ(zt_run(&dry, zt_zrun_path(), "--dry-run --nproc 2 --nnodes 2 --master "
                        "127.0.0.1:1 --zero 3 --batch 4 --seq 32 --ckpt-dir run"), 0);
    ZT_CHECK((table = strstr(dry, "dry run: ")) && strstr(o, table));
    free(o);
    free(dry);
    expect(0, "checkpoint: run/step-00000002 (step 2)\n", "audit run/step-00000002");

    json_t *j = json_of("audit run --json");
    ZT_CHECK(json_is_true(json_object_get(j, "resumable")));
    ZT_CHECK(json_is_true(json_object_get(j, "picked")));
    ZT_CHECK(json_is_true(json_object_get(j, "verified")));
    ZT_CHECK_EQ(json_integer_value(json_object_get(j, "step")), 4);
    ZT_CHECK_EQ(json_array_size(json_object_get(j, "reasons")), 0);
    json_t *ranks = json_object_get(json_object_get(j, "memory"), "ranks");
    ZT_CHECK_EQ(json_array_size(ranks), 2);
    json_t *r0 = json_array_get(ranks, 0);
    json_int_t sum = 0;
    static const char *cat[] = {"params", "grads", "optimizer", "buffers", "activations",
                                "save_staging", "pinned", "baseline"};
    for (size_t i = 0; i < 8; i++) {
        ZT_CHECK(json_is_integer(json_object_get(r0, cat[i])));
        ZT_CHECK(json_integer_value(json_object_get(r0, cat[i])) > 0 || i == 3 || i >= 5);
        sum += json_integer_value(json_object_get(r0, cat[i]));
    }
    ZT_CHECK_EQ(sum, json_integer_value(json_object_get(r0, "total")));
    json_decref(j);
}

ZT_TEST(cli_audit_damaged_latest_moves_nothing)
{
    audit_make_run();
    zt_truncate("run/step-00000004/shard-00001-of-00002.bin", 100);
    char *before = zt_slurp("run/latest");
    expect(0, "run/step-00000004 does not verify (shard-00001-of-00002.bin: truncated",
           "audit run");
    expect(0, "it would be moved aside", "audit run");
    expect(0, "checkpoint: run/step-00000002 (step 2), what a resume would pick", "audit run");
    expect(0, "resumable: step 2", "audit run");
    /* nothing moved, latest unchanged */
    struct stat st;
    ZT_CHECK(stat("run/step-00000004", &st) == 0);
    ZT_CHECK(stat("run/damaged-step-00000004", &st) < 0);
    char *after = zt_slurp("run/latest");
    ZT_CHECK(!strcmp(before, after));
    free(before);
    free(after);
    /* the damaged checkpoint itself: each problem, not resumable */
    expect(1, "  shard-00001-of-00002.bin: truncated: 100 bytes", "audit run/step-00000004");
    expect(1, "not resumable:\n  run/step-00000004 does not verify: 1 problem",
           "audit run/step-00000004");
    json_t *j = json_of("audit run/step-00000004 --json");
    ZT_CHECK(json_is_false(json_object_get(j, "resumable")));
    ZT_CHECK(json_is_false(json_object_get(j, "verified")));
    ZT_CHECK_EQ(json_array_size(json_object_get(j, "problems")), 1);
    json_decref(j);
    /* every checkpoint damaged: not resumable, nothing moved */
    zt_truncate("run/step-00000002/shard-00000-of-00002.bin", 10);
    expect(1, "none of its 2 checkpoints verifies", "audit run");
    ZT_CHECK(stat("run/step-00000002", &st) == 0 && stat("run/step-00000004", &st) == 0);
}

ZT_TEST(cli_audit_refusals_are_zruns)
{
    audit_make_run();
    /* W that does not divide the batch; W over the communicators' limit */
    expect(1, "not resumable:\n  --batch 4 is not a multiple of the world size 3",
           "audit run --world 3");
    expect(1, "world 2000 outside [1, 1024]", "audit run --world 2000");
    /* every reason, not only the first */
    expect(1, "\n  --batch 4 is not a multiple of the world size 2000", "audit run --world 2000");
    /* another model: zrun refuses it with the very same line */
    char *o;
    ZT_CHECK_EQ(zt_zckpt(&o, "audit run --model tiny"), 1);
    const char *r = strstr(o, "not resumable:\n  ");
    ZT_CHECK(r);
    r += strlen("not resumable:\n  ");
    char line[1024];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(r, "\n"), r);
    ZT_CHECK(strstr(line, "another model shape"));
    int st = zt_zrun("--model tiny --batch 4 --steps 8 --threads 1 --ckpt-dir run", "b.log");
    char *log = zt_slurp("b.log");
    if (st == 0 || !strstr(log, line))
        ZT_FAIL("zrun exit %d, its log lacks the audit's reason '%s':\n%s", st, line, log);
    free(log);
    free(o);
    /* two reasons, each on its own line */
    ZT_CHECK_EQ(zt_zckpt(&o, "audit run --world 3 --model tiny --json"), 1);
    json_t *j = json_loads(o, 0, NULL);
    ZT_CHECK(j);
    ZT_CHECK_EQ(json_array_size(json_object_get(j, "reasons")), 2);
    ZT_CHECK(json_is_null(json_object_get(j, "memory")));
    json_decref(j);
    free(o);
}

ZT_TEST(cli_audit_no_checkpoint_and_usage)
{
    /* an existing run directory without a checkpoint: not resumable (1) */
    ZT_CHECK(mkdir("empty", 0777) == 0);
    expect(1, "empty: no checkpoint to resume from", "audit empty");
    /* no such path: an error (2) */
    expect(2, "zckpt: error: absent", "audit absent");
    expect(2, "usage", "audit");
    expect(2, "--zero", "audit empty --zero 4");
    expect(2, "--world", "audit empty --world 0");
    expect(2, "--batch", "audit empty --batch x");
    expect(2, "unknown option", "audit empty --frobnicate");
    expect(0, "--model SPEC", "audit --help");
}

/* ---------------------------------------------------------------- the `zckpt verify` hint */

/* bin (a ZT_* program) with args fails (exit 2, zgen 1) naming what, with the hint to run `zckpt
 * verify` when hint, and without it otherwise. */
static void hint_case(const char *bin, const char *args, const char *what, bool hint)
{
    char *o;
    int rc = zt_run(&o, zt_bin(bin), args);
    int want = strcmp(bin, "ZT_ZGEN") ? 2 : 1; /* zgen: 1 for a damaged checkpoint */
    if (rc != want || !strstr(o, what) || (strstr(o, "zckpt verify") != NULL) != hint)
        ZT_FAIL("%s %s: exit %d, expected %d naming '%s' %s the `zckpt verify` hint:\n%s",
                bin, args, rc, want, what, hint ? "with" : "without", o);
    free(o);
}

/* The hint goes with a damaged checkpoint (zckpt reading one, zrun resuming from one, zgen),
 * never with other corrupt files: tokenizers (ztok, zrun --tokenizer), token files (zrun
 * --data), import sources. */
ZT_TEST(cli_verify_hint_only_for_checkpoints)
{
    zt_write_file("bad.json", "{\"model\": \n");
    zt_write_file("text.txt", "some words\n");
    hint_case("ZT_ZTOK", "encode --tokenizer bad.json text.txt -o t.bin", "bad.json", false);
    hint_case("ZT_ZRUN", "--model " AUDIT_MODEL " --tokenizer bad.json --steps 1 --ckpt-dir r0",
              "bad.json", false);
    /* an llm.c token file in all but its magic */
    uint32_t hdr[256] = {12345, ZCK_TOKENS_U16, 100};
    uint16_t toks[100] = {0};
    FILE *f = fopen("bad.bin", "wb");
    ZT_CHECK(f && fwrite(hdr, sizeof hdr, 1, f) == 1 && fwrite(toks, sizeof toks, 1, f) == 1);
    fclose(f);
    hint_case("ZT_ZRUN", "--model " AUDIT_MODEL " --data bad.bin --batch 4 --steps 1 "
              "--threads 1 --ckpt-dir r1", "bad.bin", false);
    /* import sources: a Hugging Face directory's config.json, a safetensors file */
    ZT_CHECK(mkdir("hf", 0755) == 0);
    zt_write_file("hf/config.json", "{\"model_type\": \n");
    zt_write_file("hf/model.safetensors", "not a safetensors file");
    hint_case("ZT_ZCKPT", "import hf -o imp", "config.json", false);
    zt_write_file("x.safetensors", "\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}");
    hint_case("ZT_ZCKPT", "import x.safetensors -o imp", "x.safetensors", false);
    /* a damaged checkpoint: zckpt, zgen and zrun resuming from it say to verify it */
    zt_zrun_ok("--model " AUDIT_MODEL " --batch 4 --steps 2 --save-every 2 --threads 1 "
               "--ckpt-dir run", "run.log");
    zt_flip_byte("run/step-00000002/shard-00000-of-00001.bin", 100);
    hint_case("ZT_ZCKPT", "export run --format safetensors -o m.safetensors", "shard-00000",
              true);
    hint_case("ZT_ZGEN", "run --prompt-ids 1,2 --tokens 2", "shard-00000", true);
    hint_case("ZT_ZRUN", "--model " AUDIT_MODEL " --batch 4 --steps 4 --threads 1 --ckpt-dir run "
              "--resume run/step-00000002", "shard-00000", true);
    zt_write_file("run/step-00000002/manifest.json", "{\n");
    hint_case("ZT_ZCKPT", "inspect run", "manifest.json", true);
    hint_case("ZT_ZRUN", "--dry-run --model " AUDIT_MODEL " --batch 4 --ckpt-dir run --resume "
              "run/step-00000002", "manifest.json", true);
}

/* ------------------------------------------------------------------ outputs (issue 24) */


static bool is_dir(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Every output's missing parent directories are made (the README's `-o hf/mine` on a fresh
 * checkout failed: "hf/mine.tmp-N: create: No such file or directory"); a parent that is a
 * file or a dangling link is refused by name; a failed command leaves none of the directories
 * it made. */
ZT_TEST(cli_outputs_make_parent_directories)
{
    gpt2_run("run");
    expect(0, "Hugging Face model", "export run -o hf/mine --format hf");
    ZT_CHECK(is_dir("hf/mine"));
    expect(0, "llm.c GPT-2 model file", "export run -o a/b/m.bin --format llmc");
    expect(0, "safetensors of run", "export run -o a/c/m.safetensors --format safetensors");
    expect(0, "safetensors of run", "consolidate run -o c/one.safetensors");
    expect(0, "world 1 checkpoint", "consolidate run -o c/d/one");
    expect(0, "world 3 checkpoint", "reshard run --world 3 -o r/s/three");
    expect(0, "archive of run", "pack run -o p/q/run.tar.gz");
    expect(0, "unpacked and verified", "unpack p/q/run.tar.gz -o u/v/copy");
    expect(0, "match", "diff run u/v/copy");
    expect(0, "imported", "import a/b/m.bin -o i/j/imported");
    expect(2, "inside the checkpoint directory", "import a/b/m.bin -o run/step-00000005/x");
    zt_write_file("u/log.jsonl", "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": 2.0}\n");
    expect(0, "2 step records", "plot u/log.jsonl -o g/h/loss.svg");
    ZT_CHECK(access("g/h/loss.svg", F_OK) == 0);

    zt_write_file("afile", "x");
    expect(2, "afile is a file, not a directory", "export run -o afile/x/m.bin --format llmc");
    ZT_CHECK(symlink("nowhere", "dangling") == 0);
    expect(2, "dangling is a symbolic link to 'nowhere', which does not exist",
           "export run -o dangling/hf --format hf");
    ZT_CHECK(access("nowhere", F_OK) < 0);
    /* a failure after the directories were made takes them away again */
    expect(2, "no-such-run", "export no-such-run -o n1/n2/hf --format hf");
    expect(2, "no-such-run", "export no-such-run -o n1/n2/m.bin --format llmc");
    expect(2, "no-such-run", "reshard no-such-run --world 2 -o n1/n2/r");
    ZT_CHECK(access("n1", F_OK) < 0);
    ZT_CHECK(mkdir("kept", 0755) == 0); /* one that was there stays */
    expect(2, "no-such-run", "export no-such-run -o kept/n2/hf --format hf");
    ZT_CHECK(is_dir("kept") && access("kept/n2", F_OK) < 0);
}

/* export --format llmc|safetensors --force replaced any regular file, the source run's latest
 * or a shard of a checkpoint among them (and the next resume then told of an interrupted
 * commit). Outputs never go where a run or a checkpoint keeps its own files. */
ZT_TEST(cli_outputs_never_replace_a_runs_files)
{
    gpt2_run("run");
    const char *shard = "run/step-00000005/shard-00000-of-00002.bin";
    ZT_CHECK(system("cp run/latest latest.orig && cp run/step-00000005/shard-00000-of-00002.bin"
                    " shard.orig") == 0);
    expect(2, "'latest' of the run directory", "export run -o run/latest --format llmc --force");
    expect(2, "'latest' of the run directory",
           "export run -o run/latest --format safetensors --force");
    expect(2, "inside the checkpoint directory",
           "export run -o run/step-00000005/shard-00000-of-00002.bin --format llmc --force");
    expect(2, "inside the checkpoint directory",
           "export run -o run/step-00000005/shard-00000-of-00002.bin --format safetensors "
           "--force");
    expect(2, "inside the checkpoint directory",
           "consolidate run -o run/step-00000005/shard-00000-of-00002.bin --format safetensors "
           "--force");
    expect(2, "'latest' of the run directory", "plot run -o run/latest --force");
    ZT_CHECK(zt_same_file("run/latest", "latest.orig"));
    ZT_CHECK(zt_same_file(shard, "shard.orig"));
    /* through a symbolic link to the run, and with a new directory inside a checkpoint */
    ZT_CHECK(symlink("run", "alias") == 0);
    expect(2, "'latest' of the run directory", "export run -o alias/latest --format llmc --force");
    expect(2, "inside the checkpoint directory",
           "export run -o run/step-00000005/sub/m.bin --format llmc");
    expect(2, "inside the checkpoint directory", "export run -o run/step-00000005/hf --format hf");
    expect(2, "'step-00000009' of the run directory", "unpack x.tar -o run/step-00000009");
    ZT_CHECK(access("run/step-00000005/sub", F_OK) < 0 && access("run/step-00000005/hf", F_OK) < 0);
    expect(0, "sound (all checks", "verify run");
    /* a checkpoint directory outside any run; a manifest.json alone makes none */
    ZT_CHECK(system("cp -r run/step-00000005 lone") == 0);
    expect(2, "inside the checkpoint directory", "export run -o lone/m.bin --format llmc");
    ZT_CHECK(mkdir("web", 0755) == 0);
    zt_write_file("web/manifest.json", "{\"name\": \"a web app\"}");
    expect(0, "llm.c GPT-2 model file", "export run -o web/m.bin --format llmc");
    /* beside the checkpoints is fine */
    expect(0, "llm.c GPT-2 model file", "export run -o run/model.bin --format llmc");
    expect(0, "llm.c GPT-2 model file", "export run -o run/model.bin --format llmc --force");
}

/* reshard -o (and consolidate into a run directory) carry the source run's JSON log
 * (train.jsonl), so that `zckpt plot` of the new run keeps its history; from a checkpoint
 * directory there is no log to carry. */
ZT_TEST(cli_reshard_carries_the_runs_log)
{
    gpt2_run("run");
    zt_write_file("run/train.jsonl", "{\"step\": 1, \"loss\": 3.0}\n{\"step\": 2, \"loss\": 2.5}\n"
                  "{\"step\": 3, \"loss\": 2.25}\n");
    expect(0, "world 3 checkpoint", "reshard run --world 3 -o r3");
    ZT_CHECK(zt_same_file("run/train.jsonl", "r3/train.jsonl"));
    expect(0, "3 step records", "plot r3");
    expect(0, "world 1 checkpoint", "consolidate run -o one");
    ZT_CHECK(zt_same_file("run/train.jsonl", "one/train.jsonl"));
    expect(0, "world 2 checkpoint", "reshard run --world 2 -o r3 --force"); /* replaced whole */
    ZT_CHECK(zt_same_file("run/train.jsonl", "r3/train.jsonl"));
    expect(0, "world 2 checkpoint", "reshard run/step-00000005 --world 2 -o r2");
    ZT_CHECK(access("r2/train.jsonl", F_OK) < 0);
}

/* ls names the files at fault of an incomplete checkpoint (it said only "listed with N bytes,
 * not on disk"), and lists the checkpoints a resume moved aside (damaged-step-N, .2, ...),
 * which nothing showed or removed; prune --damaged removes those (only those, and only when
 * they hold nothing but the format's files). */
ZT_TEST(cli_ls_and_prune_damaged_checkpoints)
{
    zck_layout *L = zt_layout(3, sizes);
    for (uint64_t s = 1; s <= 3; s++)
        free(zt_save("run", L, 3, s, 1, 0));
    zck_resume_opts ro = ZCK_RESUME_OPTS_INIT;
    ro.verify = ZCK_RESUME_VERIFY_QUICK;
    for (int k = 0; k < 2; k++) { /* step 3 damaged twice: damaged-step-00000003, then .2 */
        ZT_CHECK(unlink("run/step-00000003/shard-00001-of-00003.bin") == 0);
        char *pick = NULL;
        ZT_OK(zck_resume_pick(&pick, "run", &ro));
        ZT_CHECK(pick && strstr(pick, "step-00000002"));
        free(pick);
        if (!k)
            free(zt_save("run", L, 3, 3, 1, 0));
    }
    ZT_CHECK(is_dir("run/damaged-step-00000003") && is_dir("run/damaged-step-00000003.2"));
    ZT_CHECK(unlink("run/step-00000001/shard-00000-of-00003.bin") == 0);
    zt_truncate("run/step-00000001/shard-00002-of-00003.bin", 100);
    expect(0, "incomplete: shard-00000-of-00003.bin: listed with", "ls run");
    expect(0, "; shard-00002-of-00003.bin: 100 bytes", "ls run");
    expect(0, "damaged-step-00000003             3      3      3", "ls run");
    expect(0, "damaged (moved aside): shard-00001-of-00003.bin: listed with", "ls run");
    expect(0, "damaged (moved aside)", "ls run");
    json_t *j = json_of("ls run --json");
    json_t *d = json_object_get(j, "damaged");
    ZT_CHECK_EQ(json_array_size(d), 2);
    ZT_CHECK_EQ(json_array_size(json_object_get(j, "checkpoints")), 2);
    ZT_CHECK(!strcmp(json_string_value(json_object_get(json_array_get(d, 0), "status")),
                     "damaged (moved aside)"));
    ZT_CHECK(strstr(json_string_value(json_object_get(json_array_get(d, 0), "detail")),
                    "shard-00001-of-00003.bin"));
    json_decref(j);

    expect(2, "missing --keep-last K (or --damaged)", "prune run");
    expect(2, "not with --keep-last", "prune run --damaged --keep-last 1");
    zt_write_file("run/damaged-step-00000003.2/notes.txt", "mine");
    zt_write_file("run/damaged-step-00000009", "a file, not a directory");
    ZT_CHECK(mkdir("run/damaged-stuff", 0755) == 0);
    expect(0, "would remove run/damaged-step-00000003\n", "prune run --damaged --dry-run");
    ZT_CHECK(is_dir("run/damaged-step-00000003"));
    expect(0, "removed run/damaged-step-00000003\n", "prune run --damaged");
    ZT_CHECK(access("run/damaged-step-00000003", F_OK) < 0);
    ZT_CHECK(access("run/damaged-step-00000003.2/notes.txt", F_OK) == 0);
    ZT_CHECK(access("run/damaged-step-00000009", F_OK) == 0 && is_dir("run/damaged-stuff"));
    ZT_CHECK(is_dir("run/step-00000001") && is_dir("run/step-00000002"));
    expect(0, "nothing to remove", "prune run --damaged");
    zck_layout_free(L);
}

/* Retention removes checkpoints that hold the extra files their manifest lists (the run's
 * tokenizer.json): they were left in place as "files zckpt did not write", so a run with
 * --tokenizer kept every checkpoint whatever --keep-last said. A file the manifest does not
 * list still keeps its directory. */
ZT_TEST(cli_prune_removes_checkpoints_with_a_tokenizer)
{
    zck_layout *L = zt_layout(3, sizes);
    zck_extra_file tok = {"tokenizer.json", "{}", 2};
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.world = 2;
    o.files = &tok;
    o.n_files = 1;
    uint64_t seed = 1;
    for (o.step = 1; o.step <= 3; o.step++)
        free(zt_save_as("run", L, &o, zt_seed_fill, &seed));
    zt_write_file("run/step-00000001/user.txt", "mine");
    expect(0, "removed run/step-00000002", "prune run --keep-last 1");
    ZT_CHECK(access("run/step-00000002", F_OK) < 0 && is_dir("run/step-00000001"));
    ZT_CHECK(access("run/step-00000003/tokenizer.json", F_OK) == 0);
    zck_layout_free(L);
}
