/*
 * fuzz_safetensors.c: fuzz target for the strict safetensors reader (zfmt__st_open): header
 * length, JSON, dtypes, shapes, offsets and tiling. An accepted file must serve every tensor's
 * bytes and every metadata value it listed.
 */
#include "fmtutil.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>

int zfuzz_safetensors(const uint8_t *data, size_t size)
{
    zfmt__st_file *f = NULL;
    zr_err_clear();
    int ok = zfuzz_verdict(zfmt__st_open(&f, zfuzz_file(data, size)), "zfmt__st_open");
    if (!ok)
        return 0;
    for (size_t i = 0; i < f->n; i++) {
        const zfmt__st_entry *e = &f->e[i];
        void *buf = malloc(e->end - e->begin + 1);
        if (!buf || zfmt__st_read(f, e, buf) < 0 ||
            e->end - e->begin != e->numel * zck_dtype_size(e->dtype)) {
            fprintf(stderr, "fuzz: tensor '%s' of an accepted file unreadable: %s\n", e->name,
                    zr_err_msg());
            abort();
        }
        free(buf);
    }
    for (size_t i = 0; i < f->n_meta; i++)
        if (zfmt__st_meta(f, f->meta_keys[i]) == NULL)
            abort();
    zfmt__st_free(f);
    return 1;
}

ZFUZZ_ENTRY(zfuzz_safetensors)
