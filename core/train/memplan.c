/*
 * memplan.c: the dry run's figures besides the engine's (train_int.h) and its JSON (train.h's
 * zr_mem_plan_json): the host staging of asynchronous saves and the process's own bytes.
 */
#include "saver.h"
#include "train_int.h"

#include <stdio.h>

uint64_t zr_train__save_staging(const zr_train_opts *o, const zr_zero_bytes *b, int on_gpu)
{
    int offloaded = o->offload_optimizer == ZR_OFFLOAD_NVME ||
                    o->offload_params == ZR_OFFLOAD_NVME;
    if (!(o->async_save > 0 || (o->async_save < 0 && !offloaded)))
        return 0;
    uint64_t part = b->part ? b->part : sizeof(float);
    if (on_gpu || offloaded) /* a copy of the partitions (saver.h: not live) */
        return (part + 4095) & ~(uint64_t)4095;
    uint64_t buf = o->save_buffer ? o->save_buffer : zr_saver_default_buffer(part / 4);
    buf = buf / sizeof(float) * sizeof(float);
    buf = buf < part ? buf : part;
    return (buf + 4095) & ~(uint64_t)4095;
}

/* Measured on this project's CPU builds (docs/PERFORMANCE.md, "Memory that is predicted"):
 * about 10 MiB of code, libraries and the data's tables; the shared-memory communicator's
 * segment, 4 MiB per rank, mapped by every rank; the BLAS packing buffers each compute thread
 * touches, up to 16 MiB from a model width of 256 on, less for narrower models. */
uint64_t zr_train__baseline(const zr_gpt2_config *cfg, uint32_t micro_batch, uint32_t seq,
                            const zr_train_opts *o, int world)
{
    (void)micro_batch;
    (void)seq;
    const uint64_t mib = (uint64_t)1 << 20;
    uint64_t base = 10 * mib + (world > 1 ? (uint64_t)world * 4 * mib : 0);
    double w = cfg->dim >= 256 ? 1.0 : (double)cfg->dim * cfg->dim / (256.0 * 256.0);
    int threads = o->threads > 0 ? o->threads : 1;
    return base + (uint64_t)(w * 16 * (double)mib) * (uint64_t)threads;
}

void zr_mem_plan_json(const zr_mem_plan *p, FILE *f)
{
    fprintf(f, "{\"layers\":%u,\"parameters\":%llu,\"zero_stage\":%d,\"world\":%d,"
               "\"micro_batch\":%u,\"seq\":%u,\"on_gpu\":%s,\"formula_bytes\":%.0f,\"ranks\":[",
            p->layers, (unsigned long long)p->numel, p->zero_stage, p->world, p->micro_batch,
            p->seq, p->on_gpu ? "true" : "false", p->formula_bytes);
    for (int q = 0; q < p->world; q++) {
        const zr_rank_mem *m = &p->rank[q];
        fprintf(f, "%s{\"rank\":%d,\"params\":%llu,\"grads\":%llu,\"optimizer\":%llu,"
                   "\"gather_buffers\":%llu,\"swap_staging\":%llu,\"save_staging\":%llu,"
                   "\"activations\":%llu,\"pinned\":%llu,\"baseline\":%llu,"
                   "\"total_bytes\":%llu}", q ? "," : "", q,
                (unsigned long long)m->params, (unsigned long long)m->grads,
                (unsigned long long)m->optimizer,
                (unsigned long long)(m->buffers - m->swap_staging),
                (unsigned long long)m->swap_staging, (unsigned long long)m->save_staging,
                (unsigned long long)m->activations, (unsigned long long)m->pinned,
                (unsigned long long)m->baseline, (unsigned long long)m->total);
    }
    fprintf(f, "]}\n");
}
