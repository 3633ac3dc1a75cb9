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

/* docs/FORMAT.md's section 13 (malloc'ed) */
static char *format_section_13(void)
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
    char *a = strstr(buf, "\n## 13. "), *b = a ? strstr(a + 1, "\n## 14. ") : NULL;
    if (!a || !b)
        return NULL;
    return strndup(a, (size_t)(b - a));
}

/* The value of a documented dimension ("3C", "V", "4C") for the config below. */
#define L_ 3
#define NH_ 2
#define C_ 6
#define T_ 5
#define V_ 7
static uint64_t doc_dim(const char *s, size_t n)
{
    uint64_t mul = 0;
    size_t i = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        mul = mul * 10 + (uint64_t)(s[i] - '0');
    if (!i)
        mul = 1;
    if (n - i != 1)
        return 0;
    switch (s[i]) {
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
                snprintf(r->group, sizeof r->group, "h.%d", l);
                const char *rest = strstr(tmpl[k].name, "<l>");
                snprintf(r->name, sizeof r->name, "h.%d%s", l, rest ? rest + 3 : "");
            }
        i = j;
    }
    return n;
}

ZT_TEST(family_gpt2_table_matches_format_doc)
{
    char *sec = format_section_13();
    ZT_CHECK(sec);
    const zck_arch *a;
    ZT_OK(zck_arch_find(&a, "gpt2"));
    zck_arch_config c;
    zck_arch_config_init(&c, a);
    const struct {
        const char *field, *sym;
        double v;
    } f[] = {{"layers", "L", L_}, {"heads", "NH", NH_}, {"dim", "C", C_}, {"ctx", "T", T_},
             {"vocab", "V", V_}};
    ZT_CHECK_EQ(zck_arch_n_fields(a), 5);
    for (size_t i = 0; i < 5; i++) {
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
    ZT_CHECK_EQ(nr, 4 + 12 * L_);
    ZT_CHECK_EQ(zck_layout_n_groups(L), L_ + 3);
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
    for (size_t i = 0; i < 5; i++) {
        n += snprintf(doc + n, sizeof doc - (size_t)n, ",\"%s\":%s", f[i].field, f[i].sym);
        m += snprintf(want + m, sizeof want - (size_t)m, ",\"%s\":%g", f[i].field, f[i].v);
    }
    snprintf(doc + n, sizeof doc - (size_t)n, "}");
    snprintf(want + m, sizeof want - (size_t)m, "}");
    if (!strstr(sec, doc))
        ZT_FAIL("FORMAT.md section 13 does not show the model section %s", doc);
    char *json = NULL;
    ZT_OK(zck_arch_config_to_json(&json, &c));
    ZT_CHECK(!strcmp(json, want));
    zck_arch_config back;
    ZT_OK(zck_arch_config_from_json(&back, json, NULL));
    ZT_CHECK(back.arch == a && !memcmp(back.v, c.v, sizeof c.v));
    free(json);
    zck_layout_free(L);
    free(sec);
}

ZT_TEST(family_table_lookups_and_fields)
{
    const zck_arch *a = NULL;
    ZT_ERR(zck_arch_find(&a, "llama"), ZR_ENOTFOUND,
           "unknown model family 'llama' (expected \"gpt2\")");
    ZT_CHECK_EQ(zck_arch_count(), 1);
    ZT_CHECK(zck_arch_at(0) && !zck_arch_at(1));
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
    ZT_ERR(zck_arch_config_from_json(&c, llama, NULL), ZR_EINVAL,
           "field 'arch': expected \"gpt2\", found llama");
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
