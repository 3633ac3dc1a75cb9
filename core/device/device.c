/*
 * device.c: the loader of the device backends (device.h). Plain C, no CUDA header and no CUDA
 * library: the backend is a shared object opened with dlopen, so libzr and the programs that
 * link it run on machines without a GPU (and without CUDA installed at all).
 *
 * Search: $ZR_CUDA_LIB when set and not empty, else libzr_cuda.so in the directory of the
 * running executable (readlink /proc/self/exe). The library stays loaded for the life of the
 * process: CUDA's libraries do not survive dlclose well, and there is nothing to gain.
 *
 * ZR_CUDA_LIB=hostsim (exactly that word; a file of that name is ./hostsim) selects the host
 * simulation, libzr_hostsim.so next to the running executable (core/device/hostsim.c, a test
 * backend built by the Makefile and not linked into any program), loaded and checked as the
 * CUDA backend is.
 */
#include "comm.h"
#include "device.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The backend's errors land in this library's error state (zr_err_msg), on the thread that
 * made the failing call. */
static int forward_error(int code, const char *msg)
{
    return zr_err_set(code, "%s", msg);
}

/* buf[cap] = the directory of the running executable + "/" + lib (comm.h's helper) */
static int next_to_exe(char *buf, size_t cap, const char *lib)
{
    int rc = zr__next_to_exe(buf, cap, lib);
    if (rc < 0)
        zr_err_prefix("cuda: ");
    return rc;
}

int zr_device_lib_path(char *buf, size_t cap)
{
    const char *env = zr_env(ZR_ENV_CUDA_LIB);
    if (env) {
        if (strlen(env) >= cap)
            return zr_err_set(ZR_EINVAL, "cuda: ZR_CUDA_LIB is longer than %zu bytes", cap - 1);
        memcpy(buf, env, strlen(env) + 1);
        return 0;
    }
    return next_to_exe(buf, cap, ZR_DEVICE_LIB);
}

/* The checks every backend's table goes through, then the handler and the probe. */
static int accept_ops(const zr_device_ops *ops, const char *path, const zr_device_ops **out)
{
    if (!ops || ops->abi_version != ZR_DEVICE_ABI_VERSION || ops->size < sizeof *ops)
        return zr_err_set(ZR_EUNSUPPORTED, "cuda: %s implements device ABI %u (%u bytes), this "
                          "program needs %u (%zu bytes): rebuild with make", path,
                          ops ? ops->abi_version : 0, ops ? ops->size : 0,
                          (unsigned)ZR_DEVICE_ABI_VERSION, sizeof *ops);
    ops->set_error_handler(forward_error);
    int count = 0;
    ZR_TRY(ops->probe(&count));
    if (count < 1) /* probe says so itself; kept in case a backend does not */
        return zr_err_set(ZR_EUNSUPPORTED, "cuda: no GPU: cudaGetDeviceCount says 0");
    *out = ops;
    return 0;
}

int zr_device_open_at(const char *path, const zr_device_ops **out)
{
    *out = NULL;
    char sim[4096];
    if (!strcmp(path, "hostsim")) {
        ZR_TRY(next_to_exe(sim, sizeof sim, ZR_HOSTSIM_LIB));
        if (access(sim, F_OK) != 0)
            return zr_err_set(ZR_EUNSUPPORTED, "hostsim: no %s (the host simulation is a test "
                              "backend: make builds it)", sim);
        path = sim;
    }
    if (access(path, F_OK) != 0) {
        if (zr_env(ZR_ENV_CUDA_LIB))
            return zr_err_set(ZR_EUNSUPPORTED, "cuda: ZR_CUDA_LIB names %s, which does not "
                              "exist", path);
        return zr_err_set(ZR_EUNSUPPORTED, "cuda: built without CUDA: no %s (make builds it "
                          "when it finds nvcc; ZR_CUDA_LIB may name another)", path);
    }
    void *sym;
    ZR_TRY(zr__backend_load(&sym, path, ZR_DEVICE_SYMBOL, 0, "cuda", "CUDA backend"));
    /* dlsym returns void *; the getter is a function (POSIX guarantees the conversion) */
    zr_device_getter get;
    memcpy(&get, &sym, sizeof get);
    if (!sym)
        return zr_err_set(ZR_EUNSUPPORTED, "cuda: %s has no %s: not this project's CUDA "
                          "backend", path, ZR_DEVICE_SYMBOL);
    return accept_ops(get(), path, out);
}

static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static int open_done, open_rc;
static const zr_device_ops *open_ops;
static char open_msg[1024];

int zr_device_open(const zr_device_ops **out)
{
    pthread_mutex_lock(&open_mu);
    if (!open_done) {
        char path[4096];
        open_rc = zr_device_lib_path(path, sizeof path);
        if (!open_rc)
            open_rc = zr_device_open_at(path, &open_ops);
        if (open_rc)
            snprintf(open_msg, sizeof open_msg, "%s", zr_err_msg());
        open_done = 1;
    }
    int rc = open_rc;
    *out = open_ops;
    pthread_mutex_unlock(&open_mu);
    if (rc)
        return zr_err_set(rc, "%s", open_msg);
    return 0;
}

int zr_device_cuda_available(void)
{
    /* Loading the backend maps CUDA, cuBLAS and NCCL (some 150 MiB of resident memory per
     * process) even when the probe then finds no GPU: without the NVIDIA driver's control
     * device there is none to find, and `--device auto` stays light on CPU machines. */
    const char *env = zr_env(ZR_ENV_CUDA_LIB);
    if (!(env && !strcmp(env, "hostsim")) && access("/dev/nvidiactl", F_OK) != 0) {
        zr_err_set(ZR_EUNSUPPORTED, "cuda: no GPU: /dev/nvidiactl is absent (no NVIDIA "
                   "driver)");
        return 0;
    }
    const zr_device_ops *ops;
    return zr_device_open(&ops) == 0;
}

/* a recompute mode the backends know (zr_recompute) */
static int recompute_check(zr_recompute rc)
{
    if (rc != ZR_RECOMPUTE_NONE && rc != ZR_RECOMPUTE_LAYER && rc != ZR_RECOMPUTE_SELECTIVE)
        return zr_err_set(ZR_EINVAL, "device model: recompute mode %d (none 0, layer 1, "
                          "selective 2)", (int)rc);
    return 0;
}

int zr_device_model_new(const zr_device_ops *ops, zr_dev_model **out, const zr_config *c,
                        size_t max_B, size_t max_T, const zr_model_hooks *hooks,
                        zr_recompute rc)
{
    zr_model_offsets off;
    *out = NULL;
    ZR_TRY(recompute_check(rc));
    ZR_TRY(zr_model_offsets_get(&off, c));
    return ops->model_new(out, c, &off, max_B, max_T, hooks, rc);
}

int zr_device_activation_bytes(uint64_t *out, const zr_device_ops *ops, const zr_config *c,
                               size_t max_B, size_t max_T, zr_recompute rc)
{
    zr_model_offsets off;
    ZR_TRY(recompute_check(rc));
    ZR_TRY(zr_model_offsets_get(&off, c));
    *out = ops->activation_bytes(c, &off, max_B, max_T, rc);
    return 0;
}
