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

/* Hugging Face's GPT-2 keeps every matrix of a block in a Conv1D: c_attn, c_proj, c_fc, c_proj */
int zfmt__gpt2_kind_is_conv1d(size_t k)
{
    zfmt_gpt2_config c = {1, 1, 1, 1, 1};
    size_t nd;
    uint64_t sh[2];
    zfmt__gpt2_kind_shape(&c, k, &nd, sh);
    return nd == 2;
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

/* ---------------------------------------------------------------- Hugging Face names
 *
 * Hugging Face's GPT2LMHeadModel names our tensors "transformer.<ours>", but for the two
 * embeddings, which are modules there ("transformer.wte.weight"); its Conv1D weights are
 * stored [in, out]. lm_head.weight is wte (tied) and the attn.bias / attn.masked_bias causal
 * masks are buffers, not parameters. This table is the one place both directions use. */
static const struct {
    const char *ours, *hf;
} hf_renamed[] = {{"wte", "wte.weight"}, {"wpe", "wpe.weight"}};
#define HF_PREFIX "transformer."

int zfmt__gpt2_hf_name(char *out, size_t n, const char *ours, int *transposed)
{
    const char *base = ours;
    for (size_t i = 0; i < sizeof hf_renamed / sizeof *hf_renamed; i++)
        if (!strcmp(ours, hf_renamed[i].ours))
            base = hf_renamed[i].hf;
    *transposed = 0;
    const char *dot = !strncmp(ours, "h.", 2) ? strchr(ours + 2, '.') : NULL;
    for (size_t k = 0; dot && k < ZFMT__GPT2_KINDS; k++)
        if (!strcmp(dot + 1, zfmt__gpt2_kind(k)))
            *transposed = zfmt__gpt2_kind_is_conv1d(k);
    if ((size_t)snprintf(out, n, HF_PREFIX "%s", base) >= n)
        return zr_err_set(ZR_EINVAL, "tensor name '%s' too long", ours);
    return 0;
}

/* "h.<digits>.attn.bias" or "h.<digits>.attn.masked_bias" */
static int is_hf_buffer(const char *name)
{
    if (strncmp(name, "h.", 2) || name[2] < '0' || name[2] > '9')
        return 0;
    const char *p = name + 2;
    while (*p >= '0' && *p <= '9')
        p++;
    return !strcmp(p, ".attn.bias") || !strcmp(p, ".attn.masked_bias");
}

const char *zfmt__gpt2_from_hf(const char *hf)
{
    if (!strncmp(hf, HF_PREFIX, strlen(HF_PREFIX)))
        hf += strlen(HF_PREFIX);
    if (!strcmp(hf, "lm_head.weight") || is_hf_buffer(hf))
        return NULL;
    for (size_t i = 0; i < sizeof hf_renamed / sizeof *hf_renamed; i++) {
        if (!strcmp(hf, hf_renamed[i].hf))
            return hf_renamed[i].ours;
        if (!strcmp(hf, hf_renamed[i].ours))
            return ""; /* our name, not Hugging Face's */
    }
    return hf;
}
