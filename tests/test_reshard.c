/*
 * test_reshard.c: reshard (W -> W' -> W byte-identical, any W' holds the same values,
 * consolidation of any resharding equal to that of the source, bounded buffer, refusal of a
 * corrupt source), diff with tolerances, prune, and the run-directory listing.
 */
#include "ckutil.h"

#include <stdbool.h>
#include <sys/stat.h>

static const uint64_t sizes[] = {70001, 4096, 65, 3, 1000};

static char *reshard(const char *src, const char *out, uint32_t world, size_t buf)
{
    zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
    if (buf)
        o.buf_bytes = buf;
    char *p;
    ZT_OK(zck_reshard(&p, src, out, world, &o));
    return p;
}

static int diff_all_match(const char *a, const char *b)
{
    zck_diff *d;
    ZT_OK(zck_diff_run(&d, a, b, NULL));
    int m = d->all_match;
    zck_diff_free(d);
    return m;
}

ZT_TEST(reshard_roundtrip_is_byte_identical)
{
    zck_layout *L = zt_layout(5, sizes);
    char *src = zt_save("src", L, 4, 9, 5, 0);
    char *c1 = reshard(src, "c1", 1, 0);
    const uint32_t ws[] = {2, 3, 7, 16};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
        char mid[32], back[32];
        snprintf(mid, sizeof mid, "mid%u", ws[i]);
        snprintf(back, sizeof back, "back%u", ws[i]);
        char *m = reshard(src, mid, ws[i], (size_t)2 << 20); /* small buffer: many chunks */
        ZT_CHECK_EQ(zt_verify_count(m, 0), 0);
        zt_check_content(m, 5);
        ZT_CHECK(diff_all_match(src, m));
        char *b = reshard(m, back, 4, 0);
        for (uint32_t r = 0; r < 4; r++) {
            char x[256], y[256];
            snprintf(x, sizeof x, "%s/shard-%05u-of-00004.bin", src, r);
            snprintf(y, sizeof y, "%s/shard-%05u-of-00004.bin", b, r);
            if (!zt_same_file(x, y))
                ZT_FAIL("4 -> %u -> 4: %s differs from %s", ws[i], y, x);
        }
        /* consolidating any resharding gives the same bytes */
        char cm[32];
        snprintf(cm, sizeof cm, "cm%u", ws[i]);
        char *c2 = reshard(m, cm, 1, 0);
        char x[256], y[256];
        snprintf(x, sizeof x, "%s/shard-00000-of-00001.bin", c1);
        snprintf(y, sizeof y, "%s/shard-00000-of-00001.bin", c2);
        ZT_CHECK(zt_same_file(x, y));
        zck_reader *r;
        ZT_OK(zck_reader_open(&r, m));
        ZT_CHECK_EQ(zck_reader_step(r), 9);
        ZT_CHECK_EQ(zck_reader_world(r), ws[i]);
        ZT_CHECK(!strcmp(zck_reader_model_json(r), "{\"arch\":\"test\"}"));
        zck_reader_free(r);
        free(m);
        free(b);
        free(c2);
    }
    free(c1);
    free(src);
    zck_layout_free(L);
}

ZT_TEST(reshard_refuses_corrupt_source_and_existing_step)
{
    zck_layout *L = zt_layout(5, sizes);
    char *src = zt_save("src", L, 2, 3, 1, 0);
    char shard[256];
    snprintf(shard, sizeof shard, "%s/shard-00001-of-00002.bin", src);
    char *p;
    free(reshard(src, "out", 3, 0));
    ZT_ERR(zck_reshard(&p, src, "out", 5, NULL), ZR_EEXIST, "step-00000003");
    zt_flip_byte(shard, 100);
    ZT_ERR(zck_reshard(&p, src, "bad", 3, NULL), ZR_ECORRUPT, "shard-00001-of-00002.bin");
    struct stat st;
    ZT_CHECK(stat("bad/step-00000003", &st) != 0);
    ZT_CHECK(stat("bad/latest", &st) != 0);
    zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
    o.buf_bytes = 1000;
    ZT_ERR(zck_reshard(&p, "out", "x", 2, &o), ZR_EINVAL, "at least 1 MiB per job");
    ZT_ERR(zck_reshard(&p, "out", "x", 0, NULL), ZR_EINVAL, "world size 0");
    free(src);
    zck_layout_free(L);
}

static void copy_fill(void *ctx, const zck_layout *L, size_t g, size_t s, uint64_t start,
                      uint64_t count, void *dst)
{
    (void)L, (void)g, (void)s;
    memcpy(dst, (const float *)ctx + start, count * sizeof(float));
}

/* a one-group checkpoint whose params are the given floats */
static char *save_values(const char *run, const float *v, uint64_t n, uint32_t world)
{
    zck_layout *L;
    ZT_OK(zck_layout_new(&L));
    ZT_OK(zck_layout_add_state(L, "param", ZCK_F32));
    size_t g;
    ZT_OK(zck_layout_add_group(L, &g, "g"));
    ZT_OK(zck_layout_add_tensor(L, g, "w", ZCK_F32, 1, &n));
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = 1;
    o.world = world;
    char *p = zt_save_as(run, L, &o, copy_fill, (void *)v);
    zck_layout_free(L);
    return p;
}

ZT_TEST(diff_tolerances_and_layouts)
{
    float a[300], b[300];
    for (int i = 0; i < 300; i++)
        a[i] = b[i] = (float)i * 0.5f;
    b[7] += 0.001f;
    b[250] = -3.0f;
    char *pa = save_values("a", a, 300, 2), *pb = save_values("b", b, 300, 3);
    zck_diff *d;
    ZT_OK(zck_diff_run(&d, pa, pb, NULL));
    ZT_CHECK(!d->all_match);
    ZT_CHECK_EQ(d->n, 1);
    ZT_CHECK_EQ(d->e[0].n_differ, 2);
    ZT_CHECK(d->e[0].max_abs > 127.9 && d->e[0].max_abs < 128.1); /* 125 vs -3 */
    zck_diff_free(d);
    zck_diff_opts o = ZCK_DIFF_OPTS_INIT;
    o.atol = 0.01;
    ZT_OK(zck_diff_run(&d, pa, pb, &o));
    ZT_CHECK_EQ(d->e[0].n_differ, 1);
    zck_diff_free(d);
    b[250] = a[250];
    char *pc = save_values("c", b, 300, 1);
    ZT_OK(zck_diff_run(&d, pa, pc, &o));
    ZT_CHECK(d->all_match);
    zck_diff_free(d);
    o.atol = 0;
    o.rtol = 1e-3; /* |0.001| <= 1e-3 * 3.5 */
    ZT_OK(zck_diff_run(&d, pa, pc, &o));
    ZT_CHECK(d->all_match);
    zck_diff_free(d);
    /* different layouts: tensors only on one side are reported, never silently equal */
    const uint64_t s2[] = {10, 20};
    zck_layout *L = zt_layout(2, s2);
    char *pz = zt_save("z", L, 2, 1, 1, 0);
    ZT_OK(zck_diff_run(&d, pa, pz, NULL));
    ZT_CHECK(!d->all_match);
    int only_a = 0, only_b = 0;
    for (size_t i = 0; i < d->n; i++) {
        only_a += !strcmp(d->e[i].note, "only in A");
        only_b += !strcmp(d->e[i].note, "only in B");
    }
    ZT_CHECK_EQ(only_a, 1);
    ZT_CHECK_EQ(only_b, 12); /* 4 tensors x 3 states */
    zck_diff_free(d);
    zck_layout_free(L);
    free(pa);
    free(pb);
    free(pc);
    free(pz);
}

ZT_TEST(prune_and_list_runs)
{
    zck_layout *L = zt_layout(2, sizes);
    for (uint64_t s = 10; s <= 80; s += 10)
        free(zt_save("run", L, 2, s, s, 0));
    ZT_CHECK(rename("run/step-00000080", "run/.moved") == 0); /* make 70 latest, 80 orphan */
    ZT_OK(zck_latest_set("run", 70));
    ZT_CHECK(rename("run/.moved", "run/step-00000080") == 0);
    ZT_OK(zck__mkdir_for_tests("run/.tmp-step-00000020-00000000000000ff"));
    zck_namelist rm = {0, NULL};
    zck_prune_opts o = ZCK_PRUNE_OPTS_INIT;
    o.keep_last = 2;
    o.keep_every = 40;
    o.dry_run = 1;
    ZT_OK(zck_prune(&rm, "run", &o));
    ZT_CHECK_EQ(rm.n, 5); /* the tmp dir, 10, 20, 30, 50 */
    zck_namelist_free(&rm);
    struct stat st;
    ZT_CHECK(stat("run/step-00000010", &st) == 0); /* dry run removed nothing */
    o.dry_run = 0;
    ZT_OK(zck_prune(&rm, "run", &o));
    zck_namelist_free(&rm);
    const char *kept[] = {"40", "60", "70", "80"};
    for (int i = 0; i < 4; i++) {
        char p[64];
        snprintf(p, sizeof p, "run/step-000000%s", kept[i]);
        ZT_CHECK(stat(p, &st) == 0);
    }
    ZT_CHECK(stat("run/step-00000050", &st) != 0);
    ZT_CHECK(stat("run/.tmp-step-00000020-00000000000000ff", &st) != 0);

    /* the listing: statuses and latest */
    char p[128];
    snprintf(p, sizeof p, "run/step-00000060/shard-00001-of-00002.bin");
    ZT_CHECK(unlink(p) == 0);
    snprintf(p, sizeof p, "run/step-00000040/shard-00000-of-00002.bin");
    zt_truncate(p, 5000000);
    ZT_OK(zck__mkdir_for_tests("run/.tmp-step-00000090-0000000000000001"));
    zck_run_list *l;
    ZT_OK(zck_run_list_open(&l, "run"));
    ZT_CHECK_EQ(l->n, 4);
    ZT_CHECK(!strcmp(l->latest, "step-00000070"));
    ZT_CHECK_EQ(l->ckpt[0].status, ZCK_CKPT_CORRUPT);    /* 40: longer than listed */
    ZT_CHECK_EQ(l->ckpt[1].status, ZCK_CKPT_INCOMPLETE); /* 60: a shard missing */
    ZT_CHECK_EQ(l->ckpt[2].status, ZCK_CKPT_COMPLETE);
    ZT_CHECK(l->ckpt[2].is_latest);
    ZT_CHECK_EQ(l->ckpt[2].world, 2);
    ZT_CHECK(l->ckpt[2].bytes > 0);
    ZT_CHECK_EQ(l->stale.n, 1); /* no job holds the run: a staging dir at any step is stale */
    ZT_CHECK(!l->holder);
    zck_run_list_free(l);
    ZT_ERR(zck_prune(&rm, "nowhere", &o), ZR_ENOTFOUND, "nowhere");
    zck_layout_free(L);
}
