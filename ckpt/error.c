/*
 * error.c: the project-wide error state (one thread-local record: code, message, location) and
 * logging to stderr with a rank prefix. Every folder of zero reports failures through this.
 */
#include "zck.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG_CAP 1024

static _Thread_local struct {
    int code;
    char msg[MSG_CAP];
    char where[128];
} err;

static int log_level = -1;

static void set_where(const char *file, int line)
{
    const char *base = strrchr(file, '/');
    snprintf(err.where, sizeof err.where, "%s:%d", base ? base + 1 : file, line);
}

int zr_err_set_at(int code, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.msg, sizeof err.msg, fmt, ap);
    va_end(ap);
    err.code = code;
    set_where(file, line);
    if (zr_log_level() >= ZR_LOG_DEBUG)
        zr_log(ZR_LOG_DEBUG, "error %s at %s: %s", zr_err_name(code), err.where, err.msg);
    return code;
}

int zr_err_sys_at(int e, const char *file, int line, const char *fmt, ...)
{
    char head[MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    int code = e == ENOENT ? ZR_ENOTFOUND : e == ENOMEM ? ZR_ENOMEM
             : e == EEXIST ? ZR_EEXIST : ZR_EIO;
    return zr_err_set_at(code, file, line, "%s: %s", head, strerror(e));
}

void zr_err_prefix(const char *fmt, ...)
{
    char head[MSG_CAP], old[MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err.msg, sizeof old);
    size_t nh = strnlen(head, MSG_CAP - 1), no = strnlen(old, MSG_CAP - 1);
    if (no > MSG_CAP - 1 - nh)
        no = MSG_CAP - 1 - nh;
    memcpy(err.msg, head, nh);
    memcpy(err.msg + nh, old, no);
    err.msg[nh + no] = 0;
}

const char *zr_err_msg(void) { return err.msg; }
int zr_err_code(void) { return err.code; }
const char *zr_err_where(void) { return err.where; }

void zr_err_clear(void)
{
    err.code = 0;
    err.msg[0] = 0;
    err.where[0] = 0;
}

const char *zr_err_name(int code)
{
    switch (code) {
    case ZR_OK: return "ZR_OK";
    case ZR_ERROR: return "ZR_ERROR";
    case ZR_ENOMEM: return "ZR_ENOMEM";
    case ZR_EINVAL: return "ZR_EINVAL";
    case ZR_EIO: return "ZR_EIO";
    case ZR_ENOTFOUND: return "ZR_ENOTFOUND";
    case ZR_ECORRUPT: return "ZR_ECORRUPT";
    case ZR_EVERSION: return "ZR_EVERSION";
    case ZR_EUNSUPPORTED: return "ZR_EUNSUPPORTED";
    case ZR_EDEVICE: return "ZR_EDEVICE";
    case ZR_ECOMM: return "ZR_ECOMM";
    case ZR_EEXIST: return "ZR_EEXIST";
    case ZR_EBUSY: return "ZR_EBUSY";
    default: return "ZR_E?";
    }
}

int zr_log_level(void)
{
    if (log_level < 0) {
        const char *e = zr_env(ZR_ENV_LOG);
        int lv = ZR_LOG_WARN;
        if (e && !strcmp(e, "error")) lv = ZR_LOG_ERROR;
        else if (e && !strcmp(e, "info")) lv = ZR_LOG_INFO;
        else if (e && !strcmp(e, "debug")) lv = ZR_LOG_DEBUG;
        log_level = lv;
    }
    return log_level;
}

void zr_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > zr_log_level())
        return;
    char line[2048];
    int n = 0;
    n += snprintf(line + n, sizeof line - (size_t)n, "%s: ",
                  names[level < 0 ? 0 : level > 3 ? 3 : level]);
    va_list ap;
    va_start(ap, fmt);
    if (n < (int)sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

void zr_log_trace(const char *file, int line, int rc)
{
    if (zr_log_level() >= ZR_LOG_DEBUG) {
        const char *base = strrchr(file, '/');
        zr_log(ZR_LOG_DEBUG, "  passed up %s at %s:%d", zr_err_name(rc), base ? base + 1 : file,
               line);
    }
}

const char *zr_printable(char *buf, size_t cap, const char *s)
{
    if (!s)
        s = "(null)";
    size_t k = 0;
    for (; s[k] && k + 1 < cap; k++)
        buf[k] = (unsigned char)s[k] < 0x20 || s[k] == 0x7f ? '?' : s[k];
    if (cap)
        buf[k] = 0;
    return buf;
}

int zr_array_grow(void *arrp, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 8;
    void *arr;
    memcpy(&arr, arrp, sizeof arr);
    void *p = nc > SIZE_MAX / elem ? NULL : realloc(arr, nc * elem);
    if (!p)
        return zr_err_set(ZR_ENOMEM, "out of memory growing an array to %zu elements", nc);
    memset((char *)p + *cap * elem, 0, (nc - *cap) * elem);
    memcpy(arrp, &p, sizeof p);
    *cap = nc;
    return 0;
}

/* here, not in env.c: error.c reads ZR_LOG through env.c */
int zr_env_int(int *out, int *present, zr_env_var var, long lo, long hi)
{
    const char *s = zr_env(var), *name = zr_env_name(var);
    *present = s != NULL;
    if (!*present)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi)
        return zr_err_set(ZR_EINVAL, "%s='%s': expected an integer in [%ld, %ld]", name, s, lo,
                          hi);
    *out = (int)v;
    return 0;
}
