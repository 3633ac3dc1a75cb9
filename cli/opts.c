/*
 * opts.c: parsing argv and writing --help from one option table (see opts.h). Value errors
 * name the option and what it accepts: integers and numbers out of their range are errors,
 * never saturated or rounded to infinity.
 */
#include "opts.h"

#include "common.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ZCLI_OPT_U32 also holds the library options' `unsigned` fields */
_Static_assert(sizeof(unsigned) == sizeof(uint32_t), "unsigned is not 32 bits");

#define MAX_OPTS 64
#define HELP_COL 24  /* where the help text of an option begins */
#define HELP_WIDTH 96

static void *field(void *base, const zcli_opt *e) { return (char *)base + e->off; }

static const void *cfield(const void *base, const zcli_opt *e)
{
    return (const char *)base + e->off;
}

static int usage_error(const zcli_opts *p, const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: error: ", p->prog);
    fprintf(stderr, fmt, arg);
    if (p->cmd) {
        fprintf(stderr, "\nusage: %s %s ", p->prog, p->cmd);
        zcli_opts_synopsis(stderr, p);
        fprintf(stderr, "\n(%s %s --help for details)\n", p->prog, p->cmd);
    } else
        fprintf(stderr, "\n(%s --help lists the options)\n", p->prog);
    return ZCLI_ERROR;
}

/* The placeholder of e's value: its meta, or an enum's choices as a|b|c. */
static const char *meta_of(const zcli_opt *e, char buf[128])
{
    if (e->meta || e->kind != ZCLI_OPT_ENUM)
        return e->meta ? e->meta : "";
    buf[0] = 0;
    for (size_t k = 0; e->choices[k]; k++) {
        if (k)
            strncat(buf, "|", 127 - strlen(buf));
        strncat(buf, e->choices[k], 127 - strlen(buf));
    }
    return buf;
}

static int set_integer(const zcli_opts *p, const zcli_opt *e, void *dst, const char *v)
{
    const char *o = e->name;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    bool num = *v && !*end && v[strspn(v, " \t")] != '-';
    bool above = num && (errno == ERANGE || x > e->hi);
    unsigned long long lo = e->lo, hi = e->hi;
    if (e->multiple) {
        if (!num || (!above && x < lo))
            return zcli_fail(p->prog, NULL, "%s '%s': expected an integer >= %llu", o, v, lo);
        if (above || x % e->multiple)
            return zcli_fail(p->prog, NULL, "%s %s: expected a multiple of %llu up to %llu", o,
                             v, (unsigned long long)e->multiple, hi);
    } else if (hi != UINT64_MAX) {
        if (!num || above || x < lo)
            return zcli_fail(p->prog, NULL, "%s '%s': expected an integer from %llu to %llu", o,
                             v, lo, hi);
    } else {
        if (above)
            return zcli_fail(p->prog, NULL, "%s: %s is out of range (%llu to %llu)", o, v, lo,
                             hi);
        if (!num || x < lo)
            return zcli_fail(p->prog, NULL, "%s '%s': expected an integer >= %llu", o, v, lo);
    }
    switch (e->kind) {
    case ZCLI_OPT_U32:
        assert(hi <= UINT32_MAX);
        *(uint32_t *)dst = (uint32_t)x;
        break;
    case ZCLI_OPT_INT:
        assert(hi <= INT32_MAX);
        *(int *)dst = (int)x;
        break;
    case ZCLI_OPT_U64:
        *(uint64_t *)dst = x;
        break;
    default:
        assert(e->kind == ZCLI_OPT_ZU && hi <= SIZE_MAX);
        *(size_t *)dst = (size_t)x;
    }
    return 0;
}

static int set_real(const zcli_opts *p, const zcli_opt *e, void *dst, const char *v)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    bool num = *v && !*end && !isnan(d);
    if (!num || d < e->flo) {
        if (e->flo == 0)
            return zcli_fail(p->prog, NULL, "%s '%s': expected a non-negative number", e->name,
                             v);
        return zcli_fail(p->prog, NULL, "%s '%s': expected a number >= %g", e->name, v,
                         e->flo);
    }
    if (d > e->fhi || (errno == ERANGE && fabs(d) > 1))
        return zcli_fail(p->prog, NULL, "%s: %s is out of range (%g to %g)", e->name, v, e->flo,
                         e->fhi);
    if (errno) /* underflow: closer to zero than a double holds */
        return zcli_fail(p->prog, NULL, "%s '%s': expected a non-negative number", e->name, v);
    if (e->kind == ZCLI_OPT_FLOAT)
        *(float *)dst = (float)d;
    else
        *(double *)dst = d;
    return 0;
}

static int set_enum(const zcli_opts *p, const zcli_opt *e, void *dst, const char *v)
{
    size_t n = 0;
    while (e->choices[n])
        n++;
    for (size_t k = 0; k < n; k++)
        if (!strcmp(v, e->choices[k])) {
            *(int *)dst = e->values[k];
            return 0;
        }
    /* "--device 'mps': expected cpu, cuda or auto" */
    char list[256] = "";
    for (size_t k = 0; k < n; k++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", k == 0 ? "" : k + 1 < n ? ", " : " or ",
                 e->choices[k]);
    }
    return zcli_fail(p->prog, NULL, "%s '%s': expected %s", e->name, v, list);
}

static int set_value(const zcli_opts *p, const zcli_opt *e, void *base, const char *v)
{
    void *dst = field(base, e);
    switch (e->kind) {
    case ZCLI_OPT_U32:
    case ZCLI_OPT_INT:
    case ZCLI_OPT_U64:
    case ZCLI_OPT_ZU:
        return set_integer(p, e, dst, v);
    case ZCLI_OPT_FLOAT:
    case ZCLI_OPT_DOUBLE:
        return set_real(p, e, dst, v);
    case ZCLI_OPT_ENUM:
        return set_enum(p, e, dst, v);
    case ZCLI_OPT_BYTES:
        return zcli_parse_size(p->prog, e->name, v, (size_t *)dst) ? 0 : ZCLI_ERROR;
    case ZCLI_OPT_STRING:
        if (e->flags & ZCLI_OPT_REPEAT) {
            zcli_list *l = dst;
            const char **nv = realloc(l->v, (l->n + 1) * sizeof *nv);
            if (!nv) {
                fprintf(stderr, "%s: error: out of memory\n", p->prog);
                return ZCLI_ERROR;
            }
            nv[l->n++] = v;
            l->v = nv;
            return 0;
        }
        *(const char **)dst = v;
        return 0;
    case ZCLI_OPT_FLAG:
        *(int *)dst = e->flag_value;
        return 0;
    case ZCLI_OPT_SECTION:
        break;
    }
    assert(!"an option of no kind");
    return ZCLI_ERROR;
}

static bool is_option(const zcli_opt *e)
{
    return e->kind != ZCLI_OPT_SECTION && !(e->flags & ZCLI_OPT_POSITIONAL);
}

static const zcli_opt *find(const zcli_opts *p, const char *name)
{
    for (size_t i = 0; i < p->n; i++) {
        const zcli_opt *e = &p->opt[i];
        if (is_option(e) && (!strcmp(name, e->name) || (e->alias && !strcmp(name, e->alias))))
            return e;
    }
    return NULL;
}

void zcli_list_free(zcli_list *l)
{
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int zcli_opts_set(const zcli_opts *p, void *base, const char *name, const char *text)
{
    const zcli_opt *e = find(p, name);
    assert(e && e->kind != ZCLI_OPT_FLAG);
    return set_value(p, e, base, text);
}

int zcli_opts_parse(const zcli_opts *p, void *base, int argc, char **argv)
{
    bool seen[MAX_OPTS] = {false};
    assert(p->n <= MAX_OPTS);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (zcli_is_help(a))
            return ZCLI_OPTS_HELP;
        const zcli_opt *e = NULL;
        if (a[0] == '-' && a[1]) {
            if (!(e = find(p, a)))
                return usage_error(p, "unknown option %s", a);
        } else {
            for (size_t k = 0; k < p->n && !e; k++)
                if ((p->opt[k].flags & ZCLI_OPT_POSITIONAL) &&
                    (!seen[k] || (p->opt[k].flags & ZCLI_OPT_REPEAT)))
                    e = &p->opt[k];
            if (!e)
                return usage_error(p, "unexpected argument %s", a);
        }
        seen[e - p->opt] = true;
        if (e->kind == ZCLI_OPT_FLAG || (e->flags & ZCLI_OPT_POSITIONAL)) {
            if (set_value(p, e, base, a))
                return ZCLI_ERROR;
            continue;
        }
        if (i + 1 >= argc)
            return usage_error(p, "%s needs a value", a);
        if (set_value(p, e, base, argv[++i]))
            return ZCLI_ERROR;
    }
    for (size_t k = 0; k < p->n; k++) {
        const zcli_opt *e = &p->opt[k];
        if (seen[k] || !(e->flags & (ZCLI_OPT_REQUIRED | ZCLI_OPT_POSITIONAL)))
            continue;
        char what[300], buf[128];
        const char *meta = e->flags & ZCLI_OPT_POSITIONAL ? "" : meta_of(e, buf);
        snprintf(what, sizeof what, "%s%s%s", e->name, *meta ? " " : "", meta);
        return usage_error(p, "missing %s", what);
    }
    return 0;
}

zcli_opts zcli_command_opts(const char *prog, const zcli_command *c)
{
    zcli_opts p = {prog, c->name, c->opt, c->n_opt};
    return p;
}

const zcli_command *zcli_command_find(const char *prog, const zcli_command *c, size_t n,
                                      const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, c[i].name))
            return &c[i];
    fprintf(stderr, "%s: error: unknown command '%s'\n", prog, name);
    return NULL;
}

bool zcli_is_help(const char *arg) { return !strcmp(arg, "--help") || !strcmp(arg, "-h"); }

void zcli_commands_usage(FILE *f, const char *prog, const char *summary,
                         const zcli_command *c, size_t n, const char *footer)
{
    fprintf(f, "usage: %s COMMAND [ARGS]\n\n%s\n\ncommands:\n", prog, summary);
    for (size_t i = 0; i < n; i++) {
        zcli_opts p = zcli_command_opts(prog, &c[i]);
        zcli_command_line(f, &p);
    }
    fprintf(f, "\n`%s COMMAND --help` explains one. %s\n", prog, footer);
}

void zcli_command_line(FILE *f, const zcli_opts *p)
{
    fprintf(f, "  %s ", p->cmd);
    zcli_opts_synopsis(f, p);
    fputc('\n', f);
}

void zcli_command_help(FILE *f, const zcli_opts *p, const char *help, const void *defaults)
{
    fprintf(f, "usage: %s %s ", p->prog, p->cmd);
    zcli_opts_synopsis(f, p);
    fprintf(f, "\n\n%s\noptions:\n", help);
    zcli_opts_help(f, p, defaults);
}

void zcli_opts_synopsis(FILE *f, const zcli_opts *p)
{
    const char *sep = "";
    for (size_t i = 0; i < p->n; i++) {
        const zcli_opt *e = &p->opt[i];
        char buf[128];
        if (e->kind == ZCLI_OPT_SECTION)
            continue;
        bool opt = !(e->flags & (ZCLI_OPT_REQUIRED | ZCLI_OPT_POSITIONAL));
        const char *meta = e->flags & ZCLI_OPT_POSITIONAL ? "" : meta_of(e, buf);
        fprintf(f, "%s%s%s%s%s%s%s", sep, opt ? "[" : "", e->name,
                e->flags & ZCLI_OPT_REPEAT ? "..." : "", *meta ? " " : "", meta, opt ? "]" : "");
        sep = " ";
    }
}

/* "256M" for a size of whole mebibytes, and so on */
static void format_bytes(char *buf, size_t cap, size_t b)
{
    const char *unit = "GMK";
    for (int k = 0; k < 3; k++) {
        size_t u = (size_t)1 << (10 * (3 - k));
        if (b && b % u == 0) {
            snprintf(buf, cap, "%zu%c", b / u, unit[k]);
            return;
        }
    }
    snprintf(buf, cap, "%zu", b);
}

/* The default of e as --help shows it ("" for none): def, else the value in defaults. */
static void format_default(char *buf, size_t cap, const zcli_opt *e, const void *defaults)
{
    buf[0] = 0;
    if (e->flags & ZCLI_OPT_REQUIRED)
        return;
    if (e->def || !defaults) {
        snprintf(buf, cap, "%s", e->def ? e->def : "");
        return;
    }
    const void *v = cfield(defaults, e);
    switch (e->kind) {
    case ZCLI_OPT_U32:
        snprintf(buf, cap, "%u", (unsigned)*(const uint32_t *)v);
        break;
    case ZCLI_OPT_INT:
        snprintf(buf, cap, "%d", *(const int *)v);
        break;
    case ZCLI_OPT_U64:
        snprintf(buf, cap, "%llu", (unsigned long long)*(const uint64_t *)v);
        break;
    case ZCLI_OPT_ZU:
        snprintf(buf, cap, "%zu", *(const size_t *)v);
        break;
    case ZCLI_OPT_BYTES:
        format_bytes(buf, cap, *(const size_t *)v);
        break;
    case ZCLI_OPT_FLOAT:
        snprintf(buf, cap, "%g", (double)*(const float *)v);
        break;
    case ZCLI_OPT_DOUBLE:
        snprintf(buf, cap, "%g", *(const double *)v);
        break;
    case ZCLI_OPT_STRING:
        snprintf(buf, cap, "%s", *(const char *const *)v ? *(const char *const *)v : "");
        break;
    case ZCLI_OPT_ENUM:
        for (size_t k = 0; e->choices[k]; k++)
            if (e->values[k] == *(const int *)v)
                snprintf(buf, cap, "%s", e->choices[k]);
        break;
    default:
        break;
    }
}

/* Words of text from column col on, wrapped at HELP_WIDTH with lines indented to HELP_COL. */
static void wrap(FILE *f, const char *text, int col)
{
    const char *s = text;
    while (*s) {
        size_t w = strcspn(s, " ");
        if (col > HELP_COL && col + 1 + (int)w > HELP_WIDTH) {
            fprintf(f, "\n%*s", HELP_COL, "");
            col = HELP_COL;
        } else if (col > HELP_COL) {
            fputc(' ', f);
            col++;
        }
        fwrite(s, 1, w, f);
        col += (int)w;
        s += w;
        s += strspn(s, " ");
    }
    fputc('\n', f);
}

void zcli_opts_help(FILE *f, const zcli_opts *p, const void *defaults)
{
    for (size_t i = 0; i < p->n; i++) {
        const zcli_opt *e = &p->opt[i];
        if (e->kind == ZCLI_OPT_SECTION) {
            fprintf(f, "%s\n", e->name);
            continue;
        }
        if (!is_option(e))
            continue;
        char buf[128], def[128], text[2048];
        const char *meta = meta_of(e, buf);
        int col = fprintf(f, "  %s%s%s%s%s", e->name, e->alias ? ", " : "",
                          e->alias ? e->alias : "", *meta ? " " : "", meta);
        if (col + 2 > HELP_COL) /* a long name: the help text begins on the next line */
            fprintf(f, "\n%*s", HELP_COL, "");
        else
            fprintf(f, "%*s", HELP_COL - col, "");
        format_default(def, sizeof def, e, defaults);
        snprintf(text, sizeof text, "%s%s%s%s", e->help, *def ? " (default: " : "", def,
                 *def ? ")" : "");
        wrap(f, text, HELP_COL);
    }
}
