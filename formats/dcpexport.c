/*
 * dcpexport.c: export a GPT-2 or Llama checkpoint as a PyTorch Distributed Checkpoint directory
 * (zfmt_dcp_export), what torch.distributed.checkpoint.save of one process writes for
 * {"model": get_model_state_dict(m), "optimizer": get_optimizer_state_dict(m, AdamW)}:
 *   - __0_0.distcp: the items one after the other, each a complete torch.save zip (torch's
 *     FileSystemWriter with its default SerializationFormat.TORCH_SAVE): a tensor item holds
 *     data.pkl (_rebuild_tensor_v2 of storage "0"), the records .format_version,
 *     .storage_alignment, byteorder, data/0 (the bytes), version, .data/serialization_id; a
 *     bytes item (an optimizer setting) the same without data/0, its value pickled in data.pkl;
 *   - .metadata: a pickle (protocol 4) of Metadata: state_dict_metadata (fqn ->
 *     TensorStorageMetadata(TensorProperties(dtype, ...), size, [one chunk]) or
 *     BytesStorageMetadata), planner_data (fqn -> its path in the nested dict), storage_data
 *     (MetadataIndex(fqn, offset, index) -> _StorageInfo("__0_0.distcp", offset, length)),
 *     storage_meta (StorageMeta(checkpoint_id, save_id)), version "1.0.0".
 * Names: "model.<Hugging Face name>" (the model's state_dict, with lm_head.weight also when it
 * is tied: a copy of the embedding); with the optimizer "optimizer.state.<name>.step|exp_avg|
 * exp_avg_sq" and "optimizer.param_groups.0.<setting>". Tensors as stored, GPT-2's Conv1D weights
 * (and their moments) transposed to [in, out] as transformers holds them.
 * Built in "<dir>.tmp-<pid>", renamed into place once the source verified.
 */
#include "foreign.h"
#include "fmtutil.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define COPY_BYTES ((size_t)8 << 20)
#define DISTCP "__0_0.distcp"
#define MD_MOD "torch.distributed.checkpoint.metadata"

static const char *const moments[] = {"exp_avg", "exp_avg_sq"};

/* one item of the state dict */
typedef struct {
    char *fqn;
    const char *path[4]; /* planner_data: its keys in the nested dict (path[3] NULL: 3 deep) */
    char *hf;            /* the Hugging Face name, owned (path[1] or path[2] points to it) */
    int is_bytes;
    zfmt__pkw value;     /* bytes item: its value, pickled */
    size_t g, t, s;      /* tensor: group, tensor and state of the source */
    zck_tensor_info ti;  /* tensor: its layout entry (shape [out, in]) */
    int transposed, scalar; /* written [in, out]; a step count (one float32, value step) */
    zck_dtype dtype;
    size_t ndim;
    uint64_t shape[ZCK_MAX_DIMS];
    uint64_t at, len;    /* in __0_0.distcp */
} dcp_out;

typedef struct {
    zck_reader *r;
    dcp_out *it;
    size_t n, cap;
    double step;
    zck_read_opts ro;
    const zck_progress *progress;
    unsigned char *buf, *tbuf; /* COPY_BYTES; the largest transposed tensor (and its copy) */
    size_t tcap;
    zfmt__prog pr;
} dcp_job;

static int is_dcp_file(const char *name)
{
    return !strcmp(name, ".metadata") || !strcmp(name, DISTCP);
}

static dcp_out *add(dcp_job *j)
{
    if (j->n == j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 64;
        dcp_out *p = realloc(j->it, cap * sizeof *p);
        if (!p)
            return NULL;
        j->it = p;
        j->cap = cap;
    }
    dcp_out *x = &j->it[j->n++];
    *x = (dcp_out){0};
    return x;
}

static void free_job(dcp_job *j)
{
    for (size_t i = 0; i < j->n; i++) {
        free(j->it[i].fqn);
        free(j->it[i].hf);
        zfmt__pkw_free(&j->it[i].value);
    }
    free(j->it);
    free(j->buf);
    free(j->tbuf);
    zck_reader_free(j->r);
}

/* a tensor item: fqn from its parts, the source tensor (g, t) of state s */
static int add_tensor(dcp_job *j, const char *hf, const char *p0, const char *p1,
                      const char *p3, size_t g, size_t t, size_t s, int transposed)
{
    dcp_out *x = add(j);
    if (!x || !(x->hf = strdup(hf)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    const zck_layout *L = zck_reader_layout(j->r);
    x->g = g;
    x->t = t;
    x->s = s;
    zck_layout_tensor(L, g, t, &x->ti);
    x->dtype = zck_layout_state_dtype(L, s);
    x->transposed = transposed;
    x->ndim = x->ti.ndim;
    for (size_t d = 0; d < x->ndim; d++)
        x->shape[d] = x->ti.shape[transposed ? x->ndim - 1 - d : d];
    x->path[0] = p0;
    if (p1) { /* optimizer.state.<hf>.<p3> */
        x->path[1] = p1;
        x->path[2] = x->hf;
        x->path[3] = p3;
    } else {
        x->path[1] = x->hf;
    }
    size_t n = strlen(p0) + strlen(hf) + (p1 ? strlen(p1) : 0) + (p3 ? strlen(p3) : 0) + 4;
    if (!(x->fqn = malloc(n)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    if (p1)
        snprintf(x->fqn, n, "%s.%s.%s.%s", p0, p1, hf, p3);
    else
        snprintf(x->fqn, n, "%s.%s", p0, hf);
    if (transposed && x->ti.numel * zck_dtype_size(x->dtype) > j->tcap)
        j->tcap = (size_t)x->ti.numel * zck_dtype_size(x->dtype);
    return 0;
}

/* the state index named name, or -1 */
static long state_of(const zck_layout *L, const char *name)
{
    for (size_t s = 0; s < zck_layout_n_states(L); s++)
        if (!strcmp(zck_layout_state_name(L, s), name))
            return (long)s;
    return -1;
}

/* A number from the checkpoint's training section, or def. */
static double training_num(zck_reader *r, const char *key, double def)
{
    const char *t = zck_reader_training_json(r);
    json_t *j = t ? json_loads(t, 0, NULL) : NULL, *v = json_object_get(j, key);
    double d = json_is_number(v) ? json_number_value(v) : def;
    json_decref(j);
    return d;
}

/* the settings of AdamW's one param group, as torch 2.15 pickles them: lr and weight_decay from
 * the training section, else zrun's defaults (ZR_TRAIN_OPTS_INIT: what a resume without options
 * uses; an import records neither); betas and eps zrun's fixed ones (ZR_ADAMW_HP_INIT), restated
 * here because formats/ does not include core/ */
static int add_param_groups(dcp_job *j)
{
    static const char *const keys[] = {"lr", "betas", "eps", "weight_decay", "amsgrad",
                                       "maximize", "foreach", "capturable", "differentiable",
                                       "fused", "decoupled_weight_decay", "params"};
    double lr = training_num(j->r, "lr", 1e-3), wd = training_num(j->r, "weight_decay", 0.1);
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        dcp_out *x = add(j);
        size_t n = strlen(keys[k]) + 32;
        if (!x || !(x->fqn = malloc(n)))
            return zr_err_set(ZR_ENOMEM, "out of memory");
        snprintf(x->fqn, n, "optimizer.param_groups.0.%s", keys[k]);
        x->is_bytes = 1;
        x->path[0] = "optimizer";
        x->path[1] = "param_groups";
        x->path[2] = NULL; /* the list index 0: written as an int */
        x->path[3] = keys[k];
        zfmt__pkw *w = &x->value;
        zfmt__pkw_op(w, 0x80);
        zfmt__pkw_op(w, 2);
        if (k == 0 || k == 2 || k == 3) {
            zfmt__pkw_float(w, k == 0 ? lr : k == 2 ? 1e-8 : wd);
        } else if (k == 1) { /* zrun's betas */
            zfmt__pkw_float(w, 0.9);
            zfmt__pkw_float(w, 0.95);
            zfmt__pkw_op(w, 0x86);
        } else if (k == 6 || k == 9) {
            zfmt__pkw_op(w, 'N');
        } else if (k == 10) {
            zfmt__pkw_op(w, 0x88); /* True */
        } else if (k == 11) {    /* the parameters' names, in the order of the state */
            zfmt__pkw_op(w, ']');
            zfmt__pkw_op(w, '(');
            for (size_t i = 0; i < j->n; i++)
                if (j->it[i].path[3] && !strcmp(j->it[i].path[3], "exp_avg"))
                    zfmt__pkw_str(w, j->it[i].hf);
            zfmt__pkw_op(w, 'e');
        } else {
            zfmt__pkw_op(w, 0x89); /* False */
        }
        zfmt__pkw_op(w, '.');
        if (w->oom)
            return zr_err_set(ZR_ENOMEM, "out of memory");
    }
    return 0;
}

/* The items: the model's state_dict, then (optim) AdamW's state and param group. */
static int plan(dcp_job *j, int optim)
{
    zck_reader *r = j->r;
    const zck_layout *L = zck_reader_layout(r);
    zck_arch_config a;
    if (zck_arch_config_from_json(&a, zck_reader_model_json(r), NULL) < 0) {
        zr_err_prefix("%s: ", zck_reader_path(r));
        return zfmt__err_recode(ZR_ECORRUPT);
    }
    const zfmt__hf_family *fam = zfmt__hf_family_of(zck_arch_name(a.arch));
    if (!fam)
        return zr_err_set(ZR_EUNSUPPORTED, "%s: DCP export does not know model family '%s'",
                          zck_reader_path(r), zck_arch_name(a.arch));
    long sp = state_of(L, "param"), sm[2] = {state_of(L, moments[0]), state_of(L, moments[1])};
    if (sp < 0)
        return zr_err_set(ZR_ECORRUPT, "%s: no state 'param'", zck_reader_path(r));
    if (optim && (sm[0] < 0 || sm[1] < 0))
        return zr_err_set(ZR_ENOTFOUND, "%s: no AdamW moments (states exp_avg and exp_avg_sq) "
                          "to export with the optimizer", zck_reader_path(r));
    const char *embedding, *head = zfmt__hf_head(fam, &embedding);
    size_t emb_g = 0, emb_t = 0, n_params;
    int have_head = 0, have_emb = 0;
    char hf[512];
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++) {
            zck_tensor_info ti;
            int tr;
            zck_layout_tensor(L, g, t, &ti);
            ZR_TRY(zfmt__hf_name(fam, hf, sizeof hf, ti.name, &tr));
            ZR_TRY(add_tensor(j, hf, "model", NULL, NULL, g, t, (size_t)sp, tr));
            have_head |= !strcmp(hf, head);
            if (!strcmp(ti.name, embedding)) {
                have_emb = 1;
                emb_g = g;
                emb_t = t;
            }
        }
    n_params = j->n;
    if (!have_head && have_emb) /* tied: the state_dict holds the head as the embedding */
        ZR_TRY(add_tensor(j, head, "model", NULL, NULL, emb_g, emb_t, (size_t)sp, 0));
    if (!optim)
        return 0;
    j->step = training_num(r, "optimizer_step", (double)zck_reader_step(r));
    for (size_t i = 0; i < n_params; i++) {
        dcp_out p = j->it[i]; /* copied: add() may move the array */
        ZR_TRY(add_tensor(j, p.hf, "optimizer", "state", "step", p.g, p.t, (size_t)sp, 0));
        dcp_out *x = &j->it[j->n - 1];
        x->scalar = 1;
        x->dtype = ZCK_F32;
        x->ndim = 0;
        for (int m = 0; m < 2; m++)
            ZR_TRY(add_tensor(j, p.hf, "optimizer", "state", moments[m], p.g, p.t, (size_t)sm[m],
                              p.transposed));
    }
    return add_param_groups(j);
}

/* ---------------------------------------------------------------- __0_0.distcp */

/* torch.save's records after data.pkl (and before data/0; version after it) */
static int common_records(zfmt__zipw *z, int before, unsigned serial)
{
    if (before) {
        ZR_TRY(zfmt__zipw_record(z, ".format_version", "1", 1));
        ZR_TRY(zfmt__zipw_record(z, ".storage_alignment", "64", 2));
        return zfmt__zipw_record(z, "byteorder", "little", 6);
    }
    char id[48];
    ZR_TRY(zfmt__zipw_record(z, "version", "3\n", 2));
    snprintf(id, sizeof id, "%020u%020u", serial, serial * 2654435761u);
    return zfmt__zipw_record(z, ".data/serialization_id", id, 40);
}

/* data.pkl of a tensor: _rebuild_tensor_v2((storage, "0", "cpu", numel), 0, size, stride,
 * False, OrderedDict()) */
static int tensor_pickle(zfmt__pkw *w, const dcp_out *x)
{
    const char *dname, *sname;
    ZR_TRY(zfmt__torch_dtype_names(&dname, &sname, x->dtype));
    uint64_t numel = 1, stride[ZCK_MAX_DIMS];
    for (size_t d = x->ndim; d-- > 0;) {
        stride[d] = numel;
        numel *= x->shape[d];
    }
    zfmt__pkw_op(w, 0x80);
    zfmt__pkw_op(w, 2);
    zfmt__pkw_global(w, "torch._utils", "_rebuild_tensor_v2");
    zfmt__pkw_op(w, '(');
    zfmt__pkw_op(w, '(');
    zfmt__pkw_str(w, "storage");
    zfmt__pkw_global(w, "torch", sname);
    zfmt__pkw_str(w, "0");
    zfmt__pkw_str(w, "cpu");
    zfmt__pkw_int(w, (int64_t)numel);
    zfmt__pkw_op(w, 't');
    zfmt__pkw_op(w, 'Q'); /* BINPERSID */
    zfmt__pkw_int(w, 0);
    zfmt__pkw_ints(w, x->ndim, x->shape);
    zfmt__pkw_ints(w, x->ndim, stride);
    zfmt__pkw_op(w, 0x89);
    zfmt__pkw_global(w, "collections", "OrderedDict");
    zfmt__pkw_op(w, ')');
    zfmt__pkw_op(w, 'R');
    zfmt__pkw_op(w, 't');
    zfmt__pkw_op(w, 'R');
    zfmt__pkw_op(w, '.');
    return w->oom ? zr_err_set(ZR_ENOMEM, "out of memory") : 0;
}

/* The bytes of tensor x, streamed into o at at (CRC-32 into *crc). */
static int tensor_bytes(dcp_job *j, const dcp_out *x, zfmt__out *o, uint64_t at, uint32_t *crc)
{
    size_t es = zck_dtype_size(x->dtype);
    *crc = 0;
    if (x->scalar) {
        float v = (float)j->step;
        *crc = zfmt__crc32(0, &v, 4);
        return zfmt__out_pwrite(o, &v, 4, at);
    }
    if (x->transposed) { /* ours [out, in] -> [in, out]: read whole */
        unsigned char *a = j->tbuf, *b = j->tbuf + j->tcap;
        zck_read_req q = {x->g, x->s, x->ti.offset, x->ti.numel, a};
        ZR_TRY(zck_reader_read(j->r, &q, 1, &j->ro));
        zfmt__transpose(b, a, (size_t)x->ti.shape[0], (size_t)x->ti.shape[1], es);
        size_t n = (size_t)x->ti.numel * es;
        *crc = zfmt__crc32(0, b, n);
        zfmt__prog_add(&j->pr, n);
        return zfmt__out_pwrite(o, b, n, at);
    }
    uint64_t chunk = COPY_BYTES / es;
    for (uint64_t done = 0; done < x->ti.numel;) {
        uint64_t k = x->ti.numel - done < chunk ? x->ti.numel - done : chunk;
        zck_read_req q = {x->g, x->s, x->ti.offset + done, k, j->buf};
        ZR_TRY(zck_reader_read(j->r, &q, 1, &j->ro));
        *crc = zfmt__crc32(*crc, j->buf, (size_t)k * es);
        ZR_TRY(zfmt__out_pwrite(o, j->buf, (size_t)k * es, at + done * es));
        zfmt__prog_add(&j->pr, k * es);
        done += k;
    }
    return 0;
}

/* item x as a torch.save zip at byte at of o: x->at, x->len */
static int write_item(dcp_job *j, dcp_out *x, zfmt__out *o, uint64_t at, unsigned serial)
{
    zfmt__zipw z;
    zfmt__zipw_init(&z, o, at);
    zfmt__pkw pk = {0};
    int rc = x->is_bytes ? 0 : tensor_pickle(&pk, x);
    if (!rc)
        rc = x->is_bytes ? zfmt__zipw_record(&z, "data.pkl", x->value.b, x->value.n)
                         : zfmt__zipw_record(&z, "data.pkl", pk.b, pk.n);
    zfmt__pkw_free(&pk);
    if (!rc)
        rc = common_records(&z, 1, serial);
    if (!rc && !x->is_bytes) {
        uint64_t data_at, n = x->scalar ? 4 : x->ti.numel * zck_dtype_size(x->dtype);
        uint32_t crc;
        rc = zfmt__zipw_begin(&z, "data/0", n, &data_at);
        if (!rc)
            rc = tensor_bytes(j, x, o, data_at, &crc);
        if (!rc)
            rc = zfmt__zipw_end(&z, crc);
        if (rc)
            zr_err_prefix("%s: ", x->fqn);
    }
    if (!rc)
        rc = common_records(&z, 0, serial);
    if (!rc)
        rc = zfmt__zipw_finish(&z, &x->len);
    x->at = at;
    return rc;
}

/* ---------------------------------------------------------------- .metadata */

static void md_global(zfmt__pkw *w, const char *name) { zfmt__pkw_global(w, MD_MOD, name); }

/* cls() with a state dict to follow: NEWOBJ of no arguments, then the dict's MARK */
static void md_object(zfmt__pkw *w, const char *module, const char *name)
{
    zfmt__pkw_global(w, module, name);
    zfmt__pkw_op(w, ')');
    zfmt__pkw_op(w, 0x81); /* NEWOBJ */
}

static void md_size(zfmt__pkw *w, size_t n, const uint64_t *v)
{
    zfmt__pkw_global(w, "torch", "Size");
    zfmt__pkw_ints(w, n, v);
    zfmt__pkw_op(w, 0x85);
    zfmt__pkw_op(w, 'R');
}

static int tensor_md(zfmt__pkw *w, const dcp_out *x)
{
    const char *dname, *sname;
    ZR_TRY(zfmt__torch_dtype_names(&dname, &sname, x->dtype));
    uint64_t stride[ZCK_MAX_DIMS], zero[ZCK_MAX_DIMS] = {0}, s = 1;
    for (size_t d = x->ndim; d-- > 0;) {
        stride[d] = s;
        s *= x->shape[d];
    }
    md_object(w, MD_MOD, "TensorStorageMetadata");
    zfmt__pkw_op(w, '}');
    zfmt__pkw_op(w, '(');
    zfmt__pkw_str(w, "properties");
    md_object(w, MD_MOD, "TensorProperties"); /* state: (dtype, layout, requires_grad,
                                                 memory_format, pin_memory, strides) */
    zfmt__pkw_op(w, '(');
    zfmt__pkw_global(w, "torch", dname);
    zfmt__pkw_global(w, "torch.serialization", "_get_layout");
    zfmt__pkw_str(w, "torch.strided");
    zfmt__pkw_op(w, 0x85);
    zfmt__pkw_op(w, 'R');
    zfmt__pkw_op(w, 0x89);
    md_global(w, "_MEM_FORMAT_ENCODING");
    zfmt__pkw_int(w, 0); /* TORCH_CONTIGUOUS_FORMAT */
    zfmt__pkw_op(w, 0x85);
    zfmt__pkw_op(w, 'R');
    zfmt__pkw_op(w, 0x89);
    zfmt__pkw_ints(w, x->ndim, stride);
    zfmt__pkw_op(w, 't');
    zfmt__pkw_op(w, 'b');
    zfmt__pkw_str(w, "size");
    md_size(w, x->ndim, x->shape);
    zfmt__pkw_str(w, "chunks");
    zfmt__pkw_op(w, ']');
    md_object(w, MD_MOD, "ChunkStorageMetadata");
    zfmt__pkw_op(w, '}');
    zfmt__pkw_op(w, '(');
    zfmt__pkw_str(w, "offsets");
    md_size(w, x->ndim, zero);
    zfmt__pkw_str(w, "sizes");
    md_size(w, x->ndim, x->shape);
    zfmt__pkw_op(w, 'u');
    zfmt__pkw_op(w, 'b');
    zfmt__pkw_op(w, 'a');
    zfmt__pkw_op(w, 'u');
    zfmt__pkw_op(w, 'b');
    return 0;
}

/* the Metadata pickle of the items, for the checkpoint directory dir (storage_meta's
 * checkpoint_id: its path) */
static int metadata(zfmt__pkw *w, const dcp_job *j, const char *dir)
{
    zfmt__pkw_op(w, 0x80);
    zfmt__pkw_op(w, 4);
    md_object(w, MD_MOD, "Metadata");
    zfmt__pkw_op(w, '}');
    zfmt__pkw_op(w, '(');
    zfmt__pkw_str(w, "state_dict_metadata");
    zfmt__pkw_op(w, '}');
    zfmt__pkw_op(w, '(');
    for (size_t i = 0; i < j->n; i++) {
        zfmt__pkw_str(w, j->it[i].fqn);
        if (j->it[i].is_bytes)
            md_object(w, MD_MOD, "BytesStorageMetadata");
        else
            ZR_TRY(tensor_md(w, &j->it[i]));
    }
    zfmt__pkw_op(w, 'u');
    zfmt__pkw_str(w, "planner_data");
    zfmt__pkw_op(w, '}');
    zfmt__pkw_op(w, '(');
    for (size_t i = 0; i < j->n; i++) {
        const dcp_out *x = &j->it[i];
        zfmt__pkw_str(w, x->fqn);
        zfmt__pkw_op(w, '(');
        for (size_t k = 0; k < 4; k++)
            if (x->path[k])
                zfmt__pkw_str(w, x->path[k]);
            else if (k == 2 && x->is_bytes)
                zfmt__pkw_int(w, 0); /* param_groups[0] */
        zfmt__pkw_op(w, 't');
    }
    zfmt__pkw_op(w, 'u');
    zfmt__pkw_str(w, "storage_data");
    zfmt__pkw_op(w, '}');
    zfmt__pkw_op(w, '(');
    for (size_t i = 0; i < j->n; i++) {
        const dcp_out *x = &j->it[i];
        uint64_t zero[ZCK_MAX_DIMS] = {0};
        md_object(w, MD_MOD, "MetadataIndex");
        zfmt__pkw_op(w, '}');
        zfmt__pkw_op(w, '(');
        zfmt__pkw_str(w, "fqn");
        zfmt__pkw_str(w, x->fqn);
        if (!x->is_bytes) {
            zfmt__pkw_str(w, "offset");
            md_size(w, x->ndim, zero);
        }
        zfmt__pkw_str(w, "index");
        if (x->is_bytes)
            zfmt__pkw_op(w, 'N');
        else
            zfmt__pkw_int(w, 0);
        zfmt__pkw_op(w, 'u');
        zfmt__pkw_op(w, 'b');
        md_object(w, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
        zfmt__pkw_op(w, '}');
        zfmt__pkw_op(w, '(');
        zfmt__pkw_str(w, "relative_path");
        zfmt__pkw_str(w, DISTCP);
        zfmt__pkw_str(w, "offset");
        zfmt__pkw_int(w, (int64_t)x->at);
        zfmt__pkw_str(w, "length");
        zfmt__pkw_int(w, (int64_t)x->len);
        zfmt__pkw_op(w, 'u');
        zfmt__pkw_op(w, 'b');
    }
    zfmt__pkw_op(w, 'u');
    /* storage_meta: StorageMeta(checkpoint_id=PosixPath(dir), save_id=<uuid4>, load_id=None,
     * modules=[]) */
    zfmt__pkw_str(w, "storage_meta");
    md_object(w, MD_MOD, "StorageMeta");
    zfmt__pkw_op(w, '}');
    zfmt__pkw_op(w, '(');
    zfmt__pkw_str(w, "checkpoint_id");
    zfmt__pkw_global(w, "pathlib", "PosixPath");
    zfmt__pkw_op(w, '(');
    char part[4096];
    const char *p = dir;
    if (*p == '/')
        zfmt__pkw_str(w, "/");
    while (*p) {
        while (*p == '/')
            p++;
        size_t n = strcspn(p, "/");
        if (n) {
            snprintf(part, sizeof part, "%.*s", (int)n, p);
            zfmt__pkw_str(w, part);
        }
        p += n;
    }
    zfmt__pkw_op(w, 't');
    zfmt__pkw_op(w, 'R');
    unsigned char u[16];
    if (getrandom(u, sizeof u, 0) != (ssize_t)sizeof u) /* only an identifier: any will do */
        for (size_t k = 0; k < sizeof u; k++)
            u[k] = (unsigned char)((uint64_t)time(NULL) * 2654435761u >> (k % 8 * 8)) ^
                   (unsigned char)getpid();
    u[6] = (unsigned char)((u[6] & 0x0f) | 0x40); /* a version 4 UUID */
    u[8] = (unsigned char)((u[8] & 0x3f) | 0x80);
    char uuid[40];
    int at = 0;
    for (size_t k = 0; k < 16; k++)
        at += snprintf(uuid + at, sizeof uuid - (size_t)at, "%s%02x",
                       k == 4 || k == 6 || k == 8 || k == 10 ? "-" : "", u[k]);
    zfmt__pkw_str(w, "save_id");
    zfmt__pkw_str(w, uuid);
    zfmt__pkw_str(w, "load_id");
    zfmt__pkw_op(w, 'N');
    zfmt__pkw_str(w, "modules");
    zfmt__pkw_op(w, ']');
    zfmt__pkw_op(w, 'u');
    zfmt__pkw_op(w, 'b');
    zfmt__pkw_str(w, "version");
    zfmt__pkw_str(w, "1.0.0");
    zfmt__pkw_op(w, 'u');
    zfmt__pkw_op(w, 'b');
    zfmt__pkw_op(w, '.');
    return w->oom ? zr_err_set(ZR_ENOMEM, "out of memory") : 0;
}

/* ---------------------------------------------------------------- the export */

/* The two files into directory tmp, committed once the source verified (v joined). */
static int write_dir(dcp_job *j, zfmt__verify **v, const char *tmp, const char *dir)
{
    char path[4200];
    zfmt__out *data = NULL, *md = NULL;
    zfmt__pkw w = {0};
    snprintf(path, sizeof path, "%s/%s", tmp, DISTCP);
    int rc = zfmt__out_open(&data, path);
    uint64_t at = 0, total = 0;
    for (size_t i = 0; i < j->n; i++)
        total += j->it[i].is_bytes || j->it[i].scalar
                     ? 0 : j->it[i].ti.numel * zck_dtype_size(j->it[i].dtype);
    zfmt__prog_init(&j->pr, j->progress, "export", total);
    for (size_t i = 0; !rc && i < j->n; i++) {
        rc = write_item(j, &j->it[i], data, at, (unsigned)i);
        at += j->it[i].len;
    }
    if (!rc)
        rc = metadata(&w, j, dir);
    snprintf(path, sizeof path, "%s/.metadata", tmp);
    if (!rc)
        rc = zfmt__out_open(&md, path);
    if (!rc)
        rc = zfmt__out_write(md, w.b, w.n);
    zfmt__pkw_free(&w);
    int vrc = zfmt__verify_join(*v);
    *v = NULL;
    rc = rc ? rc : vrc;
    if (!rc)
        rc = zfmt__out_commit(data);
    if (!rc)
        rc = zfmt__out_commit(md);
    if (!rc)
        rc = zfmt__fsync_dir_of(path);
    zfmt__out_free(data);
    zfmt__out_free(md);
    return rc;
}

int zfmt_dcp_export(const char *ckpt, const char *out_dir, const zfmt_dcp_opts *o)
{
    zfmt_dcp_opts def = ZFMT_DCP_OPTS_INIT;
    if (!o)
        o = &def;
    char dir[4096], tmp[4096];
    int exists;
    ZR_TRY(zfmt__dir_tmp(dir, tmp, out_dir));
    ZR_TRY(zfmt__dir_check(dir, o->force, is_dcp_file, "a DCP export", &exists));
    dcp_job j = {0};
    zfmt__verify *v = NULL;
    int rc = zfmt__open_verifying(&j.r, &v, ckpt);
    if (!rc)
        rc = plan(&j, o->optim);
    j.ro = (zck_read_opts)ZCK_READ_OPTS_INIT;
    j.ro.verify = 0; /* verified in full alongside */
    j.ro.jobs = 1;
    j.ro.io.io = ZCK_IO_BUFFERED; /* from the page cache the verification filled */
    j.progress = &o->progress;
    if (!rc && (!(j.buf = malloc(COPY_BYTES)) ||
                (j.tcap && !(j.tbuf = malloc(2 * j.tcap)))))
        rc = zr_err_set(ZR_ENOMEM, "out of memory");
    int made = 0;
    if (!rc && mkdir(tmp, 0755) < 0)
        rc = zr_err_sys(errno, "%s: create", tmp);
    else if (!rc)
        made = 1;
    if (!rc)
        rc = write_dir(&j, &v, tmp, dir);
    if (v)
        rc = zfmt__verify_settle(v, rc);
    if (!rc)
        rc = zfmt__dir_put(tmp, dir, exists, is_dcp_file);
    if (rc && made)
        zfmt__dir_remove(tmp, is_dcp_file);
    free_job(&j);
    return rc;
}
