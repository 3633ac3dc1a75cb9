/*
 * zero_int.h: what the two ZeRO engines share, private to core/zero. zero.h's handle is a
 * zr_zero: the common part below, first member of each engine's own struct (zero.c: the host
 * engine, zero_dev.c: the device engine), with the operations table the engine was created
 * with. zero.h's functions (zero_common.c) dispatch through that table once chosen by
 * zr_zero_new, or work on the common part (ranges, the gather schedule, swap regions, sums of
 * squares); neither engine calls a function of the other.
 */
#ifndef ZR_ZERO_INT_H
#define ZR_ZERO_INT_H

#include "device.h"
#include "zero.h"

#define ZR_ZERO_GRAIN 1024u /* floats: 4 KiB, the swap files' alignment */

static inline uint64_t zr__zero_grain_up(uint64_t floats)
{
    return (floats + ZR_ZERO_GRAIN - 1) / ZR_ZERO_GRAIN * ZR_ZERO_GRAIN;
}

/* A group's partition: numel, P (elements per rank), full = W P, this rank's [lo, lo+n),
 * offsets in the full and the own arenas, and big (larger than an ordinary buffer, which holds
 * the largest group past the embeddings). */
typedef struct {
    uint64_t numel, P, full, lo, n, foff, ooff;
    int big;
} zr_zpart;

/* One fetch of the stage-3 schedule: group g, the engine's gather buffer once issued (NULL:
 * not yet), and the host engine's ticket for it on its comm thread. */
typedef struct {
    size_t g;
    void *buf;
    uint64_t seq;
} zr_zentry;

typedef struct zr_zero_ops zr_zero_ops;

struct zr_zero {
    const zr_zero_ops *ops;
    zr_comm *comm;
    const zck_layout *L;
    int rank, W, stage;
    unsigned prefetch;
    size_t ng;
    zr_zpart *G;                    /* ng partitions */
    uint64_t sum_full, sum_P, slot; /* slot: elements of an ordinary gather/grad buffer */
    /* the states, in the engine's memory (host, or device; a device engine's moments and
     * stage-3 partitions may be pinned host memory): whole groups of W P_g (full*), the own
     * partitions of P_g (own*), the moments of the opt ranges; NULL where not held */
    float *fullp, *fullg, *ownp, *owng, *m, *v;
    /* NVMe: exp_avg region then exp_avg_sq region (oreg floats each) in osw, group g's opt
     * range at float soff[g] of a region; the stage-3 partitions in psw at poff[g]; both read
     * and written through windows of `chunk` floats */
    zck_swap *osw, *psw;
    uint64_t *soff, *poff, oreg;
    size_t chunk;
    float *xbuf; /* host memory, 4 KiB aligned: staging, two chunks at least */
    /* stage 3: the gathers in order (zr_zero_attach), the next to lend, the next to issue */
    zr_zentry *sched;
    size_t n_sched, cursor, issued;
    /* the model's fetch orders (zr_zero_attach) and micro-batches per step, from which the
     * schedule is rebuilt: a step's (n_micro forwards and backwards), or an evaluation's
     * (forwards only, zr_zero_begin_eval; eval says the schedule is one) */
    size_t *order, nf, nb;
    unsigned n_micro;
    int eval;
};

/* An engine: zero.h's functions less those the common part answers. */
struct zr_zero_ops {
    void (*free)(zr_zero *z);
    void (*hooks)(zr_zero *z, zr_model_hooks *h);
    /* the model (m on the host, dm on a device: its stream): its forward and backward fetch
     * orders into fwd and bwd (room for ng + 4 each) */
    int (*attach)(zr_zero *z, const zr_model *m, zr_dev_model *dm, size_t *fwd, size_t *nf,
                  size_t *bwd, size_t *nb);
    int (*init_params)(zr_zero *z, zr_zero_fill_fn fill, void *ctx);
    int (*load)(zr_zero *z, zck_reader *rd, int verify, unsigned jobs);
    /* a save: the states as the last enqueued step left them (NULL: nothing to wait for),
     * then n floats of state s from the engine's memory at src to the sink */
    int (*save_begin)(zr_zero *z);
    int (*sink_state)(zr_zero *z, int s, const float *src, uint64_t n, const zr_zero_sink *w);
    int (*adamw)(zr_zero *z, uint64_t t, float lr, float clip, const zr_adamw_hp *hp);
    int (*begin_step)(zr_zero *z);
    int (*reduce)(zr_zero *z);
    int (*publish)(zr_zero *z);
    int (*gather_f64)(zr_zero *z, const double *mine, size_t n, double *all);
    int (*broadcast)(zr_zero *z, void *buf, size_t bytes, int root);
    void (*mem)(const zr_zero *z, zr_zero_bytes *out);
    /* one range's sum of squares (zr_sumsq's bits), for zr_zero_sumsq */
    int (*sumsq_range)(zr_zero *z, const float *x, size_t n, double *out);
    /* stage 3: a free gather buffer for group g (NULL: none now), and its gather issued into
     * e->buf (the host engine: the caller holds its mutex) */
    void *(*gather_buf)(zr_zero *z, size_t g);
    int (*gather)(zr_zero *z, zr_zentry *e);
};

/* The engines' constructors (zero.c, zero_dev.c), for zr_zero_new. */
int zr__zero_host_new(zr_zero **out, zr_comm *comm, const zck_layout *L, const zr_zero_opts *o);
int zr__zero_dev_new(zr_zero **out, zr_comm *comm, const zck_layout *L, const zr_zero_opts *o,
                     const zr_device_ops *ops, zr_dev_comm *dc);

/* The common part for rank of W (stage, prefetch, the partitions); zr__zero_base_free frees
 * what it and the schedule and swap regions hold (not the swap files). */
int zr__zero_base_init(zr_zero *z, const zr_zero_ops *ops, const zck_layout *L, int W,
                       int rank, const zr_zero_opts *o);
void zr__zero_base_free(zr_zero *z);
/* The groups of L cut for rank of W into *out (ng of them, caller frees), with the sums of
 * full and P and the ordinary buffer size. */
int zr__zero_parts(const zck_layout *L, int W, int rank, zr_zpart **out, uint64_t *sum_full,
                   uint64_t *sum_P, uint64_t *slot);
/* The swap regions' offsets: soff (each group's opt range) and oreg, or poff (each group's
 * partition), every range from a 4 KiB boundary. */
int zr__zero_opt_region(zr_zero *z);
int zr__zero_param_region(zr_zero *z);
/* swap_dir/name as a swap file of `floats` floats (the engine's depth and chunk). */
int zr__zero_swap_open(zck_swap **out, const char *swap_dir, const char *name, uint64_t floats,
                       unsigned depth, size_t chunk_floats);
/* Element `lo` of group g's opt range of state s (0 param, 1 exp_avg, 2 exp_avg_sq, 3 grad);
 * NULL for a state in a swap file. At stage 0 the part range lies inside, at offset part_lo. */
float *zr__zero_state(const zr_zero *z, size_t g, int s);
/* Where state s (0 param, 1 exp_avg, 2 exp_avg_sq) of group g lives in a swap file: the file
 * and the float offset of the opt range's first element; NULL when it is not in one. */
zck_swap *zr__zero_swap_of(const zr_zero *z, size_t g, int s, uint64_t *off);
/* The swap options (directory, request size, queue depth) when offload to NVMe is asked. */
int zr__zero_check_swap_opts(const zr_zero_opts *o);
/* The checkpoint's state indices of param, exp_avg and exp_avg_sq into st[3]. */
int zr__zero_find_states(zck_reader *rd, size_t st[3]);

/* What lives in swap files read from a checkpoint (states st[3]), chunk by chunk, checkpoint
 * -> staging -> swap file. */
int zr__zero_load_swaps(zr_zero *z, zck_reader *rd, const size_t st[3]);

/* Stage 3: the schedule's gathers issued in order up to position upto while buffers allow
 * (the entry at the cursor always is: the model holds at most two groups); the check that
 * the model asks for group g next, its gather issued (the entry: *out). */
int zr__zero_issue_more(zr_zero *z, size_t upto);
int zr__zero_fetch(zr_zero *z, size_t g, zr_zentry **out);
/* The schedule back to its start and the first `prefetch` gathers issued. */
int zr__zero_sched_start(zr_zero *z);

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
int zr__zero_chunks(const zr_zero *z, uint64_t chunk, zr_zchunk **out, size_t *n);
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

#endif
