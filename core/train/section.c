/*
 * section.c: the training section of a manifest as a resumed run reads it (section.h): the
 * optimizer step and data position to continue from, and the sample-order settings the
 * checkpoint was trained with. Kept apart from the loop so the fuzz target reaches it.
 */
#include "section.h"

#include "zck.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* An absent key leaves *out as it is; 0, or -1 when the key holds something else (no error
 * set: the sample-order keys are optional, a bad one only makes the order unknown). */
static int get_u64(const json_t *j, const char *key, uint64_t *out)
{
    json_t *v = json_object_get(j, key);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* As get_u64, for a key the resume needs: a bad value is an error. */
static int json_u64(const json_t *j, const char *key, uint64_t *out)
{
    if (get_u64(j, key, out))
        return zr_err_set(ZR_ECORRUPT, "training section: '%s' is not a non-negative integer",
                          key);
    return 0;
}

/* A finite number and a non-negative integer step: *has 1 and both set. */
static void json_val(const json_t *j, const char *loss, const char *step, int *has,
                     double *out, uint64_t *out_step)
{
    json_t *l = json_object_get(j, loss), *st = json_object_get(j, step);
    *has = json_is_number(l) && isfinite(json_number_value(l)) && json_is_integer(st) &&
           json_integer_value(st) >= 0;
    if (*has) {
        *out = json_number_value(l);
        *out_step = (uint64_t)json_integer_value(st);
    }
}

/* The schedule keys (steps, warmup, lr, min_lr_ratio): *known 1 when all four are valid. */
static void json_sched(const json_t *j, zr_train__section *s)
{
    json_t *lr = json_object_get(j, "lr"), *mr = json_object_get(j, "min_lr_ratio");
    s->steps = s->warmup = 0;
    s->sched_known = json_is_integer(json_object_get(j, "steps")) &&
                     json_is_integer(json_object_get(j, "warmup")) &&
                     !get_u64(j, "steps", &s->steps) && !get_u64(j, "warmup", &s->warmup) &&
                     json_is_number(lr) && isfinite(json_number_value(lr)) &&
                     json_is_number(mr) && isfinite(json_number_value(mr));
    s->lr = s->sched_known ? json_number_value(lr) : 0;
    s->min_lr_ratio = s->sched_known ? json_number_value(mr) : 0;
}

static int dup_string(const json_t *t, const char *key, char **out)
{
    json_t *v = json_object_get(t, key);
    if (json_is_string(v) && !(*out = strdup(json_string_value(v))))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    return 0;
}

int zr_train__section_parse(zr_train__section *s, const char *json)
{
    s->order_known = s->has_val = s->has_best = s->sched_known = 0;
    s->data = s->run_id = s->val_set = NULL;
    json_error_t je;
    json_t *t = json_loads(json, 0, &je);
    if (!t)
        return zr_err_set(ZR_ECORRUPT, "training section: not JSON (line %d: %s)",
                          je.line, je.text);
    int rc = json_u64(t, "optimizer_step", &s->optimizer_step);
    if (!rc)
        rc = json_u64(t, "next_sample", &s->next_sample);
    if (!rc)
        s->order_known = !get_u64(t, "seed", &s->seed) && !get_u64(t, "batch", &s->batch) &&
                         !get_u64(t, "seq", &s->seq);
    if (!rc)
        rc = dup_string(t, "data", &s->data);
    if (!rc)
        rc = dup_string(t, "run_id", &s->run_id);
    if (!rc)
        rc = dup_string(t, "val_set", &s->val_set);
    json_sched(t, s);
    json_val(t, "val_loss", "val_step", &s->has_val, &s->val_loss, &s->val_step);
    json_val(t, "best_val_loss", "best_val_step", &s->has_best, &s->best_val_loss,
             &s->best_val_step);
    json_decref(t);
    return rc;
}

void zr_train__section_clear(zr_train__section *s)
{
    free(s->data);
    free(s->run_id);
    free(s->val_set);
    s->data = s->run_id = s->val_set = NULL;
}
