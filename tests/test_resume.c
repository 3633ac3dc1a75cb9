/*
 * test_resume.c: the one resume policy (zck_resume_pick) through zr_train's --resume auto, the
 * restart supervisor (zr_supervise, with a shell script as the ranks, and zrun
 * --max-restarts): a damaged newest checkpoint (shard missing, truncated, SHA256SUMS missing,
 * manifest.json edited, directory renamed so its name disagrees with its manifest) is moved
 * aside with its name and its problem said, the run falls back to the newest sound one and
 * saves the damaged step again without a collision, ending byte-identical to a straight run;
 * the interrupted-commit note only when true; zr_train refuses every bad option by name.
 */
#include "ckutil.h"
#include "zr.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <errno.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SMALL ZT_SMALL

/* the shared small run (ckutil.h), saving every 10 steps and keeping every checkpoint */
static zr_train_opts small_opts(const char *dir, uint64_t steps)
{
    zr_train_opts o = zt_small_opts(dir, steps);
    o.save_every = 10;
    o.keep_last = 0;
    return o;
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* zr_train with its log into a file; the log's text (caller frees) into *log. */
static int train_logged(zr_train_result *r, zr_train_opts *o, char **log)
{
    FILE *f = fopen("train.log", "w");
    ZT_CHECK(f != NULL);
    o->log = f;
    int rc = zr_train(r, o);
    fclose(f);
    o->log = NULL;
    *log = zt_slurp("train.log");
    return rc;
}

/* A run stopped after 20 of 30 steps with checkpoints at 10 and 20 in dir, then damage(dir's
 * step 20), then the resume to 30: the damaged step-20 is moved aside naming `what`, the run
 * resumes from 10, saves step 20 again and ends as the straight run does. */
static void resume_past(const char *dir, void (*damage)(const char *step20), const char *what,
                        const char *aside)
{
    zr_train_opts o = small_opts(dir, 30);
    o.stop_after = 20;
    zr_train_result r;
    ZT_OK(zr_train(&r, &o));
    char p[256], q[256];
    snprintf(p, sizeof p, "%s/step-00000020", dir);
    damage(p);
    o.stop_after = 0;
    char *t = NULL;
    int rc = train_logged(&r, &o, &t);
    snprintf(q, sizeof q, "%s/%s", dir, aside);
    if (rc || r.start_step != 10 || !strstr(t, "does not verify") || !strstr(t, what) ||
        !strstr(t, q) || strstr(t, "interrupted"))
        ZT_FAIL("%s: rc %d (%s), start %llu; expected a move aside to %s naming '%s', no "
                "interrupted-commit note:\n%s", dir, rc, rc ? zr_err_msg() : "",
                (unsigned long long)r.start_step, q, what, t);
    free(t);
    ZT_CHECK(is_dir(q));
    ZT_CHECK_EQ(zt_verify_count(p, 0), 0); /* saved again */
    zt_same_latest("straight", dir, 0, 0);
}

static void rm_shard(const char *d)
{
    char f[512];
    snprintf(f, sizeof f, "%s/shard-00000-of-00001.bin", d);
    ZT_CHECK(unlink(f) == 0);
}

static void cut_shard(const char *d)
{
    char f[512];
    snprintf(f, sizeof f, "%s/shard-00000-of-00001.bin", d);
    zt_truncate(f, 1000);
}

static void rm_sums(const char *d)
{
    char f[512];
    snprintf(f, sizeof f, "%s/SHA256SUMS", d);
    ZT_CHECK(unlink(f) == 0);
}

/* the training section says 28 steps were done (8 skipped); the hash in SHA256SUMS does not
 * match any more */
static void edit_manifest(const char *d)
{
    char f[512], *t = NULL;
    snprintf(f, sizeof f, "%s/manifest.json", d);
    ZT_OK(zck__read_small_for_tests(&t, f));
    char *a = strstr(t, "\"optimizer_step\": 20,");
    ZT_CHECK(a != NULL);
    a[19] = '8';
    zt_write_file(f, t);
    free(t);
}

static void straight(void)
{
    zr_train_opts o = small_opts("straight", 30);
    zr_train_result r;
    ZT_OK(zr_train(&r, &o));
}

ZT_TEST(resume_moves_a_damaged_latest_aside_and_saves_its_step_again)
{
    straight();
    resume_past("missing", rm_shard, "shard-00000-of-00001.bin: missing",
                "damaged-step-00000020");
    resume_past("truncated", cut_shard, "shard-00000-of-00001.bin: truncated",
                "damaged-step-00000020");
    resume_past("nosums", rm_sums, "SHA256SUMS: SHA256SUMS mismatch: missing",
                "damaged-step-00000020");
    /* a second damaged step 20 goes next to the first */
    zr_train_opts o = small_opts("missing", 30);
    rm_shard("missing/step-00000030");
    rm_shard("missing/step-00000020");
    zr_train_result r;
    char *t = NULL;
    ZT_OK(train_logged(&r, &o, &t));
    ZT_CHECK(strstr(t, "moved aside to missing/damaged-step-00000030") &&
             strstr(t, "moved aside to missing/damaged-step-00000020.2"));
    ZT_CHECK_EQ(r.start_step, 10);
    free(t);
    zt_same_latest("straight", "missing", 0, 0);
}

ZT_TEST(resume_refuses_an_edited_manifest)
{
    straight();
    resume_past("edited", edit_manifest, "manifest.json: SHA256SUMS mismatch",
                "damaged-step-00000020");
    /* the only checkpoint edited: an error naming it, nothing moved */
    zr_train_opts o = small_opts("one", 10);
    zr_train_result r;
    ZT_OK(zr_train(&r, &o));
    char *t = NULL;
    ZT_OK(zck__read_small_for_tests(&t, "one/step-00000010/manifest.json"));
    char *a = strstr(t, "\"optimizer_step\": 10,");
    ZT_CHECK(a != NULL);
    a[19] = '8';
    zt_write_file("one/step-00000010/manifest.json", t);
    free(t);
    o.steps = 20;
    ZT_ERR(zr_train(&r, &o), ZR_ECORRUPT, "manifest.json: SHA256SUMS mismatch");
    ZT_CHECK(is_dir("one/step-00000010"));
}

/* Every way of resuming goes through the one check (zck_resume_check / zck_resume_pick): a
 * manifest edited after the commit (next_sample moved on, SHA256SUMS not fixed) is refused naming
 * manifest.json, whether the resume names the run directory, the step directory inside it, a
 * copy of it elsewhere, or is --resume auto, a restart of zrun --max-restarts, or zgen. */
ZT_TEST(resume_every_way_refuses_an_edited_manifest)
{
    const char *zgen = zt_bin("ZT_ZGEN");
    const char *common = "--model " SMALL " --batch 4 --threads 1 --save-every 10 "
                         "--keep-last 0";
    zt_zrunf_ok("a.log", "%s --steps 20 --ckpt-dir run", common);
    char *t = NULL;
    ZT_OK(zck__read_small_for_tests(&t, "run/step-00000020/manifest.json"));
    char *a = strstr(t, "\"next_sample\": 80,");
    ZT_CHECK(a != NULL);
    memcpy(a, "\"next_sample\": 88,", 17);
    zt_write_file("run/step-00000020/manifest.json", t);
    free(t);
    ZT_CHECK(system("cp -r run/step-00000020 copy && cp -r run run2 && cp -r run run3") == 0);
    const char *ways[] = {"run", "run/step-00000020", "copy"};
    for (size_t i = 0; i < 3; i++) {
        for (int v = 0; v < 3; v++) { /* --verify-on-resume full, quick, off: all check it */
            static const char *vn[] = {"full", "quick", "off"};
            int st = zt_zrunf("b.log", "%s --steps 22 --ckpt-dir out%zu%d --resume %s "
                              "--verify-on-resume %s", common, i, v, ways[i], vn[v]);
            char *log = zt_slurp("b.log");
            if (st == 0 || !strstr(log, "manifest.json: SHA256SUMS mismatch") ||
                !strstr(log, "the manifest was edited after the commit") ||
                strstr(log, "resumed from"))
                ZT_FAIL("--resume %s --verify-on-resume %s: exit %d, expected a refusal naming "
                        "manifest.json:\n%s", ways[i], vn[v], st, log);
            free(log);
        }
    }
    ZT_CHECK(is_dir("run/step-00000020")); /* a named checkpoint is never moved */
    /* --resume auto: moved aside, naming the file; the run resumes from step 10 */
    int st = zt_zrunf("c.log", "%s --steps 22 --ckpt-dir run2", common);
    char *log = zt_slurp("c.log");
    if (st != 0 || !strstr(log, "run2/step-00000020 does not verify (manifest.json: SHA256SUMS "
                                "mismatch") || !strstr(log, "resumed from run2/step-00000010"))
        ZT_FAIL("--resume auto: exit %d:\n%s", st, log);
    free(log);
    /* a restart of zrun --max-restarts: the first job fails (--resume never in a run directory
     * with checkpoints), the supervisor's pick moves the edited step aside naming the file, and
     * the restart resumes from step 10 */
    st = zt_zrunf("d.log", "%s --steps 22 --ckpt-dir run3 --resume never --max-restarts 1 "
                  "--restart-backoff 0", common);
    log = zt_slurp("d.log");
    if (st != 0 || !strstr(log, "run3/step-00000020 does not verify (manifest.json: SHA256SUMS "
                                "mismatch") || !strstr(log, "resumed from run3/step-00000010") ||
        !is_dir("run3/damaged-step-00000020"))
        ZT_FAIL("--max-restarts: exit %d:\n%s", st, log);
    free(log);
    /* zgen */
    if (zgen) {
        char *out = NULL;
        int zst = zt_run(&out, zgen, "copy --prompt-ids 1,2 --tokens 2");
        if (zst == 0 || !strstr(out, "manifest.json: SHA256SUMS mismatch"))
            ZT_FAIL("zgen: exit %d, expected a refusal naming manifest.json:\n%s", zst, out);
        free(out);
    }
}

/* The run's own cheap check (its --model against the checkpoint's layout) comes before any
 * hashing: with a newest checkpoint whose damage only hashing finds (a flipped byte) and a
 * --model of another shape, the run stops with "another model shape" at once, and nothing is
 * moved aside (a hash first would have moved it aside, then failed on the older one). */
ZT_TEST(resume_model_mismatch_is_said_before_hashing)
{
    const char *common = "--batch 4 --threads 1 --save-every 10 --keep-last 0 --ckpt-dir run";
    zt_zrunf_ok("a.log", "--model %s %s --steps 20", SMALL, common);
    zt_flip_byte("run/step-00000020/shard-00000-of-00001.bin", 100);
    const char *other = "gpt2:layers=1,heads=2,dim=32,ctx=32,vocab=256";
    const char *how[] = {"", "--resume run/step-00000020", "--resume run"};
    for (size_t i = 0; i < 3; i++) {
        int st = zt_zrunf("b.log", "--model %s %s --steps 30 %s", other, common, how[i]);
        char *t = zt_slurp("b.log");
        if (st == 0 || !strstr(t, "another model shape") || strstr(t, "hash mismatch") ||
            strstr(t, "moved aside"))
            ZT_FAIL("%s: exit %d, expected 'another model shape' before any hashing:\n%s",
                    how[i][0] ? how[i] : "--resume auto", st, t);
        free(t);
        ZT_CHECK(is_dir("run/step-00000020") && !is_dir("run/damaged-step-00000020"));
    }
    /* the right model: the hash finds the damage, auto falls back */
    zt_zrunf_ok("c.log", "--model %s %s --steps 30", SMALL, common);
    zt_file_has("c.log", "moved aside to run/damaged-step-00000020");
}

/* ---------------------------------------------------------------- resource errors */

/* A checkpoint at run/step-<step> whose manifest is large, written as text (the writer's layout
 * checks are quadratic in the tensors of a group): 100 groups of 2000 tensors of 4 elements, one
 * state, one rank, a sparse shard of the right size, SHA256SUMS right for the manifest (the
 * shard's hash is not checked by a quick check). About 17 MB, a few hundred MB to parse. */
static void wide_ckpt(uint64_t step)
{
    char *text = NULL, dir[64], path[128];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ZT_CHECK(f != NULL);
    fprintf(f, "{\"format\":\"zckpt\",\"version\":\"1.0\",\"step\":%llu,\"created\":\"x\","
               "\"producer\":\"test\",\"world_size\":1,\"zero_stage\":0,\"partition_align\":64,"
               "\"file_align\":4096,\"model\":{},\"training\":{},\"dtypes\":{\"f32\":4},"
               "\"states\":[{\"name\":\"param\",\"dtype\":\"f32\"}],\"groups\":[",
            (unsigned long long)step);
    for (int g = 0; g < 100; g++) {
        fprintf(f, "%s{\"name\":\"group%d\",\"numel\":8000,\"tensors\":[", g ? "," : "", g);
        for (int t = 0; t < 2000; t++)
            fprintf(f, "%s{\"name\":\"group%d.tensor%d\",\"dtype\":\"f32\",\"shape\":[4],"
                       "\"offset\":%d}", t ? "," : "", g, t, 4 * t);
        fprintf(f, "]}");
    }
    fprintf(f, "],\"shards\":[{\"file\":\"shard-00000-of-00001.bin\",\"rank\":0,\"bytes\":%d,"
               "\"sha256\":\"%064d\",\"extents\":[", 100 * 32768, 0);
    for (int g = 0; g < 100; g++)
        fprintf(f, "%s{\"group\":%d,\"state\":0,\"start\":0,\"count\":8000,\"offset\":%d}",
                g ? "," : "", g, g * 32768);
    fprintf(f, "]}]}\n");
    fclose(f);
    snprintf(dir, sizeof dir, "run/step-%08llu", (unsigned long long)step);
    ZT_CHECK(system("mkdir -p run") == 0);
    ZT_CHECK(mkdir(dir, 0755) == 0);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    zt_write_file(path, text);
    snprintf(path, sizeof path, "%s/shard-00000-of-00001.bin", dir);
    zt_write_file(path, "");
    zt_truncate(path, 100 * 32768);
    zck_sha256 *h = NULL;
    char hex[65], sums[256];
    ZT_OK(zck_sha256_new(&h));
    zck_sha256_update(h, text, len);
    zck_sha256_hex(h, hex);
    zck_sha256_free(h);
    free(text);
    snprintf(sums, sizeof sums, "%064d  shard-00000-of-00001.bin\n%s  manifest.json\n", 0, hex);
    snprintf(path, sizeof path, "%s/SHA256SUMS", dir);
    zt_write_file(path, sums);
    ZT_OK(zck_latest_set("run", step));
}

/* the address space this process has mapped now, in bytes */
static uint64_t vm_size(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    ZT_CHECK(f && fscanf(f, "%lu", &pages) == 1);
    fclose(f);
    return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Out of memory while the newest checkpoint's manifest is parsed (a child under RLIMIT_AS, with
 * room to read the file but not to parse it): the pick fails with ZR_ENOMEM saying so, and the
 * checkpoint stays where it is (no damaged-step-N, latest unchanged). It used to be "invalid
 * JSON": the newest sound checkpoint moved aside and the run silently resumed from an older one. */
ZT_TEST(resume_out_of_memory_is_no_damage)
{
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    ZT_SKIP("RLIMIT_AS does not bound a sanitizer's allocator");
#endif
    wide_ckpt(10);
    wide_ckpt(20);
    fflush(NULL);
    pid_t p = fork();
    ZT_CHECK(p >= 0);
    if (p == 0) {
        struct rlimit rl;
        rl.rlim_cur = rl.rlim_max = vm_size() + ((uint64_t)96 << 20);
        if (setrlimit(RLIMIT_AS, &rl) < 0)
            _exit(3);
        char *out = NULL;
        zck_resume_opts ro = ZCK_RESUME_OPTS_INIT;
        ro.verify = ZCK_RESUME_VERIFY_QUICK;
        ro.jobs = 1;
        int rc = zck_resume_pick(&out, "run", &ro);
        FILE *f = fopen("child.txt", "w");
        if (f) {
            fprintf(f, "%s %s\n", zr_err_name(rc), rc ? zr_err_msg() : out);
            fclose(f);
        }
        _exit(rc == ZR_ENOMEM ? 0 : 1);
    }
    int st = 0;
    ZT_CHECK(waitpid(p, &st, 0) == p);
    char *said = zt_slurp("child.txt");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !strstr(said, "ZR_ENOMEM") ||
        !strstr(said, "run/step-00000020/manifest.json: out of memory"))
        ZT_FAIL("status %d, expected ZR_ENOMEM naming the manifest: %s", st, said);
    free(said);
    ZT_CHECK(is_dir("run/step-00000020"));
    ZT_CHECK(!is_dir("run/damaged-step-00000020"));
    char *latest = NULL;
    ZT_OK(zck_latest(&latest, "run"));
    ZT_CHECK(strstr(latest, "step-00000020") != NULL);
    free(latest);
    /* zrun --resume auto under `ulimit -v` (150 MB: room to start, not to parse): exit status
     * non-zero, the error said, nothing moved */
    const char *zrun = zt_zrun_path();
    if (zrun) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "ulimit -v 150000; OPENBLAS_NUM_THREADS=1 exec '%s' --model "
                 SMALL " --batch 4 --threads 1 --ckpt-dir run --steps 22 --verify-on-resume "
                 "quick > zrun.log 2>&1", zrun);
        int zst = system(cmd);
        said = zt_slurp("zrun.log");
        if (!WIFEXITED(zst) || WEXITSTATUS(zst) == 0 ||
            !strstr(said, "run/step-00000020/manifest.json: out of memory while parsing"))
            ZT_FAIL("zrun under ulimit -v: status %d, expected the out-of-memory error:\n%s", zst,
                    said);
        free(said);
        ZT_CHECK(is_dir("run/step-00000020") && !is_dir("run/damaged-step-00000020"));
    }
    /* given the memory, it is sound as a quick check sees it (after the child: the parse's
     * freed memory stays mapped in this process) */
    zck_report *rep = NULL;
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    vo.quick = 1;
    ZT_OK(zck_verify(&rep, "run/step-00000020", &vo));
    ZT_CHECK_EQ(zck_report_count(rep), 0);
    zck_report_free(rep);
}

/* fail every open (and read) of the file whose path ends as ctx says with the errno of the tag */
typedef struct {
    const char *suffix;
    int err;
} refuse_ctx;

static int refuse_file(zck_op op, const char *path, void *vctx)
{
    refuse_ctx *c = vctx;
    size_t n = strlen(path), k = strlen(c->suffix);
    return (op == ZCK_OP_OPEN || op == ZCK_OP_READ) && n >= k &&
                   !strcmp(path + n - k, c->suffix) ? c->err : 0;
}

/* A read the system refuses (EIO, EMFILE, EACCES) on the newest checkpoint's manifest or on its
 * SHA256SUMS is no sign of damage: --resume auto and the supervisor's pick stop with ZR_EIO
 * naming the file, nothing is moved aside; a resume naming the checkpoint stops the same way. */
ZT_TEST(resume_refused_read_is_no_damage)
{
    uint64_t numel[2] = {1000, 300};
    zck_layout *L = zt_layout(2, numel);
    free(zt_save("run", L, 1, 10, 1, 0));
    free(zt_save("run", L, 1, 20, 2, 0));
    zck_layout_free(L);
    static const char *files[] = {"step-00000020/manifest.json", "step-00000020/SHA256SUMS"};
    static const int errs[] = {EIO, EMFILE, EACCES};
    for (size_t f = 0; f < 2; f++)
        for (size_t e = 0; e < 3; e++) {
            refuse_ctx c = {files[f], errs[e]};
            char *out = NULL;
            zck_fault_set(refuse_file, &c);
            zck_resume_opts ro = ZCK_RESUME_OPTS_INIT;
            int rc = zck_resume_pick(&out, "run", &ro);
            char msg[2048];
            snprintf(msg, sizeof msg, "%s", zr_err_msg());
            int rc2 = zck_resume_check(&out, "run/step-00000020", &ro);
            zck_fault_set(NULL, NULL);
            if (rc != ZR_EIO || !strstr(msg, files[f]) || !strstr(msg, strerror(errs[e])) ||
                strstr(msg, "damage") == NULL || rc2 != ZR_EIO)
                ZT_FAIL("%s refused with %s: pick %s (%s), check %s; expected ZR_EIO naming the "
                        "file, no verdict", files[f], strerror(errs[e]), zr_err_name(rc), msg,
                        zr_err_name(rc2));
            ZT_CHECK(is_dir("run/step-00000020"));
            ZT_CHECK(!is_dir("run/damaged-step-00000020"));
        }
}

ZT_TEST(resume_treats_a_renamed_step_directory_as_damaged)
{
    straight();
    zr_train_opts o = small_opts("renamed", 30);
    o.stop_after = 20;
    zr_train_result r;
    ZT_OK(zr_train(&r, &o));
    ZT_CHECK(rename("renamed/step-00000020", "renamed/step-00000030") == 0);
    o.stop_after = 0;
    char *t = NULL;
    int rc = train_logged(&r, &o, &t);
    if (rc || r.start_step != 10 || !strstr(t, "step 20, the directory name says 30") ||
        !strstr(t, "moved aside to renamed/damaged-step-00000030"))
        ZT_FAIL("rc %d (%s), start %llu:\n%s", rc, rc ? zr_err_msg() : "",
                (unsigned long long)r.start_step, t);
    free(t);
    zt_same_latest("straight", "renamed", 0, 0);
}

ZT_TEST(resume_says_an_interrupted_commit_only_when_true)
{
    zr_train_opts o = small_opts("crashed", 30);
    o.stop_after = 20;
    zr_train_result r;
    ZT_OK(zr_train(&r, &o));
    ZT_OK(zck_latest_set("crashed", 10)); /* step-20 renamed into place, latest not updated */
    o.stop_after = 5;
    char *t = NULL;
    ZT_OK(train_logged(&r, &o, &t));
    ZT_CHECK_EQ(r.start_step, 20);
    ZT_CHECK(strstr(t, "crashed/step-00000020 is complete and newer than what crashed/latest "
                       "names (its commit was interrupted)") != NULL);
    free(t);
    /* a plain resume: no note */
    o.stop_after = 0;
    ZT_OK(train_logged(&r, &o, &t));
    ZT_CHECK_EQ(r.start_step, 25);
    ZT_CHECK(!strstr(t, "interrupted") && !strstr(t, "does not verify"));
    free(t);
}

/* ---------------------------------------------------------------- the supervisor */

static int supervise(int *code, const char *run, unsigned restarts)
{
    zt_write_file("rank.sh", "echo \"$@\" >> args.txt\n"
                             "case \"$*\" in *--resume*) exit 0;; *) exit 3;; esac\n");
    zr_supervise_opts so = ZR_SUPERVISE_OPTS_INIT;
    so.program = "/bin/sh";
    so.max_restarts = restarts;
    so.backoff_s = 0;
    so.ckpt_dir = run;
    so.nproc_on_restart = 1;
    FILE *f = fopen("sup.log", "w");
    so.log = f;
    so.name = "sup";
    char *argv[] = {"sh", "rank.sh", "--ckpt-dir", (char *)run, NULL};
    int rc = zr_supervise(code, &so, argv);
    fclose(f);
    return rc;
}

ZT_TEST(resume_supervisor_restarts_from_the_newest_sound_checkpoint)
{
    uint64_t numel[2] = {1000, 300};
    zck_layout *L = zt_layout(2, numel);
    free(zt_save("run", L, 2, 10, 1, 0));
    free(zt_save("run", L, 2, 20, 2, 0));
    zt_truncate("run/step-00000020/shard-00001-of-00002.bin", 100);
    int code = -1;
    ZT_OK(supervise(&code, "run", 1));
    ZT_CHECK_EQ(code, 0);
    char *args = zt_slurp("args.txt"), *log = zt_slurp("sup.log");
    if (strncmp(args, "--ckpt-dir run\n", 15) ||
        !strstr(args, "--ckpt-dir run --resume run/step-00000010 --nproc 1\n") ||
        !strstr(log, "sup: run/step-00000020 does not verify (shard-00001-of-00002.bin: "
                     "truncated") ||
        !strstr(log, "moved aside to run/damaged-step-00000020") ||
        !strstr(log, "sup: restart 1 of 1 after the job failed (exit status 3): resuming from "
                     "run/step-00000010"))
        ZT_FAIL("arguments:\n%s\nlog:\n%s", args, log);
    free(args);
    free(log);
    char *p = NULL;
    ZT_OK(zck_latest(&p, "run"));
    ZT_CHECK(strstr(p, "step-00000010") != NULL);
    free(p);
    ZT_CHECK(is_dir("run/damaged-step-00000020"));
    /* no restarts left: the job's status */
    unlink("args.txt");
    ZT_OK(supervise(&code, "fresh", 0));
    ZT_CHECK_EQ(code, 3);
    /* every checkpoint damaged: no fresh start, nothing moved */
    zt_truncate("run/step-00000010/shard-00000-of-00002.bin", 10);
    ZT_ERR(supervise(&code, "run", 2), ZR_ECORRUPT, "none of its 1 checkpoint verifies");
    ZT_CHECK(is_dir("run/step-00000010"));
    zck_layout_free(L);
}

ZT_TEST(resume_zrun_max_restarts_moves_a_damaged_latest_aside)
{
    const char *common = "--model " SMALL " --batch 4 --threads 1 --save-every 10 "
                         "--keep-last 0 --ckpt-dir run";
    zt_zrunf_ok("a.log", "%s --steps 20", common);
    rm_shard("run/step-00000020");
    int st = zt_zrunf("b.log", "%s --steps 30 --max-restarts 1 --restart-backoff 0", common);
    char *t = zt_slurp("b.log");
    if (st != 0 || !strstr(t, "run/step-00000020 does not verify (shard-00000-of-00001.bin: "
                              "missing") ||
        !strstr(t, "moved aside to run/damaged-step-00000020") || strstr(t, "already exists") ||
        !strstr(t, "done at step 30/30"))
        ZT_FAIL("exit %d:\n%s", st, t);
    free(t);
    ZT_CHECK_EQ(zt_verify_count("run/step-00000020", 0), 0);
}

/* ---------------------------------------------------------------- options */

ZT_TEST(resume_train_refuses_each_bad_option_by_name)
{
    zr_train_result r;
    zr_train_opts o;
#define EXPECT(stmt, what)                                                                     \
    do {                                                                                       \
        o = small_opts("run", 10);                                                             \
        stmt;                                                                                  \
        ZT_ERR(zr_train(&r, &o), ZR_EINVAL, what);                                             \
    } while (0)
    EXPECT(o.verify_on_resume = 7,
           "--verify-on-resume 7: expected ZR_VERIFY_FULL, _QUICK or _OFF (0..2)");
    EXPECT(o.verify_on_resume = -1, "--verify-on-resume -1");
    EXPECT(o.device = 9, "--device 9: expected ZR_DEVICE_CPU, _CUDA or _AUTO (0..2)");
    EXPECT(o.offload_optimizer = 5, "--offload-optimizer 5");
    EXPECT(o.offload_params = -1, "--offload-params -1: expected ZR_OFFLOAD_NONE, _CPU or _NVME");
    EXPECT(o.offload_params = ZR_OFFLOAD_CPU, "--offload-params needs ZeRO stage 3");
    EXPECT(o.offload_optimizer = ZR_OFFLOAD_NVME, "--nvme-path");
    EXPECT(o.zero_stage = 4, "--zero 4");
    EXPECT(o.batch = 0, "--batch 0");
    EXPECT(o.steps = 0, "--steps");
    EXPECT(o.lr = 0, "--lr 0");
    EXPECT(o.lr = -1e-3f, "--lr -0.001");
    EXPECT(o.lr = NAN, "--lr nan");
    EXPECT(o.lr = INFINITY, "--lr inf");
    EXPECT(o.min_lr_ratio = 2, "--min-lr-ratio 2");
    EXPECT(o.weight_decay = NAN, "--weight-decay nan");
    EXPECT(o.grad_clip = -1, "--grad-clip -1");
    EXPECT(o.time_limit = NAN, "--time-limit nan");
    EXPECT(o.threads = -2, "--threads -2");
    EXPECT(o.async_save = 3, "--async-save 3");
    EXPECT(o.data = NULL, "--data");
    EXPECT(o.ckpt_dir = "", "--ckpt-dir");
    EXPECT(o.micro_batch = 3, "--micro-batch 3");
#undef EXPECT
    ZT_CHECK(access("run", F_OK) != 0); /* nothing was started */
}
