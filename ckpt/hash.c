/*
 * hash.c: SHA-256 through OpenSSL's EVP interface (SHA-NI where the CPU has it). This file is
 * the one adapter between OpenSSL's "1 means success" convention and ours.
 */
#include "zck_int.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <pthread.h>

struct zck__sha {
    EVP_MD_CTX *c;
};

int zck__sha_new(zck__sha **out)
{
    zck__sha *h = calloc(1, sizeof *h);
    if (!h || !(h->c = EVP_MD_CTX_new())) {
        free(h);
        return zr_err_set(ZR_ENOMEM, "out of memory creating a sha256 context");
    }
    if (EVP_DigestInit_ex(h->c, EVP_sha256(), NULL) != 1) {
        unsigned long e = ERR_get_error();
        EVP_MD_CTX_free(h->c);
        free(h);
        return zr_err_set(ZR_ERROR, "openssl: sha256 init failed: %s",
                          e ? ERR_error_string(e, NULL) : "unknown error");
    }
    *out = h;
    return 0;
}

void zck__sha_update(zck__sha *h, const void *p, size_t n)
{
    /* EVP_DigestUpdate fails only on a misused context, which is a programming error */
    int ok = EVP_DigestUpdate(h->c, p, n);
    (void)ok;
}

void zck__sha_hex(zck__sha *h, char out[65])
{
    unsigned char md[32];
    unsigned int n = 0;
    EVP_DigestFinal_ex(h->c, md, &n);
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[64] = 0;
}


void zck__sha_free(zck__sha *h)
{
    if (!h)
        return;
    EVP_MD_CTX_free(h->c);
    free(h);
}

struct hash_ctx {
    zck__sha *h;
    zck__hash_tick *tick;
    zck__chunk_fn fn;
    void *fn_ctx;
};

static int hash_chunk(void *ctx, uint64_t off, const unsigned char *p, size_t len)
{
    struct hash_ctx *c = ctx;
    zck__sha_update(c->h, p, len);
    if (c->tick)
        zck__hash_tick_add(c->tick, len);
    return c->fn ? c->fn(c->fn_ctx, off, p, len) : 0;
}

void zck__hash_tick_add(zck__hash_tick *t, uint64_t n)
{
    uint64_t done = atomic_fetch_add(&t->done, n) + n;
    /* only the thread that started the work may call back, and not too often */
    if (t->progress.fn && pthread_equal(pthread_self(), t->owner) && done - t->last >= (8u << 20)) {
        t->last = done;
        t->progress.fn(t->progress.ctx, t->what, done, t->total);
    }
}

int zck__sha256_file_ticked(char out[65], const char *path, const zck_io_opts *opts,
                            zck__hash_tick *tick, zck__chunk_fn fn, void *fn_ctx)
{
    zck__io *io = NULL;
    struct hash_ctx hc = {NULL, tick, fn, fn_ctx};
    uint64_t size;
    int rc = 0;
    ZR_TRY_GOTO(zck__io_open(&io, path, ZCK__IO_READ, opts), rc, out);
    ZR_TRY_GOTO(zck__io_size(io, &size), rc, out);
    ZR_TRY_GOTO(zck__sha_new(&hc.h), rc, out);
    zck__span span = {0, size, NULL};
    ZR_TRY_GOTO(zck__io_read_spans(io, &span, 1, hash_chunk, &hc), rc, out);
    zck__sha_hex(hc.h, out);
out:
    zck__sha_free(hc.h);
    if (io) {
        int crc = zck__io_close(io);
        if (!rc)
            rc = crc;
    }
    return rc;
}

int zck_sha256_file(char out[65], const char *path, const zck_io_opts *opts)
{
    return zck__sha256_file_ticked(out, path, opts, NULL, NULL, NULL);
}

/* the public face of the same context */
int zck_sha256_new(zck_sha256 **out) { return zck__sha_new((zck__sha **)out); }
void zck_sha256_update(zck_sha256 *h, const void *p, size_t n)
{
    zck__sha_update((zck__sha *)h, p, n);
}
void zck_sha256_hex(zck_sha256 *h, char out[65]) { zck__sha_hex((zck__sha *)h, out); }
void zck_sha256_free(zck_sha256 *h) { zck__sha_free((zck__sha *)h); }
