/*
 * supervise.c: the restart supervisor behind `zrun --max-restarts`. It starts the ranks
 * (zr_launch); when the job fails and restarts are left, it picks the checkpoint to resume from
 * with the one resume policy of ckpt/ (zck_resume_pick: the newest checkpoint that verifies,
 * damaged newer ones moved aside) and starts the ranks again from it, with --resume PATH and
 * --nproc N appended to their arguments, after the backoff. Each restart is told with its
 * cause.
 */
#include "dist.h"
#include "train.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void say(const zr_supervise_opts *o, const char *fmt, ...)
{
    if (!o->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (o->name)
        fprintf(o->log, "%s: ", o->name);
    vfprintf(o->log, fmt, ap);
    fputc('\n', o->log);
    fflush(o->log);
    va_end(ap);
}

static void say_line(void *ctx, const char *line)
{
    say(ctx, "%s", line);
}

static int check_supervise_opts(const zr_supervise_opts *o, char *const argv[])
{
    if (!argv || !argv[0])
        return zr_err_set(ZR_EINVAL, "supervise: no program arguments");
    if (o->nproc < 1 || o->nproc_on_restart < 0)
        return zr_err_set(ZR_EINVAL, "supervise: %d ranks (%d on restart): expected >= 1",
                          o->nproc, o->nproc_on_restart);
    if (!(o->backoff_s >= 0 && o->backoff_s <= 86400))
        return zr_err_set(ZR_EINVAL, "supervise: backoff %g s: expected 0..86400",
                          o->backoff_s);
    if (o->max_restarts && (!o->ckpt_dir || !o->ckpt_dir[0]))
        return zr_err_set(ZR_EINVAL, "supervise: restarts need the run directory (ckpt_dir)");
    if (o->verify < ZR_VERIFY_FULL || o->verify > ZR_VERIFY_OFF)
        return zr_err_set(ZR_EINVAL, "supervise: verify mode %d: expected 0..2", o->verify);
    return 0;
}

/* Sleep s seconds, or less when *stop is set. */
static void backoff(double s, volatile int *stop)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && !(stop && *stop))
        ;
}

int zr_supervise(int *exit_code, const zr_supervise_opts *o, char *const argv[])
{
    *exit_code = 0;
    ZR_TRY(check_supervise_opts(o, argv));
    char self[4096];
    const char *prog = o->program;
    if (!prog) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
            return zr_err_set(ZR_ERROR, "cannot find this program's path (/proc/self/exe)");
        self[n] = 0;
        prog = self;
    }
    size_t argc = 0;
    while (argv[argc])
        argc++;
    /* room for the arguments a restart appends: --resume PATH --nproc N */
    char **args = calloc(argc + 5, sizeof *args);
    if (!args)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    memcpy(args, argv, argc * sizeof *args);
    args[0] = (char *)prog;
    char *resume = NULL, nbuf[16];
    int rc = 0, nproc = o->nproc;
    for (unsigned attempt = 0;; attempt++) {
        zr_launch_opts lo = ZR_LAUNCH_OPTS_INIT;
        lo.nproc = nproc;
        lo.log_all_ranks = o->log_all_ranks;
        lo.nnodes = o->nnodes;
        lo.node_rank = o->node_rank;
        lo.master = o->master;
        if ((rc = zr_launch(exit_code, &lo, args)) < 0 || *exit_code == 0 ||
            attempt >= o->max_restarts)
            break;
        /* the job failed: restart from the newest sound checkpoint */
        free(resume);
        resume = NULL;
        zck_resume_opts ro = ZCK_RESUME_OPTS_INIT;
        ro.verify = o->verify;
        ro.jobs = o->jobs ? o->jobs : 1;
        ro.say = say_line;
        ro.say_ctx = (void *)o;
        if ((rc = zck_resume_pick(&resume, o->ckpt_dir, &ro)) < 0)
            break;
        if (o->nproc_on_restart)
            nproc = o->nproc_on_restart;
        say(o, "restart %u of %u after the job failed (exit status %d): %s%s with %d rank%s in "
               "%.1f s", attempt + 1, o->max_restarts, *exit_code,
            resume ? "resuming from " : "starting over (no checkpoint yet)",
            resume ? resume : "", nproc, nproc == 1 ? "" : "s", o->backoff_s);
        backoff(o->backoff_s, o->stop);
        if (o->stop && *o->stop)
            break;
        size_t k = argc;
        if (resume) {
            args[k++] = "--resume";
            args[k++] = resume;
        }
        snprintf(nbuf, sizeof nbuf, "%d", nproc);
        args[k++] = "--nproc";
        args[k++] = nbuf;
        args[k] = NULL;
    }
    free(resume);
    free(args);
    return rc;
}
