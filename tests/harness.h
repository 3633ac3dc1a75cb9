/*
 * harness.h: the test harness. Tests register themselves with ZT_TEST; tests/main.c runs each
 * one in a forked child inside a fresh temporary directory (the current directory when the
 * test starts) and prints one line per test, a skip count, and "N passed, N failed".
 * A failing check prints file:line and what differed, and ends the test.
 */
#ifndef ZT_HARNESS_H
#define ZT_HARNESS_H

#include "zck.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void (*zt_fn)(void);
void zt_register(const char *name, zt_fn fn);
/* 1 when ZT_STRESS=1: long campaigns (make stress) instead of the short mode of make test */
int zt_stress(void);
/* the repository root (for tests/data), from ZT_ROOT */
const char *zt_root(void);

#define ZT_TEST(name)                                                                          \
    static void zt_test_##name(void);                                                          \
    __attribute__((constructor)) static void zt_reg_##name(void)                               \
    {                                                                                          \
        zt_register(#name, zt_test_##name);                                                    \
    }                                                                                          \
    static void zt_test_##name(void)

#define ZT_FAIL(...)                                                                           \
    do {                                                                                       \
        fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);                                      \
        fprintf(stderr, __VA_ARGS__);                                                          \
        fprintf(stderr, "\n");                                                                 \
        fflush(NULL);                                                                          \
        _exit(1);                                                                              \
    } while (0)

#define ZT_CHECK(c)                                                                            \
    do {                                                                                       \
        if (!(c))                                                                              \
            ZT_FAIL("check failed: %s", #c);                                                   \
    } while (0)

#define ZT_CHECK_EQ(a, b)                                                                      \
    do {                                                                                       \
        long long zt_a_ = (long long)(a), zt_b_ = (long long)(b);                              \
        if (zt_a_ != zt_b_)                                                                    \
            ZT_FAIL("check failed: %s == %s (%lld vs %lld)", #a, #b, zt_a_, zt_b_);            \
    } while (0)

/* expr must return 0; otherwise print the library's error */
#define ZT_OK(expr)                                                                            \
    do {                                                                                       \
        int zt_rc_ = (expr);                                                                   \
        if (zt_rc_ != 0)                                                                       \
            ZT_FAIL("%s returned %s: %s", #expr, zr_err_name(zt_rc_), zr_err_msg());           \
    } while (0)

/* expr must fail with code, and the message must contain text (NULL: any) */
#define ZT_ERR(expr, code, text)                                                               \
    do {                                                                                       \
        zr_err_clear();                                                                        \
        int zt_rc_ = (expr);                                                                   \
        if (zt_rc_ != (code))                                                                  \
            ZT_FAIL("%s returned %s, expected %s (message: %s)", #expr, zr_err_name(zt_rc_),    \
                    zr_err_name(code), zr_err_msg());                                          \
        const char *zt_t_ = (text);                                                            \
        if (zt_t_ && !strstr(zr_err_msg(), zt_t_))                                             \
            ZT_FAIL("%s: message '%s' lacks '%s'", #expr, zr_err_msg(), zt_t_);                \
    } while (0)

#define ZT_SKIP(...)                                                                           \
    do {                                                                                       \
        fprintf(stderr, "  skip: ");                                                           \
        fprintf(stderr, __VA_ARGS__);                                                          \
        fprintf(stderr, "\n");                                                                 \
        fflush(NULL);                                                                          \
        _exit(77);                                                                             \
    } while (0)

#endif
