/*
 * test_hostile.c: crafted files give errors, never hangs (issue 13): FIFOs and other
 * non-regular files where a checkpoint file, a converter input or a data file belongs; symbolic
 * links inside a checkpoint and as step directories; manifests with very many names or too many
 * bytes; training counters the format cannot hold; terminal escapes in names shown by zckpt.
 * Each test arms an alarm, so a hang fails it instead of stalling the run.
 */
#include "ckutil.h"
#include "model.h"
#include "zfmt.h"

#include <jansson.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

static const uint64_t sizes[] = {20000, 65, 3};

static char *fresh(const char *run)
{
    zck_layout *L = zt_layout(3, sizes);
    char *p = zt_save(run, L, 2, 7, 42, 0);
    zck_layout_free(L);
    return p;
}

static char *in(const char *dir, const char *file)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, file);
    return buf[k];
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* CPU time: the machine may be busy */
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* verify finds a problem of kind in file whose detail holds text */
static void expect_problem(const char *ckpt, zck_problem_kind kind, const char *file,
                           const char *text)
{
    zck_report *rep;
    zck_verify_opts o = ZCK_VERIFY_OPTS_INIT;
    ZT_OK(zck_verify(&rep, ckpt, &o));
    for (size_t i = 0; i < zck_report_count(rep); i++) {
        const zck_problem *p = zck_report_get(rep, i);
        if (p->kind == kind && !strcmp(p->file, file) && strstr(p->detail, text)) {
            zck_report_free(rep);
            return;
        }
    }
    for (size_t i = 0; i < zck_report_count(rep); i++)
        fprintf(stderr, "  found: %s: %s: %s\n", zck_report_get(rep, i)->file,
                zck_problem_kind_name(zck_report_get(rep, i)->kind),
                zck_report_get(rep, i)->detail);
    ZT_FAIL("%s: no '%s' problem in %s with '%s'", ckpt, zck_problem_kind_name(kind), file,
            text);
}

/* swap path for a FIFO (the original kept as path.orig) and back */
static void to_fifo(const char *path)
{
    char orig[1100];
    snprintf(orig, sizeof orig, "%s.orig", path);
    ZT_CHECK(rename(path, orig) == 0);
    ZT_CHECK(mkfifo(path, 0644) == 0);
}

static void from_fifo(const char *path)
{
    char orig[1100];
    snprintf(orig, sizeof orig, "%s.orig", path);
    ZT_CHECK(unlink(path) == 0);
    ZT_CHECK(rename(orig, path) == 0);
}

ZT_TEST(hostile_fifo_in_checkpoint)
{
    alarm(30);
    char *p = fresh("run");
    const char *shard = "shard-00001-of-00002.bin";

    to_fifo(in(p, "manifest.json"));
    zck_reader *r = NULL;
    ZT_ERR(zck_reader_open(&r, p), ZR_ECORRUPT, "manifest.json is a FIFO, not a regular file");
    ZT_ERR(zck_reader_open(&r, "run"), ZR_ECORRUPT, "is a FIFO, not a regular file");
    expect_problem(p, ZCK_PROB_MANIFEST, "manifest.json", "is a FIFO");
    from_fifo(in(p, "manifest.json"));

    to_fifo(in(p, "SHA256SUMS"));
    expect_problem(p, ZCK_PROB_IO, "SHA256SUMS", "SHA256SUMS is a FIFO, not a regular file");
    from_fifo(in(p, "SHA256SUMS"));

    to_fifo(in(p, shard));
    expect_problem(p, ZCK_PROB_IO, shard, "a FIFO, not a regular file");
    ZT_ERR(zt_read_all(p, 0), ZR_ECORRUPT, "is a FIFO, not a regular file");
    char hex[65];
    ZT_ERR(zck_sha256_file(hex, in(p, shard), NULL), ZR_ECORRUPT, "is a FIFO");
    from_fifo(in(p, shard));

    to_fifo("run/latest");
    char *lp = NULL;
    ZT_ERR(zck_latest(&lp, "run"), ZR_ECORRUPT, "run/latest is a FIFO, not a regular file");
    ZT_ERR(zck_reader_open(&r, "run"), ZR_ECORRUPT, "is a FIFO");
    from_fifo("run/latest");

    ZT_CHECK_EQ(zt_verify_count(p, 0), 0);
    ZT_CHECK_EQ(zt_read_all(p, 0), 0);
    free(p);
}

ZT_TEST(hostile_fifo_as_input)
{
    alarm(30);
    ZT_CHECK(mkfifo("fifo", 0644) == 0);
    zr_data *d = NULL;
    ZT_ERR(zr_data_open(&d, "fifo", 256, 16, 1), ZR_EINVAL,
           "data file 'fifo': fifo is a FIFO, not a regular file");
    ZT_CHECK(!d);
    ZT_ERR(zfmt_import("fifo", "out", NULL), ZR_ECORRUPT, "fifo is a FIFO, not a regular file");
    zck_report *rep = NULL;
    ZT_ERR(zfmt_archive_verify(&rep, "fifo", NULL), ZR_ECORRUPT, "fifo is a FIFO");
    ZT_ERR(zfmt_unpack("fifo", "unpacked", NULL), ZR_ECORRUPT, "fifo is a FIFO");
    /* a Hugging Face directory whose config.json is a FIFO */
    ZT_CHECK(mkdir("hf", 0755) == 0);
    ZT_CHECK(mkfifo("hf/config.json", 0644) == 0);
    ZT_ERR(zfmt_import("hf", "out", NULL), ZR_ECORRUPT, "config.json is a FIFO");
    /* a character device */
    ZT_ERR(zr_data_open(&d, "/dev/null", 256, 16, 1), ZR_EINVAL,
           "is a character device, not a regular file");
}

/* the rule (docs/FORMAT.md): no file inside a checkpoint may be a symbolic link, and a step
 * directory that is one is not part of its run; the path given to a tool may be one */
ZT_TEST(hostile_symlinks)
{
    alarm(30);
    char *p = fresh("run");
    const char *shard = "shard-00000-of-00002.bin";
    char copy[1100];

    /* a shard linked to a copy of itself: same bytes, still refused by verify and the read */
    snprintf(copy, sizeof copy, "%s.copy", shard);
    ZT_CHECK(rename(in(p, shard), copy) == 0);
    ZT_CHECK(symlink("../../shard-00000-of-00002.bin.copy", in(p, shard)) == 0);
    expect_problem(p, ZCK_PROB_IO, shard, "a symbolic link, not a regular file");
    ZT_ERR(zt_read_all(p, 0), ZR_ECORRUPT, "is a symbolic link, not a regular file");
    ZT_CHECK(unlink(in(p, shard)) == 0);
    ZT_CHECK(rename(copy, in(p, shard)) == 0);

    /* manifest.json linked to a copy */
    ZT_CHECK(rename(in(p, "manifest.json"), "m.copy") == 0);
    ZT_CHECK(symlink("../../m.copy", in(p, "manifest.json")) == 0);
    zck_reader *r = NULL;
    ZT_ERR(zck_reader_open(&r, p), ZR_ECORRUPT, "is a symbolic link, not a regular file");
    ZT_CHECK(unlink(in(p, "manifest.json")) == 0);
    ZT_CHECK(rename("m.copy", in(p, "manifest.json")) == 0);

    /* latest linked to a copy */
    ZT_CHECK(rename("run/latest", "latest.copy") == 0);
    ZT_CHECK(symlink("../latest.copy", "run/latest") == 0);
    ZT_ERR(zck_reader_open(&r, "run"), ZR_ECORRUPT, "is a symbolic link");
    ZT_CHECK(unlink("run/latest") == 0);
    ZT_CHECK(rename("latest.copy", "run/latest") == 0);

    /* a run whose step directory is a link to another run's: not part of it, for every tool */
    ZT_CHECK(mkdir("run2", 0755) == 0);
    ZT_CHECK(symlink("../run/step-00000007", "run2/step-00000007") == 0);
    zt_write_file("run2/latest", "step-00000007\n");
    zck_run_list *l;
    ZT_OK(zck_run_list_open(&l, "run2"));
    ZT_CHECK_EQ(l->n, 0);
    ZT_CHECK_EQ(l->foreign.n, 1);
    ZT_CHECK(!strcmp(l->foreign.name[0], "step-00000007"));
    ZT_CHECK(!l->latest);
    zck_run_list_free(l);
    ZT_ERR(zck_reader_open(&r, "run2"), ZR_ECORRUPT, "a symbolic link: a step directory");
    ZT_ERR(zck_latest_set("run2", 7), ZR_ENOTFOUND, "no such checkpoint directory");
    /* the link's own path is a checkpoint like any other */
    ZT_CHECK_EQ(zt_verify_count("run2/step-00000007", 0), 0);
    ZT_CHECK_EQ(zt_read_all("run2/step-00000007", 0), 0);
    /* retention never follows it either */
    zck_namelist removed = {0};
    zck_prune_opts po = ZCK_PRUNE_OPTS_INIT;
    po.keep_last = 1;
    zck_prune(&removed, "run2", &po);
    zck_namelist_free(&removed);
    struct stat st;
    ZT_CHECK(lstat("run2/step-00000007", &st) == 0 && S_ISLNK(st.st_mode));
    ZT_CHECK_EQ(zt_verify_count(p, 0), 0);
    free(p);
}

/* A manifest of W ranks, each holding one element of one group of nt one-element tensors. */
static char *big_manifest(uint32_t W, size_t nt, const char *dup_tensor)
{
    json_t *root = json_object(), *groups = json_array(), *tens = json_array(),
           *shards = json_array();
    for (size_t t = 0; t < nt; t++) {
        char nm[64];
        snprintf(nm, sizeof nm, "t%zu", t);
        if (dup_tensor && t == nt - 1)
            snprintf(nm, sizeof nm, "%s", dup_tensor);
        json_array_append_new(tens, json_pack("{s:s, s:s, s:[i], s:I}", "name", nm, "dtype",
                                              "f32", "shape", 1, "offset", (json_int_t)t));
    }
    json_array_append_new(groups, json_pack("{s:s, s:I, s:o}", "name", "g", "numel",
                                            (json_int_t)nt, "tensors", tens));
    /* rank r holds elements [r * nt / W, (r + 1) * nt / W) */
    for (uint32_t r = 0; r < W; r++) {
        size_t a = (size_t)r * nt / W, b = (size_t)(r + 1) * nt / W;
        char file[64];
        snprintf(file, sizeof file, "shard-%05u.bin", r);
        json_t *ext = json_array();
        if (b > a)
            json_array_append_new(ext, json_pack("{s:i, s:i, s:I, s:I, s:i}", "group", 0,
                                                 "state", 0, "start", (json_int_t)a, "count",
                                                 (json_int_t)(b - a), "offset", 0));
        json_int_t bytes = b > a ? ((json_int_t)(b - a) * 4 + 4095) / 4096 * 4096 : 0;
        json_array_append_new(shards, json_pack("{s:s, s:i, s:I, s:s, s:o}", "file", file,
                                                "rank", (int)r, "bytes", bytes, "sha256",
                                                "0000000000000000000000000000000000000000000000"
                                                "000000000000000000", "extents", ext));
    }
    json_object_set_new(root, "format", json_string("zckpt"));
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "step", json_integer(1));
    json_object_set_new(root, "created", json_string("now"));
    json_object_set_new(root, "producer", json_string("test"));
    json_object_set_new(root, "world_size", json_integer(W));
    json_object_set_new(root, "zero_stage", json_integer(3));
    json_object_set_new(root, "partition_align", json_integer(1));
    json_object_set_new(root, "file_align", json_integer(4096));
    json_object_set_new(root, "model", json_object());
    json_object_set_new(root, "training", json_object());
    json_object_set_new(root, "dtypes", json_pack("{s:i}", "f32", 4));
    json_object_set_new(root, "states", json_pack("[{s:s, s:s}]", "name", "param", "dtype",
                                                  "f32"));
    json_object_set_new(root, "groups", groups);
    json_object_set_new(root, "shards", shards);
    char *txt = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    ZT_CHECK(txt);
    return txt;
}

ZT_TEST(hostile_manifest_many_names_is_fast)
{
    alarm(60);
    /* 40k tensors and 10k shards: the quadratic checks took 4 s of CPU (80k: 15 s) */
    char *txt = big_manifest(10000, 40000, NULL);
    double t0 = cpu_s();
    zck_reader *r = NULL;
    ZT_OK(zck_reader_open_manifest(&r, txt, strlen(txt), "big"));
    double dt = cpu_s() - t0;
    zck_reader_free(r);
    fprintf(stderr, "  40000 tensors, 10000 shards: parsed in %.3f s of CPU\n", dt);
    ZT_CHECK(dt < 1.5);
    free(txt);

    /* a duplicate among them is still found, and named */
    txt = big_manifest(4, 40000, "t17");
    ZT_ERR(zck_reader_open_manifest(&r, txt, strlen(txt), "dup"), ZR_ECORRUPT,
           "tensor 't17' declared twice");
    free(txt);

    /* verify of a world-10000 checkpoint with no shard on disk: SHA256SUMS lines and
     * directory entries looked up by name, not by a scan of the shard list */
    txt = big_manifest(10000, 10000, NULL);
    ZT_CHECK(mkdir("ck", 0755) == 0);
    zt_write_file("ck/manifest.json", txt);
    free(txt);
    size_t cap = 10001 * 100, n = 0;
    char *sums = malloc(cap);
    char mhex[65];
    ZT_OK(zck_sha256_file(mhex, "ck/manifest.json", NULL));
    n += (size_t)snprintf(sums + n, cap - n, "%s  manifest.json\n", mhex);
    for (unsigned rk = 0; rk < 10000; rk++)
        n += (size_t)snprintf(sums + n, cap - n, "%064d  shard-%05u.bin\n", 0, rk);
    zt_write_file("ck/SHA256SUMS", sums);
    free(sums);
    t0 = cpu_s();
    zck_report *rep;
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    ZT_OK(zck_verify(&rep, "ck", &vo));
    dt = cpu_s() - t0;
    fprintf(stderr, "  verify of 10000 missing shards in %.3f s of CPU\n", dt);
    ZT_CHECK_EQ(zck_report_count(rep), 10000);
    ZT_CHECK_EQ(zck_report_get(rep, 0)->kind, ZCK_PROB_MISSING);
    zck_report_free(rep);
    ZT_CHECK(dt < 1.5);
}

ZT_TEST(hostile_manifest_too_big)
{
    alarm(30);
    char *p = fresh("run");
    /* 65 MiB, sparse: refused by its size before a byte is read or parsed */
    FILE *f = fopen(in(p, "manifest.json"), "r+");
    ZT_CHECK(f && ftruncate(fileno(f), (off_t)65 << 20) == 0);
    fclose(f);
    zck_reader *r = NULL;
    ZT_ERR(zck_reader_open(&r, p), ZR_ECORRUPT, "68157440 bytes, more than the 67108864");
    free(p);
}

/* The manifest text of p with `insert` put right after the opening brace of the first match of
 * `at` (or at the top when at is NULL), written back. */
static void manifest_insert(const char *p, const char *at, const char *insert)
{
    char *t = NULL;
    ZT_OK(zck__read_small_for_tests(&t, in(p, "manifest.json")));
    char *pos = at ? strstr(t, at) : t;
    ZT_CHECK(pos != NULL);
    pos = strchr(pos, '{');
    ZT_CHECK(pos != NULL);
    size_t a = (size_t)(pos + 1 - t), n = strlen(t), k = strlen(insert);
    char *u = malloc(n + k + 1);
    ZT_CHECK(u != NULL);
    memcpy(u, t, a);
    memcpy(u + a, insert, k);
    memcpy(u + a + k, t + a, n - a + 1);
    zt_write_file(in(p, "manifest.json"), u);
    free(u);
    free(t);
}

/* "\"<key>\": [<n> times item]," */
static char *bulk(const char *key, const char *item, size_t n)
{
    size_t k = strlen(item), cap = strlen(key) + n * (k + 1) + 16;
    char *b = malloc(cap);
    ZT_CHECK(b != NULL);
    size_t w = (size_t)sprintf(b, "\"%s\": [", key);
    for (size_t i = 0; i < n; i++) {
        memcpy(b + w, item, k);
        w += k;
        b[w++] = i + 1 < n ? ',' : ']';
    }
    strcpy(b + w, ",");
    return b;
}

/* A manifest that is mostly what the format does not define (an unknown field of 22 million
 * empty objects in 64 MiB cost 5 GB and 10 s to parse, and was accepted) is refused before it is
 * parsed, naming the file and the field; so are bulk in an unknown field of a tensor, items of
 * no kind in a known list, and a bulky training section. A few unknown values (a later minor
 * version's field) are still accepted. */
ZT_TEST(hostile_manifest_unknown_bulk_refused_before_parsing)
{
    alarm(60);
    static const struct {
        const char *at, *key, *item, *msg;
        size_t n;
    } cases[] = {
        {NULL, "junk", "{}", "manifest.json: field 'junk': more than 65536 JSON values that the "
                             "format does not define", 22000000},
        {"\"tensors\"", "x", "[]", "field 'groups[0].tensors[0].x': more than 65536", 70000},
        {"\"training\"", "h", "0", "field 'training': more than 65536 JSON values in this "
                                   "section", 70000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char run[32];
        snprintf(run, sizeof run, "run%zu", i);
        char *p = fresh(run), *b = bulk(cases[i].key, cases[i].item, cases[i].n);
        manifest_insert(p, cases[i].at, b);
        free(b);
        double t0 = zt_now_s();
        zck_reader *r = NULL;
        ZT_ERR(zck_reader_open(&r, p), ZR_ECORRUPT, cases[i].msg);
        if (zt_now_s() - t0 > 5)
            ZT_FAIL("case %zu: refused only after %.1f s", i, zt_now_s() - t0);
        free(p);
    }
    /* items of no kind: 70000 empty objects after the real groups */
    char *p = fresh("items");
    char *t = NULL;
    ZT_OK(zck__read_small_for_tests(&t, in(p, "manifest.json")));
    char *g = strstr(t, "\"groups\": [");
    ZT_CHECK(g != NULL);
    char *b = bulk("x", "{}", 70000);
    b[strlen(b) - 2] = ','; /* "\"x\": [{},...,{}," : the items, then the real groups */
    g += strlen("\"groups\": [");
    size_t a = (size_t)(g - t), n = strlen(t), k = strlen(b) - 6; /* without "\"x\": [" */
    char *u = malloc(n + k + 1);
    ZT_CHECK(u != NULL);
    memcpy(u, t, a);
    memcpy(u + a, b + 6, k);
    memcpy(u + a + k, t + a, n - a + 1);
    zt_write_file(in(p, "manifest.json"), u);
    free(u);
    free(b);
    free(t);
    zck_reader *r = NULL;
    ZT_ERR(zck_reader_open(&r, p), ZR_ECORRUPT, "field 'groups[65536]': more than 65536");
    free(p);
    /* a few unknown values are a later version's fields: read */
    p = fresh("few");
    b = bulk("note", "{\"a\": [1, 2]}", 1000);
    manifest_insert(p, NULL, b);
    free(b);
    ZT_OK(zck_reader_open(&r, p));
    zck_reader_free(r);
    free(p);
}

/* commit a world-1 checkpoint of L with these sections */
static int commit_with(const char *run, const zck_layout *L, uint64_t step, const char *training,
                       const char *producer)
{
    char *staging, *final = NULL;
    static uint64_t nonce;
    ZT_OK(zck_staging_create(&staging, run, step, ++nonce));
    zck_shard *sh = zt_write_rank(staging, L, 1, 0, 5, NULL);
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = step;
    o.training_json = training;
    o.producer = producer;
    int rc = zck_commit(&final, run, staging, L, &sh, 1, &o);
    zck_shard_free(sh);
    free(staging);
    free(final);
    return rc;
}

ZT_TEST(hostile_training_counters)
{
    alarm(30);
    zck_layout *L = zt_layout(3, sizes);
    /* on write: a counter wrapped past 2^63 (written as negative), or too near it */
    ZT_ERR(commit_with("run", L, 1, "{\"next_sample\": -9223372036854775800}", NULL),
           ZR_EINVAL, "training.next_sample: -9223372036854775800 out of range [0, 2^62]");
    ZT_ERR(commit_with("run", L, 1, "{\"optimizer_step\": 9223372036854775807}", NULL),
           ZR_EINVAL, "training.optimizer_step");
    ZT_OK(commit_with("run", L, 1, "{\"optimizer_step\": 1, \"next_sample\": 4611686018427387904}",
                      NULL));
    /* on read: hand-edited to just below 2^63 */
    char *txt = zt_slurp("run/step-00000001/manifest.json");
    char *at = strstr(txt, "4611686018427387904");
    ZT_CHECK(at);
    char *edited = malloc(strlen(txt) + 8);
    snprintf(edited, strlen(txt) + 8, "%.*s9223372036854775807%s", (int)(at - txt), txt,
             at + 19);
    zck_reader *r = NULL;
    ZT_ERR(zck_reader_open_manifest(&r, edited, strlen(edited), "m"), ZR_ECORRUPT,
           "m: training.next_sample: 9223372036854775807 out of range");
    snprintf(edited, strlen(txt) + 8, "%.*s\"many\"%s", (int)(at - txt), txt, at + 19);
    ZT_ERR(zck_reader_open_manifest(&r, edited, strlen(edited), "m"), ZR_ECORRUPT,
           "training.next_sample: expected an integer, found a string");
    free(edited);
    free(txt);
    zck_layout_free(L);
}

static void no_escape(const char *args)
{
    char *o;
    zt_zckpt(&o, "%s", args);
    if (strchr(o, '\033'))
        ZT_FAIL("zckpt %s printed an escape character:\n%s", args, o);
    if (!strstr(o, "?[2J"))
        ZT_FAIL("zckpt %s: the name is not shown sanitized:\n%s", args, o);
    free(o);
}

ZT_TEST(hostile_terminal_escapes)
{
    alarm(60);
    zt_bin("ZT_ZCKPT"); /* skips the test when unset */
    zck_layout *L;
    ZT_OK(zck_layout_new(&L));
    ZT_OK(zck_layout_add_state(L, "param", ZCK_F32));
    size_t g;
    uint64_t n = 10;
    ZT_OK(zck_layout_add_group(L, &g, "g\033[2J"));
    ZT_OK(zck_layout_add_tensor(L, g, "w\033[2J\033]0;title\007", ZCK_F32, 1, &n));
    ZT_OK(commit_with("a", L, 1, NULL, "evil\033[2J"));
    ZT_OK(commit_with("b", L, 1, NULL, "evil\033[2J"));
    zck_layout_free(L);
    no_escape("inspect --tensors a");
    no_escape("diff --all a b");
    /* the same names inside an error message */
    char *txt = zt_slurp("a/step-00000001/manifest.json");
    char *at = strstr(txt, "\"zckpt\"");
    ZT_CHECK(at);
    char *edited = malloc(strlen(txt) + 16);
    sprintf(edited, "%.*s\"\\u001b[2J\"%s", (int)(at - txt), txt, at + 7);
    zt_write_file("a/step-00000001/manifest.json", edited); /* the format name, quoted */
    free(edited);
    free(txt);
    no_escape("inspect a");
}

/* a FIFO planted as a run directory's lock file: zrun and zckpt ls answer at once */
ZT_TEST(hostile_fifo_lock_file_never_hangs)
{
    alarm(30);
    ZT_CHECK(mkdir("run", 0755) == 0);
    ZT_CHECK(mkfifo("run/.lock", 0644) == 0);
    char *holder = NULL;
    ZT_OK(zck_run_lock_holder(&holder, "run"));
    ZT_CHECK(holder == NULL);
    zck_lock *lk = NULL;
    ZT_ERR(zck_run_lock(&lk, "run", "test"), ZR_ECORRUPT, "not a regular file");
    alarm(0);
}

/* A layout of the model's shape but `g` remade: group `g` holds `n` tensors (name, numel) */
static zck_layout *layout_with(const zck_layout *src, size_t g_new, const char *const *names,
                               const uint64_t *numels, size_t n)
{
    zck_layout *L;
    ZT_OK(zck_layout_new(&L));
    ZT_OK(zck_layout_add_state(L, "param", ZCK_F32));
    for (size_t g = 0; g < zck_layout_n_groups(src); g++) {
        size_t gi;
        ZT_OK(zck_layout_add_group(L, &gi, zck_layout_group_name(src, g)));
        if (g == g_new) {
            for (size_t t = 0; t < n; t++)
                ZT_OK(zck_layout_add_tensor(L, gi, names[t], ZCK_F32, 1, &numels[t]));
            continue;
        }
        for (size_t t = 0; t < zck_layout_group_n_tensors(src, g); t++) {
            zck_tensor_info ti;
            zck_layout_tensor(src, g, t, &ti);
            ZT_OK(zck_layout_add_tensor(L, gi, ti.name, ti.dtype, ti.ndim, ti.shape));
        }
    }
    return L;
}

/* A checkpoint whose layout differs from the model's inside a group says what differs (it said
 * "group 6 is 'ln_f' of 256 elements, this model expects 'ln_f' of 256": issue 24). */
ZT_TEST(hostile_layout_mismatch_names_the_difference)
{
    zr_gpt2_config c;
    ZT_OK(zr_gpt2_config_parse(&c, "gpt2:layers=4,heads=2,dim=128,ctx=32,vocab=256"));
    zck_layout *want;
    ZT_OK(zr_gpt2_layout(&want, &c));
    ZT_OK(zr_gpt2_layout_check(want, want, "ck"));
    /* ln_f as one tensor of 256 elements (an RMSNorm's weight) where the model has weight and
     * bias of 128 each */
    const char *one[] = {"ln_f.weight"};
    const uint64_t n256[] = {256};
    zck_layout *L = layout_with(want, 6, one, n256, 1);
    ZT_ERR(zr_gpt2_layout_check(L, want, "ck"), ZR_EINVAL,
           "ck: group 6 'ln_f', tensor 0: the checkpoint has 'ln_f.weight' [256] f32 at element "
           "0, this model 'ln_f.weight' [128] f32 at 0 (another model shape)");
    zck_layout_free(L);
    /* the same tensors, then one more */
    const char *three[] = {"ln_f.weight", "ln_f.bias", "ln_f.extra"};
    const uint64_t n3[] = {128, 128, 4};
    L = layout_with(want, 6, three, n3, 3);
    ZT_ERR(zr_gpt2_layout_check(L, want, "ck"), ZR_EINVAL,
           "ck: group 6 'ln_f' holds 3 tensors, this model's 2: the checkpoint has 'ln_f.extra' "
           "[4] f32");
    zck_layout_free(L);
    /* one fewer */
    L = layout_with(want, 6, three, n3, 1);
    ZT_ERR(zr_gpt2_layout_check(L, want, "ck"), ZR_EINVAL,
           "holds 1 tensor, this model's 2: the checkpoint lacks 'ln_f.bias' [128] f32");
    zck_layout_free(L);
    zck_layout_free(want);
}

/* ---------------------------------------------------------------- cheap checks first */

/* run/step-00000005: a 12 TiB shard (sparse) that its manifest lists consistently (one group of
 * 3 * 2^40 f32 elements), and a model section (a small GPT-2) that the layout contradicts: a
 * defect found in microseconds, behind hours of hashing. */
static void huge_ckpt(void)
{
    const uint64_t numel = (uint64_t)3 << 40, bytes = numel * 4;
    char *text = NULL, sums[256];
    if (asprintf(&text, "{\"format\":\"zckpt\",\"version\":\"1.0\",\"step\":5,\"created\":\"x\","
                 "\"producer\":\"test\",\"world_size\":1,\"zero_stage\":0,"
                 "\"partition_align\":64,\"file_align\":4096,\"model\":{\"arch\":\"gpt2\","
                 "\"layers\":2,\"heads\":2,\"dim\":32,\"ctx\":32,\"vocab\":256},"
                 "\"training\":{},\"dtypes\":{\"f32\":4},\"states\":[{\"name\":\"param\","
                 "\"dtype\":\"f32\"}],\"groups\":[{\"name\":\"wte\",\"numel\":%llu,\"tensors\":"
                 "[{\"name\":\"wte.weight\",\"dtype\":\"f32\",\"shape\":[%llu],\"offset\":0}]}],"
                 "\"shards\":[{\"file\":\"shard-00000-of-00001.bin\",\"rank\":0,\"bytes\":%llu,"
                 "\"sha256\":\"%064d\",\"extents\":[{\"group\":0,\"state\":0,\"start\":0,"
                 "\"count\":%llu,\"offset\":0}]}]}\n", (unsigned long long)numel,
                 (unsigned long long)numel, (unsigned long long)bytes, 0,
                 (unsigned long long)numel) < 0)
        ZT_FAIL("out of memory");
    ZT_CHECK(system("mkdir -p run/step-00000005") == 0);
    zt_write_file("run/step-00000005/manifest.json", text);
    FILE *f = fopen("run/step-00000005/shard-00000-of-00001.bin", "w");
    ZT_CHECK(f && ftruncate(fileno(f), (off_t)bytes) == 0);
    fclose(f);
    zck_sha256 *h = NULL;
    char hex[65];
    ZT_OK(zck_sha256_new(&h));
    zck_sha256_update(h, text, strlen(text));
    zck_sha256_hex(h, hex);
    zck_sha256_free(h);
    free(text);
    snprintf(sums, sizeof sums, "%064d  shard-00000-of-00001.bin\n%s  manifest.json\n", 0, hex);
    zt_write_file("run/step-00000005/SHA256SUMS", sums);
    ZT_OK(zck_latest_set("run", 5));
}

#define CONTRADICTS "its model section"

/* Every way of checking a checkpoint refuses it at once for the cheap defect, without hashing
 * the 12 TiB first: zck_verify (full, cheap first), the resume check, zckpt verify and audit,
 * zrun --resume PATH and --resume auto (nothing moved: only a pick that verifies is kept;
 * here the only one is damaged), zgen. */
ZT_TEST(hostile_cheap_defect_refused_before_hashing_a_huge_shard)
{
    alarm(120);
    huge_ckpt();
    double t0 = zt_now_s();
    zck_report *rep = NULL;
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    vo.cheap_first = 1;
    ZT_OK(zck_verify(&rep, "run", &vo));
    ZT_CHECK(zck_report_count(rep) == 1 && zck_report_hash_skipped(rep) &&
             strstr(zck_report_get(rep, 0)->detail, CONTRADICTS));
    zck_report_free(rep);
    char *out = NULL;
    zck_resume_opts ro = ZCK_RESUME_OPTS_INIT;
    ZT_ERR(zck_resume_check(&out, "run", &ro), ZR_ECORRUPT, CONTRADICTS);
    ZT_CHECK(zt_now_s() - t0 < 10);
    char *o = NULL;
    if (getenv("ZT_ZCKPT")) {
        t0 = zt_now_s();
        ZT_CHECK_EQ(zt_zckpt(&o, "verify run"), 1);
        ZT_CHECK(strstr(o, CONTRADICTS) && strstr(o, "the shards were not hashed"));
        free(o);
        ZT_CHECK_EQ(zt_zckpt(&o, "audit run/step-00000005"), 1);
        ZT_CHECK(strstr(o, CONTRADICTS) != NULL);
        free(o);
        ZT_CHECK(zt_now_s() - t0 < 20);
    }
    if (getenv("ZT_ZRUN")) {
        t0 = zt_now_s();
        const char *m = "--model gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256 --batch 4 "
                        "--threads 1 --steps 6";
        ZT_CHECK(zt_zrunf("a.log", "%s --ckpt-dir out --resume run/step-00000005", m) != 0);
        zt_file_has("a.log", CONTRADICTS);
        ZT_CHECK(zt_zrunf("b.log", "%s --ckpt-dir run", m) != 0);
        zt_file_has("b.log", CONTRADICTS);
        ZT_CHECK(zt_now_s() - t0 < 20);
    }
    if (getenv("ZT_ZGEN")) {
        ZT_CHECK(zt_run(&o, getenv("ZT_ZGEN"), "run --prompt-ids 1,2 --tokens 2") != 0);
        ZT_CHECK(strstr(o, CONTRADICTS) != NULL);
        free(o);
    }
    struct stat st;
    ZT_CHECK(stat("run/step-00000005", &st) == 0);
}
