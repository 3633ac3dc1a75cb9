/*
 * llmc.c: export the params of a GPT-2 checkpoint as llm.c's model file (zfmt_llmc_export), the
 * layout of karpathy/llm.c's train_gpt2.c (gpt2_124M.bin): a header of 256 int32
 * ([0] magic 20240326, [1] version 3, [2] max context T, [3] vocabulary V, [4] layers L,
 * [5] heads NH, [6] channels C, [7] padded vocabulary Vp = V rounded up to 128, the rest 0),
 * then float32 parameters in 16 arrays: wte [Vp, C] (rows V.. Vp-1 zero), wpe [T, C], each of
 * the 12 per-layer kinds stacked over the L layers ([L, ...]), ln_f.weight [C], ln_f.bias [C].
 * Streamed in bounded chunks; written to a temporary name and renamed into place.
 */
#include "fmtutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_NUMEL ((size_t)1 << 20) /* 4 MiB of f32 per read */

void zfmt__llmc_sizes(const zfmt_gpt2_config *c, uint64_t Vp, uint64_t sizes[ZFMT__LLMC_ARRAYS])
{
    uint64_t C = c->dim, sh[2];
    size_t nd;
    sizes[0] = Vp * C;
    sizes[1] = (uint64_t)c->ctx * C;
    for (size_t k = 0; k < ZFMT__GPT2_KINDS; k++) {
        zfmt__gpt2_kind_shape(c, k, &nd, sh);
        sizes[2 + k] = (uint64_t)c->layers * sh[0] * (nd == 2 ? sh[1] : 1);
    }
    sizes[14] = C;
    sizes[15] = C;
}

typedef struct {
    zck_reader *r;
    zfmt__out *f;
    size_t state;
    zck_dtype st;         /* the param state's dtype */
    unsigned char *sbuf;  /* CHUNK_NUMEL elements as stored */
    float *fbuf;          /* CHUNK_NUMEL f32 */
    zck_read_opts ro;
    zfmt__prog pr;
} exporter;

/* Stream elements [start, start + n) of the param state of group g as f32. */
static int put_range(exporter *x, size_t g, uint64_t start, uint64_t n)
{
    for (uint64_t done = 0; done < n;) {
        size_t k = n - done < CHUNK_NUMEL ? (size_t)(n - done) : CHUNK_NUMEL;
        void *dst = x->st == ZCK_F32 ? (void *)x->fbuf : (void *)x->sbuf;
        zck_read_req q = {g, x->state, start + done, k, dst};
        ZR_TRY(zck_reader_read(x->r, &q, 1, &x->ro));
        if (x->st != ZCK_F32)
            ZR_TRY(zfmt_convert(x->fbuf, ZCK_F32, x->sbuf, x->st, k));
        ZR_TRY(zfmt__out_write(x->f, x->fbuf, k * 4));
        zfmt__prog_add(&x->pr, (uint64_t)k * 4);
        done += k;
    }
    return 0;
}

static int put_zeros(exporter *x, uint64_t n)
{
    memset(x->fbuf, 0, CHUNK_NUMEL * 4);
    for (uint64_t done = 0; done < n;) {
        size_t k = n - done < CHUNK_NUMEL ? (size_t)(n - done) : CHUNK_NUMEL;
        ZR_TRY(zfmt__out_write(x->f, x->fbuf, k * 4));
        zfmt__prog_add(&x->pr, (uint64_t)k * 4);
        done += k;
    }
    return 0;
}

/* The tensor must exist in the checkpoint with the shape the config implies. */
static int locate(const zck_reader *r, const zck_layout *want, const char *name, size_t *g,
                  zck_tensor_info *ti)
{
    const zck_layout *L = zck_reader_layout(r);
    size_t wg;
    zck_tensor_info wt;
    ZR_TRY(zfmt__find_tensor(want, name, &wg, &wt));
    if (zfmt__find_tensor(L, name, g, ti) < 0)
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' missing (not a GPT-2 checkpoint?)",
                          zck_reader_path(r), name);
    int same = ti->ndim == wt.ndim;
    for (size_t d = 0; same && d < wt.ndim; d++)
        same = ti->shape[d] == wt.shape[d];
    if (!same) {
        char a[128], b[128];
        zfmt__shape_str(a, sizeof a, ti->ndim, ti->shape);
        zfmt__shape_str(b, sizeof b, wt.ndim, wt.shape);
        return zr_err_set(ZR_ECORRUPT, "%s: tensor '%s' has shape %s, the model section "
                          "implies %s", zck_reader_path(r), name, a, b);
    }
    return 0;
}

int zfmt_llmc_export(const char *ckpt, const char *out_file, const zck_progress *progress)
{
    exporter x = {0};
    zck_layout *want = NULL;
    int rc = 0;
    zfmt_gpt2_config c;
    zfmt__verify *v = NULL;
    ZR_TRY_GOTO(zfmt__open_verifying(&x.r, &v, ckpt), rc, out);
    const char *dir = zck_reader_path(x.r);
    if ((rc = zfmt_gpt2_config_from_json(&c, zck_reader_model_json(x.r))) < 0) {
        zr_err_prefix("%s: ", dir);
        goto out;
    }
    uint64_t Vp = ((uint64_t)c.vocab + 127) / 128 * 128;
    if (c.layers > INT32_MAX || c.heads > INT32_MAX || c.dim > INT32_MAX ||
        c.ctx > INT32_MAX || Vp > INT32_MAX) {
        rc = zr_err_set(ZR_EINVAL, "%s: model too large for llm.c's int32 header", dir);
        goto out;
    }
    const zck_layout *L = zck_reader_layout(x.r);
    if (zck_layout_find_state(L, &x.state, "param") < 0) {
        rc = zr_err_set(ZR_ENOTFOUND, "%s: no state 'param' to export", dir);
        goto out;
    }
    x.st = zck_layout_state_dtype(L, x.state);
    if (x.st != ZCK_F32 && x.st != ZCK_BF16 && x.st != ZCK_F16) {
        rc = zr_err_set(ZR_EUNSUPPORTED, "%s: params stored as %s: only f32, bf16 and f16 "
                        "convert to llm.c's f32", dir, zck_dtype_name(x.st));
        goto out;
    }
    ZR_TRY_GOTO(zfmt_gpt2_layout(&want, &c), rc, out);

    /* llm.c's order, every tensor checked before anything is written */
    size_t nt = 4 + (size_t)c.layers * ZFMT__GPT2_KINDS, at = 0;
    char (*names)[64] = malloc(nt * sizeof *names);
    size_t *grp = malloc(nt * sizeof *grp);
    zck_tensor_info *ti = malloc(nt * sizeof *ti);
    x.sbuf = malloc(CHUNK_NUMEL * 2);
    x.fbuf = malloc(CHUNK_NUMEL * 4);
    if (!names || !grp || !ti || !x.sbuf || !x.fbuf) {
        free(names);
        free(grp);
        free(ti);
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
        goto out;
    }
    snprintf(names[at++], 64, "wte");
    snprintf(names[at++], 64, "wpe");
    for (size_t k = 0; k < ZFMT__GPT2_KINDS; k++)
        for (uint32_t l = 0; l < c.layers; l++)
            snprintf(names[at++], 64, "h.%u.%s", l, zfmt__gpt2_kind(k));
    snprintf(names[at++], 64, "ln_f.weight");
    snprintf(names[at++], 64, "ln_f.bias");
    for (size_t i = 0; i < nt && !rc; i++)
        rc = locate(x.r, want, names[i], &grp[i], &ti[i]);

    int32_t header[ZFMT__LLMC_HEADER_INTS] = {0};
    header[0] = ZFMT__LLMC_MAGIC;
    header[1] = 3;
    header[2] = (int32_t)c.ctx;
    header[3] = (int32_t)c.vocab;
    header[4] = (int32_t)c.layers;
    header[5] = (int32_t)c.heads;
    header[6] = (int32_t)c.dim;
    header[7] = (int32_t)Vp;
    uint64_t sizes[ZFMT__LLMC_ARRAYS], total = 0;
    zfmt__llmc_sizes(&c, Vp, sizes);
    for (size_t i = 0; i < ZFMT__LLMC_ARRAYS; i++)
        total += sizes[i] * 4;

    x.ro = (zck_read_opts)ZCK_READ_OPTS_INIT;
    x.ro.verify = 0; /* verified in full above */
    x.ro.jobs = 1;
    x.ro.io.buf_bytes = (size_t)1 << 20;
    x.ro.io.queue_depth = 2;
    x.ro.io.io = ZCK_IO_BUFFERED; /* from the page cache the verification filled */
    if (!rc)
        rc = zfmt__out_open(&x.f, out_file);
    if (!rc)
        rc = zfmt__out_write(x.f, header, sizeof header);
    zfmt__prog_init(&x.pr, progress, "export", total);
    for (size_t i = 0; i < nt && !rc; i++) {
        rc = put_range(&x, grp[i], ti[i].offset, ti[i].numel);
        if (!rc && i == 0) /* wte's padded rows */
            rc = put_zeros(&x, (Vp - c.vocab) * (uint64_t)c.dim);
    }
    if (!rc) {
        rc = zfmt__verify_join(v);
        v = NULL;
    }
    if (!rc)
        rc = zfmt__out_commit(x.f);
    free(names);
    free(grp);
    free(ti);
out:
    if (v) /* a failed export still joins the verification, whose finding explains it best */
        rc = zfmt__verify_settle(v, rc);
    zfmt__out_free(x.f);
    free(x.sbuf);
    free(x.fbuf);
    zck_layout_free(want);
    zck_reader_free(x.r);
    return rc;
}
