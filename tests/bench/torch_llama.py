#!/usr/bin/env python3
"""torch_llama.py: the PyTorch Llama baseline of tests/bench/train_bench.sh.

A Llama with the architecture of core/model/llama.c: token embedding, pre-norm blocks
(RMSNorm -> q, k, v projections -> rotary positions on q and k, Hugging Face's rotate-half
convention, theta 10000 -> causal grouped-query attention -> o projection -> residual;
RMSNorm -> SwiGLU MLP down(silu(gate(x)) * up(x)) -> residual), a final RMSNorm, an untied
lm_head, mean cross-entropy; no biases; normal(0, 0.02) initialization (Hugging Face's
initializer_range), RMSNorm weights 1. The training loop, the variants, the options and the
output are torch_gpt2.py's (AdamW fp32, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
matrices only, clipping at 1.0; random tokens, fixed seed):
  sdpa-*    attention through F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)
  manual-*  attention written out, the key/value heads repeated with repeat_interleave
Configs: tiny = zrun's llama-tiny (layers 4, heads 4, kv_heads 2, dim 128, ffn 344, ctx 128,
vocab 256), 124m = zrun's llama-124m (layers 12, heads 12, kv_heads 4, dim 768, ffn 2048,
ctx 1024, vocab 32000: 124.7M parameters).
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt2  # noqa: E402  the shared training loop and command line

CONFIGS = {
    "tiny": dict(layers=4, heads=4, kv_heads=2, dim=128, ffn=344, ctx=128, vocab=256),
    "124m": dict(layers=12, heads=12, kv_heads=4, dim=768, ffn=2048, ctx=1024, vocab=32000),
}
THETA, EPS = 10000.0, 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c, sdpa):
        super().__init__()
        self.nh, self.nkv, self.sdpa = c["heads"], c["kv_heads"], sdpa
        self.hd = c["dim"] // c["heads"]
        self.q_proj = nn.Linear(c["dim"], c["dim"], bias=False)
        self.k_proj = nn.Linear(c["dim"], self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(c["dim"], self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(c["dim"], c["dim"], bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               enable_gqa=self.nkv != self.nh)
        else:
            rep = self.nh // self.nkv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, c, sdpa):
        super().__init__()
        self.input_layernorm = RMSNorm(c["dim"])
        self.self_attn = Attention(c, sdpa)
        self.post_attention_layernorm = RMSNorm(c["dim"])
        self.gate_proj = nn.Linear(c["dim"], c["ffn"], bias=False)
        self.up_proj = nn.Linear(c["dim"], c["ffn"], bias=False)
        self.down_proj = nn.Linear(c["ffn"], c["dim"], bias=False)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, c, sdpa):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList(Block(c, sdpa) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["dim"])
        self.lm_head = nn.Linear(c["dim"], c["vocab"], bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
        hd = c["dim"] // c["heads"]
        inv = 1.0 / (THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(c["ctx"], dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, idx, targets):
        B, T = idx.shape
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed_tokens(idx)
        for blk in self.layers:
            x = blk(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


if __name__ == "__main__":
    sys.exit(torch_gpt2.main(CONFIGS, lambda c, sdpa: Llama(c, sdpa), __doc__))
