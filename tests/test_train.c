/*
 * test_train.c: the training loop end to end on small models: the loss falls on the synthetic
 * corpus; a run stopped and resumed (in process with --stop-after, and a zrun process killed
 * with SIGKILL after a checkpoint) ends byte-identical to a straight run; bad inputs fail
 * before any step, naming what and where; an imported model resumes.
 */
#include "ckutil.h"
#include "zfmt.h"
#include "zr.h"

#include <fcntl.h>
#include <stdbool.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define SMALL ZT_SMALL

static void expect_same_final(const char *a, const char *b)
{
    char *pa, *pb;
    ZT_OK(zck_latest(&pa, a));
    ZT_OK(zck_latest(&pb, b));
    char fa[4096], fb[4096];
    snprintf(fa, sizeof fa, "%s/shard-00000-of-00001.bin", pa);
    snprintf(fb, sizeof fb, "%s/shard-00000-of-00001.bin", pb);
    if (!zt_same_file(fa, fb))
        ZT_FAIL("%s and %s differ", fa, fb);
    zck_diff *d;
    ZT_OK(zck_diff_run(&d, pa, pb, NULL));
    ZT_CHECK(d->all_match);
    zck_diff_free(d);
    free(pa);
    free(pb);
}

ZT_TEST(train_loss_falls_on_synthetic_corpus)
{
    zr_train_opts o = zt_small_opts("run", 150);
    o.lr = 1e-2f;
    o.log_json = "log.jsonl";
    zr_train_result res;
    ZT_OK(zr_train(&res, &o));
    ZT_CHECK_EQ(res.step, 150);
    FILE *f = fopen("log.jsonl", "r");
    ZT_CHECK(f);
    char line[1024];
    double first = -1, last = -1;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        double l;
        char *p = strstr(line, "\"loss\":");
        ZT_CHECK(p && sscanf(p + 7, "%lf", &l) == 1);
        if (first < 0)
            first = l;
        last = l;
        n++;
        ZT_CHECK(strstr(line, "\"tokens_per_s\"") && strstr(line, "\"mem\""));
    }
    fclose(f);
    ZT_CHECK_EQ(n, 150);
    fprintf(stderr, "  loss %.3f -> %.3f over 150 steps\n", first, last);
    ZT_CHECK(first > 5.0);          /* ln 256 = 5.55 at initialization */
    ZT_CHECK(last < first - 1.5);   /* the corpus is learnable */
    ZT_CHECK_EQ(zt_verify_count("run", 0), 0);
}

ZT_TEST(train_resume_is_bit_exact)
{
    zr_train_opts a = zt_small_opts("straight", 40);
    zr_train_result ra, rb;
    ZT_OK(zr_train(&ra, &a));
    zr_train_opts b = zt_small_opts("resumed", 40);
    b.stop_after = 20;
    ZT_OK(zr_train(&rb, &b));
    ZT_CHECK_EQ(rb.step, 20);
    ZT_CHECK(rb.stopped);
    b.stop_after = 0;
    ZT_OK(zr_train(&rb, &b));
    ZT_CHECK_EQ(rb.start_step, 20);
    ZT_CHECK_EQ(rb.step, 40);
    ZT_CHECK(ra.loss == rb.loss);
    expect_same_final("straight", "resumed");
    /* resuming a finished run does nothing and keeps it */
    ZT_OK(zr_train(&rb, &b));
    ZT_CHECK_EQ(rb.start_step, 40);
}

ZT_TEST(train_resume_after_sigkill)
{
    zt_zrun_ok("--model " SMALL " --batch 4 --micro-batch 2 --steps 40 --warmup 5 --lr 3e-3 "
               "--threads 1 --ckpt-dir straight", "straight.log");
    pid_t pid = zt_spawn_zrun("", "--model " SMALL " --batch 4 --micro-batch 2 --steps 40 "
                              "--warmup 5 --lr 3e-3 --threads 1 --ckpt-dir killed "
                              "--save-every 20", "killed.log");
    /* kill it as soon as its step-20 checkpoint is committed */
    struct stat st;
    for (int i = 0; i < 6000 && stat("killed/step-00000020", &st) != 0; i++) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    ZT_CHECK(stat("killed/step-00000020", &st) == 0);
    zt_zrun_ok("--batch 4 --micro-batch 2 --steps 40 --warmup 5 --lr 3e-3 --threads 1 "
               "--ckpt-dir killed --save-every 20", "resumed.log");
    expect_same_final("straight", "killed");
}

ZT_TEST(train_sigterm_saves_and_exits_zero)
{
    pid_t pid = zt_spawn_zrun("", "--model " SMALL " --batch 4 --steps 100000 --threads 1 "
                              "--ckpt-dir run", "out.log");
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    ZT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *log;
    ZT_OK(zck__read_small_for_tests(&log, "out.log"));
    ZT_CHECK(strstr(log, "stopped by a signal"));
    ZT_CHECK(strstr(log, "run/step-"));
    free(log);
    ZT_CHECK_EQ(zt_verify_count("run", 0), 0);
}

ZT_TEST(train_refuses_bad_inputs_before_any_step)
{
    zr_train_opts o = zt_small_opts("run", 10);
    zr_train_result r;
    o.data = "no-such-file.txt";
    ZT_ERR(zr_train(&r, &o), ZR_ENOTFOUND, "no-such-file.txt");
    o = zt_small_opts("run", 10);
    o.model = "gpt2:layers=2,heads=3,dim=32";
    ZT_ERR(zr_train(&r, &o), ZR_EINVAL, NULL);
    o = zt_small_opts("run", 4);
    ZT_OK(zr_train(&r, &o));
    /* another model shape */
    o = zt_small_opts("run", 8);
    o.model = "gpt2:layers=3,heads=2,dim=32,ctx=32,vocab=256";
    ZT_ERR(zr_train(&r, &o), ZR_EINVAL, "another model shape");
    /* a corrupt checkpoint stops before any step, naming the file */
    char *p;
    ZT_OK(zck_latest(&p, "run"));
    char f[4096];
    snprintf(f, sizeof f, "%s/shard-00000-of-00001.bin", p);
    zt_flip_byte(f, 100);
    o = zt_small_opts("run", 8);
    ZT_ERR(zr_train(&r, &o), ZR_ECORRUPT, "shard-00000-of-00001.bin");
    ZT_CHECK_EQ(r.step, 0);
    free(p);
    o = zt_small_opts("run2", 8);
    o.batch = 6;
    o.micro_batch = 4;
    ZT_ERR(zr_train(&r, &o), ZR_EINVAL, "does not divide the 6 sequences per rank");
}

ZT_TEST(train_resumes_an_imported_model)
{
    /* a model saved by training, exported to llm.c's format, imported at world 3: zrun
     * resumes from it with the same params and fresh optimizer state */
    zr_train_opts o = zt_small_opts("trained", 5);
    zr_train_result r;
    ZT_OK(zr_train(&r, &o));
    ZT_OK(zfmt_llmc_export("trained", "m.bin", NULL));
    zfmt_import_opts io = ZFMT_IMPORT_OPTS_INIT;
    io.world = 3;
    ZT_OK(zfmt_import("m.bin", "imported", &io));
    o = zt_small_opts("imported", 3);
    o.model = NULL;
    ZT_OK(zr_train(&r, &o));
    ZT_CHECK_EQ(r.start_step, 0);
    ZT_CHECK_EQ(r.step, 3);
}

ZT_TEST(train_time_limit_stops_with_a_checkpoint)
{
    zr_train_opts o = zt_small_opts("run", 1000000);
    o.time_limit = 1.5;
    zr_train_result r;
    ZT_OK(zr_train(&r, &o));
    ZT_CHECK(r.stopped);
    ZT_CHECK(r.step > 0 && r.step < 1000000);
    ZT_CHECK(r.ckpt[0]);
    ZT_CHECK_EQ(zt_verify_count("run", 0), 0);
    /* and the schedule still spans --steps: the next invocation continues from there */
    o.time_limit = 0;
    o.stop_after = 2;
    zr_train_result r2;
    ZT_OK(zr_train(&r2, &o));
    ZT_CHECK_EQ(r2.start_step, r.step);
    ZT_CHECK_EQ(r2.step, r.step + 2);
}

/* a zck_resume_opts.say that appends each line to the char[4096] ctx */
static void collect_line(void *ctx, const char *line)
{
    size_t n = strlen(ctx);
    snprintf((char *)ctx + n, 4096 - n, "%s\n", line);
}

ZT_TEST(train_resumes_from_a_commit_interrupted_before_latest)
{
    /* a crash between the rename of step-20 into place and the update of latest leaves latest
     * naming step 10: the run must resume from the newer, complete step 20 (not start over,
     * and not fail later on an existing step-20) */
    zr_train_opts a = zt_small_opts("straight", 30);
    zr_train_result r;
    ZT_OK(zr_train(&r, &a));
    zr_train_opts b = zt_small_opts("crashed", 30);
    b.save_every = 10;
    b.stop_after = 20;
    ZT_OK(zr_train(&r, &b));
    ZT_CHECK_EQ(r.step, 20);
    ZT_OK(zck_latest_set("crashed", 10));
    char *p, said[4096] = "";
    zck_resume_opts ro = ZCK_RESUME_OPTS_INIT;
    ro.dry_run = 1;
    ro.say = collect_line;
    ro.say_ctx = said;
    ZT_OK(zck_resume_pick(&p, "crashed", &ro));
    ZT_CHECK(strstr(p, "step-00000020") && strstr(said, "its commit was interrupted"));
    free(p);
    b.stop_after = 0;
    ZT_OK(zr_train(&r, &b));
    ZT_CHECK_EQ(r.start_step, 20);
    expect_same_final("straight", "crashed");
    /* a run directory whose only checkpoint is incomplete is an error, not a fresh start */
    ZT_OK(zck__mkdir_for_tests("broken"));
    ZT_OK(zck__mkdir_for_tests("broken/step-00000005"));
    b = zt_small_opts("broken", 30);
    ZT_ERR(zr_train(&r, &b), ZR_ECORRUPT, "none of its 1 checkpoint verifies");
}

ZT_TEST(train_resume_is_bit_exact_with_two_threads)
{
    /* the model's thread pool (matmuls split by blocks, attention by (b, h), reductions by
     * output element) gives the same bits at a fixed thread count */
    zr_train_opts a = zt_small_opts("straight", 16);
    a.threads = 2;
    zr_train_result ra, rb;
    ZT_OK(zr_train(&ra, &a));
    zr_train_opts b = zt_small_opts("resumed", 16);
    b.threads = 2;
    b.stop_after = 7;
    ZT_OK(zr_train(&rb, &b));
    b.stop_after = 0;
    ZT_OK(zr_train(&rb, &b));
    ZT_CHECK_EQ(rb.start_step, 7);
    ZT_CHECK(ra.loss == rb.loss);
    expect_same_final("straight", "resumed");
}

/* A resume that changes the schedule (--steps, --lr, --warmup) says so once, with the old and
 * new values and the next step's learning rate under each (it re-warmed silently: issue 24);
 * one with the same schedule says nothing. */
ZT_TEST(train_resume_notes_a_changed_schedule)
{
    const char *m = "--model gpt2:layers=1,heads=2,dim=32,ctx=32,vocab=256 --batch 4 "
                    "--threads 1 --ckpt-dir run";
    zt_zrunf_ok("a.log", "%s --steps 8 --warmup 2 --stop-after 4", m);
    zt_zrunf_ok("b.log", "%s --steps 8 --warmup 2 --stop-after 2", m);
    zt_file_lacks("b.log", "note: the checkpoint was trained with --steps");
    zt_zrunf_ok("c.log", "%s --nproc 2 --steps 20 --warmup 10 --lr 0.002", m);
    zt_file_has("c.log", "note: the checkpoint was trained with --steps 8 --lr 0.001 --warmup 2 "
                         "--min-lr-ratio 0.1; this run uses --steps 20 --lr 0.002 --warmup 10 "
                         "--min-lr-ratio 0.1: the schedule is recomputed with the new values "
                         "from step 7 on, at lr 0.0014 where the old one gave 0.000186; step 7 "
                         "is inside the new warmup of 10 steps: the learning rate ramps up "
                         "again\n");
    char *t = zt_slurp("c.log"), *a = strstr(t, "note: the checkpoint was trained with --steps");
    ZT_CHECK(a && !strstr(a + 1, "note: the checkpoint was trained with --steps")); /* once */
    free(t);
}
