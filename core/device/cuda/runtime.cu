/*
 * runtime.cu: the CUDA backend's runtime part: errors, device selection, memory (device and
 * pinned host), streams and events, and the one exported symbol, the getter of the ops table
 * (device.h). The getter runs no CUDA call: loading the library and reading the table work on
 * any machine; probe is the first call that touches the driver.
 */
#include "zrcuda.h"

#include <atomic>
#include <mutex>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unordered_map>

/* ---------------------------------------------------------------- errors */

static int (*g_handler)(int code, const char *msg);
static thread_local char t_msg[1024];

static void set_error_handler(int (*handler)(int code, const char *msg)) { g_handler = handler; }
static const char *last_error(void) { return t_msg; }

int zrc_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_msg, sizeof t_msg, fmt, ap);
    va_end(ap);
    if (g_handler)
        return g_handler(code, t_msg);
    return code;
}

int zrc_cuda_err(cudaError_t e, const char *what)
{
    return zrc_err(ZR_EDEVICE, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

int zrc_cublas_err(cublasStatus_t s, const char *what)
{
    return zrc_err(ZR_EDEVICE, "cuda: %s: cuBLAS says %s", what, cublasGetStatusString(s));
}

/* "1.50 GiB" */
static const char *human(char *buf, size_t cap, double bytes)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(buf, cap, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
    return buf;
}

/* ---------------------------------------------------------------- device */

static std::atomic<int> g_dev(-1); /* the selected GPU; -1: none yet (GPU 0 is used) */
static thread_local int t_dev = -1;

int zrc_ensure_device(void)
{
    int d = g_dev.load();
    if (d < 0)
        d = 0;
    if (t_dev != d) {
        ZRC_CU(cudaSetDevice(d), "cudaSetDevice");
        t_dev = d;
    }
    return 0;
}

static int probe(int *count)
{
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: leave nothing behind */
        const char *hint = e == cudaErrorInsufficientDriver
                               ? ": no NVIDIA driver is loaded, or it is older than this CUDA "
                                 "runtime needs"
                               : "";
        return zrc_err(ZR_EUNSUPPORTED, "cuda: no GPU: cudaGetDeviceCount failed: %s (%s)%s",
                       cudaGetErrorString(e), cudaGetErrorName(e), hint);
    }
    if (n < 1)
        return zrc_err(ZR_EUNSUPPORTED, "cuda: no GPU: cudaGetDeviceCount says 0");
    *count = n;
    return 0;
}

static int init(int local_rank, int *device)
{
    int n;
    if (local_rank < 0)
        return zrc_err(ZR_EINVAL, "cuda: local rank %d (expected >= 0)", local_rank);
    ZRC_TRY(probe(&n));
    int d = local_rank % n;
    ZRC_CU(cudaSetDevice(d), "cudaSetDevice");
    ZRC_CU(cudaFree(0), "creating the CUDA context"); /* errors show here, not later */
    g_dev.store(d);
    t_dev = d;
    if (device)
        *device = d;
    return 0;
}

static int info(char *name, size_t cap, uint64_t *free_bytes, uint64_t *total_bytes)
{
    ZRC_TRY(zrc_ensure_device());
    int d = g_dev.load() < 0 ? 0 : g_dev.load();
    if (name && cap) {
        cudaDeviceProp p;
        ZRC_CU(cudaGetDeviceProperties(&p, d), "cudaGetDeviceProperties");
        snprintf(name, cap, "%s (GPU %d, sm_%d%d, %d SMs)", p.name, d, p.major, p.minor,
                 p.multiProcessorCount);
    }
    size_t fr = 0, tot = 0;
    ZRC_CU(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
    if (free_bytes)
        *free_bytes = fr;
    if (total_bytes)
        *total_bytes = tot;
    return 0;
}

static int synchronize(void)
{
    ZRC_TRY(zrc_ensure_device());
    ZRC_CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return 0;
}

/* ---------------------------------------------------------------- memory */

static std::mutex g_mem_mu;
static std::unordered_map<void *, size_t> g_sizes;
static uint64_t g_cur, g_peak;

int zrc_malloc(void **out, size_t bytes, const char *what)
{
    *out = NULL;
    ZRC_TRY(zrc_ensure_device());
    if (bytes == 0)
        return 0;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        char a[32], b[32], c[32];
        return zrc_err(e == cudaErrorMemoryAllocation ? ZR_ENOMEM : ZR_EDEVICE,
                       "cuda: cudaMalloc of %s for %s: %s (%s free of %s)",
                       human(a, sizeof a, (double)bytes), what, cudaGetErrorString(e),
                       human(b, sizeof b, (double)fr), human(c, sizeof c, (double)tot));
    }
    std::lock_guard<std::mutex> lk(g_mem_mu);
    g_sizes[p] = bytes;
    g_cur += bytes;
    if (g_cur > g_peak)
        g_peak = g_cur;
    *out = p;
    return 0;
}

void zrc_free(void *p)
{
    if (!p)
        return;
    zrc_ensure_device();
    cudaFree(p);
    std::lock_guard<std::mutex> lk(g_mem_mu);
    auto it = g_sizes.find(p);
    if (it != g_sizes.end()) {
        g_cur -= it->second;
        g_sizes.erase(it);
    }
}

static void mem_stats(uint64_t *current, uint64_t *peak)
{
    std::lock_guard<std::mutex> lk(g_mem_mu);
    if (current)
        *current = g_cur;
    if (peak)
        *peak = g_peak;
}

static void mem_reset_peak(void)
{
    std::lock_guard<std::mutex> lk(g_mem_mu);
    g_peak = g_cur;
}

static int dev_malloc(void **out, size_t bytes) { return zrc_malloc(out, bytes, "ops->malloc"); }
static void dev_free(void *p) { zrc_free(p); }

static int host_alloc(void **out, size_t bytes)
{
    *out = NULL;
    ZRC_TRY(zrc_ensure_device());
    if (bytes == 0)
        return 0;
    cudaError_t e = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        char a[32];
        *out = NULL;
        return zrc_err(ZR_ENOMEM, "cuda: cudaHostAlloc of %s of pinned memory: %s",
                       human(a, sizeof a, (double)bytes), cudaGetErrorString(e));
    }
    return 0;
}

static void host_free(void *p)
{
    if (p) {
        zrc_ensure_device();
        cudaFreeHost(p);
    }
}

static int host_register(void *p, size_t bytes)
{
    ZRC_TRY(zrc_ensure_device());
    ZRC_CU(cudaHostRegister(p, bytes, cudaHostRegisterPortable), "cudaHostRegister");
    return 0;
}

static int host_unregister(void *p)
{
    ZRC_TRY(zrc_ensure_device());
    ZRC_CU(cudaHostUnregister(p), "cudaHostUnregister");
    return 0;
}

static cudaStream_t st(zr_dev_stream *s) { return (cudaStream_t)s; }

static int dev_memset(void *dst, int byte, size_t bytes, zr_dev_stream *s)
{
    ZRC_TRY(zrc_ensure_device());
    if (!bytes)
        return 0;
    ZRC_CU(cudaMemsetAsync(dst, byte, bytes, st(s)), "cudaMemsetAsync");
    if (!s)
        ZRC_CU(cudaStreamSynchronize(0), "cudaStreamSynchronize (memset)");
    return 0;
}

static int dev_memcpy(void *dst, const void *src, size_t bytes, int kind, zr_dev_stream *s)
{
    ZRC_TRY(zrc_ensure_device());
    cudaMemcpyKind k;
    switch (kind) {
    case ZR_DEV_H2D:
        k = cudaMemcpyHostToDevice;
        break;
    case ZR_DEV_D2H:
        k = cudaMemcpyDeviceToHost;
        break;
    case ZR_DEV_D2D:
        k = cudaMemcpyDeviceToDevice;
        break;
    default:
        return zrc_err(ZR_EINVAL, "cuda: memcpy kind %d (expected H2D, D2H or D2D)", kind);
    }
    if (!bytes)
        return 0;
    ZRC_CU(cudaMemcpyAsync(dst, src, bytes, k, st(s)), "cudaMemcpyAsync");
    if (!s)
        ZRC_CU(cudaStreamSynchronize(0), "cudaStreamSynchronize (memcpy)");
    return 0;
}

/* ---------------------------------------------------------------- streams and events */

static int stream_new(zr_dev_stream **out)
{
    *out = NULL;
    ZRC_TRY(zrc_ensure_device());
    cudaStream_t s;
    ZRC_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    *out = (zr_dev_stream *)s;
    return 0;
}

static void stream_free(zr_dev_stream *s)
{
    if (s) {
        zrc_ensure_device();
        cudaStreamDestroy(st(s));
    }
}

static int stream_sync(zr_dev_stream *s)
{
    ZRC_TRY(zrc_ensure_device());
    ZRC_CU(cudaStreamSynchronize(st(s)), "cudaStreamSynchronize");
    return 0;
}

static int event_new(zr_dev_event **out)
{
    *out = NULL;
    ZRC_TRY(zrc_ensure_device());
    cudaEvent_t e;
    ZRC_CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    *out = (zr_dev_event *)e;
    return 0;
}

static void event_free(zr_dev_event *e)
{
    if (e) {
        zrc_ensure_device();
        cudaEventDestroy((cudaEvent_t)e);
    }
}

static int event_record(zr_dev_event *e, zr_dev_stream *s)
{
    ZRC_TRY(zrc_ensure_device());
    ZRC_CU(cudaEventRecord((cudaEvent_t)e, st(s)), "cudaEventRecord");
    return 0;
}

static int event_sync(zr_dev_event *e)
{
    ZRC_TRY(zrc_ensure_device());
    ZRC_CU(cudaEventSynchronize((cudaEvent_t)e), "cudaEventSynchronize");
    return 0;
}

static int event_query(zr_dev_event *e)
{
    ZRC_TRY(zrc_ensure_device());
    cudaError_t r = cudaEventQuery((cudaEvent_t)e);
    if (r == cudaSuccess)
        return 1;
    if (r == cudaErrorNotReady) {
        cudaGetLastError();
        return 0;
    }
    return zrc_cuda_err(r, "cudaEventQuery");
}

static int stream_wait(zr_dev_stream *s, zr_dev_event *e)
{
    ZRC_TRY(zrc_ensure_device());
    ZRC_CU(cudaStreamWaitEvent(st(s), (cudaEvent_t)e, 0), "cudaStreamWaitEvent");
    return 0;
}

/* ---------------------------------------------------------------- the table */

static zr_device_ops g_ops;
static char g_build[256];

static void fill(void)
{
    zr_device_ops &o = g_ops;
    o.abi_version = ZR_DEVICE_ABI_VERSION;
    o.size = (uint32_t)sizeof(zr_device_ops);
    o.name = "cuda";
    snprintf(g_build, sizeof g_build,
             "CUDA runtime %d.%d, cuBLAS %d.%d, %s, sm_90 SASS + compute_90 PTX",
             CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, CUBLAS_VER_MAJOR,
             CUBLAS_VER_MINOR, zrc_nccl_version());
    o.build = g_build;
    o.set_error_handler = set_error_handler;
    o.last_error = last_error;
    o.probe = probe;
    o.init = init;
    o.info = info;
    o.synchronize = synchronize;
    o.mem_stats = mem_stats;
    o.mem_reset_peak = mem_reset_peak;
    o.malloc = dev_malloc;
    o.free = dev_free;
    o.host_alloc = host_alloc;
    o.host_free = host_free;
    o.host_register = host_register;
    o.host_unregister = host_unregister;
    o.memset = dev_memset;
    o.memcpy = dev_memcpy;
    o.stream_new = stream_new;
    o.stream_free = stream_free;
    o.stream_sync = stream_sync;
    o.event_new = event_new;
    o.event_free = event_free;
    o.event_record = event_record;
    o.event_sync = event_sync;
    o.event_query = event_query;
    o.stream_wait = stream_wait;
    o.activation_bytes = zrc_activation_bytes;
    o.model_new = zrc_model_new;
    o.model_free = zrc_model_free;
    o.model_stream = zrc_model_stream;
    o.model_n_groups = zrc_model_n_groups;
    o.model_group_numel = zrc_model_group_numel;
    o.model_numel = zrc_model_numel;
    o.model_fetch_order = zrc_model_fetch_order;
    o.model_param = zrc_model_param;
    o.model_grad = zrc_model_grad;
    o.model_zero_grad = zrc_model_zero_grad;
    o.model_forward = zrc_model_forward;
    o.model_loss = zrc_model_loss;
    o.model_backward = zrc_model_backward;
    o.model_probs = zrc_model_probs;
    o.model_bytes = zrc_model_bytes;
    o.adamw = zrc_adamw;
    o.sumsq = zrc_sumsq;
    o.add = zrc_add;
    o.comm_unique_id = zrc_comm_unique_id;
    o.comm_new = zrc_comm_new;
    o.comm_free = zrc_comm_free;
    o.comm_rank = zrc_comm_rank;
    o.comm_world = zrc_comm_world;
    o.comm_stream = zrc_comm_stream;
    o.comm_wait = zrc_comm_wait;
    o.all_reduce = zrc_all_reduce;
    o.reduce_scatter = zrc_reduce_scatter;
    o.all_gather = zrc_all_gather;
    o.broadcast = zrc_broadcast;
    o.gather = zrc_gather;
    o.barrier = zrc_barrier;
    o.kernels = &zrc_kernels;
}

extern "C" __attribute__((visibility("default"))) const zr_device_ops *zr_cuda_ops_v1(void)
{
    static std::once_flag once;
    std::call_once(once, fill);
    return &g_ops;
}
