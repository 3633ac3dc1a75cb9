/*
 * test_roundtrip.c: partition arithmetic, and save -> read for many world sizes and group sizes
 * (groups smaller than W, sizes not divisible by W), ranges crossing shard boundaries.
 */
#include "ckutil.h"

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
