#!/usr/bin/env python3
"""torch_gpt2.py: the PyTorch baseline of tests/bench/train_bench.sh.

A nanoGPT-style GPT-2 with the architecture of core/model/model.c: token + learned position
embeddings, pre-LN blocks (ln_1 -> c_attn -> causal self-attention -> c_proj -> residual;
ln_2 -> c_fc -> GELU(tanh) -> c_proj -> residual), ln_f, logits through the tied token
embedding, mean cross-entropy; biases everywhere; GPT-2 initialization; AdamW in fp32
(betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only, as zero), global gradient-norm
clipping at 1.0 (as zero's default). Random tokens, fixed seed.

It times whole training steps (tokens drawn, forward, backward, clip, AdamW, zero_grad) with
torch.set_num_threads(THREADS) and prints one JSON object per line:
  {"variant": ..., "step": k, "step_ms": ..., "tokens_per_s": ...}
then one summary line per variant:
  {"variant": ..., "summary": true, "tokens_per_s": mean over steps after --warmup, ...}
and a last line {"best": variant, "tokens_per_s": ...}.

Variants (--variants, comma separated; default "sdpa-foreach,sdpa-fused,manual-fused"):
  sdpa-*    attention through F.scaled_dot_product_attention(is_causal=True)
  manual-*  attention written out (q k^T, mask, softmax, att v), as nanoGPT's fallback
  *-fused   torch.optim.AdamW(fused=True)      *-foreach  AdamW(foreach=True)
  compile-* the same model under torch.compile (needs a C++ compiler; slow to start)
"""
import argparse
import json
import math
import re
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    "tiny": dict(layers=4, heads=4, dim=128, ctx=128, vocab=256),
    "gpt2": dict(layers=12, heads=12, dim=768, ctx=1024, vocab=50257),
}


class Attention(nn.Module):
    def __init__(self, c, sdpa):
        super().__init__()
        self.nh, self.sdpa = c["heads"], sdpa
        self.c_attn = nn.Linear(c["dim"], 3 * c["dim"])
        self.c_proj = nn.Linear(c["dim"], c["dim"])
        if not sdpa:
            T = c["ctx"]
            self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool))
                                 .view(1, 1, T, T), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.nh
        q = q.view(B, T, self.nh, hs).transpose(1, 2)
        k = k.view(B, T, self.nh, hs).transpose(1, 2)
        v = v.view(B, T, self.nh, hs).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, c, sdpa):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["dim"])
        self.attn = Attention(c, sdpa)
        self.ln_2 = nn.LayerNorm(c["dim"])
        self.c_fc = nn.Linear(c["dim"], 4 * c["dim"])
        self.c_proj = nn.Linear(4 * c["dim"], c["dim"])

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, c, sdpa):
        super().__init__()
        self.wte = nn.Embedding(c["vocab"], c["dim"])
        self.wpe = nn.Embedding(c["ctx"], c["dim"])
        self.h = nn.ModuleList(Block(c, sdpa) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["dim"])
        std_res = 0.02 / math.sqrt(2 * c["layers"])
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, std_res if name.endswith("c_proj.weight") else 0.02)
            elif "ln" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def run_variant(variant, build, cfg, B, T, steps, warmup):
    """build(cfg, sdpa) -> the model; the training loop shared with torch_llama.py"""
    torch.manual_seed(1337)
    parts = variant.split("-")
    compiled = parts[0] == "compile"
    if compiled:
        parts = parts[1:]
    if len(parts) != 2 or parts[0] not in ("sdpa", "manual") or parts[1] not in ("fused", "foreach"):
        raise ValueError(f"unknown variant {variant!r} (expected [compile-]sdpa|manual-fused|foreach)")
    attn, opt_kind = parts
    model = build(cfg, attn == "sdpa")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if opt_kind == "fused" else {"foreach": True}
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, **kw)
    fwd = torch.compile(model) if compiled else model
    gen = torch.Generator().manual_seed(1337)
    rates = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        tok = torch.randint(0, cfg["vocab"], (B, T + 1), generator=gen)
        loss = fwd(tok[:, :-1], tok[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        tps = B * T / dt
        print(json.dumps({"variant": variant, "step": step, "loss": round(loss.item(), 5),
                          "step_ms": round(dt * 1e3, 3), "tokens_per_s": round(tps, 1)}),
              flush=True)
        if step > warmup:
            rates.append(tps)
    mean = sum(rates) / len(rates)
    print(json.dumps({"variant": variant, "summary": True, "tokens_per_s": round(mean, 1),
                      "steps_timed": len(rates)}), flush=True)
    return mean


def main(configs=None, build=None, doc=None):
    """the command line of torch_gpt2.py, or of another model's script given its configs,
    its builder (see run_variant) and its docstring"""
    configs, build = configs or CONFIGS, build or (lambda c, sdpa: GPT(c, sdpa))
    ap = argparse.ArgumentParser(description=(doc or __doc__).split("\n")[0])
    ap.add_argument("--model", choices=sorted(configs), default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=0, help="tokens per sequence (0: ctx)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2, help="leading steps not averaged")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="sdpa-foreach,sdpa-fused,manual-fused")
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    cfg = configs[a.model]
    T = a.seq or cfg["ctx"]
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "mkldnn": torch.backends.mkldnn.is_available(),
                      "blas": re.findall(r"BLAS_INFO=(\w+)", torch.__config__.show())}),
          flush=True)
    best, best_v = -1.0, None
    for v in a.variants.split(","):
        try:
            r = run_variant(v, build, cfg, a.batch, T, a.steps, a.warmup)
        except Exception as e:  # a variant this torch cannot run (e.g. fused AdamW on CPU)
            print(json.dumps({"variant": v, "error": f"{type(e).__name__}: {e}"[:300]}),
                  flush=True)
            continue
        if r > best:
            best, best_v = r, v
    if best_v is None:
        print(json.dumps({"best": None}))
        return 1
    print(json.dumps({"best": best_v, "tokens_per_s": round(best, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
