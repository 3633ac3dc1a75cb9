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
