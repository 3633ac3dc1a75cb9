/*
 * zckpt.c: the shard-management CLI. Each subcommand parses its arguments, calls one library
 * function of ckpt/ or formats/, and prints the result (text, or JSON with --json). Exit codes:
 * 0 ok, 1 the check found a problem (verify, diff), 2 usage, I/O or any other error.
 */
#include "common.h"
#include "zfmt.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "zckpt"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *usage;
    const char *help;
} command;

static const command *current;

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, PROG ": error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: " PROG " %s\n(" PROG " %s --help for details)\n", current->usage,
            current->name);
    return ZCLI_ERROR;
}

static bool is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

/* Options: a tiny table-free parser. Each command walks argv itself with these helpers. */
static const char *need_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        usage_error("%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) {
        puts(s);
        free(s);
    }
    json_decref(j);
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* ------------------------------------------------------------------ ls */

static int cmd_ls(int argc, char **argv)
{
    const char *run = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!run)
            run = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!run)
        return usage_error("%s", "missing RUNDIR");
    zck_run_list *l;
    if (zck_run_list_open(&l, run) < 0)
        return zcli_fail_lib(PROG, NULL);
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < l->n; i++) {
            const zck_run_entry *e = &l->ckpt[i];
            json_array_append_new(arr, json_pack(
                "{s:s, s:I, s:i, s:i, s:I, s:s, s:b, s:s}", "name", e->name, "step",
                (json_int_t)e->step, "world_size", (int)e->world, "zero_stage", e->zero_stage,
                "bytes", (json_int_t)e->bytes, "status", zck_ckpt_status_name(e->status),
                "latest", e->is_latest, "detail", e->detail));
        }
        json_t *stale = json_array();
        for (size_t i = 0; i < l->stale.n; i++)
            json_array_append_new(stale, json_string(l->stale.name[i]));
        json_t *foreign = json_array();
        for (size_t i = 0; i < l->foreign.n; i++)
            json_array_append_new(foreign, json_string(l->foreign.name[i]));
        print_json(json_pack("{s:s, s:s?, s:o, s:o, s:o}", "run_dir", run, "latest", l->latest,
                             "checkpoints", arr, "stale", stale, "foreign", foreign));
    } else {
        printf("%-22s %10s %6s %6s %12s  %s\n", "CHECKPOINT", "STEP", "WORLD", "STAGE", "BYTES",
               "STATUS");
        for (size_t i = 0; i < l->n; i++) {
            const zck_run_entry *e = &l->ckpt[i];
            char h[32], det[1280];
            printf("%-22s %10llu %6u %6d %12s  %s%s%s%s\n", e->name,
                   (unsigned long long)e->step, e->world, e->zero_stage,
                   zcli_human(h, (double)e->bytes), zck_ckpt_status_name(e->status),
                   e->is_latest ? " (latest)" : "", e->detail[0] ? ": " : "",
                   zr_printable(det, sizeof det, e->detail));
        }
        if (!l->n)
            printf("(no checkpoints)\n");
        if (!l->latest)
            printf("latest: none\n");
        for (size_t i = 0; i < l->stale.n; i++) {
            char nm[300];
            printf("stale temporary: %s (removed by the next commit or `zckpt prune`)\n",
                   zr_printable(nm, sizeof nm, l->stale.name[i]));
        }
        for (size_t i = 0; i < l->foreign.n; i++)
            printf("not part of the run: %s (not a directory, or a symbolic link)\n",
                   l->foreign.name[i]);
    }
    zck_run_list_free(l);
    return ZCLI_OK;
}

/* ------------------------------------------------------------------ inspect */

static json_t *shards_holding(const zck_reader *r, size_t g, const zck_tensor_info *ti)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < zck_reader_n_shards(r); i++) {
        const zck_shard *s = zck_reader_shard(r, i);
        for (size_t k = 0; k < zck_shard_n_extents(s); k++) {
            zck_extent_info e;
            zck_shard_extent(s, k, &e);
            if (e.group == g && e.state == 0 && e.start < ti->offset + ti->numel &&
                e.start + e.count > ti->offset) {
                json_array_append_new(arr, json_string(zck_shard_file(s)));
                break;
            }
        }
    }
    return arr;
}

static int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0, tensors = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--tensors"))
            tensors = 1;
        else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!path)
            path = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!path)
        return usage_error("%s", "missing CKPT");
    zck_reader *r;
    if (zck_reader_open(&r, path) < 0)
        return zcli_fail_lib(PROG, NULL);
    const zck_layout *L = zck_reader_layout(r);
    uint64_t bytes = 0, params = 0;
    for (size_t i = 0; i < zck_reader_n_shards(r); i++)
        bytes += zck_shard_bytes(zck_reader_shard(r, i));
    for (size_t g = 0; g < zck_layout_n_groups(L); g++)
        params += zck_layout_group_numel(L, g);
    json_t *states = json_array(), *groups = json_array(), *shards = json_array();
    for (size_t s = 0; s < zck_layout_n_states(L); s++)
        json_array_append_new(states, json_pack("{s:s, s:s}", "name",
                                                zck_layout_state_name(L, s), "dtype",
                                                zck_dtype_name(zck_layout_state_dtype(L, s))));
    for (size_t g = 0; g < zck_layout_n_groups(L); g++) {
        json_t *go = json_pack("{s:s, s:I, s:I}", "name", zck_layout_group_name(L, g), "numel",
                               (json_int_t)zck_layout_group_numel(L, g), "tensors",
                               (json_int_t)zck_layout_group_n_tensors(L, g));
        if (tensors) {
            json_t *ts = json_array();
            for (size_t t = 0; t < zck_layout_group_n_tensors(L, g); t++) {
                zck_tensor_info ti;
                zck_layout_tensor(L, g, t, &ti);
                json_t *shape = json_array();
                for (size_t d = 0; d < ti.ndim; d++)
                    json_array_append_new(shape, json_integer((json_int_t)ti.shape[d]));
                json_array_append_new(ts, json_pack("{s:s, s:s, s:o, s:I, s:I, s:o}", "name",
                                                    ti.name, "dtype", zck_dtype_name(ti.dtype),
                                                    "shape", shape, "offset",
                                                    (json_int_t)ti.offset, "numel",
                                                    (json_int_t)ti.numel, "shards",
                                                    shards_holding(r, g, &ti)));
            }
            json_object_set_new(go, "tensors", ts);
        }
        json_array_append_new(groups, go);
    }
    for (size_t i = 0; i < zck_reader_n_shards(r); i++) {
        const zck_shard *s = zck_reader_shard(r, i);
        json_array_append_new(shards, json_pack("{s:s, s:i, s:I, s:s, s:I}", "file",
                                                zck_shard_file(s), "rank",
                                                (int)zck_shard_rank(s), "bytes",
                                                (json_int_t)zck_shard_bytes(s), "sha256",
                                                zck_shard_sha256(s), "extents",
                                                (json_int_t)zck_shard_n_extents(s)));
    }
    json_error_t je;
    json_t *model = json_loads(zck_reader_model_json(r), 0, &je);
    json_t *training = json_loads(zck_reader_training_json(r), 0, &je);
    json_t *root = json_pack("{s:s, s:s, s:I, s:s, s:s, s:i, s:i, s:I, s:I, s:o, s:o, s:o, s:o,"
                             " s:o}",
                             "path", zck_reader_path(r), "version", zck_reader_version(r),
                             "step", (json_int_t)zck_reader_step(r), "created",
                             zck_reader_created(r), "producer", zck_reader_producer(r),
                             "world_size", (int)zck_reader_world(r), "zero_stage",
                             zck_reader_zero_stage(r), "elements_per_state", (json_int_t)params,
                             "bytes", (json_int_t)bytes, "model", model, "training", training,
                             "states", states, "groups", groups, "shards", shards);
    if (json) {
        print_json(root);
    } else {
        char h[32], b1[300], b2[300];
        printf("checkpoint   %s\n", zck_reader_path(r));
        printf("format       zckpt %s, written %s by %s\n", zck_reader_version(r),
               zr_printable(b1, sizeof b1, zck_reader_created(r)),
               zr_printable(b2, sizeof b2, zck_reader_producer(r)));
        printf("step         %llu\n", (unsigned long long)zck_reader_step(r));
        printf("world        %u ranks, ZeRO stage %d\n", zck_reader_world(r),
               zck_reader_zero_stage(r));
        printf("model        %s\n", zck_reader_model_json(r));
        printf("training     %s\n", zck_reader_training_json(r));
        printf("elements     %llu per state, %zu groups\n", (unsigned long long)params,
               zck_layout_n_groups(L));
        printf("states      ");
        for (size_t s = 0; s < zck_layout_n_states(L); s++)
            printf(" %s (%s)", zck_layout_state_name(L, s),
                   zck_dtype_name(zck_layout_state_dtype(L, s)));
        printf("\nshards       %zu files, %s\n", zck_reader_n_shards(r),
               zcli_human(h, (double)bytes));
        if (tensors) {
            printf("\n%-40s %-5s %-20s %s\n", "TENSOR", "DTYPE", "SHAPE", "SHARDS (param)");
            size_t gi = 0;
            json_t *go;
            json_array_foreach(groups, gi, go) {
                size_t ti;
                json_t *t;
                json_array_foreach(json_object_get(go, "tensors"), ti, t) {
                    char shape[128] = "[", *p = shape + 1;
                    size_t di;
                    json_t *d;
                    json_array_foreach(json_object_get(t, "shape"), di, d)
                        p += snprintf(p, sizeof shape - (size_t)(p - shape) - 2, "%s%lld",
                                      di ? ", " : "", (long long)json_integer_value(d));
                    strcat(shape, "]");
                    printf("%-40s %-5s %-20s",
                           zr_printable(b1, sizeof b1,
                                        json_string_value(json_object_get(t, "name"))),
                           json_string_value(json_object_get(t, "dtype")), shape);
                    size_t si;
                    json_t *sh;
                    json_array_foreach(json_object_get(t, "shards"), si, sh)
                        printf(" %s", zr_printable(b2, sizeof b2, json_string_value(sh)));
                    printf("\n");
                }
            }
        }
        json_decref(root);
    }
    zck_reader_free(r);
    return ZCLI_OK;
}

/* ------------------------------------------------------------------ verify */

static bool is_archive(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmd_verify(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    zck_verify_opts o = ZCK_VERIFY_OPTS_INIT;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--quick"))
            o.quick = 1;
        else if (!strcmp(argv[i], "--jobs")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_u32(PROG, "--jobs", v, 1, 256, &o.jobs))
                return ZCLI_ERROR;
        } else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!path)
            path = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!path)
        return usage_error("%s", "missing CKPT");
    zcli_bar bar;
    o.progress = zcli_progress_init(&bar);
    zck_report *rep;
    int rc = is_archive(path) ? zfmt_archive_verify(&rep, path, &o.progress)
                              : zck_verify(&rep, path, &o);
    zcli_progress_end(&bar);
    if (rc < 0)
        return zcli_fail_lib(PROG, NULL);
    size_t n = zck_report_count(rep);
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++) {
            const zck_problem *p = zck_report_get(rep, i);
            json_array_append_new(arr, json_pack("{s:s, s:s, s:s}", "file", p->file, "kind",
                                                 zck_problem_kind_name(p->kind), "detail",
                                                 p->detail));
        }
        print_json(json_pack("{s:s, s:b, s:b, s:I, s:o}", "path", path, "sound", n == 0,
                             "quick", o.quick, "bytes_hashed",
                             (json_int_t)zck_report_bytes_hashed(rep), "problems", arr));
    } else {
        for (size_t i = 0; i < n; i++) {
            const zck_problem *p = zck_report_get(rep, i);
            char f[300], det[1280];
            printf("%s: %s: %s\n", zr_printable(f, sizeof f, p->file),
                   zck_problem_kind_name(p->kind), zr_printable(det, sizeof det, p->detail));
        }
        char h[32];
        if (n)
            printf("%s: %zu problem%s found\n", path, n, n == 1 ? "" : "s");
        else
            printf("%s: sound (%s, %s hashed)\n", path,
                   o.quick ? "quick check: presence, sizes, coverage" : "all checks",
                   zcli_human(h, (double)zck_report_bytes_hashed(rep)));
    }
    zck_report_free(rep);
    return n ? ZCLI_FOUND : ZCLI_OK;
}

/* ------------------------------------------------------------------ reshard, consolidate */

/* Write a new run directory at out through fn(tmp), then move it into place: when out exists
 * (only with force) the old one is removed only after the new one is complete. */
static int into_place(const char *out, bool force, int (*fn)(const char *tmp, void *), void *ctx)
{
    if (exists(out) && !force)
        return zcli_fail(PROG, "choose another output, or pass --force to replace it",
                         "%s: already exists", out);
    char tmp[4096], old[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());
    snprintf(old, sizeof old, "%s.old-%ld", out, (long)getpid());
    if (fn(tmp, ctx) < 0) {
        int rc = zcli_fail_lib(PROG, NULL);
        if (exists(tmp) && zck_remove_tree(tmp) < 0)
            fprintf(stderr, PROG ": warning: %s\n", zr_err_msg());
        return rc;
    }
    bool had = exists(out);
    if (had && rename(out, old) < 0)
        return zcli_fail(PROG, NULL, "rename %s -> %s: %s (the new one is in %s)", out, old,
                         strerror(errno), tmp);
    if (rename(tmp, out) < 0)
        return zcli_fail(PROG, NULL, "rename %s -> %s: %s (the old one is in %s)", tmp, out,
                         strerror(errno), had ? old : "nowhere");
    if (had && zck_remove_tree(old) < 0)
        fprintf(stderr, PROG ": warning: the old output stays in %s: %s\n", old, zr_err_msg());
    return ZCLI_OK;
}

typedef struct {
    const char *src;
    uint32_t world;
    zck_reshard_opts o;
} reshard_ctx;

static int do_reshard(const char *tmp, void *vctx)
{
    reshard_ctx *c = vctx;
    return zck_reshard(NULL, c->src, tmp, c->world, &c->o);
}

static int reshard_common(const char *src, const char *out, uint32_t world, bool force,
                          zck_reshard_opts *o)
{
    zcli_bar bar;
    o->progress = zcli_progress_init(&bar);
    reshard_ctx c = {src, world, *o};
    int rc = into_place(out, force, do_reshard, &c);
    zcli_progress_end(&bar);
    if (rc == ZCLI_OK)
        printf("%s: world %u checkpoint of %s\n", out, world, src);
    return rc;
}

static int cmd_reshard(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *v;
    uint32_t world = 0;
    bool force = false;
    zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--world")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_u32(PROG, "--world", v, 1, ZCK_MAX_WORLD, &world))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (!(out = need_value(argc, argv, &i)))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--buffer")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_size(PROG, "--buffer", v, &o.buf_bytes))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--jobs")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_u32(PROG, "--jobs", v, 1, 64, &o.jobs))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--force"))
            force = true;
        else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!src)
            src = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!src || !out || !world)
        return usage_error("%s", !src ? "missing CKPT" : !out ? "missing -o OUT"
                                                             : "missing --world N");
    return reshard_common(src, out, world, force, &o);
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static bool parse_dtype(const char *v, int *out)
{
    zck_dtype t;
    if (zck_dtype_parse(&t, v) < 0 || (t != ZCK_F32 && t != ZCK_BF16 && t != ZCK_F16)) {
        zcli_fail(PROG, NULL, "--dtype '%s': expected f32, bf16 or f16", v);
        return false;
    }
    *out = (int)t;
    return true;
}

static int export_st(const char *src, const char *out, bool force, zfmt_st_opts *so)
{
    if (exists(out) && !force)
        return zcli_fail(PROG, "choose another output, or pass --force to replace it",
                         "%s: already exists", out);
    zcli_bar bar;
    so->progress = zcli_progress_init(&bar);
    int rc = zfmt_safetensors_export(src, out, so);
    zcli_progress_end(&bar);
    if (rc < 0)
        return zcli_fail_lib(PROG, NULL);
    printf("%s: safetensors of %s\n", out, src);
    return ZCLI_OK;
}

static int cmd_consolidate(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *fmt = NULL, *v;
    bool force = false;
    int dtype = -1, params_only = 0;
    zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (!(out = need_value(argc, argv, &i)))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--format")) {
            if (!(fmt = need_value(argc, argv, &i)))
                return ZCLI_ERROR;
            if (strcmp(fmt, "zckpt") && strcmp(fmt, "safetensors"))
                return usage_error("--format %s: expected zckpt or safetensors", fmt);
        } else if (!strcmp(argv[i], "--dtype")) {
            if (!(v = need_value(argc, argv, &i)) || !parse_dtype(v, &dtype))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--params-only"))
            params_only = 1;
        else if (!strcmp(argv[i], "--buffer")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_size(PROG, "--buffer", v, &o.buf_bytes))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--force"))
            force = true;
        else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!src)
            src = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!src || !out)
        return usage_error("%s", !src ? "missing CKPT" : "missing -o OUT");
    if (!fmt)
        fmt = ends_with(out, ".safetensors") ? "safetensors" : "zckpt";
    if (!strcmp(fmt, "safetensors")) {
        zfmt_st_opts so = ZFMT_ST_OPTS_INIT;
        so.dtype = dtype;
        so.params_only = params_only;
        so.buf_bytes = o.buf_bytes < so.buf_bytes ? o.buf_bytes : so.buf_bytes;
        return export_st(src, out, force, &so);
    }
    if (dtype >= 0 || params_only)
        return zcli_fail(PROG, "use --format safetensors for a converted or params-only file",
                         "--dtype and --params-only apply to safetensors output only");
    return reshard_common(src, out, 1, force, &o);
}

/* ------------------------------------------------------------------ export, import */

static int cmd_export(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *fmt = NULL, *v;
    bool force = false;
    int dtype = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (!(out = need_value(argc, argv, &i)))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--format")) {
            if (!(fmt = need_value(argc, argv, &i)))
                return ZCLI_ERROR;
            if (strcmp(fmt, "safetensors") && strcmp(fmt, "llmc"))
                return usage_error("--format %s: expected safetensors or llmc", fmt);
        } else if (!strcmp(argv[i], "--dtype")) {
            if (!(v = need_value(argc, argv, &i)) || !parse_dtype(v, &dtype))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--force"))
            force = true;
        else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!src)
            src = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!src || !out || !fmt)
        return usage_error("%s", !src ? "missing CKPT" : !out ? "missing -o FILE"
                                                             : "missing --format");
    if (!strcmp(fmt, "safetensors")) {
        zfmt_st_opts so = ZFMT_ST_OPTS_INIT;
        so.dtype = dtype;
        so.params_only = 1;
        return export_st(src, out, force, &so);
    }
    if (dtype >= 0)
        return zcli_fail(PROG, NULL, "llm.c model files are float32: --dtype does not apply");
    if (exists(out) && !force)
        return zcli_fail(PROG, "choose another output, or pass --force to replace it",
                         "%s: already exists", out);
    zcli_bar bar;
    zck_progress p = zcli_progress_init(&bar);
    int rc = zfmt_llmc_export(src, out, &p);
    zcli_progress_end(&bar);
    if (rc < 0)
        return zcli_fail_lib(PROG, NULL);
    printf("%s: llm.c GPT-2 model file of %s\n", out, src);
    return ZCLI_OK;
}

static int cmd_import(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *v;
    zfmt_import_opts o = ZFMT_IMPORT_OPTS_INIT;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (!(out = need_value(argc, argv, &i)))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--world")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_u32(PROG, "--world", v, 1, ZCK_MAX_WORLD, &o.world))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--heads")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_u32(PROG, "--heads", v, 1, 65536, &o.heads))
                return ZCLI_ERROR;
        } else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!src)
            src = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!src || !out)
        return usage_error("%s", !src ? "missing FILE" : "missing -o RUNDIR");
    zcli_bar bar;
    o.progress = zcli_progress_init(&bar);
    int rc = zfmt_import(src, out, &o);
    zcli_progress_end(&bar);
    if (rc < 0)
        return zcli_fail_lib(PROG, NULL);
    printf("%s: imported %s as a world-%u checkpoint at step 0\n", out, src, o.world);
    return ZCLI_OK;
}

/* ------------------------------------------------------------------ pack, unpack */

static int two_paths(int argc, char **argv, const char **src, const char **out)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (!(*out = need_value(argc, argv, &i)))
                return ZCLI_ERROR;
        } else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!*src)
            *src = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!*src || !*out)
        return usage_error("%s", !*src ? "missing input" : "missing -o OUTPUT");
    return ZCLI_OK;
}

/* pack and unpack: input, -o output, one library call that streams with progress */
static int archive_cmd(int argc, char **argv,
                       int (*fn)(const char *, const char *, const zck_progress *),
                       const char *done)
{
    const char *src = NULL, *out = NULL;
    int rc = two_paths(argc, argv, &src, &out);
    if (rc)
        return rc;
    zcli_bar bar;
    zck_progress p = zcli_progress_init(&bar);
    rc = fn(src, out, &p);
    zcli_progress_end(&bar);
    if (rc < 0)
        return zcli_fail_lib(PROG, NULL);
    printf("%s: %s %s\n", out, done, src);
    return ZCLI_OK;
}

static int cmd_pack(int argc, char **argv)
{
    return archive_cmd(argc, argv, zfmt_pack, "archive of");
}

static int cmd_unpack(int argc, char **argv)
{
    return archive_cmd(argc, argv, zfmt_unpack, "unpacked and verified");
}

/* ------------------------------------------------------------------ diff */

static int cmd_diff(int argc, char **argv)
{
    const char *a = NULL, *b = NULL, *v;
    int json = 0, all = 0;
    zck_diff_opts o = ZCK_DIFF_OPTS_INIT;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--atol")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_double(PROG, "--atol", v, &o.atol))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--rtol")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_double(PROG, "--rtol", v, &o.rtol))
                return ZCLI_ERROR;
        } else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--all"))
            all = 1;
        else if (!strcmp(argv[i], "--no-verify"))
            o.verify = 0;
        else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!a)
            a = argv[i];
        else if (!b)
            b = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!a || !b)
        return usage_error("%s", "missing A or B");
    zck_diff *d;
    if (zck_diff_run(&d, a, b, &o) < 0)
        return zcli_fail_lib(PROG, NULL);
    size_t differ = 0;
    for (size_t i = 0; i < d->n; i++)
        differ += !d->e[i].match;
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < d->n; i++) {
            const zck_diff_entry *e = &d->e[i];
            json_t *o2 = json_pack("{s:s, s:s, s:I, s:b, s:I, s:s}", "tensor", e->tensor,
                                   "state", e->state, "numel", (json_int_t)e->numel, "match",
                                   e->match, "n_differ", (json_int_t)e->n_differ, "note",
                                   e->note);
            json_object_set_new(o2, "max_abs", e->max_abs == e->max_abs
                                                   ? json_real(e->max_abs) : json_null());
            json_array_append_new(arr, o2);
        }
        print_json(json_pack("{s:s, s:s, s:f, s:f, s:b, s:I, s:o}", "a", a, "b", b, "atol",
                             o.atol, "rtol", o.rtol, "match", d->all_match, "differ",
                             (json_int_t)differ, "entries", arr));
    } else {
        for (size_t i = 0; i < d->n; i++) {
            const zck_diff_entry *e = &d->e[i];
            if (e->match && !all)
                continue;
            char tn[300], sn[300], note[600];
            zr_printable(tn, sizeof tn, e->tensor);
            zr_printable(sn, sizeof sn, e->state);
            if (e->note[0])
                printf("%-44s %-12s %s\n", tn, sn, zr_printable(note, sizeof note, e->note));
            else
                printf("%-44s %-12s %s  max |a-b| %.6g, %llu of %llu elements differ\n",
                       tn, sn, e->match ? "match" : "DIFFER", e->max_abs,
                       (unsigned long long)e->n_differ, (unsigned long long)e->numel);
        }
        printf("%zu of %zu tensor states %s (atol %g, rtol %g)\n", d->all_match ? d->n : differ,
               d->n, d->all_match ? "match" : "differ", o.atol, o.rtol);
    }
    int rc = d->all_match ? ZCLI_OK : ZCLI_FOUND;
    zck_diff_free(d);
    return rc;
}

/* ------------------------------------------------------------------ prune */

static int cmd_prune(int argc, char **argv)
{
    const char *run = NULL, *v;
    int json = 0, have_keep = 0;
    zck_prune_opts o = ZCK_PRUNE_OPTS_INIT;
    for (int i = 1; i < argc; i++) {
        uint32_t x;
        if (!strcmp(argv[i], "--keep-last")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_u32(PROG, "--keep-last", v, 1, UINT32_MAX, &x))
                return ZCLI_ERROR;
            o.keep_last = x;
            have_keep = 1;
        } else if (!strcmp(argv[i], "--keep-every")) {
            if (!(v = need_value(argc, argv, &i)) ||
                !zcli_parse_u32(PROG, "--keep-every", v, 1, UINT32_MAX, &x))
                return ZCLI_ERROR;
            o.keep_every = x;
        } else if (!strcmp(argv[i], "--dry-run"))
            o.dry_run = 1;
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (argv[i][0] == '-')
            return usage_error("unknown option %s", argv[i]);
        else if (!run)
            run = argv[i];
        else
            return usage_error("unexpected argument %s", argv[i]);
    }
    if (!run || !have_keep)
        return usage_error("%s", !run ? "missing RUNDIR" : "missing --keep-last K");
    zck_namelist removed = {0, NULL};
    if (zck_prune(&removed, run, &o) < 0) {
        zck_namelist_free(&removed);
        return zcli_fail_lib(PROG, NULL);
    }
    if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < removed.n; i++)
            json_array_append_new(arr, json_string(removed.name[i]));
        print_json(json_pack("{s:s, s:b, s:o}", "run_dir", run, "dry_run", o.dry_run,
                             "removed", arr));
    } else {
        for (size_t i = 0; i < removed.n; i++)
            printf("%s %s/%s\n", o.dry_run ? "would remove" : "removed", run, removed.name[i]);
        if (!removed.n)
            printf("nothing to remove in %s\n", run);
    }
    zck_namelist_free(&removed);
    return ZCLI_OK;
}

/* ------------------------------------------------------------------ main */

static const command commands[] = {
    {"ls", cmd_ls, "ls RUNDIR [--json]",
     "List every checkpoint of a run directory with its step, world size, ZeRO stage, bytes\n"
     "and status from a quick check (complete, incomplete, corrupt), which one `latest`\n"
     "names, and stale temporaries.\n"},
    {"inspect", cmd_inspect, "inspect CKPT [--tensors] [--json]",
     "Summarize a checkpoint's manifest. --tensors lists every tensor's name, dtype, shape and\n"
     "the shard files that hold its params. CKPT is a checkpoint directory or a run directory\n"
     "(its `latest` is used).\n"},
    {"verify", cmd_verify, "verify CKPT|ARCHIVE [--quick] [--jobs N] [--json]",
     "Check a checkpoint: manifest, SHA256SUMS, presence and size of every shard, coverage of\n"
     "every (group, state), stray files and, unless --quick, the SHA-256 of every shard\n"
     "(hashed on N threads, default 2). An archive made by `zckpt pack` is verified while it\n"
     "streams, without extracting. Exit 0 when sound, 1 when a problem is found, 2 on error.\n"},
    {"reshard", cmd_reshard,
     "reshard CKPT --world N -o OUT [--buffer SIZE] [--jobs N] [--force]",
     "Write the checkpoint again for N ranks into the new run directory OUT (same step).\n"
     "The source is verified first; the output is hashed and committed atomically. Memory\n"
     "stays within --buffer (default 256M) whatever the checkpoint size. OUT must not exist,\n"
     "unless --force, which replaces it only once the new one is complete.\n"},
    {"consolidate", cmd_consolidate,
     "consolidate CKPT -o OUT [--format zckpt|safetensors] [--dtype f32|bf16|f16] "
     "[--params-only] [--buffer SIZE] [--force]",
     "One file or one shard: --format safetensors (the default when OUT ends in\n"
     ".safetensors) writes every tensor (states other than param as <state>/<name>) into one\n"
     "safetensors file, optionally converted (--dtype) or params only; --format zckpt writes a\n"
     "world-1 checkpoint into the run directory OUT. Streaming, bounded memory.\n"},
    {"export", cmd_export,
     "export CKPT -o FILE --format safetensors|llmc [--dtype f32|bf16|f16] [--force]",
     "Export the model (params) of a GPT-2 checkpoint: safetensors in our tensor names, or\n"
     "llm.c's model file (gpt2_124M.bin layout).\n"},
    {"import", cmd_import, "import SRC -o RUNDIR [--world N] [--heads N]",
     "Make a step-0 checkpoint (N shards, default 1) from a GPT-2 model: a safetensors file in\n"
     "our names, a Hugging Face GPT-2 directory (config.json + model.safetensors), or an llm.c\n"
     "model file. Optimizer states start at zero; `zrun` can resume training from it.\n"},
    {"pack", cmd_pack, "pack CKPT -o FILE.tar[.gz|.zst]",
     "Pack a checkpoint into a tar archive (compression from the suffix), streaming.\n"},
    {"unpack", cmd_unpack, "unpack FILE -o RUNDIR",
     "Unpack an archive made by `zckpt pack` into a run directory: refuses absolute paths,\n"
     "'..', links and device files, extracts into a temporary directory, verifies every hash,\n"
     "and only then moves the checkpoint into place (and updates `latest` if it is newer).\n"},
    {"diff", cmd_diff, "diff A B [--atol X] [--rtol Y] [--all] [--json] [--no-verify]",
     "Compare two checkpoints tensor by tensor and state by state, whatever their world\n"
     "sizes: the largest absolute difference and whether they match (|a-b| <= atol + rtol|b|;\n"
     "default exact). Both are verified first unless --no-verify. --all lists matching\n"
     "tensors too. Exit 0 when everything matches, 1 otherwise.\n"},
    {"prune", cmd_prune, "prune RUNDIR --keep-last K [--keep-every N] [--dry-run] [--json]",
     "Remove all but the newest K checkpoints (and those whose step is a multiple of N), and\n"
     "stale temporaries. Never removes what `latest` names, nor checkpoints newer than it.\n"},
};
#define N_COMMANDS (sizeof commands / sizeof *commands)

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " COMMAND [ARGS]\n\nAudit and reshape zero checkpoints.\n\n"
               "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %s\n", commands[i].usage);
    fprintf(f, "\n`" PROG " COMMAND --help` explains one. Exit status: 0 ok, 1 a check found a "
               "problem,\n2 usage or I/O error. ZR_LOG=debug traces errors.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? ZCLI_ERROR : ZCLI_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf(PROG " (zero %s), checkpoint format %d.%d\n", ZERO_VERSION, ZCK_VERSION_MAJOR,
               ZCK_VERSION_MINOR);
        return ZCLI_OK;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            current = &commands[i];
            for (int a = 2; a < argc; a++)
                if (is_help(argv[a])) {
                    printf("usage: " PROG " %s\n\n%s", commands[i].usage, commands[i].help);
                    return ZCLI_OK;
                }
            return commands[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, PROG ": error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return ZCLI_ERROR;
}
