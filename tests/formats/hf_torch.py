#!/usr/bin/env python3
"""The Hugging Face oracle of `zckpt export --format hf` and `zckpt import`: PyTorch and
transformers themselves (run on the CPU, float32).

  hf_torch.py make KIND DIR SEED [KIND DIR SEED ...]
      write a small random model directory with transformers itself: the model built from its
      config with torch.manual_seed(SEED), every weight redrawn so that the logits are spread
      (norm weights 1 + N(0, 0.1), biases N(0, 0.1), matrices N(0, 0.3 or 0.5)), then
      save_pretrained with a max_shard_size small enough for several shards and an index file.
      KIND is llama-DTYPE-untied or llama-DTYPE-tied (LlamaForCausalLM, grouped-query attention:
      4 heads, 2 KV heads, width 32, vocabulary 64) or gpt2-DTYPE (GPT2LMHeadModel, 2 layers,
      2 heads, width 16, vocabulary 256); DTYPE is float32, bfloat16 or float16 (the weights are
      saved in that type). gpt2-DTYPE-wide is the GPT-2 of the audit of issue 24: 2 layers,
      4 heads, width 48, 16 positions, vocabulary 256.
  hf_torch.py loss DIR TOKEN T
      print (one number) transformers' mean cross-entropy of the T next-token targets of a
      sequence of T + 1 copies of TOKEN: what zrun's first step computes on a corpus of that
      one byte, before its update.
  hf_torch.py check DIR OUT [DIR OUT ...]
      load DIR with GPT2LMHeadModel.from_pretrained or LlamaForCausalLM.from_pretrained (the
      class config.json's architectures names; float32; no weight missing or unexpected) and
      compare with what zero computed for the same tokens, in OUT (written by tests/test_hf.c):
      OUT.tokens (int32 [T]), OUT.logits (float32 [T, V], zero's KV-cache forward, as zgen),
      OUT.probs (float32 [T, V], zero's training forward) and OUT.loss (text: zero's mean
      cross-entropy of tokens[1:] after tokens[:-1], the training loss). transformers' loss is
      model(ids, labels=ids).loss, which shifts the labels the same way. Passes (exit 0) when
      max |dlogit| <= 1e-4 * max(1, max |logit|), max |dp| <= 1e-5 and |dloss| <= 1e-4; prints
      the differences either way, one line per directory.

Exits 77 with one line when torch or transformers cannot be imported (the test skips).
"""
import json
import os
import sys

try:
    import numpy as np
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
except Exception as e:  # not installed, or a torch wheel whose libraries do not load
    print("hf_torch.py: cannot import torch and transformers: %s" % str(e).splitlines()[0])
    sys.exit(77)

CLASSES = {"GPT2LMHeadModel": GPT2LMHeadModel, "LlamaForCausalLM": LlamaForCausalLM}


def build(kind, seed):
    torch.manual_seed(seed)
    family, dtype, *flags = kind.split("-")
    if family == "llama":
        # "swish" is transformers' other name of SiLU
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=32, rms_norm_eps=1e-5,
                          tie_word_embeddings="tied" in flags,
                          hidden_act="swish" if "swish" in flags else "silu")
        model, scale = LlamaForCausalLM(cfg), 0.3
    else:
        wide = "wide" in flags
        cfg = GPT2Config(vocab_size=256, n_positions=16, n_embd=48 if wide else 16, n_layer=2,
                         n_head=4 if wide else 2, bos_token_id=None, eos_token_id=None)
        model, scale = GPT2LMHeadModel(cfg), 0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
    return model.to(getattr(torch, dtype)), dtype


def make(kind, d, seed):
    model, dtype = build(kind, int(seed))
    # several shards (each well under the model's size) and model.safetensors.index.json
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(d, max_shard_size="%dKB" % max(1, total // 3000))
    shards = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    assert len(shards) >= 2 and os.path.exists(os.path.join(d, "model.safetensors.index.json")), \
        "%s: expected a sharded save, got %s" % (d, sorted(os.listdir(d)))
    print("%s: %s %s, %d shards" % (d, kind, dtype, len(shards)))


def check(d, out):
    arch = json.load(open(os.path.join(d, "config.json")))["architectures"]
    assert len(arch) == 1 and arch[0] in CLASSES, "%s: architectures %s" % (d, arch)
    model, info = CLASSES[arch[0]].from_pretrained(d, dtype=torch.float32,
                                                   output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, "%s: from_pretrained: %s" % (d, bad)
    model.eval()
    tokens = np.fromfile(out + ".tokens", dtype=np.int32)
    V, T = model.config.vocab_size, len(tokens)
    ids = torch.tensor(tokens, dtype=torch.long)[None]
    with torch.no_grad():
        res = model(ids, labels=ids)
    want = res.logits[0].numpy().astype(np.float64)
    got = np.fromfile(out + ".logits", dtype=np.float32).reshape(T, V).astype(np.float64)
    probs = np.fromfile(out + ".probs", dtype=np.float32).reshape(T, V).astype(np.float64)
    want_p = torch.softmax(res.logits[0].double(), -1).numpy()
    loss = float(open(out + ".loss").read())
    dl = float(np.abs(want - got).max())
    scale = float(np.abs(want).max())
    dp = float(np.abs(want_p - probs).max())
    dloss = abs(float(res.loss) - loss)
    ok = dl <= 1e-4 * max(1.0, scale) and dp <= 1e-5 and dloss <= 1e-4
    print("%s (%s, transformers %s, torch %s): max |dlogit| %.3g (%.3g of max |logit| %.3g), "
          "max |dp| %.3g, loss transformers %.7f zero %.7f (|d| %.3g) over %d x %d%s"
          % (d, arch[0], transformers.__version__, torch.__version__, dl, dl / scale, scale, dp,
             float(res.loss), loss, dloss, T, V, "" if ok else ": DIFFERENT"))
    return ok


def loss(d, token, T):
    arch = json.load(open(os.path.join(d, "config.json")))["architectures"]
    model = CLASSES[arch[0]].from_pretrained(d, dtype=torch.float32)
    model.eval()
    ids = torch.full((1, int(T)), int(token), dtype=torch.long)
    with torch.no_grad():
        logits = model(ids).logits[0]
    # the targets are the same token: the next one of each position
    print("%.9g" % float(torch.nn.functional.cross_entropy(logits, ids[0])))
    return True


def main():
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make" and args and len(args) % 3 == 0:
        for i in range(0, len(args), 3):
            make(*args[i:i + 3])
        return 0
    if cmd == "loss" and len(args) == 3:
        return 0 if loss(*args) else 1
    if cmd == "check" and args and len(args) % 2 == 0:
        return 0 if all([check(args[i], args[i + 1]) for i in range(0, len(args), 2)]) else 1
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
