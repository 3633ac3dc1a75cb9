/*
 * test_zero.c: multi-rank training through the real zrun launcher (one process per rank, the
 * shm communicator): stages 0-3 at worlds 1, 2 and 4 give the same losses (bit-equal where the
 * reduction order is the same) and the same final parameters; model-state bytes per rank
 * follow the ZeRO formulas and stage 3 holds clearly less than stage 0; a run trained at one
 * world size and stage resumes at others; a rank killed mid-step or mid-save stops the job
 * within seconds, naming the rank, with `latest` still sound.
 */
#include "ckutil.h"
#include "zr.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define SMALL "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256"
#define MAX_STEPS 64

typedef struct {
    size_t n;
    double loss[MAX_STEPS + 1]; /* by step */
    uint64_t params, grads, optimizer, buffers, rss_peak; /* of the last line */
} jlog;

static void read_jlog(jlog *j, const char *path)
{
    memset(j, 0, sizeof *j);
    FILE *f = fopen(path, "r");
    if (!f)
        ZT_FAIL("%s: %s", path, strerror(errno));
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        if (!o)
            ZT_FAIL("%s: bad JSON line: %s", path, line);
        json_int_t step = json_integer_value(json_object_get(o, "step"));
        ZT_CHECK(step >= 1 && step <= MAX_STEPS);
        j->loss[step] = json_real_value(json_object_get(o, "loss"));
        json_t *m = json_object_get(o, "mem");
        j->params = (uint64_t)json_integer_value(json_object_get(m, "params"));
        j->grads = (uint64_t)json_integer_value(json_object_get(m, "grads"));
        j->optimizer = (uint64_t)json_integer_value(json_object_get(m, "optimizer"));
        j->buffers = (uint64_t)json_integer_value(json_object_get(m, "buffers"));
        j->rss_peak = (uint64_t)json_integer_value(json_object_get(o, "rss_peak"));
        if ((size_t)step > j->n)
            j->n = (size_t)step;
        json_decref(o);
    }
    fclose(f);
}

static double rel(double a, double b)
{
    return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1e-30);
}

/* one run of the stage matrix: world W, stage s, micro-batch mb per rank (0: the default) */
static void stage_run(jlog *j, int W, int s, int mb, int steps)
{
    char dir[64], log[80], jl[80];
    snprintf(dir, sizeof dir, "w%d-s%d-mb%d", W, s, mb);
    snprintf(log, sizeof log, "%s.log", dir);
    snprintf(jl, sizeof jl, "%s.jsonl", dir);
    zt_zrunf_ok(log, "--model %s --batch 8 %s%.0d --steps %d --warmup 5 --lr 3e-3 --threads 1 "
                "--nproc %d --zero %d --ckpt-dir %s --log-json %s", SMALL,
                mb ? "--micro-batch " : "", mb, steps, W, s, dir, jl);
    read_jlog(j, jl);
    ZT_CHECK_EQ(j->n, steps);
}

ZT_TEST(zero_stages_agree_across_worlds)
{
    const int steps = 30;
    static jlog ref, j;
    stage_run(&ref, 1, 0, 0, steps);
    for (int W = 1; W <= 4; W *= 2)
        for (int s = 0; s <= 3; s++) {
            if (W == 1 && s == 0)
                continue;
            stage_run(&j, W, s, 0, steps);
            for (int k = 1; k <= steps; k++) {
                /* one micro-batch per rank: every stage reduces in the same order, so a world
                 * gives the same bits at every stage; across worlds within 1e-5 */
                if (W == 1 && j.loss[k] != ref.loss[k])
                    ZT_FAIL("W=1 stage %d step %d: loss %.9g, stage 0 %.9g", s, k, j.loss[k],
                            ref.loss[k]);
                if (rel(j.loss[k], ref.loss[k]) > 1e-5)
                    ZT_FAIL("W=%d stage %d step %d: loss %.9g vs %.9g at W=1", W, s, k,
                            j.loss[k], ref.loss[k]);
            }
            char dir[64];
            snprintf(dir, sizeof dir, "w%d-s%d-mb0", W, s);
            zt_same_latest(dir, "w1-s0-mb0", 1e-5, 1e-4);
        }
    /* the same world and stage order gives equal bits: stage 1 = stage 0, stage 3 = stage 2
     * with gradient accumulation (2 micro-batches per rank) */
    static jlog a, b, ref12;
    stage_run(&ref12, 1, 0, 8, 12);
    for (int s = 0; s <= 2; s += 2) {
        stage_run(&a, 2, s, 2, 12);
        stage_run(&b, 2, s + 1, 2, 12);
        for (int k = 1; k <= 12; k++) {
            if (a.loss[k] != b.loss[k])
                ZT_FAIL("W=2 micro-batch 2: stage %d step %d loss %.9g, stage %d %.9g", s + 1,
                        k, b.loss[k], s, a.loss[k]);
            if (rel(a.loss[k], ref12.loss[k]) > 1e-5)
                ZT_FAIL("W=2 micro-batch 2 stage %d step %d: %.9g vs %.9g at W=1", s, k,
                        a.loss[k], ref12.loss[k]);
        }
    }
}

ZT_TEST(zero_memory_follows_the_formulas)
{
    /* 8 layers of dim 256: 6.4M parameters, so model states dominate the process */
    const char *model = "gpt2:layers=8,heads=4,dim=256,ctx=64,vocab=256";
    zr_gpt2_config c;
    ZT_OK(zr_gpt2_config_parse(&c, model));
    zck_layout *L;
    ZT_OK(zr_gpt2_layout(&L, &c));
    double numel = 0;
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        numel += (double)zck_layout_group_numel(L, g);
    zck_layout_free(L);
    const int W = 4;
    const double formula[4] = {16, 4 + 4 + 8.0 / W, 4 + 12.0 / W, 16.0 / W};
    uint64_t rss[4];
    for (int s = 0; s <= 3; s++) {
        char dir[32], log[48], jl[48];
        snprintf(dir, sizeof dir, "mem-s%d", s);
        snprintf(log, sizeof log, "%s.log", dir);
        snprintf(jl, sizeof jl, "%s.jsonl", dir);
        zt_zrunf_ok(log, "--model %s --batch 4 --seq 32 --steps 2 --threads 1 --nproc %d "
                    "--zero %d --prefetch 1 --ckpt-dir %s --log-json %s", model, W, s, dir, jl);
        jlog j;
        read_jlog(&j, jl);
        double states = (double)(j.params + j.grads + j.optimizer), want = formula[s] * numel;
        printf("  stage %d: model states %.2f MiB per rank (formula %.2f MiB), buffers %.2f MiB, "
               "peak RSS %.1f MiB\n", s, states / 1048576, want / 1048576,
               j.buffers / 1048576.0, j.rss_peak / 1048576.0);
        if (rel(states, want) > 0.02)
            ZT_FAIL("stage %d: %.0f bytes of model states per rank, formula %.0f", s, states,
                    want);
        rss[s] = j.rss_peak;
    }
#if defined(__SANITIZE_ADDRESS__)
    /* ASan's shadow memory and quarantine swamp the resident set: the byte counts above are
     * checked, the RSS ordering only in the plain build */
    (void)rss;
#else
    /* stage 3 holds a quarter of the states plus bounded buffers */
    ZT_CHECK(rss[3] < rss[0] * 0.7);
    ZT_CHECK(rss[1] < rss[0] && rss[2] < rss[1] && rss[3] < rss[2]);
#endif
}

ZT_TEST(zero_elastic_resume)
{
    const char *common = "--model " SMALL " --batch 12 --steps 20 --warmup 5 --lr 3e-3 "
                         "--threads 1";
    zt_zrunf_ok("straight.log", "%s --nproc 4 --zero 3 --ckpt-dir straight --log-json "
                "straight.jsonl", common);
    jlog ref;
    read_jlog(&ref, "straight.jsonl");
    static const int to[2][2] = {{2, 1}, {3, 2}};
    for (int i = 0; i < 2; i++) {
        char dir[32], jl[48], log[48];
        snprintf(dir, sizeof dir, "elastic-%d", i);
        snprintf(jl, sizeof jl, "%s.jsonl", dir);
        snprintf(log, sizeof log, "%s-a.log", dir);
        zt_zrunf_ok(log, "%s --nproc 4 --zero 3 --stop-after 10 --ckpt-dir %s --log-json %s",
                    common, dir, jl);
        snprintf(log, sizeof log, "%s-b.log", dir);
        zt_zrunf_ok(log, "%s --nproc %d --zero %d --ckpt-dir %s --log-json %s", common,
                    to[i][0], to[i][1], dir, jl);
        zt_file_has(log, "(world 4, ZeRO 3; every file hashed"); /* resumed that checkpoint */
        jlog j;
        read_jlog(&j, jl);
        ZT_CHECK_EQ(j.n, 20);
        for (int k = 1; k <= 20; k++)
            if (rel(j.loss[k], ref.loss[k]) > (k <= 10 ? 0 : 1e-5))
                ZT_FAIL("resumed at W=%d stage %d: step %d loss %.9g, straight %.9g",
                        to[i][0], to[i][1], k, j.loss[k], ref.loss[k]);
        zt_same_latest(dir, "straight", 1e-5, 1e-4);
    }
}

/* The pid of rank `rank` among the launcher's children (0 when not found yet). */
static pid_t rank_pid(pid_t launcher, int rank)
{
    pid_t kids[64];
    int nk = zt_children(launcher, kids, 64);
    for (int k = 0; k < nk; k++)
        if (zt_rank_of(kids[k]) == rank)
            return kids[k];
    return 0;
}

/* Start a 2-rank run, SIGKILL rank 1 after delay_ms, and check how the job ends. */
static void kill_one_rank(const char *dir, const char *extra, int delay_ms)
{
    pid_t pid = fork();
    if (pid == 0) {
        char log[64];
        snprintf(log, sizeof log, "%s.log", dir);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "exec %s --model %s --batch 4 --steps 100000 --threads 1 "
                 "--nproc 2 --zero 3 --ckpt-dir %s %s", zt_zrun_path(), SMALL, dir, extra);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    pid_t victim = 0;
    for (int i = 0; i < 1000 && !victim; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        victim = rank_pid(pid, 1);
    }
    ZT_CHECK(victim > 0);
    struct timespec ts = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    ZT_CHECK(kill(victim, SIGKILL) == 0);
    double t0 = zt_now_s();
    int status;
    ZT_CHECK(waitpid(pid, &status, 0) == pid);
    double took = zt_now_s() - t0;
    printf("  %s: killed rank 1 after %d ms; zrun exited %d after %.2f s\n", dir, delay_ms,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1, took);
    ZT_CHECK(took < 10.0);
    ZT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    char log[64], *text;
    snprintf(log, sizeof log, "%s.log", dir);
    ZT_OK(zck__read_small_for_tests(&text, log));
    if (!strstr(text, "rank 1 was killed by signal 9"))
        ZT_FAIL("%s does not name the killed rank:\n%s", log, text);
    free(text);
    char *latest;
    if (zck_latest(&latest, dir) == 0) { /* whatever was committed still verifies */
        ZT_CHECK_EQ(zt_verify_count(latest, 0), 0);
        free(latest);
    }
}

ZT_TEST(zero_rank_killed_mid_step_stops_the_job)
{
    kill_one_rank("midstep", "", 700);
}

ZT_TEST(zero_rank_killed_mid_save_keeps_latest_sound)
{
    /* a save after every step: most instants fall inside one */
    srand((unsigned)getpid());
    int rounds = zt_stress() ? 20 : 3;
    for (int i = 0; i < rounds; i++) {
        char dir[32];
        snprintf(dir, sizeof dir, "midsave-%d", i);
        kill_one_rank(dir, "--save-every 1 --keep-last 2", 400 + rand() % 600);
    }
}

/* issue 13: ZeRO-3 with more than 1020 layers (the schedule was a fixed array of 1024 groups
 * and aborted on an assert): sized from the model, it trains and agrees with stage 0 */
ZT_TEST(zero_stage3_many_layers)
{
    const char *model = "--model gpt2:layers=1100,heads=1,dim=8,ctx=8,vocab=256 --batch 4 "
                        "--steps 2 --threads 1 --resume never --async-save off";
    zt_zrunf_ok("s3.log", "--nproc 2 --zero 3 %s --ckpt-dir s3", model);
    zt_zrunf_ok("s0.log", "--nproc 2 --zero 0 %s --ckpt-dir s0", model);
    zt_same_latest("s3", "s0", 0, 0);
}

/* Asynchronous saves write straight from the live states: with a disk far slower than a step
 * (ZR_SAVE_THROTTLE_MS) and a buffer smaller than a rank's states, every shard of every step
 * equals, bit for bit, the synchronous save of the same step, at stages 1-3 (the update of the
 * next step must neither run into chunks not yet written nor be seen by the writer). */
ZT_TEST(zero_async_save_from_live_states_equals_sync_save)
{
    static const char *M = "gpt2:layers=2,heads=2,dim=64,ctx=32,vocab=256";
    setenv("ZR_SAVE_THROTTLE_MS", "15", 1);
    for (int s = 1; s <= 3; s++) {
        char log[32];
        size_t buffered = 0;
        for (int async = 0; async < 2; async++) {
            const char *mode = async ? "on" : "off";
            snprintf(log, sizeof log, "s%d-%d.log", s, async);
            zt_zrunf_ok(log, "--model %s --nproc 2 --zero %d --batch 4 --steps 3 --save-every 1 "
                        "--keep-last 0 --threads 1 --resume never --async-save %s "
                        "--save-buffer 131072 --ckpt-dir s%d-%s", M, s, mode, s, mode);
        }
        char *t = zt_slurp(log), *p = t;
        while ((p = strstr(p, " chunks buffered"))) { /* "...; N chunks buffered)" */
            const char *q = p;
            while (q > t && q[-1] >= '0' && q[-1] <= '9')
                q--;
            buffered += strtoul(q, NULL, 10);
            p++;
        }
        if (!buffered)
            ZT_FAIL("stage %d: no chunk went through the bounded buffer:\n%s", s, t);
        free(t);
        for (int step = 1; step <= 3; step++)
            for (int r = 0; r < 2; r++) {
                char a[128], b[128];
                snprintf(a, sizeof a, "s%d-on/step-%08d/shard-%05d-of-00002.bin", s, step, r);
                snprintf(b, sizeof b, "s%d-off/step-%08d/shard-%05d-of-00002.bin", s, step, r);
                if (!zt_same_file(a, b))
                    ZT_FAIL("stage %d: %s differs from the synchronous save %s", s, a, b);
            }
        char latest[64];
        snprintf(latest, sizeof latest, "s%d-on/step-00000003", s);
        ZT_CHECK_EQ(zt_verify_count(latest, 0), 0);
    }
}

/* One number of a JSON object (fails the test when missing). */
static uint64_t json_u64(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        ZT_FAIL("dry run JSON: no integer \"%s\"", key);
    return (uint64_t)json_integer_value(v);
}

/* `zrun --dry-run --json` predicts each rank's peak RSS: every category listed, total_bytes
 * their sum, and rank 0's measured peak (2 ranks, asynchronous saves on, 2 steps) within
 * 0.8-1.2x of it at stages 0-3, in memory and with the optimizer states on NVMe (stage 3: the
 * parameters too). The token embedding (vocabulary 8192) is larger than a layer: stages 2-3
 * take its gradient in pieces, stage 3 gathers it into a buffer of its own. */
ZT_TEST(zero_dry_run_predicts_peak_rss)
{
    static const char *M = "gpt2:layers=4,heads=4,dim=256,ctx=64,vocab=8192";
    static const char *cats[] = {"params", "grads", "optimizer", "gather_buffers",
                                 "swap_staging", "save_staging", "activations", "pinned",
                                 "baseline"};
    ZT_CHECK(mkdir("swap", 0755) == 0);
    for (int off = 0; off < 2; off++)
        for (int s = 0; s <= 3; s++) {
            char opts[512], dir[32], jl[40], log[40];
            snprintf(opts, sizeof opts, "--model %s --nproc 2 --zero %d --batch 4 --seq 64 "
                     "--threads 1 --async-save on%s%s", M, s,
                     off ? " --offload-optimizer nvme --nvme-path swap" : "",
                     off && s == 3 ? " --offload-params nvme" : "");
            snprintf(dir, sizeof dir, "run-%d-%d", off, s);
            snprintf(jl, sizeof jl, "%s.jsonl", dir);
            snprintf(log, sizeof log, "%s.json", dir);
            zt_zrunf_ok(log, "%s --dry-run --json --ckpt-dir %s", opts, dir);
            char *t = zt_slurp(log);
            json_error_t e;
            json_t *o = json_loads(t, 0, &e);
            if (!o)
                ZT_FAIL("%s: not JSON (%s):\n%s", log, e.text, t);
            json_t *r0 = json_array_get(json_object_get(o, "ranks"), 0);
            ZT_CHECK(json_array_size(json_object_get(o, "ranks")) == 2);
            uint64_t sum = 0;
            for (size_t i = 0; i < sizeof cats / sizeof *cats; i++)
                sum += json_u64(r0, cats[i]);
            uint64_t total = json_u64(r0, "total_bytes");
            ZT_CHECK_EQ(sum, total);
            ZT_CHECK(json_u64(r0, "baseline") > 0 && json_u64(r0, "activations") > 0);
            ZT_CHECK((json_u64(r0, "save_staging") > 0) == 1);
            ZT_CHECK((json_u64(r0, "swap_staging") > 0) == off);
            json_decref(o);
            free(t);
            snprintf(log, sizeof log, "%s.log", dir);
            zt_zrunf_ok(log, "%s --steps 2 --save-every 1 --resume never --ckpt-dir %s "
                        "--log-json %s", opts, dir, jl);
            jlog j;
            read_jlog(&j, jl);
            double ratio = (double)j.rss_peak / (double)total;
            printf("  %s stage %d: peak RSS %.1f MiB, dry run %.1f MiB (%.2fx)\n",
                   off ? "nvme" : "memory", s, j.rss_peak / 1048576.0, total / 1048576.0, ratio);
            if (ratio < 0.8 || ratio > 1.2)
                ZT_FAIL("%s: measured peak RSS %.2fx the dry run's total_bytes (0.8-1.2 "
                        "expected)", dir, ratio);
        }
}

/* The options of this issue refuse bad values by name: a save buffer under 4096 bytes, --json
 * without --dry-run. */
ZT_TEST(zero_memory_options_refused)
{
    int st = zt_zrun("--save-buffer 100 --steps 1 --ckpt-dir r", "a.log");
    char *t = zt_slurp("a.log");
    if (st != 2 || !strstr(t, "--save-buffer 100"))
        ZT_FAIL("exit %d; expected --save-buffer 100 refused:\n%s", st, t);
    free(t);
    st = zt_zrun("--json --ckpt-dir r", "b.log");
    t = zt_slurp("b.log");
    if (st != 2 || !strstr(t, "--json") || !strstr(t, "--dry-run"))
        ZT_FAIL("exit %d; expected --json without --dry-run refused:\n%s", st, t);
    free(t);
    struct stat sb;
    ZT_CHECK(stat("r", &sb) != 0); /* nothing started */
}

/* One short run of model at W = 2, stage s, one micro-batch of 4 per rank (with gradient
 * accumulation stage 0 sums in another order than stages 2-3: zero_stages_agree_across_worlds),
 * into dir; the JSON log read into j. */
static void pieces_run(jlog *j, const char *model, int s, const char *dir)
{
    char log[80], jl[80];
    snprintf(log, sizeof log, "%s.log", dir);
    snprintf(jl, sizeof jl, "%s.jsonl", dir);
    zt_zrunf_ok(log, "--model %s --batch 8 --seq 64 --steps 3 --warmup 1 --threads 2 --nproc 2 "
                "--zero %d --ckpt-dir %s --log-json %s --resume never", model, s, dir, jl);
    read_jlog(j, jl);
    ZT_CHECK_EQ(j->n, 3);
}

/* Embeddings larger than a layer (GPT-2's wte and wpe, Llama's embed_tokens and an untied
 * lm_head) get their gradient in pieces of an ordinary gradient slot at stages 2-3 (11 and 2
 * pieces for GPT-2's here, 16 for each of Llama's), not in a buffer of their own: the same
 * bits as stage 0's whole buffers, every loss and every state of the checkpoint, and stage 2's
 * buffers smaller than one embedding. */
ZT_TEST(zero_embedding_gradient_in_pieces)
{
    static const char *models[] = {
        "gpt2:layers=2,heads=2,dim=32,ctx=512,vocab=4096",
        "llama:layers=2,heads=2,kv_heads=1,dim=32,ffn=64,ctx=64,vocab=4096,tied=1",
        "llama:layers=2,heads=2,kv_heads=1,dim=32,ffn=64,ctx=64,vocab=4096,tied=0"};
    for (size_t i = 0; i < 3; i++) {
        static jlog ref, j;
        char d0[32], d[32];
        snprintf(d0, sizeof d0, "m%zu-s0", i);
        pieces_run(&ref, models[i], 0, d0);
        for (int s = 2; s <= 3; s++) {
            snprintf(d, sizeof d, "m%zu-s%d", i, s);
            pieces_run(&j, models[i], s, d);
            for (int k = 1; k <= 3; k++)
                if (j.loss[k] != ref.loss[k])
                    ZT_FAIL("%s stage %d step %d: loss %.9g, stage 0 %.9g", models[i], s, k,
                            j.loss[k], ref.loss[k]);
            zt_same_latest(d, d0, 0, 0);
            uint64_t emb = 4096 * 32 * sizeof(float);
            if (s == 2 && j.buffers >= emb)
                ZT_FAIL("%s stage 2: %llu bytes of buffers, not less than the embedding's %llu",
                        models[i], (unsigned long long)j.buffers, (unsigned long long)emb);
        }
    }
}
