/*
 * fuzz_training.c: fuzz target for the training section of the manifest as a resumed run reads
 * it (zr_train__section_parse, core/train/section.c). An accepted section must give exactly
 * the optimizer step and data position it holds, and keep the run's where it holds none.
 */
#include "fuzz.h"
#include "section.h"
#include "zck.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

/* the value the section must have produced for key: its own, or the run's when absent */
static void expect(json_t *root, const char *key, uint64_t run, uint64_t got)
{
    json_t *v = json_object_get(root, key);
    uint64_t want = v ? (uint64_t)json_integer_value(v) : run;
    if (got != want) {
        fprintf(stderr, "fuzz: training section '%s': got %llu, expected %llu\n", key,
                (unsigned long long)got, (unsigned long long)want);
        abort();
    }
}

int zfuzz_training(const uint8_t *data, size_t size)
{
    char *txt = zfuzz_cstr(data, size);
    zr_train__section s = {.optimizer_step = 7, .next_sample = 11, .seed = 13, .batch = 17,
                           .seq = 19};
    zr_err_clear();
    int ok = zfuzz_verdict(zr_train__section_parse(&s, txt), "zr_train__section_parse");
    if (ok) {
        json_t *root = json_loads(txt, 0, NULL);
        if (!root)
            abort(); /* accepted text Jansson itself does not read */
        expect(root, "optimizer_step", 7, s.optimizer_step);
        expect(root, "next_sample", 11, s.next_sample);
        json_decref(root);
    }
    zr_train__section_clear(&s);
    free(txt);
    return ok;
}

ZFUZZ_ENTRY(zfuzz_training)
