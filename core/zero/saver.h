/*
 * saver.h: core-internal asynchronous checkpoint writer (not part of zr.h). A save is split in
 * two: a snapshot (this rank's partitions of param, exp_avg and exp_avg_sq copied into a host
 * staging area: the only part training waits for) and a background write (a thread streams the
 * staging area into the rank's shard file through zck_writer: hashing, fsync). Two staging
 * areas, allocated when first needed and reused (huge pages advised), so that the next save's
 * snapshot can be taken while the previous one is still being written. At most one write runs
 * at a time; the trainer commits each save (rank 0, after every rank's shard is durable) before
 * it starts the next write, so checkpoints land in step order.
 */
#ifndef ZR_SAVER_H
#define ZR_SAVER_H

#include "zero.h"

typedef struct zr_saver zr_saver;

int zr_saver_new(zr_saver **out, const zck_layout *L, int world, int rank);
/* Joins a running write (its result is dropped: the caller stops without committing it). */
void zr_saver_free(zr_saver *s);

/* Allocate and fault in the first staging area now (before training), so that saves do not
 * pay for it. */
int zr_saver_prepare(zr_saver *s, zr_zero *z);
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
/* Time the trainer was blocked by the last snapshot, seconds. */
double zr_saver_snapshot_s(const zr_saver *s);

#endif
