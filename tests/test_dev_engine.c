/*
 * test_dev_engine.c: the engine's device path (zero_dev.c, train.c with --device cuda) through
 * the real zrun and launcher, on the host simulation of a device (ZR_CUDA_LIB=hostsim,
 * device.h): every buffer, copy, hook and collective of the device path runs, with the CPU
 * engine's kernels, so the results must have the CPU engine's bits. Stages 0-3 at worlds 1
 * and 2 with NCCL-style collectives (the device communicator) and host-staged ones (ranks
 * sharing a GPU) give exactly the CPU run's losses and checkpoint; the optimizer offloaded to
 * pinned host memory or to NVMe, and the stage-3 parameters to pinned memory or NVMe, too; checkpoints move between the CPU and the device both ways; and the
 * device options fail clearly where they cannot work. The CUDA kernels themselves are checked
 * on a GPU by tests/gpu/run.sh.
 */
#include "ckutil.h"
#include "device.h"
#include "zr.h"

#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SMALL "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256"
#define COMMON "--model " SMALL " --seq 32 --batch 8 --micro-batch 2 --threads 1 --steps 8 "
#define ONE_MICRO "--model " SMALL " --seq 32 --batch 8 --micro-batch 4 --threads 1 --steps 8 "

/* The "loss" values of a --log-json file, one per line, as printed (bits of the float). */
static char *losses(const char *path)
{
    char *t = zt_slurp(path), *out = calloc(1, strlen(t) + 1);
    ZT_CHECK(out != NULL);
    size_t n = 0;
    for (char *p = t; (p = strstr(p, "\"loss\":")); p += 7) {
        char *e = strchr(p, ',');
        ZT_CHECK(e != NULL);
        memcpy(out + n, p + 7, (size_t)(e - p - 7));
        n += (size_t)(e - p - 7);
        out[n++] = ' ';
    }
    free(t);
    ZT_CHECK(n > 0);
    return out;
}

static void same_losses(const char *a, const char *b)
{
    char *la = losses(a), *lb = losses(b);
    if (strcmp(la, lb))
        ZT_FAIL("losses differ:\n  %s: %s\n  %s: %s", a, la, b, lb);
    free(la);
    free(lb);
}

/* A field of the last JSON line's "mem" object. */
static long long last_mem(const char *path, const char *key)
{
    char *t = zt_slurp(path);
    char *last = t, *p;
    while ((p = strchr(last, '\n')) && p[1])
        last = p + 1;
    json_error_t e;
    json_t *o = json_loads(last, 0, &e);
    if (!o)
        ZT_FAIL("%s: last line is not JSON: %s", path, last);
    long long v = json_integer_value(json_object_get(json_object_get(o, "mem"), key));
    json_decref(o);
    free(t);
    return v;
}

ZT_TEST(dev_engine_stages_match_cpu)
{
    setenv("ZR_CUDA_LIB", "hostsim", 1);
    char log[64], js[64];
    static const int worlds[2] = {1, 2};
    for (int wi = 0; wi < 2; wi++) {
        int W = worlds[wi];
        for (int s = 0; s <= 3; s++) {
            snprintf(log, sizeof log, "c%d%d.log", W, s);
            zt_zrunf_ok(log, COMMON "--device cpu --nproc %d --zero %d --ckpt-dir c%d%d "
                        "--log-json c%d%d.json", W, s, W, s, W, s);
            for (int m = 0; m < (W > 1 ? 2 : 1); m++) {
                const char *mode = m ? "nccl" : "shm";
                setenv("ZR_DEVICE_COMM", mode, 1);
                snprintf(log, sizeof log, "d%d%d%s.log", W, s, mode);
                zt_zrunf_ok(log, COMMON "--device cuda --nproc %d --zero %d --ckpt-dir d%d%d%s "
                            "--log-json d%d%d%s.json", W, s, W, s, mode, W, s, mode);
                char *t = zt_slurp(log);
                if (!strstr(t, "device: hostsim"))
                    ZT_FAIL("%s: no device line:\n%s", log, t);
                if (W > 1 && !strstr(t, m ? "; NCCL" : "collectives staged over shm"))
                    ZT_FAIL("%s: not the %s collectives:\n%s", log, mode, t);
                free(t);
                snprintf(js, sizeof js, "c%d%d.json", W, s);
                char dj[64], cd[32], dd[32];
                snprintf(dj, sizeof dj, "d%d%d%s.json", W, s, mode);
                same_losses(js, dj);
                snprintf(cd, sizeof cd, "c%d%d", W, s);
                snprintf(dd, sizeof dd, "d%d%d%s", W, s, mode);
                zt_same_latest(cd, dd, 0, 0); /* every tensor of every state, exactly */
                unsetenv("ZR_DEVICE_COMM");
            }
        }
    }
    /* the device's own bytes: at stage 3 a rank holds half of the parameters of stage 0 (and
     * the CPU engine's figures, the same layout) */
    ZT_CHECK_EQ(last_mem("d23nccl.json", "params"), last_mem("c23.json", "params"));
    ZT_CHECK(last_mem("d23nccl.json", "params") * 3 / 2 < last_mem("d20nccl.json", "params"));
}

/* A Llama (grouped-query attention, untied head; then tied) through the device engine: the
 * device ABI carries the family and its offsets (zr_model_offsets), hostsim runs the CPU Llama
 * behind it, so every stage at world 2 has the CPU engine's losses and checkpoint bits; a run
 * stopped at stage 3 on the device resumes at stage 1 on the device, and on the CPU at stage
 * 0, with the bits of an uninterrupted run. */
#define LLAMA "llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,ctx=32,vocab=256"
#define LL_COMMON "--seq 32 --batch 8 --micro-batch 4 --threads 1 --steps 6 --nproc 2 "
ZT_TEST(dev_engine_llama_stages_match_cpu)
{
    setenv("ZR_CUDA_LIB", "hostsim", 1);
    for (int s = 0; s <= 3; s++) {
        const char *model = s == 2 ? LLAMA ",tied=1" : LLAMA;
        char log[32], cj[32], dj[32], cd[16], dd[16];
        snprintf(log, sizeof log, "c%d.log", s);
        zt_zrunf_ok(log, "--model %s " LL_COMMON "--device cpu --zero %d --ckpt-dir c%d "
                    "--log-json c%d.json", model, s, s, s);
        setenv("ZR_DEVICE_COMM", s % 2 ? "nccl" : "shm", 1);
        snprintf(log, sizeof log, "d%d.log", s);
        zt_zrunf_ok(log, "--model %s " LL_COMMON "--device cuda --zero %d --ckpt-dir d%d "
                    "--log-json d%d.json", model, s, s, s);
        unsetenv("ZR_DEVICE_COMM");
        zt_file_has(log, "device: hostsim");
        zt_file_has(log, "Llama");
        snprintf(cj, sizeof cj, "c%d.json", s);
        snprintf(dj, sizeof dj, "d%d.json", s);
        same_losses(cj, dj);
        snprintf(cd, sizeof cd, "c%d", s);
        snprintf(dd, sizeof dd, "d%d", s);
        zt_same_latest(cd, dd, 0, 0);
    }
    /* the device's parameters at stage 3 are half of stage 0's (the CPU engine's figures) */
    ZT_CHECK_EQ(last_mem("d3.json", "params"), last_mem("c3.json", "params"));
    ZT_CHECK(last_mem("d3.json", "params") * 3 / 2 < last_mem("d0.json", "params"));
    /* resume at another stage: device stage 3 -> device stage 1 -> CPU stage 0 */
    zt_zrun_ok("--model " LLAMA " " LL_COMMON "--device cuda --zero 3 --ckpt-dir r "
               "--stop-after 2", "r1.log");
    zt_zrun_ok("--model " LLAMA " " LL_COMMON "--device cuda --zero 1 --ckpt-dir r "
               "--stop-after 2", "r2.log"); /* two more steps: 3 and 4 */
    zt_file_has("r2.log", "resumed from r/step-00000002 (world 2, ZeRO 3");
    zt_zrun_ok("--model " LLAMA " " LL_COMMON "--device cpu --zero 0 --ckpt-dir r", "r3.log");
    zt_file_has("r3.log", "resumed from r/step-00000004 (world 2, ZeRO 1");
    zt_same_latest("c0", "r", 0, 0);
}

ZT_TEST(dev_engine_offload_optimizer)
{
    setenv("ZR_CUDA_LIB", "hostsim", 1);
    /* pinned host memory (AdamW on the CPU, copies overlapping) */
    zt_zrun_ok(COMMON "--device cpu --nproc 2 --zero 2 --ckpt-dir c --log-json c.json", "c.log");
    zt_zrun_ok(COMMON "--device cuda --nproc 2 --zero 2 --offload-optimizer cpu --ckpt-dir d "
               "--log-json d.json", "d.log");
    same_losses("c.json", "d.json");
    zt_same_latest("c", "d", 0, 0);
    ZT_CHECK_EQ(last_mem("d.json", "optimizer"), 0); /* no moments on the device */
    ZT_CHECK(last_mem("d.json", "pinned") > last_mem("c.json", "optimizer"));
    /* NVMe, small aio blocks so that groups span several chunks; stopped and resumed (the
     * moments go back into the swap file from the checkpoint) */
    zt_zrun_ok(COMMON "--device cuda --nproc 2 --zero 2 --offload-optimizer nvme --nvme-path sw "
               "--aio-block-size 8192 --ckpt-dir n --stop-after 5 --log-json n.json", "n1.log");
    zt_zrun_ok(COMMON "--device cuda --nproc 2 --zero 2 --offload-optimizer nvme --nvme-path sw "
               "--aio-block-size 8192 --ckpt-dir n --log-json n.json", "n2.log");
    same_losses("c.json", "n.json");
    zt_same_latest("c", "n", 0, 0);
    ZT_CHECK_EQ(last_mem("n.json", "optimizer"), 0);
    ZT_CHECK(last_mem("n.json", "nvme") >= last_mem("c.json", "optimizer"));
    /* stage 3 with the parameter partitions in pinned memory too (gathered from there),
     * NCCL-style and staged, stopped and resumed */
    zt_zrun_ok(COMMON "--device cpu --nproc 2 --zero 3 --ckpt-dir c3 --log-json c3.json",
               "c3.log");
    for (int m = 0; m < 4; m++) { /* params in pinned memory, then on NVMe; both modes */
        setenv("ZR_DEVICE_COMM", m % 2 ? "nccl" : "shm", 1);
        static const char *dirs[4] = {"ps", "pn", "vs", "vn"};
        const char *dir = dirs[m];
        char js[32], args[512];
        snprintf(js, sizeof js, "%s.json", dir);
        snprintf(args, sizeof args, COMMON "--device cuda --nproc 2 --zero 3 --offload-optimizer "
                 "%s --offload-params %s --nvme-path sw --aio-block-size 8192 --ckpt-dir %s "
                 "--log-json %s --stop-after 3", m < 2 ? "cpu" : "nvme", m < 2 ? "cpu" : "nvme",
                 dir, js);
        zt_zrun_ok(args, "p1.log");
        char *cut = strstr(args, " --stop-after");
        *cut = 0;
        zt_zrun_ok(args, "p2.log");
        same_losses("c3.json", js);
        zt_same_latest("c3", dir, 0, 0);
        ZT_CHECK_EQ(last_mem(js, "params"), 0); /* only gather buffers on the device */
        ZT_CHECK(m < 2 ? last_mem(js, "pinned") > last_mem("c3.json", "params")
                       : last_mem(js, "nvme") > last_mem("c3.json", "params"));
    }
    unsetenv("ZR_DEVICE_COMM");
}

ZT_TEST(dev_engine_resume_across_devices)
{
    setenv("ZR_CUDA_LIB", "hostsim", 1);
    /* bits are equal at one world size (the reductions' order depends on it), and across
     * stages with one micro-batch per rank and step */
    zt_zrun_ok(ONE_MICRO "--device cpu --nproc 2 --zero 1 --ckpt-dir ref", "ref.log");
    /* CPU (stage 3) -> device (stage 1) */
    zt_zrun_ok(ONE_MICRO "--device cpu --nproc 2 --zero 3 --ckpt-dir a --stop-after 4", "a1.log");
    zt_zrun_ok(ONE_MICRO "--device cuda --nproc 2 --zero 1 --ckpt-dir a", "a2.log");
    zt_file_has("a2.log", "resumed from a/step-00000004 (world 2, ZeRO 3");
    zt_same_latest("ref", "a", 0, 0);
    /* device (stage 2, host-staged) -> CPU (stage 0) */
    setenv("ZR_DEVICE_COMM", "shm", 1);
    zt_zrun_ok(ONE_MICRO "--device cuda --nproc 2 --zero 2 --ckpt-dir b --stop-after 3", "b1.log");
    zt_zrun_ok(ONE_MICRO "--device cpu --nproc 2 --zero 0 --ckpt-dir b", "b2.log");
    zt_same_latest("ref", "b", 0, 0);
    /* device -> device, NCCL-style, with a stage change */
    setenv("ZR_DEVICE_COMM", "nccl", 1);
    zt_zrun_ok(ONE_MICRO "--device cuda --nproc 2 --zero 3 --ckpt-dir c --stop-after 5", "c1.log");
    zt_zrun_ok(ONE_MICRO "--device cuda --nproc 2 --zero 0 --ckpt-dir c", "c2.log");
    zt_same_latest("ref", "c", 0, 0);
    /* and to another world size on the device: it resumes and finishes (other bits) */
    zt_zrun_ok(ONE_MICRO "--device cuda --nproc 2 --zero 3 --ckpt-dir d --stop-after 4", "d1.log");
    zt_zrun_ok(ONE_MICRO "--device cuda --nproc 1 --zero 2 --ckpt-dir d", "d2.log");
    char *t = zt_slurp("d2.log");
    ZT_CHECK(strstr(t, "resumed from d/step-00000004 (world 2, ZeRO 3") &&
             strstr(t, "at world 1, ZeRO 2") && strstr(t, "done at step 8/8"));
    free(t);
}

ZT_TEST(dev_engine_errors)
{
    /* auto without a usable GPU trains on the CPU and says nothing about a device */
    if (!zr_device_cuda_available()) {
        zt_zrun_ok("--model " SMALL " --steps 2 --batch 2 --seq 16 --device auto --ckpt-dir a",
                   "auto.log");
        char *t = zt_slurp("auto.log");
        ZT_CHECK(strstr(t, "device:") == NULL && strstr(t, "done at step 2/2"));
        free(t);
        /* cuda without one fails before any step, saying why */
        ZT_CHECK_EQ(zt_zrun("--model " SMALL " --steps 2 --batch 2 --device cuda --ckpt-dir b",
                            "cuda.log"), 2);
        t = zt_slurp("cuda.log");
        if (!strstr(t, "cuda: no GPU") && !strstr(t, "cuda: built without CUDA") &&
            !strstr(t, "cuda: cannot load"))
            ZT_FAIL("--device cuda without a GPU:\n%s", t);
        free(t);
    }
    setenv("ZR_CUDA_LIB", "hostsim", 1);
    static const struct {
        const char *args, *var, *val, *want;
    } bad[] = {
        {"--nproc 2", "ZR_DEVICE_COMM", "bogus", "ZR_DEVICE_COMM=bogus: expected nccl or shm"},
        {"--zero 3 --offload-params cpu", NULL, NULL, "needs --offload-optimizer cpu or nvme"},
        {"--zero 3 --offload-params nvme --nvme-path swap", NULL, NULL,
         "--offload-params nvme on the GPU needs"},
        {"--device mps", NULL, NULL, "--device 'mps': expected cpu, cuda or auto"},
        /* the GPU's index on the node: a number, not atoi's 0 for anything else */
        {"", "ZR_LOCAL_RANK", "1x", "ZR_LOCAL_RANK='1x': expected an integer in [0, "},
        {"", "ZR_LOCAL_RANK", "-1", "ZR_LOCAL_RANK='-1': expected an integer in [0, "},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (bad[i].var)
            setenv(bad[i].var, bad[i].val, 1);
        char args[512];
        snprintf(args, sizeof args, "--model " SMALL " --steps 2 --batch 2 --seq 16 --device "
                 "cuda --ckpt-dir e%zu %s", i, bad[i].args);
        int st = zt_zrun(args, "bad.log");
        char *t = zt_slurp("bad.log");
        if (st == 0 || !strstr(t, bad[i].want))
            ZT_FAIL("zrun %s: status %d, wanted \"%s\":\n%s", args, st, bad[i].want, t);
        free(t);
        if (bad[i].var)
            unsetenv(bad[i].var);
    }
}

/* a rank killed while the device path runs (NCCL-style collectives on hostsim): the job stops
 * within seconds, the launcher names the rank, the survivor's error names the cause (not only
 * "aborted"), and `latest` stays sound */
ZT_TEST(dev_engine_rank_killed_names_the_cause)
{
    pid_t p = zt_spawn_zrun("ZR_CUDA_LIB=hostsim ZR_DEVICE_COMM=nccl",
                            "--model " SMALL " --seq 32 --batch 8 --threads 1 --steps 100000 "
                            "--device cuda --nproc 2 --zero 3 --save-every 5 --ckpt-dir run",
                            "run.log");
    zt_wait_file_has("run.log", "saved run/step-00000005", 60); /* then SIGKILL rank 1 */
    pid_t kids[4];
    int nk = zt_children(p, kids, 4);
    if (nk != 2)
        ZT_SKIP("cannot find the ranks (/proc/PID/task/PID/children: %d)", nk);
    ZT_CHECK(kill(kids[1], SIGKILL) == 0);
    ZT_CHECK_EQ(zt_wait_status(p), 137);
    char *t = zt_slurp("run.log");
    if (!strstr(t, "zrun: rank 1 was killed by signal 9") ||
        !strstr(t, "[rank 0] zrun: error:") || !strstr(t, "rank 1"))
        ZT_FAIL("the stop does not name rank 1:\n%s", t);
    /* the survivor's message carries the cause */
    const char *e = strstr(t, "[rank 0] zrun: error:");
    if (strstr(e, "aborted after an error") && !strstr(e, "rank 1"))
        ZT_FAIL("rank 0's error hides the cause:\n%s", e);
    free(t);
    setenv("ZR_CUDA_LIB", "hostsim", 1);
    zt_zrun_ok("--model " SMALL " --seq 32 --batch 8 --threads 1 --steps 100000 --stop-after 1 "
               "--device cuda --nproc 2 --zero 3 --ckpt-dir run", "resume.log");
}
