/*
 * verify.c: audit a checkpoint without trusting it: the manifest (completely validated), the
 * SHA256SUMS file against the manifest, presence and size of every shard, files the manifest
 * does not name, and, unless quick, the SHA-256 of every shard, hashed in parallel. Every
 * problem is collected with its file and kind; nothing stops at the first.
 */
#include "zck_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct zck_report {
    zck_problem *p;
    size_t n, cap;
    uint64_t hashed;
    int hash_skipped; /* cheap_first: a cheaper check found a problem, nothing was hashed */
};

const char *zck_problem_kind_name(zck_problem_kind k)
{
    switch (k) {
    case ZCK_PROB_MANIFEST: return "bad manifest";
    case ZCK_PROB_MISSING: return "missing";
    case ZCK_PROB_TRUNCATED: return "truncated";
    case ZCK_PROB_SIZE: return "size mismatch";
    case ZCK_PROB_HASH: return "hash mismatch";
    case ZCK_PROB_UNLISTED: return "unlisted file";
    case ZCK_PROB_SUMS: return "SHA256SUMS mismatch";
    case ZCK_PROB_IO: return "unreadable";
    case ZCK_PROB_COVERAGE: return "coverage";
    case ZCK_PROB_UNSAFE: return "unsafe pickle";
    }
    return "?";
}

int zck_report_new(zck_report **out)
{
    if (!(*out = calloc(1, sizeof **out)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    return 0;
}

void zck_report_add_bytes_hashed(zck_report *rep, uint64_t n) { rep->hashed += n; }

#define add zck_report_add

int zck_report_add(zck_report *rep, zck_problem_kind kind, const char *file, const char *fmt,
                   ...)
{
    ZR_TRY(zr_array_grow(&rep->p, &rep->cap, rep->n, sizeof *rep->p));
    char detail[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    char *f = strdup(file), *d = strdup(detail);
    if (!f || !d) {
        free(f);
        free(d);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    rep->p[rep->n++] = (zck_problem){kind, f, d};
    return 0;
}

size_t zck_report_count(const zck_report *rep) { return rep->n; }
const zck_problem *zck_report_get(const zck_report *rep, size_t i) { return &rep->p[i]; }
uint64_t zck_report_bytes_hashed(const zck_report *rep) { return rep->hashed; }
int zck_report_hash_skipped(const zck_report *rep) { return rep->hash_skipped; }

void zck_report_free(zck_report *rep)
{
    if (!rep)
        return;
    for (size_t i = 0; i < rep->n; i++) {
        free((char *)rep->p[i].file);
        free((char *)rep->p[i].detail);
    }
    free(rep->p);
    free(rep);
}

/* The shards of a manifest sorted by file name, so that a name found on disk or in
 * SHA256SUMS is looked up in O(log n): a world-65536 checkpoint has 65536 of each. */
typedef struct {
    const char *file;
    size_t i;
} named;

static int cmp_named(const void *a, const void *b)
{
    return strcmp(((const named *)a)->file, ((const named *)b)->file);
}

static int by_name_new(named **out, const zck_manifest *m)
{
    named *v = malloc((m->nshards ? m->nshards : 1) * sizeof *v);
    if (!v)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->nshards; i++)
        v[i] = (named){m->shards[i]->file, i};
    if (m->nshards)
        qsort(v, m->nshards, sizeof *v, cmp_named);
    *out = v;
    return 0;
}

/* index in the manifest of the shard named file, or m->nshards */
static size_t shard_by_name(const named *v, const zck_manifest *m, const char *file)
{
    named key = {file, 0};
    const named *hit = m->nshards ? bsearch(&key, v, m->nshards, sizeof *v, cmp_named) : NULL;
    return hit ? hit->i : m->nshards;
}

/* index of the extra file named file, or m->nfiles */
static size_t file_by_name(const zck_manifest *m, const char *file)
{
    for (size_t f = 0; f < m->nfiles; f++)
        if (!strcmp(m->files[f].file, file))
            return f;
    return m->nfiles;
}

/* The extra files (small: read and hashed here, unless quick). */
static int check_files(zck_report *rep, const char *dir, const zck_manifest *m, int quick)
{
    int rc = 0;
    for (size_t f = 0; f < m->nfiles && !rc; f++) {
        const zck__file *x = &m->files[f];
        char *p = zck_path_join(dir, x->file), *buf = NULL, hex[65];
        size_t n = 0;
        if (!p)
            return ZR_ENOMEM;
        int e = zck__read_small(&buf, &n, p, ZCK_MAX_FILE_BYTES + 1);
        if (e == ZR_ENOMEM)
            rc = e;
        else if (e == ZR_ENOTFOUND)
            rc = add(rep, ZCK_PROB_MISSING, x->file, "listed with %llu bytes, not on disk",
                     (unsigned long long)x->bytes);
        else if (e)
            rc = add(rep, ZCK_PROB_IO, x->file, "%s", zr_err_msg());
        else if (n != x->bytes)
            rc = add(rep, n < x->bytes ? ZCK_PROB_TRUNCATED : ZCK_PROB_SIZE, x->file,
                     "%zu bytes, manifest lists %llu", n, (unsigned long long)x->bytes);
        else if (!quick) {
            zck__sha *h = NULL;
            if ((rc = zck__sha_new(&h)) == 0) {
                zck__sha_update(h, buf, n);
                zck__sha_hex(h, hex);
                zck__sha_free(h);
                if (strcmp(hex, x->sha256))
                    rc = add(rep, ZCK_PROB_HASH, x->file, "sha256 %.16s... on disk, manifest "
                             "lists %.16s...", hex, x->sha256);
                else
                    rep->hashed += n;
            }
        }
        free(buf);
        free(p);
    }
    return rc;
}

/* Compare SHA256SUMS ("<hex>  <file>" lines) with the manifest, and check the line for
 * manifest.json against the manifest's own bytes (mtext). */
static int check_sums(zck_report *rep, const char *dir, const zck_manifest *m, const named *v,
                      const char *mtext)
{
    char *path = zck_path_join(dir, "SHA256SUMS"), *txt = NULL;
    if (!path)
        return ZR_ENOMEM;
    int rc = zck__read_small(&txt, NULL, path, (size_t)64 << 20);
    free(path);
    if (rc == ZR_ENOTFOUND)
        return add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "missing");
    if (rc)
        return add(rep, ZCK_PROB_IO, "SHA256SUMS", "%s", zr_err_msg());
    unsigned char *seen = calloc(m->nshards ? m->nshards : 1, 1);
    if (!seen) {
        free(txt);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    size_t lineno = 0;
    unsigned seen_files = 0; /* ZCK_MAX_FILES bits */
    for (char *save = NULL, *line = strtok_r(txt, "\n", &save); line && !rc;
         line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        char *sp = strstr(line, "  ");
        if (!sp || sp - line != 64) {
            rc = add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "line %zu: expected '<64 hex>  <file>'",
                     lineno);
            continue;
        }
        *sp = 0;
        const char *file = sp + 2;
        if (!strcmp(file, "manifest.json")) {
            char hex[65];
            zck__sha *h = NULL;
            if ((rc = zck__sha_new(&h)) < 0)
                break;
            zck__sha_update(h, mtext, strlen(mtext));
            zck__sha_hex(h, hex);
            zck__sha_free(h);
            if (strcmp(hex, line))
                rc = add(rep, ZCK_PROB_SUMS, "manifest.json", "sha256 %.16s... on disk, "
                         "SHA256SUMS lists %.16s... (the manifest was edited after the commit)",
                         hex, line);
            continue;
        }
        size_t f = file_by_name(m, file), i = shard_by_name(v, m, file);
        if (f < m->nfiles) {
            if (strcmp(m->files[f].sha256, line))
                rc = add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "%s: %.16s... here, %.16s... in the "
                         "manifest", file, line, m->files[f].sha256);
            seen_files |= 1u << f;
        } else if (i == m->nshards)
            rc = add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "line %zu: '%s' is not a shard of the "
                     "manifest", lineno, file);
        else {
            if (strcmp(m->shards[i]->sha256, line))
                rc = add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "%s: %.16s... here, %.16s... in the "
                         "manifest", file, line, m->shards[i]->sha256);
            seen[i] = 1;
        }
    }
    for (size_t i = 0; i < m->nshards && !rc; i++)
        if (!seen[i])
            rc = add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "no line for %s", m->shards[i]->file);
    for (size_t f = 0; f < m->nfiles && !rc; f++)
        if (!(seen_files & 1u << f))
            rc = add(rep, ZCK_PROB_SUMS, "SHA256SUMS", "no line for %s", m->files[f].file);
    free(seen);
    free(txt);
    return rc;
}

static int check_unlisted(zck_report *rep, const char *dir, const zck_manifest *m,
                          const named *v)
{
    DIR *d = opendir(dir);
    if (!d)
        return add(rep, ZCK_PROB_IO, ".", "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d)) && !rc) {
        const char *nm = de->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || !strcmp(nm, "manifest.json") ||
            !strcmp(nm, "SHA256SUMS"))
            continue;
        if (shard_by_name(v, m, nm) == m->nshards && file_by_name(m, nm) == m->nfiles)
            rc = add(rep, ZCK_PROB_UNLISTED, nm, "not named by the manifest");
    }
    closedir(d);
    return rc;
}

/* The model section against the layout of the same manifest: a section naming a known family
 * with a valid config whose layout (groups, their sizes, their tensors) is not the manifest's
 * is a manifest that contradicts itself. A section of no known family, or with a config the
 * family refuses, is left to the model's reader (a converter's checkpoint may carry another). */
static int check_model(zck_report *rep, const zck_manifest *m)
{
    zck_arch_config c;
    zck_layout *want = NULL;
    if (zck_arch_config_from_json(&c, m->model_json, NULL) < 0 ||
        zck_arch_layout(&want, &c) < 0) {
        int rc = zr_err_code() == ZR_ENOMEM ? ZR_ENOMEM : 0;
        if (!rc)
            zr_err_clear();
        return rc;
    }
    const zck_layout *L = m->L;
    int rc = 0;
    size_t ng = zck_layout_n_groups(want);
    size_t had = zck_report_count(rep);
    for (size_t g = 0; g < ng && g < L->ng && !rc && zck_report_count(rep) == had; g++) {
        int same = !strcmp(L->g[g].name, zck_layout_group_name(want, g)) &&
                   L->g[g].numel == zck_layout_group_numel(want, g) &&
                   L->g[g].nt == zck_layout_group_n_tensors(want, g);
        if (!same)
            rc = add(rep, ZCK_PROB_MANIFEST, "manifest.json", "group %zu is '%.200s' of %llu "
                     "elements, but its model section (%.300s) makes it '%s' of %llu: the "
                     "manifest contradicts itself", g, L->g[g].name,
                     (unsigned long long)L->g[g].numel, m->model_json,
                     zck_layout_group_name(want, g),
                     (unsigned long long)zck_layout_group_numel(want, g));
    }
    if (!rc && zck_report_count(rep) == had && ng != L->ng)
        rc = add(rep, ZCK_PROB_MANIFEST, "manifest.json", "%zu parameter groups, but its model "
                 "section (%.300s) makes %zu: the manifest contradicts itself", L->ng,
                 m->model_json, ng);
    zck_layout_free(want);
    return rc;
}

typedef struct {
    const char *dir;
    const zck_manifest *m;
    const zck_io_opts *io;
    size_t *todo;           /* shard indices to hash */
    char (*hex)[65];        /* result per todo item */
    char **err;             /* error message per todo item, or NULL */
    zck__hash_tick tick;
    const zck_verify_opts *o; /* its each, when set, sees the pieces */
    atomic_int each_failed; /* each returned an error: every shard's read stops */
} hash_ctx;

/* One shard's pieces for opts->each: its extents by offset, the next to cut. */
typedef struct {
    hash_ctx *c;
    size_t shard;
    zck__extent *e;
    size_t n, next;
    int failed, stopped; /* its each failed; stopped for another shard's */
} cut_ctx;

static int cmp_ext_offset(const void *a, const void *b)
{
    const zck__extent *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* A chunk [off, off + len) of the shard, hashed: the extents it overlaps, piece by piece. The
 * manifest's extents start on ZCK_FILE_ALIGN and chunks on multiples of it, so no element is
 * cut in two (checked all the same). */
static int cut_chunk(void *vctx, uint64_t off, const unsigned char *p, size_t len)
{
    cut_ctx *k = vctx;
    hash_ctx *c = k->c;
    if (atomic_load(&c->each_failed)) {
        k->stopped = 1;
        return zr_err_set(ZR_ERROR, "stopped: a piece of another shard failed");
    }
    const zck_shard *s = c->m->shards[k->shard];
    uint64_t end = off + len;
    for (size_t i = k->next; i < k->n && k->e[i].offset < end; i++) {
        const zck__extent *e = &k->e[i];
        uint64_t ds = zck_dtype_size(zck_layout_state_dtype(c->m->L, e->state));
        uint64_t eb = e->offset + e->count * ds, a = off > e->offset ? off : e->offset;
        uint64_t b = end < eb ? end : eb;
        if (eb <= off || a >= b) { /* before this chunk, or empty: done with it */
            k->next = i + 1;
            continue;
        }
        if ((a - e->offset) % ds || (b - a) % ds)
            return zr_err_set(ZR_ECORRUPT, "%s/%s: extent at offset %llu cut inside an element",
                              c->dir, s->file, (unsigned long long)e->offset);
        zck_piece piece = {k->shard, e->group, e->state, e->start + (a - e->offset) / ds,
                           (b - a) / ds, p + (a - off)};
        int rc = c->o->each(c->o->each_ctx, &piece);
        if (rc) {
            k->failed = 1;
            atomic_store(&c->each_failed, 1);
            return rc;
        }
        if (b == eb)
            k->next = i + 1;
    }
    return 0;
}

static int hash_one(void *vctx, size_t k)
{
    hash_ctx *c = vctx;
    size_t si = c->todo[k];
    const zck_shard *s = c->m->shards[si];
    char *path = zck_path_join(c->dir, s->file);
    if (!path)
        return ZR_ENOMEM;
    cut_ctx cut = {c, si, NULL, s->next, 0, 0, 0};
    if (c->o->each) {
        if (!(cut.e = malloc((s->next ? s->next : 1) * sizeof *cut.e))) {
            free(path);
            return zr_err_set(ZR_ENOMEM, "out of memory");
        }
        memcpy(cut.e, s->ext, s->next * sizeof *cut.e);
        qsort(cut.e, s->next, sizeof *cut.e, cmp_ext_offset);
    }
    int rc = 0;
    if (zck__sha256_file_ticked(c->hex[k], path, c->io, &c->tick, c->o->each ? cut_chunk : NULL,
                                &cut) < 0) {
        if (cut.failed) /* the caller's error, not damage */
            rc = zr_err_code();
        else if (cut.stopped) /* the shard whose piece failed reports it */
            rc = 0;
        else if (!(c->err[k] = strdup(zr_err_msg())))
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
    }
    free(cut.e);
    free(path);
    return rc;
}

int zck_verify(zck_report **out, const char *path, const zck_verify_opts *opts)
{
    zck_verify_opts def = ZCK_VERIFY_OPTS_INIT;
    if (!opts)
        opts = &def;
    char *dir = NULL;
    ZR_TRY(zck__resolve(&dir, path));
    zck_report *rep = calloc(1, sizeof *rep);
    if (!rep) {
        free(dir);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    zck_manifest *m = NULL;
    named *names = NULL;
    hash_ctx hc;
    memset(&hc, 0, sizeof hc);
    hc.dir = dir;
    hc.io = &opts->io;
    hc.tick.owner = pthread_self();
    hc.tick.progress = opts->progress;
    hc.tick.what = "verify";
    hc.o = opts;
    atomic_init(&hc.each_failed, 0);
    size_t ntodo = 0;
    int rc = zck__manifest_load(&m, dir);
    if (rc == ZR_ENOMEM || (rc && zck__vanished(dir)))
        goto out;
    if (rc) { /* damage; or a read the system refused, which is no sign of it */
        rc = add(rep, zck__is_damage(rc) ? ZCK_PROB_MANIFEST : ZCK_PROB_IO, "manifest.json",
                 "%s", zr_err_msg());
        goto out;
    }
    hc.m = m;
    ZR_TRY_GOTO(check_model(rep, m), rc, out);
    char *mp = zck_path_join(dir, "manifest.json"), *mtext = NULL;
    if (!mp || zck__read_small(&mtext, NULL, mp, ZCK_MAX_MANIFEST_BYTES) < 0) {
        /* read again after a good parse: changed or removed meanwhile. The message is copied
         * first: zr_err_set formatting zr_err_msg() into itself is undefined */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zr_err_msg());
        rc = mp ? zr_err_set(ZR_EIO, "%s", msg) : ZR_ENOMEM;
        free(mp);
        goto out;
    }
    free(mp);
    if ((rc = by_name_new(&names, m)) == 0 && (rc = check_sums(rep, dir, m, names, mtext)) == 0)
        rc = check_unlisted(rep, dir, m, names);
    if (rc == 0)
        rc = check_files(rep, dir, m, opts->quick);
    free(mtext);
    if (rc)
        goto out;
    hc.todo = calloc(m->nshards ? m->nshards : 1, sizeof *hc.todo);
    hc.hex = calloc(m->nshards ? m->nshards : 1, sizeof *hc.hex);
    hc.err = calloc(m->nshards ? m->nshards : 1, sizeof *hc.err);
    if (!hc.todo || !hc.hex || !hc.err) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < m->nshards && !rc; i++) {
        const zck_shard *s = m->shards[i];
        char *p = zck_path_join(dir, s->file);
        struct stat st;
        if (!p) {
            rc = ZR_ENOMEM;
            break;
        }
        if (lstat(p, &st) < 0)
            rc = errno == ENOENT ? add(rep, ZCK_PROB_MISSING, s->file, "listed with %llu bytes, "
                                       "not on disk", (unsigned long long)s->bytes)
                                 : add(rep, ZCK_PROB_IO, s->file, "stat: %s", strerror(errno));
        else if (!S_ISREG(st.st_mode))
            rc = add(rep, ZCK_PROB_IO, s->file, "%s, not a regular file",
                     zck__file_type_name(st.st_mode));
        else if ((uint64_t)st.st_size < s->bytes)
            rc = add(rep, ZCK_PROB_TRUNCATED, s->file, "%lld bytes, manifest lists %llu",
                     (long long)st.st_size, (unsigned long long)s->bytes);
        else if ((uint64_t)st.st_size > s->bytes)
            rc = add(rep, ZCK_PROB_SIZE, s->file, "%lld bytes, manifest lists %llu",
                     (long long)st.st_size, (unsigned long long)s->bytes);
        else if (!opts->quick)
            hc.todo[ntodo++] = i;
        free(p);
    }
    if (rc)
        goto out;
    if (opts->cheap_first && rep->n) { /* refused at once, not after hours of hashing */
        rep->hash_skipped = ntodo > 0;
        ntodo = 0;
    }
    if (opts->precheck && !rep->n) { /* the caller's cheap check, before any hashing */
        zck_reader *rd = NULL;
        ZR_TRY_GOTO(zck__reader_borrow(&rd, dir, m), rc, out);
        rc = opts->precheck(opts->precheck_ctx, rd);
        zck__reader_unborrow(rd);
        if (rc)
            goto out;
    }
    for (size_t k = 0; k < ntodo; k++)
        hc.tick.total += m->shards[hc.todo[k]]->bytes;
    ZR_TRY_GOTO(zck__parallel(ntodo, opts->jobs, hash_one, &hc), rc, out);
    if (opts->progress.fn && ntodo)
        opts->progress.fn(opts->progress.ctx, "verify", hc.tick.total, hc.tick.total);
    for (size_t k = 0; k < ntodo && !rc; k++) {
        const zck_shard *s = m->shards[hc.todo[k]];
        if (hc.err[k])
            rc = add(rep, ZCK_PROB_IO, s->file, "%s", hc.err[k]);
        else if (strcmp(hc.hex[k], s->sha256))
            rc = add(rep, ZCK_PROB_HASH, s->file, "sha256 %.16s... on disk, manifest lists "
                     "%.16s...", hc.hex[k], s->sha256);
        else
            rep->hashed += s->bytes;
    }
out:
    if (hc.err)
        for (size_t k = 0; k < ntodo; k++)
            free(hc.err[k]);
    free(hc.err);
    free(hc.hex);
    free(hc.todo);
    free(names);
    zck__manifest_free(m);
    if (!rc && rep->n && zck__vanished(dir))
        rc = zck__vanished_err(dir); /* what is missing was removed meanwhile: no verdict */
    else if (rc && rc != ZR_ENOMEM && zck__vanished(dir))
        rc = zck__vanished_err(dir);
    free(dir);
    if (rc) {
        zck_report_free(rep);
        return rc;
    }
    *out = rep;
    return 0;
}

/* verify path in full (hashes read buffered, so a pass that follows finds the shards in the
 * page cache); ZR_ECORRUPT naming the first problem when the report is not empty */
static int first_problem(const char *src, const zck_report *rep)
{
    const zck_problem *p = zck_report_get(rep, 0);
    return zr_err_set(ZR_ECORRUPT, "%s: %s: %s: %s (%zu problem%s; run zckpt verify)", src,
                      p->file, zck_problem_kind_name(p->kind), p->detail, zck_report_count(rep),
                      zck_report_count(rep) == 1 ? "" : "s");
}

int zck__verify_or_fail(const char *path, unsigned jobs, const zck_progress *progress)
{
    zck_report *rep = NULL;
    zck_verify_opts vo = ZCK_VERIFY_OPTS_INIT;
    /* buffered: the hash pass leaves the shards in the page cache for the pass that follows */
    vo.io.io = ZCK_IO_BUFFERED;
    vo.jobs = jobs ? jobs : 1;
    if (progress)
        vo.progress = *progress;
    ZR_TRY(zck_verify(&rep, path, &vo));
    int rc = zck_report_count(rep) ? first_problem(path, rep) : 0;
    zck_report_free(rep);
    return rc;
}
