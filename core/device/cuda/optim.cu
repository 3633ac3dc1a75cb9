/*
 * optim.cu: AdamW, the sum of squares and y += x on device arrays, with the CPU's bits
 * (core/model/optim.c).
 *
 * AdamW is elementwise; every operation is spelled with an IEEE round-to-nearest intrinsic
 * (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn), which nvcc never contracts into an FMA, in
 * the CPU's order, and the constants that the CPU computes once (1 - beta, the bias
 * corrections through pow in double) are computed here on the host by the same expressions.
 * So an element gets the bits zr_adamw_update gives it (tests/gpu/kernels.c checks).
 *
 * The sum of squares uses zr_sumsq's definition: blocks of 16384 elements from the start of the
 * range; within a block eight double partial sums over i mod 8 (the tail of a block that is
 * not a multiple of 8 goes into sum 0 after its main loop), combined
 * ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)); the block sums added in block order from
 * 0.0. A float squared is exact in double, so an FMA changes nothing. Eight threads compute a
 * block, one per partial sum; one thread adds the block sums.
 */
#include "zrcuda.h"

#include <math.h>

#define SUMSQ_BLOCK ((size_t)16384) /* core/model/optim.c's */

namespace {

struct adamw_k {
    float b1, b2, omb1, omb2, eps, wd, c1, c2, lr, scale;
};

__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n, adamw_k a)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float pi = p[i];
        float gi = __fmul_rn(g[i], a.scale);
        float mi = __fadd_rn(__fmul_rn(a.b1, m[i]), __fmul_rn(a.omb1, gi));
        float vi = __fadd_rn(__fmul_rn(a.b2, v[i]), __fmul_rn(__fmul_rn(a.omb2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        float mhat = __fdiv_rn(mi, a.c1), vhat = __fdiv_rn(vi, a.c2);
        float upd = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), a.eps)),
                              __fmul_rn(a.wd, pi));
        p[i] = __fsub_rn(pi, __fmul_rn(a.lr, upd));
    }
}

/* 256 threads: 32 blocks of the range, 8 threads (partial sums) each */
__global__ void k_sumsq_blocks(double *sums, const float *x, size_t n, size_t nb)
{
    __shared__ double sh[32][8];
    unsigned sub = threadIdx.x >> 3, k = threadIdx.x & 7;
    size_t b = (size_t)blockIdx.x * 32 + sub;
    if (b < nb) {
        size_t i0 = b * SUMSQ_BLOCK, len = n - i0 < SUMSQ_BLOCK ? n - i0 : SUMSQ_BLOCK;
        size_t n8 = len & ~(size_t)7;
        const float *a = x + i0;
        double s = 0.0;
#pragma unroll 8
        for (size_t i = k; i < n8; i += 8)
            s += (double)a[i] * (double)a[i];
        if (k == 0)
            for (size_t i = n8; i < len; i++)
                s += (double)a[i] * (double)a[i];
        sh[sub][k] = s;
    }
    __syncthreads();
    if (b < nb && k == 0) {
        const double *s = sh[sub];
        sums[b] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
}

/* y += x, elementwise (one rounding per element: nothing to contract) */
__global__ void k_add(float *y, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void k_sumsq_total(double *out, const double *sums, size_t nb)
{
    double total = 0.0;
    for (size_t b = 0; b < nb; b++)
        total += sums[b];
    out[0] = total;
}

} /* namespace */

int zrc_adamw(float *param, const float *grad, float *m, float *v, size_t n, uint64_t t,
              float lr, float grad_scale, int decay, const zr_adamw_hp *hp, zr_dev_stream *s)
{
    if (t < 1 || !hp)
        return zrc_err(ZR_EINVAL, "cuda: adamw: step %llu (expected >= 1)", (unsigned long long)t);
    ZRC_TRY(zrc_ensure_device());
    if (!n)
        return 0;
    adamw_k a;
    a.b1 = hp->beta1;
    a.b2 = hp->beta2;
    a.omb1 = 1.0f - hp->beta1; /* as the CPU loop computes them, in float */
    a.omb2 = 1.0f - hp->beta2;
    a.eps = hp->eps;
    a.wd = decay ? hp->weight_decay : 0.0f;
    a.c1 = (float)(1.0 - pow((double)hp->beta1, (double)t));
    a.c2 = (float)(1.0 - pow((double)hp->beta2, (double)t));
    a.lr = lr;
    a.scale = grad_scale;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    cudaStream_t st = (cudaStream_t)s;
    k_adamw<<<(unsigned)blocks, 256, 0, st>>>(param, grad, m, v, n, a);
    ZRC_LAUNCHED("adamw");
    if (!s)
        ZRC_CU(cudaStreamSynchronize(0), "adamw");
    return 0;
}

int zrc_add(float *y, const float *x, size_t n, zr_dev_stream *s)
{
    ZRC_TRY(zrc_ensure_device());
    if (!n)
        return 0;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    cudaStream_t st = (cudaStream_t)s;
    k_add<<<(unsigned)blocks, 256, 0, st>>>(y, x, n);
    ZRC_LAUNCHED("add");
    if (!s)
        ZRC_CU(cudaStreamSynchronize(0), "add");
    return 0;
}

int zrc_sumsq(const float *x, size_t n, double *out, zr_dev_stream *s)
{
    *out = 0.0;
    ZRC_TRY(zrc_ensure_device());
    if (!n)
        return 0;
    cudaStream_t st = (cudaStream_t)s;
    size_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double *sums = NULL;
    ZRC_CU(cudaMallocAsync((void **)&sums, (nb + 1) * sizeof(double), st), "sumsq scratch");
    k_sumsq_blocks<<<(unsigned)((nb + 31) / 32), 256, 0, st>>>(sums, x, n, nb);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        k_sumsq_total<<<1, 1, 0, st>>>(sums + nb, sums, nb);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(out, sums + nb, sizeof(double), cudaMemcpyDeviceToHost, st);
    cudaFreeAsync(sums, st);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(st);
    if (e != cudaSuccess)
        return zrc_cuda_err(e, "sum of squares");
    return 0;
}
