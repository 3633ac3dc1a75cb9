/*
 * fuzz_manifest.c: libFuzzer target for the manifest parser and validator. The same entry
 * point replays tests/fuzz/corpus/manifest/ as a plain regression test in make test.
 */
#include "zck_int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    zck_manifest *m = NULL;
    if (zck__manifest_parse(&m, (const char *)data, size, "fuzz") == 0) {
        /* anything accepted must serialize and parse back to the same text */
        char *a = NULL, *b = NULL;
        zck_manifest *m2 = NULL;
        if (zck__manifest_dump(&a, m) == 0 &&
            zck__manifest_parse(&m2, a, strlen(a), "fuzz-again") == 0 &&
            zck__manifest_dump(&b, m2) == 0 && strcmp(a, b) != 0)
            abort();
        free(a);
        free(b);
        zck__manifest_free(m2);
        zck__manifest_free(m);
    } else if (zr_err_msg()[0] == 0) {
        abort(); /* every rejection must say why */
    }
    return 0;
}
