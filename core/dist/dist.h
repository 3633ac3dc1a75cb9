/*
 * dist.h: the distributed runtime's public part (in zr.h): the launcher that starts the ranks
 * of a job on this node (or one node of several). Nothing in core/dist/ knows of models.
 */
#ifndef ZR_DIST_H
#define ZR_DIST_H

#include "zck.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- launcher */

/*
 * Run nproc ranks of a program on this node (shm communicator) and wait for them.
 * zr_launch creates the communicator segment (nproc > 1), then starts nproc children that
 * execve(argv[0], argv) (a path: no PATH search) with ZR_RANK=r, ZR_WORLD=nproc,
 * ZR_LOCAL_RANK=r and ZR_COMM_SHM=<segment name> in their environment (ZR_COMM_SHM absent at
 * nproc 1; several nodes: see nnodes below), stdin on
 * /dev/null, every descriptor above 2 closed, each in a process group of its own (so a terminal's Ctrl-C reaches the launcher
 * alone, which forwards it once), and a parent-death signal of SIGTERM.
 *
 * Output (nproc > 1): each rank's stdout and stderr come through pipes and are copied line by
 * line to the launcher's stdout and stderr, each line prefixed "[rank r] "; stderr of every
 * rank is shown, stdout of rank 0 only unless log_all_ranks. A partial last line is completed
 * with a newline at EOF; a line longer than 64 KiB is cut into lines of 64 KiB. At nproc 1 the
 * child writes to the launcher's stdout and stderr directly (no prefix, no pipes).
 *
 * Signals: SIGINT, SIGTERM and SIGUSR1 received by the launcher while it runs are forwarded to
 * every rank's process group (zr_launch installs handlers for them and SIGCHLD and restores the
 * previous ones before it returns; one zr_launch at a time per process).
 *
 * Failure: when a rank exits non-zero or is killed while others run, the launcher marks the
 * segment aborted (the others' collectives fail at once naming that rank), prints
 * "zrun: rank R exited with status S" or "zrun: rank R was killed by signal N (SIGKILL)" to
 * stderr (nproc > 1; the first failing rank only), sends SIGTERM to every rank's process group,
 * and SIGKILL to what is left after kill_grace_s seconds (at once when kill_grace_s <= 0).
 *
 * *exit_code: 0 when every rank exited 0; otherwise the first failing rank's status as a shell
 * reports it: its exit status, or 128 + N when killed by signal N. The segment is unlinked
 * before zr_launch returns, in every case. Returns 0 when the ranks ran (whatever they
 * returned), or ZR_EINVAL / ZR_EIO / ZR_ENOMEM when the launch itself failed (options, shared
 * memory, pipes, fork); ranks already started are then killed and reaped. A rank whose execve
 * fails prints why and exits 127.
 */
typedef struct {
    int nproc;           /* ranks, >= 1 */
    int log_all_ranks;   /* show every rank's stdout, not only rank 0's */
    double kill_grace_s; /* SIGTERM to SIGKILL, after a failure */
    /* several nodes (nnodes > 1): this launcher runs global ranks node_rank nproc ..
     * node_rank nproc + nproc - 1 of a world of nnodes nproc, connected over TCP through
     * master ("HOST:PORT", where global rank 0 listens) instead of shared memory
     * (ZR_COMM_TCP in the ranks' environment); output prefixes and messages name global
     * ranks. The other nodes' launchers are started the same way; a rank that fails on one
     * node makes the ranks of the others fail when their connections close. */
    int nnodes, node_rank;
    const char *master;
} zr_launch_opts;
#define ZR_LAUNCH_OPTS_INIT {.nproc = 1, .log_all_ranks = 0, .kill_grace_s = 5.0, .nnodes = 1, .node_rank = 0}

int zr_launch(int *exit_code, const zr_launch_opts *o, char *const argv[]);

#ifdef __cplusplus
}
#endif
#endif
