/*
 * fuzz_llmc_model.c: fuzz target for the import of a model file (zfmt_import of a single file):
 * llm.c's model header (magic, version, shape fields, padded vocabulary, file size) and, for
 * other bytes, the safetensors path of the import. An accepted file is imported as a new
 * checkpoint in a scratch run directory, which must then read back.
 */
#include "fuzz.h"
#include "zfmt.h"

#include <stdio.h>
#include <stdlib.h>

int zfuzz_llmc_model(const uint8_t *data, size_t size)
{
    const char *src = zfuzz_file(data, size);
    char run[8192];
    snprintf(run, sizeof run, "%s", zfuzz_path("import"));
    zfuzz_rmtree(run);
    zfmt_import_opts o = ZFMT_IMPORT_OPTS_INIT;
    o.heads = 1; /* a bare safetensors file of ours needs it */
    zr_err_clear();
    int ok = zfuzz_verdict(zfmt_import(src, run, &o), "zfmt_import");
    if (ok) {
        zck_reader *r = NULL;
        if (zck_reader_open(&r, run) < 0) {
            fprintf(stderr, "fuzz: an imported model does not open: %s\n", zr_err_msg());
            abort();
        }
        zck_reader_free(r);
    }
    zfuzz_rmtree(run);
    return ok;
}

ZFUZZ_ENTRY(zfuzz_llmc_model)
