/*
 * test_restart.c: checkpoint-centric runs through the real zrun: a run whose ranks are
 * SIGKILLed at random instants (single ranks, and all ranks at once) and restarted by
 * --max-restarts ends byte-identical to an uninterrupted run; SIGKILL during asynchronous saves
 * never leaves `latest` naming anything but a sound checkpoint; a damaged newest checkpoint
 * is moved aside and the run falls back to the previous one, and a run whose every
 * checkpoint is damaged stops instead of starting over; a full disk during an asynchronous
 * save stops the run uncommitted with the file named; SIGTERM to the launcher saves and exits 0 with the path in
 * the last line; --verify-on-resume says what it checked.
 */
#include "ckutil.h"
#include "zr.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define MODEL "gpt2:layers=2,heads=2,dim=64,ctx=32,vocab=256"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Start zrun with args in the background, output to log. */
static pid_t zrun_bg(const char *args, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "exec %s %s", zt_zrun_path(), args);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* The pids of the launcher's rank processes (children of pid with ZR_RANK set). */
static size_t rank_pids(pid_t launcher, pid_t *out, size_t cap)
{
    pid_t kids[64];
    int nk = zt_children(launcher, kids, 64);
    size_t n = 0;
    for (int k = 0; k < nk && n < cap; k++)
        if (zt_rank_of(kids[k]) >= 0)
            out[n++] = kids[k];
    return n;
}

/* Wait until the launcher runs `want` ranks none of which is in old[]; 0 on timeout. */
static int wait_new_ranks(pid_t launcher, size_t want, const pid_t *old, size_t n_old)
{
    for (int i = 0; i < 3000; i++) {
        pid_t p[16];
        size_t n = rank_pids(launcher, p, 16), fresh = 0;
        for (size_t a = 0; a < n; a++) {
            int seen = 0;
            for (size_t b = 0; b < n_old; b++)
                seen |= p[a] == old[b];
            fresh += !seen;
        }
        if (n == want && fresh == want)
            return 1;
        sleep_ms(5);
    }
    return 0;
}

static void latest_is_sound(const char *run)
{
    char *p;
    if (zck_latest(&p, run) != 0) {
        zr_err_clear();
        return; /* nothing committed yet */
    }
    ZT_CHECK(strstr(p, "/step-") && !strstr(p, ".tmp"));
    ZT_CHECK_EQ(zt_verify_count(p, 0), 0);
    free(p);
}

ZT_TEST(restart_after_sigkills_matches_an_uninterrupted_run)
{
    const char *common = "--model " MODEL " --batch 4 --steps 800 --warmup 5 --lr 3e-3 "
                         "--threads 1 --nproc 2 --zero 3 --save-every 10 --keep-last 3";
    char args[2048];
    ZT_CHECK_EQ(zt_zrunf("straight.log", "%s --ckpt-dir straight", common), 0);
    snprintf(args, sizeof args, "%s --ckpt-dir run --max-restarts 3 --restart-backoff 0",
             common);
    pid_t launcher = zrun_bg(args, "run.log");
    srand((unsigned)getpid());
    pid_t old[16];
    size_t n_old = 0;
    for (int round = 0; round < 3; round++) {
        ZT_CHECK(wait_new_ranks(launcher, 2, old, n_old));
        sleep_ms(60 + rand() % 140);
        n_old = rank_pids(launcher, old, 16);
        ZT_CHECK_EQ(n_old, 2);
        if (round == 1) { /* every rank at once, as a whole job's SIGKILL */
            kill(old[0], SIGKILL);
            kill(old[1], SIGKILL);
        } else
            kill(old[rand() % 2], SIGKILL);
        printf("  round %d: SIGKILL to %s\n", round, round == 1 ? "both ranks" : "one rank");
    }
    int status;
    ZT_CHECK(waitpid(launcher, &status, 0) == launcher);
    char *t = zt_slurp("run.log");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        ZT_FAIL("the restarted run failed:\n%s", t);
    ZT_CHECK(strstr(t, "restart 3 of 3"));
    free(t);
    zt_same_latest("straight", "run", 0, 0);
}

ZT_TEST(restart_sigkill_during_async_saves_keeps_latest_sound)
{
    /* a save after every step: the ranks die with writes in flight */
    srand((unsigned)getpid() * 7u);
    int rounds = zt_stress() ? 30 : 4;
    for (int i = 0; i < rounds; i++) {
        pid_t launcher = zrun_bg("--model gpt2:layers=4,heads=4,dim=128,ctx=32,vocab=256 "
                                 "--batch 4 --steps 100000 --threads 1 --nproc 2 --zero 1 "
                                 "--save-every 1 --keep-last 2 --ckpt-dir run", "run.log");
        ZT_CHECK(wait_new_ranks(launcher, 2, NULL, 0));
        sleep_ms(300 + rand() % 500);
        pid_t p[16];
        size_t n = rank_pids(launcher, p, 16);
        for (size_t k = 0; k < n; k++)
            kill(p[k], SIGKILL);
        int status;
        waitpid(launcher, &status, 0);
        ZT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
        latest_is_sound("run");
    }
    /* and the run resumes from it */
    ZT_CHECK_EQ(zt_zrun("--model gpt2:layers=4,heads=4,dim=128,ctx=32,vocab=256 --batch 4 "
                     "--threads 1 --nproc 2 --zero 1 --ckpt-dir run --stop-after 1", "r.log"),
                0);
}

ZT_TEST(restart_falls_back_from_a_damaged_checkpoint)
{
    const char *common = "--model " MODEL " --batch 4 --warmup 5 --lr 3e-3 --threads 1 "
                         "--save-every 10 --keep-last 3 --ckpt-dir run";
    ZT_CHECK_EQ(zt_zrunf("a.log", "%s --steps 20", common), 0);
    zt_flip_byte("run/step-00000020/shard-00000-of-00001.bin", 1000);
    /* the resume finds step 20 damaged, moves it aside, falls back to step 10, says so, and
     * finishes (saving step 20 again) without needing a restart */
    int st = zt_zrunf("b.log", "%s --steps 30 --max-restarts 1 --restart-backoff 0", common);
    char *t = zt_slurp("b.log");
    if (st != 0 || !strstr(t, "step-00000020 does not verify") ||
        !strstr(t, "moved aside to run/damaged-step-00000020") ||
        !strstr(t, "falling back") || !strstr(t, "resumed from run/step-00000010") ||
        strstr(t, "restart 1"))
        ZT_FAIL("exit %d; no fallback to step 10:\n%s", st, t);
    free(t);
    latest_is_sound("run");
    /* every checkpoint damaged: a clear error, no silent fresh start */
    ZT_CHECK_EQ(zt_zrun("--model " MODEL " --batch 4 --threads 1 --save-every 10 --ckpt-dir run2 "
                     "--steps 20", "c.log"), 0);
    zt_flip_byte("run2/step-00000010/shard-00000-of-00001.bin", 1000);
    zt_flip_byte("run2/step-00000020/shard-00000-of-00001.bin", 1000);
    st = zt_zrun("--model " MODEL " --batch 4 --threads 1 --save-every 10 --ckpt-dir run2 "
              "--steps 30 --max-restarts 2 --restart-backoff 0", "d.log");
    t = zt_slurp("d.log");
    if (st == 0 || !strstr(t, "none of its 2 checkpoints verifies") ||
        strstr(t, "training a "))
        ZT_FAIL("exit %d; expected a refusal to start over:\n%s", st, t);
    free(t);
}

ZT_TEST(restart_disk_full_during_async_save)
{
    ZT_CHECK(mkdir("small", 0755) == 0);
    /* one checkpoint of this model is about 1.4 MiB: the first fits, the second does not */
    if (mount("zt", "small", "tmpfs", 0, "size=2m") < 0)
        ZT_SKIP("cannot mount a small tmpfs here (%s)", strerror(errno));
    int st = zt_zrun("--model " MODEL " --batch 4 --steps 40 --threads 1 --save-every 5 "
                  "--keep-last 3 --ckpt-dir small/run", "a.log");
    char *t = zt_slurp("a.log");
    char *latest = NULL;
    int lrc = zck_latest(&latest, "small/run");
    size_t problems = lrc == 0 ? zt_verify_count(latest, 0) : 99;
    umount("small");
    if (st == 0 || !strstr(t, "small/run/.tmp-step-00000010") || !strstr(t, "No space"))
        ZT_FAIL("exit %d; expected the full disk named at the step-10 save:\n%s", st, t);
    free(t);
    ZT_CHECK_EQ(lrc, 0);
    ZT_CHECK(strstr(latest, "step-00000005"));
    ZT_CHECK_EQ(problems, 0);
    free(latest);
}

ZT_TEST(restart_preemption_saves_and_exits_zero)
{
    pid_t launcher = zrun_bg("--model " MODEL " --batch 4 --steps 100000 --threads 1 --nproc 2 "
                             "--zero 2 --save-every 50 --ckpt-dir run --max-restarts 2",
                             "run.log");
    ZT_CHECK(wait_new_ranks(launcher, 2, NULL, 0));
    sleep_ms(700);
    kill(launcher, SIGTERM);
    int status;
    ZT_CHECK(waitpid(launcher, &status, 0) == launcher);
    char *t = zt_slurp("run.log");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        ZT_FAIL("preempted run did not exit 0:\n%s", t);
    /* the last line names the checkpoint, which verifies */
    size_t len = strlen(t);
    while (len && t[len - 1] == '\n')
        t[--len] = 0;
    char *last = strrchr(t, '\n');
    last = last ? last + 1 : t;
    char *at = strstr(last, "run/step-");
    if (!at)
        ZT_FAIL("the last line does not name the checkpoint: %s", last);
    char path[256];
    snprintf(path, sizeof path, "%.*s", (int)strcspn(at, " \n;)"), at);
    ZT_CHECK_EQ(zt_verify_count(path, 0), 0);
    ZT_CHECK(!strstr(t, "restart 1"));
    free(t);
}

ZT_TEST(restart_verify_on_resume_modes)
{
    ZT_CHECK_EQ(zt_zrun("--model " MODEL " --batch 4 --steps 4 --threads 1 --ckpt-dir run",
                     "a.log"), 0);
    static const char *mode[3] = {"full", "quick", "off"};
    static const char *says[3] = {"every file hashed", "quick check (files present",
                                  "quick check, no hashing (--verify-on-resume off)"};
    for (int i = 0; i < 3; i++) {
        char log[32];
        snprintf(log, sizeof log, "v%d.log", i);
        zt_zrunf_ok(log, "--model %s --batch 4 --steps %d --threads 1 --ckpt-dir run "
                    "--verify-on-resume %s", MODEL, 5 + i, mode[i]);
        char *t = zt_slurp(log);
        if (!strstr(t, says[i]) || !strstr(t, "continuing at step"))
            ZT_FAIL("--verify-on-resume %s: the resume line does not say '%s':\n%s", mode[i],
                    says[i], t);
        free(t);
    }
    /* a bit flip: full catches it, quick does not look at the bytes */
    char *p;
    ZT_OK(zck_latest(&p, "run"));
    char f[512];
    snprintf(f, sizeof f, "%s/shard-00000-of-00001.bin", p);
    zt_flip_byte(f, 2000);
    ZT_CHECK_EQ(zt_zrun("--model " MODEL " --batch 4 --steps 9 --threads 1 --ckpt-dir run "
                     "--verify-on-resume full", "f.log"), 0);
    char *t = zt_slurp("f.log");
    ZT_CHECK(strstr(t, "step-00000007 does not verify (shard-00000-of-00001.bin: hash "
                       "mismatch") && strstr(t, "resumed from run/step-00000006"));
    free(t);
    free(p);
}

/* A full disk with --keep-last 3: the failed save's hint names zckpt prune; a restart with
 * --keep-last 1 applies it to the checkpoints there before its first save (never to what latest
 * names), so the save fits and the run ends (it failed again at the same save: issue 24). */
ZT_TEST(restart_lower_keep_last_prunes_before_the_first_save)
{
    ZT_CHECK(mkdir("small", 0755) == 0);
    /* a checkpoint of this model is about 1.4 MiB: two fit in 3.5 MiB, three do not */
    if (mount("zt", "small", "tmpfs", 0, "size=3500k") < 0)
        ZT_SKIP("cannot mount a small tmpfs here (%s)", strerror(errno));
    const char *m = "--model " MODEL " --batch 4 --threads 1 --save-every 5 --async-save off "
                    "--ckpt-dir small/run";
    int st = zt_zrunf("a.log", "%s --steps 20 --keep-last 3", m);
    int st2 = zt_zrunf("b.log", "%s --steps 20 --keep-last 1", m);
    char *latest = NULL;
    int lrc = zck_latest(&latest, "small/run");
    struct stat sb;
    int five = stat("small/run/step-00000005", &sb) == 0, ten = stat("small/run/step-00000010",
                                                                     &sb) == 0;
    size_t problems = lrc == 0 ? zt_verify_count(latest, 0) : 99;
    umount("small");
    char *a = zt_slurp("a.log"), *b = zt_slurp("b.log");
    if (st == 0 || !strstr(a, "No space") ||
        !strstr(a, "hint: the disk is full: free space with `zckpt prune small/run --keep-last K`"))
        ZT_FAIL("exit %d; expected the full disk at the step-15 save, with the hint:\n%s", st, a);
    if (st2 != 0 || !strstr(b, "retention (--keep-last 1) before the first save removed "
                               "step-00000005\n"))
        ZT_FAIL("exit %d; expected step 5 pruned before the first save:\n%s", st2, b);
    free(a);
    free(b);
    ZT_CHECK_EQ(lrc, 0);
    ZT_CHECK(latest && strstr(latest, "step-00000020"));
    ZT_CHECK(!five && !ten);
    ZT_CHECK_EQ(problems, 0);
    free(latest);
}
