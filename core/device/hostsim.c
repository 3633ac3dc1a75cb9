/*
 * hostsim.c: the host simulation of a device (device.h; selected with ZR_CUDA_LIB=hostsim). It is
 * test scaffolding, not part of libzr: the Makefile builds it into its own loadable backend,
 * libzr_hostsim.so, which exports the device ABI's getter (ZR_DEVICE_SYMBOL) as the CUDA backend
 * does and takes the engine's functions (zr_model_*, zr_comm_*, zr_err_*) from the program that
 * loads it: zrun and the test runner are linked with -rdynamic for that. The whole table of zr_device_ops on ordinary memory, run on the CPU with
 * the CPU engine's own code: zr_model for the model, zr_adamw_update and zr_sumsq for the
 * optimizer, the shm communicator of this process (zr_comm_env) for the collectives. Every call
 * is synchronous, so streams and events are tokens: waits return at once and an event is always
 * done. Results have the CPU engine's bits (not a GPU's: this is no emulator).
 *
 * What it checks that a sloppy engine would get wrong on a GPU: "device" memory from
 * ops->malloc is filled with 0xA5 bytes (a GPU's cudaMalloc does not zero either), ops->free of
 * a pointer ops->malloc did not return aborts the process, naming it, and comm_new's rank and
 * world must be this process's communicator's. Errors go to zr_err_set directly (the loading
 * program's); last_error is zr_err_msg.
 */
#include "comm.h"
#include "device.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HS_ALIGN 256          /* ops->malloc's alignment (cudaMalloc gives at least 256) */
#define HS_HOST_ALIGN 4096    /* host_alloc's (page) */
#define HS_FILL 0xA5          /* what fresh "device" memory holds */
#define HS_ID_MAGIC "hostsim" /* the start of a unique id */

/* ---------------------------------------------------------------- errors */

static void set_error_handler(int (*handler)(int code, const char *msg))
{
    (void)handler; /* inside libzr: errors are set with zr_err_set directly */
}

static const char *last_error(void) { return zr_err_msg(); }

/* ---------------------------------------------------------------- device */

static int probe(int *count)
{
    *count = 1;
    return 0;
}

static int init(int local_rank, int *device)
{
    if (local_rank < 0)
        return zr_err_set(ZR_EINVAL, "hostsim: local rank %d (expected >= 0)", local_rank);
    if (device)
        *device = 0;
    return 0;
}

static int info(char *name, size_t cap, uint64_t *free_bytes, uint64_t *total_bytes)
{
    if (name && cap)
        snprintf(name, cap, "hostsim (CPU)");
    long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES);
    long phys = sysconf(_SC_PHYS_PAGES);
    if (free_bytes)
        *free_bytes = page > 0 && avail > 0 ? (uint64_t)avail * (uint64_t)page : 0;
    if (total_bytes)
        *total_bytes = page > 0 && phys > 0 ? (uint64_t)phys * (uint64_t)page : 0;
    return 0;
}

static int synchronize(void) { return 0; }

/* ---------------------------------------------------------------- memory accounting */

/* The sizes of live ops->malloc blocks: a chained hash table on the pointer. */
#define HS_BUCKETS 4096
typedef struct hs_block {
    void *p;
    size_t bytes;
    struct hs_block *next;
} hs_block;

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static hs_block *buckets[HS_BUCKETS];
static uint64_t mem_cur, mem_peak;

static size_t bucket_of(const void *p)
{
    uint64_t h = (uint64_t)(uintptr_t)p / HS_ALIGN;
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 52) % HS_BUCKETS;
}

/* caller holds mem_mu */
static void count_add(uint64_t bytes)
{
    mem_cur += bytes;
    if (mem_cur > mem_peak)
        mem_peak = mem_cur;
}

static void count_sub(uint64_t bytes) { mem_cur = mem_cur >= bytes ? mem_cur - bytes : 0; }

static void mem_stats(uint64_t *current, uint64_t *peak)
{
    pthread_mutex_lock(&mem_mu);
    if (current)
        *current = mem_cur;
    if (peak)
        *peak = mem_peak;
    pthread_mutex_unlock(&mem_mu);
}

static void mem_reset_peak(void)
{
    pthread_mutex_lock(&mem_mu);
    mem_peak = mem_cur;
    pthread_mutex_unlock(&mem_mu);
}

/* ---------------------------------------------------------------- memory */

static int dev_malloc(void **out, size_t bytes)
{
    *out = NULL;
    if (bytes == 0)
        return 0;
    hs_block *b = malloc(sizeof *b);
    void *p = NULL;
    if (!b || posix_memalign(&p, HS_ALIGN, bytes)) {
        free(b);
        return zr_err_set(ZR_ENOMEM, "hostsim: malloc of %zu bytes: out of memory", bytes);
    }
    memset(p, HS_FILL, bytes); /* not zeroed, as on a GPU: code that assumes zeros shows */
    b->p = p;
    b->bytes = bytes;
    pthread_mutex_lock(&mem_mu);
    size_t k = bucket_of(p);
    b->next = buckets[k];
    buckets[k] = b;
    count_add(bytes);
    pthread_mutex_unlock(&mem_mu);
    *out = p;
    return 0;
}

static void dev_free(void *p)
{
    if (!p)
        return;
    hs_block *found = NULL;
    pthread_mutex_lock(&mem_mu);
    for (hs_block **pp = &buckets[bucket_of(p)]; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p) {
            found = *pp;
            *pp = found->next;
            count_sub(found->bytes);
            break;
        }
    pthread_mutex_unlock(&mem_mu);
    if (!found) { /* a host pointer, a double free: a bug in the caller that a GPU would
                   * also refuse; the simulation exists to show such bugs, so it stops here */
        fprintf(stderr, "hostsim: ops->free(%p): not a pointer ops->malloc returned\n", p);
        abort();
    }
    free(p);
    free(found);
}

static int host_alloc(void **out, size_t bytes)
{
    *out = NULL;
    if (bytes == 0)
        return 0;
    void *p = NULL;
    if (posix_memalign(&p, HS_HOST_ALIGN, bytes))
        return zr_err_set(ZR_ENOMEM, "hostsim: host_alloc of %zu bytes: out of memory", bytes);
    *out = p;
    return 0;
}

static void host_free(void *p) { free(p); }

static int host_register(void *p, size_t bytes)
{
    (void)p;
    (void)bytes;
    return 0;
}

static int host_unregister(void *p)
{
    (void)p;
    return 0;
}

static int dev_memset(void *dst, int byte, size_t bytes, zr_dev_stream *s)
{
    (void)s;
    if (bytes)
        memset(dst, byte, bytes);
    return 0;
}

static int dev_memcpy(void *dst, const void *src, size_t bytes, int kind, zr_dev_stream *s)
{
    (void)s;
    if (kind != ZR_DEV_H2D && kind != ZR_DEV_D2H && kind != ZR_DEV_D2D)
        return zr_err_set(ZR_EINVAL, "hostsim: memcpy kind %d (expected H2D, D2H or D2D)",
                          kind);
    if (bytes && dst != src)
        memcpy(dst, src, bytes);
    return 0;
}

/* ---------------------------------------------------------------- streams and events */

struct zr_dev_stream {
    int unused;
};

struct zr_dev_event {
    int recorded;
};

static int stream_new(zr_dev_stream **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : zr_err_set(ZR_ENOMEM, "hostsim: stream_new: out of memory");
}

static void stream_free(zr_dev_stream *s) { free(s); }

static int stream_sync(zr_dev_stream *s)
{
    (void)s;
    return 0;
}

static int event_new(zr_dev_event **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : zr_err_set(ZR_ENOMEM, "hostsim: event_new: out of memory");
}

static void event_free(zr_dev_event *e) { free(e); }

static int event_record(zr_dev_event *e, zr_dev_stream *s)
{
    (void)s;
    e->recorded = 1;
    return 0;
}

static int event_sync(zr_dev_event *e)
{
    (void)e;
    return 0;
}

static int event_query(zr_dev_event *e)
{
    (void)e;
    return 1;
}

static int stream_wait(zr_dev_stream *s, zr_dev_event *e)
{
    (void)s;
    (void)e;
    return 0;
}

/* ---------------------------------------------------------------- the model */

struct zr_dev_model {
    zr_model *m;
    zr_dev_stream stream; /* model_stream: a token */
    uint64_t counted;     /* bytes added to mem_stats for the model's arenas */
    int fwd_targets;      /* the last forward: -1 none (or it failed), 0 without targets, 1 */
    size_t B, T;
    float loss;
};

static uint64_t activation_bytes(const zr_config *c, const zr_model_offsets *off, size_t max_B,
                                 size_t max_T, zr_recompute rc)
{
    (void)off; /* the CPU model's activations do not depend on where the parameters lie */
    return zr_model_activation_bytes(c, max_B, max_T, rc);
}

/* The CPU model (either family: zr_model dispatches on c->family) finds its offsets in the same
 * table; a backend handed others is refused, as a CUDA model computing with them would be
 * wrong. */
static int model_new(zr_dev_model **out, const zr_config *c, const zr_model_offsets *off,
                     size_t max_B, size_t max_T, const zr_model_hooks *hooks,
                     zr_recompute recompute)
{
    *out = NULL;
    zr_dev_model *d = calloc(1, sizeof *d);
    if (!d)
        return zr_err_set(ZR_ENOMEM, "hostsim: model: out of memory");
    zr_model_offsets own;
    int rc = zr_model_new_recompute(&d->m, c, max_B, max_T, hooks, recompute);
    if (!rc)
        rc = zr_model_offsets_get(&own, c);
    if (!rc && memcmp(&own, off, sizeof own))
        rc = zr_err_set(ZR_EINVAL, "hostsim: model: tensor offsets that are not the layout's "
                        "(%llu elements, the layout has %llu)",
                        (unsigned long long)off->numel, (unsigned long long)own.numel);
    if (rc) {
        zr_model_free(d->m);
        free(d);
        return rc;
    }
    d->fwd_targets = -1;
    /* the model's arenas count as device memory, as the CUDA backend's do */
    uint64_t p = 0, g = 0, a = 0;
    zr_model_bytes(d->m, &p, &g, &a);
    d->counted = p + g + a;
    pthread_mutex_lock(&mem_mu);
    count_add(d->counted);
    pthread_mutex_unlock(&mem_mu);
    *out = d;
    return 0;
}

static void model_free(zr_dev_model *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&mem_mu);
    count_sub(d->counted);
    pthread_mutex_unlock(&mem_mu);
    zr_model_free(d->m);
    free(d);
}

static zr_dev_stream *model_stream(zr_dev_model *d) { return &d->stream; }
static size_t model_n_groups(const zr_dev_model *d) { return zr_model_n_groups(d->m); }

static uint64_t model_group_numel(const zr_dev_model *d, size_t g)
{
    return g < zr_model_n_groups(d->m) ? zr_model_group_numel(d->m, g) : 0;
}

static uint64_t model_numel(const zr_dev_model *d) { return zr_model_numel(d->m); }

static size_t model_fetch_order(const zr_dev_model *d, int backward, size_t *order)
{
    return zr_model_fetch_order(d->m, backward, order);
}

static float *model_param(zr_dev_model *d, size_t g)
{
    return g < zr_model_n_groups(d->m) ? zr_model_param(d->m, g) : NULL;
}

static float *model_grad(zr_dev_model *d, size_t g)
{
    return g < zr_model_n_groups(d->m) ? zr_model_grad(d->m, g) : NULL;
}

static int model_zero_grad(zr_dev_model *d)
{
    zr_model_zero_grad(d->m);
    return 0;
}

static int model_forward(zr_dev_model *d, const int32_t *inputs, const int32_t *targets,
                         size_t B, size_t T, float *loss)
{
    if (loss)
        *loss = 0.0f;
    d->fwd_targets = -1;
    float l = 0.0f;
    ZR_TRY(zr_model_forward(d->m, inputs, targets, B, T, &l));
    d->fwd_targets = targets != NULL;
    d->B = B;
    d->T = T;
    d->loss = l;
    if (loss)
        *loss = l;
    return 0;
}

static int model_loss(zr_dev_model *d, float *loss)
{
    *loss = 0.0f;
    if (d->fwd_targets < 0)
        return zr_err_set(ZR_EINVAL, "loss: no forward");
    *loss = d->loss; /* 0 after a forward without targets, as zr_model_forward gives */
    return 0;
}

static int model_backward(zr_dev_model *d, float scale)
{
    return zr_model_backward(d->m, scale);
}

static int model_probs(zr_dev_model *d, float *host_dst)
{
    if (d->fwd_targets < 0)
        return zr_err_set(ZR_EINVAL, "probs: no forward");
    const float *p = zr_model_probs(d->m);
    if (!p) /* the CPU model with layer recompute keeps one chunk of rows at a time */
        return zr_err_set(ZR_EUNSUPPORTED, "hostsim: probs: not kept by a model with layer "
                          "recompute");
    memcpy(host_dst, p, d->B * d->T * zr_model_config(d->m)->vocab * sizeof(float));
    return 0;
}

static void model_bytes(const zr_dev_model *d, uint64_t *params, uint64_t *grads,
                        uint64_t *acts)
{
    zr_model_bytes(d->m, params, grads, acts);
}

/* ---------------------------------------------------------------- optimizer */

static int adamw(float *param, const float *grad, float *m, float *v, size_t n, uint64_t t,
                 float lr, float grad_scale, int decay, const zr_adamw_hp *hp, zr_dev_stream *s)
{
    (void)s;
    if (t < 1 || !hp)
        return zr_err_set(ZR_EINVAL, "hostsim: adamw: step %llu (expected >= 1)%s",
                          (unsigned long long)t, hp ? "" : ", no hyperparameters");
    if (n)
        zr_adamw_update(param, grad, m, v, n, t, lr, grad_scale, decay, hp);
    return 0;
}

static int sumsq(const float *x, size_t n, double *out, zr_dev_stream *s)
{
    (void)s;
    *out = n ? zr_sumsq(x, n) : 0.0;
    return 0;
}

static int add(float *y, const float *x, size_t n, zr_dev_stream *s)
{
    (void)s;
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
    return 0;
}

/* ---------------------------------------------------------------- communicator */

struct zr_dev_comm {
    zr_comm *c;           /* this process's shm communicator; NULL: a world of one on its own */
    zr_dev_stream stream; /* comm_stream: a token */
    int rank, world, aborted;
    char why[400]; /* the error that aborted it */
};

static int comm_unique_id(void *id, size_t cap)
{
    if (cap < ZR_NCCL_ID_BYTES)
        return zr_err_set(ZR_EINVAL, "hostsim: unique id needs %d bytes, given %zu",
                          ZR_NCCL_ID_BYTES, cap);
    memset(id, 0, ZR_NCCL_ID_BYTES);
    snprintf(id, ZR_NCCL_ID_BYTES, HS_ID_MAGIC " %ld", (long)getpid());
    return 0;
}

static int comm_new(zr_dev_comm **out, const void *id, size_t id_bytes, int rank, int world)
{
    *out = NULL;
    if (id_bytes != ZR_NCCL_ID_BYTES)
        return zr_err_set(ZR_EINVAL, "hostsim: unique id of %zu bytes (expected %d)", id_bytes,
                          ZR_NCCL_ID_BYTES);
    if (!id || memcmp(id, HS_ID_MAGIC " ", sizeof HS_ID_MAGIC))
        return zr_err_set(ZR_EINVAL, "hostsim: comm_new: the unique id is not one of "
                          "hostsim's comm_unique_id (another backend's?)");
    if (world < 1 || rank < 0 || rank >= world)
        return zr_err_set(ZR_EINVAL, "hostsim: comm_new: rank %d of world %d", rank, world);
    zr_comm *env = zr_comm_env();
    if (env && (zr_comm_rank(env) != rank || zr_comm_world(env) != world))
        return zr_err_set(ZR_EINVAL, "hostsim: comm_new(rank %d, world %d) but this "
                          "process's shm communicator is rank %d of %d (the hostsim "
                          "communicator rides on it)", rank, world, zr_comm_rank(env),
                          zr_comm_world(env));
    if (!env && world != 1)
        return zr_err_set(ZR_EINVAL, "hostsim: comm_new(rank %d, world %d) but this process "
                          "has no shm communicator (zr_comm_open_env; ZR_WORLD, ZR_RANK, "
                          "ZR_COMM_SHM from the launcher): only a world of 1 works without it",
                          rank, world);
    zr_dev_comm *c = calloc(1, sizeof *c);
    if (!c)
        return zr_err_set(ZR_ENOMEM, "hostsim: comm_new: out of memory");
    c->c = env;
    c->rank = rank;
    c->world = world;
    *out = c;
    return 0;
}

static void comm_free(zr_dev_comm *c) { free(c); } /* the shm communicator is its opener's */
static int comm_rank(const zr_dev_comm *c) { return c->rank; }
static int comm_world(const zr_dev_comm *c) { return c->world; }
static zr_dev_stream *comm_stream(zr_dev_comm *c) { return &c->stream; }

static int usable(const zr_dev_comm *c)
{
    if (c->aborted)
        return zr_err_set(ZR_ECOMM, "hostsim: the communicator was aborted after an error: %s",
                          c->why);
    if (c->c && zr_comm_env() != c->c)
        return zr_err_set(ZR_ECOMM, "hostsim: the shm communicator under this one was closed");
    return 0;
}

/* A collective's outcome: an error other than an argument error aborts the communicator (as
 * comm.h's own does: after it, the communicator may only be closed). */
static int abort_with(zr_dev_comm *c, int rc)
{
    if (!c->aborted)
        snprintf(c->why, sizeof c->why, "%s", zr_err_msg());
    c->aborted = 1;
    return rc;
}

static int outcome(zr_dev_comm *c, int rc)
{
    return rc < 0 && rc != ZR_EINVAL ? abort_with(c, rc) : rc;
}

static int comm_wait(zr_dev_comm *c, int (*check)(void *ctx), void *ctx)
{
    ZR_TRY(usable(c));
    if (check) { /* the work is done already: one look at the job's state */
        int rc = check(ctx);
        if (rc)
            return abort_with(c, rc < 0 ? rc : zr_err_set(ZR_EIO, "hostsim: the job was "
                                                          "aborted (the check returned %d)",
                                                          rc));
    }
    return 0;
}

static int dtype(zr_dev_dtype dt, zr_comm_dtype *out, size_t *es)
{
    switch (dt) {
    case ZR_DEV_F32:
        *out = ZR_COMM_F32;
        *es = 4;
        return 0;
    case ZR_DEV_F64:
        *out = ZR_COMM_F64;
        *es = 8;
        return 0;
    case ZR_DEV_BF16:
        return zr_err_set(ZR_EINVAL, "hostsim: bf16 collectives are not simulated (the shm "
                          "communicator sums f32 and f64)");
    }
    return zr_err_set(ZR_EINVAL, "hostsim: dtype %d", (int)dt);
}

static void copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src)
        memmove(dst, src, bytes);
}

/* all_reduce (scatter 0) or reduce_scatter (1) of n elements per rank */
static int reduce(zr_dev_comm *c, const void *send, void *recv, size_t n, zr_dev_dtype dt,
                  int scatter)
{
    zr_comm_dtype t = ZR_COMM_F32;
    size_t es = 4;
    ZR_TRY(dtype(dt, &t, &es));
    ZR_TRY(usable(c));
    if (!c->c) {
        copy(recv, send, n * es);
        return 0;
    }
    return outcome(c, scatter ? zr_comm_reduce_scatter(c->c, send, recv, n, t)
                              : zr_comm_all_reduce(c->c, send, recv, n, t));
}

static int all_reduce(zr_dev_comm *c, const void *send, void *recv, size_t n, zr_dev_dtype dt)
{
    return reduce(c, send, recv, n, dt, 0);
}

static int reduce_scatter(zr_dev_comm *c, const void *send, void *recv, size_t n,
                          zr_dev_dtype dt)
{
    return reduce(c, send, recv, n, dt, 1);
}

static int all_gather(zr_dev_comm *c, const void *send, void *recv, size_t n, size_t elem_bytes)
{
    ZR_TRY(usable(c));
    if (!c->c) {
        copy(recv, send, n * elem_bytes);
        return 0;
    }
    return outcome(c, zr_comm_all_gather(c->c, send, recv, n, elem_bytes));
}

static int broadcast(zr_dev_comm *c, void *buf, size_t bytes, int root)
{
    if (root < 0 || root >= c->world)
        return zr_err_set(ZR_EINVAL, "hostsim: broadcast root %d of world %d", root, c->world);
    ZR_TRY(usable(c));
    if (!c->c)
        return 0;
    return outcome(c, zr_comm_broadcast(c->c, buf, bytes, root));
}

/* as the CUDA backend's: an all-gather, recv holds world x bytes on every rank */
static int gather(zr_dev_comm *c, const void *send, void *recv, size_t bytes, int root)
{
    if (root < 0 || root >= c->world)
        return zr_err_set(ZR_EINVAL, "hostsim: gather root %d of world %d", root, c->world);
    if (!bytes)
        return usable(c);
    return all_gather(c, send, recv, 1, bytes);
}

static int barrier(zr_dev_comm *c)
{
    ZR_TRY(usable(c));
    if (!c->c)
        return 0;
    return outcome(c, zr_comm_barrier(c->c));
}

/* ---------------------------------------------------------------- the table */

static const zr_device_ops hostsim_ops = {
    .abi_version = ZR_DEVICE_ABI_VERSION,
    .size = (uint32_t)sizeof(zr_device_ops),
    .name = "hostsim",
    .build = "host simulation (CPU engine)",
    .set_error_handler = set_error_handler,
    .last_error = last_error,
    .probe = probe,
    .init = init,
    .info = info,
    .synchronize = synchronize,
    .mem_stats = mem_stats,
    .mem_reset_peak = mem_reset_peak,
    .malloc = dev_malloc,
    .free = dev_free,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .host_register = host_register,
    .host_unregister = host_unregister,
    .memset = dev_memset,
    .memcpy = dev_memcpy,
    .stream_new = stream_new,
    .stream_free = stream_free,
    .stream_sync = stream_sync,
    .event_new = event_new,
    .event_free = event_free,
    .event_record = event_record,
    .event_sync = event_sync,
    .event_query = event_query,
    .stream_wait = stream_wait,
    .activation_bytes = activation_bytes,
    .model_new = model_new,
    .model_free = model_free,
    .model_stream = model_stream,
    .model_n_groups = model_n_groups,
    .model_group_numel = model_group_numel,
    .model_numel = model_numel,
    .model_fetch_order = model_fetch_order,
    .model_param = model_param,
    .model_grad = model_grad,
    .model_zero_grad = model_zero_grad,
    .model_forward = model_forward,
    .model_loss = model_loss,
    .model_backward = model_backward,
    .model_probs = model_probs,
    .model_bytes = model_bytes,
    .adamw = adamw,
    .sumsq = sumsq,
    .add = add,
    .comm_unique_id = comm_unique_id,
    .comm_new = comm_new,
    .comm_free = comm_free,
    .comm_rank = comm_rank,
    .comm_world = comm_world,
    .comm_stream = comm_stream,
    .comm_wait = comm_wait,
    .all_reduce = all_reduce,
    .reduce_scatter = reduce_scatter,
    .all_gather = all_gather,
    .broadcast = broadcast,
    .gather = gather,
    .barrier = barrier,
    .kernels = NULL, /* the per-layer test kernels are the CUDA backend's */
};

/* the getter the loader looks for (device.h), the only symbol this library exports */
__attribute__((visibility("default"))) const zr_device_ops *zr_cuda_ops_v1(void);
const zr_device_ops *zr_cuda_ops_v1(void) { return &hostsim_ops; }
