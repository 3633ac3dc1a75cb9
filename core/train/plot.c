/*
 * plot.c: a run's JSON log (zrun --log-json) drawn as an SVG (train.h, zr_plot_write): three
 * panels against the step, sharing the x axis: the loss (training, and validation where it was
 * measured), the learning rate, and tokens/s. Each invocation of zrun (a run_id of its own) is
 * a separate line, so the steps a resume redoes are drawn again over the old ones; a resume and
 * a change of world size are marked with a labelled vertical line. Long logs are decimated:
 * each series keeps, per bucket of consecutive points, its lowest and highest, so spikes stay
 * visible. Lines that are not a JSON object (a truncated last line, a "nan" written by an old
 * version) and values that are not finite numbers are skipped.
 */
#include "train.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { S_LOSS, S_VAL, S_LR, S_TPS, N_SERIES };

typedef struct {
    double step, y[N_SERIES];
    int seg; /* the invocation (a new run_id starts a new one) */
} pt;

typedef struct {
    double x;
    char label[64];
} mark;

typedef struct {
    pt *p;
    size_t n, cap;
    mark *m;
    size_t nm, cap_m;
    size_t skipped;
    char run[40];
    int world;
} plog;

/* ---------------------------------------------------------------- reading the log */

static double num_or_nan(const json_t *j, const char *key)
{
    json_t *v = json_object_get(j, key);
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    return isfinite(d) ? d : NAN;
}

/* Room for one more of *n elements of `size` bytes in *arr (capacity *cap). */
static int grow(void *arr, size_t n, size_t *cap, size_t size)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? 2 * *cap : 64;
    void *p = realloc(*(void **)arr, c * size);
    if (!p)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    *(void **)arr = p;
    *cap = c;
    return 0;
}

static int add_mark(plog *L, double x, const char *label)
{
    ZR_TRY(grow(&L->m, L->nm, &L->cap_m, sizeof *L->m));
    L->m[L->nm].x = x;
    snprintf(L->m[L->nm].label, sizeof L->m[L->nm].label, "%s", label);
    L->nm++;
    return 0;
}

/* One step record: its point, and a mark where a new invocation or world size begins. */
static int add_record(plog *L, const json_t *j)
{
    json_t *st = json_object_get(j, "step"), *id = json_object_get(j, "run_id");
    if (!json_is_integer(st) || json_object_get(j, "event"))
        return 0; /* an event record, or not zrun's */
    ZR_TRY(grow(&L->p, L->n, &L->cap, sizeof *L->p));
    pt *p = &L->p[L->n];
    p->step = (double)json_integer_value(st);
    p->y[S_LOSS] = num_or_nan(j, "loss");
    p->y[S_VAL] = num_or_nan(j, "val_loss");
    p->y[S_LR] = num_or_nan(j, "lr");
    p->y[S_TPS] = num_or_nan(j, "tokens_per_s");
    const char *run = json_is_string(id) ? json_string_value(id) : "";
    json_t *w = json_object_get(j, "world");
    int world = json_is_integer(w) ? (int)json_integer_value(w) : 0;
    int new_run = L->n && strncmp(run, L->run, sizeof L->run - 1) != 0;
    p->seg = L->n ? L->p[L->n - 1].seg + new_run : 0;
    if (L->n && (new_run || world != L->world)) {
        char label[64];
        if (world != L->world)
            snprintf(label, sizeof label, "%sworld %d to %d", new_run ? "resume, " : "",
                     L->world, world);
        else
            snprintf(label, sizeof label, "resume");
        ZR_TRY(add_mark(L, p->step - 1, label)); /* from the checkpoint of the step before */
    }
    snprintf(L->run, sizeof L->run, "%s", run);
    L->world = world;
    L->n++;
    return 0;
}

static int read_log(plog *L, const char *path)
{
    int fd;
    ZR_TRY(zck_open_regular(&fd, path, ZCK_FOLLOW, NULL));
    FILE *f = fdopen(fd, "r");
    if (!f) {
        int e = errno;
        close(fd);
        return zr_err_sys(e, "%s: open", path);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while (!rc && (len = getline(&line, &cap, f)) > 0) {
        json_t *j = json_loadb(line, (size_t)len, 0, NULL);
        if (!json_is_object(j))
            L->skipped += strspn(line, " \t\r\n") != (size_t)len; /* blank lines are not */
        else
            rc = add_record(L, j);
        json_decref(j);
    }
    if (!rc && ferror(f))
        rc = zr_err_sys(errno, "%s: read", path);
    free(line);
    fclose(f);
    if (!rc && !L->n)
        rc = zr_err_set(ZR_EINVAL, "%s: no step records to plot (%zu unreadable line%s)", path,
                        L->skipped, L->skipped == 1 ? "" : "s");
    return rc;
}

/* ---------------------------------------------------------------- drawing */

#define SVG_W 960.0
#define PANEL_H 230.0
#define LEFT 84.0
#define RIGHT 24.0
#define TOP 56.0
#define GAP 52.0
#define PLOT_H (PANEL_H - GAP)
#define MAX_BUCKETS 1200 /* per series: at most two points each */

typedef struct {
    double x0, x1, y0, y1, top; /* data ranges, the panel's top in pixels */
} frame;

static double px(const frame *f, double x)
{
    return LEFT + (x - f->x0) / (f->x1 - f->x0) * (SVG_W - LEFT - RIGHT);
}

static double py(const frame *f, double y)
{
    return f->top + PLOT_H - (y - f->y0) / (f->y1 - f->y0) * PLOT_H;
}

/* A step of 1, 2 or 5 times a power of ten giving about n ticks over [a, b]. */
static double nice_step(double a, double b, int n)
{
    double raw = (b - a) / n, p = pow(10, floor(log10(raw))), r = raw / p;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * p;
}

/* A range that is never empty: a single value is widened. */
static void widen(double *lo, double *hi)
{
    if (*hi > *lo)
        return;
    double d = fabs(*lo) > 0 ? fabs(*lo) * 0.1 : 1;
    *lo -= d;
    *hi += d;
}

static void xml_text(FILE *o, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '<')
            fputs("&lt;", o);
        else if (c == '>')
            fputs("&gt;", o);
        else if (c == '&')
            fputs("&amp;", o);
        else if (c == '"')
            fputs("&quot;", o);
        else if (c >= 0x20 || c == '\t')
            fputc(c, o);
        else
            fputc('?', o); /* control characters are not XML */
    }
}

static void axes(FILE *o, const frame *f, const char *title, int x_label)
{
    double w = SVG_W - LEFT - RIGHT;
    fprintf(o, "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" "
               "font-weight=\"bold\">", LEFT, f->top - 10);
    xml_text(o, title);
    fprintf(o, "</text>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
               "fill=\"none\" stroke=\"#444\"/>\n", LEFT, f->top, w, PLOT_H);
    double ys = nice_step(f->y0, f->y1, 5), xs = nice_step(f->x0, f->x1, 8);
    for (double y = ceil(f->y0 / ys) * ys; y <= f->y1 + ys * 1e-9; y += ys) {
        double Y = py(f, y);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.4g"
                   "</text>\n", LEFT, Y, LEFT + w, Y, LEFT - 6, Y + 4, fabs(y) < ys * 1e-9 ? 0 : y);
    }
    for (double x = ceil(f->x0 / xs) * xs; x <= f->x1 + xs * 1e-9; x += xs) {
        double X = px(f, x);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%.10g"
                   "</text>\n", X, f->top, X, f->top + PLOT_H, X, f->top + PLOT_H + 15, x);
    }
    if (x_label)
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">step"
                   "</text>\n", LEFT + w / 2, f->top + PLOT_H + 32);
    fputs("</g>\n", o);
}

/* Whether point i of series s is drawn: finite, and among its bucket's lowest and highest
 * (buckets of `per` consecutive finite points of one invocation). */
static void keep_points(const plog *L, int s, unsigned char *keep)
{
    size_t finite = 0;
    for (size_t i = 0; i < L->n; i++)
        finite += !isnan(L->p[i].y[s]);
    size_t per = finite / MAX_BUCKETS + 1;
    memset(keep, 0, L->n);
    size_t i = 0;
    while (i < L->n) {
        size_t lo = SIZE_MAX, hi = SIZE_MAX, k = 0;
        int seg = L->p[i].seg;
        for (; i < L->n && k < per && L->p[i].seg == seg; i++) {
            double y = L->p[i].y[s];
            if (isnan(y))
                continue;
            k++;
            if (lo == SIZE_MAX || y < L->p[lo].y[s])
                lo = i;
            if (hi == SIZE_MAX || y > L->p[hi].y[s])
                hi = i;
        }
        if (lo != SIZE_MAX)
            keep[lo] = keep[hi] = 1;
    }
}

/* Series s as one polyline per invocation (a lone point as a dot); dots: mark each point. */
static void series(FILE *o, const plog *L, const frame *f, int s, const char *color, int dots,
                   unsigned char *keep)
{
    keep_points(L, s, keep);
    size_t i = 0;
    while (i < L->n) {
        int seg = L->p[i].seg;
        size_t count = 0, first = i;
        for (; i < L->n && L->p[i].seg == seg; i++)
            count += keep[i];
        if (count > 1) {
            fprintf(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                       "points=\"", color);
            for (size_t k = first, c = 0; k < i; k++)
                if (keep[k])
                    fprintf(o, "%s%.1f,%.1f", c++ ? " " : "", px(f, L->p[k].step),
                            py(f, L->p[k].y[s]));
            fputs("\"/>\n", o);
        }
        for (size_t k = first; k < i; k++)
            if (keep[k] && (dots || count == 1))
                fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n",
                        px(f, L->p[k].step), py(f, L->p[k].y[s]), color);
    }
}

static void marks(FILE *o, const plog *L, const frame *f, int labels)
{
    for (size_t k = 0; k < L->nm; k++) {
        double X = px(f, L->m[k].x < f->x0 ? f->x0 : L->m[k].x);
        fprintf(o, "<line class=\"mark\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                   "stroke=\"#888\" stroke-dasharray=\"4 3\"/>\n", X, f->top, X,
                f->top + PLOT_H);
        if (labels) {
            fprintf(o, "<text class=\"mark-label\" x=\"%.1f\" y=\"%.1f\" font-size=\"10\" "
                       "fill=\"#555\">", X + 3, f->top + 12 + 12.0 * (double)(k % 3));
            xml_text(o, L->m[k].label);
            fputs("</text>\n", o);
        }
    }
}

/* The y range of series a (and b, or -1) over the points. */
static void y_range(const plog *L, int a, int b, double *lo, double *hi)
{
    *lo = INFINITY;
    *hi = -INFINITY;
    for (size_t i = 0; i < L->n; i++)
        for (int s = a; s >= 0; s = s == a ? b : -1) {
            double y = L->p[i].y[s];
            if (!isnan(y)) {
                *lo = y < *lo ? y : *lo;
                *hi = y > *hi ? y : *hi;
            }
        }
    if (*lo > *hi) /* nothing finite */
        *lo = *hi = 0;
    widen(lo, hi);
    double pad = (*hi - *lo) * 0.05; /* lines clear of the frame */
    *lo -= pad;
    *hi += pad;
}

static void legend(FILE *o, double x, double y, const char *color, const char *name)
{
    fprintf(o, "<g class=\"legend\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
               "stroke=\"%s\" stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">"
               "%s</text></g>\n", x, y, x + 18, y, color, x + 22, y + 4, name);
}

static void draw(FILE *o, const plog *L, const char *title, unsigned char *keep)
{
    static const char *const names[3] = {"loss", "learning rate", "tokens/s"};
    double x0 = L->p[0].step, x1 = x0;
    for (size_t i = 0; i < L->n; i++) {
        x0 = L->p[i].step < x0 ? L->p[i].step : x0;
        x1 = L->p[i].step > x1 ? L->p[i].step : x1;
    }
    widen(&x0, &x1);
    int has_val = 0;
    for (size_t i = 0; i < L->n && !has_val; i++)
        has_val = !isnan(L->p[i].y[S_VAL]);
    fprintf(o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/"
               "2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" "
               "fill=\"white\"/>\n<text x=\"%.1f\" y=\"24\" font-size=\"15\">", SVG_W,
            TOP + 3 * PANEL_H, SVG_W, TOP + 3 * PANEL_H, LEFT);
    xml_text(o, title);
    fprintf(o, "</text>\n");
    for (int p = 0; p < 3; p++) {
        frame f = {x0, x1, 0, 0, TOP + p * PANEL_H};
        int s = p == 0 ? S_LOSS : p == 1 ? S_LR : S_TPS;
        y_range(L, s, p == 0 ? S_VAL : -1, &f.y0, &f.y1);
        axes(o, &f, names[p], p == 2);
        marks(o, L, &f, p == 0);
        series(o, L, &f, s, p == 0 ? "#1f77b4" : p == 1 ? "#2ca02c" : "#9467bd", 0, keep);
        if (p == 0) {
            series(o, L, &f, S_VAL, "#ff7f0e", 1, keep);
            legend(o, SVG_W - RIGHT - 200, f.top - 14, "#1f77b4", "training loss");
            if (has_val)
                legend(o, SVG_W - RIGHT - 95, f.top - 14, "#ff7f0e", "validation loss");
        }
    }
    fputs("</svg>\n", o);
}

/* ---------------------------------------------------------------- the file */

/* The SVG drawn in memory, then written over svg_path whole or not at all. */
static int write_svg(const plog *L, const char *svg_path, const char *title)
{
    char *buf = NULL;
    size_t len = 0;
    unsigned char *keep = malloc(L->n);
    FILE *o = keep ? open_memstream(&buf, &len) : NULL;
    if (!o) {
        free(keep);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    draw(o, L, title, keep);
    int bad = ferror(o) != 0;
    bad |= fclose(o) != 0;
    int rc = bad ? zr_err_set(ZR_ENOMEM, "%s: out of memory drawing it", svg_path)
                 : zck_write_file_atomic(svg_path, buf, len);
    free(buf);
    free(keep);
    return rc;
}

int zr_plot_check_target(const char *log_path, const char *svg_path)
{
    struct stat l, s; /* the entry at svg_path is what the rename replaces: a link, not its target */
    if (lstat(svg_path, &s) == 0 && stat(log_path, &l) == 0 && s.st_dev == l.st_dev &&
        s.st_ino == l.st_ino)
        return zr_err_set(ZR_EINVAL, "%s is the log %s itself: the drawing would replace it",
                          svg_path, log_path);
    return 0;
}

int zr_plot_write(zr_plot_info *info, const char *log_path, const char *svg_path)
{
    ZR_TRY(zr_plot_check_target(log_path, svg_path));
    plog L;
    memset(&L, 0, sizeof L);
    int rc = read_log(&L, log_path);
    if (!rc) {
        char *title = NULL;
        if (asprintf(&title, "%s: %zu step records, %zu resume%s", log_path, L.n,
                     (size_t)(L.p[L.n - 1].seg), L.p[L.n - 1].seg == 1 ? "" : "s") < 0)
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        else
            rc = write_svg(&L, svg_path, title);
        free(title);
    }
    if (!rc && info) {
        info->records = L.n;
        info->skipped = L.skipped;
        info->marks = L.nm;
    }
    free(L.p);
    free(L.m);
    return rc;
}
