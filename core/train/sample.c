/*
 * sample.c: zrun --sample-every (sample.h). The full parameters are put together on rank 0 at
 * every stage the same way: each rank takes its checkpoint partitions of the "param" state from
 * the engine (zr_zero_save_to, which also reads device memory and swap files), then for every
 * group each rank in turn broadcasts its partition (the checkpoint's partition rule says where
 * it goes), rank 0 keeping them in a full arena and the other ranks passing them through one
 * scratch buffer. Rank 0 then decodes greedily, so the sample depends on the parameters alone:
 * the same for every world size and stage that trained the same bits.
 */
#include "sample.h"
#include "train.h"
#include "train_int.h"

#include <stdlib.h>
#include <string.h>

struct zr_train__sampler {
    zr_gpt2_config c;
    const zck_layout *L;
    int rank, W;
    uint64_t *goff;      /* [ng]: where group g starts in the arena (rank 0), or where this
                            rank's partition of it starts in its packed buffer (others) */
    uint64_t *lo;        /* [ng]: this rank's partition's first element */
    float *full;         /* rank 0: the whole arena (numel floats); others: own partitions */
    float *scratch;      /* others: the largest partition of any group */
    /* the sink's position while the engine writes */
    size_t g, state;
    uint64_t at, left;
};

/* The ids of prompt through tc (*ids malloc'ed). */
static int encode(const zr_train__codec *tc, const char *prompt, int32_t **ids, size_t *n)
{
    size_t len = strlen(prompt);
    if (tc && tc->ops)
        return tc->ops->encode(tc->ctx, prompt, len, ids, n);
    *n = len;
    return zr_gen_bytes_encode(ids, prompt, len);
}

int zr_train__sample_check(const zr_gpt2_config *c, const char *prompt,
                           const zr_train__codec *tc)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = encode(tc, prompt, &ids, &n);
    if (rc)
        zr_err_prefix("--prompt: ");
    else if (!n)
        rc = zr_err_set(ZR_EINVAL, "--prompt: no tokens");
    else if (n > c->ctx)
        rc = zr_err_set(ZR_EINVAL, "--prompt: %zu %s, more than the model's context of %u", n,
                        tc && tc->ops ? "tokens" : "bytes", c->ctx);
    for (size_t i = 0; !rc && i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= c->vocab)
            rc = zr_err_set(ZR_EINVAL, "--prompt: %s %zu (%d) is not below the model's "
                            "vocabulary of %u", tc && tc->ops ? "token" : "byte", i, ids[i],
                            c->vocab);
    free(ids);
    return rc;
}

/* the sink of zr_zero_save_to: the param state's extents into the arena (rank 0) or into the
 * same places of this rank's own buffer; the optimizer's states are passed over */
static int sink_begin(void *ctx, size_t g, size_t state, uint64_t start, uint64_t count)
{
    zr_train__sampler *s = ctx;
    s->g = g;
    s->state = state;
    s->at = s->goff[g] + (s->rank ? start - s->lo[g] : start);
    s->left = count;
    return 0;
}

static int sink_write(void *ctx, const void *data, size_t bytes)
{
    zr_train__sampler *s = ctx;
    size_t n = bytes / sizeof(float);
    if (bytes % sizeof(float) || n > s->left)
        return zr_err_set(ZR_ERROR, "sample: the engine wrote %zu bytes into an extent of %llu "
                          "floats", bytes, (unsigned long long)s->left);
    if (s->state == 0)
        memcpy(s->full + s->at, data, bytes);
    s->at += n;
    s->left -= n;
    return 0;
}

int zr_train__sample_begin(zr_train__sampler **out, zr_zero *z, const zck_layout *L,
                           const zr_gpt2_config *c, int rank, int W)
{
    *out = NULL;
    zr_train__sampler *s = calloc(1, sizeof *s);
    size_t ng = zck_layout_n_groups(L);
    if (!s || !(s->goff = calloc(ng, sizeof *s->goff)) || !(s->lo = calloc(ng, sizeof *s->lo))) {
        zr_train__sample_free(s);
        return zr_err_set(ZR_ENOMEM, "sample: out of memory");
    }
    s->c = *c;
    s->L = L;
    s->rank = rank;
    s->W = W;
    /* rank 0: the whole arena; a rank r > 0: its own partitions packed, and one scratch
     * partition for what the others broadcast */
    uint64_t numel = 0, biggest = 0;
    for (size_t g = 0; g < ng; g++) {
        uint64_t lo, n, first;
        zck_partition(zck_layout_group_numel(L, g), (uint32_t)W, 0, ZR_ZERO_ALIGN, &lo, &n);
        biggest = n > biggest ? n : biggest;
        zck_partition(zck_layout_group_numel(L, g), (uint32_t)W, (uint32_t)rank, ZR_ZERO_ALIGN,
                      &first, &n);
        s->lo[g] = first;
        s->goff[g] = numel;
        numel += rank ? n : zck_layout_group_numel(L, g);
    }
    s->full = malloc((numel ? numel : 1) * sizeof(float));
    s->scratch = rank ? malloc((biggest ? biggest : 1) * sizeof(float)) : NULL;
    if (!s->full || (rank && !s->scratch)) {
        zr_train__sample_free(s);
        return zr_err_set(ZR_ENOMEM, "sample: out of memory for %.1f MiB of parameters",
                          (double)numel * sizeof(float) / (1 << 20));
    }
    zr_zero_sink k = {s, sink_begin, sink_write};
    int rc = zr_zero_save_to(z, &k);
    if (rc) {
        zr_train__sample_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int zr_train__sample_gather(zr_train__sampler *s, zr_zero *z)
{
    if (s->W == 1)
        return 0;
    for (size_t g = 0; g < zck_layout_n_groups(s->L); g++)
        for (int q = 0; q < s->W; q++) {
            uint64_t lo, n;
            zck_partition(zck_layout_group_numel(s->L, g), (uint32_t)s->W, (uint32_t)q,
                          ZR_ZERO_ALIGN, &lo, &n);
            if (!n)
                continue;
            float *buf = s->rank == 0 ? s->full + s->goff[g] + lo
                         : s->rank == q ? s->full + s->goff[g] : s->scratch;
            ZR_TRY(zr_zero_broadcast(z, buf, n * sizeof(float), q));
        }
    return 0;
}

int zr_train__sample_text(zr_train__sampler *s, const char *prompt, const zr_train__codec *tc,
                          uint32_t tokens, char **text, size_t *len, int32_t **ids)
{
    *text = NULL;
    *ids = NULL;
    int32_t *p = NULL, *all = NULL;
    size_t np = 0;
    zr_gen *g = NULL;
    int rc = encode(tc, prompt, &p, &np);
    if (!rc && !(all = malloc((np + tokens) * sizeof *all)))
        rc = zr_err_set(ZR_ENOMEM, "sample: out of memory");
    if (!rc)
        rc = zr_gen_new(&g, &s->c, s->full);
    if (!rc) {
        memcpy(all, p, np * sizeof *p);
        zr_sample_opts o = ZR_SAMPLE_OPTS_INIT;
        o.temperature = 0; /* greedy: the most likely continuation, no randomness */
        rc = zr_gen_run(g, all + np, all, np, tokens, &o);
    }
    zr_gen_free(g);
    free(p);
    size_t n = np + tokens;
    if (!rc && tc && tc->ops) {
        rc = tc->ops->decode(tc->ctx, all, n, text, len);
    } else if (!rc) {
        if (!(*text = malloc(16 * n + 1)))
            rc = zr_err_set(ZR_ENOMEM, "sample: out of memory");
        else
            *len = zr_gen_bytes_decode(*text, 16 * n + 1, all, n);
    }
    if (rc) {
        free(all);
        return rc;
    }
    memmove(all, all + np, tokens * sizeof *all);
    *ids = all;
    return 0;
}

void zr_train__sample_free(zr_train__sampler *s)
{
    if (!s)
        return;
    free(s->goff);
    free(s->lo);
    free(s->full);
    free(s->scratch);
    free(s);
}

const char *zr_train__sample_prompt(const zr_train_opts *o)
{
    return o->sample_prompt ? o->sample_prompt : "the ";
}

/* Every sample_every steps: the parameters gathered to rank 0 (every rank takes part), which
 * prints the greedy continuation of the prompt after the step line and logs it as an event. */
int zr_train__sample_now(run *r)
{
    const zr_train_opts *o = r->o;
    if (!o->sample_every || r->step % o->sample_every)
        return 0;
    zr_train__sampler *s = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t len = 0;
    int rc = zr_train__agree(r, zr_train__sample_begin(&s, r->zero, r->L, &r->cfg, r->rank, r->W));
    if (!rc)
        rc = zr_train__sample_gather(s, r->zero);
    if (!rc)
        rc = zr_train__agree(r, r->rank == 0
                                    ? zr_train__sample_text(s, zr_train__sample_prompt(o),
                                                            &r->codec, o->sample_tokens, &text,
                                                            &len, &ids)
                                    : 0);
    zr_train__sample_free(s);
    if (rc || r->rank != 0)
        return rc;
    const char *pr = zr_train__sample_prompt(o);
    size_t plen = strlen(pr);
    if (r->log) { /* one line: control characters (newlines too) shown as '?' */
        char *p = malloc(len + 1);
        for (size_t i = 0; p && i <= len; i++)
            p[i] = i < len && !text[i] ? '?' : text[i];
        if (p)
            fprintf(r->log, "sample at step %llu: %s\n", (unsigned long long)r->step,
                    zr_printable(p, len + 1, p));
        free(p);
    }
    char *u = malloc(3 * (len + plen) + 2), *up = u ? u + 3 * len + 1 : NULL;
    if (u && r->jlog) {
        char when[32];
        json_t *a = json_array();
        for (uint32_t i = 0; i < o->sample_tokens; i++)
            json_array_append_new(a, json_integer(ids[i]));
        json_t *j = json_pack("{s:s, s:I, s:o, s:o, s:o, s:s, s:s}", "event", "sample", "step",
                              (json_int_t)r->step, "prompt",
                              json_stringn(up, zr_gen_utf8_repair(up, pr, plen)), "ids", a,
                              "text", json_stringn(u, zr_gen_utf8_repair(u, text, len)),
                              "time", iso_time(when), "run_id", r->run_id);
        char *line = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (line)
            fprintf(r->jlog, "%s\n", line);
        zr_train__json_log_flush(r);
        free(line);
        json_decref(j);
    }
    free(u);
    free(text);
    free(ids);
    return 0;
}
