/*
 * mkckpt.c: make a benchmark checkpoint: `mkckpt RUNDIR GIB SHARDS` writes a checkpoint of GIB
 * GiB (three f32 states over groups of 16M elements) in SHARDS shards, filled with non-zero
 * pseudo-random bytes (this disk writes zeros about 3x faster than real data).
 */
#include "zck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int die(void)
{
    fprintf(stderr, "mkckpt: error: %s\n", zr_err_msg());
    return 2;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: mkckpt RUNDIR GIB SHARDS\n");
        return 2;
    }
    uint64_t total = strtoull(argv[2], NULL, 10) << 30;
    uint32_t world = (uint32_t)strtoul(argv[3], NULL, 10);
    if (!total || !world)
        return fprintf(stderr, "mkckpt: GIB and SHARDS must be positive\n"), 2;
    const uint64_t gnumel = (uint64_t)16 << 20; /* elements per group */
    uint64_t per_state = total / 3 / 4;
    size_t ngroups = (size_t)((per_state + gnumel - 1) / gnumel);
    zck_layout *L;
    if (zck_layout_new(&L) || zck_layout_add_state(L, "param", ZCK_F32) ||
        zck_layout_add_state(L, "exp_avg", ZCK_F32) ||
        zck_layout_add_state(L, "exp_avg_sq", ZCK_F32))
        return die();
    for (size_t g = 0; g < ngroups; g++) {
        char name[32];
        uint64_t n = g + 1 < ngroups ? gnumel : per_state - gnumel * g;
        snprintf(name, sizeof name, "g%zu", g);
        if (zck_layout_add_group(L, NULL, name) || zck_layout_add_tensor(L, g, name, ZCK_F32, 1, &n))
            return die();
    }
    uint32_t *buf = malloc(gnumel * 4);
    if (!buf)
        return fprintf(stderr, "mkckpt: out of memory\n"), 2;
    uint64_t x = 88172645463325252ULL;
    for (uint64_t i = 0; i < gnumel; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint32_t)x | 1;
    }
    char *staging;
    if (zck_staging_create(&staging, argv[1], 1000, 1))
        return die();
    zck_shard **sh = calloc(world, sizeof *sh);
    for (uint32_t r = 0; r < world; r++) {
        zck_writer *w;
        if (zck_writer_open(&w, staging, L, world, r, NULL))
            return die();
        for (size_t g = 0; g < ngroups; g++)
            for (size_t s = 0; s < 3; s++) {
                uint64_t a, n;
                zck_partition(zck_layout_group_numel(L, g), world, r, 64, &a, &n);
                if (n && zck_writer_put(w, g, s, a, n, buf + (a + s * 7) % 1024))
                    return die();
            }
        if (zck_writer_finish(w, &sh[r]))
            return die();
        zck_writer_free(w);
    }
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = 1000;
    o.world = world;
    if (zck_commit(NULL, argv[1], staging, L, sh, world, &o))
        return die();
    return 0;
}
