/*
 * zrun.c: the training launcher. Parses the options into zr_train_opts and runs the training
 * loop of core/. With --nproc N > 1 it starts N ranks of itself through zr_launch (the
 * environment tells each one its rank) and waits for them; a rank runs zr_train. Other devices
 * and offload are refused with a clear message. SIGINT/SIGTERM/SIGUSR1 finish the current step,
 * save a checkpoint and exit 0 saying where.
 */
#include "common.h"
#include "zr.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROG "zrun"

static volatile int stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static const char *usage_text =
    "usage: zrun [OPTIONS]\n"
    "\n"
    "Train a GPT-2-style model with AdamW, checkpointing through the zckpt format; resumes from\n"
    "the newest checkpoint of --ckpt-dir by default.\n"
    "\n"
    "model and data:\n"
    "  --model SPEC        tiny (default), gpt2, gpt2-medium, or\n"
    "                      gpt2:layers=4,heads=4,dim=256,ctx=128,vocab=256\n"
    "                      (default when resuming: the checkpoint's model)\n"
    "  --data SPEC         synthetic (default: a built-in learnable corpus), a text file (bytes,\n"
    "                      vocab 256) or an llm.c token file (uint16 GPT-2 tokens)\n"
    "  --seq T             tokens per sequence (default: the model's context)\n"
    "optimization:\n"
    "  --batch N           global batch in sequences per optimizer step (default 8)\n"
    "  --micro-batch N     sequences per forward pass on each rank; gradients accumulate\n"
    "                      (default: the rank's share, --batch / --nproc)\n"
    "  --steps N           total optimizer steps of the run, the LR schedule's horizon (200)\n"
    "  --lr X              peak learning rate (1e-3); --min-lr-ratio X (0.1)\n"
    "  --warmup N          linear warmup steps (20), then cosine decay to the end\n"
    "  --weight-decay X    AdamW weight decay on matrices (0.1); --grad-clip X (1.0, 0: off)\n"
    "  --seed N            initialization and data order (1337)\n"
    "checkpoints:\n"
    "  --ckpt-dir DIR      run directory (runs/default)\n"
    "  --save-every N      save every N steps (default: only at the end)\n"
    "  --keep-last K       keep the newest K checkpoints (3; 0 keeps all)\n"
    "  --async-save M      on: a save blocks training only to copy each rank's partitions to\n"
    "                      host staging; files are written in the background and committed at\n"
    "                      a later step boundary. off: training waits for the files. auto\n"
    "                      (default): on, except with states offloaded to NVMe\n"
    "  --verify-on-resume full|quick|off   full (default): every file hashed before any state\n"
    "                      is read; quick: files present with their sizes; off: nothing\n"
    "  --max-restarts N    when a rank dies or the job fails, restart all ranks from the newest\n"
    "                      checkpoint that verifies, up to N times (0)\n"
    "  --restart-backoff S seconds before a restart (1)\n"
    "  --nproc-on-restart N  ranks from the first restart on (default: --nproc)\n"
    "  --resume MODE       auto (newest checkpoint when present, default), never, or a path\n"
    "  --stop-after N      end this invocation after N more steps, with a checkpoint\n"
    "  --time-limit SEC    save and stop before this many seconds of training\n"
    "running:\n"
    "  --threads N         compute threads per rank (2)\n"
    "  --log-json FILE     append one JSON object per step (step, loss, lr, grad_norm,\n"
    "                      tokens_per_s, step_ms, save_blocked_ms, mem, rss_peak)\n"
    "  --nproc N           data-parallel CPU ranks on this node, one process each (1)\n"
    "  --zero S            ZeRO stage (0): 0 everything replicated, gradients all-reduced;\n"
    "                      1 optimizer states partitioned; 2 also gradients; 3 also\n"
    "                      parameters, gathered group by group just before use\n"
    "  --prefetch N        stage 3: group gathers in flight ahead of use (2)\n"
    "  --log-ranks R       0 (default: rank 0's output) or all (every rank's, prefixed)\n"
    "  --nnodes N          nodes of the job (1); with N > 1, start zrun on every node with the\n"
    "                      same options, --nproc ranks each, and\n"
    "  --node-rank K       this node's index, 0..N-1 (node 0 holds global rank 0)\n"
    "  --master HOST:PORT  where global rank 0 listens (node 0's address; the other nodes\n"
    "                      connect, waiting up to ZR_COMM_TCP_TIMEOUT seconds, 300). Also under\n"
    "                      mpirun or srun (one zrun per rank: their rank and size are used;\n"
    "                      HOST:PORT may come from MASTER_ADDR and MASTER_PORT instead)\n"
    "  --dry-run           print the memory each rank would hold (params, grads, optimizer\n"
    "                      states, buffers, activations) against the ZeRO formula; no training\n"
    "  --device D          cpu, cuda or auto (default auto: cuda when every rank finds a\n"
    "                      GPU and the CUDA backend (libzr_cuda.so next to zrun), else cpu;\n"
    "                      ZR_DEVICE in the environment changes the default). On cuda, rank r\n"
    "                      takes GPU r mod the GPUs; NCCL when each rank has a GPU of its\n"
    "                      own, else collectives staged through host memory\n"
    "offload (ZeRO-Infinity):\n"
    "  --offload-optimizer none|cpu|nvme   AdamW states (none); cpu: host memory, which on the\n"
    "                      CPU device is where they are anyway (on cuda: pinned host memory,\n"
    "                      AdamW on the CPU overlapping the copies); nvme: swap files,\n"
    "                      streamed chunk by chunk through the optimizer step\n"
    "  --offload-params none|cpu|nvme      stage 3: the parameter partitions (none); nvme: read\n"
    "                      ahead of each group's gather; cpu on a GPU: pinned memory,\n"
    "                      uploaded at each gather (on a GPU both need --offload-optimizer)\n"
    "  --nvme-path DIR     swap directory (one zrun-swap-rank<r> per rank inside; removed at the\n"
    "                      end; a crashed run's is cleaned)\n"
    "  --aio-block-size B  bytes per I/O request and staging chunk (1048576)\n"
    "  --aio-queue-depth N requests in flight per swap file (8)\n"
    "  --offload-buffers N staging sets, >= 2 for double buffering (4)\n"
    "\n"
    "The global batch is split evenly over the ranks; --micro-batch is per rank. Checkpoints\n"
    "resume at any --nproc and --zero.\n"
    "SIGINT, SIGTERM or SIGUSR1: the current step finishes, a checkpoint is saved, zrun exits 0.\n"
    "Exit status: 0 done or stopped cleanly, 2 any error; with --nproc > 1, when a rank fails,\n"
    "the others are stopped and zrun exits with the failing rank's status (128 + N for a\n"
    "signal N), naming the rank.\n";

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, PROG ": error: %s%s\n(" PROG " --help lists the options)\n", what, arg);
    return ZCLI_ERROR;
}

static bool parse_u64(const char *opt, const char *v, uint64_t lo, uint64_t *out)
{
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || v[0] == '-' || x < lo) {
        zcli_fail(PROG, NULL, "%s '%s': expected an integer >= %llu", opt, v,
                  (unsigned long long)lo);
        return false;
    }
    *out = x;
    return true;
}

static bool parse_float(const char *opt, const char *v, float *out)
{
    double d;
    if (!zcli_parse_double(PROG, opt, v, &d))
        return false;
    *out = (float)d;
    return true;
}

typedef struct {
    uint32_t nnodes, node_rank;
    const char *master;
} nodes_opts;

/* The launcher: the ranks, restarted from the newest sound checkpoint when the job fails and
 * restarts are left (zr_supervise). A signal between launches ends the job. */
static int supervise(char **argv, const zr_train_opts *o, uint32_t nproc, int log_all,
                     uint32_t max_restarts, double backoff, uint32_t nproc_restart,
                     const nodes_opts *no)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    zr_supervise_opts so = ZR_SUPERVISE_OPTS_INIT;
    so.nproc = (int)nproc;
    so.nproc_on_restart = (int)nproc_restart;
    so.log_all_ranks = log_all;
    so.nnodes = (int)no->nnodes;
    so.node_rank = (int)no->node_rank;
    so.master = no->master;
    so.max_restarts = max_restarts;
    so.backoff_s = backoff;
    so.ckpt_dir = o->ckpt_dir;
    so.verify = o->verify_on_resume;
    so.jobs = o->threads > 0 ? (unsigned)o->threads : 1;
    so.stop = &stop_flag;
    so.log = stderr;
    so.name = PROG;
    int code = 0;
    if (zr_supervise(&code, &so, argv) < 0)
        return zcli_fail_lib(PROG, zr_err_code() == ZR_ECORRUPT
                                       ? "inspect it with `zckpt ls` and `zckpt verify`"
                                       : NULL);
    return code;
}

/* A rank started by mpirun (Open MPI, MPICH/PMI) or srun: its rank, size and local rank from
 * their environment become ZR_RANK, ZR_WORLD and ZR_LOCAL_RANK, and the TCP rendezvous is
 * --master, else MASTER_ADDR:MASTER_PORT. 1 when so (the environment set), 0 when not under
 * one of them (or a world of 1), -1 after printing an error. */
static int under_mpi(const char *master)
{
    static const char *vars[][3] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    };
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *r = getenv(vars[i][0]), *w = getenv(vars[i][1]), *l = getenv(vars[i][2]);
        if (!r || !w || !*r || !*w || atoi(w) <= 1)
            continue;
        char buf[300];
        if (!master) {
            const char *h = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
            if (!h || !p || !*h || !*p) {
                zcli_fail(PROG, "add --master HOST:PORT (the address of the first rank's node "
                          "and a free port), or set MASTER_ADDR and MASTER_PORT",
                          "started by mpirun or srun (%s=%s) without a rendezvous address",
                          vars[i][1], w);
                return -1;
            }
            snprintf(buf, sizeof buf, "%s:%s", h, p);
            master = buf;
        }
        setenv("ZR_RANK", r, 1);
        setenv("ZR_WORLD", w, 1);
        setenv("ZR_LOCAL_RANK", l && *l ? l : "0", 1);
        setenv("ZR_COMM_TCP", master, 1);
        unsetenv("ZR_COMM_SHM");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    zr_train_opts o = ZR_TRAIN_OPTS_INIT;
    uint32_t nproc = 1;
    const char *device = getenv("ZR_DEVICE") && *getenv("ZR_DEVICE") ? getenv("ZR_DEVICE")
                                                                      : "auto";
    int dry_run = 0, log_all = 0;
    uint32_t max_restarts = 0, nproc_restart = 0;
    nodes_opts no = {1, 0, NULL};
    double backoff = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        uint32_t u;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return ZCLI_OK;
        }
        if (!strcmp(a, "--dry-run")) {
            dry_run = 1;
            continue;
        }
        if (strncmp(a, "--", 2))
            return usage_error("unexpected argument ", a);
        if (i + 1 >= argc)
            return usage_error(a, " needs a value");
        v = argv[++i];
        if (!strcmp(a, "--model"))
            o.model = v;
        else if (!strcmp(a, "--data"))
            o.data = v;
        else if (!strcmp(a, "--seq")) {
            if (!zcli_parse_u32(PROG, a, v, 1, 1u << 20, &o.seq))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--batch")) {
            if (!zcli_parse_u32(PROG, a, v, 1, 1u << 20, &o.batch))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--micro-batch")) {
            if (!zcli_parse_u32(PROG, a, v, 1, 1u << 20, &o.micro_batch))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--steps")) {
            if (!parse_u64(a, v, 1, &o.steps))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--lr")) {
            if (!parse_float(a, v, &o.lr))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--min-lr-ratio")) {
            if (!parse_float(a, v, &o.min_lr_ratio))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--warmup")) {
            if (!parse_u64(a, v, 0, &o.warmup))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--weight-decay")) {
            if (!parse_float(a, v, &o.weight_decay))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--grad-clip")) {
            if (!parse_float(a, v, &o.grad_clip))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_u64(a, v, 0, &o.seed))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--ckpt-dir"))
            o.ckpt_dir = v;
        else if (!strcmp(a, "--save-every")) {
            if (!parse_u64(a, v, 0, &o.save_every))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--keep-last")) {
            if (!zcli_parse_u32(PROG, a, v, 0, UINT32_MAX, &u))
                return ZCLI_ERROR;
            o.keep_last = u;
        } else if (!strcmp(a, "--resume"))
            o.resume = v;
        else if (!strcmp(a, "--stop-after")) {
            if (!parse_u64(a, v, 1, &o.stop_after))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--time-limit")) {
            double d;
            if (!zcli_parse_double(PROG, a, v, &d))
                return ZCLI_ERROR;
            o.time_limit = d;
        } else if (!strcmp(a, "--threads")) {
            if (!zcli_parse_u32(PROG, a, v, 1, 256, &u))
                return ZCLI_ERROR;
            o.threads = (int)u;
        } else if (!strcmp(a, "--log-json"))
            o.log_json = v;
        else if (!strcmp(a, "--nproc")) {
            if (!zcli_parse_u32(PROG, a, v, 1, 65536, &nproc))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--zero")) {
            if (!zcli_parse_u32(PROG, a, v, 0, 3, &u))
                return ZCLI_ERROR;
            o.zero_stage = (int)u;
        } else if (!strcmp(a, "--async-save")) {
            if (strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "auto"))
                return zcli_fail(PROG, NULL, "--async-save '%s': expected auto, on or off", v);
            o.async_save = !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : -1;
        } else if (!strcmp(a, "--verify-on-resume")) {
            if (!strcmp(v, "full"))
                o.verify_on_resume = ZR_VERIFY_FULL;
            else if (!strcmp(v, "quick"))
                o.verify_on_resume = ZR_VERIFY_QUICK;
            else if (!strcmp(v, "off"))
                o.verify_on_resume = ZR_VERIFY_OFF;
            else
                return zcli_fail(PROG, NULL, "--verify-on-resume '%s': expected full, quick or "
                                 "off", v);
        } else if (!strcmp(a, "--max-restarts")) {
            if (!zcli_parse_u32(PROG, a, v, 0, 1000000, &max_restarts))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--restart-backoff")) {
            double d;
            if (!zcli_parse_double(PROG, a, v, &d))
                return ZCLI_ERROR;
            if (!(d >= 0 && d <= 86400))
                return zcli_fail(PROG, NULL, "--restart-backoff %s: expected 0..86400 seconds",
                                 v);
            backoff = d;
        } else if (!strcmp(a, "--nproc-on-restart")) {
            if (!zcli_parse_u32(PROG, a, v, 1, 65536, &nproc_restart))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--prefetch")) {
            if (!zcli_parse_u32(PROG, a, v, 0, 64, &u))
                return ZCLI_ERROR;
            o.prefetch = u;
        } else if (!strcmp(a, "--nnodes")) {
            if (!zcli_parse_u32(PROG, a, v, 1, 1024, &no.nnodes))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--node-rank")) {
            if (!zcli_parse_u32(PROG, a, v, 0, 1023, &no.node_rank))
                return ZCLI_ERROR;
        } else if (!strcmp(a, "--master")) {
            no.master = v;
        } else if (!strcmp(a, "--log-ranks")) {
            if (strcmp(v, "0") && strcmp(v, "all"))
                return zcli_fail(PROG, NULL, "--log-ranks '%s': expected 0 or all", v);
            log_all = !strcmp(v, "all");
        } else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--offload-optimizer") || !strcmp(a, "--offload-params")) {
            int k = !strcmp(v, "none") ? ZR_OFFLOAD_NONE : !strcmp(v, "cpu") ? ZR_OFFLOAD_CPU
                    : !strcmp(v, "nvme") ? ZR_OFFLOAD_NVME : -1;
            if (k < 0)
                return zcli_fail(PROG, NULL, "%s '%s': expected none, cpu or nvme", a, v);
            if (!strcmp(a, "--offload-optimizer"))
                o.offload_optimizer = k;
            else
                o.offload_params = k;
        } else if (!strcmp(a, "--nvme-path"))
            o.nvme_path = v;
        else if (!strcmp(a, "--aio-queue-depth")) {
            if (!zcli_parse_u32(PROG, a, v, 1, 1024, &u))
                return ZCLI_ERROR;
            o.aio_depth = u;
        } else if (!strcmp(a, "--aio-block-size")) {
            uint64_t b;
            if (!parse_u64(a, v, 4096, &b))
                return ZCLI_ERROR;
            if (b % 4096 || b > ((uint64_t)256 << 20))
                return zcli_fail(PROG, NULL, "--aio-block-size %s: expected a multiple of 4096 "
                                 "up to 268435456", v);
            o.aio_block = (size_t)b;
        } else if (!strcmp(a, "--offload-buffers")) {
            if (!zcli_parse_u32(PROG, a, v, 2, 64, &u))
                return ZCLI_ERROR;
            o.offload_buffers = u;
        } else
            return usage_error("unknown option ", a);
    }
    if (o.offload_params != ZR_OFFLOAD_NONE && o.zero_stage != 3)
        return zcli_fail(PROG, "use --zero 3, or drop --offload-params",
                         "--offload-params needs ZeRO stage 3 (at stages 0-2 every rank holds "
                         "all parameters)");
    if ((o.offload_optimizer == ZR_OFFLOAD_NVME || o.offload_params == ZR_OFFLOAD_NVME) &&
        !o.nvme_path)
        return zcli_fail(PROG, "add --nvme-path DIR (a directory on a fast local disk)",
                         "offload to nvme needs --nvme-path");
    if (!strcmp(device, "cpu"))
        o.device = ZR_DEVICE_CPU;
    else if (!strcmp(device, "cuda"))
        o.device = ZR_DEVICE_CUDA;
    else if (!strcmp(device, "auto"))
        o.device = ZR_DEVICE_AUTO;
    else
        return zcli_fail(PROG, NULL, "--device '%s': expected cpu, cuda or auto", device);

    if (dry_run) {
        if (zr_train_dry_run(&o, (int)nproc, stdout) < 0)
            return zcli_fail_lib(PROG, NULL);
        return ZCLI_OK;
    }
    const char *world_env = getenv("ZR_WORLD");
    int rc = world_env ? 0 : under_mpi(no.master);
    if (rc < 0)
        return ZCLI_ERROR;
    if (rc > 0) /* mpirun or srun started this rank: their world, our TCP rendezvous */
        world_env = getenv("ZR_WORLD");
    else if (no.nnodes > 1) {
        if (!no.master)
            return zcli_fail(PROG, "add --master HOST:PORT (node 0's address and a free port)",
                             "--nnodes %u needs --master", no.nnodes);
        if (no.node_rank >= no.nnodes)
            return zcli_fail(PROG, NULL, "--node-rank %u: expected 0..%u", no.node_rank,
                             no.nnodes - 1);
        if (max_restarts || nproc_restart)
            return zcli_fail(PROG, "restart the job from the newest checkpoint with your "
                             "scheduler (--resume auto)", "--max-restarts and "
                             "--nproc-on-restart work on one node only");
    }
    if (!world_env && (nproc > 1 || max_restarts > 0 || no.nnodes > 1)) /* the launcher */
        return supervise(argv, &o, nproc, log_all, max_restarts, backoff, nproc_restart, &no);
    if (world_env && rc == 0 && strtoul(world_env, NULL, 10) != nproc * no.nnodes)
        return zcli_fail(PROG, "leave ZR_WORLD to the launcher", "ZR_WORLD=%s in the "
                         "environment but --nproc %u x --nnodes %u", world_env, nproc,
                         no.nnodes);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    o.stop = &stop_flag;
    o.log = stdout;
    setvbuf(stdout, NULL, _IOLBF, 0);
    zr_train_result res;
    if (zr_train(&res, &o) < 0)
        return zcli_fail_lib(PROG, zr_err_code() == ZR_EEXIST
                                       ? "use a new --ckpt-dir, or --resume auto to continue"
                                       : zr_err_code() == ZR_ECORRUPT
                                             ? "run `zckpt verify` on the run directory"
                                             : NULL);
    if (stop_flag)
        printf(PROG ": stopped by a signal after step %llu; checkpoint: %s\n",
               (unsigned long long)res.step, res.ckpt[0] ? res.ckpt : "(none needed)");
    return ZCLI_OK;
}
