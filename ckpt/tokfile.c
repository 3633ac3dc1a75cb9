/*
 * tokfile.c: the header of an llm.c token file (zck.h, "llm.c token files"), parsed once for
 * the engine's data loader (core/model/data.c) and the tokenizer tools (formats/tok_files.c).
 */
#include "zck.h"

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int zck_token_header_parse(zck_token_header *out, const void *data, size_t size,
                           const char *path)
{
    const unsigned char *p = data;
    if (size < ZCK_TOKENS_HEADER_BYTES)
        return zr_err_set(ZR_ECORRUPT, "llm.c token file '%s': truncated header (%zu bytes, "
                          "expected %d)", path, size, ZCK_TOKENS_HEADER_BYTES);
    if (le32(p) != ZCK_TOKENS_MAGIC)
        return zr_err_set(ZR_ECORRUPT, "'%s': not an llm.c token file (magic %u, expected %d)",
                          path, le32(p), ZCK_TOKENS_MAGIC);
    uint32_t version = le32(p + 4);
    int32_t count = (int32_t)le32(p + 8);
    if (version != ZCK_TOKENS_U16 && version != ZCK_TOKENS_U32)
        return zr_err_set(ZR_ECORRUPT, "llm.c token file '%s': version %u (expected %d, or %d "
                          "for uint32 tokens)", path, version, ZCK_TOKENS_U16, ZCK_TOKENS_U32);
    if (count < 0)
        return zr_err_set(ZR_ECORRUPT, "llm.c token file '%s': negative token count %d", path,
                          count);
    int width = version == ZCK_TOKENS_U16 ? 2 : 4;
    uint64_t want = ZCK_TOKENS_HEADER_BYTES + (uint64_t)width * (uint64_t)count;
    if (size < want)
        return zr_err_set(ZR_ECORRUPT, "llm.c token file '%s': truncated (header says %d tokens, "
                          "%llu bytes; file has %zu)", path, count, (unsigned long long)want,
                          size);
    if (size > want)
        return zr_err_set(ZR_ECORRUPT, "llm.c token file '%s': %llu bytes after the %d tokens "
                          "the header declares", path, (unsigned long long)(size - want), count);
    out->version = version;
    out->width = width;
    out->count = (uint64_t)count;
    out->vocab = le32(p + 12);
    return 0;
}
