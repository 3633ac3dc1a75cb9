/*
 * comm_tcp.c: the `tcp` backend of the communicator (comm_tcp.h). A star: every rank but 0
 * holds one connection to rank 0 (the hub); the hub runs each collective.
 *
 * Every collective starts with a header from each rank (op, count, element size, root,
 * sequence number); the hub reads all of them, compares them with its own call and answers
 * each rank "go" or an error (a mismatch, a rank gone), so every rank fails the same call
 * with the same message. Then the data: reductions in lockstep chunks of 256 KiB (a rank sends
 * a chunk, the hub reads that chunk from every rank in rank order, sums ((x0 + x1) + x2) ...
 * and sends the result back), so no side ever blocks writing while the other writes too, and
 * the sums have the shm backend's bits; gathers and broadcasts move whole buffers through the
 * hub. An error during the data (a connection lost) shuts the connections: the others see the
 * hub's connection close and fail naming it.
 */
#include "comm_tcp.h"
#include "zck.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x7a725443u /* "zrTC" */
#define CHUNK_BYTES ((size_t)256 << 10)

enum { T_HELLO = 0, T_ALL_REDUCE, T_REDUCE_SCATTER, T_ALL_GATHER, T_BROADCAST, T_GATHER,
       T_BARRIER };
static const char *op_names[] = {"hello", "all_reduce", "reduce_scatter", "all_gather",
                                 "broadcast", "gather", "barrier"};

typedef struct {
    uint32_t magic, op;
    uint64_t count; /* elements (reductions, all_gather: bytes); hello: the job token */
    uint32_t es;    /* element size; hello: the world */
    int32_t root;   /* hello: the rank */
    uint64_t seq;
} hdr;

typedef struct {
    int32_t status; /* 0 go, else a ZR_E* code followed by len bytes of message */
    uint32_t len;
} reply;

struct zr_tcp {
    int rank, world;
    uint64_t token; /* the job's (ztcp_open): another job's ranks are turned away */
    int *fd; /* the hub: fd[q] for rank q >= 1; the others: fd[0], to the hub */
    uint64_t seq;
    int dead, dead_code;
    char dead_msg[512];
    char *tmp, *acc; /* the hub's chunk buffers */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The communicator fails for good with this error (every later call returns it). */
static int die(zr_tcp *t, int code, const char *fmt, ...)
{
    if (!t->dead) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->dead_msg, sizeof t->dead_msg, fmt, ap);
        va_end(ap);
        t->dead = 1;
        t->dead_code = code;
        /* the others notice: the hub's peers see their connection close, the hub sees this
         * rank's */
        for (int q = 0; q < (t->rank == 0 ? t->world : 1); q++)
            if (t->fd[q] >= 0)
                shutdown(t->fd[q], SHUT_RDWR);
    }
    return zr_err_set(t->dead_code, "%s", t->dead_msg);
}

/* The hub, in the header phase: every rank is waiting for its answer; tell them why, then
 * fail. */
static int die_all(zr_tcp *t, int code, const char *msg)
{
    size_t len = strlen(msg);
    for (int q = 1; q < t->world; q++) {
        if (t->fd[q] < 0)
            continue;
        reply r = {code, (uint32_t)len};
        if (send(t->fd[q], &r, sizeof r, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof r)
            (void)!send(t->fd[q], msg, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    return die(t, code, "%s", msg);
}

/* All len bytes to or from rank q (the hub's connection to q; for the others, the hub):
 * 0, or -1 with the reason in why[] and nothing else done. */
static int xfer_raw(zr_tcp *t, int q, void *buf, size_t len, int wr, char *why, size_t cap)
{
    int fd = t->fd[t->rank == 0 ? q : 0];
    char *p = buf;
    while (len) {
        ssize_t k = wr ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            const char *e = k == 0 ? "closed the connection" : strerror(errno);
            if (t->rank == 0)
                snprintf(why, cap, "tcp: rank %d is gone (%s): its process exited or its node "
                         "stopped it", q, e);
            else
                snprintf(why, cap, "tcp: lost rank 0, the hub (%s): the job stopped there, or "
                         "its node failed", e);
            return -1;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* The same; a failure fails the communicator for good. */
static int xfer(zr_tcp *t, int q, void *buf, size_t len, int wr)
{
    char why[256];
    if (xfer_raw(t, q, buf, len, wr, why, sizeof why))
        return die(t, ZR_EIO, "%s", why);
    return 0;
}

static int read_reply(zr_tcp *t)
{
    reply r;
    ZR_TRY(xfer(t, 0, &r, sizeof r, 0));
    if (r.status == 0)
        return 0;
    char msg[512];
    size_t n = r.len < sizeof msg - 1 ? r.len : sizeof msg - 1;
    if (xfer(t, 0, msg, n, 0))
        n = (size_t)snprintf(msg, sizeof msg, "tcp: rank 0 failed the call");
    msg[n] = 0;
    return die(t, r.status < 0 ? r.status : ZR_ECOMM, "%s", msg);
}

static int send_go(zr_tcp *t)
{
    reply r = {0, 0};
    for (int q = 1; q < t->world; q++)
        ZR_TRY(xfer(t, q, &r, sizeof r, 1));
    return 0;
}

/* The header phase of a collective (see the top). */
static int begin(zr_tcp *t, uint32_t op, uint64_t count, uint32_t es, int root)
{
    if (t->dead)
        return zr_err_set(t->dead_code, "%s: communicator unusable after an earlier error: %s",
                          op_names[op], t->dead_msg);
    hdr h = {MAGIC, op, count, es, root, ++t->seq};
    if (t->rank != 0) {
        ZR_TRY(xfer(t, 0, &h, sizeof h, 1));
        return read_reply(t);
    }
    char bad[480] = "";
    for (int q = 1; q < t->world; q++) {
        hdr p;
        char why[256];
        if (xfer_raw(t, q, &p, sizeof p, 0, why, sizeof why)) /* the others wait: tell them */
            return die_all(t, ZR_EIO, why);
        if (p.magic != MAGIC)
            snprintf(bad, sizeof bad, "tcp: rank %d sent a header that is not this protocol's",
                     q);
        else if (!bad[0] && (p.op != op || p.count != count || p.es != es || p.root != root ||
                             p.seq != h.seq))
            snprintf(bad, sizeof bad, "collective mismatch: rank %d's call %llu is %s (count "
                     "%llu, element %u bytes, root %d) while rank 0's call %llu is %s (count "
                     "%llu, element %u bytes, root %d)", q, (unsigned long long)p.seq,
                     p.op < sizeof op_names / sizeof *op_names ? op_names[p.op] : "?",
                     (unsigned long long)p.count, p.es, p.root, (unsigned long long)h.seq,
                     op_names[op], (unsigned long long)count, es, root);
    }
    if (bad[0])
        return die_all(t, ZR_ECOMM, bad);
    return send_go(t);
}

static void add(char *acc, const char *x, size_t n, size_t es)
{
    if (es == sizeof(float)) {
        float *a = (float *)acc;
        const float *b = (const float *)x;
        for (size_t i = 0; i < n; i++)
            a[i] += b[i];
    } else {
        double *a = (double *)acc;
        const double *b = (const double *)x;
        for (size_t i = 0; i < n; i++)
            a[i] += b[i];
    }
}

int ztcp_all_reduce(zr_tcp *t, const void *send, void *recv, size_t n, size_t es)
{
    ZR_TRY(begin(t, T_ALL_REDUCE, n, (uint32_t)es, 0));
    size_t per = CHUNK_BYTES / es;
    for (size_t a = 0; a < n; a += per) {
        size_t c = n - a < per ? n - a : per, b = c * es;
        char *s = (char *)send + a * es, *r = (char *)recv + a * es;
        if (t->rank) {
            ZR_TRY(xfer(t, 0, s, b, 1));
            ZR_TRY(xfer(t, 0, r, b, 0));
            continue;
        }
        memmove(r, s, b);
        for (int q = 1; q < t->world; q++) {
            ZR_TRY(xfer(t, q, t->tmp, b, 0));
            add(r, t->tmp, c, es);
        }
        for (int q = 1; q < t->world; q++)
            ZR_TRY(xfer(t, q, r, b, 1));
    }
    return 0;
}

int ztcp_reduce_scatter(zr_tcp *t, const void *send, void *recv, size_t n, size_t es)
{
    ZR_TRY(begin(t, T_REDUCE_SCATTER, n, (uint32_t)es, 0));
    size_t per = CHUNK_BYTES / es, total = n * (size_t)t->world;
    for (size_t a = 0; a < total; a += per) {
        size_t c = total - a < per ? total - a : per, b = c * es;
        char *s = (char *)send + a * es;
        if (t->rank) {
            ZR_TRY(xfer(t, 0, s, b, 1));
            size_t lo = (size_t)t->rank * n, hi = lo + n;
            lo = lo > a ? lo : a;
            hi = hi < a + c ? hi : a + c;
            if (lo < hi) /* this chunk holds part of my share */
                ZR_TRY(xfer(t, 0, (char *)recv + (lo - (size_t)t->rank * n) * es,
                            (hi - lo) * es, 0));
            continue;
        }
        memcpy(t->acc, s, b);
        for (int q = 1; q < t->world; q++) {
            ZR_TRY(xfer(t, q, t->tmp, b, 0));
            add(t->acc, t->tmp, c, es);
        }
        for (int q = 0; q < t->world; q++) {
            size_t lo = (size_t)q * n, hi = lo + n;
            lo = lo > a ? lo : a;
            hi = hi < a + c ? hi : a + c;
            if (lo >= hi)
                continue;
            char *part = t->acc + (lo - a) * es;
            if (q == 0)
                memcpy((char *)recv + lo * es, part, (hi - lo) * es);
            else
                ZR_TRY(xfer(t, q, part, (hi - lo) * es, 1));
        }
    }
    return 0;
}

int ztcp_all_gather(zr_tcp *t, const void *send, void *recv, size_t bytes)
{
    ZR_TRY(begin(t, T_ALL_GATHER, bytes, 1, 0));
    size_t total = bytes * (size_t)t->world;
    if (t->rank) {
        ZR_TRY(xfer(t, 0, (void *)send, bytes, 1));
        return xfer(t, 0, recv, total, 0);
    }
    memmove(recv, send, bytes);
    for (int q = 1; q < t->world; q++)
        ZR_TRY(xfer(t, q, (char *)recv + (size_t)q * bytes, bytes, 0));
    for (int q = 1; q < t->world; q++)
        ZR_TRY(xfer(t, q, recv, total, 1));
    return 0;
}

int ztcp_broadcast(zr_tcp *t, void *buf, size_t bytes, int root)
{
    ZR_TRY(begin(t, T_BROADCAST, bytes, 1, root));
    if (t->rank)
        return xfer(t, 0, buf, bytes, t->rank == root);
    if (root != 0)
        ZR_TRY(xfer(t, root, buf, bytes, 0));
    for (int q = 1; q < t->world; q++)
        if (q != root)
            ZR_TRY(xfer(t, q, buf, bytes, 1));
    return 0;
}

int ztcp_gather(zr_tcp *t, const void *send, void *recv, size_t bytes, int root)
{
    ZR_TRY(begin(t, T_GATHER, bytes, 1, root));
    size_t total = bytes * (size_t)t->world;
    if (t->rank) {
        ZR_TRY(xfer(t, 0, (void *)send, bytes, 1));
        return t->rank == root ? xfer(t, 0, recv, total, 0) : 0;
    }
    char *dst = root == 0 ? recv : malloc(total);
    if (!dst)
        return die(t, ZR_ENOMEM, "gather: out of memory for %zu bytes", total);
    memmove(dst, send, bytes);
    int rc = 0;
    for (int q = 1; q < t->world && !rc; q++)
        rc = xfer(t, q, dst + (size_t)q * bytes, bytes, 0);
    if (!rc && root != 0)
        rc = xfer(t, root, dst, total, 1);
    if (root != 0)
        free(dst);
    return rc;
}

int ztcp_barrier(zr_tcp *t) { return begin(t, T_BARRIER, 0, 0, 0); }

int ztcp_check(zr_tcp *t)
{
    if (t->dead)
        return zr_err_set(t->dead_code, "communicator unusable after an earlier error: %s",
                          t->dead_msg);
    for (int q = 0; q < (t->rank == 0 ? t->world : 1); q++) {
        if (t->fd[q] < 0)
            continue;
        struct pollfd p = {t->fd[q], POLLIN, 0};
        char c;
        if (poll(&p, 1, 0) == 1 &&
            ((p.revents & (POLLHUP | POLLERR)) ||
             recv(t->fd[q], &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)) {
            if (t->rank == 0)
                return die(t, ZR_EIO, "tcp: rank %d is gone (closed the connection): its "
                           "process exited or its node stopped it", q);
            return die(t, ZR_EIO, "tcp: lost rank 0, the hub (closed the connection): the job "
                       "stopped there, or its node failed");
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- connections */

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int split_master(const char *master, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon = master ? strrchr(master, ':') : NULL;
    if (!colon || colon == master || !colon[1] || (size_t)(colon - master) >= hcap ||
        strlen(colon + 1) >= pcap)
        return zr_err_set(ZR_EINVAL, "--master '%s': expected HOST:PORT", master ? master : "");
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 1 || p > 65535)
        return zr_err_set(ZR_EINVAL, "--master '%s': the port must be 1..65535", master);
    memcpy(host, master, (size_t)(colon - master));
    host[colon - master] = 0;
    if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [v6 address] */
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = 0;
    }
    snprintf(port, pcap, "%s", colon + 1);
    return 0;
}

/* A connection accepted by the hub whose hello is still being read. */
typedef struct {
    int fd;
    size_t got;
    double since;
    hdr h;
} pending;

#define MAX_PENDING 64
#define HELLO_S 10.0 /* a client silent for longer is dropped (it holds nobody up meanwhile) */

/* A complete hello from pending client c: 1 when it joined, 0 when it was dropped (not one of
 * ours, or another job's: a stale rank on the same port), an error when it is one of ours but
 * does not fit this job. */
static int hub_hello(zr_tcp *t, pending *c, int *joined)
{
    hdr h = c->h;
    if (h.magic != MAGIC || h.op != T_HELLO || h.count != t->token) {
        if (h.magic == MAGIC && h.op == T_HELLO)
            zr_log(ZR_LOG_INFO, "tcp: dropped a connection from another job (token %016llx, "
                   "ours %016llx)", (unsigned long long)h.count, (unsigned long long)t->token);
        close(c->fd); /* not one of ours: a port scanner, a stale client of another job */
        return 0;
    }
    if ((int)h.es != t->world || h.root < 1 || h.root >= t->world || t->fd[h.root] >= 0) {
        close(c->fd);
        return zr_err_set(ZR_EINVAL, "tcp: a rank connected as rank %d of %u, but rank 0 "
                          "expects ranks 1..%d of %d, each once (same --nnodes and --nproc on "
                          "every node?)", h.root, h.es, t->world - 1, t->world);
    }
    int fl = fcntl(c->fd, F_GETFL);
    fcntl(c->fd, F_SETFL, fl & ~O_NONBLOCK);
    nodelay(c->fd);
    t->fd[h.root] = c->fd;
    (*joined)++;
    return 1;
}

/* The hub's rendezvous: accept connections and read their hellos together (poll), so a client
 * that connects and says nothing delays no one; until every other rank joined or the
 * deadline. */
static int hub_accept(zr_tcp *t, int lfd, const char *port, const char *master,
                      double deadline)
{
    pending pend[MAX_PENDING];
    struct pollfd pf[MAX_PENDING + 1];
    int np = 0, joined = 0, rc = 0;
    while (!rc && joined < t->world - 1) {
        double now = now_s(), left = deadline - now;
        if (left <= 0) {
            rc = zr_err_set(ZR_EIO, "tcp: only %d of the %d other ranks connected to port %s "
                            "in time (ZR_COMM_TCP_TIMEOUT): are the other nodes started, "
                            "with --master %s?", joined, t->world - 1, port, master);
            break;
        }
        int n = 0;
        pf[n++] = (struct pollfd){lfd, (short)(np < MAX_PENDING ? POLLIN : 0), 0};
        for (int i = 0; i < np; i++)
            pf[n++] = (struct pollfd){pend[i].fd, POLLIN, 0};
        int k = poll(pf, (nfds_t)n, left > 1.0 ? 1000 : (int)(left * 1000) + 1);
        if (k < 0 && errno != EINTR) {
            rc = zr_err_sys(errno, "tcp: poll on port %s", port);
            break;
        }
        if (k > 0 && (pf[0].revents & POLLIN)) {
            int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (c >= 0)
                pend[np++] = (pending){c, 0, now_s(), {0}};
        }
        for (int i = np - 1; i >= 0 && !rc; i--) { /* hellos that came, clients that idle */
            pending *c = &pend[i];
            ssize_t got = recv(c->fd, (char *)&c->h + c->got, sizeof c->h - c->got, 0);
            int done = 0;
            if (got > 0 && (c->got += (size_t)got) == sizeof c->h) {
                rc = hub_hello(t, c, &joined) < 0 ? ZR_EINVAL : 0;
                done = 1;
            } else if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR) ||
                       now_s() - c->since > HELLO_S) {
                close(c->fd);
                done = 1;
            }
            if (done)
                pend[i] = pend[--np];
        }
    }
    for (int i = 0; i < np; i++)
        close(pend[i].fd);
    return rc;
}

static int hub_open(zr_tcp *t, const char *port, const char *master, double deadline)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET6;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int fd = -1;
    /* every interface, IPv6 and IPv4 on one socket when the system allows, else IPv4 */
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        hints.ai_family = pass ? AF_INET : AF_INET6;
        if (getaddrinfo(NULL, port, &hints, &ai))
            continue;
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1, zero = 0;
        if (fd >= 0) {
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (!pass)
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, t->world)) {
                int e = errno;
                close(fd);
                fd = -1;
                errno = e;
            }
        }
        freeaddrinfo(ai);
        ai = NULL;
    }
    if (fd < 0)
        return zr_err_sys(errno, "tcp: rank 0 cannot listen on port %s (--master %s)", port,
                          master);
    int rc = hub_accept(t, fd, port, master, deadline);
    close(fd);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", zr_err_msg());
        return die_all(t, rc, msg);
    }
    return send_go(t);
}

static int peer_open(zr_tcp *t, const char *host, const char *port, const char *master,
                     double deadline)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int last = 0;
    for (;;) {
        if (!ai) {
            int g = getaddrinfo(host, port, &hints, &ai);
            if (g && (g != EAI_AGAIN || now_s() > deadline))
                return zr_err_set(ZR_EINVAL, "tcp: --master %s: %s", master, gai_strerror(g));
        }
        for (struct addrinfo *a = ai; a && t->fd[0] < 0; a = a->ai_next) {
            int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0)
                continue;
            if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
                t->fd[0] = fd;
            else {
                last = errno;
                close(fd);
            }
        }
        if (t->fd[0] >= 0)
            break;
        if (now_s() > deadline) {
            freeaddrinfo(ai);
            return zr_err_set(ZR_EIO, "tcp: rank %d cannot reach rank 0 at %s (%s) in time "
                              "(ZR_COMM_TCP_TIMEOUT): is node 0 started?", t->rank, master,
                              strerror(last));
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    freeaddrinfo(ai);
    nodelay(t->fd[0]);
    hdr h = {MAGIC, T_HELLO, t->token, (uint32_t)t->world, t->rank, 0};
    ZR_TRY(xfer(t, 0, &h, sizeof h, 1));
    return read_reply(t);
}

int ztcp_open(zr_tcp **out, const char *master, int rank, int world, double timeout_s,
              uint64_t token)
{
    *out = NULL;
    char host[256], port[16];
    ZR_TRY(split_master(master, host, sizeof host, port, sizeof port));
    zr_tcp *t = calloc(1, sizeof *t);
    if (!t || !(t->fd = malloc((size_t)world * sizeof *t->fd)) ||
        (rank == 0 && (!(t->tmp = malloc(CHUNK_BYTES)) || !(t->acc = malloc(CHUNK_BYTES))))) {
        if (t) {
            free(t->fd);
            free(t->tmp);
            free(t);
        }
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    for (int q = 0; q < world; q++)
        t->fd[q] = -1;
    t->rank = rank;
    t->world = world;
    t->token = token;
    double deadline = now_s() + timeout_s;
    int rc = rank == 0 ? hub_open(t, port, master, deadline)
                       : peer_open(t, host, port, master, deadline);
    if (rc) {
        ztcp_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

void ztcp_close(zr_tcp *t)
{
    if (!t)
        return;
    for (int q = 0; q < t->world; q++)
        if (t->fd[q] >= 0)
            close(t->fd[q]);
    free(t->fd);
    free(t->tmp);
    free(t->acc);
    free(t);
}

/* ---------------------------------------------------------------- the operations table */

static int be_all_reduce(void *h, const void *s, void *r, size_t n, size_t es)
{
    return ztcp_all_reduce(h, s, r, n, es);
}
static int be_reduce_scatter(void *h, const void *s, void *r, size_t n, size_t es)
{
    return ztcp_reduce_scatter(h, s, r, n, es);
}
static int be_all_gather(void *h, const void *s, void *r, size_t b)
{
    return ztcp_all_gather(h, s, r, b);
}
static int be_broadcast(void *h, void *b, size_t n, int root)
{
    return ztcp_broadcast(h, b, n, root);
}
static int be_gather(void *h, const void *s, void *r, size_t b, int root)
{
    return ztcp_gather(h, s, r, b, root);
}
static int be_barrier(void *h) { return ztcp_barrier(h); }
static int be_check(void *h) { return ztcp_check(h); }
static void be_close(void *h) { ztcp_close(h); }

const zr_comm_be ztcp_be = {"tcp", be_all_reduce, be_reduce_scatter, be_all_gather,
                            be_broadcast, be_gather, be_barrier, be_check, be_close};
