/*
 * test_zgen.c: generation (core/model/generate.c) and its programs: the KV-cache forward gives
 * the full forward's logits at every position; greedy decoding is the argmax of the full
 * forward step by step and repeats itself; a seed repeats its sample and another seed changes
 * it; the RNG is splitmix64; zgen (ZT_ZGEN) reads any checkpoint (world 2 at stage 3, resharded)
 * to the same text, refuses each bad input and a corrupted shard; zrun --sample-every prints
 * samples at stages 0 and 3.
 */
#include "ckutil.h"
#include "zr.h"

#include <math.h>
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

ZT_TEST(zgen_kv_cache_logits_match_full_forward)
{
    zr_model *m = spread_model(SMALL, 7);
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
            worst = rel > worst ? rel : worst;
            lo = mine < lo ? mine : lo;
            hi = mine > hi ? mine : hi;
        }
        spread = hi - lo > spread ? hi - lo : spread;
    }
    if (worst > 1e-4)
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
