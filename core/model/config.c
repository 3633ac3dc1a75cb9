/*
 * config.c: the model configuration of the engine (zr.h, "model configuration"): parsing a
 * model spec ("tiny", "gpt2", "gpt2-medium", "gpt2:layers=4,heads=4,...", "llama",
 * "llama:layers=2,...", the Llama presets), the manifest's model section <-> zr_config, the
 * checkpoint layout of a model of that shape, and where the model's arena holds each tensor
 * (zr_gpt2_offsets). The naming contract itself (fields, checks, JSON, groups, tensors,
 * shapes) is ckpt's family table (zck.h, "model families", ckpt/arch.c), which formats/ uses
 * too: this file only binds zr_config's members and GPT-2's tensor roles to it (Llama's roles:
 * llama.c).
 */
#include "model.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the family table */

static const char *const family_names[] = {[ZR_FAMILY_GPT2] = "gpt2", [ZR_FAMILY_LLAMA] = "llama"};

static const zck_arch *family_arch(zr_family f)
{
    const zck_arch *a = NULL;
    int rc = zck_arch_find(&a, family_names[f]);
    assert(!rc && a);
    (void)rc;
    return a;
}

/* zr_config's members, by the family table's field names (Llama's own after the common ones) */
#define N_COMMON 5
static const char *const field_names[] = {"layers", "heads", "dim", "ctx", "vocab",
                                          "kv_heads", "ffn", "tied"};

static uint32_t *field_ptr(zr_config *c, size_t i)
{
    uint32_t *const p[] = {&c->layers, &c->heads, &c->dim, &c->ctx, &c->vocab,
                           &c->kv_heads, &c->ffn, &c->tied};
    return p[i];
}

static void to_arch(zck_arch_config *out, const zr_config *c)
{
    zck_arch_config_init(out, family_arch(c->family));
    size_t n = c->family == ZR_FAMILY_LLAMA ? sizeof field_names / sizeof *field_names : N_COMMON;
    for (size_t i = 0; i < n; i++)
        zck_arch_config_set(out, field_names[i], *field_ptr((zr_config *)c, i));
    if (c->family == ZR_FAMILY_LLAMA) {
        zck_arch_config_set(out, "rope_theta", c->rope_theta);
        zck_arch_config_set(out, "norm_eps", c->norm_eps);
    }
}

/* a checked config: every integer field a uint32 */
static void from_arch(zr_config *out, const zck_arch_config *a)
{
    memset(out, 0, sizeof *out); /* padding too: configs are compared with memcmp */
    out->family = strcmp(zck_arch_name(a->arch), "llama") ? ZR_FAMILY_GPT2 : ZR_FAMILY_LLAMA;
    size_t n = out->family == ZR_FAMILY_LLAMA ? sizeof field_names / sizeof *field_names
                                              : N_COMMON;
    for (size_t i = 0; i < n; i++)
        *field_ptr(out, i) = (uint32_t)zck_arch_config_get(a, field_names[i]);
    if (out->family == ZR_FAMILY_LLAMA) {
        out->rope_theta = zck_arch_config_get(a, "rope_theta");
        out->norm_eps = zck_arch_config_get(a, "norm_eps");
    }
}

/* ---------------------------------------------------------------- model specs */

/* A preset: a family and its fields ("" keeps the family's defaults). */
static const struct {
    const char *name, *family, *fields;
} presets[] = {
    {"tiny", "gpt2", ""},
    {"gpt2", "gpt2", "layers=12,heads=12,dim=768,ctx=1024,vocab=50257"},
    {"gpt2-medium", "gpt2", "layers=24,heads=16,dim=1024,ctx=1024,vocab=50257"},
    {"llama", "llama", ""},
    {"llama-tiny", "llama", ""},
    {"llama-124m", "llama", "layers=12,heads=12,kv_heads=4,dim=768,ffn=2048,ctx=1024,vocab=32000"},
    {"smollm-135m", "llama", "layers=30,heads=9,kv_heads=3,dim=576,ffn=1536,ctx=2048,"
                             "vocab=49152,tied=1"},
    {"tinyllama-1.1b", "llama", "layers=22,heads=32,kv_heads=4,dim=2048,ffn=5632,ctx=2048,"
                                "vocab=32000"},
};

/* "<family>:<fields>" (fields not NULL) or a family's defaults into *out; what: the spec, for
 * messages */
static int parse_fields(zr_config *out, const char *family, const char *fields, const char *what)
{
    const zck_arch *arch;
    ZR_TRY(zck_arch_find(&arch, family));
    zck_arch_config a;
    zck_arch_config_init(&a, arch);
    if (fields)
        ZR_TRY(zck_arch_config_set_fields(&a, fields, what));
    from_arch(out, &a);
    return 0;
}

int zr_gpt2_config_parse(zr_gpt2_config *out, const char *spec)
{
    assert(out && spec);
    char what[1100];
    snprintf(what, sizeof what, "model '%.1024s'", spec);
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (!strcmp(spec, presets[i].name))
            return parse_fields(out, presets[i].family,
                                *presets[i].fields ? presets[i].fields : NULL, what);
    /* fields not given keep the family's defaults (GPT-2: the tiny values) */
    if (!strncmp(spec, "gpt2:", 5))
        return parse_fields(out, "gpt2", spec + 5, what);
    if (!strncmp(spec, "llama:", 6))
        return parse_fields(out, "llama", spec + 6, what);
    return zr_err_set(ZR_EINVAL, "model '%s': unknown (expected tiny, gpt2, gpt2-medium, "
                      "gpt2:layers=N,heads=N,dim=N,ctx=N,vocab=N, llama, llama-tiny, "
                      "llama-124m, smollm-135m, tinyllama-1.1b or llama:layers=N,heads=N,"
                      "kv_heads=N,dim=N,ffn=N,ctx=N,vocab=N[,rope_theta=R,norm_eps=E,tied=0|1])",
                      spec);
}

/* ---------------------------------------------------------------- model section JSON */

int zr_gpt2_config_to_json(char **out, const zr_gpt2_config *c)
{
    zck_arch_config a;
    to_arch(&a, c);
    return zck_arch_config_to_json(out, &a);
}

int zr_gpt2_config_from_json(zr_gpt2_config *out, const char *json)
{
    assert(out && json);
    zck_arch_config a;
    ZR_TRY(zck_arch_config_from_json(&a, json, NULL));
    from_arch(out, &a);
    return 0;
}

/* ---------------------------------------------------------------- layout */

int zr_gpt2_layout(zck_layout **out, const zr_gpt2_config *c)
{
    zck_arch_config a;
    to_arch(&a, c);
    return zck_arch_layout(out, &a);
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
    if (c->family != ZR_FAMILY_GPT2)
        return zr_err_set(ZR_EINVAL, "gpt2 layout: the model is of family %s",
                          family_names[c->family]);
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

/* "'h.0.attn.c_attn.weight' [64, 192] f32" */
static void tensor_words(char *buf, size_t cap, const zck_tensor_info *t)
{
    int n = snprintf(buf, cap, "'%s' [", t->name);
    for (size_t d = 0; d < t->ndim && n > 0 && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%llu", d ? ", " : "",
                      (unsigned long long)t->shape[d]);
    if (n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, "] %s", zck_dtype_name(t->dtype));
}

/* Group g's tensors, one against the other: the first that differs (name, size, offset), or
 * one that one side has and the other lacks, named with both sides (shape and dtype said). */
static int group_tensors_check(const zck_layout *ck, const zck_layout *want, size_t g,
                               const char *path)
{
    size_t na = zck_layout_group_n_tensors(ck, g), nb = zck_layout_group_n_tensors(want, g);
    const char *gn = zck_layout_group_name(want, g);
    char a_w[256], b_w[256];
    for (size_t t = 0; t < na || t < nb; t++) {
        zck_tensor_info a, b;
        if (t < na)
            zck_layout_tensor(ck, g, t, &a);
        if (t < nb)
            zck_layout_tensor(want, g, t, &b);
        if (t < na)
            tensor_words(a_w, sizeof a_w, &a);
        if (t < nb)
            tensor_words(b_w, sizeof b_w, &b);
        if (t >= nb || t >= na)
            return zr_err_set(ZR_EINVAL, "%s: group %zu '%s' holds %zu tensor%s, this model's "
                              "%zu: the checkpoint %s %s (another model shape)", path, g, gn, na,
                              na == 1 ? "" : "s", nb, t >= nb ? "has" : "lacks",
                              t >= nb ? a_w : b_w);
        if (strcmp(a.name, b.name) || a.numel != b.numel || a.offset != b.offset)
            return zr_err_set(ZR_EINVAL, "%s: group %zu '%s', tensor %zu: the checkpoint has "
                              "%s at element %llu, this model %s at %llu (another model shape)",
                              path, g, gn, t, a_w, (unsigned long long)a.offset, b_w,
                              (unsigned long long)b.offset);
    }
    return 0;
}

/* The groups and tensors of a checkpoint's layout against the model's (states aside): each
 * difference said with both sides, down to the first tensor that differs. */
int zr_gpt2_layout_check(const zck_layout *ck, const zck_layout *want, const char *path)
{
    if (zck_layout_n_groups(ck) != zck_layout_n_groups(want))
        return zr_err_set(ZR_EINVAL, "%s: checkpoint has %zu parameter groups, this model %zu "
                          "(another model shape)", path, zck_layout_n_groups(ck),
                          zck_layout_n_groups(want));
    for (size_t g = 0; g < zck_layout_n_groups(want); g++) {
        if (strcmp(zck_layout_group_name(ck, g), zck_layout_group_name(want, g)))
            return zr_err_set(ZR_EINVAL, "%s: group %zu is '%s', this model expects '%s' "
                              "(another model shape)", path, g, zck_layout_group_name(ck, g),
                              zck_layout_group_name(want, g));
        ZR_TRY(group_tensors_check(ck, want, g, path));
        if (zck_layout_group_numel(ck, g) != zck_layout_group_numel(want, g))
            return zr_err_set(ZR_EINVAL, "%s: group %zu '%s' has %llu elements, this model's "
                              "%llu (another model shape)", path, g,
                              zck_layout_group_name(ck, g),
                              (unsigned long long)zck_layout_group_numel(ck, g),
                              (unsigned long long)zck_layout_group_numel(want, g));
    }
    return 0;
}
