/*
 * fmtutil.h: internal interface shared by the converters of formats/ (not for cli/): an output
 * file written under a temporary name and renamed into place, a source checkpoint opened only
 * after it verifies, throttled progress, the GPT-2 naming tables, and a strict safetensors
 * reader. Names with a double underscore are internal.
 */
#ifndef ZFMT_FMTUTIL_H
#define ZFMT_FMTUTIL_H

#include "zfmt.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "formats/ writes little-endian files by copying memory; big-endian hosts are not supported"
#endif

/* ---------------------------------------------------------------- atomic output file */

/* A file written as "<final>.tmp-<pid>", fsynced, renamed to final, and its directory fsynced.
 * Freeing one that was not committed removes the temporary file. */
typedef struct zfmt__out zfmt__out;
int zfmt__out_open(zfmt__out **out, const char *final_path);
int zfmt__out_write(zfmt__out *o, const void *data, size_t n_bytes);
/* n_bytes at byte offset at (write-back started at once for large writes) */
int zfmt__out_pwrite(zfmt__out *o, const void *data, size_t n_bytes, uint64_t at);
int zfmt__out_commit(zfmt__out *o);
void zfmt__out_free(zfmt__out *o);
/* fsync the directory that holds path (its entries: a rename, a new file). */
int zfmt__fsync_dir_of(const char *path);

/* ---------------------------------------------------------------- output directories
 * (an export of several files: built in "<dir>.tmp-<pid>" beside dir, then renamed into place;
 * ours(name) says which file names the writer makes, the only ones a replaced dir may hold) */

/* dir (trailing slashes dropped) and its temporary name, into 4096-byte buffers. */
int zfmt__dir_tmp(char dir[4096], char tmp[4096], const char *out_dir);
/* 0 when dir may be written: absent, an empty directory, or (force) a directory holding only
 * regular files ours() accepts; else ZR_EEXIST naming what is there (what: "a Hugging Face
 * export", for the message). *exists tells whether dir is there. */
int zfmt__dir_check(const char *dir, int force, int (*ours)(const char *name), const char *what,
                    int *exists);
/* Move the built directory tmp into place as dir, replacing an old one (exists). */
int zfmt__dir_put(const char *tmp, const char *dir, int exists, int (*ours)(const char *name));
/* Remove the files ours() accepts (and their temporary files of this process) from dir, then
 * dir. */
void zfmt__dir_remove(const char *dir, int (*ours)(const char *name));

/* ---------------------------------------------------------------- sources and progress */

/* Open a checkpoint (directory or run directory) and start verifying it in full (hashes) on a
 * thread of its own, so that the verification overlaps the export that reads the same files
 * (the page cache serves the second reader). zfmt__verify_join waits for it: any problem is
 * ZR_ECORRUPT naming the first problem's file. An export writes to a temporary file and
 * renames it into place only after the join succeeded, so nothing unverified becomes visible.
 * Every *v must be joined (NULL is fine). */
typedef struct zfmt__verify zfmt__verify;
int zfmt__open_verifying(zck_reader **out, zfmt__verify **v, const char *ckpt);
int zfmt__verify_join(zfmt__verify *v);
/* Join after the export failed with rc (< 0): damage the verification found (a missing
 * shard, say) explains the failure best, so its error wins; otherwise rc and its message stay. */
int zfmt__verify_settle(zfmt__verify *v, int rc);
/* The report of a zck_verify that ran on dir: its first problem (and how many more) as a
 * ZR_ECORRUPT error; 0 when it is empty. */
int zfmt__report_err(const zck_report *rep, const char *dir);

/* Progress in bytes, reported to progress->fn at most every few MiB and once at the end. */
typedef struct {
    const zck_progress *p;
    const char *what;
    uint64_t done, total, last;
} zfmt__prog;
void zfmt__prog_init(zfmt__prog *pr, const zck_progress *p, const char *what, uint64_t total);
void zfmt__prog_add(zfmt__prog *pr, uint64_t n_bytes);

/* ---------------------------------------------------------------- GPT-2 naming */

/* llm.c's file stores the 12 per-layer tensors of the family table (ckpt/arch.c), one array
 * each, in the table's order. */
#define ZFMT__GPT2_KINDS 12
/* The name of per-layer kind k in the table, after "h.<l>.": "ln_1.weight" ... (borrowed). */
const char *zfmt__gpt2_kind(size_t k);
/* Shape of kind k ([out, in] for weights); ndim is 1 or 2. */
void zfmt__gpt2_kind_shape(const zfmt_gpt2_config *c, size_t k, size_t *ndim, uint64_t shape[2]);
/* ZR_EINVAL naming the bad field. */
int zfmt__gpt2_check(const zfmt_gpt2_config *c);
/* Group index and info of a tensor by name; ZR_ENOTFOUND when absent. */
int zfmt__find_tensor(const zck_layout *L, const char *name, size_t *group, zck_tensor_info *t);

/* ---------------------------------------------------------------- Hugging Face names
 * (hfnames.c): one table entry per model family */

typedef struct zfmt__hf_family zfmt__hf_family;
/* The naming of ckpt's family arch ("gpt2", "llama"), or NULL when Hugging Face's is not known. */
const zfmt__hf_family *zfmt__hf_family_of(const char *arch);
/* config.json's architecture ("GPT2LMHeadModel", "LlamaForCausalLM"). */
const char *zfmt__hf_arch(const zfmt__hf_family *f);
/* 1 when the import takes config.json's architecture hf_arch as family f: its own, or the model
 * without its head where the head is tied ("GPT2Model"). */
int zfmt__hf_arch_imports(const zfmt__hf_family *f, const char *hf_arch);
/* Hugging Face's name of one of our tensors ("transformer.h.0.attn.c_attn.weight"), into out;
 * *transposed is 1 for a weight Hugging Face stores [in, out] (GPT-2's Conv1D). */
int zfmt__hf_name(const zfmt__hf_family *f, char *out, size_t n, const char *ours,
                  int *transposed);
/* Our name of a Hugging Face tensor (borrowed from hf or static); NULL for a buffer that is not a
 * parameter (attn.bias, rotary_emb.inv_freq); "" for a name that is ours but not Hugging Face's
 * ("wte"), which no HF file holds. *transposed as above. */
const char *zfmt__hf_to_ours(const zfmt__hf_family *f, const char *hf, int *transposed);
/* 1 when hf is the output head, which a tied model does not have (skipped on import). */
int zfmt__hf_is_head(const zfmt__hf_family *f, const char *hf);
/* The output head's Hugging Face name ("lm_head.weight"), which the model's state_dict holds
 * also when tied, and *embedding our name of the embedding a tied head is ("wte"). */
const char *zfmt__hf_head(const zfmt__hf_family *f, const char **embedding);

/* A row-major [O, I] matrix of es-byte elements into dst as [I, O] (ours [out, in] -> a Conv1D
 * weight's [in, out]). */
void zfmt__transpose(void *dst, const void *src, size_t O, size_t I, size_t es);

/* ---------------------------------------------------------------- llm.c files */

#define ZFMT__LLMC_MAGIC 20240326
#define ZFMT__LLMC_HEADER_INTS 256
#define ZFMT__LLMC_ARRAYS 16  /* wte, wpe, the 12 kinds stacked over layers, ln_f w, ln_f b */
/* Element counts of llm.c's 16 parameter arrays for a config and padded vocabulary Vp; array
 * 2 + k holds kind k of every layer, layer after layer. */
void zfmt__llmc_sizes(const zfmt_gpt2_config *c, uint64_t Vp, uint64_t sizes[ZFMT__LLMC_ARRAYS]);

/* ---------------------------------------------------------------- safetensors reading */

typedef struct {
    char *name;
    zck_dtype dtype;
    size_t ndim;
    uint64_t shape[ZCK_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;  /* bytes, relative to the data buffer */
} zfmt__st_entry;

typedef struct {
    char *path;
    int fd;
    uint64_t file_bytes, data_off;  /* the data buffer starts at data_off */
    zfmt__st_entry *e;              /* in header order */
    size_t n;
    char **meta_keys, **meta_vals;  /* __metadata__ */
    size_t n_meta;
} zfmt__st_file;

/* Open a safetensors file and validate its header strictly (length against the file size,
 * JSON, dtypes, shapes, offsets in bounds, tensors tiling the data buffer with no gap).
 * ZR_ECORRUPT naming the file and what is wrong; ZR_EUNSUPPORTED for a dtype we do not read. */
int zfmt__st_open(zfmt__st_file **out, const char *path);
void zfmt__st_free(zfmt__st_file *f);
/* A metadata value, or NULL (borrowed). */
const char *zfmt__st_meta(const zfmt__st_file *f, const char *key);
/* Read an entry's bytes (end - begin of them) into dst. */
int zfmt__st_read(const zfmt__st_file *f, const zfmt__st_entry *e, void *dst);
/* safetensors dtype name <-> zck_dtype ("F32", "BF16", ...). NULL / ZR_EUNSUPPORTED. */
const char *zfmt__st_dtype_name(zck_dtype t);
int zfmt__st_dtype_parse(zck_dtype *out, const char *name);

/* zfmt_safetensors_export's streaming writer with Hugging Face's names of the checkpoint's family
 * (params only, Conv1D weights transposed, each read whole), metadata {"format": "pt"}, into
 * directory out_dir: model.safetensors, or when larger than shard_bytes (0: no limit) the shards
 * model-0000k-of-0000n.safetensors (a new one where the next tensor would pass the limit) and
 * model.safetensors.index.json. Each file is renamed into place only after the source verified.
 * ZR_EUNSUPPORTED for a family with no Hugging Face naming. */
int zfmt__st_export_hf(const char *ckpt, const char *out_dir, const zfmt_st_opts *o,
                       uint64_t shard_bytes);

/* Hugging Face's shards (export --format hf --shard-size, consolidate --shard-size): tensors in
 * order go into files of at most limit bytes of data, a new file where the next tensor would
 * pass the limit (a larger tensor alone), as transformers does. Start with {0}; each call gives
 * the file (0, 1, ...) of the next tensor of n_bytes and its offset in that file's data. */
typedef struct {
    size_t file;
    uint64_t at;
} zfmt__st_split;
size_t zfmt__st_split_next(zfmt__st_split *s, uint64_t n_bytes, uint64_t limit, uint64_t *begin);
/* The name of file k of n: "model.safetensors" (n 1) or "model-0000k-of-0000n.safetensors"
 * (k from 0), after dir and a slash (dir NULL: the bare name). */
void zfmt__st_shard_path(char *out, size_t cap, const char *dir, size_t k, size_t n);
/* 1 for a name "model-<5 digits>-of-<5 digits>.safetensors". */
int zfmt__st_is_shard_name(const char *name);
struct json_t;
/* model.safetensors.index.json into dir: {"metadata": {"total_size": total}, "weight_map":
 * weight_map} (a JSON object, tensor name -> file name; borrowed), opened into *out for the
 * caller to commit with the shards. */
int zfmt__st_index_open(zfmt__out **out, const char *dir, const struct json_t *weight_map,
                        uint64_t total);
#define ZFMT__MAX_SHARDS 512 /* each stays open until the source verified */

/* json_dumps into memory from malloc (whatever allocator Jansson was given), each real the
 * shortest decimal that reads back as the same double (zck_json_dumps); NULL when out of
 * memory. */
char *zfmt__json_dump(const struct json_t *j, size_t flags);

/* Keep the current message, change its code (a bad config read from a file is corrupt data,
 * not a bad argument); returns code. */
int zfmt__err_recode(int code);

/* "[3, 8]" into out (truncated to n bytes). */
void zfmt__shape_str(char *out, size_t n, size_t ndim, const uint64_t *shape);

/* Read exactly n bytes at off; ZR_ECORRUPT "truncated" at end of file. */
int zfmt__pread_full(int fd, void *dst, size_t n, uint64_t off, const char *path);

/* Read a whole regular file (FIFOs and devices refused without blocking) into *out (malloc'ed,
 * one NUL byte beyond *n_bytes). */
int zfmt__read_file(char **out, size_t *n_bytes, const char *path);

#endif
