/*
 * test_output.c: zrun's output and a diverged run. A closed stdout (a reader that goes away
 * after the first line) neither stops training nor loses its checkpoint, at one rank and
 * through the launcher; --batch not a multiple of the world size names the batches that
 * work; the JSON log's records carry the time and the run id, which the checkpoint records,
 * and a resume that redoes logged steps says so; a run whose loss becomes non-finite stops at
 * that step without saving it; the progress bar's frames; --log-json's hostile paths (a
 * FIFO without a reader, the run's own files, /dev/full, /dev/urandom at a resume); JSON
 * numbers as the shortest decimals that read back the same (zck_json_dumps), in the JSON log,
 * the checkpoint's training section, zckpt --json and zgen --json.
 */
#include "ckutil.h"
#include "common.h"
#include "zr.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define SMALL "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256"

/* zrun with args, its stdout read up to the first line, then the pipe closed: its exit
 * status (128 + N for a signal N). */
static int zrun_first_line(const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s %s 2>/dev/null", zt_zrun_path(), args);
    FILE *p = popen(cmd, "r");
    ZT_CHECK(p);
    char line[512];
    ZT_CHECK(fgets(line, sizeof line, p));
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static uint64_t latest_step(const char *dir)
{
    char *p;
    ZT_OK(zck_latest(&p, dir));
    const char *s = strrchr(p, '-');
    ZT_CHECK(s);
    uint64_t step = strtoull(s + 1, NULL, 10);
    free(p);
    return step;
}

ZT_TEST(output_closed_stdout_keeps_training)
{
    static const char *const runs[][2] = {{"one", "--nproc 1"}, {"two", "--nproc 2 --zero 1"}};
    for (size_t i = 0; i < 2; i++) {
        char args[1024];
        snprintf(args, sizeof args, "--model %s --batch 4 --steps 40 --threads 1 --save-every "
                 "20 --ckpt-dir %s --log-json %s.jsonl %s", SMALL, runs[i][0], runs[i][0],
                 runs[i][1]);
        int st = zrun_first_line(args);
        if (st != 0)
            ZT_FAIL("zrun %s with its stdout closed after one line: exit status %d", args, st);
        ZT_CHECK_EQ(latest_step(runs[i][0]), 40);
        ZT_CHECK_EQ(zt_verify_count(runs[i][0], 0), 0);
        char path[64];
        snprintf(path, sizeof path, "%s.jsonl", runs[i][0]);
        char *log = zt_slurp(path);
        ZT_CHECK(strstr(log, "{\"step\":40,")); /* the JSON log went on */
        free(log);
    }
}

ZT_TEST(output_batch_not_multiple_names_the_batches)
{
    zr_train_opts o = ZR_TRAIN_OPTS_INIT;
    o.ckpt_dir = "run";
    o.batch = 7;
    FILE *f = tmpfile();
    ZT_ERR(zr_train_dry_run(&o, 3, f), ZR_EINVAL, "--batch 7 is not a multiple of the world "
           "size 3 (each rank takes an equal share of the global batch): use --batch 6 or 9");
    o.batch = 2;
    ZT_ERR(zr_train_dry_run(&o, 3, f), ZR_EINVAL, "use --batch 3");
    fclose(f);
}

/* Every line of the JSON log, parsed. */
static size_t read_records(json_t **out, size_t cap, const char *path)
{
    FILE *f = fopen(path, "r");
    ZT_CHECK(f);
    char line[4096];
    size_t n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        json_error_t e;
        out[n] = json_loads(line, 0, &e);
        if (!out[n])
            ZT_FAIL("%s: line %zu is not JSON (%s): %s", path, n + 1, e.text, line);
        n++;
    }
    fclose(f);
    return n;
}

static const char *str_of(json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));
    if (!s)
        ZT_FAIL("record without a string '%s'", key);
    return s;
}

/* "2025-01-31T12:34:56.789Z" */
static int is_iso_time(const char *s)
{
    int y, mo, d, h, mi, sec, ms;
    char z;
    return strlen(s) == 24 &&
           sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &y, &mo, &d, &h, &mi, &sec, &ms, &z) == 8 &&
           z == 'Z' && y >= 2020 && mo >= 1 && mo <= 12;
}

/* --log-json's hostile places: a FIFO nobody reads is refused at once (it used to block in
 * open); a file of the run directory (a shard of a step directory, latest, through a symbolic
 * link too) is refused and the run stays sound (a shard took the log's lines); a log that cannot
 * be written (/dev/full) is said and training goes on; a resume reads no history from a
 * device that never ends (/dev/urandom was read forever); an empty path is refused. */
ZT_TEST(output_json_log_hostile_paths)
{
#define RUN "--model " SMALL " --batch 4 --threads 1 "
    ZT_CHECK(mkfifo("fifo", 0644) == 0);
    ZT_CHECK_EQ(zt_zrunf("fifo.log", RUN "--steps 2 --ckpt-dir r0 --log-json fifo"), 2);
    zt_file_has("fifo.log", "--log-json fifo: a FIFO that no process reads");
    zt_zrunf_ok("r.log", RUN "--steps 2 --ckpt-dir r");
    ZT_CHECK(symlink("r/latest", "link") == 0);
    static const char *const inside[][2] = {
        {"r/step-00000002/shard-00000-of-00001.bin", "on 'step-00000002', which the run manages"},
        {"r/latest", "on 'latest', which the run manages"},
        {"link", "on 'latest', which the run manages"},
        {"r/.lock", "on '.lock'"},
        {"", "--log-json: empty path"},
    };
    for (size_t i = 0; i < sizeof inside / sizeof *inside; i++) {
        ZT_CHECK_EQ(zt_zrunf("in.log", RUN "--steps 3 --ckpt-dir r --log-json '%s'",
                             inside[i][0]), 2);
        zt_file_has("in.log", inside[i][1]);
    }
    ZT_CHECK_EQ(zt_verify_count("r", 0), 0);
    ZT_CHECK_EQ(latest_step("r"), 2);
    zt_zrunf_ok("full.log", RUN "--steps 3 --ckpt-dir r --log-json /dev/full");
    zt_file_has("full.log", "--log-json /dev/full: write failed (No space left on device)");
    zt_file_has("full.log", "the JSON log /dev/full lacks the records from step 3 on");
    zt_zrunf_ok("urandom.log", RUN "--steps 4 --ckpt-dir r --log-json /dev/urandom");
    zt_file_has("urandom.log", "done at step 4/4");
    zt_zrunf_ok("own.log", RUN "--steps 5 --ckpt-dir r --log-json r/mine.jsonl");
    zt_file_has("r/mine.jsonl", "\"step\":5");
#undef RUN
}

ZT_TEST(output_json_log_time_run_id_and_redone_steps)
{
    zr_train_opts o = zt_small_opts("run", 6);
    o.save_every = 3;
    o.keep_last = 0;
    o.log_json = "train.jsonl";
    o.run_id = "first";
    zr_train_result res;
    ZT_OK(zr_train(&res, &o));
    /* a crash after step 6 was logged but before its checkpoint: back to step 3 */
    ZT_CHECK_EQ(system("rm -rf run/step-00000006"), 0);
    ZT_OK(zck_latest_set("run", 3));
    o.run_id = "sec\"ond"; /* kept to what JSON takes as it is */
    FILE *log = tmpfile();
    o.log = log;
    ZT_OK(zr_train(&res, &o));
    ZT_CHECK_EQ(res.start_step, 3);

    json_t *rec[32];
    size_t n = read_records(rec, 32, "train.jsonl");
    ZT_CHECK_EQ(n, 10); /* 6 steps, the resume, steps 4-6 again */
    for (size_t i = 0; i < n; i++) {
        ZT_CHECK(is_iso_time(str_of(rec[i], "time")));
        ZT_CHECK_EQ(strcmp(str_of(rec[i], "run_id"), i < 6 ? "first" : "second"), 0);
    }
    ZT_CHECK_EQ(strcmp(str_of(rec[6], "event"), "resume"), 0);
    ZT_CHECK_EQ(json_integer_value(json_object_get(rec[6], "from_step")), 3);
    ZT_CHECK_EQ(json_integer_value(json_object_get(rec[6], "redone_steps")), 3);
    ZT_CHECK_EQ(strcmp(str_of(rec[6], "checkpoint_run_id"), "first"), 0);
    ZT_CHECK_EQ(json_integer_value(json_object_get(rec[7], "step")), 4);
    for (size_t i = 0; i < n; i++)
        json_decref(rec[i]);

    rewind(log);
    char text[8192];
    size_t k = fread(text, 1, sizeof text - 1, log);
    text[k] = 0;
    fclose(log);
    if (!strstr(text, "note: train.jsonl already holds steps up to 6: steps 4-6 are redone "
                      "(3 steps)"))
        ZT_FAIL("the step log does not say that steps are redone:\n%s", text);

    /* the checkpoint records the run id of the run that saved it */
    zck_reader *rd;
    ZT_OK(zck_reader_open(&rd, "run/step-00000006"));
    ZT_CHECK(strstr(zck_reader_training_json(rd), "\"run_id\":\"second\""));
    zck_reader_free(rd);
    /* a resume that redoes nothing adds no record */
    o.log = NULL;
    ZT_OK(zr_train(&res, &o));
    ZT_CHECK_EQ(read_records(rec, 32, "train.jsonl"), 10);
    for (size_t i = 0; i < 10; i++)
        json_decref(rec[i]);
}

/* A learning rate that makes the tiny model's loss overflow within a few steps: zrun stops at
 * the step whose loss or gradient norm is not finite, exit 2, naming it; that step is not
 * saved and the previous checkpoint stays latest and sound. */
static void diverge(const char *dir, const char *extra)
{
    char args[1024], out[64];
    snprintf(out, sizeof out, "%s.out", dir);
    snprintf(args, sizeof args, "--model %s --batch 4 --steps 50 --warmup 0 --lr 1e3 "
             "--save-every 1 --threads 1 --ckpt-dir %s --log-json %s.jsonl %s", SMALL, dir,
             dir, extra);
    int st = zt_zrun(args, out);
    char *text = zt_slurp(out);
    const char *m = strstr(text, "zrun: error: step ");
    unsigned long long bad = m ? strtoull(m + 18, NULL, 10) : 0;
    if (st != 2 || !m || !strstr(text, "the run diverged") || bad < 2)
        ZT_FAIL("zrun %s: exit %d, expected 2 and the diverged step (after step 1):\n%s", args,
                st, text);
    ZT_CHECK(strstr(m, ": the loss is "));
    char want[256], bad_dir[300];
    snprintf(want, sizeof want, "the newest checkpoint stays %s/step-%08llu", dir, bad - 1);
    if (!strstr(text, want))
        ZT_FAIL("zrun %s: the error does not say '%s':\n%s", args, want, text);
    ZT_CHECK_EQ(latest_step(dir), bad - 1);
    snprintf(bad_dir, sizeof bad_dir, "%s/step-%08llu", dir, bad);
    struct stat sb;
    ZT_CHECK(stat(bad_dir, &sb) < 0);
    ZT_CHECK_EQ(zt_verify_count(dir, 0), 0);
    snprintf(want, sizeof want, "%s.jsonl", dir);
    char *log = zt_slurp(want);
    snprintf(want, sizeof want, "{\"step\":%llu,", bad);
    ZT_CHECK(!strstr(log, want)); /* the diverged step has no record */
    snprintf(want, sizeof want, "{\"step\":%llu,", bad - 1);
    ZT_CHECK(strstr(log, want));
    free(log);
    free(text);
}

ZT_TEST(output_diverged_run_stops_without_saving)
{
    diverge("one", "--async-save off");
    diverge("two", "--nproc 2 --zero 2 --async-save on");
}

/* Progress when stderr is not a terminal (a batch job's log, issue 24): nothing for a phase
 * shorter than 5 s, then one plain line (no "\r") every 5 s of a long one, naming the phase
 * and how far it got. Real time: the test waits 5.2 s. */
ZT_TEST(output_progress_lines_when_not_a_terminal)
{
    fflush(stderr);
    int saved = dup(2), fd = open("progress.log", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ZT_CHECK(saved >= 0 && fd >= 0 && dup2(fd, 2) == 2);
    close(fd);
    zcli_bar bar;
    zck_progress p = zcli_progress_init(&bar);
    p.fn(p.ctx, "quick", 0, 1000);
    p.fn(p.ctx, "quick", 1000, 1000); /* a short phase: no line */
    p.fn(p.ctx, "hashing", 0, 1 << 30);
    p.fn(p.ctx, "hashing", 1 << 20, 1 << 30); /* under 5 s: no line yet */
    usleep(5200 * 1000);
    p.fn(p.ctx, "hashing", 1 << 29, 1 << 30); /* past 5 s: one line */
    p.fn(p.ctx, "hashing", (1 << 29) + 1, 1 << 30); /* just after it: none */
    zcli_progress_end(&bar);
    fflush(stderr);
    ZT_CHECK(dup2(saved, 2) == 2);
    close(saved);
    char *t = zt_slurp("progress.log");
    if (strstr(t, "quick") || strchr(t, '\r') || !strstr(t, "hashing") ||
        !strstr(t, "50%") || strchr(t, '\n') != strrchr(t, '\n'))
        ZT_FAIL("expected one plain line for the long phase at 50%%, got:\n%s", t);
    free(t);
}

ZT_TEST(output_progress_frames)
{
    char buf[256];
    /* at the start: no rate, no ETA */
    size_t w = zcli_progress_format(buf, sizeof buf, "verify", 0, 1 << 20, 0.0, 0);
    ZT_CHECK(buf[0] == '\r' && strstr(buf, "0 B / 1.0 MiB"));
    ZT_CHECK(!strstr(buf, "B/s") && !strstr(buf, "ETA"));
    ZT_CHECK_EQ(w, strlen(buf) - 1);
    /* measured: rate and ETA */
    size_t w2 = zcli_progress_format(buf, sizeof buf, "verify", 512 << 10, 1 << 20, 1.0, w);
    ZT_CHECK(strstr(buf, "512.0 KiB/s  ETA 1s"));
    ZT_CHECK_EQ(w2, strlen(buf) - 1);
    ZT_CHECK(w2 > w);
    /* a shorter frame blanks what is left of the longer one */
    size_t w3 = zcli_progress_format(buf, sizeof buf, "verify", 1 << 20, 1 << 20, 0.05, w2);
    ZT_CHECK(w3 < w2);
    ZT_CHECK_EQ(strlen(buf) - 1, w2);
    ZT_CHECK(!strstr(buf, "ETA") && buf[strlen(buf) - 1] == ' ');
    for (size_t i = w3 + 1; i < strlen(buf); i++)
        ZT_CHECK(buf[i] == ' ');
    /* no total: bytes, and the rate once measured */
    zcli_progress_format(buf, sizeof buf, "pack", 3 << 20, 0, 2.0, 0);
    ZT_CHECK(strstr(buf, "3.0 MiB  1.5 MiB/s") && !strstr(buf, "ETA"));
    zcli_progress_format(buf, sizeof buf, "pack", 0, 0, 2.0, 0);
    ZT_CHECK(!strstr(buf, "/s"));
}

/* An error every rank reports is one line with "(all N ranks)" on it (the ranks relaying
 * rank 0's error said "rank 0: ..." and so printed it apart, and the suffix landed on the hint);
 * an error of one rank is one line naming it, and the launcher blames that rank, whichever
 * exited first (issue 24). */
ZT_TEST(output_rank_errors_said_once_and_blamed_on_their_rank)
{
    /* every rank: byte data beside a BPE tokenizer (each rank finds it, then they agree) */
    ZT_CHECK_EQ(zt_zrunf("a.log", "--nproc 2 --model gpt2:layers=1,heads=2,dim=32,ctx=32,"
                         "vocab=768 --batch 4 --threads 1 --tokenizer %s/tests/data/tok/"
                         "hf_bpe.json --ckpt-dir run --steps 2", zt_root()), 2);
    char *t = zt_slurp("a.log");
    const char *e = strstr(t, "zrun: error: ");
    if (!e || strstr(e + 1, "zrun: error: ") || strstr(t, "[rank ") ||
        !strstr(e, " (all 2 ranks)\n") || strstr(t, "rank 0: ") ||
        !strstr(t, "zrun: all 2 ranks failed with the error above (rank "))
        ZT_FAIL("expected one error line for all ranks:\n%s", t);
    free(t);
    /* one rank: rank 1's offload directory is held by a live process (this one) */
    ZT_CHECK_EQ(mkdir("nv", 0755), 0);
    ZT_CHECK_EQ(mkdir("nv/zrun-swap-rank1", 0700), 0);
    char pid[32];
    snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    zt_write_file("nv/zrun-swap-rank1/owner", pid);
    for (int i = 0; i < 3; i++) { /* whichever rank exits first */
        ZT_CHECK_EQ(zt_zrun("--nproc 2 --model gpt2:layers=1,heads=2,dim=32,ctx=32,vocab=256 "
                            "--batch 4 --threads 1 --ckpt-dir run --steps 2 "
                            "--offload-optimizer nvme --nvme-path nv", "b.log"), 2);
        t = zt_slurp("b.log");
        e = strstr(t, "zrun: error: rank 1: nv/zrun-swap-rank1 is in use by a running process");
        if (!e || strstr(e + 1, "zrun: error: ") || !strstr(e, " (all 2 ranks)\n") ||
            strstr(t, "zrun: rank 0 exited") || !strstr(t, "zrun: rank 1 ") ||
            strstr(t, "use a new --ckpt-dir") || strstr(t, "choose another output path") ||
            !strstr(t, "hint: wait for the process named to end, or give this run another "
                       "--nvme-path\n"))
            ZT_FAIL("expected rank 1's error once and rank 1 blamed:\n%s", t);
        free(t);
    }
}

/* zck_json_real_text: the shortest decimal that reads back (float32: strtof; else strtod) */
static void shortest_is(double v, int f32, const char *want)
{
    char t[64];
    zck_json_real_text(t, sizeof t, v, f32);
    if (strcmp(t, want))
        ZT_FAIL("%.17g (%s) written '%s', expected '%s'", v, f32 ? "float" : "double", t, want);
}

ZT_TEST(output_json_reals_shortest_round_trip)
{
    shortest_is(0.8f, 1, "0.8");
    shortest_is(0.8f, 0, "0.800000011920929"); /* the double of 0.8f is not 0.8 */
    shortest_is(0.1, 0, "0.1");
    shortest_is(1.0, 0, "1.0"); /* a real stays a real */
    shortest_is(1e-5, 0, "1e-5");
    shortest_is(3e-3f, 1, "0.003");
    shortest_is(1e20, 0, "1e20");
    shortest_is(1e6, 0, "1000000.0"); /* a whole number below 1e16 in full, as %.17g */
    shortest_is(-2.5e-7f, 1, "-2.5e-7");
    shortest_is(123456789.0f, 1, "123456790.0");
    shortest_is(1.0 / 3, 0, "0.3333333333333333");
    /* any float and any double read back exactly, in at most 9 and 17 digits */
    zr_rng r;
    zr_rng_seed(&r, 9);
    for (int i = 0; i < 20000; i++) {
        uint64_t bits = zr_rng_next(&r);
        uint32_t b32 = (uint32_t)bits;
        float f;
        double d;
        memcpy(&f, &b32, 4);
        memcpy(&d, &bits, 8);
        char t[64];
        if (isfinite(f)) {
            zck_json_real_text(t, sizeof t, f, 1);
            if (strtof(t, NULL) != f)
                ZT_FAIL("float %.9g written '%s' reads back %.9g", (double)f, t,
                        (double)strtof(t, NULL));
            json_t *j = zck_json_real_f32(f);
            ZT_CHECK(j && (float)json_real_value(j) == f);
            json_decref(j);
        }
        if (isfinite(d)) {
            zck_json_real_text(t, sizeof t, d, 0);
            if (strtod(t, NULL) != d)
                ZT_FAIL("double %.17g written '%s' reads back %.17g", d, t, strtod(t, NULL));
        }
    }
    /* a whole document: reals shortened, integers and strings as they are, and each value
     * reads back as it was */
    json_t *j = json_pack("{s:o, s:f, s:f, s:f, s:f, s:I, s:s, s:[f, f]}", "t",
                          zck_json_real_f32(0.8f), "d", 0.1, "one", 1.0, "eps", 1e-5, "big",
                          1e20, "n", (json_int_t)12, "s", "0.80000001192092896 1e-05", "a", -0.5,
                          2.0 / 3);
    char *text = zck_json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    const char *want = "{\"t\":0.8,\"d\":0.1,\"one\":1.0,\"eps\":1e-5,\"big\":1e20,\"n\":12,"
                       "\"s\":\"0.80000001192092896 1e-05\",\"a\":[-0.5,0.6666666666666666]}";
    if (!text || strcmp(text, want))
        ZT_FAIL("zck_json_dumps wrote '%s', expected '%s'", text ? text : "(null)", want);
    json_t *back = json_loads(text, 0, NULL);
    ZT_CHECK(back && (float)json_real_value(json_object_get(back, "t")) == 0.8f);
    ZT_CHECK(json_real_value(json_object_get(back, "d")) == 0.1);
    ZT_CHECK(json_is_real(json_object_get(back, "one")));
    ZT_CHECK(json_real_value(json_array_get(json_object_get(back, "a"), 1)) == 2.0 / 3);
    ZT_CHECK(json_real_value(json_object_get(back, "eps")) == 1e-5);
    ZT_CHECK(json_real_value(json_object_get(back, "big")) == 1e20);
    free(text);
    json_decref(back);
    json_decref(j);
}

/* zrun's JSON log, the checkpoint's manifest and zckpt --json write --lr 3e-3 as 0.003 (a
 * float32, 0.0030000000260770321 as Jansson writes its double) */
ZT_TEST(output_json_numbers_in_log_manifest_and_zckpt)
{
    zt_zrun_ok("--steps 2 --ckpt-dir run --model " SMALL " --batch 4 --micro-batch 2 --lr 3e-3 "
               "--warmup 1 --threads 1", "run.log");
    zt_file_has("run/train.jsonl", "\"lr\":0.003,");
    zt_file_has("run/step-00000002/manifest.json", "\"lr\": 0.003,");
    zt_file_has("run/step-00000002/manifest.json", "\"weight_decay\": 0.1,");
    zt_file_lacks("run/step-00000002/manifest.json", "0.0030000");
    zt_file_lacks("run/step-00000002/manifest.json", "0.10000");
    /* every loss in the log reads back as the float the line was written from: at most 9
     * digits */
    char *log = zt_slurp("run/train.jsonl");
    for (const char *p = strstr(log, "\"loss\":"); p; p = strstr(p + 1, "\"loss\":")) {
        const char *v = p + 7;
        size_t digits = 0;
        for (; *v && *v != ','; v++)
            digits += *v >= '0' && *v <= '9';
        ZT_CHECK(digits <= 10); /* "0." and 9 significant digits at most */
    }
    free(log);
    char *out;
    ZT_CHECK_EQ(zt_zckpt(&out, "inspect run --json"), 0);
    if (!strstr(out, "\"lr\": 0.003,") || !strstr(out, "\"min_lr_ratio\": 0.1,"))
        ZT_FAIL("zckpt inspect --json:\n%s", out);
    free(out);
    ZT_CHECK_EQ(zt_zckpt(&out, "inspect run"), 0);
    ZT_CHECK(strstr(out, "\"lr\":0.003,"));
    free(out);
}
