/*
 * config.c: the GPT-2 model configuration of the engine (zr.h, "model configuration"): parsing
 * a model spec ("tiny", "gpt2", "gpt2-medium", "gpt2:layers=4,heads=4,..."), the manifest's
 * model section <-> zr_gpt2_config (JSON through Jansson), and the checkpoint layout of a model
 * of that shape: the GPT-2 naming contract of docs/FORMAT.md.
 *
 * formats/ implements the same contract (zfmt_gpt2_layout, zfmt_gpt2_config_to_json) but core/
 * may not include formats/, so this is a second, independent implementation; the engine tests
 * (tests/test_engine_parts.c) check that both give the same layout and byte-identical JSON.
 */
#include "model.h"

#include <assert.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- validation */

/* The five fields in the order of the model section. */
#define N_FIELDS 5
static const char *const field_names[N_FIELDS] = {"layers", "heads", "dim", "ctx", "vocab"};

static uint32_t *field_ptr(zr_gpt2_config *c, size_t i)
{
    uint32_t *p[N_FIELDS] = {&c->layers, &c->heads, &c->dim, &c->ctx, &c->vocab};
    return p[i];
}

static uint32_t field_get(const zr_gpt2_config *c, size_t i)
{
    const uint32_t v[N_FIELDS] = {c->layers, c->heads, c->dim, c->ctx, c->vocab};
    return v[i];
}

/* ZR_EINVAL naming the bad field, each message starting with `what` (the spec, the section). */
static int config_check(const zr_gpt2_config *c, const char *what)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (!field_get(c, i))
            return zr_err_set(ZR_EINVAL, "%s: field '%s' is 0 (expected >= 1)", what,
                              field_names[i]);
    if (c->dim % c->heads)
        return zr_err_set(ZR_EINVAL, "%s: dim %u is not a multiple of heads %u", what, c->dim,
                          c->heads);
    /* The same bounds as formats/: every tensor far below the format's 2^50 elements, and the
     * whole model too (12 C^2 + 13 C elements per layer). */
    uint64_t C = c->dim;
    if ((uint64_t)c->vocab * C > ((uint64_t)1 << 48) || (uint64_t)c->ctx * C > ((uint64_t)1 << 48)
        || C * C > ((uint64_t)1 << 44))
        return zr_err_set(ZR_EINVAL, "%s: vocab %u, ctx %u, dim %u: tensors too large", what,
                          c->vocab, c->ctx, c->dim);
    uint64_t per_layer = 12 * C * C + 13 * C;
    if (c->layers > ((uint64_t)1 << 50) / per_layer)
        return zr_err_set(ZR_EINVAL, "%s: %u layers of dim %u: model too large", what, c->layers,
                          c->dim);
    return 0;
}

/* ---------------------------------------------------------------- model specs */

static const struct {
    const char *name;
    zr_gpt2_config c;
} presets[] = {
    {"tiny", {4, 4, 128, 128, 256}},
    {"gpt2", {12, 12, 768, 1024, 50257}},
    {"gpt2-medium", {24, 16, 1024, 1024, 50257}},
};

/* One "key=value" part of a field list, [p, end). */
static int parse_field(zr_gpt2_config *c, unsigned *seen, const char *spec, const char *p,
                       const char *end)
{
    int n = (int)(end - p);
    if (!n)
        return zr_err_set(ZR_EINVAL, "model '%s': empty field (expected key=value)", spec);
    const char *eq = memchr(p, '=', (size_t)n);
    if (!eq)
        return zr_err_set(ZR_EINVAL, "model '%s': field '%.*s' has no '=' (expected key=value)",
                          spec, n, p);
    int nk = (int)(eq - p);
    size_t k = 0;
    while (k < N_FIELDS && !(strlen(field_names[k]) == (size_t)nk &&
                             !memcmp(field_names[k], p, (size_t)nk)))
        k++;
    if (k == N_FIELDS)
        return zr_err_set(ZR_EINVAL, "model '%s': unknown field '%.*s' (expected layers, heads, "
                          "dim, ctx or vocab)", spec, nk, p);
    if (*seen & (1u << k))
        return zr_err_set(ZR_EINVAL, "model '%s': field '%s' given twice", spec, field_names[k]);
    *seen |= 1u << k;
    /* decimal digits only: no sign, no spaces, no suffix */
    const char *v = eq + 1;
    int nv = (int)(end - v);
    if (!nv)
        return zr_err_set(ZR_EINVAL, "model '%s': field '%s' has no value", spec,
                          field_names[k]);
    uint64_t x = 0;
    for (const char *q = v; q < end; q++) {
        if (*q < '0' || *q > '9')
            return zr_err_set(ZR_EINVAL, "model '%s': field '%s': '%.*s' is not a number",
                              spec, field_names[k], nv, v);
        x = x * 10 + (uint64_t)(*q - '0');
        if (x > UINT32_MAX)
            return zr_err_set(ZR_EINVAL, "model '%s': field '%s': '%.*s' is too large (at most "
                              "%u)", spec, field_names[k], nv, v, UINT32_MAX);
    }
    if (!x)
        return zr_err_set(ZR_EINVAL, "model '%s': field '%s' is 0 (expected >= 1)", spec,
                          field_names[k]);
    *field_ptr(c, k) = (uint32_t)x;
    return 0;
}

int zr_gpt2_config_parse(zr_gpt2_config *out, const char *spec)
{
    assert(out && spec);
    zr_gpt2_config c = presets[0].c; /* fields not given keep the tiny values */
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (!strcmp(spec, presets[i].name)) {
            *out = presets[i].c;
            return 0;
        }
    if (strncmp(spec, "gpt2:", 5))
        return zr_err_set(ZR_EINVAL, "model '%s': unknown (expected tiny, gpt2, gpt2-medium or "
                          "gpt2:layers=N,heads=N,dim=N,ctx=N,vocab=N)", spec);
    unsigned seen = 0;
    const char *p = spec + 5;
    for (;;) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        ZR_TRY(parse_field(&c, &seen, spec, p, end));
        if (!*end)
            break;
        p = end + 1;
    }
    char what[320];
    snprintf(what, sizeof what, "model '%.300s'", spec);
    ZR_TRY(config_check(&c, what));
    *out = c;
    return 0;
}

/* ---------------------------------------------------------------- model section JSON */

int zr_gpt2_config_to_json(char **out, const zr_gpt2_config *c)
{
    ZR_TRY(config_check(c, "gpt2 config"));
    /* field order is part of the text: arch first, then the fields in declaration order */
    json_t *root = json_object();
    if (!root)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int bad = json_object_set_new(root, "arch", json_string("gpt2"));
    for (size_t i = 0; i < N_FIELDS; i++)
        bad |= json_object_set_new(root, field_names[i],
                                   json_integer((json_int_t)field_get(c, i)));
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    /* the caller frees with free(): copy out of whatever allocator Jansson was given */
    char *copy = strdup(text);
    json_free_t jfree;
    json_malloc_t jmalloc;
    json_get_alloc_funcs(&jmalloc, &jfree);
    jfree(text);
    if (!copy)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    *out = copy;
    return 0;
}

int zr_gpt2_config_from_json(zr_gpt2_config *out, const char *json)
{
    assert(out && json);
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zr_err_set(ZR_EINVAL, "model section: invalid JSON at line %d: %s", jerr.line,
                          jerr.text);
    int rc = 0;
    zr_gpt2_config c;
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
    /* other fields (a "note") are the writer's business and ignored */
    for (size_t i = 0; i < N_FIELDS; i++) {
        json_t *v = json_object_get(root, field_names[i]);
        if (!v) {
            rc = zr_err_set(ZR_EINVAL, "model section: missing field '%s'", field_names[i]);
            goto out;
        }
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > (json_int_t)UINT32_MAX) {
            rc = zr_err_set(ZR_EINVAL, "model section: field '%s': expected an integer in "
                            "[1, %u]", field_names[i], UINT32_MAX);
            goto out;
        }
        *field_ptr(&c, i) = (uint32_t)json_integer_value(v);
    }
    ZR_TRY_GOTO(config_check(&c, "model section"), rc, out);
    *out = c;
out:
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------- layout */

/* The per-layer tensors in llm.c's order, with shapes as multiples of C: [out_mul C, in_mul C]
 * for weights ([out, in] as nn.Linear), [out_mul C] for vectors (in_mul 0). */
static const struct {
    const char *name;
    unsigned out_mul, in_mul;
} layer_tensors[] = {
    {"ln_1.weight", 1, 0},        {"ln_1.bias", 1, 0},
    {"attn.c_attn.weight", 3, 1}, {"attn.c_attn.bias", 3, 0},
    {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
    {"ln_2.weight", 1, 0},        {"ln_2.bias", 1, 0},
    {"mlp.c_fc.weight", 4, 1},    {"mlp.c_fc.bias", 4, 0},
    {"mlp.c_proj.weight", 1, 4},  {"mlp.c_proj.bias", 1, 0},
};

int zr_gpt2_layout(zck_layout **out, const zr_gpt2_config *c)
{
    ZR_TRY(config_check(c, "gpt2 config"));
    zck_layout *L = NULL;
    int rc = 0;
    size_t g;
    char name[96];
    const uint64_t C = c->dim;
    uint64_t sh[2];
    ZR_TRY_GOTO(zck_layout_new(&L), rc, fail);
    /* states: the parameters and AdamW's two moments */
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
        for (size_t k = 0; k < sizeof layer_tensors / sizeof *layer_tensors; k++) {
            snprintf(name, sizeof name, "h.%u.%s", l, layer_tensors[k].name);
            sh[0] = layer_tensors[k].out_mul * C;
            sh[1] = layer_tensors[k].in_mul * C;
            ZR_TRY_GOTO(zck_layout_add_tensor(L, g, name, ZCK_F32, layer_tensors[k].in_mul ? 2 : 1,
                                              sh), rc, fail);
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
