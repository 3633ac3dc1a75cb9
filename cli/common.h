/*
 * common.h: what the command-line programs share: exit codes, error and hint messages,
 * sizes, and the progress bar drawn from zck_progress callbacks.
 */
#ifndef ZCLI_COMMON_H
#define ZCLI_COMMON_H

#include "zck.h"

#include <stdbool.h>
#include <stdint.h>

/* Exit codes, in one place: 0 ok, 1 the check found a problem, 2 usage, I/O or other error. */
enum { ZCLI_OK = 0, ZCLI_FOUND = 1, ZCLI_ERROR = 2 };

/* "prog: error: <msg>" (and "hint: <hint>" when hint is not NULL) on stderr; returns 2. */
int zcli_fail(const char *prog, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The library's last error as above, with a hint chosen from its code when hint is NULL. */
int zcli_fail_lib(const char *prog, const char *hint);
/* As zcli_fail_lib after reading a checkpoint (or an archive of one): a ZR_ECORRUPT gets the
 * hint to run `zckpt verify` on it. zcli_fail_lib gives none: tokenizers, token files, logs and
 * Hugging Face files are corrupt too, and verify does not read them. */
int zcli_fail_ckpt(const char *prog, const char *hint);

/* "256M", "1G", "4096", "64KiB" -> bytes; false (after printing the error naming opt) when the
 * text is not a size. Options are parsed by their table (opts.h), which uses this. */
bool zcli_parse_size(const char *prog, const char *opt, const char *text, size_t *out);

/* "1.2 GiB" into buf */
const char *zcli_human(char buf[32], double bytes);

/* A progress bar on stderr when it is a terminal: bytes done, and rate and ETA once measured;
 * otherwise (a batch job's log) a plain line of the same every 5 seconds of a long phase.
 * zcli_progress_init fills p for the library's options;
 * zcli_progress_end clears the bar's line. */
typedef struct {
    bool tty;
    double t0, last;
    const char *what;
    size_t width; /* columns of the frame on the line (0: none) */
} zcli_bar;
zck_progress zcli_progress_init(zcli_bar *bar);
void zcli_progress_end(zcli_bar *bar);
/* One frame into buf: "\r", the phase, the bar (total > 0) or the bytes, rate and ETA when
 * elapsed_s measured a rate, then blanks over the rest of a previous frame of prev_len
 * columns. Returns the frame's columns (without the blanks). */
size_t zcli_progress_format(char *buf, size_t cap, const char *what, uint64_t done,
                            uint64_t total, double elapsed_s, size_t prev_len);

#endif
