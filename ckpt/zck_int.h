/*
 * zck_int.h: internal interface shared by the files of ckpt/. Not for use outside ckpt/ except
 * by tests and fuzz targets (names with a double underscore are internal).
 */
#ifndef ZCK_INT_H
#define ZCK_INT_H

#include "zck.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* Shard files hold little-endian element bytes, copied as they are in memory. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "zero's checkpoint format is little-endian; big-endian hosts are not supported yet"
#endif
#include <sys/types.h>

/* ---------------------------------------------------------------- layout internals */

typedef struct {
    char *name;
    zck_dtype dtype;
    size_t ndim;
    uint64_t shape[ZCK_MAX_DIMS];
    uint64_t offset, numel;
} zck__tensor;

typedef struct {
    char *name;
    uint64_t numel;
    zck__tensor *t;
    size_t nt, capt;
} zck__group;

typedef struct {
    char *name;
    zck_dtype dtype;
} zck__state;

struct zck_layout {
    zck__group *g;
    size_t ng, capg;
    zck__state *s;
    size_t ns, caps;
    uint32_t palign;
    /* set while a parser adds many names: the adders skip their (linear) uniqueness check and
     * the parser calls zck__layout_check_unique once at the end */
    bool unchecked;
};

/* Largest group the format accepts, in elements (keeps every byte count far from overflow). */
#define ZCK__MAX_NUMEL ((uint64_t)1 << 50)

bool zck__name_ok(const char *name);          /* state names: [A-Za-z0-9_.-]{1,64} */
bool zck__file_name_ok(const char *name);     /* plain file name inside a checkpoint */
bool zck__is_sha256_hex(const char *s);       /* 64 lowercase hex digits */
/* Every state, group and tensor name declared once (sorted, O(n log n)); ZR_EINVAL naming the
 * first duplicate. */
int zck__layout_check_unique(const zck_layout *L);
/* Sort n strings (qsort with strcmp; n may be 0) and return the first one that appears twice,
 * or NULL. */
const char *zck__first_duplicate(const char **v, size_t n);

/* ---------------------------------------------------------------- shards and manifests */

typedef struct {
    uint32_t group, state;
    uint64_t start, count;  /* elements */
    uint64_t offset;        /* byte offset in the shard file, multiple of ZCK_FILE_ALIGN */
} zck__extent;

struct zck_shard {
    char *file;
    uint32_t rank;
    uint64_t bytes;
    char sha256[65];
    zck__extent *ext;
    size_t next, capext;
};

int zck__shard_add_extent(zck_shard *s, const zck__extent *e);
/* Shard <-> Jansson object; ctx names the object in messages ("manifest.json: shards[2]"). */
struct json_t;
struct json_t *zck__shard_json(const zck_shard *s);
int zck__shard_parse(zck_shard **out, struct json_t *obj, const char *ctx);

/* One extent of a (group, state), located: sorted by start in zck_manifest.index. */
typedef struct {
    uint64_t start, count, offset;
    uint32_t shard;
} zck__extref;

/* An extra file of the manifest (zck_extra_file) */
typedef struct {
    char *file;
    uint64_t bytes;
    char sha256[65];
} zck__file;
struct json_t;
/* Parse / make the manifest's "files" array (files.c); names checked against the shards. */
int zck__files_parse(zck__file **out, size_t *n, struct json_t *arr, const char *what);
struct json_t *zck__files_json(const zck__file *f, size_t n);
void zck__files_free(zck__file *f, size_t n);
/* Write the commit's extra files into the staging directory (fsynced) and describe them. */
int zck__files_write(zck__file **out, const char *staging, const zck_extra_file *f, size_t n);
/* The extra files of the checkpoint r reads, read verified into co->files (a new checkpoint of
 * the same run keeps them: reshard, consolidate); zck__files_carry_free releases them. */
int zck__files_carry(zck_commit_opts *co, const struct zck_reader *r);
void zck__files_carry_free(zck_commit_opts *co);
/* Check a name for an extra file (error code naming it, what says where). */
int zck__file_name_check(const char *name, const char *what, int code);

typedef struct {
    char version[16];
    int major, minor;
    uint64_t step;
    char *created, *producer;
    uint32_t world;
    int stage;
    char *model_json, *training_json;  /* compact JSON object text */
    zck_layout *L;
    zck_shard **shards;
    size_t nshards;
    zck__file *files;      /* extra files ("files", format 1.1) */
    size_t nfiles;
    /* filled by zck__manifest_index: extents of (g, s) at index[g * ns + s] */
    zck__extref **index;
    size_t *index_n;
} zck_manifest;

/* Parse and completely validate manifest text; what names the file in messages. */
int zck__manifest_parse(zck_manifest **out, const char *text, size_t len, const char *what);
/* Check shard list against the layout (ranks, names, sizes, extents, coverage) and build the
 * extent index. Messages start with what. */
int zck__manifest_index(zck_manifest *m, const char *what);
/* Resolve a checkpoint directory, or a run directory through its latest file, to the
 * checkpoint directory (malloc'ed). */
int zck__resolve(char **out, const char *path);
/* Read and parse dir/manifest.json. */
int zck__manifest_load(zck_manifest **out, const char *dir);
/* Serialize (pretty, stable key order). */
int zck__manifest_dump(char **out, const zck_manifest *m);
/* the manifest a reader holds (borrowed) */
const zck_manifest *zck__reader_manifest(const zck_reader *r);
void zck__manifest_free(zck_manifest *m);

/* zck_verify, with any problem turned into ZR_ECORRUPT naming the first one */
int zck__verify_or_fail(const char *path, unsigned jobs, const zck_progress *progress);
/* ZR_ECORRUPT naming the field when parsing the manifest text would cost more than its real
 * content does (mbound.c: unknown bulk); 0 otherwise, and for text that is not JSON */
int zck__manifest_bound(const char *text, size_t len, const char *what);
/* A reader over m (not owned: unborrow frees the reader only), for callbacks given a reader */
int zck__reader_borrow(zck_reader **out, const char *dir, zck_manifest *m);
void zck__reader_unborrow(zck_reader *r);
/* dir (a checkpoint directory) is gone: removed while it was read (a prune by retention) */
bool zck__vanished(const char *dir);
/* ZR_ENOTFOUND saying that dir vanished while it was read, with no verdict of damage */
int zck__vanished_err(const char *dir);
/* An error of reading a checkpoint that proves damage (ZR_ECORRUPT, ZR_EVERSION, ZR_ENOTFOUND:
 * what is on disk is wrong or absent), as opposed to one of the system (out of memory, a read
 * refused, too many open files), which says nothing about the checkpoint. */
bool zck__is_damage(int rc);

/* ---------------------------------------------------------------- storage substrate */

/* fault hook: returns 0, or a positive errno the operation must fail with */
int zck__fault(zck_op op, const char *path);

/* SHA-256 (OpenSSL EVP) */
typedef struct zck__sha zck__sha;
int zck__sha_new(zck__sha **out);
void zck__sha_update(zck__sha *h, const void *p, size_t n);
void zck__sha_hex(zck__sha *h, char out[65]);  /* finalizes: call once */
void zck__sha_free(zck__sha *h);

/* Progress of work spread over threads: bytes done, reported by the owner thread only. */
typedef struct {
    _Atomic uint64_t done;
    uint64_t total, last;
    pthread_t owner;
    zck_progress progress;
    const char *what;
} zck__hash_tick;
void zck__hash_tick_add(zck__hash_tick *t, uint64_t n);

/* The libaio I/O engine: one file, a ring of aligned buffers, several requests in flight. */
typedef struct zck__io zck__io;
enum { ZCK__IO_READ = 0, ZCK__IO_WRITE = 1 };
/* WRITE creates the file exclusively (O_EXCL). Falls back to buffered I/O where O_DIRECT is
 * refused (tmpfs) with one warning per process. */
int zck__io_open(zck__io **out, const char *path, int mode, const zck_io_opts *o);
int zck__io_direct(const zck__io *io);
size_t zck__io_buf_bytes(const zck__io *io);
/* Write side: the buffer to fill next (waits until it is free). */
int zck__io_wbuf(zck__io *io, unsigned char **out);
/* Submit the buffer returned by the last zck__io_wbuf: len bytes (multiple of ZCK_FILE_ALIGN)
 * at file offset off. */
int zck__io_wsubmit(zck__io *io, size_t len, uint64_t off);
int zck__io_drain(zck__io *io);
/* Write side: give the file its final size (the engine allocates ahead of the writes). */
int zck__io_truncate(zck__io *io, uint64_t size);
int zck__io_fsync(zck__io *io);
/* Read side: stream spans [a, b) (a aligned; b aligned or the end of the file) in order,
 * chunk by chunk; fn sees every byte once, in increasing offset order. A span with a dst is
 * read straight into dst (no copy through the ring): then dst and b - a must be multiples of
 * ZCK_FILE_ALIGN, and fn's p points into dst. */
typedef struct {
    uint64_t a, b;
    unsigned char *dst;
} zck__span;
typedef int (*zck__chunk_fn)(void *ctx, uint64_t off, const unsigned char *p, size_t len);
int zck__io_read_spans(zck__io *io, const zck__span *spans, size_t n, zck__chunk_fn fn,
                       void *ctx);
/* SHA-256 of a whole file through the engine, ticking tick (may be NULL); fn (may be NULL) sees
 * every chunk after it is hashed, in file order (the same pass): its error stops the read. */
int zck__sha256_file_ticked(char out[65], const char *path, const zck_io_opts *opts,
                            zck__hash_tick *tick, zck__chunk_fn fn, void *fn_ctx);
int zck__io_size(zck__io *io, uint64_t *out);
/* Close (and report a close error); always frees. */
int zck__io_close(zck__io *io);
/* libaio's io_getevents for at least min of up to max events into ev, retried on EINTR (io.c,
 * the libaio adapter, for itself and swap.c): their count, or the error naming path. */
struct io_context;
struct io_event;
int zck__aio_getevents(struct io_context *ctx, long min, long max, struct io_event *ev,
                       const char *path);
/* Prepare cb as a pwrite (write) or pread of len bytes of buf at off, carrying data to its
 * completion, and io_submit it: 1, or libaio's negative errno. */
struct iocb;
int zck__aio_submit(struct io_context *ctx, struct iocb *cb, int fd, int write, void *buf,
                    size_t len, uint64_t off, void *data);
/* After io_submit refused an O_DIRECT request (EINVAL): clear O_DIRECT on fd and warn once;
 * false when fd cannot be switched. */
bool zck__aio_to_buffered(int fd, const char *path);
/* The one-line warning (once per process) that a filesystem refused O_DIRECT. */
void zck__warn_buffered(const char *path);

/* The first failure among threads, with its message: record keeps the first code and the
 * calling thread's message and raises failed (which workers poll to stop early); result
 * returns that code with the message re-set in the calling thread (0 when none failed).
 * init and destroy around them. */
typedef struct {
    pthread_mutex_t mu;
    atomic_int failed;
    int rc;
    char msg[1024];
} zck__first_error;
void zck__first_error_init(zck__first_error *f);
void zck__first_error_record(zck__first_error *f, int rc);
int zck__first_error_result(const zck__first_error *f);
void zck__first_error_destroy(zck__first_error *f);

/* Run fn(ctx, i) for i in [0, n) on up to jobs threads. Returns the first failure, with its
 * message re-set in the calling thread. */
int zck__parallel(size_t n, unsigned jobs, int (*fn)(void *ctx, size_t i), void *ctx);

/* Small filesystem helpers, all through the fault hook (and in zck.h: zck_path_join,
 * zck_fsync_dir, zck_rename_noreplace). */
int zck__mkdir(const char *path);                 /* EEXIST is success */
int zck__mkdir_p(const char *path);  /* mkdir -p, each new directory made durable in its parent */
int zck__rename(const char *from, const char *to);
int zck__rmtree(const char *path);                /* a flat checkpoint directory */
int zck__write_small(const char *path, const void *data, size_t len); /* create, write, fsync */
int zck__read_small(char **out, size_t *len, const char *path, size_t max);
const char *zck__file_type_name(mode_t m);          /* "a FIFO", "a symbolic link", ... */

/* "step-<1-19 digits>" -> step; false for anything else */
bool zck__parse_step_name(const char *name, uint64_t *step);
/* A list of step directories (names.c): add one (grows the array), sort newest first, free. */
typedef struct {
    uint64_t step;
    char *name;
} zck__stepdir;
int zck__steps_add(zck__stepdir **v, size_t *n, size_t *cap, uint64_t step, const char *name);
void zck__steps_sort_desc(zck__stepdir *v, size_t n);
void zck__steps_free(zck__stepdir *v, size_t n);
/* replace run_dir/latest by a file naming `name` (write-temp + rename + fsync of the directory) */
int zck__write_latest(const char *run_dir, const char *name);
/* Retention and garbage collection in run_dir around the checkpoint `keep` of step `step`
 * (the directory latest names) and keep2 (NULL: none): never touches them or step directories
 * above keep; staging directories of steps <= tmp_below are collected (with gc_tmp). Only
 * directories holding nothing but the format's files are deleted (others are left with a warning). Names removed
 * (or, with dry_run, that would be) go to *removed when it is not NULL. */
int zck__housekeeping(const char *run_dir, uint64_t step, uint64_t tmp_below, const char *keep,
                      const char *keep2, const zck_prune_opts *o, zck_namelist *removed);

#endif
