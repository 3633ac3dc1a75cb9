/*
 * sample.h: internal to core/train: the samples zrun --sample-every prints during training.
 * Every rank takes part (at ZeRO-3 the parameters exist only as partitions): begin (local: the
 * buffers, and this rank's partitions of the parameters from the engine), gather (collective:
 * each rank's partitions reach rank 0), text (local, rank 0: a greedy continuation of the
 * prompt with the KV-cache generator). The caller agrees on the local results between phases,
 * so a rank that failed never leaves the others waiting in a collective.
 */
#ifndef ZR_TRAIN_SAMPLE_H
#define ZR_TRAIN_SAMPLE_H

#include "model.h"
#include "zero.h"

typedef struct zr_train__sampler zr_train__sampler;

/* The samples' text codec: the caller's (ops and the context its open made), or bytes (ops
 * NULL: the prompt's bytes are its ids, ids decode to bytes, >= 256 as <|id|>). */
typedef struct {
    const struct zr_text_codec *ops;
    void *ctx;
} zr_train__codec;

/* The prompt's checks against the model (zr_train__check_opts refused an empty prompt and
 * --sample-tokens 0): encodes to some tokens, at most ctx, each id below the vocabulary.
 * ZR_EINVAL naming --prompt. */
int zr_train__sample_check(const zr_gpt2_config *c, const char *prompt,
                           const zr_train__codec *tc);
int zr_train__sample_begin(zr_train__sampler **out, zr_zero *z, const zck_layout *L,
                           const zr_gpt2_config *c, int rank, int W);
int zr_train__sample_gather(zr_train__sampler *s, zr_zero *z);
/* Rank 0: the prompt continued by `tokens` greedy tokens, decoded by tc: *text malloc'ed
 * (NUL-terminated, *len bytes; prompt and continuation), *ids malloc'ed [tokens]. */
int zr_train__sample_text(zr_train__sampler *s, const char *prompt, const zr_train__codec *tc,
                          uint32_t tokens, char **text, size_t *len, int32_t **ids);
void zr_train__sample_free(zr_train__sampler *s);

#endif
