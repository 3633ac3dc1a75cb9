/*
 * saver.c: asynchronous checkpoint writes (saver.h): snapshots into staging areas, one writer
 * thread per write.
 */
#include "saver.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct {
    size_t g, s;
    uint64_t start, count;
    size_t at; /* floats into the area */
} extent;

typedef struct {
    float *mem;
    size_t cap;     /* floats */
    extent *ext;
    size_t n_ext, cap_ext;
    size_t fill;    /* floats written by the snapshot */
    int ready;      /* a snapshot waits for its write */
} area;

struct zr_saver {
    const zck_layout *L;
    int world, rank;
    area a[2];
    int writing_area;  /* the area the running write reads, -1 none */
    pthread_t th;
    int th_running;    /* a thread to join */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int status;        /* ZR_SAVER_* or an error code */
    char errmsg[512];
    char *staging, *json;
    double snap_s;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int zr_saver_new(zr_saver **out, const zck_layout *L, int world, int rank)
{
    zr_saver *s = calloc(1, sizeof *s);
    if (!s)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    s->L = L;
    s->world = world;
    s->rank = rank;
    s->writing_area = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *out = s;
    return 0;
}

static void join(zr_saver *s)
{
    if (s->th_running) {
        pthread_join(s->th, NULL);
        s->th_running = 0;
    }
}

void zr_saver_free(zr_saver *s)
{
    if (!s)
        return;
    join(s);
    for (int i = 0; i < 2; i++) {
        if (s->a[i].mem)
            munmap(s->a[i].mem, s->a[i].cap * sizeof(float));
        free(s->a[i].ext);
    }
    free(s->staging);
    free(s->json);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* ---------------------------------------------------------------- snapshot */

static int snap_begin(void *ctx, size_t g, size_t st, uint64_t start, uint64_t count)
{
    area *a = ctx;
    if (a->n_ext == a->cap_ext) {
        size_t cap = a->cap_ext ? 2 * a->cap_ext : 64;
        extent *e = realloc(a->ext, cap * sizeof *e);
        if (!e)
            return zr_err_set(ZR_ENOMEM, "out of memory");
        a->ext = e;
        a->cap_ext = cap;
    }
    a->ext[a->n_ext++] = (extent){g, st, start, count, a->fill};
    return 0;
}

static int snap_write(void *ctx, const void *data, size_t bytes)
{
    area *a = ctx;
    size_t n = bytes / sizeof(float);
    if (a->fill + n > a->cap)
        return zr_err_set(ZR_ERROR, "snapshot larger than its staging area");
    memcpy(a->mem + a->fill, data, bytes);
    a->fill += n;
    return 0;
}

/* Room for `need` floats in area a: anonymous memory, huge pages advised, faulted in now when
 * touch is set (so that no save pays for first-touch page faults). */
static int area_reserve(area *a, size_t need, int touch)
{
    if (a->cap >= need && a->mem)
        return 0;
    if (a->mem)
        munmap(a->mem, a->cap * sizeof(float));
    a->mem = NULL;
    a->cap = 0;
    size_t bytes = (need ? need : 1) * sizeof(float);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return zr_err_set(ZR_ENOMEM, "out of memory for a %.1f MiB checkpoint staging area",
                          (double)bytes / 1048576);
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    if (touch)
        memset(p, 0, bytes);
    a->mem = p;
    a->cap = need ? need : 1;
    return 0;
}

int zr_saver_prepare(zr_saver *s, zr_zero *z)
{
    return area_reserve(&s->a[0], (size_t)zr_zero_part_floats(z), 1);
}

int zr_saver_snapshot(zr_saver *s, zr_zero *z)
{
    double t0 = now_s();
    pthread_mutex_lock(&s->mu);
    int busy = s->writing_area, i = busy == 0 ? 1 : 0; /* not the area being written */
    int ready = s->a[0].ready || s->a[1].ready;
    pthread_mutex_unlock(&s->mu);
    if (ready)
        return zr_err_set(ZR_ERROR, "saver: a snapshot is already waiting for its write");
    area *a = &s->a[i];
    ZR_TRY(area_reserve(a, (size_t)zr_zero_part_floats(z), 0));
    a->n_ext = 0;
    a->fill = 0;
    zr_zero_sink k = {a, snap_begin, snap_write};
    ZR_TRY(zr_zero_save_to(z, &k));
    a->ready = 1;
    s->snap_s = now_s() - t0;
    return 0;
}

double zr_saver_snapshot_s(const zr_saver *s) { return s->snap_s; }

/* ---------------------------------------------------------------- the write */

static void *writer_main(void *arg)
{
    zr_saver *s = arg;
    area *a = &s->a[s->writing_area];
    zck_writer *w = NULL;
    zck_shard *sh = NULL;
    char *json = NULL;
    int rc = zck_writer_open(&w, s->staging, s->L, (uint32_t)s->world, (uint32_t)s->rank, NULL);
    for (size_t i = 0; !rc && i < a->n_ext; i++) {
        const extent *e = &a->ext[i];
        rc = zck_writer_put(w, e->g, e->s, e->start, e->count, a->mem + e->at);
    }
    if (!rc)
        rc = zck_writer_finish(w, &sh);
    if (!rc)
        rc = zck_shard_to_json(&json, sh);
    char msg[sizeof s->errmsg] = "";
    if (rc)
        snprintf(msg, sizeof msg, "%s", zr_err_msg());
    zck_writer_free(w);
    zck_shard_free(sh);
    pthread_mutex_lock(&s->mu);
    s->status = rc ? rc : ZR_SAVER_DONE;
    memcpy(s->errmsg, msg, sizeof msg);
    s->json = json;
    s->writing_area = -1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int zr_saver_write(zr_saver *s, const char *staging_dir)
{
    pthread_mutex_lock(&s->mu);
    int running = s->status == ZR_SAVER_WRITING, i = s->a[0].ready ? 0 : s->a[1].ready ? 1 : -1;
    pthread_mutex_unlock(&s->mu);
    if (running)
        return zr_err_set(ZR_ERROR, "saver: a write is still running");
    if (i < 0)
        return zr_err_set(ZR_ERROR, "saver: no snapshot to write");
    join(s);
    free(s->staging);
    free(s->json);
    s->json = NULL;
    if (!(s->staging = strdup(staging_dir)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    s->writing_area = i;
    s->a[i].ready = 0; /* being written now */
    s->status = ZR_SAVER_WRITING;
    int e = pthread_create(&s->th, NULL, writer_main, s);
    if (e) {
        s->writing_area = -1;
        s->status = ZR_SAVER_IDLE;
        return zr_err_sys(e, "starting the checkpoint writer thread");
    }
    s->th_running = 1;
    return 0;
}

static int status_locked(zr_saver *s)
{
    if (s->status < 0)
        zr_err_set(s->status, "%s", s->errmsg);
    return s->status;
}

int zr_saver_status(zr_saver *s)
{
    pthread_mutex_lock(&s->mu);
    int st = status_locked(s);
    pthread_mutex_unlock(&s->mu);
    return st;
}

int zr_saver_wait(zr_saver *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->status == ZR_SAVER_WRITING)
        pthread_cond_wait(&s->cv, &s->mu);
    int st = status_locked(s);
    pthread_mutex_unlock(&s->mu);
    join(s);
    return st;
}

int zr_saver_take(zr_saver *s, char **shard_json)
{
    if (zr_saver_wait(s) != ZR_SAVER_DONE || !s->json)
        return zr_err_set(ZR_ERROR, "saver: no finished write to take");
    *shard_json = s->json;
    s->json = NULL;
    s->status = ZR_SAVER_IDLE;
    return 0;
}
