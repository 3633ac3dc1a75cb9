/*
 * common.c: shared pieces of the command-line programs (see common.h).
 */
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int zcli_fail(const char *prog, const char *hint, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: error: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (hint)
        fprintf(stderr, "hint: %s\n", hint);
    return ZCLI_ERROR;
}

int zcli_fail_lib(const char *prog, const char *hint)
{
    int code = zr_err_code();
    if (!hint) {
        if (code == ZR_EVERSION)
            hint = "this checkpoint was written by a newer zero; upgrade to read it";
        else if (code == ZR_EEXIST)
            hint = "choose another output path, or pass --force where the command offers it";
        else if (code == ZR_ENOMEM)
            hint = "lower --buffer or --jobs";
    }
    char msg[1024]; /* messages quote names from files: no terminal escapes through */
    return zcli_fail(prog, hint, "%s",
                     zr_err_msg()[0] ? zr_printable(msg, sizeof msg, zr_err_msg())
                                     : "unknown error");
}

int zcli_fail_ckpt(const char *prog, const char *hint)
{
    if (!hint && zr_err_code() == ZR_ECORRUPT)
        hint = "run `zckpt verify` on it for the full list of problems";
    return zcli_fail_lib(prog, hint);
}

bool zcli_parse_size(const char *prog, const char *opt, const char *text, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    double mul = 1;
    if (!strcmp(end, "") || !strcasecmp(end, "b"))
        mul = 1;
    else if (!strcasecmp(end, "k") || !strcasecmp(end, "kib") || !strcasecmp(end, "kb"))
        mul = 1024.0;
    else if (!strcasecmp(end, "m") || !strcasecmp(end, "mib") || !strcasecmp(end, "mb"))
        mul = 1024.0 * 1024;
    else if (!strcasecmp(end, "g") || !strcasecmp(end, "gib") || !strcasecmp(end, "gb"))
        mul = 1024.0 * 1024 * 1024;
    else
        mul = -1;
    if (!*text || errno || mul < 0 || !(v > 0) || v * mul > 1e15) {
        zcli_fail(prog, NULL, "%s '%s': expected a size such as 256M or 1G", opt, text);
        return false;
    }
    *out = (size_t)(v * mul);
    return true;
}

const char *zcli_human(char buf[32], double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, 32, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return buf;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

size_t zcli_progress_format(char *buf, size_t cap, const char *what, uint64_t done,
                            uint64_t total, double elapsed_s, size_t prev_len)
{
    char a[32], b[32], r[32], rate_eta[96] = "";
    /* a rate only once it is measured: some bytes done over at least a tenth of a second */
    double rate = done && elapsed_s >= 0.1 ? (double)done / elapsed_s : 0;
    int n;
    if (total) {
        int w = 30, fill = (int)((double)w * (double)(done < total ? done : total) /
                                 (double)total);
        char barstr[64];
        for (int i = 0; i < w; i++)
            barstr[i] = i < fill ? '#' : ' ';
        barstr[w] = 0;
        if (rate > 0)
            snprintf(rate_eta, sizeof rate_eta, "  %s/s  ETA %.0fs", zcli_human(r, rate),
                     done < total ? (double)(total - done) / rate : 0.0);
        n = snprintf(buf, cap, "\r%-12s [%s] %3.0f%% %s / %s%s", what, barstr,
                     100.0 * (double)done / (double)total, zcli_human(a, (double)done),
                     zcli_human(b, (double)total), rate_eta);
    } else {
        if (rate > 0)
            snprintf(rate_eta, sizeof rate_eta, "  %s/s", zcli_human(r, rate));
        n = snprintf(buf, cap, "\r%-12s %s%s", what, zcli_human(a, (double)done), rate_eta);
    }
    if (n < 0 || cap == 0)
        return 0;
    size_t len = (size_t)n < cap ? (size_t)n : cap - 1;
    size_t shown = len - 1; /* without the "\r" */
    /* blanks over what is left of a longer previous frame */
    for (size_t k = shown; k < prev_len && len + 1 < cap; k++)
        buf[len++] = ' ';
    buf[len] = 0;
    return shown;
}

/* Not a terminal (a batch job's log): a plain line every ZCLI_LOG_EVERY_S seconds of a long
 * phase, none for a short one. */
#define ZCLI_LOG_EVERY_S 5.0
static void log_line(zcli_bar *bar, const char *what, uint64_t done, uint64_t total)
{
    double t = now();
    if (!bar->what || strcmp(bar->what, what)) { /* a new phase */
        bar->what = what;
        bar->t0 = bar->last = t;
        return;
    }
    if (t - bar->last < ZCLI_LOG_EVERY_S || done >= total)
        return;
    bar->last = t;
    char line[256];
    zcli_progress_format(line, sizeof line, what, done, total, t - bar->t0, 0);
    fprintf(stderr, "%s\n", line + 1); /* without the "\r" */
}

static void draw(void *ctx, const char *what, uint64_t done, uint64_t total)
{
    zcli_bar *bar = ctx;
    if (!bar->tty) {
        log_line(bar, what, done, total);
        return;
    }
    double t = now();
    if (bar->what && strcmp(bar->what, what)) { /* a new phase: finish the old line */
        fputc('\n', stderr);
        bar->width = 0;
    } else if (t - bar->last < 0.1 && done < total)
        return;
    if (!bar->what || strcmp(bar->what, what))
        bar->t0 = t;
    bar->what = what;
    bar->last = t;
    char line[256];
    bar->width = zcli_progress_format(line, sizeof line, what, done, total, t - bar->t0,
                                      bar->width);
    fputs(line, stderr);
}

zck_progress zcli_progress_init(zcli_bar *bar)
{
    memset(bar, 0, sizeof *bar);
    bar->tty = isatty(2);
    zck_progress p = {draw, bar};
    return p;
}

void zcli_progress_end(zcli_bar *bar)
{
    if (bar->tty && bar->width) /* the bar's line cleared for what follows */
        fprintf(stderr, "\r%*s\r", (int)bar->width, "");
    bar->what = NULL;
    bar->width = 0;
}
