/*
 * torchzip.c: the zip container torch.save writes (PyTorch >= 1.6), read from its central
 * directory with pread: no decompression (torch stores every record), no libarchive stream
 * (records are read by offset, many times, in any order).
 *
 * A torch.save zip: local headers with zero sizes and a data descriptor after each record, the
 * real sizes, CRC-32s and offsets in the central directory, then a ZIP64 end-of-central-
 * directory record and locator (torch's writer always adds them) and the classic end record.
 * Records are "<root>/data.pkl", "<root>/data/<key>", "<root>/byteorder", "<root>/version", ...
 * under one root folder (the file's stem, or "archive").
 */
#include "foreign.h"
#include "fmtutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END 0x06054b50u
#define SIG_END64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define MAX_CD_BYTES ((uint64_t)64 << 20) /* the central directory read whole: bounded */

static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const unsigned char *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* CRC-32, slicing by 8 (tables built once) */
static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tab[t][i] = crc_tab[t - 1][i] >> 8 ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

uint32_t zfmt__crc32(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t a = c ^ le32(p), b = le32(p + 4);
        c = crc_tab[7][a & 0xff] ^ crc_tab[6][a >> 8 & 0xff] ^ crc_tab[5][a >> 16 & 0xff] ^
            crc_tab[4][a >> 24] ^ crc_tab[3][b & 0xff] ^ crc_tab[2][b >> 8 & 0xff] ^
            crc_tab[1][b >> 16 & 0xff] ^ crc_tab[0][b >> 24];
    }
    while (n--)
        c = crc_tab[0][(c ^ *p++) & 0xff] ^ c >> 8;
    return ~c;
}

/* n bytes at offset off of the zip (relative to its base); ZR_ECORRUPT when the zip ends first */
static int zread(const zfmt__zip *z, uint64_t off, void *buf, size_t n, const char *what)
{
    if (off > z->len || n > z->len - off)
        return zr_err_set(ZR_ECORRUPT, "%s: %s at byte %llu runs past the end of the zip "
                          "(%llu bytes): truncated?", z->path, what, (unsigned long long)off,
                          (unsigned long long)z->len);
    size_t done = 0;
    while (done < n) {
        ssize_t k = pread(z->fd, (char *)buf + done, n - done, (off_t)(z->base + off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return zr_err_sys(errno, "%s: read", z->path);
        if (k == 0)
            return zr_err_set(ZR_ECORRUPT, "%s: the file ended at byte %llu (it shrank while "
                              "being read?)", z->path, (unsigned long long)(z->base + off + done));
        done += (size_t)k;
    }
    return 0;
}

/* Find the end records: *cd_off, *cd_bytes, *count of the central directory. */
static int find_end(zfmt__zip *z, uint64_t *cd_off, uint64_t *cd_bytes, uint64_t *count)
{
    /* the classic end record (22 bytes) is within the last 22 + 65535 (its comment) bytes */
    size_t tail = z->len < 22 + 65535 ? (size_t)z->len : 22 + 65535;
    if (tail < 22)
        return zr_err_set(ZR_ECORRUPT, "%s: %llu bytes, too short for a zip (no end of central "
                          "directory): not a torch.save file, or truncated", z->path,
                          (unsigned long long)z->len);
    unsigned char *b = malloc(tail);
    if (!b)
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", z->path);
    int rc = zread(z, z->len - tail, b, tail, "the end of central directory");
    size_t at = tail - 22 + 1;
    while (!rc && at-- > 0)
        if (le32(b + at) == SIG_END && at + 22 + le16(b + at + 20) == tail)
            break;
    if (!rc && at == (size_t)-1)
        rc = zr_err_set(ZR_ECORRUPT, "%s: no end of central directory record: not a zip, or "
                        "truncated", z->path);
    if (rc) {
        free(b);
        return rc;
    }
    uint64_t end_at = z->len - tail + at;
    *count = le16(b + at + 10);
    *cd_bytes = le32(b + at + 12);
    *cd_off = le32(b + at + 16);
    int disk = le16(b + at + 4) || le16(b + at + 6);
    free(b);
    if (disk)
        return zr_err_set(ZR_ECORRUPT, "%s: a multi-disk zip", z->path);
    /* ZIP64: the locator just before the end record */
    unsigned char loc[20], e64[56];
    if (end_at >= 20) {
        ZR_TRY(zread(z, end_at - 20, loc, 20, "the ZIP64 locator"));
        if (le32(loc) == SIG_LOC64) {
            uint64_t at64 = le64(loc + 8);
            ZR_TRY(zread(z, at64, e64, 56, "the ZIP64 end of central directory"));
            if (le32(e64) != SIG_END64)
                return zr_err_set(ZR_ECORRUPT, "%s: the ZIP64 locator points at byte %llu, "
                                  "which holds no ZIP64 end record", z->path,
                                  (unsigned long long)at64);
            *count = le64(e64 + 32);
            *cd_bytes = le64(e64 + 40);
            *cd_off = le64(e64 + 48);
            end_at = at64;
        }
    }
    if (*cd_off > end_at || *cd_bytes > end_at - *cd_off)
        return zr_err_set(ZR_ECORRUPT, "%s: the central directory (%llu bytes at %llu) lies "
                          "outside the zip: truncated?", z->path, (unsigned long long)*cd_bytes,
                          (unsigned long long)*cd_off);
    if (*cd_bytes > MAX_CD_BYTES)
        return zr_err_set(ZR_ECORRUPT, "%s: a central directory of %llu bytes (at most %llu)",
                          z->path, (unsigned long long)*cd_bytes,
                          (unsigned long long)MAX_CD_BYTES);
    if (*count > *cd_bytes / 46)
        return zr_err_set(ZR_ECORRUPT, "%s: %llu records cannot fit a central directory of "
                          "%llu bytes", z->path, (unsigned long long)*count,
                          (unsigned long long)*cd_bytes);
    return 0;
}

/* the ZIP64 extra field of a central entry: the fields that were 0xffffffff, in order */
static int zip64_extra(const zfmt__zip *z, const unsigned char *x, size_t xn, const char *name,
                       uint64_t *usize, uint64_t *csize, uint64_t *off)
{
    uint64_t *want[3] = {*usize == 0xffffffffu ? usize : NULL,
                         *csize == 0xffffffffu ? csize : NULL,
                         *off == 0xffffffffu ? off : NULL};
    if (!want[0] && !want[1] && !want[2])
        return 0;
    for (size_t at = 0; at + 4 <= xn;) {
        size_t id = le16(x + at), len = le16(x + at + 2);
        if (at + 4 + len > xn)
            break;
        if (id == 1) {
            size_t k = 0;
            for (int f = 0; f < 3; f++) {
                if (!want[f])
                    continue;
                if (k + 8 > len)
                    return zr_err_set(ZR_ECORRUPT, "%s: record '%s': short ZIP64 field",
                                      z->path, name);
                *want[f] = le64(x + at + 4 + k);
                k += 8;
            }
            return 0;
        }
        at += 4 + len;
    }
    return zr_err_set(ZR_ECORRUPT, "%s: record '%s' needs a ZIP64 field it lacks", z->path,
                      name);
}

static int cmp_off(const void *a, const void *b)
{
    const zfmt__zip_entry *x = *(const zfmt__zip_entry *const *)a,
                          *y = *(const zfmt__zip_entry *const *)b;
    return x->data_off < y->data_off ? -1 : x->data_off > y->data_off;
}
static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const zfmt__zip_entry *const *)a)->name,
                  (*(const zfmt__zip_entry *const *)b)->name);
}

/* One central entry at cd[*at]: fills e and moves *at past it. */
static int central_entry(zfmt__zip *z, const unsigned char *cd, uint64_t cd_bytes, size_t *at,
                         uint64_t cd_off, zfmt__zip_entry *e)
{
    const unsigned char *p = cd + *at;
    if (*at + 46 > cd_bytes || le32(p) != SIG_CENTRAL)
        return zr_err_set(ZR_ECORRUPT, "%s: central directory entry %zu is damaged", z->path,
                          (size_t)(e - z->e));
    size_t nn = le16(p + 28), xn = le16(p + 30), cn = le16(p + 32);
    if (*at + 46 + nn + xn + cn > cd_bytes)
        return zr_err_set(ZR_ECORRUPT, "%s: central directory entry %zu runs past its end",
                          z->path, (size_t)(e - z->e));
    if (nn == 0 || memchr(p + 46, 0, nn))
        return zr_err_set(ZR_ECORRUPT, "%s: a record with an empty or NUL-holding name",
                          z->path);
    if (!(e->name = strndup((const char *)p + 46, nn)))
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", z->path);
    char shown[128];
    zr_printable(shown, sizeof shown, e->name);
    unsigned flags = le16(p + 8), method = le16(p + 10);
    uint64_t csize = le32(p + 20), usize = le32(p + 24), loff = le32(p + 42);
    e->crc = le32(p + 16);
    ZR_TRY(zip64_extra(z, p + 46 + nn, xn, shown, &usize, &csize, &loff));
    if (flags & 1)
        return zr_err_set(ZR_ECORRUPT, "%s: record '%s' is encrypted", z->path, shown);
    if (method != 0 || csize != usize)
        return zr_err_set(ZR_EUNSUPPORTED, "%s: record '%s' is compressed (method %u); "
                          "torch.save stores records uncompressed", z->path, shown, method);
    /* the local header: its name must be this one; the data follows it */
    unsigned char lh[30];
    ZR_TRY(zread(z, loff, lh, 30, "a local header"));
    size_t lnn = le16(lh + 26), lxn = le16(lh + 28);
    if (le32(lh) != SIG_LOCAL || lnn != nn)
        return zr_err_set(ZR_ECORRUPT, "%s: record '%s': no local header at byte %llu",
                          z->path, shown, (unsigned long long)loff);
    char *lname = malloc(nn);
    if (!lname)
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", z->path);
    int rc = zread(z, loff + 30, lname, nn, "a local header's name");
    if (!rc && memcmp(lname, e->name, nn))
        rc = zr_err_set(ZR_ECORRUPT, "%s: record '%s': the local header at byte %llu names "
                        "another record", z->path, shown, (unsigned long long)loff);
    free(lname);
    ZR_TRY(rc);
    e->data_off = loff + 30 + lnn + lxn;
    e->size = usize;
    if (e->data_off > cd_off || e->size > cd_off - e->data_off)
        return zr_err_set(ZR_ECORRUPT, "%s: record '%s' (%llu bytes at %llu) runs into the "
                          "central directory at %llu: truncated or damaged", z->path, shown,
                          (unsigned long long)e->size, (unsigned long long)e->data_off,
                          (unsigned long long)cd_off);
    *at += 46 + nn + xn + cn;
    return 0;
}

/* The root folder, every name under it, no duplicates, no overlapping records. */
static int check_records(zfmt__zip *z)
{
    if (z->n == 0)
        return zr_err_set(ZR_ECORRUPT, "%s: an empty zip", z->path);
    const char *slash = strchr(z->e[0].name, '/');
    if (!slash || slash == z->e[0].name)
        return zr_err_set(ZR_ECORRUPT, "%s: the first record is not in a folder: not a "
                          "torch.save file", z->path);
    if (!(z->root = strndup(z->e[0].name, (size_t)(slash - z->e[0].name))))
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", z->path);
    size_t rl = strlen(z->root);
    zfmt__zip_entry **v = malloc(z->n * sizeof *v);
    if (!v)
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", z->path);
    int rc = 0;
    char shown[128];
    for (size_t i = 0; i < z->n && !rc; i++) {
        v[i] = &z->e[i];
        if (strncmp(z->e[i].name, z->root, rl) || z->e[i].name[rl] != '/')
            rc = zr_err_set(ZR_ECORRUPT, "%s: record '%s' is outside the root folder '%s'",
                            z->path, zr_printable(shown, sizeof shown, z->e[i].name), z->root);
    }
    if (!rc) {
        qsort(v, z->n, sizeof *v, cmp_name);
        for (size_t i = 1; i < z->n && !rc; i++)
            if (!strcmp(v[i - 1]->name, v[i]->name))
                rc = zr_err_set(ZR_ECORRUPT, "%s: two records named '%s'", z->path,
                                zr_printable(shown, sizeof shown, v[i]->name));
    }
    if (!rc) {
        qsort(v, z->n, sizeof *v, cmp_off);
        for (size_t i = 1; i < z->n && !rc; i++)
            if (v[i - 1]->data_off + v[i - 1]->size > v[i]->data_off - 30)
                rc = zr_err_set(ZR_ECORRUPT, "%s: records '%s' and '%s' overlap", z->path,
                                v[i - 1]->name, zr_printable(shown, sizeof shown, v[i]->name));
    }
    free(v);
    return rc;
}

static int zip_parse(zfmt__zip *z)
{
    uint64_t cd_off = 0, cd_bytes = 0, count = 0;
    ZR_TRY(find_end(z, &cd_off, &cd_bytes, &count));
    unsigned char *cd = malloc(cd_bytes ? cd_bytes : 1);
    if (!cd || !(z->e = calloc(count ? count : 1, sizeof *z->e))) {
        free(cd);
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", z->path);
    }
    int rc = zread(z, cd_off, cd, cd_bytes, "the central directory");
    size_t at = 0;
    for (; !rc && z->n < count; z->n++)
        rc = central_entry(z, cd, cd_bytes, &at, cd_off, &z->e[z->n]);
    free(cd); /* on failure n counts the failed entry too: its name (if any) is freed */
    return rc ? rc : check_records(z);
}

int zfmt__zip_open_slice(zfmt__zip **out, int fd, const char *path, uint64_t off, uint64_t len)
{
    *out = NULL;
    zfmt__zip *z = calloc(1, sizeof *z);
    if (!z || !(z->path = strdup(path))) {
        free(z);
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", path);
    }
    z->fd = fd;
    z->base = off;
    z->len = len;
    int rc = zip_parse(z);
    if (rc) {
        zfmt__zip_free(z);
        return rc;
    }
    *out = z;
    return 0;
}

int zfmt__zip_open(zfmt__zip **out, const char *path)
{
    *out = NULL;
    int fd;
    uint64_t bytes;
    ZR_TRY(zck_open_regular(&fd, path, ZCK_FOLLOW, &bytes));
    int rc = zfmt__zip_open_slice(out, fd, path, 0, bytes);
    if (rc) {
        close(fd);
        return rc;
    }
    (*out)->own_fd = 1;
    return 0;
}

void zfmt__zip_free(zfmt__zip *z)
{
    if (!z)
        return;
    for (size_t i = 0; i < z->n; i++)
        free(z->e[i].name);
    free(z->e);
    if (z->own_fd)
        close(z->fd);
    free(z->root);
    free(z->path);
    free(z);
}

const zfmt__zip_entry *zfmt__zip_find(const zfmt__zip *z, const char *rel)
{
    size_t rl = strlen(z->root);
    for (size_t i = 0; i < z->n; i++)
        if (!strcmp(z->e[i].name + rl + 1, rel))
            return &z->e[i];
    return NULL;
}

int zfmt__zip_read(const zfmt__zip *z, const zfmt__zip_entry *e, uint64_t off, void *buf,
                   size_t n)
{
    if (off > e->size || n > e->size - off)
        return zr_err_set(ZR_ECORRUPT, "%s: record '%s' has %llu bytes, %zu wanted at %llu",
                          z->path, e->name, (unsigned long long)e->size, n,
                          (unsigned long long)off);
    return zread(z, e->data_off + off, buf, n, "a record");
}

int zfmt__zip_slurp(const zfmt__zip *z, const zfmt__zip_entry *e, size_t max, char **out)
{
    *out = NULL;
    if (e->size > max)
        return zr_err_set(ZR_ECORRUPT, "%s: record '%s' holds %llu bytes, at most %zu expected",
                          z->path, e->name, (unsigned long long)e->size, max);
    char *b = malloc((size_t)e->size + 1);
    if (!b)
        return zr_err_set(ZR_ENOMEM, "%s: out of memory reading '%s'", z->path, e->name);
    int rc = zfmt__zip_read(z, e, 0, b, (size_t)e->size);
    if (rc) {
        free(b);
        return rc;
    }
    b[e->size] = 0;
    *out = b;
    return 0;
}

int zfmt__zip_check_crc(const zfmt__zip *z, const zfmt__zip_entry *e)
{
    size_t chunk = (size_t)1 << 20;
    char *b = malloc(chunk);
    if (!b)
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", z->path);
    uint32_t crc = 0;
    int rc = 0;
    for (uint64_t at = 0; at < e->size && !rc; at += chunk) {
        size_t n = e->size - at < chunk ? (size_t)(e->size - at) : chunk;
        if (!(rc = zfmt__zip_read(z, e, at, b, n)))
            crc = zfmt__crc32(crc, b, n);
    }
    free(b);
    ZR_TRY(rc);
    /* torch.serialization.set_crc32_options(False) writes 0: no CRC recorded, none checked */
    if (crc != e->crc && e->crc != 0)
        return zr_err_set(ZR_ECORRUPT, "%s: record '%s': CRC-32 %08x, the zip says %08x (its "
                          "bytes changed after torch.save wrote them)", z->path, e->name, crc,
                          e->crc);
    return 0;
}

/* ---------------------------------------------------------------- writing */

#define ZIPW_ALIGN 64 /* torch's kFieldAlignment */

static void put16(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v)
{
    put16(p, v & 0xffff);
    put16(p + 2, v >> 16);
}

void zfmt__zipw_init(zfmt__zipw *z, zfmt__out *o, uint64_t base)
{
    *z = (zfmt__zipw){.o = o, .base = base};
}

/* the local header of record k (crc as known), with the padding extra field "FB" that puts its
 * data on a 64-byte boundary of the zip, at its offset */
static int local_header(zfmt__zipw *z, size_t k, uint64_t *hdr_bytes)
{
    unsigned char h[30 + 64 + ZIPW_ALIGN + 4];
    size_t nl = strlen(z->e[k].name);
    uint64_t data = z->e[k].off + 30 + nl + 4;
    size_t pad = (size_t)((ZIPW_ALIGN - data % ZIPW_ALIGN) % ZIPW_ALIGN);
    memset(h, 0, 30);
    put32(h, 0x04034b50);
    put16(h + 4, 20);        /* version needed */
    put16(h + 6, 0x0800);    /* UTF-8 names */
    put32(h + 14, z->e[k].crc);
    put32(h + 18, (uint32_t)z->e[k].size);
    put32(h + 22, (uint32_t)z->e[k].size);
    put16(h + 26, (uint32_t)nl);
    put16(h + 28, (uint32_t)(4 + pad));
    memcpy(h + 30, z->e[k].name, nl);
    put16(h + 30 + nl, 0x4246); /* "FB" */
    put16(h + 32 + nl, (uint32_t)pad);
    memset(h + 34 + nl, 'Z', pad);
    *hdr_bytes = 34 + nl + pad;
    return zfmt__out_pwrite(z->o, h, (size_t)*hdr_bytes, z->base + z->e[k].off);
}

int zfmt__zipw_begin(zfmt__zipw *z, const char *name, uint64_t size, uint64_t *data_at)
{
    if (z->n >= sizeof z->e / sizeof *z->e || strlen(name) + 9 >= sizeof z->e[0].name)
        return zr_err_set(ZR_EINVAL, "torch.save zip: too many records or too long a name");
    if (size >= 0xffffffffu)
        return zr_err_set(ZR_EUNSUPPORTED, "torch.save zip: a record of %llu bytes (4 GiB or "
                          "more needs ZIP64, not written)", (unsigned long long)size);
    size_t k = z->n++;
    snprintf(z->e[k].name, sizeof z->e[k].name, "archive/%s", name);
    z->e[k].off = z->at;
    z->e[k].size = size;
    z->e[k].crc = 0;
    uint64_t hl;
    ZR_TRY(local_header(z, k, &hl));
    *data_at = z->base + z->at + hl;
    z->at += hl + size;
    return 0;
}

int zfmt__zipw_end(zfmt__zipw *z, uint32_t crc)
{
    uint64_t hl;
    z->e[z->n - 1].crc = crc;
    return local_header(z, z->n - 1, &hl); /* again, with the CRC-32 */
}

int zfmt__zipw_record(zfmt__zipw *z, const char *name, const void *data, size_t n)
{
    uint64_t at;
    ZR_TRY(zfmt__zipw_begin(z, name, n, &at));
    ZR_TRY(zfmt__out_pwrite(z->o, data, n, at));
    return zfmt__zipw_end(z, zfmt__crc32(0, data, n));
}

int zfmt__zipw_finish(zfmt__zipw *z, uint64_t *len)
{
    unsigned char c[46 + 64];
    uint64_t cd = z->at;
    for (size_t k = 0; k < z->n; k++) {
        size_t nl = strlen(z->e[k].name);
        memset(c, 0, 46);
        put32(c, 0x02014b50);
        put16(c + 4, 20);  /* version made by */
        put16(c + 6, 20);  /* version needed */
        put16(c + 8, 0x0800);
        put32(c + 16, z->e[k].crc);
        put32(c + 20, (uint32_t)z->e[k].size);
        put32(c + 24, (uint32_t)z->e[k].size);
        put16(c + 28, (uint32_t)nl);
        put32(c + 42, (uint32_t)z->e[k].off);
        memcpy(c + 46, z->e[k].name, nl);
        ZR_TRY(zfmt__out_pwrite(z->o, c, 46 + nl, z->base + z->at));
        z->at += 46 + nl;
    }
    if (z->at >= 0xffffffffu)
        return zr_err_set(ZR_EUNSUPPORTED, "torch.save zip: 4 GiB or more needs ZIP64, not "
                          "written");
    memset(c, 0, 22);
    put32(c, 0x06054b50);
    put16(c + 8, (uint32_t)z->n);
    put16(c + 10, (uint32_t)z->n);
    put32(c + 12, (uint32_t)(z->at - cd));
    put32(c + 16, (uint32_t)cd);
    ZR_TRY(zfmt__out_pwrite(z->o, c, 22, z->base + z->at));
    z->at += 22;
    *len = z->at;
    return 0;
}
