/*
 * zrun.c: the training launcher. Parses the options (one table, zrun_table, which also makes
 * --help) into zr_train_opts and runs the training loop of core/. With --nproc N > 1, --nnodes
 * or --max-restarts it is the launcher: zr_supervise starts N ranks of itself through zr_launch
 * (the environment tells each one its rank and world) and restarts them from the newest sound
 * checkpoint when the job fails; under mpirun or srun it is one rank (under_mpi: the MPI
 * communicator, or --comm tcp). A rank runs zr_train on
 * the device --device picks (cpu, or cuda through the backend loaded at run time), with the
 * optimizer states and parameters offloaded to host memory or NVMe as asked. The checks here
 * are those between options that need no environment; zr_train checks the rest.
 * SIGINT/SIGTERM/SIGUSR1 finish the current step, save a checkpoint and exit 0 saying where.
 */
#include "common.h"
#include "opts.h"
#include "zfmt.h"
#include "zr.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define PROG "zrun"

static volatile int stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* SIGINT, SIGTERM and SIGUSR1 set stop_flag */
static void catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
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
    catch_stop_signals();
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

enum { COMM_AUTO, COMM_MPI, COMM_TCP };

/* A rank started by mpirun (Open MPI, MPICH/PMI) or srun: its rank, size and local rank from
 * their environment become ZR_RANK, ZR_WORLD and ZR_LOCAL_RANK. The communicator: MPI
 * (ZR_COMM=mpi) with --comm mpi, or by default under Open MPI's mpirun or srun --mpi=pmix
 * (PMIX_RANK set); else the TCP rendezvous at --master, or MASTER_ADDR:MASTER_PORT. Each
 * process is one rank: --nproc and --max-restarts are refused. 1 when so (the environment
 * set), 0 when not under one of them (or a world of 1), -1 after printing an error. */
static int under_mpi(const char *master, int comm, uint32_t nproc, uint32_t max_restarts)
{
    static const zr_env_var vars[][3] = {
        {ZR_ENV_OMPI_RANK, ZR_ENV_OMPI_SIZE, ZR_ENV_OMPI_LOCAL_RANK},
        {ZR_ENV_PMI_RANK, ZR_ENV_PMI_SIZE, ZR_ENV_PMI_LOCAL_RANK},
        {ZR_ENV_SLURM_PROCID, ZR_ENV_SLURM_NTASKS, ZR_ENV_SLURM_LOCALID},
    };
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        /* each value checked under its own name (a bad one is the launcher's, not ours) */
        int rank = 0, world = 0, local = 0, has_r, has_w, has_l;
        if (!zr_env(vars[i][0])) /* not this launcher's rank (a size alone says nothing) */
            continue;
        if (zr_env_int(&world, &has_w, vars[i][1], 0, ZCK_MAX_WORLD) < 0)
            return zcli_fail_lib(PROG, NULL), -1;
        if (!has_w || world <= 1)
            continue;
        if (zr_env_int(&rank, &has_r, vars[i][0], 0, world - 1) < 0 ||
            zr_env_int(&local, &has_l, vars[i][2], 0, world - 1) < 0)
            return zcli_fail_lib(PROG, NULL), -1;
        const char *w = zr_env(vars[i][1]);
        if (nproc > 1 || max_restarts)
            return zcli_fail(PROG, nproc > 1 ? "drop --nproc: the launcher's -np / --ntasks "
                             "sets the ranks" : "restart the job from your batch script "
                             "(docs/RUNNING.md): each run resumes from the newest sound "
                             "checkpoint", "started by mpirun or srun (%s=%s), each process is "
                             "one rank: %s", zr_env_name(vars[i][1]), w, nproc > 1 ?
                             "--nproc does not apply" : "--max-restarts does not apply"), -1;
        int mpi = comm == COMM_MPI ||
                  (comm == COMM_AUTO && (i == 0 || (i == 2 && zr_env(ZR_ENV_PMIX_RANK))));
        char buf[300];
        if (!mpi && !master) {
            const char *h = zr_env(ZR_ENV_MASTER_ADDR), *p = zr_env(ZR_ENV_MASTER_PORT);
            if (!h || !p) {
                zcli_fail(PROG, "add --master HOST:PORT (the address of the first rank's node "
                          "and a free port), or set MASTER_ADDR and MASTER_PORT, or run "
                          "srun --mpi=pmix for the MPI communicator",
                          "started by mpirun or srun (%s=%s) without a rendezvous address",
                          zr_env_name(vars[i][1]), w);
                return -1;
            }
            snprintf(buf, sizeof buf, "%s:%s", h, p);
            master = buf;
        }
        char num[3][16];
        snprintf(num[0], sizeof num[0], "%d", rank);
        snprintf(num[1], sizeof num[1], "%d", world);
        snprintf(num[2], sizeof num[2], "%d", local);
        setenv(zr_env_name(ZR_ENV_RANK), num[0], 1);
        setenv(zr_env_name(ZR_ENV_WORLD), num[1], 1);
        setenv(zr_env_name(ZR_ENV_LOCAL_RANK), num[2], 1);
        if (mpi) {
            setenv(zr_env_name(ZR_ENV_COMM), "mpi", 1);
            unsetenv(zr_env_name(ZR_ENV_COMM_TCP));
        } else {
            unsetenv(zr_env_name(ZR_ENV_COMM));
            setenv(zr_env_name(ZR_ENV_COMM_TCP), master, 1);
        }
        unsetenv(zr_env_name(ZR_ENV_COMM_SHM));
        return 1;
    }
    if (comm == COMM_MPI)
        return zcli_fail(PROG, "start zrun with mpirun -np N (or srun --mpi=pmix); each MPI "
                         "process is one rank", "--comm mpi, but this process was not "
                         "started by mpirun or srun"), -1;
    return 0;
}

/* ------------------------------------------------------------------ options */

/* Everything the options set: the training options and the launcher's. */
typedef struct {
    zr_train_opts o;
    uint32_t nproc, max_restarts, nproc_restart;
    double backoff;
    nodes_opts no;
    int dry_run, dry_json, log_all;
    size_t memory_limit; /* --memory-limit: bytes per rank (0: none) */
    int comm;   /* COMM_AUTO, COMM_MPI, COMM_TCP */
    int device; /* -1 until set: then ZR_DEVICE, else auto */
} zrun_args;
#define ZCLI_ARGS zrun_args

static void args_init(zrun_args *a)
{
    *a = (zrun_args){
        .o = ZR_TRAIN_OPTS_INIT,
        .nproc = 1,
        .backoff = 1.0,
        .no.nnodes = 1,
        .device = -1,
    };
}

static const char *const async_names[] = {"auto", "on", "off", NULL};
static const int async_values[] = {-1, 1, 0};
static const char *const verify_names[] = {"full", "quick", "off", NULL};
static const int verify_values[] = {ZR_VERIFY_FULL, ZR_VERIFY_QUICK, ZR_VERIFY_OFF};
static const char *const ranks_names[] = {"0", "all", NULL};
static const int ranks_values[] = {0, 1};
static const char *const comm_names[] = {"auto", "mpi", "tcp", NULL};
static const int comm_values[] = {COMM_AUTO, COMM_MPI, COMM_TCP};
static const char *const device_names[] = {"cpu", "cuda", "auto", NULL};
static const int device_values[] = {ZR_DEVICE_CPU, ZR_DEVICE_CUDA, ZR_DEVICE_AUTO};
static const char *const recompute_names[] = {"none", "layer", "selective", NULL};
static const int recompute_values[] = {ZR_RECOMPUTE_NONE, ZR_RECOMPUTE_LAYER,
                                       ZR_RECOMPUTE_SELECTIVE};
static const char *const offload_names[] = {"none", "cpu", "nvme", NULL};
static const int offload_values[] = {ZR_OFFLOAD_NONE, ZR_OFFLOAD_CPU, ZR_OFFLOAD_NVME};

static const zcli_opt zrun_table[] = {
    ZCLI_SECTION("model and data:"),
    ZCLI_STRING("--model", o.model, "SPEC", "tiny; when resuming, the checkpoint's model",
                "tiny, gpt2, gpt2-medium, gpt2:layers=4,heads=4,dim=256,ctx=128,vocab=256, "
                "llama (llama-tiny), llama-124m, smollm-135m, tinyllama-1.1b, or "
                "llama:layers=2,heads=4,kv_heads=2,dim=64,ffn=176,ctx=64,vocab=256"
                "[,rope_theta=R,norm_eps=E,tied=0|1]"),
    ZCLI_STRING("--data", o.data, "SPEC", NULL,
                "synthetic (a built-in learnable corpus), a text file (bytes, vocab 256) or an "
                "llm.c token file (uint16 or uint32 tokens, as ztok encode writes)"),
    ZCLI_STRING("--tokenizer", o.tokenizer_path, "FILE", "",
                "a byte-level BPE tokenizer.json (ztok): recorded in every checkpoint; its "
                "vocabulary must fit the model's (a resume without it keeps the checkpoint's)"),
    ZCLI_INTEGER(U32, "--seq", o.seq, "T", 1, 1u << 20, "the model's context",
                 "tokens per sequence"),
    ZCLI_SECTION("validation:"),
    ZCLI_INTEGER(U64, "--eval-every", o.eval_every, "N", 0, UINT64_MAX, "0, never",
                 "validation loss every N steps and at the last step: on the step line, in "
                 "the JSON log (val_loss) and in checkpoints with the best so far"),
    ZCLI_INTEGER(U32, "--eval-batches", o.eval_batches, "K", 1, 1u << 16, NULL,
                 "each evaluation covers K x --batch fixed sequences"),
    ZCLI_STRING("--val-data", o.val_data, "FILE", "the held-out tail of --data",
                "validation tokens, as --data; without it a tenth of a --data file (the "
                "synthetic corpus: its own continuation) is held out and never trained on"),
    ZCLI_SECTION("optimization:"),
    ZCLI_INTEGER(U32, "--batch", o.batch, "N", 1, 1u << 20, NULL,
                 "global batch in sequences per optimizer step"),
    ZCLI_INTEGER(U32, "--micro-batch", o.micro_batch, "N", 1, 1u << 20,
                 "the rank's share, --batch / world (--nproc x --nnodes)",
                 "sequences per forward pass on each rank; gradients accumulate"),
    ZCLI_ENUM("--recompute", o.recompute, recompute_names, recompute_values, NULL,
              "activation checkpointing. layer: keep each layer's input, "
              "recompute the layer and the head's logits in the backward; selective: "
              "recompute only the attention "
              "weights and GELU/SwiGLU outputs (on a GPU only the attention weights). Same "
              "losses and gradients, bit for bit"),
    ZCLI_INTEGER(U64, "--steps", o.steps, "N", 1, UINT64_MAX, NULL,
                 "total optimizer steps of the run, the LR schedule's horizon"),
    ZCLI_REAL(FLOAT, "--lr", o.lr, "X", 0, FLT_MAX, NULL, "peak learning rate"),
    ZCLI_REAL(FLOAT, "--min-lr-ratio", o.min_lr_ratio, "X", 0, FLT_MAX, NULL,
              "the cosine decay ends at lr times this"),
    ZCLI_INTEGER(U64, "--warmup", o.warmup, "N", 0, UINT64_MAX, NULL,
                 "linear warmup steps, then cosine decay to the end"),
    ZCLI_REAL(FLOAT, "--weight-decay", o.weight_decay, "X", 0, FLT_MAX, NULL,
              "AdamW weight decay on matrices"),
    ZCLI_REAL(FLOAT, "--grad-clip", o.grad_clip, "X", 0, FLT_MAX, NULL,
              "clip the global gradient norm to X (0: off)"),
    ZCLI_INTEGER(U64, "--seed", o.seed, "N", 0, UINT64_MAX, NULL,
                 "initialization and data order"),
    ZCLI_SECTION("checkpoints:"),
    ZCLI_STRING("--ckpt-dir", o.ckpt_dir, "DIR", NULL, "run directory"),
    ZCLI_INTEGER(U64, "--save-every", o.save_every, "N", 0, UINT64_MAX, "0, only at the end",
                 "save every N steps"),
    ZCLI_INTEGER(U32, "--keep-last", o.keep_last, "K", 0, UINT32_MAX, NULL,
                 "keep the newest K checkpoints (0 keeps all)"),
    ZCLI_ENUM("--async-save", o.async_save, async_names, async_values, NULL,
              "on: files are written in the background (on the CPU straight from the live "
              "states, see --save-buffer; on a GPU from a pinned host copy) and committed at a "
              "later step boundary. off: training waits for the files. auto: on, except with "
              "states offloaded to NVMe"),
    {.name = "--save-buffer", .kind = ZCLI_OPT_ZU, .off = offsetof(zrun_args, o.save_buffer),
     .meta = "B", .lo = 0, .hi = (uint64_t)1 << 40,
     .help = "asynchronous saves on the CPU: bytes per rank for the parts of a save not yet "
             "written when the next optimizer update comes (the update waits for the writer "
             "beyond it); 0: the larger of 64 MiB and 5 % of the rank's states"},
    ZCLI_ENUM("--verify-on-resume", o.verify_on_resume, verify_names, verify_values, NULL,
              "full: every file hashed before any state is read; quick: files present with "
              "their sizes, the manifest against SHA256SUMS; off: as quick (the check of every "
              "resume, --resume PATH too), the read not hashing again"),
    ZCLI_INTEGER(U32, "--max-restarts", max_restarts, "N", 0, 1000000, NULL,
                 "when a rank dies or the job fails, restart all ranks from the newest "
                 "checkpoint that verifies, up to N times"),
    ZCLI_REAL(DOUBLE, "--restart-backoff", backoff, "S", 0, 86400, NULL,
              "seconds before a restart"),
    ZCLI_INTEGER(U32, "--nproc-on-restart", nproc_restart, "N", 1, 65536, "--nproc",
                 "ranks from the first restart on"),
    ZCLI_STRING("--resume", o.resume, "MODE", NULL,
                "auto (the newest checkpoint when present), never, or a path"),
    ZCLI_INTEGER(U64, "--stop-after", o.stop_after, "N", 1, UINT64_MAX, "",
                 "end this invocation after N more steps, with a checkpoint"),
    ZCLI_REAL(DOUBLE, "--time-limit", o.time_limit, "SEC", 0, DBL_MAX, "",
              "save and stop before this many seconds of training"),
    ZCLI_SECTION("samples:"),
    ZCLI_INTEGER(U64, "--sample-every", o.sample_every, "N", 0, UINT64_MAX, "0, none",
                 "every N steps, rank 0 prints a greedy continuation of --prompt after the "
                 "step line (and logs it as a \"sample\" event with --log-json); at ZeRO-3 "
                 "the parameters are gathered to rank 0 for it"),
    ZCLI_STRING("--prompt", o.sample_prompt, "TEXT", "\"the \"",
                "the samples' prompt: encoded by the run's tokenizer (--tokenizer, or the "
                "checkpoint's), else its bytes are the token ids"),
    ZCLI_INTEGER(U32, "--sample-tokens", o.sample_tokens, "N", 1, 1u << 20, NULL,
                 "tokens each sample generates"),
    ZCLI_SECTION("running:"),
    ZCLI_INTEGER(INT, "--threads", o.threads, "N", 1, 256, NULL, "compute threads per rank"),
    ZCLI_STRING("--log-json", o.log_json, "FILE", "CKPT_DIR/train.jsonl",
                "append one JSON object per step (step, time, run_id, loss, lr, grad_norm, "
                "tokens_per_s, step_ms, save_blocked_ms, mem, rss_peak), from which "
                "CKPT_DIR/train.svg is drawn at each save and at the end; 'none': no JSON log "
                "and no plot"),
    ZCLI_INTEGER(U32, "--nproc", nproc, "N", 1, 65536, NULL,
                 "data-parallel ranks on this node, one process each"),
    ZCLI_INTEGER(INT, "--zero", o.zero_stage, "S", 0, 3, NULL,
                 "ZeRO stage: 0 everything replicated, gradients all-reduced; 1 optimizer "
                 "states partitioned; 2 also gradients; 3 also parameters, gathered group by "
                 "group just before use"),
    ZCLI_INTEGER(U32, "--prefetch", o.prefetch, "N", 0, 64, NULL,
                 "stage 3: group gathers in flight ahead of use"),
    ZCLI_INTEGER(U64, "--max-live-params", o.max_live_params, "N", 0, UINT64_MAX,
                 "0, a quarter of the rank's partition",
                 "stages 2-3 on the CPU: parameters the ordinary gather and gradient buffers hold "
                 "together at most (at least two gathers and two gradients; --prefetch is cut to "
                 "fit; the embeddings' gradients come in pieces of a gradient buffer)"),
    ZCLI_ENUM("--log-ranks", log_all, ranks_names, ranks_values, NULL,
              "0: rank 0's output; all: every rank's, prefixed"),
    ZCLI_INTEGER(U32, "--nnodes", no.nnodes, "N", 1, 1024, NULL,
                 "nodes of the job; with N > 1, start zrun on every node with the same "
                 "options, --nproc ranks each, and --node-rank and --master"),
    ZCLI_INTEGER(U32, "--node-rank", no.node_rank, "K", 0, 1023, NULL,
                 "this node's index, 0..N-1 (node 0 holds global rank 0)"),
    ZCLI_STRING("--master", no.master, "HOST:PORT", "",
                "where global rank 0 listens (node 0's address; the other nodes connect, "
                "waiting up to ZR_COMM_TCP_TIMEOUT seconds, 300). Also under mpirun or srun "
                "(one zrun per rank: their rank and size are used; HOST:PORT may come from "
                "MASTER_ADDR and MASTER_PORT instead)"),
    ZCLI_ENUM("--comm", comm, comm_names, comm_values, NULL,
              "how the CPU ranks exchange. auto: shared memory on one node (--nproc); MPI "
              "under mpirun or srun --mpi=pmix; the TCP star across --nnodes. mpi: MPI "
              "(under mpirun or srun). tcp: the TCP star through global rank 0 (small jobs "
              "without MPI; see docs/RUNNING.md)"),
    {.name = "--memory-limit", .kind = ZCLI_OPT_ZU, .off = offsetof(zrun_args, memory_limit),
     .meta = "B", .lo = 1, .hi = (uint64_t)1 << 50, .def = "none",
     .help = "bytes per rank: the planner picks the fastest --zero, --micro-batch, "
             "--recompute and offload (NVMe with --nvme-path) whose dry-run peak fits, says "
             "what it chose and the runner-up it rejected; refused, naming the smallest limit "
             "that works, when nothing fits"},
    ZCLI_FLAG("--dry-run", dry_run,
              "print the memory each rank would hold (params, grads, optimizer states, "
              "buffers, activations, save staging, the process's own) against the ZeRO "
              "formula; no training"),
    ZCLI_FLAG("--json", dry_json,
              "with --dry-run: one JSON object, per rank every category in bytes (params, "
              "grads, optimizer, gather_buffers, swap_staging, save_staging, activations, "
              "pinned, baseline) and total_bytes"),
    ZCLI_ENUM("--device", device, device_names, device_values, "auto, or ZR_DEVICE",
              "auto: cuda when every rank finds a GPU and the CUDA backend (libzr_cuda.so "
              "next to zrun), else cpu. On cuda, rank r takes GPU r mod the GPUs; NCCL when "
              "each rank has a GPU of its own, else collectives staged through host memory"),
    ZCLI_SECTION("offload (ZeRO-Infinity):"),
    ZCLI_ENUM("--offload-optimizer", o.offload_optimizer, offload_names, offload_values, NULL,
              "AdamW states. cpu: host memory, which on the CPU device is where they are "
              "anyway (on cuda: pinned host memory, AdamW on the CPU overlapping the copies); "
              "nvme: swap files, streamed chunk by chunk through the optimizer step"),
    ZCLI_ENUM("--offload-params", o.offload_params, offload_names, offload_values, NULL,
              "stage 3: the parameter partitions. nvme: read ahead of each group's gather; cpu "
              "on a GPU: pinned memory, uploaded at each gather (on a GPU both need "
              "--offload-optimizer)"),
    ZCLI_STRING("--nvme-path", o.nvme_path, "DIR", "",
                "swap directory (one zrun-swap-rank<r> per rank inside; removed at the end; a "
                "crashed run's is cleaned)"),
    {.name = "--aio-block-size", .kind = ZCLI_OPT_ZU, .off = offsetof(zrun_args, o.aio_block),
     .meta = "B", .lo = 4096, .hi = (uint64_t)256 << 20, .multiple = 4096,
     .help = "bytes per I/O request and staging chunk, a multiple of 4096"},
    ZCLI_INTEGER(U32, "--aio-queue-depth", o.aio_depth, "N", 1, 1024, NULL,
                 "requests in flight per swap file"),
    ZCLI_INTEGER(U32, "--offload-buffers", o.offload_buffers, "N", 2, 64, NULL,
                 "staging sets, >= 2 for double buffering"),
};
static const zcli_opts zrun_opts = {PROG, NULL, zrun_table,
                                    sizeof zrun_table / sizeof *zrun_table};

static void usage(void)
{
    zrun_args defaults;
    args_init(&defaults);
    fputs("usage: zrun [OPTIONS]\n"
          "\n"
          "Train a GPT-2 or Llama model with AdamW, checkpointing through the zckpt format; "
          "resumes from\nthe newest checkpoint of --ckpt-dir by default.\n\n", stdout);
    zcli_opts_help(stdout, &zrun_opts, &defaults);
    fputs("\n"
          "The global batch is split evenly over the ranks; --micro-batch is per rank. "
          "Checkpoints\nresume at any --nproc and --zero.\n"
          "SIGINT, SIGTERM or SIGUSR1: the current step finishes, a checkpoint is saved, zrun "
          "exits 0.\n"
          "Exit status: 0 done or stopped cleanly, 2 any error; with --nproc > 1, when a rank "
          "fails,\nthe others are stopped and zrun exits with the failing rank's status (128 + "
          "N for a\nsignal N), naming the rank.\n", stdout);
}

/* The options into *a, with the checks between options that need no environment. ZCLI_OK,
 * ZCLI_ERROR after printing why, or ZCLI_OPTS_HELP after printing the help. */
/* ------------------------------------------------------------------ the samples' tokenizer */

/* The run's tokenizer.json (formats/' byte-level BPE) for the samples of --sample-every. */
static int tok_open(void **ctx, const char *json, size_t n)
{
    return zfmt_tok_load_mem((zfmt_tok **)ctx, json, n, "the run's tokenizer.json");
}

static int tok_encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n)
{
    zfmt_tok_ids v = {0};
    int rc = zfmt_tok_encode(&v, ctx, text, len, NULL);
    if (rc) {
        zfmt_tok_ids_free(&v);
        return rc;
    }
    *ids = (int32_t *)v.id; /* ids below the model's vocabulary (< 2^31): the same bits */
    *n = v.n;
    return 0;
}

/* An id the tokenizer does not have (the model's vocabulary may be larger) as <|id|>. */
static int tok_decode(void *ctx, const int32_t *ids, size_t n, char **text, size_t *len)
{
    size_t cap = 64, at = 0;
    char *out = malloc(cap);
    for (size_t i = 0; out && i < n; i++) {
        char *piece = NULL, id[32];
        size_t k = 0;
        uint32_t u = (uint32_t)ids[i];
        if (zfmt_tok_decode(&piece, &k, ctx, &u, 1) < 0) {
            zr_err_clear();
            k = (size_t)snprintf(id, sizeof id, "<|%d|>", ids[i]);
        }
        if (at + k + 1 > cap) {
            while (at + k + 1 > cap)
                cap *= 2;
            char *bigger = realloc(out, cap);
            if (!bigger)
                free(out);
            out = bigger;
        }
        if (out)
            memcpy(out + at, piece ? piece : id, k);
        at += k;
        free(piece);
    }
    if (!out)
        return zr_err_set(ZR_ENOMEM, "sample: out of memory");
    out[at] = 0;
    *text = out;
    *len = at;
    return 0;
}

static void tok_close(void *ctx) { zfmt_tok_free(ctx); }

static const zr_text_codec tok_codec = {tok_open, tok_encode, tok_decode, tok_close};

static int parse_args(zrun_args *a, int argc, char **argv)
{
    args_init(a);
    int rc = zcli_opts_parse(&zrun_opts, a, argc, argv);
    if (rc == ZCLI_OPTS_HELP)
        usage();
    if (rc)
        return rc;
    const char *env = zr_env(ZR_ENV_DEVICE);
    if (a->device < 0 && zcli_opts_set(&zrun_opts, a, "--device", env ? env : "auto"))
        return ZCLI_ERROR;
    a->o.device = a->device;
    a->o.text_codec = &tok_codec; /* samples read the run's tokenizer, if it has one */
    if (a->o.tokenizer_path) { /* checked and read once, before any rank starts */
        char *json;
        if (zfmt_tok_read(&json, &a->o.tokenizer_bytes, &a->o.tokenizer_vocab,
                          a->o.tokenizer_path) < 0) {
            zr_err_prefix("--tokenizer: ");
            return zcli_fail_lib(PROG, NULL);
        }
        if (a->o.tokenizer_bytes > ZCK_MAX_FILE_BYTES) { /* before any rank, not at a save */
            free(json);
            return zcli_fail(PROG, "a checkpoint records the tokenizer as an extra file: use a "
                             "smaller tokenizer.json (fewer merges, no indentation)",
                             "--tokenizer %s: %zu bytes, at most %zu (64 MiB)",
                             a->o.tokenizer_path, a->o.tokenizer_bytes, ZCK_MAX_FILE_BYTES);
        }
        a->o.tokenizer_json = json; /* kept for the run */
    }
    if (a->o.offload_params != ZR_OFFLOAD_NONE && a->o.zero_stage != 3)
        return zcli_fail(PROG, "use --zero 3, or drop --offload-params",
                         "--offload-params needs ZeRO stage 3 (at stages 0-2 every rank holds "
                         "all parameters)");
    if ((a->o.offload_optimizer == ZR_OFFLOAD_NVME || a->o.offload_params == ZR_OFFLOAD_NVME) &&
        !a->o.nvme_path)
        return zcli_fail(PROG, "add --nvme-path DIR (a directory on a fast local disk)",
                         "offload to nvme needs --nvme-path");
    if (a->dry_json && !a->dry_run)
        return zcli_fail(PROG, "add --dry-run", "--json is the dry run's format");
    return ZCLI_OK;
}

/* One rank: train until done or stopped by a signal. */
static int run_rank(zr_train_opts *o)
{
    catch_stop_signals();
    o->stop = &stop_flag;
    o->log = stdout;
    setvbuf(stdout, NULL, _IOLBF, 0);
    zr_train_result res;
    char full[512];
    /* a save that found the disk full: the checkpoints there take the space */
    snprintf(full, sizeof full, "the disk is full: free space with `zckpt prune %s --keep-last "
             "K`, or run again with a lower --keep-last (applied before the first save), "
             "to resume from the newest checkpoint", o->ckpt_dir);
    if (zr_train(&res, o) < 0)
        return zcli_fail_lib(PROG, zr_err_code() == ZR_EEXIST && strstr(zr_err_msg(),
                                                                          "--nvme-path")
                                       ? "wait for the process named to end, or give this run "
                                         "another --nvme-path"
                                   : zr_err_code() == ZR_EEXIST
                                       ? "use a new --ckpt-dir, or --resume auto to continue"
                                   : zr_err_code() == ZR_ECORRUPT && res.ckpt_error
                                       ? "run `zckpt verify` on the run directory"
                                   : strstr(zr_err_msg(), strerror(ENOSPC)) ||
                                           strstr(zr_err_msg(), strerror(EDQUOT))
                                       ? full
                                       : NULL);
    if (stop_flag)
        printf(PROG ": stopped by a signal after step %llu; checkpoint: %s\n",
               (unsigned long long)res.step, res.ckpt[0] ? res.ckpt : "(none needed)");
    return ZCLI_OK;
}

/* This invocation's run id: ZR_RUN_ID when the launcher (this zrun, one level up) set it,
 * else 16 random hex digits, put in the environment for the ranks and the restarts. */
static const char *run_id(void)
{
    const char *id = zr_env(ZR_ENV_RUN_ID);
    if (id)
        return id;
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ (uint64_t)clock();
    char buf[17];
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
    setenv(zr_env_name(ZR_ENV_RUN_ID), buf, 1);
    return zr_env(ZR_ENV_RUN_ID);
}

static int launch(zrun_args *ap, char **argv);

int main(int argc, char **argv)
{
    /* a closed stdout (`| head`, a `| tee` gone with Ctrl-C) loses output, never the run: the
     * writes fail and training, its JSON log and its saves go on (the ranks inherit this) */
    signal(SIGPIPE, SIG_IGN);
    zrun_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc)
        return rc == ZCLI_OPTS_HELP ? ZCLI_OK : rc;
    rc = launch(&a, argv);
    free((void *)a.o.tokenizer_json);
    return rc;
}

/* The dry run, the launcher of the ranks, or one rank. */
static int launch(zrun_args *ap, char **argv)
{
    zrun_args a = *ap;
    int rc;
    zr_train_opts *o = &a.o;
    o->run_id = run_id();
    static char *log_json; /* the default JSON log: beside the checkpoints */
    if (!o->log_json && asprintf(&log_json, "%s/train.jsonl", o->ckpt_dir) > 0)
        o->log_json = log_json;
    else if (o->log_json && !strcmp(o->log_json, "none"))
        o->log_json = NULL;
    uint32_t nproc = a.nproc, max_restarts = a.max_restarts, nproc_restart = a.nproc_restart;
    const nodes_opts no = a.no;

    if (a.memory_limit) { /* every rank plans the same; the launcher (or a lone rank) says it */
        zr_plan_pick c;
        FILE *said = zr_env(ZR_ENV_WORLD) ? NULL : a.dry_json ? stderr : stdout; /* JSON alone */
        if (zr_train_plan_memory(&c, NULL, o, (int)(nproc * no.nnodes), a.memory_limit, said) < 0)
            return zcli_fail_lib(PROG, NULL);
        o->zero_stage = c.zero_stage;
        o->micro_batch = c.micro_batch;
        o->recompute = c.recompute;
        o->offload_optimizer = c.offload_optimizer;
        o->offload_params = c.offload_params;
    }
    if (a.dry_run) { /* the plan of the whole job: every node's ranks */
        if ((a.dry_json ? zr_train_dry_run_json : zr_train_dry_run)(o, (int)(nproc * no.nnodes),
                                                                    stdout) < 0)
            return zcli_fail_ckpt(PROG, NULL); /* what it reads is the checkpoint to resume */
        return ZCLI_OK;
    }
    const char *world_env = zr_env(ZR_ENV_WORLD);
    rc = world_env ? 0 : under_mpi(no.master, a.comm, nproc, max_restarts);
    if (rc < 0)
        return ZCLI_ERROR;
    if (rc > 0) /* mpirun or srun started this rank: their world, MPI or our TCP rendezvous */
        world_env = zr_env(ZR_ENV_WORLD);
    else if (!world_env && a.comm == COMM_TCP && no.nnodes < 2)
        return zcli_fail(PROG, "drop --comm tcp: one node's ranks share memory", "--comm tcp "
                         "needs --nnodes > 1, or ranks started by mpirun or srun");
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
        return supervise(argv, o, nproc, a.log_all, max_restarts, a.backoff, nproc_restart,
                         &no);
    if (world_env && rc == 0 && strtoul(world_env, NULL, 10) != nproc * no.nnodes)
        return zcli_fail(PROG, "leave ZR_WORLD to the launcher", "ZR_WORLD=%s in the "
                         "environment but --nproc %u x --nnodes %u", world_env, nproc,
                         no.nnodes);
    return run_rank(o);
}
