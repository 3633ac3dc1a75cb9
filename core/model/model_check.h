/*
 * model_check.h: what a new GPT-2 model refuses, written once for the host model (model.c,
 * kernels.c) and the CUDA backend (core/device/cuda/model.cu). The backend is compiled by
 * nvcc without libzck, so these only word the problem; each side raises it with its own
 * error function. Header-only: no object of core/model/ is linked into the backend.
 */
#ifndef ZR_MODEL_CHECK_H
#define ZR_MODEL_CHECK_H

#include "model.h"

#include <math.h>
#include <stdio.h>

/* A size of the config that is 0, or dim not a multiple of heads: 1 with why filled, else 0. */
static inline int zr__config_problem(char *why, size_t cap, const zr_gpt2_config *c)
{
    const struct {
        const char *name;
        uint32_t v;
    } f[] = {{"layers", c->layers}, {"heads", c->heads}, {"dim", c->dim}, {"ctx", c->ctx},
             {"vocab", c->vocab}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (!f[i].v) {
            snprintf(why, cap, "model: %s is 0 (expected >= 1)", f[i].name);
            return 1;
        }
    if (c->dim % c->heads) {
        snprintf(why, cap, "model: dim %u is not a multiple of heads %u", c->dim, c->heads);
        return 1;
    }
    return 0;
}

/* The largest batch and sequence a model is made for, and its hooks (params and grads each
 * come with their _done): 1 with why filled when one is wrong, else 0. */
static inline int zr__new_problem(char *why, size_t cap, size_t max_B, size_t max_T,
                                  uint32_t ctx, const zr_model_hooks *hooks)
{
    if (max_B == 0)
        snprintf(why, cap, "model: max batch 0 (expected >= 1)");
    else if (max_T == 0 || max_T > ctx)
        snprintf(why, cap, "model: max sequence length %zu (expected 1..ctx %u)", max_T, ctx);
    else if (hooks &&
             (!hooks->params != !hooks->params_done || !hooks->grads != !hooks->grads_done))
        snprintf(why, cap, "model: hooks come in pairs (params with params_done, grads with "
                           "grads_done)");
    else if (hooks && (!hooks->grad_piece_numel != !hooks->grad_piece ||
                       !hooks->grad_piece != !hooks->grad_piece_done ||
                       (hooks->grad_piece && !hooks->grads)))
        snprintf(why, cap, "model: the gradient piece hooks come together, and with grads");
    else
        return 0;
    return 1;
}

/* The rotary table of the Llama family: cos and sin [T, hd / 2] of position t times
 * theta^(-2i / hd) (angles in double, rounded to float), the same bits on the host and for the
 * device model. */
static inline void zr__rope_table(float *cos_t, float *sin_t, size_t T, size_t hd, double theta)
{
    size_t half = hd / 2;
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < half; i++) {
            double f = pow(theta, -(double)(2 * i) / (double)hd);
            cos_t[t * half + i] = (float)cos((double)t * f);
            sin_t[t * half + i] = (float)sin((double)t * f);
        }
}

#endif
