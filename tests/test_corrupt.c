/*
 * test_corrupt.c: every class of damage is found by verify, named with its file and kind, and
 * a verified read refuses to hand out data from a damaged checkpoint.
 */
#include "ckutil.h"

#include <stdatomic.h>
#include <sys/stat.h>

static const uint64_t sizes[] = {20000, 65, 3};

static char *fresh(const char *run)
{
    zck_layout *L = zt_layout(3, sizes);
    char *p = zt_save(run, L, 3, 7, 42, 0);
    zck_layout_free(L);
    ZT_CHECK_EQ(zt_verify_count(p, 0), 0);
    return p;
}

/* verify must find exactly one problem, of this kind, in this file */
static void expect_one(const char *ckpt, int quick, zck_problem_kind kind, const char *file,
                       const char *detail)
{
    zck_report *rep;
    zck_verify_opts o = ZCK_VERIFY_OPTS_INIT;
    o.quick = quick;
    ZT_OK(zck_verify(&rep, ckpt, &o));
    zt_expect_one_problem(rep, ckpt, kind, file, detail);
}

/* a full verified read must fail with code and a message naming file */
static void expect_read_fails(const char *ckpt, int code, const char *file, const char *text)
{
    ZT_ERR(zt_read_all(ckpt, 1), code, text);
    ZT_CHECK(strstr(zr_err_msg(), file));
}

static char *in(const char *ckpt, const char *file)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", ckpt, file);
    return buf;
}

ZT_TEST(corrupt_missing_shard)
{
    char *p = fresh("run");
    ZT_CHECK(unlink(in(p, "shard-00001-of-00003.bin")) == 0);
    expect_one(p, 1, ZCK_PROB_MISSING, "shard-00001-of-00003.bin", "not on disk");
    expect_one(p, 0, ZCK_PROB_MISSING, "shard-00001-of-00003.bin", "not on disk");
    expect_read_fails(p, ZR_ENOTFOUND, "shard-00001-of-00003.bin", "No such file");
    free(p);
}

ZT_TEST(corrupt_truncated_and_extended_shards)
{
    char *p = fresh("run");
    struct stat st;
    ZT_CHECK(stat(in(p, "shard-00000-of-00003.bin"), &st) == 0);
    zt_truncate(in(p, "shard-00000-of-00003.bin"), (uint64_t)st.st_size - 4096);
    expect_one(p, 1, ZCK_PROB_TRUNCATED, "shard-00000-of-00003.bin", "manifest lists");
    expect_read_fails(p, ZR_ECORRUPT, "shard-00000-of-00003.bin", "truncated");
    zt_truncate(in(p, "shard-00000-of-00003.bin"), (uint64_t)st.st_size + 1);
    expect_one(p, 0, ZCK_PROB_SIZE, "shard-00000-of-00003.bin", NULL);
    expect_read_fails(p, ZR_ECORRUPT, "shard-00000-of-00003.bin", "size mismatch");
    free(p);
}

ZT_TEST(corrupt_bit_flip)
{
    char *p = fresh("run");
    zt_flip_byte(in(p, "shard-00002-of-00003.bin"), 5000);
    ZT_CHECK_EQ(zt_verify_count(p, 1), 0); /* quick does not hash */
    expect_one(p, 0, ZCK_PROB_HASH, "shard-00002-of-00003.bin", "sha256");
    expect_read_fails(p, ZR_ECORRUPT, "shard-00002-of-00003.bin", "sha256 mismatch");
    /* the same read without verification returns (damaged) data: the caller asked for that */
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, p));
    float x[10];
    ZT_OK(zck_reader_read_range(r, 0, 0, 0, 10, x));
    zck_reader_free(r);
    free(p);
}

ZT_TEST(corrupt_unlisted_file_and_sums)
{
    char *p = fresh("run");
    zt_write_file(in(p, "stray.bin"), "x");
    expect_one(p, 1, ZCK_PROB_UNLISTED, "stray.bin", "not named by the manifest");
    ZT_CHECK(unlink(in(p, "stray.bin")) == 0);
    /* SHA256SUMS edited: one digit of the first shard's line */
    char *txt;
    ZT_OK(zck__read_small_for_tests(&txt, in(p, "SHA256SUMS")));
    char *line = strstr(txt, "shard-00000");
    ZT_CHECK(line);
    char *hexp = line - 66;
    *hexp = *hexp == 'a' ? 'b' : 'a';
    zt_write_file(in(p, "SHA256SUMS"), txt);
    expect_one(p, 1, ZCK_PROB_SUMS, "SHA256SUMS", "shard-00000-of-00003.bin");
    ZT_CHECK(unlink(in(p, "SHA256SUMS")) == 0);
    expect_one(p, 1, ZCK_PROB_SUMS, "SHA256SUMS", "missing");
    free(txt);
    free(p);
}

ZT_TEST(corrupt_hand_edited_manifest)
{
    char *p = fresh("run");
    char *txt;
    ZT_OK(zck__read_small_for_tests(&txt, in(p, "manifest.json")));
    /* an edit that keeps the manifest valid is caught by the manifest's line in SHA256SUMS */
    char *at = strstr(txt, "\"step\": 7");
    ZT_CHECK(at);
    at[8] = '8';
    zt_write_file(in(p, "manifest.json"), txt);
    expect_one(p, 1, ZCK_PROB_SUMS, "manifest.json", "edited after the commit");
    /* an edit that breaks it is a bad manifest, and nothing can be opened */
    at = strstr(txt, "\"world_size\": 3");
    ZT_CHECK(at);
    at[14] = '2';
    zt_write_file(in(p, "manifest.json"), txt);
    expect_one(p, 1, ZCK_PROB_MANIFEST, "manifest.json", "3 shards listed for world size 2");
    zck_reader *r;
    ZT_ERR(zck_reader_open(&r, p), ZR_ECORRUPT, "manifest.json");
    free(txt);
    free(p);
}

ZT_TEST(corrupt_several_problems_all_reported)
{
    char *p = fresh("run");
    ZT_CHECK(unlink(in(p, "shard-00000-of-00003.bin")) == 0);
    zt_flip_byte(in(p, "shard-00001-of-00003.bin"), 0);
    zt_write_file(in(p, "extra"), "x");
    ZT_CHECK_EQ(zt_verify_count(p, 0), 3);
    zck_report *rep;
    ZT_ERR(zck_verify(&rep, "nowhere", NULL), ZR_ENOTFOUND, "nowhere");
    free(p);
}

/* ---------------------------------------------------------------- pruned while read */

/* When the file whose path ends in ctx's suffix is opened, the checkpoint directory is removed
 * first (what the retention of another job's zrun does between zckpt's listing and its read). */
typedef struct {
    const char *suffix, *dir;
    atomic_int claimed; /* shards are opened by several threads */
    int fired;          /* read after the threads are joined */
} prune_ctx;

static int prune_on_open(zck_op op, const char *path, void *vctx)
{
    prune_ctx *c = vctx;
    size_t n = strlen(path), k = strlen(c->suffix);
    if (op == ZCK_OP_OPEN && n >= k && !strcmp(path + n - k, c->suffix) &&
        !atomic_exchange(&c->claimed, 1)) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
        c->fired = system(cmd) == 0;
    }
    return 0;
}

/* every element of state 0 through an open reader, verified */
static int read_all_reader(zck_reader *r)
{
    const zck_layout *L = zck_reader_layout(r);
    size_t ng = zck_layout_n_groups(L);
    zck_read_req q[3];
    for (size_t g = 0; g < ng; g++) {
        uint64_t n = zck_layout_group_numel(L, g);
        q[g] = (zck_read_req){g, 0, 0, n, malloc(n * 4)};
        ZT_CHECK(q[g].dst);
    }
    int rc = zck_reader_read(r, q, ng, NULL);
    for (size_t g = 0; g < ng; g++)
        free(q[g].dst);
    return rc;
}

#define VANISHED "the checkpoint directory vanished while it was being read"

/* A checkpoint removed while it is read (pruned by retention) is said to be that, with no
 * verdict of damage (no problem kind, no "run zckpt verify"): verify, open, a verified read, the
 * verify a reshard does first, the resume check; and zckpt verify --all skips it saying so. */
ZT_TEST(corrupt_pruned_while_read_is_no_damage)
{
    static const char *files[] = {"manifest.json", "SHA256SUMS", "shard-00001-of-00003.bin"};
    for (size_t f = 0; f < 3; f++) {
        for (int how = 0; how < 4; how++) {
            char run[32];
            snprintf(run, sizeof run, "run%zu%d", f, how);
            char *p = fresh(run);
            if (how == 1 && f == 1) { /* an open reads no SHA256SUMS */
                free(p);
                continue;
            }
            zck_reader *r = NULL;
            if (how == 1 && f == 2)
                ZT_OK(zck_reader_open(&r, p)); /* a read: opened before the prune */
            prune_ctx c = {files[f], p, 0, 0};
            zck_fault_set(prune_on_open, &c);
            zck_report *rep = NULL;
            int rc = 0;
            char *out = NULL;
            if (how == 0)
                rc = zck_verify(&rep, p, NULL);
            else if (how == 1 && f == 2)
                rc = read_all_reader(r);
            else if (how == 1)
                rc = zck_reader_open(&r, p);
            else if (how == 2)
                rc = zck_reshard(&out, p, "out", 2, NULL);
            else {
                zck_resume_opts ro = ZCK_RESUME_OPTS_INIT;
                rc = zck_resume_check(&out, p, &ro);
            }
            zck_fault_set(NULL, NULL);
            if (!c.fired || rc != ZR_ENOTFOUND || !strstr(zr_err_msg(), VANISHED) ||
                strstr(zr_err_msg(), "zckpt verify") || strstr(zr_err_msg(), "mismatch"))
                ZT_FAIL("%s removed at the open of %s, way %d: %s (%s); expected ZR_ENOTFOUND "
                        "saying it vanished", p, files[f], how, zr_err_name(rc), zr_err_msg());
            zck_report_free(rep);
            zck_reader_free(r);
            free(out);
            free(p);
        }
    }
}
