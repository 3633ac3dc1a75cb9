/*
 * zero_dev.h: the ZeRO stages on a device (device.h), private to the zero module: zero.c's
 * public functions hand a device zr_zero to these (zr_zero_new_device). Same partitions, the
 * same stages and the same checkpoint extents as the host engine; the states live in device
 * memory and move by the device's copies and collectives:
 *
 *   - collectives through the device communicator (NCCL: asynchronous on its own stream,
 *     ordered against the model's stream by events) or, when ranks share a GPU or no device
 *     communicator is wanted, staged through pinned host memory over the shm communicator
 *     (synchronous, on the calling thread);
 *   - AdamW on the device (the CPU's bits), or with the optimizer offloaded to pinned host
 *     memory or to NVMe (a swap file, zck_swap), on the CPU (zr_adamw_update) in chunks whose
 *     copies and reads overlap the updates;
 *   - checkpoints and init through pinned staging chunks, device-to-host copies of the next
 *     chunk overlapping the sink's write of the current one.
 */
#ifndef ZR_ZERO_DEV_H
#define ZR_ZERO_DEV_H

#include "device.h"
#include "zero.h"

/* The arithmetic both engines share (zero.c). A group's partition: numel, P (elements per
 * rank), full = W P, this rank's [lo, lo+n), offsets in the full and the own arenas, and big
 * (larger than an ordinary buffer, which holds the largest group past the embeddings). */
typedef struct {
    uint64_t numel, P, full, lo, n, foff, ooff;
    int big;
} zr_zpart;
/* The groups of L cut for rank of W into *out (ng of them, caller frees), with the sums of
 * full and P and the ordinary buffer size. */
int zr__zero_parts(const zck_layout *L, int W, int rank, zr_zpart **out, uint64_t *sum_full,
                   uint64_t *sum_P, uint64_t *slot);
/* The stage-3 schedule: n_micro times the forward then the backward fetch order, as group
 * indices into *out (*n of them, caller frees). */
int zr__zero_schedule(const size_t *fwd, size_t nf, const size_t *bwd, size_t nb,
                      unsigned n_micro, size_t **out, size_t *n);

/* Elements [a0, a0+cnt) of group g of L cut by its tensors: f(ctx, at, count, decay) for each
 * tensor's part (at relative to a0; decay for tensors of two or more dimensions). */
typedef int (*zr_ztensor_fn)(void *ctx, uint64_t at, uint64_t cnt, int decay);
int zr__zero_tensors(const zck_layout *L, size_t g, uint64_t a0, uint64_t cnt, zr_ztensor_fn f,
                     void *ctx);
/* The optimizer step's chunks: every group's opt range (stage 0: the whole group; else this
 * rank's partition) cut in pieces of at most `chunk` elements, in group order. */
typedef struct {
    size_t g;
    uint64_t off, cnt; /* within the group's opt range */
} zr_zchunk;
int zr__zero_chunks(const zck_layout *L, int W, int rank, int stage, uint64_t chunk,
                    zr_zchunk **out, size_t *n);
/* The sum of squares of rank q's partition of every group, in group order; base[g][i] is
 * element i of group g, sq(ctx, x, n, &out) sums one range (zr_sumsq's bits). */
typedef int (*zr_zsumsq_fn)(void *ctx, const float *x, size_t n, double *out);
int zr__zero_part_sumsq(const zck_layout *L, int W, int q, float *const *base, zr_zsumsq_fn sq,
                        void *ctx, double *out);
/* A swap file through two staging windows of `win` floats (stage[2 win], 4 KiB aligned; win
 * a multiple of 1024): floats [at, at+n) (at on a 4 KiB boundary) filled with produce(ctx,
 * off, cnt, buf) window by window, each written while the next is produced; and floats
 * [first, first+n) to a sink, the next window read while the sink takes the current one. */
typedef int (*zr_zproduce_fn)(void *ctx, uint64_t off, uint64_t cnt, float *dst);
/* Producers for both: a range of init values (fill(ctx, g, lo + off, cnt, dst)), a range of a
 * checkpoint's state (zck_reader_read_range of st, elements lo + off ...). */
typedef struct {
    zr_zero_fill_fn fill;
    void *ctx;
    size_t g;
    uint64_t lo;
} zr_zfill;
int zr__zero_produce_fill(void *ctx, uint64_t off, uint64_t cnt, float *dst);
typedef struct {
    zck_reader *rd;
    size_t g, st;
    uint64_t lo;
} zr_zread;
int zr__zero_produce_read(void *ctx, uint64_t off, uint64_t cnt, float *dst);
int zr__zero_swap_fill(zck_swap *sw, float *stage, uint64_t win, uint64_t at, uint64_t n,
                       zr_zproduce_fn produce, void *ctx);
int zr__zero_swap_to_sink(zck_swap *sw, float *stage, uint64_t win, uint64_t first, uint64_t n,
                          const zr_zero_sink *w);
/* The swap options (directory, request size, queue depth) when offload to NVMe is asked. */
int zr__zero_check_swap_opts(const zr_zero_opts *o);

typedef struct zr_zdev zr_zdev;

int zd_new(zr_zdev **out, zr_comm *comm, const zck_layout *L, const zr_zero_opts *o,
           const zr_device_ops *ops, zr_dev_comm *dc);
void zd_free(zr_zdev *d);
void zd_hooks(zr_zdev *d, zr_model_hooks *h);
int zd_attach(zr_zdev *d, zr_dev_model *m, unsigned n_micro);
void zd_part_range(const zr_zdev *d, size_t g, uint64_t *lo, uint64_t *n);
void zd_opt_range(const zr_zdev *d, size_t g, uint64_t *lo, uint64_t *n);
int zd_init_params(zr_zdev *d, zr_zero_fill_fn fill, void *ctx);
int zd_load(zr_zdev *d, zck_reader *rd);
int zd_save_to(zr_zdev *d, const zr_zero_sink *sink);
uint64_t zd_part_floats(const zr_zdev *d);
int zd_begin_step(zr_zdev *d);
int zd_reduce(zr_zdev *d);
int zd_sumsq(zr_zdev *d, double *out);
int zd_adamw(zr_zdev *d, uint64_t t, float lr, float clip, const zr_adamw_hp *hp);
int zd_publish(zr_zdev *d);
void zd_mem(const zr_zdev *d, zr_zero_bytes *out);
int zd_offloaded(const zr_zdev *d);
int zd_check_swap(zr_zdev *d);

#endif
