/*
 * optim.c: the optimizer arithmetic of the engine (zr.h, "optimizer"): the AdamW update of a
 * flat range of parameters, the sum of squares behind the global gradient norm, and the
 * learning-rate schedule (linear warmup, then cosine decay to lr * min_ratio).
 *
 * The loops are branch-free over restrict pointers so the compiler can vectorize them (GCC
 * wants -fno-math-errno for AdamW's sqrtf, and -O3 or a cheaper cost model than -O2's for any
 * loop of unknown trip count). Both passes run on the par_for threads (par.h, sized by
 * zr_set_threads), and neither's bits depend on the thread count:
 *   - the update is elementwise, so an element's result does not depend on how the range is
 *     split: threads take contiguous pieces, and a ZeRO rank updating its partition computes
 *     the same bits as one process updating everything (given no FMA contraction, which GCC's
 *     -std=c11 keeps off);
 *   - the sum of squares is defined over fixed blocks of SUMSQ_BLOCK elements: each block is
 *     summed in double (eight partial sums, combined pairwise), and the block sums are added
 *     in block order, whichever thread computed them.
 */
#include "model.h"
#include "fastmath.h"
#include "par.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#define ADAMW_GRAIN ((size_t)32768) /* elements per thread at least: 512 KiB of the 4 arrays */

typedef struct {
    float *p, *m, *v;
    const float *g;
    float b1, b2, eps, wd, c1, c2, lr, scale;
} adamw_args;

ZR_VEC_CLONES static void adamw_range(void *ctx, size_t i0, size_t i1)
{
    const adamw_args *a = ctx;
    float *restrict p = a->p;
    const float *restrict g = a->g;
    float *restrict mm = a->m;
    float *restrict vv = a->v;
    const float b1 = a->b1, b2 = a->b2, eps = a->eps, wd = a->wd, c1 = a->c1, c2 = a->c2;
    const float lr = a->lr, grad_scale = a->scale;
    for (size_t i = i0; i < i1; i++) {
        float gi = g[i] * grad_scale;
        float mi = b1 * mm[i] + (1.0f - b1) * gi;
        float vi = b2 * vv[i] + (1.0f - b2) * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        float mhat = mi / c1, vhat = vi / c2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
}

void zr_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, uint64_t t,
                     float lr, float grad_scale, int decay, const zr_adamw_hp *hp)
{
    assert(t >= 1 && hp);
    adamw_args a = {param, m, v, grad, hp->beta1, hp->beta2, hp->eps,
                    /* decay 0 adds wd * param = 0 * param, which leaves every finite param's
                     * update unchanged and keeps the loop free of a branch */
                    decay ? hp->weight_decay : 0.0f,
                    /* bias corrections 1 - beta^t, in double: powf loses digits for large t */
                    (float)(1.0 - pow((double)hp->beta1, (double)t)),
                    (float)(1.0 - pow((double)hp->beta2, (double)t)), lr, grad_scale};
    par_for(n, ADAMW_GRAIN, adamw_range, &a);
}

#define SUMSQ_BLOCK ((size_t)16384) /* elements per block sum (64 KiB) */
#define SUMSQ_BATCH ((size_t)1024)  /* block sums per par_for region (16M elements) */

/* the sum of squares of one block, in double: eight independent partial sums the compiler may
 * vectorize without reassociating (a float squared is exact in double, so only the additions
 * round) */
ZR_VEC_CLONES static double sumsq_block(const float *restrict a, size_t n)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t k = 0; k < 8; k++)
            s[k] += (double)a[i + k] * (double)a[i + k];
    for (; i < n; i++)
        s[0] += (double)a[i] * (double)a[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* The sums of SUMSQ_MANY whole consecutive blocks at x, each exactly as sumsq_block sums it:
 * one loop runs their 4 x 8 partial sums side by side, so that the latency of the additions
 * (each partial sum is a chain of dependent adds) no longer bounds it; one block at a time ran
 * at a third of the memory's rate. */
#define SUMSQ_MANY 4
typedef float sumsq_v4f __attribute__((vector_size(16)));
typedef double sumsq_v4d __attribute__((vector_size(32)));
ZR_VEC_CLONES static void sumsq_blocks_many(const float *restrict x, double *restrict out)
{
    sumsq_v4d s[SUMSQ_MANY][2] = {{{0}}}; /* block j's partial sums 0-3 and 4-7 */
    for (size_t i = 0; i < SUMSQ_BLOCK; i += 8)
        for (size_t j = 0; j < SUMSQ_MANY; j++) {
            sumsq_v4f lo, hi;
            memcpy(&lo, x + j * SUMSQ_BLOCK + i, sizeof lo);
            memcpy(&hi, x + j * SUMSQ_BLOCK + i + 4, sizeof hi);
            sumsq_v4d dlo = __builtin_convertvector(lo, sumsq_v4d);
            sumsq_v4d dhi = __builtin_convertvector(hi, sumsq_v4d);
            s[j][0] += dlo * dlo;
            s[j][1] += dhi * dhi;
        }
    for (size_t j = 0; j < SUMSQ_MANY; j++)
        out[j] = ((s[j][0][0] + s[j][0][1]) + (s[j][0][2] + s[j][0][3])) +
                 ((s[j][1][0] + s[j][1][1]) + (s[j][1][2] + s[j][1][3]));
}

typedef struct {
    const float *x; /* the batch's first block */
    size_t n;       /* elements from x to the end of the whole range */
    double *sums;   /* one per block of the batch */
} sumsq_args;

static void sumsq_blocks(void *ctx, size_t b0, size_t b1)
{
    const sumsq_args *a = ctx;
    size_t b = b0;
    for (; b + SUMSQ_MANY <= b1 && (b + SUMSQ_MANY) * SUMSQ_BLOCK <= a->n; b += SUMSQ_MANY)
        sumsq_blocks_many(a->x + b * SUMSQ_BLOCK, a->sums + b);
    for (; b < b1; b++) {
        size_t i = b * SUMSQ_BLOCK;
        a->sums[b] = sumsq_block(a->x + i, a->n - i < SUMSQ_BLOCK ? a->n - i : SUMSQ_BLOCK);
    }
}

double zr_sumsq(const float *x, size_t n)
{
    double sums[SUMSQ_BATCH], total = 0.0;
    size_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    for (size_t b0 = 0; b0 < nb; b0 += SUMSQ_BATCH) {
        size_t cnt = nb - b0 < SUMSQ_BATCH ? nb - b0 : SUMSQ_BATCH;
        sumsq_args a = {x + b0 * SUMSQ_BLOCK, n - b0 * SUMSQ_BLOCK, sums};
        par_for(cnt, 2, sumsq_blocks, &a); /* two blocks per thread at least */
        for (size_t b = 0; b < cnt; b++) /* in block order, whatever the split */
            total += sums[b];
    }
    return total;
}

float zr_lr_at(uint64_t step, uint64_t warmup, uint64_t total, float lr, float min_ratio)
{
    if (step < warmup)
        return (float)((double)lr * (double)(step + 1) / (double)warmup);
    double lo = (double)lr * (double)min_ratio;
    /* the end of the decay is step total - 1; at it and after, the floor */
    if (step + 1 >= total)
        return (float)lo;
    /* here warmup <= step < total - 1, so the decay span is at least one step */
    double frac = (double)(step - warmup) / (double)(total - 1 - warmup);
    /* 1 at the peak, 0 at the end */
    double coeff = 0.5 * (1.0 + cos(3.14159265358979323846 * frac));
    return (float)(lo + coeff * ((double)lr - lo));
}
