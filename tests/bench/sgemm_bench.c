/*
 * sgemm_bench.c: the sgemm rate of this machine's OpenBLAS, for tests/bench/train_bench.sh.
 * Built by hand by that script (not by the Makefile):
 *   cc -O2 tests/bench/sgemm_bench.c $(pkg-config --cflags --libs openblas) -o build/sgemm_bench
 * Usage: sgemm_bench [THREADS [SECONDS_PER_SHAPE]]   (defaults 2 and 1.0)
 *
 * Times cblas_sgemm, row-major as core/model/model.c calls it, on square-ish shapes and on the
 * shapes of one GPT-2 124M training step at batch 4 x 64 tokens (N = 256 rows, C = 768):
 * the forward (NoTrans x Trans, out = inp W^T), the input gradient (NoTrans x NoTrans) and the
 * weight gradient (Trans x NoTrans). For each shape it repeats the call for about
 * SECONDS_PER_SHAPE (after one untimed call) and keeps the fastest call. Prints one line per
 * shape: "shape NAME M N K TA TB GFLOPS", then "best GFLOPS" (the fastest shape) and
 * "mix124m GFLOPS": the rate of the 124M step's matmul mix, its total FLOPs over the summed
 * best time of each of its shapes weighted by how often the step runs it.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const char *name;
    int M, N, K;  /* C[M, N] = op(A)[M, K] op(B)[K, N] */
    int ta, tb;   /* 1: transposed (A stored [K, M], B stored [N, K]) */
    double count; /* calls per 124M step (0: not part of the step) */
} shape;

/* 124M at B=4, T=64: N = 256 rows, C = 768, V = 50257, 12 layers. Per layer: c_attn 768->2304,
 * attn c_proj 768->768, c_fc 768->3072, mlp c_proj 3072->768, each with a forward, an input
 * gradient and a weight gradient; once per step: the tied head 768->50257 (forward, input
 * gradient, weight gradient). */
static const shape shapes[] = {
    {"square 768x768x3072 NT", 768, 768, 3072, 0, 1, 0},
    {"square 1024x1024x1024 NN", 1024, 1024, 1024, 0, 0, 0},
    {"square 2048x2048x2048 NN", 2048, 2048, 2048, 0, 0, 0},
    {"fwd c_attn 256x2304x768 NT", 256, 2304, 768, 0, 1, 12},
    {"fwd attn.c_proj 256x768x768 NT", 256, 768, 768, 0, 1, 12},
    {"fwd c_fc 256x3072x768 NT", 256, 3072, 768, 0, 1, 12},
    {"fwd mlp.c_proj 256x768x3072 NT", 256, 768, 3072, 0, 1, 12},
    {"fwd head 256x50257x768 NT", 256, 50257, 768, 0, 1, 1},
    {"dinp c_attn 256x768x2304 NN", 256, 768, 2304, 0, 0, 12},
    {"dinp attn.c_proj 256x768x768 NN", 256, 768, 768, 0, 0, 12},
    {"dinp c_fc 256x768x3072 NN", 256, 768, 3072, 0, 0, 12},
    {"dinp mlp.c_proj 256x3072x768 NN", 256, 3072, 768, 0, 0, 12},
    {"dinp head 256x768x50257 NN", 256, 768, 50257, 0, 0, 1},
    {"dW c_attn 2304x768x256 TN", 2304, 768, 256, 1, 0, 12},
    {"dW attn.c_proj 768x768x256 TN", 768, 768, 256, 1, 0, 12},
    {"dW c_fc 3072x768x256 TN", 3072, 768, 256, 1, 0, 12},
    {"dW mlp.c_proj 768x3072x256 TN", 768, 3072, 256, 1, 0, 12},
    {"dW head 50257x768x256 TN", 50257, 768, 256, 1, 0, 1},
};

static float *randbuf(size_t n, unsigned *seed)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "sgemm_bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        p[i] = (float)((*seed >> 9) & 0xffff) / 65536.0f - 0.5f;
    }
    return p;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double per = argc > 2 ? atof(argv[2]) : 1.0;
    if (threads < 1 || per <= 0) {
        fprintf(stderr, "usage: sgemm_bench [THREADS [SECONDS_PER_SHAPE]]\n");
        return 2;
    }
    openblas_set_num_threads(threads);
    printf("threads %d (openblas_get_num_threads %d), config: %s\n", threads,
           openblas_get_num_threads(), openblas_get_config());
    unsigned seed = 1;
    double best = 0, mix_flops = 0, mix_time = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const shape *x = &shapes[s];
        float *A = randbuf((size_t)x->M * x->K, &seed), *B = randbuf((size_t)x->K * x->N, &seed);
        float *C = randbuf((size_t)x->M * x->N, &seed);
        int lda = x->ta ? x->M : x->K, ldb = x->tb ? x->K : x->N;
        double flops = 2.0 * x->M * x->N * x->K, fastest = 1e30, t_end = now() + per;
        int calls = 0;
        for (int i = -1; i < 3 || now() < t_end; i++) {
            double t0 = now();
            cblas_sgemm(CblasRowMajor, x->ta ? CblasTrans : CblasNoTrans,
                        x->tb ? CblasTrans : CblasNoTrans, x->M, x->N, x->K, 1.0f, A, lda, B,
                        ldb, 1.0f, C, x->N);
            double dt = now() - t0;
            if (i >= 0) { /* the first call is untimed (page faults, thread start) */
                calls++;
                if (dt < fastest)
                    fastest = dt;
            }
        }
        double gf = flops / fastest / 1e9;
        printf("shape %-34s %6d %6d %6d %c%c %8.1f GFLOP/s (%d calls)\n", x->name, x->M, x->N,
               x->K, x->ta ? 'T' : 'N', x->tb ? 'T' : 'N', gf, calls);
        if (gf > best)
            best = gf;
        mix_flops += x->count * flops;
        mix_time += x->count * fastest;
        free(A);
        free(B);
        free(C);
    }
    printf("best %.1f\n", best);
    printf("mix124m %.1f\n", mix_flops / mix_time / 1e9);
    return 0;
}
