/*
 * test_eval.c: validation loss and plots (issue 15). The held-out part of the data is never
 * sampled for training; the validation loss is the same bits at world 1 and 2, stages 0 and 3;
 * it appears on the step line, in the JSON log and in the training section with the best so
 * far, kept across a resume; bad options are refused. RUN/train.svg is written at saves and at
 * the end, is well-formed XML and marks a resume; zr_plot_write / zckpt plot survive a truncated
 * last line, non-finite values, a single point, 100k records and refuse an empty log; headless
 * Chromium renders the SVG where it is installed.
 */
#include "ckutil.h"
#include "eval.h"
#include "section.h"
#include "zr.h"

#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define SMALL "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256"

/* ---------------------------------------------------------------- the sampler */

ZT_TEST(eval_held_out_tail_never_sampled)
{
    /* a file whose last tenth is upper case, the rest lower case */
    enum { N = 10000, T = 50 };
    static unsigned char bytes[N];
    uint64_t s = 7;
    for (size_t i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        bytes[i] = (unsigned char)((i < N - N / 10 ? 'a' : 'A') + (s >> 33) % 26);
    }
    zt_write_bytes("corpus.txt", bytes, N);
    zr_data *d, *v;
    ZT_OK(zr_data_open(&d, "corpus.txt", 256, T, 3));
    ZT_OK(zr_data_hold_out(&v, d));
    ZT_CHECK_EQ(zr_data_tokens(d), N - N / 10);
    ZT_CHECK_EQ(zr_data_tokens(v), N / 10);
    ZT_CHECK(!strcmp(zr_data_describe(v), "the held-out tail of file 'corpus.txt' as raw bytes "
                     "(1000 tokens)"));
    ZT_CHECK(!strcmp(zr_data_describe(d), "file 'corpus.txt' as raw bytes (9000 tokens; 1000 "
                     "after them held out for validation)"));
    int32_t x[T + 1];
    for (uint64_t i = 0; i < 20000; i++) {
        zr_data_sample(d, i, x);
        for (size_t k = 0; k <= T; k++)
            if (x[k] < 'a')
                ZT_FAIL("training sample %llu holds a held-out token", (unsigned long long)i);
    }
    for (uint64_t i = 0; i < 16; i++) { /* evaluation windows: all in the tail, the first at it */
        zr_data_window(v, i, 16, x);
        for (size_t k = 0; k <= T; k++)
            ZT_CHECK(x[k] >= 'A' && x[k] <= 'Z');
        if (i == 0)
            ZT_CHECK_EQ(x[0], bytes[N - N / 10]);
    }
    ZT_ERR(zr_data_hold_out(&v, d), ZR_EINVAL, "held out already");
    zr_data_free(v);
    zr_data_free(d);

    /* the synthetic corpus: training samples unchanged, the held-out part its continuation */
    zr_data *a, *b;
    ZT_OK(zr_data_open(&a, "synthetic", 256, 64, 9));
    ZT_OK(zr_data_open(&b, "synthetic", 256, 64, 9));
    ZT_OK(zr_data_hold_out(&v, b));
    ZT_CHECK_EQ(zr_data_tokens(b), 1048576);
    ZT_CHECK_EQ(zr_data_tokens(v), 131072);
    int32_t y[65], z[65];
    for (uint64_t i = 0; i < 1000; i++) {
        zr_data_sample(a, i, z);
        zr_data_sample(b, i, y);
        ZT_CHECK(!memcmp(z, y, sizeof y));
    }
    zr_data_window(v, 3, 7, y);
    for (size_t k = 0; k <= 64; k++)
        ZT_CHECK(y[k] == ' ' || y[k] == '.' || y[k] == ',' || y[k] == '\n' ||
                 (y[k] >= 'a' && y[k] <= 'z') || (y[k] >= 'A' && y[k] <= 'Z'));
    zr_data_free(v);
    zr_data_free(a);
    zr_data_free(b);

    /* too short to split */
    zt_write_bytes("short.txt", bytes, 300);
    ZT_OK(zr_data_open(&d, "short.txt", 256, T, 3));
    ZT_ERR(zr_data_hold_out(&v, d), ZR_EINVAL, "too short to hold out a validation part (30 "
           "tokens)");
    zr_data_free(d);
}

/* ---------------------------------------------------------------- equality and records */

/* The val_loss values of a JSON log, in order, as written (text). */
static size_t val_texts(const char *path, char out[][32], size_t cap)
{
    char *log = zt_slurp(path);
    size_t n = 0;
    for (const char *p = log; n < cap && (p = strstr(p, "\"val_loss\":")); p += 11)
        sscanf(p + 11, "%31[^,}]", out[n++]);
    free(log);
    return n;
}

static double section_number(const char *run, const char *key)
{
    char *path;
    ZT_OK(zck_latest(&path, run));
    zck_reader *rd;
    ZT_OK(zck_reader_open(&rd, path));
    json_t *t = json_loads(zck_reader_training_json(rd), 0, NULL);
    json_t *v = json_object_get(t, key);
    if (!json_is_number(v))
        ZT_FAIL("%s: the training section has no number '%s': %s", path, key,
                zck_reader_training_json(rd));
    double d = json_number_value(v);
    json_decref(t);
    zck_reader_free(rd);
    free(path);
    return d;
}

ZT_TEST(eval_same_at_any_world_and_stage)
{
    static const char *const runs[][2] = {
        {"w1", "--nproc 1 --zero 0"}, {"w2z0", "--nproc 2 --zero 0"}, {"w2z3", "--nproc 2 --zero 3"}};
    char vals[3][8][32];
    size_t nv[3];
    double last[3];
    for (size_t i = 0; i < 3; i++) {
        char out[64], log[64];
        snprintf(out, sizeof out, "%s.out", runs[i][0]);
        snprintf(log, sizeof log, "%s.jsonl", runs[i][0]);
        /* training itself sums gradients in another order at another world size; a learning
         * rate of 1e-30 leaves the parameters the evaluations see equal in every bit that
         * matters (each moves by at most 1e-30), so only the evaluation is compared */
        zt_zrunf_ok(out, "--model %s --batch 4 --steps 5 --threads 1 --eval-every 2 "
                    "--eval-batches 3 --lr 1e-30 --weight-decay 0 --ckpt-dir %s --log-json %s %s",
                    SMALL, runs[i][0], log, runs[i][1]);
        nv[i] = val_texts(log, vals[i], 8);
        ZT_CHECK_EQ(nv[i], 3); /* steps 2, 4 and the last, 5 */
        last[i] = section_number(runs[i][0], "val_loss");
        zt_file_has(out, "validation every 2 steps and at the last: 12 sequences of 32 tokens "
                         "from the held-out continuation of synthetic corpus");
        zt_file_has(out, "step      2/5 | loss ");
        zt_file_has(out, " | val ");
    }
    for (size_t i = 1; i < 3; i++) {
        for (size_t k = 0; k < 3; k++)
            if (strcmp(vals[i][k], vals[0][k]))
                ZT_FAIL("%s: val_loss %s at evaluation %zu, world 1 has %s", runs[i][0],
                        vals[i][k], k, vals[0][k]);
        if (memcmp(&last[i], &last[0], sizeof last[0])) /* bit for bit */
            ZT_FAIL("%s: val_loss %.17g in the checkpoint, world 1 has %.17g", runs[i][0],
                    last[i], last[0]);
    }
    ZT_CHECK(last[0] > 4 && last[0] < 6); /* ln 256 = 5.55 near initialization */
}

ZT_TEST(eval_best_kept_across_resume)
{
    zr_train_opts o = zt_small_opts("straight", 12);
    o.micro_batch = 0; /* the whole batch in one forward */
    o.warmup = 2;
    o.eval_every = 3;
    o.eval_batches = 2;
    o.log_json = "straight.jsonl";
    zr_train_result res;
    ZT_OK(zr_train(&res, &o));
    double best = section_number("straight", "best_val_loss");
    double best_step = section_number("straight", "best_val_step");
    char vals[8][32];
    ZT_CHECK_EQ(val_texts("straight.jsonl", vals, 8), 4);
    double lowest = INFINITY, at = 0;
    for (int k = 0; k < 4; k++)
        if (atof(vals[k]) < lowest) {
            lowest = atof(vals[k]);
            at = 3.0 * (k + 1);
        }
    ZT_CHECK(fabs(best - lowest) < 1e-6 && best_step == at);

    /* stopped after 7 steps (evaluated at 3 and 6), then resumed: the same best */
    o.ckpt_dir = "resumed";
    o.log_json = "resumed.jsonl";
    o.stop_after = 7;
    ZT_OK(zr_train(&res, &o));
    ZT_CHECK_EQ(section_number("resumed", "val_step"), 6);
    double mid = section_number("resumed", "best_val_loss");
    o.stop_after = 0;
    o.eval_every = 5; /* evaluations at 10 and 12 only: the best of 3 and 6 must survive */
    ZT_OK(zr_train(&res, &o));
    double after = section_number("resumed", "best_val_loss");
    ZT_CHECK(after <= mid);
    ZT_CHECK_EQ(section_number("resumed", "val_step"), 12);
    /* the section parser keeps what it finds and ignores malformed values */
    zr_train__section sec = {0};
    ZT_OK(zr_train__section_parse(&sec, "{\"optimizer_step\":6,\"next_sample\":24,"
                                  "\"val_loss\":2.5,\"val_step\":6,\"best_val_loss\":2.25,"
                                  "\"best_val_step\":3,\"val_set\":\"held-out|8|32\"}"));
    ZT_CHECK(sec.has_val && sec.has_best && sec.val_loss == 2.5 && sec.best_val_loss == 2.25);
    ZT_CHECK(sec.best_val_step == 3 && !strcmp(sec.val_set, "held-out|8|32"));
    zr_train__section_clear(&sec);
    ZT_OK(zr_train__section_parse(&sec, "{\"optimizer_step\":6,\"next_sample\":24,"
                                  "\"val_loss\":\"x\",\"val_step\":6,\"best_val_loss\":1,"
                                  "\"best_val_step\":-3}"));
    ZT_CHECK(!sec.has_val && !sec.has_best);
    zr_train__section_clear(&sec);
    /* a bad sample-order key: the order is unknown, and no error is left behind for a later
     * message to show (it left "'seed' is not a non-negative integer" set) */
    zr_err_clear();
    ZT_OK(zr_train__section_parse(&sec, "{\"optimizer_step\":6,\"seed\":-1,\"batch\":2}"));
    ZT_CHECK(!sec.order_known && sec.optimizer_step == 6);
    ZT_CHECK_EQ(zr_err_code(), 0);
    ZT_CHECK(!strcmp(zr_err_msg(), ""));
    zr_train__section_clear(&sec);
    /* not JSON: the message says where */
    ZT_ERR(zr_train__section_parse(&sec, "{\"optimizer_step\":6,"), ZR_ECORRUPT,
           "training section: not JSON (line 1:");
    ZT_ERR(zr_train__section_parse(&sec, "{\"optimizer_step\":-6}"), ZR_ECORRUPT,
           "training section: 'optimizer_step' is not a non-negative integer");
    zr_train__section_clear(&sec);
}

ZT_TEST(eval_bad_options)
{
    zr_train_opts o = zt_small_opts("run", 2);
    o.eval_every = 1;
    o.eval_batches = 0;
    zr_train_result res;
    ZT_ERR(zr_train(&res, &o), ZR_EINVAL, "--eval-batches 0: at least 1");
    o.eval_batches = 1;
    o.val_data = "";
    ZT_ERR(zr_train(&res, &o), ZR_EINVAL, "--val-data: empty");
    o.val_data = "no-such-file";
    ZT_ERR(zr_train(&res, &o), ZR_ENOTFOUND, "--val-data: data file 'no-such-file'");
    ZT_CHECK_EQ(mkfifo("fifo", 0600), 0); /* refused without blocking on the open */
    o.val_data = "fifo";
    ZT_ERR(zr_train(&res, &o), ZR_EINVAL, "--val-data: data file 'fifo'");
    /* an llm.c token file with a token beyond the model's vocabulary (256) */
    static unsigned char tok[1024 + 2 * 100];
    int32_t h[3] = {20240520, 1, 100};
    memcpy(tok, h, sizeof h);
    for (int i = 0; i < 100; i++)
        tok[1024 + 2 * i] = (unsigned char)(i == 40 ? 0 : 65), tok[1025 + 2 * i] = i == 40;
    zt_write_bytes("val.bin", tok, sizeof tok);
    o.val_data = "val.bin";
    ZT_ERR(zr_train(&res, &o), ZR_EINVAL, "token 256 at position 40 is out of the model's "
           "vocabulary");
    /* a data file too short to hold out a tail, with evaluation: said, with the way out */
    static unsigned char bytes[300];
    memset(bytes, 'a', sizeof bytes);
    zt_write_bytes("short.txt", bytes, sizeof bytes);
    o.val_data = NULL;
    o.data = "short.txt";
    ZT_ERR(zr_train(&res, &o), ZR_EINVAL, "give --val-data FILE");
    o.eval_every = 0; /* without evaluation it trains on the whole file */
    ZT_OK(zr_train(&res, &o));
    if (!getenv("ZT_ZRUN"))
        return;
    ZT_CHECK_EQ(zt_zrun("--eval-every 2 --eval-batches 0 --ckpt-dir r2", "cli.out"), 2);
    zt_file_has("cli.out", "--eval-batches");
}

/* ---------------------------------------------------------------- plots */

/* Whether python3 parses path as XML; -1 without python3. */
static int xml_ok(const char *path)
{
    if (system("command -v python3 >/dev/null 2>&1") != 0)
        return -1;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 -c \"import sys, xml.etree.ElementTree as E; "
             "E.parse(sys.argv[1])\" '%s'", path);
    return system(cmd) == 0;
}

static size_t count(const char *text, const char *what)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

ZT_TEST(plot_train_svg_marks_a_resume)
{
    char args[1024];
    snprintf(args, sizeof args, "--model %s --batch 4 --steps 12 --threads 1 --eval-every 4 "
             "--eval-batches 1 --save-every 4 --ckpt-dir run --log-json run/train.jsonl", SMALL);
    char first[1100];
    snprintf(first, sizeof first, "%s --stop-after 6", args);
    zt_zrun_ok(first, "a.out");
    struct stat st;
    ZT_CHECK_EQ(stat("run/train.svg", &st), 0); /* at the save of step 4 and the stop at 6 */
    char second[1100];
    snprintf(second, sizeof second, "%s --nproc 2 --zero 3", args);
    zt_zrun_ok(second, "b.out");
    char *svg = zt_slurp("run/train.svg");
    ZT_CHECK(!strncmp(svg, "<?xml", 5) && strstr(svg, "</svg>\n"));
    ZT_CHECK(strstr(svg, ">resume, world 1 to 2</text>"));
    ZT_CHECK_EQ(count(svg, "class=\"mark\""), 3); /* the mark on each panel */
    ZT_CHECK(strstr(svg, ">validation loss</text>") && strstr(svg, ">learning rate</text>") &&
             strstr(svg, ">tokens/s</text>") && strstr(svg, ">step</text>"));
    free(svg);
    int ok = xml_ok("run/train.svg");
    if (ok == 0)
        ZT_FAIL("run/train.svg is not well-formed XML");
    if (ok < 0)
        fprintf(stderr, "  (python3 not found: XML parse not checked)\n");
    ZT_CHECK(system("ls run | grep -q 'train.svg.tmp'") != 0); /* no temporary left */
}

/* n step records (the JSON log's format) into f, from step `from`, run id `run`. */
/* A run directory "run" and its JSON log, opened for writing records */
static FILE *new_run_log(void)
{
    ZT_CHECK_EQ(mkdir("run", 0755), 0);
    FILE *f = fopen("run/train.jsonl", "w");
    ZT_CHECK(f);
    return f;
}

static void records(FILE *f, uint64_t from, uint64_t n, const char *run, int world)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t s = from + i;
        fprintf(f, "{\"step\":%llu,\"loss\":%.6f,%s\"lr\":%.6e,\"grad_norm\":1.0,"
                   "\"tokens_per_s\":%.1f,\"world\":%d,\"run_id\":\"%s\"}\n",
                (unsigned long long)s, 5.0 / (1.0 + 0.001 * (double)s),
                s % 100 == 0 ? "\"val_loss\":3.5," : "", 1e-3, 1000.0 + (double)(s % 7), world,
                run);
    }
}

ZT_TEST(plot_robust_logs)
{
    zr_plot_info info;
    /* a truncated last line: skipped and counted */
    FILE *f = fopen("t.jsonl", "w");
    records(f, 1, 5, "a", 1);
    fputs("{\"step\":6,\"loss\":4.9", f);
    fclose(f);
    ZT_OK(zr_plot_write(&info, "t.jsonl", "t.svg"));
    ZT_CHECK(info.records == 5 && info.skipped == 1 && info.marks == 0);
    /* non-finite values (an old "nan", a null val_loss, a huge number) and a single point */
    zt_write_file("n.jsonl", "{\"step\":1,\"loss\":nan,\"lr\":1e-3}\n"
                             "{\"step\":2,\"loss\":null,\"val_loss\":null,\"lr\":1e-3,"
                             "\"tokens_per_s\":5}\n");
    ZT_OK(zr_plot_write(&info, "n.jsonl", "n.svg"));
    ZT_CHECK(info.records == 1 && info.skipped == 1);
    char *svg = zt_slurp("n.svg");
    ZT_CHECK(!strstr(svg, "nan") && !strstr(svg, "inf"));
    ZT_CHECK(strstr(svg, "<circle")); /* a lone point is a dot */
    free(svg);
    ZT_CHECK(xml_ok("n.svg") != 0);
    /* 100k records over two invocations: decimated, quickly */
    f = fopen("big.jsonl", "w");
    records(f, 1, 60000, "a", 2);
    records(f, 50001, 50000, "b", 4); /* redoes 10000 steps at another world size */
    fclose(f);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ZT_OK(zr_plot_write(&info, "big.jsonl", "big.svg"));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ZT_CHECK(info.records == 110000 && info.marks == 1);
    struct stat st;
    ZT_CHECK_EQ(stat("big.svg", &st), 0);
    fprintf(stderr, "  110000 records drawn in %.2f s into %lld bytes\n", s,
            (long long)st.st_size);
    ZT_CHECK(st.st_size < 1500000);
    ZT_CHECK(xml_ok("big.svg") != 0);
    /* nothing to draw: an empty log, only events, a FIFO, a missing file */
    zt_write_file("e.jsonl", "");
    ZT_ERR(zr_plot_write(&info, "e.jsonl", "e.svg"), ZR_EINVAL, "e.jsonl: no step records");
    zt_write_file("e.jsonl", "{\"event\":\"resume\",\"step\":3}\n");
    ZT_ERR(zr_plot_write(&info, "e.jsonl", "e.svg"), ZR_EINVAL, "no step records");
    ZT_CHECK(stat("e.svg", &st) < 0);
    ZT_CHECK_EQ(mkfifo("fifo", 0600), 0);
    ZT_ERR(zr_plot_write(&info, "fifo", "e.svg"), ZR_ECORRUPT, "FIFO");
    ZT_ERR(zr_plot_write(&info, "missing.jsonl", "e.svg"), ZR_ENOTFOUND, "missing.jsonl");
    /* an unwritable destination: an error naming it */
    ZT_ERR(zr_plot_write(&info, "t.jsonl", "no-dir/t.svg"), ZR_ENOTFOUND, "no-dir/t.svg");
    /* a FIFO where the drawing goes, or where its temporary would: replaced, never opened */
    ZT_CHECK_EQ(mkfifo("f.svg", 0600), 0);
    ZT_OK(zr_plot_write(&info, "t.jsonl", "f.svg"));
    ZT_CHECK(stat("f.svg", &st) == 0 && S_ISREG(st.st_mode));
    char tmp[64];
    snprintf(tmp, sizeof tmp, ".g.svg.tmp-%ld", (long)getpid());
    ZT_CHECK_EQ(mkfifo(tmp, 0600), 0);
    ZT_OK(zr_plot_write(&info, "t.jsonl", "g.svg"));
    ZT_CHECK(stat("g.svg", &st) == 0 && S_ISREG(st.st_mode) && stat(tmp, &st) < 0);
    /* the log itself as the drawing (zrun --log-json RUN/train.svg): refused, the log kept */
    char *before = zt_slurp("t.jsonl");
    ZT_ERR(zr_plot_write(&info, "t.jsonl", "t.jsonl"), ZR_EINVAL, "t.jsonl is the log t.jsonl");
    ZT_ERR(zr_plot_write(&info, "t.jsonl", "./t.jsonl"), ZR_EINVAL,
           "./t.jsonl is the log t.jsonl itself");
    char *after = zt_slurp("t.jsonl");
    ZT_CHECK(!strcmp(before, after));
    free(before);
    free(after);
}

/* Where zckpt plot draws: never over the log it reads, nor over anything but a regular file (a
 * FIFO refused without blocking); an earlier drawing is redrawn, any other file only with
 * --force. */
ZT_TEST(plot_zckpt_plot_output_refusals)
{
    FILE *f = new_run_log();
    records(f, 1, 20, "a", 1);
    fclose(f);
    char *log = zt_slurp("run/train.jsonl"), *o;
    const char *same[] = {"plot run -o run/train.jsonl", "plot run -o ./run/train.jsonl --force",
                          "plot run/train.jsonl -o run/train.jsonl",
                          "plot run --log run/train.jsonl -o run//train.jsonl"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        int rc = zt_zckpt(&o, "%s", same[i]);
        if (rc != 2 || !strstr(o, "train.jsonl is the log run/train.jsonl itself"))
            ZT_FAIL("zckpt %s: exit %d:\n%s", same[i], rc, o);
        free(o);
        char *now = zt_slurp("run/train.jsonl");
        ZT_CHECK(!strcmp(now, log));
        free(now);
    }
    /* not regular files: a FIFO (never opened), a directory, a link to the log */
    ZT_CHECK_EQ(mkfifo("fifo.svg", 0600), 0);
    ZT_CHECK_EQ(mkdir("dir.svg", 0755), 0);
    ZT_CHECK_EQ(symlink("run/train.jsonl", "link.svg"), 0);
    const char *kind[][2] = {{"fifo.svg", "a FIFO"}, {"dir.svg", "a directory"},
                             {"link.svg", "a symbolic link"}};
    struct stat st;
    for (size_t i = 0; i < 3; i++) {
        int rc = zt_zckpt(&o, "plot run -o %s --force", kind[i][0]);
        if (rc != 2 || !strstr(o, kind[i][0]) || !strstr(o, kind[i][1]))
            ZT_FAIL("zckpt plot run -o %s: exit %d:\n%s", kind[i][0], rc, o);
        free(o);
    }
    ZT_CHECK(lstat("fifo.svg", &st) == 0 && S_ISFIFO(st.st_mode));
    ZT_CHECK(lstat("link.svg", &st) == 0 && S_ISLNK(st.st_mode));
    char *now = zt_slurp("run/train.jsonl");
    ZT_CHECK(!strcmp(now, log));
    free(now);
    /* a file that is not a drawing: only with --force */
    zt_write_file("notes.txt", "mine\n");
    int rc = zt_zckpt(&o, "plot run -o notes.txt");
    ZT_CHECK(rc == 2 && strstr(o, "notes.txt: exists and is not an SVG drawing") &&
             strstr(o, "--force"));
    free(o);
    zt_file_has("notes.txt", "mine\n");
    rc = zt_zckpt(&o, "plot run -o notes.txt --force");
    ZT_CHECK(rc == 0 && strstr(o, "notes.txt: 20 step records drawn"));
    free(o);
    zt_file_has("notes.txt", "<svg");
    /* an earlier drawing (zrun's RUN/train.svg) is redrawn without --force, as documented */
    rc = zt_zckpt(&o, "plot run");
    ZT_CHECK(rc == 0);
    free(o);
    rc = zt_zckpt(&o, "plot run");
    ZT_CHECK(rc == 0 && strstr(o, "run/train.svg: 20 step records drawn"));
    free(o);
    free(log);
}

ZT_TEST(plot_zckpt_plot_truncated_log)
{
    FILE *f = new_run_log();
    records(f, 1, 30, "a", 1);
    records(f, 21, 10, "b", 2);
    fputs("{\"step\":31,\"lo", f); /* a crash in the middle of a record */
    fclose(f);
    char *o;
    int rc = zt_zckpt(&o, "plot run");
    if (rc != 0 || !strstr(o, "run/train.svg: 40 step records drawn, 1 resume or world-size "
                              "mark") || !strstr(o, "1 line skipped"))
        ZT_FAIL("zckpt plot run: exit %d:\n%s", rc, o);
    free(o);
    ZT_CHECK(xml_ok("run/train.svg") != 0);
    rc = zt_zckpt(&o, "plot run/train.jsonl -o other.svg");
    ZT_CHECK(rc == 0 && strstr(o, "other.svg: 40 step records"));
    free(o);
    rc = zt_zckpt(&o, "plot run/train.jsonl");
    ZT_CHECK(rc == 2 && strstr(o, "add -o FILE.svg"));
    free(o);
    zt_write_file("empty.jsonl", "");
    rc = zt_zckpt(&o, "plot empty.jsonl -o e.svg");
    ZT_CHECK(rc == 2 && strstr(o, "zckpt: error: empty.jsonl: no step records to plot"));
    free(o);
    ZT_CHECK_EQ(mkdir("bare", 0755), 0);
    rc = zt_zckpt(&o, "plot bare");
    ZT_CHECK(rc == 2 && strstr(o, "bare/train.jsonl") && strstr(o, "--log FILE"));
    free(o);
}

/* A browser renders it: headless Chromium's screenshot is a PNG that is not one colour. */
ZT_TEST(plot_renders_in_chromium)
{
    static const char *const names[] = {"chromium", "chromium-browser", "google-chrome", NULL};
    const char *bin = NULL;
    char cmd[1024];
    for (size_t i = 0; names[i] && !bin; i++) {
        snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", names[i]);
        if (system(cmd) == 0)
            bin = names[i];
    }
    if (!bin)
        ZT_SKIP("chromium is not installed (make test-deps installs it)");
    if (system("command -v python3 >/dev/null 2>&1") != 0)
        ZT_SKIP("python3 is not installed (needed to read the PNG)");
    FILE *f = fopen("train.jsonl", "w");
    records(f, 1, 300, "a", 1);
    records(f, 201, 100, "b", 2);
    fclose(f);
    zr_plot_info info;
    ZT_OK(zr_plot_write(&info, "train.jsonl", "train.svg"));
    /* --no-sandbox: root (CI) has no sandbox; timeout: a browser that hangs fails the test */
    snprintf(cmd, sizeof cmd, "timeout 120 %s --headless --no-sandbox --disable-gpu "
             "--screenshot=shot.png --window-size=960,760 file://$PWD/train.svg > chromium.out "
             "2>&1", bin);
    if (system(cmd) != 0)
        ZT_FAIL("%s failed to render train.svg:\n%s", bin, zt_slurp("chromium.out"));
    /* decode the PNG's pixels (zlib, filters undone) and count the distinct colours */
    const char *py =
        "import sys, zlib, struct\n"
        "d = open('shot.png', 'rb').read()\n"
        "assert d[:8] == b'\\x89PNG\\r\\n\\x1a\\n'\n"
        "i, idat, w, h, ct = 8, b'', 0, 0, 0\n"
        "while i < len(d):\n"
        "    n, t = struct.unpack('>I4s', d[i:i + 8]); c = d[i + 8:i + 8 + n]; i += 12 + n\n"
        "    if t == b'IHDR': w, h, bd, ct = struct.unpack('>IIBB', c[:10])\n"
        "    if t == b'IDAT': idat += c\n"
        "bpp = {2: 3, 6: 4}[ct]; raw = zlib.decompress(idat); s = w * bpp\n"
        "prev = bytearray(s); colours = set()\n"
        "for y in range(h):\n"
        "    f = raw[y * (s + 1)]; line = bytearray(raw[y * (s + 1) + 1:(y + 1) * (s + 1)])\n"
        "    for x in range(s):\n"
        "        a = line[x - bpp] if x >= bpp else 0; b = prev[x]; c = prev[x - bpp] if x >= bpp else 0\n"
        "        p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)\n"
        "        pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)\n"
        "        line[x] = (line[x] + [0, a, b, (a + b) // 2, pr][f]) & 255\n"
        "    prev = line\n"
        "    if y % 4 == 0: colours.update(bytes(line[k:k + 3]) for k in range(0, s, bpp * 4))\n"
        "print(len(colours)); sys.exit(0 if len(colours) > 4 else 1)\n";
    FILE *p = fopen("png.py", "w");
    fputs(py, p);
    fclose(p);
    if (system("python3 png.py > png.out 2>&1") != 0)
        ZT_FAIL("the screenshot of train.svg is blank or unreadable: %s", zt_slurp("png.out"));
}

/* The device path (the host simulation of a device: the device ABI's forward, the device
 * engine's forward-only schedule) evaluates to the CPU engine's bits. */
ZT_TEST(eval_on_the_device_path)
{
    static const char *const dev[2] = {"--device cpu", "--device cuda"};
    char vals[2][8][32];
    for (int i = 0; i < 2; i++) {
        char dir[16], log[32], out[32];
        snprintf(dir, sizeof dir, "d%d", i);
        snprintf(log, sizeof log, "d%d.jsonl", i);
        snprintf(out, sizeof out, "d%d.out", i);
        setenv("ZR_CUDA_LIB", "hostsim", 1);
        zt_zrunf_ok(out, "--model %s --batch 4 --steps 4 --threads 1 --eval-every 2 "
                    "--eval-batches 2 --nproc 2 --zero 3 --ckpt-dir %s --log-json %s %s", SMALL,
                    dir, log, dev[i]);
        unsetenv("ZR_CUDA_LIB");
        ZT_CHECK_EQ(val_texts(log, vals[i], 8), 2);
    }
    char *t = zt_slurp("d1.out");
    if (!strstr(t, "device: hostsim"))
        ZT_FAIL("d1.out: not on the device path:\n%s", t);
    free(t);
    for (int k = 0; k < 2; k++)
        if (strcmp(vals[0][k], vals[1][k]))
            ZT_FAIL("val_loss %s on the device path, %s on the CPU", vals[1][k], vals[0][k]);
    ZT_CHECK(section_number("d0", "best_val_loss") == section_number("d1", "best_val_loss"));
}
