/*
 * jsonlog.c: the run's logs (train_int.h): the step's line on the terminal and its record in the
 * JSON log (--log-json), the run id, the JSON log opened (never one of the run directory's
 * files), and the note of a resume behind the log's last step.
 */
#include "train_int.h"

#include <jansson.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* This process's peak resident set, bytes. */
uint64_t zr_train__rss_peak(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0 : (uint64_t)ru.ru_maxrss * 1024;
}

/* After each record: the JSON log flushed. A write that failed (a full disk, /dev/full) is
 * said once on the step log and the JSON log closed: training and its checkpoints go on, and
 * the last line says the log is incomplete. */
void zr_train__json_log_flush(run *r)
{
    if (!r->jlog || (fflush(r->jlog) == 0 && !ferror(r->jlog)))
        return;
    int e = errno;
    fclose(r->jlog);
    r->jlog = NULL;
    r->jlog_lost = r->step ? r->step : 1;
    if (r->log)
        fprintf(r->log, "warning: --log-json %s: write failed (%s): no more JSON records from "
                        "step %llu on; training goes on\n", r->o->log_json, strerror(e),
                (unsigned long long)r->jlog_lost);
}

/* The step's line on the terminal (before its save, if any) and, with save_ms (how long a
 * save at this step blocked training; 0 without one), its JSON line (after it). */
void zr_train__log_step(run *r, int json, float loss, float lr, float norm, double dt,
                     double save_ms)
{
    const zr_train_opts *o = r->o;
    double tps = (double)o->batch * r->T / (dt > 0 ? dt : 1e-9);
    zr_zero_bytes zb;
    zr_zero_mem(r->zero, &zb);
    uint64_t ab, unused[2];
    if (r->dev)
        r->dev->model_bytes(r->dmodel, &unused[0], &unused[1], &ab);
    else
        zr_model_bytes(r->model, NULL, NULL, &ab);
    double mib = 1.0 / (1 << 20);
    char nvme[48] = "", pinned[48] = "";
    if (zb.nvme)
        snprintf(nvme, sizeof nvme, " | nvme %.1f", zb.nvme * mib);
    if (zb.pinned)
        snprintf(pinned, sizeof pinned, " | pinned %.1f", zb.pinned * mib);
    char val[64] = "";
    if (r->val.now)
        snprintf(val, sizeof val, " | val %.4f", r->val.val);
    if (r->log && !json)
        fprintf(r->log, "step %6llu/%llu | loss %.4f%s | lr %.2e | norm %.3f | %8.0f tok/s | "
                        "%.1f ms | %s MiB p %.1f g %.1f o %.1f b %.1f a %.1f%s%s\n",
                (unsigned long long)r->step, (unsigned long long)o->steps, loss, val, lr, norm,
                tps,
                dt * 1e3, r->dev ? "gpu/rank" : "mem/rank", zb.params * mib, zb.grads * mib,
                zb.optimizer * mib, zb.buffers * mib, ab * mib, nvme, pinned);
    if (r->jlog && json) {
        /* the values as the shortest decimals that read back the same (float32 but val) */
        char when[32], vl[40], l[40], lrs[40], ns[40];
        zck_json_real_text(vl, sizeof vl, r->val.val, 0);
        zck_json_real_text(l, sizeof l, loss, 1);
        zck_json_real_text(lrs, sizeof lrs, lr, 1);
        zck_json_real_text(ns, sizeof ns, norm, 1);
        if (r->val.now && isfinite(r->val.val))
            snprintf(val, sizeof val, "\"val_loss\":%s,", vl);
        else
            snprintf(val, sizeof val, "%s", r->val.now ? "\"val_loss\":null," : "");
        fprintf(r->jlog, "{\"step\":%llu,\"loss\":%s,%s\"lr\":%s,\"grad_norm\":%s,"
                         "\"tokens_per_s\":%.1f,\"step_ms\":%.3f,\"save_blocked_ms\":%.3f,"
                         "\"world\":%d,\"zero\":%d,\"device\":\"%s\","
                         "\"mem\":{\"params\":%llu,\"grads\":%llu,\"optimizer\":%llu,"
                         "\"buffers\":%llu,\"activations\":%llu,\"nvme\":%llu,"
                         "\"pinned\":%llu},"
                         "\"rss_peak\":%llu,\"time\":\"%s\",\"run_id\":\"%s\"}\n",
                (unsigned long long)r->step, l, val, lrs, ns, tps, dt * 1e3, save_ms, r->W,
                o->zero_stage, r->dev ? r->dev->name : "cpu", (unsigned long long)zb.params,
                (unsigned long long)zb.grads,
                (unsigned long long)zb.optimizer, (unsigned long long)zb.buffers,
                (unsigned long long)ab, (unsigned long long)zb.nvme,
                (unsigned long long)zb.pinned,
                (unsigned long long)zr_train__rss_peak(), iso_time(when), r->run_id);
        zr_train__json_log_flush(r);
    }
}

/* mkdir -p of the directory part of path (best effort) */
static void make_parent_dirs(const char *path)
{
    char *p = strdup(path);
    if (!p)
        return;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0777);
            *s = '/';
        }
    free(p);
}

/* r->run_id: o->run_id (only [A-Za-z0-9._-] kept, which JSON takes as it is), else 16 random
 * hex digits. */
void zr_train__set_run_id(run *r)
{
    const char *id = r->o->run_id;
    size_t n = 0;
    for (; id && *id && n + 1 < sizeof r->run_id; id++)
        if ((*id >= 'a' && *id <= 'z') || (*id >= 'A' && *id <= 'Z') ||
            (*id >= '0' && *id <= '9') || strchr("._-", *id))
            r->run_id[n++] = *id;
    r->run_id[n] = 0;
    if (n)
        return;
    uint64_t v = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e9);
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&v, sizeof v, 1, f) != 1)
            v ^= (uint64_t)clock();
        fclose(f);
    }
    snprintf(r->run_id, sizeof r->run_id, "%016llx", (unsigned long long)v);
}

/* The highest step of the step records already in the JSON log (0: none, no log yet, or a
 * log that is not a regular file: a FIFO or a device such as /dev/stdout holds no history, and
 * reading one could block or never end). Only the bytes there at the start are read. */
uint64_t zr_train__logged_max_step(const char *path)
{
    int fd;
    uint64_t left;
    if (zck_open_regular(&fd, path, ZCK_FOLLOW, &left) < 0) {
        zr_err_clear();
        return 0;
    }
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return 0;
    }
    char *line = NULL;
    size_t cap = 0;
    uint64_t max = 0;
    ssize_t len;
    while (left && (len = getline(&line, &cap, f)) > 0) {
        left -= (uint64_t)len < left ? (uint64_t)len : left;
        json_t *j = json_loads(line, 0, NULL);
        json_t *st = json_object_get(j, "step");
        if (json_is_integer(st) && !json_object_get(j, "event") &&
            json_integer_value(st) > 0 && (uint64_t)json_integer_value(st) > max)
            max = (uint64_t)json_integer_value(st);
        json_decref(j);
    }
    free(line);
    fclose(f);
    return max;
}

/* The JSON log at path is not a file of the run directory's own (a shard would take the log's
 * lines, `latest` would lose them at the next save): the first name below ckpt_dir on its way,
 * symbolic links resolved, is not one run_owns. The log's directory exists. */
static int json_log_not_the_runs(const char *path, const char *ckpt_dir)
{
    char *log = zck_path_resolve(path), *rund = realpath(ckpt_dir, NULL);
    size_t n = rund ? strlen(rund) : 0;
    int rc = 0;
    if (log && rund && !strncmp(log, rund, n) && log[n] == '/') {
        const char *first = log + n + 1; /* the entry of the run directory on the log's way */
        int len = (int)strcspn(first, "/");
        if (zck_run_owns(first, (size_t)len) || (len == 9 && !memcmp(first, "train.svg", 9)))
            rc = zr_err_set(ZR_EINVAL, "--log-json %s: inside the checkpoint directory %s, on "
                            "'%.*s', which the run manages (step directories, latest, .lock, "
                            "train.svg, temporaries): give another path, such as the default "
                            "%s/train.jsonl", path, ckpt_dir, len, first, ckpt_dir);
    }
    free(log);
    free(rund);
    return rc;
}

/* The JSON log opened for appending (parent directories made): a regular file, created when
 * missing, or a pipe or FIFO whose reader is already there; a FIFO nobody reads is refused at
 * once rather than waited on, and so is a file of the run directory's own. */
int zr_train__open_json_log(FILE **out, const char *path, const char *ckpt_dir)
{
    *out = NULL;
    if (!path[0])
        return zr_err_set(ZR_EINVAL, "--log-json: empty path (give a file, or none)");
    make_parent_dirs(path); /* open says what is wrong if this was not enough */
    ZR_TRY(json_log_not_the_runs(path, ckpt_dir));
    /* the run directory holds no symbolic links: one there would have zrun append outside it */
    int in_run = zr_train__log_in_run(path, ckpt_dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC |
                            (in_run ? O_NOFOLLOW : 0), 0644);
    if (fd < 0 && errno == ELOOP && in_run)
        return zr_err_set(ZR_EINVAL, "--log-json %s: a symbolic link inside the run directory "
                          "%s, whose files are its own (zrun would append to the file it "
                          "names): remove the link, or give --log-json that file's path",
                          path, ckpt_dir);
    if (fd < 0 && errno == ENXIO)
        return zr_err_set(ZR_EINVAL, "--log-json %s: a FIFO that no process reads (start its "
                          "reader first, or give a file)", path);
    if (fd < 0)
        return zr_err_sys(errno, "%s: open for appending", path);
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 || !(*out = fdopen(fd, "a"))) {
        int e = errno;
        close(fd);
        return zr_err_sys(e, "%s: open for appending", path);
    }
    return 0;
}

/* A resume behind the JSON log's last step (a crash after steps the checkpoint does not hold):
 * the steps redone said, one "resume" record in the log and a line on the step log. */
void zr_train__log_redone(run *r, uint64_t logged)
{
    if (!r->rd || logged <= r->step)
        return;
    uint64_t k = logged - r->step;
    char when[32];
    if (r->jlog) {
        fprintf(r->jlog, "{\"event\":\"resume\",\"time\":\"%s\",\"run_id\":\"%s\","
                         "\"from_step\":%llu,\"redone_steps\":%llu,\"logged_step\":%llu,"
                         "\"checkpoint_run_id\":\"%s\"}\n",
                iso_time(when), r->run_id, (unsigned long long)r->step,
                (unsigned long long)k, (unsigned long long)logged, r->ck_run_id);
        zr_train__json_log_flush(r);
    }
    if (r->log)
        fprintf(r->log, "note: %s already holds steps up to %llu: steps %llu-%llu are redone "
                        "(%llu step%s), and appear again in it\n", r->o->log_json,
                (unsigned long long)logged, (unsigned long long)r->step + 1,
                (unsigned long long)logged, (unsigned long long)k, k == 1 ? "" : "s");
}
