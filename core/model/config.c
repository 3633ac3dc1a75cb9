/*
 * config.c: the GPT-2 model configuration of the engine (zr.h, "model configuration"): parsing
 * a model spec ("tiny", "gpt2", "gpt2-medium", "gpt2:layers=4,heads=4,..."), the manifest's
 * model section <-> zr_gpt2_config, the checkpoint layout of a model of that shape, and where
 * the model's arena holds each tensor (zr_gpt2_offsets). The naming contract itself (fields,
 * checks, JSON, groups, tensors, shapes) is ckpt's family table (zck.h, "model families",
 * ckpt/arch.c), which formats/ uses too, and zr_gpt2_config is its zck_gpt2_config: this file
 * only binds the model's tensor roles to it.
 */
#include "model.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- model specs */

static const struct {
    const char *name;
    zr_gpt2_config c;
} presets[] = {
    {"tiny", {4, 4, 128, 128, 256}},
    {"gpt2", {12, 12, 768, 1024, 50257}},
    {"gpt2-medium", {24, 16, 1024, 1024, 50257}},
};

int zr_gpt2_config_parse(zr_gpt2_config *out, const char *spec)
{
    assert(out && spec);
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (!strcmp(spec, presets[i].name)) {
            *out = presets[i].c;
            return 0;
        }
    if (strncmp(spec, "gpt2:", 5))
        return zr_err_set(ZR_EINVAL, "model '%s': unknown (expected tiny, gpt2, gpt2-medium or "
                          "gpt2:layers=N,heads=N,dim=N,ctx=N,vocab=N)", spec);
    /* fields not given keep the family's defaults (the tiny values) */
    zck_arch_config a;
    zck_arch_config_init(&a, zck_arch_gpt2());
    char what[1100];
    snprintf(what, sizeof what, "model '%.1024s'", spec);
    ZR_TRY(zck_arch_config_set_fields(&a, spec + 5, what));
    zck_gpt2_from_arch(out, &a);
    return 0;
}

/* ---------------------------------------------------------------- model section JSON */

int zr_gpt2_config_to_json(char **out, const zr_gpt2_config *c)
{
    return zck_gpt2_to_json(out, c);
}

int zr_gpt2_config_from_json(zr_gpt2_config *out, const char *json)
{
    assert(out && json);
    return zck_gpt2_from_json(out, json);
}

/* ---------------------------------------------------------------- layout */

int zr_gpt2_layout(zck_layout **out, const zr_gpt2_config *c)
{
    return zck_gpt2_layout(out, c);
}

/* The table's name of each role the model's maths gives a block tensor (zr_gpt2_blk). */
static const char *const blk_names[ZR_BLK_COUNT] = {
    [ZR_BLK_LN1W] = "ln_1.weight",           [ZR_BLK_LN1B] = "ln_1.bias",
    [ZR_BLK_QKVW] = "attn.c_attn.weight",    [ZR_BLK_QKVB] = "attn.c_attn.bias",
    [ZR_BLK_ATTPROJW] = "attn.c_proj.weight", [ZR_BLK_ATTPROJB] = "attn.c_proj.bias",
    [ZR_BLK_LN2W] = "ln_2.weight",           [ZR_BLK_LN2B] = "ln_2.bias",
    [ZR_BLK_FCW] = "mlp.c_fc.weight",        [ZR_BLK_FCB] = "mlp.c_fc.bias",
    [ZR_BLK_FCPROJW] = "mlp.c_proj.weight",  [ZR_BLK_FCPROJB] = "mlp.c_proj.bias",
};

/* Offset of tensor `name` inside group g, its element count into *numel. */
static int tensor_at(uint64_t *out, uint64_t *numel, const zck_layout *L, size_t g,
                     const char *name)
{
    zck_tensor_info t;
    for (size_t i = 0; i < zck_layout_group_n_tensors(L, g); i++) {
        zck_layout_tensor(L, g, i, &t);
        if (!strcmp(t.name, name)) {
            *out = t.offset;
            if (numel)
                *numel = t.numel;
            return 0;
        }
    }
    return zr_err_set(ZR_ENOTFOUND, "gpt2 layout: no tensor '%s' in group %s", name,
                      zck_layout_group_name(L, g));
}

/* The arena is the layout's groups end to end; the model's maths addresses groups by index
 * (wte 0, wpe 1, h.<l> 2 + l, ln_f L + 2) and block tensors by role. */
static int fill_offsets(zr_gpt2_offsets *o, const zck_layout *L, uint32_t layers)
{
    const char *const want[] = {"wte", "wpe", "h.0", "ln_f"};
    const size_t at[] = {0, 1, 2, (size_t)layers + 2};
    uint64_t *dst[] = {&o->wte, &o->wpe, &o->h0, &o->ln_f};
    if (zck_layout_n_groups(L) != (size_t)layers + 3)
        return zr_err_set(ZR_EINVAL, "gpt2 layout: %zu groups (the model expects %u)",
                          zck_layout_n_groups(L), layers + 3);
    uint64_t off = 0;
    for (size_t g = 0, k = 0; g < zck_layout_n_groups(L); g++) {
        if (k < 4 && g == at[k]) {
            if (strcmp(zck_layout_group_name(L, g), want[k]))
                return zr_err_set(ZR_EINVAL, "gpt2 layout: group %zu is '%s' (the model "
                                  "expects '%s')", g, zck_layout_group_name(L, g), want[k]);
            *dst[k++] = off;
        }
        off += zck_layout_group_numel(L, g);
    }
    o->numel = off;
    o->layer_numel = zck_layout_group_numel(L, 2);
    char name[64];
    for (int k = 0; k < ZR_BLK_COUNT; k++) {
        snprintf(name, sizeof name, "h.0.%s", blk_names[k]);
        ZR_TRY(tensor_at(&o->blk[k], &o->blk_numel[k], L, 2, name));
    }
    ZR_TRY(tensor_at(&o->lnf_w, NULL, L, (size_t)layers + 2, "ln_f.weight"));
    ZR_TRY(tensor_at(&o->lnf_b, NULL, L, (size_t)layers + 2, "ln_f.bias"));
    return 0;
}

int zr_gpt2_offsets_get(zr_gpt2_offsets *out, const zr_gpt2_config *c)
{
    zck_layout *L = NULL;
    ZR_TRY(zr_gpt2_layout(&L, c));
    zr_gpt2_offsets o;
    memset(&o, 0, sizeof o);
    int rc = fill_offsets(&o, L, c->layers);
    zck_layout_free(L);
    if (!rc)
        *out = o;
    return rc;
}

/* The groups and tensors of a checkpoint's layout against the model's (states aside). */
int zr_gpt2_layout_check(const zck_layout *ck, const zck_layout *want, const char *path)
{
    if (zck_layout_n_groups(ck) != zck_layout_n_groups(want))
        return zr_err_set(ZR_EINVAL, "%s: checkpoint has %zu parameter groups, this model %zu "
                          "(another model shape)", path, zck_layout_n_groups(ck),
                          zck_layout_n_groups(want));
    for (size_t g = 0; g < zck_layout_n_groups(want); g++) {
        if (strcmp(zck_layout_group_name(ck, g), zck_layout_group_name(want, g)) ||
            zck_layout_group_numel(ck, g) != zck_layout_group_numel(want, g) ||
            zck_layout_group_n_tensors(ck, g) != zck_layout_group_n_tensors(want, g))
            return zr_err_set(ZR_EINVAL, "%s: group %zu is '%s' of %llu elements, this model "
                              "expects '%s' of %llu (another model shape)", path, g,
                              zck_layout_group_name(ck, g),
                              (unsigned long long)zck_layout_group_numel(ck, g),
                              zck_layout_group_name(want, g),
                              (unsigned long long)zck_layout_group_numel(want, g));
        for (size_t t = 0; t < zck_layout_group_n_tensors(want, g); t++) {
            zck_tensor_info a, b;
            zck_layout_tensor(ck, g, t, &a);
            zck_layout_tensor(want, g, t, &b);
            if (strcmp(a.name, b.name) || a.numel != b.numel || a.offset != b.offset)
                return zr_err_set(ZR_EINVAL, "%s: tensor '%s' where this model has '%s'", path,
                                  a.name, b.name);
        }
    }
    return 0;
}
