/*
 * ckpt_demo.c: what `make run` runs until zrun exists. Two rank processes each write their
 * partition of a small GPT-2-shaped model's states (param, exp_avg, exp_avg_sq) into their own
 * shard; rank 0 gathers the shard descriptions through a pipe and commits. Three saves, with
 * retention of the last two, then the newest checkpoint is verified and summarized.
 * No training happens here: the values are synthetic.
 */
#include "zck.h"
#include "zfmt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>

#define WORLD 2

static const zfmt_gpt2_config demo_model = {4, 4, 64, 128, 256}; /* L, NH, C, T, V */

/* One rank: write its partition of every (group, state) and return the shard as JSON. */
static int rank_main(const char *staging, const zck_layout *L, uint32_t rank, uint64_t step,
                     char **json)
{
    zck_writer *w = NULL;
    zck_shard *sh = NULL;
    float *buf = NULL;
    int rc = 0;
    ZR_TRY_GOTO(zck_writer_open(&w, staging, L, WORLD, rank, NULL), rc, out);
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        for (size_t s = 0; s < zck_layout_n_states(L); s++) {
            uint64_t a, n;
            zck_partition(zck_layout_group_numel(L, g), WORLD, rank,
                          zck_layout_partition_align(L), &a, &n);
            if (!n)
                continue;
            float *nb = realloc(buf, n * sizeof *buf);
            if (!nb) {
                rc = zr_err_set(ZR_ENOMEM, "out of memory");
                goto out;
            }
            buf = nb;
            for (uint64_t i = 0; i < n; i++)
                buf[i] = (float)((a + i) % 97) * 0.01f * (float)(s + 1) + (float)step * 1e-4f;
            ZR_TRY_GOTO(zck_writer_put(w, g, s, a, n, buf), rc, out);
        }
    ZR_TRY_GOTO(zck_writer_finish(w, &sh), rc, out);
    ZR_TRY_GOTO(zck_shard_to_json(json, sh), rc, out);
out:
    free(buf);
    zck_shard_free(sh);
    zck_writer_free(w);
    return rc;
}

static int save(const char *run_dir, const zck_layout *L, uint64_t step, char **final)
{
    char *staging = NULL, *json[WORLD] = {0};
    zck_shard *sh[WORLD] = {0};
    uint64_t nonce = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    int rc = 0;
    ZR_TRY(zck_staging_create(&staging, run_dir, step, nonce));
    int fds[WORLD][2];
    pid_t pids[WORLD];
    for (uint32_t r = 1; r < WORLD; r++) { /* ranks 1.. are real processes */
        if (pipe(fds[r]) < 0) {
            rc = zr_err_sys(errno, "pipe");
            goto out;
        }
        if ((pids[r] = fork()) == 0) {
            char *j = NULL;
            zr_log_set_rank((int)r);
            if (rank_main(staging, L, r, step, &j) < 0) {
                zr_log(ZR_LOG_ERROR, "%s", zr_err_msg());
                _exit(2);
            }
            size_t len = strlen(j);
            _exit(write(fds[r][1], j, len) == (ssize_t)len ? 0 : 2);
        }
        close(fds[r][1]);
    }
    ZR_TRY_GOTO(rank_main(staging, L, 0, step, &json[0]), rc, out);
    for (uint32_t r = 1; r < WORLD; r++) {
        size_t cap = 1 << 16, len = 0;
        json[r] = malloc(cap);
        ssize_t k;
        while (json[r] && (k = read(fds[r][0], json[r] + len, cap - len)) > 0)
            len += (size_t)k;
        close(fds[r][0]);
        int st;
        waitpid(pids[r], &st, 0);
        if (!json[r] || !WIFEXITED(st) || WEXITSTATUS(st)) {
            rc = zr_err_set(ZR_ERROR, "rank %u failed to write its shard", r);
            goto out;
        }
        ZR_TRY_GOTO(zck_shard_from_json(&sh[r], json[r], len), rc, out);
    }
    ZR_TRY_GOTO(zck_shard_from_json(&sh[0], json[0], strlen(json[0])), rc, out);
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = step;
    o.world = WORLD;
    o.zero_stage = 3;
    o.keep_last = 2;
    char *model = NULL;
    ZR_TRY_GOTO(zfmt_gpt2_config_to_json(&model, &demo_model), rc, out);
    o.model_json = model;
    char tj[128];
    snprintf(tj, sizeof tj, "{\"optimizer_step\":%llu,\"note\":\"synthetic values: ckpt demo, "
             "no training\"}", (unsigned long long)step);
    o.training_json = tj;
    rc = zck_commit(final, run_dir, staging, L, sh, WORLD, &o);
    free(model);
out:
    for (int r = 0; r < WORLD; r++) {
        free(json[r]);
        zck_shard_free(sh[r]);
    }
    free(staging);
    return rc;
}

int main(int argc, char **argv)
{
    const char *run_dir = "runs/demo";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--run-dir") && i + 1 < argc)
            run_dir = argv[++i];
        else {
            fprintf(stderr, "usage: zck-demo [--run-dir DIR]\n"
                            "Writes three 2-rank ZeRO-3-style checkpoints of a small GPT-2 "
                            "layout (synthetic values) into DIR and verifies the newest.\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    zck_layout *L;
    if (zfmt_gpt2_layout(&L, &demo_model) < 0) {
        fprintf(stderr, "zck-demo: error: %s\n", zr_err_msg());
        return 2;
    }
    uint64_t base = 0;
    char *cur = NULL;
    zck_reader *prev;
    if (zck_reader_open(&prev, run_dir) == 0) { /* continue after the newest checkpoint */
        base = zck_reader_step(prev);
        zck_reader_free(prev);
    }
    for (uint64_t k = 1; k <= 3; k++) {
        free(cur);
        cur = NULL;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (save(run_dir, L, base + 10 * k, &cur) < 0) {
            fprintf(stderr, "zck-demo: error: %s\n", zr_err_msg());
            return 2;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("saved %s (2 ranks, %.1f ms)\n", cur,
               (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    }
    zck_report *rep;
    if (zck_verify(&rep, run_dir, NULL) < 0) {
        fprintf(stderr, "zck-demo: error: %s\n", zr_err_msg());
        return 2;
    }
    size_t np = zck_report_count(rep);
    for (size_t i = 0; i < np; i++)
        fprintf(stderr, "zck-demo: %s: %s: %s\n", zck_report_get(rep, i)->file,
                zck_problem_kind_name(zck_report_get(rep, i)->kind),
                zck_report_get(rep, i)->detail);
    printf("verified %s: %s, %llu bytes hashed\n", cur, np ? "PROBLEMS FOUND" : "sound",
           (unsigned long long)zck_report_bytes_hashed(rep));
    zck_report_free(rep);
    zck_reader *r;
    if (zck_reader_open(&r, run_dir) == 0) {
        printf("latest: step %llu, world %u, zero stage %d, %zu groups, %zu shards\n",
               (unsigned long long)zck_reader_step(r), zck_reader_world(r),
               zck_reader_zero_stage(r), zck_layout_n_groups(zck_reader_layout(r)),
               zck_reader_n_shards(r));
        zck_reader_free(r);
    }
    free(cur);
    zck_layout_free(L);
    return np ? 1 : 0;
}
