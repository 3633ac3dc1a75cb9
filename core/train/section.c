/*
 * section.c: the training section of a manifest as a resumed run reads it (section.h): the
 * optimizer step and data position to continue from, and the sample-order settings the
 * checkpoint was trained with. Kept apart from the loop so the fuzz target reaches it.
 */
#include "section.h"

#include "zck.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* An absent key leaves *out as it is. */
static int json_u64(const json_t *j, const char *key, uint64_t *out)
{
    json_t *v = json_object_get(j, key);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return zr_err_set(ZR_ECORRUPT, "training section: '%s' is not a non-negative integer",
                          key);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

int zr_train__section_parse(zr_train__section *s, const char *json)
{
    s->order_known = 0;
    s->data = s->run_id = NULL;
    json_error_t je;
    json_t *t = json_loads(json, 0, &je);
    if (!t)
        return zr_err_set(ZR_ECORRUPT, "training section unreadable");
    int rc = json_u64(t, "optimizer_step", &s->optimizer_step);
    if (!rc)
        rc = json_u64(t, "next_sample", &s->next_sample);
    if (!rc)
        s->order_known = !json_u64(t, "seed", &s->seed) && !json_u64(t, "batch", &s->batch) &&
                         !json_u64(t, "seq", &s->seq);
    json_t *dv = json_object_get(t, "data");
    if (!rc && json_is_string(dv) && !(s->data = strdup(json_string_value(dv))))
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    json_t *id = json_object_get(t, "run_id");
    if (!rc && json_is_string(id) && !(s->run_id = strdup(json_string_value(id))))
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    json_decref(t);
    return rc;
}

void zr_train__section_clear(zr_train__section *s)
{
    free(s->data);
    free(s->run_id);
    s->data = s->run_id = NULL;
}
