/*
 * fuzz_archive.c: fuzz target for the archive read and verify path (zfmt_archive_verify):
 * libarchive's readers (tar, gzip, zstd) under our member checks, the manifest, SHA256SUMS and
 * every member's size and hash. Accepted means verified with no problem; every problem reported
 * must name its kind and say what was found.
 */
#include "fuzz.h"
#include "zfmt.h"

#include <stdio.h>
#include <stdlib.h>

int zfuzz_archive(const uint8_t *data, size_t size)
{
    zck_report *rep = NULL;
    zr_err_clear();
    int ok = zfuzz_verdict(zfmt_archive_verify(&rep, zfuzz_file(data, size), NULL),
                           "zfmt_archive_verify");
    if (!ok)
        return 0;
    size_t n = zck_report_count(rep);
    for (size_t i = 0; i < n; i++) {
        const zck_problem *p = zck_report_get(rep, i);
        if (!p->file || !p->detail || !p->detail[0]) {
            fprintf(stderr, "fuzz: archive problem %zu (%s) says nothing\n", i,
                    zck_problem_kind_name(p->kind));
            abort();
        }
    }
    zck_report_free(rep);
    return n == 0;
}

ZFUZZ_ENTRY(zfuzz_archive)
