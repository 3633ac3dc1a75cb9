/*
 * fuzz_shard.c: fuzz target for the shard description a rank hands to the commit
 * (zck_shard_from_json over zck__shard_parse). Anything accepted must serialize and parse back
 * to the same text.
 */
#include "fuzz.h"
#include "zck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int zfuzz_shard(const uint8_t *data, size_t size)
{
    zck_shard *s = NULL, *s2 = NULL;
    char *a = NULL, *b = NULL;
    zr_err_clear();
    int ok = zfuzz_verdict(zck_shard_from_json(&s, (const char *)data, size),
                           "zck_shard_from_json");
    if (ok && (zck_shard_to_json(&a, s) < 0 || zck_shard_from_json(&s2, a, strlen(a)) < 0 ||
               zck_shard_to_json(&b, s2) < 0 || strcmp(a, b))) {
        fprintf(stderr, "fuzz: an accepted shard record does not round-trip: %s\n",
                zr_err_msg());
        abort();
    }
    free(a);
    free(b);
    zck_shard_free(s);
    zck_shard_free(s2);
    return ok;
}

ZFUZZ_ENTRY(zfuzz_shard)
