/*
 * gpt2.c: the GPT-2 naming contract between checkpoints and models (zfmt.h, "GPT-2 naming"),
 * as formats/ sees it: ckpt's family table (zck.h, "model families", ckpt/arch.c), which holds
 * the contract once for the engine and the converters alike (the layout, the checks, the model
 * section, and zfmt_gpt2_config, which is its zck_gpt2_config), and the per-layer tensor kinds
 * in the table's order that the converters share.
 */
#include "fmtutil.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The table index of per-layer tensor kind k. */
static size_t kind_index(const zck_arch_config *a, size_t k)
{
    zck_arch_tensor_info ti;
    for (size_t t = 0, n = 0; t < zck_arch_n_tensors(a->arch); t++) {
        zck_arch_tensor(a, t, &ti);
        if (ti.per_layer && n++ == k)
            return t;
    }
    assert(!"the family table has fewer per-layer tensors than ZFMT__GPT2_KINDS");
    return 0;
}

const char *zfmt__gpt2_kind(size_t k)
{
    assert(k < ZFMT__GPT2_KINDS);
    zck_arch_config a;
    zck_arch_config_init(&a, zck_arch_gpt2());
    zck_arch_tensor_info ti;
    zck_arch_tensor(&a, kind_index(&a, k), &ti);
    return ti.name;
}

void zfmt__gpt2_kind_shape(const zfmt_gpt2_config *c, size_t k, size_t *ndim, uint64_t shape[2])
{
    assert(k < ZFMT__GPT2_KINDS);
    zck_arch_config a;
    zck_gpt2_to_arch(&a, c);
    zck_arch_tensor_info ti;
    zck_arch_tensor(&a, kind_index(&a, k), &ti);
    *ndim = ti.ndim;
    shape[0] = ti.shape[0];
    shape[1] = ti.ndim == 2 ? ti.shape[1] : 0;
}

int zfmt__gpt2_check(const zfmt_gpt2_config *c)
{
    zck_arch_config a;
    zck_gpt2_to_arch(&a, c);
    return zck_arch_config_check(&a, "gpt2 config");
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
    return zck_gpt2_layout(out, c);
}

int zfmt_gpt2_config_from_json(zfmt_gpt2_config *out, const char *model_json)
{
    return zck_gpt2_from_json(out, model_json);
}

int zfmt_gpt2_config_to_json(char **out, const zfmt_gpt2_config *c)
{
    return zck_gpt2_to_json(out, c);
}
