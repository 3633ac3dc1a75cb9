/*
 * collective.c: the trainer's collectives (train_int.h): a broadcast, a gather of doubles, a
 * message one rank sends to all, and agree(), through which every rank learns the first failing
 * rank's error. Through the ZeRO comm thread once it runs, on the communicator directly before.
 */
#include "train_int.h"

#include <stdlib.h>
#include <string.h>

/*
 * A message that one rank sends to all: status (0 or a ZR_E* code) and text (a path, a shard
 * description or an error message). Every rank calls it with the same root; *text_out is the
 * root's text (malloc'ed). Returns the root's status, with its message set as the error.
 */
/* Collectives of the trainer: through the ZeRO comm thread once it runs (ordered with the
 * stage's own), on the communicator directly before. */
int zr_train__bcast(run *r, void *buf, size_t bytes, int root)
{
    return r->zero ? zr_zero_broadcast(r->zero, buf, bytes, root)
                   : zr_comm_broadcast(r->comm, buf, bytes, root);
}

int zr_train__gather_f64(run *r, const double *mine, size_t n, double *all)
{
    return r->zero ? zr_zero_gather_f64(r->zero, mine, n, all)
                   : zr_comm_all_gather(r->comm, mine, all, n, sizeof(double));
}

int zr_train__share_text(run *r, int root, int status, const char *text, char **text_out)
{
    double hdr[2] = {(double)status, text ? (double)strlen(text) : 0};
    int rc = zr_train__bcast(r, hdr, sizeof hdr, root);
    if (rc)
        return rc;
    size_t len = (size_t)hdr[1];
    char *buf = malloc(len + 1);
    if (!buf)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    if (r->rank == root)
        memcpy(buf, text, len);
    buf[len] = 0;
    if (len && (rc = zr_train__bcast(r, buf, len, root))) {
        free(buf);
        return rc;
    }
    if ((int)hdr[0]) {
        rc = zr_err_set((int)hdr[0], "%s", buf);
        free(buf);
        return rc;
    }
    if (text_out)
        *text_out = buf;
    else
        free(buf);
    return 0;
}

/* 32 bits of FNV-1a of an error message (exact in a double), to compare the ranks' errors */
static double msg_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; s && *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return (double)h;
}

/* A rank's local result, agreed: every rank learns the first failing rank's error. When every
 * rank failed with that very message (a bad option, a checkpoint that does not fit), it stays
 * as it is, so that all ranks print the same line (the launcher prints it once, "all N
 * ranks"); otherwise every rank, that one included, says whose it is: "rank K: ...". */
int zr_train__agree(run *r, int rc)
{
    char *msg = rc ? strdup(zr_err_msg()) : NULL;
    double mine[2] = {rc, rc ? msg_hash(msg) : 0}, *all = calloc(2 * (size_t)r->W, sizeof *all);
    if (!all) {
        free(msg);
        return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    int crc = zr_train__gather_f64(r, mine, 2, all);
    int first = -1, same = 1;
    for (int q = 0; !crc && q < r->W && first < 0; q++)
        if (all[2 * q] != 0)
            first = q;
    for (int q = 0; !crc && first >= 0 && q < r->W; q++)
        same = same && all[2 * q] != 0 && all[2 * q + 1] == all[2 * first + 1];
    free(all);
    if (!crc && first >= 0) {
        crc = zr_train__share_text(r, first, rc ? rc : ZR_ERROR, msg ? msg : "", NULL);
        if (crc && r->W > 1 && !same)
            zr_err_prefix("rank %d: ", first);
    }
    free(msg);
    return crc;
}
