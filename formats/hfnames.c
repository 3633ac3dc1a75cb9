/*
 * hfnames.c: Hugging Face's tensor names of each model family, one table entry per family,
 * used by the import (HF -> ours) and the export (ours -> HF) alike:
 *   - gpt2 (GPT2LMHeadModel): "transformer.<ours>", but for the two embeddings, which are
 *     modules there ("transformer.wte.weight"); the Conv1D weights are stored [in, out];
 *     lm_head.weight is wte (tied); attn.bias / attn.masked_bias are causal-mask buffers;
 *   - llama (LlamaForCausalLM): "model.<ours>", but lm_head.weight (untied head), which is
 *     outside the prefix and, with a tied head, absent or a copy of embed_tokens; the
 *     rotary_emb.inv_freq buffers of older files are not parameters.
 * On import a missing prefix is accepted (a bare GPT2Model / LlamaModel file).
 */
#include "fmtutil.h"

#include <stdio.h>
#include <string.h>

struct zfmt__hf_family {
    const char *arch;          /* ckpt's family name */
    const char *hf_arch;       /* config.json's architectures[0] */
    const char *hf_bare;       /* the model without its head, also imported, or NULL */
    const char *prefix;        /* before our names in Hugging Face's */
    const char *outside;       /* a name kept outside the prefix (as ours), or NULL */
    const char *head;          /* the output head: skipped on import when ours is tied */
    const char *embedding;     /* our name of the embedding a tied head is */
    struct {
        const char *ours, *hf;
    } renamed[2];
    const char *layers;        /* the per-layer group: "<layers>.<l>.<kind>" */
    const char *buffers[2];    /* per-layer kinds that are buffers, not parameters */
    const char *transposed[4]; /* per-layer kinds stored [in, out] */
};

static const zfmt__hf_family families[] = {
    {
        .arch = "gpt2",
        .hf_arch = "GPT2LMHeadModel",
        .hf_bare = "GPT2Model", /* its head is tied: the same model */
        .prefix = "transformer.",
        .head = "lm_head.weight",
        .embedding = "wte",
        .renamed = {{"wte", "wte.weight"}, {"wpe", "wpe.weight"}},
        .layers = "h",
        .buffers = {"attn.bias", "attn.masked_bias"},
        .transposed = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                       "mlp.c_proj.weight"},
    },
    {
        .arch = "llama",
        .hf_arch = "LlamaForCausalLM",
        .prefix = "model.",
        .outside = "lm_head.weight",
        .head = "lm_head.weight",
        .embedding = "embed_tokens.weight",
        .layers = "layers",
        .buffers = {"self_attn.rotary_emb.inv_freq"},
    },
};
#define N_FAMILIES (sizeof families / sizeof *families)
#define COUNT(a) (sizeof(a) / sizeof *(a))

const zfmt__hf_family *zfmt__hf_family_of(const char *arch)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (!strcmp(families[i].arch, arch))
            return &families[i];
    return NULL;
}

const char *zfmt__hf_arch(const zfmt__hf_family *f) { return f->hf_arch; }

int zfmt__hf_arch_imports(const zfmt__hf_family *f, const char *hf_arch)
{
    return !strcmp(hf_arch, f->hf_arch) || (f->hf_bare && !strcmp(hf_arch, f->hf_bare));
}

/* The kind of a per-layer name "<layers>.<digits>.<kind>", or NULL. */
static const char *layer_kind(const zfmt__hf_family *f, const char *name)
{
    size_t n = strlen(f->layers);
    if (strncmp(name, f->layers, n) || name[n] != '.' || name[n + 1] < '0' || name[n + 1] > '9')
        return NULL;
    const char *p = name + n + 1;
    while (*p >= '0' && *p <= '9')
        p++;
    return *p == '.' ? p + 1 : NULL;
}

static int in_list(const char *const *list, size_t n, const char *s)
{
    for (size_t i = 0; s && i < n; i++)
        if (list[i] && !strcmp(list[i], s))
            return 1;
    return 0;
}

int zfmt__hf_name(const zfmt__hf_family *f, char *out, size_t n, const char *ours,
                  int *transposed)
{
    const char *base = ours, *prefix = f->prefix;
    for (size_t i = 0; i < COUNT(f->renamed); i++)
        if (f->renamed[i].ours && !strcmp(ours, f->renamed[i].ours))
            base = f->renamed[i].hf;
    if (f->outside && !strcmp(ours, f->outside))
        prefix = "";
    *transposed = in_list(f->transposed, COUNT(f->transposed), layer_kind(f, ours));
    if ((size_t)snprintf(out, n, "%s%s", prefix, base) >= n)
        return zr_err_set(ZR_EINVAL, "tensor name '%s' too long", ours);
    return 0;
}

const char *zfmt__hf_to_ours(const zfmt__hf_family *f, const char *hf, int *transposed)
{
    *transposed = 0;
    if (f->outside && !strcmp(hf, f->outside))
        return hf;
    size_t pl = strlen(f->prefix);
    if (!strncmp(hf, f->prefix, pl))
        hf += pl;
    const char *kind = layer_kind(f, hf);
    if (in_list(f->buffers, COUNT(f->buffers), kind))
        return NULL;
    for (size_t i = 0; i < COUNT(f->renamed); i++) {
        if (f->renamed[i].hf && !strcmp(hf, f->renamed[i].hf))
            return f->renamed[i].ours;
        if (f->renamed[i].ours && !strcmp(hf, f->renamed[i].ours))
            return ""; /* our name, not Hugging Face's */
    }
    *transposed = in_list(f->transposed, COUNT(f->transposed), kind);
    return hf;
}

int zfmt__hf_is_head(const zfmt__hf_family *f, const char *hf)
{
    return f->head && !strcmp(hf, f->head);
}

const char *zfmt__hf_head(const zfmt__hf_family *f, const char **embedding)
{
    *embedding = f->embedding;
    return f->head;
}
