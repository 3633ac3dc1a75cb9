/*
 * zero_new.c: zr_zero_new (zero.h), the one place that picks an engine: the host engine
 * (zero.c) without a device, the device engine (zero_dev.c) with one. Both engines use the common
 * part (zero_common.c) and neither knows the other; this file sits above the three, so no two
 * objects of core/zero depend on each other.
 */
#include "zero_int.h"

int zr_zero_new(zr_zero **out, zr_comm *comm, const zck_layout *L, const zr_zero_opts *o,
                const zr_device_ops *dev, zr_dev_comm *dc)
{
    *out = NULL;
    if (o->stage < 0 || o->stage > 3)
        return zr_err_set(ZR_EINVAL, "--zero %d: expected 0..3", o->stage);
    return dev ? zr__zero_dev_new(out, comm, L, o, dev, dc) : zr__zero_host_new(out, comm, L, o);
}
