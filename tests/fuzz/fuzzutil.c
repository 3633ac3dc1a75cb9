/*
 * fuzzutil.c: what the fuzz targets share (fuzz.h): the verdict on a parser's result, inputs
 * as C strings or as files (a memfd, so the fuzzer touches no disk for them), and a scratch
 * directory of the process's own for the parsers that write (imports).
 */
#include "fuzz.h"

#include "zck.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int zfuzz_verdict(int rc, const char *what)
{
    if (rc == 0)
        return 1;
    if (rc > 0) {
        fprintf(stderr, "fuzz: %s returned %d, expected 0 or a negative ZR_E* code\n", what, rc);
        abort();
    }
    if (zr_err_msg()[0] == 0) {
        fprintf(stderr, "fuzz: %s rejected the input (%s) without a message\n", what,
                zr_err_name(rc));
        abort(); /* every rejection must say why */
    }
    return 0;
}

char *zfuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    if (size)
        memcpy(s, data, size);
    s[size] = 0;
    return s;
}

const char *zfuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        if ((fd = memfd_create("zfuzz", MFD_CLOEXEC)) < 0) {
            perror("fuzz: memfd_create");
            abort();
        }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) < 0)
        abort();
    for (size_t at = 0; at < size;) {
        ssize_t w = pwrite(fd, data + at, size - at, (off_t)at);
        if (w <= 0) {
            perror("fuzz: write to memfd");
            abort();
        }
        at += (size_t)w;
    }
    return path;
}

static char dir[4096];

const char *zfuzz_dir(void)
{
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/zfuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(zfuzz_cleanup);
    }
    return dir;
}

const char *zfuzz_path(const char *name)
{
    static char p[8192];
    snprintf(p, sizeof p, "%s/%s", zfuzz_dir(), name);
    return p;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(p);
    else
        unlink(p);
    return 0;
}

void zfuzz_rmtree(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void zfuzz_cleanup(void)
{
    if (dir[0])
        zfuzz_rmtree(dir);
    dir[0] = 0;
}
