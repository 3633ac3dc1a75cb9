/*
 * options.c: the checks of zr_train_opts (train_int.h), whatever the world size and then for
 * it, and what the options pick: the model config and the sequence length.
 */
#include "train_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The validation options (--eval-every and its companions). */
/* an enum option a library caller passes: v in lo..hi, whose names are `names` */
static int enum_ok(int v, int lo, int hi, const char *opt, const char *names)
{
    if (v < lo || v > hi)
        return zr_err_set(ZR_EINVAL, "%s %d: expected %s (%d..%d)", opt, v, names, lo, hi);
    return 0;
}

static int check_eval_opts(const zr_train_opts *o)
{
    if (o->val_data && !o->val_data[0])
        return zr_err_set(ZR_EINVAL, "--val-data: empty");
    if (!o->eval_every)
        return 0;
    if (o->eval_batches < 1)
        return zr_err_set(ZR_EINVAL, "--eval-batches 0: at least 1 (with --eval-every)");
    if ((uint64_t)o->eval_batches * o->batch > (1u << 24))
        return zr_err_set(ZR_EINVAL, "--eval-batches %u x --batch %u: %llu sequences per "
                          "evaluation, at most %u", o->eval_batches, o->batch,
                          (unsigned long long)o->eval_batches * o->batch, 1u << 24);
    return 0;
}

/* Every option, whatever the world size: ZR_EINVAL naming the first bad one. */
int zr_train__check_opts(const zr_train_opts *o)
{
    if (o->batch < 1)
        return zr_err_set(ZR_EINVAL, "--batch %u: at least 1", o->batch);
    if (o->steps < 1)
        return zr_err_set(ZR_EINVAL, "--steps must be at least 1");
    if (!(o->lr > 0) || !isfinite(o->lr))
        return zr_err_set(ZR_EINVAL, "--lr %g: expected a finite number > 0", (double)o->lr);
    if (!(o->min_lr_ratio >= 0 && o->min_lr_ratio <= 1))
        return zr_err_set(ZR_EINVAL, "--min-lr-ratio %g: expected 0..1",
                          (double)o->min_lr_ratio);
    if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
        return zr_err_set(ZR_EINVAL, "--weight-decay %g: expected a finite number >= 0",
                          (double)o->weight_decay);
    if (!(o->grad_clip >= 0) || !isfinite(o->grad_clip))
        return zr_err_set(ZR_EINVAL, "--grad-clip %g: expected a finite number >= 0",
                          (double)o->grad_clip);
    if (!(o->time_limit >= 0) || !isfinite(o->time_limit))
        return zr_err_set(ZR_EINVAL, "--time-limit %g: expected a finite number >= 0",
                          o->time_limit);
    if (o->zero_stage < 0 || o->zero_stage > 3)
        return zr_err_set(ZR_EINVAL, "--zero %d: expected 0..3", o->zero_stage);
    if (o->threads < 0 || o->threads > 4096)
        return zr_err_set(ZR_EINVAL, "--threads %d: expected 1..4096 (0: 1)", o->threads);
    if (!o->ckpt_dir || !o->ckpt_dir[0])
        return zr_err_set(ZR_EINVAL, "--ckpt-dir: empty");
    if (!o->data || !o->data[0])
        return zr_err_set(ZR_EINVAL, "--data: empty");
    ZR_TRY(check_eval_opts(o));
    if (o->tokenizer_json && o->tokenizer_bytes > ZCK_MAX_FILE_BYTES)
        return zr_err_set(ZR_EINVAL, "--tokenizer %s: %zu bytes; every checkpoint records it as "
                          "the extra file tokenizer.json, of at most %zu bytes (64 MiB)",
                          o->tokenizer_path ? o->tokenizer_path : "(given)", o->tokenizer_bytes,
                          ZCK_MAX_FILE_BYTES);
    ZR_TRY(enum_ok(o->verify_on_resume, ZR_VERIFY_FULL, ZR_VERIFY_OFF, "--verify-on-resume",
                   "ZR_VERIFY_FULL, _QUICK or _OFF"));
    ZR_TRY(enum_ok(o->device, ZR_DEVICE_CPU, ZR_DEVICE_AUTO, "--device",
                   "ZR_DEVICE_CPU, _CUDA or _AUTO"));
    if (o->async_save < -1 || o->async_save > 1)
        return zr_err_set(ZR_EINVAL, "--async-save %d: expected -1 (auto), 0 (off) or 1 (on)",
                          o->async_save);
    if (o->save_buffer && o->save_buffer < 4096)
        return zr_err_set(ZR_EINVAL, "--save-buffer %zu: expected 0 (the default) or at "
                          "least 4096 bytes", o->save_buffer);
    ZR_TRY(enum_ok(o->offload_optimizer, ZR_OFFLOAD_NONE, ZR_OFFLOAD_NVME,
                   "--offload-optimizer", "ZR_OFFLOAD_NONE, _CPU or _NVME"));
    ZR_TRY(enum_ok(o->offload_params, ZR_OFFLOAD_NONE, ZR_OFFLOAD_NVME, "--offload-params",
                   "ZR_OFFLOAD_NONE, _CPU or _NVME"));
    ZR_TRY(enum_ok(o->recompute, ZR_RECOMPUTE_NONE, ZR_RECOMPUTE_SELECTIVE, "--recompute",
                   "ZR_RECOMPUTE_NONE, _LAYER or _SELECTIVE"));
    if (o->offload_params != ZR_OFFLOAD_NONE && o->zero_stage != 3)
        return zr_err_set(ZR_EINVAL, "--offload-params needs ZeRO stage 3, not %d",
                          o->zero_stage);
    if (!o->sample_every && o->sample_prompt)
        return zr_err_set(ZR_EINVAL, "--prompt sets the prompt of the samples: add "
                          "--sample-every N");
    if (o->sample_every && o->sample_tokens < 1)
        return zr_err_set(ZR_EINVAL, "--sample-tokens 0: at least 1");
    if (o->sample_every && o->sample_prompt && !o->sample_prompt[0])
        return zr_err_set(ZR_EINVAL, "--prompt: empty (the samples need at least one byte)");
    if (o->offload_optimizer != ZR_OFFLOAD_NVME && o->offload_params != ZR_OFFLOAD_NVME)
        return 0;
    if (!o->nvme_path || !o->nvme_path[0])
        return zr_err_set(ZR_EINVAL, "offload to nvme needs --nvme-path DIR");
    if (o->aio_depth < 1)
        return zr_err_set(ZR_EINVAL, "--aio-queue-depth 0: at least 1");
    if (o->offload_buffers < 2)
        return zr_err_set(ZR_EINVAL, "--offload-buffers %u: at least 2", o->offload_buffers);
    if (!o->aio_block || o->aio_block % 4096)
        return zr_err_set(ZR_EINVAL, "--aio-block-size %zu: expected a multiple of 4096",
                          o->aio_block);
    return 0;
}

/* The options that depend on the world size W. */
int zr_train__check_world(const zr_train_opts *o, int W)
{
    if (o->batch % (uint32_t)W) {
        uint64_t below = o->batch / (uint32_t)W * (uint64_t)W, above = below + (uint64_t)W;
        char use[64];
        if (below)
            snprintf(use, sizeof use, "use --batch %llu or %llu", (unsigned long long)below,
                     (unsigned long long)above);
        else
            snprintf(use, sizeof use, "use --batch %llu", (unsigned long long)above);
        return zr_err_set(ZR_EINVAL, "--batch %u is not a multiple of the world size %d (each "
                          "rank takes an equal share of the global batch): %s", o->batch, W,
                          use);
    }
    uint32_t per_rank = o->batch / (uint32_t)W;
    if (o->micro_batch && per_rank % o->micro_batch)
        return zr_err_set(ZR_EINVAL, "--micro-batch %u does not divide the %u sequences per "
                          "rank (--batch %u over %d rank%s)", o->micro_batch, per_rank,
                          o->batch, W, W == 1 ? "" : "s");
    return 0;
}

/* The model config: --model, else the checkpoint's, else tiny; a checkpoint of another shape
 * than --model says is refused. */
int zr_train__pick_config(zr_gpt2_config *cfg, const zr_train_opts *o, zck_reader *rd)
{
    if (o->model) {
        ZR_TRY(zr_gpt2_config_parse(cfg, o->model));
        zr_gpt2_config ck;
        if (rd && zr_gpt2_config_from_json(&ck, zck_reader_model_json(rd)) == 0 &&
            memcmp(&ck, cfg, sizeof ck)) {
            char *want = NULL;
            int rc = zr_gpt2_config_to_json(&want, cfg);
            rc = zr_err_set(ZR_EINVAL, "%s: checkpoint of another model shape (%s; --model "
                            "says %s)", zck_reader_path(rd), zck_reader_model_json(rd),
                            rc ? "?" : want);
            free(want);
            return rc;
        }
        zr_err_clear();
        return 0;
    }
    if (rd) {
        int rc = zr_gpt2_config_from_json(cfg, zck_reader_model_json(rd));
        if (rc < 0)
            zr_err_prefix("%s: model section: ", zck_reader_path(rd));
        return rc;
    }
    return zr_gpt2_config_parse(cfg, "tiny");
}

/* The sequence length: --seq, else the model's context, which it may not exceed. */
int zr_train__seq(uint32_t *out, const zr_train_opts *o, const zr_gpt2_config *cfg)
{
    *out = o->seq ? o->seq : cfg->ctx;
    if (*out > cfg->ctx)
        return zr_err_set(ZR_EINVAL, "--seq %u is longer than the model's context %u", *out,
                          cfg->ctx);
    return 0;
}

const char *zr_train__recompute_name(int recompute)
{
    static const char *const names[] = {"none", "layer", "selective"};
    return recompute >= 0 && recompute <= ZR_RECOMPUTE_SELECTIVE ? names[recompute] : "?";
}
