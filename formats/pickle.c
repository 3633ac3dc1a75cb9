/*
 * pickle.c: a restricted unpickler for the pickles inside torch.save files (data.pkl, protocol
 * 2) and DCP's .metadata (protocol 4 or 5). It builds plain values (zfmt__pv) and never calls
 * anything: a GLOBAL must be on the allowlist below (torch's weights_only globals, the
 * DeepSpeed enums, loss scalers and fragment addresses, DCP's metadata classes), and what a
 * REDUCE or NEWOBJ of it would construct is described instead: a tensor view, a dict, a set,
 * bytes, or an opaque OBJECT of the class with its arguments and BUILD state. Every value and
 * the memo are charged against a byte budget, so a hostile pickle costs bounded memory; values
 * may be shared (the memo) and even form cycles, so readers walk them with a depth bound.
 */
#include "foreign.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* what a REDUCE / NEWOBJ of an allowed global builds */
typedef enum {
    H_VALUE,      /* a value only (a dtype, a storage class, torch.Tensor): not callable */
    H_OBJECT,     /* an opaque OBJECT(cls, args) */
    H_TENSOR_V2,  /* torch._utils._rebuild_tensor_v2 */
    H_TENSOR_V3,  /* torch._utils._rebuild_tensor_v3 */
    H_PARAM,      /* torch._utils._rebuild_parameter(_with_state): its first argument */
    H_FROM_TYPE,  /* torch._tensor._rebuild_from_type_v2(func, type, args, state) */
    H_DICT,       /* collections.OrderedDict, collections.Counter */
    H_SET,        /* builtins.set, builtins.frozenset */
    H_ENCODE,     /* _codecs.encode(str, 'latin1'): bytes */
    H_BYTES,      /* builtins.bytes, builtins.bytearray */
    H_TUPLE,      /* torch.Size(tuple) */
} handling;

static const struct {
    const char *name;
    handling h;
} allowed[] = {
    {"torch._utils._rebuild_tensor_v2", H_TENSOR_V2},
    {"torch._utils._rebuild_tensor_v3", H_TENSOR_V3},
    {"torch._utils._rebuild_parameter", H_PARAM},
    {"torch._utils._rebuild_parameter_with_state", H_PARAM},
    {"torch._tensor._rebuild_from_type_v2", H_FROM_TYPE},
    {"collections.OrderedDict", H_DICT},
    {"collections.Counter", H_DICT},
    {"builtins.set", H_SET},
    {"builtins.frozenset", H_SET},
    {"_codecs.encode", H_ENCODE},
    {"builtins.bytes", H_BYTES},
    {"builtins.bytearray", H_BYTES},
    {"torch.Size", H_TUPLE},
    {"torch.Tensor", H_VALUE},
    {"torch.nn.parameter.Parameter", H_OBJECT},
    {"torch.device", H_OBJECT},
    {"torch.serialization._get_layout", H_OBJECT},
    /* DeepSpeed (docs/FORMAT.md, "Foreign checkpoints") */
    {"deepspeed.runtime.zero.config.ZeroStageEnum", H_OBJECT},
    {"deepspeed.runtime.fp16.loss_scaler.LossScaler", H_OBJECT},
    {"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", H_OBJECT},
    {"deepspeed.utils.tensor_fragment.fragment_address", H_OBJECT},
    {"deepspeed.checkpoint.universal_checkpoint.SubparamShape", H_OBJECT},
    /* PyTorch DCP's .metadata */
    {"torch.distributed.checkpoint.metadata.Metadata", H_OBJECT},
    {"torch.distributed.checkpoint.metadata.TensorStorageMetadata", H_OBJECT},
    {"torch.distributed.checkpoint.metadata.BytesStorageMetadata", H_OBJECT},
    {"torch.distributed.checkpoint.metadata.ChunkStorageMetadata", H_OBJECT},
    {"torch.distributed.checkpoint.metadata.TensorProperties", H_OBJECT},
    {"torch.distributed.checkpoint.metadata.MetadataIndex", H_OBJECT},
    {"torch.distributed.checkpoint.metadata.StorageMeta", H_OBJECT},
    {"torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING", H_OBJECT},
    {"torch.distributed.checkpoint.filesystem._StorageInfo", H_OBJECT},
    {"pathlib.PosixPath", H_OBJECT},
    {"pathlib.PurePosixPath", H_OBJECT},
    {"pathlib._local.PosixPath", H_OBJECT},
};

/* torch's dtypes and storage classes: values only */
static const struct {
    const char *dtype, *storage;
    int known;
    zck_dtype t;
} dtypes[] = {
    {"float32", "FloatStorage", 1, ZCK_F32},     {"float", NULL, 1, ZCK_F32},
    {"float64", "DoubleStorage", 1, ZCK_F64},    {"double", NULL, 1, ZCK_F64},
    {"float16", "HalfStorage", 1, ZCK_F16},      {"half", NULL, 1, ZCK_F16},
    {"bfloat16", "BFloat16Storage", 1, ZCK_BF16}, {"int64", "LongStorage", 1, ZCK_I64},
    {"long", NULL, 1, ZCK_I64},                  {"int32", "IntStorage", 1, ZCK_I32},
    {"int", NULL, 1, ZCK_I32},                   {"int16", "ShortStorage", 1, ZCK_I16},
    {"short", NULL, 1, ZCK_I16},                 {"int8", "CharStorage", 1, ZCK_I8},
    {"uint8", "ByteStorage", 1, ZCK_U8},         {"uint16", NULL, 1, ZCK_U16},
    {NULL, "UntypedStorage", 1, ZCK_U8},         {"bool", "BoolStorage", 0, ZCK_U8},
    {"complex64", "ComplexFloatStorage", 0, ZCK_U8},
    {"complex128", "ComplexDoubleStorage", 0, ZCK_U8},
    {"uint32", NULL, 0, ZCK_U8},                 {"uint64", NULL, 0, ZCK_U8},
    {"float8_e4m3fn", NULL, 0, ZCK_U8},          {"float8_e5m2", NULL, 0, ZCK_U8},
};

int zfmt__torch_dtype(zck_dtype *out, const char *name)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].dtype && !strcmp(dtypes[i].dtype, name)) {
            *out = dtypes[i].t;
            return dtypes[i].known;
        }
    return 0;
}

struct zfmt__pickle {
    const char *what;
    size_t used, max;          /* bytes charged, the budget */
    zfmt__pv **all;            /* every value, for freeing */
    size_t n_all, cap_all;
    zfmt__pv *root;
};

typedef struct {
    zfmt__pickle *P;
    const unsigned char *d;
    size_t n, pos, op_at;
    zfmt__pv **st; /* the stack; MARK is the sentinel value &mark */
    size_t sn, scap;
    zfmt__pv **memo;
    size_t mcap, mcount; /* slots, slots in use (MEMOIZE stores at mcount, as Python's len) */
} parser;

static zfmt__pv mark_v; /* the MARK sentinel on the stack */

static int fail(parser *p, int code, const char *fmt, const char *arg)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return zr_err_set(code, "%s: %s (pickle opcode at byte %zu)", p->P->what, msg, p->op_at);
}

static int charge(parser *p, size_t bytes)
{
    if (bytes > p->P->max - p->P->used)
        return zr_err_set(ZR_ECORRUPT, "%s: the pickle needs more than %zu bytes of values "
                          "(byte %zu): refused", p->P->what, p->P->max, p->op_at);
    p->P->used += bytes;
    return 0;
}

/* room for one more pointer in *a (of *n used, *cap allocated), doubling it, charged */
static int grow(parser *p, zfmt__pv ***a, size_t n, size_t *cap, size_t first)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? 2 * *cap : first;
    ZR_TRY(charge(p, (c - *cap) * sizeof(void *)));
    zfmt__pv **b = realloc(*a, c * sizeof *b);
    if (!b)
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", p->P->what);
    *a = b;
    *cap = c;
    return 0;
}

static int new_v(parser *p, zfmt__pk_kind kind, zfmt__pv **out)
{
    ZR_TRY(charge(p, sizeof(zfmt__pv)));
    ZR_TRY(grow(p, &p->P->all, p->P->n_all, &p->P->cap_all, 256));
    zfmt__pv *v = calloc(1, sizeof *v);
    if (!v)
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", p->P->what);
    v->kind = kind;
    p->P->all[p->P->n_all++] = v;
    *out = v;
    return 0;
}

static int add_item(parser *p, zfmt__pv *c, zfmt__pv *item)
{
    ZR_TRY(grow(p, &c->items, c->n, &c->cap, 4));
    c->items[c->n++] = item;
    return 0;
}

static int push(parser *p, zfmt__pv *v)
{
    ZR_TRY(grow(p, &p->st, p->sn, &p->scap, 64));
    p->st[p->sn++] = v;
    return 0;
}

static int top(parser *p, zfmt__pv **out)
{
    if (p->sn == 0 || p->st[p->sn - 1] == &mark_v)
        return fail(p, ZR_ECORRUPT, "%s", "the stack is empty where a value was expected");
    *out = p->st[p->sn - 1];
    return 0;
}

static int pop(parser *p, zfmt__pv **out)
{
    ZR_TRY(top(p, out));
    p->sn--;
    return 0;
}

/* the values above the topmost MARK: *first indexes them; the MARK itself at *first - 1 */
static int since_mark(parser *p, size_t *first)
{
    size_t i = p->sn;
    while (i > 0 && p->st[i - 1] != &mark_v)
        i--;
    if (i == 0)
        return fail(p, ZR_ECORRUPT, "%s", "no MARK on the stack");
    *first = i;
    return 0;
}

static int need(parser *p, size_t k, const unsigned char **at)
{
    if (k > p->n - p->pos)
        return fail(p, ZR_ECORRUPT, "%s", "the pickle ends inside an opcode: truncated");
    *at = p->d + p->pos;
    p->pos += k;
    return 0;
}

static uint64_t le(const unsigned char *b, size_t k)
{
    uint64_t v = 0;
    for (size_t i = 0; i < k; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static int push_int(parser *p, int64_t i)
{
    zfmt__pv *v;
    ZR_TRY(new_v(p, ZFMT__PK_INT, &v));
    v->i = i;
    return push(p, v);
}

static int push_text(parser *p, zfmt__pk_kind kind, const unsigned char *s, size_t len)
{
    zfmt__pv *v;
    ZR_TRY(new_v(p, kind, &v));
    ZR_TRY(charge(p, len + 1));
    if (!(v->s = malloc(len + 1)))
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", p->P->what);
    memcpy(v->s, s, len);
    v->s[len] = 0;
    v->len = len;
    return push(p, v);
}

/* a string of k-byte length prefix */
static int op_text(parser *p, zfmt__pk_kind kind, size_t k)
{
    const unsigned char *b = NULL, *s = NULL;
    ZR_TRY(need(p, k, &b));
    uint64_t len = le(b, k);
    if (len > p->n - p->pos)
        return fail(p, ZR_ECORRUPT, "%s", "a string runs past the end of the pickle");
    ZR_TRY(need(p, (size_t)len, &s));
    return push_text(p, kind, s, (size_t)len);
}

static int find_global(const char *name)
{
    for (size_t i = 0; i < sizeof allowed / sizeof *allowed; i++)
        if (!strcmp(allowed[i].name, name))
            return (int)i;
    return -1;
}

/* torch.<dtype> or torch.<Name>Storage: its table row, or -1 */
static int find_dtype(const char *name, int storage)
{
    if (strncmp(name, "torch.", 6))
        return -1;
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++) {
        const char *d = storage ? dtypes[i].storage : dtypes[i].dtype;
        if (d && !strcmp(d, name + 6))
            return (int)i;
    }
    return -1;
}

/* GLOBAL / STACK_GLOBAL of module, name: allowlisted, or refused naming it */
static int push_global(parser *p, const char *module, const char *name)
{
    if (!strcmp(module, "__builtin__"))
        module = "builtins";
    else if (!strcmp(module, "copy_reg"))
        module = "copyreg";
    char full[512], shown[512];
    snprintf(full, sizeof full, "%s.%s", module, name);
    if (find_global(full) < 0 && find_dtype(full, 0) < 0 && find_dtype(full, 1) < 0)
        return fail(p, ZR_ECORRUPT, "pickle global '%s' is not allowed (nothing was executed: "
                    "zero reads plain data and the classes docs/FORMAT.md lists)",
                    zr_printable(shown, sizeof shown, full));
    return push_text(p, ZFMT__PK_GLOBAL, (const unsigned char *)full, strlen(full));
}

static int op_global(parser *p)
{
    /* "module\nname\n" */
    const unsigned char *s = p->d + p->pos, *e1, *e2;
    size_t left = p->n - p->pos;
    if (!(e1 = memchr(s, '\n', left)) || !(e2 = memchr(e1 + 1, '\n', left - (size_t)(e1 + 1 - s))))
        return fail(p, ZR_ECORRUPT, "%s", "GLOBAL without its two lines");
    size_t ml = (size_t)(e1 - s), nl = (size_t)(e2 - e1 - 1);
    if (ml >= 200 || nl >= 200)
        return fail(p, ZR_ECORRUPT, "%s", "GLOBAL names over 200 bytes");
    char module[200], name[200];
    memcpy(module, s, ml);
    module[ml] = 0;
    memcpy(name, e1 + 1, nl);
    name[nl] = 0;
    p->pos += (size_t)(e2 + 1 - s);
    return push_global(p, module, name);
}

static int op_stack_global(parser *p)
{
    zfmt__pv *name, *module;
    ZR_TRY(pop(p, &name));
    ZR_TRY(pop(p, &module));
    if (name->kind != ZFMT__PK_STR || module->kind != ZFMT__PK_STR || name->len >= 200 ||
        module->len >= 200)
        return fail(p, ZR_ECORRUPT, "%s", "STACK_GLOBAL without two strings");
    return push_global(p, module->s, name->s);
}

static int int_arg(const zfmt__pv *v, int64_t *out)
{
    if (v->kind != ZFMT__PK_INT && v->kind != ZFMT__PK_BOOL)
        return -1;
    *out = v->i;
    return 0;
}

/* a tensor view of storage st: offset, size and stride tuples; in bounds of the storage */
static int make_tensor(parser *p, zfmt__pv *st, const zfmt__pv *off, const zfmt__pv *size,
                       const zfmt__pv *stride, zfmt__pv **out)
{
    if (st->kind != ZFMT__PK_STORAGE)
        return fail(p, ZR_ECORRUPT, "%s", "a tensor whose storage is not a storage");
    int64_t o;
    if (int_arg(off, &o) || o < 0 || size->kind != ZFMT__PK_TUPLE ||
        stride->kind != ZFMT__PK_TUPLE || size->n != stride->n || size->n > ZCK_MAX_DIMS)
        return fail(p, ZR_ECORRUPT, "%s", "a tensor with a bad offset, size or stride");
    zfmt__pv *t;
    ZR_TRY(new_v(p, ZFMT__PK_TENSOR, &t));
    t->storage = st;
    t->dtype = st->dtype;
    t->dtype_known = st->dtype_known;
    t->dtype_name = st->dtype_name;
    t->i = o;
    t->ndim = size->n;
    uint64_t numel = 1, last = (uint64_t)o;
    for (size_t k = 0; k < size->n; k++) {
        int64_t a, b;
        if (int_arg(size->items[k], &a) || int_arg(stride->items[k], &b) || a < 0 || b < 0 ||
            a > (int64_t)1 << 48 || b > (int64_t)1 << 48)
            return fail(p, ZR_ECORRUPT, "%s", "a tensor with a bad dimension or stride");
        t->size[k] = (uint64_t)a;
        t->stride[k] = b;
        numel = a && numel > UINT64_MAX / (uint64_t)a ? UINT64_MAX : numel * (uint64_t)a;
        uint64_t reach;
        if (a && (__builtin_mul_overflow((uint64_t)(a - 1), (uint64_t)b, &reach) ||
                  __builtin_add_overflow(last, reach, &last)))
            return fail(p, ZR_ECORRUPT, "%s", "a tensor view reaches past 2^64 elements");
    }
    if (numel && (uint64_t)st->i <= last)
        return fail(p, ZR_ECORRUPT, "%s", "a tensor view reaches past the end of its storage");
    *out = t;
    return 0;
}

/* a storage from BINPERSID's ('storage', class, key, location, numel) */
static int op_persid(parser *p)
{
    zfmt__pv *pid, *st;
    ZR_TRY(pop(p, &pid));
    if (pid->kind != ZFMT__PK_TUPLE || pid->n != 5 || pid->items[0]->kind != ZFMT__PK_STR ||
        strcmp(pid->items[0]->s, "storage") || pid->items[1]->kind != ZFMT__PK_GLOBAL ||
        pid->items[2]->kind != ZFMT__PK_STR || pid->items[3]->kind != ZFMT__PK_STR ||
        pid->items[4]->kind != ZFMT__PK_INT || pid->items[4]->i < 0)
        return fail(p, ZR_ECORRUPT, "%s", "a persistent id that is not ('storage', class, key, "
                    "location, numel)");
    int d = find_dtype(pid->items[1]->s, 1);
    if (d < 0)
        return fail(p, ZR_ECORRUPT, "'%s' is not a storage class", pid->items[1]->s);
    if (pid->items[2]->len == 0 || pid->items[2]->len > 64 || strchr(pid->items[2]->s, '/'))
        return fail(p, ZR_ECORRUPT, "%s", "a storage key that is not a plain record name");
    ZR_TRY(new_v(p, ZFMT__PK_STORAGE, &st));
    st->s = pid->items[2]->s; /* shared with the tuple's string: freed once, there */
    st->len = pid->items[2]->len;
    st->i = pid->items[4]->i;
    st->dtype = dtypes[d].t;
    st->dtype_known = dtypes[d].known;
    st->dtype_name = dtypes[d].dtype ? dtypes[d].dtype : "uint8";
    st->state = pid; /* keeps the key's owner reachable */
    return push(p, st);
}

static int reduce_tensor(parser *p, handling h, zfmt__pv *a, zfmt__pv **out)
{
    if (h == H_TENSOR_V2 && a->n >= 4)
        return make_tensor(p, a->items[0], a->items[1], a->items[2], a->items[3], out);
    if (h == H_TENSOR_V3 && a->n >= 7 && a->items[6]->kind == ZFMT__PK_GLOBAL) {
        int d = find_dtype(a->items[6]->s, 0);
        zfmt__pv *st = a->items[0], *typed;
        if (d < 0 || st->kind != ZFMT__PK_STORAGE)
            return fail(p, ZR_ECORRUPT, "%s", "_rebuild_tensor_v3 of a bad dtype or storage");
        /* the untyped storage counts bytes: view it in elements of the dtype */
        size_t es = dtypes[d].known ? zck_dtype_size(dtypes[d].t) : 1;
        ZR_TRY(new_v(p, ZFMT__PK_STORAGE, &typed));
        *typed = *st;
        typed->i = st->i / (int64_t)es;
        typed->dtype = dtypes[d].t;
        typed->dtype_known = dtypes[d].known;
        typed->dtype_name = dtypes[d].dtype;
        typed->s = st->s;
        typed->items = NULL;
        typed->n = typed->cap = 0;
        return make_tensor(p, typed, a->items[1], a->items[2], a->items[3], out);
    }
    if (h == H_PARAM && a->n >= 1 && a->items[0]->kind == ZFMT__PK_TENSOR) {
        *out = a->items[0];
        return 0;
    }
    if (h == H_FROM_TYPE && a->n == 4 && a->items[0]->kind == ZFMT__PK_GLOBAL &&
        a->items[2]->kind == ZFMT__PK_TUPLE) {
        int g = find_global(a->items[0]->s);
        if (g >= 0 && (allowed[g].h == H_TENSOR_V2 || allowed[g].h == H_TENSOR_V3))
            return reduce_tensor(p, allowed[g].h, a->items[2], out);
    }
    return fail(p, ZR_ECORRUPT, "%s", "a tensor rebuild call with arguments torch never writes");
}

/* REDUCE(callable, args) and NEWOBJ(cls, args), described, never called */
static int construct(parser *p, zfmt__pv *fn, zfmt__pv *args)
{
    if (fn->kind != ZFMT__PK_GLOBAL)
        return fail(p, ZR_ECORRUPT, "%s", "REDUCE or NEWOBJ of something that is not a global");
    if (args->kind != ZFMT__PK_TUPLE)
        return fail(p, ZR_ECORRUPT, "%s", "REDUCE or NEWOBJ whose arguments are not a tuple");
    int g = find_global(fn->s);
    handling h = g < 0 ? H_VALUE : allowed[g].h;
    zfmt__pv *v = NULL;
    switch (h) {
    case H_VALUE:
        return fail(p, ZR_ECORRUPT, "'%s' is not callable here", fn->s);
    case H_TENSOR_V2:
    case H_TENSOR_V3:
    case H_PARAM:
    case H_FROM_TYPE:
        ZR_TRY(reduce_tensor(p, h, args, &v));
        break;
    case H_DICT:
    case H_SET:
    case H_TUPLE:
        ZR_TRY(new_v(p, h == H_DICT ? ZFMT__PK_DICT : h == H_SET ? ZFMT__PK_SET : ZFMT__PK_TUPLE,
                     &v));
        if (args->n == 1 && (args->items[0]->kind == ZFMT__PK_LIST ||
                             args->items[0]->kind == ZFMT__PK_TUPLE)) {
            const zfmt__pv *l = args->items[0];
            for (size_t i = 0; i < l->n; i++) {
                if (h != H_DICT) {
                    ZR_TRY(add_item(p, v, l->items[i]));
                    continue;
                }
                if (l->items[i]->kind != ZFMT__PK_TUPLE || l->items[i]->n != 2)
                    return fail(p, ZR_ECORRUPT, "'%s' of items that are not pairs", fn->s);
                ZR_TRY(add_item(p, v, l->items[i]->items[0]));
                ZR_TRY(add_item(p, v, l->items[i]->items[1]));
            }
        } else if (args->n) {
            return fail(p, ZR_ECORRUPT, "'%s' with arguments torch never writes", fn->s);
        }
        break;
    case H_ENCODE:
    case H_BYTES: {
        const zfmt__pv *s = args->n ? args->items[0] : NULL;
        if (s && s->kind == ZFMT__PK_BYTES)
            return push(p, args->items[0]);
        if (s && s->kind != ZFMT__PK_STR)
            return fail(p, ZR_ECORRUPT, "'%s' of something that is not text", fn->s);
        /* latin-1: each code point below 256 one byte (from its UTF-8) */
        ZR_TRY(new_v(p, ZFMT__PK_BYTES, &v));
        ZR_TRY(charge(p, (s ? s->len : 0) + 1));
        if (!(v->s = malloc((s ? s->len : 0) + 1)))
            return zr_err_set(ZR_ENOMEM, "%s: out of memory", p->P->what);
        for (size_t i = 0; s && i < s->len; i++) {
            unsigned char c = (unsigned char)s->s[i];
            if (c >= 0xc4 || (c >= 0x80 && c < 0xc2))
                return fail(p, ZR_ECORRUPT, "%s", "bytes encoded beyond latin-1");
            if (c >= 0xc2) {
                if (i + 1 >= s->len)
                    return fail(p, ZR_ECORRUPT, "%s", "bad UTF-8 in encoded bytes");
                c = (unsigned char)(((c & 3) << 6) | (s->s[++i] & 0x3f));
            }
            v->s[v->len++] = (char)c;
        }
        v->s[v->len] = 0;
        break;
    }
    case H_OBJECT:
        ZR_TRY(new_v(p, ZFMT__PK_OBJECT, &v));
        v->cls = fn;
        v->args = args;
        break;
    }
    return push(p, v);
}

static int op_build(parser *p)
{
    zfmt__pv *state, *obj;
    ZR_TRY(pop(p, &state));
    ZR_TRY(top(p, &obj));
    if (obj->kind == ZFMT__PK_OBJECT) {
        obj->state = state;
        return 0;
    }
    /* an OrderedDict's _metadata, a tensor's Python attributes (DeepSpeed's ds_id): kept out */
    if (obj->kind == ZFMT__PK_DICT || obj->kind == ZFMT__PK_TENSOR)
        return 0;
    return fail(p, ZR_ECORRUPT, "%s", "BUILD on a value that takes no state");
}

/* TUPLE, LIST, DICT, FROZENSET from the values above the MARK; APPENDS, SETITEMS, ADDITEMS
 * onto the container under it */
static int op_marked(parser *p, unsigned char op)
{
    size_t first;
    ZR_TRY(since_mark(p, &first));
    size_t k = p->sn - first;
    zfmt__pv *c;
    int build = op == 't' || op == 'l' || op == 'd' || op == 0x91;
    if (build) {
        ZR_TRY(new_v(p, op == 't' ? ZFMT__PK_TUPLE : op == 'l' ? ZFMT__PK_LIST
                        : op == 'd' ? ZFMT__PK_DICT : ZFMT__PK_SET, &c));
    } else {
        if (first < 2 || p->st[first - 2] == &mark_v)
            return fail(p, ZR_ECORRUPT, "%s", "no container under the MARK");
        c = p->st[first - 2];
        zfmt__pk_kind want = op == 'e' ? ZFMT__PK_LIST : op == 'u' ? ZFMT__PK_DICT
                                                                    : ZFMT__PK_SET;
        if (c->kind != want)
            return fail(p, ZR_ECORRUPT, "%s", "APPENDS, SETITEMS or ADDITEMS on the wrong kind "
                        "of container");
    }
    if ((op == 'd' || op == 'u') && k % 2)
        return fail(p, ZR_ECORRUPT, "%s", "a key without its value");
    for (size_t i = first; i < p->sn; i++)
        ZR_TRY(add_item(p, c, p->st[i]));
    p->sn = first - 1; /* the values and the MARK */
    return build ? push(p, c) : 0;
}

static int op_memo(parser *p, uint64_t idx, int put)
{
    if (put) {
        zfmt__pv *v = NULL;
        ZR_TRY(top(p, &v));
        if (idx >= p->mcap) {
            if (idx > ((size_t)1 << 30))
                return fail(p, ZR_ECORRUPT, "%s", "a memo index over 2^30");
            size_t cap = p->mcap ? p->mcap : 64;
            while (cap <= idx)
                cap *= 2;
            ZR_TRY(charge(p, (cap - p->mcap) * sizeof(void *)));
            zfmt__pv **m = realloc(p->memo, cap * sizeof *m);
            if (!m)
                return zr_err_set(ZR_ENOMEM, "%s: out of memory", p->P->what);
            memset(m + p->mcap, 0, (cap - p->mcap) * sizeof *m);
            p->memo = m;
            p->mcap = cap;
        }
        p->mcount += !p->memo[idx];
        p->memo[idx] = v;
        return 0;
    }
    if (idx >= p->mcap || !p->memo[idx])
        return fail(p, ZR_ECORRUPT, "%s", "a memo read of an index never stored");
    return push(p, p->memo[idx]);
}

static int op_small(parser *p, unsigned char op)
{
    zfmt__pv *v = NULL, *a = NULL, *b = NULL;
    switch (op) {
    case 'N':
    case 0x88:
    case 0x89:
        ZR_TRY(new_v(p, op == 'N' ? ZFMT__PK_NONE : ZFMT__PK_BOOL, &v));
        v->i = op == 0x88;
        return push(p, v);
    case ')':
    case ']':
    case '}':
    case 0x8f:
        ZR_TRY(new_v(p, op == ')' ? ZFMT__PK_TUPLE : op == ']' ? ZFMT__PK_LIST
                        : op == '}' ? ZFMT__PK_DICT : ZFMT__PK_SET, &v));
        return push(p, v);
    case 0x85:
    case 0x86:
    case 0x87: {
        size_t k = (size_t)(op - 0x84);
        if (p->sn < k)
            return fail(p, ZR_ECORRUPT, "%s", "TUPLE1-3 on a short stack");
        ZR_TRY(new_v(p, ZFMT__PK_TUPLE, &v));
        for (size_t i = p->sn - k; i < p->sn; i++) {
            if (p->st[i] == &mark_v)
                return fail(p, ZR_ECORRUPT, "%s", "TUPLE1-3 over a MARK");
            ZR_TRY(add_item(p, v, p->st[i]));
        }
        p->sn -= k;
        return push(p, v);
    }
    case 'a':
        ZR_TRY(pop(p, &a));
        ZR_TRY(top(p, &v));
        if (v->kind != ZFMT__PK_LIST)
            return fail(p, ZR_ECORRUPT, "%s", "APPEND to something that is not a list");
        return add_item(p, v, a);
    case 's':
        ZR_TRY(pop(p, &b));
        ZR_TRY(pop(p, &a));
        ZR_TRY(top(p, &v));
        if (v->kind != ZFMT__PK_DICT)
            return fail(p, ZR_ECORRUPT, "%s", "SETITEM on something that is not a dict");
        ZR_TRY(add_item(p, v, a));
        return add_item(p, v, b);
    case 'R':
    case 0x81:
        ZR_TRY(pop(p, &b));
        ZR_TRY(pop(p, &a));
        return construct(p, a, b);
    case 0x92: /* NEWOBJ_EX: cls, args, kwargs */
        ZR_TRY(pop(p, &v));
        ZR_TRY(pop(p, &b));
        ZR_TRY(pop(p, &a));
        if (v->kind != ZFMT__PK_DICT || v->n)
            return fail(p, ZR_ECORRUPT, "%s", "NEWOBJ_EX with keyword arguments");
        return construct(p, a, b);
    case '0':
        return pop(p, &v);
    case '1': {
        size_t first;
        ZR_TRY(since_mark(p, &first));
        p->sn = first - 1;
        return 0;
    }
    case '2':
        ZR_TRY(top(p, &v));
        return push(p, v);
    case '(':
        return push(p, &mark_v);
    }
    return 1; /* not one of these */
}

static int op_wide(parser *p, unsigned char op)
{
    const unsigned char *b = NULL;
    switch (op) {
    case 0x80: /* PROTO */
        ZR_TRY(need(p, 1, &b));
        if (b[0] < 2 || b[0] > 5)
            return fail(p, ZR_EUNSUPPORTED, "%s", "a pickle protocol other than 2 to 5");
        return 0;
    case 0x95: /* FRAME: a length to skip */
        return need(p, 8, &b);
    case 'K':
        ZR_TRY(need(p, 1, &b));
        return push_int(p, b[0]);
    case 'M':
        ZR_TRY(need(p, 2, &b));
        return push_int(p, (int64_t)le(b, 2));
    case 'J':
        ZR_TRY(need(p, 4, &b));
        return push_int(p, (int32_t)(uint32_t)le(b, 4));
    case 0x8a: { /* LONG1: little-endian two's complement of n bytes */
        ZR_TRY(need(p, 1, &b));
        size_t k = b[0];
        if (k > 8)
            return fail(p, ZR_EUNSUPPORTED, "%s", "an integer wider than 64 bits");
        ZR_TRY(need(p, k, &b));
        uint64_t u = le(b, k);
        if (k && k < 8 && (b[k - 1] & 0x80))
            u |= ~(uint64_t)0 << (8 * k);
        return push_int(p, (int64_t)u);
    }
    case 'G': {
        ZR_TRY(need(p, 8, &b));
        uint64_t u = 0;
        for (int i = 0; i < 8; i++)
            u = u << 8 | b[i]; /* big-endian */
        zfmt__pv *v;
        ZR_TRY(new_v(p, ZFMT__PK_FLOAT, &v));
        memcpy(&v->f, &u, 8);
        return push(p, v);
    }
    case 'X':
        return op_text(p, ZFMT__PK_STR, 4);
    case 0x8c:
        return op_text(p, ZFMT__PK_STR, 1);
    case 0x8d:
        return op_text(p, ZFMT__PK_STR, 8);
    case 'U':
        return op_text(p, ZFMT__PK_STR, 1);
    case 'T':
        return op_text(p, ZFMT__PK_STR, 4);
    case 'C':
        return op_text(p, ZFMT__PK_BYTES, 1);
    case 'B':
        return op_text(p, ZFMT__PK_BYTES, 4);
    case 0x8e:
    case 0x96:
        return op_text(p, ZFMT__PK_BYTES, 8);
    case 'q':
        ZR_TRY(need(p, 1, &b));
        return op_memo(p, b[0], 1);
    case 'r':
        ZR_TRY(need(p, 4, &b));
        return op_memo(p, le(b, 4), 1);
    case 'h':
        ZR_TRY(need(p, 1, &b));
        return op_memo(p, b[0], 0);
    case 'j':
        ZR_TRY(need(p, 4, &b));
        return op_memo(p, le(b, 4), 0);
    case 'c':
        return op_global(p);
    case 0x93:
        return op_stack_global(p);
    case 'Q':
        return op_persid(p);
    case 'b':
        return op_build(p);
    case 't':
    case 'l':
    case 'd':
    case 'e':
    case 'u':
    case 0x90:
    case 0x91:
        return op_marked(p, op);
    }
    return 1;
}

static int run(parser *p)
{
    while (p->pos < p->n) {
        p->op_at = p->pos;
        unsigned char op = p->d[p->pos++];
        if (op == '.') {
            if (p->sn != 1 || p->st[0] == &mark_v)
                return fail(p, ZR_ECORRUPT, "%s", "STOP with other than one value on the stack");
            p->P->root = p->st[0];
            return 0;
        }
        if (op == 0x94) {
            ZR_TRY(op_memo(p, p->mcount, 1));
            continue;
        }
        int rc = op_small(p, op);
        if (rc == 1)
            rc = op_wide(p, op);
        if (rc == 1) {
            char hex[8];
            snprintf(hex, sizeof hex, "0x%02x", op);
            return fail(p, ZR_ECORRUPT, "unsupported pickle opcode %s (torch.save and DCP "
                        "never write it)", hex);
        }
        ZR_TRY(rc);
    }
    return fail(p, ZR_ECORRUPT, "%s", "the pickle ends without STOP: truncated");
}

int zfmt__pickle_load(zfmt__pickle **out, const void *data, size_t n, const char *what,
                      size_t max_bytes)
{
    *out = NULL;
    zfmt__pickle *P = calloc(1, sizeof *P);
    if (!P)
        return zr_err_set(ZR_ENOMEM, "%s: out of memory", what);
    P->what = what;
    P->max = max_bytes;
    parser p = {.P = P, .d = data, .n = n};
    int rc = run(&p);
    free(p.st);
    free(p.memo);
    if (rc) {
        zfmt__pickle_free(P);
        return rc;
    }
    P->what = NULL; /* the caller's string may go */
    *out = P;
    return 0;
}

const zfmt__pv *zfmt__pickle_root(const zfmt__pickle *p) { return p->root; }

void zfmt__pickle_free(zfmt__pickle *P)
{
    if (!P)
        return;
    for (size_t i = 0; i < P->n_all; i++) {
        zfmt__pv *v = P->all[i];
        if (v->kind != ZFMT__PK_STORAGE)
            free(v->s);
        free(v->items);
        free(v);
    }
    free(P->all);
    free(P);
}

/* ---------------------------------------------------------------- lookups */

const zfmt__pv *zfmt__pv_get(const zfmt__pv *d, const char *key)
{
    if (!d || d->kind != ZFMT__PK_DICT)
        return NULL;
    for (size_t i = 0; i + 1 < d->n; i += 2)
        if (d->items[i]->kind == ZFMT__PK_STR && !strcmp(d->items[i]->s, key))
            return d->items[i + 1];
    return NULL;
}

const zfmt__pv *zfmt__pv_attr(const zfmt__pv *obj, const char *key)
{
    if (!obj || obj->kind != ZFMT__PK_OBJECT || !obj->state)
        return NULL;
    const zfmt__pv *st = obj->state;
    /* (dict, slots) as objects with __slots__ pickle it, or the dict alone */
    if (st->kind == ZFMT__PK_TUPLE && st->n == 2)
        return zfmt__pv_get(st->items[0], key) ? zfmt__pv_get(st->items[0], key)
                                               : zfmt__pv_get(st->items[1], key);
    return zfmt__pv_get(st, key);
}

int zfmt__pv_int(const zfmt__pv *v, int64_t *out)
{
    if (!v)
        return 0;
    if (v->kind == ZFMT__PK_INT || v->kind == ZFMT__PK_BOOL) {
        *out = v->i;
        return 1;
    }
    if (v->kind == ZFMT__PK_OBJECT && v->args && v->args->n == 1 &&
        v->args->items[0]->kind == ZFMT__PK_INT) {
        *out = v->args->items[0]->i;
        return 1;
    }
    return 0;
}

int zfmt__pv_is(const zfmt__pv *v, const char *global)
{
    return v && v->kind == ZFMT__PK_OBJECT && v->cls && !strcmp(v->cls->s, global);
}

void zfmt__pv_describe(const zfmt__pv *v, char *buf, size_t n)
{
    static const char *const kinds[] = {"None", "bool", "int", "float", "str", "bytes",
                                        "list", "tuple", "dict", "set", "global", "object",
                                        "storage", "tensor"};
    if (!v) {
        snprintf(buf, n, "(absent)");
        return;
    }
    if (v->kind == ZFMT__PK_TENSOR) {
        int k = snprintf(buf, n, "tensor %s [", v->dtype_name);
        for (size_t d = 0; d < v->ndim && k > 0 && (size_t)k < n; d++)
            k += snprintf(buf + k, n - (size_t)k, "%s%llu", d ? ", " : "",
                          (unsigned long long)v->size[d]);
        if (k > 0 && (size_t)k < n)
            snprintf(buf + k, n - (size_t)k, "]");
        return;
    }
    if (v->kind == ZFMT__PK_OBJECT) {
        snprintf(buf, n, "%s object", v->cls->s);
        return;
    }
    if (v->kind == ZFMT__PK_DICT)
        snprintf(buf, n, "dict of %zu", v->n / 2);
    else if (v->kind == ZFMT__PK_LIST || v->kind == ZFMT__PK_TUPLE || v->kind == ZFMT__PK_SET)
        snprintf(buf, n, "%s of %zu", kinds[v->kind], v->n);
    else if (v->kind == ZFMT__PK_INT)
        snprintf(buf, n, "int %lld", (long long)v->i);
    else
        snprintf(buf, n, "%s", kinds[v->kind]);
}

/* ---------------------------------------------------------------- writing */

int zfmt__torch_dtype_names(const char **dtype, const char **storage, zck_dtype t)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].known && dtypes[i].t == t && dtypes[i].dtype && dtypes[i].storage) {
            *dtype = dtypes[i].dtype;
            *storage = dtypes[i].storage;
            return 0;
        }
    return zr_err_set(ZR_EUNSUPPORTED, "dtype %s has no torch storage class", zck_dtype_name(t));
}

void zfmt__pkw_raw(zfmt__pkw *w, const void *p, size_t n)
{
    if (w->oom)
        return;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->n + n)
            cap *= 2;
        unsigned char *b = realloc(w->b, cap);
        if (!b) {
            w->oom = 1;
            return;
        }
        w->b = b;
        w->cap = cap;
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}

void zfmt__pkw_op(zfmt__pkw *w, int op)
{
    unsigned char c = (unsigned char)op;
    zfmt__pkw_raw(w, &c, 1);
}

static void put_le(zfmt__pkw *w, uint64_t v, int n)
{
    unsigned char b[8];
    for (int k = 0; k < n; k++)
        b[k] = (unsigned char)(v >> (8 * k));
    zfmt__pkw_raw(w, b, (size_t)n);
}

void zfmt__pkw_int(zfmt__pkw *w, int64_t v)
{
    if (v >= 0 && v < 256) {
        zfmt__pkw_op(w, 'K'); /* BININT1 */
        put_le(w, (uint64_t)v, 1);
    } else if (v >= 0 && v < 65536) {
        zfmt__pkw_op(w, 'M'); /* BININT2 */
        put_le(w, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        zfmt__pkw_op(w, 'J'); /* BININT */
        put_le(w, (uint64_t)(uint32_t)(int32_t)v, 4);
    } else {
        zfmt__pkw_op(w, 0x8a); /* LONG1: 8 bytes, two's complement */
        put_le(w, 8, 1);
        put_le(w, (uint64_t)v, 8);
    }
}

void zfmt__pkw_float(zfmt__pkw *w, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    unsigned char b[9] = {'G'}; /* BINFLOAT: big-endian */
    for (int k = 0; k < 8; k++)
        b[1 + k] = (unsigned char)(u >> (8 * (7 - k)));
    zfmt__pkw_raw(w, b, 9);
}

void zfmt__pkw_str(zfmt__pkw *w, const char *s)
{
    size_t n = strlen(s);
    zfmt__pkw_op(w, 'X'); /* BINUNICODE */
    put_le(w, (uint64_t)n, 4);
    zfmt__pkw_raw(w, s, n);
}

void zfmt__pkw_global(zfmt__pkw *w, const char *module, const char *name)
{
    zfmt__pkw_op(w, 'c'); /* GLOBAL "module\nname\n" */
    zfmt__pkw_raw(w, module, strlen(module));
    zfmt__pkw_op(w, '\n');
    zfmt__pkw_raw(w, name, strlen(name));
    zfmt__pkw_op(w, '\n');
}

void zfmt__pkw_ints(zfmt__pkw *w, size_t n, const uint64_t *v)
{
    if (n > 3)
        zfmt__pkw_op(w, '(');
    for (size_t k = 0; k < n; k++)
        zfmt__pkw_int(w, (int64_t)v[k]);
    static const char tuple_op[4] = {')', (char)0x85, (char)0x86, (char)0x87};
    zfmt__pkw_op(w, n > 3 ? 't' : (unsigned char)tuple_op[n]);
}

void zfmt__pkw_free(zfmt__pkw *w)
{
    free(w->b);
    *w = (zfmt__pkw){0};
}
