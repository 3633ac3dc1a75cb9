/*
 * lock.c: one job per run directory. A job that stages, commits or deletes in a run directory
 * holds an exclusive flock(2) on RUN/.lock for as long as it works there; the file names the
 * holder (pid, host, program) so that a refused job can say who is in the way. The kernel
 * drops the lock when its holder dies, so a lock left by a crashed job is simply taken over.
 * Where the filesystem has no flock (some NFS setups answer ENOLCK), the pid in the file is
 * the only guard: a live process of that pid on this host keeps the directory, anything else
 * is taken over.
 */
#include "zck_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

struct zck_lock {
    int fd;
    char *path;
};

static void host_name(char out[256])
{
    if (gethostname(out, 256) < 0)
        snprintf(out, 256, "?");
    out[255] = 0;
}

/* The holder named in the lock file: "pid host program" (zeros and "?" when unreadable). */
static void read_holder(int fd, long *pid, char host[256], char prog[64])
{
    char buf[512];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    *pid = 0;
    snprintf(host, 256, "?");
    snprintf(prog, 64, "?");
    char h[256], p[64];
    int k = sscanf(buf, "%ld %255s %63[^\n]", pid, h, p);
    if (k >= 2)
        snprintf(host, 256, "%s", h);
    if (k >= 3)
        snprintf(prog, 64, "%s", p);
}

static int busy(const char *run_dir, int fd)
{
    long pid;
    char host[256], prog[64];
    read_holder(fd, &pid, host, prog);
    return zr_err_set(ZR_EBUSY, "%s: in use by %s (pid %ld on host %s); one job per run "
                      "directory: wait for it to end or choose another directory", run_dir,
                      prog, pid, host);
}

/* No flock on this filesystem: the directory is busy when the pid written there is alive on
 * this host. */
static bool holder_alive(int fd)
{
    long pid;
    char host[256], prog[64], me[256];
    read_holder(fd, &pid, host, prog);
    host_name(me);
    return pid > 0 && pid != (long)getpid() && !strcmp(host, me) &&
           (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/* Open and lock path; 1 when the lock is ours and the file still is the one at path (a holder
 * that ended removes the file, so a lock on an unlinked file is no lock: try again). */
static int lock_once(int *fd_out, const char *run_dir, const char *path)
{
    int e = zck__fault(ZCK_OP_OPEN, path);
    int fd = e ? -1 : open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0)
        return zr_err_sys(e ? e : errno, "%s: open lock file", path);
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) { /* a FIFO planted there: never block */
        close(fd);
        return zr_err_set(ZR_ECORRUPT, "%s: the lock file is not a regular file (remove it)",
                          path);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        if (errno == EWOULDBLOCK) {
            int rc = busy(run_dir, fd);
            close(fd);
            return rc;
        }
        if (errno != ENOLCK && errno != EOPNOTSUPP && errno != ENOSYS) {
            int rc = zr_err_sys(errno, "%s: flock", path);
            close(fd);
            return rc;
        }
        if (holder_alive(fd)) {
            int rc = busy(run_dir, fd);
            close(fd);
            return rc;
        }
        zr_log(ZR_LOG_WARN, "%s: this filesystem has no flock; only the pid in the lock file "
               "keeps other jobs out", path);
    }
    struct stat a, b;
    if (fstat(fd, &a) < 0 || stat(path, &b) < 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
        close(fd);
        return 0;
    }
    *fd_out = fd;
    return 1;
}

int zck_run_lock(zck_lock **out, const char *run_dir, const char *program)
{
    zck_lock *lk = calloc(1, sizeof *lk);
    if (!lk)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    lk->fd = -1;
    int rc = zck__mkdir_p(run_dir);
    if (!rc && !(lk->path = zck_path_join(run_dir, ".lock")))
        rc = ZR_ENOMEM;
    for (int tries = 0; !rc && lk->fd < 0; tries++) {
        rc = lock_once(&lk->fd, run_dir, lk->path);
        if (rc == 0 && tries == 100)
            rc = zr_err_set(ZR_EIO, "%s: the lock file keeps being replaced", lk->path);
        rc = rc < 0 ? rc : 0;
    }
    if (rc) {
        zck_run_unlock(lk);
        return rc;
    }
    char host[256], line[512];
    host_name(host);
    int n = snprintf(line, sizeof line, "%ld %s %s\n", (long)getpid(), host,
                     program && program[0] ? program : "?");
    if (ftruncate(lk->fd, 0) < 0 || pwrite(lk->fd, line, (size_t)n, 0) != n) {
        rc = zr_err_sys(errno, "%s: write", lk->path);
        close(lk->fd);
        lk->fd = -1;
        zck_run_unlock(lk);
        return rc;
    }
    *out = lk;
    return 0;
}

void zck_run_unlock(zck_lock *lk)
{
    if (!lk)
        return;
    if (lk->fd >= 0) {
        unlink(lk->path); /* still locked: whoever opened this file before sees it is gone */
        close(lk->fd);
    }
    free(lk->path);
    free(lk);
}

int zck_run_lock_holder(char **out, const char *run_dir)
{
    *out = NULL;
    char *path = zck_path_join(run_dir, ".lock");
    if (!path)
        return ZR_ENOMEM;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    free(path);
    if (fd < 0)
        return 0;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) { /* not ours: nobody holds the run */
        close(fd);
        return 0;
    }
    int held = 0;
    if (flock(fd, LOCK_SH | LOCK_NB) < 0)
        held = errno == EWOULDBLOCK || holder_alive(fd);
    int rc = 0;
    if (held) {
        long pid;
        char host[256], prog[64];
        read_holder(fd, &pid, host, prog);
        if (asprintf(out, "%s (pid %ld on host %s)", prog, pid, host) < 0) {
            *out = NULL;
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        }
    }
    close(fd);
    return rc;
}
