/*
 * memplan.c: the dry run's figures besides the engine's (train_int.h) and its JSON (train.h's
 * zr_mem_plan_json): the host staging of asynchronous saves and the process's own bytes.
 */
#include "saver.h"
#include "train_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
               "\"micro_batch\":%u,\"seq\":%u,\"recompute\":\"%s\",\"on_gpu\":%s,"
               "\"formula_bytes\":%.0f,\"ranks\":[",
            p->layers, (unsigned long long)p->numel, p->zero_stage, p->world, p->micro_batch,
            p->seq, zr_train__recompute_name(p->recompute), p->on_gpu ? "true" : "false",
            p->formula_bytes);
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

void zr_mem_plan_free(zr_mem_plan *p)
{
    if (!p)
        return;
    free(p->from);
    free(p->rank);
    memset(p, 0, sizeof *p);
}

/* The ZeRO formula's bytes per parameter for params, grads and AdamW states: a + b / W. */
static const double per_param[4][2] = {{16, 0}, {8, 8}, {4, 12}, {0, 16}};

int zr_train_mem_plan(zr_mem_plan *out, const zr_train_opts *o, int world)
{
    memset(out, 0, sizeof *out);
    ZR_TRY(zr_train__check_opts(o));
    ZR_TRY(zr_train__check_world(o, world));
    zck_reader *rd = NULL;
    zck_layout *L = NULL;
    zr_gpt2_config cfg;
    int rc = 0;
    ZR_TRY_GOTO(zr_train__resume_path(&out->from, o, NULL, 1), rc, out);
    if (out->from)
        ZR_TRY_GOTO(zck_reader_open(&rd, out->from), rc, out);
    ZR_TRY_GOTO(zr_train__pick_config(&cfg, o, rd), rc, out);
    ZR_TRY_GOTO(zr_train__seq(&out->seq, o, &cfg), rc, out);
    out->layers = cfg.layers;
    out->llama = cfg.family == ZR_FAMILY_LLAMA;
    out->zero_stage = o->zero_stage;
    out->world = world;
    out->micro_batch = o->micro_batch ? o->micro_batch : o->batch / (uint32_t)world;
    ZR_TRY_GOTO(zr_gpt2_layout(&L, &cfg), rc, out);
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        out->numel += zck_layout_group_numel(L, g);
    /* on a GPU: the device model's activations (bf16 copies, the T x T attention) */
    const zr_device_ops *ops = NULL;
    if (o->device == ZR_DEVICE_CUDA ||
        (o->device == ZR_DEVICE_AUTO && zr_device_cuda_available()))
        ZR_TRY_GOTO(zr_device_open(&ops), rc, out);
    out->on_gpu = ops != NULL;
    out->recompute = o->recompute;
    uint64_t acts = zr_model_activation_bytes(&cfg, out->micro_batch, out->seq,
                                              (zr_recompute)o->recompute);
    if (ops)
        ZR_TRY_GOTO(zr_device_activation_bytes(&acts, ops, &cfg, out->micro_batch, out->seq,
                                               (zr_recompute)o->recompute), rc, out);
    out->per_param[0] = per_param[o->zero_stage][0];
    out->per_param[1] = per_param[o->zero_stage][1];
    out->formula_bytes = (out->per_param[0] + out->per_param[1] / world) * (double)out->numel;
    if (!(out->rank = calloc((size_t)world, sizeof *out->rank))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    zr_zero_opts zo = zr_train__zero_opts(o);
    zo.swap_dir = "(dry run)";
    for (int q = 0; q < world; q++) {
        zr_zero_bytes b;
        ZR_TRY_GOTO(zr_zero_plan(&b, L, world, q, &zo), rc, out);
        zr_rank_mem *m = &out->rank[q];
        m->params = b.params;
        m->grads = b.grads;
        m->optimizer = b.optimizer;
        m->buffers = b.buffers;
        m->activations = acts;
        m->swap_staging = b.swap_staging;
        m->pinned = b.pinned;
        m->save_staging = zr_train__save_staging(o, &b, ops != NULL);
        m->baseline = zr_train__baseline(&cfg, out->micro_batch, out->seq, o, world);
        m->total = b.params + b.grads + b.optimizer + b.buffers + acts + m->save_staging +
                   m->pinned + m->baseline;
    }
out:
    zck_reader_free(rd);
    zck_layout_free(L);
    if (rc)
        zr_mem_plan_free(out);
    return rc;
}

static int dry_run(const zr_train_opts *o, int world, FILE *f,
                   void (*print)(const zr_mem_plan *, FILE *))
{
    zr_mem_plan p;
    ZR_TRY(zr_train_mem_plan(&p, o, world));
    print(&p, f);
    zr_mem_plan_free(&p);
    return 0;
}

int zr_train_dry_run_json(const zr_train_opts *o, int world, FILE *f)
{
    return dry_run(o, world, f, zr_mem_plan_json);
}

int zr_train_dry_run(const zr_train_opts *o, int world, FILE *f)
{
    return dry_run(o, world, f, zr_mem_plan_print);
}

void zr_mem_plan_print(const zr_mem_plan *p, FILE *f)
{
    double mib = 1.0 / (1 << 20);
    fprintf(f, "dry run: %s %u layers, %llu parameters, ZeRO stage %d, world %d, "
               "micro-batch %u x %u tokens per rank, recompute %s, on %s%s%s\n",
            p->llama ? "Llama" : "GPT-2", p->layers,
            (unsigned long long)p->numel, p->zero_stage, p->world, p->micro_batch, p->seq,
            zr_train__recompute_name(p->recompute),
            p->on_gpu ? "the GPU (device memory; activations in bf16 and fp32)" : "the CPU",
            p->from ? "; resuming from " : "", p->from ? p->from : "");
    fprintf(f, "expected bytes per rank (MiB): formula %g + %g/W bytes per parameter for "
               "params, grads and AdamW states\n", p->per_param[0], p->per_param[1]);
    fprintf(f, "  rank      params       grads   optimizer     buffers  activations  "
               "save staging  process     total   formula\n");
    for (int q = 0; q < p->world; q++) {
        const zr_rank_mem *m = &p->rank[q];
        fprintf(f, "  %4d %11.1f %11.1f %11.1f %11.1f %12.1f %13.1f %8.1f %9.1f %9.1f\n", q,
                m->params * mib, m->grads * mib, m->optimizer * mib, m->buffers * mib,
                m->activations * mib, m->save_staging * mib, (m->baseline + m->pinned) * mib,
                m->total * mib, p->formula_bytes * mib);
    }
}
