/*
 * layout.c: dtypes, the logical layout (groups of named tensors in a flat index space, states)
 * and the partition rule that maps a world of W ranks onto every group.
 */
#include "zck_int.h"

#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[ZCK_DTYPE_COUNT] = {
    [ZCK_F32] = {"f32", 4}, [ZCK_BF16] = {"bf16", 2}, [ZCK_F16] = {"f16", 2},
    [ZCK_F64] = {"f64", 8}, [ZCK_I64] = {"i64", 8},   [ZCK_I32] = {"i32", 4},
    [ZCK_I16] = {"i16", 2}, [ZCK_U16] = {"u16", 2},   [ZCK_I8] = {"i8", 1},
    [ZCK_U8] = {"u8", 1},
};

size_t zck_dtype_size(zck_dtype t) { return (unsigned)t < ZCK_DTYPE_COUNT ? dtypes[t].size : 0; }

const char *zck_dtype_name(zck_dtype t)
{
    return (unsigned)t < ZCK_DTYPE_COUNT ? dtypes[t].name : "?";
}

int zck_dtype_parse(zck_dtype *out, const char *name)
{
    for (int i = 0; i < ZCK_DTYPE_COUNT; i++)
        if (!strcmp(dtypes[i].name, name)) {
            *out = (zck_dtype)i;
            return 0;
        }
    return zr_err_set(ZR_EINVAL, "unknown dtype '%s' (known: f32 bf16 f16 f64 i64 i32 i16 u16 "
                      "i8 u8)", name);
}

bool zck__name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

bool zck__file_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 255 || name[0] == '.')
        return false;
    if (!strcmp(name, "manifest.json") || !strcmp(name, "SHA256SUMS"))
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f)
            return false;
    }
    return true;
}

bool zck__is_sha256_hex(const char *s)
{
    if (strlen(s) != 64)
        return false;
    for (size_t i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

int zck_layout_new(zck_layout **out)
{
    zck_layout *L = calloc(1, sizeof *L);
    if (!L)
        return zr_err_set(ZR_ENOMEM, "out of memory allocating a layout");
    L->palign = ZCK_PARTITION_ALIGN;
    *out = L;
    return 0;
}

void zck_layout_free(zck_layout *L)
{
    if (!L)
        return;
    for (size_t g = 0; g < L->ng; g++) {
        for (size_t t = 0; t < L->g[g].nt; t++)
            free(L->g[g].t[t].name);
        free(L->g[g].t);
        free(L->g[g].name);
    }
    for (size_t s = 0; s < L->ns; s++)
        free(L->s[s].name);
    free(L->g);
    free(L->s);
    free(L);
}

int zck_layout_add_state(zck_layout *L, const char *name, zck_dtype dtype)
{
    if (!zck__name_ok(name))
        return zr_err_set(ZR_EINVAL, "state name '%s': expected 1-64 characters of "
                          "[A-Za-z0-9_.-]", name);
    if ((unsigned)dtype >= ZCK_DTYPE_COUNT)
        return zr_err_set(ZR_EINVAL, "state '%s': invalid dtype %d", name, (int)dtype);
    for (size_t s = 0; !L->unchecked && s < L->ns; s++)
        if (!strcmp(L->s[s].name, name))
            return zr_err_set(ZR_EINVAL, "state '%s' declared twice", name);
    ZR_TRY(zr_array_grow(&L->s, &L->caps, L->ns, sizeof *L->s));
    if (!(L->s[L->ns].name = strdup(name)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    L->s[L->ns++].dtype = dtype;
    return 0;
}

int zck_layout_add_group(zck_layout *L, size_t *out, const char *name)
{
    if (!name[0] || strlen(name) > 256)
        return zr_err_set(ZR_EINVAL, "group name: expected 1-256 characters");
    for (size_t g = 0; !L->unchecked && g < L->ng; g++)
        if (!strcmp(L->g[g].name, name))
            return zr_err_set(ZR_EINVAL, "group '%s' declared twice", name);
    ZR_TRY(zr_array_grow(&L->g, &L->capg, L->ng, sizeof *L->g));
    if (!(L->g[L->ng].name = strdup(name)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    if (out)
        *out = L->ng;
    L->ng++;
    return 0;
}

int zck_layout_add_tensor(zck_layout *L, size_t g, const char *name, zck_dtype dtype,
                          size_t ndim, const uint64_t *shape)
{
    if (g >= L->ng)
        return zr_err_set(ZR_EINVAL, "tensor '%s': no group %zu", name, g);
    if (!name[0] || strlen(name) > 256)
        return zr_err_set(ZR_EINVAL, "tensor name: expected 1-256 characters");
    if ((unsigned)dtype >= ZCK_DTYPE_COUNT)
        return zr_err_set(ZR_EINVAL, "tensor '%s': invalid dtype %d", name, (int)dtype);
    if (ndim > ZCK_MAX_DIMS)
        return zr_err_set(ZR_EINVAL, "tensor '%s': %zu dimensions, at most %d", name, ndim,
                          ZCK_MAX_DIMS);
    zck__group *G = &L->g[g];
    for (size_t gg = 0; !L->unchecked && gg < L->ng; gg++)
        for (size_t t = 0; t < L->g[gg].nt; t++)
            if (!strcmp(L->g[gg].t[t].name, name))
                return zr_err_set(ZR_EINVAL, "tensor '%s' declared twice", name);
    uint64_t numel = 1;
    for (size_t d = 0; d < ndim; d++) {
        if (shape[d] > ZCK__MAX_NUMEL || (shape[d] && numel > ZCK__MAX_NUMEL / shape[d]))
            return zr_err_set(ZR_EINVAL, "tensor '%s': shape too large", name);
        numel *= shape[d];
    }
    if (G->numel + numel > ZCK__MAX_NUMEL)
        return zr_err_set(ZR_EINVAL, "group '%s': more than 2^50 elements", G->name);
    ZR_TRY(zr_array_grow(&G->t, &G->capt, G->nt, sizeof *G->t));
    zck__tensor *T = &G->t[G->nt];
    if (!(T->name = strdup(name)))
        return zr_err_set(ZR_ENOMEM, "out of memory");
    T->dtype = dtype;
    T->ndim = ndim;
    for (size_t d = 0; d < ndim; d++)
        T->shape[d] = shape[d];
    T->offset = G->numel;
    T->numel = numel;
    G->numel += numel;
    G->nt++;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *zck__first_duplicate(const char **v, size_t n)
{
    if (n < 2)
        return NULL;
    qsort(v, n, sizeof *v, cmp_str);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(v[i - 1], v[i]))
            return v[i];
    return NULL;
}

int zck__layout_check_unique(const zck_layout *L)
{
    size_t nt = 0;
    for (size_t g = 0; g < L->ng; g++)
        nt += L->g[g].nt;
    size_t cap = nt > L->ng ? nt : L->ng;
    cap = cap > L->ns ? cap : L->ns;
    const char **v = malloc((cap ? cap : 1) * sizeof *v);
    if (!v)
        return zr_err_set(ZR_ENOMEM, "out of memory");
    const char *dup;
    int rc = 0;
    for (size_t s = 0; s < L->ns; s++)
        v[s] = L->s[s].name;
    if ((dup = zck__first_duplicate(v, L->ns)))
        rc = zr_err_set(ZR_EINVAL, "state '%s' declared twice", dup);
    for (size_t g = 0; g < L->ng; g++)
        v[g] = L->g[g].name;
    if (!rc && (dup = zck__first_duplicate(v, L->ng)))
        rc = zr_err_set(ZR_EINVAL, "group '%s' declared twice", dup);
    size_t k = 0;
    for (size_t g = 0; g < L->ng; g++)
        for (size_t t = 0; t < L->g[g].nt; t++)
            v[k++] = L->g[g].t[t].name;
    if (!rc && (dup = zck__first_duplicate(v, nt)))
        rc = zr_err_set(ZR_EINVAL, "tensor '%s' declared twice", dup);
    free(v);
    return rc;
}

int zck_layout_set_partition_align(zck_layout *L, uint32_t align)
{
    if (align < 1 || align > (1u << 20))
        return zr_err_set(ZR_EINVAL, "partition alignment %u: expected 1..2^20 elements", align);
    L->palign = align;
    return 0;
}

int zck_layout_copy(zck_layout **out, const zck_layout *L)
{
    zck_layout *c = NULL;
    ZR_TRY(zck_layout_new(&c));
    int rc = 0;
    c->palign = L->palign;
    c->unchecked = true; /* the names of L are unique already */
    for (size_t s = 0; s < L->ns; s++)
        ZR_TRY_GOTO(zck_layout_add_state(c, L->s[s].name, L->s[s].dtype), rc, fail);
    for (size_t g = 0; g < L->ng; g++) {
        ZR_TRY_GOTO(zck_layout_add_group(c, NULL, L->g[g].name), rc, fail);
        for (size_t t = 0; t < L->g[g].nt; t++) {
            const zck__tensor *T = &L->g[g].t[t];
            ZR_TRY_GOTO(zck_layout_add_tensor(c, g, T->name, T->dtype, T->ndim, T->shape), rc,
                        fail);
        }
    }
    c->unchecked = L->unchecked;
    *out = c;
    return 0;
fail:
    zck_layout_free(c);
    return rc;
}

size_t zck_layout_n_groups(const zck_layout *L) { return L->ng; }
size_t zck_layout_n_states(const zck_layout *L) { return L->ns; }
uint32_t zck_layout_partition_align(const zck_layout *L) { return L->palign; }
const char *zck_layout_group_name(const zck_layout *L, size_t g) { return L->g[g].name; }
uint64_t zck_layout_group_numel(const zck_layout *L, size_t g) { return L->g[g].numel; }
size_t zck_layout_group_n_tensors(const zck_layout *L, size_t g) { return L->g[g].nt; }
const char *zck_layout_state_name(const zck_layout *L, size_t s) { return L->s[s].name; }
zck_dtype zck_layout_state_dtype(const zck_layout *L, size_t s) { return L->s[s].dtype; }

int zck_layout_find_state(const zck_layout *L, size_t *out, const char *name)
{
    for (size_t s = 0; s < L->ns; s++)
        if (!strcmp(L->s[s].name, name)) {
            *out = s;
            return 0;
        }
    return zr_err_set(ZR_ENOTFOUND, "no state named '%s'", name);
}

int zck_layout_find_group(const zck_layout *L, size_t *out, const char *name)
{
    for (size_t g = 0; g < L->ng; g++)
        if (!strcmp(L->g[g].name, name)) {
            *out = g;
            return 0;
        }
    return zr_err_set(ZR_ENOTFOUND, "no group named '%s'", name);
}

void zck_layout_tensor(const zck_layout *L, size_t g, size_t t, zck_tensor_info *out)
{
    const zck__tensor *T = &L->g[g].t[t];
    memset(out, 0, sizeof *out);
    out->name = T->name;
    out->dtype = T->dtype;
    out->ndim = T->ndim;
    memcpy(out->shape, T->shape, sizeof T->shape);
    out->offset = T->offset;
    out->numel = T->numel;
}

void zck_partition(uint64_t numel, uint32_t world, uint32_t rank, uint32_t align,
                   uint64_t *start, uint64_t *count)
{
    if (world == 0)
        world = 1;
    if (align == 0)
        align = 1;
    uint64_t p = (numel + world - 1) / world;
    p = (p + align - 1) / align * align;
    uint64_t a = (uint64_t)rank * p, b = a + p;
    if (a > numel)
        a = numel;
    if (b > numel)
        b = numel;
    *start = a;
    *count = b - a;
}
