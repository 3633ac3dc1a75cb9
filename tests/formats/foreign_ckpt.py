#!/usr/bin/env python3
"""Foreign checkpoints for the DeepSpeed ZeRO and PyTorch DCP readers: real checkpoints written
by DeepSpeed and by torch.distributed.checkpoint themselves (CPU, gloo), with reference outputs
from their own converters, and damaged copies of them.

  foreign_ckpt.py ds OUTDIR --model gpt2|llama --stage 1|2|3 --dtype fp32|bf16 [--world W]
                  [--steps N] [--grad-accum same|fp32] [--size tiny|124m] [--no-ref]
                  [--next-token K] [--weight-decay X]
      train a tiny model (GPT2LMHeadModel: 2 layers, 2 heads, width 16, 16 positions, vocabulary
      64, tied; LlamaForCausalLM: 2 layers, 4 heads, 2 KV heads, width 16, MLP 24, vocabulary 64,
      untied), built with torch.manual_seed(1234), under deepspeed.initialize with ZeRO stage S
      (client optimizer torch.optim.AdamW lr 1e-2 betas (0.9, 0.95) eps 1e-8 weight decay 0.1
      (--weight-decay X: X; zrun decays only matrices, so a run zrun continues uses 0),
      "zero_allow_untested_optimizer", "gradient_clipping": 0.0 (DeepSpeed 0.19.8's default is
      1.0); bf16: "bf16": {"enabled": true}) on W CPU processes
      (default 2, gloo, spawned by torch.multiprocessing) for N steps (default 2), each rank
      taking 2 fixed random sequences of 8 tokens per step (--grad-accum fp32: "data_types":
      {"grad_accum_dtype": "fp32"}, which with bf16 at stage 1 makes DeepSpeed use its
      BF16_Optimizer, whose files have no zero_stage); then engine.save_checkpoint(OUTDIR)
      (OUTDIR/latest, OUTDIR/global_stepN/), and the model's config.json in OUTDIR (where the
      Hugging Face Trainer puts it). --next-token K: the next batch (below) is every token K,
      which a corpus of that one token gives zrun (the import test continues the run in zrun). --size 124m: GPT-2 small (124M parameters, for
      tests/bench/foreign_bench.sh); --no-ref: the checkpoint only, no ref/. Writes OUTDIR/ref/:
        model.safetensors  deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint
                           (float32, the names the converter gives, tied names included); where
                           the converter refuses the checkpoint (BF16_Optimizer), the gathered
                           master weights (info.json model_reference says which);
        optim.safetensors  "<name>.exp_avg", "<name>.exp_avg_sq" (float32, full shape) of every
                           trainable parameter, gathered inside the ranks after the last step by
                           deepspeed.utils.safe_get_full_optimizer_state; also "<name>.fp32"
                           (safe_get_full_fp32_param, the master weights);
        info.json          step, world, stage, dtype, model (config dict), optimizer (class and
                           hyper-parameters), batches (the tokens of every rank's every step),
                           next_tokens and next_loss (the engine's mean loss on a fixed next
                           batch before saving: what a reader that loads the checkpoint must
                           compute), after_step_loss (the loss on next_tokens after one more
                           training step on next_tokens on every rank, taken after saving).
  foreign_ckpt.py dcp OUTDIR --model gpt2|llama [--world W] [--optim] [--steps N]
                  [--next-token K] [--weight-decay X]
      the same model and batches trained under FSDP2 (torch.distributed.fsdp.fully_shard, CPU,
      gloo) with torch.optim.AdamW, then torch.distributed.checkpoint.save to OUTDIR of
      get_model_state_dict(model) (keys: the parameter names) or, with --optim,
      {"model": model state, "optimizer": optimizer state} from get_state_dict (keys
      "model.<name>", "optimizer.state.<name>.exp_avg", "optimizer.param_groups.0.lr", ...).
      OUTDIR/ref/model.safetensors comes from format_utils.dcp_to_torch_save (loaded back and
      re-saved as safetensors, float32), ref/optim.safetensors (--optim) from the same
      conversion, ref/info.json and OUTDIR/config.json as for ds.
  foreign_ckpt.py universal SRC DST [--load W]
      DeepSpeed's universal checkpoint of the ZeRO checkpoint SRC (made by ds above): its
      ds_to_universal.py (--inject_missing_state: the engine writes no universal_checkpoint_info
      for a model without tensor parallelism, and the converter refuses such a checkpoint
      without it; one worker each) converts SRC/<tag> into DST/<tag>_universal, and writes
      DST/latest_universal; SRC's config.json and ref/ (zero_to_fp32's weights, the engine's
      gathered moments: what the universal checkpoint must hold too) are copied into DST.
      --load W: then W CPU ranks (gloo) build the same model and engine (SRC's stage, dtype and
      optimizer) with "checkpoint": {"load_universal": true}, engine.load_checkpoint(DST) (which
      reads latest_universal), and gather every trainable parameter's master weights and
      moments (safe_get_full_fp32_param, safe_get_full_optimizer_state) into
      DST/ref/loaded.safetensors ("<name>.fp32", "<name>.exp_avg", "<name>.exp_avg_sq"), the
      engine's global_steps into DST/ref/loaded.json.
  foreign_ckpt.py damage KIND SRC DST
      copy the checkpoint directory SRC to DST (which must not exist) and damage the copy. KIND:
      missing-rank-file (DeepSpeed: remove the last rank's *_optim_states.pt), truncated-zip
      (DeepSpeed: cut the last rank's optim file to half its size), missing-distcp (DCP: remove
      the last __R_0.distcp), metadata-missing-chunk (DCP: rewrite .metadata with the last chunk
      of the first tensor that has two or more removed), latest-absent-tag (DeepSpeed: `latest`
      names global_step999999), evil-pickle-os-system and evil-pickle-eval (DeepSpeed: replace
      data.pkl in rank 0's optim file with a pickle whose GLOBAL is os.system (`cos\\nsystem`)
      / builtins.eval (`c__builtin__\\neval`), called with a command that creates DST/PWNED;
      the zip is rebuilt with zipfile, stored, with the same root folder). DST is removed again
      when the damage does not apply to SRC (exit 1, one line).
  foreign_ckpt.py rebuild DIR
      rebuild the master weights, exp_avg and exp_avg_sq of a DeepSpeed checkpoint from its
      rank files alone (stage 1/2: partitions concatenated in rank order, group_paddings and
      param_alignment_paddings honoured; stage 3: ceil(numel/W) per parameter from every rank)
      and compare with ref/; exits 0 when they agree bit for bit: the recipe a reader in C
      must follow.
  foreign_ckpt.py inspect DIR
      describe every file of a checkpoint directory (zip records, pickle protocol, opcodes and
      GLOBALs, structure, DCP .metadata): the material of FOREIGN_FINDINGS.md.

ds and dcp refuse an OUTDIR that exists and is not an empty directory. Every subcommand but
inspect prints one line of what it wrote on stdout (DeepSpeed's and torch's logs go to stderr)
and exits 0; a failure exits non-zero with one line; a missing torch, deepspeed, transformers or
safetensors exits 77 with one line (the test skips). DS_ACCELERATOR=cpu and HF_HUB_OFFLINE=1 are
set here when unset. One variant takes about 10-12 s on a quiet 2-core machine, most of it the
imports in each spawned rank (FOREIGN_FINDINGS.md has the measurements).
"""
import json
import os
import shutil
import socket
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from safetensors.torch import save_file
except Exception as e:  # not installed, or a torch wheel whose libraries do not load
    print("foreign_ckpt.py: cannot import torch and safetensors: %s" % str(e).splitlines()[0])
    sys.exit(77)

SEQ, MICRO, LR, BETAS, EPS, WD, SEED = 8, 2, 1e-2, (0.9, 0.95), 1e-8, 0.1, 1234


def need(modname):
    try:
        return __import__(modname)
    except Exception as e:
        sys.__stdout__.write("foreign_ckpt.py: cannot import %s: %s\n"
                             % (modname, str(e).splitlines()[0]))
        sys.exit(77)


def build(model, size="tiny"):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(SEED)
    if model == "gpt2" and size == "124m":  # GPT-2 small, for the benchmark
        cfg = GPT2Config(bos_token_id=None, eos_token_id=None)
        m = GPT2LMHeadModel(cfg)
    elif model == "gpt2":
        cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                         bos_token_id=None, eos_token_id=None)
        m = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=16, rms_norm_eps=1e-5,
                          tie_word_embeddings=False)
        m = LlamaForCausalLM(cfg)
    # no dropout: the same loss whichever framework computes it
    for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"):
        if hasattr(m.config, k):
            setattr(m.config, k, 0.0)
    for mod in m.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    return m, json.loads(m.config.to_json_string())


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank + 1)
    return torch.randint(0, 64, (MICRO, SEQ), generator=g)


def next_batch(token=None):
    if token is not None:  # --next-token: a batch of one token, as a corpus of it gives zrun
        return torch.full((MICRO, SEQ), token, dtype=torch.long)
    return torch.randint(0, 64, (MICRO, SEQ), generator=torch.Generator().manual_seed(999))


def adamw(model, wd):
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=wd)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def dist_env(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)


def optim_info(a):
    return {"class": "torch.optim.AdamW", "lr": LR, "betas": list(BETAS), "eps": EPS,
            "weight_decay": a.weight_decay, "gradient_clipping": None}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def fp32_dict(sd):
    # safetensors refuses tensors that share memory (GPT-2's tied lm_head): clone each
    return {k: v.detach().float().clone().contiguous() for k, v in sd.items()
            if torch.is_tensor(v)}


# ---------------------------------------------------------------------------------------------
# DeepSpeed

def ds_rank(rank, a, port, q):
    sys.stdout = sys.stderr
    dist_env(rank, a.world, port)
    tm = {"start": time.time()}
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    import transformers
    transformers.utils.logging.set_verbosity_error()
    deepspeed.init_distributed(dist_backend="gloo")
    model, cfg = build(a.model, a.size)
    opt = adamw(model, a.weight_decay)
    conf = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": a.stage}, "zero_allow_untested_optimizer": True,
            "gradient_clipping": 0.0, "steps_per_print": 1000000, "wall_clock_breakdown": False}
    if a.dtype == "bf16":
        conf["bf16"] = {"enabled": True}
    if a.grad_accum == "fp32":
        conf["data_types"] = {"grad_accum_dtype": "fp32"}
    tm["imported"] = time.time()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=conf)
    tm["initialized"] = time.time()
    losses = []
    for s in range(a.steps):
        ids = batch(s, rank)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    if a.no_ref:  # the benchmark's checkpoint: saved, nothing gathered or compared
        engine.save_checkpoint(a.outdir)
        if rank == 0:
            q.put({"missing": [], "info": {"model": cfg, "step": a.steps}})
        return
    # every rank takes part in the gathers (collectives under ZeRO)
    ref = {}
    for name, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        ref[name + ".fp32"] = safe_get_full_fp32_param(p)
        for k in ("exp_avg", "exp_avg_sq"):
            ref[name + "." + k] = safe_get_full_optimizer_state(p, k)
    nb = next_batch(a.next_token)
    engine.eval()
    with torch.no_grad():
        next_loss = float(engine(input_ids=nb, labels=nb).loss)
    engine.train()
    tm["trained"] = time.time()
    engine.save_checkpoint(a.outdir)
    tm["saved"] = time.time()
    loss = engine(input_ids=nb, labels=nb).loss
    engine.backward(loss)
    engine.step()
    engine.eval()
    with torch.no_grad():
        after = float(engine(input_ids=nb, labels=nb).loss)
    if rank == 0:
        # tensors through a queue need the sender alive: write them here
        os.makedirs(os.path.join(a.outdir, "ref"), exist_ok=True)
        save_file({k: v.detach().float().clone().contiguous() for k, v in ref.items()
                   if v is not None}, os.path.join(a.outdir, "ref", "optim.safetensors"))
        q.put({"missing": sorted(k for k, v in ref.items() if v is None),
               "info": {"model": cfg, "next_loss": next_loss, "after_step_loss": after,
                        "train_losses_rank0": losses,
                        "rank0_seconds": {k: round(v - tm["start"], 2) for k, v in tm.items()},
                        "optimizer_class": type(engine.optimizer).__name__,
                        "basic_optimizer": type(engine.basic_optimizer).__name__
                        if getattr(engine, "basic_optimizer", None) is not None else None,
                        "step": a.steps}})
    dist.barrier()
    dist.destroy_process_group()


def spawn(fn, a, fresh=False):
    """run fn(rank, a, port, queue) on a.world processes; rank 0 puts one result in the queue.
    When a rank fails the others (likely waiting in a collective) are killed at once. A rank
    that dies of a signal of its own (gloo's threads have aborted a rank at exit, "terminate
    called without an active exception", once in many CI runs) gets the whole run again, once,
    on a new port (fresh: a.outdir, empty before the first run, emptied again first); a rank
    that fails with an exit status does not."""
    out, codes, crashed = spawn_once(fn, a)
    if crashed:
        sys.stderr.write("foreign_ckpt.py: %s: a rank crashed (exit codes %s): running again "
                         "once\n" % (a.outdir, codes))
        if fresh:
            shutil.rmtree(a.outdir)  # fresh_dir made it empty: all of it is ours
            fresh_dir(a.outdir)
        out, codes, crashed = spawn_once(fn, a)
    if any(c != 0 for c in codes) or out is None:
        raise SystemExit("foreign_ckpt.py: %s: a rank failed (exit codes %s)" % (a.outdir, codes))
    return out


def spawn_once(fn, a):
    """one run of spawn: (rank 0's result or None, the exit codes, whether the first rank to
    fail died of a signal rather than the kill that followed)"""
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=fn, args=(r, a, port, q)) for r in range(a.world)]
    for p in procs:
        p.start()
    out, deadline, crashed = None, time.time() + 600, False
    while True:
        if out is None and not q.empty():
            out = q.get()
        codes = [p.exitcode for p in procs]
        if any(c not in (None, 0) for c in codes):
            crashed = any(c is not None and c < 0 for c in codes)  # before the kills below
            break
        if time.time() > deadline:
            break
        if all(c == 0 for c in codes):
            if out is None and not q.empty():
                out = q.get()
            break
        time.sleep(0.05)
    for p in procs:
        if p.exitcode is None:
            p.kill()
        p.join()
    return out, [p.exitcode for p in procs], crashed


def fresh_dir(d):
    if os.path.exists(d) and (not os.path.isdir(d) or os.listdir(d)):
        raise SystemExit("foreign_ckpt.py: %s exists and is not an empty directory" % d)
    os.makedirs(d, exist_ok=True)


def cmd_ds(a):
    need("deepspeed")
    need("transformers")
    t0 = time.time()
    fresh_dir(a.outdir)
    out = spawn(ds_rank, a, fresh=True)
    if a.no_ref:
        write_json(os.path.join(a.outdir, "config.json"), out["info"]["model"])
        say("%s: deepspeed %s (%s) stage %d %s world %d, no reference (%.1f s)"
            % (a.outdir, a.model, a.size, a.stage, a.dtype, a.world, time.time() - t0))
        return 0
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    import logging
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    from safetensors.torch import load_file
    refdir = os.path.join(a.outdir, "ref")
    gathered = load_file(os.path.join(refdir, "optim.safetensors"))
    try:
        sd, converter = get_fp32_state_dict_from_zero_checkpoint(a.outdir), "zero_to_fp32"
    except ValueError as e:  # BF16_Optimizer files have no zero_stage: zero_to_fp32 refuses them
        converter = "safe_get_full_fp32_param (zero_to_fp32: %s)" % e
        sd = {k[:-5]: v for k, v in gathered.items() if k.endswith(".fp32")}
        import glob
        ms = torch.load(sorted(glob.glob(os.path.join(a.outdir, open(os.path.join(
            a.outdir, "latest")).read(), "*model_states.pt")))[0], weights_only=False)
        for alias, name in ms["shared_params"].items():  # as zero_to_fp32 adds them
            sd[alias] = sd[name]
    model = fp32_dict(sd)
    save_file(model, os.path.join(refdir, "model.safetensors"))
    # the converter and the engine's own gather must agree on the master weights
    diff = max(float((model[k[:-5]] - v).abs().max()) for k, v in gathered.items()
               if k.endswith(".fp32"))
    info = out["info"]
    write_json(os.path.join(a.outdir, "config.json"), info["model"])
    tag = open(os.path.join(a.outdir, "latest")).read()
    info.update(world=a.world, stage=a.stage, dtype=a.dtype, tag=tag,
                optimizer=optim_info(a), micro_batch=MICRO, seq=SEQ,
                batches=[[batch(s, r).tolist() for r in range(a.world)] for s in range(a.steps)],
                next_tokens=next_batch(a.next_token).tolist(), gather_missing=out["missing"],
                grad_accum=a.grad_accum, model_reference=converter,
                converter_vs_gather_max_abs=diff,
                versions={"torch": torch.__version__,
                          "deepspeed": sys.modules["deepspeed"].__version__})
    write_json(os.path.join(refdir, "info.json"), info)
    if diff != 0.0:
        raise SystemExit("foreign_ckpt.py: %s: zero_to_fp32 and safe_get_full_fp32_param differ "
                         "by %g" % (a.outdir, diff))
    say("%s: deepspeed %s stage %d %s world %d, %s, %d tensors, next_loss %.6f (%.1f s)"
          % (a.outdir, a.model, a.stage, a.dtype, a.world, tag, len(model), info["next_loss"],
             time.time() - t0))
    return 0


def ucp_load_rank(rank, a, port, q):
    sys.stdout = sys.stderr
    dist_env(rank, a.world, port)
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    import transformers
    transformers.utils.logging.set_verbosity_error()
    deepspeed.init_distributed(dist_backend="gloo")
    model, _ = build(a.model)
    conf = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": a.stage}, "zero_allow_untested_optimizer": True,
            "gradient_clipping": 0.0, "steps_per_print": 1000000, "wall_clock_breakdown": False,
            "checkpoint": {"load_universal": True}}
    if a.dtype == "bf16":
        conf["bf16"] = {"enabled": True}
    if a.grad_accum == "fp32":
        conf["data_types"] = {"grad_accum_dtype": "fp32"}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=adamw(model, a.weight_decay),
                                           config=conf)
    engine.load_checkpoint(a.outdir)
    got = {}
    for name, p in engine.module.named_parameters():
        if p.requires_grad:
            got[name + ".fp32"] = safe_get_full_fp32_param(p)
            for k in ("exp_avg", "exp_avg_sq"):
                got[name + "." + k] = safe_get_full_optimizer_state(p, k)
    if rank == 0:
        save_file({k: v.detach().float().clone().contiguous() for k, v in got.items()
                   if v is not None}, os.path.join(a.outdir, "ref", "loaded.safetensors"))
        q.put({"missing": sorted(k for k, v in got.items() if v is None),
               "global_steps": engine.global_steps})
    dist.barrier()
    dist.destroy_process_group()


def cmd_universal(src, dst, load=None):
    need("deepspeed")
    import subprocess
    t0 = time.time()
    src, dst = os.path.abspath(src), os.path.abspath(dst)
    fresh_dir(dst)
    tag = open(os.path.join(src, "latest")).read().strip()
    out = os.path.join(dst, tag + "_universal")
    env = dict(os.environ, DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"))
    r = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", os.path.join(src, tag), "--output_folder", out,
                        "--inject_missing_state", "--num_extract_workers", "1",
                        "--num_merge_workers", "1"], stdout=sys.stderr, stderr=sys.stderr,
                       env=env)
    if r.returncode != 0:
        raise SystemExit("foreign_ckpt.py: ds_to_universal of %s exited %d" % (src, r.returncode))
    shutil.copy(os.path.join(src, "config.json"), dst)
    if os.path.isdir(os.path.join(src, "ref")):
        shutil.copytree(os.path.join(src, "ref"), os.path.join(dst, "ref"))
    params = sorted(os.listdir(os.path.join(out, "zero")))
    if load:
        import argparse
        from safetensors.torch import load_file
        info = json.load(open(os.path.join(src, "ref", "info.json")))
        a = argparse.Namespace(world=load, model=info["model"]["model_type"], stage=info["stage"],
                               dtype=info["dtype"], grad_accum=info["grad_accum"],
                               weight_decay=info["optimizer"]["weight_decay"], outdir=dst)
        r = spawn(ucp_load_rank, a)
        write_json(os.path.join(dst, "ref", "loaded.json"), {"world": load, **r})
        # what DeepSpeed loaded is what it gathered before saving the ZeRO checkpoint
        ref = load_file(os.path.join(dst, "ref", "optim.safetensors"))
        got = load_file(os.path.join(dst, "ref", "loaded.safetensors"))
        bad = sorted(k for k in ref if k not in got or not torch.equal(ref[k], got[k]))
        if bad or r["missing"]:
            raise SystemExit("foreign_ckpt.py: DeepSpeed's load_universal at world %d: %s differ "
                             "from the source's gather; not gathered: %s"
                             % (load, bad[:4], r["missing"][:4]))
    say("%s: universal checkpoint of %s (%s_universal, %d entries in zero/, %.1f s)"
        % (dst, src, tag, len(params), time.time() - t0))
    return 0


# ---------------------------------------------------------------------------------------------
# DCP

def dcp_rank(rank, a, port, q):
    sys.stdout = sys.stderr
    dist_env(rank, a.world, port)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict
    from torch.distributed.fsdp import fully_shard
    import transformers
    transformers.utils.logging.set_verbosity_error()
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (a.world,))
    model, cfg = build(a.model)
    layers = model.transformer.h if a.model == "gpt2" else model.model.layers
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = adamw(model, a.weight_decay)
    losses = []
    for s in range(a.steps):
        ids = batch(s, rank)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    nb = next_batch(a.next_token)
    with torch.no_grad():
        next_loss = float(model(input_ids=nb, labels=nb).loss)
    if a.optim:
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optimizer": osd}
    else:
        sd = get_model_state_dict(model)
    dcp.save(sd, checkpoint_id=a.outdir)
    loss = model(input_ids=nb, labels=nb).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        after = float(model(input_ids=nb, labels=nb).loss)
    if rank == 0:
        q.put({"info": {"model": cfg, "next_loss": next_loss, "after_step_loss": after,
                        "train_losses_rank0": losses, "step": a.steps,
                        "wrapper": "FSDP2 fully_shard (per decoder layer, then the model)",
                        "layout": "{'model': ..., 'optimizer': ...} (get_state_dict)" if a.optim
                        else "get_model_state_dict (bare names)"}})
    dist.barrier()
    dist.destroy_process_group()


def cmd_dcp(a):
    need("transformers")
    t0 = time.time()
    fresh_dir(a.outdir)
    out = spawn(dcp_rank, a, fresh=True)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    refdir = os.path.join(a.outdir, "ref")
    os.makedirs(refdir)
    pt = os.path.join(refdir, "dcp_to_torch_save.pt")
    dcp_to_torch_save(a.outdir, pt)
    full = torch.load(pt, weights_only=False)
    os.unlink(pt)
    msd = full["model"] if a.optim else full
    model = fp32_dict(msd)
    save_file(model, os.path.join(refdir, "model.safetensors"))
    if a.optim:
        ost = {}
        for name, st in full["optimizer"]["state"].items():
            for k in ("exp_avg", "exp_avg_sq"):
                ost[name + "." + k] = st[k].float().clone().contiguous()
        save_file(ost, os.path.join(refdir, "optim.safetensors"))
    info = out["info"]
    write_json(os.path.join(a.outdir, "config.json"), info["model"])
    info.update(world=a.world, dtype="fp32", optimizer=optim_info(a), micro_batch=MICRO, seq=SEQ,
                batches=[[batch(s, r).tolist() for r in range(a.world)] for s in range(a.steps)],
                next_tokens=next_batch(a.next_token).tolist(), optim=bool(a.optim),
                versions={"torch": torch.__version__})
    write_json(os.path.join(refdir, "info.json"), info)
    say("%s: dcp %s world %d%s, %d tensors, next_loss %.6f (%.1f s)"
          % (a.outdir, a.model, a.world, " with optimizer" if a.optim else "", len(model),
             info["next_loss"], time.time() - t0))
    return 0


# ---------------------------------------------------------------------------------------------
# damage

def rank_files(d, suffix):
    import glob
    import re
    tag = open(os.path.join(d, "latest")).read().strip()
    files = glob.glob(os.path.join(d, tag, "*" + suffix))
    if not files:
        raise ValueError("no %s/*%s: not a DeepSpeed checkpoint" % (tag, suffix))
    key = lambda p: int(re.search(r"zero_pp_rank_(\d+)_", p).group(1))
    return sorted(files, key=key)


def evil_pickle(kind, marker):
    # protocol 2, as torch.save writes: GLOBAL, an argument tuple, REDUCE
    cmd = "touch %s" % marker
    if kind == "evil-pickle-os-system":
        glob_ = b"cos\nsystem\n"  # (pickle itself would write posix system)
        arg = cmd
    else:
        glob_ = b"c__builtin__\neval\n"
        arg = "__import__('os').system(%r)" % cmd
    s = arg.encode()
    return b"\x80\x02" + glob_ + b"X" + len(s).to_bytes(4, "little") + s + b"\x85R."


def replace_record(path, record, data):
    import zipfile
    with zipfile.ZipFile(path) as z:
        items = [(i.filename, z.read(i)) for i in z.infolist()]
    root = items[0][0].split("/")[0]
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for name, body in items:
            z.writestr(name, data if name == root + "/" + record else body)
    os.replace(tmp, path)


KINDS = ("missing-rank-file", "truncated-zip", "missing-distcp", "metadata-missing-chunk",
         "latest-absent-tag", "evil-pickle-os-system", "evil-pickle-eval")


def cmd_damage(kind, src, dst):
    if kind not in KINDS:
        raise SystemExit("foreign_ckpt.py: unknown damage %s (one of %s)"
                         % (kind, ", ".join(KINDS)))
    if not os.path.isdir(src):
        raise SystemExit("foreign_ckpt.py: %s is not a directory" % src)
    if os.path.lexists(dst):
        raise SystemExit("foreign_ckpt.py: %s exists" % dst)
    dst = os.path.abspath(dst)
    shutil.copytree(src, dst)
    try:
        what = damage(kind, dst)
    except Exception as e:  # e.g. a DCP damage asked of a DeepSpeed directory
        shutil.rmtree(dst)
        raise SystemExit("foreign_ckpt.py: cannot apply %s to %s: %s: %s"
                         % (kind, src, type(e).__name__, e))
    say("%s: %s" % (kind, what))
    return 0


def damage(kind, dst):
    import pickle
    if kind == "missing-rank-file":
        f = rank_files(dst, "_optim_states.pt")[-1]
        os.unlink(f)
        what = "removed " + f
    elif kind == "truncated-zip":
        f = rank_files(dst, "_optim_states.pt")[-1]
        n = os.path.getsize(f)
        os.truncate(f, n // 2)
        what = "cut %s from %d to %d bytes" % (f, n, n // 2)
    elif kind == "missing-distcp":
        files = sorted(x for x in os.listdir(dst) if x.endswith(".distcp"))
        if not files:
            raise ValueError("no *.distcp files: not a DCP checkpoint")
        os.unlink(os.path.join(dst, files[-1]))
        what = "removed " + os.path.join(dst, files[-1])
    elif kind == "metadata-missing-chunk":
        p = os.path.join(dst, ".metadata")
        with open(p, "rb") as f:
            md = pickle.load(f)
        fqn = next(k for k, v in md.state_dict_metadata.items()
                   if len(getattr(v, "chunks", [])) >= 2)
        md.state_dict_metadata[fqn].chunks.pop()
        with open(p, "wb") as f:
            pickle.dump(md, f)
        what = "removed the last chunk of %s from %s" % (fqn, p)
    elif kind == "latest-absent-tag":
        with open(os.path.join(dst, "latest"), "w") as f:
            f.write("global_step999999")
        what = "latest in %s names global_step999999" % dst
    elif kind in ("evil-pickle-os-system", "evil-pickle-eval"):
        f = rank_files(dst, "_optim_states.pt")[0]
        replace_record(f, "data.pkl", evil_pickle(kind, os.path.join(dst, "PWNED")))
        what = "data.pkl of %s calls %s" % (f, "os.system" if "system" in kind else "eval")
    return what


# ---------------------------------------------------------------------------------------------
# inspect

def pickle_scan(data):
    """protocol, opcode counts and the (module, name) of every GLOBAL / STACK_GLOBAL"""
    import pickletools
    proto, ops, globs, memo, strs = None, {}, [], {}, []
    last = None
    for op, arg, pos in pickletools.genops(data):
        ops[op.name] = ops.get(op.name, 0) + 1
        if op.name == "PROTO":
            proto = arg
        if op.name == "GLOBAL":
            globs.append(tuple(arg.split(" ", 1)))
            last = None
        elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strs.append(arg)
            last = arg
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            v = memo.get(arg)
            strs.append(v)
            last = v
        elif op.name == "MEMOIZE":
            memo[len(memo)] = last
        elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = last
        elif op.name == "STACK_GLOBAL":
            globs.append((strs[-2], strs[-1]))
            last = None
        else:
            last = None
    return proto, ops, globs


def describe(obj, depth=0, maxitems=40):
    pad = "  " * depth
    if torch.is_tensor(obj):
        extra = ""
        if obj.__dict__:
            extra = " attrs %s" % sorted(obj.__dict__)
        st = obj.untyped_storage()
        return "Tensor%s %s storage_offset %d storage_nbytes %d%s" % (
            list(obj.shape), str(obj.dtype).replace("torch.", ""), obj.storage_offset(),
            st.nbytes(), extra)
    if isinstance(obj, dict):
        lines = ["%s (%d keys)" % (type(obj).__name__, len(obj))]
        for i, (k, v) in enumerate(obj.items()):
            if i >= maxitems:
                lines.append("%s  ... %d more" % (pad, len(obj) - maxitems))
                break
            lines.append("%s  %r: %s" % (pad, k, describe(v, depth + 1, maxitems)))
        return "\n".join(lines)
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        if all(isinstance(x, (int, float, str, bool, type(None))) for x in obj):
            return "%s %r" % (type(obj).__name__, obj if len(obj) <= 16 else
                              list(obj[:16]) + ["... %d" % len(obj)])
        lines = ["%s (%d items)" % (type(obj).__name__, len(obj))]
        for i, v in enumerate(obj[:maxitems]):
            lines.append("%s  [%d]: %s" % (pad, i, describe(v, depth + 1, maxitems)))
        return "\n".join(lines)
    if hasattr(obj, "__dict__") and not isinstance(obj, type) and \
            type(obj).__module__ not in ("builtins",) and not isinstance(obj, torch.Size):
        return "%s.%s %r" % (type(obj).__module__, type(obj).__name__,
                             {k: v for k, v in vars(obj).items()} if len(vars(obj)) < 16
                             else sorted(vars(obj)))
    r = repr(obj)
    return "%s %s" % (type(obj).__name__, r if len(r) < 200 else r[:200] + "...")


def zip_report(path, out):
    import struct
    import zipfile
    with open(path, "rb") as f:
        raw = f.read()
    z = zipfile.ZipFile(path)
    infos = z.infolist()
    root = infos[0].filename.split("/")[0]
    out.append("  zip root %r, %d records, ZIP64 EOCD %s, ZIP64 locator %s, data descriptors %s"
               % (root, len(infos), b"PK\x06\x06" in raw, b"PK\x06\x07" in raw,
                  raw.count(b"PK\x07\x08")))
    for i in infos:
        lh = raw[i.header_offset:i.header_offset + 30]
        (_, _, flags, method, _, _, lcrc, lcs, lus, nlen, xlen) = struct.unpack(
            "<IHHHHHIIIHH", lh)
        data_off = i.header_offset + 30 + nlen + xlen
        extra = raw[i.header_offset + 30 + nlen:data_off]
        real = zipfile.crc32(z.read(i)) & 0xffffffff
        out.append("   %-40s method %d (%s) size %d cd-crc %08x (actual %08x) local crc/cs/us "
                   "%x/%d/%d flags %#06x extra %s data@%d (%%64=%d)"
                   % (i.filename, i.compress_type,
                      "stored" if i.compress_type == 0 else "compressed", i.file_size,
                      i.CRC, real, lcrc, lcs, lus, flags, extra[:4].hex(), data_off,
                      data_off % 64))
    pkl = z.read(root + "/data.pkl")
    proto, ops, globs = pickle_scan(pkl)
    out.append("  data.pkl: protocol %s, %d bytes" % (proto, len(pkl)))
    out.append("  opcodes: %s" % ", ".join("%s×%d" % kv for kv in sorted(ops.items())))
    seen = []
    for g in globs:
        if g not in seen:
            seen.append(g)
    out.append("  GLOBALs (%d, %d distinct): %s" % (len(globs), len(seen),
                                                   ", ".join("%s.%s" % g for g in seen)))
    return z


def dcp_report(d, out):
    import pickle
    with open(os.path.join(d, ".metadata"), "rb") as f:
        raw = f.read()
    proto, ops, globs = pickle_scan(raw)
    out.append("  .metadata: %d bytes, starts %r, protocol %s" % (len(raw), raw[:2], proto))
    out.append("  opcodes: %s" % ", ".join("%s×%d" % kv for kv in sorted(ops.items())))
    seen = []
    for g in globs:
        if g not in seen:
            seen.append(g)
    out.append("  GLOBALs (%d distinct): %s" % (len(seen), ", ".join("%s.%s" % g for g in seen)))
    md = pickle.loads(raw)
    out.append("  Metadata fields: %s" % sorted(vars(md)))
    out.append("  version %r storage_meta %r" % (getattr(md, "version", None),
                                                  getattr(md, "storage_meta", None)))
    out.append("  state_dict_metadata:")
    for k, v in md.state_dict_metadata.items():
        if hasattr(v, "chunks"):
            p = v.properties
            out.append("   %r: Tensor size %s %s chunks %s" % (
                k, list(v.size), str(p.dtype).replace("torch.", ""),
                [(list(c.offsets), list(c.sizes)) for c in v.chunks]))
        else:
            out.append("   %r: %s" % (k, type(v).__name__))
    out.append("  planner_data (first 12): %s" % list(md.planner_data.items())[:12])
    out.append("  storage_data:")
    for k, v in md.storage_data.items():
        out.append("   MetadataIndex(%r, %s, index=%s) -> %s %d+%d %s" % (
            k.fqn, list(k.offset) if k.offset is not None else None, k.index,
            v.relative_path, v.offset, v.length,
            {x: y for x, y in vars(v).items() if x not in ("relative_path", "offset", "length")}
            if hasattr(v, "__dict__") else ""))
    # is each item itself a torch.save zip?
    kinds = {}
    for k, v in md.storage_data.items():
        with open(os.path.join(d, v.relative_path), "rb") as f:
            f.seek(v.offset)
            head = f.read(4)
            f.seek(v.offset + v.length - 22)
            tail = f.read(4)
        kinds.setdefault((head, tail), []).append(k.fqn)
    for (h, t), names in kinds.items():
        out.append("  items starting %r and with %r 22 bytes before their end: %d (e.g. %s)"
                   % (h, t, len(names), names[0]))
    return md


def cmd_inspect(d):
    import io
    import zipfile
    out = ["# %s" % d]
    for root, dirs, files in sorted(os.walk(d)):
        dirs.sort()
        for fn in sorted(files):
            p = os.path.join(root, fn)
            out.append("  %s %d" % (os.path.relpath(p, d), os.path.getsize(p)))
    if os.path.exists(os.path.join(d, "latest")):
        out.append("latest = %r" % open(os.path.join(d, "latest"), "rb").read())
        tag = open(os.path.join(d, "latest")).read()
        for fn in sorted(os.listdir(os.path.join(d, tag))):
            p = os.path.join(d, tag, fn)
            out.append("## %s" % fn)
            zip_report(p, out)
            obj = torch.load(p, weights_only=False, map_location="cpu")
            out.append("  structure: " + describe(obj, 1))
            osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
            if isinstance(osd, dict) and "zero_stage" in osd:
                zs = osd["zero_stage"]
                out.append("  zero_stage value %r type %s.%s int %d" % (
                    zs, type(zs).__module__, type(zs).__name__, int(zs)))
            for k in ("sparse_tensor_module_names",):
                if isinstance(obj, dict) and k in obj:
                    out.append("  %s type %s" % (k, type(obj[k]).__name__))
    if os.path.exists(os.path.join(d, ".metadata")):
        out.append("## .metadata")
        md = dcp_report(d, out)
        first = next(iter(md.storage_data.items()))
        k, v = first
        with open(os.path.join(d, v.relative_path), "rb") as f:
            f.seek(v.offset)
            blob = f.read(v.length)
        out.append("## one item of %s: %r" % (v.relative_path, k.fqn))
        tmp = io.BytesIO(blob)
        if blob[:4] == b"PK\x03\x04":
            import tempfile
            with tempfile.NamedTemporaryFile(suffix=".pt") as t:
                t.write(blob)
                t.flush()
                zip_report(t.name, out)
            out.append("  loads as: " + describe(torch.load(tmp, weights_only=False)))
    say("\n".join(out))
    return 0


# ---------------------------------------------------------------------------------------------
# rebuild: the recipes a reader without DeepSpeed must follow, checked against ref/

def ds_rebuild(d):
    """{(name, 'fp32'|'exp_avg'|'exp_avg_sq'): full tensor} from the rank files alone"""
    import glob
    import math
    import re
    tag = open(os.path.join(d, "latest")).read()
    rank = lambda p: int(re.search(r"zero_pp_rank_(\d+)_", p).group(1))
    ofs = sorted(glob.glob(os.path.join(d, tag, "*optim_states.pt")), key=rank)
    ms = torch.load(sorted(glob.glob(os.path.join(d, tag, "*model_states.pt")))[0],
                    weights_only=False)
    osd = [torch.load(f, weights_only=False)["optimizer_state_dict"] for f in ofs]
    W, out = len(osd), {}
    if "zero_stage" in osd[0] and int(osd[0]["zero_stage"]) == 3:
        # per parameter ceil(numel/W) from each rank, padding at the end, no gaps
        assert all(len(o["fp32_flat_groups"]) == 1 for o in osd), "one sub-group only here"
        flats = {"fp32": [o["fp32_flat_groups"][0] for o in osd]}
        for k in ("exp_avg", "exp_avg_sq"):
            flats[k] = [o["optimizer_state_dict"]["state"][0][k] for o in osd]
        off = 0
        for shapes in ms["param_shapes"]:
            for name, shape in shapes.items():
                n = math.prod(shape)
                pn = -(-n // W)
                for k, fl in flats.items():
                    out[(name, k)] = torch.cat([f[off:off + pn] for f in fl])[:n].view(shape)
                off += pn
        assert off == flats["fp32"][0].numel(), "%s: consumed %d of %d" % (d, off,
                                                                         flats["fp32"][0].numel())
        return out
    # stage 1/2 and BF16_Optimizer: the fp32 partitions are stripped of their padding, the Adam
    # moments are not (group_paddings says how much of each rank's tail is padding)
    for g, shapes in enumerate(ms["param_shapes"]):
        pads = osd[0].get("param_alignment_paddings", [[0] * len(shapes)] * (g + 1))[g]
        full = {"fp32": torch.cat([o["single_partition_of_fp32_groups"][g] for o in osd])}
        for k in ("exp_avg", "exp_avg_sq"):
            parts = []
            for o in osd:
                t = o["base_optimizer_state"]["state"][g][k]
                parts.append(t[:t.numel() - o["group_paddings"][g]])
            full[k] = torch.cat(parts)
        off = 0
        for (name, shape), pad in zip(shapes.items(), pads):
            n = math.prod(shape)
            for k, fl in full.items():
                out[(name, k)] = fl[off:off + n].view(shape)
            off += n + pad
        assert off == full["fp32"].numel(), "%s: consumed %d of %d" % (d, off,
                                                                     full["fp32"].numel())
    return out


def cmd_rebuild(d):
    from safetensors.torch import load_file
    ref = load_file(os.path.join(d, "ref", "model.safetensors"))
    opt = load_file(os.path.join(d, "ref", "optim.safetensors"))
    out = ds_rebuild(d)
    worst = 0.0
    for (name, k), t in out.items():
        r = ref[name] if k == "fp32" else opt[name + "." + k]
        worst = max(worst, float((t.float() - r).abs().max()))
    say("%s: %d parameters and their Adam moments rebuilt from the rank files, max |diff| "
        "from ref/ %g" % (d, len(out) // 3, worst))
    return 0 if worst == 0.0 else 1


def main():
    out = sys.stdout
    # DeepSpeed logs to stdout: everything but the one line of what was written goes to stderr
    sys.stdout = sys.stderr
    try:
        return run()
    finally:
        sys.stdout = out


def say(line):
    sys.__stdout__.write(line + "\n")
    sys.__stdout__.flush()


def run():
    import argparse
    if len(sys.argv) >= 2 and sys.argv[1] == "damage" and len(sys.argv) == 5:
        return cmd_damage(*sys.argv[2:])
    if len(sys.argv) == 3 and sys.argv[1] == "inspect":
        return cmd_inspect(sys.argv[2])
    if len(sys.argv) in (4, 6) and sys.argv[1] == "universal":
        if len(sys.argv) == 6 and sys.argv[4] != "--load":
            raise SystemExit("foreign_ckpt.py universal SRC DST [--load W]")
        return cmd_universal(sys.argv[2], sys.argv[3], int(sys.argv[5]) if len(sys.argv) == 6
                             else None)
    if len(sys.argv) == 3 and sys.argv[1] == "rebuild":
        return cmd_rebuild(sys.argv[2])
    ap = argparse.ArgumentParser(usage=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ds = sub.add_parser("ds")
    ds.add_argument("outdir")
    ds.add_argument("--model", choices=("gpt2", "llama"), required=True)
    ds.add_argument("--stage", type=int, choices=(1, 2, 3), required=True)
    ds.add_argument("--dtype", choices=("fp32", "bf16"), required=True)
    ds.add_argument("--world", type=int, default=2)
    ds.add_argument("--steps", type=int, default=2)
    ds.add_argument("--grad-accum", choices=("same", "fp32"), default="same")
    ds.add_argument("--size", choices=("tiny", "124m"), default="tiny")
    ds.add_argument("--no-ref", action="store_true")
    ds.add_argument("--next-token", type=int)
    ds.add_argument("--weight-decay", type=float, default=WD)
    dc = sub.add_parser("dcp")
    dc.add_argument("outdir")
    dc.add_argument("--model", choices=("gpt2", "llama"), required=True)
    dc.add_argument("--world", type=int, default=2)
    dc.add_argument("--steps", type=int, default=2)
    dc.add_argument("--optim", action="store_true")
    dc.add_argument("--next-token", type=int)
    dc.add_argument("--weight-decay", type=float, default=WD)
    a = ap.parse_args()
    a.outdir = os.path.abspath(a.outdir)
    return cmd_ds(a) if a.cmd == "ds" else cmd_dcp(a)


if __name__ == "__main__":
    sys.exit(main())
