#!/usr/bin/env python3
"""An independent reference for `zckpt export --format hf`: read the exported directory as
Hugging Face's libraries do (transformers' GPT2Config for config.json, safetensors for the
weights), run GPT-2's forward in float64 with numpy following Hugging Face's GPT2LMHeadModel
(Conv1D: x @ W + b with W [in, out]; gelu_new; LayerNorm eps from the config; tied head), and
compare the next-token probabilities with those zero computed (a float32 [T, V] file).

usage: hf_gpt2_ref.py DIR TOKENS(comma separated) PROBS.bin   -> exit 0 when within 1e-4
"""
import sys

import numpy as np
from safetensors.numpy import load_file
from transformers import GPT2Config


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(cfg, w, tokens):
    get = lambda n: w["transformer." + n].astype(np.float64)
    T, C, H = len(tokens), cfg.n_embd, cfg.n_head
    x = get("wte.weight")[tokens] + get("wpe.weight")[:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg.n_layer):
        p = lambda n: get("h.%d.%s" % (l, n))
        h = layer_norm(x, p("ln_1.weight"), p("ln_1.bias"), cfg.layer_norm_epsilon)
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, H, C // H).transpose(1, 0, 2)
                   for i in range(3))
        att = q @ k.transpose(0, 2, 1) / np.sqrt(C // H) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = layer_norm(x, p("ln_2.weight"), p("ln_2.bias"), cfg.layer_norm_epsilon)
        h = gelu_new(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"))
        x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = layer_norm(x, get("ln_f.weight"), get("ln_f.bias"), cfg.layer_norm_epsilon)
    logits = x @ get("wte.weight").T
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def main():
    d, toks, probs_file = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = GPT2Config.from_pretrained(d)
    assert cfg.model_type == "gpt2" and cfg.architectures == ["GPT2LMHeadModel"], cfg
    assert cfg.activation_function == "gelu_new" and cfg.tie_word_embeddings
    w = load_file(d + "/model.safetensors")
    assert "lm_head.weight" not in w, "the head is tied: no lm_head.weight"
    tokens = [int(t) for t in toks.split(",")]
    want = forward(cfg, w, tokens)
    got = np.fromfile(probs_file, dtype=np.float32).reshape(len(tokens), cfg.vocab_size)
    err = float(np.abs(want - got).max())
    print("max |p_ref - p_zero| = %.3g over %d positions x %d tokens" % (err, *got.shape))
    sys.exit(0 if err <= 1e-4 else 1)


if __name__ == "__main__":
    main()
