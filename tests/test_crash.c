/*
 * test_crash.c: crash safety and the commit protocol. Fault injection fails the Nth storage
 * operation of a save for every N; a writer process is killed with SIGKILL at random instants
 * of save and commit; after each, `latest` names a checkpoint that verifies and holds exactly
 * what was saved, and no half-written directory is ever named. Also retention, garbage
 * collection, refusal to overwrite, the buffered fallback on tmpfs, a full filesystem, writer
 * misuse, and a save by W real processes.
 */
#include "ckutil.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

static const uint64_t sizes[] = {50000, 1000, 7};

/* `latest` of run names a checkpoint that verifies and holds the contents saved for its step
 * (seed = step); every step-* directory verifies too. Returns the step latest names. */
static uint64_t check_run(const char *run)
{
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, run));
    uint64_t step = zck_reader_step(r);
    zck_reader_free(r);
    ZT_CHECK_EQ(zt_verify_count(run, 0), 0);
    zt_check_content(run, step);
    DIR *d = opendir(run);
    ZT_CHECK(d);
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "step-", 5)) {
            char p[1024];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s", run, de->d_name);
            if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
                ZT_CHECK_EQ(zt_verify_count(p, 0), 0);
        }
    closedir(d);
    return step;
}

/* A save that reports failure instead of ending the test. */
static int try_save(const char *run, const zck_layout *L, uint32_t world, uint64_t step)
{
    char *staging = NULL;
    zck_shard **sh = calloc(world, sizeof *sh);
    int rc = zck_staging_create(&staging, run, step, step * 31);
    for (uint32_t k = 0; k < world && !rc; k++) {
        zck_writer *w = NULL;
        rc = zck_writer_open(&w, staging, L, world, k, NULL);
        for (size_t g = 0; g < zck_layout_n_groups(L) && !rc; g++)
            for (size_t s = 0; s < zck_layout_n_states(L) && !rc; s++) {
                uint64_t a, n;
                zck_partition(zck_layout_group_numel(L, g), world, k, 64, &a, &n);
                if (!n)
                    continue;
                void *buf = malloc(n * 4);
                zt_fill(L, g, s, a, n, step, buf);
                rc = zck_writer_put(w, g, s, a, n, buf);
                free(buf);
            }
        if (!rc)
            rc = zck_writer_finish(w, &sh[k]);
        zck_writer_free(w);
    }
    if (!rc) {
        zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
        o.step = step;
        o.world = world;
        o.keep_last = 2;
        rc = zck_commit(NULL, run, staging, L, sh, world, &o);
    }
    for (uint32_t k = 0; k < world; k++)
        zck_shard_free(sh[k]);
    free(sh);
    free(staging);
    return rc;
}

typedef struct {
    long countdown; /* fail when it reaches zero */
    int hit;
    zck_op op;
    char path[512];
} fault_state;

static int fail_nth(zck_op op, const char *path, void *ctx)
{
    fault_state *f = ctx;
    if (op == ZCK_OP_READ || f->hit || --f->countdown > 0)
        return 0;
    f->hit = 1;
    f->op = op;
    snprintf(f->path, sizeof f->path, "%s", path);
    return op == ZCK_OP_WRITE ? ENOSPC : EIO;
}

ZT_TEST(crash_fault_injection_every_operation)
{
    setenv("ZR_LOG", "error", 1); /* the cleanup warnings that injected failures cause */
    zck_layout *L = zt_layout(3, sizes);
    ZT_OK(try_save("run", L, 3, 1));
    uint64_t step = 2;
    int failures = 0;
    for (long n = 1;; n++, step++) {
        fault_state f = {n, 0, 0, ""};
        zck_fault_set(fail_nth, &f);
        zr_err_clear();
        int rc = try_save("run", L, 3, step);
        zck_fault_set(NULL, NULL);
        if (!f.hit) { /* past the last operation: the save went through */
            ZT_OK(rc);
            ZT_CHECK_EQ(check_run("run"), step);
            break;
        }
        failures++;
        /* every injected failure is reported, with the file named */
        /* success despite a failure is right only for the cleanup after the commit: removing
         * (unlink, rename), or looking into another save's leftovers (retention reads a stale
         * staging directory's manifest to know which files are the format's) */
        char own[64];
        snprintf(own, sizeof own, "step-%08llu", (unsigned long long)step);
        if (rc == 0 && !((f.op == ZCK_OP_UNLINK || f.op == ZCK_OP_RENAME ||
                          !strstr(f.path, own)) &&
                         check_run("run") == step))
            ZT_FAIL("operation %ld (%d on %s) failed but the save reported success", n, f.op,
                    f.path);
        if (rc && !strstr(zr_err_msg(), "run"))
            ZT_FAIL("operation %ld: message names no file: %s", n, zr_err_msg());
        uint64_t named = check_run("run");
        ZT_CHECK(named == step || named < step);
        ZT_CHECK(n < 100000);
    }
    fprintf(stderr, "  %d injected failures, each left a sound latest\n", failures);
    ZT_CHECK(failures > 20);
    /* stale staging directories of failed saves are collected by the last commit */
    DIR *d = opendir("run");
    struct dirent *de;
    int dirs = 0;
    while ((de = readdir(d))) {
        ZT_CHECK(strncmp(de->d_name, ".tmp-", 5) && strncmp(de->d_name, ".del-", 5));
        dirs += !strncmp(de->d_name, "step-", 5);
    }
    closedir(d);
    ZT_CHECK_EQ(dirs, 2); /* keep_last = 2 */
    zck_layout_free(L);
}

ZT_TEST(crash_sigkill_during_save_and_commit)
{
    const uint64_t big[] = {400000, 70000, 1000, 5};
    zck_layout *L = zt_layout(4, big);
    int rounds = zt_stress() ? 400 : 30;
    unsigned seed = (unsigned)time(NULL);
    fprintf(stderr, "  seed %u, %d rounds\n", seed, rounds);
    uint64_t next = 1, last_named = 0;
    int killed_mid = 0;
    /* time one save, so that kills land anywhere in the next few saves, commits included */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    free(zt_save("timing", L, 3, 1, 1, 0));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long save_us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000;
    fprintf(stderr, "  one save takes %ld us\n", save_us);
    for (int i = 0; i < rounds; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            for (uint64_t s = next;; s++) {
                char *p = zt_save("run", L, 3, s, s, 2);
                free(p);
            }
        }
        long us = (long)((uint64_t)rand_r(&seed) % (uint64_t)(3 * save_us + 1000));
        struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        ZT_CHECK(WIFSIGNALED(st)); /* the writer never failed on its own */
        /* a kill between the rename and the update of latest leaves a complete step
         * directory newer than latest (also the first one, before any latest): the next
         * writer continues above every step directory present */
        DIR *d = opendir("run"); /* NULL: killed before the run directory was made */
        struct dirent *de;
        int staged = 0;
        while (d && (de = readdir(d))) {
            unsigned long long s;
            staged |= !strncmp(de->d_name, ".tmp-", 5);
            if (sscanf(de->d_name, "step-%llu", &s) == 1 && s >= next)
                next = s + 1;
        }
        if (d)
            closedir(d);
        killed_mid += staged;
        zck_reader *r;
        if (zck_reader_open(&r, "run") == ZR_ENOTFOUND)
            continue; /* killed before the first commit */
        zck_reader_free(r);
        uint64_t named = check_run("run");
        ZT_CHECK(named >= last_named);
        last_named = named;
    }
    fprintf(stderr, "  %d of %d kills left a staging directory behind; latest sound every "
            "time\n", killed_mid, rounds);
    zck_layout_free(L);
}

ZT_TEST(retention_and_garbage_collection)
{
    zck_layout *L = zt_layout(3, sizes);
    for (uint64_t s = 1; s <= 5; s++)
        free(zt_save("run", L, 2, s, s, 2));
    struct stat st;
    ZT_OK(zck__mkdir_for_tests("run/.tmp-step-00000003-00000000000000aa"));
    zt_write_file("run/.tmp-step-00000003-00000000000000aa/shard-00000-of-00002.bin", "x");
    ZT_OK(zck__mkdir_for_tests("run/.tmp-step-00000099-00000000000000bb")); /* in flight */
    zt_write_file("run/.latest.tmp-123", "step-00000001\n");
    zt_write_file("run/step-00000002", "a file, not a checkpoint\n");
    /* a complete checkpoint newer than latest (crash between rename and latest): kept */
    free(zt_save("orphans", L, 2, 100, 100, 0));
    ZT_CHECK(rename("orphans/step-00000100", "run/step-00000100") == 0);
    free(zt_save("run", L, 2, 6, 6, 2));
    ZT_CHECK(stat("run/step-00000100", &st) == 0);
    ZT_CHECK(stat("run/step-00000002", &st) == 0 && S_ISREG(st.st_mode));
    ZT_CHECK(stat("run/step-00000006", &st) == 0);
    ZT_CHECK(stat("run/step-00000005", &st) == 0);
    ZT_CHECK(stat("run/step-00000004", &st) != 0);
    ZT_CHECK(stat("run/step-00000001", &st) != 0);
    ZT_CHECK(stat("run/.tmp-step-00000003-00000000000000aa", &st) != 0);
    ZT_CHECK(stat("run/.tmp-step-00000099-00000000000000bb", &st) == 0);
    ZT_CHECK(stat("run/.latest.tmp-123", &st) != 0);
    ZT_CHECK_EQ(check_run("run"), 6);
    /* keep_last = 0 keeps everything */
    free(zt_save("run", L, 2, 7, 7, 0));
    ZT_CHECK(stat("run/step-00000005", &st) == 0);
    zck_layout_free(L);
}

ZT_TEST(commit_refuses_existing_step_and_bad_shards)
{
    zck_layout *L = zt_layout(3, sizes);
    free(zt_save("run", L, 2, 1, 1, 0));
    ZT_ERR(try_save("run", L, 2, 1), ZR_EEXIST, "step-00000001");
    ZT_CHECK_EQ(check_run("run"), 1);
    /* only one of two ranks */
    char *staging;
    ZT_OK(zck_staging_create(&staging, "run", 2, 5));
    zck_shard *s0 = zt_write_rank(staging, L, 2, 0, 2, NULL);
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = 2;
    o.world = 2;
    ZT_ERR(zck_commit(NULL, "run", staging, L, &s0, 1, &o), ZR_ECORRUPT,
           "1 shards listed for world size 2");
    /* a shard description whose file is not in the staging directory */
    zck_shard *s1 = zt_write_rank("run", L, 2, 1, 2, NULL);
    zck_shard *both[2] = {s0, s1};
    ZT_ERR(zck_commit(NULL, "run", staging, L, both, 2, &o), ZR_ENOTFOUND,
           "shard-00001-of-00002.bin");
    ZT_CHECK_EQ(check_run("run"), 1);
    o.step = (uint64_t)1 << 63;
    ZT_ERR(zck_commit(NULL, "run", staging, L, both, 2, &o), ZR_EINVAL, "at most 2^63-1");
    o.step = 2;
    o.zero_stage = 9;
    ZT_ERR(zck_commit(NULL, "run", staging, L, both, 2, &o), ZR_EINVAL, "zero stage 9");
    zck_shard_free(s0);
    zck_shard_free(s1);
    free(staging);
    zck_layout_free(L);
}

ZT_TEST(writer_misuse_is_refused)
{
    zck_layout *L = zt_layout(3, sizes);
    zck_writer *w;
    ZT_OK(zck__mkdir_for_tests("st"));
    ZT_ERR(zck_writer_open(&w, "st", L, 2, 2, NULL), ZR_EINVAL, "rank 2 of world 2");
    ZT_OK(zck_writer_open(&w, "st", L, 2, 0, NULL));
    zck_writer *w2;
    ZT_ERR(zck_writer_open(&w2, "st", L, 2, 0, NULL), ZR_EEXIST, "shard-00000-of-00002.bin");
    ZT_ERR(zck_writer_begin(w, 0, 0, 49990, 11), ZR_EINVAL, "out of range");
    ZT_ERR(zck_writer_begin(w, 5, 0, 0, 1), ZR_EINVAL, "no group 5");
    ZT_ERR(zck_writer_begin(w, 0, 0, 0, 0), ZR_EINVAL, "empty");
    float x[8] = {0};
    ZT_OK(zck_writer_begin(w, 0, 0, 0, 4));
    ZT_ERR(zck_writer_write(w, x, 20), ZR_EINVAL, "takes 16 more");
    ZT_OK(zck_writer_write(w, x, 8));
    ZT_ERR(zck_writer_begin(w, 0, 0, 4, 4), ZR_EINVAL, "still needs 8 bytes");
    zck_shard *s;
    ZT_ERR(zck_writer_finish(w, &s), ZR_EINVAL, "8 bytes of the last extent missing");
    struct stat st;
    ZT_CHECK(stat("st/shard-00000-of-00002.bin", &st) == 0);
    zck_writer_free(w); /* unfinished: the file goes */
    ZT_CHECK(stat("st/shard-00000-of-00002.bin", &st) != 0);
    zck_layout_free(L);
}

static int refuse_direct(zck_op op, const char *path, void *ctx)
{
    (void)path;
    ++*(int *)ctx;
    return op == ZCK_OP_OPEN_DIRECT ? EINVAL : 0;
}

ZT_TEST(buffered_fallback_when_odirect_is_refused)
{
    zck_layout *L = zt_layout(3, sizes);
    /* a filesystem that refuses O_DIRECT (open fails with EINVAL, as tmpfs did before Linux
     * 6.6): saves, verifies and reads go through the buffered path */
    int calls = 0;
    zck_fault_set(refuse_direct, &calls);
    zck_writer *w;
    ZT_OK(zck__mkdir_for_tests("st"));
    ZT_OK(zck_writer_open(&w, "st", L, 1, 0, NULL));
    ZT_CHECK_EQ(zck_writer_direct(w), 0);
    zck_writer_free(w);
    free(zt_save("run", L, 3, 1, 1, 0));
    ZT_CHECK_EQ(check_run("run"), 1);
    zck_fault_set(NULL, NULL);
    ZT_CHECK(calls > 0);
    /* forced buffered I/O with small buffers */
    zck_io_opts io = ZCK_IO_OPTS_INIT;
    io.io = ZCK_IO_BUFFERED;
    io.buf_bytes = 8 << 10;
    io.queue_depth = 2;
    ZT_OK(zck_writer_open(&w, ".", L, 1, 0, &io));
    ZT_CHECK_EQ(zck_writer_direct(w), 0);
    zck_writer_free(w);
    /* the real tmpfs: whatever the kernel says about O_DIRECT, a save there is sound */
    char dir[] = "/dev/shm/zt-tmpfs-XXXXXX";
    if (mkdtemp(dir)) {
        char run[128];
        snprintf(run, sizeof run, "%s/run", dir);
        ZT_OK(zck__mkdir_for_tests(run));
        ZT_OK(zck_writer_open(&w, run, L, 1, 0, NULL));
        fprintf(stderr, "  tmpfs O_DIRECT: %s\n", zck_writer_direct(w) ? "accepted" : "refused");
        zck_writer_free(w);
        free(zt_save(run, L, 3, 1, 1, 0));
        ZT_CHECK_EQ(check_run(run), 1);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        ZT_CHECK(system(cmd) == 0);
    }
    zck_layout_free(L);
}

ZT_TEST(disk_full_fails_cleanly)
{
    zck_layout *L = zt_layout(3, sizes);
    ZT_OK(zck__mkdir_for_tests("small"));
    if (mount("zt", "small", "tmpfs", 0, "size=400k") < 0)
        ZT_SKIP("cannot mount a small tmpfs here (%s)", strerror(errno));
    const uint64_t tiny[] = {100};
    zck_layout *T = zt_layout(1, tiny);
    free(zt_save("small/run", T, 2, 1, 1, 0));
    int rc = try_save("small/run", L, 3, 2); /* 3 x ~600 KiB does not fit */
    const char *msg = zr_err_msg();
    int ok = rc == ZR_EIO && strstr(msg, "No space left") && strstr(msg, "small/run");
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", msg);
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, "small/run"));
    ZT_CHECK_EQ(zck_reader_step(r), 1);
    zck_reader_free(r);
    ZT_CHECK_EQ(zt_verify_count("small/run", 0), 0);
    umount("small");
    if (!ok)
        ZT_FAIL("save on a full filesystem: %s: %s", zr_err_name(rc), saved);
    zck_layout_free(L);
    zck_layout_free(T);
}

ZT_TEST(save_by_real_rank_processes)
{
    zck_layout *L = zt_layout(3, sizes);
    const uint32_t W = 4;
    char *staging;
    ZT_OK(zck_staging_create(&staging, "run", 10, 77));
    int fds[4][2];
    pid_t pids[4];
    for (uint32_t r = 0; r < W; r++) {
        ZT_CHECK(pipe(fds[r]) == 0);
        if ((pids[r] = fork()) == 0) {
            zck_shard *s = zt_write_rank(staging, L, W, r, 10, NULL);
            char *j;
            ZT_OK(zck_shard_to_json(&j, s));
            size_t n = strlen(j);
            _exit(write(fds[r][1], j, n) == (ssize_t)n ? 0 : 1);
        }
        close(fds[r][1]);
    }
    zck_shard *sh[4];
    for (uint32_t r = 0; r < W; r++) {
        char buf[1 << 16];
        size_t len = 0;
        ssize_t k;
        while ((k = read(fds[r][0], buf + len, sizeof buf - len)) > 0)
            len += (size_t)k;
        int st;
        waitpid(pids[r], &st, 0);
        ZT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        ZT_OK(zck_shard_from_json(&sh[r], buf, len));
    }
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = 10;
    o.world = W;
    ZT_OK(zck_commit(NULL, "run", staging, L, sh, W, &o));
    ZT_CHECK_EQ(check_run("run"), 10);
    for (uint32_t r = 0; r < W; r++)
        zck_shard_free(sh[r]);
    free(staging);
    zck_layout_free(L);
}
