/*
 * names.c: the names a run directory holds: step directories (step-<8+ digits>) and the
 * `latest` file that names the newest committed one, read and replaced atomically
 * (write-temp + rename + fsync of the directory). Used by the commit, the reader, the run
 * listing and retention, and by nothing else below them, so no two files of ckpt/ depend on
 * each other.
 */
#include "zck_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool zck__parse_step_name(const char *name, uint64_t *step)
{
    if (strncmp(name, "step-", 5))
        return false;
    const char *d = name + 5;
    if (!*d || strlen(d) > 19)
        return false;
    uint64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9')
            return false;
        v = v * 10 + (uint64_t)(*d - '0');
    }
    *step = v;
    return true;
}

int zck__steps_add(zck__stepdir **v, size_t *n, size_t *cap, uint64_t step, const char *name)
{
    ZR_TRY(zr_array_grow(v, cap, *n, sizeof **v));
    if (!((*v)[*n].name = strdup(name)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    (*v)[(*n)++].step = step;
    return 0;
}

static int cmp_step_desc(const void *a, const void *b)
{
    const zck__stepdir *x = a, *y = b;
    return x->step > y->step ? -1 : x->step < y->step;
}

void zck__steps_sort_desc(zck__stepdir *v, size_t n)
{
    if (n) /* qsort(NULL, 0, ...) is undefined */
        qsort(v, n, sizeof *v, cmp_step_desc);
}

void zck__steps_free(zck__stepdir *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

int zck_run_owns(const char *name, size_t n)
{
    static const char *const prefix[] = {"step-", "damaged-step-", "."};
    if (n == 6 && !memcmp(name, "latest", 6))
        return 1;
    for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
        if (n >= strlen(prefix[i]) && !memcmp(name, prefix[i], strlen(prefix[i])))
            return 1;
    return 0;
}

void zck_step_dirname(char out[32], uint64_t step)
{
    snprintf(out, 32, "step-%08llu", (unsigned long long)step);
}

int zck_latest(char **out, const char *run_dir)
{
    char *lp = zck_path_join(run_dir, "latest"), *txt = NULL;
    if (!lp)
        return ZR_ENOMEM;
    int rc = zck__read_small(&txt, NULL, lp, 4096);
    if (rc == ZR_ENOTFOUND)
        rc = zr_err_set(ZR_ENOTFOUND, "%s: no 'latest' file: no committed checkpoint here",
                        run_dir);
    if (rc)
        goto out;
    size_t n = strlen(txt);
    while (n && (txt[n - 1] == '\n' || txt[n - 1] == '\r' || txt[n - 1] == ' '))
        txt[--n] = 0;
    uint64_t step;
    if (!zck__parse_step_name(txt, &step)) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: expected a name like step-00001000, found '%.64s'", lp,
                        txt);
        goto out;
    }
    if (!(*out = zck_path_join(run_dir, txt))) {
        rc = ZR_ENOMEM;
        goto out;
    }
    struct stat st;
    if (lstat(*out, &st) == 0 && S_ISLNK(st.st_mode)) {
        rc = zr_err_set(ZR_ECORRUPT, "%s: names %s, a symbolic link: a step directory that is a "
                        "symbolic link is not part of the run", lp, txt);
        free(*out);
        *out = NULL;
    }
out:
    free(lp);
    free(txt);
    return rc;
}

int zck__write_latest(const char *run_dir, const char *name)
{
    char line[64];
    snprintf(line, sizeof line, "%s\n", name);
    char *dst = zck_path_join(run_dir, "latest");
    if (!dst)
        return ZR_ENOMEM;
    int rc = zck_write_file_atomic(dst, line, strlen(line)); /* its temporary: .latest.tmp-PID */
    free(dst);
    return rc;
}

int zck_latest_set(const char *run_dir, uint64_t step)
{
    char name[32];
    zck_step_dirname(name, step);
    char *p = zck_path_join(run_dir, name);
    if (!p)
        return ZR_ENOMEM;
    struct stat st;
    int ok = lstat(p, &st) == 0 && S_ISDIR(st.st_mode); /* a symbolic link is no step of the run */
    free(p);
    if (!ok)
        return zr_err_set(ZR_ENOTFOUND, "%s/%s: no such checkpoint directory", run_dir, name);
    return zck__write_latest(run_dir, name);
}
