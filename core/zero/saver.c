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

/* Live mode (a host engine with its states in memory): a save is a list of chunks that the
 * writer reads straight from the live state arrays; zr_saver_protect copies into the bounded
 * buffer those not yet written before the next optimizer update may change them. */
#define CHUNK_FLOATS 16384u /* 64 KiB */
enum { CH_LIVE, CH_READING, CH_COPIED, CH_WRITTEN };

typedef struct {
    size_t ext;        /* its extent (a[0].ext) */
    uint64_t off, n;   /* floats within the extent */
    const float *src;  /* live: in the state arrays; copied: in the buffer */
    int state;         /* CH_* */
} chunk;

struct zr_saver {
    const zck_layout *L;
    int world, rank;
    int live;          /* live mode (zr_saver_prepare decides) */
    size_t buf_cap;    /* live mode: the bounded buffer, floats (a[1].mem) */
    size_t buf_used;
    chunk *ch;
    size_t n_ch, cap_ch;
    unsigned throttle_ms;
    size_t copied;     /* the last protect: chunks copied */
    double protect_s;  /* the last protect: seconds training waited */
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
    size_t exposed;    /* live mode: chunks still LIVE or READING */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int zr_saver_new(zr_saver **out, const zck_layout *L, int world, int rank, size_t buffer)
{
    zr_saver *s = calloc(1, sizeof *s);
    if (!s)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    s->L = L;
    s->world = world;
    s->rank = rank;
    s->writing_area = -1;
    s->buf_cap = buffer / sizeof(float);
    int ms = 0, has;
    int rc = zr_env_int(&ms, &has, ZR_ENV_SAVE_THROTTLE_MS, 0, 60000);
    if (rc < 0) {
        free(s);
        return rc;
    }
    s->throttle_ms = (unsigned)ms;
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
    free(s->ch);
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
    ZR_TRY(zr_array_grow(&a->ext, &a->cap_ext, a->n_ext, sizeof *a->ext));
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

size_t zr_saver_default_buffer(uint64_t part_floats)
{
    uint64_t five = part_floats * sizeof(float) / 20, floor = (uint64_t)64 << 20;
    return (size_t)(five > floor ? five : floor);
}

int zr_saver_prepare(zr_saver *s, zr_zero *z)
{
    uint64_t part = zr_zero_part_floats(z);
    s->live = zr_zero_live_saves(z);
    if (!s->live)
        return area_reserve(&s->a[0], (size_t)part, 1);
    if (!s->buf_cap)
        s->buf_cap = zr_saver_default_buffer(part) / sizeof(float);
    if (s->buf_cap > part) /* never more than a whole copy */
        s->buf_cap = (size_t)part;
    return area_reserve(&s->a[1], s->buf_cap, 1);
}

size_t zr_saver_buffer_bytes(const zr_saver *s)
{
    return (s->live ? s->a[1].cap : s->a[0].cap + s->a[1].cap) * sizeof(float);
}

/* Live mode: the sink records chunks pointing into the state arrays (zr_zero_live_saves: they
 * stay valid and unchanged until the next optimizer update). */
typedef struct {
    zr_saver *s;
    uint64_t off; /* floats of the current extent recorded */
} live_rec;

static int live_begin(void *ctx, size_t g, size_t st, uint64_t start, uint64_t count)
{
    live_rec *r = ctx;
    r->off = 0;
    return snap_begin(&r->s->a[0], g, st, start, count);
}

static int live_write(void *ctx, const void *data, size_t bytes)
{
    live_rec *r = ctx;
    zr_saver *s = r->s;
    const float *p = data;
    for (uint64_t n = bytes / sizeof(float), k; n; n -= k, p += k, r->off += k) {
        k = n < CHUNK_FLOATS ? n : CHUNK_FLOATS;
        ZR_TRY(zr_array_grow(&s->ch, &s->cap_ch, s->n_ch, sizeof *s->ch));
        s->ch[s->n_ch++] = (chunk){s->a[0].n_ext - 1, r->off, k, p, CH_LIVE};
    }
    return 0;
}

static int snapshot_live(zr_saver *s, zr_zero *z)
{
    pthread_mutex_lock(&s->mu); /* the chunk list and the buffer are the running write's */
    while (s->status == ZR_SAVER_WRITING)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (s->a[0].ready)
        return zr_err_set(ZR_ERROR, "saver: a snapshot is already waiting for its write");
    s->a[0].n_ext = 0;
    s->n_ch = 0;
    s->buf_used = 0;
    live_rec r = {s, 0};
    zr_zero_sink k = {&r, live_begin, live_write};
    ZR_TRY(zr_zero_save_to(z, &k));
    s->exposed = s->n_ch;
    s->a[0].ready = 1;
    return 0;
}

int zr_saver_snapshot(zr_saver *s, zr_zero *z)
{
    double t0 = now_s();
    if (s->live) {
        ZR_TRY(snapshot_live(s, z));
        s->snap_s = now_s() - t0;
        return 0;
    }
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

int zr_saver_protect(zr_saver *s)
{
    double t0 = now_s();
    s->copied = 0;
    s->protect_s = 0;
    pthread_mutex_lock(&s->mu);
    if (!s->live || s->status != ZR_SAVER_WRITING || !s->exposed) {
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    /* the chunks the writer reaches last first, while the buffer has room */
    for (size_t i = s->n_ch; i-- > 0 && s->buf_used < s->buf_cap;) {
        chunk *c = &s->ch[i];
        if (c->state != CH_LIVE || s->buf_used + c->n > s->buf_cap)
            continue;
        float *dst = s->a[1].mem + s->buf_used;
        memcpy(dst, c->src, (size_t)c->n * sizeof(float));
        s->buf_used += (size_t)c->n;
        c->src = dst;
        c->state = CH_COPIED;
        s->exposed--;
        s->copied++;
    }
    /* the rest: the writer takes them from the live arrays first */
    while (s->status == ZR_SAVER_WRITING && s->exposed)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    s->protect_s = now_s() - t0;
    return 0;
}

void zr_saver_protect_stats(const zr_saver *s, size_t *copied, double *secs)
{
    *copied = s->copied;
    *secs = s->protect_s;
}

double zr_saver_snapshot_s(const zr_saver *s) { return s->snap_s; }

/* ---------------------------------------------------------------- the write */

static void throttle(const zr_saver *s)
{
    if (!s->throttle_ms)
        return;
    struct timespec ts = {(time_t)(s->throttle_ms / 1000), (long)(s->throttle_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Live mode: chunk by chunk, from the state arrays or, once zr_saver_protect copied it, from
 * the buffer; each chunk's state under the mutex, its bytes outside it. */
static int write_chunks(zr_saver *s, zck_writer *w)
{
    for (size_t i = 0; i < s->n_ch; i++) {
        pthread_mutex_lock(&s->mu);
        chunk *c = &s->ch[i];
        if (c->state == CH_LIVE)
            c->state = CH_READING;
        const float *src = c->src;
        pthread_mutex_unlock(&s->mu);
        const extent *e = &s->a[0].ext[c->ext];
        int rc = c->off ? 0 : zck_writer_begin(w, e->g, e->s, e->start, e->count);
        if (!rc)
            rc = zck_writer_write(w, src, (size_t)c->n * sizeof(float));
        throttle(s);
        pthread_mutex_lock(&s->mu);
        if (c->state == CH_READING)
            s->exposed--;
        c->state = CH_WRITTEN;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (rc)
            return rc;
    }
    return 0;
}

static int write_area(zr_saver *s, zck_writer *w)
{
    area *a = &s->a[s->writing_area];
    for (size_t i = 0; i < a->n_ext; i++) {
        const extent *e = &a->ext[i];
        ZR_TRY(zck_writer_put(w, e->g, e->s, e->start, e->count, a->mem + e->at));
        throttle(s);
    }
    return 0;
}

static void *writer_main(void *arg)
{
    zr_saver *s = arg;
    zck_writer *w = NULL;
    zck_shard *sh = NULL;
    char *json = NULL;
    int rc = zck_writer_open(&w, s->staging, s->L, (uint32_t)s->world, (uint32_t)s->rank, NULL);
    if (!rc)
        rc = s->live ? write_chunks(s, w) : write_area(s, w);
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
