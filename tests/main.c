/*
 * main.c: the test runner. Runs every registered test (or those whose names start with an
 * argument) in a forked child, each inside a fresh directory under $TMPDIR, with a timeout.
 * Prints one line per test, then "N skipped" when any were, then "N passed, N failed".
 * Exit status 0 only when nothing failed. A failed test's directory is kept for inspection.
 */
#include "harness.h"

#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#define MAX_TESTS 512

static struct {
    const char *name;
    zt_fn fn;
} tests[MAX_TESTS];
static int ntests;

void zt_register(const char *name, zt_fn fn)
{
    if (ntests < MAX_TESTS) {
        tests[ntests].name = name;
        tests[ntests].fn = fn;
        ntests++;
    }
}

int zt_stress(void)
{
    const char *s = getenv("ZT_STRESS");
    return s && *s == '1';
}

const char *zt_root(void)
{
    const char *r = getenv("ZT_ROOT");
    return r ? r : ".";
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    return remove(p);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    /* run in name order so that output is stable */
    const char *names[MAX_TESTS];
    for (int i = 0; i < ntests; i++)
        names[i] = tests[i].name;
    qsort(names, (size_t)ntests, sizeof *names, cmp_name);
    char cwd[4096];
    if (!getenv("ZT_ROOT") && getcwd(cwd, sizeof cwd))
        setenv("ZT_ROOT", cwd, 1); /* tests find tests/data relative to where zt started */
    /* the suite's zrun runs check the CPU engine (bits across stages and worlds): on a GPU
     * machine too, unless a test asks for a device with --device */
    if (!getenv("ZR_DEVICE"))
        setenv("ZR_DEVICE", "cpu", 1);
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    unsigned timeout = zt_stress() ? 3600 : 600;
    int passed = 0, failed = 0, skipped = 0;
    for (int k = 0; k < ntests; k++) {
        int i = 0;
        while (strcmp(tests[i].name, names[k]))
            i++;
        int want = argc < 2;
        for (int a = 1; a < argc; a++)
            if (!strncmp(tests[i].name, argv[a], strlen(argv[a])))
                want = 1;
        if (!want)
            continue;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/zt-%s-XXXXXX", tmp, tests[i].name);
        if (!mkdtemp(dir)) {
            fprintf(stderr, "zt: cannot create a directory under %s: %s\n", tmp,
                    strerror(errno));
            return 2;
        }
        fflush(NULL);
        double t0 = now();
        pid_t pid = fork();
        if (pid == 0) {
            if (chdir(dir) < 0)
                _exit(3);
            setpgid(0, 0);
            alarm(timeout);
            tests[i].fn();
            fflush(NULL);
            exit(0); /* not _exit: LeakSanitizer checks at exit in SAN=1 builds */
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        kill(-pid, SIGKILL); /* whatever the test left running */
        double dt = now() - t0;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            printf("PASS %-40s %7.2fs\n", tests[i].name, dt);
            passed++;
            nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
            printf("SKIP %-40s\n", tests[i].name);
            skipped++;
            nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        } else {
            if (WIFSIGNALED(st))
                printf("FAIL %-40s %7.2fs (killed by signal %d%s; files kept in %s)\n",
                       tests[i].name, dt, WTERMSIG(st),
                       WTERMSIG(st) == SIGALRM ? ": timeout" : "", dir);
            else
                printf("FAIL %-40s %7.2fs (exit %d; files kept in %s)\n", tests[i].name, dt,
                       WEXITSTATUS(st), dir);
            failed++;
        }
        fflush(stdout);
    }
    if (skipped)
        printf("%d skipped\n", skipped);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
