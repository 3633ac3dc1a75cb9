/*
 * test_family.c: ckpt's model-family table (zck.h, "model families", ckpt/arch.c) against its
 * documentation: the GPT-2 rows of docs/FORMAT.md section 13 (states, groups, tensor names and
 * shapes in order, the model section's text) must be what the one table produces, and the
 * table's lookups and field parsing refuse what they should. core/ and formats/ both call the
 * table, so this replaces the tests that held their two copies identical.
 */
#include "harness.h"
#include "zck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* docs/FORMAT.md's section `num` (malloc'ed): from "## <num>. " to the next "## " */
static char *format_section(int num)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/docs/FORMAT.md", zt_root());
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char head[16];
    snprintf(head, sizeof head, "\n## %d. ", num);
    char *a = strstr(buf, head), *b = a ? strstr(a + 1, "\n## ") : NULL;
    if (!a)
        return NULL;
    return b ? strndup(a, (size_t)(b - a)) : strdup(a);
}

/* The value of a documented dimension ("3C", "V", "4C", "KVD") for the configs below (a Llama
 * of KV_ key/value heads of C_ / NH_ channels, MLP width I_). */
#define L_ 3
#define NH_ 2
#define C_ 8
#define T_ 5
#define V_ 7
#define KV_ 1
#define I_ 5
static uint64_t doc_dim(const char *s, size_t n)
{
    uint64_t mul = 0;
    size_t i = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        mul = mul * 10 + (uint64_t)(s[i] - '0');
    if (!i)
        mul = 1;
    if (n - i == 3 && !memcmp(s + i, "KVD", 3))
        return mul * KV_ * (C_ / NH_);
    if (n - i != 1)
        return 0;
    switch (s[i]) {
    case 'I': return mul * I_;
    case 'C': return mul * C_;
    case 'T': return mul * T_;
    case 'V': return mul * V_;
    default: return 0;
    }
}

typedef struct {
    char group[64], name[96];
    size_t ndim;
    uint64_t shape[2];
} doc_row;

/* The rows of the tensor table, per-layer rows expanded for layers 0 .. L_-1 in layout order. */
static size_t doc_rows(const char *sec, doc_row *out, size_t cap)
{
    doc_row tmpl[64];
    size_t nt = 0, n = 0;
    char group[64] = "";
    for (const char *p = sec; (p = strstr(p, "\n| ")) && nt < 64; p++) {
        char g[64] = "", name[96], shape[64];
        if (sscanf(p, "\n| `%63[^`]` | `%95[^`]` | [%63[^]]] |", g, name, shape) != 3 &&
            sscanf(p, "\n| | `%95[^`]` | [%63[^]]] |", name, shape) != 2)
            continue;
        if (g[0])
            snprintf(group, sizeof group, "%s", g);
        doc_row *r = &tmpl[nt++];
        snprintf(r->group, sizeof r->group, "%s", group);
        snprintf(r->name, sizeof r->name, "%s", name);
        const char *comma = strchr(shape, ',');
        r->ndim = comma ? 2 : 1;
        r->shape[0] = doc_dim(shape, comma ? (size_t)(comma - shape) : strlen(shape));
        r->shape[1] = comma ? doc_dim(comma + 2, strlen(comma + 2)) : 0;
    }
    /* expand h.<l>: the rows of one group repeat for each layer */
    for (size_t i = 0; i < nt;) {
        size_t j = i;
        while (j < nt && !strcmp(tmpl[j].group, tmpl[i].group))
            j++;
        const char *lt = strstr(tmpl[i].group, "<l>");
        for (int l = 0; l < (lt ? L_ : 1); l++)
            for (size_t k = i; k < j && n < cap; k++) {
                doc_row *r = &out[n++];
                *r = tmpl[k];
                if (!lt)
                    continue;
                /* "h.<l>" -> "h.1", "layers.<l>.x" -> "layers.1.x" */
                int pre = (int)(lt - tmpl[i].group);
                snprintf(r->group, sizeof r->group, "%.*s%d", pre, tmpl[i].group, l);
                const char *rest = strstr(tmpl[k].name, "<l>");
                snprintf(r->name, sizeof r->name, "%.*s%d%s", pre, tmpl[i].group, l,
                         rest ? rest + 3 : "");
            }
        i = j;
    }
    return n;
}

typedef struct {
    const char *field, *sym; /* the documented symbol, or a literal ("0") */
    double v;
} doc_field;

/* docs/FORMAT.md's section `num` against the family table's entry `family` with fields f (in
 * table order) at their values: states, groups and tensors with shapes in order, and the model
 * section's documented text (with the values too when `written`: integer fields only). */
static void check_family_doc(int num, const char *family, const doc_field *f, size_t nf,
                             int written)
{
    char *sec = format_section(num);
    ZT_CHECK(sec);
    const zck_arch *a;
    ZT_OK(zck_arch_find(&a, family));
    zck_arch_config c;
    zck_arch_config_init(&c, a);
    ZT_CHECK_EQ(zck_arch_n_fields(a), nf);
    for (size_t i = 0; i < nf; i++) {
        ZT_CHECK(!strcmp(zck_arch_field_name(a, i), f[i].field));
        zck_arch_config_set(&c, f[i].field, f[i].v);
    }
    zck_layout *L = NULL;
    ZT_OK(zck_arch_layout(&L, &c));
    /* states */
    const char *st = strstr(sec, "**States**");
    ZT_CHECK(st);
    st = strchr(st, ':');
    for (size_t s = 0; s < zck_layout_n_states(L); s++) {
        char want[80];
        snprintf(want, sizeof want, "`%s`", zck_layout_state_name(L, s));
        const char *at = strstr(st, want);
        if (!at || at - st > 80)
            ZT_FAIL("state %zu '%s' not next in FORMAT.md", s, zck_layout_state_name(L, s));
        st = at + strlen(want);
        ZT_CHECK_EQ(zck_layout_state_dtype(L, s), ZCK_F32);
    }

    /* groups and tensors, in order */
    static doc_row rows[1024];
    size_t nr = doc_rows(sec, rows, 1024), at = 0;
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++, at++) {
            zck_tensor_info ti;
            zck_layout_tensor(L, g, t, &ti);
            ZT_CHECK(at < nr);
            const doc_row *r = &rows[at];
            if (strcmp(r->group, zck_layout_group_name(L, g)) || strcmp(r->name, ti.name))
                ZT_FAIL("tensor %zu: the table has %s/%s, FORMAT.md %s/%s", at,
                        zck_layout_group_name(L, g), ti.name, r->group, r->name);
            ZT_CHECK_EQ(ti.dtype, ZCK_F32);
            ZT_CHECK_EQ(ti.ndim, r->ndim);
            for (size_t d = 0; d < ti.ndim; d++)
                if (ti.shape[d] != r->shape[d])
                    ZT_FAIL("%s: dim %zu is %llu in the table, %llu in FORMAT.md", ti.name, d,
                            (unsigned long long)ti.shape[d], (unsigned long long)r->shape[d]);
        }
    ZT_CHECK_EQ(at, nr);

    /* the model section: the documented text with the symbols, the written one with values */
    char doc[256], want[256];
    int n = snprintf(doc, sizeof doc, "{\"arch\":\"%s\"", zck_arch_name(a));
    int m = snprintf(want, sizeof want, "{\"arch\":\"%s\"", zck_arch_name(a));
    for (size_t i = 0; i < nf; i++) {
        n += snprintf(doc + n, sizeof doc - (size_t)n, ",\"%s\":%s", f[i].field, f[i].sym);
        m += snprintf(want + m, sizeof want - (size_t)m, ",\"%s\":%g", f[i].field, f[i].v);
    }
    snprintf(doc + n, sizeof doc - (size_t)n, "}");
    snprintf(want + m, sizeof want - (size_t)m, "}");
    if (!strstr(sec, doc))
        ZT_FAIL("FORMAT.md section %d does not show the model section %s", num, doc);
    char *json = NULL;
    ZT_OK(zck_arch_config_to_json(&json, &c));
    ZT_CHECK(!written || !strcmp(json, want));
    zck_arch_config back;
    ZT_OK(zck_arch_config_from_json(&back, json, NULL));
    ZT_CHECK(back.arch == a && !memcmp(back.v, c.v, sizeof c.v));
    free(json);
    zck_layout_free(L);
    free(sec);
}

ZT_TEST(family_gpt2_table_matches_format_doc)
{
    const doc_field f[] = {{"layers", "L", L_}, {"heads", "NH", NH_}, {"dim", "C", C_},
                           {"ctx", "T", T_}, {"vocab", "V", V_}};
    check_family_doc(13, "gpt2", f, 5, 1);
}

/* untied: the table of section 16 lists lm_head */
ZT_TEST(family_llama_table_matches_format_doc)
{
    const doc_field f[] = {{"layers", "L", L_}, {"heads", "H", NH_}, {"kv_heads", "KV", KV_},
                           {"dim", "C", C_},    {"ffn", "I", I_},    {"ctx", "T", T_},
                           {"vocab", "V", V_},  {"rope_theta", "R", 10000},
                           {"norm_eps", "E", 1e-5}, {"tied", "0", 0}};
    check_family_doc(16, "llama", f, 10, 0);
}

ZT_TEST(family_table_lookups_and_fields)
{
    const zck_arch *a = NULL;
    ZT_ERR(zck_arch_find(&a, "mistral"), ZR_ENOTFOUND,
           "unknown model family 'mistral' (expected one of \"gpt2\", \"llama\")");
    ZT_CHECK_EQ(zck_arch_count(), 2);
    ZT_CHECK(zck_arch_at(0) && zck_arch_at(1) && !zck_arch_at(2));
    ZT_OK(zck_arch_find(&a, "gpt2"));
    ZT_CHECK(zck_arch_at(0) == a);
    zck_arch_config c;
    zck_arch_config_init(&c, a); /* the defaults: the engine's tiny */
    ZT_CHECK(zck_arch_config_get(&c, "layers") == 4 && zck_arch_config_get(&c, "vocab") == 256);
    ZT_OK(zck_arch_config_set_fields(&c, "dim=64,vocab=11", "spec"));
    ZT_CHECK(zck_arch_config_get(&c, "dim") == 64 && zck_arch_config_get(&c, "vocab") == 11);
    ZT_ERR(zck_arch_config_set_fields(&c, "dim=66", "spec"), ZR_EINVAL,
           "spec: dim 66 is not a multiple of heads 4");
    ZT_ERR(zck_arch_config_set_fields(&c, "ffn=4", "spec"), ZR_EINVAL,
           "spec: unknown field 'ffn' (expected layers, heads, dim, ctx or vocab)");
    ZT_CHECK(zck_arch_config_get(&c, "dim") == 64); /* untouched on failure */
    /* a config's check: whole numbers in bounds */
    zck_arch_config_set(&c, "ctx", 2.5);
    ZT_ERR(zck_arch_config_check(&c, "x"), ZR_EINVAL, "x: field 'ctx' is 2.5 (expected an "
           "integer in [1, 4294967295])");
    zck_arch_config_set(&c, "ctx", 4294967296.0);
    ZT_ERR(zck_arch_config_check(&c, "x"), ZR_EINVAL, "field 'ctx' is 4294967296");
    zck_arch_config_set(&c, "ctx", 0);
    char *json = NULL;
    ZT_ERR(zck_arch_config_to_json(&json, &c), ZR_EINVAL,
           "gpt2 config: field 'ctx' is 0 (expected >= 1)");
    ZT_CHECK(!json);
    /* any family, or the one asked for */
    const char *llama = "{\"arch\":\"llama\",\"layers\":1}";
    ZT_ERR(zck_arch_config_from_json(&c, "{\"arch\":\"mistral\"}", NULL), ZR_EINVAL,
           "field 'arch': expected one of \"gpt2\", \"llama\", found mistral");
    ZT_ERR(zck_arch_config_from_json(&c, llama, NULL), ZR_EINVAL,
           "model section: missing field 'heads'");
    ZT_ERR(zck_arch_config_from_json(&c, llama, a), ZR_EINVAL,
           "field 'arch': expected \"gpt2\", found llama");
    /* the per-layer tensors are listed once, in layout order */
    size_t per_layer = 0;
    zck_arch_config_init(&c, a);
    for (size_t t = 0; t < zck_arch_n_tensors(a); t++) {
        zck_arch_tensor_info ti;
        zck_arch_tensor(&c, t, &ti);
        per_layer += ti.per_layer;
        if (t == 4)
            ZT_CHECK(!strcmp(ti.name, "attn.c_attn.weight") && !strcmp(ti.group, "h") &&
                     ti.ndim == 2 && ti.shape[0] == 3 * 128 && ti.shape[1] == 128 &&
                     ti.numel == 3 * 128 * 128);
    }
    ZT_CHECK_EQ(per_layer, 12);
    ZT_CHECK_EQ(zck_arch_layers(&c), 4);
}

/* Llama's fields: reals read from specs and JSON, the grouped-query and rotary checks, the head
 * dropped from the tensors of a tied config */
ZT_TEST(family_llama_fields_and_tied_head)
{
    const zck_arch *a = NULL;
    ZT_OK(zck_arch_find(&a, "llama"));
    zck_arch_config c;
    zck_arch_config_init(&c, a);
    ZT_CHECK(zck_arch_config_get(&c, "rope_theta") == 10000 &&
             zck_arch_config_get(&c, "norm_eps") == 1e-5 && zck_arch_config_get(&c, "tied") == 0);
    ZT_OK(zck_arch_config_set_fields(&c, "rope_theta=5e5,norm_eps=0.000001,heads=8,dim=64",
                                     "spec"));
    ZT_CHECK(zck_arch_config_get(&c, "rope_theta") == 5e5 &&
             zck_arch_config_get(&c, "norm_eps") == 1e-6);
    ZT_ERR(zck_arch_config_set_fields(&c, "kv_heads=3", "spec"), ZR_EINVAL,
           "spec: heads 8 is not a multiple of kv_heads 3");
    ZT_ERR(zck_arch_config_set_fields(&c, "dim=24", "spec"), ZR_EINVAL,
           "spec: head dimension dim / heads = 24 / 8 = 3 is odd");
    ZT_ERR(zck_arch_config_set_fields(&c, "norm_eps=1", "spec"), ZR_EINVAL,
           "spec: field 'norm_eps' is 1 (expected a number in [1e-12, 0.1])");
    ZT_ERR(zck_arch_config_set_fields(&c, "rope_theta=1e", "spec"), ZR_EINVAL,
           "field 'rope_theta': '1e' is not a number");
    ZT_ERR(zck_arch_config_set_fields(&c, "tied=0.5", "spec"), ZR_EINVAL,
           "field 'tied': '0.5' is not a number");
    /* JSON: a real written as an integer is read; an integer field written as a real is not */
    const char *ok = "{\"arch\":\"llama\",\"layers\":1,\"heads\":2,\"kv_heads\":1,\"dim\":8,"
                     "\"ffn\":5,\"ctx\":4,\"vocab\":7,\"rope_theta\":100,\"norm_eps\":1e-6,"
                     "\"tied\":1}";
    ZT_OK(zck_arch_config_from_json(&c, ok, NULL));
    ZT_CHECK(c.arch == a && zck_arch_config_get(&c, "rope_theta") == 100);
    ZT_ERR(zck_arch_config_from_json(&c, "{\"arch\":\"llama\",\"layers\":1,\"heads\":2,"
           "\"kv_heads\":1,\"dim\":8,\"ffn\":5,\"ctx\":4,\"vocab\":7,\"rope_theta\":\"x\"}",
           NULL), ZR_EINVAL, "field 'rope_theta': expected a number in [1, 1e+12]");
    /* tied: no lm_head tensor, no lm_head group */
    zck_arch_tensor_info ti;
    zck_arch_tensor(&c, zck_arch_n_tensors(a) - 1, &ti);
    ZT_CHECK(!strcmp(ti.name, "lm_head.weight") && !ti.present);
    zck_layout *L = NULL;
    ZT_OK(zck_arch_layout(&L, &c));
    ZT_CHECK_EQ(zck_layout_n_groups(L), 3);
    ZT_CHECK(!strcmp(zck_layout_group_name(L, 2), "norm"));
    zck_layout_free(L);
    zck_arch_config_set(&c, "tied", 0);
    ZT_OK(zck_arch_layout(&L, &c));
    ZT_CHECK_EQ(zck_layout_n_groups(L), 4);
    ZT_CHECK(!strcmp(zck_layout_group_name(L, 3), "lm_head"));
    zck_layout_free(L);
}
