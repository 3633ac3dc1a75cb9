/*
 * foreign.h: internal interface of the readers of other frameworks' checkpoints (not for cli/):
 * the zip container of torch.save (torchzip.c) and a restricted unpickler (pickle.c) that builds
 * plain values and never calls anything. DeepSpeed and DCP readers are built on these two.
 * Names with a double underscore are internal.
 *
 * Facts about the formats, with their sources: docs/FORMAT.md, "Foreign checkpoints".
 */
#ifndef ZFMT_FOREIGN_H
#define ZFMT_FOREIGN_H

#include "fmtutil.h"
#include "zfmt.h"

#include <stdint.h>

/* ---------------------------------------------------------------- torch.save zip (torchzip.c) */

typedef struct {
    char *name;        /* the whole name, root folder included ("archive/data.pkl") */
    uint64_t data_off; /* where the stored bytes start, from the start of the zip */
    uint64_t size;     /* bytes (stored: compressed = uncompressed) */
    uint32_t crc;      /* the central directory's CRC-32 */
} zfmt__zip_entry;

typedef struct {
    char *path;  /* for messages */
    int fd;      /* owned when own_fd */
    int own_fd;
    uint64_t base, len; /* the zip is bytes [base, base + len) of the file */
    char *root;         /* "archive" or the file's stem: every record is root/... */
    zfmt__zip_entry *e; /* in central-directory order */
    size_t n;
} zfmt__zip;

/* Open a torch.save zip file (the whole file), or one that is bytes [off, off + len) of fd (a
 * DCP item; fd stays the caller's). Sizes and offsets come from the central directory (ZIP64
 * records understood); every record must be stored (not compressed), unencrypted, with a local
 * header naming it at its offset, its bytes inside the zip and before the central directory,
 * no two records overlapping or sharing a name, every name under one root folder. ZR_ECORRUPT
 * naming the file and what is wrong (a truncated file: "no end of central directory");
 * ZR_EIO for a read error. */
int zfmt__zip_open(zfmt__zip **out, const char *path);
int zfmt__zip_open_slice(zfmt__zip **out, int fd, const char *path, uint64_t off, uint64_t len);
void zfmt__zip_free(zfmt__zip *z);
/* The record root/rel, or NULL. */
const zfmt__zip_entry *zfmt__zip_find(const zfmt__zip *z, const char *rel);
/* n bytes of record e from byte off of it. ZR_ECORRUPT when past its end. */
int zfmt__zip_read(const zfmt__zip *z, const zfmt__zip_entry *e, uint64_t off, void *buf,
                   size_t n);
/* The whole record into a malloc'ed buffer (+1 NUL byte), refused above max bytes. */
int zfmt__zip_slurp(const zfmt__zip *z, const zfmt__zip_entry *e, size_t max, char **out);
/* Stream record e and compare its CRC-32 with the central directory's (a CRC of 0: none was
 * recorded, torch.serialization.set_crc32_options(False)). ZR_ECORRUPT naming the
 * file and the record on a mismatch. */
int zfmt__zip_check_crc(const zfmt__zip *z, const zfmt__zip_entry *e);
/* CRC-32 (ISO-HDLC, zip's) of n bytes, continuing from crc (0 to start). */
uint32_t zfmt__crc32(uint32_t crc, const void *data, size_t n);

/* ---------------------------------------------------------------- restricted unpickler (pickle.c) */

typedef enum {
    ZFMT__PK_NONE,
    ZFMT__PK_BOOL,
    ZFMT__PK_INT,
    ZFMT__PK_FLOAT,
    ZFMT__PK_STR,     /* UTF-8 text (s, len) */
    ZFMT__PK_BYTES,   /* (s, len) */
    ZFMT__PK_LIST,    /* items[n] */
    ZFMT__PK_TUPLE,   /* items[n]; torch.Size too */
    ZFMT__PK_DICT,    /* items[n]: key, value, key, value ... in insertion order */
    ZFMT__PK_SET,     /* items[n] */
    ZFMT__PK_GLOBAL,  /* s = "module.name", one of the allowlist */
    ZFMT__PK_OBJECT,  /* an instance of an allowed class, never constructed: cls (a GLOBAL), args
                         (a TUPLE), state (BUILD's argument, or NULL) */
    ZFMT__PK_STORAGE, /* a torch storage: s = its record key, dtype, numel (elements) */
    ZFMT__PK_TENSOR,  /* a tensor view: storage, dtype, offset, ndim, size[], stride[] */
} zfmt__pk_kind;

typedef struct zfmt__pv zfmt__pv;
struct zfmt__pv {
    zfmt__pk_kind kind;
    int64_t i;       /* BOOL, INT; STORAGE: numel; TENSOR: storage offset (elements) */
    double f;        /* FLOAT */
    char *s;         /* STR, BYTES, GLOBAL, STORAGE's key */
    size_t len;      /* of s */
    zfmt__pv **items;
    size_t n, cap;   /* items (DICT: keys and values, 2 per pair) */
    zfmt__pv *cls, *args, *state, *storage;
    zck_dtype dtype; /* STORAGE, TENSOR */
    int dtype_known; /* 0: a dtype zero does not read (complex, bool, ...) */
    const char *dtype_name; /* torch's name ("float32", "bool") */
    size_t ndim;
    uint64_t size[ZCK_MAX_DIMS];
    int64_t stride[ZCK_MAX_DIMS];
};

typedef struct zfmt__pickle zfmt__pickle; /* owns every value it built */

/* Unpickle data[0, n) (protocols 2 to 5, the opcodes Python's pickler writes for plain data).
 * Every GLOBAL must be on the allowlist (torch's weights_only globals, the DeepSpeed and DCP
 * classes of docs/FORMAT.md); any other is refused naming it ("pickle global 'os.system' is not
 * allowed"), and nothing is ever called or executed: a REDUCE or NEWOBJ of an allowed class
 * builds an OBJECT, torch's rebuild functions a TENSOR, OrderedDict a DICT, set a SET,
 * _codecs.encode BYTES. Memory is bounded by max_bytes (values, memo, stack). what names the
 * source in messages ("x.pt: data.pkl"). ZR_ECORRUPT / ZR_EUNSUPPORTED with the byte offset. */
int zfmt__pickle_load(zfmt__pickle **out, const void *data, size_t n, const char *what,
                      size_t max_bytes);
const zfmt__pv *zfmt__pickle_root(const zfmt__pickle *p);
void zfmt__pickle_free(zfmt__pickle *p);

/* Lookups on values (NULL when absent or of another kind) */
const zfmt__pv *zfmt__pv_get(const zfmt__pv *dict, const char *key); /* str key */
const zfmt__pv *zfmt__pv_attr(const zfmt__pv *obj, const char *key); /* OBJECT's state dict */
/* An integer: INT, BOOL, or an int-valued enum OBJECT (ZeroStageEnum(2)); 0 if not one */
int zfmt__pv_int(const zfmt__pv *v, int64_t *out);
/* 1 when v is an OBJECT whose class is module.name */
int zfmt__pv_is(const zfmt__pv *v, const char *global);
/* A one-line description for messages and inspect ("tensor f32 [16, 48]", "dict of 3") */
void zfmt__pv_describe(const zfmt__pv *v, char *buf, size_t n);

/* torch's dtype name ("float32", "bfloat16") as ours: 1, or 0 for one zero does not read */
int zfmt__torch_dtype(zck_dtype *out, const char *name);

/* torch's names of a dtype ours: "float32" and its storage class "FloatStorage";
 * ZR_EUNSUPPORTED for one torch has no storage class of. */
int zfmt__torch_dtype_names(const char **dtype, const char **storage, zck_dtype t);

/* A pickle writer (pickle.c): opcodes appended to a growing buffer, in the subset of protocol 2
 * that every later protocol reads too (GLOBAL by "module\nname\n", BINUNICODE, BININT*,
 * LONG1, BINFLOAT); no memo. Out of memory sets oom, checked once at the end. */
typedef struct {
    unsigned char *b;
    size_t n, cap;
    int oom;
} zfmt__pkw;
void zfmt__pkw_raw(zfmt__pkw *w, const void *p, size_t n);
void zfmt__pkw_op(zfmt__pkw *w, int op); /* one opcode byte: '(' MARK, 't' TUPLE, ... */
void zfmt__pkw_int(zfmt__pkw *w, int64_t v);
void zfmt__pkw_float(zfmt__pkw *w, double v);
void zfmt__pkw_str(zfmt__pkw *w, const char *s);
void zfmt__pkw_global(zfmt__pkw *w, const char *module, const char *name);
/* a tuple of n non-negative ints */
void zfmt__pkw_ints(zfmt__pkw *w, size_t n, const uint64_t *v);
void zfmt__pkw_free(zfmt__pkw *w);

/* A torch.save zip written into an output file from byte base (torchzip.c): records under
 * "archive/", stored, each record's data 64-byte aligned in the zip as torch aligns it, then
 * the central directory. Up to 16 records; each below 4 GiB (no ZIP64: ZR_EUNSUPPORTED). */
typedef struct {
    zfmt__out *o;
    uint64_t base, at; /* the zip's start in o, the next byte (relative) */
    size_t n;
    struct {
        char name[64];
        uint64_t off, size;
        uint32_t crc;
    } e[16];
} zfmt__zipw;
void zfmt__zipw_init(zfmt__zipw *z, zfmt__out *o, uint64_t base);
/* A record of size bytes: its local header written; *data_at: where in o its bytes go (the
 * caller writes them there, then zfmt__zipw_end with their CRC-32). */
int zfmt__zipw_begin(zfmt__zipw *z, const char *name, uint64_t size, uint64_t *data_at);
int zfmt__zipw_end(zfmt__zipw *z, uint32_t crc);
/* A whole record from memory. */
int zfmt__zipw_record(zfmt__zipw *z, const char *name, const void *data, size_t n);
/* The central directory: *len the zip's bytes. */
int zfmt__zipw_finish(zfmt__zipw *z, uint64_t *len);

/* ---------------------------------------------------------------- PyTorch DCP (dcp.c) */

typedef struct zfmt__dcp zfmt__dcp;
/* Parse dir/.metadata: its items and chunks, each chunk's file and byte range. Problems in
 * storage_data that leave the metadata usable (an entry matching no chunk, two entries for one)
 * go into rep; an unusable .metadata is ZR_ECORRUPT (a refused global named), a missing one
 * ZR_ENOTFOUND. */
int zfmt__dcp_open(zfmt__dcp **out, const char *dir, zck_report *rep);
void zfmt__dcp_free(zfmt__dcp *d);
/* Every check of dcp.c's head comment, problems into rep; negative only when the check could
 * not run. With keep, the parsed checkpoint is handed out (NULL when .metadata was unusable),
 * so that a caller reading it next does not parse .metadata again. */
int zfmt__dcp_verify(zck_report *rep, const char *dir, const zck_verify_opts *o,
                     zfmt__dcp **keep);
/* The one tensor of a DCP tensor item (a torch.save zip), checked: dtype dt, sizes, its storage
 * record's size. *pk owns it (free it also on failure). */
int zfmt__dcp_item_tensor(zfmt__zip *z, const char *fqn, zck_dtype dt, size_t nd,
                          const uint64_t *size, zfmt__pickle **pk, const zfmt__pv **t);

/* Items in fqn order; item i's name, dtype and shape: 0 for a tensor, 1 for a bytes item (not
 * a tensor), ZR_EUNSUPPORTED for a dtype zero does not read. */
size_t zfmt__dcp_n(const zfmt__dcp *d);
int zfmt__dcp_tensor(const zfmt__dcp *d, size_t i, const char **fqn, zck_dtype *dt,
                     size_t *ndim, const uint64_t **size);
size_t zfmt__dcp_chunks(const zfmt__dcp *d, size_t i);
/* The value of bytes item i (a torch.save'd Python object: a float, a tuple) through the
 * restricted unpickler: zfmt__pickle_root(*pk). */
int zfmt__dcp_value(const zfmt__dcp *d, size_t i, zfmt__pickle **pk);
/* The index of the item named fqn, or -1. */
long zfmt__dcp_find(const zfmt__dcp *d, const char *fqn);
/* Tensor item i, row-major in its own dtype, into dst (numel x its size). */
int zfmt__dcp_read(const zfmt__dcp *d, size_t i, void *dst);
const char *zfmt__dcp_dtype_name(const zfmt__dcp *d, size_t i); /* torch's name */
/* Tensor item i, row-major, into o from byte base, through buf (cap bytes). */
int zfmt__dcp_copy(const zfmt__dcp *d, size_t i, zfmt__out *o, uint64_t base, void *buf,
                   size_t cap);

/* ---------------------------------------------------------------- DeepSpeed ZeRO (deepspeed.c) */

typedef struct {
    const char *name; /* as param_shapes has it (the module's names: Hugging Face's) */
    size_t group, ndim;
    uint64_t shape[ZCK_MAX_DIMS], numel;
    uint64_t off; /* stages 1-2: in its group's whole flat; stage 3: in every rank's flat */
} zfmt__ds_param;

typedef struct zfmt__ds zfmt__ds;
/* Open path (a save_dir with `latest`, or a tag folder) and check it (deepspeed.c's head
 * comment; CRC-32s when crc). Problems go into rep: then 1 and *out NULL. Negative when the
 * check could not run. */
int zfmt__ds_open(zfmt__ds **out, const char *path, zck_report *rep, int crc,
                  const zck_progress *progress);
void zfmt__ds_free(zfmt__ds *d);
int zfmt__ds_verify(zck_report *rep, const char *path, const zck_verify_opts *o);
/* The CRC-32 of every record the fp32 weights come from (what consolidate reads), the ranks on
 * two threads; a mismatch into rep. */
int zfmt__ds_check_weights(const zfmt__ds *d, zck_report *rep);
/* The trainable parameters in param_shapes order (borrowed). */
size_t zfmt__ds_params(const zfmt__ds *d, const zfmt__ds_param **out);
int zfmt__ds_stage(const zfmt__ds *d);
int zfmt__ds_universal(const zfmt__ds *d);    /* a universal checkpoint folder */
int zfmt__ds_bf16(const zfmt__ds *d);         /* the bf16_ optimizer files */
const char *zfmt__ds_tag(const zfmt__ds *d);  /* "" when opened at the tag folder */
uint32_t zfmt__ds_world(const zfmt__ds *d);
int64_t zfmt__ds_step(const zfmt__ds *d);            /* global_steps */
const zfmt__pv *zfmt__ds_model_states(const zfmt__ds *d); /* the model file's dict */
/* The torch optimizer's step count (every group's, which must agree: AdamW's bias correction
 * continues from it) and its param_groups list (rank 0's, borrowed; NULL when absent). */
int zfmt__ds_adam(const zfmt__ds *d, int64_t *step, const zfmt__pv **param_groups);
/* Elements [from, from + n) of parameter i, in row-major order, into dst: the fp32 weights
 * (which NULL) or the AdamW moment "exp_avg" / "exp_avg_sq". */
int zfmt__ds_read(const zfmt__ds *d, size_t i, const char *which, uint64_t from, float *dst,
                  uint64_t n);

/* Helpers deepspeed.c shares with ds_universal.c. A torch.save file dir/file: zip, CRC-32 of
 * data.pkl, pickle; problems into rep named by file (1: reported). */
int zfmt__ds_load(zfmt__zip **z, zfmt__pickle **pk, const char *dir, const char *file,
                  zck_report *rep);
/* The CRC-32 of every record of z, a mismatch into rep named by file; *hashed += bytes. */
int zfmt__ds_crc_all(const zfmt__zip *z, const char *file, zck_report *rep, uint64_t *hashed);
/* The value of an optimizer's "step": an int, a float, or a 0-d float32 / float64 / int64
 * tensor of zip z (torch keeps it a tensor since 1.12); ZR_ECORRUPT naming file otherwise. */
int zfmt__ds_step_value(const zfmt__zip *z, const char *file, const zfmt__pv *v, int64_t *out);
/* 1 when dir holds a DeepSpeed states file (*_model_states.pt, *_optim_states.pt) (foreign.c) */
int zfmt__ds_files_in(const char *dir);

/* ---------------------------------------------------------------- DeepSpeed universal
 * (ds_universal.c): a folder of ds_to_universal.py, opened by zfmt__ds_open, which reads its
 * model states and then delegates to these. */

typedef struct zfmt__dsu zfmt__dsu;
/* 1 when dir is one: dir/zero/optimizer_state.pt, or a zero/ folder beside DeepSpeed files */
int zfmt__dsu_is(const char *dir);
/* Check dir's zero/ folder against the parameters p[np] (borrowed: they must outlive *out) of
 * the model states, which say world ranks (ds_universal.c's head comment; CRC-32s when crc,
 * their bytes added to *hashed). Problems into rep: then 1 and *out NULL. */
int zfmt__dsu_open(zfmt__dsu **out, const char *dir, const zfmt__ds_param *p, size_t np,
                   uint32_t world, zck_report *rep, int crc, uint64_t *hashed,
                   const zck_progress *progress);
void zfmt__dsu_free(zfmt__dsu *u);
int zfmt__dsu_stage(const zfmt__dsu *u); /* optimizer_state.pt's zero_stage */
/* zfmt__ds_read, zfmt__ds_adam and zfmt__ds_check_weights of a universal folder */
int zfmt__dsu_read(zfmt__dsu *u, size_t i, const char *which, uint64_t from, float *dst,
                   uint64_t n);
int zfmt__dsu_adam(const zfmt__dsu *u, int64_t *step, const zfmt__pv **param_groups);
int zfmt__dsu_check_weights(const zfmt__dsu *u, zck_report *rep);

/* ---------------------------------------------------------------- either (foreign.c) */

/* Open a DeepSpeed (*ds) or DCP (*dcp) checkpoint after its verification: every check, the
 * CRC-32 of every record (DeepSpeed without moments: only those the fp32 weights come from);
 * the first problem found is ZR_ECORRUPT naming it and the count. */
int zfmt__foreign_open(const char *path, int moments, const zck_progress *progress,
                       zfmt__ds **ds, zfmt__dcp **dcp);

#endif
