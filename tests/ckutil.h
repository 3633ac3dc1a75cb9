/*
 * ckutil.h: helpers the ckpt tests share: a layout of groups of chosen sizes, deterministic
 * contents per (seed, group, state, element), saving a whole checkpoint as W ranks would, and
 * checking that what a reader returns is exactly what was saved.
 */
#ifndef ZT_CKUTIL_H
#define ZT_CKUTIL_H

#include <stdbool.h>
#include <sys/types.h>
#include "harness.h"
#include "zr.h"

/* States: param f32, exp_avg f32, exp_avg_sq bf16 (a 2-byte state exercises sizes). */
zck_layout *zt_layout(size_t n_groups, const uint64_t *numel);
/* A 64-bit mixing function (MurmurHash3's fmix64): deterministic pseudo-random values. */
uint64_t zt_mix(uint64_t x);
/* Deterministic bytes of elements [start, start+count) of (g, s). */
void zt_fill(const zck_layout *L, size_t g, size_t s, uint64_t start, uint64_t count,
             uint64_t seed, void *dst);
/* Write rank's shard (its partition of every (group, state)) into staging; returns the shard. */
zck_shard *zt_write_rank(const char *staging, const zck_layout *L, uint32_t world,
                         uint32_t rank, uint64_t seed, const zck_io_opts *io);
/* Save a full checkpoint of world W at step, contents from seed; returns the final path. */
char *zt_save(const char *run_dir, const zck_layout *L, uint32_t world, uint64_t step,
              uint64_t seed, unsigned keep_last);
/* Elements [start, start+count) of (g, s) of a checkpoint being saved, into dst. */
typedef void (*zt_fill_fn)(void *ctx, const zck_layout *L, size_t g, size_t s, uint64_t start,
                           uint64_t count, void *dst);
/* Save a checkpoint as o->world ranks would (each writing its partitions, in uneven pieces),
 * contents from fill, committed with o (step and world from it) into run_dir; returns the
 * final path. */
/* zt_fill as a zt_fill_fn: ctx points to the seed (a uint64_t). */
void zt_seed_fill(void *ctx, const zck_layout *L, size_t g, size_t s, uint64_t start,
                  uint64_t count, void *dst);
char *zt_save_as(const char *run_dir, const zck_layout *L, const zck_commit_opts *o,
                 zt_fill_fn fill, void *ctx);
/* Read every (group, state) of the checkpoint at path (verified) and compare with seed. */
void zt_check_content(const char *path, uint64_t seed);
/* Number of problems zck_verify finds (printing them). */
size_t zt_verify_count(const char *path, int quick);
/* Print rep's problems to stderr ("  verify <what>: <file>: <kind>: <detail>"); their count. */
size_t zt_report_print(const zck_report *rep, const char *what);
/* rep (of a check of what) must hold exactly one problem, of this kind, in this file, with
 * detail in its text when detail is not NULL; frees rep. */
void zt_expect_one_problem(zck_report *rep, const char *what, zck_problem_kind kind,
                           const char *file, const char *detail);
/* Read state 0 (f32) of every group of the checkpoint at ckpt whole, verified or not; the
 * reader's result (its message left set). */
int zt_read_all(const char *ckpt, int verify);
/* Overwrite or append bytes of a file / truncate it. */
void zt_flip_byte(const char *path, uint64_t off);
void zt_truncate(const char *path, uint64_t size);
void zt_write_file(const char *path, const char *text);
/* Writes n bytes at p to path (the test fails when it cannot). */
void zt_write_bytes(const char *path, const void *p, size_t n);
/* Whole file as a NUL-terminated string (returns a ZR_ code). */
int zck__read_small_for_tests(char **out, const char *path);
int zck__mkdir_for_tests(const char *path);

/* The zrun binary (ZT_ZRUN, set by make test); skips the test when unset. */
/* zrun args > log 2>&1 in the background (sh -c exec: the pid is zrun's), with environment
 * assignments before it (or ""); its exit status as a shell gives it (128 + N for signal N);
 * the pids of p's children (the ranks of a launcher) into out[cap], their count. */
pid_t zt_spawn_zrun(const char *env, const char *args, const char *log);
int zt_wait_status(pid_t p);
/* Before a shell command that runs mpirun: Open MPI's components (loaded and unloaded by
 * MPI_Init and MPI_Finalize) leave allocations that LeakSanitizer reports at every rank's exit
 * in a SAN=1 build; the same code's leaks are checked by the runs without MPI. */
#define ZT_MPI_ENV "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 "
/* sh -c cmd in the background (its pid) */
pid_t zt_spawn_sh(const char *cmd);
int zt_children(pid_t p, pid_t *out, int cap);
/* The rank a process runs as (its ZR_RANK), or -1 (not a rank, or gone). */
int zt_rank_of(pid_t p);
/* A TCP port on 127.0.0.1 for ranks that rendezvous over TCP, held for the rest of the test:
 * no other process's bind or outgoing connection takes it before rank 0 listens on it. */
int zt_free_port(void);
/* The environment of rank r of W launched over the shm segment name (NULL: none, as over TCP):
 * ZR_RANK, ZR_WORLD, ZR_COMM_SHM. zt_open_rank also opens the communicator from it. */
void zt_set_rank_env(const char *name, int r, int W);
typedef struct zr_comm zr_comm; /* core/dist/comm.h */
zr_comm *zt_open_rank(const char *name, int r, int W);
/* The program the environment variable var names (ZT_ZCKPT, ZT_ZGEN, ...: make test sets
 * them); skips the test when it is unset. */
const char *zt_bin(const char *var);
/* Seconds on the monotonic clock (for timing a test's steps). */
double zt_now_s(void);
const char *zt_zrun_path(void);
/* A whole small file (the test fails when it cannot be read); caller frees. */
char *zt_slurp(const char *path);
/* Whether the files at a and b exist and hold the same bytes. */
bool zt_same_file(const char *a, const char *b);
/* Fails the test, showing the file, unless the file at path has (lacks) text. */
void zt_file_has(const char *path, const char *text);
void zt_file_lacks(const char *path, const char *text);
/* Waits until the file at path (which may not exist yet) has text; fails the test, showing the
 * file, after secs seconds. */
void zt_wait_file_has(const char *path, const char *text, double secs);
/* zrun with args (a shell fragment), stdout and stderr into log; the exit status as a shell
 * reports it. zt_zrun_ok fails the test, showing the log, unless it is 0. */
int zt_zrun(const char *args, const char *log);
/* As zt_zrun and zt_zrun_ok, the arguments formatted as printf would. */
int zt_zrunf(const char *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define zt_zrunf_ok(log, ...) zt_zrun_expect(zt_zrunf((log), __VA_ARGS__), (log))
/* Fails the test, showing the last zrun's arguments and its log, unless status is 0. */
void zt_zrun_expect(int status, const char *log);
void zt_zrun_ok(const char *args, const char *log);
/* Run a program with arguments (a shell fragment); its output (stdout and stderr) in *out
 * (caller frees); its exit status (128 when it did not exit). */
int zt_run(char **out, const char *bin, const char *args);
/* zckpt (ZT_ZCKPT, set by make test; the test is skipped when unset) with the arguments
 * formatted as printf would, as zt_run. */
int zt_zckpt(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* loss[k] of each record {"step":k,...,"loss":x,...} of a --log-json file, 1 <= k < cap (0
 * where a step has no record); returns the highest step seen. */
size_t zt_jlog_losses(double *loss, size_t cap, const char *path);
/* The mean cross-entropy of logits [N, V] against targets tg, in double (the model tests'
 * references); the softmax into probs [N, V] when not NULL. */
double zt_ref_xent(const double *lg, const int32_t *tg, size_t N, size_t V, double *probs);
/* Causal self-attention in double (the model tests' references) over B rows of T positions,
 * H heads of hd: head h at position t attends to positions u <= t with key/value head
 * h / (H / KV), softmax of q.k / sqrt(hd), into y [B, T, H hd]. Rows of q are q_stride apart,
 * rows of k and v kv_stride apart (GPT-2: q, k and v in one qkv [B, T, 3C] row). */
typedef struct {
    size_t B, T, H, KV, hd, q_stride, kv_stride;
} zt_attn_shape;
void zt_ref_attention(double *y, const double *q, const double *k, const double *v,
                      const zt_attn_shape *s);
/* An input a model config parser refuses and the text its message must have. */
typedef struct {
    const char *in, *text;
} zt_refusal;
/* parse (zr_gpt2_config_parse, zr_gpt2_config_from_json) refuses each case with ZR_EINVAL and
 * its text, leaving the config it was given untouched. */
void zt_config_refusals(int (*parse)(zr_config *, const char *), const zt_refusal *cases,
                        size_t n);
/* The checkpoints latest names in run directories a and b hold the same values (within atol +
 * rtol |b|; 0, 0: exactly), whatever their world sizes. */
void zt_same_latest(const char *a, const char *b, double atol, double rtol);
/* The python of the oracles' venv (ZT_ROOT/build/venv, made by `make oracle-venv`, which make
 * test runs; $ZT_VENV instead when set) when `import MODULES` (space-separated) works there;
 * NULL otherwise (the caller skips with one line). */
const char *zt_venv_python(const char *modules);
/* tests/formats/SCRIPT ARGS with the venv's python (which must import MODULES), its output into
 * py.txt in the test's directory and returned (caller frees). Skips the test with one line
 * when the venv lacks MODULES or the script exits 77 (what it cannot import); fails it, showing
 * the output, on any other non-zero exit. */
char *zt_py_script(const char *modules, const char *script, const char *args);
/* Forward and backward of m (own arenas) on (in, tg) at 1, 2 and 3 threads: each loss within
 * 1e-5 relative of ref, each probability within 1e-6 of probs[B*T*V]; the gradients of each
 * count into gt[0..2] (malloc'ed, zr_model_numel floats). what names the case in failures.
 * Leaves one thread set. */
void zt_grads_at_threads(zr_model *m, const int32_t *in, const int32_t *tg, size_t B, size_t T,
                         size_t V, double ref, const double *probs, const char *what,
                         float *gt[3]);

/* A small GPT-2 that trains in milliseconds, and the options of such a run into dir: batch 4 of
 * micro-batches of 2, warmup 5, lr 3e-3, one thread, the given steps. */
#define ZT_SMALL "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256"
zr_train_opts zt_small_opts(const char *dir, uint64_t steps);

#endif
