/*
 * test_llama.c: the Llama family of core/model/llama.c. The gradient of every parameter of
 * every tensor against central differences of a double-precision reference forward written
 * here (RMSNorm, rotate-half rotary positions, grouped-query causal attention, SwiGLU, final
 * RMSNorm, tied or untied head), the loss and probabilities against it, the layout against
 * ckpt's family table, and bad specs refused with messages naming the field.
 *
 * The reference finds every tensor by its name in the layout (zr_gpt2_layout of the config:
 * ckpt's family table), never through llama.c's offsets, so a wrong offset shows up as a
 * mismatch named by its tensor.
 */
#include "ckutil.h"
#include "harness.h"
#include "zr.h"

#include <math.h>
#include <sys/wait.h>

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}
static double rng_unit(uint64_t *s) { return (double)rng_next(s) / 2147483648.0 * 2 - 1; }

static zr_config llama_cfg(const char *spec)
{
    zr_config c;
    ZT_OK(zr_gpt2_config_parse(&c, spec));
    ZT_CHECK_EQ(c.family, ZR_FAMILY_LLAMA);
    return c;
}

/* ---------------------------------------------------------------- double reference */

#define NT 16 /* tensors of a layer, at most */
typedef struct {
    char name[96];
    uint64_t off, numel; /* in the whole arena (groups end to end) */
    size_t ndim;
} tinfo;

typedef struct {
    zr_config c;
    size_t L, C, H, KV, hd, KVD, I, V;
    tinfo t[128];
    size_t nt;
} ref_model;

static const tinfo *ref_find(const ref_model *r, const char *name)
{
    for (size_t i = 0; i < r->nt; i++)
        if (!strcmp(r->t[i].name, name))
            return &r->t[i];
    ZT_FAIL("no tensor %s in the layout", name);
    return NULL;
}

static uint64_t ref_off(const ref_model *r, const char *fmt, size_t l)
{
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    return ref_find(r, name)->off;
}

static void ref_init(ref_model *r, const zr_config *c)
{
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->L = c->layers, r->C = c->dim, r->H = c->heads, r->KV = c->kv_heads;
    r->hd = c->dim / c->heads, r->KVD = r->KV * r->hd, r->I = c->ffn, r->V = c->vocab;
    zck_layout *lay;
    ZT_OK(zr_gpt2_layout(&lay, c));
    uint64_t base = 0;
    for (size_t g = 0; g < zck_layout_n_groups(lay); g++) {
        for (size_t i = 0; i < zck_layout_group_n_tensors(lay, g); i++) {
            zck_tensor_info ti;
            zck_layout_tensor(lay, g, i, &ti);
            ZT_CHECK(r->nt < 128);
            tinfo *t = &r->t[r->nt++];
            snprintf(t->name, sizeof t->name, "%s", ti.name);
            t->off = base + ti.offset;
            t->numel = ti.numel;
            t->ndim = ti.ndim;
        }
        base += zck_layout_group_numel(lay, g);
    }
    zck_layout_free(lay);
}

static void ref_rms(double *out, const double *x, const double *w, size_t N, size_t C,
                    double eps)
{
    for (size_t n = 0; n < N; n++) {
        double ss = 0;
        for (size_t i = 0; i < C; i++)
            ss += x[n * C + i] * x[n * C + i];
        double s = 1 / sqrt(ss / C + eps);
        for (size_t i = 0; i < C; i++)
            out[n * C + i] = x[n * C + i] * s * w[i];
    }
}

/* out[N, OC] = x[N, IC] W[OC, IC]^T */
static void ref_linear(double *out, const double *x, const double *W, size_t N, size_t IC,
                       size_t OC)
{
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double s = 0;
            for (size_t i = 0; i < IC; i++)
                s += x[n * IC + i] * W[o * IC + i];
            out[n * OC + o] = s;
        }
}

/* rotate-half on each head of hd channels of x [N, nh hd], position n mod T */
static void ref_rope(double *x, size_t N, size_t T, size_t nh, size_t hd, double theta)
{
    size_t half = hd / 2;
    for (size_t n = 0; n < N; n++)
        for (size_t h = 0; h < nh; h++) {
            double *v = x + n * nh * hd + h * hd;
            for (size_t i = 0; i < half; i++) {
                double a = (double)(n % T) * pow(theta, -(double)(2 * i) / hd);
                double x1 = v[i], x2 = v[i + half];
                v[i] = x1 * cos(a) - x2 * sin(a);
                v[i + half] = x2 * cos(a) + x1 * sin(a);
            }
        }
}

static void ref_layer(const ref_model *r, const double *p, double *x, size_t l, size_t B,
                      size_t T, double *buf)
{
    size_t C = r->C, KVD = r->KVD, I = r->I, N = B * T;
    double *h = buf, *q = h + N * C, *k = q + N * C, *v = k + N * KVD, *y = v + N * KVD;
    double *g = y + N * C, *u = g + N * I;
    double eps = r->c.norm_eps;
    ref_rms(h, x, p + ref_off(r, "layers.%zu.input_layernorm.weight", l), N, C, eps);
    ref_linear(q, h, p + ref_off(r, "layers.%zu.self_attn.q_proj.weight", l), N, C, C);
    ref_linear(k, h, p + ref_off(r, "layers.%zu.self_attn.k_proj.weight", l), N, C, KVD);
    ref_linear(v, h, p + ref_off(r, "layers.%zu.self_attn.v_proj.weight", l), N, C, KVD);
    ref_rope(q, N, T, r->H, r->hd, r->c.rope_theta);
    ref_rope(k, N, T, r->KV, r->hd, r->c.rope_theta);
    /* y [N, C] from q [N, C], k, v [N, KVD]: head h attends with key/value head h / (H / KV) */
    zt_ref_attention(y, q, k, v, &(zt_attn_shape){B, T, r->H, r->KV, r->hd, C, KVD});
    ref_linear(h, y, p + ref_off(r, "layers.%zu.self_attn.o_proj.weight", l), N, C, C);
    for (size_t i = 0; i < N * C; i++)
        x[i] += h[i];
    ref_rms(h, x, p + ref_off(r, "layers.%zu.post_attention_layernorm.weight", l), N, C, eps);
    ref_linear(g, h, p + ref_off(r, "layers.%zu.mlp.gate_proj.weight", l), N, C, I);
    ref_linear(u, h, p + ref_off(r, "layers.%zu.mlp.up_proj.weight", l), N, C, I);
    for (size_t i = 0; i < N * I; i++)
        g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    ref_linear(h, g, p + ref_off(r, "layers.%zu.mlp.down_proj.weight", l), N, I, C);
    for (size_t i = 0; i < N * C; i++)
        x[i] += h[i];
}

/* Mean cross-entropy with parameters p (the whole arena in double); probs [N, V] if not NULL */
static double ref_loss(const ref_model *r, const double *p, const int32_t *in, const int32_t *tg,
                       size_t B, size_t T, double *probs)
{
    size_t C = r->C, V = r->V, N = B * T;
    double *x = malloc(N * C * sizeof *x), *h = malloc(N * C * sizeof *x);
    double *buf = malloc(N * (4 * C + 2 * r->KVD + 2 * r->I) * sizeof *x);
    double *lg = malloc(N * V * sizeof *x);
    uint64_t emb = ref_find(r, "embed_tokens.weight")->off;
    for (size_t n = 0; n < N; n++)
        for (size_t i = 0; i < C; i++)
            x[n * C + i] = p[emb + (size_t)in[n] * C + i];
    for (size_t l = 0; l < r->L; l++)
        ref_layer(r, p, x, l, B, T, buf);
    ref_rms(h, x, p + ref_find(r, "norm.weight")->off, N, C, r->c.norm_eps);
    ref_linear(lg, h, p + (r->c.tied ? emb : ref_find(r, "lm_head.weight")->off), N, C, V);
    double loss = zt_ref_xent(lg, tg, N, V, probs);
    free(x);
    free(h);
    free(buf);
    free(lg);
    return loss;
}

/* ---------------------------------------------------------------- gradients */

/*
 * Every checked parameter's gradient against a central difference of the double reference
 * (h = 1e-5), bound |g - g_ref| <= 1e-6 + 1e-4 |g_ref| per element as GPT-2's check; the loss
 * within 1e-5 relative and the probabilities within 1e-6 absolute. Parameters N(0, 0.4) with
 * norm weights around 1, so every path carries signal.
 */
static void grad_check(const char *spec, size_t max_B, size_t B, size_t T, uint64_t per_tensor,
                       uint64_t seed)
{
    zr_config c = llama_cfg(spec);
    zr_model *m;
    ZT_OK(zr_model_new_ext(&m, &c, max_B, c.ctx, NULL));
    ref_model *r = malloc(sizeof *r);
    ref_init(r, &c);
    uint64_t n = zr_model_numel(m);
    float *pf = zr_model_param(m, 0);
    for (size_t k = 0; k < r->nt; k++)
        for (uint64_t j = 0; j < r->t[k].numel; j++)
            pf[r->t[k].off + j] = (float)((r->t[k].ndim == 1 ? 1.0 : 0.0) + 0.4 * rng_unit(&seed));
    int32_t in[256], tg[256];
    ZT_CHECK(B * T <= 256);
    for (size_t i = 0; i < B * T; i++) {
        in[i] = (int32_t)(rng_next(&seed) % c.vocab);
        tg[i] = (int32_t)(rng_next(&seed) % c.vocab);
    }
    double *pd = malloc(n * sizeof *pd), *probs = malloc(B * T * c.vocab * sizeof *probs);
    for (uint64_t i = 0; i < n; i++)
        pd[i] = pf[i];
    double ref = ref_loss(r, pd, in, tg, B, T, probs);
    /* the model at 1, 2 and 3 threads (zrun's default is 2): each against the reference */
    float *gt[3];
    zt_grads_at_threads(m, in, tg, B, T, c.vocab, ref, probs, spec, gt);
    const double h = 1e-5;
    for (size_t k = 0; k < r->nt; k++) {
        uint64_t nj = r->t[k].numel < per_tensor ? r->t[k].numel : per_tensor, nz = 0;
        for (uint64_t jj = 0; jj < nj; jj++) {
            uint64_t j = nj > 1 ? jj * (r->t[k].numel - 1) / (nj - 1) : 0;
            uint64_t i = r->t[k].off + j;
            double save = pd[i];
            pd[i] = save + h;
            double lp = ref_loss(r, pd, in, tg, B, T, NULL);
            pd[i] = save - h;
            double lm = ref_loss(r, pd, in, tg, B, T, NULL);
            pd[i] = save;
            double fd = (lp - lm) / (2 * h);
            for (int t = 0; t < 3; t++)
                if (!(fabs(gt[t][i] - fd) <= 1e-6 + 1e-4 * fabs(fd)))
                    ZT_FAIL("%s B=%zu T=%zu, %d threads: d loss / d %s[%llu] = %.9g, finite "
                            "difference %.9g", spec, B, T, t + 1, r->t[k].name,
                            (unsigned long long)j, gt[t][i], fd);
            nz += fabs(fd) > 1e-4;
        }
        /* every tensor carries signal (embedding rows no token touches get none untied) */
        if (strcmp(r->t[k].name, "embed_tokens.weight") && nz < nj / 2)
            ZT_FAIL("%s: %s: only %llu of %llu gradients are non-negligible", spec,
                    r->t[k].name, (unsigned long long)nz, (unsigned long long)nj);
    }
    ZT_CHECK_EQ(r->nt, 9 * c.layers + (c.tied ? 2 : 3));
    for (int t = 0; t < 3; t++)
        free(gt[t]);
    free(pd);
    free(probs);
    free(r);
    zr_model_free(m);
}

ZT_TEST(llama_grad_check)
{
    /* GQA (4 query heads on 2 key/value heads), untied, every parameter */
    grad_check("llama:layers=2,heads=4,kv_heads=2,dim=16,ffn=12,ctx=6,vocab=11", 3, 2, 5,
               UINT64_MAX, 1);
    /* tied head, multi-query (1 key/value head), rope_theta and norm_eps not the defaults */
    grad_check("llama:layers=1,heads=2,kv_heads=1,dim=8,ffn=10,ctx=5,vocab=9,tied=1,"
               "rope_theta=500,norm_eps=1e-3", 2, 2, 4, UINT64_MAX, 2);
    /* plain multi-head (kv_heads = heads), head dim 12: the 8-wide loops and their tails */
    grad_check("llama:layers=1,heads=2,kv_heads=2,dim=24,ffn=20,ctx=5,vocab=13", 2, 2, 5, 40, 3);
    /* T = 140 > 2 x 64: attention in blocks, GQA across them */
    grad_check("llama:layers=1,heads=2,kv_heads=1,dim=8,ffn=8,ctx=150,vocab=7", 1, 1, 140, 24,
               4);
}

/* ---------------------------------------------------------------- specs */

ZT_TEST(llama_config_specs)
{
    zr_config c = llama_cfg("llama:layers=2,heads=4,kv_heads=2,dim=64,ffn=176,ctx=64,vocab=256");
    ZT_CHECK_EQ(c.layers, 2);
    ZT_CHECK_EQ(c.kv_heads, 2);
    ZT_CHECK_EQ(c.ffn, 176);
    ZT_CHECK(c.rope_theta == 10000.0 && c.norm_eps == 1e-5 && c.tied == 0);
    /* the model section carries every field, reals as reals, and reads back the same */
    char *json;
    ZT_OK(zr_gpt2_config_to_json(&json, &c));
    ZT_CHECK(strstr(json, "{\"arch\":\"llama\",\"layers\":2,\"heads\":4,\"kv_heads\":2,"));
    ZT_CHECK(strstr(json, "\"rope_theta\":10000") && strstr(json, "\"tied\":0}"));
    zr_config back;
    ZT_OK(zr_gpt2_config_from_json(&back, json));
    ZT_CHECK(!memcmp(&back, &c, sizeof c));
    free(json);
    c = llama_cfg("smollm-135m");
    ZT_CHECK(c.tied == 1 && c.heads == 9 && c.kv_heads == 3);
    c = llama_cfg("llama:rope_theta=500000.0,norm_eps=1e-6,tied=1");
    ZT_CHECK(c.rope_theta == 500000.0 && c.norm_eps == 1e-6 && c.tied == 1);
    /* a tied config has no lm_head group */
    zck_layout *lay;
    ZT_OK(zr_gpt2_layout(&lay, &c));
    ZT_CHECK_EQ(zck_layout_n_groups(lay), c.layers + 2);
    ZT_CHECK(!strcmp(zck_layout_group_name(lay, 0), "embed_tokens"));
    ZT_CHECK(!strcmp(zck_layout_group_name(lay, c.layers + 1), "norm"));
    zck_layout_free(lay);

    static const zt_refusal bad[] = {
        {"llama:heads=4,kv_heads=3", "heads 4 is not a multiple of kv_heads 3"},
        {"llama:heads=8,dim=24,kv_heads=2", "head dimension dim / heads = 24 / 8 = 3 is odd"},
        {"llama:dim=130", "dim 130 is not a multiple of heads 4"},
        {"llama:kv_heads=0", "field 'kv_heads' is 0"},
        {"llama:tied=2", "field 'tied': '2' is too large"},
        {"llama:layers=65537", "field 'layers': '65537' is too large"},
        {"llama:rope_theta=abc", "field 'rope_theta': 'abc' is not a number"},
        {"llama:rope_theta=-1", "field 'rope_theta': '-1' is not a number"},
        {"llama:norm_eps=0", "field 'norm_eps' is 0 (expected a number in"},
        {"llama:norm_eps=1e-5x", "'1e-5x' is not a number"},
        {"llama:rope_theta=inf", "'inf' is not a number"},
        {"llama:experts=8", "unknown field 'experts'"},
        {"llama-7b", "model 'llama-7b': unknown"},
    };
    zt_config_refusals(zr_gpt2_config_parse, bad, sizeof bad / sizeof *bad);
}

/* ---------------------------------------------------------------- training through zrun */

#define SMALL "llama:layers=2,heads=4,kv_heads=2,dim=64,ffn=176,ctx=64,vocab=256"
#define STEPS 30

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1e-30); }

/* a run of model (NULL: the checkpoint's) into run directory dir, losses into dir.jsonl */
static void llama_run(const char *model, const char *dir, const char *extra)
{
    char log[80], jl[80];
    snprintf(log, sizeof log, "%s.log", dir);
    snprintf(jl, sizeof jl, "%s.jsonl", dir);
    zt_zrunf_ok(log, "%s%s --batch 8 --steps %d --warmup 5 --lr 3e-3 --threads 1 --device cpu "
                "--ckpt-dir %s --log-json %s %s", model ? "--model " : "", model ? model : "",
                STEPS, dir, jl, extra);
}

ZT_TEST(llama_trains_at_every_stage)
{
    static double ref[STEPS + 1], l[STEPS + 1];
    llama_run(SMALL, "w1-s0", "--nproc 1 --zero 0");
    ZT_CHECK_EQ(zt_jlog_losses(ref, STEPS + 1, "w1-s0.jsonl"), STEPS);
    /* from ln 256 = 5.55 the synthetic corpus is learnable: the loss falls */
    if (!(ref[1] > 5.2 && ref[STEPS] < ref[1] - 1.0))
        ZT_FAIL("loss %.4f at step 1, %.4f at step %d: it does not fall", ref[1], ref[STEPS],
                STEPS);
    zt_file_has("w1-s0.log", "training a 2-layer Llama (");
    const struct {
        int W, s;
    } runs[] = {{1, 3}, {2, 0}, {2, 1}, {2, 2}, {2, 3}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char dir[32], extra[64], jl[48];
        snprintf(dir, sizeof dir, "w%d-s%d", runs[i].W, runs[i].s);
        snprintf(extra, sizeof extra, "--nproc %d --zero %d", runs[i].W, runs[i].s);
        snprintf(jl, sizeof jl, "%s.jsonl", dir);
        llama_run(SMALL, dir, extra);
        ZT_CHECK_EQ(zt_jlog_losses(l, STEPS + 1, jl), STEPS);
        for (int k = 1; k <= STEPS; k++)
            if (!(rel(l[k], ref[k]) <= 1e-4))
                ZT_FAIL("W=%d stage %d step %d: loss %.6f, %.6f at W=1 stage 0", runs[i].W,
                        runs[i].s, k, l[k], ref[k]);
        zt_same_latest(dir, "w1-s0", 1e-4, 1e-3);
    }
}

/* zckpt with args, its output into out; its exit status */
static int zckpt_to(const char *args, const char *out)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s >> %s 2>&1", zt_bin("ZT_ZCKPT"), args, out);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int zckpt(const char *args) { return zckpt_to(args, "zckpt.log"); }

ZT_TEST(llama_resume_at_another_world_and_zckpt)
{
    zt_bin("ZT_ZCKPT"); /* skips the test when unset */
    static double ref[STEPS + 1], l[STEPS + 1];
    /* a tied head: the embedding's gradient comes from both ends */
    llama_run(SMALL ",tied=1", "straight", "--nproc 1");
    zt_jlog_losses(ref, STEPS + 1, "straight.jsonl");
    llama_run(SMALL ",tied=1", "elastic", "--nproc 2 --zero 3 --stop-after 12");
    llama_run(NULL, "elastic", "--nproc 1 --zero 1"); /* the checkpoint's model */
    char *text = zt_slurp("elastic.log");
    if (!strstr(text, "(world 2, ZeRO 3; every file hashed"))
        ZT_FAIL("elastic.log does not say it resumed the world-2 stage-3 checkpoint:\n%s", text);
    free(text);
    ZT_CHECK_EQ(zt_jlog_losses(l, STEPS + 1, "elastic.jsonl"), STEPS);
    for (int k = 1; k <= STEPS; k++)
        if (!(rel(l[k], ref[k]) <= 1e-4))
            ZT_FAIL("resumed at W=1: step %d loss %.6f, straight %.6f", k, l[k], ref[k]);
    zt_same_latest("elastic", "straight", 1e-4, 1e-3);
    /* zckpt works on Llama checkpoints unchanged */
    ZT_CHECK_EQ(zckpt("verify elastic"), 0);
    ZT_CHECK_EQ(zckpt_to("inspect elastic", "inspect.txt"), 0);
    zt_file_has("inspect.txt", "{\"arch\":\"llama\",\"layers\":2,\"heads\":4,\"kv_heads\":2,");
    ZT_CHECK_EQ(zckpt("reshard elastic --world 3 -o w3"), 0);
    ZT_CHECK_EQ(zckpt("consolidate elastic -o one"), 0);
    ZT_CHECK_EQ(zckpt("verify w3"), 0);
    ZT_CHECK_EQ(zckpt("diff elastic w3"), 0);
    ZT_CHECK_EQ(zckpt("diff one w3"), 0);
    ZT_CHECK_EQ(zckpt("diff w3 straight --atol 1e-4 --rtol 1e-3"), 0);
    /* a resume with another model is refused */
    ZT_CHECK(zt_zrun("--model " SMALL " --steps 40 --device cpu --ckpt-dir w3", "other.log"));
    zt_file_has("other.log", "checkpoint of another model shape");
}
