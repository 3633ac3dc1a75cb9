/*
 * tests/gpu/bench.c (build/gpu_bench): training throughput of the device model on one GPU.
 * A step is what a stage-0 rank does at world 1: zero the gradients, forward and backward of
 * one micro-batch of B x T tokens, the global gradient norm (sumsq), AdamW on every
 * group (fp32 master weights and moments on the device). Prints tokens/s, the model FLOPs
 * utilisation against a bf16 dense peak, and the memory held.
 *
 * MFU counts the model's FLOPs, not the kernels': per token 6 x (the matmul parameters:
 * 12 L C^2 in the blocks + V C in the tied head) + 12 L T C for attention (QK^T and PV,
 * forward and backward, the whole T x T as PaLM's appendix B counts it), divided by the
 * peak (--peak-tflops, default 989: H100/H200 SXM bf16 dense).
 *
 * usage: gpu_bench [--model SPEC] [--batch B] [--seq T] [--steps N] [--warmup N]
 *                  [--recompute none|layer|selective] [--peak-tflops X] [--json]
 * (--recompute: the device model's activation checkpointing; MFU still counts the model's
 * FLOPs, so a recompute's extra work shows as a lower MFU.)
 * Exit 77 with a "skip:" line when no GPU is usable.
 */
#include "device.h"
#include "zr.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const zr_device_ops *D;

#define OK(expr)                                                                               \
    do {                                                                                       \
        int ok_rc_ = (expr);                                                                   \
        if (ok_rc_) {                                                                          \
            fprintf(stderr, "gpu_bench: %s: %s\n", #expr, zr_err_msg());                       \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* zr_model_init_range of every group on a few threads (it is a pure function of the seed and
 * the element index), into one host arena in layout order */
typedef struct {
    const zr_model *m;
    float *arena;
    int k, nt;
} init_job;

static void *init_part(void *p)
{
    init_job *j = p;
    size_t G = zr_model_n_groups(j->m);
    uint64_t off = 0;
    for (size_t g = 0; g < G; g++) {
        uint64_t n = zr_model_group_numel(j->m, g);
        uint64_t lo = n * (uint64_t)j->k / (uint64_t)j->nt;
        uint64_t hi = n * (uint64_t)(j->k + 1) / (uint64_t)j->nt;
        if (hi > lo)
            zr_model_init_range(j->m, 1337, g, lo, hi - lo, j->arena + off + lo);
        off += n;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *spec = "gpt2";
    size_t B = 8, T = 1024, steps = 20, warmup = 3;
    double peak = 989.0;
    int json = 0;
    zr_recompute rc = ZR_RECOMPUTE_NONE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "gpu_bench: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model"))
            spec = v;
        else if (!strcmp(a, "--batch"))
            B = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--seq"))
            T = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--steps"))
            steps = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--warmup"))
            warmup = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--peak-tflops"))
            peak = strtod(v, NULL);
        else if (!strcmp(a, "--recompute") && !strcmp(v, "none"))
            rc = ZR_RECOMPUTE_NONE;
        else if (!strcmp(a, "--recompute") && !strcmp(v, "layer"))
            rc = ZR_RECOMPUTE_LAYER;
        else if (!strcmp(a, "--recompute") && !strcmp(v, "selective"))
            rc = ZR_RECOMPUTE_SELECTIVE;
        else {
            fprintf(stderr, "usage: gpu_bench [--model SPEC] [--batch B] [--seq T] [--steps N] "
                            "[--warmup N] [--recompute none|layer|selective] "
                            "[--peak-tflops X] [--json]\n");
            return 2;
        }
    }
    if (zr_device_open(&D)) {
        printf("skip: %s\n", zr_err_msg());
        return 77;
    }
    zr_gpt2_config c;
    OK(zr_gpt2_config_parse(&c, spec));
    if (T > c.ctx)
        T = c.ctx;
    OK(D->init(0, NULL));
    char name[256];
    uint64_t fr0, tot;
    OK(D->info(name, sizeof name, &fr0, &tot));

    /* host initialization: a CPU model of minimal activations gives init_range */
    zr_model *cpu;
    OK(zr_model_new_ext(&cpu, &c, 1, 1, NULL));
    uint64_t numel = zr_model_numel(cpu);
    float *host = malloc(numel * sizeof *host);
    if (!host) {
        fprintf(stderr, "gpu_bench: out of host memory\n");
        return 1;
    }
    enum { NT = 16 };
    pthread_t th[NT];
    init_job jobs[NT];
    for (int k = 0; k < NT; k++) {
        jobs[k] = (init_job){cpu, host, k, NT};
        pthread_create(&th[k], NULL, init_part, &jobs[k]);
    }
    for (int k = 0; k < NT; k++)
        pthread_join(th[k], NULL);

    D->mem_reset_peak();
    zr_dev_model *m;
    OK(zr_device_model_new(D, &m, &c, B, T, NULL, rc));
    OK(D->memcpy(D->model_param(m, 0), host, numel * 4, ZR_DEV_H2D, NULL));
    free(host);
    float *mv, *vv;
    OK(D->malloc((void **)&mv, numel * 4));
    OK(D->malloc((void **)&vv, numel * 4));
    OK(D->memset(mv, 0, numel * 4, NULL));
    OK(D->memset(vv, 0, numel * 4, NULL));
    zr_dev_stream *s = D->model_stream(m);
    size_t G = D->model_n_groups(m), N = B * T;
    zr_data *data;
    OK(zr_data_open(&data, "synthetic", 256, (uint32_t)T, 1));
    int32_t *tok = malloc((T + 1) * 4), *in = malloc(N * 4), *tg = malloc(N * 4);
    zr_adamw_hp hp = ZR_ADAMW_HP_INIT;
    float loss = 0;
    double t0 = 0, sum_norm = 0;
    uint64_t fr_min = fr0;
    for (size_t step = 0; step < warmup + steps; step++) {
        if (step == warmup) {
            OK(D->stream_sync(s));
            t0 = now();
        }
        for (size_t b = 0; b < B; b++) { /* byte tokens: a subset of the vocabulary */
            zr_data_sample(data, step * B + b, tok);
            memcpy(in + b * T, tok, T * 4);
            memcpy(tg + b * T, tok + 1, T * 4);
        }
        OK(D->model_zero_grad(m));
        OK(D->model_forward(m, in, tg, B, T, NULL));
        OK(D->model_backward(m, 1.0f));
        /* the norm over the whole (contiguous) gradient arena in one call: the engine's
         * per-group calls each wait for their result, which a later version can batch */
        double ss = 0;
        OK(D->sumsq(D->model_grad(m, 0), numel, &ss, s));
        double norm = sqrt(ss);
        sum_norm += norm;
        float clip = norm > 1.0 ? (float)(1.0 / (norm + 1e-6)) : 1.0f;
        float *p = D->model_param(m, 0), *gr = D->model_grad(m, 0);
        for (size_t g = 0, off = 0; g < G; off += D->model_group_numel(m, g), g++)
            OK(D->adamw(p + off, gr + off, mv + off, vv + off, D->model_group_numel(m, g),
                        step + 1, 3e-4f, clip, 1, &hp, s));
        OK(D->model_loss(m, &loss));
        if (step == warmup) {
            uint64_t fr;
            OK(D->info(NULL, 0, &fr, NULL));
            fr_min = fr < fr_min ? fr : fr_min;
        }
    }
    OK(D->stream_sync(s));
    double dt = now() - t0;
    double tps = (double)(steps * N) / dt;
    double L = c.layers, C = c.dim, V = c.vocab;
    double flops_tok = 6.0 * (12.0 * L * C * C + V * C) + 12.0 * L * (double)T * C;
    double mfu = tps * flops_tok / (peak * 1e12);
    uint64_t cur, pk, pb, gb, ab;
    D->mem_stats(&cur, &pk);
    D->model_bytes(m, &pb, &gb, &ab);
    double gib = 1073741824.0;
    /* the ZeRO formula at stage 0, world 1: 16 bytes per parameter (fp32 param, grad, two
     * moments; our bf16 copies are per-group scratch, counted with the activations) */
    double states = 16.0 * (double)numel;
    static const char *const rc_names[3] = {"none", "layer", "selective"};
    if (json)
        printf("{\"model\":\"%s\",\"recompute\":\"%s\",\"params\":%llu,\"B\":%zu,\"T\":%zu,"
               "\"tokens_per_s\":%.0f,\"step_ms\":%.2f,\"mfu\":%.4f,\"peak_alloc_gib\":%.3f,"
               "\"device_used_gib\":%.3f,"
               "\"states_gib\":%.3f,\"acts_gib\":%.3f,\"loss\":%.4f}\n",
               spec, rc_names[rc], (unsigned long long)numel, B, T, tps, 1e3 * dt / steps, mfu,
               pk / gib, (tot - fr_min) / gib, states / gib, ab / gib, loss);
    else {
        printf("%s: %s, %.1f M parameters, B %zu x T %zu, recompute %s, %zu steps after %zu "
               "warmup\n", spec, name, numel / 1e6, B, T, rc_names[rc], steps, warmup);
        printf("  %.0f tokens/s, %.1f ms/step, MFU %.1f %% of %.0f TFLOP/s (%.0f GFLOP/token)\n",
               tps, 1e3 * dt / steps, 100 * mfu, peak, flops_tok / 1e9);
        printf("  memory: %.2f GiB peak through the allocator (states %.2f GiB = 16 B/param, "
               "activations + scratch %.2f GiB), %.2f GiB in use on the device\n",
               pk / gib, states / gib, ab / gib, (tot - fr_min) / gib);
        printf("  last loss %.4f, mean grad norm %.3f\n", loss, sum_norm / (warmup + steps));
    }
    D->free(mv);
    D->free(vv);
    D->model_free(m);
    zr_model_free(cpu);
    zr_data_free(data);
    free(tok), free(in), free(tg);
    return 0;
}
