/*
 * zckpt.c: the shard-management CLI. Each subcommand declares its options in a table (parsed,
 * and printed by `zckpt COMMAND --help`, by cli/opts.c), calls one library function of ckpt/,
 * formats/ or (audit) core/, and prints the result (text, or JSON with --json). Exit codes:
 * 0 ok, 1 the check found a problem (verify, diff, audit), 2 usage, I/O or any other error.
 */
#include "common.h"
#include "opts.h"
#include "zfmt.h"
#include "zr.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "zckpt"

/* What the options of every subcommand set; each subcommand's table (commands[] below) names
 * the fields it uses. */
typedef struct {
    const char *path, *path2; /* the positional arguments: CKPT, RUNDIR, SRC, A and B */
    const char *out;          /* -o */
    const char *tokenizer;    /* export --format hf: a tokenizer.json to include */
    const char *log;          /* plot: --log */
    int json, tensors, force, params_only, all;
    int optim;                /* export --format dcp: --optim */
    int format;               /* FMT_*, -1: from the output's name */
    int dtype;                /* a zck_dtype, -1: as stored */
    uint32_t world;
    size_t shard_bytes;       /* export --format hf: --shard-size */
    size_t split_bytes;       /* consolidate of a foreign checkpoint: --shard-size (SIZE_MAX:
                                 not given, one file) */
    zck_verify_opts verify;
    zck_reshard_opts reshard;
    zck_diff_opts diff;
    zck_prune_opts prune;
    zfmt_import_opts import;
    zr_audit_opts audit;
} zckpt_args;
#define ZCLI_ARGS zckpt_args
enum { FMT_ZCKPT, FMT_SAFETENSORS, FMT_LLMC, FMT_HF, FMT_DCP };

static void args_init(zckpt_args *a)
{
    *a = (zckpt_args){
        .format = -1,
        .dtype = -1,
        .shard_bytes = (size_t)ZFMT_HF_SHARD_DEFAULT,
        .split_bytes = SIZE_MAX,
        .verify = ZCK_VERIFY_OPTS_INIT,
        .reshard = ZCK_RESHARD_OPTS_INIT,
        .diff = ZCK_DIFF_OPTS_INIT,
        .prune = ZCK_PRUNE_OPTS_INIT,
        .import = ZFMT_IMPORT_OPTS_INIT,
        .audit = ZR_AUDIT_OPTS_INIT,
    };
}

static void print_json(json_t *j)
{
    char *s = zck_json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER); /* shortest reals */
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

/* The entries of ls --json (checkpoints or damaged ones). */
static json_t *entries_json(const zck_run_entry *v, size_t n)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        const zck_run_entry *e = &v[i];
        json_array_append_new(arr, json_pack(
            "{s:s, s:I, s:i, s:i, s:I, s:s, s:b, s:s}", "name", e->name, "step",
            (json_int_t)e->step, "world_size", (int)e->world, "zero_stage", e->zero_stage,
            "bytes", (json_int_t)e->bytes, "status", zck_ckpt_status_name(e->status),
            "latest", e->is_latest, "detail", e->detail));
    }
    return arr;
}

/* The rows of the ls table (checkpoints or damaged ones). */
static void entries_print(const zck_run_entry *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const zck_run_entry *e = &v[i];
        char h[32], det[1280], nm[300];
        printf("%-24s %10llu %6u %6d %12s  %s%s%s%s\n", zr_printable(nm, sizeof nm, e->name),
               (unsigned long long)e->step, e->world, e->zero_stage,
               zcli_human(h, (double)e->bytes), zck_ckpt_status_name(e->status),
               e->is_latest ? " (latest)" : "", e->detail[0] ? ": " : "",
               zr_printable(det, sizeof det, e->detail));
    }
}

static int cmd_ls(const void *args)
{
    const zckpt_args *a = args;
    const char *run = a->path;
    int json = a->json;
    zck_run_list *l;
    if (zck_run_list_open(&l, run) < 0)
        return zcli_fail_ckpt(PROG, NULL);
    if (json) {
        json_t *arr = entries_json(l->ckpt, l->n);
        json_t *stale = json_array();
        for (size_t i = 0; i < l->stale.n; i++)
            json_array_append_new(stale, json_string(l->stale.name[i]));
        json_t *foreign = json_array();
        for (size_t i = 0; i < l->foreign.n; i++)
            json_array_append_new(foreign, json_string(l->foreign.name[i]));
        print_json(json_pack("{s:s, s:s?, s:o, s:o, s:o, s:o}", "run_dir", run, "latest",
                             l->latest, "checkpoints", arr, "damaged",
                             entries_json(l->damaged, l->n_damaged), "stale", stale, "foreign",
                             foreign));
    } else {
        printf("%-24s %10s %6s %6s %12s  %s\n", "CHECKPOINT", "STEP", "WORLD", "STAGE", "BYTES",
               "STATUS");
        entries_print(l->ckpt, l->n);
        entries_print(l->damaged, l->n_damaged);
        if (!l->n)
            printf("(no checkpoints)\n");
        if (l->n_damaged)
            printf("damaged checkpoints moved aside by a resume: %zu (removed by `zckpt prune "
                   "--damaged`)\n", l->n_damaged);
        if (!l->latest)
            printf("latest: none\n");
        if (l->holder)
            printf("in use by %s\n", l->holder);
        for (size_t i = 0; i < l->stale.n; i++) {
            char nm[300];
            printf("abandoned temporary: %s (removed by `zckpt prune`)\n",
                   zr_printable(nm, sizeof nm, l->stale.name[i]));
        }
        for (size_t i = 0; i < l->foreign.n; i++) {
            char nm[300];
            printf("not part of the run: %s (not a directory, or a symbolic link)\n",
                   zr_printable(nm, sizeof nm, l->foreign.name[i]));
        }
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

/* The checkpoint's other files (format 1.1: the run's tokenizer.json) as a JSON array. */
static json_t *extra_files(const zck_reader *r)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < zck_reader_n_files(r); i++)
        json_array_append_new(arr, json_pack("{s:s, s:I, s:s}", "file",
                                             zck_reader_file_name(r, i), "bytes",
                                             (json_int_t)zck_reader_file_bytes(r, i), "sha256",
                                             zck_reader_file_sha256(r, i)));
    return arr;
}

/* inspect of a DeepSpeed or DCP checkpoint: the JSON, or its text */
static int inspect_foreign(const zckpt_args *a)
{
    json_t *j = NULL;
    if (zfmt_foreign_inspect(&j, a->path) < 0)
        return zcli_fail_lib(PROG, "zckpt verify lists every problem");
    if (a->json) {
        print_json(j);
        return ZCLI_OK;
    }
    const char *fmt = json_string_value(json_object_get(j, "format"));
    printf("%s: %s\n", a->path, fmt);
    json_t *ts = json_object_get(j, "tensors");
    int universal = !strcmp(fmt, zfmt_foreign_name(ZFMT_FOREIGN_DS_UNIVERSAL));
    if (json_object_get(j, "stage"))
        printf("  tag %s, ZeRO stage %lld, %lld ranks, %s, global step %lld\n",
               json_string_value(json_object_get(j, "tag")),
               (long long)json_integer_value(json_object_get(j, "stage")),
               (long long)json_integer_value(json_object_get(j, "world")),
               universal ? "one folder per parameter"
               : json_is_true(json_object_get(j, "bf16")) ? "bf16 optimizer files"
                                                         : "fp32 optimizer files",
               (long long)json_integer_value(json_object_get(j, "step")));
    else
        printf("  %zu bytes items\n", json_array_size(json_object_get(j, "bytes_items")));
    printf("  %zu tensors, %lld elements\n", json_array_size(ts),
           (long long)json_integer_value(json_object_get(j, "numel")));
    for (size_t i = 0; a->tensors && i < json_array_size(ts); i++) {
        json_t *t = json_array_get(ts, i), *sh = json_object_get(t, "shape");
        char shape[128] = "[", name[300];
        for (size_t k = 0; k < json_array_size(sh); k++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld",
                     k ? ", " : "", (long long)json_integer_value(json_array_get(sh, k)));
        printf("  %-48s %-8s %s]\n", zr_printable(name, sizeof name,
               json_string_value(json_object_get(t, "name"))),
               json_object_get(t, "dtype") ? json_string_value(json_object_get(t, "dtype")) : "f32",
               shape);
    }
    json_decref(j);
    return ZCLI_OK;
}

static int cmd_inspect(const void *args)
{
    const zckpt_args *a = args;
    const char *path = a->path;
    int json = a->json, tensors = a->tensors;
    if (zfmt_foreign_detect(path) != ZFMT_FOREIGN_NONE)
        return inspect_foreign(a);
    zck_reader *r;
    if (zck_reader_open(&r, path) < 0)
        return zcli_fail_ckpt(PROG, NULL);
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
    json_object_set_new(root, "files", extra_files(r));
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
        for (size_t i = 0; i < zck_reader_n_files(r); i++)
            printf("%s %s, %s\n", i ? "            " : "files       ",
                   zr_printable(b1, sizeof b1, zck_reader_file_name(r, i)),
                   zcli_human(h, (double)zck_reader_file_bytes(r, i)));
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

/* The problems of a report as a JSON array of {file, kind, detail} */
static json_t *problems_json(const zck_report *rep)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < zck_report_count(rep); i++) {
        const zck_problem *p = zck_report_get(rep, i);
        json_array_append_new(arr, json_pack("{s:s, s:s, s:s}", "file", p->file, "kind",
                                             zck_problem_kind_name(p->kind), "detail",
                                             p->detail));
    }
    return arr;
}

/* Verify one checkpoint directory, named label in the summary; problem files are printed
 * after prefix ("step-00000200/" inside a run directory). *found: problems found; *jout: its
 * JSON object (with json). */
static void report_print(zck_report *rep, const char *path, const char *label,
                         const char *prefix, int quick, int json, json_t **jout, size_t *found)
{
    size_t n = zck_report_count(rep);
    if (json) {
        json_t *arr = problems_json(rep);
        *jout = json_pack("{s:s, s:b, s:b, s:I, s:b, s:o}", "path", path, "sound", n == 0,
                          "quick", quick, "bytes_hashed",
                          (json_int_t)zck_report_bytes_hashed(rep), "hash_skipped",
                          zck_report_hash_skipped(rep), "problems", arr);
    } else {
        for (size_t i = 0; i < n; i++) {
            const zck_problem *p = zck_report_get(rep, i);
            char f[300], det[1280];
            printf("%s%s: %s: %s\n", prefix, zr_printable(f, sizeof f, p->file),
                   zck_problem_kind_name(p->kind), zr_printable(det, sizeof det, p->detail));
        }
        char h[32];
        if (n)
            printf("%s: %zu problem%s found%s\n", label, n, n == 1 ? "" : "s",
                   zck_report_hash_skipped(rep) ? " (before hashing: the shards were not hashed)"
                                                : "");
        else
            printf("%s: sound (%s, %s hashed)\n", label,
                   quick ? "quick check: presence, sizes, coverage" : "all checks",
                   zcli_human(h, (double)zck_report_bytes_hashed(rep)));
    }
    zck_report_free(rep);
    *found += n;
}

static int verify_dir(const char *path, const char *label, const char *prefix,
                      const zck_verify_opts *o, int json, json_t **jout, size_t *found)
{
    zck_report *rep;
    if (zck_verify(&rep, path, o) < 0)
        return -1;
    report_print(rep, path, label, prefix, o->quick, json, jout, found);
    return 0;
}

/* A run directory: the checkpoint latest names ("RUN: step-00000200 (latest): ..."), or with
 * all every step directory. A missing latest is a finding. */
static int verify_run(const char *run, int all, const zck_verify_opts *o, int json)
{
    zck_run_list *l = NULL;
    if (zck_run_list_open(&l, run) < 0)
        return zcli_fail_ckpt(PROG, NULL);
    size_t found = 0;
    json_t *arr = json ? json_array() : NULL;
    int rc = 0;
    for (size_t i = 0; i < l->n && !rc; i++) {
        const zck_run_entry *e = &l->ckpt[i];
        if (!all && !e->is_latest)
            continue;
        char *p = NULL, *label = NULL, *prefix = NULL;
        json_t *j = NULL;
        if (asprintf(&p, "%s/%s", run, e->name) < 0 ||
            asprintf(&label, "%s: %s%s", run, e->name, e->is_latest ? " (latest)" : "") < 0 ||
            asprintf(&prefix, "%s/", e->name) < 0)
            rc = zr_err_set(ZR_ENOMEM, "out of memory");
        else
            rc = verify_dir(p, label, prefix, o, json, &j, &found);
        struct stat st;
        if (rc && zr_err_code() == ZR_ENOTFOUND && lstat(p, &st) < 0) {
            /* pruned by the retention of a job saving here while it was read: no verdict */
            if (!json)
                printf("%s: removed while it was being read (probably pruned by the retention "
                       "of a job saving into %s): not checked\n", label, run);
            zr_err_clear();
            rc = 0;
        }
        if (j)
            json_array_append_new(arr, j);
        free(p);
        free(label);
        free(prefix);
    }
    char *nolatest = NULL;
    if (!rc && !l->latest) {
        char *x = NULL;
        zck_latest(&x, run); /* its message says what is wrong with latest */
        free(x);
        nolatest = strdup(zr_err_msg());
        found++;
        if (!json)
            printf("%s%s\n", nolatest, all || !l->n ? "" : " (`zckpt verify --all` checks "
                   "every step directory)");
    }
    if (!rc && all && !l->n && l->latest) {
        found++;
        if (!json)
            printf("%s: no step directory\n", run);
    }
    if (!rc && json && !all && json_array_size(arr) == 1) { /* as for one checkpoint */
        json_t *j = json_incref(json_array_get(arr, 0));
        json_object_set_new(j, "path", json_string(run));
        json_object_set_new(j, "checkpoint", json_string(l->latest));
        print_json(j);
        json_decref(arr);
    } else if (!rc && json)
        print_json(json_pack("{s:s, s:b, s:s?, s:s?, s:o}", "path", run, "sound", found == 0,
                             "latest", l->latest, "error", nolatest, "checkpoints", arr));
    else
        json_decref(arr);
    free(nolatest);
    zck_run_list_free(l);
    if (rc < 0)
        return zcli_fail_ckpt(PROG, NULL);
    return found ? ZCLI_FOUND : ZCLI_OK;
}

static int cmd_verify(const void *args)
{
    const zckpt_args *a = args;
    const char *path = a->path;
    int json = a->json, all = a->all;
    zck_verify_opts o = a->verify;
    o.cheap_first = 1; /* a cheap problem said at once, not after hours of hashing */
    zcli_bar bar;
    o.progress = zcli_progress_init(&bar);
    char mp[4096];
    struct stat st;
    snprintf(mp, sizeof mp, "%s/manifest.json", path);
    bool run = stat(path, &st) == 0 && S_ISDIR(st.st_mode) && stat(mp, &st) < 0;
    int rc = ZCLI_OK;
    size_t n = 0;
    json_t *j = NULL;
    zfmt_foreign_kind fk = zfmt_foreign_detect(path);
    if (fk != ZFMT_FOREIGN_NONE) {
        zck_report *rep = NULL;
        char label[4200];
        snprintf(label, sizeof label, "%s (%s)", path, zfmt_foreign_name(fk));
        if (zfmt_foreign_verify(&rep, path, &o) < 0) {
            rc = zcli_fail_lib(PROG, NULL);
        } else {
            report_print(rep, path, label, "", o.quick, json, &j, &n);
            if (json) {
                json_object_set_new(j, "format", json_string(zfmt_foreign_name(fk)));
                print_json(j);
            }
            rc = n ? ZCLI_FOUND : ZCLI_OK;
        }
    } else if (run) {
        rc = verify_run(path, all, &o, json);
    } else {
        zck_report *rep = NULL;
        if (is_archive(path) ? zfmt_archive_verify(&rep, path, &o.progress) < 0
                             : zck_verify(&rep, path, &o) < 0)
            rc = zcli_fail_ckpt(PROG, NULL);
        else {
            report_print(rep, path, path, "", o.quick, json, &j, &n);
            if (json)
                print_json(j);
            rc = n ? ZCLI_FOUND : ZCLI_OK;
        }
    }
    zcli_progress_end(&bar);
    return rc;
}

/* ------------------------------------------------------------------ reshard, consolidate */

/* an output that is there already, without --force */
static int refuse_existing(const char *out)
{
    return zcli_fail(PROG, "choose another output, or pass --force to replace it",
                     "%s: already exists", out);
}

/* Before a command writes its output out (a file with file set, else a directory): not where a
 * run or a checkpoint keeps its own files (zck_check_unmanaged; a file: nothing but a regular
 * file there, zck_check_output), then its missing parent directories made (*made: the topmost,
 * for output_failed). 0, or the exit code after the error. */
static int output_ready(const char *out, bool file, char **made)
{
    *made = NULL;
    if (zck_check_unmanaged(out) < 0 || (file && zck_check_output(out) < 0) ||
        zck_make_parents(made, out) < 0)
        return zcli_fail_lib(PROG, "choose another output");
    return ZCLI_OK;
}

/* rc of the command that wrote out: when it failed, the parent directories output_ready made
 * for it go again (those still empty). made is freed. */
static int output_done(int rc, char *made, const char *out)
{
    if (rc != ZCLI_OK)
        zck_unmake_parents(made, out);
    free(made);
    return rc;
}

/* the end of a library call shown with a progress bar: the bar's line cleared, then the
 * call's error if it failed (rc < 0) */
static int progress_done(zcli_bar *bar, int rc)
{
    zcli_progress_end(bar);
    return rc < 0 ? zcli_fail_ckpt(PROG, NULL) : ZCLI_OK;
}

/* Write a new run directory at out through fn(tmp), then move it into place: when out exists
 * (only with force) the old one is removed only after the new one is complete. */
static int into_place_now(const char *out, int (*fn)(const char *tmp, void *), void *ctx);
static int into_place(const char *out, const char *src, bool force,
                      int (*fn)(const char *tmp, void *), void *ctx)
{
    if (exists(out) && !force)
        return refuse_existing(out);
    if (zck_check_replaceable(out, src) < 0)
        return zcli_fail_ckpt(PROG, NULL);
    char *made;
    int rc = output_ready(out, false, &made);
    return rc ? rc : output_done(into_place_now(out, fn, ctx), made, out);
}

/* into_place once out is checked and its parents made */
static int into_place_now(const char *out, int (*fn)(const char *tmp, void *), void *ctx)
{
    char tmp[4096], old[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());
    snprintf(old, sizeof old, "%s.old-%ld", out, (long)getpid());
    if (fn(tmp, ctx) < 0) {
        int rc = zcli_fail_ckpt(PROG, NULL);
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

/* A run directory, as the library resolves a source (a latest file and no manifest.json): its
 * checkpoint is what latest names. */
static bool is_run_dir(const char *path)
{
    char m[4200], l[4200];
    struct stat st;
    snprintf(m, sizeof m, "%s/manifest.json", path);
    snprintf(l, sizeof l, "%s/latest", path);
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) && stat(m, &st) < 0 && stat(l, &st) == 0;
}

/* Copy the regular file from into the new file to (fsync'ed). */
static int copy_file(const char *from, const char *to)
{
    int in, out;
    if (zck_open_regular(&in, from, ZCK_NOFOLLOW, NULL) < 0)
        return -1;
    out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) {
        close(in);
        return zr_err_set(ZR_EIO, "%s: create: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    int rc = 0;
    for (;;) {
        ssize_t k = read(in, buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            rc = zr_err_set(ZR_EIO, "%s: read: %s", from, strerror(errno));
        if (k <= 0)
            break;
        for (ssize_t off = 0; !rc && off < k;) {
            ssize_t w = write(out, buf + off, (size_t)(k - off));
            if (w < 0 && errno != EINTR)
                rc = zr_err_set(ZR_EIO, "%s: write: %s", to, strerror(errno));
            off += w > 0 ? w : 0;
        }
        if (rc)
            break;
    }
    if (!rc && fsync(out) < 0)
        rc = zr_err_set(ZR_EIO, "%s: fsync: %s", to, strerror(errno));
    close(in);
    if (close(out) < 0 && !rc)
        rc = zr_err_set(ZR_EIO, "%s: close: %s", to, strerror(errno));
    return rc;
}

/* The source run's JSON log (train.jsonl, zrun's default --log-json) goes with the new run
 * directory, so that its plot keeps the history: only from a run directory (a checkpoint
 * directory has no log of its own); none is fine, and one that cannot be copied (a FIFO, a
 * read error) is a warning: the checkpoint is what was asked for. */
static void carry_log(const char *src, const char *tmp)
{
    char from[4200], to[4200];
    struct stat st;
    snprintf(from, sizeof from, "%s/train.jsonl", src);
    snprintf(to, sizeof to, "%s/train.jsonl", tmp);
    if (!is_run_dir(src) || lstat(from, &st) < 0)
        return;
    if (copy_file(from, to) < 0 || zck_fsync_dir(tmp) < 0) {
        fprintf(stderr, PROG ": warning: the run's log was not copied: %s\n", zr_err_msg());
        unlink(to);
        zr_err_clear();
    }
}

static int do_reshard(const char *tmp, void *vctx)
{
    reshard_ctx *c = vctx;
    int rc = zck_reshard(NULL, c->src, tmp, c->world, &c->o);
    if (!rc)
        carry_log(c->src, tmp);
    return rc;
}

static int reshard_common(const char *src, const char *out, uint32_t world, bool force,
                          zck_reshard_opts *o)
{
    zcli_bar bar;
    o->progress = zcli_progress_init(&bar);
    reshard_ctx c = {src, world, *o};
    int rc = into_place(out, src, force, do_reshard, &c);
    zcli_progress_end(&bar);
    if (rc == ZCLI_OK)
        printf("%s: world %u checkpoint of %s\n", out, world, src);
    return rc;
}

static int cmd_reshard(const void *args)
{
    const zckpt_args *a = args;
    zck_reshard_opts o = a->reshard;
    return reshard_common(a->path, a->out, a->world, a->force, &o);
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int export_st(const char *src, const char *out, bool force, zfmt_st_opts *so)
{
    if (exists(out) && !force)
        return refuse_existing(out);
    char *made;
    int rc = output_ready(out, true, &made);
    if (rc)
        return rc;
    zcli_bar bar;
    so->progress = zcli_progress_init(&bar);
    rc = progress_done(&bar, zfmt_safetensors_export(src, out, so));
    if (rc == ZCLI_OK)
        printf("%s: safetensors of %s\n", out, src);
    return output_done(rc, made, out);
}

/* A DeepSpeed or DCP checkpoint into one safetensors file (zfmt_foreign_consolidate), or with
 * --shard-size a directory of Hugging Face shards (zfmt_foreign_consolidate_sharded). */
static int consolidate_foreign(const zckpt_args *a, zfmt_foreign_kind k, int fmt)
{
    bool sharded = a->split_bytes != SIZE_MAX;
    if ((fmt != FMT_SAFETENSORS && !sharded) || a->dtype >= 0 || a->params_only)
        return zcli_fail(PROG, "name a .safetensors output, or pass --format safetensors "
                         "(--shard-size SIZE: a directory of shards)",
                         "%s: a %s checkpoint consolidates into safetensors, as it is "
                         "(--dtype and --params-only do not apply)", a->path,
                         zfmt_foreign_name(k));
    if (!sharded && exists(a->out) && !a->force)
        return refuse_existing(a->out);
    char *made;
    int rc = output_ready(a->out, !sharded, &made);
    if (rc)
        return rc;
    zcli_bar bar;
    zck_progress p = zcli_progress_init(&bar);
    if (!sharded) {
        rc = progress_done(&bar, zfmt_foreign_consolidate(a->path, a->out, &p));
        if (rc == ZCLI_OK)
            printf("%s: safetensors of %s (%s)\n", a->out, a->path, zfmt_foreign_name(k));
        return output_done(rc, made, a->out);
    }
    int r = zfmt_foreign_consolidate_sharded(a->path, a->out, a->split_bytes, a->force, &p);
    zcli_progress_end(&bar);
    if (r < 0)
        return output_done(zcli_fail_ckpt(PROG, r == ZR_EEXIST && !a->force
                                                    ? "choose another output, or pass --force "
                                                      "to replace an earlier consolidate"
                                                    : NULL),
                           made, a->out);
    free(made);
    char ix[4200];
    struct stat st;
    snprintf(ix, sizeof ix, "%s/model.safetensors.index.json", a->out);
    printf("%s: %s of %s (%s)\n", a->out,
           lstat(ix, &st) == 0 ? "sharded model-*.safetensors with their index"
                               : "model.safetensors",
           a->path, zfmt_foreign_name(k));
    return ZCLI_OK;
}

static int cmd_consolidate(const void *args)
{
    const zckpt_args *a = args;
    const char *src = a->path, *out = a->out;
    bool force = a->force;
    int dtype = a->dtype, params_only = a->params_only;
    zck_reshard_opts o = a->reshard;
    int fmt = a->format >= 0 ? a->format
                             : ends_with(out, ".safetensors") ? FMT_SAFETENSORS : FMT_ZCKPT;
    zfmt_foreign_kind fk = zfmt_foreign_detect(src);
    if (fk != ZFMT_FOREIGN_NONE)
        return consolidate_foreign(a, fk, fmt);
    if (a->split_bytes != SIZE_MAX)
        return zcli_fail(PROG, "use export --format hf --shard-size for a zero checkpoint",
                         "%s: --shard-size applies to a DeepSpeed or DCP checkpoint", src);
    if (fmt == FMT_SAFETENSORS) {
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

/* A directory export (hf, dcp) that failed with rc: the error, its parents made go again. */
static int dir_export_failed(int rc, const zckpt_args *a, char *made)
{
    return output_done(zcli_fail_ckpt(PROG, rc == ZR_EEXIST && !a->force
                                                ? "choose another output, or pass --force to "
                                                  "replace an earlier export"
                                                : NULL),
                       made, a->out);
}

static int export_dcp(const zckpt_args *a)
{
    if (a->dtype >= 0)
        return zcli_fail(PROG, NULL, "a DCP export keeps the stored dtypes: --dtype does not "
                         "apply");
    zfmt_dcp_opts o = ZFMT_DCP_OPTS_INIT;
    zcli_bar bar;
    o.optim = a->optim;
    o.force = a->force;
    char *made;
    int rc = output_ready(a->out, false, &made);
    if (rc)
        return rc;
    o.progress = zcli_progress_init(&bar);
    rc = zfmt_dcp_export(a->path, a->out, &o);
    zcli_progress_end(&bar);
    if (rc < 0)
        return dir_export_failed(rc, a, made);
    free(made);
    printf("%s: PyTorch DCP checkpoint (.metadata, __0_0.distcp) of %s: the model%s\n", a->out,
           a->path, a->optim ? " and AdamW's state" : "");
    return ZCLI_OK;
}

static int export_hf(const zckpt_args *a)
{
    zfmt_hf_opts o = ZFMT_HF_OPTS_INIT;
    zcli_bar bar;
    o.dtype = a->dtype;
    o.force = a->force;
    o.tokenizer_json = a->tokenizer;
    o.shard_bytes = a->shard_bytes;
    char *made;
    int rc = output_ready(a->out, false, &made);
    if (rc)
        return rc;
    o.progress = zcli_progress_init(&bar);
    rc = zfmt_hf_export(a->path, a->out, &o);
    zcli_progress_end(&bar);
    if (rc < 0)
        return dir_export_failed(rc, a, made);
    free(made);
    char tj[4200];
    struct stat st;
    snprintf(tj, sizeof tj, "%s/tokenizer.json", a->out);
    char ix[4200];
    snprintf(ix, sizeof ix, "%s/model.safetensors.index.json", a->out);
    printf("%s: Hugging Face model (config.json, %s%s) of %s\n", a->out,
           lstat(ix, &st) == 0 ? "sharded model-*.safetensors with their index"
                               : "model.safetensors",
           lstat(tj, &st) == 0 ? ", tokenizer.json" : "", a->path);
    return ZCLI_OK;
}

static int cmd_export(const void *args)
{
    const zckpt_args *a = args;
    const char *src = a->path, *out = a->out;
    bool force = a->force;
    int dtype = a->dtype;
    if (a->tokenizer && a->format != FMT_HF)
        return zcli_fail(PROG, NULL, "--tokenizer applies to --format hf only");
    if (a->optim && a->format != FMT_DCP)
        return zcli_fail(PROG, NULL, "--optim applies to --format dcp only");
    if (a->format == FMT_DCP)
        return export_dcp(a);
    if (a->format == FMT_SAFETENSORS) {
        zfmt_st_opts so = ZFMT_ST_OPTS_INIT;
        so.dtype = dtype;
        so.params_only = 1;
        return export_st(src, out, force, &so);
    }
    if (a->format == FMT_HF)
        return export_hf(a);
    if (dtype >= 0)
        return zcli_fail(PROG, NULL, "llm.c model files are float32: --dtype does not apply");
    if (exists(out) && !force)
        return refuse_existing(out);
    char *made;
    int rc = output_ready(out, true, &made);
    if (rc)
        return rc;
    zcli_bar bar;
    zck_progress p = zcli_progress_init(&bar);
    rc = progress_done(&bar, zfmt_llmc_export(src, out, &p));
    if (rc == ZCLI_OK)
        printf("%s: llm.c GPT-2 model file of %s\n", out, src);
    return output_done(rc, made, out);
}

static int cmd_import(const void *args)
{
    const zckpt_args *a = args;
    const char *src = a->path, *out = a->out;
    zfmt_import_opts o = a->import;
    zcli_bar bar;
    char *made;
    int rc = output_ready(out, false, &made);
    if (rc)
        return rc;
    char note[1024] = "";
    o.note = note;
    o.note_cap = sizeof note;
    o.progress = zcli_progress_init(&bar);
    rc = zfmt_import(src, out, &o);
    zcli_progress_end(&bar);
    if (rc < 0) /* zckpt verify does not read most sources (it does DeepSpeed's and DCP's) */
        return output_done(zcli_fail_lib(PROG, NULL), made, out);
    free(made);
    printf("%s: imported %s as a world-%u checkpoint %s\n", out, src, o.world, note);
    return ZCLI_OK;
}

/* ------------------------------------------------------------------ pack, unpack */

/* pack and unpack: input, -o output, one library call that streams with progress */
static int archive_cmd(const zckpt_args *a,
                       int (*fn)(const char *, const char *, const zck_progress *),
                       const char *done, bool file)
{
    const char *src = a->path, *out = a->out;
    char *made;
    int rc = output_ready(out, file, &made);
    if (rc)
        return rc;
    zcli_bar bar;
    zck_progress p = zcli_progress_init(&bar);
    rc = progress_done(&bar, fn(src, out, &p));
    if (rc == ZCLI_OK)
        printf("%s: %s %s\n", out, done, src);
    return output_done(rc, made, out);
}

static int cmd_pack(const void *args)
{
    const zckpt_args *a = args;
    return archive_cmd(a, zfmt_pack, "archive of", true);
}

static int cmd_unpack(const void *args)
{
    const zckpt_args *a = args;
    return archive_cmd(a, zfmt_unpack, "unpacked and verified", false);
}

/* ------------------------------------------------------------------ diff */

static int cmd_diff(const void *vargs)
{
    const zckpt_args *args = vargs;
    const char *a = args->path, *b = args->path2;
    int json = args->json, all = args->all;
    zck_diff_opts o = args->diff;
    zck_diff *d;
    if (zck_diff_run(&d, a, b, &o) < 0)
        return zcli_fail_ckpt(PROG, NULL);
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

static int cmd_prune(const void *args)
{
    const zckpt_args *a = args;
    const char *run = a->path;
    int json = a->json;
    zck_prune_opts o = a->prune;
    if (!o.damaged && !o.keep_last)
        return zcli_fail(PROG, "see `zckpt prune --help`", "missing --keep-last K (or "
                         "--damaged)");
    if (o.damaged && (o.keep_last || o.keep_every))
        return zcli_fail(PROG, "run them one after the other", "--damaged removes only the "
                         "damaged-step directories: not with --keep-last or --keep-every");
    zck_namelist removed = {0, NULL};
    if (zck_prune(&removed, run, &o) < 0) {
        zck_namelist_free(&removed);
        return zcli_fail_ckpt(PROG, NULL);
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

/* ------------------------------------------------------------------ plot */

/* An earlier drawing: "<svg" in the first bytes of the regular file at path. */
static bool is_svg(const char *path)
{
    int fd;
    if (zck_open_regular(&fd, path, ZCK_NOFOLLOW, NULL) < 0) {
        zr_err_clear();
        return false;
    }
    char buf[512];
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    close(fd);
    return n > 0 && memmem(buf, (size_t)n, "<svg", 4);
}

/* Whether the drawing may go to out: never over the log it reads nor over anything but a
 * regular file (looked at, never opened: a FIFO does not block); a regular file that is not an
 * earlier drawing only with --force. 0, or the exit code after the error. */
static int plot_target(const char *log, const char *out, bool force)
{
    if (zr_plot_check_target(log, out) < 0 || zck_check_output(out) < 0)
        return zcli_fail_lib(PROG, "choose another -o");
    if (!force && exists(out) && !is_svg(out))
        return zcli_fail(PROG, "choose another -o, or pass --force to replace it", "%s: exists "
                         "and is not an SVG drawing", out);
    return ZCLI_OK;
}

/* RUN's JSON log (--log, else RUN/train.jsonl; RUN may be the log itself) drawn into -o (else
 * RUN/train.svg). */
static int cmd_plot(const void *args)
{
    const zckpt_args *a = args;
    struct stat st;
    int dir = stat(a->path, &st) == 0 && S_ISDIR(st.st_mode);
    char *log = NULL, *out = NULL;
    if (!dir && !exists(a->path))
        return zcli_fail(PROG, NULL, "%s: no such run directory or JSON log", a->path);
    if (!dir && !a->out)
        return zcli_fail(PROG, "add -o FILE.svg", "%s is not a run directory: where to draw "
                         "it?", a->path);
    if ((a->log ? !(log = strdup(a->log))
                : asprintf(&log, dir ? "%s/train.jsonl" : "%s", a->path) < 0) ||
        (a->out ? !(out = strdup(a->out)) : asprintf(&out, "%s/train.svg", a->path) < 0)) {
        free(log);
        return zcli_fail(PROG, NULL, "out of memory");
    }
    zr_plot_info info;
    char *made = NULL;
    int rc = plot_target(log, out, a->force);
    if (!rc)
        rc = output_ready(out, true, &made);
    if (!rc && zr_plot_write(&info, log, out) < 0)
        rc = zcli_fail_lib(PROG, zr_err_code() != ZR_ENOTFOUND || exists(log) ? NULL
                                 : a->log || !dir ? "the log is the file zrun --log-json names"
                                                  : "zrun writes the log given by --log-json; "
                                                    "name it with --log FILE");
    else if (!rc) {
        printf("%s: %zu step records drawn, %zu resume or world-size mark%s\n", out,
               info.records, info.marks, info.marks == 1 ? "" : "s");
        if (info.skipped)
            printf("note: %s: %zu line%s skipped (not a JSON object: a truncated last line?)\n",
                   log, info.skipped, info.skipped == 1 ? "" : "s");
    }
    rc = output_done(rc, made, out);
    free(log);
    free(out);
    return rc;
}

/* ------------------------------------------------------------------ audit */

static json_t *audit_json(const char *path, const zr_audit *au)
{
    json_t *said = json_array(), *probs = json_array(), *reasons = json_array();
    for (size_t i = 0; i < au->said.n; i++)
        json_array_append_new(said, json_string(au->said.name[i]));
    for (size_t i = 0; au->report && i < zck_report_count(au->report); i++) {
        const zck_problem *p = zck_report_get(au->report, i);
        json_array_append_new(probs, json_pack("{s:s, s:s, s:s}", "file", p->file, "kind",
                                               zck_problem_kind_name(p->kind), "detail",
                                               p->detail));
    }
    for (size_t i = 0; i < au->reasons.n; i++)
        json_array_append_new(reasons, json_string(au->reasons.name[i]));
    json_t *mem = json_null();
    if (au->has_mem) {
        json_t *ranks = json_array();
        for (int q = 0; q < au->mem.world; q++) {
            const zr_rank_mem *m = &au->mem.rank[q];
            json_array_append_new(ranks, json_pack(
                "{s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "rank", q, "params",
                (json_int_t)m->params, "grads", (json_int_t)m->grads, "optimizer",
                (json_int_t)m->optimizer, "buffers", (json_int_t)m->buffers, "activations",
                (json_int_t)m->activations, "save_staging", (json_int_t)m->save_staging,
                "pinned", (json_int_t)m->pinned, "baseline", (json_int_t)m->baseline, "total",
                (json_int_t)m->total));
        }
        mem = json_pack("{s:s, s:f, s:o}", "device", au->mem.on_gpu ? "cuda" : "cpu",
                        "formula_bytes", au->mem.formula_bytes, "ranks", ranks);
    }
    json_t *j = json_pack("{s:s, s:s?, s:b, s:o, s:o, s:b, s:o}", "path", path, "checkpoint",
                          au->ckpt, "picked", au->picked,
                          "step", au->ckpt ? json_integer((json_int_t)au->step) : json_null(),
                          "policy", said, "verified", au->report && !zck_report_count(au->report),
                          "problems", probs);
    if (au->world)
        json_object_set_new(j, "resume", json_pack("{s:I, s:i, s:I, s:s?}", "world",
                                                   (json_int_t)au->world, "zero_stage",
                                                   au->zero_stage, "batch",
                                                   (json_int_t)au->batch, "model",
                                                   au->model[0] ? au->model : NULL));
    json_object_set_new(j, "resumable", json_boolean(au->reasons.n == 0));
    json_object_set_new(j, "reasons", reasons);
    json_object_set_new(j, "memory", mem);
    if (au->has_pick) {
        char b[160], c[160];
        zr_plan_pick_print(&au->pick, b, sizeof b);
        zr_plan_pick_print(&au->runner_up, c, sizeof c);
        json_object_set_new(j, "memory_plan", json_pack(
            "{s:s, s:I, s:f, s:s?, s:I, s:f}", "chose", b, "bytes", (json_int_t)au->pick.bytes,
            "step_time", au->pick.cost, "rejected", au->runner_up.micro_batch ? c : NULL,
            "rejected_bytes", (json_int_t)au->runner_up.bytes, "rejected_step_time",
            au->runner_up.cost));
    }
    return j;
}

static void audit_print(const zr_audit *au)
{
    for (size_t i = 0; i < au->said.n; i++)
        printf("%s\n", au->said.name[i]);
    if (au->ckpt)
        printf("checkpoint: %s (step %llu)%s\n", au->ckpt, (unsigned long long)au->step,
               au->picked ? ", what a resume would pick" : "");
    size_t n = au->report ? zck_report_count(au->report) : 0;
    for (size_t i = 0; i < n; i++) {
        const zck_problem *p = zck_report_get(au->report, i);
        printf("  %s: %s: %s\n", p->file, zck_problem_kind_name(p->kind), p->detail);
    }
    if (au->ckpt && !n)
        printf("verification: sound (all checks, every file hashed%s)\n",
               au->picked ? " by the resume policy" : "");
    else if (n)
        printf("verification: %zu problem%s found\n", n, n == 1 ? "" : "s");
    if (au->world)
        printf("resume at world %u, ZeRO stage %d, batch %u, model %s\n", au->world,
               au->zero_stage, au->batch, au->model[0] ? au->model : "(not resolved)");
    if (au->has_mem)
        zr_mem_plan_print(&au->mem, stdout);
    if (au->has_pick) {
        char b[160];
        zr_plan_pick_print(&au->pick, b, sizeof b);
        printf("memory limit: %s: %.1f MiB per rank predicted, step time %.2fx\n", b,
               au->pick.bytes / 1048576.0, au->pick.cost);
        if (au->runner_up.micro_batch) {
            zr_plan_pick_print(&au->runner_up, b, sizeof b);
            printf("  rejected %s: %.1f MiB per rank, step time %.2fx (%s)\n", b,
                   au->runner_up.bytes / 1048576.0, au->runner_up.cost,
                   au->runner_up.cost < au->pick.cost ? "over the limit" : "slower");
        }
    }
    if (!au->reasons.n) {
        printf("resumable: step %llu\n", (unsigned long long)au->step);
        return;
    }
    printf("not resumable:\n");
    for (size_t i = 0; i < au->reasons.n; i++)
        printf("  %s\n", au->reasons.name[i]);
}

/* audit of a DeepSpeed or DCP checkpoint: its verification, and why zrun cannot resume it */
static int audit_foreign(const zckpt_args *a, zfmt_foreign_kind k)
{
    zck_report *rep = NULL;
    zck_verify_opts o = ZCK_VERIFY_OPTS_INIT;
    if (zfmt_foreign_verify(&rep, a->path, &o) < 0)
        return zcli_fail_lib(PROG, NULL);
    size_t n = zck_report_count(rep);
    const char *why = "zrun resumes only zero checkpoints: `zckpt import DIR -o RUNDIR` makes "
                      "one of it (a Hugging Face GPT-2 or Llama: its weights, AdamW's moments "
                      "and step), which `zrun --resume RUNDIR` continues";
    if (a->json) {
        json_t *probs = problems_json(rep);
        print_json(json_pack("{s:s, s:s, s:b, s:b, s:o, s:[s]}", "path", a->path, "format",
                             zfmt_foreign_name(k), "sound", n == 0, "resumable", 0, "problems",
                             probs, "reasons", why));
    } else {
        char f[300], det[1280];
        for (size_t i = 0; i < n; i++) {
            const zck_problem *p = zck_report_get(rep, i);
            printf("%s: %s: %s\n", zr_printable(f, sizeof f, p->file),
                   zck_problem_kind_name(p->kind), zr_printable(det, sizeof det, p->detail));
        }
        printf("%s: a %s checkpoint, %s\nnot resumable:\n  %s\n", a->path,
               zfmt_foreign_name(k), n ? "damaged (the problems above)" : "sound (all checks)",
               why);
    }
    zck_report_free(rep);
    return ZCLI_FOUND;
}

static int cmd_audit(const void *args)
{
    const zckpt_args *a = args;
    zfmt_foreign_kind fk = zfmt_foreign_detect(a->path);
    if (fk != ZFMT_FOREIGN_NONE)
        return audit_foreign(a, fk);
    zr_audit *au = NULL;
    if (zr_audit_run(&au, a->path, &a->audit) < 0)
        return zcli_fail_ckpt(PROG, NULL);
    if (a->json)
        print_json(audit_json(a->path, au));
    else
        audit_print(au);
    int rc = au->reasons.n ? ZCLI_FOUND : ZCLI_OK;
    zr_audit_free(au);
    return rc;
}

/* ------------------------------------------------------------------ options */

/* options several subcommands share */
#define OPT_JSON ZCLI_FLAG("--json", json, "print one JSON object on stdout (docs/CLI.md)")
#define OPT_FORCE                                                                               \
    ZCLI_FLAG("--force", force, "replace the output when it exists (a run directory only once " \
                                "the new one is complete)")
#define OPT_OUTPUT(mt, txt)                                                                     \
    {.name = "-o", .alias = "--output", .kind = ZCLI_OPT_STRING, .flags = ZCLI_OPT_REQUIRED,   \
     .off = offsetof(zckpt_args, out), .meta = mt, .help = txt}
#define OPT_BUFFER(txt) {.name = "--buffer", .kind = ZCLI_OPT_BYTES,                            \
                         .off = offsetof(zckpt_args, reshard.buf_bytes), .meta = "SIZE",       \
                         .help = txt}
#define OPT_DTYPE                                                                               \
    ZCLI_ENUM("--dtype", dtype, dtype_names, dtype_values, "as stored",                         \
              "convert every tensor to this dtype")

static const char *const dtype_names[] = {"f32", "bf16", "f16", NULL};
static const int dtype_values[] = {ZCK_F32, ZCK_BF16, ZCK_F16};
static const char *const consolidate_formats[] = {"zckpt", "safetensors", NULL};
static const int consolidate_format_values[] = {FMT_ZCKPT, FMT_SAFETENSORS};
static const char *const export_formats[] = {"safetensors", "llmc", "hf", "dcp", NULL};
static const int export_format_values[] = {FMT_SAFETENSORS, FMT_LLMC, FMT_HF, FMT_DCP};

static const zcli_opt ls_opts[] = {ZCLI_POSITIONAL("RUNDIR", path), OPT_JSON};
static const zcli_opt inspect_opts[] = {
    ZCLI_POSITIONAL("CKPT", path),
    ZCLI_FLAG("--tensors", tensors,
              "list every tensor's name, dtype, shape and the shard files that hold its params"),
    OPT_JSON,
};
static const zcli_opt verify_opts[] = {
    ZCLI_POSITIONAL("CKPT|RUNDIR|ARCHIVE", path),
    ZCLI_FLAG("--all", all, "a run directory: every step directory, not only what latest names"),
    ZCLI_FLAG("--quick", verify.quick, "skip hashing: presence, sizes, coverage"),
    ZCLI_INTEGER(U32, "--jobs", verify.jobs, "N", 1, 256, NULL, "shards hashed in parallel"),
    OPT_JSON,
};
static const zcli_opt reshard_opts[] = {
    ZCLI_POSITIONAL("CKPT", path),
    {.name = "--world", .kind = ZCLI_OPT_U32, .flags = ZCLI_OPT_REQUIRED,
     .off = offsetof(zckpt_args, world), .meta = "N", .lo = 1, .hi = ZCK_MAX_WORLD,
     .help = "ranks of the new checkpoint"},
    OPT_OUTPUT("OUT", "the new run directory"),
    OPT_BUFFER("working memory for data, whatever the checkpoint size"),
    ZCLI_INTEGER(U32, "--jobs", reshard.jobs, "N", 1, 64, NULL, "shards written in parallel"),
    OPT_FORCE,
};
static const zcli_opt consolidate_opts[] = {
    ZCLI_POSITIONAL("CKPT", path),
    OPT_OUTPUT("OUT", "the safetensors file, or the run directory of the world-1 checkpoint"),
    ZCLI_ENUM("--format", format, consolidate_formats, consolidate_format_values,
              "safetensors when OUT ends in .safetensors, else zckpt", "what OUT is"),
    OPT_DTYPE,
    ZCLI_FLAG("--params-only", params_only, "safetensors: only the param state"),
    OPT_BUFFER("working memory (safetensors: at most 64M)"),
    {.name = "--shard-size", .kind = ZCLI_OPT_BYTES, .off = offsetof(zckpt_args, split_bytes),
     .meta = "SIZE", .def = "one file",
     .help = "a DeepSpeed or DCP checkpoint: OUT is a directory of Hugging Face shards "
             "model-0000k-of-0000n.safetensors of at most SIZE each (a larger tensor alone; at "
             "most 512 files) with model.safetensors.index.json, as export --format hf writes"},
    OPT_FORCE,
};
static const zcli_opt export_opts[] = {
    ZCLI_POSITIONAL("CKPT", path),
    OPT_OUTPUT("OUT", "the model file (hf, dcp: the directory)"),
    {.name = "--format", .kind = ZCLI_OPT_ENUM, .flags = ZCLI_OPT_REQUIRED,
     .off = offsetof(zckpt_args, format), .choices = export_formats,
     .values = export_format_values,
     .help = "safetensors in our tensor names, llm.c's GPT-2 model file, a Hugging Face "
             "model directory (config.json + model.safetensors) that transformers loads, or a "
             "PyTorch Distributed Checkpoint (.metadata + __0_0.distcp) that "
             "torch.distributed.checkpoint.load reads into the Hugging Face model's state_dict "
             "under \"model\""},
    OPT_DTYPE,
    ZCLI_STRING("--tokenizer", tokenizer, "FILE", "the checkpoint's own, if any",
                "hf: a tokenizer.json to put beside the model"),
    {.name = "--shard-size", .kind = ZCLI_OPT_BYTES, .off = offsetof(zckpt_args, shard_bytes),
     .meta = "SIZE", .def = "5000000000 (transformers' 5GB)",
     .help = "hf: weights larger than this go into model-0000k-of-0000n.safetensors shards of "
             "at most SIZE each (a larger tensor alone; at most 512 files) with "
             "model.safetensors.index.json; 0: one model.safetensors whatever its size"},
    ZCLI_FLAG("--optim", optim,
              "dcp: also AdamW's state under \"optimizer\" (exp_avg, exp_avg_sq, step; one param "
              "group), as get_optimizer_state_dict names it, for set_optimizer_state_dict"),
    OPT_FORCE,
};
static const zcli_opt import_opts[] = {
    ZCLI_POSITIONAL("SRC", path),
    OPT_OUTPUT("RUNDIR", "the run directory of the new checkpoint"),
    ZCLI_INTEGER(U32, "--world", import.world, "N", 1, ZCK_MAX_WORLD, NULL,
                 "shards of the new checkpoint"),
    ZCLI_INTEGER(U32, "--heads", import.heads, "N", 1, 65536, "from the source",
                 "attention heads, when the source does not say"),
    ZCLI_STRING("--format", import.format, "auto|deepspeed|dcp", "auto",
                "deepspeed or dcp: refuse SRC unless it is a DeepSpeed (ZeRO or universal) or "
                "PyTorch DCP checkpoint (auto: by what SRC holds)"),
    ZCLI_STRING("--config", import.config, "FILE", "SRC's config.json (a DeepSpeed tag "
                "folder: its parent's)",
                "DeepSpeed and DCP: the model's Hugging Face config.json"),
};
static const zcli_opt pack_opts[] = {
    ZCLI_POSITIONAL("CKPT", path),
    OPT_OUTPUT("FILE.tar[.gz|.zst]", "the archive; compression from the suffix (also .tgz)"),
};
static const zcli_opt unpack_opts[] = {
    ZCLI_POSITIONAL("FILE", path),
    OPT_OUTPUT("RUNDIR", "the run directory to unpack into"),
};
static const zcli_opt diff_opts[] = {
    ZCLI_POSITIONAL("A", path),
    ZCLI_POSITIONAL("B", path2),
    ZCLI_REAL(DOUBLE, "--atol", diff.atol, "X", 0, DBL_MAX, NULL, "absolute tolerance"),
    ZCLI_REAL(DOUBLE, "--rtol", diff.rtol, "Y", 0, DBL_MAX, NULL, "relative tolerance"),
    ZCLI_FLAG("--all", all, "list matching tensors too"),
    OPT_JSON,
    {.name = "--no-verify", .kind = ZCLI_OPT_FLAG, .off = offsetof(zckpt_args, diff.verify),
     .help = "compare without verifying both checkpoints first", .flag_value = 0},
};
static const zcli_opt audit_opts[] = {
    ZCLI_POSITIONAL("RUNDIR|CKPT", path),
    ZCLI_INTEGER(U32, "--world", audit.world, "W", 1, ZCK_MAX_WORLD, "the checkpoint's",
                 "ranks of the resume"),
    ZCLI_INTEGER(INT, "--zero", audit.zero_stage, "S", 0, 3, "the checkpoint's",
                 "ZeRO stage of the resume"),
    ZCLI_INTEGER(U32, "--batch", audit.batch, "B", 1, UINT32_MAX,
                 "the checkpoint's training section, else 8", "global batch of the resume"),
    ZCLI_STRING("--model", audit.model, "SPEC", "the checkpoint's",
                "model of the resume (as zrun --model)"),
    ZCLI_INTEGER(U32, "--jobs", audit.jobs, "N", 1, 256, NULL, "shards hashed in parallel"),
    {.name = "--memory-limit", .kind = ZCLI_OPT_U64,
     .off = offsetof(zckpt_args, audit.memory_limit), .meta = "B", .lo = 1,
     .hi = (uint64_t)1 << 50, .def = "none",
     .help = "bytes per rank: the configuration zrun --memory-limit would pick for the resume "
             "(stage, micro-batch, recompute, offload) and the runner-up it rejects; a reason "
             "naming the smallest limit when nothing fits"},
    OPT_JSON,
};
static const zcli_opt plot_opts[] = {
    ZCLI_POSITIONAL("RUN|LOG", path),
    {.name = "-o", .alias = "--output", .kind = ZCLI_OPT_STRING,
     .off = offsetof(zckpt_args, out), .meta = "FILE.svg", .def = "RUN/train.svg",
     .help = "the SVG (written beside it, then renamed over it)"},
    ZCLI_STRING("--log", log, "FILE", "RUN/train.jsonl", "the JSON log (zrun --log-json)"),
    ZCLI_FLAG("--force", force, "replace an output that is not an SVG drawing (never the log, "
                                "nor anything but a regular file)"),
};
static const zcli_opt prune_opts[] = {
    ZCLI_POSITIONAL("RUNDIR", path),
    {.name = "--keep-last", .kind = ZCLI_OPT_U32, .off = offsetof(zckpt_args, prune.keep_last),
     .meta = "K", .lo = 1, .hi = UINT32_MAX,
     .help = "keep the newest K checkpoints (required, unless --damaged)"},
    ZCLI_INTEGER(U64, "--keep-every", prune.keep_every, "N", 1, UINT32_MAX, "",
                 "also keep those whose step is a multiple of N"),
    ZCLI_FLAG("--damaged", prune.damaged, "remove only the damaged-step-N directories a "
              "resume moved aside (those holding only the format's files), nothing else"),
    ZCLI_FLAG("--dry-run", prune.dry_run, "only say what would be removed"),
    OPT_JSON,
};

/* ------------------------------------------------------------------ main */

#define TABLE(t) ZCLI_TABLE(t)

static const zcli_command commands[] = {
    {"ls", cmd_ls, TABLE(ls_opts),
     "List every checkpoint of a run directory with its step, world size, ZeRO stage, bytes\n"
     "and status from a quick check (complete, incomplete, corrupt: the files at fault named),\n"
     "which one `latest` names, the damaged ones a resume moved aside (damaged-step-N), and\n"
     "stale temporaries.\n"},
    {"inspect", cmd_inspect, TABLE(inspect_opts),
     "Summarize a checkpoint's manifest. CKPT is a checkpoint directory or a run directory\n"
     "(its `latest` is used), or a DeepSpeed ZeRO, DeepSpeed universal (ds_to_universal.py)\n"
     "or PyTorch DCP checkpoint directory.\n"},
    {"verify", cmd_verify, TABLE(verify_opts),
     "Check a checkpoint: manifest, SHA256SUMS, presence and size of every shard, coverage of\n"
     "every (group, state), stray files and, unless --quick, the SHA-256 of every shard.\n"
     "An archive made by `zckpt pack` is verified while it streams, without extracting.\n"
     "A DeepSpeed ZeRO, DeepSpeed universal or PyTorch DCP checkpoint directory is read in C\n"
     "(nothing executed): rank files, partitions, parameter folders or chunks covering every\n"
     "tensor, zips, pickles, CRC-32s.\n"
     "Exit 0 when sound, 1 when a problem is found, 2 on error.\n"},
    {"reshard", cmd_reshard, TABLE(reshard_opts),
     "Write the checkpoint again for N ranks into the new run directory OUT (same step).\n"
     "The source is verified in full while the output is written, which is committed only\n"
     "when that passes; the output is hashed and committed atomically. Memory stays within\n"
     "--buffer whatever the checkpoint size. OUT must not exist, unless --force, which\n"
     "replaces it only once the new one is complete.\n"},
    {"consolidate", cmd_consolidate, TABLE(consolidate_opts),
     "One file or one shard: --format safetensors writes every tensor (states other than\n"
     "param as <state>/<name>) into one safetensors file, optionally converted (--dtype) or\n"
     "params only; --format zckpt writes a world-1 checkpoint into the run directory OUT.\n"
     "Of a DeepSpeed (ZeRO or universal) or DCP checkpoint: its weights into one safetensors\n"
     "file, as zero_to_fp32.py or dcp_to_torch_save give them, or with --shard-size into a\n"
     "directory of Hugging Face shards with their index. Streaming, bounded memory.\n"},
    {"export", cmd_export, TABLE(export_opts),
     "Export the model (params) of a checkpoint: safetensors in our tensor names, llm.c's\n"
     "GPT-2 model file (gpt2_124M.bin layout), or a Hugging Face model directory (config.json\n"
     "+ model.safetensors or shards with their index) that transformers loads as\n"
     "GPT2LMHeadModel or LlamaForCausalLM, or a PyTorch Distributed Checkpoint of that\n"
     "model's state dict (with --optim also AdamW's state) that torch.distributed.checkpoint\n"
     "loads.\n"},
    {"import", cmd_import, TABLE(import_opts),
     "Make a step-0 checkpoint (N shards) from a model: a safetensors file in our names, a\n"
     "Hugging Face GPT2LMHeadModel or LlamaForCausalLM directory (config.json +\n"
     "model.safetensors, or shards with model.safetensors.index.json), or an llm.c GPT-2\n"
     "model file: optimizer states start at zero. Or a DeepSpeed ZeRO checkpoint (stages\n"
     "1-3, fp32 or bf16), its universal checkpoint (ds_to_universal.py's <tag>_universal\n"
     "folder) or a PyTorch DCP checkpoint of such a Hugging Face model, verified\n"
     "in full first: the fp32 weights, AdamW's moments and step come along, and `zrun\n"
     "--resume RUNDIR` continues the run (give it the source's --lr and --weight-decay).\n"},
    {"pack", cmd_pack, TABLE(pack_opts),
     "Pack a checkpoint into a tar archive (compression from the suffix), streaming.\n"},
    {"unpack", cmd_unpack, TABLE(unpack_opts),
     "Unpack an archive made by `zckpt pack` into a run directory: refuses absolute paths,\n"
     "'..', links and device files, extracts into a temporary directory, verifies every hash,\n"
     "and only then moves the checkpoint into place (and updates `latest` if it is newer).\n"},
    {"diff", cmd_diff, TABLE(diff_opts),
     "Compare two checkpoints tensor by tensor and state by state, whatever their world\n"
     "sizes: the largest absolute difference and whether they match (|a-b| <= atol + rtol|b|;\n"
     "default exact). Both are verified first unless --no-verify. Exit 0 when everything\n"
     "matches, 1 otherwise.\n"},
    {"audit", cmd_audit, TABLE(audit_opts),
     "The check before a resume: which checkpoint a resume would read (of a run directory,\n"
     "what `zrun --resume auto` would pick, moving nothing; damaged newer ones named), its\n"
     "full verification, whether zrun would accept it at --world, --zero, --batch and --model\n"
     "(the training loop's own checks), and the memory per rank (as zrun --dry-run).\n"
     "Exit 0 when resumable, 1 when not (each reason on its own line; also a run directory\n"
     "without a checkpoint), 2 on usage or I/O errors (a path that does not exist).\n"},
    {"plot", cmd_plot, TABLE(plot_opts),
     "Draw a run's JSON log (zrun --log-json) as an SVG, as zrun writes RUN/train.svg at each\n"
     "save: training and validation loss, learning rate and tokens/s against the step, each\n"
     "invocation its own line, resumes and world-size changes marked. Lines that are not JSON\n"
     "(a truncated last line) are skipped and counted; a log without step records is an\n"
     "error.\n"},
    {"prune", cmd_prune, TABLE(prune_opts),
     "Remove all but the newest K checkpoints (and those whose step is a multiple of N), and\n"
     "stale temporaries. Never removes what `latest` names, nor checkpoints newer than it.\n"
     "With --damaged instead: only the damaged-step-N directories a resume moved aside.\n"},
};
#define N_COMMANDS (sizeof commands / sizeof *commands)

static void usage(FILE *f)
{
    zcli_commands_usage(f, PROG, "Audit and reshape zero checkpoints.", commands, N_COMMANDS,
                        "Exit status: 0 ok, 1 a check found a problem,\n2 usage or I/O error. "
                        "ZR_LOG=debug traces errors.");
}

static void command_help(const zcli_command *c)
{
    zcli_opts p = zcli_command_opts(PROG, c);
    zckpt_args defaults;
    args_init(&defaults);
    zcli_command_help(stdout, &p, c->help, &defaults);
}

int main(int argc, char **argv)
{
    if (argc < 2 || zcli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? ZCLI_ERROR : ZCLI_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf(PROG " (zero %s), checkpoint format %d.%d\n", ZERO_VERSION, ZCK_VERSION_MAJOR,
               ZCK_VERSION_MINOR);
        return ZCLI_OK;
    }
    const zcli_command *cmd = zcli_command_find(PROG, commands, N_COMMANDS, argv[1]);
    if (!cmd) {
        usage(stderr);
        return ZCLI_ERROR;
    }
    for (int a = 2; a < argc; a++)
        if (zcli_is_help(argv[a])) {
            command_help(cmd);
            return ZCLI_OK;
        }
    zcli_opts p = zcli_command_opts(PROG, cmd);
    zckpt_args args;
    args_init(&args);
    int rc = zcli_opts_parse(&p, &args, argc - 1, argv + 1);
    return rc ? rc : cmd->fn(&args);
}
