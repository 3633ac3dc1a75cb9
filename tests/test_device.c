/*
 * test_device.c: the device loader (core/device.c) on every machine. Without the CUDA backend
 * or without a GPU, zr_device_open must fail with ZR_EUNSUPPORTED and a message that says
 * which (never crash); with nvcc on the machine, make must have built build/libzr_cuda.so
 * (so CI catches a broken CUDA build); with a GPU, the GPU checks (build/gpu_kernels --quick)
 * run, else one skip line says why they did not.
 *
 * make test exports ZT_NVCC: the nvcc the Makefile used ("" when it built without CUDA). Run
 * by hand without it, the test looks for nvcc as the Makefile does.
 */
#include "device.h"
#include "harness.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>

static void exe_dir(char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    ZT_CHECK(n > 0);
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    ZT_CHECK(slash);
    *slash = '\0';
}

static int nvcc_present(void)
{
    const char *e = getenv("ZT_NVCC");
    if (e)
        return *e != '\0';
    const char *path = getenv("PATH");
    char buf[4096];
    while (path && *path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        snprintf(buf, sizeof buf, "%.*s/nvcc", (int)len, path);
        if (len && access(buf, X_OK) == 0)
            return 1;
        path = end ? end + 1 : NULL;
    }
    return access("/usr/local/cuda/bin/nvcc", X_OK) == 0;
}

static int file_nonempty(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
}

ZT_TEST(device_without_backend_is_unsupported)
{
    /* ZR_CUDA_LIB naming a missing file */
    ZT_CHECK(setenv("ZR_CUDA_LIB", "./no-such-dir/libzr_cuda.so", 1) == 0);
    const zr_device_ops *ops = (const zr_device_ops *)&ops;
    ZT_ERR(zr_device_open(&ops), ZR_EUNSUPPORTED, "./no-such-dir/libzr_cuda.so");
    ZT_CHECK(ops == NULL);
    ZT_CHECK(strstr(zr_err_msg(), "does not exist"));
    /* the outcome is kept: the same answer again, and for --device auto */
    ZT_ERR(zr_device_open(&ops), ZR_EUNSUPPORTED, "does not exist");
    ZT_CHECK(!zr_device_cuda_available());

    /* a file that is not a shared object: dlopen's own words */
    FILE *f = fopen("fake.so", "w");
    ZT_CHECK(f);
    fputs("not an ELF file\n", f);
    fclose(f);
    ZT_ERR(zr_device_open_at("./fake.so", &ops), ZR_EUNSUPPORTED, "cannot load the CUDA backend");
    ZT_CHECK(strstr(zr_err_msg(), "fake.so"));

    /* a real shared object without the getter (libm, already loaded by this program) */
    Dl_info info;
    double (*fn)(double) = cos;
    void *addr;
    memcpy(&addr, &fn, sizeof addr);
    if (dladdr(addr, &info) && info.dli_fname && strchr(info.dli_fname, '/'))
        ZT_ERR(zr_device_open_at(info.dli_fname, &ops), ZR_EUNSUPPORTED, "has no zr_cuda_ops_v1");

    /* where it looks by default: next to the executable */
    ZT_CHECK(unsetenv("ZR_CUDA_LIB") == 0);
    char p[4096], d[4096], want[4200];
    ZT_OK(zr_device_lib_path(p, sizeof p));
    exe_dir(d, sizeof d);
    snprintf(want, sizeof want, "%s/libzr_cuda.so", d);
    ZT_CHECK(!strcmp(p, want));
    ZT_ERR(zr_device_lib_path(p, 8), ZR_EINVAL, "does not fit");
}

ZT_TEST(device_backend_built_when_nvcc_exists)
{
    if (!nvcc_present())
        ZT_SKIP("no nvcc here: the CUDA backend is not built (make builds it when it finds "
                "nvcc)");
    char d[4096], so[4200];
    exe_dir(d, sizeof d);
    snprintf(so, sizeof so, "%s/libzr_cuda.so", d);
    if (!file_nonempty(so))
        ZT_FAIL("nvcc is on this machine but %s was not built (make builds it; see the nvcc "
                "errors of the build)", so);
#if defined(__SANITIZE_ADDRESS__)
    /* loading CUDA's libraries under ASan is not what this build checks */
    fprintf(stderr, "  (sanitizer build: %s exists; loading it is checked by make test)\n", so);
#else
    /* it loads, exports the getter of this ABI, and either finds a GPU or says there is none */
    const zr_device_ops *ops;
    zr_err_clear();
    int rc = zr_device_open_at(so, &ops);
    if (rc) {
        ZT_CHECK_EQ(rc, ZR_EUNSUPPORTED);
        if (!strstr(zr_err_msg(), "no GPU"))
            ZT_FAIL("%s does not load as this program's backend: %s", so, zr_err_msg());
    } else {
        ZT_CHECK(ops->abi_version == ZR_DEVICE_ABI_VERSION && !strcmp(ops->name, "cuda"));
    }
#endif
}

ZT_TEST(device_gpu_checks_or_one_skip_line)
{
#if defined(__SANITIZE_ADDRESS__)
    ZT_SKIP("GPU checks: not under ASan (CUDA needs its address space); make test runs them");
#endif
    ZT_CHECK(unsetenv("ZR_CUDA_LIB") == 0);
    char d[4096], so[4200], bin[4200];
    exe_dir(d, sizeof d);
    snprintf(so, sizeof so, "%s/libzr_cuda.so", d);
    snprintf(bin, sizeof bin, "%s/gpu_kernels", d);
    const zr_device_ops *ops;
    zr_err_clear();
    int rc = zr_device_open(&ops);
    if (rc) {
        /* no crash, a clear reason: no backend built, or no GPU for the one that is */
        ZT_CHECK_EQ(rc, ZR_EUNSUPPORTED);
        ZT_CHECK(!zr_device_cuda_available());
        const char *why = zr_err_msg();
        if (file_nonempty(so) && !strstr(why, "no GPU"))
            ZT_FAIL("%s exists, yet the loader says: %s", so, why);
        if (!file_nonempty(so) && !strstr(why, "built without CUDA"))
            ZT_FAIL("no %s, yet the loader says: %s", so, why);
        ZT_SKIP("GPU checks not run: %s (tests/gpu/run.sh runs them on a GPU machine)", why);
    }
    ZT_CHECK(zr_device_cuda_available());
    if (!file_nonempty(bin))
        ZT_FAIL("a GPU is here but %s was not built", bin);
    fflush(NULL);
    pid_t pid = fork();
    ZT_CHECK(pid >= 0);
    if (pid == 0) {
        execl(bin, bin, "--quick", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        ZT_FAIL("%s --quick failed (status %d): its output is above", bin,
                WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}
