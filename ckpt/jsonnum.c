/*
 * jsonnum.c: JSON numbers as people write them (zck.h, "JSON numbers"). Jansson writes every
 * real with 17 significant digits, so 0.1 reads 0.10000000000000001 and the float 0.8f
 * 0.80000001192092896. zck_json_dumps writes each real as the shortest decimal that reads back
 * as the same double (so nothing changes value: a reader gets the very bits written);
 * zck_json_real_f32 makes the real of a float32 the double of the shortest decimal that reads
 * back as the same float, which zck_json_dumps then writes as that decimal (0.8).
 */
#include "zck_int.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The digits of v in %.{p}e, without the point, into d (p digits); its decimal exponent. */
static int digits_of(char *d, double v, int p)
{
    char e[48];
    snprintf(e, sizeof e, "%.*e", p - 1, fabs(v));
    size_t n = 0;
    for (const char *c = e; *c && *c != 'e'; c++)
        if (*c != '.')
            d[n++] = *c;
    d[n] = 0;
    return atoi(strchr(e, 'e') + 1);
}

/* Tidy %g's text in place: no '+' and no leading zeros in the exponent (1e-05 -> 1e-5), and a
 * whole number of up to 16 digits in full rather than with an exponent (1e+06 -> 1000000, as
 * %.17g writes it); then ".0" when there is neither a point nor an exponent, so that the
 * number reads back as a real and not an integer (as Jansson does). */
static void tidy(char *s, size_t cap, double v, int p)
{
    char *e = strchr(s, 'e');
    if (e) {
        int x = atoi(e + 1);
        if (x >= p && x < 16) { /* a whole number: the p digits, then zeros */
            char d[40];
            digits_of(d, v, p);
            snprintf(s, cap, "%s%s%0*d", v < 0 ? "-" : "", d, x + 1 - p, 0);
        } else {
            snprintf(e + 1, cap - (size_t)(e + 1 - s), "%d", x);
        }
    }
    if (!strpbrk(s, ".e") && strlen(s) + 3 <= cap)
        strcat(s, ".0");
}

size_t zck_json_real_text(char *out, size_t cap, double v, int f32)
{
    if (!isfinite(v)) {
        snprintf(out, cap, "%s", isnan(v) ? "NaN" : v < 0 ? "-Infinity" : "Infinity");
        return strlen(out);
    }
    int p = 1, max = f32 ? 9 : 17;
    char buf[64];
    for (; p < max; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (f32 ? strtof(buf, NULL) == (float)v : strtod(buf, NULL) == v)
            break;
    }
    snprintf(buf, sizeof buf, "%.*g", p, v);
    tidy(buf, sizeof buf, v, p);
    snprintf(out, cap, "%s", buf);
    return strlen(out);
}

json_t *zck_json_real_f32(float v)
{
    if (!isfinite(v))
        return NULL;
    char s[64];
    for (int p = 1; p <= 9; p++) {
        snprintf(s, sizeof s, "%.*g", p, (double)v);
        double d = strtod(s, NULL);
        if ((float)d == v)
            return json_real(d);
    }
    return json_real((double)v); /* not reached: 9 digits always read back */
}

/* Copy text[*i..] of a JSON number into out at *w: a real (a point or an exponent) rewritten
 * shortest, an integer as it is. */
static void number(char *out, size_t *w, const char *text, size_t *i)
{
    size_t s = *i, real = 0;
    while (text[*i] && strchr("+-0123456789.eE", text[*i])) {
        real |= text[*i] == '.' || text[*i] == 'e' || text[*i] == 'E';
        (*i)++;
    }
    if (!real) {
        memcpy(out + *w, text + s, *i - s);
        *w += *i - s;
        return;
    }
    *w += zck_json_real_text(out + *w, 64, strtod(text + s, NULL), 0);
}

char *zck_json_dumps(const json_t *j, size_t flags)
{
    /* 17 digits: each real as Jansson writes it reads back exactly, then is shortened */
    char *text = json_dumps(j, flags & ~(size_t)JSON_REAL_PRECISION(31));
    if (!text)
        return NULL;
    size_t n = strlen(text);
    /* a real of 17 digits and an exponent is at most 24 bytes: its shortest never longer
     * than 24 + ".0"; 64 spare bytes per real would do, 2n + 64 does */
    char *out = malloc(2 * n + 64);
    size_t w = 0;
    for (size_t i = 0; out && i < n;) {
        char c = text[i];
        if (c == '"') { /* a string: copied through its closing quote, escapes included */
            out[w++] = text[i++];
            while (i < n && text[i] != '"') {
                if (text[i] == '\\' && i + 1 < n)
                    out[w++] = text[i++];
                out[w++] = text[i++];
            }
            if (i < n)
                out[w++] = text[i++];
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            number(out, &w, text, &i);
        } else {
            out[w++] = text[i++];
        }
    }
    if (out)
        out[w] = 0;
    json_free_t jf;
    json_malloc_t jm;
    json_get_alloc_funcs(&jm, &jf);
    jf(text);
    return out;
}
