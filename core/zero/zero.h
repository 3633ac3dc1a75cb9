/*
 * zero.h: core-internal ZeRO stage logic (not part of zr.h): where a rank keeps the model's
 * parameters, gradients and AdamW states at each stage, and the collectives that move them.
 *
 * Every group g of the layout is cut by the checkpoint's partition rule (zck_partition with
 * ZR_ZERO_ALIGN): P_g elements per rank, rank r owns [r P_g, min((r+1) P_g, numel_g)). Full
 * buffers of a group hold W P_g elements (the tail past numel_g is zero padding), so that
 * reduce-scatter and all-gather work in place on whole groups.
 *
 *   stage 0  params, grads and AdamW states whole on every rank; grads all-reduced; every rank
 *            updates everything (the same bits everywhere).
 *   stage 1  params and grads whole; grads reduce-scattered per group after the backward; each
 *            rank updates its partition (states only for it), then params are all-gathered.
 *   stage 2  as 1, but the model adds each group's gradient into a lent buffer that is
 *            reduce-scattered (on the comm thread) as soon as the group's backward is done; a
 *            rank keeps only its partition of the gradients.
 *   stage 3  as 2, and params exist only as partitions: a group is all-gathered into a lent
 *            buffer just before the model reads it and released after, the next `prefetch`
 *            gathers of the schedule (zr_model_fetch_order) in flight on the comm thread.
 *
 * The host engine runs all collectives on one comm thread, the device engine on the
 * communicator's stream, in the order they are issued, so every rank issues the same
 * sequence. Reductions sum in rank order (comm.h), so at one world size stages 0 and 1 give the
 * same bits, and 2 and 3 too (and all four with one micro-batch per step).
 */
#ifndef ZR_ZERO_H
#define ZR_ZERO_H

#include "comm.h"
#include "device.h"
#include "model.h"

#define ZR_ZERO_ALIGN 64 /* partition granule, elements (the checkpoints' too) */

typedef struct zr_zero zr_zero;

typedef struct {
    int stage;         /* 0..3 */
    unsigned prefetch; /* stage 3: gathers in flight ahead of use (0: none) */
    /* Where the optimizer's moments, and at stage 3 the parameter partitions, live (model.h's
     * ZR_OFFLOAD_*): NONE with the engine (host memory, device memory), CPU in pinned host
     * memory with AdamW on the CPU (a device engine; the host engine keeps everything in host
     * memory already: CPU is NONE there), NVME in swap files in swap_dir (zck_swap,
     * ZeRO-Infinity), streamed in chunks of aio_block bytes through `buffers` staging sets,
     * aio_depth requests in flight. */
    zr_offload offload_optimizer, offload_params;
    const char *swap_dir;
    unsigned aio_depth, buffers;
    size_t aio_block;
    /* stage 2-3 on the host engine: the ordinary gather and gradient buffers hold at most this
     * many parameters together (0: a quarter of the rank's own partition's, so that they stay
     * below a sixteenth of its model states); never fewer than two gather buffers and two
     * gradient buffers (the model holds two groups at most), never more than prefetch + 2 and
     * 3. The groups larger than an ordinary buffer (the embeddings) take their gradients in
     * pieces of a gradient buffer (zr_model_hooks) and, at stage 3, keep a gather buffer of
     * their own. */
    uint64_t live_params;
} zr_zero_opts;
#define ZR_ZERO_OPTS_INIT {0, 2, ZR_OFFLOAD_NONE, ZR_OFFLOAD_NONE, NULL, 8, 4, (size_t)1 << 20, 0}

/*
 * Storage for the groups of L (its "param" state's sizes) on comm's rank: on the host (dev
 * NULL: zero.c), or on a device (zero_dev.c): params, grads and moments in device memory,
 * collectives through dc (the device communicator, NCCL) or, with dc NULL and W > 1, staged
 * through pinned host memory over comm (ranks sharing a GPU). A device engine's hooks lend
 * device pointers under the stream contract of device.h; its zr_zero_load must be called
 * without verify (the caller verifies first); its zr_zero_mem reports device bytes, pinned
 * host bytes in `pinned`. The engine is chosen here once; every function below works on
 * both.
 */
int zr_zero_new(zr_zero **out, zr_comm *comm, const zck_layout *L, const zr_zero_opts *o,
                const zr_device_ops *dev, zr_dev_comm *dc);
void zr_zero_free(zr_zero *z);
/* The hooks the model is created with (zr_model_new_ext, or the device's model_new). */
void zr_zero_hooks(zr_zero *z, zr_model_hooks *h);
/* The model, once created (m on the host, dm on a device: the engine works on its stream):
 * the stage-3 schedule follows its fetch order, for n_micro forward/backward pairs per step.
 * ZR_ENOMEM. */
int zr_zero_attach(zr_zero *z, const zr_model *m, zr_dev_model *dm, unsigned n_micro);

/* What this rank updates and checkpoints of group g, in the group's element index:
 * opt [lo, lo+n): the range it steps (stage 0: the whole group; else its partition);
 * part [lo, lo+n): its partition (written to checkpoints; may be empty). */
void zr_zero_opt_range(const zr_zero *z, size_t g, uint64_t *lo, uint64_t *n);
void zr_zero_part_range(const zr_zero *z, size_t g, uint64_t *lo, uint64_t *n);
/* Fill this rank's parameters (whole groups at stages 0-2, its partitions at 3) with
 * fill(ctx, g, off, n, dst): elements [off, off+n) of group g into dst. */
typedef void (*zr_zero_fill_fn)(void *ctx, size_t g, uint64_t off, uint64_t n, float *dst);
int zr_zero_init_params(zr_zero *z, zr_zero_fill_fn fill, void *ctx);
/* Read this rank's states from a checkpoint (layout checked by the caller): params (whole or
 * its partitions), exp_avg and exp_avg_sq of its opt ranges. With verify, every file the read
 * touches is hashed in the same pass (one rank, nothing offloaded); without, the caller has
 * verified the checkpoint. */
int zr_zero_load(zr_zero *z, zck_reader *rd, int verify, unsigned jobs);
/* Write this rank's partition of param, exp_avg, exp_avg_sq of every group (states 0, 1, 2 of
 * the writer's layout), from memory or straight from the swap files. */
int zr_zero_save(zr_zero *z, zck_writer *w);
/* The same extents to any sink: begin(g, state, start, count), then the count floats' bytes in
 * one or more writes; zr_zero_part_floats is their total (floats, all groups and states). */
typedef struct {
    void *ctx;
    int (*begin)(void *ctx, size_t g, size_t state, uint64_t start, uint64_t count);
    int (*write)(void *ctx, const void *data, size_t bytes);
} zr_zero_sink;
int zr_zero_save_to(zr_zero *z, const zr_zero_sink *sink);
uint64_t zr_zero_part_floats(const zr_zero *z);
/* 1 when zr_zero_save_to hands its sink pointers into the live state arrays (the host engine
 * with nothing in swap files): they stay valid, and unchanged until the next zr_zero_adamw
 * (forward, backward, reduce and sumsq read them only). */
int zr_zero_live_saves(const zr_zero *z);
/* AdamW on this rank's opt ranges (zr_adamw_update per tensor part; decay on tensors of two
 * or more dimensions), gradients scaled by clip, 1-based step t; offloaded states stream
 * through the staging sets, reads ahead and write-backs overlapping the update. */
int zr_zero_adamw(zr_zero *z, uint64_t t, float lr, float clip, const zr_adamw_hp *hp);
/* Swap files still whole (zck_swap_check); a no-op without offload. */
int zr_zero_check_swap(zr_zero *z);
int zr_zero_offloaded(const zr_zero *z);

/* Step protocol: begin (zero the gradients, reset the schedule), the micro-batches' forward
 * and backward through the hooks, reduce (gradients complete and summed over ranks in this
 * rank's opt range), sumsq (the global squared norm, the same bits on every rank), the
 * caller's AdamW on the opt ranges, then publish (all-gather updated params at stages 1-2). */
int zr_zero_begin_step(zr_zero *z);
/* Forward passes only (an evaluation, between steps): as begin_step (the gradients, which no
 * step needs any more, zeroed), with stage 3's gather schedule n_forwards forward fetch orders;
 * every rank the same n_forwards. The next begin_step restores the step's schedule. */
int zr_zero_begin_eval(zr_zero *z, unsigned n_forwards);
int zr_zero_reduce(zr_zero *z);
int zr_zero_sumsq(zr_zero *z, double *out);
int zr_zero_publish(zr_zero *z);
/* Every rank's n doubles, in rank order, into all[W n] (agreement on loss, stop, verdicts). */
int zr_zero_gather_f64(zr_zero *z, const double *mine, size_t n, double *all);
/* Rank root's bytes to everyone (through the comm thread, ordered with the rest). */
int zr_zero_broadcast(zr_zero *z, void *buf, size_t bytes, int root);

/* Bytes this rank holds, by category: model states (params, grads, optimizer) and bounded
 * buffers (gather / bucket slots). */
typedef struct {
    uint64_t params, grads, optimizer, buffers; /* host memory (a device engine: device) */
    uint64_t nvme;                              /* in swap files */
    uint64_t pinned;                            /* a device engine: pinned host memory */
    uint64_t swap_staging; /* of buffers: the NVMe staging sets (zr_zero_plan only) */
    uint64_t part;         /* this rank's partitions of the three states (a shard's data) */
} zr_zero_bytes;
void zr_zero_mem(const zr_zero *z, zr_zero_bytes *out);
/* The same figures computed without allocating (zrun --dry-run). */
int zr_zero_plan(zr_zero_bytes *out, const zck_layout *L, int world, int rank,
                 const zr_zero_opts *o);

#endif
