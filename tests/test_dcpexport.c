/*
 * test_dcpexport.c: zckpt export --format dcp against PyTorch itself. A GPT-2 (tied head,
 * Conv1D weights) and a Llama (untied head) trained by zrun for a few steps, exported as DCP,
 * are loaded by torch.distributed.checkpoint.load into the Hugging Face model and an AdamW
 * (tests/formats/dcp_torch.py): every weight equals export --format hf's, every moment and step
 * our checkpoint's; zckpt verify and inspect read the export, and import --format dcp gives
 * the checkpoint back. Refusals leave nothing behind.
 */
#include "ckutil.h"
#include "foreign.h"
#include "harness.h"

#include <jansson.h>
#include <sys/stat.h>

static void train(const char *run, const char *spec)
{
    char log[64];
    snprintf(log, sizeof log, "%s.log", run);
    zt_zrunf_ok(log, "--model %s --steps 3 --save-every 3 --batch 2 --seq 16 --ckpt-dir %s",
                spec, run);
}

/* one state of one tensor of run's checkpoint, as floats (n elements) */
static float *read_state(zck_reader *r, size_t g, size_t s, const zck_tensor_info *ti)
{
    float *p = malloc(ti->numel * 4 + 4);
    ZT_CHECK(p);
    zck_read_opts ro = ZCK_READ_OPTS_INIT;
    zck_read_req q = {g, s, ti->offset, ti->numel, p};
    ZT_OK(zck_reader_read(r, &q, 1, &ro));
    return p;
}

/* The moments torch loaded (st: "<hf name>.exp_avg" / ".exp_avg_sq", Conv1D [in, out]) are
 * run's, bit for bit; returns the number of parameters. */
static size_t same_moments(const char *run, const char *st)
{
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, run));
    const zck_layout *L = zck_reader_layout(r);
    zck_arch_config a;
    ZT_OK(zck_arch_config_from_json(&a, zck_reader_model_json(r), NULL));
    const zfmt__hf_family *fam = zfmt__hf_family_of(zck_arch_name(a.arch));
    zfmt__st_file *f;
    ZT_OK(zfmt__st_open(&f, st));
    size_t n = 0;
    for (size_t s = 1; s < zck_layout_n_states(L); s++) /* exp_avg, exp_avg_sq */
        for (size_t g = 0; g < zck_layout_n_groups(L); g++)
            for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++) {
                zck_tensor_info ti;
                zck_layout_tensor(L, g, t, &ti);
                char hf[256], name[300];
                int tr;
                ZT_OK(zfmt__hf_name(fam, hf, sizeof hf, ti.name, &tr));
                snprintf(name, sizeof name, "%s.%s", hf, zck_layout_state_name(L, s));
                const zfmt__st_entry *e = NULL;
                for (size_t i = 0; i < f->n && !e; i++)
                    if (!strcmp(f->e[i].name, name))
                        e = &f->e[i];
                if (!e)
                    ZT_FAIL("%s: no '%s'", st, name);
                ZT_CHECK(e->dtype == ZCK_F32 && e->end - e->begin == ti.numel * 4);
                float *want = read_state(r, g, s, &ti), *got = malloc(ti.numel * 4 + 4);
                ZT_OK(zfmt__st_read(f, e, got));
                size_t O = tr ? (size_t)ti.shape[0] : 0, I = tr ? (size_t)ti.shape[1] : 0;
                for (size_t k = 0; k < ti.numel; k++) {
                    float w = tr ? want[(k % O) * I + k / O] : want[k]; /* got is [in, out] */
                    if (memcmp(&w, &got[k], 4))
                        ZT_FAIL("%s: '%s'[%zu] = %.9g, %s has %.9g", st, name, k, got[k], run,
                                w);
                }
                free(want);
                free(got);
                n += s == 1;
            }
    zfmt__st_free(f);
    zck_reader_free(r);
    return n;
}

/* Every state (params_only: the params) of every group of runs a and b, bit for bit; with
 * the states, their optimizer steps equal. */
static void same_states(const char *a, const char *b, int params_only)
{
    zck_reader *ra, *rb;
    ZT_OK(zck_reader_open(&ra, a));
    ZT_OK(zck_reader_open(&rb, b));
    const zck_layout *L = zck_reader_layout(ra), *M = zck_reader_layout(rb);
    ZT_CHECK_EQ(zck_layout_n_groups(L), zck_layout_n_groups(M));
    ZT_CHECK_EQ(zck_layout_n_states(L), zck_layout_n_states(M));
    for (size_t s = 0; s < (params_only ? 1 : zck_layout_n_states(L)); s++)
        for (size_t g = 0; g < zck_layout_n_groups(L); g++) {
            uint64_t n = zck_layout_group_numel(L, g);
            ZT_CHECK_EQ(n, zck_layout_group_numel(M, g));
            float *x = malloc(n * 4), *y = malloc(n * 4);
            zck_read_opts ro = ZCK_READ_OPTS_INIT;
            zck_read_req qa = {g, s, 0, n, x}, qb = {g, s, 0, n, y};
            ZT_OK(zck_reader_read(ra, &qa, 1, &ro));
            ZT_OK(zck_reader_read(rb, &qb, 1, &ro));
            if (memcmp(x, y, n * 4))
                ZT_FAIL("state %s of group %s differs between %s and %s",
                        zck_layout_state_name(L, s), zck_layout_group_name(L, g), a, b);
            free(x);
            free(y);
        }
    json_t *ta = json_loads(zck_reader_training_json(ra), 0, NULL),
           *tb = json_loads(zck_reader_training_json(rb), 0, NULL);
    ZT_CHECK(ta && tb);
    if (!params_only)
        ZT_CHECK_EQ(json_integer_value(json_object_get(ta, "optimizer_step")),
                    json_integer_value(json_object_get(tb, "optimizer_step")));
    json_decref(ta);
    json_decref(tb);
    zck_reader_free(ra);
    zck_reader_free(rb);
}

/* GPT-2 (tied head, Conv1D) and Llama (untied head): exported with --optim, torch loads the
 * model equal to export --format hf and the moments and step equal to ours; our verify and
 * inspect read the export; import gives every state back; without --optim, the model alone. */
ZT_TEST(dcpexport_torch_loads_model_and_adamw)
{
    if (!zt_venv_python("torch transformers safetensors"))
        ZT_SKIP("no oracle venv with torch, transformers and safetensors");
    const char *runs[] = {"g", "l"};
    const char *specs[] = {"gpt2:layers=2,heads=2,dim=16,ctx=16,vocab=256",
                           "llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,ctx=16,vocab=256"};
    for (size_t i = 0; i < 2; i++) {
        const char *run = runs[i];
        char *out, args[512], hf[32], d[32], md[32], st[32], imp[32];
        train(run, specs[i]);
        snprintf(hf, sizeof hf, "%s-hf", run);
        snprintf(d, sizeof d, "%s-dcp", run);
        snprintf(md, sizeof md, "%s-model", run);
        snprintf(st, sizeof st, "%s-optim.safetensors", run);
        snprintf(imp, sizeof imp, "%s-imp", run);
        ZT_CHECK(zt_zckpt(&out, "export %s --format hf -o %s", run, hf) == 0);
        free(out);
        if (zt_zckpt(&out, "export %s --format dcp -o %s --optim", run, d) != 0 ||
            !strstr(out, "PyTorch DCP checkpoint (.metadata, __0_0.distcp)"))
            ZT_FAIL("export %s --format dcp: %s", run, out);
        free(out);
        snprintf(args, sizeof args, "load %s %s %s optim", hf, d, st);
        char *py = zt_py_script("torch transformers safetensors", "dcp_torch.py", args);
        json_t *j = json_loads(py, 0, NULL);
        if (!j)
            ZT_FAIL("dcp_torch.py: %s", py);
        /* our settings replaced the optimizer's (lr 0.5, betas 0.5, decay 0.5) */
        json_t *steps = json_object_get(j, "step"), *betas = json_object_get(j, "betas");
        ZT_CHECK(json_array_size(steps) > 0 && json_array_size(betas) == 2);
        for (size_t k = 0; k < json_array_size(steps); k++)
            ZT_CHECK(json_number_value(json_array_get(steps, k)) == 3.0);
        ZT_CHECK(json_number_value(json_object_get(j, "lr")) == 1e-3);
        ZT_CHECK(json_number_value(json_array_get(betas, 0)) == 0.9);
        ZT_CHECK(json_number_value(json_array_get(betas, 1)) == 0.95);
        ZT_CHECK(json_number_value(json_object_get(j, "eps")) == 1e-8);
        ZT_CHECK(json_number_value(json_object_get(j, "weight_decay")) == 0.1);
        size_t n = same_moments(run, st);
        ZT_CHECK_EQ((size_t)json_integer_value(json_object_get(j, "params")), n);
        fprintf(stderr, "  %s: torch loaded %lld tensors equal to %s, %zu parameters' moments "
                "and steps equal to %s's\n", d,
                (long long)json_integer_value(json_object_get(j, "model")), hf, n, run);
        json_decref(j);
        free(py);
        /* ours reads it: verify, inspect, import gives every state back */
        char want[128];
        snprintf(want, sizeof want, "%s (PyTorch DCP): sound (all checks", d);
        ZT_CHECK(zt_zckpt(&out, "verify %s", d) == 0 && strstr(out, want));
        free(out);
        ZT_CHECK(zt_zckpt(&out, "inspect %s --json", d) == 0 &&
                 strstr(out, "\"optimizer.param_groups.0.lr\""));
        free(out);
        if (zt_zckpt(&out, "import %s -o %s --config %s/config.json --format dcp", d, imp,
                     hf) != 0 || !strstr(out, "with AdamW's moments"))
            ZT_FAIL("import %s: %s", d, out);
        free(out);
        same_states(run, imp, 0);
        /* the model alone */
        ZT_CHECK(zt_zckpt(&out, "export %s --format dcp -o %s", run, md) == 0 &&
                 strstr(out, "the model\n"));
        free(out);
        snprintf(args, sizeof args, "load %s %s - model", hf, md);
        free(zt_py_script("torch transformers safetensors", "dcp_torch.py", args));
        snprintf(imp, sizeof imp, "%s-imp-model", run);
        if (zt_zckpt(&out, "import %s -o %s --config %s/config.json", md, imp, hf) != 0 ||
            !strstr(out, "no optimizer state"))
            ZT_FAIL("import %s: %s", md, out);
        free(out);
        same_states(run, imp, 1);
    }
}

/* Refusals, nothing written: an export there (without --force; --force replaces it), a
 * directory holding anything else (even with --force), --optim of another format, --dtype, a
 * damaged source. */
ZT_TEST(dcpexport_refusals_leave_nothing)
{
    char *out;
    train("g", "gpt2:layers=1,heads=2,dim=16,ctx=16,vocab=256");
    ZT_CHECK(zt_zckpt(&out, "export g --format dcp -o d") == 0);
    free(out);
    struct stat before, after;
    ZT_CHECK(stat("d/__0_0.distcp", &before) == 0);
    ZT_CHECK(zt_zckpt(&out, "export g --format dcp -o d --optim") == 2 &&
             strstr(out, "d is not empty (it holds '") && strstr(out, "--force"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "export g --format dcp -o d --optim --force") == 0);
    free(out);
    ZT_CHECK(stat("d/__0_0.distcp", &after) == 0 && after.st_size > before.st_size);
    ZT_CHECK(system("mkdir -p keep && touch keep/notes.txt") == 0);
    ZT_CHECK(zt_zckpt(&out, "export g --format dcp -o keep --force") == 2 &&
             strstr(out, "holds 'notes.txt', which a DCP export does not write"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "export g --format hf -o x --optim") == 2 &&
             strstr(out, "--optim applies to --format dcp only"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "export g --format dcp -o x --dtype bf16") == 2 &&
             strstr(out, "--dtype does not apply"));
    free(out);
    /* damage: one byte of the shard flipped */
    ZT_CHECK(system("cp -r g bad && f=$(ls bad/step-*/shard-*.bin | head -1) && "
                    "printf 'X' | dd of=$f bs=1 seek=100 conv=notrunc 2>/dev/null") == 0);
    ZT_CHECK(zt_zckpt(&out, "export bad --format dcp -o y --optim") != 0 &&
             strstr(out, "shard-"));
    free(out);
    ZT_CHECK(access("x", F_OK) < 0 && access("y", F_OK) < 0 &&
             access("keep/notes.txt", F_OK) == 0);
    ZT_CHECK(system("ls -a | grep -q '\\.tmp-'") != 0); /* no temporary directory left */
}
