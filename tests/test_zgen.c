/*
 * test_zgen.c: generation (core/model/generate.c) and its programs: the KV-cache forward gives
 * the full forward's logits at every position; greedy decoding is the argmax of the full
 * forward step by step and repeats itself; a seed repeats its sample and another seed changes
 * it; the RNG is splitmix64; zgen (ZT_ZGEN) reads any checkpoint (world 2 at stage 3, resharded)
 * to the same text, refuses each bad input and a corrupted shard; zrun --sample-every prints
 * samples at stages 0 and 3. Llama (grouped-query attention, rotary positions) the same way.
 */
#include "ckutil.h"
#include "zr.h"

#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define SMALL "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256"

/* A model whose weights are drawn with a large spread, so that its logits differ by whole
 * units between tokens and positions (the GPT-2 initialization gives almost uniform ones). */
static zr_model *spread_model(const char *spec, uint64_t seed)
{
    zr_gpt2_config c;
    ZT_OK(zr_gpt2_config_parse(&c, spec));
    zr_model *m;
    ZT_OK(zr_model_new(&m, &c, 1));
    zr_rng r;
    zr_rng_seed(&r, seed);
    float *p = zr_model_param(m, 0);
    for (uint64_t i = 0; i < zr_model_numel(m); i++)
        p[i] = (float)(zr_rng_uniform(&r) * 2 - 1) * 0.6f;
    return m;
}

static void random_tokens(int32_t *t, size_t n, uint32_t V, uint64_t seed)
{
    zr_rng r;
    zr_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)(zr_rng_next(&r) % V);
}

/* The KV-cache log-probabilities of spec's model at every position (the first half fed at once,
 * then one token at a time) against the full forward's. */
static void kv_cache_matches(const char *spec)
{
    zr_model *m = spread_model(spec, 7);
    const zr_gpt2_config *c = zr_model_config(m);
    size_t T = c->ctx, V = c->vocab;
    ZT_CHECK(zr_model_param(m, 0) != NULL); /* the arena starts with wte */
    int32_t tok[64];
    random_tokens(tok, T, (uint32_t)V, 3);
    float loss;
    ZT_OK(zr_model_forward(m, tok, NULL, 1, T, &loss));
    const float *probs = zr_model_probs(m);
    zr_gen *g;
    ZT_OK(zr_gen_new(&g, c, zr_model_param(m, 0)));
    double worst = 0, spread = 0;
    for (size_t t = 0; t < T; t++) {
        const float *lg;
        /* the first half in one feed (the prompt path), then one token at a time */
        if (t < T / 2) {
            if (t == T / 2 - 1)
                ZT_OK(zr_gen_feed(g, tok, T / 2, &lg));
            else
                continue;
        } else
            ZT_OK(zr_gen_feed(g, tok + t, 1, &lg));
        /* the full forward keeps probabilities: compare log-probabilities, which are the
         * logits up to the constant log-sum-exp */
        double mx = lg[0], s = 0, lo = 1e30, hi = -1e30;
        for (size_t v = 1; v < V; v++)
            mx = lg[v] > mx ? lg[v] : mx;
        for (size_t v = 0; v < V; v++)
            s += exp(lg[v] - mx);
        for (size_t v = 0; v < V; v++) {
            double mine = lg[v] - mx - log(s), full = log(probs[t * V + v]);
            double rel = fabs(mine - full) / (fabs(full) > 1 ? fabs(full) : 1);
            worst = !(rel <= worst) ? rel : worst; /* a NaN stays */
            lo = mine < lo ? mine : lo;
            hi = mine > hi ? mine : hi;
        }
        spread = hi - lo > spread ? hi - lo : spread;
    }
    if (!(worst <= 1e-4))
        ZT_FAIL("KV-cache log-probabilities differ from the full forward by %g relative", worst);
    ZT_CHECK(spread > 3); /* the logits were not all alike: the comparison meant something */
    ZT_CHECK_EQ(zr_gen_pos(g), T);
    const float *lg;
    ZT_ERR(zr_gen_feed(g, tok, 1, &lg), ZR_EINVAL, "exceed the context of 32");
    zr_gen_reset(g);
    int32_t bad = (int32_t)V;
    ZT_ERR(zr_gen_feed(g, &bad, 1, &lg), ZR_EINVAL, "not an id of the vocabulary");
    zr_gen_free(g);
    zr_model_free(m);
}

ZT_TEST(zgen_kv_cache_logits_match_full_forward)
{
    kv_cache_matches(SMALL);
    /* Llama: grouped-query attention (4 heads reading 2 KV heads), rotary positions at the
     * cache position; untied and tied heads */
    kv_cache_matches("llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=48,ctx=32,vocab=256");
    kv_cache_matches("llama:layers=2,heads=4,kv_heads=1,dim=32,ffn=48,ctx=32,vocab=256,tied=1,"
                     "rope_theta=500000");
}

ZT_TEST(zgen_greedy_is_argmax_of_full_forward_and_repeats)
{
    zr_model *m = spread_model(SMALL, 11);
    const zr_gpt2_config *c = zr_model_config(m);
    size_t V = c->vocab, n_prompt = 5, n_new = 20;
    int32_t seq[64], out[64], again[64];
    random_tokens(seq, n_prompt, (uint32_t)V, 5);
    zr_gen *g;
    ZT_OK(zr_gen_new(&g, c, zr_model_param(m, 0)));
    zr_sample_opts o = ZR_SAMPLE_OPTS_INIT;
    o.temperature = 0;
    ZT_OK(zr_gen_run(g, out, seq, n_prompt, n_new, &o));
    o.seed = 99; /* greedy ignores the seed */
    ZT_OK(zr_gen_run(g, again, seq, n_prompt, n_new, &o));
    ZT_CHECK(!memcmp(out, again, n_new * sizeof *out));
    /* each new token is the argmax of the full forward over everything before it */
    for (size_t i = 0; i < n_new; i++) {
        size_t n = n_prompt + i;
        float loss;
        ZT_OK(zr_model_forward(m, seq, NULL, 1, n, &loss));
        const float *p = zr_model_probs(m) + (n - 1) * V;
        size_t best = 0;
        for (size_t v = 1; v < V; v++)
            best = p[v] > p[best] ? v : best;
        ZT_CHECK_EQ(out[i], best);
        seq[n] = out[i];
    }
    zr_gen_free(g);
    zr_model_free(m);
}

ZT_TEST(zgen_seed_repeats_and_another_seed_differs)
{
    zr_rng r;
    zr_rng_seed(&r, 0); /* splitmix64's published first output for seed 0 */
    ZT_CHECK(zr_rng_next(&r) == 0xe220a8397b1dcdafull);
    zr_model *m = spread_model(SMALL, 13);
    const zr_gpt2_config *c = zr_model_config(m);
    int32_t prompt[3] = {'T', 'h', 'e'}, a[80], b[80], d[80];
    zr_gen *g;
    ZT_OK(zr_gen_new(&g, c, zr_model_param(m, 0)));
    zr_sample_opts o = ZR_SAMPLE_OPTS_INIT;
    o.temperature = 1.5f;
    o.top_k = 0;
    o.seed = 42;
    /* 80 tokens: past the context of 32, through the sliding window */
    ZT_OK(zr_gen_run(g, a, prompt, 3, 80, &o));
    ZT_OK(zr_gen_run(g, b, prompt, 3, 80, &o));
    ZT_CHECK(!memcmp(a, b, sizeof a));
    o.seed = 43;
    ZT_OK(zr_gen_run(g, d, prompt, 3, 80, &o));
    ZT_CHECK(memcmp(a, d, sizeof a) != 0);
    /* top-k 1 is greedy; top-k 3 draws only among the three largest logits */
    const float *lg;
    zr_gen_reset(g);
    ZT_OK(zr_gen_feed(g, prompt, 3, &lg));
    float copy[256];
    memcpy(copy, lg, sizeof copy);
    int32_t first = 0, second = -1, third = -1;
    for (int32_t v = 1; v < 256; v++)
        if (copy[v] > copy[first])
            first = v;
    for (int32_t v = 0; v < 256; v++)
        if (v != first && (second < 0 || copy[v] > copy[second]))
            second = v;
    for (int32_t v = 0; v < 256; v++)
        if (v != first && v != second && (third < 0 || copy[v] > copy[third]))
            third = v;
    zr_sample_opts k = ZR_SAMPLE_OPTS_INIT;
    k.temperature = 5.0f;
    k.top_k = 3;
    int seen[3] = {0};
    for (uint64_t s = 0; s < 200; s++) {
        zr_rng rr;
        zr_rng_seed(&rr, s);
        int32_t t;
        ZT_OK(zr_sample_token(&t, copy, 256, &k, &rr));
        ZT_CHECK(t == first || t == second || t == third);
        seen[t == first ? 0 : t == second ? 1 : 2] = 1;
    }
    ZT_CHECK(seen[0] && seen[1] && seen[2]);
    k.top_k = 1;
    zr_rng rr;
    zr_rng_seed(&rr, 1);
    int32_t t;
    ZT_OK(zr_sample_token(&t, copy, 256, &k, &rr));
    ZT_CHECK_EQ(t, first);
    k.temperature = -1;
    ZT_ERR(zr_sample_token(&t, copy, 256, &k, &rr), ZR_EINVAL, "temperature");
    ZT_ERR(zr_gen_run(g, a, prompt, 0, 4, &o), ZR_EINVAL, "empty prompt");
    int32_t longp[40] = {0};
    ZT_ERR(zr_gen_run(g, a, longp, 40, 4, &o), ZR_EINVAL, "more than the model's context");
    char text[64];
    int32_t ids[4] = {'h', 0, 'i', 300};
    ZT_CHECK_EQ(zr_gen_bytes_decode(text, sizeof text, ids, 4), 3 + 7);
    ZT_CHECK(!memcmp(text, "h\0i<|300|>", 11));
    zr_gen_free(g);
    zr_model_free(m);
}

/* Top-p after temperature and top-k (transformers' order): a tiny nucleus is greedy; a known
 * distribution keeps the tokens it should; bad values refused. */
ZT_TEST(zgen_top_p_nucleus_after_temperature)
{
    /* probabilities 0.5, 0.3, 0.2 at temperature 1, and 253 tokens of none */
    float lg[256];
    for (int v = 0; v < 256; v++)
        lg[v] = -1e4f;
    lg[7] = logf(0.5f), lg[3] = logf(0.3f), lg[200] = logf(0.2f);
    zr_sample_opts o = ZR_SAMPLE_OPTS_INIT;
    o.top_k = 0;
    struct {
        float t, p;
        int want[3]; /* whether 7, 3, 200 may come */
    } cases[] = {
        {1.0f, 0.45f, {1, 0, 0}}, /* 0.5 already reaches 0.45 */
        {1.0f, 0.7f, {1, 1, 0}},  /* 0.5 + 0.3 */
        {1.0f, 0.9f, {1, 1, 1}},
        /* temperature 10 first: about 0.35, 0.33, 0.32, so 0.7 needs all three */
        {10.0f, 0.7f, {1, 1, 1}},
        {5.0f, 1e-6f, {1, 0, 0}}, /* a tiny nucleus is the most likely token: greedy */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        o.temperature = cases[c].t;
        o.top_p = cases[c].p;
        int seen[3] = {0};
        for (uint64_t s = 0; s < 400; s++) {
            zr_rng r;
            zr_rng_seed(&r, s);
            int32_t t;
            ZT_OK(zr_sample_token(&t, lg, 256, &o, &r));
            ZT_CHECK(t == 7 || t == 3 || t == 200);
            seen[t == 7 ? 0 : t == 3 ? 1 : 2] = 1;
        }
        for (int i = 0; i < 3; i++)
            if (seen[i] != cases[c].want[i])
                ZT_FAIL("temperature %g, top_p %g: token %d %s", (double)cases[c].t,
                        (double)cases[c].p, i, seen[i] ? "drawn, outside the nucleus" :
                        "never drawn");
    }
    /* top-k before top-p: of the two best (0.625, 0.375 of them), 0.7 keeps both */
    o.temperature = 1, o.top_k = 2, o.top_p = 0.7f;
    int third = 0;
    for (uint64_t s = 0; s < 400; s++) {
        zr_rng r;
        zr_rng_seed(&r, s);
        int32_t t;
        ZT_OK(zr_sample_token(&t, lg, 256, &o, &r));
        third |= t == 200;
    }
    ZT_CHECK(!third);
    /* a seed repeats a nucleus sample */
    zr_model *m = spread_model(SMALL, 17);
    zr_gen *g;
    ZT_OK(zr_gen_new(&g, zr_model_config(m), zr_model_param(m, 0)));
    int32_t prompt[3] = {'T', 'h', 'e'}, a[40], b[40], greedy[40];
    o.temperature = 1.2f, o.top_k = 0, o.top_p = 0.9f, o.seed = 3;
    ZT_OK(zr_gen_run(g, a, prompt, 3, 40, &o));
    ZT_OK(zr_gen_run(g, b, prompt, 3, 40, &o));
    ZT_CHECK(!memcmp(a, b, sizeof a));
    o.top_p = 1e-7f; /* the whole way: greedy */
    ZT_OK(zr_gen_run(g, a, prompt, 3, 40, &o));
    o.temperature = 0;
    ZT_OK(zr_gen_run(g, greedy, prompt, 3, 40, &o));
    ZT_CHECK(!memcmp(a, greedy, sizeof a));
    int32_t t;
    zr_rng r;
    zr_rng_seed(&r, 1);
    o.temperature = 1;
    float bad[] = {0, -0.5f, 1.01f, NAN};
    for (size_t i = 0; i < 4; i++) {
        o.top_p = bad[i];
        ZT_ERR(zr_sample_token(&t, lg, 256, &o, &r), ZR_EINVAL, "top_p");
    }
    zr_gen_free(g);
    zr_model_free(m);
}

/* zr_gen_run stops after the end-of-text id (kept in out, counted in n_out) and gives each
 * token's log-probability: <= 0, the full forward's, and greedy's the largest. */
ZT_TEST(zgen_stops_at_eos_and_gives_logprobs)
{
    zr_model *m = spread_model(SMALL, 11);
    const zr_gpt2_config *c = zr_model_config(m);
    size_t V = c->vocab, n_new = 12;
    int32_t seq[64], out[64], stopped[64];
    random_tokens(seq, 5, (uint32_t)V, 5);
    zr_gen *g;
    ZT_OK(zr_gen_new(&g, c, zr_model_param(m, 0)));
    float lp[64];
    size_t n = 0;
    zr_sample_opts o = ZR_SAMPLE_OPTS_INIT;
    o.temperature = 0;
    o.logprobs = lp;
    o.n_out = &n;
    ZT_OK(zr_gen_run(g, out, seq, 5, n_new, &o));
    ZT_CHECK_EQ(n, n_new);
    for (size_t i = 0; i < n_new; i++) {
        float loss;
        ZT_OK(zr_model_forward(m, seq, NULL, 1, 5 + i, &loss));
        const float *p = zr_model_probs(m) + (4 + i) * V;
        double best = -1e30;
        for (size_t v = 0; v < V; v++)
            best = log(p[v]) > best ? log(p[v]) : best;
        ZT_CHECK(lp[i] <= 0);
        if (!(fabs(lp[i] - best) < 1e-4 && fabs(lp[i] - log(p[out[i]])) < 1e-4))
            ZT_FAIL("token %zu: log-probability %g, the full forward's %g, its largest %g", i,
                    (double)lp[i], log(p[out[i]]), best);
        seq[5 + i] = out[i];
    }
    /* the fourth greedy token as the end of text: three more after it are not made; the id
     * is the last one out */
    o.eos = out[3];
    size_t first = 0;
    while (out[first] != o.eos)
        first++;
    memset(stopped, 0xff, sizeof stopped);
    ZT_OK(zr_gen_run(g, stopped, seq, 5, n_new, &o));
    ZT_CHECK_EQ(n, first + 1);
    ZT_CHECK(!memcmp(stopped, out, (first + 1) * sizeof *out) && stopped[first + 1] == -1);
    zr_gen_free(g);
    zr_model_free(m);
}

/* ------------------------------------------------------------------ the programs */

#define TINY_RUN "--model " SMALL " --batch 4 --micro-batch 2 --lr 3e-3 --warmup 2 --threads 1"

/* Run zgen (ZT_ZGEN) with args; stdout into out, stderr into err; the exit status. */
static int zgen(const char *args, const char *out, const char *err)
{
    const char *bin = zt_bin("ZT_ZGEN");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s > %s 2> %s", bin, args, out, err);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *zgen_ok(const char *args)
{
    if (zgen(args, "gen.out", "gen.err") != 0)
        ZT_FAIL("zgen %s failed:\n%s", args, zt_slurp("gen.err"));
    return zt_slurp("gen.out");
}

/* zgen fails with status and its stderr holds text */
static void zgen_fails(const char *args, int status, const char *text)
{
    int st = zgen(args, "bad.out", "bad.err");
    char *e = zt_slurp("bad.err");
    if (st != status || !strstr(e, text))
        ZT_FAIL("zgen %s: status %d (expected %d), stderr '%s' (expected '%s')", args, st,
                status, e, text);
    free(e);
}

/* whether the file at path holds text */
static int file_has(const char *path, const char *text)
{
    char *t = zt_slurp(path);
    int has = strstr(t, text) != NULL;
    free(t);
    return has;
}

/* The text of zrun's "sample at step N: " line in log (malloc'ed) */
static char *sample_line(const char *log, int step)
{
    char *t = zt_slurp(log), key[64];
    snprintf(key, sizeof key, "sample at step %d: ", step);
    char *p = strstr(t, key);
    if (!p)
        ZT_FAIL("%s has no '%s':\n%s", log, key, t);
    p += strlen(key);
    char *e = strchr(p, '\n');
    ZT_CHECK(e);
    char *s = strndup(p, (size_t)(e - p));
    free(t);
    return s;
}

ZT_TEST(zgen_zrun_samples_at_stage_0_and_3_and_zgen_agrees)
{
    /* world 2, one micro-batch per rank: stages 0 and 3 train the same bits; 150 steps make
     * the greedy samples words rather than blanks */
#define SAMPLE_RUN "--nproc 2 --steps 150 --sample-every 75 --sample-tokens 24 --model " SMALL \
                   " --batch 8 --micro-batch 4 --lr 1e-2 --warmup 5 --threads 1 "
    zt_zrun_ok("--zero 0 --ckpt-dir s0 --log-json s0/log.jsonl " SAMPLE_RUN, "s0.log");
    zt_zrun_ok("--zero 3 --ckpt-dir s3 " SAMPLE_RUN, "s3.log");
    /* the device engine's path (the host simulation of a GPU): partitions from device memory */
    setenv("ZR_CUDA_LIB", "hostsim", 1);
    zt_zrun_ok("--zero 3 --device cuda --ckpt-dir d3 " SAMPLE_RUN, "d3.log");
    unsetenv("ZR_CUDA_LIB");
    zt_file_has("d3.log", "device: hostsim");
    for (int step = 75; step <= 150; step += 75) {
        char *a = sample_line("s0.log", step), *b = sample_line("s3.log", step);
        char *d = sample_line("d3.log", step);
        if (strcmp(a, b) || strcmp(a, d))
            ZT_FAIL("step %d: stage 0 sampled '%s', stage 3 '%s', stage 3 on the device '%s'",
                    step, a, b, d);
        free(d);
        ZT_CHECK(!strncmp(a, "the ", 4) && strlen(a) == 4 + 24);
        int letters = 0;
        for (const char *p = a + 4; *p; p++)
            letters += *p >= 'a' && *p <= 'z';
        if (step == 150 && letters < 8)
            ZT_FAIL("step 150: the sample '%s' has %d letters: nothing to compare", a, letters);
        free(a);
        free(b);
    }
    char *j = zt_slurp("s0/log.jsonl");
    ZT_CHECK(strstr(j, "{\"event\":\"sample\",\"step\":75,\"prompt\":\"the \",\"ids\":["));
    ZT_CHECK(strstr(j, "{\"event\":\"sample\",\"step\":150,"));
    free(j);
    /* zgen, greedy, on the final checkpoint gives zrun's last sample */
    char *z = zgen_ok("s3 --prompt 'the ' --tokens 24 --temperature 0");
    char *last = sample_line("s3.log", 150);
    if (strncmp(z, last, strlen(last)) || z[strlen(last)] != '\n')
        ZT_FAIL("zgen printed '%s', zrun sampled '%s'", z, last);
    free(z);
    free(last);
    /* bad sample options fail before any step */
    ZT_CHECK(zt_zrun("--steps 2 --sample-every 1 --prompt '' --ckpt-dir e " TINY_RUN, "e.log"));
    ZT_CHECK(file_has("e.log", "--prompt: empty"));
    ZT_CHECK(zt_zrun("--steps 2 --sample-every 1 --sample-tokens 0 --ckpt-dir e " TINY_RUN,
                     "e.log"));
    ZT_CHECK(file_has("e.log", "--sample-tokens"));
    char longp[80];
    memset(longp, 'a', 40);
    longp[40] = 0;
    char args[512];
    snprintf(args, sizeof args, "--steps 2 --sample-every 1 --prompt %s --ckpt-dir e " TINY_RUN,
             longp);
    ZT_CHECK(zt_zrun(args, "e.log"));
    ZT_CHECK(file_has("e.log", "more than the model's context of 32"));
    ZT_CHECK(zt_zrun("--steps 2 --prompt x --ckpt-dir e " TINY_RUN, "e.log"));
    ZT_CHECK(file_has("e.log", "add --sample-every N"));
}

/* Llama: zrun --sample-every samples at world 2, stage 3 (grouped heads in the KV cache), and
 * zgen, greedy, on the final checkpoint gives the last sample. */
ZT_TEST(zgen_llama_zrun_samples_and_zgen_agrees)
{
    zt_zrun_ok("--zero 3 --nproc 2 --steps 60 --sample-every 30 --sample-tokens 16 --model "
               "llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,ctx=32,vocab=256 --batch 8 "
               "--micro-batch 4 --lr 1e-2 --warmup 5 --threads 1 --ckpt-dir ll", "ll.log");
    char *last = sample_line("ll.log", 60);
    ZT_CHECK(!strncmp(last, "the ", 4) && strlen(last) > 4);
    char *z = zgen_ok("ll --prompt 'the ' --tokens 16 --temperature 0");
    if (strncmp(z, last, strlen(last)) || z[strlen(last)] != '\n')
        ZT_FAIL("zgen printed '%s', zrun sampled '%s'", z, last);
    free(z);
    free(last);
}

ZT_TEST(zgen_same_text_from_world_2_stage_3_and_resharded)
{
    const char *zckpt = zt_bin("ZT_ZCKPT");
    zt_zrun_ok("--nproc 2 --zero 3 --steps 20 --ckpt-dir w2 " TINY_RUN, "w2.log");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s reshard w2 --world 1 -o w1 > /dev/null && "
             "%s reshard w2 --world 3 -o w3 > /dev/null && "
             "%s export w2 -o m.bin --format llmc > /dev/null && "
             "%s import m.bin -o imp --world 3 > /dev/null", zckpt, zckpt, zckpt, zckpt);
    ZT_CHECK(system(cmd) == 0);
    const char *opts = " --prompt 'the cat' --tokens 40 --seed 5 --json";
    char args[256];
    snprintf(args, sizeof args, "w2%s", opts);
    char *a = zgen_ok(args);
    snprintf(args, sizeof args, "w1%s", opts);
    char *b = zgen_ok(args);
    snprintf(args, sizeof args, "imp%s", opts); /* imported from llm.c's file, at world 3 */
    char *d = zgen_ok(args);
    char *ck; /* a checkpoint directory rather than a run directory */
    ZT_OK(zck_latest(&ck, "w3"));
    snprintf(args, sizeof args, "%s%s", ck, opts);
    char *c = zgen_ok(args);
    /* the same ids and text; only the checkpoint's path and the speed differ */
    const char *ids_a = strstr(a, "\"ids\":"), *ids_b = strstr(b, "\"ids\":"),
               *ids_c = strstr(c, "\"ids\":"), *ids_d = strstr(d, "\"ids\":");
    ZT_CHECK(ids_a && ids_b && ids_c && ids_d);
    size_t n = (size_t)(strstr(ids_a, "\"tokens_per_s\"") - ids_a);
    ZT_CHECK(!strncmp(ids_a, ids_b, n) && !strncmp(ids_a, ids_c, n) &&
             !strncmp(ids_a, ids_d, n));
    ZT_CHECK(strstr(a, "\"prompt\":\"the cat\",\"prompt_ids\":[116,104,101,32,99,97,116]"));
    ZT_CHECK(strstr(a, "\"checkpoint\":\"w2/step-00000020\""));
    ZT_CHECK(strstr(a, "\"tokens\":40,"));
    /* text mode prints the prompt and its continuation; the same seed the same text, another
     * seed another */
    char *t1 = zgen_ok("w1 --prompt 'the cat' --tokens 40 --seed 5");
    char *t2 = zgen_ok("w2 --prompt 'the cat' --tokens 40 --seed 5");
    char *t3 = zgen_ok("w2 --prompt 'the cat' --tokens 40 --seed 6");
    ZT_CHECK(!strncmp(t1, "the cat", 7) && strlen(t1) == 7 + 40 + 1);
    ZT_CHECK(!strcmp(t1, t2) && strcmp(t1, t3));
    free(t1);
    free(t2);
    free(t3);
    free(a);
    free(b);
    free(c);
    free(d);
    free(ck);
}

ZT_TEST(zgen_bad_inputs_and_corrupt_checkpoint)
{
    zt_zrun_ok("--steps 2 --ckpt-dir run " TINY_RUN, "run.log");
    zgen_fails("run --prompt ''", 2, "empty prompt");
    zgen_fails("run --prompt x --tokens 0", 2, "--tokens");
    zgen_fails("run", 2, "no prompt");
    zgen_fails("run --prompt x --prompt-ids 1", 2, "exclusive");
    zgen_fails("run --prompt-ids 1,256", 2, "id 256 (number 2) is not below the model's "
               "vocabulary of 256");
    zgen_fails("run --prompt-ids 1,,2", 2, "not a comma-separated list");
    zgen_fails("run --prompt-ids -1", 2, "not a comma-separated list");
    zgen_fails("run --prompt x --temperature -1", 2, "--temperature");
    zgen_fails("run --prompt aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 2,
               "the prompt has 33 tokens, more than the model's context of 32");
    zgen_fails("nowhere --prompt x", 1, "nowhere");
    ZT_CHECK(mkdir("empty", 0755) == 0);
    zgen_fails("empty --prompt x", 1, "empty");
    /* ids given are decoded as bytes in a byte model */
    char *t = zgen_ok("run --prompt-ids 104,105 --tokens 3");
    ZT_CHECK(!strncmp(t, "hi", 2) && strlen(t) == 2 + 3 + 1);
    free(t);
    /* a model of 300 tokens trained on a file: no text codec, ids in and out */
    zt_write_file("corpus.txt", "the cat sat on the mat and the dog sat on the log. "
                                "the cat sat on the mat and the dog sat on the log.\n");
    zt_zrun_ok("--steps 2 --ckpt-dir v300 --data corpus.txt --model "
               "gpt2:layers=1,heads=2,dim=16,ctx=16,vocab=300 --batch 2 --threads 1", "v.log");
    zgen_fails("v300 --prompt x", 2, "--prompt-ids");
    zgen_fails("v300 --prompt-ids 300", 2, "not below the model's vocabulary of 300");
    t = zgen_ok("v300 --prompt-ids 299,1,2 --tokens 4");
    int a, b, c, d[4], k = sscanf(t, "%d %d %d %d %d %d %d", &a, &b, &c, &d[0], &d[1], &d[2],
                                  &d[3]);
    ZT_CHECK_EQ(k, 7);
    ZT_CHECK(a == 299 && b == 1 && c == 2);
    for (int i = 0; i < 4; i++)
        ZT_CHECK(d[i] >= 0 && d[i] < 300);
    free(t);
    t = zgen_ok("v300 --prompt-ids 5 --tokens 2 --json");
    ZT_CHECK(strstr(t, "\"prompt\":null,\"prompt_ids\":[5],") && strstr(t, "\"text\":null"));
    free(t);
    /* a flipped byte in a shard: refused, naming the file, before anything is printed */
    char *ck, shard[4200];
    ZT_OK(zck_latest(&ck, "run"));
    snprintf(shard, sizeof shard, "%s/shard-00000-of-00001.bin", ck);
    zt_flip_byte(shard, 4096 + 100);
    zgen_fails("run --prompt x", 1, "shard-00000-of-00001.bin");
    struct stat st;
    ZT_CHECK(stat("bad.out", &st) == 0 && st.st_size == 0); /* nothing printed */
    zt_truncate(shard, 1000);
    zgen_fails("run --prompt x", 1, "shard-00000-of-00001.bin");
    free(ck);
}

/* The JSON object zgen --json printed for args (the test fails unless zgen succeeds). */
static json_t *zgen_json(const char *args)
{
    char full[1024];
    snprintf(full, sizeof full, "%s --json", args);
    char *t = zgen_ok(full);
    json_error_t je;
    json_t *j = json_loads(t, 0, &je);
    if (!json_is_object(j))
        ZT_FAIL("zgen %s printed no JSON object (%s):\n%s", full, je.text, t);
    free(t);
    return j;
}

/* A run whose tokenizer has <|endoftext|> (ztok's special token) and whose text ends each
 * sentence with it: greedy zgen stops after it (--ignore-eos goes on); top-p tiny is greedy;
 * --json gives each token's log-probability; bad --top-p values are refused. */
ZT_TEST(zgen_cli_eos_top_p_and_logprobs)
{
    FILE *f = fopen("eos.txt", "w");
    ZT_CHECK(f);
    for (int i = 0; i < 400; i++)
        fputs("the cat sat.<|endoftext|>", f);
    ZT_CHECK(fclose(f) == 0);
    char cmd[2048];
    const char *ztok = zt_bin("ZT_ZTOK");
    snprintf(cmd, sizeof cmd, "%s train eos.txt --vocab 270 -o t.json > /dev/null && %s encode "
             "--tokenizer t.json eos.txt -o eos.bin > /dev/null", ztok, ztok);
    ZT_CHECK(system(cmd) == 0);
    zt_zrun_ok("--steps 60 --ckpt-dir er --data eos.bin --tokenizer t.json --model "
               "gpt2:layers=1,heads=2,dim=32,ctx=32,vocab=270 --batch 4 --micro-batch 2 "
               "--lr 1e-2 --warmup 2 --threads 1", "er.log");
    const char *p = "er --prompt 'the cat sat.' --tokens 20 --temperature 0";
    json_t *j = zgen_json(p);
    json_t *ids = json_object_get(j, "ids");
    size_t n = json_array_size(ids);
    json_int_t eos = json_integer_value(json_object_get(j, "eos_id"));
    ZT_CHECK(json_is_integer(json_object_get(j, "eos_id")) && eos > 255);
    if (n >= 20 || json_integer_value(json_array_get(ids, n - 1)) != eos)
        ZT_FAIL("zgen did not stop at <|endoftext|> (id %lld): %zu ids", (long long)eos, n);
    ZT_CHECK(!strcmp(json_string_value(json_object_get(j, "stop")), "eos"));
    ZT_CHECK_EQ(json_integer_value(json_object_get(j, "tokens")), n);
    const char *text = json_string_value(json_object_get(j, "text"));
    ZT_CHECK(strlen(text) >= 13 && !strcmp(text + strlen(text) - 13, "<|endoftext|>"));
    json_decref(j);
    /* text mode: the same, said on stderr */
    char *t = zgen_ok(p);
    ZT_CHECK(strstr(t, "<|endoftext|>\n") && !strstr(strstr(t, "<|endoftext|>") + 1, "the"));
    free(t);
    zt_file_has("gen.err", "stopped at the end-of-text token <|endoftext|>");
    /* --ignore-eos: all 20; their log-probabilities are <= 0, one per token */
    char args[512];
    snprintf(args, sizeof args, "%s --ignore-eos", p);
    j = zgen_json(args);
    json_t *greedy = json_deep_copy(json_object_get(j, "ids"));
    json_t *lp = json_object_get(j, "logprobs");
    ZT_CHECK_EQ(json_array_size(greedy), 20);
    ZT_CHECK_EQ(json_array_size(lp), 20);
    ZT_CHECK(!strcmp(json_string_value(json_object_get(j, "stop")), "tokens"));
    ZT_CHECK(json_is_null(json_object_get(j, "eos_id")));
    for (size_t i = 0; i < 20; i++) {
        json_t *v = json_array_get(lp, i);
        ZT_CHECK(json_is_real(v) && json_real_value(v) <= 0);
    }
    json_decref(j);
    /* a tiny nucleus at temperature 1 gives greedy's tokens; a wide one at a high temperature
     * other tokens, the same again for the same seed */
    j = zgen_json("er --prompt 'the cat sat.' --tokens 20 --ignore-eos --temperature 1 "
                  "--top-p 0.000001 --seed 5");
    ZT_CHECK(json_equal(json_object_get(j, "ids"), greedy));
    ZT_CHECK((float)json_real_value(json_object_get(j, "top_p")) == 1e-6f);
    json_decref(j);
    const char *wide = "er --prompt 'the cat sat.' --tokens 20 --ignore-eos --temperature 3 "
                       "--top-k 0 --top-p 0.95 --seed 5";
    json_t *w1 = zgen_json(wide), *w2 = zgen_json(wide);
    ZT_CHECK(!json_equal(json_object_get(w1, "ids"), greedy));
    ZT_CHECK(json_equal(json_object_get(w1, "ids"), json_object_get(w2, "ids")));
    json_decref(w1);
    json_decref(w2);
    json_decref(greedy);
    /* bad values: named */
    zgen_fails("er --prompt x --top-p 0", 2, "--top-p 0: a nucleus of probability 0");
    zgen_fails("er --prompt x --top-p 1e-60", 2, "--top-p 0: a nucleus of probability 0");
    zgen_fails("er --prompt x --top-p 1.5", 2, "--top-p: 1.5 is out of range (0 to 1)");
    zgen_fails("er --prompt x --top-p -0.5", 2, "--top-p '-0.5'");
    zgen_fails("er --prompt x --top-p abc", 2, "--top-p 'abc'");
}
