/*
 * zck.h: the public interface of the ckpt library, the bottom layer of zero.
 *
 * It owns the on-disk checkpoint format (docs/FORMAT.md): the logical layout of parameter
 * groups, rank-local shard writers, the atomic commit, the reader that serves any logical range
 * whatever the shard layout, and verification. It also carries the project-wide error and
 * logging convention (zr_ names) that core/, formats/ and cli/ reuse.
 *
 * Conventions: functions that can fail return 0 or a negative ZR_E* code after setting a
 * one-line message read with zr_err_msg(). Constructors return through their first argument;
 * the caller owns the result and frees it with the matching _free (which accepts NULL).
 * Getters return borrowed pointers that live as long as their parent.
 */
#ifndef ZCK_H
#define ZCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- errors and logging */

enum {
    ZR_OK = 0,
    ZR_ERROR = -1,        /* anything not worth a code of its own */
    ZR_ENOMEM = -2,
    ZR_EINVAL = -3,       /* bad argument or option value */
    ZR_EIO = -4,          /* the system refused a read, write, fsync, rename... */
    ZR_ENOTFOUND = -5,    /* a file, checkpoint or name does not exist */
    ZR_ECORRUPT = -6,     /* data on disk is damaged or inconsistent */
    ZR_EVERSION = -7,     /* format major version this reader does not know */
    ZR_EUNSUPPORTED = -8, /* feature not built in */
    ZR_EDEVICE = -9,
    ZR_ECOMM = -10,
    ZR_EEXIST = -11,      /* refusing to overwrite something that exists */
    ZR_EBUSY = -12,       /* another job holds the run directory (zck_run_lock) */
};

/* Set the thread's error (code, message, source location) and return code. */
int zr_err_set_at(int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define zr_err_set(code, ...) zr_err_set_at((code), __FILE__, __LINE__, __VA_ARGS__)
/* As zr_err_set, with ": <strerror(err)>" appended; the code follows from err
 * (ENOENT -> ZR_ENOTFOUND, ENOMEM -> ZR_ENOMEM, EEXIST -> ZR_EEXIST, others -> ZR_EIO). */
int zr_err_sys_at(int err, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define zr_err_sys(err, ...) zr_err_sys_at((err), __FILE__, __LINE__, __VA_ARGS__)
/* Prepend context to the current message once ("rank 2: "); the code is kept. */
void zr_err_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *zr_err_msg(void);  /* "" when no error is set; borrowed, thread-local */
int zr_err_code(void);
const char *zr_err_where(void); /* "file.c:123" of the zr_err_set call */
const char *zr_err_name(int code); /* "ZR_ECORRUPT" */
void zr_err_clear(void);
/* s made safe to print on a terminal: each control character (below 0x20, and 0x7f) as '?',
 * cut to cap - 1 bytes, into buf; returns buf ("(null)" for NULL). For names that come from
 * files (tensor, group, producer, shard and archive member names) before they are shown. */
const char *zr_printable(char *buf, size_t cap, const char *s);
/* Room for element n of the array *arrp (a pointer to the array pointer) of *cap elements of
 * elem bytes: when n == *cap, doubles *cap (first 8), zeroing the new elements; otherwise
 * nothing. ZR_ENOMEM (the array unchanged) when memory or the size runs out. */
int zr_array_grow(void *arrp, size_t *cap, size_t n, size_t elem);

enum { ZR_LOG_ERROR = 0, ZR_LOG_WARN = 1, ZR_LOG_INFO = 2, ZR_LOG_DEBUG = 3 };
/* Log to stderr ("warn: ..."), level from ZR_LOG. Lines of a rank are prefixed "[rank N] " by the
 * launcher that carries its output (zrun; mpirun --tag-output, srun --label), not here. */
void zr_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int zr_log_level(void);
void zr_log_trace(const char *file, int line, int rc); /* ZR_TRY hop, shown at debug level */

/* Every environment variable the project reads, named once (ckpt/env.c) and listed in
 * docs/RUNNING.md. zr_env: its value, NULL when unset or empty; zr_env_name: "ZR_LOG" ...;
 * zr_env_doc: one line of what it does. */
typedef enum {
    ZR_ENV_LOG, ZR_ENV_RANK, ZR_ENV_WORLD, ZR_ENV_LOCAL_RANK, ZR_ENV_COMM_SHM, ZR_ENV_COMM_TCP,
    ZR_ENV_COMM_TCP_TIMEOUT, ZR_ENV_DEVICE, ZR_ENV_DEVICE_COMM, ZR_ENV_CUDA_LIB,
    ZR_ENV_CUDA_VISIBLE_DEVICES, ZR_ENV_MASTER_ADDR, ZR_ENV_MASTER_PORT, ZR_ENV_OMPI_RANK,
    ZR_ENV_OMPI_SIZE, ZR_ENV_OMPI_LOCAL_RANK, ZR_ENV_PMI_RANK, ZR_ENV_PMI_SIZE,
    ZR_ENV_PMI_LOCAL_RANK, ZR_ENV_SLURM_PROCID, ZR_ENV_SLURM_NTASKS, ZR_ENV_SLURM_LOCALID,
    ZR_ENV_JOB_ID, ZR_ENV_SLURM_JOB_ID, ZR_ENV_SLURM_STEP_ID, ZR_ENV_PMIX_NAMESPACE,
    ZR_ENV_RUN_ID, ZR_ENV_COMM, ZR_ENV_COMM_MPI_WINDOW, ZR_ENV_PMIX_RANK,
    ZR_ENV_OMPI_LOCAL_SIZE, ZR_ENV_OMPI_YIELD, ZR_ENV_SAVE_THROTTLE_MS, ZR_ENV_COUNT
} zr_env_var;
const char *zr_env(zr_env_var v);
const char *zr_env_name(zr_env_var v);
const char *zr_env_doc(zr_env_var v);
/* v as a decimal integer in [lo, hi] into *out (left as is when unset or empty; *present says
 * which); an error naming the variable and its value otherwise */
int zr_env_int(int *out, int *present, zr_env_var v, long lo, long hi);

#define ZR_TRY(x)                                                                              \
    do {                                                                                       \
        int zr_try_rc_ = (x);                                                                  \
        if (zr_try_rc_ < 0) {                                                                  \
            zr_log_trace(__FILE__, __LINE__, zr_try_rc_);                                      \
            return zr_try_rc_;                                                                 \
        }                                                                                      \
    } while (0)
#define ZR_TRY_GOTO(x, rc, label)                                                              \
    do {                                                                                       \
        (rc) = (x);                                                                            \
        if ((rc) < 0) {                                                                        \
            zr_log_trace(__FILE__, __LINE__, (rc));                                            \
            goto label;                                                                        \
        }                                                                                      \
    } while (0)

/* ---------------------------------------------------------------- JSON numbers
 *
 * Jansson writes a real with 17 significant digits (0.1 as 0.10000000000000001). The JSON that
 * people read (zgen --json, zckpt --json, zrun's training section, a Hugging Face config.json)
 * goes through zck_json_dumps instead: each real the shortest decimal that reads back as the
 * same double, so no value changes. A value that is a float32 in the program becomes a real
 * through zck_json_real_f32: the double of the shortest decimal that reads back as the same
 * float (0.8f: 0.8, where json_real gives 0.800000011920929). */
struct json_t;
/* json_dumps(j, flags) (any JSON_REAL_PRECISION ignored) with every real the shortest decimal
 * that reads back as the same double, with a point or an exponent (1.0, 1e-5, 0.8). Malloc'ed
 * (free()); NULL when out of memory. */
char *zck_json_dumps(const struct json_t *j, size_t flags);
/* A new JSON real for the float32 v (see above); NULL when v is not finite or out of memory. */
struct json_t *zck_json_real_f32(float v);
/* The shortest decimal of v that reads back (strtod, or strtof when f32) as the same double
 * (float), as zck_json_dumps writes it, into out[cap]; its length. */
size_t zck_json_real_text(char *out, size_t cap, double v, int f32);

/* ---------------------------------------------------------------- format constants */

#define ZERO_VERSION "0.1.0"     /* the software; written as the manifest's producer */
#define ZCK_FORMAT_NAME "zckpt"
#define ZCK_VERSION_MAJOR 1
#define ZCK_VERSION_MINOR 0
#define ZCK_VERSION_MINOR_FILES 1 /* what a checkpoint with extra files says (zck_extra_file) */
#define ZCK_FILE_ALIGN 4096u     /* every extent starts at a multiple of this in its file */
#define ZCK_PARTITION_ALIGN 64u  /* default partition size multiple, in elements */
#define ZCK_MAX_DIMS 8
#define ZCK_MAX_WORLD 65536u
/* manifest.json is refused beyond this on read and on write (bounds the memory a hostile one
 * costs: parsing takes several times its size) */
#define ZCK_MAX_MANIFEST_BYTES ((size_t)64 << 20)
/* training-section counters (step, optimizer_step, next_sample) above this are refused on read
 * and on write: far from where a signed 64-bit JSON integer wraps to negative */
#define ZCK_MAX_COUNTER ((uint64_t)1 << 62)

/* ---------------------------------------------------------------- dtypes */

typedef enum {
    ZCK_F32 = 0, ZCK_BF16, ZCK_F16, ZCK_F64, ZCK_I64, ZCK_I32, ZCK_I16, ZCK_U16, ZCK_I8, ZCK_U8,
    ZCK_DTYPE_COUNT
} zck_dtype;

size_t zck_dtype_size(zck_dtype t);       /* bytes per element */
const char *zck_dtype_name(zck_dtype t);  /* "f32", "bf16", ... */
/* Parse a dtype name; ZR_EINVAL when unknown. */
int zck_dtype_parse(zck_dtype *out, const char *name);

/* ---------------------------------------------------------------- layout */

/*
 * A layout is the ordered list of parameter groups and the list of per-element states.
 * A group is an ordered list of tensors laid end to end in one flat index space of numel
 * elements. Every (group, state) pair is one flat array of numel elements of the state's dtype.
 */
typedef struct zck_layout zck_layout;

int zck_layout_new(zck_layout **out);
void zck_layout_free(zck_layout *L);
/* Declare a state ("param", "exp_avg", ...). Names are unique, [A-Za-z0-9_.-], <= 64 chars. */
int zck_layout_add_state(zck_layout *L, const char *name, zck_dtype dtype);
/* Append a group; its index goes to *out (may be NULL). Names are unique, non-empty. */
int zck_layout_add_group(zck_layout *L, size_t *out, const char *name);
/* Append a tensor to group g at the group's current end. dtype is the tensor's natural dtype,
 * recorded in the manifest for consumers; storage dtypes are per state (exports write those). */
int zck_layout_add_tensor(zck_layout *L, size_t g, const char *name, zck_dtype dtype,
                          size_t ndim, const uint64_t *shape);
/* Set the partition alignment in elements (default ZCK_PARTITION_ALIGN, >= 1). */
int zck_layout_set_partition_align(zck_layout *L, uint32_t align);
int zck_layout_copy(zck_layout **out, const zck_layout *L);

size_t zck_layout_n_groups(const zck_layout *L);
size_t zck_layout_n_states(const zck_layout *L);
uint32_t zck_layout_partition_align(const zck_layout *L);
const char *zck_layout_group_name(const zck_layout *L, size_t g);
uint64_t zck_layout_group_numel(const zck_layout *L, size_t g);
size_t zck_layout_group_n_tensors(const zck_layout *L, size_t g);
const char *zck_layout_state_name(const zck_layout *L, size_t s);
zck_dtype zck_layout_state_dtype(const zck_layout *L, size_t s);
/* Index of a state or group by name; ZR_ENOTFOUND when absent. */
int zck_layout_find_state(const zck_layout *L, size_t *out, const char *name);
int zck_layout_find_group(const zck_layout *L, size_t *out, const char *name);

typedef struct {
    const char *name;      /* borrowed */
    zck_dtype dtype;
    size_t ndim;
    uint64_t shape[ZCK_MAX_DIMS];
    uint64_t offset;       /* first element in the group's index space */
    uint64_t numel;
} zck_tensor_info;
void zck_layout_tensor(const zck_layout *L, size_t g, size_t t, zck_tensor_info *out);

/*
 * The partition rule. For a group of numel elements and a world of W ranks:
 * P = ceil(numel / W) rounded up to a multiple of align; rank r owns
 * [min(r*P, numel), min((r+1)*P, numel)). High ranks may own nothing.
 */
void zck_partition(uint64_t numel, uint32_t world, uint32_t rank, uint32_t align,
                   uint64_t *start, uint64_t *count);

/* ---------------------------------------------------------------- model families (arch.c)
 *
 * The naming contracts between checkpoints and models (docs/FORMAT.md section 13), one table
 * entry per model family ("gpt2", "llama"): the config fields of the manifest's model section with their
 * defaults and bounds, the checks, the section's JSON, and the ordered groups and tensors with
 * their shapes as functions of the config. core/ (the engine) and formats/ (the converters)
 * both use it, so the contract is written once. Names and shapes only: no model maths.
 */
typedef struct zck_arch zck_arch; /* a family: a static table entry, never freed */

#define ZCK_ARCH_MAX_FIELDS 16
/* A config of one family: field i of the family's field list is v[i] (integer fields hold
 * whole numbers; a double carries every uint32 exactly, and real-valued fields too). */
typedef struct {
    const zck_arch *arch;
    double v[ZCK_ARCH_MAX_FIELDS];
} zck_arch_config;

/* The family of that name ("gpt2"); ZR_ENOTFOUND naming the known ones. */
int zck_arch_find(const zck_arch **out, const char *name);
size_t zck_arch_count(void);
const zck_arch *zck_arch_at(size_t i); /* NULL past the end */
const char *zck_arch_name(const zck_arch *a);
size_t zck_arch_n_fields(const zck_arch *a);
const char *zck_arch_field_name(const zck_arch *a, size_t i); /* in model-section order */

/* Every field at its default. */
void zck_arch_config_init(zck_arch_config *out, const zck_arch *a);
/* A field by name; the name must be one of the family's (assert). */
double zck_arch_config_get(const zck_arch_config *c, const char *field);
void zck_arch_config_set(zck_arch_config *c, const char *field, double v);
/* ZR_EINVAL "<what>: ..." naming the bad field (out of bounds, not a multiple, too large). */
int zck_arch_config_check(const zck_arch_config *c, const char *what);
/* Set fields from "key=value,key=value" (decimal integers; decimal numbers for real fields
 * such as llama's rope_theta and norm_eps) and check the result; messages
 * start with what. On failure *c is unchanged. */
int zck_arch_config_set_fields(zck_arch_config *c, const char *fields, const char *what);
/* The manifest's model section, compact: {"arch":"<family>", then the fields in order}.
 * The caller frees *out. ZR_EINVAL ("<family> config: ...") for a config that fails its check. */
int zck_arch_config_to_json(char **out, const zck_arch_config *c);
/* Parse a model section ("model section: ..." messages, ZR_EINVAL). want: the family it must
 * be, or NULL for any known one. Other fields are ignored. */
int zck_arch_config_from_json(zck_arch_config *out, const char *json, const zck_arch *want);

typedef struct {
    const char *name;  /* full name ("wte"), or for a per-layer group the part after
                          "<group>.<l>." ("attn.c_attn.weight"); borrowed from the table */
    const char *group; /* the group, or for a per-layer group its prefix ("h": h.0, h.1 ...) */
    int per_layer;
    int present;       /* 0: this config has no such tensor (Llama's lm_head when tied) */
    size_t ndim;
    uint64_t shape[ZCK_MAX_DIMS]; /* weights [out, in] */
    uint64_t numel;
} zck_arch_tensor_info;
/* The family's tensors in layout order, each per-layer tensor listed once; a tensor a config
 * leaves out (present 0) is in no layout of that config. */
size_t zck_arch_n_tensors(const zck_arch *a);
void zck_arch_tensor(const zck_arch_config *c, size_t t, zck_arch_tensor_info *out);
uint32_t zck_arch_layers(const zck_arch_config *c); /* how many times per-layer groups repeat */
/* The checkpoint layout of a config: the family's states (f32), then its groups in order, the
 * per-layer ones repeated for each layer. Caller frees. ZR_EINVAL as to_json. */
int zck_arch_layout(zck_layout **out, const zck_arch_config *c);

/* GPT-2's config as a C struct: the "gpt2" family's fields (the engine's zr_gpt2_config and the
 * converters' zfmt_gpt2_config are this type, so the binding is written once). zck_arch_gpt2:
 * the family. to_arch: a config of every field (unchecked); from_arch: the fields of a gpt2
 * config (assert), each a uint32 once checked. */
typedef struct {
    uint32_t layers, heads, dim, ctx, vocab; /* L, NH, C, maximum T, V */
} zck_gpt2_config;
const zck_arch *zck_arch_gpt2(void);
void zck_gpt2_to_arch(zck_arch_config *out, const zck_gpt2_config *c);
void zck_gpt2_from_arch(zck_gpt2_config *out, const zck_arch_config *a);
/* zck_arch_layout, zck_arch_config_to_json and zck_arch_config_from_json (want "gpt2") of a
 * GPT-2 config. */
int zck_gpt2_layout(zck_layout **out, const zck_gpt2_config *c);
int zck_gpt2_to_json(char **out, const zck_gpt2_config *c);
int zck_gpt2_from_json(zck_gpt2_config *out, const char *json);

/* ---------------------------------------------------------------- llm.c token files (tokfile.c)
 *
 * int32 header[256] little-endian: [0] magic 20240520, [1] version, [2] token count, [3] the
 * tokenizer's vocabulary size (0: not said, as llm.c writes), then the tokens: version 1 uint16,
 * version 2 uint32 (ztok's, for vocabularies over 65536); the file is exactly header and tokens.
 * zck_token_header_parse: the header of a file of size bytes at data, checked against the size;
 * errors (ZR_ECORRUPT) name path. */
#define ZCK_TOKENS_MAGIC 20240520
#define ZCK_TOKENS_U16 1
#define ZCK_TOKENS_U32 2
#define ZCK_TOKENS_HEADER_BYTES 1024
typedef struct {
    uint32_t version, vocab; /* vocab: 0 when the header does not say */
    int width;               /* bytes a token: 2 or 4 */
    uint64_t count;          /* tokens after the header */
} zck_token_header;
int zck_token_header_parse(zck_token_header *out, const void *data, size_t size,
                           const char *path);

/* ---------------------------------------------------------------- progress */

/* Long operations report progress through this callback (the CLI draws a bar from it).
 * what names the phase ("verify", "reshard", ...); done and total are bytes (total 0 when not
 * known in advance). Called from the calling thread only, throttled (every few MiB or every
 * 50 ms); the receiver must not assume a rate. */
typedef struct {
    void (*fn)(void *ctx, const char *what, uint64_t done, uint64_t total);
    void *ctx;
} zck_progress;

/* ---------------------------------------------------------------- opening files */

/* Open path read-only as a regular file. A FIFO, socket, device or directory is refused without
 * blocking ("<path> is a FIFO, not a regular file": ZR_ECORRUPT), and with ZCK_NOFOLLOW so is a
 * symbolic link as the last component of path (the files inside a checkpoint); a missing file
 * is ZR_ENOTFOUND. *out is a blocking descriptor the caller closes; *bytes (may be NULL) the
 * size. Every checkpoint file, converter input and training data file is opened through this. */
enum { ZCK_FOLLOW = 0, ZCK_NOFOLLOW = 1 };
int zck_open_regular(int *out, const char *path, int nofollow, uint64_t *bytes);
/* Small helpers the converters share with the library; the fsync and the rename pass through
 * the fault hook (advanced section) like every storage operation of the library.
 * zck_path_join: "a/b" (no second '/' when a ends with one), malloc'd; NULL on ENOMEM (error
 * set). zck_fsync_dir: make a directory's entries durable. zck_rename_noreplace: rename that
 * never replaces an existing `to` (ZR_EEXIST), also where the filesystem lacks
 * RENAME_NOREPLACE (checked, then renamed). */
char *zck_path_join(const char *a, const char *b);
int zck_fsync_dir(const char *dir);
/* A small file replaced whole or not at all: data into a temporary beside it (.NAME.tmp-PID,
 * whatever had that name removed first), fsync'ed, renamed over path, the directory fsync'ed;
 * on failure the temporary is removed and the message names path. */
int zck_write_file_atomic(const char *path, const void *data, size_t len);
int zck_rename_noreplace(const char *from, const char *to);
/* Paths of outputs, checked before a tool writes them (a temporary renamed over the path).
 * zck_path_resolve: path with symbolic links resolved, the file itself when it exists, else its
 * directory resolved and its name appended (malloc'd; NULL when neither resolves or on ENOMEM).
 * zck_same_file: whether a and b name one file: the same device and inode when both exist, else
 * the same resolved path (an output not written yet against another). zck_check_output: 0 when
 * nothing is at path or it is a regular file; else ZR_EINVAL "<path> is a FIFO, not a regular
 * file" (a directory, a device, a socket, a symbolic link: what the rename would replace),
 * looked at with lstat, never opened (a FIFO does not block). */
char *zck_path_resolve(const char *path);
int zck_same_file(const char *a, const char *b);
int zck_check_output(const char *path);
/* zck_make_parents: make the missing directories on the way to path (mkdir -p of its parent,
 * each new directory made durable in its own parent); an existing component must be a
 * directory or a symbolic link to one, else ZR_EINVAL naming it and what it is (a file, a
 * dangling link and its target). *made (may be NULL): the malloc'd path of the topmost
 * directory it made, NULL when none. zck_unmake_parents: after the output failed, remove the
 * directories it made for path that are still empty, from path's parent up to made (NULL
 * accepted). */
int zck_make_parents(char **made, const char *path);
void zck_unmake_parents(const char *made, const char *path);

/* ---------------------------------------------------------------- writing a checkpoint */

enum { ZCK_IO_AUTO = 0, ZCK_IO_BUFFERED = 1 };

typedef struct {
    int io;              /* ZCK_IO_AUTO: O_DIRECT when the filesystem allows it */
    size_t buf_bytes;    /* staging buffer size, multiple of ZCK_FILE_ALIGN */
    unsigned queue_depth;/* buffers in flight */
} zck_io_opts;
#define ZCK_IO_OPTS_INIT {.io = ZCK_IO_AUTO, .buf_bytes = (size_t)4 << 20, .queue_depth = 4}

/* Create the staging directory ".tmp-step-<step>-<nonce>" inside run_dir (and run_dir itself
 * when missing). All ranks of a save agree on (step, nonce); creating it twice is fine.
 * *out is the malloc'ed path. */
int zck_staging_create(char **out, const char *run_dir, uint64_t step, uint64_t nonce);

/* Remove the staging directory of a save that failed, with what its writers left there: the
 * caller (whoever created it) calls this once every rank has given up on it. The current
 * error is kept; a failure to remove is logged as a warning. NULL is fine. */
void zck_staging_remove(const char *staging_dir);

/* The description of one written shard file: what the committer needs from each rank. */
typedef struct zck_shard zck_shard;

typedef struct zck_writer zck_writer;
/* Open rank's shard file "shard-RRRRR-of-WWWWW.bin" in staging_dir for writing. The layout is
 * copied. opts may be NULL. */
int zck_writer_open(zck_writer **out, const char *staging_dir, const zck_layout *L,
                    uint32_t world, uint32_t rank, const zck_io_opts *opts);
/* Start an extent: the next count elements of (group, state) from element start. The extent
 * is placed at the next ZCK_FILE_ALIGN boundary of the file. ZR_EINVAL when out of range or
 * when the previous extent is not complete. */
int zck_writer_begin(zck_writer *w, size_t group, size_t state, uint64_t start, uint64_t count);
/* Stream bytes of the current extent; any split is fine, the total must match its size. */
int zck_writer_write(zck_writer *w, const void *data, size_t n_bytes);
/* begin + write in one call. */
int zck_writer_put(zck_writer *w, size_t group, size_t state, uint64_t start, uint64_t count,
                   const void *data);
/* Pad, drain, fsync and close the file; *out describes it (caller frees). After this, or after
 * any failure, only zck_writer_free is valid. */
int zck_writer_finish(zck_writer *w, zck_shard **out);
/* Free; a shard file that was not finished is removed. */
void zck_writer_free(zck_writer *w);
/* 1 when the writer used O_DIRECT, 0 when it fell back to buffered I/O. */
int zck_writer_direct(const zck_writer *w);

/* Shards travel between ranks as JSON text (the committer gathers them). */
int zck_shard_to_json(char **out, const zck_shard *s);
int zck_shard_from_json(zck_shard **out, const char *json, size_t len);
void zck_shard_free(zck_shard *s);
const char *zck_shard_file(const zck_shard *s);
uint64_t zck_shard_bytes(const zck_shard *s);
const char *zck_shard_sha256(const zck_shard *s); /* 64 lowercase hex characters */
uint32_t zck_shard_rank(const zck_shard *s);
typedef struct {
    size_t group, state;
    uint64_t start, count;   /* elements of (group, state) */
    uint64_t offset;         /* bytes into the shard file */
} zck_extent_info;
size_t zck_shard_n_extents(const zck_shard *s);
void zck_shard_extent(const zck_shard *s, size_t i, zck_extent_info *out);

typedef struct {
    uint64_t step;
    uint32_t world;
    int zero_stage;          /* 0..3 */
    const char *model_json;  /* JSON object text for the engine, NULL for {} */
    const char *training_json; /* JSON object text, NULL for {} */
    const char *producer;    /* NULL for "zero <version>" */
    unsigned keep_last;      /* 0 keeps everything; else keep this many newest step-* dirs */
    int gc_tmp;              /* remove stale .tmp-step-N-* with N <= step after commit */
    const struct zck_extra_file *files; /* small files recorded beside the shards */
    size_t n_files;
} zck_commit_opts;
#define ZCK_COMMIT_OPTS_INIT {.step = 0, .world = 1, .zero_stage = 0, .keep_last = 0, .gc_tmp = 1}

/*
 * Commit a save: validate that the shards (one per rank, in any order) cover every
 * (group, state) exactly once, write manifest.json and SHA256SUMS into staging_dir, fsync them
 * and the directory, rename it to run_dir/step-<step>, fsync run_dir, replace run_dir/latest
 * atomically, then apply retention. *out (may be NULL) is the malloc'ed final path.
 * ZR_EEXIST when step-<step> already exists; ZR_ECORRUPT when the shards do not tile.
 * A failure before the rename leaves latest and every committed checkpoint untouched; the
 * staging directory stays the caller's (zck_staging_remove).
 */
int zck_commit(char **out, const char *run_dir, const char *staging_dir, const zck_layout *L,
               zck_shard *const *shards, size_t n_shards, const zck_commit_opts *opts);

/* Remove a directory tree (a run or checkpoint directory; symlinks are removed, not
 * followed). The error names the entry that could not be removed. */
int zck_remove_tree(const char *path);

/* Point run_dir/latest at step-<step> atomically (write temp, fsync, rename, fsync run_dir).
 * ZR_ENOTFOUND when that checkpoint directory does not exist. */
int zck_latest_set(const char *run_dir, uint64_t step);

/* Directory name of a step ("step-00001000"). */
void zck_step_dirname(char out[32], uint64_t step);
/* Whether name (its first n bytes), an entry of a run directory, is one the format manages: a
 * step directory (damaged ones too: damaged-step-N), `latest`, and the hidden entries (`.lock`,
 * the temporaries of saves, deletions, unpacks and `latest`, all named ".*"). */
int zck_run_owns(const char *name, size_t n);
/* Resolve run_dir/latest to a malloc'ed checkpoint path; ZR_ENOTFOUND without latest,
 * ZR_ECORRUPT when latest does not hold a plain step directory name. */
int zck_latest(char **out, const char *run_dir);

/* ---------------------------------------------------------------- run directories */

/*
 * One job per run directory: whatever stages, commits or deletes in a run directory holds an
 * exclusive lock on RUN/.lock (flock) for as long as it works there; the file names the holder
 * as "pid host program". zck_run_lock creates run_dir when missing. A second taker gets
 * ZR_EBUSY naming the holder's program, pid and host. The kernel drops a lock whose holder
 * died, so a crashed job's lock is taken over. Where the filesystem refuses flock, a live
 * process of the written pid on this host keeps the directory. zck_prune, zck_reshard (into
 * its output run directory) and zfmt_unpack take it themselves; zck_commit does not (its
 * caller holds it). Locks of one process on one directory exclude each other too.
 */
typedef struct zck_lock zck_lock;
int zck_run_lock(zck_lock **out, const char *run_dir, const char *program);
/* Release (and remove the lock file); accepts NULL. */
void zck_run_unlock(zck_lock *lk);
/* Who holds run_dir now: *out is a malloc'ed "program (pid N on host H)", or NULL when no
 * live job holds it. */
int zck_run_lock_holder(char **out, const char *run_dir);

typedef struct {
    size_t n;
    char **name;
} zck_namelist;
void zck_namelist_free(zck_namelist *l); /* frees the names, not l itself */

typedef struct {
    unsigned keep_last;   /* keep the newest K step directories; 0 keeps all */
    uint64_t keep_every;  /* also keep steps that are multiples of this; 0: none */
    int gc_tmp;           /* remove stale .tmp-step-N-* (N <= latest), .del-*, .latest.tmp-* */
    int dry_run;          /* only say what would go */
    int damaged;          /* only the damaged-step-N directories the resume policy moved aside
                             (nothing else: no retention, no temporaries) */
} zck_prune_opts;
#define ZCK_PRUNE_OPTS_INIT {.keep_last = 0, .keep_every = 0, .gc_tmp = 1, .dry_run = 0, .damaged = 0}

/* Apply retention to run_dir now, holding its lock (ZR_EBUSY while a job works there): never
 * removes what latest names, nor any step directory above it (an orphan of a crashed commit).
 * With gc_tmp, every abandoned staging directory goes, whatever its step (also without
 * latest). Only what the format wrote is deleted: a directory holding anything but
 * manifest.json, SHA256SUMS, shard-*.bin and the extra files its manifest lists is left in
 * place with a warning. With o->damaged, only the damaged-step-N (damaged-step-N.K)
 * directories go, under the same rule. Step directories
 * are renamed out of sight before they are deleted. *removed (may be NULL) lists what went
 * (or would go). */
int zck_prune(zck_namelist *removed, const char *run_dir, const zck_prune_opts *o);
/* The same by the job that holds run_dir's lock (held: its zck_run_lock of run_dir; a job's
 * own lock would refuse zck_prune), which also keeps the step directory also_keep (a name or a
 * path ending in one, such as the checkpoint it resumed from; NULL: none). zrun applies its
 * --keep-last this way at start, before its first save. */
int zck_prune_held(zck_namelist *removed, const zck_lock *held, const char *run_dir,
                   const char *also_keep, const zck_prune_opts *o);

/* ZCK_CKPT_DAMAGED: a damaged-step-N directory (zck_run_list's damaged) */
typedef enum {
    ZCK_CKPT_COMPLETE,
    ZCK_CKPT_INCOMPLETE,
    ZCK_CKPT_CORRUPT,
    ZCK_CKPT_DAMAGED
} zck_ckpt_status;

typedef struct {
    char *name;          /* "step-00001000" */
    uint64_t step;       /* from the name */
    uint32_t world;      /* 0 when the manifest cannot be read */
    int zero_stage;
    uint64_t bytes;      /* sum of the files in the directory */
    zck_ckpt_status status;  /* from a quick verify (no hashing) */
    char *detail;        /* "" when complete; else "FILE: problem", the first one (incomplete:
                            every missing or short file, "; "-separated) */
    int is_latest;
} zck_run_entry;

typedef struct {
    zck_run_entry *ckpt;  /* sorted by step */
    size_t n;
    char *latest;         /* what latest names, NULL without one */
    zck_namelist stale;   /* stale temporaries: abandoned staging of failed saves and others */
    char *holder;         /* the live job holding the directory (zck_run_lock_holder), or NULL */
    zck_namelist foreign; /* step-<N> names that are not directories (a symbolic link to one
                             among them): not part of the run, never resumed from or removed */
    zck_run_entry *damaged; /* the damaged-step-N directories the resume policy moved aside,
                               sorted by step, each with its quick check's detail; status
                               ZCK_CKPT_DAMAGED */
    size_t n_damaged;
} zck_run_list;

/* List the checkpoints of a run directory with a quick check of each. */
int zck_run_list_open(zck_run_list **out, const char *run_dir);
void zck_run_list_free(zck_run_list *l);
/* "complete", "incomplete", "corrupt", "damaged (moved aside)" */
const char *zck_ckpt_status_name(zck_ckpt_status s);

/* Whether target (an output a tool was told to replace, --force) may be deleted: 0 when it
 * does not exist or is a symlink (only the link goes), or a zckpt run directory (a latest
 * file, or step-N directories with manifests) or checkpoint directory (a manifest) that no
 * live job holds. ZR_EEXIST when it is anything else, or src itself or a directory holding src
 * (compared by device and inode, src may be NULL); ZR_EBUSY while a job holds it. */
int zck_check_replaceable(const char *target, const char *src);
/* Whether a tool may write at path (a file or a directory it makes): ZR_EINVAL when path lies
 * inside a checkpoint directory (one holding manifest.json and SHA256SUMS), or on an entry of a run directory
 * that the format manages (zck_run_owns: step and damaged-step directories, latest, the hidden
 * lock and temporaries), naming the directory and the entry. The directories on the way are
 * resolved (symbolic links followed, as far as they exist); the last component is taken as
 * written (a rename over a symbolic link replaces the link). 0 otherwise. */
int zck_check_unmanaged(const char *path);

/* ---------------------------------------------------------------- resuming a run */

typedef struct zck_reader zck_reader; /* reading a checkpoint, below */

/* How zck_resume_pick checks each candidate: FULL (the default) is what `zckpt verify` checks,
 * every shard hashed and manifest.json against SHA256SUMS; QUICK and OFF check everything but
 * the hashes (manifest, SHA256SUMS, every shard present with its size). OFF means only that the
 * caller will then read the pick without verifying it again; the pick itself is checked as
 * QUICK. The values are those of ZR_VERIFY_* (train.h). */
enum { ZCK_RESUME_VERIFY_FULL = 0, ZCK_RESUME_VERIFY_QUICK = 1, ZCK_RESUME_VERIFY_OFF = 2 };

typedef struct {
    int verify;          /* ZCK_RESUME_VERIFY_* */
    unsigned jobs;       /* files hashed in parallel */
    int dry_run;         /* decide and say what would be done, change nothing */
    /* each line of what was done (damaged checkpoints moved aside, an interrupted commit),
     * complete sentences without a trailing newline; NULL: not told */
    void (*say)(void *ctx, const char *line);
    void *say_ctx;
    /* as zck_verify_opts.precheck: the caller's cheap check before any hashing; its error stops
     * the check (and the pick: nothing is moved) */
    int (*precheck)(void *ctx, const zck_reader *rd);
    void *precheck_ctx;
} zck_resume_opts;
#define ZCK_RESUME_OPTS_INIT {.verify = ZCK_RESUME_VERIFY_FULL, .jobs = 2, .dry_run = 0}

/* The one resume policy of a run directory (a plain `--resume auto` and the restart
 * supervisor alike): the checkpoint to resume from is the newest step directory that passes
 * o->verify and whose name agrees with the step in its manifest (a renamed directory is
 * damaged). Every newer step directory is damaged: each is renamed to damaged-step-N
 * (damaged-step-N.2, ... when taken), never deleted, so that the resumed run can save that
 * step again; `latest` is rewritten to name the pick. Each move is told through o->say with the
 * directory's name and its first problem; so is the note of an interrupted commit, only when
 * the pick is newer than what latest names (a commit that stopped between the rename of its
 * directory and the update of latest). *out: the malloc'ed path of the pick, or NULL (and 0
 * returned) when run_dir is absent or holds no step directory. ZR_ECORRUPT when it holds some
 * but none passes (nothing is moved then); ZR_EINVAL for a bad o->verify; errors of the
 * renames and of the rewrite of latest as they come. Each candidate gets the check of
 * zck_resume_check; one that cannot run (out of memory, a read the system refuses) stops the
 * pick with that error (ZR_ENOMEM, ZR_EIO) and nothing is moved: only proven damage is. */
int zck_resume_pick(char **out, const char *run_dir, const zck_resume_opts *o);

/* The one check of a checkpoint before it is trusted (every resume: each candidate of
 * zck_resume_pick, a --resume PATH naming a run directory, a step directory inside one or a copy
 * elsewhere, a restart of the supervisor; and zgen's load, QUICK, its read hashing the shards):
 * path (a checkpoint, or a run directory through latest) resolved into *out (malloc'ed), then
 * checked as o->verify says (OFF as QUICK), the cheap checks first and nothing hashed once one
 * fails: the manifest, its model section against its layout, SHA256SUMS (manifest.json edited
 * after the commit), presence and sizes, a directory named step-N against the manifest's step,
 * then the hashes (with FULL; a line through o->say every few seconds while that lasts). Damage:
 * ZR_ECORRUPT "<dir>: <file>: <kind>: <detail>". A check that cannot run (out of memory, a read
 * the system refuses: ZR_ENOMEM, ZR_EIO) is that error, never a verdict of damage. */
int zck_resume_check(char **out, const char *path, const zck_resume_opts *o);

/* ---------------------------------------------------------------- reading a checkpoint */

/* A small file recorded in a checkpoint beside the shards (the run's tokenizer.json): written
 * into the checkpoint directory by zck_commit, listed in the manifest's "files" with its size
 * and SHA-256 and in SHA256SUMS, verified like a shard, carried by zck_reshard. name is a plain
 * file name ([A-Za-z0-9._-], not manifest.json, SHA256SUMS or a shard's name); at most
 * ZCK_MAX_FILES of at most ZCK_MAX_FILE_BYTES each. docs/FORMAT.md, "Extra files" (format 1.1). */
typedef struct zck_extra_file {
    const char *name;
    const void *data;
    size_t bytes;
} zck_extra_file;
#define ZCK_MAX_FILES 16
#define ZCK_MAX_FILE_BYTES ((size_t)64 << 20)

/* The bytes of the extra file `name` of a checkpoint (directory, or run directory through
 * latest), verified against the manifest's size and SHA-256 (*out malloc'ed, NUL-terminated
 * beyond *n_bytes). ZR_ENOTFOUND when the checkpoint lists no such file, ZR_ECORRUPT when the
 * file is missing, not a regular file, or differs. */
int zck_ckpt_file_read(char **out, size_t *n_bytes, const char *ckpt, const char *name);

/* Open a checkpoint directory, or a run directory through its latest file, and validate the
 * manifest completely (fields, types, ranges, names, every (group, state) covered exactly once,
 * extents inside their files). Shard files are not read. ZR_ENOTFOUND, ZR_ECORRUPT, ZR_EVERSION. */
int zck_reader_open(zck_reader **out, const char *path);
void zck_reader_free(zck_reader *r);
/* A reader over manifest text alone (from an archive, say), validated as zck_reader_open does;
 * what names it in messages. It has no directory: zck_reader_read fails with ZR_EINVAL. */
int zck_reader_open_manifest(zck_reader **out, const char *text, size_t len, const char *what);

const char *zck_reader_path(const zck_reader *r);      /* the checkpoint directory */
const zck_layout *zck_reader_layout(const zck_reader *r);
uint64_t zck_reader_step(const zck_reader *r);
uint32_t zck_reader_world(const zck_reader *r);
int zck_reader_zero_stage(const zck_reader *r);
const char *zck_reader_version(const zck_reader *r);  /* "1.0" */
const char *zck_reader_created(const zck_reader *r);
const char *zck_reader_producer(const zck_reader *r);
/* Compact JSON text of the opaque sections (borrowed). */
const char *zck_reader_model_json(const zck_reader *r);
const char *zck_reader_training_json(const zck_reader *r);
size_t zck_reader_n_shards(const zck_reader *r);
/* The extra files the manifest lists (zck_extra_file): their count and names (borrowed). */
size_t zck_reader_n_files(const zck_reader *r);
const char *zck_reader_file_name(const zck_reader *r, size_t i);
uint64_t zck_reader_file_bytes(const zck_reader *r, size_t i);
const char *zck_reader_file_sha256(const zck_reader *r, size_t i);
const zck_shard *zck_reader_shard(const zck_reader *r, size_t i);

typedef struct {
    size_t group, state;
    uint64_t start, count;   /* elements */
    void *dst;               /* count * dtype size bytes */
} zck_read_req;

typedef struct {
    int verify;        /* hash every touched shard file in full while reading; a mismatch fails
                          the whole read with ZR_ECORRUPT naming the file */
    unsigned jobs;     /* files read in parallel (threads), >= 1 */
    zck_io_opts io;
} zck_read_opts;
#define ZCK_READ_OPTS_INIT {.verify = 1, .jobs = 2, .io = ZCK_IO_OPTS_INIT}

/* Fill each request's dst from the shards, whatever their layout. When the call fails the
 * contents of every dst are unspecified: nothing read may be used. opts may be NULL. */
int zck_reader_read(zck_reader *r, const zck_read_req *reqs, size_t n_reqs,
                    const zck_read_opts *opts);
/* One range, no hashing. */
int zck_reader_read_range(zck_reader *r, size_t group, size_t state, uint64_t start,
                          uint64_t count, void *dst);

/* ---------------------------------------------------------------- verification */

typedef enum {
    ZCK_PROB_MANIFEST,   /* manifest.json missing, unreadable or invalid */
    ZCK_PROB_MISSING,    /* a listed shard file is absent */
    ZCK_PROB_TRUNCATED,  /* a shard file is shorter than listed */
    ZCK_PROB_SIZE,       /* a shard file is longer than listed */
    ZCK_PROB_HASH,       /* sha256 differs from the manifest */
    ZCK_PROB_UNLISTED,   /* a file in the directory the manifest does not name */
    ZCK_PROB_SUMS,       /* SHA256SUMS missing or disagreeing with the manifest */
    ZCK_PROB_IO,         /* a file could not be read */
    ZCK_PROB_COVERAGE,   /* a tensor not covered exactly by its parts (other formats) */
    ZCK_PROB_UNSAFE,     /* a pickle naming code (other formats): refused, never run */
} zck_problem_kind;

typedef struct {
    zck_problem_kind kind;
    const char *file;    /* relative to the checkpoint directory */
    const char *detail;  /* one line: expected vs found */
} zck_problem;

/* A piece of a shard as zck_verify reads it to hash it (zck_verify_opts.each): elements
 * [start, start + count) of (group, state), as stored. */
typedef struct {
    size_t shard;        /* index in the manifest's shard list */
    size_t group, state;
    uint64_t start, count;
    const void *data;    /* count * the state's dtype size bytes; valid during the call only */
} zck_piece;

typedef struct {
    int quick;           /* skip hashing */
    unsigned jobs;       /* files hashed in parallel */
    zck_io_opts io;
    zck_progress progress; /* bytes hashed */
    int cheap_first;     /* hash nothing once a cheaper check (manifest, its model section
                            against its layout, SHA256SUMS, presence, sizes) found a problem:
                            a refusal at once, not after hours of hashing */
    /* the caller's own cheap check (a run's model against the checkpoint's layout), called with
     * the checkpoint open when the cheap checks found nothing, before any hashing; its error
     * ends zck_verify with that error (no report). NULL: none */
    int (*precheck)(void *ctx, const zck_reader *rd);
    void *precheck_ctx;
    /* one pass for a caller that needs the data too (consolidate): every shard's bytes, as
     * they are read to be hashed, cut into the pieces of its extents (padding is hashed, not
     * handed over), a shard's pieces in file order, several shards' on up to jobs threads at
     * once. The pieces come before their shard's hash is known: nothing of them may be trusted
     * unless the report is empty. A non-zero return ends zck_verify with that error (no
     * report). NULL: none */
    int (*each)(void *ctx, const zck_piece *p);
    void *each_ctx;
} zck_verify_opts;
#define ZCK_VERIFY_OPTS_INIT {.quick = 0, .jobs = 2, .io = ZCK_IO_OPTS_INIT}

typedef struct zck_report zck_report;
/* Check a checkpoint (directory, or run directory through latest): the manifest (and its model
 * section against its layout, when it names a known family), SHA256SUMS, unlisted files,
 * presence and sizes, then (unless quick) the hashes. Returns 0 when the check ran, whatever it
 * found; the report lists each problem. Negative only when the check itself could not run (path
 * absent: ZR_ENOTFOUND; the directory removed while it was read, a prune by retention:
 * ZR_ENOTFOUND saying so, no verdict; out of memory). A read the system refuses (EIO, EACCES,
 * EMFILE) is a problem of kind ZCK_PROB_IO, never of damage. */
int zck_verify(zck_report **out, const char *path, const zck_verify_opts *opts);
size_t zck_report_count(const zck_report *rep);
const zck_problem *zck_report_get(const zck_report *rep, size_t i);
uint64_t zck_report_bytes_hashed(const zck_report *rep);
/* 1 when cheap_first left shards unhashed (a cheaper check found a problem first) */
int zck_report_hash_skipped(const zck_report *rep);
const char *zck_problem_kind_name(zck_problem_kind k); /* "missing", "hash mismatch", ... */
void zck_report_free(zck_report *rep);

/* Streaming SHA-256 (OpenSSL EVP). hex finalizes: call once. */
typedef struct zck_sha256 zck_sha256;
int zck_sha256_new(zck_sha256 **out);
void zck_sha256_update(zck_sha256 *h, const void *p, size_t n);
void zck_sha256_hex(zck_sha256 *h, char out[65]);
void zck_sha256_free(zck_sha256 *h);

/* ---------------------------------------------------------------- reshard */

typedef struct {
    size_t buf_bytes;    /* working memory for data, all threads together (default 256 MiB) */
    unsigned jobs;       /* new shards written in parallel */
    int verify_source;   /* hash every source shard, on a thread beside the writers; nothing
                            is committed unless it passes (default on) */
    zck_progress progress;
} zck_reshard_opts;
#define ZCK_RESHARD_OPTS_INIT {.buf_bytes = (size_t)256 << 20, .jobs = 2, .verify_source = 1}

/*
 * Write the checkpoint at src (directory, or run directory through latest) again for a world
 * of `world` ranks, as a new checkpoint of the same step in run directory out_run_dir (created
 * when missing), committed atomically with its latest. Each new rank's shard holds its
 * partition of every (group, state) in layout order, one extent each: what a save by that
 * world writes, so W -> W' -> W gives back byte-identical shards. Streaming: memory stays
 * within buf_bytes plus small I/O rings whatever the checkpoint size. *out (may be NULL) is the
 * new checkpoint's path. ZR_ECORRUPT when the source does not verify (first problem named),
 * ZR_EEXIST when out_run_dir already has that step.
 */
int zck_reshard(char **out, const char *src, const char *out_run_dir, uint32_t world,
                const zck_reshard_opts *opts);

/* ---------------------------------------------------------------- diff */

typedef struct {
    double atol, rtol;   /* match when |a - b| <= atol + rtol * |b| (or the bits are equal) */
    int verify;          /* verify both checkpoints (hashes) before comparing (default on) */
    size_t buf_bytes;    /* working memory (default 64 MiB) */
    zck_progress progress;
} zck_diff_opts;
#define ZCK_DIFF_OPTS_INIT {.atol = 0.0, .rtol = 0.0, .verify = 1, .buf_bytes = (size_t)64 << 20}

typedef struct {
    char *tensor, *state;
    uint64_t numel;
    uint64_t n_differ;   /* elements outside the tolerance */
    double max_abs;      /* largest |a - b| (NaN when one side is NaN and the other not) */
    int match;
    char *note;          /* "" or why they cannot be compared ("only in A", "shape ...") */
} zck_diff_entry;

typedef struct {
    zck_diff_entry *e;
    size_t n;
    int all_match;
} zck_diff;

/* Compare two checkpoints tensor by tensor and state by state, whatever their world sizes
 * and shard layouts (values are compared as doubles). */
int zck_diff_run(zck_diff **out, const char *a, const char *b, const zck_diff_opts *opts);
void zck_diff_free(zck_diff *d);

/* Value of element i of an array of dtype t, as a double. */
double zck_dtype_get_f64(zck_dtype t, const void *base, size_t i);

/* SHA-256 of a whole file as 64 hex characters (+ NUL) through the library's I/O engine. */
int zck_sha256_file(char out[65], const char *path, const zck_io_opts *opts);

/* ================================================================ advanced
 *
 * Below: the engine's and the tests' tools, not the checkpoint API a client programs against.
 * They may change between minor versions: the fault hook (tests), the report plumbing of
 * checkers other than zck_verify (formats' archive verifier), and the swap files of core's
 * NVMe offload.
 */

/* ---------------------------------------------------------------- fault injection (tests) */

/* Every storage operation of the library passes through a hook that tests replace to fail the
 * Nth write, fsync or rename. Return 0 to let the operation happen, or a positive errno to make
 * it fail with that error. */
typedef enum {
    ZCK_OP_OPEN, ZCK_OP_WRITE, ZCK_OP_READ, ZCK_OP_FSYNC, ZCK_OP_RENAME, ZCK_OP_MKDIR,
    ZCK_OP_UNLINK,
    ZCK_OP_OPEN_DIRECT, /* the O_DIRECT attempt of a shard open: EINVAL acts as a filesystem
                           that refuses O_DIRECT, exercising the buffered fallback */
    ZCK_OP_COUNT
} zck_op;
typedef int (*zck_fault_fn)(zck_op op, const char *path, void *ctx);
/* Install a hook for the whole process (NULL removes it). Not thread-safe against running I/O. */
void zck_fault_set(zck_fault_fn fn, void *ctx);

/* ---------------------------------------------------------------- reports of other checkers */

/* Problems found by other checkers (an archive verifier) go into the same kind of report. */
int zck_report_new(zck_report **out);
int zck_report_add(zck_report *rep, zck_problem_kind kind, const char *file, const char *fmt,
                   ...) __attribute__((format(printf, 4, 5)));
void zck_report_add_bytes_hashed(zck_report *rep, uint64_t n);

/* ---------------------------------------------------------------- swap files (offload) */

/*
 * A scratch file for offloaded training state (core's NVMe swapper): created fresh at path
 * (a file already there, a stale swap file, is replaced, never reused), `bytes` long and
 * allocated at once (a full filesystem fails here, naming the file), opened O_DIRECT where the
 * filesystem allows it (else buffered, with the library's one-line warning). Reads and writes
 * go between the file and the caller's buffers through libaio, split into requests of at most
 * `block` bytes, at most `depth` in flight; buf, len and off must be multiples of
 * ZCK_FILE_ALIGN. A transfer is queued at once (waiting only for room in the queue) and is
 * complete when zck_swap_wait covers its ticket; the buffer must stay untouched until then. A
 * failed or short transfer fails that wait and every later call (ZR_EIO naming the file and the
 * offset). One thread at a time.
 */
typedef struct zck_swap zck_swap;
int zck_swap_open(zck_swap **out, const char *path, uint64_t bytes, unsigned depth,
                  size_t block);
int zck_swap_read(zck_swap *s, void *buf, size_t len, uint64_t off, uint64_t *ticket);
int zck_swap_write(zck_swap *s, const void *buf, size_t len, uint64_t off, uint64_t *ticket);
/* Wait for every transfer queued up to and including ticket. */
int zck_swap_wait(zck_swap *s, uint64_t ticket);
/* The file is still at its path (same inode) and at its full size: else ZR_EIO, "vanished" or
 * "truncated", naming it. */
int zck_swap_check(zck_swap *s);
int zck_swap_direct(const zck_swap *s);
uint64_t zck_swap_size(const zck_swap *s);
const char *zck_swap_path(const zck_swap *s);
/* Wait for what is in flight, close, and remove the file when remove is set. */
int zck_swap_close(zck_swap *s, int remove);

#ifdef __cplusplus
}
#endif
#endif
