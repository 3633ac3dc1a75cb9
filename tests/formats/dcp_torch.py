#!/usr/bin/env python3
"""The PyTorch oracle of `zckpt export --format dcp`: torch.distributed.checkpoint itself (one
process, no process group, on the CPU).

  dcp_torch.py load HF DCP OUT [optim]
      build the Hugging Face model of HF/config.json (AutoModelForCausalLM.from_config, random
      weights) and, with optim, an AdamW over its parameters (its state initialised as
      get_optimizer_state_dict does); torch.distributed.checkpoint.load
      {"model": get_model_state_dict(m)[, "optimizer": get_optimizer_state_dict(m, opt)]} from DCP,
      then set_model_state_dict / set_optimizer_state_dict. Every tensor of m.state_dict() must
      equal HF/model.safetensors (zckpt export --format hf of the same checkpoint) bit for bit,
      and no key may be left unloaded. With optim, writes OUT (safetensors) with every
      parameter's "<name>.exp_avg" and "<name>.exp_avg_sq" as the optimizer now holds them and
      prints one JSON line: {"step": [each parameter's step], "lr", "betas", "eps",
      "weight_decay", "params": n}.
  dcp_torch.py save HF OUT_DCP
      torch.distributed.checkpoint.save of {"model": state_dict, "optimizer": AdamW state} of the
      model in HF (from_pretrained) after one AdamW step: what the bench compares against;
      prints the seconds dcp.save took.

Exits 77 with one line when torch, transformers or safetensors cannot be imported.
"""
import json
import sys
import time
import warnings

try:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    from transformers import AutoConfig, AutoModelForCausalLM
    from safetensors.torch import load_file, save_file
except ImportError as e:  # the test skips
    print(f"dcp_torch.py: {e}")
    sys.exit(77)

warnings.filterwarnings("ignore")


def load(hf, d, out, optim):
    torch.manual_seed(1)
    m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf))
    sd = {"model": get_model_state_dict(m)}
    opt = None
    if optim:
        opt = torch.optim.AdamW(m.parameters(), lr=0.5, betas=(0.5, 0.5), weight_decay=0.5)
        sd["optimizer"] = get_optimizer_state_dict(m, opt)
    dcp.load(sd, checkpoint_id=d)  # raises on a key the checkpoint lacks
    set_model_state_dict(m, sd["model"])
    ref = load_file(hf + "/model.safetensors")
    got = m.state_dict()
    for k, v in got.items():
        want = ref.get(k)
        if want is None and k == "lm_head.weight":  # tied: the export has no head
            want = ref.get("transformer.wte.weight", ref.get("model.embed_tokens.weight"))
        if want is None or want.dtype != v.dtype or want.shape != v.shape or \
                not torch.equal(want.view(torch.uint8) if want.dtype != torch.uint8 else want,
                                v.view(torch.uint8) if v.dtype != torch.uint8 else v):
            sys.exit(f"{d}: model tensor '{k}' differs from {hf}/model.safetensors")
    if not optim:
        print(json.dumps({"model": len(got)}))
        return
    set_optimizer_state_dict(m, opt, sd["optimizer"])
    names = {id(p): n for n, p in m.named_parameters()}
    moments, steps = {}, []
    for p, st in opt.state.items():
        n = names[id(p)]
        moments[n + ".exp_avg"] = st["exp_avg"].contiguous()
        moments[n + ".exp_avg_sq"] = st["exp_avg_sq"].contiguous()
        steps.append(float(st["step"]))
    save_file(moments, out)
    g = opt.param_groups[0]
    print(json.dumps({"model": len(got), "step": steps, "lr": g["lr"], "betas": list(g["betas"]),
                      "eps": g["eps"], "weight_decay": g["weight_decay"],
                      "params": len(opt.state), "groups": len(opt.param_groups)}))


def save(hf, d):
    m = AutoModelForCausalLM.from_pretrained(hf)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ids = torch.zeros(1, 8, dtype=torch.long)
    m(ids, labels=ids).loss.backward()
    opt.step()
    t = time.perf_counter()
    dcp.save({"model": get_model_state_dict(m), "optimizer": get_optimizer_state_dict(m, opt)},
             checkpoint_id=d)
    print("%.2f" % (time.perf_counter() - t))


if __name__ == "__main__":
    if sys.argv[1] == "load":
        load(sys.argv[2], sys.argv[3], sys.argv[4], len(sys.argv) > 5 and sys.argv[5] == "optim")
    elif sys.argv[1] == "save":
        save(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"dcp_torch.py: unknown command {sys.argv[1]}")
