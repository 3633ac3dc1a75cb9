/*
 * fuzz_manifest.c: fuzz target for the manifest parser and validator (zck__manifest_parse).
 * Anything accepted must dump and parse back to the same text.
 */
#include "fuzz.h"
#include "zck_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int zfuzz_manifest_roundtrip(const void *mv)
{
    const zck_manifest *m = mv;
    char *a = NULL, *b = NULL;
    zck_manifest *m2 = NULL;
    int rc = -1;
    if (zck__manifest_dump(&a, m) < 0)
        fprintf(stderr, "fuzz: an accepted manifest does not dump: %s\n", zr_err_msg());
    else if (zck__manifest_parse(&m2, a, strlen(a), "fuzz-again") < 0)
        fprintf(stderr, "fuzz: the dump of an accepted manifest does not parse back: %s\n",
                zr_err_msg());
    else if (zck__manifest_dump(&b, m2) < 0)
        fprintf(stderr, "fuzz: a re-parsed manifest does not dump: %s\n", zr_err_msg());
    else if (strcmp(a, b))
        fprintf(stderr, "fuzz: dump, parse, dump changed the text\n");
    else
        rc = 0;
    free(a);
    free(b);
    zck__manifest_free(m2);
    return rc;
}

int zfuzz_manifest(const uint8_t *data, size_t size)
{
    zck_manifest *m = NULL;
    zr_err_clear();
    int ok = zfuzz_verdict(zck__manifest_parse(&m, (const char *)data, size, "fuzz"),
                           "zck__manifest_parse");
    if (ok && zfuzz_manifest_roundtrip(m) < 0)
        abort();
    zck__manifest_free(m);
    return ok;
}

ZFUZZ_ENTRY(zfuzz_manifest)
