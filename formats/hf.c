/*
 * hf.c: export a GPT-2 or Llama checkpoint as a Hugging Face model directory (zfmt_hf_export):
 * config.json as transformers writes it for GPT2LMHeadModel or LlamaForCausalLM, the weights in
 * Hugging Face's names (the safetensors writer of safetensors.c with the name table of
 * hfnames.c) in model.safetensors or in shards with model.safetensors.index.json, and
 * optionally tokenizer.json. The directory is built beside the target under a temporary name
 * and renamed into place once complete; a target is replaced only when it holds nothing but
 * the files an export writes.
 */
#include "fmtutil.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What an export writes: the only entries a target may hold to be replaced; and the shards
 * model-<5 digits>-of-<5 digits>.safetensors (zfmt__st_is_shard_name). */
static const char *const hf_files[] = {"config.json", "model.safetensors", "tokenizer.json",
                                       "model.safetensors.index.json"};
#define N_HF_FILES (sizeof hf_files / sizeof *hf_files)

static int is_hf_file(const char *name)
{
    for (size_t i = 0; i < N_HF_FILES; i++)
        if (!strcmp(name, hf_files[i]))
            return 1;
    return zfmt__st_is_shard_name(name);
}

static int write_text(const char *path, const char *text, size_t n)
{
    zfmt__out *f = NULL;
    int rc = zfmt__out_open(&f, path);
    if (!rc)
        rc = zfmt__out_write(f, text, n);
    if (!rc)
        rc = zfmt__out_commit(f);
    zfmt__out_free(f);
    return rc;
}

static const char *torch_dtype(int dtype)
{
    return dtype == ZCK_BF16 ? "bfloat16" : dtype == ZCK_F16 ? "float16" : "float32";
}

/* config.json as text (malloc'ed), with a final newline, into path. */
static int write_json(const char *path, json_t *j)
{
    if (!j)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    char *text =
        zfmt__json_dump(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER); /* shortest reals */
    json_decref(j);
    if (!text)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps leaves room for its NUL: a final newline in its place */
    int rc = write_text(path, text, n + 1);
    free(text);
    return rc;
}

/* bos_token_id and eos_token_id: the tokenizer's end-of-text token (eos >= 0), else for a
 * GPT-2 without a tokenizer of GPT-2's vocabulary 50256 (GPT-2's <|endoftext|>), else null. */
static json_t *eos_json(int64_t eos, int gpt2, uint32_t vocab)
{
    if (eos >= 0)
        return json_integer(eos);
    return gpt2 && vocab > 50256 ? json_integer(50256) : json_null();
}

/* config.json of GPT2LMHeadModel: our maths is GPT-2's (tanh GELU, LayerNorm eps 1e-5, tied
 * head); dropouts are 0 (the checkpoint does not train with dropout). eos: eos_json's. */
static json_t *gpt2_config(const zck_arch_config *a, int dtype, uint64_t step, int64_t eos_id)
{
    zfmt_gpt2_config c;
    zck_gpt2_from_arch(&c, a);
    json_t *eos = eos_json(eos_id, 1, c.vocab);
    return json_pack(
        "{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:n, s:s, s:f, s:f, s:f, s:f, s:f, s:b, "
        "s:b, s:o, s:O, s:b, s:s, s:I}",
        "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size",
        (json_int_t)c.vocab, "n_positions", (json_int_t)c.ctx, "n_ctx", (json_int_t)c.ctx,
        "n_embd", (json_int_t)c.dim, "n_layer", (json_int_t)c.layers, "n_head",
        (json_int_t)c.heads, "n_inner", "activation_function", "gelu_new",
        "layer_norm_epsilon", 1e-5, "initializer_range", 0.02, "resid_pdrop", 0.0, "embd_pdrop",
        0.0, "attn_pdrop", 0.0, "scale_attn_weights", 1, "use_cache", 1, "bos_token_id", eos,
        "eos_token_id", eos, "tie_word_embeddings", 1, "torch_dtype", torch_dtype(dtype),
        "zero_step", (json_int_t)step);
}

/* config.json of LlamaForCausalLM: rotate-half rotary positions of theta rope_theta with no
 * scaling, SwiGLU (silu), RMSNorm, no biases, grouped-query attention. eos: eos_json's. */
static json_t *llama_config(const zck_arch_config *a, int dtype, uint64_t step, int64_t eos_id)
{
#define F(name) ((json_int_t)zck_arch_config_get(a, name))
    json_t *eos = eos_json(eos_id, 0, 0);
    return json_pack(
        "{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:n, s:b, s:b, s:s, "
        "s:f, s:f, s:b, s:b, s:o, s:O, s:s, s:I}",
        "architectures", "LlamaForCausalLM", "model_type", "llama", "vocab_size", F("vocab"),
        "hidden_size", F("dim"), "intermediate_size", F("ffn"), "num_hidden_layers",
        F("layers"), "num_attention_heads", F("heads"), "num_key_value_heads", F("kv_heads"),
        "head_dim", F("dim") / F("heads"), "max_position_embeddings", F("ctx"), "rms_norm_eps",
        zck_arch_config_get(a, "norm_eps"), "rope_theta", zck_arch_config_get(a, "rope_theta"),
        "rope_scaling", "attention_bias", 0, "mlp_bias", 0, "hidden_act", "silu",
        "attention_dropout", 0.0, "initializer_range", 0.02, "tie_word_embeddings",
        zck_arch_config_get(a, "tied") != 0, "use_cache", 1, "bos_token_id", eos, "eos_token_id",
        eos, "torch_dtype", torch_dtype(dtype), "zero_step", (json_int_t)step);
#undef F
}

/* The tokenizer.json given for the export (path), read and checked as zfmt_tok_load checks it
 * (a FIFO refused), its vocabulary within the model's: *out its bytes. What is wrong with it is
 * the caller's argument, ZR_EINVAL (ZR_EUNSUPPORTED for a tokenizer the loader does not know),
 * not a damaged checkpoint. */
static int given_tokenizer(char **out, size_t *n_bytes, const char *path, uint32_t model_vocab)
{
    uint32_t vocab;
    int rc = zfmt_tok_read(out, n_bytes, &vocab, path);
    if (rc == ZR_ECORRUPT) { /* the message is formatted into the record it reads: copy it */
        char why[1024];
        snprintf(why, sizeof why, "%s", zr_err_msg());
        return zr_err_set(ZR_EINVAL, "Hugging Face export: %s", why);
    }
    if (rc < 0)
        return rc;
    if (vocab > model_vocab) {
        free(*out);
        *out = NULL;
        return zr_err_set(ZR_EINVAL, "Hugging Face export: the tokenizer %s has a vocabulary of "
                          "%u tokens, the model only %u", path, vocab, model_vocab);
    }
    return 0;
}

/* The checkpoint's own tokenizer.json (zrun --tokenizer), verified, into *out; none is fine
 * (*out NULL). */
static int ckpt_tokenizer(char **out, size_t *n, const char *ckpt)
{
    int rc = zck_ckpt_file_read(out, n, ckpt, "tokenizer.json");
    if (rc == ZR_ENOTFOUND) {
        zr_err_clear();
        *out = NULL;
        return 0;
    }
    return rc;
}

/* The id of the end-of-text token <|endoftext|> of the tokenizer.json tok[n] (named name), or
 * -1 (no tokenizer, or none in it). */
static int end_of_text(int64_t *eos, const char *tok, size_t n, const char *name)
{
    *eos = -1;
    if (!tok)
        return 0;
    zfmt_tok *t;
    ZR_TRY(zfmt_tok_load_mem(&t, tok, n, name));
    *eos = zfmt_tok_id(t, "<|endoftext|>");
    zfmt_tok_free(t);
    return 0;
}

/* The model config and step of a checkpoint (its manifest only). */
static int read_config(zck_arch_config *a, uint64_t *step, int *param_dtype, const char *ckpt)
{
    zck_reader *r = NULL;
    ZR_TRY(zck_reader_open(&r, ckpt));
    const zck_layout *L = zck_reader_layout(r);
    *param_dtype = ZCK_F32;
    for (size_t s = 0; s < zck_layout_n_states(L); s++)
        if (!strcmp(zck_layout_state_name(L, s), "param"))
            *param_dtype = (int)zck_layout_state_dtype(L, s);
    int rc = zck_arch_config_from_json(a, zck_reader_model_json(r), NULL);
    if (rc) { /* the message is formatted into the error record it reads: copy it first */
        char why[512];
        snprintf(why, sizeof why, "%s", zr_err_msg());
        rc = zr_err_set(ZR_EUNSUPPORTED, "%s: Hugging Face export: %s", zck_reader_path(r),
                        why);
    } else if (!zfmt__hf_family_of(zck_arch_name(a->arch))) {
        rc = zr_err_set(ZR_EUNSUPPORTED, "%s: Hugging Face export does not know model family "
                        "'%s'", zck_reader_path(r), zck_arch_name(a->arch));
    }
    *step = zck_reader_step(r);
    zck_reader_free(r);
    return rc;
}

int zfmt_hf_export(const char *ckpt, const char *out_dir, const zfmt_hf_opts *o)
{
    zfmt_hf_opts def = ZFMT_HF_OPTS_INIT;
    if (!o)
        o = &def;
    if (o->dtype != -1 && o->dtype != ZCK_F32 && o->dtype != ZCK_BF16 && o->dtype != ZCK_F16)
        return zr_err_set(ZR_EINVAL, "Hugging Face export: dtype %d: expected -1 (as stored), "
                          "f32, bf16 or f16", o->dtype);
    char dir[4096], tmp[4096], path[4200];
    ZR_TRY(zfmt__dir_tmp(dir, tmp, out_dir));

    int exists, stored;
    zck_arch_config c;
    uint64_t step;
    char *tok = NULL; /* the tokenizer.json given (else the checkpoint's), checked before */
    size_t tok_bytes = 0; /* anything is written */
    int64_t eos;
    ZR_TRY(zfmt__dir_check(dir, o->force, is_hf_file, "a Hugging Face export", &exists));
    ZR_TRY(read_config(&c, &step, &stored, ckpt));
    if (o->tokenizer_json)
        ZR_TRY(given_tokenizer(&tok, &tok_bytes, o->tokenizer_json,
                               (uint32_t)zck_arch_config_get(&c, "vocab")));
    else
        ZR_TRY(ckpt_tokenizer(&tok, &tok_bytes, ckpt));
    snprintf(path, sizeof path, "%s/tokenizer.json", ckpt); /* its name, for a message */
    if (end_of_text(&eos, tok, tok_bytes, o->tokenizer_json ? o->tokenizer_json : path) < 0) {
        free(tok);
        return zr_err_code();
    }
    int dtype = o->dtype < 0 ? stored : o->dtype; /* config.json says what the tensors are */
    if (mkdir(tmp, 0755) < 0) {
        free(tok);
        return zr_err_sys(errno, "%s: create", tmp);
    }

    zfmt_st_opts so = ZFMT_ST_OPTS_INIT;
    so.dtype = o->dtype;
    so.progress = o->progress;
    /* verifies the source before the renames */
    int rc = zfmt__st_export_hf(ckpt, tmp, &so, o->shard_bytes);
    if (!rc) {
        snprintf(path, sizeof path, "%s/config.json", tmp);
        rc = write_json(path, !strcmp(zck_arch_name(c.arch), "llama")
                                  ? llama_config(&c, dtype, step, eos)
                                  : gpt2_config(&c, dtype, step, eos));
    }
    if (!rc && tok) {
        snprintf(path, sizeof path, "%s/tokenizer.json", tmp);
        rc = write_text(path, tok, tok_bytes);
    }
    free(tok);
    if (!rc)
        rc = zfmt__fsync_dir_of(path);
    if (!rc)
        rc = zfmt__dir_put(tmp, dir, exists, is_hf_file);
    if (rc)
        zfmt__dir_remove(tmp, is_hf_file);
    return rc;
}
