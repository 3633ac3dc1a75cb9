/*
 * ckutil.h: helpers the ckpt tests share: a layout of groups of chosen sizes, deterministic
 * contents per (seed, group, state, element), saving a whole checkpoint as W ranks would, and
 * checking that what a reader returns is exactly what was saved.
 */
#ifndef ZT_CKUTIL_H
#define ZT_CKUTIL_H

#include <sys/types.h>
#include "harness.h"

/* States: param f32, exp_avg f32, exp_avg_sq bf16 (a 2-byte state exercises sizes). */
zck_layout *zt_layout(size_t n_groups, const uint64_t *numel);
/* Deterministic bytes of elements [start, start+count) of (g, s). */
void zt_fill(const zck_layout *L, size_t g, size_t s, uint64_t start, uint64_t count,
             uint64_t seed, void *dst);
/* Write rank's shard (its partition of every (group, state)) into staging; returns the shard. */
zck_shard *zt_write_rank(const char *staging, const zck_layout *L, uint32_t world,
                         uint32_t rank, uint64_t seed, const zck_io_opts *io);
/* Save a full checkpoint of world W at step, contents from seed; returns the final path. */
char *zt_save(const char *run_dir, const zck_layout *L, uint32_t world, uint64_t step,
              uint64_t seed, unsigned keep_last);
/* Read every (group, state) of the checkpoint at path (verified) and compare with seed. */
void zt_check_content(const char *path, uint64_t seed);
/* Number of problems zck_verify finds (printing them). */
size_t zt_verify_count(const char *path, int quick);
/* Overwrite or append bytes of a file / truncate it. */
void zt_flip_byte(const char *path, uint64_t off);
void zt_truncate(const char *path, uint64_t size);
void zt_write_file(const char *path, const char *text);
/* Whole file as a NUL-terminated string (returns a ZR_ code). */
int zck__read_small_for_tests(char **out, const char *path);
int zck__mkdir_for_tests(const char *path);

/* The zrun binary (ZT_ZRUN, set by make test); skips the test when unset. */
/* zrun args > log 2>&1 in the background (sh -c exec: the pid is zrun's), with environment
 * assignments before it (or ""); its exit status as a shell gives it (128 + N for signal N);
 * the pids of p's children (the ranks of a launcher) into out[cap], their count. */
pid_t zt_spawn_zrun(const char *env, const char *args, const char *log);
int zt_wait_status(pid_t p);
int zt_children(pid_t p, pid_t *out, int cap);
/* A TCP port free on 127.0.0.1 now (for ranks that rendezvous over TCP). */
int zt_free_port(void);
const char *zt_zrun_path(void);
/* A whole small file (the test fails when it cannot be read); caller frees. */
char *zt_slurp(const char *path);
/* zrun with args (a shell fragment), stdout and stderr into log; the exit status as a shell
 * reports it. zt_zrun_ok fails the test, showing the log, unless it is 0. */
int zt_zrun(const char *args, const char *log);
void zt_zrun_ok(const char *args, const char *log);
/* loss[k] of each record {"step":k,...,"loss":x,...} of a --log-json file, 1 <= k < cap (0
 * where a step has no record); returns the highest step seen. */
size_t zt_jlog_losses(double *loss, size_t cap, const char *path);
/* The mean cross-entropy of logits [N, V] against targets tg, in double (the model tests'
 * references); the softmax into probs [N, V] when not NULL. */
double zt_ref_xent(const double *lg, const int32_t *tg, size_t N, size_t V, double *probs);
/* The checkpoints latest names in run directories a and b hold the same values (within atol +
 * rtol |b|; 0, 0: exactly), whatever their world sizes. */
void zt_same_latest(const char *a, const char *b, double atol, double rtol);
/* The python of a venv under build/ (ZT_ROOT/build/venv) in which `import MODULES` works
 * (space-separated), pip-installing PACKAGES there when not (PyPI reachable); NULL when that
 * fails (the caller skips with one line). The venv is made once and reused. */
const char *zt_venv_python(const char *modules, const char *packages);

#endif
