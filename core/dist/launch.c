/*
 * launch.c: zr_launch (zr.h), the multi-process launcher for CPU ranks of one node.
 *
 * One thread does everything with poll(): the read ends of every rank's stdout and stderr
 * pipes (non-blocking) and a self-pipe that the signal handlers write the signal number to.
 * SIGCHLD wakes the loop to reap ranks (waitpid on each rank's pid, WNOHANG; the loop also
 * wakes every 200 ms, so nothing depends on a signal arriving); SIGINT, SIGTERM and SIGUSR1
 * are forwarded to every rank's process group. The signals are blocked around the forks so
 * that a child never runs the launcher's handlers; the child puts the dispositions back (SIG_IGN
 * stays ignored, everything else SIG_DFL) and unblocks them before execve.
 *
 * Every descriptor the launcher opens is O_CLOEXEC, and the child closes every descriptor above
 * 2 before execve (close_range, else a loop up to RLIMIT_NOFILE), so a rank holds exactly
 * /dev/null on 0 and its own pipe ends on 1 and 2 (at nproc 1: the launcher's 1 and 2), as
 * Python's subprocess does by default. Environments are built before the forks: the child calls
 * only async-signal-safe functions.
 *
 * When every rank has exited, pipes that stay open (a grandchild still holds them) are read for
 * 200 ms more, then dropped.
 */
#include "comm.h"
#include "dist.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define LINE_CAP 65536              /* a longer line is cut */
#define TICK_MS 200                 /* poll wake-up period; drain window after the last exit */
#define MAX_NPROC 1024

typedef struct {
    int fd;                         /* read end, -1 once closed */
    int dest;                       /* 1 or 2 */
    int show;
    char *buf;
    size_t len;
} stream;

typedef struct {
    pid_t pid;
    int running;
    int status;
    stream out, err;
    char prefix[32];
    size_t plen;
    int grank;                      /* its global rank */
} rank_proc;

static const int fwd_sigs[] = {SIGINT, SIGTERM, SIGUSR1};
static const int all_sigs[] = {SIGINT, SIGTERM, SIGUSR1, SIGCHLD};
#define N_ALL 4

static volatile sig_atomic_t self_w = -1;
/* SIGPIPE is ignored while the launcher runs (a closed stdout, `| head`, drops rank output,
 * never the job); its disposition before, which the ranks get back */
static struct sigaction old_pipe;

static void on_signal(int s)
{
    int e = errno;
    unsigned char b = (unsigned char)s;
    if (self_w >= 0)
        (void)!write(self_w, &b, 1);
    errno = e;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- output */

static void write_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t k = writev(fd, iov, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return; /* nowhere to write: drop */
        }
        while (n > 0 && (size_t)k >= iov->iov_len) {
            k -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= (size_t)k;
        }
    }
}

/*
 * Error lines held back: when every rank of a job finds the same problem (a bad option, a
 * checkpoint that does not fit), each prints the same "zrun: error: ..." and "hint: ..." lines.
 * Lines of stderr that say "error:" or start with "hint:" wait up to HOLD_MS in this queue;
 * the same text from several ranks becomes one line ("... (all 4 ranks)"). The launcher's own
 * messages queue behind them, so the order stays as it happened. One launch at a time per
 * process (as for the signal plumbing).
 */
#define HOLD_MAX 64
#define HOLD_MS 300

typedef struct {
    char *text;
    size_t n;
    int rank, count, launcher;
    int64_t t0;
} held;

static struct {
    held e[HOLD_MAX];
    int n;
    int world;   /* ranks of this launcher; holding is off below 2 */
    int nodes;
    int base;    /* global rank of the first */
    /* whose error each rank reported (index: local rank): -1 none yet, -2 its own (an error
     * line naming no rank), else the global rank K its "error: rank K: ..." names */
    int origin[MAX_NPROC];
    int shared_error; /* an error line every rank printed */
} hold;

/* The rank an error line says the error is from: K of "error: rank K: ", -2 when it names
 * none. */
static int error_origin(const char *line, size_t n)
{
    const char *e = memmem(line, n, "error: rank ", 12);
    if (!e)
        return -2;
    const char *p = e + 12, *end = line + n;
    long k = 0;
    int digits = 0;
    for (; p < end && *p >= '0' && *p <= '9' && digits < 7; p++, digits++)
        k = k * 10 + (*p - '0');
    return digits && p < end && *p == ':' ? (int)k : -2;
}

static int holdable(const char *line, size_t n)
{
    return memmem(line, n, "error:", 6) || (n >= 5 && !memcmp(line, "hint:", 5));
}

/* A line every rank printed once, "(all N ranks)" on the error line (not on its hint); a line
 * of some ranks with the first one's "[rank R] " and, on an error line, how many others. */
static void hold_print(const held *h)
{
    char pre[32] = "", post[64] = "";
    int err = !h->launcher && memmem(h->text, h->n, "error:", 6) != NULL;
    if (!h->launcher) {
        if (h->count == hold.world) {
            if (err)
                snprintf(post, sizeof post, " (all %d ranks%s)", h->count,
                         hold.nodes > 1 ? " of this node" : "");
        } else {
            snprintf(pre, sizeof pre, "[rank %d] ", h->rank);
            if (h->count > 1 && err)
                snprintf(post, sizeof post, " (and %d other rank%s)", h->count - 1,
                         h->count == 2 ? "" : "s");
        }
    }
    struct iovec iov[4] = {{pre, strlen(pre)}, {h->text, h->n}, {post, strlen(post)}, {"\n", 1}};
    write_all(2, iov, 4);
}

/* Print the queue's head while it is due: a launcher message, a line every rank printed, one
 * older than HOLD_MS, or everything when forced. */
static void hold_flush(int force)
{
    int64_t t = now_ms();
    int k = 0;
    while (k < hold.n) {
        held *h = &hold.e[k];
        if (!force && !h->launcher && h->count < hold.world && t - h->t0 < HOLD_MS)
            break;
        hold_print(h);
        free(h->text);
        k++;
    }
    memmove(hold.e, hold.e + k, (size_t)(hold.n - k) * sizeof *hold.e);
    hold.n -= k;
}

static void hold_add(int rank, int launcher, const char *line, size_t n)
{
    if (!launcher)
        for (int i = 0; i < hold.n; i++)
            if (!hold.e[i].launcher && hold.e[i].n == n && !memcmp(hold.e[i].text, line, n)) {
                if (++hold.e[i].count == hold.world && memmem(line, n, "error:", 6))
                    hold.shared_error = 1;
                return;
            }
    if (hold.n == HOLD_MAX)
        hold_flush(1);
    char *text = malloc(n ? n : 1);
    if (!text) { /* print it now rather than lose it */
        held h = {(char *)line, n, rank, 1, launcher, 0};
        hold_flush(1);
        hold_print(&h);
        return;
    }
    memcpy(text, line, n);
    hold.e[hold.n++] = (held){text, n, rank, 1, launcher, now_ms()};
}

static void emit_line(const rank_proc *p, const stream *s, const char *line, size_t n)
{
    if (!s->show)
        return;
    if (s->dest == 2 && hold.world > 1 && holdable(line, n)) {
        int i = p->grank - hold.base;
        if (memmem(line, n, "error:", 6) && i >= 0 && i < hold.world && hold.origin[i] == -1)
            hold.origin[i] = error_origin(line, n);
        hold_add(p->grank, 0, line, n);
        return;
    }
    struct iovec iov[3] = {{(void *)p->prefix, p->plen}, {(void *)line, n}, {"\n", 1}};
    write_all(s->dest, iov, 3);
}

/* Emit every complete line in the buffer (and the rest too at EOF, or when the buffer is
 * full without a newline). */
static void stream_flush(const rank_proc *p, stream *s, int eof)
{
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++)
        if (s->buf[i] == '\n') {
            emit_line(p, s, s->buf + start, i - start);
            start = i + 1;
        }
    if (start < s->len && (eof || (start == 0 && s->len == LINE_CAP))) {
        emit_line(p, s, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

/* Read what is there; on EOF (or an error) flush and close. */
static void stream_read(const rank_proc *p, stream *s)
{
    while (s->fd >= 0) {
        ssize_t k = read(s->fd, s->buf + s->len, LINE_CAP - s->len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (k <= 0) {
            stream_flush(p, s, 1);
            close(s->fd);
            s->fd = -1;
            return;
        }
        s->len += (size_t)k;
        stream_flush(p, s, 0);
    }
}

static void stream_close(const rank_proc *p, stream *s)
{
    if (s->fd >= 0) {
        stream_flush(p, s, 1);
        close(s->fd);
        s->fd = -1;
    }
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf - 2)
        n = (int)sizeof buf - 2;
    if (hold.n > 0) { /* behind the ranks' lines it follows */
        hold_add(-1, 1, buf, (size_t)n);
        return;
    }
    buf[n++] = '\n';
    struct iovec iov = {buf, (size_t)n};
    write_all(2, &iov, 1);
}

/* ---------------------------------------------------------------- the child */

static void child_write(const char *s) { (void)!write(2, s, strlen(s)); }

static void child_write_int(long v)
{
    char b[24];
    int i = (int)sizeof b;
    int neg = v < 0;
    unsigned long u = neg ? 0ul - (unsigned long)v : (unsigned long)v;
    do
        b[--i] = (char)('0' + u % 10);
    while ((u /= 10) && i > 1);
    if (neg)
        b[--i] = '-';
    (void)!write(2, b + i, sizeof b - (size_t)i);
}

/* after fork: async-signal-safe calls only */
static void child_exec(int rank, char *const argv[], char *const envp[], int devnull,
                       int out_w, int err_w, const struct sigaction *old_act,
                       const sigset_t *old_mask, pid_t parent)
{
    setpgid(0, 0);
    for (int i = 0; i < N_ALL; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = old_act[i].sa_handler == SIG_IGN ? SIG_IGN : SIG_DFL;
        sigemptyset(&sa.sa_mask);
        sigaction(all_sigs[i], &sa, NULL);
    }
    sigaction(SIGPIPE, &old_pipe, NULL);
    sigprocmask(SIG_SETMASK, old_mask, NULL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
        _exit(127); /* the launcher died before we got here */
    /* sources first moved above 2 (a caller with 0, 1 or 2 closed may have had a pipe land
     * there), then dup2'ed into place, which clears their close-on-exec flag */
    int src[3] = {devnull, out_w, err_w};
    for (int i = 0; i < 3; i++)
        if (src[i] >= 0 && src[i] < 3)
            src[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3);
    for (int i = 0; i < 3; i++)
        if (src[i] >= 0)
            dup2(src[i], i);
    /* nothing else reaches the rank: descriptors the caller left inheritable are closed too */
    long closed = -1;
#ifdef SYS_close_range
    closed = syscall(SYS_close_range, 3u, ~0u, 0u);
#endif
    if (closed != 0) {
        struct rlimit rl;
        long max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                       ? (long)rl.rlim_cur
                       : 65536;
        if (max > 65536)
            max = 65536;
        for (int fd = 3; fd < max; fd++)
            close(fd);
    }
    execve(argv[0], argv, envp);
    int e = errno;
    child_write("zrun: rank ");
    child_write_int(rank);
    child_write(": cannot execute ");
    child_write(argv[0]);
    child_write(": ");
    child_write(e == ENOENT    ? "No such file or directory"
                : e == EACCES  ? "Permission denied"
                : e == ENOEXEC ? "Exec format error"
                : e == ENOMEM  ? "Cannot allocate memory"
                               : "errno ");
    if (e != ENOENT && e != EACCES && e != ENOEXEC && e != ENOMEM)
        child_write_int(e);
    child_write("\n");
    _exit(127);
}

/* ---------------------------------------------------------------- the launcher */

static void signal_group(const rank_proc *p, int sig)
{
    if (kill(-p->pid, sig) < 0 && p->running)
        kill(p->pid, sig);
}

/* environment of rank r: environ without ZR_RANK, ZR_WORLD, ZR_COMM_SHM, ZR_COMM_TCP,
 * ZR_COMM and ZR_LOCAL_RANK, plus ours (the shm segment on one node, the master's address on
 * several) */
static const zr_env_var launcher_vars[] = {ZR_ENV_RANK, ZR_ENV_WORLD, ZR_ENV_COMM_SHM,
                                           ZR_ENV_COMM_TCP, ZR_ENV_COMM, ZR_ENV_LOCAL_RANK};

static int ours(const char *e)
{
    for (size_t i = 0; i < sizeof launcher_vars / sizeof *launcher_vars; i++) {
        const char *name = zr_env_name(launcher_vars[i]);
        size_t n = strlen(name);
        if (!strncmp(e, name, n) && e[n] == '=')
            return 1;
    }
    return 0;
}

static char **make_env(int rank, int world, const char *shm, int local, const char *tcp)
{
    size_t n = 0;
    for (char **e = environ; e && *e; e++)
        n++;
    char **env = calloc(n + 5, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (char **e = environ; e && *e; e++)
        if (!ours(*e))
            env[k++] = *e;
    const char *where = shm ? shm : tcp;
    char *a = malloc(32), *b = malloc(32), *l = malloc(32);
    char *c = where ? malloc(strlen(where) + 16) : NULL;
    if (!a || !b || !l || (where && !c)) {
        free(a);
        free(b);
        free(l);
        free(c);
        free(env);
        return NULL;
    }
    snprintf(a, 32, "%s=%d", zr_env_name(ZR_ENV_RANK), rank);
    snprintf(b, 32, "%s=%d", zr_env_name(ZR_ENV_WORLD), world);
    snprintf(l, 32, "%s=%d", zr_env_name(ZR_ENV_LOCAL_RANK), local);
    env[k++] = a;
    env[k++] = b;
    env[k++] = l;
    if (where) {
        sprintf(c, "%s=%s", zr_env_name(shm ? ZR_ENV_COMM_SHM : ZR_ENV_COMM_TCP), where);
        env[k++] = c;
    }
    env[k] = NULL;
    return env;
}

static void free_env(char **env)
{
    if (!env)
        return;
    /* ours were allocated here; the rest are environ's */
    for (size_t i = 0; env[i]; i++)
        if (ours(env[i]))
            free(env[i]);
    free(env);
}

/* One launch: the ranks of this node, their output streams, the signal plumbing, and the
 * failure bookkeeping of the loop. */
typedef struct {
    const zr_launch_opts *o;
    int W;                           /* ranks on this node */
    int base;                        /* global rank of the first */
    int nodes, piped;
    char *shm;
    char **envs[MAX_NPROC];
    rank_proc *P;
    int self[2], devnull;
    struct sigaction old_act[N_ALL];
    sigset_t old_mask;
    int handlers, blocked, started;
    int running, first_fail, fail_status, killed;
    int blame_pending;               /* the line naming the failure is still to be said */
    int64_t term_at, kill_at, all_done_at;
    struct pollfd *pf;
    int *pf_rank;                    /* 2r: rank r's stdout, 2r+1 its stderr, -1 the self-pipe */
} launch;

/* Everything before the forks: the shm segment, per-rank buffers and environments, the
 * self-pipe, /dev/null, the handlers, the poll arrays; the signals end up blocked. */
static int launch_prepare(launch *L)
{
    const zr_launch_opts *o = L->o;
    const int W = L->W;
    fflush(NULL);
    if (W > 1 && L->nodes == 1)
        ZR_TRY(zr_comm_shm_create(&L->shm, W, 0));
    L->P = calloc((size_t)W, sizeof *L->P);
    L->pf = calloc((size_t)(2 * W + 1), sizeof *L->pf);
    L->pf_rank = calloc((size_t)(2 * W + 1), sizeof *L->pf_rank);
    if (!L->P || !L->pf || !L->pf_rank)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    for (int r = 0; r < W; r++) {
        rank_proc *p = &L->P[r];
        p->out.fd = p->err.fd = -1;
        if (L->piped) {
            p->out.buf = malloc(LINE_CAP);
            p->err.buf = malloc(LINE_CAP);
        }
        L->envs[r] = make_env(L->base + r, W * L->nodes, L->shm, r,
                              L->nodes > 1 ? o->master : NULL);
        if (!L->envs[r] || (L->piped && (!p->out.buf || !p->err.buf)))
            return zr_err_set(ZR_ENOMEM, "out of memory");
        p->plen = L->piped ? (size_t)snprintf(p->prefix, sizeof p->prefix, "[rank %d] ",
                                              L->base + r)
                           : 0;
        p->grank = L->base + r;
        p->out.dest = 1;
        p->out.show = L->base + r == 0 || o->log_all_ranks;
        p->err.dest = 2;
        p->err.show = 1;
    }
    if (pipe2(L->self, O_CLOEXEC | O_NONBLOCK) < 0)
        return zr_err_sys(errno, "launch: pipe");
    L->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    self_w = L->self[1];
    for (int i = 0; i < N_ALL; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESTART | (all_sigs[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
        sigemptyset(&sa.sa_mask);
        sigaction(all_sigs[i], &sa, &L->old_act[i]);
    }
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe);
    L->handlers = 1;
    sigset_t block;
    sigemptyset(&block);
    for (int i = 0; i < N_ALL; i++)
        sigaddset(&block, all_sigs[i]);
    sigprocmask(SIG_BLOCK, &block, &L->old_mask);
    L->blocked = 1;
    return 0;
}

/* Fork and exec every rank (signals blocked throughout), then unblock them. */
static int launch_spawn(launch *L, char *const argv[])
{
    pid_t me = getpid();
    for (int r = 0; r < L->W; r++) {
        int po[2] = {-1, -1}, pe[2] = {-1, -1};
        if (L->piped && (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0)) {
            int rc = zr_err_sys(errno, "launch: pipe for rank %d", r);
            if (po[0] >= 0) {
                close(po[0]);
                close(po[1]);
            }
            return rc;
        }
        pid_t pid = fork();
        if (pid == 0)
            child_exec(r, argv, L->envs[r], L->devnull, po[1], pe[1], L->old_act, &L->old_mask,
                       me);
        int e = errno;
        if (L->piped) {
            close(po[1]);
            close(pe[1]);
        }
        if (pid < 0) {
            if (L->piped) {
                close(po[0]);
                close(pe[0]);
            }
            return zr_err_sys(e, "launch: fork of rank %d", r);
        }
        setpgid(pid, pid); /* also done by the child: whichever runs first */
        L->P[r].pid = pid;
        L->P[r].running = 1;
        L->started++;
        if (L->piped) {
            fcntl(po[0], F_SETFL, O_NONBLOCK);
            fcntl(pe[0], F_SETFL, O_NONBLOCK);
            L->P[r].out.fd = po[0];
            L->P[r].err.fd = pe[0];
        }
    }
    sigprocmask(SIG_SETMASK, &L->old_mask, NULL);
    L->blocked = 0;
    return 0;
}

/* Whom the failure is blamed on, from the error lines the ranks printed (hold.origin): the
 * rank K every "error: rank K: ..." names (the rank whose error the others relay); -2 when
 * every rank printed the same error of its own; -1 when the lines say nothing (then the rank
 * that exited first is named). */
static int blamed_rank(const launch *L)
{
    int own = 0;
    for (int i = 0; i < L->W; i++) {
        if (hold.origin[i] >= 0)
            return hold.origin[i];
        own += hold.origin[i] == -2;
    }
    return own == L->W && hold.shared_error ? -2 : -1;
}

/* The line naming the failure, once the ranks that found the same problem had HOLD_MS to say
 * so (all: at the end, every stream read): the rank whose error the others relay, or all ranks, or
 * else the rank that exited first. */
static void launch_blame(launch *L, int64_t t, int all)
{
    if (!L->blame_pending || (!all && t < L->term_at))
        return;
    L->blame_pending = 0;
    int st = L->fail_status, r = L->base + L->first_fail, who = blamed_rank(L);
    char d[96], stop[64] = "";
    if (WIFEXITED(st))
        snprintf(d, sizeof d, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(d, sizeof d, "was killed by signal %d (%s)", WTERMSIG(st),
                 zr__signal_name(WTERMSIG(st)));
    else
        snprintf(d, sizeof d, "failed (wait status %d)", st);
    if (L->running > 0)
        snprintf(stop, sizeof stop, "; stopping the other %d rank%s", L->running,
                 L->running == 1 ? "" : "s");
    if (who == -2)
        say("zrun: all %d ranks failed with the error above (rank %d %s first)%s", L->W, r, d,
            stop);
    else if (who >= 0 && who != r)
        say("zrun: rank %d failed first (the error above); rank %d %s%s", who, r, d, stop);
    else
        say("zrun: rank %d %s%s", r, d, stop);
}

/* Rank r failed first (wait status st): its last words, the segment's abort record, a line
 * naming the failure (launch_blame), and SIGTERM (or SIGKILL without a grace period) to every
 * rank. */
static void launch_rank_failed(launch *L, int r, int st)
{
    L->first_fail = r;
    L->fail_status = st;
    rank_proc *p = &L->P[r];
    if (L->piped) { /* its last words before ours */
        stream_read(p, &p->err);
        stream_read(p, &p->out);
    }
    if (L->shm)
        zr_comm_shm_abort(L->shm, r, st);
    /* the others hear of it through the segment at once; the signals wait HOLD_MS, so ranks
     * that found the same problem say so before they are stopped (their lines become one),
     * and so does the line naming the failure, which their lines decide */
    L->term_at = now_ms() + (L->piped && L->o->kill_grace_s > 0 ? HOLD_MS : 0);
    L->blame_pending = L->piped;
}

/* The stop after a failure: SIGTERM to every rank once term_at has come (SIGKILL at once
 * without a grace period), then SIGKILL to what still runs kill_grace_s later. */
static void launch_escalate(launch *L, int64_t t)
{
    if (L->first_fail < 0 || L->killed || L->running <= 0)
        return;
    if (L->kill_at < 0) {
        if (t < L->term_at)
            return;
        int grace_ms = L->o->kill_grace_s > 0 ? (int)(L->o->kill_grace_s * 1000) : 0;
        for (int q = 0; q < L->W; q++)
            signal_group(&L->P[q], grace_ms > 0 ? SIGTERM : SIGKILL);
        if (grace_ms > 0)
            L->kill_at = t + grace_ms;
        else
            L->killed = 1;
        return;
    }
    if (t < L->kill_at)
        return;
    for (int q = 0; q < L->W; q++)
        if (L->P[q].running)
            say("zrun: rank %d still running %.1f s after SIGTERM: sending SIGKILL",
                L->base + q, L->o->kill_grace_s);
    for (int q = 0; q < L->W; q++)
        signal_group(&L->P[q], SIGKILL);
    L->killed = 1;
}

/* Reap the ranks that exited (WNOHANG); the first that failed stops the others. */
static void launch_reap(launch *L)
{
    for (int r = 0; r < L->W; r++) {
        if (!L->P[r].running)
            continue;
        int st;
        pid_t k;
        do
            k = waitpid(L->P[r].pid, &st, WNOHANG);
        while (k < 0 && errno == EINTR);
        if (k == 0)
            continue;
        if (k < 0)
            st = 0x7f00; /* cannot happen with our handler; treat as exit 127 */
        L->P[r].running = 0;
        L->P[r].status = st;
        L->running--;
        int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!ok && L->first_fail < 0)
            launch_rank_failed(L, r, st);
    }
}

/* Signals the handler wrote to the self-pipe, forwarded to every running rank's group. */
static void launch_forward_signals(launch *L)
{
    unsigned char sig[64];
    ssize_t got;
    while ((got = read(L->self[0], sig, sizeof sig)) > 0 || (got < 0 && errno == EINTR))
        for (ssize_t j = 0; j < got; j++)
            for (size_t f = 0; f < sizeof fwd_sigs / sizeof *fwd_sigs; f++)
                if (sig[j] == fwd_sigs[f])
                    for (int q = 0; q < L->W; q++)
                        if (L->P[q].running)
                            signal_group(&L->P[q], sig[j]);
}

/* One wait of at most TICK_MS (less when a SIGKILL is due): copy rank output, forward
 * signals. */
static void launch_pump(launch *L, int64_t t)
{
    int timeout = hold.n > 0 ? HOLD_MS / 3 : TICK_MS;
    if (L->first_fail >= 0 && !L->killed && L->running > 0) {
        int64_t due = L->kill_at >= 0 ? L->kill_at : L->term_at;
        if (due - t < timeout)
            timeout = due - t < 0 ? 0 : (int)(due - t);
    }
    struct pollfd *pf = L->pf;
    int n = 0;
    pf[n].fd = L->self[0];
    pf[n].events = POLLIN;
    L->pf_rank[n++] = -1;
    for (int r = 0; r < L->W; r++) {
        if (L->P[r].out.fd >= 0) {
            pf[n].fd = L->P[r].out.fd;
            pf[n].events = POLLIN;
            L->pf_rank[n++] = 2 * r;
        }
        if (L->P[r].err.fd >= 0) {
            pf[n].fd = L->P[r].err.fd;
            pf[n].events = POLLIN;
            L->pf_rank[n++] = 2 * r + 1;
        }
    }
    int k = poll(pf, (nfds_t)n, timeout);
    if (k < 0) {
        if (errno == EINTR)
            return;
        k = 0; /* unexpected; the tick still reaps */
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < n && k > 0; i++) {
        if (!pf[i].revents)
            continue;
        if (L->pf_rank[i] < 0) {
            launch_forward_signals(L);
            continue;
        }
        rank_proc *p = &L->P[L->pf_rank[i] / 2];
        stream_read(p, L->pf_rank[i] % 2 ? &p->err : &p->out);
    }
}

/* Until every rank has exited and its streams are drained (or TICK_MS after the last exit,
 * when a grandchild holds a pipe). The exit code of the first failing rank, else 0. */
static int launch_wait(launch *L)
{
    L->running = L->W;
    L->first_fail = -1;
    L->kill_at = L->all_done_at = -1;
    for (;;) {
        launch_reap(L);
        int64_t t = now_ms();
        launch_blame(L, t, 0);
        launch_escalate(L, t);
        int open_streams = 0;
        for (int r = 0; r < L->W; r++)
            open_streams += (L->P[r].out.fd >= 0) + (L->P[r].err.fd >= 0);
        if (L->running == 0) {
            if (!open_streams)
                break;
            if (L->all_done_at < 0)
                L->all_done_at = t;
            else if (t - L->all_done_at >= TICK_MS)
                break;
        }
        hold_flush(0);
        launch_pump(L, t);
    }
    L->started = 0; /* all reaped */
    launch_blame(L, now_ms(), 1);
    if (L->first_fail < 0)
        return 0;
    /* anything a rank left in its process group goes with the job */
    for (int q = 0; q < L->W; q++)
        kill(-L->P[q].pid, SIGKILL);
    int st = L->fail_status;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
    return code ? code : 1;
}

/* Undo everything launch_prepare and launch_spawn did; ranks still running after a failed
 * launch are killed and reaped. */
static void launch_cleanup(launch *L)
{
    const int W = L->W;
    if (L->started) {
        for (int r = 0; r < W; r++)
            if (L->P[r].running) {
                signal_group(&L->P[r], SIGKILL);
                while (waitpid(L->P[r].pid, NULL, 0) < 0 && errno == EINTR)
                    ;
                L->P[r].running = 0;
            }
    }
    if (L->blocked)
        sigprocmask(SIG_SETMASK, &L->old_mask, NULL);
    if (L->handlers) {
        for (int i = 0; i < N_ALL; i++)
            sigaction(all_sigs[i], &L->old_act[i], NULL);
        sigaction(SIGPIPE, &old_pipe, NULL);
        self_w = -1;
    }
    if (L->P) {
        for (int r = 0; r < W; r++) {
            stream_close(&L->P[r], &L->P[r].out);
            stream_close(&L->P[r], &L->P[r].err);
            free(L->P[r].out.buf);
            free(L->P[r].err.buf);
        }
        free(L->P);
    }
    for (int r = 0; r < W; r++)
        free_env(L->envs[r]);
    free(L->pf);
    free(L->pf_rank);
    if (L->self[0] >= 0) {
        close(L->self[0]);
        close(L->self[1]);
    }
    if (L->devnull >= 0)
        close(L->devnull);
    if (L->shm) {
        zr_comm_shm_unlink(L->shm);
        free(L->shm);
    }
}

int zr_launch(int *exit_code, const zr_launch_opts *o, char *const argv[])
{
    *exit_code = 0;
    if (!o || o->nproc < 1 || o->nproc > MAX_NPROC)
        return zr_err_set(ZR_EINVAL, "launch: nproc %d outside [1, %d]", o ? o->nproc : 0,
                          MAX_NPROC);
    if (!argv || !argv[0] || !*argv[0])
        return zr_err_set(ZR_EINVAL, "launch: no program to run");
    const int nodes = o->nnodes > 1 ? o->nnodes : 1;
    if (nodes > 1 && (o->node_rank < 0 || o->node_rank >= nodes || !o->master || !*o->master))
        return zr_err_set(ZR_EINVAL, "launch: %d nodes need a node rank in [0, %d) and the "
                          "master's HOST:PORT", nodes, nodes);
    launch *L = calloc(1, sizeof *L);
    if (!L)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    L->o = o;
    L->W = o->nproc;
    L->nodes = nodes;
    L->base = nodes > 1 ? o->node_rank * L->W : 0;
    L->piped = L->W > 1 || nodes > 1;
    L->self[0] = L->self[1] = L->devnull = -1;
    hold.n = 0;
    hold.world = L->piped ? L->W : 0;
    hold.nodes = nodes;
    hold.base = L->base;
    hold.shared_error = 0;
    for (int i = 0; i < MAX_NPROC; i++)
        hold.origin[i] = -1;
    int rc = launch_prepare(L);
    if (!rc)
        rc = launch_spawn(L, argv);
    if (!rc)
        *exit_code = launch_wait(L);
    launch_cleanup(L);
    hold_flush(1);
    hold.world = 0;
    free(L);
    return rc;
}
