/*
 * gpt2.c: the GPT-2 naming contract between checkpoints and models (zfmt.h, "GPT-2 naming"):
 * the layout of a GPT-2 of a given shape (groups wte, wpe, h.0 ... h.<L-1>, ln_f; states param,
 * exp_avg, exp_avg_sq), the manifest's model section <-> zfmt_gpt2_config, and the per-layer
 * tensor kinds in llm.c's order that the converters share.
 */
#include "fmtutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const zfmt__gpt2_kinds[ZFMT__GPT2_KINDS] = {
    "ln_1.weight",        "ln_1.bias",       "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",       "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight", "mlp.c_proj.bias",
};

void zfmt__gpt2_kind_shape(const zfmt_gpt2_config *c, size_t k, size_t *ndim, uint64_t shape[2])
{
    uint64_t C = c->dim;
    /* [out, in] for weights, [out] for biases and norms */
    static const struct {
        unsigned out_mul, in_mul; /* in_mul 0: a vector */
    } m[ZFMT__GPT2_KINDS] = {
        {1, 0}, {1, 0}, {3, 1}, {3, 0}, {1, 1}, {1, 0},
        {1, 0}, {1, 0}, {4, 1}, {4, 0}, {1, 4}, {1, 0},
    };
    shape[0] = m[k].out_mul * C;
    shape[1] = m[k].in_mul * C;
    *ndim = m[k].in_mul ? 2 : 1;
}

int zfmt__gpt2_kind_is_conv1d(size_t k) { return k == 2 || k == 4 || k == 8 || k == 10; }

int zfmt__gpt2_check(const zfmt_gpt2_config *c)
{
    const struct {
        const char *name;
        uint32_t v;
    } f[] = {{"layers", c->layers}, {"heads", c->heads}, {"dim", c->dim}, {"ctx", c->ctx},
             {"vocab", c->vocab}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (!f[i].v)
            return zr_err_set(ZR_EINVAL, "gpt2 config: field '%s' is 0 (expected >= 1)",
                              f[i].name);
    if (c->dim % c->heads)
        return zr_err_set(ZR_EINVAL, "gpt2 config: dim %u is not a multiple of heads %u",
                          c->dim, c->heads);
    /* every tensor stays far below the format's 2^50 elements; h.N names fit in 32 bytes */
    if ((uint64_t)c->vocab * c->dim > ((uint64_t)1 << 48) ||
        (uint64_t)c->ctx * c->dim > ((uint64_t)1 << 48) ||
        (uint64_t)c->dim * c->dim > ((uint64_t)1 << 44))
        return zr_err_set(ZR_EINVAL, "gpt2 config: vocab %u, ctx %u, dim %u: tensors too large",
                          c->vocab, c->ctx, c->dim);
    uint64_t per_layer = 12 * (uint64_t)c->dim * c->dim + 13 * (uint64_t)c->dim;
    if (c->layers > ((uint64_t)1 << 50) / per_layer)
        return zr_err_set(ZR_EINVAL, "gpt2 config: %u layers of dim %u: model too large",
                          c->layers, c->dim);
    return 0;
}

int zfmt__find_tensor(const zck_layout *L, const char *name, size_t *group, zck_tensor_info *t)
{
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        for (size_t i = 0; i < zck_layout_group_n_tensors(L, g); i++) {
            zck_layout_tensor(L, g, i, t);
            if (!strcmp(t->name, name)) {
                *group = g;
                return 0;
            }
        }
    return zr_err_set(ZR_ENOTFOUND, "no tensor '%s' in the layout", name);
}

int zfmt_gpt2_layout(zck_layout **out, const zfmt_gpt2_config *c)
{
    ZR_TRY(zfmt__gpt2_check(c));
    zck_layout *L = NULL;
    int rc = 0;
    size_t g;
    char name[64];
    uint64_t C = c->dim, sh[2];
    size_t nd;
    ZR_TRY_GOTO(zck_layout_new(&L), rc, fail);
    ZR_TRY_GOTO(zck_layout_add_state(L, "param", ZCK_F32), rc, fail);
    ZR_TRY_GOTO(zck_layout_add_state(L, "exp_avg", ZCK_F32), rc, fail);
    ZR_TRY_GOTO(zck_layout_add_state(L, "exp_avg_sq", ZCK_F32), rc, fail);

    sh[0] = c->vocab; /* wte [V, C] */
    sh[1] = C;
    ZR_TRY_GOTO(zck_layout_add_group(L, &g, "wte"), rc, fail);
    ZR_TRY_GOTO(zck_layout_add_tensor(L, g, "wte", ZCK_F32, 2, sh), rc, fail);
    sh[0] = c->ctx; /* wpe [T, C] */
    ZR_TRY_GOTO(zck_layout_add_group(L, &g, "wpe"), rc, fail);
    ZR_TRY_GOTO(zck_layout_add_tensor(L, g, "wpe", ZCK_F32, 2, sh), rc, fail);
    for (uint32_t l = 0; l < c->layers; l++) {
        snprintf(name, sizeof name, "h.%u", l);
        ZR_TRY_GOTO(zck_layout_add_group(L, &g, name), rc, fail);
        for (size_t k = 0; k < ZFMT__GPT2_KINDS; k++) {
            snprintf(name, sizeof name, "h.%u.%s", l, zfmt__gpt2_kinds[k]);
            zfmt__gpt2_kind_shape(c, k, &nd, sh);
            ZR_TRY_GOTO(zck_layout_add_tensor(L, g, name, ZCK_F32, nd, sh), rc, fail);
        }
    }
    ZR_TRY_GOTO(zck_layout_add_group(L, &g, "ln_f"), rc, fail);
    ZR_TRY_GOTO(zck_layout_add_tensor(L, g, "ln_f.weight", ZCK_F32, 1, &C), rc, fail);
    ZR_TRY_GOTO(zck_layout_add_tensor(L, g, "ln_f.bias", ZCK_F32, 1, &C), rc, fail);
    *out = L;
    return 0;
fail:
    zck_layout_free(L);
    return rc;
}

int zfmt_gpt2_config_from_json(zfmt_gpt2_config *out, const char *model_json)
{
    json_error_t jerr;
    json_t *root = json_loads(model_json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zr_err_set(ZR_EINVAL, "model section: invalid JSON at line %d: %s", jerr.line,
                          jerr.text);
    int rc = 0;
    zfmt_gpt2_config c;
    if (!json_is_object(root)) {
        rc = zr_err_set(ZR_EINVAL, "model section: not a JSON object");
        goto out;
    }
    json_t *arch = json_object_get(root, "arch");
    if (!arch) {
        rc = zr_err_set(ZR_EINVAL, "model section: missing field 'arch'");
        goto out;
    }
    if (!json_is_string(arch) || strcmp(json_string_value(arch), "gpt2")) {
        rc = zr_err_set(ZR_EINVAL, "model section: field 'arch': expected \"gpt2\", found %s",
                        json_is_string(arch) ? json_string_value(arch) : "a non-string");
        goto out;
    }
    const char *names[] = {"layers", "heads", "dim", "ctx", "vocab"};
    uint32_t *dst[] = {&c.layers, &c.heads, &c.dim, &c.ctx, &c.vocab};
    for (size_t i = 0; i < 5; i++) {
        json_t *v = json_object_get(root, names[i]);
        if (!v) {
            rc = zr_err_set(ZR_EINVAL, "model section: missing field '%s'", names[i]);
            goto out;
        }
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > (json_int_t)UINT32_MAX) {
            rc = zr_err_set(ZR_EINVAL, "model section: field '%s': expected an integer in [1, "
                            "%u]", names[i], UINT32_MAX);
            goto out;
        }
        *dst[i] = (uint32_t)json_integer_value(v);
    }
    ZR_TRY_GOTO(zfmt__gpt2_check(&c), rc, out);
    *out = c;
out:
    json_decref(root);
    return rc;
}

int zfmt_gpt2_config_to_json(char **out, const zfmt_gpt2_config *c)
{
    ZR_TRY(zfmt__gpt2_check(c));
    json_t *root = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "arch", "gpt2", "layers",
                             (json_int_t)c->layers, "heads", (json_int_t)c->heads, "dim",
                             (json_int_t)c->dim, "ctx", (json_int_t)c->ctx, "vocab",
                             (json_int_t)c->vocab);
    if (!root)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    char *copy = zfmt__json_dump(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!copy)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    *out = copy;
    return 0;
}
