/*
 * test_recompute.c: activation checkpointing (zrun --recompute, zr_recompute). The model with
 * layer or selective recompute gives the losses and gradients of none bit for bit (GPT-2 and
 * Llama, odd shapes, 1 to 3 threads, micro-batches accumulated), asks the parameter hooks for
 * the same groups in the same order (the recompute runs inside the backward's one request of
 * a layer: ZeRO-3 gathers nothing more for the layers) and holds fewer activation bytes, as the
 * dry run says; the head in several chunks with its gradient whole or in pieces (layer keeps no
 * probabilities: the pieces recompute their logits) gives the same bits in every mode;
 * zrun at stages 0-3, world 1 and 2, ends with the checkpoint of none, through a resume; the
 * device engine refuses it. The memory planner (zrun and zckpt audit --memory-limit): its
 * choice fits the limit, measured; nothing fitting names the smallest limit.
 */
#include "ckutil.h"
#include "zr.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *const MODELS[] = {
    "gpt2:layers=3,heads=3,dim=24,ctx=16,vocab=97",
    "llama:layers=3,heads=4,kv_heads=2,dim=32,ffn=40,ctx=16,vocab=97",
    "llama:layers=2,heads=4,kv_heads=1,dim=32,ffn=24,ctx=16,vocab=97,tied=1",
};
static const char *const MODE_NAMES[] = {"none", "layer", "selective"};

/* the hooks lend the parameters of a model with its own arenas and count the requests */
typedef struct {
    zr_model *own;
    size_t order[64], n;
} lender;

static int lend(void *ctx, size_t g, const float **out)
{
    lender *l = ctx;
    if (l->n < 64)
        l->order[l->n] = g;
    l->n++;
    *out = zr_model_param(l->own, g);
    return 0;
}

static int lend_done(void *ctx, size_t g)
{
    (void)ctx;
    (void)g;
    return 0;
}

ZT_TEST(recompute_model_gradients_bit_equal_at_1_to_3_threads)
{
    enum { B = 3, T = 7 }; /* odd: a last partial block everywhere */
    for (size_t k = 0; k < sizeof MODELS / sizeof *MODELS; k++) {
        zr_gpt2_config c;
        ZT_OK(zr_gpt2_config_parse(&c, MODELS[k]));
        int32_t in[2][B * T], tg[2][B * T];
        for (size_t i = 0; i < B * T; i++)
            for (int j = 0; j < 2; j++) {
                in[j][i] = (int32_t)(zt_mix(i * 2 + j) % c.vocab);
                tg[j][i] = (int32_t)(zt_mix(i * 2 + j + 1000) % c.vocab);
            }
        zr_model *m[3];
        for (int r = 0; r < 3; r++) {
            ZT_OK(zr_model_new_recompute(&m[r], &c, B, T, NULL, (zr_recompute)r));
            zr_model_init_weights(m[r], 7);
        }
        uint64_t acts[3];
        for (int r = 0; r < 3; r++) {
            uint64_t p, g;
            zr_model_bytes(m[r], &p, &g, &acts[r]);
            ZT_CHECK_EQ(acts[r], zr_model_activation_bytes(&c, B, T, (zr_recompute)r));
        }
        size_t n = zr_model_numel(m[0]);
        for (int th = 1; th <= 3; th++) {
            zr_set_threads(th);
            float loss[3][2];
            for (int r = 0; r < 3; r++) {
                zr_model_zero_grad(m[r]);
                for (int j = 0; j < 2; j++) { /* two micro-batches, accumulated */
                    ZT_OK(zr_model_forward(m[r], in[j], tg[j], B, T, &loss[r][j]));
                    if (j) { /* the second: two backwards of one forward (the shared buffers
                              * then hold the first layer when the second begins) */
                        ZT_OK(zr_model_backward(m[r], 0.25f));
                        ZT_OK(zr_model_backward(m[r], 0.25f));
                    } else {
                        ZT_OK(zr_model_backward(m[r], 0.5f));
                    }
                }
            }
            for (int r = 1; r < 3; r++) {
                if (memcmp(loss[r], loss[0], sizeof loss[0]))
                    ZT_FAIL("%s, %d threads, recompute %s: losses %.9g %.9g, none %.9g %.9g",
                            MODELS[k], th, MODE_NAMES[r], loss[r][0], loss[r][1], loss[0][0],
                            loss[0][1]);
                const float *ga = zr_model_grad(m[0], 0), *gb = zr_model_grad(m[r], 0);
                for (size_t i = 0; i < n; i++)
                    if (memcmp(&ga[i], &gb[i], sizeof *ga))
                        ZT_FAIL("%s, %d threads, recompute %s: gradient %zu is %.9g, none %.9g",
                                MODELS[k], th, MODE_NAMES[r], i, gb[i], ga[i]);
            }
        }
        zr_set_threads(1);
        /* layer keeps less than selective, which keeps less than none (at a batch where the
         * difference passes the arena's 2 MiB rounding) */
        ZT_CHECK(zr_model_activation_bytes(&c, 512, 16, ZR_RECOMPUTE_LAYER) <
                 zr_model_activation_bytes(&c, 512, 16, ZR_RECOMPUTE_SELECTIVE));
        ZT_CHECK(zr_model_activation_bytes(&c, 512, 16, ZR_RECOMPUTE_SELECTIVE) <
                 zr_model_activation_bytes(&c, 512, 16, ZR_RECOMPUTE_NONE));
        for (int r = 0; r < 3; r++)
            zr_model_free(m[r]);
    }
}

/* The hooks of a model whose gradient lives in one array (grads, in the arena layout of own):
 * parameters lent from own, every group of V rows (an embedding, a head) lent in pieces of
 * piece_rows rows, as ZeRO-2/3 lends the big groups. */
typedef struct {
    lender l;
    float *grads;
    uint64_t rows_numel, piece_numel;
} piece_lender;

static int lend_grads(void *ctx, size_t g, float **out)
{
    piece_lender *p = ctx;
    *out = p->grads + (zr_model_grad(p->l.own, g) - zr_model_grad(p->l.own, 0));
    return 0;
}

static uint64_t piece_numel(void *ctx, size_t g)
{
    piece_lender *p = ctx;
    return zr_model_group_numel(p->l.own, g) == p->rows_numel ? p->piece_numel : 0;
}

static int lend_piece(void *ctx, size_t g, uint64_t off, uint64_t n, float **out)
{
    (void)n;
    ZT_OK(lend_grads(ctx, g, out));
    *out += off;
    return 0;
}

static int piece_done(void *ctx, size_t g, uint64_t off, uint64_t n)
{
    (void)ctx;
    (void)g;
    (void)off;
    (void)n;
    return 0;
}

/* The head in several chunks of rows (a vocabulary of 70001: 239 rows a chunk, the last one
 * partial), its gradient whole or in pieces (which, without the probabilities, recompute their
 * columns of the logits): every mode gives the losses and the gradient of none with its own
 * arenas, bit for bit, at 1 to 3 threads; layer keeps one chunk of the head, the others all
 * the probabilities. */
ZT_TEST(recompute_head_in_chunks_and_gradient_pieces_bit_equal)
{
    static const char *const BIG_V[] = {
        "gpt2:layers=1,heads=2,dim=16,ctx=64,vocab=70001",
        "llama:layers=1,heads=2,kv_heads=1,dim=16,ffn=24,ctx=64,vocab=70001",
        "llama:layers=1,heads=2,kv_heads=1,dim=16,ffn=24,ctx=64,vocab=70001,tied=1",
    };
    enum { B = 5, T = 53 }; /* 265 positions: chunks of 239 and 26 */
    for (size_t k = 0; k < sizeof BIG_V / sizeof *BIG_V; k++) {
        zr_gpt2_config c;
        ZT_OK(zr_gpt2_config_parse(&c, BIG_V[k]));
        int32_t in[B * T], tg[B * T];
        for (size_t i = 0; i < B * T; i++) {
            in[i] = (int32_t)(zt_mix(i) % c.vocab);
            tg[i] = (int32_t)(zt_mix(i + 777) % c.vocab);
        }
        zr_model *own;
        ZT_OK(zr_model_new_ext(&own, &c, B, T, NULL));
        zr_model_init_weights(own, 5);
        size_t n = zr_model_numel(own);
        piece_lender pl[3];
        zr_model *m[3];
        for (int r = 0; r < 3; r++) {
            memset(&pl[r], 0, sizeof pl[r]);
            pl[r].l.own = own;
            ZT_CHECK((pl[r].grads = calloc(n, sizeof(float))) != NULL);
            pl[r].rows_numel = (uint64_t)c.vocab * c.dim;
            pl[r].piece_numel = 4000 * (uint64_t)c.dim; /* 3968 rows a piece: 18 pieces */
            zr_model_hooks h = {.ctx = &pl[r], .params = lend, .params_done = lend_done,
                                .grads = lend_grads, .grads_done = lend_done,
                                .grad_piece_numel = piece_numel, .grad_piece = lend_piece,
                                .grad_piece_done = piece_done};
            ZT_OK(zr_model_new_recompute(&m[r], &c, B, T, &h, (zr_recompute)r));
            uint64_t acts;
            zr_model_bytes(m[r], NULL, NULL, &acts);
            ZT_CHECK_EQ(acts, zr_model_activation_bytes(&c, B, T, (zr_recompute)r));
        }
        ZT_CHECK(zr_model_probs(m[0]) != NULL && zr_model_probs(m[2]) != NULL);
        ZT_CHECK(zr_model_probs(m[1]) == NULL);
        /* one chunk instead of the probabilities (74 MiB against 64 MiB here) */
        ZT_CHECK(zr_model_activation_bytes(&c, B, T, ZR_RECOMPUTE_LAYER) + ((uint64_t)4 << 20) <
                 zr_model_activation_bytes(&c, B, T, ZR_RECOMPUTE_NONE));
        for (int th = 1; th <= 3; th++) {
            zr_set_threads(th);
            float ref, loss;
            zr_model_zero_grad(own);
            ZT_OK(zr_model_forward(own, in, tg, B, T, &ref));
            ZT_OK(zr_model_backward(own, 1.0f));
            const float *ga = zr_model_grad(own, 0);
            for (int r = 0; r < 3; r++) {
                memset(pl[r].grads, 0, n * sizeof(float));
                ZT_OK(zr_model_forward(m[r], in, tg, B, T, &loss));
                ZT_OK(zr_model_backward(m[r], 1.0f));
                if (memcmp(&loss, &ref, sizeof loss))
                    ZT_FAIL("%s, %d threads, recompute %s, pieces: loss %.9g, none %.9g",
                            BIG_V[k], th, MODE_NAMES[r], loss, ref);
                for (size_t i = 0; i < n; i++)
                    if (memcmp(&ga[i], &pl[r].grads[i], sizeof *ga))
                        ZT_FAIL("%s, %d threads, recompute %s, pieces: gradient %zu is %.9g, "
                                "none %.9g", BIG_V[k], th, MODE_NAMES[r], i, pl[r].grads[i],
                                ga[i]);
            }
        }
        zr_set_threads(1);
        for (int r = 0; r < 3; r++) {
            zr_model_free(m[r]);
            free(pl[r].grads);
        }
        zr_model_free(own);
    }
}

/* Stage 3 gathers what the model asks the hooks for: the same groups in the same order with
 * every mode, each layer once in the backward (the recompute reuses that request). */
ZT_TEST(recompute_asks_for_each_layer_once_in_the_backward)
{
    for (size_t k = 0; k < sizeof MODELS / sizeof *MODELS; k++) {
        zr_gpt2_config c;
        ZT_OK(zr_gpt2_config_parse(&c, MODELS[k]));
        zr_model *own;
        ZT_OK(zr_model_new_ext(&own, &c, 2, 9, NULL));
        zr_model_init_weights(own, 3);
        int32_t in[18], tg[18];
        for (size_t i = 0; i < 18; i++) {
            in[i] = (int32_t)(zt_mix(i) % c.vocab);
            tg[i] = (int32_t)(zt_mix(i + 99) % c.vocab);
        }
        lender l[3];
        size_t fwd[3];
        for (int r = 0; r < 3; r++) {
            memset(&l[r], 0, sizeof l[r]);
            l[r].own = own;
            zr_model_hooks h = {.ctx = &l[r], .params = lend, .params_done = lend_done};
            zr_model *m;
            ZT_OK(zr_model_new_recompute(&m, &c, 2, 9, &h, (zr_recompute)r));
            float loss;
            ZT_OK(zr_model_forward(m, in, tg, 2, 9, &loss));
            fwd[r] = l[r].n;
            ZT_OK(zr_model_backward(m, 1.0f));
            size_t order[64], no = zr_model_fetch_order(m, 1, order);
            ZT_CHECK_EQ(l[r].n - fwd[r], no); /* the backward's requests: its fetch order */
            ZT_CHECK(memcmp(order, l[r].order + fwd[r], no * sizeof *order) == 0);
            zr_model_free(m);
        }
        for (int r = 1; r < 3; r++) {
            ZT_CHECK_EQ(l[r].n, l[0].n);
            ZT_CHECK_EQ(fwd[r], fwd[0]);
            ZT_CHECK(memcmp(l[r].order, l[0].order, l[0].n * sizeof *l[0].order) == 0);
        }
        zr_model_free(own);
    }
}

/* One zrun run into dir with recompute mode; with stop: stopped after step 2, then resumed to
 * the end with the other recompute mode (layer <-> selective: the checkpoint holds no mode). */
static void run(const char *dir, const char *model, int W, int s, int th, int mode, int stop)
{
    char log[96], opts[512];
    snprintf(opts, sizeof opts, "--model %s --batch 4 --micro-batch %d --seq 13 --steps 4 "
             "--warmup 1 --threads %d --nproc %d --zero %d --ckpt-dir %s --log-json %s.jsonl",
             model, W == 1 ? 2 : 1, th, W, s, dir, dir);
    snprintf(log, sizeof log, "%s.log", dir);
    if (stop) {
        zt_zrunf_ok(log, "%s --recompute %s --resume never --stop-after 2", opts,
                    MODE_NAMES[mode]);
        zt_zrunf_ok(log, "%s --recompute %s --resume auto", opts, MODE_NAMES[3 - mode]);
        zt_file_has(log, "continuing at step 3");
    } else {
        zt_zrunf_ok(log, "%s --recompute %s --resume never", opts, MODE_NAMES[mode]);
    }
}

/* zrun at every stage, world 1 and 2 (real processes): layer and selective (stopped after
 * step 2 and resumed with the other) end with the checkpoint and the losses of none. */
static void zrun_matches_none(int k, const char *model)
{
    for (int W = 1; W <= 2; W++)
        for (int s = 0; s <= 3; s++) {
            int th = 1 + (s + W) % 2; /* 1 and 2 threads across the cases */
            char base[64], jb[80];
            snprintf(base, sizeof base, "m%d-w%d-s%d-none", k, W, s);
            run(base, model, W, s, th, 0, 0);
            double lb[8];
            snprintf(jb, sizeof jb, "%s.jsonl", base);
            ZT_CHECK_EQ(zt_jlog_losses(lb, 8, jb), 4);
            for (int r = 1; r < 3; r++) {
                char dir[64], jl[80];
                snprintf(dir, sizeof dir, "m%d-w%d-s%d-%s", k, W, s, MODE_NAMES[r]);
                run(dir, model, W, s, th, r, 1);
                zt_same_latest(base, dir, 0, 0);
                double lr[8];
                snprintf(jl, sizeof jl, "%s.jsonl", dir);
                ZT_CHECK_EQ(zt_jlog_losses(lr, 8, jl), 4);
                for (int i = 1; i <= 4; i++)
                    if (lr[i] != lb[i])
                        ZT_FAIL("%s: step %d loss %.9g, none %.9g", dir, i, lr[i], lb[i]);
            }
        }
}

ZT_TEST(recompute_zrun_gpt2_matches_none_at_every_stage_and_world)
{
    /* wte (500 x 32) is bigger than a layer: ZeRO-2/3 lend its gradient in pieces */
    zrun_matches_none(0, "gpt2:layers=2,heads=2,dim=32,ctx=16,vocab=500");
}

ZT_TEST(recompute_zrun_llama_matches_none_at_every_stage_and_world)
{
    zrun_matches_none(1, "llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=40,ctx=16,vocab=256");
}

ZT_TEST(recompute_zrun_tied_llama_matches_none_at_every_stage_and_world)
{
    zrun_matches_none(2, "llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=40,ctx=16,vocab=300,"
                         "tied=1");
}

/* The dry run says the mode and counts less for it; a bad mode is refused by name. */
ZT_TEST(recompute_dry_run_and_refusals)
{
    const char *m = "--model gpt2:layers=4,heads=4,dim=64,ctx=128,vocab=256 --batch 8 --seq 128";
    uint64_t acts[3];
    for (int r = 0; r < 3; r++) {
        char log[32];
        snprintf(log, sizeof log, "d%d.json", r);
        zt_zrunf_ok(log, "%s --recompute %s --dry-run --json", m, MODE_NAMES[r]);
        char *t = zt_slurp(log);
        json_error_t e;
        json_t *o = json_loads(t, 0, &e);
        if (!o)
            ZT_FAIL("%s: not JSON (%s):\n%s", log, e.text, t);
        ZT_CHECK(strcmp(json_string_value(json_object_get(o, "recompute")), MODE_NAMES[r]) == 0);
        json_t *r0 = json_array_get(json_object_get(o, "ranks"), 0);
        acts[r] = (uint64_t)json_integer_value(json_object_get(r0, "activations"));
        json_decref(o);
        free(t);
    }
    ZT_CHECK(acts[1] < acts[2] && acts[2] < acts[0]);
    zt_zrunf_ok("t.log", "%s --recompute layer --dry-run", m);
    zt_file_has("t.log", "recompute layer");
    int st = zt_zrunf("bad.log", "%s --recompute some --dry-run", m);
    ZT_CHECK_EQ(st, 2);
    zt_file_has("bad.log", "--recompute");
}

/* The largest "rss_peak" of a --log-json file's records. */
static uint64_t jlog_rss_peak(const char *path)
{
    char *t = zt_slurp(path);
    uint64_t peak = 0;
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *v = o ? json_object_get(o, "rss_peak") : NULL;
        if (json_is_integer(v) && (uint64_t)json_integer_value(v) > peak)
            peak = (uint64_t)json_integer_value(v);
        json_decref(o);
    }
    free(t);
    return peak;
}

/* With every mode, rank 0's measured peak RSS is within 0.9-1.1x of the dry run's total, at a
 * shape where activations are most of it (2 ranks, stage 3, 1 step and a save). */
ZT_TEST(recompute_dry_run_predicts_peak_rss)
{
    /* the layers' activations; then the head's (vocabulary 32768, 1024 positions a rank: 128
     * MiB of probabilities, of which layer keeps one 64 MiB chunk) */
    static const char *const SHAPES[] = {
        "--model gpt2:layers=4,heads=4,dim=128,ctx=256,vocab=256 --batch 48 --seq 256 "
        "--nproc 2 --zero 3 --threads 1",
        "--model gpt2:layers=1,heads=2,dim=32,ctx=256,vocab=32768 --batch 8 --seq 256 "
        "--nproc 2 --zero 3 --threads 1",
    };
    for (int k = 0; k < 2; k++) {
        const char *m = SHAPES[k];
        double acts[3];
        for (int r = 0; r < 3; r++) {
            char log[32], dir[32], jl[40];
            snprintf(log, sizeof log, "d%d-%d.json", k, r);
            snprintf(dir, sizeof dir, "run-%d-%d", k, r);
            snprintf(jl, sizeof jl, "run-%d-%d.jsonl", k, r);
            zt_zrunf_ok(log, "%s --recompute %s --dry-run --json", m, MODE_NAMES[r]);
            char *t = zt_slurp(log);
            json_t *o = json_loads(t, 0, NULL);
            ZT_CHECK(o != NULL);
            json_t *r0 = json_array_get(json_object_get(o, "ranks"), 0);
            double total = (double)json_integer_value(json_object_get(r0, "total_bytes"));
            acts[r] = (double)json_integer_value(json_object_get(r0, "activations"));
            json_decref(o);
            free(t);
            snprintf(log, sizeof log, "run-%d-%d.log", k, r);
            zt_zrunf_ok(log, "%s --recompute %s --steps 1 --resume never --ckpt-dir %s "
                        "--log-json %s", m, MODE_NAMES[r], dir, jl);
            double ratio = (double)jlog_rss_peak(jl) / total;
            printf("  shape %d, recompute %s: activations %.1f MiB; peak RSS %.1f MiB, dry run "
                   "%.1f MiB (%.2fx)\n", k, MODE_NAMES[r], acts[r] / 1048576.0,
                   ratio * total / 1048576.0, total / 1048576.0, ratio);
            if (ratio < 0.9 || ratio > 1.1)
                ZT_FAIL("shape %d, recompute %s: measured peak RSS %.2fx the dry run's "
                        "total_bytes (0.9-1.1 expected)", k, MODE_NAMES[r], ratio);
        }
        if (k == 1 && acts[1] > acts[0] - 60.0 * 1048576.0)
            ZT_FAIL("the head: layer's activations %.1f MiB, none's %.1f MiB: expected 64 MiB "
                    "of probabilities fewer", acts[1] / 1048576.0, acts[0] / 1048576.0);
    }
}

/* zrun --memory-limit at 3 limits: the configuration it says it chose runs, its predicted
 * bytes and rank 0's measured peak RSS (not under ASan) are under the limit; below every configuration it refuses, naming the
 * smallest limit that works, which then runs. */
ZT_TEST(recompute_memory_limit_picks_a_configuration_that_fits)
{
    const char *m = "--model gpt2:layers=4,heads=4,dim=128,ctx=256,vocab=256 --batch 16 "
                    "--seq 256 --nproc 2 --threads 1 --steps 1 --resume never";
    static const uint64_t limits[] = {200u << 20, 90u << 20, 50u << 20};
    char seen[3][160];
    for (int i = 0; i < 3; i++) {
        char log[32], dir[32], jl[40];
        snprintf(log, sizeof log, "l%d.log", i);
        snprintf(dir, sizeof dir, "run-%d", i);
        snprintf(jl, sizeof jl, "run-%d.jsonl", i);
        zt_zrunf_ok(log, "%s --memory-limit %llu --ckpt-dir %s --log-json %s", m,
                    (unsigned long long)limits[i], dir, jl);
        zt_file_has(log, "memory plan: limit ");
        zt_file_has(log, "  rejected --zero ");
        char *t = zt_slurp(log), *c = strstr(t, "  chose --zero ");
        ZT_CHECK(c != NULL);
        snprintf(seen[i], sizeof seen[i], "%.*s", (int)strcspn(c, ":"), c);
        double predicted = strtod(c + strcspn(c, ":") + 1, NULL);
        free(t);
        ZT_CHECK(predicted > 0 && predicted * 1048576.0 <= (double)limits[i]);
        uint64_t peak = jlog_rss_peak(jl);
        printf("  limit %.0f MiB: %s, predicted %.1f MiB, peak RSS %.1f MiB\n",
               limits[i] / 1048576.0, seen[i] + 8, predicted, peak / 1048576.0);
        ZT_CHECK(peak > 0);
#if !defined(__SANITIZE_ADDRESS__) /* ASan's shadow memory adds to the resident set */
        if (peak > limits[i])
            ZT_FAIL("--memory-limit %llu: measured peak RSS %llu (%s)",
                    (unsigned long long)limits[i], (unsigned long long)peak, seen[i]);
#endif
    }
    ZT_CHECK(strcmp(seen[0], seen[2]) != 0); /* the limits led to different choices */
    int st = zt_zrunf("small.log", "%s --memory-limit 1000000 --ckpt-dir small", m);
    ZT_CHECK_EQ(st, 2);
    char *t = zt_slurp("small.log"), *u = strstr(t, "use --memory-limit ");
    if (!u || !strstr(t, "no configuration fits"))
        ZT_FAIL("expected a refusal naming the smallest limit:\n%s", t);
    unsigned long long need = strtoull(u + strlen("use --memory-limit "), NULL, 10);
    free(t);
    ZT_CHECK(need > 1000000);
    zt_zrunf_ok("need.log", "%s --memory-limit %llu --ckpt-dir need", m, need);
}

/* zckpt audit --memory-limit says what a resume with zrun --memory-limit would pick, and when
 * nothing fits, a reason naming the smallest limit (not resumable within it). */
ZT_TEST(recompute_audit_memory_limit)
{
    zt_zrunf_ok("a.log", "--model gpt2:layers=2,heads=2,dim=64,ctx=128,vocab=256 --batch 8 "
                "--seq 128 --steps 1 --threads 1 --ckpt-dir run");
    char *out = NULL;
    ZT_CHECK_EQ(zt_zckpt(&out, "audit run --world 2 --memory-limit %llu --json",
                         (unsigned long long)(400u << 20)), 0);
    json_t *o = json_loads(out, 0, NULL);
    ZT_CHECK(o != NULL);
    json_t *p = json_object_get(o, "memory_plan");
    ZT_CHECK(json_is_string(json_object_get(p, "chose")));
    ZT_CHECK(json_integer_value(json_object_get(p, "bytes")) <= (json_int_t)(400u << 20));
    ZT_CHECK(json_is_true(json_object_get(o, "resumable")));
    json_decref(o);
    free(out);
    ZT_CHECK_EQ(zt_zckpt(&out, "audit run --world 2 --memory-limit 1000"), 1);
    if (!strstr(out, "not resumable") || !strstr(out, "no configuration fits") ||
        !strstr(out, "use --memory-limit "))
        ZT_FAIL("expected the smallest limit named:\n%s", out);
    free(out);
}

/* The device engine with each mode, on the host simulation of a device (ZR_CUDA_LIB=hostsim:
 * the device ABI carries the mode to a backend, which runs the CPU model with it): at world 2,
 * ZeRO-3, GPT-2 and tied Llama, the losses and the checkpoint of none, bit for bit; the dry run
 * counts the device's activations for the mode. (The CUDA backend's own recompute is checked
 * by tests/gpu/kernels.c and tests/gpu/engine.sh where a GPU is.) */
ZT_TEST(recompute_on_the_device_engine_matches_none)
{
    setenv("ZR_CUDA_LIB", "hostsim", 1);
    static const char *const models[2] = {
        "gpt2:layers=2,heads=2,dim=32,vocab=500",
        "llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=40,vocab=300,tied=1"};
    for (int k = 0; k < 2; k++) {
        uint64_t acts[3];
        double lb[8];
        for (int r = 0; r < 3; r++) {
            char dir[32], log[48], js[48];
            snprintf(dir, sizeof dir, "d%d-%s", k, MODE_NAMES[r]);
            snprintf(log, sizeof log, "%s.log", dir);
            snprintf(js, sizeof js, "%s.jsonl", dir);
            zt_zrunf_ok(log, "--model %s,ctx=32 --batch 4 --seq 16 --steps 3 --threads 1 "
                        "--device cuda --nproc 2 --zero 3 --recompute %s --ckpt-dir %s "
                        "--log-json %s",
                        models[k], MODE_NAMES[r], dir, js);
            zt_file_has(log, "device: hostsim");
            double lr[8];
            ZT_CHECK_EQ(zt_jlog_losses(r ? lr : lb, 8, js), 3);
            if (r) {
                char base[32];
                snprintf(base, sizeof base, "d%d-none", k);
                zt_same_latest(base, dir, 0, 0);
                for (int i = 1; i <= 3; i++)
                    if (lr[i] != lb[i])
                        ZT_FAIL("%s: step %d loss %.9g, none %.9g", dir, i, lr[i], lb[i]);
            }
            /* the dry run at a longer context (arenas are counted in 2 MiB pages) */
            snprintf(log, sizeof log, "%s-dry.json", dir);
            zt_zrunf_ok(log, "--model %s,ctx=256 --batch 8 --seq 256 --device cuda --nproc 2 "
                        "--zero 3 --recompute %s --dry-run --json", models[k], MODE_NAMES[r]);
            char *t = zt_slurp(log);
            json_t *o = json_loads(t, 0, NULL);
            if (!o)
                ZT_FAIL("%s: not JSON:\n%s", log, t);
            json_t *r0 = json_array_get(json_object_get(o, "ranks"), 0);
            acts[r] = (uint64_t)json_integer_value(json_object_get(r0, "activations"));
            json_decref(o);
            free(t);
        }
        ZT_CHECK(acts[1] < acts[0] && acts[2] < acts[0]);
    }
    /* the planner on a GPU considers recompute: a limit that only layer meets (1 MiB above its
     * dry run at ZeRO-3, micro-batch 1; none's smallest is above it) */
    const char *g = "--model gpt2:layers=4,heads=4,dim=64,ctx=256,vocab=256 --batch 8 --seq 256 "
                    "--device cuda --nproc 2 --zero 3 --micro-batch 1";
    uint64_t tot[2];
    for (int r = 0; r < 2; r++) {
        zt_zrunf_ok("p.json", "%s --recompute %s --dry-run --json", g, MODE_NAMES[r]);
        char *t = zt_slurp("p.json");
        json_t *o = json_loads(t, 0, NULL);
        if (!o)
            ZT_FAIL("p.json: not JSON:\n%s", t);
        tot[r] = 0;
        json_t *rk;
        size_t i;
        json_array_foreach(json_object_get(o, "ranks"), i, rk) {
            uint64_t b = (uint64_t)json_integer_value(json_object_get(rk, "total_bytes"));
            tot[r] = b > tot[r] ? b : tot[r];
        }
        json_decref(o);
        free(t);
    }
    uint64_t limit = tot[1] + (1u << 20);
    ZT_CHECK(tot[0] > limit);
    zt_zrunf_ok("plan.log", "%s --memory-limit %llu --dry-run", g, (unsigned long long)limit);
    zt_file_has("plan.log", "--recompute layer");
    unsetenv("ZR_CUDA_LIB");
}
