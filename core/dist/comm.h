/*
 * comm.h: core-internal communicator on flat buffers (not part of zr.h; the trainer and the
 * tests use it). One interface, backends behind it: `shm` (ranks of one node, POSIX shared
 * memory), `mpi` (ranks started by mpirun or srun: libzr_mpi.so, comm_mpi.c, loaded at run
 * time) and `tcp` (ranks on several nodes without MPI, a star through rank 0). Device buffers move
 * through the device's own communicator (device.h, NCCL), not this one.
 *
 * Conventions (ckpt's): 0 or a negative ZR_E* code with a one-line message (zr_err_msg()).
 * Every rank must call the same collectives in the same order with the same sizes; a call that
 * does not match the other ranks' (op, count, dtype or element size, root) fails on every rank
 * with ZR_ECOMM ("collective mismatch: ..."). A peer that dies or fails (its process exits or
 * is killed, the launcher marks the job aborted, the launcher itself disappears) makes every
 * pending and later call on the other ranks return ZR_EIO within seconds with a message naming
 * the rank ("rank 2 (pid 1234) died (exited with status 7)", "rank 1 exited with status 3
 * (reported by the launcher)"); no call hangs, and there is no timeout on a live peer. After
 * such an error the communicator may only be closed. A communicator is used by one thread at a
 * time (any thread) and is not carried across fork(); argument errors (ZR_EINVAL) are found
 * before any synchronization and leave it usable.
 *
 * Reductions are sums. Determinism: element i of a reduction is computed as
 * ((x_0 + x_1) + x_2) + ... + x_{W-1} in rank order, by one rank, and the same bits reach every
 * rank; so all_reduce(x) has exactly the bits of reduce_scatter(x) followed by all_gather, and a
 * result never depends on timing or chunking.
 *
 * Sizes are counts of elements (dtype) except for broadcast/gather (bytes). Any size streams
 * through the bounded shared segment in chunks; a count of 0 is a no-op that synchronizes
 * nothing (returns 0 at once, on every rank). Worlds of up to 1024 ranks.
 */
#ifndef ZR_COMM_H
#define ZR_COMM_H

#include "zck.h"

#include <stddef.h>
#include <stdint.h>

typedef enum { ZR_COMM_F32 = 0, ZR_COMM_F64 = 1 } zr_comm_dtype;

typedef struct zr_comm zr_comm;

/*
 * The communicator of this process. With ZR_WORLD unset (or 1) in the environment: a world of
 * one (every collective is a copy or a no-op). Otherwise the launcher's rendezvous:
 * ZR_RANK (0..W-1), ZR_WORLD (W) and ZR_COMM_SHM (the name of the shared segment created by
 * zr_comm_shm_create). ZR_EINVAL naming the variable when one is missing or malformed;
 * ZR_EIO when the segment cannot be opened or does not match (world, version).
 * With ZR_COMM_TCP=HOST:PORT instead (ranks on several nodes, zrun --nnodes): the `tcp`
 * backend (comm_tcp.h): rank 0 listens on PORT, the others connect to HOST:PORT, waiting up to
 * ZR_COMM_TCP_TIMEOUT seconds (300) for each other; the same calls, bits and failure rules.
 * With ZR_COMM=mpi: the `mpi` backend, libzr_mpi.so next to the running program (ZR_EUNSUPPORTED
 * when it is missing or cannot be loaded), MPI_Init_thread, rank and world from MPI (ZR_EINVAL
 * when ZR_RANK or ZR_WORLD, set, disagree); the same calls and bits; a dead peer ends the job
 * through mpirun / srun (a call may first fail with ZR_EIO); ZR_COMM_MPI_WINDOW (bytes, default
 * 64 MiB) bounds one message. After an error, close skips MPI_Finalize. One per process.
 */
int zr_comm_open_env(zr_comm **out);
void zr_comm_close(zr_comm *c);
/* The communicator zr_comm_open_env opened in this process and has not closed (NULL: none);
 * the host-simulated device's communicator rides on it (device.h, ZR_HOSTSIM_LIB). */
zr_comm *zr_comm_env(void);
int zr_comm_rank(const zr_comm *c);
int zr_comm_world(const zr_comm *c);

/* recv[i] = sum over ranks of send[i], on every rank, n elements; send == recv (in place) ok. */
int zr_comm_all_reduce(zr_comm *c, const void *send, void *recv, size_t n, zr_comm_dtype dt);
/* recv[0, n) on rank r = sum over ranks of send[r n, (r+1) n); send holds W n elements.
 * In place: recv == (char *)send + r n elements. */
int zr_comm_reduce_scatter(zr_comm *c, const void *send, void *recv, size_t n,
                           zr_comm_dtype dt);
/* recv[q n, (q+1) n) = send of rank q, for every q; n elements of elem_bytes each.
 * In place: send == (char *)recv + r n elements. */
int zr_comm_all_gather(zr_comm *c, const void *send, void *recv, size_t n, size_t elem_bytes);
/* buf (bytes) of rank root reaches every rank's buf. */
int zr_comm_broadcast(zr_comm *c, void *buf, size_t bytes, int root);
/* Small records: recv[q bytes, (q+1) bytes) at root = send of rank q (recv used at root only). */
int zr_comm_gather(zr_comm *c, const void *send, void *recv, size_t bytes, int root);
int zr_comm_barrier(zr_comm *c);
/* Without waiting: ZR_EIO (the communicator then dead, as after a failed call) when a peer is
 * known to be gone (shm: the launcher's abort record, a dead process; tcp: a closed
 * connection), else 0. For callers blocked elsewhere (a device communicator's wait). */
int zr_comm_check(zr_comm *c);

/*
 * For the launcher (zr_launch) and tests that start ranks themselves: create a fresh segment
 * for `world` ranks with a data area of seg_bytes per rank (0: the default, 4 MiB; at least
 * 256 bytes per rank of the world, rounded up to whole pages), named *name_out ("/zr-<pid>-<hex>",
 * caller frees), its memory reserved at once (a full /dev/shm fails here with ZR_EIO, not
 * later), and unlink it when done with zr_comm_shm_unlink. The creating process counts as the
 * launcher: ranks fail when it is gone (unless it is one of the ranks). The creator may mark
 * the job aborted (a rank died with `status` as wait() reports it): waiting ranks wake at once,
 * and every rank's pending and later calls fail naming `rank`; the first abort stays.
 */
int zr_comm_shm_create(char **name_out, int world, size_t seg_bytes);
/* Whether a job of `world` ranks is within what the communicators take (1..1024): 0, or
 * ZR_EINVAL naming the limit. */
int zr_comm_check_world(int world);
void zr_comm_shm_abort(const char *name, int rank, int status);
void zr_comm_shm_unlink(const char *name);
/* Unlink this user's segments in /dev/shm whose creating launcher is dead (a launcher killed by
 * SIGKILL leaves its segment behind); zr_comm_shm_create calls it. Returns how many. */
int zr_comm_shm_reclaim(void);

/* buf[cap] = the directory of the running executable + "/" + file (where the loadable
 * backends live: libzr_mpi.so, libzr_cuda.so). */
int zr__next_to_exe(char *buf, size_t cap, const char *file);
/* Load the backend at path (dlopen RTLD_NOW, RTLD_GLOBAL when global, else RTLD_LOCAL) and
 * look up symbol: *sym, NULL when the object lacks it. ZR_EUNSUPPORTED "<who>: cannot load the
 * <what>: <dlerror>" when it does not load. The object stays loaded. */
int zr__backend_load(void **sym, const char *path, const char *symbol, int global,
                     const char *who, const char *what);

/* The name of signal s ("SIGKILL"), for messages about ranks that died (comm, launcher). */
const char *zr__signal_name(int s);

#endif
