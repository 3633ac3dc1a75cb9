/*
 * arch.c: the model-family table (zck.h, "model families"): for each family the naming
 * contract of docs/FORMAT.md section 13, written once for core/ and formats/ alike: the config
 * fields with their defaults and bounds, the checks, the manifest's model section <-> config
 * (JSON through Jansson), the ordered groups and tensors with shapes as functions of the
 * config, and the checkpoint layout built from them.
 *
 * The format itself still knows nothing of model maths: a family here is names and shapes, not
 * what a model computes with them. Families: "gpt2" and "llama" (issue 17), one entry each of
 * `families`.
 */
#include "zck_int.h"

#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the table */

#define MAX_TENSORS 32
#define NO_FIELD (-1)

typedef struct {
    const char *name;
    double def, min, max; /* in [min, max]; whole numbers unless real */
    int real;             /* a real number (rope_theta, norm_eps), JSON real */
} field_spec;

/* One dimension of a shape: mul x the value of field f, times field xf - 1 and divided by
 * field df - 1 when those are not 0 (Llama's k_proj: dim x kv_heads / heads rows). */
typedef struct {
    unsigned mul;
    int f;
    int xf, df;
} dim_spec;

typedef struct {
    const char *name; /* full name, or for a per-layer group the part after "<group>.<l>." */
    const char *group;
    int per_layer;    /* the group repeats: "<group>.0" ... "<group>.<layers-1>" */
    size_t ndim;
    dim_spec dim[2];
    int unless;       /* not 0: the tensor is absent when field unless - 1 is not 0 (tied) */
} tensor_spec;

struct zck_arch {
    const char *name; /* the model section's "arch" */
    size_t n_fields;
    field_spec fields[ZCK_ARCH_MAX_FIELDS];
    int layers;       /* the field that counts per-layer groups */
    int div_a, div_b; /* field div_a must be a multiple of field div_b (NO_FIELD: none) */
    /* family-specific bounds (ZR_EINVAL prefixed with what), after the field checks */
    int (*check)(const double *v, const char *what);
    size_t n_tensors;
    tensor_spec tensors[MAX_TENSORS]; /* in layout order; groups in order of first use */
    size_t n_states;
    const char *states[4]; /* all f32 */
};

enum { G_LAYERS, G_HEADS, G_DIM, G_CTX, G_VOCAB };

/* Every tensor far below the format's 2^50 elements, and the whole model too (12 C^2 + 13 C
 * elements per layer). */
static int gpt2_check(const double *v, const char *what)
{
    uint64_t C = (uint64_t)v[G_DIM], L = (uint64_t)v[G_LAYERS];
    uint64_t T = (uint64_t)v[G_CTX], V = (uint64_t)v[G_VOCAB];
    if (V * C > ((uint64_t)1 << 48) || T * C > ((uint64_t)1 << 48) || C * C > ((uint64_t)1 << 44))
        return zr_err_set(ZR_EINVAL, "%s: vocab %u, ctx %u, dim %u: tensors too large", what,
                          (unsigned)V, (unsigned)T, (unsigned)C);
    uint64_t per_layer = 12 * C * C + 13 * C;
    if (L > ((uint64_t)1 << 50) / per_layer)
        return zr_err_set(ZR_EINVAL, "%s: %u layers of dim %u: model too large", what,
                          (unsigned)L, (unsigned)C);
    return 0;
}

enum { LL_LAYERS, LL_HEADS, LL_KV_HEADS, LL_DIM, LL_FFN, LL_CTX, LL_VOCAB, LL_ROPE_THETA,
       LL_NORM_EPS, LL_TIED };

/* Grouped-query attention: kv_heads divides heads; rotary positions rotate pairs of a head's
 * channels, so the head dimension is even; sizes far below the format's limits. */
static int llama_check(const double *v, const char *what)
{
    uint64_t H = (uint64_t)v[LL_HEADS], KV = (uint64_t)v[LL_KV_HEADS];
    uint64_t C = (uint64_t)v[LL_DIM], I = (uint64_t)v[LL_FFN], L = (uint64_t)v[LL_LAYERS];
    uint64_t T = (uint64_t)v[LL_CTX], V = (uint64_t)v[LL_VOCAB];
    if (H % KV)
        return zr_err_set(ZR_EINVAL, "%s: heads %u is not a multiple of kv_heads %u", what,
                          (unsigned)H, (unsigned)KV);
    if ((C / H) % 2)
        return zr_err_set(ZR_EINVAL, "%s: head dimension dim / heads = %u / %u = %u is odd "
                          "(rotary positions rotate pairs of channels)", what, (unsigned)C,
                          (unsigned)H, (unsigned)(C / H));
    if (V * C > ((uint64_t)1 << 48) || T * C > ((uint64_t)1 << 48) ||
        C * C > ((uint64_t)1 << 44) || I * C > ((uint64_t)1 << 46))
        return zr_err_set(ZR_EINVAL, "%s: vocab %u, ctx %u, dim %u, ffn %u: tensors too large",
                          what, (unsigned)V, (unsigned)T, (unsigned)C, (unsigned)I);
    uint64_t per_layer = 4 * C * C + 3 * C * I + 2 * C;
    if (L > ((uint64_t)1 << 50) / per_layer)
        return zr_err_set(ZR_EINVAL, "%s: %u layers of dim %u, ffn %u: model too large", what,
                          (unsigned)L, (unsigned)C, (unsigned)I);
    return 0;
}

#define U32 1, 4294967295.0
/* layers: far more than any model trained today (a few hundred), and a bound on the layout a
 * hostile config.json or model spec can ask for (each layer is a group of up to a dozen
 * tensors) */
#define LAYERS 1, 65536.0
#define C1 {{1, G_DIM}}
#define W(o, i) {{o, G_DIM}, {i, G_DIM}}
#define LC {1, LL_DIM}
#define LKV {1, LL_DIM, LL_KV_HEADS + 1, LL_HEADS + 1} /* kv_heads x head dimension */
#define LI {1, LL_FFN}

static const zck_arch families[] = {
    {
        .name = "gpt2",
        .n_fields = 5, /* defaults: the engine's "tiny" */
        .fields = {{"layers", 4, LAYERS}, {"heads", 4, U32}, {"dim", 128, U32}, {"ctx", 128, U32},
                   {"vocab", 256, U32}},
        .layers = G_LAYERS,
        .div_a = G_DIM,
        .div_b = G_HEADS,
        .check = gpt2_check,
        .n_tensors = 16,
        .tensors = {
            {"wte", "wte", 0, 2, {{1, G_VOCAB}, {1, G_DIM}}},
            {"wpe", "wpe", 0, 2, {{1, G_CTX}, {1, G_DIM}}},
            {"ln_1.weight", "h", 1, 1, C1},        {"ln_1.bias", "h", 1, 1, C1},
            {"attn.c_attn.weight", "h", 1, 2, W(3, 1)},
            {"attn.c_attn.bias", "h", 1, 1, {{3, G_DIM}}},
            {"attn.c_proj.weight", "h", 1, 2, W(1, 1)},
            {"attn.c_proj.bias", "h", 1, 1, C1},
            {"ln_2.weight", "h", 1, 1, C1},        {"ln_2.bias", "h", 1, 1, C1},
            {"mlp.c_fc.weight", "h", 1, 2, W(4, 1)},
            {"mlp.c_fc.bias", "h", 1, 1, {{4, G_DIM}}},
            {"mlp.c_proj.weight", "h", 1, 2, W(1, 4)},
            {"mlp.c_proj.bias", "h", 1, 1, C1},
            {"ln_f.weight", "ln_f", 0, 1, C1},     {"ln_f.bias", "ln_f", 0, 1, C1},
        },
        .n_states = 3,
        .states = {"param", "exp_avg", "exp_avg_sq"},
    },
    {
        /* Hugging Face's LlamaForCausalLM names without the "model." prefix; defaults: a small
         * model with grouped-query attention (ffn about 8/3 dim) */
        .name = "llama",
        .n_fields = 10,
        .fields = {{"layers", 4, LAYERS}, {"heads", 4, U32}, {"kv_heads", 2, U32},
                   {"dim", 128, U32}, {"ffn", 344, U32}, {"ctx", 128, U32},
                   {"vocab", 256, U32}, {"rope_theta", 10000, 1, 1e12, 1},
                   {"norm_eps", 1e-5, 1e-12, 0.1, 1}, {"tied", 0, 0, 1}},
        .layers = LL_LAYERS,
        .div_a = LL_DIM,
        .div_b = LL_HEADS,
        .check = llama_check,
        .n_tensors = 12,
        .tensors = {
            {"embed_tokens.weight", "embed_tokens", 0, 2, {{1, LL_VOCAB}, LC}},
            {"input_layernorm.weight", "layers", 1, 1, {LC}},
            {"self_attn.q_proj.weight", "layers", 1, 2, {LC, LC}},
            {"self_attn.k_proj.weight", "layers", 1, 2, {LKV, LC}},
            {"self_attn.v_proj.weight", "layers", 1, 2, {LKV, LC}},
            {"self_attn.o_proj.weight", "layers", 1, 2, {LC, LC}},
            {"post_attention_layernorm.weight", "layers", 1, 1, {LC}},
            {"mlp.gate_proj.weight", "layers", 1, 2, {LI, LC}},
            {"mlp.up_proj.weight", "layers", 1, 2, {LI, LC}},
            {"mlp.down_proj.weight", "layers", 1, 2, {LC, LI}},
            {"norm.weight", "norm", 0, 1, {LC}},
            {"lm_head.weight", "lm_head", 0, 2, {{1, LL_VOCAB}, LC}, LL_TIED + 1},
        },
        .n_states = 3,
        .states = {"param", "exp_avg", "exp_avg_sq"},
    },
};
#define N_FAMILIES (sizeof families / sizeof *families)

/* ---------------------------------------------------------------- GPT-2's C struct */

const zck_arch *zck_arch_gpt2(void) { return &families[0]; }

void zck_gpt2_to_arch(zck_arch_config *out, const zck_gpt2_config *c)
{
    zck_arch_config_init(out, zck_arch_gpt2());
    out->v[G_LAYERS] = c->layers;
    out->v[G_HEADS] = c->heads;
    out->v[G_DIM] = c->dim;
    out->v[G_CTX] = c->ctx;
    out->v[G_VOCAB] = c->vocab;
}

void zck_gpt2_from_arch(zck_gpt2_config *out, const zck_arch_config *a)
{
    assert(a->arch == zck_arch_gpt2());
    out->layers = (uint32_t)a->v[G_LAYERS];
    out->heads = (uint32_t)a->v[G_HEADS];
    out->dim = (uint32_t)a->v[G_DIM];
    out->ctx = (uint32_t)a->v[G_CTX];
    out->vocab = (uint32_t)a->v[G_VOCAB];
}

int zck_gpt2_layout(zck_layout **out, const zck_gpt2_config *c)
{
    zck_arch_config a;
    zck_gpt2_to_arch(&a, c);
    return zck_arch_layout(out, &a);
}

int zck_gpt2_to_json(char **out, const zck_gpt2_config *c)
{
    zck_arch_config a;
    zck_gpt2_to_arch(&a, c);
    return zck_arch_config_to_json(out, &a);
}

int zck_gpt2_from_json(zck_gpt2_config *out, const char *json)
{
    zck_arch_config a;
    ZR_TRY(zck_arch_config_from_json(&a, json, zck_arch_gpt2()));
    zck_gpt2_from_arch(out, &a);
    return 0;
}

/* ---------------------------------------------------------------- families and fields */

/* "\"gpt2\"" or "one of \"gpt2\", \"llama\"" into buf */
static const char *family_list(char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "%s", N_FAMILIES > 1 ? "one of " : "");
    for (size_t i = 0; i < N_FAMILIES && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s\"%s\"", i ? ", " : "", families[i].name);
    return buf;
}

int zck_arch_find(const zck_arch **out, const char *name)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (!strcmp(families[i].name, name)) {
            *out = &families[i];
            return 0;
        }
    char list[256];
    return zr_err_set(ZR_ENOTFOUND, "unknown model family '%s' (expected %s)", name,
                      family_list(list, sizeof list));
}

size_t zck_arch_count(void) { return N_FAMILIES; }
const zck_arch *zck_arch_at(size_t i) { return i < N_FAMILIES ? &families[i] : NULL; }
const char *zck_arch_name(const zck_arch *a) { return a->name; }
size_t zck_arch_n_fields(const zck_arch *a) { return a->n_fields; }
const char *zck_arch_field_name(const zck_arch *a, size_t i)
{
    assert(i < a->n_fields);
    return a->fields[i].name;
}

static int field_index(const zck_arch *a, const char *name, size_t len)
{
    for (size_t i = 0; i < a->n_fields; i++)
        if (strlen(a->fields[i].name) == len && !memcmp(a->fields[i].name, name, len))
            return (int)i;
    return -1;
}

void zck_arch_config_init(zck_arch_config *out, const zck_arch *a)
{
    memset(out, 0, sizeof *out);
    out->arch = a;
    for (size_t i = 0; i < a->n_fields; i++)
        out->v[i] = a->fields[i].def;
}

double zck_arch_config_get(const zck_arch_config *c, const char *field)
{
    int i = field_index(c->arch, field, strlen(field));
    assert(i >= 0);
    return c->v[i];
}

void zck_arch_config_set(zck_arch_config *c, const char *field, double v)
{
    int i = field_index(c->arch, field, strlen(field));
    assert(i >= 0);
    c->v[i] = v;
}

/* ---------------------------------------------------------------- checks */

int zck_arch_config_check(const zck_arch_config *c, const char *what)
{
    const zck_arch *a = c->arch;
    for (size_t i = 0; i < a->n_fields; i++) {
        const field_spec *f = &a->fields[i];
        if (c->v[i] < f->min)
            return zr_err_set(ZR_EINVAL, "%s: field '%s' is %.17g (expected >= %.17g)", what,
                              f->name, c->v[i], f->min);
        if (c->v[i] > f->max || (!f->real && c->v[i] != (double)(uint64_t)c->v[i]))
            return zr_err_set(ZR_EINVAL, "%s: field '%s' is %.17g (expected %s in "
                              "[%.17g, %.17g])", what, f->name, c->v[i],
                              f->real ? "a number" : "an integer", f->min, f->max);
    }
    if (a->div_a != NO_FIELD && (uint64_t)c->v[a->div_a] % (uint64_t)c->v[a->div_b])
        return zr_err_set(ZR_EINVAL, "%s: %s %u is not a multiple of %s %u", what,
                          a->fields[a->div_a].name, (unsigned)c->v[a->div_a],
                          a->fields[a->div_b].name, (unsigned)c->v[a->div_b]);
    return a->check ? a->check(c->v, what) : 0;
}

/* A real field's value [v, v + nv): a finite decimal number ("1e-5", "500000.0") in bounds. */
static int set_real(zck_arch_config *c, int k, const char *what, const char *v, int nv)
{
    const field_spec *f = &c->arch->fields[k];
    char buf[64], *end = NULL;
    double x = 0;
    int ok = nv < (int)sizeof buf && (*v == '.' || (*v >= '0' && *v <= '9'));
    if (ok) {
        memcpy(buf, v, (size_t)nv);
        buf[nv] = 0;
        x = strtod(buf, &end);
        ok = end == buf + nv && isfinite(x);
    }
    if (!ok)
        return zr_err_set(ZR_EINVAL, "%s: field '%s': '%.*s' is not a number", what, f->name,
                          nv, v);
    if (x < f->min || x > f->max)
        return zr_err_set(ZR_EINVAL, "%s: field '%s' is %g (expected a number in [%g, %g])",
                          what, f->name, x, f->min, f->max);
    c->v[k] = x;
    return 0;
}

/* One "key=value" part of a field list, [p, end): a decimal integer within the field's bounds
 * (a decimal number for a real field). */
static int set_field(zck_arch_config *c, unsigned *seen, const char *what, const char *p,
                     const char *end)
{
    const zck_arch *a = c->arch;
    int n = (int)(end - p);
    if (!n)
        return zr_err_set(ZR_EINVAL, "%s: empty field (expected key=value)", what);
    const char *eq = memchr(p, '=', (size_t)n);
    if (!eq)
        return zr_err_set(ZR_EINVAL, "%s: field '%.*s' has no '=' (expected key=value)", what,
                          n, p);
    int nk = (int)(eq - p), k = field_index(a, p, (size_t)nk);
    if (k < 0) {
        char list[512];
        size_t at = 0;
        for (size_t i = 0; i < a->n_fields && at < sizeof list; i++)
            at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", !i ? "" :
                                   i + 1 == a->n_fields ? " or " : ", ", a->fields[i].name);
        return zr_err_set(ZR_EINVAL, "%s: unknown field '%.*s' (expected %s)", what, nk, p,
                          list);
    }
    const field_spec *f = &a->fields[k];
    if (*seen & (1u << k))
        return zr_err_set(ZR_EINVAL, "%s: field '%s' given twice", what, f->name);
    *seen |= 1u << k;
    /* decimal digits only: no sign, no spaces, no suffix */
    const char *v = eq + 1;
    int nv = (int)(end - v);
    if (!nv)
        return zr_err_set(ZR_EINVAL, "%s: field '%s' has no value", what, f->name);
    if (f->real)
        return set_real(c, k, what, v, nv);
    uint64_t x = 0;
    for (const char *q = v; q < end; q++) {
        if (*q < '0' || *q > '9')
            return zr_err_set(ZR_EINVAL, "%s: field '%s': '%.*s' is not a number", what,
                              f->name, nv, v);
        x = x * 10 + (uint64_t)(*q - '0');
        if ((double)x > f->max)
            return zr_err_set(ZR_EINVAL, "%s: field '%s': '%.*s' is too large (at most "
                              "%.17g)", what, f->name, nv, v, f->max);
    }
    if ((double)x < f->min)
        return zr_err_set(ZR_EINVAL, "%s: field '%s' is %llu (expected >= %.17g)", what,
                          f->name, (unsigned long long)x, f->min);
    c->v[k] = (double)x;
    return 0;
}

int zck_arch_config_set_fields(zck_arch_config *c, const char *fields, const char *what)
{
    assert(c->arch->n_fields <= 32);
    zck_arch_config t = *c;
    unsigned seen = 0;
    const char *p = fields;
    for (;;) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        ZR_TRY(set_field(&t, &seen, what, p, end));
        if (!*end)
            break;
        p = end + 1;
    }
    ZR_TRY(zck_arch_config_check(&t, what));
    *c = t;
    return 0;
}

/* ---------------------------------------------------------------- model section JSON */

int zck_arch_config_to_json(char **out, const zck_arch_config *c)
{
    char what[64];
    snprintf(what, sizeof what, "%s config", c->arch->name);
    ZR_TRY(zck_arch_config_check(c, what));
    /* field order is part of the text: arch first, then the fields in table order */
    json_t *root = json_object();
    if (!root)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int bad = json_object_set_new(root, "arch", json_string(c->arch->name));
    for (size_t i = 0; i < c->arch->n_fields; i++)
        bad |= json_object_set_new(root, c->arch->fields[i].name,
                                   c->arch->fields[i].real ? json_real(c->v[i])
                                                           : json_integer((json_int_t)c->v[i]));
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

/* The family named by the section's "arch": want's, or any known one when want is NULL. */
static int section_arch(const zck_arch **out, json_t *root, const zck_arch *want)
{
    json_t *arch = json_object_get(root, "arch");
    if (!arch)
        return zr_err_set(ZR_EINVAL, "model section: missing field 'arch'");
    const char *name = json_is_string(arch) ? json_string_value(arch) : NULL;
    for (size_t i = 0; name && i < N_FAMILIES; i++)
        if ((!want || want == &families[i]) && !strcmp(name, families[i].name)) {
            *out = &families[i];
            return 0;
        }
    char list[256];
    if (want)
        snprintf(list, sizeof list, "\"%s\"", want->name);
    else
        family_list(list, sizeof list);
    return zr_err_set(ZR_EINVAL, "model section: field 'arch': expected %s, found %s", list,
                      name ? name : "a non-string");
}

int zck_arch_config_from_json(zck_arch_config *out, const char *json, const zck_arch *want)
{
    assert(out && json);
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zr_err_set(ZR_EINVAL, "model section: invalid JSON at line %d: %s", jerr.line,
                          jerr.text);
    int rc = 0;
    zck_arch_config c;
    const zck_arch *a = NULL;
    if (!json_is_object(root)) {
        rc = zr_err_set(ZR_EINVAL, "model section: not a JSON object");
        goto out;
    }
    ZR_TRY_GOTO(section_arch(&a, root, want), rc, out);
    zck_arch_config_init(&c, a);
    /* other fields (a "note") are the writer's business and ignored */
    for (size_t i = 0; i < a->n_fields; i++) {
        const field_spec *f = &a->fields[i];
        json_t *v = json_object_get(root, f->name);
        if (!v) {
            rc = zr_err_set(ZR_EINVAL, "model section: missing field '%s'", f->name);
            goto out;
        }
        /* a real field may be written as an integer (10000); an integer field may not be real */
        int ok = f->real ? json_is_number(v) : json_is_integer(v);
        double x = ok ? json_number_value(v) : 0;
        if (!ok || x < f->min || x > f->max) {
            int p = f->real ? 6 : 17; /* 1e-12, not 9.9999999999999998e-13 */
            rc = zr_err_set(ZR_EINVAL, "model section: field '%s': expected %s in "
                            "[%.*g, %.*g]", f->name, f->real ? "a number" : "an integer", p,
                            f->min, p, f->max);
            goto out;
        }
        c.v[i] = x;
    }
    ZR_TRY_GOTO(zck_arch_config_check(&c, "model section"), rc, out);
    *out = c;
out:
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------- tensors and layout */

size_t zck_arch_n_tensors(const zck_arch *a) { return a->n_tensors; }

void zck_arch_tensor(const zck_arch_config *c, size_t t, zck_arch_tensor_info *out)
{
    assert(t < c->arch->n_tensors);
    const tensor_spec *s = &c->arch->tensors[t];
    memset(out, 0, sizeof *out);
    out->name = s->name;
    out->group = s->group;
    out->per_layer = s->per_layer;
    out->ndim = s->ndim;
    out->present = !s->unless || !c->v[s->unless - 1];
    out->numel = 1;
    for (size_t d = 0; d < s->ndim; d++) {
        const dim_spec *ds = &s->dim[d];
        uint64_t n = ds->mul * (uint64_t)c->v[ds->f];
        if (ds->xf)
            n *= (uint64_t)c->v[ds->xf - 1];
        if (ds->df)
            n /= (uint64_t)c->v[ds->df - 1];
        out->shape[d] = n;
        out->numel *= out->shape[d];
    }
}

uint32_t zck_arch_layers(const zck_arch_config *c) { return (uint32_t)c->v[c->arch->layers]; }

/* The tensors of table entries [t0, t1) (one group's) into group g; l: the layer of a
 * per-layer group. */
static int add_tensors(zck_layout *L, size_t g, const zck_arch_config *c, size_t t0, size_t t1,
                       uint32_t l)
{
    char name[320];
    zck_arch_tensor_info ti;
    for (size_t t = t0; t < t1; t++) {
        zck_arch_tensor(c, t, &ti);
        if (!ti.present)
            continue;
        if (ti.per_layer)
            snprintf(name, sizeof name, "%s.%u.%s", ti.group, l, ti.name);
        else
            snprintf(name, sizeof name, "%s", ti.name);
        ZR_TRY(zck_layout_add_tensor(L, g, name, ZCK_F32, ti.ndim, ti.shape));
    }
    return 0;
}

/* Groups in order of first use; tensors of one group are consecutive in the table. */
static int add_groups(zck_layout *L, const zck_arch_config *c)
{
    const zck_arch *a = c->arch;
    char name[320];
    size_t g;
    for (size_t t0 = 0, t1; t0 < a->n_tensors; t0 = t1) {
        const tensor_spec *s = &a->tensors[t0];
        for (t1 = t0 + 1; t1 < a->n_tensors && !strcmp(a->tensors[t1].group, s->group); t1++)
            ;
        int present = 0; /* a group whose tensors are all absent (a tied head) is no group */
        for (size_t t = t0; t < t1; t++)
            present |= !a->tensors[t].unless || !c->v[a->tensors[t].unless - 1];
        if (!present)
            continue;
        if (!s->per_layer) {
            ZR_TRY(zck_layout_add_group(L, &g, s->group));
            ZR_TRY(add_tensors(L, g, c, t0, t1, 0));
            continue;
        }
        for (uint32_t l = 0; l < zck_arch_layers(c); l++) {
            snprintf(name, sizeof name, "%s.%u", s->group, l);
            ZR_TRY(zck_layout_add_group(L, &g, name));
            ZR_TRY(add_tensors(L, g, c, t0, t1, l));
        }
    }
    return 0;
}

int zck_arch_layout(zck_layout **out, const zck_arch_config *c)
{
    char what[64];
    snprintf(what, sizeof what, "%s config", c->arch->name);
    ZR_TRY(zck_arch_config_check(c, what));
    zck_layout *L = NULL;
    int rc = 0;
    ZR_TRY_GOTO(zck_layout_new(&L), rc, fail);
    L->unchecked = true; /* names checked all at once below: a check per name is O(n^2) */
    for (size_t s = 0; s < c->arch->n_states; s++)
        ZR_TRY_GOTO(zck_layout_add_state(L, c->arch->states[s], ZCK_F32), rc, fail);
    ZR_TRY_GOTO(add_groups(L, c), rc, fail);
    L->unchecked = false;
    ZR_TRY_GOTO(zck__layout_check_unique(L), rc, fail);
    *out = L;
    return 0;
fail:
    zck_layout_free(L);
    return rc;
}
