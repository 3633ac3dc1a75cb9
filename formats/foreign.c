/*
 * foreign.c: the public entry points of the foreign-checkpoint readers (zfmt.h): which format
 * a path holds, and the dispatch to dcp.c and deepspeed.c.
 */
#include "foreign.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static int has_file(const char *dir, const char *name)
{
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

zfmt_foreign_kind zfmt_foreign_detect(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode) || has_file(path, "manifest.json"))
        return ZFMT_FOREIGN_NONE;
    if (has_file(path, ".metadata"))
        return ZFMT_FOREIGN_DCP;
    return ZFMT_FOREIGN_NONE;
}

const char *zfmt_foreign_name(zfmt_foreign_kind k)
{
    switch (k) {
    case ZFMT_FOREIGN_DCP: return "PyTorch DCP";
    case ZFMT_FOREIGN_DEEPSPEED: return "DeepSpeed ZeRO";
    case ZFMT_FOREIGN_NONE: break;
    }
    return "none";
}

int zfmt_foreign_verify(zck_report **out, const char *path, const zck_verify_opts *o)
{
    *out = NULL;
    zck_verify_opts dflt = ZCK_VERIFY_OPTS_INIT;
    zfmt_foreign_kind k = zfmt_foreign_detect(path);
    if (k == ZFMT_FOREIGN_NONE)
        return zr_err_set(ZR_ENOTFOUND, "%s: neither a DeepSpeed nor a DCP checkpoint", path);
    zck_report *rep;
    ZR_TRY(zck_report_new(&rep));
    int rc = zfmt__dcp_verify(rep, path, o ? o : &dflt);
    if (rc) {
        zck_report_free(rep);
        return rc;
    }
    *out = rep;
    return 0;
}
