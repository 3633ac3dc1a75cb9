/*
 * kernels.cu: the model's kernels other than the matmuls: embedding, LayerNorm, bias, GELU,
 * the attention's permutations and causal softmax, the fused softmax + cross-entropy of the
 * head, column sums, casts. fp32 arithmetic throughout; bf16 only where a value is stored for a
 * matmul (round to nearest even, __float2bfloat16).
 *
 * Determinism: no atomics. Every reduction has a fixed shape (warp shuffles in xor order,
 * shared-memory sums in index order, column sums over fixed row chunks added in chunk order),
 * so a kernel's bits depend only on its inputs and sizes, never on timing.
 */
#include "zrcuda.h"

#include <math.h>

namespace {

const unsigned kThreads = 256;
const float kLnEps = 1e-5f;
const float kGeluK = 0.7978845608028654f; /* sqrt(2 / pi) */

unsigned grid_for(size_t n, unsigned threads)
{
    size_t g = (n + threads - 1) / threads;
    if (g > 262144)
        g = 262144; /* the kernels loop over the rest (grid stride) */
    return (unsigned)(g ? g : 1);
}

#define GRID_STRIDE(i, n)                                                                      \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
         i += (size_t)gridDim.x * blockDim.x)

/* The row of this thread's warp in a kernel of one warp per row (launch_rows sizes its grid:
 * kThreads / 32 rows a block). */
__device__ __forceinline__ size_t warp_row()
{
    return (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The block's sum or maximum, on every thread (blockDim.x a multiple of 32, <= 1024). sh: 33
 * floats of shared memory, free again on return. */
__device__ float block_reduce(float v, bool is_max, float *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float x = lane < nw ? sh[lane] : (is_max ? -INFINITY : 0.0f);
        x = is_max ? warp_max(x) : warp_sum(x);
        if (lane == 0)
            sh[32] = x;
    }
    __syncthreads();
    float r = sh[32];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float tof(float x) { return x; }
__device__ __forceinline__ float tof(bf16 x) { return __bfloat162float(x); }

__device__ __forceinline__ float gelu_fwd(float x)
{
    float u = kGeluK * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float gelu_grad(float x)
{
    float th = tanhf(kGeluK * (x + 0.044715f * x * x * x));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluK * (1.0f + 3.0f * 0.044715f * x * x);
}

/* ------------------------------------------------------------ elementwise */

__global__ void k_cast_bf16(bf16 *dst, const float *src, size_t n)
{
    GRID_STRIDE(i, n) dst[i] = __float2bfloat16(src[i]);
}

__global__ void k_to_f32(float *dst, const bf16 *src, size_t n)
{
    GRID_STRIDE(i, n) dst[i] = __bfloat162float(src[i]);
}

__global__ void k_fill(float *dst, float v, size_t n)
{
    GRID_STRIDE(i, n) dst[i] = v;
}

__global__ void k_encoder_forward(float *out, const int32_t *tok, const float *wte,
                                  const float *wpe, size_t N, size_t T, size_t C)
{
    GRID_STRIDE(i, N * C)
    {
        size_t n = i / C, c = i % C;
        float e = wte[(size_t)tok[n] * C + c];
        out[i] = wpe ? e + wpe[(n % T) * C + c] : e; /* no positions: Llama */
    }
}

/* block (u, c-chunk): one thread per channel sums the token's positions in ascending order */
__global__ void k_encoder_backward_wte(float *dwte, const float *dout, const int32_t *pos,
                                       const int32_t *uniq, const int32_t *seg, size_t C)
{
    size_t u = blockIdx.x, c = (size_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float s = 0.0f;
    for (int32_t j = seg[u]; j < seg[u + 1]; j++)
        s += dout[(size_t)pos[j] * C + c];
    dwte[(size_t)uniq[u] * C + c] += s;
}

__global__ void k_encoder_backward_wpe(float *dwpe, const float *dout, size_t B, size_t T,
                                       size_t C)
{
    GRID_STRIDE(i, T * C)
    {
        size_t t = i / C, c = i % C;
        float s = 0.0f;
        for (size_t b = 0; b < B; b++)
            s += dout[(b * T + t) * C + c];
        dwpe[i] += s;
    }
}

/* ------------------------------------------------------------ LayerNorm: a warp per row */

__global__ void k_layernorm_forward(bf16 *out, float *mean, float *rstd, const float *inp,
                                    const float *w, const float *b, size_t N, size_t C)
{
    size_t row = warp_row();
    unsigned lane = threadIdx.x & 31;
    if (row >= N)
        return; /* whole warps: row depends on the warp only */
    const float *x = inp + row * C;
    float s = 0.0f;
    for (size_t c = lane; c < C; c += 32)
        s += x[c];
    float mu = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (size_t c = lane; c < C; c += 32) {
        float d = x[c] - mu;
        v += d * d;
    }
    float var = warp_sum(v) / (float)C; /* biased, as PyTorch and the CPU */
    float r = 1.0f / sqrtf(var + kLnEps);
    bf16 *o = out + row * C;
    for (size_t c = lane; c < C; c += 32)
        o[c] = __float2bfloat16((x[c] - mu) * r * w[c] + b[c]);
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = r;
    }
}

__global__ void k_layernorm_backward_dinp(float *dinp, const float *dout, const float *inp,
                                          const float *mean, const float *rstd, const float *w,
                                          size_t N, size_t C)
{
    size_t row = warp_row();
    unsigned lane = threadIdx.x & 31;
    if (row >= N)
        return;
    const float *x = inp + row * C, *d = dout + row * C;
    float mu = mean[row], r = rstd[row];
    float a1 = 0.0f, a2 = 0.0f;
    for (size_t c = lane; c < C; c += 32) {
        float norm = (x[c] - mu) * r, dn = w[c] * d[c];
        a1 += dn;
        a2 += dn * norm;
    }
    a1 = warp_sum(a1) / (float)C;
    a2 = warp_sum(a2) / (float)C;
    float *dx = dinp + row * C;
    for (size_t c = lane; c < C; c += 32) {
        float norm = (x[c] - mu) * r, dn = w[c] * d[c];
        dx[c] += (dn - a1 - norm * a2) * r;
    }
}

/* ------------------------------------------------------------ column sums */

/* Row chunks of a column sum: R depends on N only, so the bits do too. */
size_t row_chunks(size_t N)
{
    size_t R = (N + 255) / 256;
    return R < 1 ? 1 : R > 64 ? 64 : R;
}

/* block (32 columns, chunk r), threads (32, 8): thread (tx, ty) sums f(n, c) over rows n0+ty,
 * n0+ty+8, ... of column c; the 8 partial sums are added in ty order */
template <typename F>
__global__ void k_colsum_partial(float *partial, F f, size_t N, size_t OC, size_t R)
{
    __shared__ float sh[8][33];
    unsigned tx = threadIdx.x, ty = threadIdx.y;
    size_t c = (size_t)blockIdx.x * 32 + tx, r = blockIdx.y;
    size_t n0 = N * r / R, n1 = N * (r + 1) / R;
    float acc = 0.0f;
    if (c < OC)
        for (size_t n = n0 + ty; n < n1; n += 8)
            acc += f(n, c);
    sh[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < OC) {
        float s = sh[0][tx];
        for (int k = 1; k < 8; k++)
            s += sh[k][tx];
        partial[r * OC + c] = s;
    }
}

/* the summands: a matrix's elements (bias gradients), the RMSNorm's d x r (its dw) */
template <typename T> struct elem_of {
    const T *x;
    size_t OC;
    __device__ float operator()(size_t n, size_t c) const { return tof(x[n * OC + c]); }
};
struct rms_dw_of {
    const float *d, *x, *r;
    size_t C;
    __device__ float operator()(size_t n, size_t c) const
    {
        return d[n * C + c] * x[n * C + c] * r[n];
    }
};

/* the LayerNorm's dw (sum of dout * norm) and db (sum of dout), as k_colsum_partial */
__global__ void k_ln_param_partial(float *pw, float *pb, const float *dout, const float *inp,
                                   const float *mean, const float *rstd, size_t N, size_t C,
                                   size_t R)
{
    __shared__ float shw[8][33], shb[8][33];
    unsigned tx = threadIdx.x, ty = threadIdx.y;
    size_t c = (size_t)blockIdx.x * 32 + tx, r = blockIdx.y;
    size_t n0 = N * r / R, n1 = N * (r + 1) / R;
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (size_t n = n0 + ty; n < n1; n += 8) {
            float d = dout[n * C + c];
            aw += d * ((inp[n * C + c] - mean[n]) * rstd[n]);
            ab += d;
        }
    shw[ty][tx] = aw;
    shb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && c < C) {
        float sw = shw[0][tx], sb = shb[0][tx];
        for (int k = 1; k < 8; k++) {
            sw += shw[k][tx];
            sb += shb[k][tx];
        }
        pw[r * C + c] = sw;
        pb[r * C + c] = sb;
    }
}

__global__ void k_colsum_finish(float *db, const float *partial, size_t OC, size_t R)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= OC)
        return;
    float s = 0.0f;
    for (size_t r = 0; r < R; r++)
        s += partial[r * OC + c];
    db[c] += s;
}

/* ------------------------------------------------------------ bias, GELU */

__global__ void k_rows_init(float *out, const float *res, const float *bias, size_t N, size_t OC)
{
    GRID_STRIDE(i, N * OC)
    {
        float v = res ? res[i] : 0.0f;
        if (bias)
            v += bias[i % OC];
        out[i] = v;
    }
}

__global__ void k_bias_gelu(bf16 *pre, bf16 *act, const float *x, const float *bias, size_t N,
                            size_t OC)
{
    GRID_STRIDE(i, N * OC)
    {
        float v = x[i] + (bias ? bias[i % OC] : 0.0f);
        pre[i] = __float2bfloat16(v);
        act[i] = __float2bfloat16(gelu_fwd(v));
    }
}

__global__ void k_gelu_backward(bf16 *dx, const float *dout, const bf16 *pre, size_t n)
{
    GRID_STRIDE(i, n) dx[i] = __float2bfloat16(dout[i] * gelu_grad(__bfloat162float(pre[i])));
}

/* ------------------------------------------------------------ attention */

__global__ void k_qkv_permute(bf16 *q, bf16 *k, bf16 *v, const float *x, const float *bias,
                              size_t B, size_t T, size_t C, size_t NH)
{
    size_t C3 = 3 * C, hs = C / NH;
    GRID_STRIDE(i, B * T * C3)
    {
        size_t n = i / C3, j = i % C3, which = j / C, c = j % C;
        size_t h = c / hs, d = c % hs, b = n / T, t = n % T;
        float val = x[i] + (bias ? bias[j] : 0.0f);
        bf16 *dst = which == 0 ? q : which == 1 ? k : v;
        dst[((b * NH + h) * T + t) * hs + d] = __float2bfloat16(val);
    }
}

__global__ void k_heads_permute(bf16 *dst, const bf16 *src, size_t ld, size_t B, size_t T,
                                size_t C, size_t NH)
{
    size_t hs = C / NH;
    GRID_STRIDE(i, B * T * C)
    {
        size_t n = i / C, c = i % C, h = c / hs, d = c % hs, b = n / T, t = n % T;
        dst[((b * NH + h) * T + t) * hs + d] = src[n * ld + c];
    }
}

__global__ void k_heads_unpermute(bf16 *dst, size_t ld, const bf16 *src, size_t B, size_t T,
                                  size_t C, size_t NH)
{
    size_t hs = C / NH;
    GRID_STRIDE(i, B * T * C)
    {
        size_t n = i / C, c = i % C, h = c / hs, d = c % hs, b = n / T, t = n % T;
        dst[n * ld + c] = src[((b * NH + h) * T + t) * hs + d];
    }
}

/* a warp per row (bh, t) of T columns; columns past t are 0 */
__global__ void k_attn_softmax_forward(bf16 *P, const float *S, size_t rows, size_t T)
{
    size_t row = warp_row();
    unsigned lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    size_t t = row % T;
    const float *s = S + row * T;
    bf16 *p = P + row * T;
    float mx = -INFINITY;
    for (size_t j = lane; j <= t; j += 32)
        mx = fmaxf(mx, s[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (size_t j = lane; j <= t; j += 32)
        sum += expf(s[j] - mx);
    float inv = 1.0f / warp_sum(sum);
    for (size_t j = lane; j < T; j += 32)
        p[j] = __float2bfloat16(j <= t ? expf(s[j] - mx) * inv : 0.0f);
}

__global__ void k_attn_softmax_backward(bf16 *dS, const float *dP, const bf16 *P, size_t rows,
                                        size_t T, float scale)
{
    size_t row = warp_row();
    unsigned lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    size_t t = row % T;
    const float *dp = dP + row * T;
    const bf16 *p = P + row * T;
    bf16 *ds = dS + row * T;
    float D = 0.0f;
    for (size_t j = lane; j <= t; j += 32)
        D += __bfloat162float(p[j]) * dp[j];
    D = warp_sum(D);
    for (size_t j = lane; j < T; j += 32)
        ds[j] = __float2bfloat16(j <= t ? __bfloat162float(p[j]) * (dp[j] - D) * scale : 0.0f);
}

/* ------------------------------------------------------------ the head */

/* a block per row: max, sum of exponentials, loss, then d = p - onehot in bf16 */
__global__ void k_xent_forward(bf16 *d, size_t ldd, float *losses, const float *logits,
                               size_t ldl, const int32_t *targets, size_t V)
{
    __shared__ float sh[33];
    size_t row = blockIdx.x;
    const float *l = logits + row * ldl;
    float mx = -INFINITY;
    for (size_t j = threadIdx.x; j < V; j += blockDim.x)
        mx = fmaxf(mx, l[j]);
    mx = block_reduce(mx, true, sh);
    float s = 0.0f;
    for (size_t j = threadIdx.x; j < V; j += blockDim.x)
        s += expf(l[j] - mx);
    s = block_reduce(s, false, sh);
    long tg = targets ? (long)targets[row] : -1;
    if (threadIdx.x == 0)
        losses[row] = targets ? logf(s) - (l[tg] - mx) : 0.0f;
    float inv = 1.0f / s;
    bf16 *dr = d + row * ldd;
    for (size_t j = threadIdx.x; j < V; j += blockDim.x) {
        float p = expf(l[j] - mx) * inv;
        if ((long)j == tg)
            p -= 1.0f;
        dr[j] = __float2bfloat16(p);
    }
}

__global__ void k_probs_export(float *dst, const bf16 *d, size_t ldd, const int32_t *targets,
                               size_t rows, size_t V)
{
    GRID_STRIDE(i, rows * V)
    {
        size_t r = i / V, j = i % V;
        float p = __bfloat162float(d[r * ldd + j]);
        if (targets && (size_t)targets[r] == j)
            p += 1.0f;
        dst[i] = p;
    }
}

/* one block of 1024 threads: strided double sums, then a fixed tree */
__global__ void k_sum_f64(double *out, const float *x, size_t n)
{
    __shared__ double sh[32];
    double acc = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        acc += (double)x[i];
    acc = warp_sum_d(acc);
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0)
        sh[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        double v = lane < nw ? sh[lane] : 0.0;
        v = warp_sum_d(v);
        if (lane == 0)
            out[0] = v;
    }
}

/* ------------------------------------------------------------ Llama: RMSNorm, rotary, SwiGLU */

/* a warp per row: out (bf16) = x r w, r = 1 / sqrt(mean(x^2) + eps) (fp32, kept) */
__global__ void k_rmsnorm_forward(bf16 *out, float *rstd, const float *inp, const float *w,
                                  size_t N, size_t C, float eps)
{
    size_t row = warp_row();
    unsigned lane = threadIdx.x & 31;
    if (row >= N)
        return;
    const float *x = inp + row * C;
    float ss = 0.0f;
    for (size_t c = lane; c < C; c += 32)
        ss += x[c] * x[c];
    float r = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    bf16 *o = out + row * C;
    for (size_t c = lane; c < C; c += 32)
        o[c] = __float2bfloat16(x[c] * r * w[c]);
    if (lane == 0)
        rstd[row] = r;
}

/* dinp += r w d - x r^3 sum(w d x) / C */
__global__ void k_rmsnorm_backward_dinp(float *dinp, const float *dout, const float *inp,
                                        const float *rstd, const float *w, size_t N, size_t C)
{
    size_t row = warp_row();
    unsigned lane = threadIdx.x & 31;
    if (row >= N)
        return;
    const float *x = inp + row * C, *d = dout + row * C;
    float r = rstd[row], dot = 0.0f;
    for (size_t c = lane; c < C; c += 32)
        dot += w[c] * d[c] * x[c];
    float k = r * r * r * warp_sum(dot) / (float)C;
    float *dx = dinp + row * C;
    for (size_t c = lane; c < C; c += 32)
        dx[c] += r * w[c] * d[c] - x[c] * k;
}

/* The geometry of a row of q, k, v [N, QL] (q: H heads from column 0, k: KV heads from C, v:
 * KV heads from C + KVD) against the permuted [B, heads, T, hd] tensors. */
struct qkv_geom {
    size_t B, T, H, KV, hd, C, KVD, QL;
};

/* element (n, col) of a row: its permuted tensor (0 q, 1 k, 2 v) and index there; *j the
 * channel inside the head */
__device__ __forceinline__ int qkv_locate(const qkv_geom &g, size_t n, size_t col, size_t *idx,
                                          size_t *j)
{
    size_t b = n / g.T, t = n % g.T, which = col < g.C ? 0 : col < g.C + g.KVD ? 1 : 2;
    size_t c = which == 0 ? col : which == 1 ? col - g.C : col - g.C - g.KVD;
    size_t heads = which == 0 ? g.H : g.KV, h = c / g.hd;
    *j = c % g.hd;
    *idx = ((b * heads + h) * g.T + t) * g.hd + *j;
    return (int)which;
}

/* q and k rotated (rotate-half: channels j and j + hd/2 by angle t theta^(-2j/hd)), v copied,
 * into the permuted bf16 tensors */
__global__ void k_rope_permute(bf16 *q, bf16 *k, bf16 *v, const float *x, const float *cos_t,
                               const float *sin_t, qkv_geom g)
{
    size_t half = g.hd / 2;
    GRID_STRIDE(i, g.B * g.T * g.QL)
    {
        size_t n = i / g.QL, col = i % g.QL, idx, j;
        int which = qkv_locate(g, n, col, &idx, &j);
        const float *row = x + n * g.QL + (col - j); /* the head's first channel */
        float val = row[j];
        if (which < 2) {
            size_t a = (n % g.T) * half + (j < half ? j : j - half);
            float c = cos_t[a], s = sin_t[a];
            val = j < half ? row[j] * c - row[j + half] * s : row[j] * c + row[j - half] * s;
        }
        (which == 0 ? q : which == 1 ? k : v)[idx] = __float2bfloat16(val);
    }
}

/* the backward: dq, dk (rotated back: the transpose) and dv into rows dx [N, QL] bf16 */
__global__ void k_rope_unpermute(bf16 *dx, const bf16 *dq, const bf16 *dk, const bf16 *dv,
                                 const float *cos_t, const float *sin_t, qkv_geom g)
{
    size_t half = g.hd / 2;
    GRID_STRIDE(i, g.B * g.T * g.QL)
    {
        size_t n = i / g.QL, col = i % g.QL, idx, j;
        int which = qkv_locate(g, n, col, &idx, &j);
        const bf16 *src = which == 0 ? dq : which == 1 ? dk : dv;
        float val = __bfloat162float(src[idx]);
        if (which < 2) {
            size_t a = (n % g.T) * half + (j < half ? j : j - half);
            float c = cos_t[a], s = sin_t[a];
            const bf16 *head = src + (idx - j);
            val = j < half ? val * c + __bfloat162float(head[j + half]) * s
                           : val * c - __bfloat162float(head[j - half]) * s;
        }
        dx[i] = __float2bfloat16(val);
    }
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* gate, up (bf16, kept) and h = silu(gate) up (bf16), from the fp32 matmul outputs */
__global__ void k_swiglu_forward(bf16 *gate, bf16 *up, bf16 *h, const float *g, const float *u,
                                 size_t n)
{
    GRID_STRIDE(i, n)
    {
        float a = g[i], b = u[i];
        gate[i] = __float2bfloat16(a);
        up[i] = __float2bfloat16(b);
        h[i] = __float2bfloat16(a * sigmoidf_(a) * b);
    }
}

/* dgate = dh up s (1 + gate (1 - s)), dup = dh gate s, s = sigmoid(gate) (bf16 outputs) */
__global__ void k_swiglu_backward(bf16 *dgate, bf16 *dup, const float *dh, const bf16 *gate,
                                  const bf16 *up, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float a = __bfloat162float(gate[i]), b = __bfloat162float(up[i]), d = dh[i];
        float sg = sigmoidf_(a);
        dup[i] = __float2bfloat16(d * a * sg);
        dgate[i] = __float2bfloat16(d * b * sg * (1.0f + a * (1.0f - sg)));
    }
}

} /* namespace */

/* ---------------------------------------------------------------- launchers */

/* Launch k on s with one thread per element of n (grid stride past grid_for's limit), then
 * check the launch; n == 0 launches nothing. */
template <typename... P, typename... A>
static int launch_elems(const char *what, size_t n, cudaStream_t s, void (*k)(P...), A... args)
{
    if (!n)
        return 0;
    k<<<grid_for(n, kThreads), kThreads, 0, s>>>(args...);
    ZRC_LAUNCHED(what);
    return 0;
}

/* The same with one warp per row of rows (kThreads / 32 rows a block). */
template <typename... P, typename... A>
static int launch_rows(const char *what, size_t rows, cudaStream_t s, void (*k)(P...), A... args)
{
    if (!rows)
        return 0;
    unsigned per = kThreads / 32;
    k<<<(unsigned)((rows + per - 1) / per), kThreads, 0, s>>>(args...);
    ZRC_LAUNCHED(what);
    return 0;
}

int zrk_cast_bf16(bf16 *dst, const float *src, size_t n, cudaStream_t s)
{
    return launch_elems("cast to bf16", n, s, k_cast_bf16, dst, src, n);
}

int zrk_to_f32(float *dst, const bf16 *src, size_t n, cudaStream_t s)
{
    return launch_elems("cast to fp32", n, s, k_to_f32, dst, src, n);
}

int zrk_fill(float *dst, float v, size_t n, cudaStream_t s)
{
    return launch_elems("fill", n, s, k_fill, dst, v, n);
}

int zrk_encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe,
                        size_t N, size_t T, size_t C, cudaStream_t s)
{
    return launch_elems("encoder forward", N * C, s, k_encoder_forward, out, tok, wte, wpe, N, T,
                        C);
}

int zrk_encoder_backward_wte(float *dwte, const float *dout, const int32_t *pos,
                             const int32_t *uniq, const int32_t *seg, size_t U, size_t C,
                             cudaStream_t s)
{
    if (!U)
        return 0;
    dim3 grid((unsigned)U, (unsigned)((C + kThreads - 1) / kThreads));
    k_encoder_backward_wte<<<grid, kThreads, 0, s>>>(dwte, dout, pos, uniq, seg, C);
    ZRC_LAUNCHED("encoder backward (wte)");
    return 0;
}

int zrk_encoder_backward_wpe(float *dwpe, const float *dout, size_t B, size_t T, size_t C,
                             cudaStream_t s)
{
    return launch_elems("encoder backward (wpe)", T * C, s, k_encoder_backward_wpe, dwpe, dout, B,
                        T, C);
}

int zrk_layernorm_forward(bf16 *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, size_t N, size_t C, cudaStream_t s)
{
    return launch_rows("layernorm forward", N, s, k_layernorm_forward, out, mean, rstd, inp, w, b,
                       N, C);
}

size_t zrk_partial_floats(size_t N, size_t cols) { return row_chunks(N) * cols; }

int zrk_layernorm_backward(float *dinp, float *dw, float *db, float *partial, const float *dout,
                           const float *inp, const float *mean, const float *rstd,
                           const float *w, size_t N, size_t C, cudaStream_t s)
{
    if (!N)
        return 0;
    ZRC_TRY(launch_rows("layernorm backward", N, s, k_layernorm_backward_dinp, dinp, dout, inp,
                        mean, rstd, w, N, C));
    size_t R = row_chunks(N);
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)R), block(32, 8);
    k_ln_param_partial<<<grid, block, 0, s>>>(partial, partial + R * C, dout, inp, mean, rstd, N,
                                              C, R);
    ZRC_LAUNCHED("layernorm backward (weights)");
    unsigned g = (unsigned)((C + kThreads - 1) / kThreads);
    k_colsum_finish<<<g, kThreads, 0, s>>>(dw, partial, C, R);
    k_colsum_finish<<<g, kThreads, 0, s>>>(db, partial + R * C, C, R);
    ZRC_LAUNCHED("layernorm backward (sums)");
    return 0;
}

template <typename T>
static int colsum(float *db, float *partial, const T *x, size_t N, size_t OC, cudaStream_t s)
{
    if (!N || !OC)
        return 0;
    size_t R = row_chunks(N);
    dim3 grid((unsigned)((OC + 31) / 32), (unsigned)R), block(32, 8);
    elem_of<T> f = {x, OC};
    k_colsum_partial<<<grid, block, 0, s>>>(partial, f, N, OC, R);
    ZRC_LAUNCHED("bias gradient");
    k_colsum_finish<<<(unsigned)((OC + kThreads - 1) / kThreads), kThreads, 0, s>>>(db, partial,
                                                                                  OC, R);
    ZRC_LAUNCHED("bias gradient (sums)");
    return 0;
}

int zrk_colsum_f32(float *db, float *partial, const float *x, size_t N, size_t OC,
                   cudaStream_t s)
{
    return colsum<float>(db, partial, x, N, OC, s);
}

int zrk_colsum_bf16(float *db, float *partial, const bf16 *x, size_t N, size_t OC,
                    cudaStream_t s)
{
    return colsum<bf16>(db, partial, x, N, OC, s);
}

int zrk_rows_init(float *out, const float *res, const float *bias, size_t N, size_t OC,
                  cudaStream_t s)
{
    return launch_elems("residual + bias", N * OC, s, k_rows_init, out, res, bias, N, OC);
}

int zrk_bias_gelu(bf16 *pre, bf16 *act, const float *x, const float *bias, size_t N, size_t OC,
                  cudaStream_t s)
{
    return launch_elems("bias + gelu", N * OC, s, k_bias_gelu, pre, act, x, bias, N, OC);
}

int zrk_gelu_backward(bf16 *dx, const float *dout, const bf16 *pre, size_t n, cudaStream_t s)
{
    return launch_elems("gelu backward", n, s, k_gelu_backward, dx, dout, pre, n);
}

int zrk_qkv_permute(bf16 *q, bf16 *k, bf16 *v, const float *x, const float *bias, size_t B,
                    size_t T, size_t C, size_t NH, cudaStream_t s)
{
    return launch_elems("qkv permute", B * T * 3 * C, s, k_qkv_permute, q, k, v, x, bias, B, T, C,
                        NH);
}

int zrk_heads_permute(bf16 *dst, const bf16 *src, size_t ld, size_t B, size_t T, size_t C,
                      size_t NH, cudaStream_t s)
{
    return launch_elems("heads permute", B * T * C, s, k_heads_permute, dst, src, ld, B, T, C, NH);
}

int zrk_heads_unpermute(bf16 *dst, size_t ld, const bf16 *src, size_t B, size_t T, size_t C,
                        size_t NH, cudaStream_t s)
{
    return launch_elems("heads unpermute", B * T * C, s, k_heads_unpermute, dst, ld, src, B, T, C,
                        NH);
}

int zrk_attn_softmax_forward(bf16 *P, const float *S, size_t BNH, size_t T, cudaStream_t s)
{
    size_t rows = BNH * T;
    return launch_rows("attention softmax", rows, s, k_attn_softmax_forward, P, S, rows, T);
}

int zrk_attn_softmax_backward(bf16 *dS, const float *dP, const bf16 *P, size_t BNH, size_t T,
                              float scale, cudaStream_t s)
{
    size_t rows = BNH * T;
    return launch_rows("attention softmax backward", rows, s, k_attn_softmax_backward, dS, dP, P,
                       rows, T, scale);
}

int zrk_xent_forward(bf16 *d, size_t ldd, float *losses, const float *logits, size_t ldl,
                     const int32_t *targets, size_t rows, size_t V, cudaStream_t s)
{
    if (!rows)
        return 0;
    k_xent_forward<<<(unsigned)rows, 512, 0, s>>>(d, ldd, losses, logits, ldl, targets, V);
    ZRC_LAUNCHED("softmax + cross-entropy");
    return 0;
}

int zrk_probs_export(float *dst, const bf16 *d, size_t ldd, const int32_t *targets, size_t rows,
                     size_t V, cudaStream_t s)
{
    return launch_elems("probabilities", rows * V, s, k_probs_export, dst, d, ldd, targets, rows,
                        V);
}

int zrk_sum_f64(double *out, const float *x, size_t n, cudaStream_t s)
{
    k_sum_f64<<<1, 1024, 0, s>>>(out, x, n);
    ZRC_LAUNCHED("loss sum");
    return 0;
}

/* ---------------------------------------------------------------- Llama */

int zrk_rmsnorm_forward(bf16 *out, float *rstd, const float *inp, const float *w, size_t N,
                        size_t C, float eps, cudaStream_t s)
{
    return launch_rows("rmsnorm forward", N, s, k_rmsnorm_forward, out, rstd, inp, w, N, C, eps);
}

int zrk_rmsnorm_backward(float *dinp, float *dw, float *partial, const float *dout,
                         const float *inp, const float *rstd, const float *w, size_t N, size_t C,
                         cudaStream_t s)
{
    if (!N)
        return 0;
    ZRC_TRY(launch_rows("rmsnorm backward", N, s, k_rmsnorm_backward_dinp, dinp, dout, inp, rstd,
                        w, N, C));
    size_t R = row_chunks(N);
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)R), block(32, 8);
    rms_dw_of f = {dout, inp, rstd, C};
    k_colsum_partial<<<grid, block, 0, s>>>(partial, f, N, C, R);
    ZRC_LAUNCHED("rmsnorm backward (weights)");
    k_colsum_finish<<<(unsigned)((C + kThreads - 1) / kThreads), kThreads, 0, s>>>(dw, partial,
                                                                                 C, R);
    ZRC_LAUNCHED("rmsnorm backward (sums)");
    return 0;
}

static qkv_geom geom(size_t B, size_t T, size_t H, size_t KV, size_t hd)
{
    qkv_geom g = {B, T, H, KV, hd, H * hd, KV * hd, (H + 2 * KV) * hd};
    return g;
}

int zrk_rope_permute(bf16 *q, bf16 *k, bf16 *v, const float *x, const float *cos_t,
                     const float *sin_t, size_t B, size_t T, size_t H, size_t KV, size_t hd,
                     cudaStream_t s)
{
    qkv_geom g = geom(B, T, H, KV, hd);
    return launch_elems("rotary positions", B * T * g.QL, s, k_rope_permute, q, k, v, x, cos_t,
                        sin_t, g);
}

int zrk_rope_unpermute(bf16 *dx, const bf16 *dq, const bf16 *dk, const bf16 *dv,
                       const float *cos_t, const float *sin_t, size_t B, size_t T, size_t H,
                       size_t KV, size_t hd, cudaStream_t s)
{
    qkv_geom g = geom(B, T, H, KV, hd);
    return launch_elems("rotary positions backward", B * T * g.QL, s, k_rope_unpermute, dx, dq, dk,
                        dv, cos_t, sin_t, g);
}

int zrk_swiglu_forward(bf16 *gate, bf16 *up, bf16 *h, const float *g, const float *u, size_t n,
                       cudaStream_t s)
{
    return launch_elems("swiglu forward", n, s, k_swiglu_forward, gate, up, h, g, u, n);
}

int zrk_swiglu_backward(bf16 *dgate, bf16 *dup, const float *dh, const bf16 *gate,
                        const bf16 *up, size_t n, cudaStream_t s)
{
    return launch_elems("swiglu backward", n, s, k_swiglu_backward, dgate, dup, dh, gate, up, n);
}
