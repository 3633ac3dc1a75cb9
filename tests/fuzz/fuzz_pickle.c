/*
 * fuzz_pickle.c: fuzz target for the restricted unpickler (formats/pickle.c) on raw pickle bytes
 * (DCP's .metadata is a bare pickle). It must accept or refuse with a message, within its memory
 * budget, and never run anything; an accepted value must describe itself and answer lookups.
 */
#include "foreign.h"
#include "fuzz.h"

#include <stdlib.h>

int zfuzz_pickle(const uint8_t *data, size_t size)
{
    zfmt__pickle *p = NULL;
    zr_err_clear();
    if (!zfuzz_verdict(zfmt__pickle_load(&p, data, size, "fuzz.pkl", 1 << 24), "pickle_load"))
        return 0;
    const zfmt__pv *root = zfmt__pickle_root(p);
    char d[256];
    int64_t i;
    zfmt__pv_describe(root, d, sizeof d);
    (void)zfmt__pv_get(root, "state_dict_metadata");
    (void)zfmt__pv_attr(root, "storage_data");
    (void)zfmt__pv_int(root, &i);
    zfmt__pickle_free(p);
    return 1;
}

ZFUZZ_ENTRY(zfuzz_pickle)
