/*
 * test_offload.c: offload to NVMe through the real zrun (swap files on this machine's disk):
 * byte-identical training with and without offload (optimizer only; optimizer and parameters)
 * at W=1 and W=2, stages 1 and 3; peak RSS clearly lower with everything offloaded; a swap
 * file deleted or truncated mid-run, and a swap path on a full filesystem, stop the run with a
 * message naming the file and leave `latest` sound; save and resume with offload on, resuming
 * without it and the reverse; a crashed run's swap directory is cleaned, a live one refused;
 * the deferred update of stage 3 bit-identical through saves, samples, a stop and a resume.
 */
#include "ckutil.h"
#include "zr.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define MODEL "gpt2:layers=2,heads=2,dim=64,ctx=32,vocab=256"
/* small chunks, so that even this model streams through many of them */
#define NVME "--nvme-path swap --aio-block-size 8192 --offload-buffers 3 --aio-queue-depth 4"

static void same_file(const char *a, const char *b)
{
    char *ta = zt_slurp(a), *tb = zt_slurp(b);
    if (strcmp(ta, tb))
        ZT_FAIL("%s and %s differ", a, b);
    free(ta);
    free(tb);
}

/* the step log without the timing and memory fields: loss, lr, norm per step (and the
 * samples' text) */
static void losses_only(const char *jsonl, const char *out)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sed 's/,\"tokens_per_s.*//; s/,\"time\".*//' %s > %s", jsonl,
             out);
    ZT_CHECK(system(cmd) == 0);
}

/* A case of the tests below: a world size, a stage and the offload's options. */
typedef struct {
    int W, stage;
    const char *what;
} offload_case;

/* A case's two runs: their options (args, and extra: the offload, NVME then the case's) and
 * run directories. */
typedef struct {
    char args[512], extra[256], ref[32], off[32];
} offload_run;

/* Case i: common at its world size and stage, and the same run with its offload: the same
 * checkpoint bit for bit and the same losses, learning rates and norms at every step (in
 * ref-I and off-I). Returns the two runs. */
static offload_run same_run_offloaded(size_t i, const char *common, const offload_case *c)
{
    offload_run o;
    snprintf(o.args, sizeof o.args, "%s --nproc %d --zero %d", common, c->W, c->stage);
    snprintf(o.extra, sizeof o.extra, NVME " %s", c->what);
    snprintf(o.ref, sizeof o.ref, "ref-%zu", i);
    snprintf(o.off, sizeof o.off, "off-%zu", i);
    char jr[48], jo[48];
    snprintf(jr, sizeof jr, "%s.jsonl", o.ref);
    snprintf(jo, sizeof jo, "%s.jsonl", o.off);
    zt_zrunf_ok("ref.log", "%s --ckpt-dir %s --log-json %s", o.args, o.ref, jr);
    zt_zrunf_ok("off.log", "%s --ckpt-dir %s --log-json %s %s", o.args, o.off, jo, o.extra);
    zt_same_latest(o.ref, o.off, 0, 0);
    losses_only(jr, "a.txt");
    losses_only(jo, "b.txt");
    same_file("a.txt", "b.txt");
    return o;
}

ZT_TEST(offload_is_byte_identical)
{
    static const offload_case c[] = {{1, 1, "--offload-optimizer nvme"},
                                     {2, 1, "--offload-optimizer nvme"},
                                     {1, 3, "--offload-optimizer nvme"},
                                     {2, 3, "--offload-optimizer nvme"},
                                     {1, 3, "--offload-optimizer nvme --offload-params nvme"},
                                     {2, 3, "--offload-optimizer nvme --offload-params nvme"},
                                     {2, 3, "--offload-params nvme"}};
    const char *common = "--model " MODEL " --batch 4 --steps 12 --warmup 3 --lr 3e-3 "
                         "--threads 1";
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        same_run_offloaded(i, common, &c[i]);
        /* the swap files are scratch: gone after a clean exit */
        struct stat st;
        ZT_CHECK(stat("swap/zrun-swap-rank0", &st) < 0 && errno == ENOENT);
    }
}

ZT_TEST(offload_lowers_peak_rss)
{
    const char *common = "--model gpt2:layers=8,heads=4,dim=256,ctx=64,vocab=256 --batch 4 "
                         "--seq 32 --steps 2 --threads 1 --nproc 2 --zero 3 --prefetch 1";
    zt_zrunf_ok("plain.log", "%s --ckpt-dir plain --log-json plain.jsonl", common);
    zt_zrunf_ok("off.log", "%s --ckpt-dir off --log-json off.jsonl --offload-optimizer "
                "nvme --offload-params nvme --nvme-path swap", common);
    uint64_t rss[2];
    const char *files[2] = {"plain.jsonl", "off.jsonl"};
    for (int i = 0; i < 2; i++) {
        char *t = zt_slurp(files[i]);
        const char *q = NULL, *at = t;
        while ((at = strstr(at, "\"rss_peak\":"))) /* the last line's */
            q = at++;
        ZT_CHECK(q);
        rss[i] = strtoull(q + 11, NULL, 10);
        free(t);
    }
    printf("  peak RSS of rank 0: %.1f MiB without offload, %.1f MiB with optimizer and "
           "parameters on NVMe\n", rss[0] / 1048576.0, rss[1] / 1048576.0);
#if !defined(__SANITIZE_ADDRESS__)
    ZT_CHECK(rss[1] < rss[0] * 0.8);
#endif
}

/* Start an offloaded 2-rank run that saves every step; once rank 0's swap files exist and a
 * few steps are done, damage one (delete or truncate); the run must stop naming it. */
static void damage_mid_run(int truncate_it)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("run.log", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "exec %s --model %s --batch 4 --steps 100000 --threads 1 "
                 "--nproc 2 --zero 3 --save-every 2 --keep-last 2 --ckpt-dir run "
                 "--offload-optimizer nvme --offload-params nvme " NVME, zt_zrun_path(), MODEL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    const char *victim = "swap/zrun-swap-rank1/optimizer.swap";
    struct stat st;
    for (int i = 0; i < 2000 && stat("run/latest", &st) != 0; i++) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ZT_CHECK(stat(victim, &st) == 0);
    if (truncate_it)
        ZT_CHECK(truncate(victim, 4096) == 0);
    else
        ZT_CHECK(unlink(victim) == 0);
    int status;
    ZT_CHECK(waitpid(pid, &status, 0) == pid);
    ZT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    char *t = zt_slurp("run.log");
    if (!strstr(t, victim) || !strstr(t, truncate_it ? "truncated" : "vanished"))
        ZT_FAIL("the log does not name %s as %s:\n%s", victim,
                truncate_it ? "truncated" : "vanished", t);
    free(t);
    ZT_CHECK_EQ(zt_verify_count("run", 0), 0);
}

ZT_TEST(offload_swap_file_deleted_mid_run)
{
    damage_mid_run(0);
}

ZT_TEST(offload_swap_file_truncated_mid_run)
{
    damage_mid_run(1);
}

ZT_TEST(offload_swap_path_on_a_full_filesystem)
{
    ZT_CHECK(mkdir("small", 0755) == 0);
    if (mount("zt", "small", "tmpfs", 0, "size=64k") < 0)
        ZT_SKIP("cannot mount a small tmpfs here (%s)", strerror(errno));
    /* a first run without offload leaves a checkpoint; the offloaded resume cannot allocate
     * its swap files and must stop before touching it */
    zt_zrun_ok("--model " MODEL " --batch 4 --steps 2 --threads 1 --ckpt-dir run", "a.log");
    int st = zt_zrun("--model " MODEL " --batch 4 --steps 4 --threads 1 --nproc 2 --zero 3 "
                  "--ckpt-dir run --offload-optimizer nvme --offload-params nvme "
                  "--nvme-path small", "b.log");
    char *t = zt_slurp("b.log");
    umount("small");
    ZT_CHECK(st != 0);
    if (!strstr(t, "small/zrun-swap-rank") || !strstr(t, "allocating"))
        ZT_FAIL("no clear error naming the swap file:\n%s", t);
    free(t);
    char *latest;
    ZT_OK(zck_latest(&latest, "run"));
    ZT_CHECK(strstr(latest, "step-00000002"));
    ZT_CHECK_EQ(zt_verify_count(latest, 0), 0);
    free(latest);
}

ZT_TEST(offload_save_and_resume_either_way)
{
    const char *common = "--model " MODEL " --batch 4 --steps 12 --warmup 3 --lr 3e-3 "
                         "--threads 1 --nproc 2 --zero 3";
    zt_zrunf_ok("straight.log", "%s --ckpt-dir straight", common);
    /* offloaded first half, plain second half */
    zt_zrunf_ok("a1.log", "%s --ckpt-dir a --stop-after 6 --offload-optimizer nvme "
                "--offload-params nvme " NVME, common);
    zt_zrunf_ok("a2.log", "%s --ckpt-dir a", common);
    zt_same_latest("straight", "a", 0, 0);
    /* plain first half, offloaded second half (at another world size and stage too) */
    zt_zrunf_ok("b1.log", "%s --ckpt-dir b --stop-after 6", common);
    zt_zrunf_ok("b2.log", "%s --ckpt-dir b --offload-optimizer nvme --offload-params "
                "nvme " NVME, common);
    zt_same_latest("straight", "b", 0, 0);
    zt_zrunf_ok("c1.log", "--model " MODEL " --batch 4 --steps 12 --warmup 3 --lr 3e-3 "
                "--threads 1 --nproc 1 --zero 1 --ckpt-dir c --stop-after 6");
    zt_zrunf_ok("c2.log", "--model " MODEL " --batch 4 --steps 12 --warmup 3 --lr 3e-3 "
                "--threads 1 --nproc 2 --zero 3 --ckpt-dir c --offload-optimizer nvme " NVME);
    zt_file_has("c2.log", "(world 1, ZeRO 1; every file hashed");
}

ZT_TEST(offload_stale_swap_directory)
{
    /* a crashed run's directory: owner pid gone, a leftover swap file */
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    ZT_CHECK(mkdir("swap", 0755) == 0 && mkdir("swap/zrun-swap-rank0", 0700) == 0);
    char text[64];
    snprintf(text, sizeof text, "%d\n", (int)dead);
    zt_write_file("swap/zrun-swap-rank0/owner", text);
    zt_write_file("swap/zrun-swap-rank0/optimizer.swap", "old state");
    const char *args = "--model " MODEL " --batch 4 --steps 2 --threads 1 --ckpt-dir run "
                       "--offload-optimizer nvme " NVME;
    zt_zrun_ok(args, "a.log");
    char *t = zt_slurp("a.log");
    if (!strstr(t, "stale swap directory"))
        ZT_FAIL("the stale directory was not reported:\n%s", t);
    free(t);
    struct stat st;
    ZT_CHECK(stat("swap/zrun-swap-rank0", &st) < 0);
    /* a live owner: refused */
    ZT_CHECK(mkdir("swap/zrun-swap-rank0", 0700) == 0);
    snprintf(text, sizeof text, "%d\n", (int)getpid());
    zt_write_file("swap/zrun-swap-rank0/owner", text);
    ZT_CHECK(zt_zrun(args, "b.log") != 0);
    t = zt_slurp("b.log");
    if (!strstr(t, "in use by a running process"))
        ZT_FAIL("a live swap directory was not refused:\n%s", t);
    free(t);
}

/* The optimizer states of the first chunks are read during the backward (before the gradients
 * are final), the rest in a window behind the update: with many small chunks, a window of 2 or
 * 3 staging sets that wraps around hundreds of times, and several backward passes per step
 * (accumulation: the read-ahead starts once), the run stays bit-identical to one in memory.
 * (At stage 3 the second case runs the deferred update instead: the same pipeline per group.) */
ZT_TEST(offload_read_ahead_is_byte_identical)
{
    static const offload_case c[] = {
        {2, 2, "--offload-optimizer nvme --offload-buffers 2 --aio-block-size 4096"},
        {2, 3, "--offload-optimizer nvme --offload-params nvme --offload-buffers 3 "
               "--aio-block-size 4096"}};
    const char *common = "--model " MODEL " --batch 4 --micro-batch 1 --steps 6 --warmup 2 "
                         "--lr 3e-3 --threads 1";
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        same_run_offloaded(i, common, &c[i]);
}

/* Checkpoints dir_a/step-N and dir_b/step-N the same bit for bit. */
static void same_step(const char *a, const char *b, unsigned step)
{
    char pa[64], pb[64];
    snprintf(pa, sizeof pa, "%s/step-%08u", a, step);
    snprintf(pb, sizeof pb, "%s/step-%08u", b, step);
    zck_diff *d;
    ZT_OK(zck_diff_run(&d, pa, pb, NULL));
    if (!d->all_match)
        ZT_FAIL("%s and %s differ", pa, pb);
    zck_diff_free(d);
}

/* Stage 3 with NVMe defers each group's update to just before the next step's gather of it
 * (zero.c): bit for bit the in-memory run's losses, evaluations, samples and checkpoints,
 * through gradient accumulation, saves with updates pending (steps 4 and 8: no evaluation
 * before them to apply the updates through its gathers), samples (steps 5 and 10), a stop with
 * updates pending (step 7) and a resume, at W=1 and W=2, optimizer alone and with params. */
ZT_TEST(offload_deferred_update_is_byte_identical)
{
    static const offload_case c[] = {{2, 3, "--offload-optimizer nvme --offload-params nvme"},
                                     {2, 3, "--offload-optimizer nvme"},
                                     {1, 3, "--offload-optimizer nvme --offload-params nvme"}};
    const char *common = "--model " MODEL " --batch 4 --micro-batch 1 --steps 10 --warmup 3 "
                         "--lr 3e-3 --threads 1 --eval-every 3 --sample-every 5 --prompt ab "
                         "--save-every 4";
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        offload_run o = same_run_offloaded(i, common, &c[i]); /* straight through */
        same_step(o.ref, o.off, 4);
        same_step(o.ref, o.off, 8);
        /* the first 7 steps, then a resume to the end */
        zt_zrunf_ok("r1.log", "%s --ckpt-dir ref-half --stop-after 7", o.args);
        zt_zrunf_ok("o1.log", "%s --ckpt-dir off-half --stop-after 7 %s", o.args, o.extra);
        same_step("ref-half", "off-half", 7);
        zt_zrunf_ok("o2.log", "%s --ckpt-dir off-half %s", o.args, o.extra);
        zt_file_has("o2.log", "done at step 10/10");
        same_step(o.ref, "off-half", 10);
        ZT_CHECK(system("rm -rf ref-half off-half") == 0);
    }
}
