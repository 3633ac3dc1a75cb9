/*
 * ckutil.c: shared helpers of the ckpt tests (see ckutil.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include "ckutil.h"
#include "comm.h"
#include "zck_int.h"

#include <fcntl.h>
#include <stdarg.h>
#include <math.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/wait.h>

zck_layout *zt_layout(size_t n_groups, const uint64_t *numel)
{
    zck_layout *L;
    ZT_OK(zck_layout_new(&L));
    ZT_OK(zck_layout_add_state(L, "param", ZCK_F32));
    ZT_OK(zck_layout_add_state(L, "exp_avg", ZCK_F32));
    ZT_OK(zck_layout_add_state(L, "exp_avg_sq", ZCK_BF16));
    for (size_t g = 0; g < n_groups; g++) {
        char name[64];
        size_t gi;
        snprintf(name, sizeof name, "h%zu", g);
        ZT_OK(zck_layout_add_group(L, &gi, name));
        /* two tensors when the group is big enough: a matrix and a bias */
        char tn[80];
        if (numel[g] >= 8) {
            uint64_t bias = numel[g] % 7 + 1, rest = numel[g] - bias;
            uint64_t shape[2] = {1, rest};
            snprintf(tn, sizeof tn, "h%zu.w", g);
            ZT_OK(zck_layout_add_tensor(L, gi, tn, ZCK_F32, 2, shape));
            snprintf(tn, sizeof tn, "h%zu.b", g);
            ZT_OK(zck_layout_add_tensor(L, gi, tn, ZCK_F32, 1, &bias));
        } else {
            snprintf(tn, sizeof tn, "h%zu.w", g);
            ZT_OK(zck_layout_add_tensor(L, gi, tn, ZCK_F32, 1, &numel[g]));
        }
    }
    return L;
}

uint64_t zt_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

void zt_fill(const zck_layout *L, size_t g, size_t s, uint64_t start, uint64_t count,
             uint64_t seed, void *dst)
{
    size_t dsz = zck_dtype_size(zck_layout_state_dtype(L, s));
    unsigned char *p = dst;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t v = zt_mix(seed * 1000003 + g * 7919 + s * 104729 + (start + i) * 31 + 1);
        memcpy(p + i * dsz, &v, dsz);
    }
}

void zt_seed_fill(void *ctx, const zck_layout *L, size_t g, size_t s, uint64_t start,
                  uint64_t count, void *dst)
{
    zt_fill(L, g, s, start, count, *(const uint64_t *)ctx, dst);
}

static zck_shard *write_rank(const char *staging, const zck_layout *L, uint32_t world,
                             uint32_t rank, const zck_io_opts *io, zt_fill_fn fill, void *ctx)
{
    zck_writer *w;
    ZT_OK(zck_writer_open(&w, staging, L, world, rank, io));
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        for (size_t s = 0; s < zck_layout_n_states(L); s++) {
            uint64_t a, n;
            zck_partition(zck_layout_group_numel(L, g), world, rank,
                          zck_layout_partition_align(L), &a, &n);
            if (!n)
                continue;
            size_t dsz = zck_dtype_size(zck_layout_state_dtype(L, s));
            unsigned char *buf = malloc(n * dsz);
            ZT_CHECK(buf);
            fill(ctx, L, g, s, a, n, buf);
            /* stream it in uneven pieces to exercise buffer boundaries */
            ZT_OK(zck_writer_begin(w, g, s, a, n));
            size_t off = 0, piece = 1 + (size_t)(n * dsz / 3);
            while (off < n * dsz) {
                size_t k = n * dsz - off < piece ? n * dsz - off : piece;
                ZT_OK(zck_writer_write(w, buf + off, k));
                off += k;
            }
            free(buf);
        }
    zck_shard *sh;
    ZT_OK(zck_writer_finish(w, &sh));
    zck_writer_free(w);
    return sh;
}

zck_shard *zt_write_rank(const char *staging, const zck_layout *L, uint32_t world,
                         uint32_t rank, uint64_t seed, const zck_io_opts *io)
{
    return write_rank(staging, L, world, rank, io, zt_seed_fill, &seed);
}

char *zt_save_as(const char *run_dir, const zck_layout *L, const zck_commit_opts *o,
                 zt_fill_fn fill, void *ctx)
{
    char *staging;
    static uint64_t nth;
    /* a fresh nonce per save, as the engine draws one: a save retried after a crash at the
     * same step never meets the staging directory of the crashed attempt */
    uint64_t nonce = ((uint64_t)getpid() << 32) ^ ((uint64_t)time(NULL) << 8) ^ ++nth;
    ZT_OK(zck_staging_create(&staging, run_dir, o->step, nonce));
    zck_shard **sh = calloc(o->world, sizeof *sh);
    ZT_CHECK(sh);
    for (uint32_t r = 0; r < o->world; r++)
        sh[r] = write_rank(staging, L, o->world, r, NULL, fill, ctx);
    char *final;
    ZT_OK(zck_commit(&final, run_dir, staging, L, sh, o->world, o));
    for (uint32_t r = 0; r < o->world; r++)
        zck_shard_free(sh[r]);
    free(sh);
    free(staging);
    return final;
}

char *zt_save(const char *run_dir, const zck_layout *L, uint32_t world, uint64_t step,
              uint64_t seed, unsigned keep_last)
{
    zck_commit_opts o = ZCK_COMMIT_OPTS_INIT;
    o.step = step;
    o.world = world;
    o.zero_stage = 3;
    o.keep_last = keep_last;
    o.model_json = "{\"arch\":\"test\"}";
    char tj[64];
    snprintf(tj, sizeof tj, "{\"seed\":%llu}", (unsigned long long)seed);
    o.training_json = tj;
    return zt_save_as(run_dir, L, &o, zt_seed_fill, &seed);
}

void zt_check_content(const char *path, uint64_t seed)
{
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, path));
    const zck_layout *L = zck_reader_layout(r);
    size_t ng = zck_layout_n_groups(L), ns = zck_layout_n_states(L);
    zck_read_req *q = calloc(ng * ns, sizeof *q);
    ZT_CHECK(q);
    for (size_t g = 0; g < ng; g++)
        for (size_t s = 0; s < ns; s++) {
            uint64_t n = zck_layout_group_numel(L, g);
            size_t dsz = zck_dtype_size(zck_layout_state_dtype(L, s));
            q[g * ns + s] = (zck_read_req){g, s, 0, n, malloc(n * dsz)};
            ZT_CHECK(q[g * ns + s].dst);
        }
    zck_read_opts o = ZCK_READ_OPTS_INIT;
    ZT_OK(zck_reader_read(r, q, ng * ns, &o));
    for (size_t g = 0; g < ng; g++)
        for (size_t s = 0; s < ns; s++) {
            uint64_t n = zck_layout_group_numel(L, g);
            size_t dsz = zck_dtype_size(zck_layout_state_dtype(L, s));
            unsigned char *want = malloc(n * dsz);
            zt_fill(L, g, s, 0, n, seed, want);
            if (memcmp(want, q[g * ns + s].dst, n * dsz))
                ZT_FAIL("%s: group %zu state %zu differs from what was saved", path, g, s);
            free(want);
            free(q[g * ns + s].dst);
        }
    free(q);
    zck_reader_free(r);
}

size_t zt_verify_count(const char *path, int quick)
{
    zck_report *rep;
    zck_verify_opts o = ZCK_VERIFY_OPTS_INIT;
    o.quick = quick;
    ZT_OK(zck_verify(&rep, path, &o));
    size_t n = zt_report_print(rep, path);
    zck_report_free(rep);
    return n;
}

size_t zt_report_print(const zck_report *rep, const char *what)
{
    size_t n = zck_report_count(rep);
    for (size_t i = 0; i < n; i++) {
        const zck_problem *p = zck_report_get(rep, i);
        fprintf(stderr, "  verify %s: %s: %s: %s\n", what, p->file,
                zck_problem_kind_name(p->kind), p->detail);
    }
    return n;
}

void zt_expect_one_problem(zck_report *rep, const char *what, zck_problem_kind kind,
                           const char *file, const char *detail)
{
    if (zck_report_count(rep) != 1) {
        zt_report_print(rep, what);
        ZT_FAIL("%s: %zu problems found, expected 1 (%s in %s)", what, zck_report_count(rep),
                zck_problem_kind_name(kind), file);
    }
    const zck_problem *p = zck_report_get(rep, 0);
    if (p->kind != kind || strcmp(p->file, file) || (detail && !strstr(p->detail, detail)))
        ZT_FAIL("%s: found %s in %s (%s), expected %s in %s (%s)", what,
                zck_problem_kind_name(p->kind), p->file, p->detail, zck_problem_kind_name(kind),
                file, detail ? detail : "");
    zck_report_free(rep);
}

int zt_read_all(const char *ckpt, int verify)
{
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, ckpt));
    const zck_layout *L = zck_reader_layout(r);
    size_t ng = zck_layout_n_groups(L);
    zck_read_req *q = calloc(ng, sizeof *q);
    ZT_CHECK(q);
    for (size_t g = 0; g < ng; g++) {
        uint64_t n = zck_layout_group_numel(L, g);
        q[g] = (zck_read_req){g, 0, 0, n, malloc(n * 4)};
        ZT_CHECK(q[g].dst);
    }
    zck_read_opts o = ZCK_READ_OPTS_INIT;
    o.verify = verify;
    int rc = zck_reader_read(r, q, ng, &o);
    for (size_t g = 0; g < ng; g++)
        free(q[g].dst);
    free(q);
    zck_reader_free(r);
    return rc;
}

void zt_flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    ZT_CHECK(fd >= 0);
    unsigned char b;
    ZT_CHECK(pread(fd, &b, 1, (off_t)off) == 1);
    b ^= 0x01;
    ZT_CHECK(pwrite(fd, &b, 1, (off_t)off) == 1);
    close(fd);
}

void zt_truncate(const char *path, uint64_t size) { ZT_CHECK(truncate(path, (off_t)size) == 0); }

void zt_write_file(const char *path, const char *text)
{
    zt_write_bytes(path, text, strlen(text));
}

void zt_write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    ZT_CHECK(f);
    ZT_CHECK(fwrite(p, 1, n, f) == n);
    ZT_CHECK(fclose(f) == 0);
}

int zck__read_small_for_tests(char **out, const char *path)
{
    return zck__read_small(out, NULL, path, (size_t)1 << 26);
}

int zck__mkdir_for_tests(const char *path) { return zck__mkdir(path); }

pid_t zt_spawn_zrun(const char *env, const char *args, const char *log)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s exec %s %s > %s 2>&1", env, zt_zrun_path(), args, log);
    return zt_spawn_sh(cmd);
}

pid_t zt_spawn_sh(const char *cmd)
{
    fflush(NULL);
    pid_t p = fork();
    ZT_CHECK(p >= 0);
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return p;
}

int zt_wait_status(pid_t p)
{
    int st;
    while (waitpid(p, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int zt_children(pid_t p, pid_t *out, int cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)p, (int)p);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int n = 0, v;
    while (n < cap && fscanf(f, "%d", &v) == 1)
        out[n++] = v;
    fclose(f);
    return n;
}

int zt_rank_of(pid_t p)
{
    char env[65536], path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)p);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, env, sizeof env - 1);
    close(fd);
    if (n <= 0)
        return -1;
    env[n] = 0;
    for (ssize_t i = 0; i < n; i += (ssize_t)strlen(env + i) + 1)
        if (!strncmp(env + i, "ZR_RANK=", 8))
            return atoi(env + i + 8);
    return -1;
}

int zt_free_port(void)
{
    /* SO_REUSEADDR and no listen(): the kernel counts the port as taken for any bind without
     * SO_REUSEADDR, for another bind to port 0 and for an outgoing connection's local port,
     * but rank 0's hub (which binds with SO_REUSEADDR) may bind and listen on it. The socket
     * stays open until the test's process ends (CLOEXEC: a zrun it starts does not hold it). */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ZT_CHECK(fd >= 0);
    int one = 1;
    ZT_CHECK(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ZT_CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    ZT_CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    return ntohs(a.sin_port);
}

void zt_set_rank_env(const char *name, int r, int W)
{
    char b[32];
    snprintf(b, sizeof b, "%d", r);
    setenv("ZR_RANK", b, 1);
    snprintf(b, sizeof b, "%d", W);
    setenv("ZR_WORLD", b, 1);
    if (name)
        setenv("ZR_COMM_SHM", name, 1);
    else
        unsetenv("ZR_COMM_SHM");
}

zr_comm *zt_open_rank(const char *name, int r, int W)
{
    zt_set_rank_env(name, r, W);
    zr_comm *c;
    ZT_OK(zr_comm_open_env(&c));
    return c;
}

const char *zt_bin(const char *var)
{
    const char *bin = getenv(var);
    if (!bin)
        ZT_SKIP("%s is not set (run through make test)", var);
    return bin;
}

const char *zt_zrun_path(void)
{
    return zt_bin("ZT_ZRUN");
}

char *zt_slurp(const char *path)
{
    char *t = NULL;
    if (zck__read_small_for_tests(&t, path) != 0)
        ZT_FAIL("cannot read %s", path);
    return t;
}

double zt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

bool zt_same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    char x[1 << 16], y[1 << 16];
    while (same) {
        size_t nx = fread(x, 1, sizeof x, fa), ny = fread(y, 1, sizeof y, fb);
        same = nx == ny && !memcmp(x, y, nx) && !ferror(fa) && !ferror(fb);
        if (nx < sizeof x)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

static void file_check(const char *path, const char *text, bool want)
{
    char *t = zt_slurp(path);
    if (!strstr(t, text) == want)
        ZT_FAIL("%s %s '%s':\n%s", path, want ? "lacks" : "has", text, t);
    free(t);
}

void zt_file_has(const char *path, const char *text) { file_check(path, text, true); }
void zt_file_lacks(const char *path, const char *text) { file_check(path, text, false); }

void zt_wait_file_has(const char *path, const char *text, double secs)
{
    struct timespec t0, now, nap = {0, 50 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        char *t = NULL;
        int there = access(path, F_OK) == 0 && strstr(t = zt_slurp(path), text);
        free(t);
        if (there)
            return;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) * 1e-9 > secs)
            ZT_FAIL("%s: no '%s' within %g s:\n%s", path, text, secs,
                    access(path, F_OK) == 0 ? zt_slurp(path) : "(no such file)");
        nanosleep(&nap, NULL);
    }
}

static char zrun_args[4096]; /* the last zt_zrun's, for zt_zrun_expect's message */

int zt_zrun(const char *args, const char *log)
{
    snprintf(zrun_args, sizeof zrun_args, "%s", args);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s > %s 2>&1", zt_zrun_path(), args, log);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int zt_zrunf(const char *log, const char *fmt, ...)
{
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return zt_zrun(args, log);
}


int zt_run(char **out, const char *bin, const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin, args);
    FILE *p = popen(cmd, "r");
    ZT_CHECK(p);
    size_t cap = 1 << 16, n = 0, k;
    char *buf = malloc(cap);
    ZT_CHECK(buf);
    while ((k = fread(buf + n, 1, cap - n - 1, p)) > 0)
        if ((n += k) + 1 == cap) {
            buf = realloc(buf, cap *= 2);
            ZT_CHECK(buf);
        }
    buf[n] = 0;
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

int zt_zckpt(char **out, const char *fmt, ...)
{
    const char *bin = zt_bin("ZT_ZCKPT");
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return zt_run(out, bin, args);
}

void zt_zrun_ok(const char *args, const char *log)
{
    zt_zrun_expect(zt_zrun(args, log), log);
}

void zt_zrun_expect(int status, const char *log)
{
    if (status != 0)
        ZT_FAIL("zrun %s: exit status %d\n%s", zrun_args, status, zt_slurp(log));
}

void zt_same_latest(const char *a, const char *b, double atol, double rtol)
{
    char *pa, *pb;
    ZT_OK(zck_latest(&pa, a));
    ZT_OK(zck_latest(&pb, b));
    zck_diff_opts o = ZCK_DIFF_OPTS_INIT;
    o.atol = atol;
    o.rtol = rtol;
    zck_diff *d;
    ZT_OK(zck_diff_run(&d, pa, pb, &o));
    if (!d->all_match)
        ZT_FAIL("%s and %s differ (atol %g, rtol %g)", pa, pb, atol, rtol);
    zck_diff_free(d);
    free(pa);
    free(pb);
}

zr_train_opts zt_small_opts(const char *dir, uint64_t steps)
{
    zr_train_opts o = ZR_TRAIN_OPTS_INIT;
    o.model = ZT_SMALL;
    o.batch = 4;
    o.micro_batch = 2;
    o.steps = steps;
    o.warmup = 5;
    o.lr = 3e-3f;
    o.ckpt_dir = dir;
    o.threads = 1;
    return o;
}

const char *zt_venv_python(const char *modules)
{
    static char py[4096];
    char cmd[8192], imports[1024] = "", mods[512], *save = NULL;
    snprintf(mods, sizeof mods, "%s", modules);
    for (char *m = strtok_r(mods, " ", &save); m; m = strtok_r(NULL, " ", &save))
        snprintf(imports + strlen(imports), sizeof imports - strlen(imports), "import %s; ", m);
    const char *venv = getenv("ZT_VENV");
    if (venv && *venv)
        snprintf(py, sizeof py, "%s/bin/python", venv);
    else
        snprintf(py, sizeof py, "%s/build/venv/bin/python", zt_root());
    snprintf(cmd, sizeof cmd, "'%s' -c '%s' >/dev/null 2>&1", py, imports);
    return access(py, X_OK) == 0 && system(cmd) == 0 ? py : NULL;
}

size_t zt_jlog_losses(double *loss, size_t cap, const char *path)
{
    char *text = zt_slurp(path);
    size_t last = 0;
    memset(loss, 0, cap * sizeof *loss);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        const char *st = strstr(line, "{\"step\":"), *ls = strstr(line, ",\"loss\":");
        if (!st || !ls)
            ZT_FAIL("%s: a record without step or loss: %s", path, line);
        unsigned long k = strtoul(st + 8, NULL, 10);
        ZT_CHECK(k >= 1 && k < cap);
        loss[k] = strtod(ls + 8, NULL);
        last = k > last ? k : last;
    }
    free(text);
    return last;
}

double zt_ref_xent(const double *lg, const int32_t *tg, size_t N, size_t V, double *probs)
{
    double loss = 0;
    for (size_t n = 0; n < N; n++) {
        const double *row = lg + n * V;
        double mx = -INFINITY, sum = 0;
        for (size_t v = 0; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (size_t v = 0; v < V; v++)
            sum += exp(row[v] - mx);
        loss += log(sum) - (row[tg[n]] - mx);
        for (size_t v = 0; probs && v < V; v++)
            probs[n * V + v] = exp(row[v] - mx) / sum;
    }
    return loss / (double)N;
}

void zt_ref_attention(double *y, const double *q, const double *k, const double *v,
                      const zt_attn_shape *s)
{
    size_t T = s->T, hd = s->hd, C = s->H * s->hd, grp = s->H / s->KV;
    double w[256];
    ZT_CHECK(T <= 256);
    for (size_t b = 0; b < s->B; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t h = 0; h < s->H; h++) {
                const double *qt = q + (b * T + t) * s->q_stride + h * hd;
                size_t kh = h / grp * hd;
                double mx = -INFINITY, sum = 0;
                for (size_t u = 0; u <= t; u++) {
                    const double *ku = k + (b * T + u) * s->kv_stride + kh;
                    double d = 0;
                    for (size_t i = 0; i < hd; i++)
                        d += qt[i] * ku[i];
                    w[u] = d / sqrt((double)hd);
                    mx = w[u] > mx ? w[u] : mx;
                }
                for (size_t u = 0; u <= t; u++)
                    sum += (w[u] = exp(w[u] - mx));
                for (size_t i = 0; i < hd; i++) {
                    double acc = 0;
                    for (size_t u = 0; u <= t; u++)
                        acc += w[u] / sum * v[(b * T + u) * s->kv_stride + kh + i];
                    y[(b * T + t) * C + h * hd + i] = acc;
                }
            }
}

void zt_config_refusals(int (*parse)(zr_config *, const char *), const zt_refusal *cases,
                        size_t n)
{
    for (size_t i = 0; i < n; i++) {
        zr_config c = ZR_GPT2(99, 99, 99, 99, 99);
        zr_err_clear();
        int rc = parse(&c, cases[i].in);
        if (rc != ZR_EINVAL || !strstr(zr_err_msg(), cases[i].text))
            ZT_FAIL("'%s' gave %s '%s', expected ZR_EINVAL naming '%s'", cases[i].in,
                    zr_err_name(rc), zr_err_msg(), cases[i].text);
        if (c.layers != 99)
            ZT_FAIL("'%s': the config was changed on failure (layers %u)", cases[i].in,
                    c.layers);
    }
}

char *zt_py_script(const char *modules, const char *script, const char *args)
{
    const char *py = zt_venv_python(modules);
    if (!py)
        ZT_SKIP("no oracle venv with %s (make oracle-venv; PyPI unreachable?)", modules);
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 '%s' "
             "'%s/tests/formats/%s' %s > py.txt 2>&1", py, zt_root(), script, args);
    int rc = system(cmd);
    char *txt = zt_slurp("py.txt");
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77)
        ZT_SKIP("%.*s (make oracle-venv installs it)", (int)strcspn(txt, "\n"), txt);
    if (rc != 0)
        ZT_FAIL("%s %.60s...: %s", script, args, txt);
    return txt;
}

void zt_grads_at_threads(zr_model *m, const int32_t *in, const int32_t *tg, size_t B, size_t T,
                         size_t V, double ref, const double *probs, const char *what,
                         float *gt[3])
{
    size_t n = zr_model_numel(m);
    for (int t = 0; t < 3; t++) {
        float loss;
        zr_set_threads(t + 1);
        zr_model_zero_grad(m);
        ZT_OK(zr_model_forward(m, in, tg, B, T, &loss));
        ZT_OK(zr_model_backward(m, 1.0f));
        if (!(fabs(loss - ref) <= 1e-5 * fabs(ref)))
            ZT_FAIL("%s, %d threads: loss %.9g, double reference %.12g", what, t + 1, loss, ref);
        const float *pr = zr_model_probs(m);
        for (size_t i = 0; i < B * T * V; i++)
            if (!(fabs(pr[i] - probs[i]) <= 1e-6))
                ZT_FAIL("%s, %d threads: probs[%zu] = %.9g, double reference %.12g", what,
                        t + 1, i, pr[i], probs[i]);
        ZT_CHECK((gt[t] = malloc(n * sizeof(float))));
        memcpy(gt[t], zr_model_grad(m, 0), n * sizeof(float));
    }
    zr_set_threads(1);
}
