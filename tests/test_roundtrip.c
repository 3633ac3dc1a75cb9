/*
 * test_roundtrip.c: partition arithmetic, and save -> read for many world sizes and group sizes
 * (groups smaller than W, sizes not divisible by W), ranges crossing shard boundaries.
 */
#include "ckutil.h"

#include <pthread.h>

ZT_TEST(partition_tiles_every_group)
{
    const uint64_t sizes[] = {1, 2, 63, 64, 65, 127, 1000, 4097, 100003};
    const uint32_t worlds[] = {1, 2, 3, 4, 7, 16, 64};
    const uint32_t aligns[] = {1, 8, 64};
    for (size_t a = 0; a < 3; a++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++) {
                uint64_t expect = 0, P = 0;
                for (uint32_t r = 0; r < worlds[w]; r++) {
                    uint64_t s, n;
                    zck_partition(sizes[i], worlds[w], r, aligns[a], &s, &n);
                    if (r == 0)
                        P = n;
                    ZT_CHECK_EQ(s, expect < sizes[i] ? expect : sizes[i]);
                    ZT_CHECK(n <= P);
                    if (s + n < sizes[i])
                        ZT_CHECK_EQ(n, P); /* only the tail partitions are short */
                    expect = s + n;
                }
                ZT_CHECK_EQ(expect, sizes[i]);
                ZT_CHECK_EQ(P % aligns[a] == 0 || P == sizes[i], 1);
                ZT_CHECK(P * worlds[w] >= sizes[i]);
            }
    uint64_t s, n;
    zck_partition(100, 4, 1, 64, &s, &n); /* P = 64: rank 1 gets the 36 left, 2 and 3 nothing */
    ZT_CHECK_EQ(s, 64);
    ZT_CHECK_EQ(n, 36);
    zck_partition(100, 4, 3, 64, &s, &n);
    ZT_CHECK_EQ(s, 100);
    ZT_CHECK_EQ(n, 0);
}

ZT_TEST(roundtrip_many_worlds)
{
    const uint64_t sizes[] = {1, 63, 65, 1000, 100003, 7};
    const uint32_t worlds[] = {1, 2, 3, 4, 7, 16};
    zck_layout *L = zt_layout(6, sizes);
    for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++) {
        char run[64];
        snprintf(run, sizeof run, "run-w%u", worlds[w]);
        char *p = zt_save(run, L, worlds[w], 10 + w, 1234 + w, 0);
        ZT_CHECK_EQ(zt_verify_count(p, 0), 0);
        zt_check_content(p, 1234 + w);
        zt_check_content(run, 1234 + w); /* through latest */
        free(p);
    }
    zck_layout_free(L);
}

ZT_TEST(read_ranges_across_shards)
{
    const uint64_t sizes[] = {5000, 3, 777};
    zck_layout *L = zt_layout(3, sizes);
    char *p = zt_save("run", L, 7, 1, 99, 0);
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, p));
    ZT_CHECK_EQ(zck_reader_world(r), 7);
    ZT_CHECK_EQ(zck_reader_step(r), 1);
    ZT_CHECK_EQ(zck_reader_zero_stage(r), 3);
    ZT_CHECK(!strcmp(zck_reader_model_json(r), "{\"arch\":\"test\"}"));
    unsigned seed = 7;
    for (int it = 0; it < 300; it++) {
        size_t g = (size_t)(rand_r(&seed) % 3), s = (size_t)(rand_r(&seed) % 3);
        uint64_t n = sizes[g];
        uint64_t a = (uint64_t)rand_r(&seed) % n;
        uint64_t c = 1 + (uint64_t)rand_r(&seed) % (n - a);
        size_t dsz = zck_dtype_size(zck_layout_state_dtype(L, s));
        unsigned char *got = malloc(c * dsz), *want = malloc(c * dsz);
        ZT_OK(zck_reader_read_range(r, g, s, a, c, got));
        zt_fill(L, g, s, a, c, 99, want);
        if (memcmp(got, want, c * dsz))
            ZT_FAIL("range [%llu, +%llu) of group %zu state %zu differs", (unsigned long long)a,
                    (unsigned long long)c, g, s);
        free(got);
        free(want);
    }
    /* several requests at once, verified, two jobs */
    uint32_t buf[100], buf2[10];
    zck_read_req q[2] = {{0, 0, 4900, 100, buf}, {0, 0, 0, 10, buf2}};
    zck_read_opts o = ZCK_READ_OPTS_INIT;
    ZT_OK(zck_reader_read(r, q, 2, &o));
    uint32_t want[100];
    zt_fill(L, 0, 0, 4900, 100, 99, want);
    ZT_CHECK(!memcmp(buf, want, sizeof buf));
    ZT_ERR(zck_reader_read_range(r, 0, 0, 4990, 11, buf), ZR_EINVAL, "outside group 'h0'");
    ZT_ERR(zck_reader_read_range(r, 3, 0, 0, 1, buf), ZR_EINVAL, "no group 3");
    zck_reader_free(r);
    free(p);
    zck_layout_free(L);
}

ZT_TEST(read_into_aligned_buffers)
{
    /* aligned destinations take the direct path (read straight into them); misaligned ones,
     * overlapping requests and partial ranges go through the ring: all must agree */
    const uint64_t sizes[] = {300000, 5000, 1025};
    zck_layout *L = zt_layout(3, sizes);
    char *p = zt_save("run", L, 3, 4, 21, 0);
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, p));
    for (int verify = 0; verify <= 1; verify++) {
        zck_read_req q[12];
        unsigned char *mem[12];
        size_t nq = 0;
        for (size_t g = 0; g < 3; g++)
            for (size_t s = 0; s < 3; s++) {
                uint64_t n = sizes[g];
                size_t dsz = zck_dtype_size(zck_layout_state_dtype(L, s));
                ZT_CHECK(posix_memalign((void **)&mem[nq], 4096, n * dsz + 4096) == 0);
                /* g 2 misaligned on purpose */
                q[nq] = (zck_read_req){g, s, 0, n, mem[nq] + (g == 2 ? 8 : 0)};
                nq++;
            }
        /* overlapping and partial requests on top */
        ZT_CHECK(posix_memalign((void **)&mem[nq], 4096, 300000 * 4) == 0);
        q[nq] = (zck_read_req){0, 0, 1024, 200000, mem[nq]};
        nq++;
        ZT_CHECK(posix_memalign((void **)&mem[nq], 4096, 300000 * 4) == 0);
        q[nq] = (zck_read_req){0, 0, 99999, 3, mem[nq]};
        nq++;
        zck_read_opts o = ZCK_READ_OPTS_INIT;
        o.verify = verify;
        o.io.buf_bytes = 64 << 10; /* many chunks */
        ZT_OK(zck_reader_read(r, q, nq, &o));
        for (size_t k = 0; k < nq; k++) {
            size_t dsz = zck_dtype_size(zck_layout_state_dtype(L, q[k].state));
            unsigned char *want = malloc(q[k].count * dsz);
            zt_fill(L, q[k].group, q[k].state, q[k].start, q[k].count, 21, want);
            if (memcmp(want, q[k].dst, q[k].count * dsz))
                ZT_FAIL("request %zu (verify %d) differs", k, verify);
            free(want);
            free(mem[k]);
        }
    }
    /* a flipped byte is caught when reading straight into aligned buffers too */
    char f[512];
    snprintf(f, sizeof f, "%s/shard-00000-of-00003.bin", p);
    zt_flip_byte(f, 4096 * 3 + 5);
    void *buf;
    ZT_CHECK(posix_memalign(&buf, 4096, 300000 * 4) == 0);
    zck_read_req q1 = {0, 0, 0, 300000, buf};
    zck_read_opts o = ZCK_READ_OPTS_INIT;
    ZT_ERR(zck_reader_read(r, &q1, 1, &o), ZR_ECORRUPT, "shard-00000-of-00003.bin");
    free(buf);
    zck_reader_free(r);
    free(p);
    zck_layout_free(L);
}

/* zck_verify's each: the verification's own read hands every stored element over exactly
 * once, as stored, from several shards at once; its error ends the check. */
typedef struct {
    const zck_layout *L;
    pthread_mutex_t mu;
    unsigned char *seen[4][3]; /* times each element was handed over, per (group, state) */
    size_t calls, fail_at, bad;
} each_seen;

static int on_piece(void *ctx, const zck_piece *p)
{
    each_seen *e = ctx;
    size_t ds = zck_dtype_size(zck_layout_state_dtype(e->L, p->state));
    unsigned char *want = malloc(p->count * ds + 1);
    zt_fill(e->L, p->group, p->state, p->start, p->count, 41, want);
    int differs = memcmp(want, p->data, p->count * ds) != 0;
    free(want);
    pthread_mutex_lock(&e->mu);
    size_t call = ++e->calls;
    e->bad += differs;
    for (uint64_t i = 0; i < p->count; i++)
        e->seen[p->group][p->state][p->start + i]++;
    pthread_mutex_unlock(&e->mu);
    if (e->fail_at && call == e->fail_at)
        return zr_err_set(ZR_EIO, "piece %zu: no room left (test)", call);
    return 0;
}

ZT_TEST(verify_each_hands_every_element_once)
{
    const uint64_t sizes[] = {5000, 3, 777, 100003};
    zck_layout *L = zt_layout(4, sizes);
    char *p = zt_save("run", L, 3, 1, 41, 0);
    each_seen e = {.L = L};
    pthread_mutex_init(&e.mu, NULL);
    for (size_t g = 0; g < 4; g++)
        for (size_t s = 0; s < 3; s++)
            e.seen[g][s] = calloc(sizes[g], 1);
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    vo.io.buf_bytes = 4096; /* chunks that cut extents */
    vo.each = on_piece;
    vo.each_ctx = &e;
    zck_report *rep = NULL;
    ZT_OK(zck_verify(&rep, p, &vo));
    ZT_CHECK_EQ(zck_report_count(rep), 0);
    zck_report_free(rep);
    ZT_CHECK(e.calls > 3 * 3 * 4); /* more pieces than extents: the chunks cut them */
    ZT_CHECK_EQ(e.bad, 0);
    for (size_t g = 0; g < 4; g++)
        for (size_t s = 0; s < 3; s++)
            for (uint64_t i = 0; i < sizes[g]; i++)
                if (e.seen[g][s][i] != 1)
                    ZT_FAIL("group %zu state %zu element %llu handed over %d times", g, s,
                            (unsigned long long)i, e.seen[g][s][i]);

    /* the caller's error ends the check with it, no report, whatever the other shard does */
    e.calls = 0;
    e.fail_at = 5;
    rep = NULL;
    ZT_ERR(zck_verify(&rep, p, &vo), ZR_EIO, "piece 5: no room left (test)");
    ZT_CHECK(rep == NULL);

    /* quick: nothing read, nothing handed over; damage: reported, the check ran */
    e.calls = 0;
    e.fail_at = 0;
    vo.quick = 1;
    ZT_OK(zck_verify(&rep, p, &vo));
    ZT_CHECK_EQ(e.calls, 0);
    zck_report_free(rep);
    vo.quick = 0;
    char shard[4096];
    snprintf(shard, sizeof shard, "%s/shard-00001-of-00003.bin", p);
    zt_flip_byte(shard, 10);
    ZT_OK(zck_verify(&rep, p, &vo));
    zt_expect_one_problem(rep, "flipped", ZCK_PROB_HASH, "shard-00001-of-00003.bin", NULL);
    ZT_CHECK_EQ(e.bad, 1); /* the flipped byte was handed over: the report is what says so */
    for (size_t g = 0; g < 4; g++)
        for (size_t s = 0; s < 3; s++)
            free(e.seen[g][s]);
    pthread_mutex_destroy(&e.mu);
    free(p);
    zck_layout_free(L);
}
