/*
 * planner.c: zrun --memory-limit and zckpt audit --memory-limit (train.h, zr_train_plan_memory):
 * the fastest configuration whose dry-run peak per rank fits the limit, among the ZeRO stage,
 * the micro-batch (the divisors of the rank's share), the recompute mode and the offload of the
 * optimizer states and (stage 3) the parameters (to NVMe when --nvme-path is given; to pinned
 * host memory on a GPU). Bytes are the dry run's (zr_train_mem_plan, the largest rank's
 * total); the speed model multiplies factors taken from the bench figures of
 * docs/PERFORMANCE.md (no probe is run), listed below.
 */
#include "train_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Step time relative to stage 0, no recompute, nothing offloaded, one micro-batch per step
 * (docs/PERFORMANCE.md): the ZeRO stages' tokens/s at W = 2 (issue 5: 1.00, 0.97, 0.72, 0.99);
 * recompute on GPT-2 124M at 2 ranks, 2 x 128 tokens (issue 26, recompute_bench.sh, medians of
 * 3 rounds on the quiet VM: layer 1.27x at stage 0 and 1.34x at stage 3, where the embedding's
 * gradient pieces recompute their logits once more; selective 1.02x on one rank; on a GPU the
 * same factors, not measured there: no GPU was lent when the device engine got recompute);
 * NVMe offload at stage 3 (issue 6:
 * the optimizer 2.06x, with the parameters 2.83x); pinned host memory on a GPU and a step's
 * extra micro-batches have no figure: 1.3x and 1 % each, assumed. */
static const double stage_cost[4] = {1.0 / 1.00, 1.0 / 0.97, 1.0 / 0.72, 1.0 / 0.99};
static const double recompute_cost[2][3] = {{1.00, 1.27, 1.02},  /* stages 0, 1 */
                                            {1.00, 1.34, 1.02}}; /* stages 2, 3: pieces */
#define NVME_OPT_COST 2.06
#define NVME_OPT_PARAMS_COST 2.83
#define PINNED_COST 1.3
#define MICRO_COST 0.01

static double cost_of(const zr_plan_pick *c, uint32_t share)
{
    double t = stage_cost[c->zero_stage] * recompute_cost[c->zero_stage >= 2][c->recompute];
    if (c->offload_params == ZR_OFFLOAD_NVME)
        t *= NVME_OPT_PARAMS_COST;
    else if (c->offload_optimizer == ZR_OFFLOAD_NVME)
        t *= NVME_OPT_COST;
    if (c->offload_optimizer == ZR_OFFLOAD_CPU || c->offload_params == ZR_OFFLOAD_CPU)
        t *= PINNED_COST;
    return t * (1.0 + MICRO_COST * (double)(share / c->micro_batch - 1));
}

/* The options of candidate c (resume: the checkpoint base's pick found, unverified again). */
static zr_train_opts opts_of(const zr_train_opts *o, const zr_plan_pick *c, const char *from)
{
    zr_train_opts t = *o;
    t.zero_stage = c->zero_stage;
    t.micro_batch = c->micro_batch;
    t.recompute = c->recompute;
    t.offload_optimizer = c->offload_optimizer;
    t.offload_params = c->offload_params;
    t.resume = from ? from : "never";
    t.verify_on_resume = ZR_VERIFY_OFF;
    return t;
}

/* a is better than b: faster, then fewer bytes */
static int better(const zr_plan_pick *a, const zr_plan_pick *b)
{
    if (a->cost != b->cost)
        return a->cost < b->cost;
    return a->bytes < b->bytes;
}

void zr_plan_pick_print(const zr_plan_pick *c, char *buf, size_t cap)
{
    static const char *const off[] = {"none", "cpu", "nvme"};
    int n = snprintf(buf, cap, "--zero %d --micro-batch %u --recompute %s", c->zero_stage,
                     c->micro_batch, zr_train__recompute_name(c->recompute));
    if (n > 0 && (size_t)n < cap && c->offload_optimizer)
        n += snprintf(buf + n, cap - (size_t)n, " --offload-optimizer %s",
                      off[c->offload_optimizer]);
    if (n > 0 && (size_t)n < cap && c->offload_params)
        snprintf(buf + n, cap - (size_t)n, " --offload-params %s", off[c->offload_params]);
}

int zr_train_plan_memory(zr_plan_pick *out, zr_plan_pick *runner_up, const zr_train_opts *o,
                         int world, uint64_t limit, FILE *log)
{
    memset(out, 0, sizeof *out);
    if (runner_up)
        memset(runner_up, 0, sizeof *runner_up);
    /* the options as given: their checks, the checkpoint a resume would read, the device */
    zr_train_opts base = *o;
    base.zero_stage = 0;
    base.micro_batch = 0;
    base.recompute = ZR_RECOMPUTE_NONE;
    base.offload_optimizer = base.offload_params = ZR_OFFLOAD_NONE;
    if (base.verify_on_resume == ZR_VERIFY_FULL) /* the training verifies it in full */
        base.verify_on_resume = ZR_VERIFY_QUICK;
    zr_mem_plan bp;
    ZR_TRY(zr_train_mem_plan(&bp, &base, world));
    char *from = bp.from;
    bp.from = NULL;
    int on_gpu = bp.on_gpu;
    zr_mem_plan_free(&bp);
    uint32_t share = o->batch / (uint32_t)world;
    int nvme = o->nvme_path != NULL, rc = 0;
    size_t n = 0, cap = 64;
    zr_plan_pick *all = malloc(cap * sizeof *all);
    if (!all) {
        free(from);
        return zr_err_set(ZR_ENOMEM, "--memory-limit: out of memory");
    }
    for (int s = 0; s <= 3; s++)
        for (uint32_t mb = share; mb >= 1; mb--) {
            if (share % mb)
                continue;
            for (int r = 0; r <= ZR_RECOMPUTE_SELECTIVE; r++)
                for (int oo = 0; oo <= ZR_OFFLOAD_NVME; oo++)
                    for (int op = 0; op <= ZR_OFFLOAD_NVME; op++) {
                        if ((oo == ZR_OFFLOAD_NVME || op == ZR_OFFLOAD_NVME) && !nvme)
                            continue;
                        if ((oo == ZR_OFFLOAD_CPU || op == ZR_OFFLOAD_CPU) && !on_gpu)
                            continue; /* on the CPU, host memory is where they are anyway */
                        if ((op && s != 3) || (on_gpu && op && !oo))
                            continue;
                        zr_plan_pick c = {mb, s, r, oo, op, 0, 0.0};
                        zr_train_opts t = opts_of(o, &c, from);
                        zr_mem_plan p;
                        if (zr_train_mem_plan(&p, &t, world) < 0) {
                            rc = rc ? rc : zr_err_code();
                            continue;
                        }
                        for (int q = 0; q < world; q++)
                            if (p.rank[q].total > c.bytes)
                                c.bytes = p.rank[q].total;
                        zr_mem_plan_free(&p);
                        c.cost = cost_of(&c, share);
                        if (n == cap) {
                            zr_plan_pick *g = realloc(all, 2 * cap * sizeof *all);
                            if (!g) {
                                free(all);
                                free(from);
                                return zr_err_set(ZR_ENOMEM, "--memory-limit: out of memory");
                            }
                            all = g;
                            cap *= 2;
                        }
                        all[n++] = c;
                    }
        }
    free(from);
    /* the choice: the best that fits; the smallest of all (a refusal names it); the runner-up:
     * of the faster ones that do not fit, the nearest miss (fewest bytes), else the next best
     * that fits */
    const zr_plan_pick *best = NULL, *smallest = NULL, *miss = NULL, *second = NULL;
    for (size_t i = 0; i < n; i++) {
        const zr_plan_pick *c = &all[i];
        if (!smallest || c->bytes < smallest->bytes ||
            (c->bytes == smallest->bytes && better(c, smallest)))
            smallest = c;
        if (c->bytes <= limit && (!best || better(c, best)))
            best = c;
    }
    for (size_t i = 0; best && i < n; i++) {
        const zr_plan_pick *c = &all[i];
        if (c->bytes > limit && better(c, best) &&
            (!miss || c->bytes < miss->bytes || (c->bytes == miss->bytes && better(c, miss))))
            miss = c;
        if (c != best && c->bytes <= limit && (!second || better(c, second)))
            second = c;
    }
    char b1[160], b2[160];
    if (!smallest) {
        free(all);
        return zr_err_set(rc ? rc : ZR_EINVAL, "--memory-limit: no configuration could be "
                          "planned: %s", zr_err_msg());
    }
    if (!best) {
        zr_plan_pick_print(smallest, b1, sizeof b1);
        rc = zr_err_set(ZR_EINVAL, "--memory-limit %llu: no configuration fits: the smallest "
                        "needs %llu bytes per rank (%.1f MiB: %s); use --memory-limit %llu or "
                        "more", (unsigned long long)limit,
                        (unsigned long long)smallest->bytes, smallest->bytes / 1048576.0, b1,
                        (unsigned long long)smallest->bytes);
        free(all);
        return rc;
    }
    *out = *best;
    const zr_plan_pick *u = miss ? miss : second;
    if (runner_up && u)
        *runner_up = *u;
    if (log) {
        zr_plan_pick_print(best, b1, sizeof b1);
        fprintf(log, "memory plan: limit %llu bytes (%.1f MiB) per rank; speed model: the bench "
                "figures of docs/PERFORMANCE.md\n  chose %s: %.1f MiB per rank predicted, step "
                "time %.2fx\n", (unsigned long long)limit, limit / 1048576.0, b1,
                best->bytes / 1048576.0, best->cost);
        if (u) {
            zr_plan_pick_print(u, b2, sizeof b2);
            if (miss)
                fprintf(log, "  rejected %s (step time %.2fx): %.1f MiB per rank predicted, "
                        "over the limit\n", b2, u->cost, u->bytes / 1048576.0);
            else
                fprintf(log, "  rejected %s: %.1f MiB per rank fits, but step time %.2fx is "
                        "slower\n", b2, u->bytes / 1048576.0, u->cost);
        }
    }
    free(all);
    zr_err_clear();
    return 0;
}
