/*
 * test_env.c: environment variables are read in one place (ckpt/env.c, zr_env) and listed in
 * one table in docs/RUNNING.md.
 */
#include "harness.h"
#include "ckutil.h"
#include "zck.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* every variable of the table is in RUNNING.md's section "Environment variables", as `NAME` */
ZT_TEST(env_every_variable_is_documented)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/docs/RUNNING.md", zt_root());
    char *doc = zt_slurp(path);
    ZT_CHECK(doc);
    const char *sec = strstr(doc, "## Environment variables");
    ZT_CHECK(sec);
    for (int v = 0; v < ZR_ENV_COUNT; v++) {
        const char *name = zr_env_name((zr_env_var)v);
        ZT_CHECK(name && zr_env_doc((zr_env_var)v));
        char quoted[128];
        snprintf(quoted, sizeof quoted, "`%s`", name);
        if (!strstr(sec, quoted))
            ZT_FAIL("docs/RUNNING.md (Environment variables) does not list %s", name);
    }
    free(doc);
}

/* a value set and empty: zr_env reads the first, treats the second as unset */
ZT_TEST(env_reads_through_the_table)
{
    ZT_CHECK(setenv("ZR_DEVICE_COMM", "shm", 1) == 0);
    ZT_CHECK(zr_env(ZR_ENV_DEVICE_COMM) && !strcmp(zr_env(ZR_ENV_DEVICE_COMM), "shm"));
    ZT_CHECK(setenv("ZR_DEVICE_COMM", "", 1) == 0);
    ZT_CHECK(zr_env(ZR_ENV_DEVICE_COMM) == NULL);
    unsetenv("ZR_DEVICE_COMM");
    ZT_CHECK(zr_env(ZR_ENV_COUNT) == NULL && zr_env_name(ZR_ENV_COUNT) == NULL);
}

/* no getenv( in ckpt/ core/ cli/ formats/ except ckpt/env.c */
static void scan(const char *dir, int *bad)
{
    DIR *d = opendir(dir);
    ZT_CHECK(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_type == DT_DIR) {
            scan(p, bad);
            continue;
        }
        size_t n = strlen(e->d_name);
        if (n < 3 || (strcmp(e->d_name + n - 2, ".c") && strcmp(e->d_name + n - 2, ".h") &&
                      (n < 4 || strcmp(e->d_name + n - 3, ".cu"))))
            continue;
        if (strstr(p, "/ckpt/env.c"))
            continue;
        char *txt = zt_slurp(p);
        ZT_CHECK(txt);
        if (strstr(txt, "getenv(")) {
            fprintf(stderr, "  %s calls getenv (read through zr_env, ckpt/env.c)\n", p);
            (*bad)++;
        }
        free(txt);
    }
    closedir(d);
}

ZT_TEST(env_read_in_one_place)
{
    int bad = 0;
    const char *dirs[] = {"ckpt", "core", "cli", "formats"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", zt_root(), dirs[i]);
        scan(p, &bad);
    }
    ZT_CHECK_EQ(bad, 0);
}
