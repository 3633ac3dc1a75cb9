/*
 * import.c: import a model as a new checkpoint at step 0 (zfmt_import). Three sources:
 *   - a Hugging Face directory of GPT2LMHeadModel (or GPT2Model) or LlamaForCausalLM:
 *     config.json (the family from model_type / architectures; fields that change the maths
 *     refused naming them)
 *     + model.safetensors, or the shards model.safetensors.index.json names; the names are
 *     mapped by the family's table (hfnames.c: prefixes, GPT-2's Conv1D weights stored [in, out]
 *     and transposed to our [out, in], buffers and a tied head ignored);
 *   - an llm.c model file (int32 magic 20240326, version 3 with a padded vocabulary or version 1
 *     without), padded rows of wte dropped;
 *   - a safetensors file in our names (as zfmt_safetensors_export writes it), its config from the
 *     "zero.model" metadata (any family), else a GPT-2 from the shapes and opts.heads; "<state>/<name>" tensors are
 *     ignored (optimizer states start at zero).
 * Every tensor is checked (missing, duplicated, unexpected, wrong shape) before anything is
 * written. Then each rank's shard is written through the ckpt writer (param from the source,
 * zeros for exp_avg and exp_avg_sq), up to IMPORT_JOBS ranks at once on their own threads (one
 * after the other for DeepSpeed and DCP sources), and the whole is committed with `latest`. At
 * most one source tensor per thread is held in memory at a time.
 */
#include "fmtutil.h"
#include "foreign.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { SRC_OURS, SRC_HF, SRC_LLMC, SRC_DS, SRC_DCP };

/* the states a source can hold, as the layout names them: the weights and AdamW's moments */
enum { ST_PARAM, ST_EXP_AVG, ST_EXP_AVG_SQ, N_ST };
static const char *const state_names[N_ST] = {"param", "exp_avg", "exp_avg_sq"};

typedef struct {
    int kind;
    zfmt_foreign_kind foreign; /* as detected: a DeepSpeed universal folder reads as SRC_DS */
    const char *file;            /* the file holding the tensors, for messages */
    char *file_buf;              /* owns file when it is built */
    zck_arch_config a;           /* the model */
    zfmt_gpt2_config c;          /* the same for GPT-2 sources (llm.c, ours without metadata) */
    const zfmt__hf_family *fam;  /* Hugging Face sources: the family's names */
    zck_layout *L;
    size_t nt;                   /* tensors, flat index in layout order */
    size_t *t_group;             /* per flat index */
    zck_tensor_info *t_info;     /* per flat index (names borrowed from L) */
    /* safetensors sources: one file, or Hugging Face's shards */
    zfmt__st_file **st;
    size_t n_st;
    const zfmt__st_entry **map;  /* per flat index: the source entry */
    size_t *map_file;            /* per flat index: its file in st */
    unsigned char *tr;           /* per flat index: stored [in, out] (GPT-2's Conv1D) */
    /* llm.c sources */
    int fd;
    uint64_t llmc_off[ZFMT__LLMC_ARRAYS]; /* byte offset of each array in the file */
    /* DeepSpeed and DCP checkpoints: per flat index and state, the source's parameter (DS) or
     * item (DCP), -1 when it has none; the moments and the steps AdamW took when it has them */
    zfmt__ds *ds;
    zfmt__dcp *dcp;
    long (*fx)[N_ST];
    int moments;
    int64_t step;
    char optim_note[512];        /* the source optimizer's hyper-parameters, for the user */
    /* the one tensor in memory, as f32 in our layout */
    size_t cached, cached_state;
    float *buf;
} source;

/* ---------------------------------------------------------------- naming */

/* Parse "<digits>" at *p (no sign, no leading zeros but "0"); advance past it. */
static int parse_uint(const char **p, uint32_t *out)
{
    const char *s = *p;
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
        return -1;
    uint64_t v = 0;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (uint64_t)(*s++ - '0');
        if (v > UINT32_MAX)
            return -1;
    }
    *out = (uint32_t)v;
    *p = s;
    return 0;
}

/* Flat index of one of our tensor names, or -1. */
static long flat_index(const source *s, const char *name)
{
    for (size_t i = 0; i < s->nt; i++)
        if (!strcmp(s->t_info[i].name, name))
            return (long)i;
    return -1;
}

/* The per-layer kind of a flat index, or -1 for wte, wpe, ln_f. */
static int kind_of(const source *s, size_t i)
{
    if (i < 2 || i >= 2 + (size_t)s->c.layers * ZFMT__GPT2_KINDS)
        return -1;
    return (int)((i - 2) % ZFMT__GPT2_KINDS);
}

/* ---------------------------------------------------------------- sources */

static void source_free(source *s)
{
    for (size_t i = 0; i < s->n_st; i++)
        zfmt__st_free(s->st[i]);
    free(s->st);
    free(s->map_file);
    free(s->tr);
    if (s->fd >= 0)
        close(s->fd);
    free(s->map);
    free(s->t_group);
    free(s->t_info);
    free(s->buf);
    free(s->file_buf);
    free(s->fx);
    zfmt__ds_free(s->ds);
    zfmt__dcp_free(s->dcp);
    zck_layout_free(s->L);
}

/* Build the layout of s->a and the flat tensor tables. */
static int source_layout(source *s)
{
    if (zck_arch_layout(&s->L, &s->a) < 0) {
        zr_err_prefix("%s: ", s->file);
        return zr_err_code() == ZR_ENOMEM ? ZR_ENOMEM : zfmt__err_recode(ZR_ECORRUPT);
    }
    size_t n = 0;
    for (size_t g = 0; g < zck_layout_n_groups(s->L); g++)
        n += zck_layout_group_n_tensors(s->L, g);
    s->nt = n;
    if (!(s->t_group = calloc(n, sizeof *s->t_group)) ||
        !(s->t_info = calloc(n, sizeof *s->t_info)) || !(s->map = calloc(n, sizeof *s->map)) ||
        !(s->map_file = calloc(n, sizeof *s->map_file)) || !(s->tr = calloc(n, 1)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t i = 0;
    for (size_t g = 0; g < zck_layout_n_groups(s->L); g++)
        for (size_t t = 0; t < zck_layout_group_n_tensors(s->L, g); t++, i++) {
            s->t_group[i] = g;
            zck_layout_tensor(s->L, g, t, &s->t_info[i]);
        }
    return 0;
}

/* ZR_ECORRUPT unless the index (weight_map, NULL: none) puts tensor name in file fname. */
static int check_indexed(json_t *weight_map, const char *name, const char *fname,
                         const char *path)
{
    if (!weight_map)
        return 0;
    json_t *v = json_object_get(weight_map, name);
    if (!v)
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' is not in the index's weight_map", path,
                          name);
    if (!json_is_string(v) || strcmp(json_string_value(v), fname))
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' is in this file but the index puts it "
                          "in '%s'", path, name, json_is_string(v) ? json_string_value(v) : "?");
    return 0;
}

/* Our flat index *x of the source's tensor src_name (in Hugging Face's names when hf) of shape
 * shape[ndim], *tr when it is stored [in, out] (GPT-2's Conv1D); *x -1 for one that is not a
 * parameter of ours (a buffer, the head of a tied model). ZR_ECORRUPT naming where, for a
 * tensor the model does not have or one of another shape. */
static int map_name(source *s, const char *src_name, int hf, size_t ndim, const uint64_t *shape,
                    const char *where, long *x, int *tr)
{
    const char *name = src_name;
    *x = -1;
    *tr = 0;
    if (hf && !(name = zfmt__hf_to_ours(s->fam, src_name, tr)))
        return 0; /* a buffer: causal masks, rotary frequencies */
    long i = flat_index(s, name);
    if (i < 0 && hf && zfmt__hf_is_head(s->fam, src_name))
        return 0; /* the output head of a tied model: the embedding */
    if (i < 0)
        return zr_err_set(ZR_ECORRUPT, "%s: unexpected tensor '%s' (not part of a %s of %u "
                          "layers)", where, src_name, zck_arch_name(s->a.arch),
                          zck_arch_layers(&s->a));
    /* expected shape, in the source's orientation */
    const zck_tensor_info *ti = &s->t_info[i];
    uint64_t want[ZCK_MAX_DIMS];
    memcpy(want, ti->shape, sizeof want);
    if (*tr) {
        want[0] = ti->shape[1];
        want[1] = ti->shape[0];
    }
    int same = ndim == ti->ndim;
    for (size_t d = 0; same && d < ti->ndim; d++)
        same = shape[d] == want[d];
    if (!same) {
        char a[128], b[128];
        zfmt__shape_str(a, sizeof a, ndim, shape);
        zfmt__shape_str(b, sizeof b, ti->ndim, want);
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' has shape %s, expected %s%s", where,
                          src_name, a, b, *tr ? " (Conv1D: [in, out])" : "");
    }
    *x = i;
    return 0;
}

/* Map every entry of safetensors file fi onto our tensors; check dtype and shape, that
 * nothing is duplicated or unexpected, and that the index (weight_map, NULL: none) agrees. */
static int map_entries(source *s, size_t fi, json_t *weight_map, const char *fname)
{
    const zfmt__st_file *f = s->st[fi];
    for (size_t i = 0; i < f->n; i++) {
        const zfmt__st_entry *e = &f->e[i];
        ZR_TRY(check_indexed(weight_map, e->name, fname, f->path));
        if (s->kind != SRC_HF && strchr(e->name, '/'))
            continue; /* an optimizer state of an export: states start at zero */
        long x;
        int tr;
        ZR_TRY(map_name(s, e->name, s->kind == SRC_HF, e->ndim, e->shape, f->path, &x, &tr));
        if (x < 0)
            continue;
        if (s->map[x])
            return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' duplicated (as '%s' and '%s')",
                              f->path, s->t_info[x].name, s->map[x]->name, e->name);
        if (e->dtype != ZCK_F32 && e->dtype != ZCK_BF16 && e->dtype != ZCK_F16)
            return zr_err_set(ZR_EUNSUPPORTED, "%s: tensor '%s': dtype %s (expected F32, BF16 "
                              "or F16)", f->path, e->name, zfmt__st_dtype_name(e->dtype));
        s->map[x] = e;
        s->map_file[x] = fi;
        s->tr[x] = (unsigned char)tr;
    }
    return 0;
}

/* After every file is mapped: ZR_ECORRUPT naming a tensor no file holds. */
static int check_missing(const source *s, const char *where)
{
    for (size_t i = 0; i < s->nt; i++)
        if (!s->map[i])
            return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' missing", where, s->t_info[i].name);
    return 0;
}

static int json_field_u32(uint32_t *out, json_t *root, const char *name, const char *path)
{
    json_t *v = json_object_get(root, name);
    if (!v)
        return zr_err_set(ZR_ECORRUPT, "%s: missing field '%s'", path, name);
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > (json_int_t)UINT32_MAX)
        return zr_err_set(ZR_ECORRUPT, "%s: field '%s': expected a positive integer", path,
                          name);
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static const zfmt__st_entry *st_find(const zfmt__st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, name))
            return &f->e[i];
    return NULL;
}

/* Open safetensors file path as the source's next file. */
static int add_st(source *s, const char *path)
{
    zfmt__st_file **st = realloc(s->st, (s->n_st + 1) * sizeof *st);
    if (!st)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    s->st = st;
    ZR_TRY(zfmt__st_open(&s->st[s->n_st], path));
    s->n_st++;
    return 0;
}

/* A JSON object from file path (*out: a new reference). */
static int load_json(json_t **out, const char *path)
{
    json_error_t jerr;
    int fd;
    ZR_TRY(zck_open_regular(&fd, path, ZCK_FOLLOW, NULL));
    json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &jerr);
    close(fd);
    if (!root)
        return zr_err_set(ZR_ECORRUPT, "%s:%d: invalid JSON: %s", path, jerr.line, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return zr_err_set(ZR_ECORRUPT, "%s: not a JSON object", path);
    }
    *out = root;
    return 0;
}

/* An optional field of config.json: absent or null gives def; else a number in (0, max]. */
static int json_field_real(double *out, json_t *root, const char *name, double def, double max,
                           const char *path)
{
    json_t *v = json_object_get(root, name);
    *out = def;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > max)
        return zr_err_set(ZR_ECORRUPT, "%s: field '%s': expected a positive number", path, name);
    *out = json_number_value(v);
    return 0;
}

/* ---------------------------------------------------------------- config.json refusals
 * A field of config.json that would change the maths unless at its neutral value is refused
 * naming the field (and what it holds) rather than silently ignored. Each family lists its
 * fields in a table of rules; absent is always transformers' default, which zero computes. */

enum hf_want {
    HF_NULL,   /* absent or null */
    HF_FALSE,  /* absent or false */
    HF_TRUE,   /* absent or true */
    HF_ONE_OF, /* absent, or one of names */
    HF_INT,    /* absent, null, or the integer value */
    HF_F32     /* absent, null, or a number equal to value in float32 (zero computes in f32) */
};

typedef struct {
    const char *field;
    enum hf_want want;
    const char *const *names; /* HF_ONE_OF: the accepted strings, NULL-terminated */
    double value;             /* HF_INT, HF_F32: the accepted number */
    const char *why;          /* what zero computes instead, for the message */
} hf_rule;

static int hf_rule_ok(const hf_rule *r, json_t *v)
{
    switch (r->want) {
    case HF_NULL:
        return json_is_null(v);
    case HF_FALSE:
        return json_is_false(v);
    case HF_TRUE:
        return json_is_true(v);
    case HF_ONE_OF:
        for (size_t i = 0; json_is_string(v) && r->names[i]; i++)
            if (!strcmp(json_string_value(v), r->names[i]))
                return 1;
        return 0;
    case HF_INT:
        return json_is_null(v) || (json_is_integer(v) && json_integer_value(v) == r->value);
    case HF_F32:
        return json_is_null(v) ||
               (json_is_number(v) && (float)json_number_value(v) == (float)r->value);
    }
    return 0;
}

/* ZR_EUNSUPPORTED naming cfg, the first field of rules[n] that root holds at another value, the
 * value and the rule's reason; 0 when every field is absent or neutral. */
static int hf_refuse_fields(json_t *root, const hf_rule *rules, size_t n, const char *cfg)
{
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_object_get(root, rules[i].field);
        if (!v || hf_rule_ok(&rules[i], v))
            continue;
        char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(9));
        int rc = zr_err_set(ZR_EUNSUPPORTED, "%s: field '%s' is %.80s%s: not supported (%s)",
                            cfg, rules[i].field, text ? text : "?",
                            text && strlen(text) > 80 ? "..." : "", rules[i].why);
        free(text);
        return rc;
    }
    return 0;
}

/* GPT-2's config.json: besides the shape, transformers' GPT2Config fields that change what the
 * model computes. reorder_and_upcast_attn is accepted: in transformers it only moves the 1 /
 * sqrt(head size) scale into the q k^T product (baddbmm's alpha) and computes that product and
 * the softmax in float32, so in float32, as zero computes, it changes rounding, not the maths
 * (and only in the "eager" attention; the others ignore it). */
static int gpt2_refusals(json_t *root, uint32_t dim, const char *cfg)
{
    /* transformers' names of the tanh approximation of GELU, zero's: the formula written out
     * (gelu_new, gelu_python_tanh), torch's gelu(approximate="tanh") (gelu_pytorch_tanh), the
     * same with sqrt(2 / pi) as 0.7978845608 (gelu_fast: the same float32 constant) */
    static const char *const tanh_gelu[] = {"gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh",
                                            "gelu_fast", NULL};
    const hf_rule rules[] = {
        {"activation_function", HF_ONE_OF, tanh_gelu, 0,
         "zero's GPT-2 has the tanh approximation of GELU: gelu_new, gelu_pytorch_tanh, "
         "gelu_python_tanh or gelu_fast"},
        {"n_inner", HF_INT, NULL, 4.0 * dim, "zero's GPT-2 MLP is 4 * n_embd wide"},
        {"layer_norm_epsilon", HF_F32, NULL, 1e-5, "zero's GPT-2 LayerNorm epsilon is 1e-5"},
        {"scale_attn_weights", HF_TRUE, NULL, 0,
         "zero scales attention scores by 1 / sqrt(head size)"},
        {"scale_attn_by_inverse_layer_idx", HF_FALSE, NULL, 0,
         "zero does not scale attention scores by 1 / (layer + 1)"},
        {"add_cross_attention", HF_FALSE, NULL, 0,
         "zero's GPT-2 is decoder-only, without cross-attention"},
        {"tie_word_embeddings", HF_TRUE, NULL, 0, "zero's GPT-2 head is wte (tied)"},
    };
    return hf_refuse_fields(root, rules, sizeof rules / sizeof *rules, cfg);
}

/* GPT2LMHeadModel's config.json (n_layer, n_head, n_embd, n_positions, vocab_size). */
static int hf_config_gpt2(source *s, json_t *root, const char *cfg)
{
    ZR_TRY(json_field_u32(&s->c.layers, root, "n_layer", cfg));
    ZR_TRY(json_field_u32(&s->c.heads, root, "n_head", cfg));
    ZR_TRY(json_field_u32(&s->c.dim, root, "n_embd", cfg));
    ZR_TRY(json_field_u32(&s->c.ctx, root,
                          json_object_get(root, "n_positions") ? "n_positions" : "n_ctx", cfg));
    ZR_TRY(json_field_u32(&s->c.vocab, root, "vocab_size", cfg));
    ZR_TRY(gpt2_refusals(root, s->c.dim, cfg));
    zck_gpt2_to_arch(&s->a, &s->c);
    return 0;
}

/* Llama's config.json: transformers' LlamaConfig fields that change what the model computes. */
static int llama_refusals(json_t *root, uint32_t dim, uint32_t heads, const char *cfg)
{
    /* transformers computes both with torch's silu (activations.py's ACT2CLS) */
    static const char *const silu[] = {"silu", "swish", NULL};
    const hf_rule rules[] = {
        {"rope_scaling", HF_NULL, NULL, 0,
         "zero's Llama has plain rotary positions over the full context"},
        {"sliding_window", HF_NULL, NULL, 0, "zero's Llama attends over the full context"},
        {"attention_bias", HF_FALSE, NULL, 0, "zero's Llama has no biases"},
        {"mlp_bias", HF_FALSE, NULL, 0, "zero's Llama has no biases"},
        {"hidden_act", HF_ONE_OF, silu, 0, "only \"silu\" or \"swish\" (SwiGLU) is supported"},
        {"head_dim", HF_INT, NULL, dim / heads, "zero's head size is hidden_size / "
         "num_attention_heads"},
    };
    ZR_TRY(hf_refuse_fields(root, rules, sizeof rules / sizeof *rules, cfg));
    json_t *rp = json_object_get(root, "rope_parameters"); /* transformers 5 */
    json_t *rt = rp ? json_object_get(rp, "rope_type") : NULL;
    if (rp && !json_is_null(rp) &&
        (!json_is_object(rp) || (rt && (!json_is_string(rt) ||
                                        strcmp(json_string_value(rt), "default")))))
        return zr_err_set(ZR_EUNSUPPORTED, "%s: field 'rope_parameters': only rope_type "
                          "\"default\" (no scaling) is supported", cfg);
    return 0;
}

/* LlamaForCausalLM's config.json, with transformers' LlamaConfig defaults for what is absent
 * (num_key_value_heads: num_attention_heads, rms_norm_eps 1e-6, rope_theta 10000, untied). */
static int hf_config_llama(source *s, json_t *root, const char *cfg)
{
    static const struct {
        const char *hf, *ours;
    } ints[] = {{"num_hidden_layers", "layers"}, {"num_attention_heads", "heads"},
                {"hidden_size", "dim"}, {"intermediate_size", "ffn"},
                {"max_position_embeddings", "ctx"}, {"vocab_size", "vocab"},
                {"num_key_value_heads", "kv_heads"}};
    const zck_arch *llama;
    ZR_TRY(zck_arch_find(&llama, "llama"));
    zck_arch_config_init(&s->a, llama);
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        uint32_t v;
        json_t *j = json_object_get(root, ints[i].hf);
        if (!strcmp(ints[i].ours, "kv_heads") && (!j || json_is_null(j)))
            v = (uint32_t)zck_arch_config_get(&s->a, "heads");
        else
            ZR_TRY(json_field_u32(&v, root, ints[i].hf, cfg));
        zck_arch_config_set(&s->a, ints[i].ours, v);
    }
    uint32_t dim = (uint32_t)zck_arch_config_get(&s->a, "dim");
    uint32_t heads = (uint32_t)zck_arch_config_get(&s->a, "heads");
    ZR_TRY(llama_refusals(root, dim, heads, cfg));
    double theta, eps;
    json_t *rp = json_object_get(root, "rope_parameters");
    ZR_TRY(json_field_real(&theta, json_is_object(rp) && json_object_get(rp, "rope_theta") ? rp
                           : root, "rope_theta", 10000, 1e12, cfg));
    ZR_TRY(json_field_real(&eps, root, "rms_norm_eps", 1e-6, 0.1, cfg));
    json_t *tied = json_object_get(root, "tie_word_embeddings");
    if (tied && !json_is_boolean(tied))
        return zr_err_set(ZR_ECORRUPT, "%s: field 'tie_word_embeddings': expected true or false",
                          cfg);
    zck_arch_config_set(&s->a, "rope_theta", theta);
    zck_arch_config_set(&s->a, "norm_eps", eps);
    zck_arch_config_set(&s->a, "tied", tied && json_is_true(tied));
    return 0;
}

/* The family of a config.json from model_type and architectures (neither: GPT-2, as older
 * files have it); unknown ones refused. */
static int hf_family(source *s, json_t *root, const char *cfg)
{
    json_t *mt = json_object_get(root, "model_type"), *ar = json_object_get(root, "architectures");
    if (ar && (!json_is_array(ar) || json_array_size(ar) != 1 ||
               !json_is_string(json_array_get(ar, 0))))
        return zr_err_set(ZR_EUNSUPPORTED, "%s: field 'architectures': expected one "
                          "architecture", cfg);
    if (mt && !json_is_string(mt))
        return zr_err_set(ZR_ECORRUPT, "%s: field 'model_type': expected a string", cfg);
    const char *type = mt ? json_string_value(mt) : NULL;
    const char *arch = ar ? json_string_value(json_array_get(ar, 0)) : NULL;
    const zfmt__hf_family *by_arch = NULL, *by_type = NULL;
    for (size_t i = 0; i < zck_arch_count(); i++) {
        const char *name = zck_arch_name(zck_arch_at(i));
        const zfmt__hf_family *f = zfmt__hf_family_of(name);
        if (f && arch && zfmt__hf_arch_imports(f, arch))
            by_arch = f;
        if (f && type && !strcmp(type, name))
            by_type = f;
    }
    if (arch && !by_arch)
        return zr_err_set(ZR_EUNSUPPORTED, "%s: field 'architectures' is \"%s\": not supported "
                          "(expected GPT2LMHeadModel, GPT2Model or LlamaForCausalLM)", cfg, arch);
    if (type && !by_type)
        return zr_err_set(ZR_EUNSUPPORTED, "%s: field 'model_type' is \"%s\": not supported "
                          "(expected gpt2 or llama)", cfg, type);
    if (by_arch && by_type && by_arch != by_type)
        return zr_err_set(ZR_ECORRUPT, "%s: field 'architectures' (%s) and field 'model_type' "
                          "(%s) disagree", cfg, arch, type);
    s->fam = by_arch ? by_arch : by_type ? by_type : zfmt__hf_family_of("gpt2");
    return 0;
}

/* The shards of model.safetensors.index.json: every file its weight_map names, each tensor in
 * the file the index says, and every tensor the index lists present. */
static int open_hf_shards(source *s, const char *dir, const char *idx)
{
    json_t *root = NULL;
    ZR_TRY(load_json(&root, idx));
    json_t *wm = json_object_get(root, "weight_map");
    int rc = 0;
    if (!json_is_object(wm) || !json_object_size(wm)) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: no 'weight_map' object of tensor names", idx);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *fn = json_is_string(v) ? json_string_value(v) : NULL;
        if (!fn || !*fn || fn[0] == '.' || strchr(fn, '/')) {
            rc = zr_err_set(ZR_ECORRUPT, "%s: weight_map['%s']: expected a file name in the "
                            "directory", idx, key);
            goto out;
        }
        char *path = zck_path_join(dir, fn);
        size_t k = 0;
        while (path && k < s->n_st && strcmp(s->st[k]->path, path))
            k++;
        if (!path)
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        else if (k == s->n_st && !(rc = add_st(s, path)))
            rc = map_entries(s, k, wm, fn);
        if (!rc && !st_find(s->st[k], key))
            rc = zr_err_set(ZR_ECORRUPT, "%s: the index puts tensor '%s' in %s, which does "
                            "not hold it", idx, key, fn);
        free(path);
        if (rc)
            goto out;
    }
    rc = check_missing(s, idx);
out:
    json_decref(root);
    return rc;
}

/* The weights: model.safetensors when there, else the shards of its index. */
static int open_hf_weights(source *s, const char *dir)
{
    if (!(s->file_buf = zck_path_join(dir, "model.safetensors")))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    s->file = s->file_buf;
    struct stat st;
    if (stat(s->file, &st) == 0 || errno != ENOENT) {
        ZR_TRY(add_st(s, s->file));
        ZR_TRY(map_entries(s, 0, NULL, NULL));
        return check_missing(s, s->file);
    }
    char *idx = zck_path_join(dir, "model.safetensors.index.json");
    if (!idx)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc;
    if (stat(idx, &st) < 0 && errno == ENOENT)
        rc = zr_err_set(ZR_ENOTFOUND, "%s: neither model.safetensors nor "
                        "model.safetensors.index.json", dir);
    else
        rc = open_hf_shards(s, dir, idx);
    free(idx);
    return rc;
}

/* The model of a Hugging Face config.json, and its layout. */
static int hf_config(source *s, const char *cfg)
{
    json_t *root = NULL;
    int rc = 0;
    ZR_TRY_GOTO(load_json(&root, cfg), rc, out);
    ZR_TRY_GOTO(hf_family(s, root, cfg), rc, out);
    if (!strcmp(zfmt__hf_arch(s->fam), "GPT2LMHeadModel"))
        ZR_TRY_GOTO(hf_config_gpt2(s, root, cfg), rc, out);
    else
        ZR_TRY_GOTO(hf_config_llama(s, root, cfg), rc, out);
    if (zck_arch_config_check(&s->a, cfg) < 0) {
        rc = zfmt__err_recode(ZR_ECORRUPT);
        goto out;
    }
    rc = source_layout(s);
out:
    json_decref(root);
    return rc;
}

static int open_hf(source *s, const char *dir)
{
    char *cfg = zck_path_join(dir, "config.json");
    if (!cfg)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = hf_config(s, cfg);
    free(cfg);
    return rc ? rc : open_hf_weights(s, dir);
}

/* ---------------------------------------------------------------- DeepSpeed and DCP
 * The model comes from a Hugging Face config.json (opts.config, else the one beside the
 * checkpoint: in a DeepSpeed save_dir, where the Hugging Face Trainer writes it, or in a DCP
 * directory); its parameters, AdamW's moments and step from the checkpoint, verified in full
 * first (every CRC-32). Names are the wrapped model's, Hugging Face's. */

/* The config.json to use: given, else dir/config.json, else (a DeepSpeed tag folder) the one
 * in dir's parent. *out malloc'ed. */
static int foreign_config(char **out, const char *dir, const char *given, int parent_too)
{
    if (given)
        return (*out = strdup(given)) ? 0 : zr_err_set(ZR_ENOMEM, "out of memory");
    char *p = zck_path_join(dir, "config.json");
    struct stat st;
    if (p && stat(p, &st) < 0 && errno == ENOENT && parent_too) {
        char *up = zck_path_join(dir, "..");
        free(p);
        p = up ? zck_path_join(up, "config.json") : NULL;
        free(up);
    }
    if (!p)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    if (stat(p, &st) < 0 && errno == ENOENT) {
        free(p);
        return zr_err_set(ZR_ENOTFOUND, "%s: no config.json beside the checkpoint: the model's "
                          "shape and family come from its Hugging Face config.json (zckpt "
                          "import --config FILE)", dir);
    }
    *out = p;
    return 0;
}

/* A number of a param_groups entry, or NaN. */
static double group_real(const zfmt__pv *g, const char *key)
{
    const zfmt__pv *v = zfmt__pv_get(g, key);
    int64_t i;
    if (v && v->kind == ZFMT__PK_FLOAT)
        return v->f;
    return zfmt__pv_int(v, &i) ? (double)i : NAN;
}

/* What the user needs to continue the same run in zrun: the source optimizer's settings
 * (groups: a list of param_groups dicts, as DeepSpeed's files and DCP's items give them),
 * against zrun's (betas 0.9, 0.95, eps 1e-8, decay on matrices only). */
static void optim_note(source *s, const zfmt__pv *const *groups, size_t n)
{
    if (!n)
        return;
    const zfmt__pv *g0 = groups[0], *betas = zfmt__pv_get(g0, "betas");
    double lr = group_real(g0, "lr"), eps = group_real(g0, "eps"), b1 = NAN, b2 = NAN;
    if (betas && (betas->kind == ZFMT__PK_TUPLE || betas->kind == ZFMT__PK_LIST) &&
        betas->n == 2) {
        b1 = betas->items[0]->kind == ZFMT__PK_FLOAT ? betas->items[0]->f : NAN;
        b2 = betas->items[1]->kind == ZFMT__PK_FLOAT ? betas->items[1]->f : NAN;
    }
    char wd[160] = "";
    for (size_t g = 0; g < n && strlen(wd) < sizeof wd - 24; g++)
        snprintf(wd + strlen(wd), sizeof wd - strlen(wd), "%s%g", g ? ", " : "",
                 group_real(groups[g], "weight_decay"));
    /* one group decaying everything: biases and norms too, which zrun never decays */
    int all = n == 1 && group_real(g0, "weight_decay") != 0;
    snprintf(s->optim_note, sizeof s->optim_note, "the source's AdamW: lr %g, betas (%g, %g), "
             "eps %g, weight decay per group %s%s%s", lr, b1, b2, eps, wd,
             (b1 == 0.9 && b2 == 0.95 && eps == 1e-8)
                 ? ""
                 : "; zrun computes betas (0.9, 0.95) and eps 1e-8, so the continued run "
                   "differs",
             all ? "; zrun decays matrices only (the source also decayed biases and norms)"
                 : "");
}

/* DeepSpeed: the trainable parameters of param_shapes, their fp32 master weights and moments
 * as zero_to_fp32 rebuilds them. */
static int open_ds(source *s, const char *path, const zfmt_import_opts *o)
{
    ZR_TRY(zfmt__foreign_open(path, 1, &o->progress, &s->ds, &s->dcp));
    char *cfg = NULL;
    ZR_TRY(foreign_config(&cfg, path, o->config, !*zfmt__ds_tag(s->ds)));
    int rc = hf_config(s, cfg);
    free(cfg);
    ZR_TRY(rc);
    if (!(s->fx = malloc(s->nt * sizeof *s->fx)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    memset(s->fx, 0xff, s->nt * sizeof *s->fx); /* -1 */
    const zfmt__ds_param *p;
    size_t n = zfmt__ds_params(s->ds, &p);
    for (size_t i = 0; i < n; i++) {
        long x;
        int tr;
        ZR_TRY(map_name(s, p[i].name, 1, p[i].ndim, p[i].shape, path, &x, &tr));
        if (x < 0)
            continue;
        if (s->fx[x][ST_PARAM] >= 0)
            return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' duplicated (as '%s' and '%s')", path,
                              s->t_info[x].name, p[s->fx[x][ST_PARAM]].name, p[i].name);
        for (int k = 0; k < N_ST; k++)
            s->fx[x][k] = (long)i;
        s->tr[x] = (unsigned char)tr;
    }
    for (size_t i = 0; i < s->nt; i++)
        if (s->fx[i][ST_PARAM] < 0)
            return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' missing (not a trainable parameter "
                              "of the checkpoint)", path, s->t_info[i].name);
    const zfmt__pv *groups;
    ZR_TRY(zfmt__ds_adam(s->ds, &s->step, &groups));
    s->moments = 1;
    if (groups)
        optim_note(s, (const zfmt__pv *const *)groups->items, groups->n);
    return 0;
}

/* get_state_dict's param_groups, a bytes item per value ("optimizer.param_groups.<g>.lr"), as
 * dicts for optim_note: what is absent or not a number is left out. */
static int dcp_optim_note(source *s)
{
    static const char *const keys[] = {"lr", "betas", "eps", "weight_decay"};
    enum { G = 16, K = sizeof keys / sizeof *keys };
    zfmt__pickle *pk[G][K] = {{0}};
    zfmt__pv dict[G], *items[G][2 * K], key[K];
    const zfmt__pv *groups[G];
    size_t n = 0;
    int rc = 0;
    memset(dict, 0, sizeof dict);
    memset(key, 0, sizeof key);
    for (size_t k = 0; k < K; k++) {
        key[k].kind = ZFMT__PK_STR;
        key[k].s = (char *)keys[k];
        key[k].len = strlen(keys[k]);
    }
    for (; !rc && n < G; n++) {
        dict[n].kind = ZFMT__PK_DICT;
        dict[n].items = items[n];
        for (size_t k = 0; !rc && k < K; k++) {
            char fqn[96];
            snprintf(fqn, sizeof fqn, "optimizer.param_groups.%zu.%s", n, keys[k]);
            long i = zfmt__dcp_find(s->dcp, fqn);
            if (i < 0 || (rc = zfmt__dcp_value(s->dcp, (size_t)i, &pk[n][k])))
                continue;
            items[n][dict[n].n++] = &key[k]; /* a DICT's n counts keys and values */
            items[n][dict[n].n++] = (zfmt__pv *)zfmt__pickle_root(pk[n][k]);
        }
        if (!dict[n].n)
            break;
        groups[n] = &dict[n];
    }
    if (!rc)
        optim_note(s, groups, n);
    for (size_t g = 0; g < G; g++)
        for (size_t k = 0; k < K; k++)
            zfmt__pickle_free(pk[g][k]);
    return rc;
}

/* DCP: a model state dict (keys: the parameter names), or get_state_dict's {"model": ...[,
 * "optimizer": ...]} (zfmt_dcp_export's) with the moments as
 * "optimizer.state.<name>.exp_avg" / ".exp_avg_sq" and the step as ".step". */
static int open_dcp(source *s, const char *path, const zfmt_import_opts *o)
{
    ZR_TRY(zfmt__foreign_open(path, 1, &o->progress, &s->ds, &s->dcp));
    char *cfg = NULL;
    ZR_TRY(foreign_config(&cfg, path, o->config, 0));
    int rc = hf_config(s, cfg);
    free(cfg);
    ZR_TRY(rc);
    if (!(s->fx = malloc(s->nt * sizeof *s->fx)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    memset(s->fx, 0xff, s->nt * sizeof *s->fx); /* -1 */
    size_t n = zfmt__dcp_n(s->dcp);
    /* get_state_dict's: an "optimizer." item, or every item under "model." (a bare
     * LlamaForCausalLM state dict has lm_head.weight outside its "model." prefix) */
    int layout = 0, wrapped = n > 0;
    for (size_t i = 0; i < n; i++) {
        const char *fqn;
        zck_dtype dt;
        size_t nd;
        const uint64_t *sz;
        zfmt__dcp_tensor(s->dcp, i, &fqn, &dt, &nd, &sz);
        layout |= !strncmp(fqn, "optimizer.", 10);
        wrapped &= !strncmp(fqn, "model.", 6);
    }
    layout |= wrapped;
    static const char *const suffix[N_ST] = {"", ".exp_avg", ".exp_avg_sq"};
    int moments = 0, steps = 0;
    for (size_t i = 0; i < n; i++) {
        const char *fqn, *name;
        zck_dtype dt;
        size_t nd;
        const uint64_t *sz;
        int r = zfmt__dcp_tensor(s->dcp, i, &fqn, &dt, &nd, &sz);
        if (layout && !strncmp(fqn, "optimizer.", 10))
            continue; /* the moments: found below by their parameter's name */
        if (layout && strncmp(fqn, "model.", 6))
            return zr_err_set(ZR_EUNSUPPORTED, "%s: item '%s' is neither the model's nor the "
                              "optimizer's", path, fqn);
        name = layout ? fqn + 6 : fqn;
        if (r == 1)
            return zr_err_set(ZR_EUNSUPPORTED, "%s: item '%s' is not a tensor", path, fqn);
        ZR_TRY(r);
        long x;
        int tr;
        ZR_TRY(map_name(s, name, 1, nd, sz, path, &x, &tr));
        if (x < 0)
            continue;
        if (dt != ZCK_F32 && dt != ZCK_BF16 && dt != ZCK_F16)
            return zr_err_set(ZR_EUNSUPPORTED, "%s: '%s' is %s (expected float32, bfloat16 or "
                              "float16)", path, fqn, zfmt__dcp_dtype_name(s->dcp, i));
        s->fx[x][ST_PARAM] = (long)i;
        s->tr[x] = (unsigned char)tr;
        for (int k = ST_EXP_AVG; layout && k < N_ST; k++) {
            char key[1024];
            snprintf(key, sizeof key, "optimizer.state.%s%s", name, suffix[k]);
            long m = zfmt__dcp_find(s->dcp, key);
            const char *mf;
            zck_dtype mdt;
            size_t mnd;
            const uint64_t *msz;
            if (m < 0)
                continue;
            if (zfmt__dcp_tensor(s->dcp, (size_t)m, &mf, &mdt, &mnd, &msz) ||
                (mdt != ZCK_F32 && mdt != ZCK_BF16 && mdt != ZCK_F16) || mnd != nd ||
                memcmp(msz, sz, nd * sizeof *sz))
                return zr_err_set(ZR_ECORRUPT, "%s: '%s' is not a float tensor of its "
                                  "parameter's shape", path, key);
            s->fx[x][k] = m;
            moments++;
        }
        /* the step: the same for every parameter */
        char key[1024];
        snprintf(key, sizeof key, "optimizer.state.%s.step", name);
        long m = layout ? zfmt__dcp_find(s->dcp, key) : -1;
        if (m >= 0) {
            const char *mf;
            zck_dtype mdt;
            size_t mnd;
            const uint64_t *msz;
            double v = -1;
            if (!zfmt__dcp_tensor(s->dcp, (size_t)m, &mf, &mdt, &mnd, &msz) && mnd == 0 &&
                mdt == ZCK_F32) {
                float f;
                ZR_TRY(zfmt__dcp_read(s->dcp, (size_t)m, &f));
                v = f;
            }
            if (!(v >= 0 && v <= 16777216.0) || v != (double)(int64_t)v ||
                (steps && (int64_t)v != s->step))
                return zr_err_set(ZR_ECORRUPT, "%s: '%s' is not the step count of the other "
                                  "parameters", path, key);
            s->step = (int64_t)v;
            steps++;
        }
    }
    for (size_t i = 0; i < s->nt; i++)
        if (s->fx[i][ST_PARAM] < 0)
            return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' missing", path, s->t_info[i].name);
    /* all or none: a partial optimizer state would resume a different run */
    if (moments && (moments != 2 * (int)s->nt || steps != (int)s->nt))
        return zr_err_set(ZR_ECORRUPT, "%s: the optimizer state covers %d of the %zu "
                          "parameters' moments and steps", path, moments / 2, s->nt);
    s->moments = moments > 0;
    return s->moments ? dcp_optim_note(s) : 0;
}

/* A safetensors file of ours: config from metadata, else from the shapes and heads. */
static int open_ours(source *s, const char *path, uint32_t heads, const char *why_not_llmc)
{
    s->file = path;
    int rc = add_st(s, path);
    if (rc == ZR_ECORRUPT && why_not_llmc) {
        /* neither format: say both, so that a damaged llm.c file is not a mystery */
        char msg[1024];
        const char *m = zr_err_msg();
        size_t pl = strlen(path);
        if (!strncmp(m, path, pl) && !strncmp(m + pl, ": ", 2))
            m += pl + 2;
        snprintf(msg, sizeof msg, "%s", m);
        return zr_err_set(rc, "%s: not an llm.c model file (%s), and not a safetensors file: %s",
                          path, why_not_llmc, msg);
    }
    ZR_TRY(rc);
    const zfmt__st_file *f = s->st[0];
    const char *model = zfmt__st_meta(f, "zero.model");
    if (model) {
        if (zck_arch_config_from_json(&s->a, model, NULL) < 0) {
            zr_err_prefix("%s: __metadata__ 'zero.model': ", path);
            return zr_err_code() == ZR_ENOMEM ? ZR_ENOMEM : zfmt__err_recode(ZR_ECORRUPT);
        }
    } else {
        if (!heads)
            return zr_err_set(ZR_EINVAL, "%s: no 'zero.model' metadata to give the number of "
                              "heads: pass it (heads option)", path);
        const zfmt__st_entry *wte = st_find(f, "wte"), *wpe = st_find(f, "wpe");
        if (!wte || !wpe)
            return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' missing", path,
                              wte ? "wpe" : "wte");
        if (wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1] ||
            wte->shape[0] > UINT32_MAX || wpe->shape[0] > UINT32_MAX ||
            wte->shape[1] > UINT32_MAX) {
            char a[128], b[128];
            zfmt__shape_str(a, sizeof a, wte->ndim, wte->shape);
            zfmt__shape_str(b, sizeof b, wpe->ndim, wpe->shape);
            return zr_err_set(ZR_ECORRUPT, "%s: tensors 'wte' %s and 'wpe' %s are not [V, C] "
                              "and [T, C]", path, a, b);
        }
        s->c.vocab = (uint32_t)wte->shape[0];
        s->c.dim = (uint32_t)wte->shape[1];
        s->c.ctx = (uint32_t)wpe->shape[0];
        s->c.heads = heads;
        uint32_t layers = 0;
        for (size_t i = 0; i < f->n; i++) {
            const char *p = f->e[i].name;
            uint32_t l;
            if (!strncmp(p, "h.", 2) && !strchr(p, '/') && (p += 2, parse_uint(&p, &l) == 0) &&
                *p == '.' && l >= layers)
                layers = l == UINT32_MAX ? l : l + 1;
        }
        s->c.layers = layers;
        if (!layers)
            return zr_err_set(ZR_ECORRUPT, "%s: no layers (no tensor named h.0.*)", path);
        zck_gpt2_to_arch(&s->a, &s->c);
    }
    ZR_TRY(source_layout(s));
    ZR_TRY(map_entries(s, 0, NULL, NULL));
    return check_missing(s, path);
}

static int open_llmc(source *s, const char *path, int fd, uint64_t file_bytes)
{
    s->file = path;
    s->fd = fd;
    int32_t h[ZFMT__LLMC_HEADER_INTS];
    if (file_bytes < sizeof h)
        return zr_err_set(ZR_ECORRUPT, "%s: truncated llm.c model file: %llu bytes, the header "
                          "alone is %zu", path, (unsigned long long)file_bytes, sizeof h);
    ZR_TRY(zfmt__pread_full(fd, h, sizeof h, 0, path));
    if (h[1] != 1 && h[1] != 3)
        return zr_err_set(ZR_EVERSION, "%s: llm.c model file version %d is not supported "
                          "(expected 3, or 1 without padded vocabulary; bf16 files are not read)",
                          path, (int)h[1]);
    const char *fields[] = {"max_seq_len", "vocab_size", "num_layers", "num_heads", "channels"};
    for (int i = 2; i <= 6 + (h[1] == 3); i++)
        if (h[i] <= 0)
            return zr_err_set(ZR_ECORRUPT, "%s: llm.c header field %d (%s) is %d", path, i,
                              i < 7 ? fields[i - 2] : "padded_vocab_size", (int)h[i]);
    s->c.ctx = (uint32_t)h[2];
    s->c.vocab = (uint32_t)h[3];
    s->c.layers = (uint32_t)h[4];
    s->c.heads = (uint32_t)h[5];
    s->c.dim = (uint32_t)h[6];
    uint64_t Vp = h[1] == 3 ? (uint64_t)h[7] : s->c.vocab;
    if (Vp < s->c.vocab)
        return zr_err_set(ZR_ECORRUPT, "%s: padded vocabulary %llu below vocabulary %u", path,
                          (unsigned long long)Vp, s->c.vocab);
    if (zfmt__gpt2_check(&s->c) < 0) {
        zr_err_prefix("%s: ", path);
        return zfmt__err_recode(ZR_ECORRUPT);
    }
    zck_gpt2_to_arch(&s->a, &s->c);
    uint64_t sizes[ZFMT__LLMC_ARRAYS], at = sizeof h;
    zfmt__llmc_sizes(&s->c, Vp, sizes);
    for (size_t i = 0; i < ZFMT__LLMC_ARRAYS; i++) {
        s->llmc_off[i] = at;
        at += sizes[i] * 4;
    }
    if (file_bytes != at)
        return zr_err_set(ZR_ECORRUPT, "%s: %s: %llu bytes, the header (L %u, C %u, T %u, Vp "
                          "%llu) implies %llu", path, file_bytes < at ? "truncated" :
                          "trailing bytes", (unsigned long long)file_bytes, s->c.layers, s->c.dim,
                          s->c.ctx, (unsigned long long)Vp, (unsigned long long)at);
    return source_layout(s);
}

/* Detect the kind of src and open it; every tensor is checked here. */
static int source_open(source *s, const char *src, const zfmt_import_opts *o)
{
    struct stat st;
    if (stat(src, &st) < 0)
        return zr_err_sys(errno, "%s", src);
    zfmt_foreign_kind fk = zfmt_foreign_detect(src);
    s->foreign = fk;
    if (fk == ZFMT_FOREIGN_DS_UNIVERSAL) /* read as the ZeRO checkpoints (deepspeed.c) */
        fk = ZFMT_FOREIGN_DEEPSPEED;
    if (o->format && strcmp(o->format, "auto")) {
        int want = !strcmp(o->format, "deepspeed") ? ZFMT_FOREIGN_DEEPSPEED
                   : !strcmp(o->format, "dcp")     ? ZFMT_FOREIGN_DCP
                                                   : -1;
        if (want < 0)
            return zr_err_set(ZR_EINVAL, "import --format %s: expected auto, deepspeed or dcp",
                              o->format);
        if ((int)fk != want)
            return zr_err_set(ZR_ENOTFOUND, "%s: not a %s checkpoint (%s)", src,
                              zfmt_foreign_name((zfmt_foreign_kind)want),
                              fk == ZFMT_FOREIGN_NONE ? "no .metadata, `latest` or rank files"
                                                      : zfmt_foreign_name(fk));
    }
    s->file = src;
    if (fk == ZFMT_FOREIGN_DEEPSPEED) {
        s->kind = SRC_DS;
        return open_ds(s, src, o);
    }
    if (fk == ZFMT_FOREIGN_DCP) {
        s->kind = SRC_DCP;
        return open_dcp(s, src, o);
    }
    if (o->config)
        return zr_err_set(ZR_EINVAL, "import --config: only for DeepSpeed and DCP checkpoints "
                          "(%s is neither)", src);
    if (S_ISDIR(st.st_mode)) {
        s->kind = SRC_HF;
        return open_hf(s, src);
    }
    int fd;
    uint64_t size;
    ZR_TRY(zck_open_regular(&fd, src, ZCK_FOLLOW, &size));
    int32_t magic = 0;
    if (size >= 4 && zfmt__pread_full(fd, &magic, 4, 0, src) < 0) {
        close(fd);
        return zr_err_code();
    }
    if (magic == ZFMT__LLMC_MAGIC) {
        s->kind = SRC_LLMC;
        return open_llmc(s, src, fd, size);
    }
    close(fd);
    char why[96];
    snprintf(why, sizeof why, "first int32 %d, expected magic %d", (int)magic,
             ZFMT__LLMC_MAGIC);
    s->kind = SRC_OURS;
    return open_ours(s, src, o->heads, why);
}

/* n values of dtype dt from raw into f32 at f (raw may be f itself when dt is f32) */
static int to_f32(float *f, const void *raw, zck_dtype dt, size_t n)
{
    return raw == f ? 0 : zfmt_convert(f, ZCK_F32, raw, dt, n);
}

/* Make state st (ST_PARAM, or a moment of a source that has them) of tensor i (flat index) the
 * one in memory, as f32 in our [out, in] orientation. */
static int source_load(source *s, size_t i, size_t st)
{
    if (s->buf && s->cached == i && s->cached_state == st)
        return 0;
    free(s->buf);
    s->buf = NULL;
    const zck_tensor_info *ti = &s->t_info[i];
    size_t n = (size_t)ti->numel;
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (!f)
        return zr_err_set(ZR_ENOMEM, "out of memory (tensor '%s', %zu elements)", ti->name, n);
    int rc = 0;
    if (s->kind == SRC_LLMC) {
        int k = kind_of(s, i);
        uint64_t off;
        if (i < 2)
            off = s->llmc_off[i]; /* wte: the first V rows of [Vp, C]; wpe */
        else if (k >= 0)
            off = s->llmc_off[2 + k] + (uint64_t)((i - 2) / ZFMT__GPT2_KINDS) * n * 4;
        else
            off = s->llmc_off[14 + (i - 2 - (size_t)s->c.layers * ZFMT__GPT2_KINDS)];
        rc = zfmt__pread_full(s->fd, f, n * 4, off, s->file);
    } else if (s->kind == SRC_DS) {
        rc = zfmt__ds_read(s->ds, (size_t)s->fx[i][st], st == ST_PARAM ? NULL : state_names[st],
                           0, f, n);
    } else {
        zck_dtype dt = ZCK_F32;
        if (s->kind == SRC_DCP) {
            const char *fqn;
            size_t nd;
            const uint64_t *sz;
            zfmt__dcp_tensor(s->dcp, (size_t)s->fx[i][st], &fqn, &dt, &nd, &sz);
        } else {
            dt = s->map[i]->dtype;
        }
        void *raw = dt == ZCK_F32 ? (void *)f : malloc(n ? n * zck_dtype_size(dt) : 1);
        if (!raw) {
            free(f);
            return zr_err_set(ZR_ENOMEM, "out of memory (tensor '%s')", ti->name);
        }
        rc = s->kind == SRC_DCP ? zfmt__dcp_read(s->dcp, (size_t)s->fx[i][st], raw)
                                : zfmt__st_read(s->st[s->map_file[i]], s->map[i], raw);
        if (!rc)
            rc = to_f32(f, raw, dt, n);
        if (raw != f)
            free(raw);
    }
    if (!rc && s->tr[i]) {
        /* source [in, out] -> ours [out, in] */
        size_t O = (size_t)ti->shape[0], I = (size_t)ti->shape[1];
        float *t = malloc((n ? n : 1) * sizeof *t);
        if (!t) {
            rc = zr_err_set(ZR_ENOMEM, "out of memory (tensor '%s')", ti->name);
        } else {
            zfmt__transpose(t, f, I, O, sizeof *t);
            free(f);
            f = t;
        }
    }
    if (rc) {
        free(f);
        return rc;
    }
    s->buf = f;
    s->cached = i;
    s->cached_state = st;
    return 0;
}

/* ---------------------------------------------------------------- writing */

/* ZR_EEXIST when run_dir already holds a checkpoint (latest or any step-*). */
static int check_empty_run(const char *run_dir)
{
    DIR *d = opendir(run_dir);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        return zr_err_sys(errno, "%s", run_dir);
    }
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)))
        if (!strcmp(de->d_name, "latest") || !strncmp(de->d_name, "step-", 5)) {
            rc = zr_err_set(ZR_EEXIST, "%s: already holds a checkpoint (%s): import into a new "
                            "run directory", run_dir, de->d_name);
            break;
        }
    closedir(d);
    return rc;
}

/* Remove what a failed import left in its staging directory. */
static void remove_staging(const char *staging, zck_shard **sh, uint32_t world)
{
    const char *extra[] = {"manifest.json", "SHA256SUMS"};
    for (uint32_t r = 0; r < world; r++)
        if (sh[r]) {
            char *p = zck_path_join(staging, zck_shard_file(sh[r]));
            if (p)
                unlink(p);
            free(p);
        }
    for (size_t i = 0; i < 2; i++) {
        char *p = zck_path_join(staging, extra[i]);
        if (p)
            unlink(p);
        free(p);
    }
    rmdir(staging);
}

#define ZERO_NUMEL ((size_t)1 << 16)

/* Ranks written at once: one thread each, each with its own view of the source (its own tensor
 * in memory), so that shards are hashed on every core and their files are in flight together;
 * four rather than two, so that a core whose thread waits for its write ring (or its fsync)
 * hashes another shard meanwhile (gpt2 at --world 4 here: 0.83-0.96 s at two, 0.72-0.89 s at
 * four, peak RSS 53 -> 94 MiB). The safetensors and llm.c sources are read with pread only;
 * DeepSpeed's and DCP's readers keep state, so their ranks are written one after the other. */
#define IMPORT_JOBS 4
#define CHUNK_NUMEL ((size_t)1 << 20)

typedef struct {
    source *s;
    const char *staging;
    uint32_t world;
    const size_t *from;      /* per state of the layout: its source state (N_ST: zeros) */
    const float *zeros;
    zfmt__prog *pr;
    zck_shard **sh;          /* per rank, set when its shard is finished */
    pthread_mutex_t mu;      /* guards pr, next, rc and msg */
    uint32_t next;           /* the next rank to write */
    int rc;                  /* the first failure, its message in msg */
    char msg[1024];
} rank_jobs;

/* Elements [lo, hi) of tensor i of a safetensors source, stored in our orientation: read and
 * converted to f32 CHUNK_NUMEL at a time through chunk (CHUNK_NUMEL f32, then as many raw
 * values), so that no thread holds a whole tensor (an embedding can be hundreds of MiB). */
static int write_st_range(zck_writer *w, const source *s, size_t i, uint64_t lo, uint64_t hi,
                          float *chunk)
{
    const zfmt__st_file *f = s->st[s->map_file[i]];
    const zfmt__st_entry *e = s->map[i];
    size_t dsz = zck_dtype_size(e->dtype);
    void *raw = e->dtype == ZCK_F32 ? (void *)chunk : (void *)(chunk + CHUNK_NUMEL);
    for (uint64_t at = lo; at < hi;) {
        size_t k = hi - at < CHUNK_NUMEL ? (size_t)(hi - at) : CHUNK_NUMEL;
        ZR_TRY(zfmt__pread_full(f->fd, raw, k * dsz, f->data_off + e->begin + at * dsz,
                                f->path));
        ZR_TRY(to_f32(chunk, raw, e->dtype, k));
        ZR_TRY(zck_writer_write(w, chunk, k * 4));
        at += k;
    }
    return 0;
}

/* Rank r's shard: its partition of every (group, state), reading through the view s (and
 * chunk, when not NULL, for safetensors tensors in our orientation). */
static int write_rank(rank_jobs *j, source *s, uint32_t r, float *chunk)
{
    const zck_layout *L = s->L;
    uint32_t world = j->world;
    zck_writer *w = NULL;
    int rc = 0;
    ZR_TRY_GOTO(zck_writer_open(&w, j->staging, L, world, r, NULL), rc, out);
    size_t first = 0; /* flat index of the group's first tensor */
    for (size_t g = 0; g < zck_layout_n_groups(L); first += zck_layout_group_n_tensors(L, g),
                g++) {
        uint64_t a, n;
        zck_partition(zck_layout_group_numel(L, g), world, r, zck_layout_partition_align(L), &a,
                      &n);
        if (!n)
            continue;
        for (size_t st = 0; st < zck_layout_n_states(L); st++) {
            ZR_TRY_GOTO(zck_writer_begin(w, g, st, a, n), rc, out);
            if (j->from[st] == N_ST) { /* a state the source does not hold: zeros */
                for (uint64_t done = 0; done < n;) {
                    size_t k = n - done < ZERO_NUMEL ? (size_t)(n - done) : ZERO_NUMEL;
                    ZR_TRY_GOTO(zck_writer_write(w, j->zeros, k * 4), rc, out);
                    done += k;
                }
                continue;
            }
            for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++) {
                const zck_tensor_info *ti = &s->t_info[first + t];
                uint64_t lo = a > ti->offset ? a : ti->offset;
                uint64_t hi = a + n < ti->offset + ti->numel ? a + n : ti->offset + ti->numel;
                if (lo >= hi)
                    continue;
                if (chunk && (s->kind == SRC_OURS || s->kind == SRC_HF) && !s->tr[first + t]) {
                    ZR_TRY_GOTO(write_st_range(w, s, first + t, lo - ti->offset,
                                               hi - ti->offset, chunk), rc, out);
                } else {
                    ZR_TRY_GOTO(source_load(s, first + t, j->from[st]), rc, out);
                    ZR_TRY_GOTO(zck_writer_write(w, s->buf + (lo - ti->offset), (hi - lo) * 4),
                                rc, out);
                }
                pthread_mutex_lock(&j->mu);
                zfmt__prog_add(j->pr, (hi - lo) * 4);
                pthread_mutex_unlock(&j->mu);
            }
        }
    }
    ZR_TRY_GOTO(zck_writer_finish(w, &j->sh[r]), rc, out);
out:
    zck_writer_free(w);
    if (rc)
        zr_err_prefix("rank %u: ", r);
    return rc;
}

/* Take ranks until none is left or one failed. */
static void *rank_worker(void *arg)
{
    rank_jobs *j = arg;
    source v = *j->s; /* the shared source, with a tensor cache of its own */
    v.buf = NULL;
    /* f32 values, then raw ones of up to 8 bytes (f64); without it, whole tensors as before */
    float *chunk = v.kind == SRC_OURS || v.kind == SRC_HF ? malloc(CHUNK_NUMEL * 12) : NULL;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        uint32_t r = j->next++;
        int stop = j->rc || r >= j->world;
        pthread_mutex_unlock(&j->mu);
        if (stop)
            break;
        int rc = write_rank(j, &v, r, chunk);
        if (rc) {
            pthread_mutex_lock(&j->mu);
            if (!j->rc) {
                j->rc = rc;
                snprintf(j->msg, sizeof j->msg, "%s", zr_err_msg());
            }
            pthread_mutex_unlock(&j->mu);
        }
    }
    free(v.buf);
    free(chunk);
    return NULL;
}

/* Every rank's shard into staging, IMPORT_JOBS at once where the source allows it. */
static int write_ranks(rank_jobs *j)
{
    unsigned jobs = j->s->kind == SRC_DS || j->s->kind == SRC_DCP ? 1 : IMPORT_JOBS;
    if (jobs > j->world)
        jobs = j->world;
    pthread_t th[IMPORT_JOBS];
    unsigned started = 0;
    pthread_mutex_init(&j->mu, NULL);
    for (; started + 1 < jobs; started++)
        if (pthread_create(&th[started], NULL, rank_worker, j))
            break; /* fewer threads: the calling thread writes the rest */
    rank_worker(j);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j->mu);
    return j->rc ? zr_err_set(j->rc, "%s", j->msg) : 0;
}

int zfmt_import(const char *src, const char *out_run_dir, const zfmt_import_opts *o)
{
    zfmt_import_opts def = ZFMT_IMPORT_OPTS_INIT;
    if (!o)
        o = &def;
    if (o->world < 1 || o->world > ZCK_MAX_WORLD)
        return zr_err_set(ZR_EINVAL, "import: world %u: expected 1..%u", o->world,
                          ZCK_MAX_WORLD);
    ZR_TRY(check_empty_run(out_run_dir));

    source s = {0};
    s.fd = -1;
    char *staging = NULL, *model = NULL, *training = NULL;
    zck_shard **sh = NULL;
    size_t *from = NULL;
    float *zeros = NULL;
    int rc = 0;
    ZR_TRY_GOTO(source_open(&s, src, o), rc, out);
    ZR_TRY_GOTO(zck_arch_config_to_json(&model, &s.a), rc, out);
    /* the steps AdamW took (its bias correction continues from them): a DeepSpeed or DCP
     * checkpoint's, else 0 */
    json_t *tj = json_pack("{s:I, s:s}", "optimizer_step", (json_int_t)s.step, "imported_from",
                           src);
    if (!tj) {
        rc = zr_err_set(ZR_EINVAL, "%s: the source path is not valid UTF-8", src);
        goto out;
    }
    if (s.kind == SRC_DS || s.kind == SRC_DCP)
        json_object_set_new(tj, "imported_format",
                            json_string(zfmt_foreign_name(s.foreign)));
    training = zfmt__json_dump(tj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(tj);
    if (!training || !(sh = calloc(o->world, sizeof *sh)) ||
        !(zeros = calloc(ZERO_NUMEL, sizeof *zeros))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    /* per state of the layout: where it comes from in the source (N_ST: zeros) */
    size_t n_from = 0;
    if (!(from = calloc(zck_layout_n_states(s.L), sizeof *from))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t st = 0; st < zck_layout_n_states(s.L); st++) {
        from[st] = N_ST;
        for (size_t k = 0; k < (s.moments ? N_ST : 1); k++)
            if (!strcmp(zck_layout_state_name(s.L, st), state_names[k])) {
                from[st] = k;
                n_from++;
            }
    }
    if (s.moments && n_from != N_ST) {
        rc = zr_err_set(ZR_EINVAL, "%s: the model's layout has no state for AdamW's moments",
                        src);
        goto out;
    }
    if (o->note && o->note_cap) {
        if (s.kind == SRC_DS || s.kind == SRC_DCP)
            snprintf(o->note, o->note_cap, "(%s) at step %lld, %s%s%s",
                     zfmt_foreign_name(s.foreign), (long long)s.step,
                     s.moments ? "with AdamW's moments" : "no optimizer state (moments start at "
                                                          "zero)",
                     *s.optim_note ? "; " : "", s.optim_note);
        else
            snprintf(o->note, o->note_cap, "at step 0");
    }

    uint64_t total = 0;
    for (size_t g = 0; g < zck_layout_n_groups(s.L); g++)
        total += zck_layout_group_numel(s.L, g) * 4 * n_from;
    zfmt__prog pr;
    zfmt__prog_init(&pr, &o->progress, "import", total);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_sec ^
                     ((uint64_t)ts.tv_nsec << 20);
    ZR_TRY_GOTO(zck_staging_create(&staging, out_run_dir, (uint64_t)s.step, nonce), rc, out);
    rank_jobs jobs = {.s = &s, .staging = staging, .world = o->world, .from = from,
                      .zeros = zeros, .pr = &pr, .sh = sh};
    ZR_TRY_GOTO(write_ranks(&jobs), rc, out);
    zck_commit_opts co = ZCK_COMMIT_OPTS_INIT;
    co.step = (uint64_t)s.step;
    co.world = o->world;
    co.zero_stage = 0;
    co.model_json = model;
    co.training_json = training;
    ZR_TRY_GOTO(zck_commit(NULL, out_run_dir, staging, s.L, sh, o->world, &co), rc, out);
out:
    if (rc && staging && sh)
        remove_staging(staging, sh, o->world);
    for (uint32_t r = 0; sh && r < o->world; r++)
        zck_shard_free(sh[r]);
    free(sh);
    free(from);
    free(zeros);
    free(staging);
    free(model);
    free(training);
    source_free(&s);
    return rc;
}
