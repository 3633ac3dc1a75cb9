/*
 * optim.c: the optimizer arithmetic of the engine (zr.h, "optimizer"): the AdamW update of a
 * flat range of parameters, the sum of squares behind the global gradient norm, and the
 * learning-rate schedule (linear warmup, then cosine decay to lr * min_ratio).
 *
 * The loops are branch-free over restrict pointers so the compiler can vectorize them (GCC
 * wants -fno-math-errno for AdamW's sqrtf, and -O3 or a cheaper cost model than -O2's for any
 * loop of unknown trip count). The update is elementwise, so an element's result does not
 * depend on how the range is split: a ZeRO rank updating its partition computes the same bits
 * as one process updating everything (given no FMA contraction, which GCC's -std=c11 keeps off).
 */
#include "zr.h"

#include <assert.h>
#include <math.h>

void zr_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, uint64_t t,
                     float lr, float grad_scale, int decay, const zr_adamw_hp *hp)
{
    assert(t >= 1 && hp);
    float *restrict p = param;
    const float *restrict g = grad;
    float *restrict mm = m;
    float *restrict vv = v;
    const float b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
    /* decay 0 adds wd * param = 0 * param, which leaves every finite param's update unchanged
     * and keeps the loop free of a branch */
    const float wd = decay ? hp->weight_decay : 0.0f;
    /* bias corrections 1 - beta^t, in double: powf loses digits for large t */
    const float c1 = (float)(1.0 - pow((double)b1, (double)t));
    const float c2 = (float)(1.0 - pow((double)b2, (double)t));
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float mi = b1 * mm[i] + (1.0f - b1) * gi;
        float vi = b2 * vv[i] + (1.0f - b2) * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        float mhat = mi / c1, vhat = vi / c2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
}

double zr_sumsq(const float *x, size_t n)
{
    const float *restrict a = x;
    /* eight independent partial sums: the compiler may vectorize them without reassociating
     * (a float squared is exact in double, so only the additions round) */
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t k = 0; k < 8; k++)
            s[k] += (double)a[i + k] * (double)a[i + k];
    for (; i < n; i++)
        s[0] += (double)a[i] * (double)a[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
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
