/*
 * comm_tcp.h: the `tcp` backend of the communicator (comm.h), private to it: ranks on several
 * nodes, one TCP connection from every rank to rank 0 (the hub), which runs every collective.
 * comm.c checks the arguments and handles world 1; these run the collective. Same contract as
 * the shm backend: every rank calls the same collectives in the same order (a mismatch fails
 * on every rank with ZR_ECOMM, naming both calls), sums in rank order computed by one rank (the
 * hub), so the bits equal shm's; a peer that disconnects (its process died, its node's
 * launcher stopped it) fails every rank's pending and later calls with ZR_EIO naming it; no
 * timeout on a live peer. After an error only close.
 */
#ifndef ZR_COMM_TCP_H
#define ZR_COMM_TCP_H

#include "comm_be.h"

#include <stddef.h>
#include <stdint.h>

typedef struct zr_tcp zr_tcp;

/* master "HOST:PORT": rank 0 listens on PORT (every interface), the others connect to
 * HOST:PORT, retrying until timeout_s seconds have passed (nodes start at different times).
 * token: the job's, in every rank's hello; rank 0 turns away (closes) a connection with another
 * token (a stale rank of another job on the same port) and one silent for 10 s, and keeps
 * waiting for its own ranks. */
int ztcp_open(zr_tcp **out, const char *master, int rank, int world, double timeout_s,
              uint64_t token);
void ztcp_close(zr_tcp *t);
/* es: element size (4 f32, 8 f64) */
int ztcp_all_reduce(zr_tcp *t, const void *send, void *recv, size_t n, size_t es);
int ztcp_reduce_scatter(zr_tcp *t, const void *send, void *recv, size_t n, size_t es);
int ztcp_all_gather(zr_tcp *t, const void *send, void *recv, size_t bytes);
int ztcp_broadcast(zr_tcp *t, void *buf, size_t bytes, int root);
int ztcp_gather(zr_tcp *t, const void *send, void *recv, size_t bytes, int root);
int ztcp_barrier(zr_tcp *t);
/* Without waiting: ZR_EIO when a connection was closed (zr_comm_check). */
int ztcp_check(zr_tcp *t);
/* the same functions in comm.c's table (handle: a zr_tcp) */
extern const zr_comm_be ztcp_be;

#endif
