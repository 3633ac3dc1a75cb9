#!/usr/bin/env python3
"""An independent reference for `zckpt import` of a Hugging Face Llama (LlamaForCausalLM).

  hf_llama_ref.py make DIR SEED TIED SHARDED
      write a small random Llama directory as transformers lays it out: config.json from
      transformers' LlamaConfig (grouped-query attention: 4 heads, 2 KV heads), the weights in
      Hugging Face's names (model.layers.N.self_attn.q_proj.weight ...) with numpy + safetensors:
      one float32 model.safetensors, or (SHARDED=1) float16 shards model-0000k-of-00002 with
      model.safetensors.index.json; lm_head.weight only when not TIED.
  hf_llama_ref.py check DIR TOKENS(comma separated) PROBS.bin
      run Llama's forward in float64 with numpy following transformers' LlamaForCausalLM
      (RMSNorm with the weight after normalising, rotate-half rotary embedding with the angles
      computed in float32 as transformers does, grouped-query attention by repeating KV heads,
      SwiGLU down(silu(gate(x)) * up(x)), tied or untied head), and compare the next-token
      probabilities with zero's (float32 [T, V]): exit 0 when within 1e-4; also prints the mean
      next-token cross-entropy (the first-step loss) of both.
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file
from transformers import LlamaConfig


def make(d, seed, tied, sharded):
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied,
                      architectures=["LlamaForCausalLM"])
    cfg.save_pretrained(d)
    rng = np.random.default_rng(seed)
    C, I, V, H, KV = 32, 48, 64, 4, 2
    kv = C // H * KV
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, C))}
    for l in range(2):
        p = "model.layers.%d." % l
        w[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
        w[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.3, (C, C))
        w[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.3, (kv, C))
        w[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.3, (kv, C))
        w[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.3, (C, C))
        w[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
        w[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.3, (I, C))
        w[p + "mlp.up_proj.weight"] = rng.normal(0, 0.3, (I, C))
        w[p + "mlp.down_proj.weight"] = rng.normal(0, 0.3, (C, I))
    w["model.norm.weight"] = 1 + rng.normal(0, 0.1, C)
    if not tied:
        w["lm_head.weight"] = rng.normal(0, 0.5, (V, C))
    dt = np.float16 if sharded else np.float32
    w = {k: np.ascontiguousarray(v.astype(dt)) for k, v in w.items()}
    if not sharded:
        save_file(w, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(w)
    parts = [names[: len(names) // 2], names[len(names) // 2:]]
    wm = {}
    for i, part in enumerate(parts):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, len(parts))
        save_file({k: w[k] for k in part}, os.path.join(d, fn), metadata={"format": "pt"})
        wm.update({k: fn for k in part})
    total = sum(v.nbytes for v in w.values())
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def rope_theta(cfg):
    # transformers 5 keeps it in rope_parameters (rope_scaling is another name for it); 4 in
    # rope_theta with rope_scaling None
    rp = getattr(cfg, "rope_parameters", None) or {}
    assert rp.get("rope_type", "default") == "default", rp
    return rp.get("rope_theta", getattr(cfg, "rope_theta", None))


def rotary(cfg, T, hd):
    # transformers' default rotary embedding: inv_freq and the angles in float32
    inv = (1.0 / (np.float32(rope_theta(cfg)) **
                  (np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / np.float32(hd))))
    inv = inv.astype(np.float32)
    ang = (np.arange(T, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float32)
    emb = np.concatenate([ang, ang], -1)
    return np.cos(emb).astype(np.float32).astype(np.float64), \
        np.sin(emb).astype(np.float32).astype(np.float64)


def forward(cfg, w, tokens):
    get = lambda n: w[n].astype(np.float64)
    T, C, H = len(tokens), cfg.hidden_size, cfg.num_attention_heads
    KV, hd, eps = cfg.num_key_value_heads, C // H, cfg.rms_norm_eps
    cos, sin = rotary(cfg, T, hd)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    x = get("model.embed_tokens.weight")[tokens]
    for l in range(cfg.num_hidden_layers):
        p = lambda n: get("model.layers.%d.%s" % (l, n))
        h = rms_norm(x, p("input_layernorm.weight"), eps)
        q = (h @ p("self_attn.q_proj.weight").T).reshape(T, H, hd).transpose(1, 0, 2)
        k = (h @ p("self_attn.k_proj.weight").T).reshape(T, KV, hd).transpose(1, 0, 2)
        v = (h @ p("self_attn.v_proj.weight").T).reshape(T, KV, hd).transpose(1, 0, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)
        att = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ p("self_attn.o_proj.weight").T
        h = rms_norm(x, p("post_attention_layernorm.weight"), eps)
        g = h @ p("mlp.gate_proj.weight").T
        x = x + ((g / (1 + np.exp(-g))) * (h @ p("mlp.up_proj.weight").T)) @ \
            p("mlp.down_proj.weight").T
    x = rms_norm(x, get("model.norm.weight"), eps)
    head = get("model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight")
    logits = x @ head.T
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def load(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return load_file(os.path.join(d, "model.safetensors"))
    w = {}
    for fn in sorted(set(json.load(open(idx))["weight_map"].values())):
        w.update(load_file(os.path.join(d, fn)))
    return w


def check(d, toks, probs_file):
    cfg = LlamaConfig.from_pretrained(d)
    assert cfg.model_type == "llama" and cfg.architectures == ["LlamaForCausalLM"], cfg
    assert cfg.hidden_act == "silu" and not cfg.attention_bias and not cfg.mlp_bias
    assert getattr(cfg, "head_dim", None) in (None, cfg.hidden_size // cfg.num_attention_heads)
    tokens = [int(t) for t in toks.split(",")]
    want = forward(cfg, load(d), tokens)
    got = np.fromfile(probs_file, dtype=np.float32).reshape(len(tokens), cfg.vocab_size)
    err = float(np.abs(want - got).max())
    nxt = np.array(tokens[1:])
    xent = lambda p: float(-np.log(p[np.arange(len(nxt)), nxt]).mean())
    print("max |p_ref - p_zero| = %.3g over %d positions x %d tokens; loss ref %.6f zero %.6f"
          % (err, *got.shape, xent(want[:-1]), xent(got[:-1].astype(np.float64))))
    sys.exit(0 if err <= 1e-4 and abs(xent(want[:-1]) - xent(got[:-1])) <= 1e-4 else 1)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "1")
    else:
        check(sys.argv[2], sys.argv[3], sys.argv[4])
