/*
 * tok_files.c: llm.c token files (zfmt.h, "llm.c token files"): encoding text files into one,
 * with an optional validation tail in a second, and reading one back.
 *
 * Memory: the ids of all files (4 bytes a token) and one file's text at a time.
 */
#include "tok_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEADER_INTS (ZCK_TOKENS_HEADER_BYTES / 4)
#define VERSION_U16 ZCK_TOKENS_U16
#define VERSION_U32 ZCK_TOKENS_U32

static int write_tokens(const char *path, const uint32_t *ids, size_t n, uint32_t vocab,
                        int version)
{
    int32_t h[HEADER_INTS] = {0};
    h[0] = ZCK_TOKENS_MAGIC;
    h[1] = version;
    h[2] = (int32_t)n;
    h[3] = (int32_t)vocab;
    zfmt__out *o;
    ZR_TRY(zfmt__out_open(&o, path));
    int rc = zfmt__out_write(o, h, sizeof h);
    if (version == VERSION_U32) {
        if (rc == 0)
            rc = zfmt__out_write(o, ids, n * sizeof *ids);
    } else {
        uint16_t buf[4096];
        for (size_t i = 0; i < n && rc == 0;) {
            size_t k = 0;
            for (; k < 4096 && i < n; k++, i++)
                buf[k] = (uint16_t)ids[i];
            rc = zfmt__out_write(o, buf, k * sizeof *buf);
        }
    }
    if (rc == 0)
        rc = zfmt__out_commit(o);
    zfmt__out_free(o);
    return rc;
}

int zfmt_tok_encode_files(zfmt_tok_file_stats *out, zfmt_tok *t, const char *const *files,
                          size_t n_files, const char *out_bin, const char *out_val,
                          const zfmt_tok_file_opts *o)
{
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return zr_err_set(ZR_EINVAL, "validation fraction %g: expected [0, 1)", o->val_fraction);
    zfmt_tok_file_stats st = {0};
    zfmt_tok_ids ids = {0};
    int rc = 0;
    for (size_t i = 0; i < n_files && rc == 0; i++) {
        char *text;
        size_t n;
        if ((rc = zfmt__read_file(&text, &n, files[i])) < 0)
            break;
        rc = zfmt_tok_encode(&ids, t, text, n, &o->progress);
        if (rc < 0)
            zr_err_prefix("%s: ", files[i]);
        st.bytes += n;
        free(text);
    }
    uint32_t vocab = zfmt_tok_vocab(t);
    st.version = vocab > 65536 ? VERSION_U32 : VERSION_U16;
    size_t n_val = out_val ? (size_t)(o->val_fraction * (double)ids.n + 0.5) : 0;
    size_t most = ids.n - n_val > n_val ? ids.n - n_val : n_val;
    if (rc == 0 && most > INT32_MAX)
        rc = zr_err_set(ZR_EINVAL, "%zu tokens: a token file holds at most %d", most, INT32_MAX);
    if (rc == 0 && n_val && out_val)
        rc = write_tokens(out_val, ids.id + ids.n - n_val, n_val, vocab, st.version);
    if (rc == 0)
        rc = write_tokens(out_bin, ids.id, ids.n - n_val, vocab, st.version);
    st.tokens = ids.n - n_val;
    st.val_tokens = n_val;
    zfmt_tok_ids_free(&ids);
    if (rc == 0)
        *out = st;
    return rc;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The header is checked against the file's size before any token is read: a file whose size
 * the header does not explain is refused at once, whatever its length. */
int zfmt_tok_file_read(zfmt_tok_ids *out, uint32_t *vocab, const char *path)
{
    int fd;
    uint64_t size;
    ZR_TRY(zck_open_regular(&fd, path, ZCK_FOLLOW, &size));
    uint8_t head[ZCK_TOKENS_HEADER_BYTES];
    size_t head_n = size < sizeof head ? (size_t)size : sizeof head;
    zck_token_header h;
    int rc = zfmt__pread_full(fd, head, head_n, 0, path);
    if (rc == 0)
        rc = zck_token_header_parse(&h, head, size < SIZE_MAX ? (size_t)size : SIZE_MAX, path);
    uint8_t *buf = NULL;
    uint32_t *ids = NULL;
    size_t data_n = rc == 0 ? (size_t)h.count * (size_t)h.width : 0;
    if (rc == 0 && (!(buf = malloc(data_n ? data_n : 1)) ||
                    !(ids = malloc((h.count ? h.count : 1) * sizeof *ids))))
        rc = zr_err_set(ZR_ENOMEM, "%s: out of memory (%llu tokens)", path,
                        (unsigned long long)h.count);
    if (rc == 0)
        rc = zfmt__pread_full(fd, buf, data_n, ZCK_TOKENS_HEADER_BYTES, path);
    close(fd);
    for (size_t i = 0; rc == 0 && i < h.count; i++) {
        uint32_t id = h.width == 4 ? le32(buf + 4 * i) : (uint32_t)buf[2 * i] | buf[2 * i + 1] << 8;
        if (h.vocab && id >= h.vocab)
            rc = zr_err_set(ZR_ECORRUPT, "llm.c token file '%s': id %u (position %zu) is beyond "
                            "the vocabulary of %u its header declares", path, id, i, h.vocab);
        else
            ids[i] = id;
    }
    free(buf);
    if (rc < 0) {
        free(ids);
        return rc;
    }
    out->id = ids;
    out->n = out->cap = h.count;
    *vocab = h.vocab;
    return 0;
}

int zfmt_tok_file_decode(char **out, size_t *n_bytes, const zfmt_tok *t, const char *path)
{
    zfmt_tok_ids ids = {0};
    uint32_t vocab;
    ZR_TRY(zfmt_tok_file_read(&ids, &vocab, path));
    int rc = 0;
    if (vocab > zfmt_tok_vocab(t))
        rc = zr_err_set(ZR_EINVAL, "%s was written for a vocabulary of %u, the tokenizer %s has "
                        "%u", path, vocab, zfmt__tok_name(t), zfmt_tok_vocab(t));
    if (rc == 0)
        rc = zfmt__tok_decode_from(out, n_bytes, t, ids.id, ids.n, path);
    zfmt_tok_ids_free(&ids);
    return rc;
}
