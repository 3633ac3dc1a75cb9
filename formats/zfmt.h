/*
 * zfmt.h: the public interface of formats/, the converters between zero checkpoints and the
 * formats the rest of the ecosystem reads: safetensors (Hugging Face, PyTorch), Hugging Face
 * model directories (GPT-2 and Llama: config.json, safetensors shards and their index), llm.c's
 * GPT-2 model file and tar archives (libarchive); and the byte-level BPE tokenizer (train,
 * encode, decode; Hugging Face tokenizer.json). formats/ uses only ckpt/'s public API (zck.h).
 *
 * Conventions are ckpt's: 0 or a negative ZR_E* code with a one-line message (zr_err_msg()),
 * outputs through the first argument, the library never prints and never exits.
 */
#ifndef ZFMT_H
#define ZFMT_H

#include "zck.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- GPT-2 naming
 *
 * The contract between checkpoints and models (docs/FORMAT.md, "GPT-2 tensor names"), held by
 * ckpt's family table (zck.h, "model families"); these calls bind zfmt_gpt2_config to it: groups
 * "wte", "wpe", "h.0" ... "h.<L-1>", "ln_f", in that order. Tensors (f32, row-major, weights
 * [out, in] as in PyTorch nn.Linear and llm.c):
 *   wte [V, C]; wpe [T, C];
 *   h.<l>.ln_1.weight [C], h.<l>.ln_1.bias [C],
 *   h.<l>.attn.c_attn.weight [3C, C], h.<l>.attn.c_attn.bias [3C],
 *   h.<l>.attn.c_proj.weight [C, C], h.<l>.attn.c_proj.bias [C],
 *   h.<l>.ln_2.weight [C], h.<l>.ln_2.bias [C],
 *   h.<l>.mlp.c_fc.weight [4C, C], h.<l>.mlp.c_fc.bias [4C],
 *   h.<l>.mlp.c_proj.weight [C, 4C], h.<l>.mlp.c_proj.bias [C];
 *   ln_f.weight [C], ln_f.bias [C].
 * States: param, exp_avg, exp_avg_sq, all f32. The model section of the manifest is
 * {"arch":"gpt2","layers":L,"heads":NH,"dim":C,"ctx":T,"vocab":V}.
 */
typedef zck_gpt2_config zfmt_gpt2_config; /* layers, heads, dim, ctx, vocab (zck.h) */

/* Build the layout of a GPT-2 of this shape (caller frees). ZR_EINVAL on a zero field or when
 * dim is not a multiple of heads. */
int zfmt_gpt2_layout(zck_layout **out, const zfmt_gpt2_config *c);
/* The manifest's model section <-> config. from_json: ZR_EINVAL naming the missing field. */
int zfmt_gpt2_config_from_json(zfmt_gpt2_config *out, const char *model_json);
int zfmt_gpt2_config_to_json(char **out, const zfmt_gpt2_config *c);

/* ---------------------------------------------------------------- element conversion */

/* Convert n elements between f32, bf16 (round to nearest even) and f16 (IEEE half, round to
 * nearest even); same dtype is a copy. ZR_EUNSUPPORTED for other pairs. */
int zfmt_convert(void *dst, zck_dtype dst_t, const void *src, zck_dtype src_t, size_t n);

/* ---------------------------------------------------------------- safetensors */

typedef struct {
    int dtype;           /* -1: each state's stored dtype; else a zck_dtype (f32, bf16, f16) */
    int params_only;     /* only the "param" state */
    size_t buf_bytes;    /* bounded working memory, default 64 MiB */
    zck_progress progress;
} zfmt_st_opts;
#define ZFMT_ST_OPTS_INIT {.dtype = -1, .params_only = 0, .buf_bytes = (size_t)64 << 20}

/*
 * Write every tensor of a checkpoint into one safetensors file, streaming (memory bounded by
 * buf_bytes, whatever the checkpoint size). Names: the tensor's own name for state "param",
 * "<state>/<name>" for every other state. __metadata__ holds {"format":"zero",
 * "zero.model": <model json text>, "zero.step": "<step>"}. The file is written to a temporary
 * name beside out_file, fsynced and renamed, so out_file is never half-written. The source is
 * read once: the export writes what the full verification (every shard hashed) reads, and
 * out_file appears only when that verification found nothing.
 */
int zfmt_safetensors_export(const char *ckpt, const char *out_file, const zfmt_st_opts *o);

/* ---------------------------------------------------------------- llm.c */

/* Write the params of a GPT-2 checkpoint as llm.c's model file (gpt2_124M.bin layout: 256
 * int32 header, magic 20240326, version 3, padded vocabulary Vp = vocab rounded up to 128, then
 * float32 parameters in llm.c's order). Atomic like the safetensors export. */
int zfmt_llmc_export(const char *ckpt, const char *out_file, const zck_progress *progress);

/* ---------------------------------------------------------------- Hugging Face */

typedef struct {
    int dtype;           /* -1: as stored (f32); else ZCK_F32, ZCK_BF16 or ZCK_F16 */
    int force;           /* replace out_dir when it holds a Hugging Face export (only the files
                            an export writes); anything else there is never replaced */
    const char *tokenizer_json; /* a tokenizer.json to put in the export, loaded as
                                   zfmt_tok_load does and its vocabulary at most the model's
                                   (ZR_EINVAL otherwise); NULL: the checkpoint's own (zrun
                                   --tokenizer), verified, when it has one */
    uint64_t shard_bytes; /* model.safetensors larger than this: shards and an index file (0: one
                             file whatever its size) */
    zck_progress progress;
} zfmt_hf_opts;
#define ZFMT_HF_SHARD_DEFAULT ((uint64_t)5000000000) /* transformers' "5GB" */
#define ZFMT_HF_OPTS_INIT                                                                        \
    {.dtype = -1, .force = 0, .tokenizer_json = NULL, .shard_bytes = ZFMT_HF_SHARD_DEFAULT}

/*
 * Export the parameters of a checkpoint as a Hugging Face model directory that transformers
 * loads: GPT-2 with GPT2LMHeadModel.from_pretrained (config.json: model_type gpt2, the shape,
 * gelu_new, layer_norm_epsilon 1e-5, tied embeddings; weights in Hugging Face's names, Conv1D
 * weights [in, out], no lm_head: it is tied to wte), Llama with LlamaForCausalLM (config.json:
 * model_type llama, the shape, rms_norm_eps, rope_theta, no scaling, no biases, silu,
 * tie_word_embeddings; weights "model.<ours>", lm_head.weight unless tied). The weights go into
 * model.safetensors, or past shard_bytes into model-0000k-of-0000n.safetensors with
 * model.safetensors.index.json; plus tokenizer.json (the one given, else the checkpoint's own
 * when it has one). Streaming, memory bounded by the largest Conv1D weight (read whole to
 * transpose). Written into "<out_dir>.tmp-<pid>" beside out_dir and renamed into place only
 * after the source verified (every shard hashed), so out_dir is either the old or the new
 * export. ZR_EEXIST when out_dir exists and is not empty (without force), or holds anything an
 * export does not write; ZR_EUNSUPPORTED for a model family Hugging Face export does not know.
 */
int zfmt_hf_export(const char *ckpt, const char *out_dir, const zfmt_hf_opts *o);

/* ---------------------------------------------------------------- PyTorch DCP export */

typedef struct {
    int optim;           /* also AdamW's state (the checkpoint's exp_avg, exp_avg_sq, step) */
    int force;           /* replace out_dir when it holds only a DCP export's two files */
    zck_progress progress;
} zfmt_dcp_opts;
#define ZFMT_DCP_OPTS_INIT {.optim = 0, .force = 0}

/*
 * Export a GPT-2 or Llama checkpoint as the PyTorch Distributed Checkpoint directory that
 * torch.distributed.checkpoint.save of one process writes for {"model":
 * get_model_state_dict(m)} (with optim: and "optimizer": get_optimizer_state_dict(m, AdamW), the
 * key of torch's documentation and of zfmt_import) of
 * the Hugging Face model m (GPT2LMHeadModel, LlamaForCausalLM): .metadata and __0_0.distcp,
 * one torch.save zip per item (docs/FORMAT.md section 17). Keys "model.<Hugging Face name>"
 * (lm_head.weight also when tied, as the state_dict has it; GPT-2's Conv1D weights [in, out]);
 * with optim "optimizer.state.<name>.step|exp_avg|exp_avg_sq" and
 * "optimizer.param_groups.0.<setting>"
 * (lr and weight_decay from the training section, zrun's betas (0.9, 0.95) and eps 1e-8; one
 * group, so zrun's decay on matrices only is not carried). Tensors as stored; the source is
 * verified (every shard hashed) alongside, the directory built as "<out_dir>.tmp-<pid>" and
 * renamed into place only after. ZR_EEXIST as zfmt_hf_export; ZR_ENOTFOUND for optim without
 * moments; ZR_EUNSUPPORTED for another family or a tensor of 4 GiB or more (no ZIP64).
 */
int zfmt_dcp_export(const char *ckpt, const char *out_dir, const zfmt_dcp_opts *o);

/* ---------------------------------------------------------------- import */

typedef struct {
    uint32_t world;      /* shards of the new checkpoint, >= 1 */
    uint32_t heads;      /* when the source does not say (a bare safetensors file of ours
                            says in its metadata; llm.c and HF config.json say) */
    const char *format;  /* NULL or "auto": by what src holds; "deepspeed" or "dcp": src must
                            be one */
    const char *config;  /* DeepSpeed and DCP: the model's Hugging Face config.json (NULL: the
                            one beside the checkpoint) */
    char *note;          /* when not NULL: note_cap bytes that receive what was imported, for
                            the user ("at step 0"; DeepSpeed and DCP: the format, the step,
                            whether the moments came, the source optimizer's settings) */
    size_t note_cap;
    zck_progress progress;
} zfmt_import_opts;
#define ZFMT_IMPORT_OPTS_INIT {.world = 1, .heads = 0}

/*
 * Import a model as a new checkpoint in run directory out_run_dir (created;
 * ZR_EEXIST if it holds a checkpoint already), committed atomically with `latest`. src is one
 * of: a safetensors file in our names (as zfmt_safetensors_export writes; any family by its
 * zero.model metadata), a Hugging Face directory of GPT2LMHeadModel (or GPT2Model) or
 * LlamaForCausalLM
 * (config.json + model.safetensors, or shards named by model.safetensors.index.json; GPT-2's
 * Conv1D weights transposed to [out, in], the "transformer." / "model." prefixes, buffers and a
 * tied head ignored; config.json fields that change the maths refused naming the field,
 * ZR_EUNSUPPORTED: docs/CLI.md `import`), or an llm.c model file (padded vocabulary rows dropped):
 * a checkpoint at step 0 whose optimizer states start at zero; the training section is
 * {"optimizer_step":0,"imported_from":"<src>"}. Or src is a DeepSpeed ZeRO or PyTorch DCP
 * checkpoint (zfmt_foreign_detect) of a Hugging Face GPT-2 or Llama, verified in full first (every
 * CRC-32): the model from o->config (else the config.json beside it), the fp32 master weights,
 * AdamW's exp_avg and exp_avg_sq (DCP: when get_state_dict saved the optimizer) and its step,
 * which becomes the checkpoint's step and optimizer_step ("imported_format" says which). Every
 * tensor missing, duplicated or of the wrong shape is an error naming it.
 */
int zfmt_import(const char *src, const char *out_run_dir, const zfmt_import_opts *o);

/* ---------------------------------------------------------------- archives (libarchive) */

/* Pack a checkpoint directory into a tar archive: out_file ending in .tar, .tar.gz (or .tgz)
 * or .tar.zst chooses the compression. Members are "<step dir name>/<file>", regular files only, streamed
 * (bounded memory); written to a temporary name and renamed into place. */
int zfmt_pack(const char *ckpt, const char *out_file, const zck_progress *progress);

/*
 * Unpack an archive made by zfmt_pack into run directory out_dir (created if missing), as
 * out_dir/<step dir>: refuses absolute paths, '..', links, device files and anything but a
 * flat step directory of regular files; extracts into a temporary directory inside out_dir,
 * verifies every hash (zck_verify), and only then renames into place and updates out_dir/latest
 * when the step is newer than what latest names. Nothing is written outside out_dir.
 */
int zfmt_unpack(const char *archive, const char *out_dir, const zck_progress *progress);

/* Verify an archive while streaming it, without extracting: the manifest (which must come
 * before the shards it describes, as zfmt_pack writes it), SHA256SUMS, and the SHA-256 and size
 * of every member. Problems are reported as by zck_verify. */
int zfmt_archive_verify(zck_report **out, const char *archive, const zck_progress *progress);


/* ---------------------------------------------------------------- byte-level BPE tokenizer
 *
 * Hugging Face tokenizers' byte-level BPE (GPT-2's and any tokenizer.json the `tokenizers`
 * library writes in that form): model BPE (vocab; merges as "a b" strings or [a, b] lists),
 * pre-tokenizer ByteLevel (the GPT-2 split pattern when use_regex) or a Sequence of a Split by a
 * regex (behavior Isolated) and ByteLevel without regex, decoder ByteLevel, added tokens
 * (<|endoftext|>) matched in the raw text first. Anything else is refused when loading, naming
 * the field (docs/CLI.md, "ztok"). Encoding gives exactly the ids the library gives. A handle
 * keeps a cache of words: one thread per handle.
 */
typedef struct zfmt_tok zfmt_tok;

/* Load tokenizer.json from a file (ZR_ECORRUPT / ZR_EUNSUPPORTED naming the file and field). */
int zfmt_tok_load(zfmt_tok **out, const char *path);
/* The same from memory; name is used in messages. */
int zfmt_tok_load_mem(zfmt_tok **out, const char *json, size_t n_bytes, const char *name);
void zfmt_tok_free(zfmt_tok *t);
/* Read and check a tokenizer.json: its bytes (*out malloc'ed) and vocabulary (largest id + 1),
 * refused as zfmt_tok_load refuses. */
int zfmt_tok_read(char **out, size_t *n_bytes, uint32_t *vocab, const char *path);
/* Ids are below this: the largest id (vocab or added token) + 1. */
uint32_t zfmt_tok_vocab(const zfmt_tok *t);
/* The id of a token by its text (an added token's content, or the raw bytes of a vocab entry),
 * or -1. */
int64_t zfmt_tok_id(const zfmt_tok *t, const char *text);

/* A growing array of ids. */
typedef struct {
    uint32_t *id;
    size_t n, cap;
} zfmt_tok_ids;
void zfmt_tok_ids_free(zfmt_tok_ids *v);

/* Append the ids of text[0, n_bytes) to out. ZR_EINVAL when the text is not UTF-8 (naming the
 * byte offset). progress (may be NULL) receives bytes of text done. */
int zfmt_tok_encode(zfmt_tok_ids *out, zfmt_tok *t, const char *text, size_t n_bytes,
                    const zck_progress *progress);
/* The bytes of ids (malloc'ed into *out, NUL-terminated beyond *n_bytes); ZR_EINVAL naming the
 * first id the tokenizer does not have. */
int zfmt_tok_decode(char **out, size_t *n_bytes, const zfmt_tok *t, const uint32_t *ids,
                    size_t n);

typedef struct {
    uint32_t vocab;        /* the vocabulary size to reach: 256 bytes + merges + special */
    const char *special;   /* an added special token given the last id ("" or NULL: none) */
    zck_progress progress;
} zfmt_tok_train_opts;
#define ZFMT_TOK_TRAIN_OPTS_INIT {.vocab = 0, .special = "<|endoftext|>"}

/*
 * Train a byte-level BPE on the UTF-8 text of files and write tokenizer.json to out_json
 * (atomically): ids 0..255 are the bytes (in byte order), then one token per merge in the
 * order learned, then the special token. Each merge joins the most frequent adjacent pair over
 * the words of the GPT-2 split (counted with their multiplicity); a tie goes to the pair whose
 * (left id, right id) is smallest. Fewer merges when no pair is left. ZR_EINVAL when vocab is
 * below 257 (256 with no special token).
 */
int zfmt_tok_train(const char *out_json, const char *const *files, size_t n_files,
                   const zfmt_tok_train_opts *o);

/* ---------------------------------------------------------------- llm.c token files
 *
 * The format and its header parser are zck.h's ("llm.c token files"): the engine reads them
 * too. Version 2 (uint32 tokens) is written when the vocabulary exceeds 65536.
 */
/* ---------------------------------------------------------------- other frameworks' checkpoints
 *
 * DeepSpeed ZeRO and PyTorch DCP checkpoints read in C, their pickles through a restricted
 * unpickler that never executes anything (docs/FORMAT.md, "Foreign checkpoints"). */

typedef enum {
    ZFMT_FOREIGN_NONE = 0,
    ZFMT_FOREIGN_DCP,       /* a directory with .metadata and __R_N.distcp files */
    ZFMT_FOREIGN_DEEPSPEED, /* a save_dir with `latest`, or a tag folder of *_states.pt files */
    ZFMT_FOREIGN_DS_UNIVERSAL, /* DeepSpeed's universal checkpoint: a folder with zero/<param>/
                                  fp32.pt ..., or a save_dir whose latest_universal names one */
} zfmt_foreign_kind;

/* What path holds, from its file names (and the tag a DeepSpeed `latest` names): NONE for our
 * own checkpoints and run directories and anything else. */
zfmt_foreign_kind zfmt_foreign_detect(const char *path);
const char *zfmt_foreign_name(zfmt_foreign_kind k); /* "PyTorch DCP", "DeepSpeed ZeRO" */
/* Verify a foreign checkpoint, problems into a report as zck_verify's (missing rank files and
 * .distcp files, truncated zips, tensors not covered exactly by their chunks or partitions, CRC-32
 * mismatches, pickles naming a global outside the allowlist). 0 when the check ran. */
int zfmt_foreign_verify(zck_report **out, const char *path, const zck_verify_opts *o);
/* One safetensors file of the checkpoint's weights, checked first (DCP in full; DeepSpeed all but
 * the CRC-32s of the optimizer moments, which are not read), streamed in bounded
 * memory, written to a temporary name and renamed into place: DeepSpeed's fp32 master weights
 * as zero_to_fp32.py rebuilds them (its parameter names, shared parameters as copies); every
 * tensor of a DCP checkpoint in its own dtype and name, as dcp_to_torch_save keeps them. */
int zfmt_foreign_consolidate(const char *path, const char *out_file,
                             const zck_progress *progress);
/* The same weights as Hugging Face's shards in directory out_dir: model-0000k-of-0000n.safetensors
 * of at most shard_bytes of data each (a new file where the next tensor would pass the limit, a
 * larger tensor alone: export --format hf's rule, at most 512 files) with
 * model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}), or one
 * model.safetensors when all fit. Built in "<out_dir>.tmp-<pid>" and renamed into place; out_dir
 * must be absent or empty, or with force hold nothing but such files (ZR_EEXIST otherwise).
 * shard_bytes UINT64_MAX: zfmt_foreign_consolidate's one file out_dir (force must be 0); 0 is
 * ZR_EINVAL. */
int zfmt_foreign_consolidate_sharded(const char *path, const char *out_dir, uint64_t shard_bytes,
                                     int force, const zck_progress *progress);
/* What a foreign checkpoint holds, as JSON (format, DeepSpeed's tag, stage, world, step, each
 * parameter's name and shape; DCP's tensors with dtype, shape and chunk count, its bytes items),
 * after the cheap checks (no CRC): a damaged one is ZR_ECORRUPT naming its first problem. */
struct json_t;
int zfmt_foreign_inspect(struct json_t **out, const char *path);

#define ZFMT_TOKENS_MAGIC ZCK_TOKENS_MAGIC

typedef struct {
    double val_fraction;   /* the tail of the tokens to out_val instead, 0..1 */
    zck_progress progress;
} zfmt_tok_file_opts;
#define ZFMT_TOK_FILE_OPTS_INIT {.val_fraction = 0}

typedef struct {
    uint64_t bytes, tokens, val_tokens;
    int version;
} zfmt_tok_file_stats;

/* Encode files (one after the other, concatenated) into the token file out_bin, and, when
 * val_fraction > 0 and out_val is not NULL, the last round(val_fraction * tokens) tokens into
 * out_val instead. Both are written atomically. */
int zfmt_tok_encode_files(zfmt_tok_file_stats *out, zfmt_tok *t, const char *const *files,
                          size_t n_files, const char *out_bin, const char *out_val,
                          const zfmt_tok_file_opts *o);
/* Read a token file (either version) into out; *vocab the header's vocabulary (0: not said). */
int zfmt_tok_file_read(zfmt_tok_ids *out, uint32_t *vocab, const char *path);
/* Read a token file and decode it with t into *out (malloc'ed, NUL-terminated; *n_bytes without
 * the NUL). ZR_EINVAL when the header's vocabulary exceeds t's, or an id is not in t (naming
 * path and the id's position). */
int zfmt_tok_file_decode(char **out, size_t *n_bytes, const zfmt_tok *t, const char *path);

#ifdef __cplusplus
}
#endif
#endif
