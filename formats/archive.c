/*
 * archive.c: checkpoints as tar archives, through libarchive.
 *
 * zfmt_pack streams a checkpoint directory into a .tar, .tar.gz or .tar.zst (pax restricted):
 * "<step dir>/manifest.json" first, then SHA256SUMS, then the shards in manifest order and the
 * extra files (tokenizer.json), written
 * under a temporary name and renamed into place. zfmt_unpack extracts an archive into a run
 * directory: every member must be a regular file directly inside one step-<digits> directory
 * (anything else is refused before a byte of it is written), the files go into a temporary
 * directory inside the run directory, are verified with zck_verify, and only then renamed into
 * place. zfmt_archive_verify checks an archive while streaming it: every member is hashed as it
 * goes by and compared with the manifest at the end.
 *
 * libarchive's conventions (ARCHIVE_* codes, archive_error_string) stay inside this file. Read
 * formats are tar (ustar, pax, GNU), cpio, zip and 7-Zip with every filter libarchive has; mtree
 * is left out on purpose, because its reader takes file contents from the local disk.
 */
#include "zfmt.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_BYTES ((size_t)1 << 20)        /* file data moves in pieces of this size */
#define MAX_MEMBER_BYTES ((int64_t)1 << 50)  /* a member larger than this is absurd */
#define MAX_SUMS_BYTES ((size_t)64 << 20)
#define PROGRESS_EVERY ((uint64_t)4 << 20)

/* ---------------------------------------------------------------- small helpers */

static const char *ar_msg(struct archive *a)
{
    const char *m = archive_error_string(a);
    return m ? m : "unknown libarchive error";
}

/* Member names come from untrusted archives: show them on one line, bounded. */
static const char *shown(char buf[256], const char *name)
{
    return name ? zr_printable(buf, 256, name) : "(unnamed)";
}

static int fsync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return zck_fsync_dir(".");
    if (slash == path)
        return zck_fsync_dir("/");
    char *dir = strndup(path, (size_t)(slash - path));
    if (!dir)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = zck_fsync_dir(dir);
    free(dir);
    return rc;
}

/* Best-effort removal of name (relative to dfd), descending at most depth directory levels
 * and never following a symbolic link. Only for our own temporary trees, on failure paths. */
static void remove_tree_at(int dfd, const char *name, int depth)
{
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT || depth <= 0)
        return;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            remove_tree_at(dirfd(d), de->d_name, depth - 1);
    closedir(d);
    unlinkat(dfd, name, AT_REMOVEDIR);
}

/* "step-" followed by 1 to 19 decimal digits, n bytes long */
static int step_name_ok(const char *s, size_t n)
{
    if (n < 6 || n > 24 || strncmp(s, "step-", 5))
        return 0;
    for (size_t i = 5; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

/* A file name that may appear inside a checkpoint directory: 1 to 255 bytes, no '/', no '\',
 * no control character, not starting with '.' (so not "." or ".."). */
static int plain_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 255 || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f)
            return 0;
    }
    return 1;
}

typedef struct {
    const zck_progress *p;
    const char *what;
    uint64_t done, total, last;
} prog;

static void prog_set(prog *pg, uint64_t done, int force)
{
    pg->done = done;
    if (!pg->p || !pg->p->fn)
        return;
    if (force || pg->done - pg->last >= PROGRESS_EVERY) {
        pg->last = pg->done;
        pg->p->fn(pg->p->ctx, pg->what, pg->done, pg->total);
    }
}

/* ---------------------------------------------------------------- member names */

/*
 * Why a member may not be part of a checkpoint archive, or NULL when it may. top is the step
 * directory seen so far ("" before the first member). On NULL, *is_dir says that the member is
 * the step directory's own entry, *top_len is the length of its step directory name and *file
 * (for a regular file) the file name inside it. why holds formatted reasons.
 */
static const char *member_refusal(struct archive_entry *e, const char *name, const char *top,
                                  int *is_dir, size_t *top_len, const char **file,
                                  char why[128])
{
    *is_dir = 0;
    *file = NULL;
    if (!name || !*name)
        return "no readable name";
    if (name[0] == '/')
        return "absolute path";
    for (const char *c = name; *c;) {
        size_t n = strcspn(c, "/");
        if (n == 2 && !strncmp(c, "..", 2))
            return "'..' component";
        if (n == 1 && c[0] == '.')
            return "'.' component";
        c += n;
        if (*c == '/')
            c++;
    }
    if (archive_entry_hardlink(e))
        return "hard link";
    mode_t t = archive_entry_filetype(e);
    if (t == AE_IFLNK || archive_entry_symlink(e))
        return "symbolic link";
    switch (t) {
    case AE_IFREG:
    case AE_IFDIR:
        break;
    case AE_IFCHR: return "character device";
    case AE_IFBLK: return "block device";
    case AE_IFIFO: return "fifo";
    case AE_IFSOCK: return "socket";
    default: return "not a regular file";
    }
    if (archive_entry_size_is_set(e)) {
        int64_t sz = archive_entry_size(e);
        if (sz < 0 || sz > MAX_MEMBER_BYTES) {
            snprintf(why, 128, "size %" PRId64 " out of range [0, 2^50]", sz);
            return why;
        }
    }
    const char *slash = strchr(name, '/');
    size_t tl = slash ? (size_t)(slash - name) : strlen(name);
    if (!step_name_ok(name, tl))
        return "not inside a step-<digits> directory";
    if (*top && (strlen(top) != tl || memcmp(top, name, tl))) {
        snprintf(why, 128, "a second top directory (the archive holds %s/ already)", top);
        return why;
    }
    *top_len = tl;
    if (t == AE_IFDIR) {
        if (slash && slash[1])
            return "nested directory";
        *is_dir = 1;
        return NULL;
    }
    if (!slash)
        return "a file where the step directory should be";
    const char *f = slash + 1;
    const char *sub = strchr(f, '/');
    if (sub && sub[1])
        return "nested directory";
    if (!plain_name_ok(f))
        return "not a plain file name";
    *file = f;
    return NULL;
}

/* An archive reader over path with the formats we accept; *fd is the opened file, which
 * libarchive does not close: reader_free does. */
static int reader_open(struct archive **out, int *out_fd, const char *path)
{
    int fd;
    ZR_TRY(zck_open_regular(&fd, path, ZCK_FOLLOW, NULL));
    struct archive *a = archive_read_new();
    if (!a) {
        close(fd);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    archive_read_support_filter_all(a); /* ARCHIVE_WARN when some use external programs */
    if (archive_read_support_format_tar(a) != ARCHIVE_OK ||
        archive_read_support_format_cpio(a) != ARCHIVE_OK ||
        archive_read_support_format_zip(a) != ARCHIVE_OK ||
        archive_read_support_format_7zip(a) != ARCHIVE_OK) {
        int rc = zr_err_set(ZR_ERROR, "libarchive: %s", ar_msg(a));
        archive_read_free(a);
        close(fd);
        return rc;
    }
    if (archive_read_open_fd(a, fd, CHUNK_BYTES) != ARCHIVE_OK) {
        /* libarchive's errno: a system error, or EILSEQ / -1 for what it cannot parse */
        int e = archive_errno(a), rc;
        if (e == ENOENT)
            rc = zr_err_set(ZR_ENOTFOUND, "%s: %s", path, ar_msg(a));
        else if (e > 0 && e != EILSEQ)
            rc = zr_err_set(ZR_EIO, "%s: %s", path, ar_msg(a));
        else
            rc = zr_err_set(ZR_ECORRUPT, "%s: not a readable archive: %s", path, ar_msg(a));
        archive_read_free(a);
        close(fd);
        return rc;
    }
    *out = a;
    *out_fd = fd;
    return 0;
}

static void reader_free(struct archive *a, int fd)
{
    archive_read_free(a);
    if (fd >= 0)
        close(fd);
}

/* ---------------------------------------------------------------- pack */

typedef struct {
    struct archive *a;
    const char *out;          /* the temporary file, for messages */
    const char *dir;          /* the checkpoint directory */
    const char *top;          /* its name in the archive */
    unsigned char *buf;       /* CHUNK_BYTES */
    prog pg;
} pack_ctx;

/* Append dir/file as "<top>/<file>". expect_bytes: the size the manifest lists, or -1. */
static int pack_file(pack_ctx *c, const char *file, int64_t expect_bytes)
{
    char *path = zck_path_join(c->dir, file), member[300];
    if (!path)
        return ZR_ENOMEM;
    struct archive_entry *e = NULL;
    int rc = 0;
    int fd = -1;
    ZR_TRY_GOTO(zck_open_regular(&fd, path, ZCK_NOFOLLOW, NULL), rc, out);
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = zr_err_sys(errno, "%s: stat", path);
        goto out;
    }
    if (expect_bytes >= 0 && st.st_size != expect_bytes) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: %lld bytes, manifest lists %lld", path,
                        (long long)st.st_size, (long long)expect_bytes);
        goto out;
    }
    snprintf(member, sizeof member, "%s/%s", c->top, file);
    if (!(e = archive_entry_new())) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    archive_entry_set_pathname(e, member);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, st.st_size);
    archive_entry_set_mtime(e, st.st_mtim.tv_sec, 0);
    if (archive_write_header(c->a, e) != ARCHIVE_OK) {
        rc = zr_err_set(ZR_EIO, "%s: %s: %s", c->out, member, ar_msg(c->a));
        goto out;
    }
    uint64_t left = (uint64_t)st.st_size;
    while (left) {
        size_t want = left < CHUNK_BYTES ? (size_t)left : CHUNK_BYTES;
        ssize_t k = read(fd, c->buf, want);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            rc = zr_err_sys(errno, "%s: read", path);
            goto out;
        }
        if (k == 0) {
            rc = zr_err_set(ZR_EIO, "%s: file shrank while being packed (%llu bytes missing)",
                            path, (unsigned long long)left);
            goto out;
        }
        la_ssize_t w = archive_write_data(c->a, c->buf, (size_t)k);
        if (w != k) {
            rc = zr_err_set(ZR_EIO, "%s: %s: %s", c->out, member, ar_msg(c->a));
            goto out;
        }
        left -= (uint64_t)k;
        if (expect_bytes >= 0)
            prog_set(&c->pg, c->pg.done + (uint64_t)k, 0);
    }
    if (archive_write_finish_entry(c->a) != ARCHIVE_OK)
        rc = zr_err_set(ZR_EIO, "%s: %s: %s", c->out, member, ar_msg(c->a));
out:
    archive_entry_free(e);
    if (fd >= 0)
        close(fd);
    free(path);
    return rc;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && !strcmp(s + n - k, suffix);
}

int zfmt_pack(const char *ckpt, const char *out_file, const zck_progress *progress)
{
    enum { PLAIN, GZIP, ZSTD } comp;
    if (ends_with(out_file, ".tar"))
        comp = PLAIN;
    else if (ends_with(out_file, ".tar.gz") || ends_with(out_file, ".tgz"))
        comp = GZIP;
    else if (ends_with(out_file, ".tar.zst"))
        comp = ZSTD;
    else
        return zr_err_set(ZR_EINVAL, "%s: unknown archive type (expected a name ending in .tar, "
                          ".tar.gz or .tar.zst)", out_file);
    struct stat st;
    if (lstat(out_file, &st) == 0)
        return zr_err_set(ZR_EEXIST, "%s: already exists", out_file);
    if (errno != ENOENT)
        return zr_err_sys(errno, "%s", out_file);

    zck_reader *r = NULL;
    ZR_TRY(zck_reader_open(&r, ckpt));
    int rc = 0, fd = -1, created = 0;
    char top[32], *tmp = NULL;
    pack_ctx c = {0};
    zck_step_dirname(top, zck_reader_step(r));
    size_t tn = strlen(out_file) + 32;
    if (!(tmp = malloc(tn)) || !(c.buf = malloc(CHUNK_BYTES))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    snprintf(tmp, tn, "%s.tmp-%ld", out_file, (long)getpid());
    c.out = tmp;
    c.dir = zck_reader_path(r);
    c.top = top;
    c.pg = (prog){progress, "pack", 0, 0, 0};
    for (size_t i = 0; i < zck_reader_n_shards(r); i++)
        c.pg.total += zck_shard_bytes(zck_reader_shard(r, i));

    if (!(c.a = archive_write_new())) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    if (archive_write_set_format_pax_restricted(c.a) != ARCHIVE_OK) {
        rc = zr_err_set(ZR_ERROR, "libarchive: %s", ar_msg(c.a));
        goto out;
    }
    /* ARCHIVE_WARN here means libarchive would run an external program instead of a library it
     * was built with: treated as no support */
    if (comp == GZIP && archive_write_add_filter_gzip(c.a) != ARCHIVE_OK) {
        rc = zr_err_set(ZR_EUNSUPPORTED, "%s: this libarchive has no gzip support (%s)",
                        out_file, ar_msg(c.a));
        goto out;
    }
    if (comp == ZSTD && archive_write_add_filter_zstd(c.a) != ARCHIVE_OK) {
        rc = zr_err_set(ZR_EUNSUPPORTED, "%s: this libarchive has no zstd support (%s); "
                        "write .tar.gz or .tar instead", out_file, ar_msg(c.a));
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = zr_err_sys(errno, "%s: create", tmp);
        goto out;
    }
    created = 1;
    archive_write_set_bytes_in_last_block(c.a, 1); /* no padding of the last block */
    if (archive_write_open_fd(c.a, fd) != ARCHIVE_OK) {
        rc = zr_err_set(ZR_EIO, "%s: %s", tmp, ar_msg(c.a));
        goto out;
    }
    ZR_TRY_GOTO(pack_file(&c, "manifest.json", -1), rc, out);
    ZR_TRY_GOTO(pack_file(&c, "SHA256SUMS", -1), rc, out);
    for (size_t i = 0; i < zck_reader_n_shards(r); i++) {
        const zck_shard *s = zck_reader_shard(r, i);
        ZR_TRY_GOTO(pack_file(&c, zck_shard_file(s), (int64_t)zck_shard_bytes(s)), rc, out);
    }
    for (size_t i = 0; i < zck_reader_n_files(r); i++) /* tokenizer.json, after the shards */
        ZR_TRY_GOTO(pack_file(&c, zck_reader_file_name(r, i),
                              (int64_t)zck_reader_file_bytes(r, i)), rc, out);
    if (archive_write_close(c.a) != ARCHIVE_OK) {
        rc = zr_err_set(ZR_EIO, "%s: %s", tmp, ar_msg(c.a));
        goto out;
    }
    if (fsync(fd) < 0) {
        rc = zr_err_sys(errno, "%s: fsync", tmp);
        goto out;
    }
    if (close(fd) < 0) {
        fd = -1;
        rc = zr_err_sys(errno, "%s: close", tmp);
        goto out;
    }
    fd = -1;
    ZR_TRY_GOTO(zck_rename_noreplace(tmp, out_file), rc, out);
    created = 0;
    ZR_TRY_GOTO(fsync_parent(out_file), rc, out);
    prog_set(&c.pg, c.pg.done, 1);
out:
    /* after a failure this still writes the end of the archive into the temporary file, which
     * is removed below (archive_write_fail would skip that, but leaks the compressor's state) */
    archive_write_free(c.a);
    if (fd >= 0)
        close(fd);
    if (created)
        unlink(tmp);
    free(tmp);
    free(c.buf);
    zck_reader_free(r);
    return rc;
}

/* ---------------------------------------------------------------- unpack */

typedef struct {
    const char *archive;
    const char *out_dir;
    char *tmp;                /* out_dir/.tmp-unpack-<pid> */
    int tmp_fd, step_fd;
    char top[32];             /* the step directory, "" until the first member */
    int have_manifest;
    zck_reader *listing;      /* the manifest once unpacked (sizes of later members), or NULL */
    unsigned char *buf;
    prog pg;
    uint64_t archive_bytes;
} unpack_ctx;

/* The most bytes the member file (of tmp/<top>) may hold, and what says so: the size the
 * manifest (unpacked before it, as `zckpt pack` writes it first) lists for a shard or an extra
 * file, else the format's limit for the name. */
static uint64_t member_limit(const unpack_ctx *c, const char *file, const char **what)
{
    *what = "a checkpoint's file may have";
    if (!strcmp(file, "manifest.json")) {
        *what = "a manifest may have";
        return ZCK_MAX_MANIFEST_BYTES;
    }
    if (!strcmp(file, "SHA256SUMS")) {
        *what = "a SHA256SUMS may have";
        return MAX_SUMS_BYTES;
    }
    for (size_t i = 0; c->listing && i < zck_reader_n_shards(c->listing); i++) {
        const zck_shard *sh = zck_reader_shard(c->listing, i);
        if (!strcmp(zck_shard_file(sh), file)) {
            *what = "the manifest lists for it";
            return zck_shard_bytes(sh);
        }
    }
    for (size_t i = 0; c->listing && i < zck_reader_n_files(c->listing); i++)
        if (!strcmp(zck_reader_file_name(c->listing, i), file)) {
            *what = "the manifest lists for it";
            return zck_reader_file_bytes(c->listing, i);
        }
    if (!c->listing && !strncmp(file, "shard-", 6)) {
        *what = "a member may have";
        return (uint64_t)MAX_MEMBER_BYTES;
    }
    return ZCK_MAX_FILE_BYTES; /* an extra file, or one the manifest does not list */
}

/* After manifest.json is unpacked: its listing, for the sizes of the members after it; a
 * manifest that does not parse is left to the verification at the end (its message). */
static void unpack_listing(unpack_ctx *c)
{
    char *dir = zck_path_join(c->tmp, c->top);
    if (dir && zck_reader_open(&c->listing, dir) < 0)
        c->listing = NULL;
    zr_err_clear();
    free(dir);
}

/* The first member names the step directory: refuse one that exists, create it in tmp. */
static int unpack_begin_step(unpack_ctx *c, const char *name, size_t top_len)
{
    memcpy(c->top, name, top_len);
    c->top[top_len] = 0;
    char *dst = zck_path_join(c->out_dir, c->top);
    if (!dst)
        return ZR_ENOMEM;
    struct stat st;
    int exists = lstat(dst, &st) == 0;
    int rc = exists ? zr_err_set(ZR_EEXIST, "%s: already exists", dst) : 0;
    free(dst);
    if (rc)
        return rc;
    if (mkdirat(c->tmp_fd, c->top, 0755) < 0)
        return zr_err_sys(errno, "%s/%s: mkdir", c->tmp, c->top);
    c->step_fd = openat(c->tmp_fd, c->top, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (c->step_fd < 0)
        return zr_err_sys(errno, "%s/%s: open directory", c->tmp, c->top);
    return 0;
}

static int unpack_file(unpack_ctx *c, struct archive *a, struct archive_entry *e,
                       const char *member, const char *file)
{
    char nb[256];
    const char *what;
    uint64_t limit = member_limit(c, file, &what);
    if (archive_entry_size_is_set(e) && (uint64_t)archive_entry_size(e) > limit)
        return zr_err_set(ZR_ECORRUPT, "%s: member '%s': %" PRId64 " bytes (its tar header), "
                          "more than the %" PRIu64 " %s: refused before reading it", c->archive,
                          shown(nb, member), archive_entry_size(e), limit, what);
    int fd = openat(c->step_fd, file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    0644);
    if (fd < 0 && errno == EEXIST)
        return zr_err_set(ZR_ECORRUPT, "%s: member '%s': appears twice", c->archive,
                          shown(nb, member));
    if (fd < 0)
        return zr_err_sys(errno, "%s/%s/%s: create", c->tmp, c->top, file);
    int rc = 0;
    uint64_t total = 0;
    for (;;) {
        la_ssize_t k = archive_read_data(a, c->buf, CHUNK_BYTES);
        if (k == 0)
            break;
        if (k < 0) {
            rc = zr_err_set(ZR_ECORRUPT, "%s: member '%s': %s", c->archive, shown(nb, member),
                            ar_msg(a));
            goto out;
        }
        total += (uint64_t)k;
        if (total > limit) { /* a header without a size, or one that lied */
            rc = zr_err_set(ZR_ECORRUPT, "%s: member '%s': more than the %" PRIu64 " bytes %s",
                            c->archive, shown(nb, member), limit, what);
            goto out;
        }
        for (size_t off = 0; off < (size_t)k;) {
            ssize_t w = write(fd, c->buf + off, (size_t)k - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                rc = zr_err_sys(errno, "%s/%s/%s: write", c->tmp, c->top, file);
                goto out;
            }
            off += (size_t)w;
        }
        int64_t raw = archive_filter_bytes(a, -1);
        prog_set(&c->pg, raw > 0 ? (uint64_t)raw : 0, 0);
    }
    if (fsync(fd) < 0)
        rc = zr_err_sys(errno, "%s/%s/%s: fsync", c->tmp, c->top, file);
out:
    if (close(fd) < 0 && !rc)
        rc = zr_err_sys(errno, "%s/%s/%s: close", c->tmp, c->top, file);
    return rc;
}

/* Read every member into tmp/<top>, refusing anything but plain files of one step directory. */
static int unpack_members(unpack_ctx *c, struct archive *a)
{
    char nb[256], why[128];
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN)
            return zr_err_set(ZR_ECORRUPT, "%s: %s", c->archive, ar_msg(a));
        const char *name = archive_entry_pathname(e), *file;
        int is_dir;
        size_t top_len;
        const char *no = member_refusal(e, name, c->top, &is_dir, &top_len, &file, why);
        if (no)
            return zr_err_set(ZR_ECORRUPT, "%s: member '%s': %s", c->archive, shown(nb, name),
                              no);
        if (!*c->top)
            ZR_TRY(unpack_begin_step(c, name, top_len));
        if (is_dir)
            continue;
        ZR_TRY(unpack_file(c, a, e, name, file));
        if (!strcmp(file, "manifest.json")) {
            c->have_manifest = 1;
            unpack_listing(c);
        }
    }
    if (!*c->top)
        return zr_err_set(ZR_ECORRUPT, "%s: no checkpoint in the archive (no members)",
                          c->archive);
    if (!c->have_manifest)
        return zr_err_set(ZR_ECORRUPT, "%s: no member %s/manifest.json: not a checkpoint",
                          c->archive, c->top);
    if (fsync(c->step_fd) < 0)
        return zr_err_sys(errno, "%s/%s: fsync directory", c->tmp, c->top);
    if (fsync(c->tmp_fd) < 0)
        return zr_err_sys(errno, "%s: fsync directory", c->tmp);
    return 0;
}

/* Verify tmp/<top> in full; the first problem becomes the error. *step: the manifest's step. */
static int unpack_check(unpack_ctx *c, uint64_t *step)
{
    char *dir = zck_path_join(c->tmp, c->top);
    if (!dir)
        return ZR_ENOMEM;
    zck_report *rep = NULL;
    zck_reader *r = NULL;
    int rc = zck_verify(&rep, dir, NULL);
    if (rc)
        goto out;
    size_t n = zck_report_count(rep);
    if (n) {
        const zck_problem *p = zck_report_get(rep, 0);
        rc = zr_err_set(ZR_ECORRUPT, "%s: %s/%s: %s: %s%s", c->archive, c->top, p->file,
                        zck_problem_kind_name(p->kind), p->detail,
                        n > 1 ? " (and more problems)" : "");
        goto out;
    }
    ZR_TRY_GOTO(zck_reader_open(&r, dir), rc, out);
    *step = zck_reader_step(r);
    char want[32];
    zck_step_dirname(want, *step);
    if (strcmp(want, c->top))
        rc = zr_err_set(ZR_ECORRUPT, "%s: the checkpoint of step %llu is in directory %s/ "
                        "(expected %s/)", c->archive, (unsigned long long)*step, c->top, want);
out:
    zck_reader_free(r);
    zck_report_free(rep);
    free(dir);
    return rc;
}

/* Point out_dir/latest at step unless it names a newer (or the same) step already. */
static int unpack_latest(const char *out_dir, uint64_t step)
{
    char *lp = NULL;
    int rc = zck_latest(&lp, out_dir), set;
    if (rc == ZR_ENOTFOUND) {
        zr_err_clear();
        set = 1;
    } else if (rc) {
        return rc;
    } else {
        zck_reader *r = NULL;
        int orc = zck_reader_open(&r, lp);
        if (orc == 0) {
            set = zck_reader_step(r) < step;
        } else if (orc == ZR_ENOTFOUND) {
            set = 1; /* latest names nothing that exists */
        } else {
            /* a damaged checkpoint: compare the step of its name */
            const char *base = strrchr(lp, '/');
            set = strtoull(base ? base + 6 : lp + 5, NULL, 10) < step;
        }
        zr_err_clear();
        zck_reader_free(r);
        free(lp);
    }
    return set ? zck_latest_set(out_dir, step) : 0;
}

int zfmt_unpack(const char *archive, const char *out_dir, const zck_progress *progress)
{
    struct archive *a = NULL;
    int afd = -1;
    unpack_ctx c = {.archive = archive, .out_dir = out_dir, .tmp_fd = -1, .step_fd = -1};
    int rc = 0, made_tmp = 0, made_out = 0;
    char *final = NULL;
    zck_lock *lk = NULL;
    struct stat st;
    if (stat(archive, &st) == 0)
        c.archive_bytes = (uint64_t)st.st_size;
    ZR_TRY(reader_open(&a, &afd, archive));
    if (mkdir(out_dir, 0777) == 0)
        made_out = 1;
    else if (errno != EEXIST) {
        rc = zr_err_sys(errno, "%s: mkdir", out_dir);
        goto out;
    }
    if (stat(out_dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        rc = zr_err_set(ZR_EEXIST, "%s: exists and is not a directory", out_dir);
        goto out;
    }
    ZR_TRY_GOTO(zck_run_lock(&lk, out_dir, "unpack"), rc, out);
    char name[64];
    snprintf(name, sizeof name, ".tmp-unpack-%ld", (long)getpid());
    if (!(c.tmp = zck_path_join(out_dir, name)) || !(c.buf = malloc(CHUNK_BYTES))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    remove_tree_at(AT_FDCWD, c.tmp, 2); /* left by a dead process that had our pid */
    if (mkdir(c.tmp, 0755) < 0) {
        rc = zr_err_sys(errno, "%s: mkdir", c.tmp);
        goto out;
    }
    made_tmp = 1;
    c.tmp_fd = open(c.tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (c.tmp_fd < 0) {
        rc = zr_err_sys(errno, "%s: open directory", c.tmp);
        goto out;
    }
    c.pg = (prog){progress, "unpack", 0, c.archive_bytes, 0};
    ZR_TRY_GOTO(unpack_members(&c, a), rc, out);
    reader_free(a, afd);
    a = NULL;
    afd = -1;
    uint64_t step = 0;
    ZR_TRY_GOTO(unpack_check(&c, &step), rc, out);
    char *from = zck_path_join(c.tmp, c.top);
    if (!from || !(final = zck_path_join(out_dir, c.top))) {
        free(from);
        rc = ZR_ENOMEM;
        goto out;
    }
    rc = zck_rename_noreplace(from, final);
    free(from);
    if (rc)
        goto out;
    /* in place: from here on a failure leaves a complete, verified checkpoint behind */
    made_tmp = 0;
    close(c.tmp_fd);
    c.tmp_fd = -1;
    rmdir(c.tmp); /* best effort: an empty dot-directory is ignored by every reader */
    ZR_TRY_GOTO(zck_fsync_dir(out_dir), rc, out);
    if ((rc = unpack_latest(out_dir, step)) < 0) {
        zr_err_prefix("%s unpacked, but latest was not updated: ", final);
        goto out;
    }
    prog_set(&c.pg, c.archive_bytes, 1);
out:
    if (c.step_fd >= 0)
        close(c.step_fd);
    if (c.tmp_fd >= 0)
        close(c.tmp_fd);
    if (made_tmp)
        remove_tree_at(AT_FDCWD, c.tmp, 2);
    zck_run_unlock(lk); /* before the rmdir: its lock file is in out_dir */
    if (rc && made_out)
        rmdir(out_dir); /* leave no trace of a failed unpack (fails harmlessly if not empty) */
    reader_free(a, afd);
    zck_reader_free(c.listing);
    free(final);
    free(c.buf);
    free(c.tmp);
    return rc;
}

/* ---------------------------------------------------------------- verify */

typedef struct {
    char *file;               /* name inside the step directory */
    uint64_t bytes;           /* data bytes read */
    char hex[65];
    int broken;               /* its data could not be read to the end */
    int used;                 /* the manifest or SHA256SUMS names it */
} seen_member;

typedef struct {
    const char *archive;
    zck_report *rep;
    char top[32];
    seen_member *m;
    size_t n, cap;
    char *mtext, *sums;       /* manifest.json and SHA256SUMS, NUL-terminated */
    size_t mlen;
    int mtoo_big, stopped;
    char stop_msg[512];       /* why reading ended early */
    unsigned char *buf;
    prog pg;
} verify_ctx;

static seen_member *find_member(verify_ctx *c, const char *file)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->m[i].file, file))
            return &c->m[i];
    return NULL;
}

/* Hash one member's data; keep it in *keep (up to max bytes) when keep is not NULL. */
static int verify_read(verify_ctx *c, struct archive *a, const char *file, char **keep,
                       size_t max)
{
    ZR_TRY(zr_array_grow(&c->m, &c->cap, c->n, sizeof *c->m));
    seen_member *m = &c->m[c->n];
    *m = (seen_member){0};
    if (!(m->file = strdup(file)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    c->n++;
    zck_sha256 *h;
    ZR_TRY(zck_sha256_new(&h));
    size_t kept = 0, cap = 0;
    char *text = NULL;
    int rc = 0;
    for (;;) {
        la_ssize_t k = archive_read_data(a, c->buf, CHUNK_BYTES);
        if (k == 0)
            break;
        if (k < 0) {
            m->broken = 1;
            c->stopped = 1;
            snprintf(c->stop_msg, sizeof c->stop_msg, "%s", ar_msg(a));
            break;
        }
        zck_sha256_update(h, c->buf, (size_t)k);
        m->bytes += (uint64_t)k;
        if (keep && m->bytes > max) {
            if (keep == &c->mtext)
                c->mtoo_big = 1;
            free(text);
            text = NULL;
            keep = NULL;
        }
        if (keep) {
            if (kept + (size_t)k + 1 > cap) {
                size_t nc = cap ? cap : 65536;
                while (nc < kept + (size_t)k + 1)
                    nc *= 2;
                char *nt = realloc(text, nc);
                if (!nt) {
                    rc = zr_err_set(ZR_ENOMEM, "out of memory");
                    break;
                }
                text = nt;
                cap = nc;
            }
            memcpy(text + kept, c->buf, (size_t)k);
            kept += (size_t)k;
            text[kept] = 0;
        }
        int64_t raw = archive_filter_bytes(a, -1);
        prog_set(&c->pg, raw > 0 ? (uint64_t)raw : 0, 0);
    }
    zck_sha256_hex(h, m->hex);
    zck_sha256_free(h);
    if (keep && !rc && !m->broken) {
        if (!text && !(text = calloc(1, 1)))
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        *keep = text;
        text = NULL;
        if (keep == &c->mtext)
            c->mlen = kept;
    }
    free(text);
    return rc;
}

/* Stream every member: hash it, keep the manifest and SHA256SUMS, report what is not a plain
 * file of the step directory. */
static int verify_members(verify_ctx *c, struct archive *a)
{
    char nb[256], why[128];
    int first = 1;
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN) {
            if (first && !c->n)
                return zr_err_set(ZR_ECORRUPT, "%s: %s", c->archive, ar_msg(a));
            c->stopped = 1;
            snprintf(c->stop_msg, sizeof c->stop_msg, "%s", ar_msg(a));
            break;
        }
        const char *name = archive_entry_pathname(e), *file;
        int is_dir;
        size_t top_len;
        const char *no = member_refusal(e, name, c->top, &is_dir, &top_len, &file, why);
        if (!no && !*c->top) {
            memcpy(c->top, name, top_len);
            c->top[top_len] = 0;
        }
        if (!no && is_dir)
            continue;
        if (first && (no || strcmp(file, "manifest.json")))
            ZR_TRY(zck_report_add(c->rep, ZCK_PROB_MANIFEST, "manifest.json", "first member is "
                                  "'%s': the archive must start with <step dir>/manifest.json",
                                  shown(nb, name)));
        first = 0;
        if (no) {
            ZR_TRY(zck_report_add(c->rep, ZCK_PROB_UNLISTED, shown(nb, name), "%s", no));
            continue;
        }
        if (find_member(c, file)) {
            ZR_TRY(zck_report_add(c->rep, ZCK_PROB_UNLISTED, file, "appears twice in the "
                                  "archive"));
            continue;
        }
        if (!strcmp(file, "manifest.json"))
            ZR_TRY(verify_read(c, a, file, &c->mtext, ZCK_MAX_MANIFEST_BYTES));
        else if (!strcmp(file, "SHA256SUMS"))
            ZR_TRY(verify_read(c, a, file, &c->sums, MAX_SUMS_BYTES));
        else
            ZR_TRY(verify_read(c, a, file, NULL, 0));
        if (c->stopped)
            break;
    }
    return 0;
}

/* What the manifest lists: the shards, then the extra files (tokenizer.json). */
typedef struct {
    const char *file, *sha256;
    uint64_t bytes;
} listed_file;

static int listed_files(listed_file **out, size_t *n, const zck_reader *r)
{
    size_t ns = zck_reader_n_shards(r), nf = zck_reader_n_files(r);
    listed_file *l = malloc((ns + nf ? ns + nf : 1) * sizeof *l);
    if (!l)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < ns; i++) {
        const zck_shard *s = zck_reader_shard(r, i);
        l[i] = (listed_file){zck_shard_file(s), zck_shard_sha256(s), zck_shard_bytes(s)};
    }
    for (size_t i = 0; i < nf; i++)
        l[ns + i] = (listed_file){zck_reader_file_name(r, i), zck_reader_file_sha256(r, i),
                                  zck_reader_file_bytes(r, i)};
    *out = l;
    *n = ns + nf;
    return 0;
}

/* SHA256SUMS against the manifest, and its manifest.json line against the manifest's hash. */
static int verify_sums(verify_ctx *c, const listed_file *lf, size_t ns, const char *mhex)
{
    zck_report *rep = c->rep;
    seen_member *sm = find_member(c, "SHA256SUMS");
    if (!sm)
        return zck_report_add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "missing from the archive");
    sm->used = 1;
    if (!c->sums)
        return zck_report_add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "unreadable or larger than "
                              "64 MiB");
    unsigned char *listed = calloc(ns ? ns : 1, 1);
    if (!listed)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    int rc = 0;
    size_t lineno = 0;
    for (char *save = NULL, *line = strtok_r(c->sums, "\n", &save); line && !rc;
         line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        char *sp = strstr(line, "  ");
        if (!sp || sp - line != 64) {
            rc = zck_report_add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "line %zu: expected "
                                "'<64 hex>  <file>'", lineno);
            continue;
        }
        *sp = 0;
        const char *file = sp + 2;
        if (!strcmp(file, "manifest.json")) {
            if (strcmp(mhex, line))
                rc = zck_report_add(rep, ZCK_PROB_SUMS, "manifest.json", "sha256 %.16s... in "
                                    "the archive, SHA256SUMS lists %.16s... (the manifest was "
                                    "edited after the commit)", mhex, line);
            continue;
        }
        size_t i = 0;
        while (i < ns && strcmp(lf[i].file, file))
            i++;
        if (i == ns) {
            char nb[256];
            rc = zck_report_add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "line %zu: '%s' is not a "
                                "shard of the manifest", lineno, shown(nb, file));
        } else {
            const char *want = lf[i].sha256;
            if (strcmp(want, line))
                rc = zck_report_add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "%s: %.16s... here, "
                                    "%.16s... in the manifest", file, line, want);
            listed[i] = 1;
        }
    }
    for (size_t i = 0; i < ns && !rc; i++)
        if (!listed[i])
            rc = zck_report_add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "no line for %s",
                                lf[i].file);
    free(listed);
    return rc;
}

/* Compare what was streamed with the manifest. */
static int verify_against_manifest(verify_ctx *c)
{
    zck_report *rep = c->rep;
    seen_member *mm = find_member(c, "manifest.json");
    if (!mm)
        return zck_report_add(rep, ZCK_PROB_MANIFEST, "manifest.json", "not in the archive%s%s",
                              c->stopped ? ": it could not be read past an error: " : "",
                              c->stopped ? c->stop_msg : "");
    mm->used = 1;
    if (c->mtoo_big)
        return zck_report_add(rep, ZCK_PROB_MANIFEST, "manifest.json", "larger than 64 MiB");
    if (!c->mtext)
        return zck_report_add(rep, ZCK_PROB_MANIFEST, "manifest.json", "unreadable: %s",
                              c->stop_msg);
    char what[600];
    snprintf(what, sizeof what, "%s:%s/manifest.json", c->archive, c->top);
    zck_reader *r = NULL;
    listed_file *lf = NULL;
    size_t n_lf = 0;
    int rc = zck_reader_open_manifest(&r, c->mtext, c->mlen, what);
    if (rc == ZR_ENOMEM)
        return rc;
    if (rc)
        return zck_report_add(rep, ZCK_PROB_MANIFEST, "manifest.json", "%s", zr_err_msg());
    /* zfmt_unpack installs the checkpoint under its own name, which must be the step's */
    char name[32];
    zck_step_dirname(name, zck_reader_step(r));
    if (strcmp(name, c->top))
        ZR_TRY_GOTO(zck_report_add(rep, ZCK_PROB_MANIFEST, "manifest.json", "the checkpoint of "
                                   "step %llu is in directory %s/ (expected %s/)",
                                   (unsigned long long)zck_reader_step(r), c->top, name),
                    rc, out);
    ZR_TRY_GOTO(listed_files(&lf, &n_lf, r), rc, out);
    ZR_TRY_GOTO(verify_sums(c, lf, n_lf, mm->hex), rc, out);
    for (size_t i = 0; i < n_lf && !rc; i++) {
        const char *file = lf[i].file;
        unsigned long long want = (unsigned long long)lf[i].bytes;
        seen_member *m = find_member(c, file);
        if (!m) {
            rc = zck_report_add(rep, ZCK_PROB_MISSING, file, "listed with %llu bytes, not in the "
                                "archive%s%s%s", want,
                                c->stopped ? " (reading stopped early: " : "",
                                c->stopped ? c->stop_msg : "", c->stopped ? ")" : "");
            continue;
        }
        m->used = 1;
        if (m->broken)
            rc = zck_report_add(rep, ZCK_PROB_TRUNCATED, file, "%llu bytes readable, manifest "
                                "lists %llu: %s", (unsigned long long)m->bytes, want,
                                c->stop_msg);
        else if (m->bytes < want)
            rc = zck_report_add(rep, ZCK_PROB_TRUNCATED, file, "%llu bytes, manifest lists %llu",
                                (unsigned long long)m->bytes, want);
        else if (m->bytes > want)
            rc = zck_report_add(rep, ZCK_PROB_SIZE, file, "%llu bytes, manifest lists %llu",
                                (unsigned long long)m->bytes, want);
        else if (strcmp(m->hex, lf[i].sha256))
            rc = zck_report_add(rep, ZCK_PROB_HASH, file, "sha256 %.16s... in the archive, "
                                "manifest lists %.16s...", m->hex, lf[i].sha256);
        else
            zck_report_add_bytes_hashed(rep, m->bytes);
    }
    for (size_t i = 0; i < c->n && !rc; i++)
        if (!c->m[i].used)
            rc = zck_report_add(rep, ZCK_PROB_UNLISTED, c->m[i].file, "not named by the "
                                "manifest");
out:
    free(lf);
    zck_reader_free(r);
    return rc;
}

int zfmt_archive_verify(zck_report **out, const char *archive, const zck_progress *progress)
{
    struct archive *a = NULL;
    int afd = -1;
    struct stat st;
    verify_ctx c = {.archive = archive};
    if (stat(archive, &st) == 0)
        c.pg = (prog){progress, "verify", 0, (uint64_t)st.st_size, 0};
    ZR_TRY(reader_open(&a, &afd, archive));
    int rc = 0;
    if (!(c.buf = malloc(CHUNK_BYTES))) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    ZR_TRY_GOTO(zck_report_new(&c.rep), rc, out);
    ZR_TRY_GOTO(verify_members(&c, a), rc, out);
    ZR_TRY_GOTO(verify_against_manifest(&c), rc, out);
    prog_set(&c.pg, c.pg.total, 1);
    *out = c.rep;
    c.rep = NULL;
out:
    for (size_t i = 0; i < c.n; i++)
        free(c.m[i].file);
    free(c.m);
    free(c.mtext);
    free(c.sums);
    free(c.buf);
    zck_report_free(c.rep);
    reader_free(a, afd);
    return rc;
}
