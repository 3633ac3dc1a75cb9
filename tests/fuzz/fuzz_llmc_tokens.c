/*
 * fuzz_llmc_tokens.c: fuzz target for the data files of core/model/data.c through its public
 * API (zr_data_open): llm.c's token-file header (magic, version, count against the file size,
 * tokens within the vocabulary), its damaged look-alikes, and raw bytes. An accepted file must
 * give samples of T + 1 tokens within the vocabulary.
 */
#include "fuzz.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>

enum { VOCAB = 50257, T = 8 };

int zfuzz_llmc_tokens(const uint8_t *data, size_t size)
{
    zr_data *d = NULL;
    zr_err_clear();
    int ok = zfuzz_verdict(zr_data_open(&d, zfuzz_file(data, size), VOCAB, T, 1234),
                           "zr_data_open");
    if (!ok)
        return 0;
    int32_t tok[T + 1];
    for (uint64_t i = 0; i < 4; i++) {
        zr_data_sample(d, i, tok);
        for (int k = 0; k <= T; k++)
            if (tok[k] < 0 || tok[k] >= VOCAB) {
                fprintf(stderr, "fuzz: sample %llu token %d is %d, outside the vocabulary\n",
                        (unsigned long long)i, k, (int)tok[k]);
                abort();
            }
    }
    zr_data_free(d);
    return 1;
}

ZFUZZ_ENTRY(zfuzz_llmc_tokens)
