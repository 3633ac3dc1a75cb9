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
} rank_proc;

static const int fwd_sigs[] = {SIGINT, SIGTERM, SIGUSR1};
static const int all_sigs[] = {SIGINT, SIGTERM, SIGUSR1, SIGCHLD};
#define N_ALL 4

static volatile sig_atomic_t self_w = -1;

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

static void emit_line(const rank_proc *p, const stream *s, const char *line, size_t n)
{
    if (!s->show)
        return;
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

/* environment of rank r: environ without ZR_RANK, ZR_WORLD, ZR_COMM_SHM, ZR_COMM_TCP and
 * ZR_LOCAL_RANK, plus ours (the shm segment on one node, the master's address on several) */
static int ours(const char *e)
{
    return !strncmp(e, "ZR_RANK=", 8) || !strncmp(e, "ZR_WORLD=", 9) ||
           !strncmp(e, "ZR_COMM_SHM=", 12) || !strncmp(e, "ZR_COMM_TCP=", 12) ||
           !strncmp(e, "ZR_LOCAL_RANK=", 14);
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
    snprintf(a, 32, "ZR_RANK=%d", rank);
    snprintf(b, 32, "ZR_WORLD=%d", world);
    snprintf(l, 32, "ZR_LOCAL_RANK=%d", local);
    env[k++] = a;
    env[k++] = b;
    env[k++] = l;
    if (where) {
        sprintf(c, "%s=%s", shm ? "ZR_COMM_SHM" : "ZR_COMM_TCP", where);
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
    const int W = o->nproc;                       /* ranks on this node */
    const int base = nodes > 1 ? o->node_rank * W : 0; /* global rank of the first */
    const int piped = W > 1 || nodes > 1;
    int rc = 0;
    char *shm = NULL;
    char **envs[MAX_NPROC] = {0};
    rank_proc *P = NULL;
    int self[2] = {-1, -1}, devnull = -1;
    struct sigaction old_act[N_ALL];
    sigset_t block, old_mask;
    int handlers = 0, blocked = 0, started = 0;

    fflush(NULL);
    if (W > 1 && nodes == 1)
        ZR_TRY(zr_comm_shm_create(&shm, W, 0));
    P = calloc((size_t)W, sizeof *P);
    if (!P) {
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    for (int r = 0; r < W; r++) {
        P[r].out.fd = P[r].err.fd = -1;
        if (piped) {
            P[r].out.buf = malloc(LINE_CAP);
            P[r].err.buf = malloc(LINE_CAP);
        }
        envs[r] = make_env(base + r, W * nodes, shm, r, nodes > 1 ? o->master : NULL);
        if (!envs[r] || (piped && (!P[r].out.buf || !P[r].err.buf))) {
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
            goto out;
        }
        P[r].plen = piped ? (size_t)snprintf(P[r].prefix, sizeof P[r].prefix, "[rank %d] ",
                                             base + r)
                          : 0;
        P[r].out.dest = 1;
        P[r].out.show = base + r == 0 || o->log_all_ranks;
        P[r].err.dest = 2;
        P[r].err.show = 1;
    }
    if (pipe2(self, O_CLOEXEC | O_NONBLOCK) < 0) {
        rc = zr_err_sys(errno, "launch: pipe");
        goto out;
    }
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    self_w = self[1];
    for (int i = 0; i < N_ALL; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESTART | (all_sigs[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
        sigemptyset(&sa.sa_mask);
        sigaction(all_sigs[i], &sa, &old_act[i]);
    }
    handlers = 1;
    sigemptyset(&block);
    for (int i = 0; i < N_ALL; i++)
        sigaddset(&block, all_sigs[i]);
    sigprocmask(SIG_BLOCK, &block, &old_mask);
    blocked = 1;

    pid_t me = getpid();
    for (int r = 0; r < W; r++) {
        int po[2] = {-1, -1}, pe[2] = {-1, -1};
        if (piped && (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0)) {
            rc = zr_err_sys(errno, "launch: pipe for rank %d", r);
            if (po[0] >= 0) {
                close(po[0]);
                close(po[1]);
            }
            goto out;
        }
        pid_t pid = fork();
        if (pid == 0)
            child_exec(r, argv, envs[r], devnull, po[1], pe[1], old_act, &old_mask, me);
        int e = errno;
        if (piped) {
            close(po[1]);
            close(pe[1]);
        }
        if (pid < 0) {
            if (piped) {
                close(po[0]);
                close(pe[0]);
            }
            rc = zr_err_sys(e, "launch: fork of rank %d", r);
            goto out;
        }
        setpgid(pid, pid); /* also done by the child: whichever runs first */
        P[r].pid = pid;
        P[r].running = 1;
        started++;
        if (piped) {
            fcntl(po[0], F_SETFL, O_NONBLOCK);
            fcntl(pe[0], F_SETFL, O_NONBLOCK);
            P[r].out.fd = po[0];
            P[r].err.fd = pe[0];
        }
    }
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    blocked = 0;

    /* ------------------------------------------------ the loop */
    int running = W, first_fail = -1, fail_status = 0, killed = 0;
    int64_t kill_at = -1, all_done_at = -1;
    struct pollfd *pf = calloc((size_t)(2 * W + 1), sizeof *pf);
    int *pf_rank = calloc((size_t)(2 * W + 1), sizeof *pf_rank);
    if (!pf || !pf_rank) {
        free(pf);
        free(pf_rank);
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    for (;;) {
        /* reap */
        for (int r = 0; r < W; r++) {
            if (!P[r].running)
                continue;
            int st;
            pid_t k;
            do
                k = waitpid(P[r].pid, &st, WNOHANG);
            while (k < 0 && errno == EINTR);
            if (k == 0)
                continue;
            if (k < 0)
                st = 0x7f00; /* cannot happen with our handler; treat as exit 127 */
            P[r].running = 0;
            P[r].status = st;
            running--;
            int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
            if (ok || first_fail >= 0)
                continue;
            first_fail = r;
            fail_status = st;
            if (piped) { /* its last words before ours */
                stream_read(&P[r], &P[r].err);
                stream_read(&P[r], &P[r].out);
            }
            if (shm)
                zr_comm_shm_abort(shm, r, st);
            if (piped) {
                char d[96];
                if (WIFEXITED(st))
                    snprintf(d, sizeof d, "exited with status %d", WEXITSTATUS(st));
                else if (WIFSIGNALED(st))
                    snprintf(d, sizeof d, "was killed by signal %d (%s)", WTERMSIG(st),
                             zr__signal_name(WTERMSIG(st)));
                else
                    snprintf(d, sizeof d, "failed (wait status %d)", st);
                if (running > 0)
                    say("zrun: rank %d %s; stopping the other %d rank%s", base + r, d, running,
                        running == 1 ? "" : "s");
                else
                    say("zrun: rank %d %s", base + r, d);
            }
            int grace_ms = o->kill_grace_s > 0 ? (int)(o->kill_grace_s * 1000) : 0;
            for (int q = 0; q < W; q++)
                signal_group(&P[q], grace_ms > 0 ? SIGTERM : SIGKILL);
            if (grace_ms > 0)
                kill_at = now_ms() + grace_ms;
            else
                killed = 1;
        }
        int64_t t = now_ms();
        if (first_fail >= 0 && !killed && kill_at >= 0 && t >= kill_at && running > 0) {
            for (int q = 0; q < W; q++)
                if (P[q].running)
                    say("zrun: rank %d still running %.1f s after SIGTERM: sending SIGKILL",
                        base + q, o->kill_grace_s);
            for (int q = 0; q < W; q++)
                signal_group(&P[q], SIGKILL);
            killed = 1;
        }
        int open_streams = 0;
        for (int r = 0; r < W; r++)
            open_streams += (P[r].out.fd >= 0) + (P[r].err.fd >= 0);
        if (running == 0) {
            if (!open_streams)
                break;
            if (all_done_at < 0)
                all_done_at = t;
            else if (t - all_done_at >= TICK_MS)
                break;
        }
        /* wait */
        int timeout = TICK_MS;
        if (first_fail >= 0 && !killed && kill_at >= 0 && running > 0 && kill_at - t < timeout)
            timeout = kill_at - t < 0 ? 0 : (int)(kill_at - t);
        int n = 0;
        pf[n].fd = self[0];
        pf[n].events = POLLIN;
        pf_rank[n++] = -1;
        for (int r = 0; r < W; r++) {
            if (P[r].out.fd >= 0) {
                pf[n].fd = P[r].out.fd;
                pf[n].events = POLLIN;
                pf_rank[n++] = 2 * r;
            }
            if (P[r].err.fd >= 0) {
                pf[n].fd = P[r].err.fd;
                pf[n].events = POLLIN;
                pf_rank[n++] = 2 * r + 1;
            }
        }
        int k = poll(pf, (nfds_t)n, timeout);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            k = 0; /* unexpected; the tick still reaps */
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        for (int i = 0; i < n && k > 0; i++) {
            if (!pf[i].revents)
                continue;
            if (pf_rank[i] < 0) {
                unsigned char sig[64];
                ssize_t got;
                while ((got = read(self[0], sig, sizeof sig)) > 0 || (got < 0 && errno == EINTR))
                    for (ssize_t j = 0; j < got; j++)
                        for (size_t f = 0; f < sizeof fwd_sigs / sizeof *fwd_sigs; f++)
                            if (sig[j] == fwd_sigs[f])
                                for (int q = 0; q < W; q++)
                                    if (P[q].running)
                                        signal_group(&P[q], sig[j]);
                continue;
            }
            rank_proc *p = &P[pf_rank[i] / 2];
            stream_read(p, pf_rank[i] % 2 ? &p->err : &p->out);
        }
    }
    free(pf);
    free(pf_rank);
    if (first_fail >= 0) {
        /* anything a rank left in its process group goes with the job */
        for (int q = 0; q < W; q++)
            kill(-P[q].pid, SIGKILL);
        *exit_code = WIFEXITED(fail_status)     ? WEXITSTATUS(fail_status)
                     : WIFSIGNALED(fail_status) ? 128 + WTERMSIG(fail_status)
                                                : 1;
        if (*exit_code == 0)
            *exit_code = 1;
    }
    started = 0; /* all reaped */

out:
    if (started) {
        /* the launch failed midway: stop and reap what was started */
        for (int r = 0; r < W; r++)
            if (P[r].running) {
                signal_group(&P[r], SIGKILL);
                while (waitpid(P[r].pid, NULL, 0) < 0 && errno == EINTR)
                    ;
                P[r].running = 0;
            }
    }
    if (blocked)
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
    if (handlers) {
        for (int i = 0; i < N_ALL; i++)
            sigaction(all_sigs[i], &old_act[i], NULL);
        self_w = -1;
    }
    if (P) {
        for (int r = 0; r < W; r++) {
            stream_close(&P[r], &P[r].out);
            stream_close(&P[r], &P[r].err);
            free(P[r].out.buf);
            free(P[r].err.buf);
        }
        free(P);
    }
    for (int r = 0; r < W; r++)
        free_env(envs[r]);
    if (self[0] >= 0) {
        close(self[0]);
        close(self[1]);
    }
    if (devnull >= 0)
        close(devnull);
    if (shm) {
        zr_comm_shm_unlink(shm);
        free(shm);
    }
    return rc;
}
