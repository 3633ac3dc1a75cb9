/*
 * device.h: the device backends' C ABI (core-internal, not part of zr.h). A backend is a shared
 * object loaded at run time (dlopen), so that libzr, zrun and the tests never link against
 * CUDA: the same binaries run on machines without a GPU and pick the CPU there.
 *
 * The CUDA backend is build/libzr_cuda.so (core/device/cuda/, built by the Makefile when nvcc is
 * found). It exports one symbol, the getter ZR_DEVICE_SYMBOL ("zr_cuda_ops_v1"), which returns
 * its table of operations (zr_device_ops). core/device/device.c finds and loads it: zr_device_open.
 *
 * Conventions (ckpt's, zck.h): functions return 0 or a negative ZR_E* code after setting a
 * one-line message; the loader installs an error handler in the backend that forwards every
 * message to zr_err_set, so zr_err_msg() reads them as it reads any other error. Nothing is
 * printed and nothing exits. Device errors are ZR_EDEVICE ("cuda: cudaMalloc of 1.5 GiB: out
 * of memory ..."), communicator errors ZR_ECOMM, a backend that cannot run here (no library, no
 * GPU, another ABI) ZR_EUNSUPPORTED.
 *
 * Pointers: "device" pointers come from ops->malloc (or a lender that got them there); "host"
 * pointers are ordinary memory, or pinned memory from ops->host_alloc / host_register, which
 * asynchronous copies need to be truly asynchronous. Streams and events are opaque handles
 * (cudaStream_t and cudaEvent_t in the CUDA backend); a NULL stream argument means "synchronous":
 * the call returns when the work is done (the legacy default stream, then a device sync of it).
 *
 * Threads: the backend binds the selected GPU (ops->init) to every thread that calls into it,
 * so the engine's comm thread may call the communicator directly. One model is used by one
 * thread at a time.
 */
#ifndef ZR_DEVICE_H
#define ZR_DEVICE_H

#include "model.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZR_DEVICE_ABI_VERSION 5 /* 4: model_new and activation_bytes take zr_model_offsets
                                 * (the family and its offsets: GPT-2 or Llama); 5: and the
                                 * recompute mode (zr_recompute) */
#define ZR_DEVICE_SYMBOL "zr_cuda_ops_v1" /* const zr_device_ops *zr_cuda_ops_v1(void) */
#define ZR_DEVICE_LIB "libzr_cuda.so"
#define ZR_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef struct zr_dev_stream zr_dev_stream; /* cudaStream_t */
typedef struct zr_dev_event zr_dev_event;   /* cudaEvent_t */
typedef struct zr_dev_model zr_dev_model;   /* a model on the device (below) */
typedef struct zr_dev_comm zr_dev_comm;     /* an NCCL communicator and its stream */

/* Element types of the communicator (F32 and F64 have zr_comm_dtype's values). */
typedef enum { ZR_DEV_F32 = 0, ZR_DEV_F64 = 1, ZR_DEV_BF16 = 2 } zr_dev_dtype;
/* Directions of ops->memcpy. */
typedef enum { ZR_DEV_H2D = 1, ZR_DEV_D2H = 2, ZR_DEV_D2D = 3 } zr_dev_copy;

/*
 * Per-layer kernels, exposed for tests/gpu/kernels.c (not for the engine). Each runs a layer's
 * forward and, when its `dout`-like argument is not NULL, its backward, with the model's own
 * kernels and rounding: inputs that the model keeps in bf16 (matmul operands, LayerNorm
 * outputs, attention q/k/v and probabilities, GELU activations, the classifier's dlogits) are
 * rounded to bf16 on the way in, exactly where the model rounds them. Every pointer is a device
 * pointer to fp32, row-major, unless it says host; scratch is allocated and freed inside; each
 * call is synchronous. Gradients marked += add into what the buffer holds; outputs marked out
 * may be NULL when not wanted. Shapes as in core/model/model.c: N = B T rows, C channels, NH heads.
 */
typedef struct zr_device_kernels {
    /* out[N,C] = wte[tok] + wpe[t]; backward: dwte[V,C] +=, dwpe[T,C] += dout summed over the
     * positions of each token / each t (tokens_host: the N token ids, on the host) */
    int (*encoder)(float *out, float *dwte, float *dwpe, const int32_t *tokens_host,
                   const float *wte, const float *wpe, const float *dout, size_t B, size_t T,
                   size_t C, size_t V);
    /* out[N,C] (bf16-rounded), mean[N], rstd[N] out; backward from dout[N,C]: dinp +=, dw +=,
     * db += */
    int (*layernorm)(float *out, float *mean, float *rstd, float *dinp, float *dw, float *db,
                     const float *inp, const float *w, const float *b, const float *dout,
                     size_t N, size_t C);
    /* out[N,OC] = (res ? res : 0) + inp[N,IC] W[OC,IC]^T + (bias ? bias : 0) (fp32 output, inp
     * and W rounded to bf16); backward from dout[N,OC] (rounded to bf16): dinp[N,IC] = dout W
     * (overwritten), dW += dout^T inp, db += column sums of dout (may be NULL) */
    int (*matmul)(float *out, float *dinp, float *dW, float *db, const float *inp, const float *W,
                  const float *bias, const float *res, const float *dout, size_t N, size_t IC,
                  size_t OC);
    /* causal self-attention of qkv[N,3C] (q, k, v of head h at channels h hs of each third):
     * y[N,C] out, att[B,NH,T,T] out (softmax rows, zeros above the diagonal); backward from
     * dy[N,C]: dqkv[N,3C] (overwritten) */
    int (*attention)(float *y, float *att, float *dqkv, const float *qkv, const float *dy,
                     size_t B, size_t T, size_t C, size_t NH);
    /* out[n] = gelu_tanh(inp) (bf16-rounded; inp is the fp32 pre-activation); backward:
     * dinp[n] = dout * gelu'(inp rounded to bf16, as the model keeps it) (overwritten) */
    int (*gelu)(float *out, float *dinp, const float *inp, const float *dout, size_t n);
    /* the fused head in chunks of chunk_rows rows (0: the model's chunk): logits = lnf[N,C]
     * wte[V,C]^T, softmax, losses[N] = -log p[target]; probs[N,V] out (NULL: not wanted);
     * backward (when dlnf is not NULL): dlogits = scale (p - onehot), dlnf[N,C] = dlogits wte
     * (overwritten), dwte += dlogits^T lnf. targets_host: N ids on the host. */
    int (*classifier)(float *losses, float *probs, float *dlnf, float *dwte, const float *lnf,
                      const float *wte, const int32_t *targets_host, size_t N, size_t C,
                      size_t V, float scale, size_t chunk_rows);
    /* Llama (llama.c's shapes: H query heads, KV key/value heads, hd = C / H, QL = C + 2 KV hd).
     * RMSNorm: out[N,C] (bf16-rounded), rstd[N] out; backward from dout: dinp +=, dw += */
    int (*rmsnorm)(float *out, float *rstd, float *dinp, float *dw, const float *inp,
                   const float *w, const float *dout, size_t N, size_t C, float eps);
    /* the attention path of a layer: rows qkv[N, QL] (q, k, v before the rotation; rounded to
     * bf16 after it) -> rotary positions of base theta on q and k -> causal grouped-query
     * attention: y[N, C] out, att[B, H, T, T] out; backward from dy[N, C]: dqkv[N, QL] (the
     * gradient of the rows before the rotation, overwritten) */
    int (*rope_attention)(float *y, float *att, float *dqkv, const float *qkv, const float *dy,
                          size_t B, size_t T, size_t C, size_t H, size_t KV, double theta);
    /* SwiGLU: h[n] = silu(g) u (bf16-rounded; g and u are fp32, kept rounded to bf16 for the
     * backward); backward from dh: dg, du (overwritten) */
    int (*swiglu)(float *h, float *dg, float *du, const float *g, const float *u,
                  const float *dh, size_t n);
} zr_device_kernels;

typedef struct zr_device_ops {
    uint32_t abi_version; /* ZR_DEVICE_ABI_VERSION the backend was built with */
    uint32_t size;        /* sizeof(zr_device_ops) as the backend was built */
    const char *name;     /* "cuda" */
    const char *build;    /* what it was built with: "CUDA 13.0, NCCL 2.28.9, sm_90 + PTX" */

    /* ------------------------------------------------------------ errors */
    /* Every error the backend reports goes to handler(code, message) (the loader's forwards it
     * to zr_err_set and returns code); without one, to a thread-local message last_error(). */
    void (*set_error_handler)(int (*handler)(int code, const char *msg));
    const char *(*last_error)(void);

    /* ------------------------------------------------------------ device */
    /* GPUs visible (cudaGetDeviceCount); ZR_EUNSUPPORTED "no GPU: ..." when there is none or
     * the driver cannot be used. */
    int (*probe)(int *count);
    /* Select GPU local_rank % count for this process (*device: its index; NULL allowed) and
     * make it current on the calling thread. Calls before init use GPU 0. */
    int (*init)(int local_rank, int *device);
    /* The selected GPU's name (into name[cap], may be NULL), free and total memory in bytes. */
    int (*info)(char *name, size_t cap, uint64_t *free_bytes, uint64_t *total_bytes);
    int (*synchronize)(void); /* every stream of the device */
    /* Bytes allocated through ops->malloc now and at most since the last reset (the models'
     * arenas included; cuBLAS's and NCCL's own memory not). */
    void (*mem_stats)(uint64_t *current, uint64_t *peak);
    void (*mem_reset_peak)(void);

    /* ------------------------------------------------------------ memory */
    int (*malloc)(void **out, size_t bytes); /* device, 256-byte aligned, not zeroed */
    void (*free)(void *p);                   /* NULL: nothing */
    int (*host_alloc)(void **out, size_t bytes); /* pinned host memory */
    void (*host_free)(void *p);
    int (*host_register)(void *p, size_t bytes); /* pin existing host memory */
    int (*host_unregister)(void *p);
    /* bytes of dst set to `byte` (device memory) */
    int (*memset)(void *dst, int byte, size_t bytes, zr_dev_stream *s);
    /* kind: ZR_DEV_H2D, D2H or D2D; with a stream, asynchronous (host memory pinned) */
    int (*memcpy)(void *dst, const void *src, size_t bytes, int kind, zr_dev_stream *s);

    /* ------------------------------------------------------------ streams and events */
    int (*stream_new)(zr_dev_stream **out); /* non-blocking with respect to the NULL stream */
    void (*stream_free)(zr_dev_stream *s);
    int (*stream_sync)(zr_dev_stream *s);
    int (*event_new)(zr_dev_event **out); /* timing disabled */
    void (*event_free)(zr_dev_event *e);
    int (*event_record)(zr_dev_event *e, zr_dev_stream *s);
    int (*event_sync)(zr_dev_event *e);
    int (*event_query)(zr_dev_event *e); /* 1 done, 0 pending, or an error */
    /* work enqueued on s after this call waits until e's recorded work is done */
    int (*stream_wait)(zr_dev_stream *s, zr_dev_event *e);

    /* ------------------------------------------------------------ the model */
    /*
     * The same model and contract as zr_model (zr.h), of either family (c->family): the groups
     * of zr_gpt2_layout (GPT-2: wte, wpe, h.0 .. h.<L-1>, ln_f; Llama: embed_tokens, layers.0
     * .. layers.<L-1>, norm, lm_head unless tied; tensors in layout order, weights [out, in]),
     * fp32 parameters and
     * gradients, the same fetch order, forward (mean cross-entropy) and backward(scale) adding
     * scale x the gradient. Differences: every parameter and gradient pointer, own or lent, is
     * DEVICE memory; the computation is bf16 with fp32 accumulation (matmul weights cast to
     * bf16 each time a group is fetched, activations bf16 where matmuls read them, the residual
     * stream, LayerNorm statistics, softmax, loss and every gradient accumulation in fp32).
     *
     * model_new(c, off, max_B, max_T, hooks, rc): as zr_model_new_recompute; off says where
     * each group and tensor lies in an arena (zr_model_offsets_get of c: the family, then the
     * family's offsets; the host computes them from ckpt's family table, so the backend never
     * restates the table; zr_device_model_new does it). A backend without a model of c's
     * family answers ZR_EUNSUPPORTED naming it.
     * Without hooks (or a NULL side),
     * the model owns zeroed device arenas of numel floats in layout order (model_param /
     * model_grad point into them; the test uploads a CPU model's arena with one copy). With
     * hooks, they lend device pointers, called on the model's calling thread, and the stream
     * contract is:
     *   params(g)      the buffer must hold group g for all work the model enqueues on its
     *                  stream (model_stream) after the call returns (a lender filling it on
     *                  another stream makes model_stream wait on an event first);
     *   params_done(g) the model has ENQUEUED every read of the buffer; the lender must not
     *                  overwrite it before that work is done (record an event on model_stream);
     *   grads(g)       the model enqueues += into it after the call returns;
     *   grads_done(g)  every += is enqueued: record an event on model_stream before reading.
     * A hook's error is returned as is (its message already set by the lender).
     *
     * model_forward: inputs and targets on the host (checked as zr_model_forward does, the same
     * messages); *loss = the mean loss, which waits for the forward to finish; loss NULL
     * returns once the work is enqueued, and model_loss waits and reads it later.
     * model_probs: the last forward's probabilities [B*T, V] into host memory (bf16 precision).
     * model_zero_grad: zero the own gradient arena (nothing when gradients are lent).
     * model_bytes: device bytes held (params, grads: 0 for a lent side; acts: activations,
     * bf16 weight copies and scratch).
     */
    uint64_t (*activation_bytes)(const zr_config *c, const zr_model_offsets *off, size_t max_B,
                                 size_t max_T, zr_recompute rc);
    int (*model_new)(zr_dev_model **out, const zr_config *c, const zr_model_offsets *off,
                     size_t max_B, size_t max_T, const zr_model_hooks *hooks, zr_recompute rc);
    void (*model_free)(zr_dev_model *m);
    zr_dev_stream *(*model_stream)(zr_dev_model *m);
    size_t (*model_n_groups)(const zr_dev_model *m);
    uint64_t (*model_group_numel)(const zr_dev_model *m, size_t g);
    uint64_t (*model_numel)(const zr_dev_model *m);
    size_t (*model_fetch_order)(const zr_dev_model *m, int backward, size_t *order);
    float *(*model_param)(zr_dev_model *m, size_t g); /* device; NULL when lent */
    float *(*model_grad)(zr_dev_model *m, size_t g);
    int (*model_zero_grad)(zr_dev_model *m);
    int (*model_forward)(zr_dev_model *m, const int32_t *inputs, const int32_t *targets,
                         size_t B, size_t T, float *loss);
    int (*model_loss)(zr_dev_model *m, float *loss);
    int (*model_backward)(zr_dev_model *m, float scale);
    int (*model_probs)(zr_dev_model *m, float *host_dst);
    void (*model_bytes)(const zr_dev_model *m, uint64_t *params, uint64_t *grads,
                        uint64_t *acts);

    /* ------------------------------------------------------------ optimizer */
    /* zr_adamw_update on device arrays, the same arithmetic in the same order with no FMA
     * contraction: the same bits as the CPU for the same inputs. Enqueued on s (NULL: sync). */
    int (*adamw)(float *param, const float *grad, float *m, float *v, size_t n, uint64_t t,
                 float lr, float grad_scale, int decay, const zr_adamw_hp *hp, zr_dev_stream *s);
    /* zr_sumsq of a device array, the same blocks, partial sums and order: the same bits.
     * Waits for the result (after the work already enqueued on s). */
    int (*sumsq)(const float *x, size_t n, double *out, zr_dev_stream *s);
    /* y[i] += x[i] for n floats of device memory, enqueued on s (NULL: sync): a ZeRO rank
     * accumulates its reduced gradient partition over micro-batches with it. */
    int (*add)(float *y, const float *x, size_t n, zr_dev_stream *s);

    /* ------------------------------------------------------------ communicator (NCCL) */
    /*
     * comm.h's collectives on device buffers, the same shapes and in-place forms, enqueued on
     * the communicator's own stream (comm_stream) and returning at once: a caller orders them
     * after compute with an event (event_record on the model stream, stream_wait on the comm
     * stream) and waits with comm_wait. Sums are NCCL's (not comm.h's rank-order bits).
     * gather is an all_gather: recv must hold W x bytes on EVERY rank. barrier waits.
     * Bootstrap: one rank calls comm_unique_id (ZR_NCCL_ID_BYTES bytes), the launcher hands
     * the bytes to every rank, each calls comm_new with its rank (after init).
     * comm_wait: returns when the comm stream's work is done; meanwhile it polls NCCL's
     * asynchronous error and check(ctx) (NULL: none; e.g. the launcher's abort record): an
     * error or a nonzero check aborts the communicator (it may then only be freed) and is
     * returned.
     */
    int (*comm_unique_id)(void *id, size_t cap);
    int (*comm_new)(zr_dev_comm **out, const void *id, size_t id_bytes, int rank, int world);
    void (*comm_free)(zr_dev_comm *c);
    int (*comm_rank)(const zr_dev_comm *c);
    int (*comm_world)(const zr_dev_comm *c);
    zr_dev_stream *(*comm_stream)(zr_dev_comm *c);
    int (*comm_wait)(zr_dev_comm *c, int (*check)(void *ctx), void *ctx);
    int (*all_reduce)(zr_dev_comm *c, const void *send, void *recv, size_t n, zr_dev_dtype dt);
    int (*reduce_scatter)(zr_dev_comm *c, const void *send, void *recv, size_t n,
                          zr_dev_dtype dt);
    int (*all_gather)(zr_dev_comm *c, const void *send, void *recv, size_t n,
                      size_t elem_bytes);
    int (*broadcast)(zr_dev_comm *c, void *buf, size_t bytes, int root);
    int (*gather)(zr_dev_comm *c, const void *send, void *recv, size_t bytes, int root);
    int (*barrier)(zr_dev_comm *c);

    /* ------------------------------------------------------------ tests */
    const zr_device_kernels *kernels;
} zr_device_ops;

/* The getter the backend exports under ZR_DEVICE_SYMBOL. It runs no CUDA call. */
typedef const zr_device_ops *(*zr_device_getter)(void);

/* ---------------------------------------------------------------- the loader (device.c) */

/*
 * Load the CUDA backend and check that a GPU can be used: the library named by ZR_CUDA_LIB in
 * the environment when set, else libzr_cuda.so in the directory of the running executable
 * (/proc/self/exe). ZR_EUNSUPPORTED with a one-line reason when it cannot be used: "built
 * without CUDA" (no library there), the dlopen error text, a missing symbol or another ABI
 * version, or "no GPU: ..." (cudaGetDeviceCount failed or says 0). Never crashes and never
 * exits on a machine without a GPU or without the library. The first call's outcome is kept:
 * later calls return the same table or the same error (the library stays loaded for the life of
 * the process). Note that the probe initializes the CUDA runtime in the calling process; a
 * process that forks afterwards must exec before its children touch the GPU (zr_launch does).
 */
int zr_device_open(const zr_device_ops **out);
/* ops->model_new and ops->activation_bytes with the offsets of c (zr_model_offsets_get): what
 * the engine and the tests call. ZR_EINVAL for a config without a layout. */
int zr_device_model_new(const zr_device_ops *ops, zr_dev_model **out, const zr_config *c,
                        size_t max_B, size_t max_T, const zr_model_hooks *hooks,
                        zr_recompute rc);
int zr_device_activation_bytes(uint64_t *out, const zr_device_ops *ops, const zr_config *c,
                               size_t max_B, size_t max_T, zr_recompute rc);
/* As zr_device_open for the library at `path`, without keeping the outcome (tests). */
int zr_device_open_at(const char *path, const zr_device_ops **out);
/* Where zr_device_open looks: into buf[cap]; ZR_EINVAL when it does not fit. */
int zr_device_lib_path(char *buf, size_t cap);
/*
 * The host simulation of a device (core/device/hostsim.c), selected with ZR_CUDA_LIB=hostsim:
 * libzr_hostsim.so next to the running executable, a test backend (the Makefile builds it; no
 * program links it). The same table on ordinary memory, run on the CPU with the CPU engine's own
 * code (zr_model for model_*, zr_adamw_update, zr_sumsq), every call synchronous, streams and
 * events trivial, the communicator (comm_*) riding on this process's shm communicator
 * (zr_comm_env). It lets the engine's device path (zero_dev.c, train.c) run and be tested on
 * machines without a GPU; its results have the CPU engine's bits. It is not a GPU emulator.
 */
#define ZR_HOSTSIM_LIB "libzr_hostsim.so"

/* 1 when zr_device_open succeeds (--device auto picks cuda then), else 0 (the reason stays in
 * zr_err_msg()). Without /dev/nvidiactl (no NVIDIA driver) it answers 0 without loading the
 * library, which costs some 150 MiB of resident memory even where it finds no GPU. */
int zr_device_cuda_available(void);

#ifdef __cplusplus
}
#endif
#endif
