/*
 * zr.h: the public interface of core/, the training engine. It gathers the public parts of the
 * engine's folders:
 *   model/model.h   model configuration, the GPT-2 model, AdamW, the LR schedule, token data
 *   train/train.h   the training loop, its options, the dry run's memory plan
 *   dist/dist.h     the launcher of a job's ranks
 * Everything else in core/ (communicators, devices, the ZeRO engines, the saver) is internal.
 * core/ uses only ckpt/'s public API (zck.h) and never includes formats/.
 *
 * Conventions are ckpt's: 0 or a negative ZR_E* code with a one-line message (zr_err_msg()),
 * outputs through the first argument, the library never prints errors and never exits (the
 * training loop's per-step log line goes to a caller-chosen stream).
 */
#ifndef ZR_H
#define ZR_H

#include "model/model.h"
#include "train/train.h"
#include "dist/dist.h"

#endif
