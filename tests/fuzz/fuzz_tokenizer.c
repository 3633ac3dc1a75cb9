/*
 * fuzz_tokenizer.c: fuzz target for the tokenizer.json reader (formats/tokenizer.c): the input
 * is a tokenizer.json. One that loads must encode a fixed varied text (ASCII, accents, CJK,
 * emoji, digits, whitespace runs, contractions, <|endoftext|>) into ids below its vocabulary
 * that decode without error, to no more bytes than the text; one refused must say why.
 */
#include "fuzz.h"
#include "zfmt.h"

#include <stdlib.h>
#include <string.h>

static const char text[] =
    "Hello world! It's 42 caf\xc3\xa9s, we'll see. \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
    "\xf0\x9f\x98\x80   spaces\t\n\n<|endoftext|>next 3.14 don't";

int zfuzz_tokenizer(const uint8_t *data, size_t size)
{
    zfmt_tok *t = NULL;
    zr_err_clear();
    int ok = zfuzz_verdict(zfmt_tok_load_mem(&t, (const char *)data, size, "tokenizer.json"),
                           "zfmt_tok_load_mem");
    if (!ok)
        return 0;
    zfmt_tok_ids ids = {0};
    if (zfmt_tok_encode(&ids, t, text, sizeof text - 1, NULL) < 0)
        abort(); /* the text is UTF-8: encoding cannot fail but for memory */
    for (size_t i = 0; i < ids.n; i++)
        if (ids.id[i] >= zfmt_tok_vocab(t))
            abort();
    char *back;
    size_t n;
    if (zfmt_tok_decode(&back, &n, t, ids.id, ids.n) < 0 || n > sizeof text - 1)
        abort();
    free(back);
    zfmt_tok_ids_free(&ids);
    zfmt_tok_free(t);
    return 1;
}

ZFUZZ_ENTRY(zfuzz_tokenizer)
