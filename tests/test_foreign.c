/*
 * test_foreign.c: the readers of other frameworks' checkpoints (formats/torchzip.c, pickle.c,
 * dcp.c) on files PyTorch itself wrote (tests/formats/torch_files.py, from the oracle venv;
 * skipped without torch), and on hand-made hostile bytes (always run).
 */
#include "ckutil.h"
#include "foreign.h"
#include "harness.h"

#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>

/* tests/formats/torch_files.py with args; skips without torch */
static void torch_files(const char *args) { free(zt_py_script("torch", "torch_files.py", args)); }

static zfmt__pickle *load_pkl(const zfmt__zip *z)
{
    const zfmt__zip_entry *e = zfmt__zip_find(z, "data.pkl");
    ZT_CHECK(e);
    char *b;
    ZT_OK(zfmt__zip_slurp(z, e, 1 << 20, &b));
    zfmt__pickle *p;
    ZT_OK(zfmt__pickle_load(&p, b, (size_t)e->size, "data.pkl", 1 << 24));
    free(b);
    return p;
}

/* the SHA-256 of a tensor's values in row-major order, read through its storage and strides */
static void tensor_sha(const zfmt__zip *z, const zfmt__pv *t, char hex[65])
{
    char rec[128];
    snprintf(rec, sizeof rec, "data/%s", t->storage->s);
    const zfmt__zip_entry *e = zfmt__zip_find(z, rec);
    ZT_CHECK(e);
    size_t es = zck_dtype_size(t->dtype), numel = 1;
    for (size_t d = 0; d < t->ndim; d++)
        numel *= t->size[d];
    char *all;
    ZT_OK(zfmt__zip_slurp(z, e, 1 << 20, &all));
    ZT_CHECK_EQ(e->size, (uint64_t)t->storage->i * es);
    zck_sha256 *h;
    ZT_OK(zck_sha256_new(&h));
    for (size_t i = 0; i < numel; i++) {
        size_t rest = i, at = (size_t)t->i;
        for (size_t d = t->ndim; d-- > 0;) {
            at += (rest % t->size[d]) * (size_t)t->stride[d];
            rest /= t->size[d];
        }
        zck_sha256_update(h, all + at * es, es);
    }
    zck_sha256_hex(h, hex);
    zck_sha256_free(h);
    free(all);
}

ZT_TEST(foreign_torch_save_values)
{
    torch_files("save a.pt");
    zfmt__zip *z;
    ZT_OK(zfmt__zip_open(&z, "a.pt"));
    ZT_CHECK(!strcmp(z->root, "a")); /* torch.save of a path: the file's stem */
    for (size_t i = 0; i < z->n; i++)
        ZT_OK(zfmt__zip_check_crc(z, &z->e[i]));
    zfmt__pickle *p = load_pkl(z);
    const zfmt__pv *root = zfmt__pickle_root(p), *sd = zfmt__pv_get(root, "state_dict");
    int64_t i;
    ZT_CHECK(zfmt__pv_int(zfmt__pv_get(root, "step"), &i) && i == 7);
    ZT_CHECK(zfmt__pv_int(zfmt__pv_get(root, "big"), &i) && i == (int64_t)1 << 40);
    ZT_CHECK(zfmt__pv_int(zfmt__pv_get(root, "neg"), &i) && i == -5);
    ZT_CHECK(zfmt__pv_get(root, "lr")->kind == ZFMT__PK_FLOAT && zfmt__pv_get(root, "lr")->f == 1e-3);
    ZT_CHECK(!strcmp(zfmt__pv_get(root, "name")->s, "x"));
    ZT_CHECK(zfmt__pv_get(root, "flag")->kind == ZFMT__PK_BOOL && zfmt__pv_get(root, "flag")->i);
    ZT_CHECK(zfmt__pv_get(root, "none")->kind == ZFMT__PK_NONE);
    ZT_CHECK(zfmt__pv_get(root, "list")->n == 3 && zfmt__pv_get(root, "set")->kind == ZFMT__PK_SET);
    const zfmt__pv *by = zfmt__pv_get(root, "bytes");
    ZT_CHECK(by->kind == ZFMT__PK_BYTES && by->len == 4 && !memcmp(by->s, "\0\xff" "ab", 4));
    const zfmt__pv *sz = zfmt__pv_get(root, "size");
    ZT_CHECK(sz->kind == ZFMT__PK_TUPLE && sz->n == 2 && sz->items[1]->i == 4);
    /* every tensor of the state dict: dtype, shape and values as torch has them */
    char *expect = zt_slurp("a.pt.expect"), *save = NULL;
    size_t seen = 0;
    for (char *line = strtok_r(expect, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[64], dtype[32], shape[64], sha[65], got[65], gshape[64] = "";
        ZT_CHECK(sscanf(line, "%63s %31s %63s %64s", name, dtype, shape, sha) == 4);
        if (!strcmp(shape, "-"))
            shape[0] = 0;
        const zfmt__pv *t = zfmt__pv_get(sd, name);
        ZT_CHECK(t && t->kind == ZFMT__PK_TENSOR);
        for (size_t d = 0; d < t->ndim; d++)
            snprintf(gshape + strlen(gshape), sizeof gshape - strlen(gshape), "%s%llu",
                     d ? "," : "", (unsigned long long)t->size[d]);
        if (strcmp(t->dtype_name, dtype) || strcmp(gshape, shape))
            ZT_FAIL("%s: %s [%s], torch says %s [%s]", name, t->dtype_name, gshape, dtype, shape);
        tensor_sha(z, t, got);
        if (strcmp(got, sha))
            ZT_FAIL("%s: the values differ from torch's", name);
        seen++;
    }
    ZT_CHECK_EQ(seen, 7);
    free(expect);
    zfmt__pickle_free(p);
    zfmt__zip_free(z);
}

/* a pickle that would run code: refused naming the global; nothing runs */
ZT_TEST(foreign_pickles_naming_code_are_refused)
{
    const char *kinds[2][2] = {{"system", "posix.system"}, {"eval", "builtins.eval"}};
    for (int k = 0; k < 2; k++) {
        char args[4400], cwd[4096];
        ZT_CHECK(getcwd(cwd, sizeof cwd));
        snprintf(args, sizeof args, "evil evil.pt %s %s/PWNED", kinds[k][0], cwd);
        torch_files(args);
        zfmt__zip *z;
        ZT_OK(zfmt__zip_open(&z, "evil.pt"));
        const zfmt__zip_entry *e = zfmt__zip_find(z, "data.pkl");
        char *b;
        ZT_OK(zfmt__zip_slurp(z, e, 1 << 20, &b));
        zfmt__pickle *p = NULL;
        char want[64];
        snprintf(want, sizeof want, "pickle global '%s' is not allowed", kinds[k][1]);
        ZT_ERR(zfmt__pickle_load(&p, b, (size_t)e->size, "evil.pt", 1 << 24), ZR_ECORRUPT, want);
        ZT_CHECK(access("PWNED", F_OK) < 0);
        free(b);
        zfmt__zip_free(z);
    }
    /* hand-made: GLOBAL + REDUCE, STACK_GLOBAL, INST (text opcodes never accepted) */
    static const struct {
        const char *bytes;
        size_t n;
        const char *msg;
    } bad[] = {
        {"\x80\x02" "cos\nsystem\nX\x04\0\0\0true\x85R.", 20, "'os.system' is not allowed"},
        {"\x80\x04\x8c\x08" "builtins\x8c\x04" "exec\x93.", 20, "'builtins.exec' is not allowed"},
        {"(S'x'\nios\nsystem\n.", 17, "unsupported pickle opcode"},
        {"\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\n)R.", 38, "arguments torch never writes"},
        {"\x80\x02]q\xff.", 6, NULL}, /* fine: an empty list memoized at 255 */
        {"\x80\x02" "h\x05.", 5, "a memo read of an index never stored"},
        {"\x80\x02]r\xff\xff\xff\x7f.", 9, "a memo index over 2^30"},
        {"\x80\x02(((((", 7, "ends without STOP"},
        {"\x80\x02" "X\xff\xff\0\0ab.", 10, "runs past the end"},
        {"\x80\x02" "ctorch\nFloatStorage\n)R.", 25, "is not callable"},
    };
    /* a tensor view of sizes (2^40, 2^40), strides (2^40, 1): past 2^64 elements, not wrapped */
    static const char huge[] =
        "\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\n("
        "(X\x07\0\0\0storage" "ctorch\nFloatStorage\n" "X\x01\0\0\0" "0" "X\x03\0\0\0cpu"
        "K\x0at" "QK\x00"
        "\x8a\x06\0\0\0\0\0\x01\x8a\x06\0\0\0\0\0\x01\x86"
        "\x8a\x06\0\0\0\0\0\x01K\x01\x86" "\x89Nt" "R.";
    zfmt__pickle *hp = NULL;
    ZT_ERR(zfmt__pickle_load(&hp, huge, sizeof huge - 1, "x", 1 << 20), ZR_ECORRUPT,
           "reaches past 2^64 elements");
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        zfmt__pickle *p = NULL;
        if (!bad[i].msg) {
            ZT_OK(zfmt__pickle_load(&p, bad[i].bytes, bad[i].n, "x", 1 << 20));
            zfmt__pickle_free(p);
            continue;
        }
        zr_err_clear();
        int rc = zfmt__pickle_load(&p, bad[i].bytes, bad[i].n, "x", 1 << 20);
        if (rc != ZR_ECORRUPT || !strstr(zr_err_msg(), bad[i].msg))
            ZT_FAIL("bad pickle %zu: %s, message '%s', expected '%s'", i, zr_err_name(rc),
                    zr_err_msg(), bad[i].msg);
    }
}

/* memory is bounded: a pickle of many values stops at the budget, with a message */
ZT_TEST(foreign_pickle_memory_is_bounded)
{
    size_t n = 1 << 20;
    char *b = malloc(n + 4);
    b[0] = '\x80';
    b[1] = 2;
    memset(b + 2, ']', n); /* a million empty lists on the stack */
    b[n + 2] = '.';
    zfmt__pickle *p = NULL;
    ZT_ERR(zfmt__pickle_load(&p, b, n + 3, "big", 16 << 20), ZR_ECORRUPT, "more than 16777216 bytes");
    free(b);
    /* a list appended into itself (a cycle) loads; describing it does not recurse */
    static const char cyc[] = "\x80\x02]q\x00h\x00" "a.";
    ZT_OK(zfmt__pickle_load(&p, cyc, sizeof cyc - 1, "cycle", 1 << 20));
    char d[64];
    zfmt__pv_describe(zfmt__pickle_root(p), d, sizeof d);
    ZT_CHECK(!strcmp(d, "list of 1") && zfmt__pickle_root(p)->items[0] == zfmt__pickle_root(p));
    zfmt__pickle_free(p);
}

/* zip damage: truncation, a flipped byte, a compressed record, a record outside the root */
ZT_TEST(foreign_zip_damage_is_named)
{
    torch_files("save a.pt");
    char *all = zt_slurp("a.pt");
    struct stat st;
    ZT_CHECK(stat("a.pt", &st) == 0);
    zfmt__zip *z = NULL;
    zt_write_bytes("half.pt", all, (size_t)st.st_size / 2);
    ZT_ERR(zfmt__zip_open(&z, "half.pt"), ZR_ECORRUPT, "no end of central directory");
    zt_write_bytes("tail.pt", all, (size_t)st.st_size - 30); /* the end record cut */
    ZT_ERR(zfmt__zip_open(&z, "tail.pt"), ZR_ECORRUPT, "tail.pt");
    /* one byte of a storage flipped: the zip opens, the record's CRC-32 differs */
    ZT_OK(zfmt__zip_open(&z, "a.pt"));
    const zfmt__zip_entry *e = zfmt__zip_find(z, "data/0");
    ZT_CHECK(e);
    all[e->data_off + 3] ^= 1;
    zfmt__zip_free(z);
    zt_write_bytes("flip.pt", all, (size_t)st.st_size);
    ZT_OK(zfmt__zip_open(&z, "flip.pt"));
    ZT_ERR(zfmt__zip_check_crc(z, zfmt__zip_find(z, "data/0")), ZR_ECORRUPT,
           "record 'a/data/0': CRC-32");
    zfmt__zip_free(z);
    free(all);
    /* zips torch never writes (Python's zipfile): compressed, no root folder, two roots */
    const char *py = zt_venv_python("zipfile");
    ZT_CHECK(py);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' -c \"import zipfile\n"
             "z = zipfile.ZipFile('deflated.pt', 'w', zipfile.ZIP_DEFLATED)\n"
             "z.writestr('archive/data.pkl', b'x' * 1000)\nz.close()\n"
             "z = zipfile.ZipFile('flat.pt', 'w')\nz.writestr('data.pkl', b'.')\nz.close()\n"
             "z = zipfile.ZipFile('roots.pt', 'w')\nz.writestr('a/data.pkl', b'.')\n"
             "z.writestr('b/x', b'.')\nz.close()\n\"", py);
    ZT_CHECK(system(cmd) == 0);
    ZT_ERR(zfmt__zip_open(&z, "deflated.pt"), ZR_EUNSUPPORTED, "is compressed");
    ZT_ERR(zfmt__zip_open(&z, "flat.pt"), ZR_ECORRUPT, "not in a folder");
    ZT_ERR(zfmt__zip_open(&z, "roots.pt"), ZR_ECORRUPT, "outside the root folder 'a'");
    mkfifo("fifo.pt", 0600);
    ZT_ERR(zfmt__zip_open(&z, "fifo.pt"), ZR_ECORRUPT, "FIFO");
}

/* zckpt verify of a DCP save: sound; then each damage named, exit 1 */
ZT_TEST(foreign_dcp_verify_names_each_damage)
{
    torch_files("dcp d");
    char *out;
    if (zt_zckpt(&out, "verify d") != 0 || !strstr(out, "d (PyTorch DCP): sound"))
        ZT_FAIL("verify d: %s", out);
    free(out);
    ZT_CHECK(zt_zckpt(&out, "verify d --json") == 0 && strstr(out, "\"format\": \"PyTorch DCP\""));
    free(out);
    /* audit: sound, but not a checkpoint zrun resumes (exit 1, the reason said) */
    ZT_CHECK(zt_zckpt(&out, "audit d") == 1 && strstr(out, "a PyTorch DCP checkpoint, sound") &&
             strstr(out, "not resumable:"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "inspect d --tensors") == 0 && strstr(out, "model.w") &&
             strstr(out, "[40, 24]"));
    free(out);
    struct {
        const char *setup, *want;
    } cases[] = {
        /* a missing .distcp */
        {"rm e/__0_0.distcp", "__0_0.distcp: missing: named by .metadata, absent"},
        /* a truncated one */
        {"truncate -s 1000 e/__0_0.distcp", "__0_0.distcp: truncated: 1000 bytes"},
        /* a flipped byte in the middle of the first item */
        {"printf '\\001' | dd of=e/__0_0.distcp bs=1 seek=3000 conv=notrunc 2>/dev/null",
         "__0_0.distcp: hash mismatch: item"},
        /* a .distcp of another save */
        {"cp e/__0_0.distcp e/__1_0.distcp", "__1_0.distcp: unlisted file"},
        /* no .metadata pickle at all */
        {"echo x > e/.metadata", ".metadata: bad manifest"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ZT_CHECK(system("rm -rf e && cp -r d e") == 0);
        ZT_CHECK(system(cases[i].setup) == 0);
        int rc = zt_zckpt(&out, "verify e");
        if (rc != 1 || !strstr(out, cases[i].want))
            ZT_FAIL("%s: exit %d, expected 1 and '%s':\n%s", cases[i].setup, rc, cases[i].want,
                    out);
        free(out);
    }
    /* a chunk missing from .metadata: the tensor's chunks no longer cover it */
    ZT_CHECK(system("rm -rf e && cp -r d e") == 0);
    const char *py = zt_venv_python("torch");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' -c \"import pickle\nm = pickle.load(open('e/.metadata', "
             "'rb'))\nm.state_dict_metadata['model.w'].chunks.pop(0)\n"
             "pickle.dump(m, open('e/.metadata', 'wb'))\" 2>/dev/null", py);
    ZT_CHECK(system(cmd) == 0);
    ZT_CHECK(zt_zckpt(&out, "verify e") == 1);
    if (!strstr(out, "'model.w': its chunks cover 0 of its 960 elements"))
        ZT_FAIL("chunk missing: %s", out);
    free(out);
}

/* ---------------------------------------------------------------- DeepSpeed and DCP, for real */

/* tests/formats/foreign_ckpt.py with args (real DeepSpeed / DCP on CPU ranks); skips without
 * torch and deepspeed */
static void foreign_ckpt(const char *args)
{
    free(zt_py_script("torch deepspeed", "foreign_ckpt.py", args));
}

/* foreign_ckpt.py's damage KIND of src into dst: zckpt verify exits 1 saying want */
static void damaged_verify_says(const char *kind, const char *src, const char *dst,
                                const char *want)
{
    char args[256], *out;
    snprintf(args, sizeof args, "damage %s %s %s", kind, src, dst);
    foreign_ckpt(args);
    int rc = zt_zckpt(&out, "verify %s", dst);
    if (rc != 1 || !strstr(out, want))
        ZT_FAIL("%s: exit %d, expected 1 and '%s':\n%s", kind, rc, want, out);
    free(out);
}

/* every tensor of ref in got, equal bit for bit (got's name may carry prefix) */
static void same_tensors(const char *ref, const char *got, const char *prefix)
{
    zfmt__st_file *a, *b;
    ZT_OK(zfmt__st_open(&a, ref));
    ZT_OK(zfmt__st_open(&b, got));
    for (size_t i = 0; i < a->n; i++) {
        const zfmt__st_entry *x = &a->e[i], *y = NULL;
        char name[512];
        snprintf(name, sizeof name, "%s%s", prefix, x->name);
        for (size_t j = 0; j < b->n && !y; j++)
            if (!strcmp(b->e[j].name, name) || !strcmp(b->e[j].name, x->name))
                y = &b->e[j];
        if (!y)
            ZT_FAIL("%s: '%s' of %s is missing", got, x->name, ref);
        if (x->dtype != y->dtype || x->ndim != y->ndim ||
            memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape))
            ZT_FAIL("%s: '%s' has another dtype or shape than in %s", got, x->name, ref);
        size_t n = (size_t)(x->end - x->begin);
        char *p = malloc(n + 1), *q = malloc(n + 1);
        ZT_OK(zfmt__st_read(a, x, p));
        ZT_OK(zfmt__st_read(b, y, q));
        if (memcmp(p, q, n))
            ZT_FAIL("%s: '%s' differs from %s", got, x->name, ref);
        free(p);
        free(q);
    }
    fprintf(stderr, "  %s: %zu tensors equal to %s\n", got, a->n, ref);
    zfmt__st_free(a);
    zfmt__st_free(b);
}

static void verify_sound(const char *dir, const char *format)
{
    char *out, want[256];
    snprintf(want, sizeof want, "%s (%s): sound (all checks", dir, format);
    if (zt_zckpt(&out, "verify %s", dir) != 0 || !strstr(out, want))
        ZT_FAIL("zckpt verify %s: %s", dir, out);
    free(out);
}

/* the tensor name of st file f, or NULL */
static const zfmt__st_entry *st_entry(const zfmt__st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, name))
            return &f->e[i];
    return NULL;
}

/* ref (float32, Hugging Face names, [in, out] Conv1D weights; ref_suffix after each name:
 * "" for the weights, ".exp_avg", ".exp_avg_sq") against the same states of our checkpoint's
 * consolidation ours ("<state>/<our name>", or our name for the weights): every tensor of the
 * model equal bit for bit. Returns how many were compared. */
static size_t same_as_ref(const char *ref, const char *ours, const char *model,
                          const char *ref_suffix, const char *state)
{
    const zfmt__hf_family *fam = zfmt__hf_family_of(model);
    zfmt__st_file *a, *b;
    ZT_OK(zfmt__st_open(&a, ref));
    ZT_OK(zfmt__st_open(&b, ours));
    size_t seen = 0, ls = strlen(ref_suffix);
    for (size_t i = 0; i < a->n; i++) {
        const zfmt__st_entry *x = &a->e[i];
        char hf[512], name[600];
        size_t l = strlen(x->name);
        if (l <= ls || strcmp(x->name + l - ls, ref_suffix))
            continue;
        snprintf(hf, sizeof hf, "%.*s", (int)(l - ls), x->name);
        int tr = 0;
        const char *o = zfmt__hf_to_ours(fam, hf, &tr);
        ZT_CHECK(o);
        snprintf(name, sizeof name, "%s%s%s", state ? state : "", state ? "/" : "", o);
        const zfmt__st_entry *y = st_entry(b, name);
        if (!y && zfmt__hf_is_head(fam, hf))
            continue; /* the tied head: the embedding */
        if (!y)
            ZT_FAIL("%s: no '%s' (for %s of %s)", ours, name, x->name, ref);
        ZT_CHECK(x->dtype == ZCK_F32 && y->dtype == ZCK_F32 && x->ndim == y->ndim);
        size_t n = (size_t)(x->end - x->begin) / 4;
        ZT_CHECK_EQ((uint64_t)n * 4, y->end - y->begin);
        float *p = malloc(n * 4 + 4), *q = malloc(n * 4 + 4);
        ZT_OK(zfmt__st_read(a, x, p));
        ZT_OK(zfmt__st_read(b, y, q));
        size_t O = tr ? (size_t)x->shape[1] : 0, I = tr ? (size_t)x->shape[0] : 0;
        for (size_t k = 0; k < n; k++) {
            /* ours [out, in] against the source's [in, out] */
            float want = tr ? p[(k % I) * O + k / I] : p[k];
            if (memcmp(&want, &q[k], 4))
                ZT_FAIL("%s: '%s'[%zu] = %.9g, %s has %.9g", ours, name, k, q[k], ref, want);
        }
        free(p);
        free(q);
        seen++;
    }
    zfmt__st_free(a);
    zfmt__st_free(b);
    return seen;
}

/* zckpt import of dir (a DeepSpeed or DCP checkpoint with ref/) into run at world W: its
 * weights, exp_avg and exp_avg_sq are the source framework's own gather, bit for bit */
static void import_equals_ref(const char *dir, const char *model, int world, int moments)
{
    char *out, run[128], st[160], ref[160];
    snprintf(run, sizeof run, "imp-%s", dir);
    if (zt_zckpt(&out, "import %s -o %s --world %d", dir, run, world) != 0)
        ZT_FAIL("import %s: %s", dir, out);
    ZT_CHECK(strstr(out, moments ? "with AdamW's moments" : "no optimizer state"));
    /* the source's settings, for the zrun options that continue the run */
    ZT_CHECK(!moments || strstr(out, "the source's AdamW: lr 0.01, betas (0.9, 0.95), eps 1e-08"));
    free(out);
    snprintf(st, sizeof st, "%s.safetensors", run);
    if (zt_zckpt(&out, "consolidate %s -o %s --format safetensors", run, st) != 0)
        ZT_FAIL("consolidate %s: %s", run, out);
    free(out);
    snprintf(ref, sizeof ref, "%s/ref/model.safetensors", dir);
    size_t n = same_as_ref(ref, st, model, "", NULL);
    ZT_CHECK(n > 0);
    snprintf(ref, sizeof ref, "%s/ref/optim.safetensors", dir);
    if (moments) {
        ZT_CHECK_EQ(same_as_ref(ref, st, model, ".exp_avg", "exp_avg"), n);
        ZT_CHECK_EQ(same_as_ref(ref, st, model, ".exp_avg_sq", "exp_avg_sq"), n);
    }
    fprintf(stderr, "  %s: %zu weights%s equal to %s's\n", run, n,
            moments ? " and their moments" : "", dir);
}

/* Real DeepSpeed checkpoints (2 or 3 ranks): verify sound, consolidate equal tensor for tensor
 * to DeepSpeed's zero_to_fp32, import equal to DeepSpeed's own gather of the master weights and
 * moments (make test: five of the variants below; make stress: all). */
ZT_TEST(foreign_deepspeed_consolidate_equals_zero_to_fp32)
{
    /* model, stage, dtype, world (3: partitions with padding), gradient accumulation dtype
     * (fp32 with bf16 at stage 1: DeepSpeed's BF16_Optimizer, whose files zero_to_fp32 refuses;
     * the reference is then the engine's gathered master weights) */
    static const char *const all[] = {"gpt2 1 fp32 2 same", "gpt2 3 bf16 2 same",
                                      "llama 2 bf16 3 same", "llama 3 fp32 3 same",
                                      "gpt2 1 bf16 2 fp32", "gpt2 1 bf16 2 same",
                                      "gpt2 2 fp32 2 same", "gpt2 2 bf16 2 same",
                                      "gpt2 3 fp32 2 same", "llama 1 fp32 2 same",
                                      "llama 1 bf16 2 same", "llama 2 fp32 2 same",
                                      "llama 3 bf16 2 same", "llama 1 fp32 3 same"};
    size_t n = zt_stress() ? sizeof all / sizeof *all : 5;
    for (size_t i = 0; i < n; i++) {
        char model[16], dtype[8], dir[64], args[256], accum[8];
        int stage, world;
        ZT_CHECK(sscanf(all[i], "%15s %d %7s %d %7s", model, &stage, dtype, &world, accum) == 5);
        snprintf(dir, sizeof dir, "ds-%s-s%d-%s-w%d-%s", model, stage, dtype, world, accum);
        snprintf(args, sizeof args, "ds %s --model %s --stage %d --dtype %s --world %d "
                 "--grad-accum %s", dir, model, stage, dtype, world, accum);
        foreign_ckpt(args);
        verify_sound(dir, "DeepSpeed ZeRO");
        char *out, ref[128], got[128], want[64];
        ZT_CHECK(zt_zckpt(&out, "inspect %s --json", dir) == 0);
        snprintf(want, sizeof want, "\"stage\": %d,\n  \"world\": %d,", stage, world);
        if (!strstr(out, want))
            ZT_FAIL("inspect %s --json lacks '%s':\n%s", dir, want, out);
        free(out);
        if (zt_zckpt(&out, "consolidate %s -o out/%s.safetensors", dir, dir) != 0)
            ZT_FAIL("consolidate %s: %s", dir, out);
        free(out);
        snprintf(ref, sizeof ref, "%s/ref/model.safetensors", dir);
        snprintf(got, sizeof got, "out/%s.safetensors", dir);
        same_tensors(ref, got, "");
        import_equals_ref(dir, model, 1 + (int)i % 3, 1);
    }
}

/* Each damage class named by verify (exit 1); consolidate refuses (exit 2) and writes nothing;
 * a pickle naming os.system or eval runs nothing. */
ZT_TEST(foreign_deepspeed_damage_is_named)
{
    foreign_ckpt("ds src --model gpt2 --stage 2 --dtype bf16");
    static const struct {
        const char *kind, *want;
    } cases[] = {
        {"missing-rank-file", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: missing: rank 1's "
                              "optimizer states"},
        {"truncated-zip", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: truncated:"},
        {"latest-absent-tag", "latest: missing: names tag 'global_step999999', which does not "
                              "exist"},
        {"evil-pickle-os-system", "unsafe pickle: "},
        {"evil-pickle-eval", "pickle global 'builtins.eval' is not allowed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dst[16], *out;
        snprintf(dst, sizeof dst, "d%zu", i);
        damaged_verify_says(cases[i].kind, "src", dst, cases[i].want);
        int rc = zt_zckpt(&out, "consolidate d%zu -o out%zu.safetensors", i, i);
        if (rc != 2 || !strstr(out, "zckpt verify lists them"))
            ZT_FAIL("consolidate of %s: exit %d:\n%s", cases[i].kind, rc, out);
        free(out);
        char marker[64], shown[64];
        snprintf(marker, sizeof marker, "d%zu/PWNED", i);
        snprintf(shown, sizeof shown, "out%zu.safetensors", i);
        ZT_CHECK(access(marker, F_OK) < 0 && access(shown, F_OK) < 0);
    }
    /* bytes changed inside rank 0's partitions: a CRC-32 mismatch for verify, and consolidate,
     * which reads the fp32 partition, refuses before writing */
    ZT_CHECK(system("cp -r src flip") == 0);
    const char *f = "flip/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt";
    zfmt__zip *z;
    ZT_OK(zfmt__zip_open(&z, f));
    FILE *fp = fopen(f, "r+b");
    ZT_CHECK(fp);
    for (size_t i = 0; i < z->n; i++)
        if (z->e[i].size > 4000) { /* the fp32 partition, exp_avg, exp_avg_sq (not data.pkl) */
            long at = (long)(z->e[i].data_off + z->e[i].size / 2);
            int c;
            ZT_CHECK(fseek(fp, at, SEEK_SET) == 0 && (c = fgetc(fp)) != EOF);
            ZT_CHECK(fseek(fp, at, SEEK_SET) == 0 && fputc(c ^ 0x40, fp) != EOF);
        }
    fclose(fp);
    zfmt__zip_free(z);
    char *out;
    ZT_CHECK(zt_zckpt(&out, "verify flip") == 1 && strstr(out, "hash mismatch") &&
             strstr(out, "CRC-32"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "consolidate flip -o flip.safetensors") == 2 && strstr(out, "CRC-32"));
    free(out);
    ZT_CHECK(access("flip.safetensors", F_OK) < 0);
    /* a storage record dropped from rank 1's zip (rebuilt by Python's zipfile): named */
    ZT_CHECK(system("cp -r src norec") == 0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' -c \"import zipfile\n"
             "f = 'norec/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt'\n"
             "z = zipfile.ZipFile(f)\nr = [(i.filename, z.read(i)) for i in z.infolist()]\n"
             "z.close()\no = zipfile.ZipFile(f, 'w')\n"
             "[o.writestr(n, d) for n, d in r if not n.endswith('/data/2')]\no.close()\"",
             zt_venv_python("zipfile"));
    ZT_CHECK(system(cmd) == 0);
    ZT_CHECK(zt_zckpt(&out, "verify norec") == 1);
    if (!strstr(out, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: ") ||
        !strstr(out, "storage record"))
        ZT_FAIL("a dropped storage record:\n%s", out);
    free(out);
}

/* Real DCP checkpoints of FSDP2 on 2 ranks: verify sound, consolidate equal to
 * dcp_to_torch_save; a missing .distcp and a chunk missing from .metadata named. */
ZT_TEST(foreign_dcp_consolidate_equals_dcp_to_torch_save)
{
    foreign_ckpt("dcp g --model gpt2");
    foreign_ckpt("dcp l --model llama --optim");
    const char *dirs[] = {"g", "l"}, *prefix[] = {"", "model."};
    for (size_t i = 0; i < 2; i++) {
        verify_sound(dirs[i], "PyTorch DCP");
        char *out, ref[64], got[64];
        if (zt_zckpt(&out, "consolidate %s -o %s.safetensors", dirs[i], dirs[i]) != 0)
            ZT_FAIL("consolidate %s: %s", dirs[i], out);
        free(out);
        snprintf(ref, sizeof ref, "%s/ref/model.safetensors", dirs[i]);
        snprintf(got, sizeof got, "%s.safetensors", dirs[i]);
        same_tensors(ref, got, prefix[i]);
    }
    static const struct {
        const char *kind, *want;
    } cases[] = {
        {"missing-distcp", "__1_0.distcp: missing: named by .metadata, absent"},
        {"metadata-missing-chunk", "coverage: '"},
    };
    damaged_verify_says(cases[0].kind, "g", "e0", cases[0].want);
    damaged_verify_says(cases[1].kind, "g", "e1", cases[1].want);
}

/* the loss of step `step` in run's train.jsonl */
static double logged_loss(const char *run, int step)
{
    char path[256];
    snprintf(path, sizeof path, "%s/train.jsonl", run);
    char *all = zt_slurp(path), *save = NULL;
    double loss = NAN;
    for (char *line = strtok_r(all, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_t *j = json_loads(line, 0, NULL);
        if (j && json_integer_value(json_object_get(j, "step")) == step)
            loss = json_number_value(json_object_get(j, "loss"));
        json_decref(j);
    }
    free(all);
    return loss;
}

/* zrun continues the run imp-<dir> (imported from dir, made with --next-token 5 after 2
 * steps) on the batch the source framework continued on: the loss of its first step (the
 * weights) and of its second (AdamW's update from the imported moments and step) are the
 * source framework's (dir/ref/info.json) within 1e-5. how: zrun's parallel options and its
 * --batch (every sample the same: the batch size changes no loss). */
static void run_continues(const char *dir, const char *how)
{
    /* a corpus of token 5: every sample is the batch the source continued on; sequences of 7
     * are its 8 tokens' 7 predictions */
    enum { N = 4096 };
    static int32_t head[256] = {20240520, 1, N};
    static uint16_t tok[N];
    for (size_t i = 0; i < N; i++)
        tok[i] = 5;
    FILE *f = fopen("five.bin", "wb");
    ZT_CHECK(f && fwrite(head, sizeof head, 1, f) == 1 && fwrite(tok, sizeof tok, 1, f) == 1);
    fclose(f);
    char run[64], info[64];
    snprintf(run, sizeof run, "imp-%s", dir);
    zt_zrunf_ok("zrun.log", "--resume %s --ckpt-dir %s %s--data five.bin --seq 7 "
                "--steps 4 --lr 1e-2 --warmup 0 --min-lr-ratio 1 --weight-decay 0 "
                "--grad-clip 0", run, run, how);
    snprintf(info, sizeof info, "%s/ref/info.json", dir);
    json_t *j = json_load_file(info, 0, NULL);
    ZT_CHECK(j && json_integer_value(json_object_get(j, "step")) == 2);
    double want[2] = {json_number_value(json_object_get(j, "next_loss")),
                      json_number_value(json_object_get(j, "after_step_loss"))};
    json_decref(j);
    for (int k = 0; k < 2; k++) {
        double got = logged_loss(run, 3 + k);
        if (!(fabs(got - want[k]) <= 1e-5 * fabs(want[k])))
            ZT_FAIL("%s: step %d loss %.7f, the source's %.7f", run, 3 + k, got, want[k]);
        fprintf(stderr, "  %s: step %d loss %.7f, the source's %.7f\n", run, 3 + k, got,
                want[k]);
    }
}

/* A DeepSpeed ZeRO-2 GPT-2 and an FSDP2 DCP Llama (with its optimizer), 2 ranks each, imported;
 * zrun continues each run (run_continues). Damage, a wrong --format and a missing config.json
 * are refused, nothing written. */
ZT_TEST(foreign_import_continues_the_run)
{
    foreign_ckpt("ds ds --model gpt2 --stage 2 --dtype fp32 --next-token 5 --weight-decay 0");
    foreign_ckpt("dcp dcp --model llama --optim --next-token 5 --weight-decay 0");
    const char *dirs[] = {"ds", "dcp"}, *models[] = {"gpt2", "llama"};
    const char *how[] = {"--batch 2 ", "--nproc 2 --zero 3 --batch 2 "};
    for (size_t i = 0; i < 2; i++) {
        import_equals_ref(dirs[i], models[i], 2, 1);
        run_continues(dirs[i], how[i]);
    }
    /* refusals: nothing written */
    char *out;
    ZT_CHECK(system("cp -r ds noconf && rm noconf/config.json") == 0);
    ZT_CHECK(zt_zckpt(&out, "import noconf -o r1") == 2 && strstr(out, "--config FILE"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "import noconf -o r1 --config dcp/config.json") == 2 &&
             strstr(out, "unexpected tensor 'transformer."));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "import noconf -o r1 --config ds/config.json") == 0);
    free(out);
    ZT_CHECK(zt_zckpt(&out, "import ds -o r2 --format dcp") == 2 &&
             strstr(out, "not a PyTorch DCP checkpoint (DeepSpeed ZeRO)"));
    free(out);
    damaged_verify_says("missing-rank-file", "ds", "dmg", "missing");
    ZT_CHECK(zt_zckpt(&out, "import dmg -o r3") == 2 && strstr(out, "missing: rank 1's") &&
             strstr(out, "zckpt verify lists them"));
    free(out);
    ZT_CHECK(access("r2", F_OK) < 0 && access("r3", F_OK) < 0);
}

/* the two files are equal byte for byte */
static void same_bytes(const char *a, const char *b)
{
    char *x = zt_slurp(a), *y = zt_slurp(b);
    struct stat sa, sb;
    ZT_CHECK(stat(a, &sa) == 0 && stat(b, &sb) == 0);
    if (sa.st_size != sb.st_size || memcmp(x, y, (size_t)sa.st_size))
        ZT_FAIL("%s and %s differ", a, b);
    free(x);
    free(y);
}

/* A DeepSpeed universal checkpoint (ds_to_universal.py) of a ZeRO-2 GPT-2 of 2 ranks: verify
 * sound; consolidate equal tensor for tensor to zero_to_fp32 of the source; DeepSpeed's own
 * load_universal at 3 ranks gathers the same master weights as our import; the import (3
 * ranks) equal bit for bit to the import of the source ZeRO checkpoint, and zrun continues it
 * as the source engine did; each damage class named by verify (exit 1), consolidate refused. */
ZT_TEST(foreign_deepspeed_universal_stage2)
{
    foreign_ckpt("ds ds --model gpt2 --stage 2 --dtype fp32 --next-token 5 --weight-decay 0");
    foreign_ckpt("universal ds u --load 3");
    verify_sound("u", "DeepSpeed universal");
    verify_sound("u/global_step2_universal", "DeepSpeed universal");
    verify_sound("ds/global_step2", "DeepSpeed ZeRO"); /* a tag folder named directly */
    char *out;
    ZT_CHECK(zt_zckpt(&out, "inspect u --json") == 0);
    if (!strstr(out, "\"format\": \"DeepSpeed universal\"") ||
        !strstr(out, "\"stage\": 2,\n  \"world\": 2,") || !strstr(out, "\"step\": 2,"))
        ZT_FAIL("inspect u --json:\n%s", out);
    free(out);
    ZT_CHECK(zt_zckpt(&out, "audit u") == 1 && strstr(out, "a DeepSpeed universal checkpoint, "
                                                       "sound (all checks)"));
    free(out);
    if (zt_zckpt(&out, "consolidate u -o u.safetensors") != 0)
        ZT_FAIL("consolidate u: %s", out);
    free(out);
    same_tensors("ds/ref/model.safetensors", "u.safetensors", "");
    /* the import (consolidated into imp-<dir>.safetensors): the source's gather, DeepSpeed's
     * load_universal at 3 ranks, and the import of the ZeRO checkpoint itself, bit for bit */
    import_equals_ref("u", "gpt2", 3, 1);
    import_equals_ref("ds", "gpt2", 3, 1);
    /* the manifests say which format each came from */
    ZT_CHECK(system("grep -rqF 'DeepSpeed universal' imp-u --include=manifest.json") == 0);
    ZT_CHECK(system("grep -rqF 'DeepSpeed ZeRO' imp-ds --include=manifest.json") == 0);
    size_t n = same_as_ref("u/ref/loaded.safetensors", "imp-u.safetensors", "gpt2", ".fp32", NULL);
    ZT_CHECK(n > 0);
    ZT_CHECK_EQ(same_as_ref("u/ref/loaded.safetensors", "imp-u.safetensors", "gpt2", ".exp_avg",
                            "exp_avg"), n);
    same_bytes("imp-u.safetensors", "imp-ds.safetensors");
    run_continues("u", "--nproc 3 --zero 2 --batch 3 ");
    /* damage, each named */
    static const struct {
        const char *setup, *want;
    } cases[] = {
        {"rm -r e/global_step2_universal/zero/transformer.h.0.ln_1.bias",
         "zero/transformer.h.0.ln_1.bias: missing: the folder of parameter "
         "'transformer.h.0.ln_1.bias'"},
        {"rm e/global_step2_universal/zero/transformer.wte.weight/exp_avg.pt",
         "zero/transformer.wte.weight/exp_avg.pt: missing: the first moment (exp_avg) of "
         "'transformer.wte.weight'"},
        {"rm e/global_step2_universal/zero/transformer.wte.weight/step.pt",
         "zero/transformer.wte.weight/step.pt: missing: the optimizer step"},
        {"truncate -s 1000 e/global_step2_universal/zero/transformer.h.1.mlp.c_fc.weight/"
         "exp_avg_sq.pt", "zero/transformer.h.1.mlp.c_fc.weight/exp_avg_sq.pt: truncated: "},
        {"cp e/global_step2_universal/zero/transformer.h.0.ln_1.bias/fp32.pt "
         "e/global_step2_universal/zero/transformer.h.0.attn.c_attn.bias/fp32.pt",
         "zero/transformer.h.0.attn.c_attn.bias/fp32.pt: bad manifest: shape [16], the model "
         "states say [48]"},
        {"printf '\\001' | dd of=e/global_step2_universal/zero/transformer.wte.weight/fp32.pt "
         "bs=1 seek=1200 conv=notrunc 2>/dev/null",
         "zero/transformer.wte.weight/fp32.pt: hash mismatch: "},
        {"rm e/global_step2_universal/zero/optimizer_state.pt",
         "zero/optimizer_state.pt: missing: "},
        {"echo global_step9_universal > e/latest_universal",
         "latest_universal: missing: names tag 'global_step9_universal', which does not exist"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ZT_CHECK(system("rm -rf e && cp -r u e") == 0);
        ZT_CHECK(system(cases[i].setup) == 0);
        int rc = zt_zckpt(&out, "verify e");
        if (rc != 1 || !strstr(out, cases[i].want))
            ZT_FAIL("%s: exit %d, expected 1 and '%s':\n%s", cases[i].setup, rc, cases[i].want,
                    out);
        free(out);
        rc = zt_zckpt(&out, "consolidate e -o e.safetensors");
        if (rc != 2 || !strstr(out, "zckpt verify lists them") ||
            access("e.safetensors", F_OK) == 0)
            ZT_FAIL("%s: consolidate exit %d:\n%s", cases[i].setup, rc, out);
        free(out);
    }
}

/* Universal checkpoints of other variants: a ZeRO-3 bf16 Llama of 3 ranks (its files: bare flat
 * tensors, the step in zero/optimizer_state.pt) and a bf16 GPT-2 under DeepSpeed's
 * BF16_Optimizer (stage 1 with fp32 gradient accumulation: no zero_stage anywhere; the
 * reference is the engine's gathered master weights, zero_to_fp32 refusing the source):
 * consolidate equal to the reference, the import equal to the source's gather of weights and
 * moments and to the import of the ZeRO checkpoint, bit for bit. */
ZT_TEST(foreign_deepspeed_universal_variants)
{
    static const char *const all[] = {"llama 3 bf16 3 same", "gpt2 1 bf16 2 fp32"};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        char model[16], dtype[8], accum[8], args[256], dir[32], u[40], st[64], ref[64], a[64],
            b[64], *out;
        int stage, world;
        ZT_CHECK(sscanf(all[i], "%15s %d %7s %d %7s", model, &stage, dtype, &world, accum) == 5);
        snprintf(dir, sizeof dir, "ds%zu", i);
        snprintf(u, sizeof u, "u%zu", i);
        snprintf(args, sizeof args, "ds %s --model %s --stage %d --dtype %s --world %d "
                 "--grad-accum %s", dir, model, stage, dtype, world, accum);
        foreign_ckpt(args);
        snprintf(args, sizeof args, "universal %s %s", dir, u);
        foreign_ckpt(args);
        verify_sound(u, "DeepSpeed universal");
        snprintf(st, sizeof st, "%s.safetensors", u);
        if (zt_zckpt(&out, "consolidate %s -o %s", u, st) != 0)
            ZT_FAIL("consolidate %s: %s", u, out);
        free(out);
        snprintf(ref, sizeof ref, "%s/ref/model.safetensors", dir);
        same_tensors(ref, st, "");
        import_equals_ref(u, model, 2, 1);
        import_equals_ref(dir, model, 2, 1);
        snprintf(a, sizeof a, "imp-%s.safetensors", u);
        snprintf(b, sizeof b, "imp-%s.safetensors", dir);
        same_bytes(a, b);
    }
}

/* dir (a sharded consolidate) holds exactly the tensors of one (the one-file consolidate), bit
 * for bit, each in the file its index names, each shard within limit bytes of data unless it
 * holds one tensor alone; the index's total_size is their sum. Returns the number of shards. */
static size_t shards_equal_one_file(const char *dir, const char *one, uint64_t limit)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_t *ix = json_load_file(path, 0, NULL), *wm = json_object_get(ix, "weight_map");
    ZT_CHECK(ix && json_is_object(wm));
    zfmt__st_file *a;
    ZT_OK(zfmt__st_open(&a, one));
    ZT_CHECK_EQ(json_object_size(wm), a->n);
    uint64_t total = 0;
    size_t n_files = 0;
    for (size_t k = 1;; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s/model-%05zu-of-", dir, k);
        glob_t g;
        char pat[600];
        snprintf(pat, sizeof pat, "%s*.safetensors", name);
        if (glob(pat, 0, NULL, &g) != 0)
            break;
        ZT_CHECK_EQ(g.gl_pathc, (size_t)1);
        zfmt__st_file *b;
        ZT_OK(zfmt__st_open(&b, g.gl_pathv[0]));
        const char *base = strrchr(g.gl_pathv[0], '/') + 1;
        uint64_t data = 0;
        for (size_t i = 0; i < b->n; i++) {
            const zfmt__st_entry *y = &b->e[i], *x = st_entry(a, y->name);
            if (!x)
                ZT_FAIL("%s: '%s' is not in %s", g.gl_pathv[0], y->name, one);
            ZT_CHECK(!strcmp(json_string_value(json_object_get(wm, y->name)), base));
            ZT_CHECK(x->dtype == y->dtype && x->ndim == y->ndim &&
                     !memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape));
            size_t n = (size_t)(x->end - x->begin);
            char *p = malloc(n + 1), *q = malloc(n + 1);
            ZT_OK(zfmt__st_read(a, x, p));
            ZT_OK(zfmt__st_read(b, y, q));
            if (memcmp(p, q, n))
                ZT_FAIL("%s: '%s' differs from %s", g.gl_pathv[0], y->name, one);
            free(p);
            free(q);
            data += n;
        }
        ZT_CHECK(data <= limit || b->n == 1);
        total += data;
        n_files++;
        zfmt__st_free(b);
        globfree(&g);
    }
    ZT_CHECK_EQ((uint64_t)json_integer_value(
                    json_object_get(json_object_get(ix, "metadata"), "total_size")), total);
    fprintf(stderr, "  %s: %zu shards, the %zu tensors of %s\n", dir, n_files, a->n, one);
    zfmt__st_free(a);
    json_decref(ix);
    return n_files;
}

/* consolidate --shard-size of a real DeepSpeed and a real DCP checkpoint: Hugging Face shards
 * equal to the one-file consolidate; refusals of a bad size and an existing output, a zero
 * checkpoint refused; --force replaces an earlier one. */
ZT_TEST(foreign_consolidate_sharded_equals_one_file)
{
    foreign_ckpt("ds ds --model gpt2 --stage 2 --dtype fp32 --world 2");
    foreign_ckpt("dcp dcp --model llama --optim");
    const char *dirs[] = {"ds", "dcp"};
    for (size_t i = 0; i < 2; i++) {
        char *out;
        if (zt_zckpt(&out, "consolidate %s -o %s.safetensors", dirs[i], dirs[i]) != 0)
            ZT_FAIL("consolidate %s: %s", dirs[i], out);
        free(out);
        if (zt_zckpt(&out, "consolidate %s -o out/%s-sh --shard-size 8K", dirs[i], dirs[i]) != 0 ||
            !strstr(out, "sharded model-*.safetensors with their index"))
            ZT_FAIL("consolidate %s --shard-size 8K: %s", dirs[i], out);
        free(out);
        char sh[64], one[64];
        snprintf(sh, sizeof sh, "out/%s-sh", dirs[i]);
        snprintf(one, sizeof one, "%s.safetensors", dirs[i]);
        ZT_CHECK(shards_equal_one_file(sh, one, 8192) > 2);
        /* all in one: model.safetensors, no index */
        ZT_CHECK(zt_zckpt(&out, "consolidate %s -o %s-1 --shard-size 1G", dirs[i], dirs[i]) == 0);
        free(out);
        snprintf(sh, sizeof sh, "%s-1/model.safetensors", dirs[i]);
        same_tensors(one, sh, "");
        snprintf(sh, sizeof sh, "%s-1/model.safetensors.index.json", dirs[i]);
        ZT_CHECK(access(sh, F_OK) < 0);
    }
    char *out;
    ZT_CHECK(zt_zckpt(&out, "consolidate ds -o out/ds-sh --shard-size 8K") == 2 &&
             strstr(out, "out/ds-sh is not empty") && strstr(out, "--force"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "consolidate ds -o out/ds-sh --shard-size 16K --force") == 0);
    free(out);
    ZT_CHECK(shards_equal_one_file("out/ds-sh", "ds.safetensors", 16384) >= 2);
    ZT_CHECK(system("mkdir -p other && touch other/notes.txt") == 0);
    ZT_CHECK(zt_zckpt(&out, "consolidate ds -o other --shard-size 8K --force") == 2 &&
             strstr(out, "holds 'notes.txt', which a sharded consolidate does not write"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "consolidate ds -o x --shard-size 0") == 2 &&
             strstr(out, "--shard-size '0': expected a size"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "consolidate ds -o x --shard-size 12Q") == 2 &&
             strstr(out, "--shard-size '12Q': expected a size"));
    free(out);
    ZT_CHECK(zt_zckpt(&out, "consolidate nothing-here -o x --shard-size 8K") == 2 &&
             strstr(out, "--shard-size applies to a DeepSpeed or DCP checkpoint"));
    free(out);
    ZT_CHECK(access("x", F_OK) < 0 && access("other/notes.txt", F_OK) == 0);
}
