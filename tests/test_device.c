/*
 * test_device.c: the device loader (core/device/device.c) on every machine. Without the CUDA backend
 * or without a GPU, zr_device_open must fail with ZR_EUNSUPPORTED and a message that says
 * which (never crash); with nvcc on the machine, make must have built build/libzr_cuda.so
 * (so CI catches a broken CUDA build); with a GPU, the GPU checks (build/gpu_kernels --quick)
 * run, else one skip line says why they did not.
 *
 * make test exports ZT_NVCC: the nvcc the Makefile used ("" when it built without CUDA). Run
 * by hand without it, the test looks for nvcc as the Makefile does.
 *
 * The host simulation (ZR_CUDA_LIB=hostsim, core/device/hostsim.c) on every machine: its table, its
 * memory, and that its optimizer, model and collectives give the CPU engine's bits.
 */
#include "comm.h"
#include "device.h"
#include "ckutil.h"
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

/* The CUDA backend's activation bytes per recompute mode, from its own layout code (the getter
 * and activation_bytes run no CUDA call, so this runs without a GPU): GPT-2 124M and a Llama at
 * B 8 x T 1024. selective shares one [B, NH, T, T] bf16 attention buffer among the layers: none
 * minus selective is exactly L - 1 of them; layer keeps less again. */
ZT_TEST(device_cuda_activation_bytes_per_recompute_mode)
{
    if (!nvcc_present())
        ZT_SKIP("no nvcc here: the CUDA backend is not built");
#if defined(__SANITIZE_ADDRESS__)
    ZT_SKIP("not under ASan (loading CUDA's libraries is checked by make test)");
#endif
    char d[4096], so[4200];
    exe_dir(d, sizeof d);
    snprintf(so, sizeof so, "%s/libzr_cuda.so", d);
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        ZT_FAIL("%s: %s", so, dlerror());
    zr_device_getter get = (zr_device_getter)dlsym(h, ZR_DEVICE_SYMBOL);
    ZT_CHECK(get != NULL);
    const zr_device_ops *ops = get();
    ZT_CHECK_EQ(ops->abi_version, ZR_DEVICE_ABI_VERSION);
    static const char *const specs[2] = {
        "gpt2", "llama:layers=4,heads=8,kv_heads=2,dim=256,ffn=704,ctx=1024,vocab=32000"};
    for (int k = 0; k < 2; k++) {
        zr_config c;
        ZT_OK(zr_gpt2_config_parse(&c, specs[k]));
        zr_model_offsets off;
        ZT_OK(zr_model_offsets_get(&off, &c));
        uint64_t b[3];
        for (int r = 0; r < 3; r++)
            b[r] = ops->activation_bytes(&c, &off, 8, 1024, (zr_recompute)r);
        uint64_t att = (uint64_t)8 * c.heads * 1024 * 1024 * 2;
        ZT_CHECK_EQ(b[0] - b[2], (uint64_t)(c.layers - 1) * att);
        ZT_CHECK(b[1] < b[2]);
        fprintf(stderr, "  %s, B 8 x T 1024: none %.0f MiB, layer %.0f, selective %.0f\n",
                specs[k], b[0] / 1048576.0, b[1] / 1048576.0, b[2] / 1048576.0);
    }
    dlclose(h);
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
        char why[1024];
        snprintf(why, sizeof why, "%s", zr_err_msg());
        ZT_CHECK(!zr_device_cuda_available());
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

/* ---------------------------------------------------------------- the host simulation */
/* core/device/hostsim.c (ZR_CUDA_LIB=hostsim): the device table on host memory with the CPU engine's
 * code, so its results must have the CPU's bits exactly. */

static uint64_t hs_rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* values of random sign in [-scale, scale) */
static void hs_fill(float *x, size_t n, uint64_t seed, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = ((float)hs_rng(&seed) / 2147483648.0f * 2.0f - 1.0f) * scale;
}

static void *hs_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ZT_CHECK(p);
    return p;
}

/* the table through the loader: ZR_CUDA_LIB=hostsim, exactly as a run selects it */
static const zr_device_ops *hs_open(void)
{
    ZT_CHECK(setenv("ZR_CUDA_LIB", "hostsim", 1) == 0);
    const zr_device_ops *ops = NULL;
    ZT_OK(zr_device_open(&ops));
    ZT_CHECK(!strcmp(ops->name, "hostsim"));
    return ops;
}

ZT_TEST(device_hostsim_table_and_memory)
{
    const zr_device_ops *ops = hs_open();
    ZT_CHECK(zr_device_cuda_available());
    char p[64];
    ZT_OK(zr_device_lib_path(p, sizeof p));
    ZT_CHECK(!strcmp(p, "hostsim"));
    const zr_device_ops *again = NULL;
    ZT_OK(zr_device_open_at("hostsim", &again));
    ZT_CHECK(again == ops);
    ZT_CHECK_EQ(ops->abi_version, ZR_DEVICE_ABI_VERSION);
    ZT_CHECK_EQ(ops->size, sizeof(zr_device_ops));
    ZT_CHECK(!strcmp(ops->name, "hostsim"));
    ZT_CHECK(!strcmp(ops->build, "host simulation (CPU engine)"));
    /* every operation is there (kernels alone are CUDA's) */
#define HS_HAS(f) ZT_CHECK(ops->f != NULL)
    HS_HAS(set_error_handler); HS_HAS(last_error); HS_HAS(probe); HS_HAS(init); HS_HAS(info);
    HS_HAS(synchronize); HS_HAS(mem_stats); HS_HAS(mem_reset_peak); HS_HAS(malloc);
    HS_HAS(free); HS_HAS(host_alloc); HS_HAS(host_free); HS_HAS(host_register);
    HS_HAS(host_unregister); HS_HAS(memset); HS_HAS(memcpy); HS_HAS(stream_new);
    HS_HAS(stream_free); HS_HAS(stream_sync); HS_HAS(event_new); HS_HAS(event_free);
    HS_HAS(event_record); HS_HAS(event_sync); HS_HAS(event_query); HS_HAS(stream_wait);
    HS_HAS(activation_bytes); HS_HAS(model_new); HS_HAS(model_free); HS_HAS(model_stream);
    HS_HAS(model_n_groups); HS_HAS(model_group_numel); HS_HAS(model_numel);
    HS_HAS(model_fetch_order); HS_HAS(model_param); HS_HAS(model_grad);
    HS_HAS(model_zero_grad); HS_HAS(model_forward); HS_HAS(model_loss); HS_HAS(model_backward);
    HS_HAS(model_probs); HS_HAS(model_bytes); HS_HAS(adamw); HS_HAS(sumsq); HS_HAS(add);
    HS_HAS(comm_unique_id); HS_HAS(comm_new); HS_HAS(comm_free); HS_HAS(comm_rank);
    HS_HAS(comm_world); HS_HAS(comm_stream); HS_HAS(comm_wait); HS_HAS(all_reduce);
    HS_HAS(reduce_scatter); HS_HAS(all_gather); HS_HAS(broadcast); HS_HAS(gather);
    HS_HAS(barrier);
#undef HS_HAS
    ZT_CHECK(ops->kernels == NULL);

    /* device */
    int count = 0, dev = -1;
    ZT_OK(ops->probe(&count));
    ZT_CHECK_EQ(count, 1);
    ZT_OK(ops->init(3, &dev));
    ZT_CHECK_EQ(dev, 0);
    ZT_ERR(ops->init(-1, NULL), ZR_EINVAL, "local rank -1");
    ZT_CHECK(strstr(ops->last_error(), "local rank -1"));
    char name[64];
    uint64_t fr = 0, tot = 0;
    ZT_OK(ops->info(name, sizeof name, &fr, &tot));
    ZT_CHECK(!strcmp(name, "hostsim (CPU)"));
    ZT_CHECK(tot > 0 && fr <= tot);
    ZT_OK(ops->synchronize());

    /* memory: 256-aligned, not zeroed (0xA5), counted until freed */
    uint64_t cur0, peak0, cur, peak;
    ops->mem_stats(&cur0, &peak0);
    const size_t n = 1000;
    float *d = NULL, *d2 = NULL;
    ZT_OK(ops->malloc((void **)&d, n * sizeof(float)));
    ZT_OK(ops->malloc((void **)&d2, n * sizeof(float)));
    ZT_CHECK(d && d2 && (uintptr_t)d % 256 == 0 && (uintptr_t)d2 % 256 == 0);
    for (size_t i = 0; i < n * sizeof(float); i++)
        ZT_CHECK_EQ(((unsigned char *)d)[i], 0xA5);
    ops->mem_stats(&cur, &peak);
    ZT_CHECK_EQ(cur, cur0 + 2 * n * sizeof(float));
    ZT_CHECK(peak >= cur);
    void *z = (void *)&z;
    ZT_OK(ops->malloc(&z, 0));
    ZT_CHECK(z == NULL);

    float *h = hs_xmalloc(n * sizeof(float)), *back = hs_xmalloc(n * sizeof(float));
    hs_fill(h, n, 7, 3.0f);
    zr_dev_stream *s = NULL;
    ZT_OK(ops->stream_new(&s));
    ZT_CHECK(s);
    ZT_OK(ops->memcpy(d, h, n * sizeof(float), ZR_DEV_H2D, s));
    ZT_OK(ops->memcpy(d2, d, n * sizeof(float), ZR_DEV_D2D, NULL));
    ZT_OK(ops->memcpy(back, d2, n * sizeof(float), ZR_DEV_D2H, s));
    ZT_OK(ops->stream_sync(s));
    ZT_CHECK(!memcmp(back, h, n * sizeof(float)));
    ZT_ERR(ops->memcpy(back, d2, 4, 7, NULL), ZR_EINVAL, "memcpy kind 7");
    ZT_OK(ops->memset(d2, 0, 16 * sizeof(float), NULL));
    ZT_OK(ops->memcpy(back, d2, n * sizeof(float), ZR_DEV_D2H, NULL));
    for (size_t i = 0; i < 16; i++)
        ZT_CHECK(back[i] == 0.0f);
    ZT_CHECK(back[16] == h[16]);

    /* streams and events: tokens, always done */
    zr_dev_event *e = NULL;
    ZT_OK(ops->event_new(&e));
    ZT_CHECK(e);
    ZT_OK(ops->event_record(e, s));
    ZT_CHECK_EQ(ops->event_query(e), 1);
    ZT_OK(ops->event_sync(e));
    ZT_OK(ops->stream_wait(s, e));
    ops->event_free(e);
    ops->stream_free(s);

    /* host memory: page-aligned, registration a no-op */
    void *hp = NULL;
    ZT_OK(ops->host_alloc(&hp, 12345));
    ZT_CHECK(hp && (uintptr_t)hp % 4096 == 0);
    memset(hp, 1, 12345);
    ZT_OK(ops->host_register(h, n * sizeof(float)));
    ZT_OK(ops->host_unregister(h));
    ops->host_free(hp);

    ops->free(d);
    ops->free(d2);
    ops->free(NULL);
    ops->mem_stats(&cur, &peak);
    ZT_CHECK_EQ(cur, cur0);
    ZT_CHECK(peak >= cur0 + 2 * n * sizeof(float));
    ops->mem_reset_peak();
    ops->mem_stats(&cur, &peak);
    ZT_CHECK_EQ(peak, cur0);
    free(h);
    free(back);
}

ZT_TEST(device_hostsim_optimizer_bits)
{
    const zr_device_ops *ops = hs_open();
    /* more than two sumsq blocks of 16384, not a multiple of 8 */
    const size_t n = 40000 + 5;
    float *p = hs_xmalloc(n * 4), *g = hs_xmalloc(n * 4), *m = hs_xmalloc(n * 4);
    float *v = hs_xmalloc(n * 4), *p2 = hs_xmalloc(n * 4), *m2 = hs_xmalloc(n * 4);
    float *v2 = hs_xmalloc(n * 4), *y = hs_xmalloc(n * 4), *want = hs_xmalloc(n * 4);
    hs_fill(p, n, 1, 1.0f);
    hs_fill(g, n, 2, 0.01f);
    hs_fill(m, n, 3, 0.001f);
    hs_fill(v, n, 4, 1e-5f);
    for (size_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    memcpy(p2, p, n * 4);
    memcpy(m2, m, n * 4);
    memcpy(v2, v, n * 4);

    float *dp, *dg, *dm, *dv, *dy;
    ZT_OK(ops->malloc((void **)&dp, n * 4));
    ZT_OK(ops->malloc((void **)&dg, n * 4));
    ZT_OK(ops->malloc((void **)&dm, n * 4));
    ZT_OK(ops->malloc((void **)&dv, n * 4));
    ZT_OK(ops->malloc((void **)&dy, n * 4));
    ZT_OK(ops->memcpy(dp, p, n * 4, ZR_DEV_H2D, NULL));
    ZT_OK(ops->memcpy(dg, g, n * 4, ZR_DEV_H2D, NULL));
    ZT_OK(ops->memcpy(dm, m, n * 4, ZR_DEV_H2D, NULL));
    ZT_OK(ops->memcpy(dv, v, n * 4, ZR_DEV_H2D, NULL));

    zr_adamw_hp hp = ZR_ADAMW_HP_INIT;
    for (uint64_t t = 1; t <= 3; t++) {
        int decay = t != 2;
        zr_adamw_update(p2, g, m2, v2, n, t, 1e-3f, 0.5f, decay, &hp);
        ZT_OK(ops->adamw(dp, dg, dm, dv, n, t, 1e-3f, 0.5f, decay, &hp, NULL));
    }
    ZT_OK(ops->memcpy(p, dp, n * 4, ZR_DEV_D2H, NULL));
    ZT_OK(ops->memcpy(m, dm, n * 4, ZR_DEV_D2H, NULL));
    ZT_OK(ops->memcpy(v, dv, n * 4, ZR_DEV_D2H, NULL));
    ZT_CHECK(!memcmp(p, p2, n * 4));
    ZT_CHECK(!memcmp(m, m2, n * 4));
    ZT_CHECK(!memcmp(v, v2, n * 4));
    ZT_ERR(ops->adamw(dp, dg, dm, dv, n, 0, 1e-3f, 1.0f, 1, &hp, NULL), ZR_EINVAL, "step 0");

    double ss = -1.0, want_ss = zr_sumsq(g, n);
    ZT_OK(ops->sumsq(dg, n, &ss, NULL));
    ZT_CHECK(!memcmp(&ss, &want_ss, sizeof ss));
    ZT_CHECK(want_ss > 0.0);
    ZT_OK(ops->sumsq(dg, 0, &ss, NULL));
    ZT_CHECK(ss == 0.0);

    /* add: y += x, twice (accumulation over micro-batches) */
    hs_fill(y, n, 5, 2.0f);
    for (size_t i = 0; i < n; i++)
        want[i] = (y[i] + g[i]) + g[i];
    ZT_OK(ops->memcpy(dy, y, n * 4, ZR_DEV_H2D, NULL));
    ZT_OK(ops->add(dy, dg, n, NULL));
    ZT_OK(ops->add(dy, dg, n, NULL));
    ZT_OK(ops->add(dy, dg, 0, NULL));
    ZT_OK(ops->memcpy(y, dy, n * 4, ZR_DEV_D2H, NULL));
    ZT_CHECK(!memcmp(y, want, n * 4));

    ops->free(dp);
    ops->free(dg);
    ops->free(dm);
    ops->free(dv);
    ops->free(dy);
    free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2), free(y), free(want);
}

/* a params hook that lends a CPU model's arena (the device contract on host memory) */
typedef struct {
    zr_model *src;
    int lent, done;
} hs_lender;

static int hs_params(void *ctx, size_t g, const float **out)
{
    hs_lender *l = ctx;
    *out = zr_model_param(l->src, g);
    l->lent++;
    return 0;
}

static int hs_params_done(void *ctx, size_t g)
{
    (void)g;
    ((hs_lender *)ctx)->done++;
    return 0;
}

ZT_TEST(device_hostsim_model_matches_cpu_bits)
{
    const zr_device_ops *ops = hs_open();
    zr_gpt2_config c = ZR_GPT2(2, 2, 32, 16, 64);
    const size_t B = 2, T = 16, N = B * T;
    zr_model *cm;
    ZT_OK(zr_model_new_ext(&cm, &c, B, T, NULL));
    zr_model_init_weights(cm, 42);
    int32_t in[2 * 16], tg[2 * 16];
    uint64_t seed = 9;
    for (size_t i = 0; i < N; i++) {
        in[i] = (int32_t)(hs_rng(&seed) % c.vocab);
        tg[i] = (int32_t)(hs_rng(&seed) % c.vocab);
    }

    uint64_t cur0, cur;
    ops->mem_stats(&cur0, NULL);
    zr_dev_model *dm;
    ZT_OK(zr_device_model_new(ops, &dm, &c, B, T, NULL, ZR_RECOMPUTE_NONE));
    ZT_CHECK(ops->model_stream(dm) != NULL);
    uint64_t pb, gb, ab, cpb, cgb, cab;
    ops->model_bytes(dm, &pb, &gb, &ab);
    zr_model_bytes(cm, &cpb, &cgb, &cab);
    ZT_CHECK(pb == cpb && gb == cgb && ab == cab && pb > 0 && ab > 0);
    uint64_t acts = 0;
    ZT_OK(zr_device_activation_bytes(&acts, ops, &c, B, T, ZR_RECOMPUTE_NONE));
    ZT_CHECK_EQ(acts, zr_model_activation_bytes(&c, B, T, ZR_RECOMPUTE_NONE));
    ZT_OK(zr_device_activation_bytes(&acts, ops, &c, B, T, ZR_RECOMPUTE_LAYER));
    ZT_CHECK_EQ(acts, zr_model_activation_bytes(&c, B, T, ZR_RECOMPUTE_LAYER));
    ZT_CHECK_EQ(zr_device_activation_bytes(&acts, ops, &c, B, T, (zr_recompute)7), ZR_EINVAL);
    ops->mem_stats(&cur, NULL);
    ZT_CHECK_EQ(cur, cur0 + pb + gb + ab); /* the arenas count as device memory */

    /* the same groups, sizes and fetch order */
    size_t G = ops->model_n_groups(dm);
    ZT_CHECK_EQ(G, zr_model_n_groups(cm));
    ZT_CHECK_EQ(ops->model_numel(dm), zr_model_numel(cm));
    size_t o1[16], o2[16];
    for (int bw = 0; bw < 2; bw++) {
        size_t k = ops->model_fetch_order(dm, bw, o1);
        ZT_CHECK_EQ(k, zr_model_fetch_order(cm, bw, o2));
        ZT_CHECK(!memcmp(o1, o2, k * sizeof *o1));
    }

    /* nothing to read before a forward */
    float loss = -1.0f, dloss = -1.0f;
    ZT_ERR(ops->model_loss(dm, &loss), ZR_EINVAL, "no forward");
    float *probs = hs_xmalloc(N * c.vocab * sizeof(float));
    ZT_ERR(ops->model_probs(dm, probs), ZR_EINVAL, "no forward");
    ZT_ERR(ops->model_backward(dm, 1.0f), ZR_EINVAL, "no forward");

    /* own arenas, zeroed; upload the CPU model's parameters group by group */
    for (size_t g = 0; g < G; g++) {
        uint64_t k = ops->model_group_numel(dm, g);
        ZT_CHECK_EQ(k, zr_model_group_numel(cm, g));
        float *dp = ops->model_param(dm, g);
        ZT_CHECK(dp && ops->model_grad(dm, g));
        for (uint64_t i = 0; i < k; i++)
            ZT_CHECK(dp[i] == 0.0f);
        ZT_OK(ops->memcpy(dp, zr_model_param(cm, g), k * sizeof(float), ZR_DEV_H2D, NULL));
    }
    ZT_CHECK(ops->model_param(dm, G) == NULL);

    /* forward: the loss's bits, returned or read later (loss NULL) */
    ZT_OK(zr_model_forward(cm, in, tg, B, T, &loss));
    ZT_CHECK(loss > 0.0f);
    ZT_OK(ops->model_forward(dm, in, tg, B, T, NULL));
    ZT_OK(ops->model_loss(dm, &dloss));
    ZT_CHECK(!memcmp(&loss, &dloss, sizeof loss));
    dloss = -1.0f;
    ZT_OK(ops->model_forward(dm, in, tg, B, T, &dloss));
    ZT_CHECK(!memcmp(&loss, &dloss, sizeof loss));
    ZT_OK(ops->model_probs(dm, probs));
    ZT_CHECK(!memcmp(probs, zr_model_probs(cm), N * c.vocab * sizeof(float)));

    /* backward: the gradients' bits */
    zr_model_zero_grad(cm);
    ZT_OK(ops->model_zero_grad(dm));
    ZT_OK(zr_model_backward(cm, 0.5f));
    ZT_OK(ops->model_backward(dm, 0.5f));
    for (size_t g = 0; g < G; g++) {
        uint64_t k = zr_model_group_numel(cm, g);
        float *hg = hs_xmalloc(k * sizeof(float));
        ZT_OK(ops->memcpy(hg, ops->model_grad(dm, g), k * sizeof(float), ZR_DEV_D2H, NULL));
        if (memcmp(hg, zr_model_grad(cm, g), k * sizeof(float)))
            ZT_FAIL("group %zu: the gradient differs from the CPU model's", g);
        free(hg);
    }

    /* the forward's checks and messages are zr_model_forward's; a failed forward leaves none */
    int32_t bad[2 * 16];
    memcpy(bad, in, sizeof bad);
    bad[3] = (int32_t)c.vocab;
    ZT_ERR(ops->model_forward(dm, bad, tg, B, T, &dloss), ZR_EINVAL, "inputs[3]");
    ZT_ERR(ops->model_forward(dm, in, tg, B + 1, T, NULL), ZR_EINVAL, "batch B = 3");
    ZT_ERR(ops->model_loss(dm, &dloss), ZR_EINVAL, "no forward");
    /* without targets: loss 0, probabilities still there */
    ZT_OK(ops->model_forward(dm, in, NULL, 1, 5, NULL));
    ZT_OK(ops->model_loss(dm, &dloss));
    ZT_CHECK(dloss == 0.0f);
    ZT_OK(zr_model_forward(cm, in, NULL, 1, 5, &loss));
    ZT_OK(ops->model_probs(dm, probs));
    ZT_CHECK(!memcmp(probs, zr_model_probs(cm), 5 * c.vocab * sizeof(float)));
    ops->model_free(dm);
    ops->mem_stats(&cur, NULL);
    ZT_CHECK_EQ(cur, cur0);

    /* lent parameters (hooks): model_param is NULL, the loss the same bits */
    hs_lender l = {cm, 0, 0};
    zr_model_hooks hk = {.ctx = &l, .params = hs_params, .params_done = hs_params_done};
    ZT_OK(zr_device_model_new(ops, &dm, &c, B, T, &hk, ZR_RECOMPUTE_NONE));
    ZT_CHECK(ops->model_param(dm, 0) == NULL && ops->model_grad(dm, 0) != NULL);
    ops->model_bytes(dm, &pb, &gb, NULL);
    ZT_CHECK(pb == 0 && gb == cgb);
    ZT_OK(zr_model_forward(cm, in, tg, B, T, &loss));
    ZT_OK(ops->model_forward(dm, in, tg, B, T, &dloss));
    ZT_CHECK(!memcmp(&loss, &dloss, sizeof loss));
    ZT_CHECK(l.lent == (int)c.layers + 4 && l.done == l.lent);
    ops->model_free(dm);
    ops->model_free(NULL);
    zr_model_free(cm);
    free(probs);
}

static int hs_check_value;
static int hs_check(void *ctx)
{
    (void)ctx;
    return hs_check_value;
}

/* the world-1 collectives on a hostsim communicator: copies (in place: nothing) */
static void hs_world1_ops(const zr_device_ops *ops, zr_dev_comm *dc)
{
    ZT_CHECK_EQ(ops->comm_rank(dc), 0);
    ZT_CHECK_EQ(ops->comm_world(dc), 1);
    ZT_CHECK(ops->comm_stream(dc) != NULL);
    float a[7], b[7];
    double x[3] = {1.5, -2.25, 1e300}, yv[3] = {0, 0, 0};
    hs_fill(a, 7, 11, 5.0f);
    memset(b, 0, sizeof b);
    ZT_OK(ops->all_reduce(dc, a, b, 7, ZR_DEV_F32));
    ZT_CHECK(!memcmp(a, b, sizeof a));
    ZT_OK(ops->all_reduce(dc, x, yv, 3, ZR_DEV_F64));
    ZT_CHECK(!memcmp(x, yv, sizeof x));
    ZT_OK(ops->all_reduce(dc, b, b, 7, ZR_DEV_F32));
    ZT_CHECK(!memcmp(a, b, sizeof a));
    memset(b, 0, sizeof b);
    ZT_OK(ops->reduce_scatter(dc, a, b, 7, ZR_DEV_F32));
    ZT_CHECK(!memcmp(a, b, sizeof a));
    memset(b, 0, sizeof b);
    ZT_OK(ops->all_gather(dc, a, b, 7, sizeof(float)));
    ZT_CHECK(!memcmp(a, b, sizeof a));
    memset(b, 0, sizeof b);
    ZT_OK(ops->gather(dc, a, b, 5, 0));
    ZT_CHECK(!memcmp(a, b, 5) && ((unsigned char *)b)[5] == 0);
    ZT_OK(ops->broadcast(dc, a, sizeof a, 0));
    ZT_OK(ops->barrier(dc));
    ZT_ERR(ops->all_reduce(dc, a, b, 7, ZR_DEV_BF16), ZR_EINVAL, "bf16");
    ZT_ERR(ops->broadcast(dc, a, sizeof a, 1), ZR_EINVAL, "root 1 of world 1");
    ZT_ERR(ops->gather(dc, a, b, 4, -1), ZR_EINVAL, "root -1");
    /* an argument error leaves it usable */
    ZT_OK(ops->barrier(dc));
    hs_check_value = 0;
    ZT_OK(ops->comm_wait(dc, NULL, NULL));
    ZT_OK(ops->comm_wait(dc, hs_check, NULL));
}

ZT_TEST(device_hostsim_comm_world_of_one)
{
    const zr_device_ops *ops = hs_open();
    ZT_CHECK(unsetenv("ZR_WORLD") == 0 && unsetenv("ZR_RANK") == 0);
    ZT_CHECK(zr_comm_env() == NULL);
    unsigned char id[ZR_NCCL_ID_BYTES], small[8];
    ZT_ERR(ops->comm_unique_id(small, sizeof small), ZR_EINVAL, "needs 128 bytes");
    ZT_OK(ops->comm_unique_id(id, sizeof id));
    ZT_CHECK(!memcmp(id, "hostsim", 7));

    /* no shm communicator in this process: a world of one works on its own */
    zr_dev_comm *dc = NULL;
    ZT_ERR(ops->comm_new(&dc, id, sizeof id, 0, 2), ZR_EINVAL, "no shm communicator");
    ZT_CHECK(dc == NULL);
    ZT_ERR(ops->comm_new(&dc, id, 16, 0, 1), ZR_EINVAL, "unique id of 16 bytes");
    unsigned char other[ZR_NCCL_ID_BYTES];
    memset(other, 0, sizeof other);
    ZT_ERR(ops->comm_new(&dc, other, sizeof other, 0, 1), ZR_EINVAL, "not one of hostsim's");
    ZT_ERR(ops->comm_new(&dc, id, sizeof id, 1, 1), ZR_EINVAL, "rank 1 of world 1");
    ZT_OK(ops->comm_new(&dc, id, sizeof id, 0, 1));
    hs_world1_ops(ops, dc);
    /* a nonzero check aborts it: then every call fails */
    hs_check_value = 1;
    ZT_ERR(ops->comm_wait(dc, hs_check, NULL), ZR_EIO, "aborted");
    ZT_ERR(ops->barrier(dc), ZR_ECOMM, "aborted");
    ZT_ERR(ops->comm_wait(dc, NULL, NULL), ZR_ECOMM, "aborted");
    ops->comm_free(dc);

    /* with this process's communicator (a world of one here): its rank and world only */
    zr_comm *c;
    ZT_OK(zr_comm_open_env(&c));
    ZT_CHECK(zr_comm_env() == c);
    ZT_ERR(ops->comm_new(&dc, id, sizeof id, 1, 2), ZR_EINVAL,
           "comm_new(rank 1, world 2) but this process's shm communicator is rank 0 of 1");
    ZT_OK(ops->comm_new(&dc, id, sizeof id, 0, 1));
    hs_world1_ops(ops, dc);
    /* a negative check is returned as it is */
    hs_check_value = ZR_ECOMM;
    zr_err_clear();
    ZT_CHECK_EQ(ops->comm_wait(dc, hs_check, NULL), ZR_ECOMM);
    ops->comm_free(dc);
    zr_comm_close(c);
    ZT_CHECK(zr_comm_env() == NULL);
}

/* two forked ranks on a real shm segment: the hostsim collectives are zr_comm's */
static void hs_rank2(const zr_device_ops *ops, const char *seg, const unsigned char *id, int r)
{
    zr_comm *c = zt_open_rank(seg, r, 2);
    zr_dev_comm *dc;
    ZT_ERR(ops->comm_new(&dc, id, ZR_NCCL_ID_BYTES, 1 - r, 2), ZR_EINVAL, "shm communicator is");
    ZT_OK(ops->comm_new(&dc, id, ZR_NCCL_ID_BYTES, r, 2));
    ZT_CHECK_EQ(ops->comm_rank(dc), r);
    ZT_CHECK_EQ(ops->comm_world(dc), 2);
    const size_t n = 1009;
    float *x[2], *sum = hs_xmalloc(2 * n * 4), *got = hs_xmalloc(2 * n * 4);
    for (int q = 0; q < 2; q++) {
        x[q] = hs_xmalloc(2 * n * 4);
        hs_fill(x[q], 2 * n, 100 + (uint64_t)q, 10.0f);
    }
    for (size_t i = 0; i < 2 * n; i++)
        sum[i] = x[0][i] + x[1][i];
    float *dx, *dy;
    ZT_OK(ops->malloc((void **)&dx, 2 * n * 4));
    ZT_OK(ops->malloc((void **)&dy, 2 * n * 4));
    ZT_OK(ops->memcpy(dx, x[r], 2 * n * 4, ZR_DEV_H2D, NULL));
    ZT_OK(ops->all_reduce(dc, dx, dy, 2 * n, ZR_DEV_F32));
    ZT_OK(ops->comm_wait(dc, NULL, NULL));
    ZT_OK(ops->memcpy(got, dy, 2 * n * 4, ZR_DEV_D2H, NULL));
    ZT_CHECK(!memcmp(got, sum, 2 * n * 4));
    ZT_OK(ops->reduce_scatter(dc, dx, dy, n, ZR_DEV_F32));
    ZT_OK(ops->memcpy(got, dy, n * 4, ZR_DEV_D2H, NULL));
    ZT_CHECK(!memcmp(got, sum + (size_t)r * n, n * 4));
    /* gather is an all-gather: every rank receives every piece */
    ZT_OK(ops->gather(dc, dx, dy, 12, 0));
    ZT_OK(ops->memcpy(got, dy, 24, ZR_DEV_D2H, NULL));
    ZT_CHECK(!memcmp(got, x[0], 12) && !memcmp((char *)got + 12, x[1], 12));
    ZT_OK(ops->memcpy(dx, x[r], 8, ZR_DEV_H2D, NULL));
    ZT_OK(ops->broadcast(dc, dx, 8, 1));
    ZT_OK(ops->memcpy(got, dx, 8, ZR_DEV_D2H, NULL));
    ZT_CHECK(!memcmp(got, x[1], 8));
    ZT_OK(ops->barrier(dc));
    ops->free(dx);
    ops->free(dy);
    ops->comm_free(dc);
    zr_comm_close(c);
    free(x[0]), free(x[1]), free(sum), free(got);
}

ZT_TEST(device_hostsim_comm_world_of_two)
{
    const zr_device_ops *ops = hs_open();
    char *seg = NULL;
    ZT_OK(zr_comm_shm_create(&seg, 2, 0));
    unsigned char id[ZR_NCCL_ID_BYTES];
    ZT_OK(ops->comm_unique_id(id, sizeof id));
    pid_t pid[2];
    fflush(NULL);
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        ZT_CHECK(pid[r] >= 0);
        if (pid[r] == 0) {
            hs_rank2(ops, seg, id, r);
            fflush(NULL);
            _exit(0);
        }
    }
    int bad = 0;
    for (int r = 0; r < 2; r++) {
        int st = 0;
        while (waitpid(pid[r], &st, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad = 1;
    }
    zr_comm_shm_unlink(seg);
    free(seg);
    ZT_CHECK(!bad);
}

/* The device ABI's family-neutral offsets (zr_model_offsets): the family, the group count and
 * size, and each group's start are the CPU model's, for GPT-2 and for a Llama (untied: its
 * lm_head; tied: the head is the embedding); hostsim runs a Llama behind the table with the CPU
 * model's bits, and refuses offsets of another model. */
ZT_TEST(device_model_offsets_carry_the_family)
{
    const zr_device_ops *ops = hs_open();
    static const char *const specs[3] = {
        "gpt2:layers=2,heads=2,dim=32,ctx=16,vocab=64",
        "llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=48,ctx=16,vocab=64",
        "llama:layers=3,heads=4,kv_heads=1,dim=32,ffn=40,ctx=16,vocab=64,tied=1",
    };
    zr_model_offsets gpt2_off;
    for (int i = 0; i < 3; i++) {
        zr_config c;
        ZT_OK(zr_gpt2_config_parse(&c, specs[i]));
        zr_model *cm;
        ZT_OK(zr_model_new_ext(&cm, &c, 2, 16, NULL));
        zr_model_init_weights(cm, 5);
        zr_model_offsets o;
        ZT_OK(zr_model_offsets_get(&o, &c));
        ZT_CHECK_EQ(o.family, c.family);
        ZT_CHECK_EQ(o.n_groups, zr_model_n_groups(cm));
        ZT_CHECK_EQ(o.numel, zr_model_numel(cm));
        const float *p0 = zr_model_param(cm, 0);
        size_t G = zr_model_n_groups(cm);
        for (size_t g = 0; g < G; g++) {
            uint64_t at = (uint64_t)(zr_model_param(cm, g) - p0), want;
            if (c.family == ZR_FAMILY_GPT2)
                want = g == 0       ? o.gpt2.wte
                       : g == 1     ? o.gpt2.wpe
                       : g == G - 1 ? o.gpt2.ln_f
                                    : o.gpt2.h0 + (g - 2) * o.gpt2.layer_numel;
            else
                want = g == 0                ? o.llama.embed
                       : g <= c.layers       ? o.llama.layer0 + (g - 1) * o.llama.layer_numel
                       : g == c.layers + 1u ? o.llama.norm
                                            : o.llama.head;
            if (at != want)
                ZT_FAIL("%s: group %zu at %llu, the offsets say %llu", specs[i], g,
                        (unsigned long long)at, (unsigned long long)want);
        }
        if (c.family == ZR_FAMILY_GPT2) {
            gpt2_off = o;
        } else {
            uint64_t head = c.tied ? o.llama.embed : o.numel - (uint64_t)c.vocab * c.dim;
            ZT_CHECK_EQ(o.llama.head, head);
            /* another model's offsets are refused; the right ones give the CPU's loss bits */
            zr_dev_model *dm = NULL;
            ZT_ERR(ops->model_new(&dm, &c, &gpt2_off, 2, 16, NULL, ZR_RECOMPUTE_NONE), ZR_EINVAL,
                   "tensor offsets that are not the layout's");
            ZT_CHECK(dm == NULL);
            ZT_OK(zr_device_model_new(ops, &dm, &c, 2, 16, NULL, ZR_RECOMPUTE_NONE));
            for (size_t g = 0; g < G; g++)
                ZT_OK(ops->memcpy(ops->model_param(dm, g), zr_model_param(cm, g),
                                  zr_model_group_numel(cm, g) * sizeof(float), ZR_DEV_H2D, NULL));
            int32_t in[32], tg[32];
            uint64_t seed = 3;
            for (size_t k = 0; k < 32; k++) {
                in[k] = (int32_t)(hs_rng(&seed) % c.vocab);
                tg[k] = (int32_t)(hs_rng(&seed) % c.vocab);
            }
            float lc = -1.0f, ld = -2.0f;
            ZT_OK(zr_model_forward(cm, in, tg, 2, 16, &lc));
            ZT_OK(ops->model_forward(dm, in, tg, 2, 16, &ld));
            ZT_CHECK(lc > 0.0f && !memcmp(&lc, &ld, sizeof lc));
            ops->model_free(dm);
        }
        zr_model_free(cm);
    }
}
