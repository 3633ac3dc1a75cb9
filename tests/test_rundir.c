/*
 * test_rundir.c: one job per run directory and nothing lost or left behind (issue 13): the run
 * directory lock (a second taker is refused naming the holder, a dead holder's lock is taken
 * over, prune/reshard/unpack and zrun respect it), --force replacing only zckpt directories
 * that are not the source, failed saves removing their staging, retention deleting only what
 * the format wrote, and `zckpt verify` on run directories.
 */
#include "ckutil.h"
#include "zfmt.h"
#include "zr.h"

#include <dirent.h>
#include <stdbool.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const uint64_t sizes[] = {20000, 65, 3};

static bool present(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

/* a name in dir starting with prefix */
static bool has_entry(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    bool r = false;
    struct dirent *de;
    while (d && (de = readdir(d)))
        r = r || !strncmp(de->d_name, prefix, strlen(prefix));
    if (d)
        closedir(d);
    return r;
}

ZT_TEST(rundir_lock_refuses_a_second_job_and_takes_over_a_dead_one)
{
    zck_layout *L = zt_layout(3, sizes);
    free(zt_save("run", L, 2, 5, 5, 0));
    zck_lock *a = NULL, *b = NULL;
    ZT_OK(zck_run_lock(&a, "run", "zrun"));
    char host[256], want[300];
    gethostname(host, sizeof host);
    snprintf(want, sizeof want, "in use by zrun (pid %ld on host %s)", (long)getpid(), host);
    ZT_ERR(zck_run_lock(&b, "run", "prune"), ZR_EBUSY, want);
    zck_prune_opts po = ZCK_PRUNE_OPTS_INIT;
    po.keep_last = 1;
    ZT_ERR(zck_prune(NULL, "run", &po), ZR_EBUSY, "in use by zrun");
    ZT_ERR(zck_reshard(NULL, "run", "run", 3, NULL), ZR_EBUSY, "in use by zrun");
    ZT_OK(zfmt_pack("run", "run.tar", NULL));
    ZT_ERR(zfmt_unpack("run.tar", "run", NULL), ZR_EBUSY, "in use by zrun");
    zck_run_list *l;
    ZT_OK(zck_run_list_open(&l, "run"));
    ZT_CHECK(l->holder && strstr(l->holder, "zrun"));
    zck_run_list_free(l);
    zck_run_unlock(a);
    ZT_CHECK(!present("run/.lock"));
    ZT_OK(zck_run_lock(&b, "run", "prune"));
    zck_run_unlock(b);

    /* a holder in another process, then killed: its lock file stays, the lock is taken over */
    int pfd[2];
    ZT_CHECK(pipe(pfd) == 0);
    pid_t c = fork();
    if (c == 0) {
        zck_lock *k = NULL;
        char x = zck_run_lock(&k, "run", "zrun") == 0 ? 'y' : 'n';
        if (write(pfd[1], &x, 1) != 1)
            _exit(3);
        pause();
        _exit(0);
    }
    char x = 0;
    ZT_CHECK(read(pfd[0], &x, 1) == 1 && x == 'y');
    snprintf(want, sizeof want, "pid %ld on host %s", (long)c, host);
    ZT_ERR(zck_run_lock(&b, "run", "zrun"), ZR_EBUSY, want);
    kill(c, SIGKILL);
    waitpid(c, NULL, 0);
    ZT_CHECK(present("run/.lock"));
    ZT_OK(zck_run_lock(&b, "run", "zrun"));
    zck_run_unlock(b);
    close(pfd[0]);
    close(pfd[1]);
    zck_layout_free(L);
}

ZT_TEST(rundir_two_zrun_jobs_on_one_directory)
{
    const char *args = "--model gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256 --batch 4 "
                       "--steps 100000 --threads 1 --save-every 5 --ckpt-dir run";
    pid_t p = zt_spawn_zrun("", args, "a.log");
    for (int i = 0; i < 400 && !present("run/.lock"); i++)
        usleep(25000);
    ZT_CHECK(present("run/.lock"));
    int st = zt_zrun("--model gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256 --batch 4 "
                     "--steps 3 --threads 1 --ckpt-dir run", "b.log");
    kill(p, SIGTERM);
    zt_wait_status(p);
    char *t = zt_slurp("b.log");
    if (st == 0 || !strstr(t, "in use by zrun (pid"))
        ZT_FAIL("second job: exit %d, expected a refusal naming the first:\n%s", st, t);
    free(t);
}

static int fail_manifest(zck_op op, const char *path, void *ctx)
{
    (void)ctx;
    size_t n = strlen(path);
    return op == ZCK_OP_OPEN && n >= 13 && !strcmp(path + n - 13, "manifest.json") ? ENOSPC
                                                                                    : 0;
}

ZT_TEST(rundir_failed_save_leaves_no_staging)
{
    for (int async = 0; async < 2; async++) {
        const char *dir = async ? "run-async" : "run-sync";
        zr_train_opts o = ZR_TRAIN_OPTS_INIT;
        o.model = "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256";
        o.batch = 4;
        o.steps = 4;
        o.save_every = 2;
        o.async_save = async;
        o.ckpt_dir = dir;
        o.threads = 1;
        zr_train_result res;
        zck_fault_set(fail_manifest, NULL);
        int rc = zr_train(&res, &o);
        zck_fault_set(NULL, NULL);
        ZT_CHECK(rc < 0);
        ZT_CHECK(strstr(zr_err_msg(), "manifest.json"));
        if (has_entry(dir, ".tmp-step-"))
            ZT_FAIL("%s: a failed save left its staging directory", dir);
        ZT_CHECK(!present(async ? "run-async/.lock" : "run-sync/.lock"));
    }
}

ZT_TEST(rundir_abandoned_staging_listed_and_pruned_at_any_step)
{
    zck_layout *L = zt_layout(3, sizes);
    free(zt_save("run", L, 2, 5, 5, 0));
    ZT_OK(zck__mkdir_for_tests("run/.tmp-step-00000010-00000000000000aa"));
    zt_write_file("run/.tmp-step-00000010-00000000000000aa/shard-00000-of-00002.bin", "x");
    zck_run_list *l;
    ZT_OK(zck_run_list_open(&l, "run"));
    ZT_CHECK_EQ(l->stale.n, 1);
    zck_run_list_free(l);
    /* held by a live job: in flight, neither listed as abandoned nor pruned */
    zck_lock *k = NULL;
    ZT_OK(zck_run_lock(&k, "run", "zrun"));
    ZT_OK(zck_run_list_open(&l, "run"));
    ZT_CHECK_EQ(l->stale.n, 0);
    zck_run_list_free(l);
    zck_prune_opts po = ZCK_PRUNE_OPTS_INIT;
    po.keep_last = 1;
    ZT_ERR(zck_prune(NULL, "run", &po), ZR_EBUSY, "in use");
    ZT_CHECK(present("run/.tmp-step-00000010-00000000000000aa"));
    zck_run_unlock(k);
    zck_namelist rm = {0, NULL};
    ZT_OK(zck_prune(&rm, "run", &po));
    ZT_CHECK_EQ(rm.n, 1);
    zck_namelist_free(&rm);
    ZT_CHECK(!present("run/.tmp-step-00000010-00000000000000aa"));
    /* without latest (the first save failed): still collected */
    ZT_OK(zck__mkdir_for_tests("fresh"));
    ZT_OK(zck__mkdir_for_tests("fresh/.tmp-step-00000001-00000000000000bb"));
    ZT_OK(zck_prune(NULL, "fresh", &po));
    ZT_CHECK(!present("fresh/.tmp-step-00000001-00000000000000bb"));
    zck_layout_free(L);
}

ZT_TEST(rundir_retention_deletes_only_what_the_format_wrote)
{
    zck_layout *L = zt_layout(3, sizes);
    for (uint64_t s = 1; s <= 3; s++)
        free(zt_save("run", L, 2, s, s, 0));
    zt_write_file("run/step-00000001/thesis.tex", "\\documentclass{article}\n");
    ZT_OK(zck__mkdir_for_tests("run/.tmp-step-00000002-00000000000000cc"));
    zt_write_file("run/.tmp-step-00000002-00000000000000cc/notes.txt", "mine\n");
    ZT_OK(zck__mkdir_for_tests("run/.del-step-00000000-1"));
    ZT_OK(zck__mkdir_for_tests("run/.del-step-00000000-1/sub"));
    zck_prune_opts po = ZCK_PRUNE_OPTS_INIT;
    po.keep_last = 1;
    zck_namelist rm = {0, NULL};
    ZT_OK(zck_prune(&rm, "run", &po));
    ZT_CHECK_EQ(rm.n, 1); /* step 2 only */
    zck_namelist_free(&rm);
    ZT_CHECK(!present("run/step-00000002"));
    ZT_CHECK(present("run/step-00000001/thesis.tex"));
    ZT_CHECK(present("run/.tmp-step-00000002-00000000000000cc/notes.txt"));
    ZT_CHECK(present("run/.del-step-00000000-1/sub"));
    /* the same after a commit's own retention */
    free(zt_save("run", L, 2, 4, 4, 1));
    ZT_CHECK(present("run/step-00000001/thesis.tex"));
    ZT_CHECK(!present("run/step-00000003"));
    zck_layout_free(L);
}

static void expect(int code, const char *text, const char *args)
{
    char *o;
    int rc = zt_zckpt(&o, "%s", args);
    if (rc != code || !strstr(o, text))
        ZT_FAIL("zckpt %s: exit %d (expected %d), output lacks '%s':\n%s", args, rc, code, text,
                o);
    free(o);
}

ZT_TEST(rundir_force_replaces_only_zckpt_outputs)
{
    zck_layout *L = zt_layout(3, sizes);
    ZT_OK(zck__mkdir_for_tests("top"));
    free(zt_save("top/src", L, 2, 5, 5, 0));
    ZT_OK(zck__mkdir_for_tests("mine"));
    zt_write_file("mine/thesis.tex", "x\n");
    expect(2, "mine: not a zckpt run or checkpoint directory", "reshard top/src --world 3 -o mine --force");
    ZT_CHECK(present("mine/thesis.tex"));
    expect(2, "is the source", "reshard top/src --world 3 -o top/src --force");
    expect(2, "is the source", "consolidate top/src -o top --force");
    expect(2, "is the source", "reshard top/src/step-00000005 --world 3 -o top/src --force");
    ZT_CHECK(present("top/src/step-00000005/manifest.json"));
    expect(0, "world 3", "reshard top/src --world 3 -o out");
    expect(0, "world 2", "reshard top/src --world 2 -o out --force");
    zck_lock *k = NULL;
    ZT_OK(zck_run_lock(&k, "out", "zrun"));
    expect(2, "in use by zrun", "reshard top/src --world 3 -o out --force");
    zck_run_unlock(k);
    ZT_ERR(zck_check_replaceable("mine", NULL), ZR_EEXIST, "mine");
    ZT_OK(zck_check_replaceable("nothing-here", "top/src"));
    zck_layout_free(L);
}

ZT_TEST(rundir_verify_names_the_step)
{
    zck_layout *L = zt_layout(3, sizes);
    free(zt_save("run", L, 2, 100, 1, 0));
    free(zt_save("run", L, 2, 200, 2, 0));
    expect(0, "run: step-00000200 (latest): sound", "verify run");
    char *o;
    ZT_CHECK_EQ(zt_zckpt(&o, "verify --all run"), 0);
    ZT_CHECK(strstr(o, "run: step-00000100: sound") && strstr(o, "step-00000200 (latest)"));
    free(o);
    zt_flip_byte("run/step-00000100/shard-00001-of-00002.bin", 7);
    expect(0, "sound", "verify run");
    expect(1, "step-00000100/shard-00001-of-00002.bin: hash mismatch", "verify run --all");
    ZT_CHECK(unlink("run/latest") == 0);
    expect(1, "run: no 'latest' file", "verify run");
    ZT_CHECK_EQ(zt_zckpt(&o, "verify run"), 1);
    ZT_CHECK(!strstr(o, "manifest.json"));
    free(o);
    zck_layout_free(L);
}

/* RUN/train.jsonl as a symbolic link (to a file outside the run directory) is refused, naming
 * it, before any step; the file it names is left as it was (zrun appended to it: issue 24). A
 * link outside the run directory is still followed (a log kept elsewhere). */
ZT_TEST(rundir_json_log_symlink_inside_refused)
{
    const char *args = "--model gpt2:layers=1,heads=2,dim=32,ctx=32,vocab=256 --batch 4 "
                       "--steps 2 --threads 1 --ckpt-dir run";
    ZT_OK(zck__mkdir_for_tests("run"));
    zt_write_file("outside.jsonl", "{\"mine\":1}\n");
    ZT_CHECK_EQ(symlink("../outside.jsonl", "run/train.jsonl"), 0);
    ZT_CHECK_EQ(zt_zrun(args, "a.log"), 2);
    zt_file_has("a.log", "--log-json run/train.jsonl: a symbolic link inside the run directory "
                         "run");
    zt_file_lacks("a.log", "step      1");
    char *t = zt_slurp("outside.jsonl");
    ZT_CHECK(!strcmp(t, "{\"mine\":1}\n"));
    free(t);
    ZT_CHECK(!present("run/latest"));
    /* named explicitly, through a path that reaches the run directory another way: the same */
    ZT_CHECK_EQ(symlink("run", "alias"), 0);
    ZT_CHECK_EQ(zt_zrunf("b.log", "%s --log-json alias/train.jsonl", args), 2);
    zt_file_has("b.log", "a symbolic link inside the run directory");
    /* a link kept outside the run directory is followed */
    ZT_CHECK_EQ(symlink("outside.jsonl", "log-link.jsonl"), 0);
    ZT_CHECK_EQ(unlink("run/train.jsonl"), 0);
    zt_zrunf_ok("c.log", "%s --log-json log-link.jsonl", args);
    zt_file_has("outside.jsonl", "\"step\":2");
    ZT_CHECK(present("run/latest"));
}

/* zck_prune_held: retention by the job holding the lock (zck_prune would be refused by it),
 * keeping latest and also_keep (the checkpoint a run resumed from) besides the newest K. */
ZT_TEST(rundir_prune_held_keeps_latest_and_the_resume_source)
{
    zck_layout *L = zt_layout(3, sizes);
    for (uint64_t s = 1; s <= 4; s++)
        free(zt_save("run", L, 2, s, s, 0));
    zck_prune_opts po = ZCK_PRUNE_OPTS_INIT;
    po.keep_last = 1;
    ZT_ERR(zck_prune_held(NULL, NULL, "run", NULL, &po), ZR_EINVAL, "without the run");
    zck_lock *k = NULL;
    ZT_OK(zck_run_lock(&k, "run", "zrun"));
    ZT_ERR(zck_prune(NULL, "run", &po), ZR_EBUSY, "in use");
    zck_namelist rm = {0, NULL};
    ZT_OK(zck_prune_held(&rm, k, "run", "run/step-00000002", &po));
    ZT_CHECK_EQ(rm.n, 2);
    zck_namelist_free(&rm);
    ZT_CHECK(!present("run/step-00000001") && !present("run/step-00000003"));
    ZT_CHECK(present("run/step-00000002") && present("run/step-00000004"));
    zck_run_unlock(k);
    zck_layout_free(L);
}
