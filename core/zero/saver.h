/*
 * saver.h: core-internal asynchronous checkpoint writer (not part of zr.h). A save is split in
 * two: a snapshot (this rank's partitions of param, exp_avg and exp_avg_sq copied into a host
 * staging area: the only part training waits for) and a background write (a thread streams the
 * staging area into the rank's shard file through zck_writer: hashing, fsync). Two staging
 * areas, allocated when first needed and reused (huge pages advised), so that the next save's
 * snapshot can be taken while the previous one is still being written. At most one write runs
 * at a time; the trainer commits each save (rank 0, after every rank's shard is durable) before
 * it starts the next write, so checkpoints land in step order.
 *
 * Live mode (a host engine with its states in memory, zr_zero_live_saves): no copy. The
 * snapshot only lists this rank's partitions in chunks of 64 KiB pointing into the live state
 * arrays, which the next forward and backward do not change; the writer streams them from
 * there, hashing as it writes. Before the next optimizer update the trainer calls
 * zr_saver_protect: the chunks not yet written are copied into a bounded buffer (the last ones
 * first) while it has room, and the update waits for the writer to take the others from the
 * live arrays. The file holds exactly the state at the save step, whatever the disk's speed;
 * memory: the buffer, not a copy of the states. The next snapshot waits for the running write.
 */
#ifndef ZR_SAVER_H
#define ZR_SAVER_H

#include "zero.h"

typedef struct zr_saver zr_saver;

/* buffer: live mode's bound, bytes (0: zr_saver_default_buffer of the rank's states). */
int zr_saver_new(zr_saver **out, const zck_layout *L, int world, int rank, size_t buffer);
/* The default bound: the larger of 64 MiB and 5 % of part_floats' bytes. */
size_t zr_saver_default_buffer(uint64_t part_floats);
/* Joins a running write (its result is dropped: the caller stops without committing it). */
void zr_saver_free(zr_saver *s);

/* Choose the mode for z's engine and allocate and fault in the first staging area now (live
 * mode: the bounded buffer, at most the rank's states), so that saves do not pay for it. */
int zr_saver_prepare(zr_saver *s, zr_zero *z);
/* Host bytes of staging allocated (after prepare: the bounded buffer, or one area). */
size_t zr_saver_buffer_bytes(const zr_saver *s);
/* Copy this rank's partitions into a free staging area (the one the running write does not
 * read). Fails if a snapshot is already waiting for its write. */
int zr_saver_snapshot(zr_saver *s, zr_zero *z);
/* Start writing the waiting snapshot into staging_dir in the background. Fails if a write is
 * running (zr_saver_wait first) or no snapshot waits. */
int zr_saver_write(zr_saver *s, const char *staging_dir);

enum { ZR_SAVER_IDLE = 0, ZR_SAVER_WRITING = 1, ZR_SAVER_DONE = 2 };
/* The running (or last) write: IDLE (none since the last zr_saver_take), WRITING, DONE (the
 * shard is durable), or its error code (negative, with the message set as the error). */
int zr_saver_status(zr_saver *s);
/* Block until the write is no longer WRITING; returns the status as above. */
int zr_saver_wait(zr_saver *s);
/* After DONE: the shard's description (zck_shard_to_json text, malloc'ed, caller frees), and
 * the saver goes back to IDLE. */
int zr_saver_take(zr_saver *s, char **shard_json);
/* Live mode, before every optimizer update: no chunk of the running write left in the live
 * arrays (copied into the buffer, or written). A no-op otherwise. A failed write is not
 * waited for (its error comes from zr_saver_wait). */
int zr_saver_protect(zr_saver *s);
/* The last protect: chunks copied into the buffer and the seconds it took. */
void zr_saver_protect_stats(const zr_saver *s, size_t *copied, double *secs);
/* Time the trainer was blocked by the last snapshot, seconds. */
double zr_saver_snapshot_s(const zr_saver *s);

#endif
