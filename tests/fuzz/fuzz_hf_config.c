/*
 * fuzz_hf_config.c: fuzz target for the Hugging Face config.json reader of the import
 * (formats/import.c): the input is config.json of a model directory whose model.safetensors is
 * a fixed GPT-2 of L 1, NH 1, C 4, T 2, V 3 in Hugging Face's names (Conv1D weights [in, out]).
 * A config of that shape imports; any other must be refused with a message.
 */
#include "fmtutil.h"
#include "fuzz.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const zfmt_gpt2_config shape = {1, 1, 4, 2, 3};

static void put(json_t *hdr, const char *name, size_t ndim, uint64_t d0, uint64_t d1,
                uint64_t *at)
{
    uint64_t bytes = 4 * d0 * (ndim == 2 ? d1 : 1);
    json_t *e = ndim == 2 ? json_pack("{s:s, s:[I,I], s:[I,I]}", "dtype", "F32", "shape",
                                      (json_int_t)d0, (json_int_t)d1, "data_offsets",
                                      (json_int_t)*at, (json_int_t)(*at + bytes))
                          : json_pack("{s:s, s:[I], s:[I,I]}", "dtype", "F32", "shape",
                                      (json_int_t)d0, "data_offsets", (json_int_t)*at,
                                      (json_int_t)(*at + bytes));
    if (!e || json_object_set_new(hdr, name, e))
        abort();
    *at += bytes;
}

/* dir/model.safetensors of the fixed shape, zeros for every value */
static void write_model(const char *path)
{
    const zfmt_gpt2_config *c = &shape;
    json_t *hdr = json_object();
    uint64_t at = 0;
    put(hdr, "wte.weight", 2, c->vocab, c->dim, &at);
    put(hdr, "wpe.weight", 2, c->ctx, c->dim, &at);
    for (size_t k = 0; k < ZFMT__GPT2_KINDS; k++) {
        size_t nd;
        uint64_t sh[2];
        char name[64];
        zfmt__gpt2_kind_shape(c, k, &nd, sh);
        snprintf(name, sizeof name, "h.0.%s", zfmt__gpt2_kind(k));
        char hf[96];
        int tr;
        if (zfmt__hf_name(zfmt__hf_family_of("gpt2"), hf, sizeof hf, name, &tr) < 0)
            abort();
        if (tr)
            put(hdr, name, 2, sh[1], sh[0], &at);
        else
            put(hdr, name, nd, sh[0], sh[1], &at);
    }
    put(hdr, "ln_f.weight", 1, c->dim, 0, &at);
    put(hdr, "ln_f.bias", 1, c->dim, 0, &at);
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(hdr);
    FILE *f = fopen(path, "wb");
    if (!text || !f)
        abort();
    uint64_t hlen = strlen(text);
    unsigned char len8[8];
    for (int b = 0; b < 8; b++)
        len8[b] = (unsigned char)(hlen >> (8 * b));
    fwrite(len8, 1, 8, f);
    fwrite(text, 1, hlen, f);
    for (uint64_t i = 0; i < at; i++)
        fputc(0, f);
    if (fclose(f))
        abort();
    free(text);
}

int zfuzz_hf_config(const uint8_t *data, size_t size)
{
    char dir[8192], run[8192], p[8300];
    snprintf(dir, sizeof dir, "%s", zfuzz_path("hf"));
    snprintf(run, sizeof run, "%s", zfuzz_path("import"));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (access(p, F_OK) < 0) {
        mkdir(dir, 0755);
        write_model(p);
    }
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f))
        abort();
    zfuzz_rmtree(run);
    zr_err_clear();
    int ok = zfuzz_verdict(zfmt_import(dir, run, NULL), "zfmt_import");
    zfuzz_rmtree(run);
    return ok;
}

ZFUZZ_ENTRY(zfuzz_hf_config)
