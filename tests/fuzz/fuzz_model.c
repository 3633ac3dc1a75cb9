/*
 * fuzz_model.c: fuzz target for the model section of the manifest, as the engine reads it
 * (zr_gpt2_config_from_json, core/model/config.c) and as the converters read it
 * (zfmt_gpt2_config_from_json, formats/gpt2.c). Each accepted config must serialize and parse
 * back to the same config.
 */
#include "fuzz.h"
#include "model.h"
#include "zfmt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_engine(const zr_gpt2_config *c)
{
    char *j = NULL;
    zr_gpt2_config c2;
    if (zr_gpt2_config_to_json(&j, c) < 0 || zr_gpt2_config_from_json(&c2, j) < 0 ||
        memcmp(c, &c2, sizeof c2)) {
        fprintf(stderr, "fuzz: model section does not round-trip (engine): %s\n", zr_err_msg());
        abort();
    }
    free(j);
}

static void check_formats(const zfmt_gpt2_config *c)
{
    char *j = NULL;
    zfmt_gpt2_config c2;
    if (zfmt_gpt2_config_to_json(&j, c) < 0 || zfmt_gpt2_config_from_json(&c2, j) < 0 ||
        memcmp(c, &c2, sizeof c2)) {
        fprintf(stderr, "fuzz: model section does not round-trip (formats): %s\n",
                zr_err_msg());
        abort();
    }
    free(j);
}

int zfuzz_model(const uint8_t *data, size_t size)
{
    char *s = zfuzz_cstr(data, size);
    zr_gpt2_config c;
    zfmt_gpt2_config f;
    zr_err_clear();
    int ok = zfuzz_verdict(zr_gpt2_config_from_json(&c, s), "zr_gpt2_config_from_json");
    if (ok)
        check_engine(&c);
    zr_err_clear();
    int okf = zfuzz_verdict(zfmt_gpt2_config_from_json(&f, s), "zfmt_gpt2_config_from_json");
    if (okf)
        check_formats(&f);
    free(s);
    return ok;
}

ZFUZZ_ENTRY(zfuzz_model)
