/*
 * engine.c: the run's machinery set up and torn down (train_int.h): the world and the device,
 * the data, the ZeRO engine and its options, the offload swap directory, the saver, the model.
 */
#include "train_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

zr_zero_opts zr_train__zero_opts(const zr_train_opts *o)
{
    zr_zero_opts zo = ZR_ZERO_OPTS_INIT;
    zo.stage = o->zero_stage;
    zo.prefetch = o->prefetch;
    zo.live_params = o->max_live_params;
    zo.offload_optimizer = o->offload_optimizer;
    zo.offload_params = o->offload_params;
    zo.swap_dir = o->nvme_path;
    zo.aio_depth = o->aio_depth;
    zo.aio_block = o->aio_block;
    zo.buffers = o->offload_buffers;
    return zo;
}

/* Remove the regular files of a swap directory (ours, or a crashed run's). */
static void swap_dir_clean(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
}

/*
 * This rank's swap directory, <nvme_path>/zrun-swap-rank<r>: created, or taken over from a
 * crashed run (the pid in its `owner` file is gone: its files are removed, never mixed with
 * new state, and the log says so); refused while a live process owns it.
 */
static int swap_dir_claim(run *r)
{
    const char *base = r->o->nvme_path;
    char *dir = NULL;
    if (!base || !base[0])
        return zr_err_set(ZR_EINVAL, "offload to nvme needs --nvme-path DIR");
    if (mkdir(base, 0777) < 0 && errno != EEXIST)
        return zr_err_sys(errno, "--nvme-path %s: create", base);
    if (asprintf(&dir, "%s/zrun-swap-rank%d", base, r->rank) < 0)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    char owner[4200];
    snprintf(owner, sizeof owner, "%s/owner", dir);
    int rc = 0;
    if (mkdir(dir, 0700) < 0) {
        if (errno != EEXIST) {
            rc = zr_err_sys(errno, "%s: create", dir);
            goto out;
        }
        long pid = 0;
        int ofd = -1;
        FILE *f = zck_open_regular(&ofd, owner, ZCK_NOFOLLOW, NULL) == 0 ? fdopen(ofd, "r")
                                                                         : NULL;
        zr_err_clear(); /* no owner file (or not a regular one): nobody holds it */
        if (f) {
            if (fscanf(f, "%ld", &pid) != 1)
                pid = 0;
            fclose(f);
        } else if (ofd >= 0)
            close(ofd);
        if (pid > 0 && pid != (long)getpid() &&
            (kill((pid_t)pid, 0) == 0 || errno == EPERM)) {
            rc = zr_err_set(ZR_EEXIST, "%s is in use by a running process (pid %ld); give "
                            "this run another --nvme-path", dir, pid);
            goto out; /* not ours: left alone */
        }
        zr_log(ZR_LOG_WARN, "%s: stale swap directory of a run that did not finish%s%.0ld%s: "
               "its files are removed", dir, pid ? " (pid " : "", pid, pid ? ")" : "");
        swap_dir_clean(dir);
    }
    r->swap_dir = dir; /* ours from here: removed at the end */
    dir = NULL;
    unlink(owner); /* whatever was there (a FIFO would block the open) */
    int wfd = open(owner, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *f = wfd >= 0 ? fdopen(wfd, "w") : NULL;
    if (!f && wfd >= 0)
        close(wfd);
    if (!f || fprintf(f, "%ld\n", (long)getpid()) < 0 || fclose(f) != 0)
        rc = zr_err_sys(errno, "%s: write", owner);
out:
    free(dir);
    return rc;
}

static void swap_dir_release(run *r)
{
    if (!r->swap_dir)
        return;
    swap_dir_clean(r->swap_dir); /* scratch: the swap files went with the ZeRO state */
    rmdir(r->swap_dir);
    free(r->swap_dir);
}

static int fail_now(void *ctx)
{
    (void)ctx;
    return ZR_ECOMM;
}

/* failed: a collective may still be in flight on the device communicator: abort it first
 * (comm_wait aborts when its check fails while work is pending), so that freeing the model
 * and the buffers, which drains their streams, cannot wait for a peer that is gone */
void zr_train__free_run(run *r, int failed)
{
    if (failed && r->dcomm) {
        int keep = zr_err_code();
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zr_err_msg());
        r->dev->comm_wait(r->dcomm, fail_now, NULL);
        if (keep)
            zr_err_set(keep, "%s", msg); /* the run's error, not the abort's */
    }
    zr_saver_free(r->saver); /* a write still running is joined, never committed */
    if (r->rank == 0)
        zck_staging_remove(r->pend.staging);
    zck_run_unlock(r->lock);
    free(r->pend.staging);
    free(r->pend.train);
    zr_model_free(r->model);
    if (r->dmodel)
        r->dev->model_free(r->dmodel);
    zr_zero_free(r->zero); /* after the model: its comm thread may still hold lent buffers */
    if (r->dcomm)
        r->dev->comm_free(r->dcomm);
    swap_dir_release(r);
    zr_comm_close(r->comm);
    zck_layout_free(r->L);
    free(r->tokens);
    free(r->inputs);
    free(r->targets);
    zr_train__eval_free(r->eval); /* before the data it may borrow from */
    zr_data_free(r->data);
    free(r->ck_tokenizer);
    if (r->codec.ops)
        r->codec.ops->close(r->codec.ctx);
    if (r->jlog)
        fclose(r->jlog);
    zck_reader_free(r->rd);
    free(r->from);
}

/* The device (o->device): cpu; cuda, which every rank must be able to use; or auto: cuda
 * when every rank can, else cpu. Then this rank's GPU (ZR_LOCAL_RANK, else the rank, modulo
 * the GPUs: ranks beyond the GPUs share them) and, with several ranks, the device
 * communicator: NCCL when every rank has a GPU of its own (no two ranks of a host on one
 * device index of the same CUDA_VISIBLE_DEVICES; its unique id from rank 0 through the host
 * communicator: shm on one node, TCP across nodes), else none (collectives staged through
 * host memory over the host communicator). ZR_DEVICE_COMM=nccl or shm overrides the choice. */
static int open_device(run *r)
{
    const zr_train_opts *o = r->o;
    if (o->device == ZR_DEVICE_CPU)
        return 0;
    const zr_device_ops *ops = NULL;
    int lrc = o->device == ZR_DEVICE_AUTO && !zr_device_cuda_available() ? ZR_EUNSUPPORTED
                                                                         : zr_device_open(&ops);
    if (o->device == ZR_DEVICE_AUTO) {
        double mine = lrc ? 0 : 1, *all = calloc((size_t)r->W, sizeof *all);
        if (!all)
            return zr_err_set(ZR_ENOMEM, "out of memory");
        int rc = zr_train__gather_f64(r, &mine, 1, all), every = 1;
        for (int q = 0; q < r->W; q++)
            every &= all[q] != 0;
        free(all);
        if (rc)
            return rc;
        zr_err_clear();
        if (!every)
            return 0; /* the CPU engine */
    }
    ZR_TRY(zr_train__agree(r, lrc));
    r->dev = ops;
    int local = r->rank, idx = 0, count = 1, has_local = 0;
    char name[96] = "?";
    uint64_t fb = 0, tb = 0;
    lrc = zr_env_int(&local, &has_local, ZR_ENV_LOCAL_RANK, 0, 1 << 20);
    if (!lrc)
        lrc = ops->probe(&count);
    if (!lrc)
        lrc = ops->init(local, &idx);
    if (!lrc)
        lrc = ops->info(name, sizeof name, &fb, &tb);
    ZR_TRY(zr_train__agree(r, lrc));
    /* a GPU of its own for every rank: no two ranks of a host on the same device (its index
     * among the devices CUDA_VISIBLE_DEVICES shows it, which a scheduler may set per rank) */
    int nccl = r->W > 1;
    if (nccl) {
        enum { KEY = 160 };
        char key[KEY], host[64] = "?", *all = calloc((size_t)r->W, KEY);
        if (!all)
            return zr_err_set(ZR_ENOMEM, "out of memory");
        const char *vis = zr_env(ZR_ENV_CUDA_VISIBLE_DEVICES);
        gethostname(host, sizeof host - 1);
        memset(key, 0, sizeof key);
        snprintf(key, sizeof key, "%s|%.80s|%d", host, vis ? vis : "*", idx);
        int rc = zr_comm_all_gather(r->comm, key, all, 1, KEY);
        for (int q = 0; !rc && q < r->W; q++)
            for (int p = 0; p < q; p++)
                if (!strncmp(all + (size_t)q * KEY, all + (size_t)p * KEY, KEY))
                    nccl = 0;
        free(all);
        if (rc)
            return rc;
    }
    const char *mode = zr_env(ZR_ENV_DEVICE_COMM);
    lrc = 0;
    if (mode && !strcmp(mode, "nccl"))
        nccl = r->W > 1;
    else if (mode && !strcmp(mode, "shm"))
        nccl = 0;
    else if (mode && *mode)
        lrc = zr_err_set(ZR_EINVAL, "ZR_DEVICE_COMM=%s: expected nccl or shm", mode);
    ZR_TRY(zr_train__agree(r, lrc)); /* the same choice on every rank, or none goes on */
    if (nccl) {
        char id[ZR_NCCL_ID_BYTES];
        memset(id, 0, sizeof id);
        ZR_TRY(zr_train__agree(r, r->rank == 0 ? ops->comm_unique_id(id, sizeof id) : 0));
        ZR_TRY(zr_train__bcast(r, id, sizeof id, 0));
        ZR_TRY(zr_train__agree(r, ops->comm_new(&r->dcomm, id, sizeof id, r->rank, r->W)));
    }
    snprintf(r->dev_name, sizeof r->dev_name, "%s (GPU %d: %s, %.1f GiB%s)", ops->name, idx,
             name, tb / 1073741824.0,
             r->W == 1 ? "" : nccl ? "; NCCL" : "; collectives staged over shm");
    return 0;
}

/* The world (the launcher's ranks, else one rank), the options it constrains, the device. */
int zr_train__open_world(run *r)
{
    ZR_TRY(zr_comm_open_env(&r->comm));
    r->rank = zr_comm_rank(r->comm);
    r->W = zr_comm_world(r->comm);
    r->log = r->rank == 0 ? r->o->log : NULL;
    ZR_TRY(zr_train__check_world(r->o, r->W));
    zr_set_threads(r->o->threads > 0 ? r->o->threads : 1);
    return open_device(r);
}

/* The data, the ZeRO engine (on the device, with its offload), the saver, the model and the
 * batch buffers. Returns this rank's result, still to be agreed. */
int zr_train__build_engine(run *r)
{
    const zr_train_opts *o = r->o;
    int offloaded = o->offload_optimizer == ZR_OFFLOAD_NVME ||
                    o->offload_params == ZR_OFFLOAD_NVME;
    ZR_TRY(zr_data_open(&r->data, o->data, r->cfg.vocab, r->T, o->seed));
    ZR_TRY(zr_train__check_bytes_data(o, zr_data_is_bytes(r->data),
                                      r->ck_tokenizer ? zck_reader_path(r->rd) : NULL));
    uint32_t dv = zr_data_vocab(r->data);
    if (o->tokenizer_json && dv && dv != o->tokenizer_vocab)
        return zr_err_set(ZR_EINVAL, "%s was encoded with a tokenizer of %u tokens, --tokenizer "
                          "%s has %u: encode the data with this tokenizer (ztok encode)",
                          o->data, dv, o->tokenizer_path ? o->tokenizer_path : "",
                          o->tokenizer_vocab);
    ZR_TRY(zr_train__eval_open(&r->eval, o, r->data, r->cfg.vocab, r->T));
    ZR_TRY(zr_gpt2_layout(&r->L, &r->cfg));
    if (offloaded)
        ZR_TRY(swap_dir_claim(r));
    zr_zero_opts zo = zr_train__zero_opts(o);
    zo.swap_dir = r->swap_dir;
    ZR_TRY(zr_zero_new(&r->zero, r->comm, r->L, &zo, r->dev, r->dcomm));
    /* asynchronous saves need a host copy of this rank's partitions: by default not when the
     * states were moved to NVMe to free that memory */
    if (o->async_save > 0 || (o->async_save < 0 && !offloaded)) {
        ZR_TRY(zr_saver_new(&r->saver, r->L, r->W, r->rank, o->save_buffer));
        ZR_TRY(zr_saver_prepare(r->saver, r->zero)); /* faulted in before the first step */
    }
    zr_model_hooks h;
    zr_zero_hooks(r->zero, &h);
    if (r->dev) { /* the CPU model only gives the initial values: the smallest one */
        ZR_TRY(zr_device_model_new(r->dev, &r->dmodel, &r->cfg, r->mb, r->T, &h,
                                   (zr_recompute)o->recompute));
        ZR_TRY(zr_zero_attach(r->zero, NULL, r->dmodel, r->n_micro));
        ZR_TRY(zr_model_new_ext(&r->model, &r->cfg, 1, 1, &h));
    } else {
        ZR_TRY(zr_model_new_recompute(&r->model, &r->cfg, r->mb, r->T, &h,
                                      (zr_recompute)o->recompute));
        ZR_TRY(zr_zero_attach(r->zero, r->model, NULL, r->n_micro));
    }
    r->ng = zr_model_n_groups(r->model);
    if (!(r->tokens = malloc((r->T + 1) * sizeof *r->tokens)) ||
        !(r->inputs = malloc((size_t)r->mb * r->T * sizeof *r->inputs)) ||
        !(r->targets = malloc((size_t)r->mb * r->T * sizeof *r->targets)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    return 0;
}
