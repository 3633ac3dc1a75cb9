#!/usr/bin/env bash
# train_bench.sh: part of `make bench` (issue 4). In one run, on this machine's CPUs:
#   - zero: tokens/s of build/zrun on the tiny config (batch 8 x 128 tokens) and on GPT-2 124M
#     (batch 4 x 64 tokens), fp32, BENCH_THREADS threads (2), the first WARMUP (2) steps
#     excluded, read from zrun's --log-json; peak RSS of the 124M run (/usr/bin/time %M)
#     against 16 bytes/param + activations;
#   - zero on the Llama family (issue 17): llama-tiny (batch 8 x 128) and llama-124m (layers 12,
#     heads 12, kv_heads 4, dim 768, ffn 2048, vocab 32000, untied: 124.7M parameters; batch
#     4 x 64), against tests/bench/torch_llama.py (the same Llama, the same loop and variants);
#   - PyTorch: tests/bench/torch_gpt2.py (the same GPT-2, nanoGPT style, AdamW fp32) on the
#     same configs and thread count, best of a few variants (attention through SDPA or
#     written out, fused or foreach AdamW), run with GLIBC_TUNABLES=glibc.malloc.hugetlb=1;
#     torch comes from a venv under build/ (installed with pip on first use), else from
#     Debian's python3-torch; without torch that comparison is skipped;
#   - OpenBLAS: the 2-thread sgemm GFLOP/s (tests/bench/sgemm_bench.c, built here by hand),
#     and zero's 124M model-FLOPs rate as a fraction of it.
# Targets (issues 4, 16, 17): zero tokens/s >= 1.3x PyTorch's on every config; zero's 124M model-FLOPs
# rate >= 65% of the best sgemm rate. A benchmark: prints PASS/BELOW and exits 0 either way,
# non-zero only when a command fails.
#   ZRUN           the zrun binary to measure (default: build/zrun, brought up to date with make)
#   BENCH_THREADS  threads for zero, torch and the sgemm probe (2)
#   BENCH_DIR      scratch directory (build/bench-scratch); the 124M checkpoint (~1.5 GB) that
#                  zrun saves at the end is written there and deleted
#   TINY_STEPS, GPT2_STEPS, WARMUP   steps per run (12, 6) and leading steps not averaged (2)
#   FAMILIES       the families measured, comma separated (gpt2,llama); the sgemm fraction
#                  needs gpt2
#   ROUNDS         zero and torch alternate this many times (2); each side's best round counts
#   IDLE_WAIT      seconds each measurement waits for the CPUs to be idle, < 15% busy (60; 0: none)
#   TORCH_PYTHON   a python3 that imports torch (skips the venv lookup and install)
#   TORCH_VENV     the venv to use or create (build/torch-venv); before creating it, the oracle
#                  venv build/venv is used when `make oracle-venv` installed torch there
#   TORCH_INSTALL  0: never install torch (pip or apt); the comparison is skipped without it
#   TORCH_VARIANTS torch_gpt2.py --variants (sdpa-foreach,sdpa-fused,manual-fused; the best
#                  counts; compile-sdpa-fused adds torch.compile, ~80 s of compiling for 124M)
# The step logs of the last run are kept in build/train-bench/.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" train-bench
BENCH_THREADS=${BENCH_THREADS:-2}
TINY_STEPS=${TINY_STEPS:-12}
GPT2_STEPS=${GPT2_STEPS:-6}
WARMUP=${WARMUP:-2}
TORCH_VENV=${TORCH_VENV:-$root/build/torch-venv}
TORCH_INSTALL=${TORCH_INSTALL:-1}
TORCH_VARIANTS=${TORCH_VARIANTS:-sdpa-foreach,sdpa-fused,manual-fused}
ROUNDS=${ROUNDS:-2}
FAMILIES=${FAMILIES:-gpt2,llama}
IDLE_WAIT=${IDLE_WAIT:-60}
LOGS=$root/build/train-bench


for v in BENCH_THREADS TINY_STEPS GPT2_STEPS ROUNDS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || fail "$v=${!v}: expected a positive integer"
done
[[ $WARMUP =~ ^[0-9]+$ ]] || fail "WARMUP=$WARMUP: expected an integer"
[[ $IDLE_WAIT =~ ^[0-9]+$ ]] || fail "IDLE_WAIT=$IDLE_WAIT: expected an integer (seconds)"
((TINY_STEPS > WARMUP && GPT2_STEPS > WARMUP)) || fail "TINY_STEPS and GPT2_STEPS must exceed WARMUP"
[[ $FAMILIES =~ ^(gpt2|llama)(,(gpt2|llama))*$ ]] ||
    fail "FAMILIES=$FAMILIES: expected gpt2, llama or both, comma separated"
mkdir -p "$BENCH_DIR" "$LOGS"
rm -f "$LOGS"/*
if [ -z "${ZRUN:-}" ]; then
    make -C "$root" --no-print-directory build/zrun >"$LOGS/make.log" 2>&1 ||
        { cat "$LOGS/make.log" >&2; fail "make build/zrun failed"; }
    ZRUN=$root/build/zrun
    zdesc="$ZRUN (tree $(git -C "$root" describe --always --dirty 2>/dev/null || echo '?'))"
else
    zdesc=$ZRUN
fi
[ -x "$ZRUN" ] || fail "$ZRUN: not an executable"
command -v python3 >/dev/null || fail "python3 is needed to read the logs"
pkg-config --exists openblas 2>/dev/null || fail "OpenBLAS (libopenblas-dev) is needed for the sgemm probe"
apt_install() { # apt_install PKG...: quietly, as root or through sudo; fails when it cannot
    command -v apt-get >/dev/null || return 1
    local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -q >/dev/null 2>&1 || return 1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@" >/dev/null 2>&1
}
if [ ! -x /usr/bin/time ]; then
    say "GNU time is missing: installing it with apt-get"
    apt_install time || fail "apt-get install time failed (GNU time measures the peak RSS)"
fi

s=$(mktemp -d "$BENCH_DIR/train.XXXXXX")
trap 'rm -rf "$s"' EXIT
say "zrun: $zdesc"

# ------------------------------------------------------------------ torch
torch_py=""
has_torch() { "$1" -c 'import torch' >/dev/null 2>&1; }
if [ -n "${TORCH_PYTHON:-}" ]; then
    has_torch "$TORCH_PYTHON" || fail "TORCH_PYTHON=$TORCH_PYTHON cannot import torch"
    torch_py=$TORCH_PYTHON
elif [ -x "$TORCH_VENV/bin/python" ] && has_torch "$TORCH_VENV/bin/python"; then
    torch_py=$TORCH_VENV/bin/python
elif [ -x "$root/build/venv/bin/python" ] && has_torch "$root/build/venv/bin/python"; then
    torch_py=$root/build/venv/bin/python
elif [ "$TORCH_INSTALL" != 0 ]; then
    say "installing torch from PyPI into $TORCH_VENV (once; several GB: the PyPI wheel brings CUDA libraries)"
    if { [ -x "$TORCH_VENV/bin/pip" ] || python3 -m venv "$TORCH_VENV" >/dev/null 2>&1 ||
         { apt_install python3-venv && python3 -m venv "$TORCH_VENV"; }; } &&
        "$TORCH_VENV/bin/pip" install -q torch numpy >"$LOGS/pip.log" 2>&1 &&
        has_torch "$TORCH_VENV/bin/python"; then
        torch_py=$TORCH_VENV/bin/python
    elif has_torch /usr/bin/python3 || { say "pip failed (see $LOGS/pip.log): trying Debian's python3-torch" &&
         apt_install python3-torch libopenblas0-openmp && has_torch /usr/bin/python3; }; then
        # Debian's torch falls back to a slow reference BLAS unless an optimized one is installed
        torch_py=/usr/bin/python3
    fi
fi
if [ -n "$torch_py" ]; then
    say "torch: $("$torch_py" -c 'import torch; print(torch.__version__)') ($torch_py)"
else
    say "torch is not available (TORCH_INSTALL=$TORCH_INSTALL): the PyTorch comparison is skipped"
fi

# ------------------------------------------------------------------ measurements
# busy: percent of the CPUs' time spent outside idle over one second (nothing of ours runs then)
busy() {
    local a b
    read -r -a a < <(grep '^cpu ' /proc/stat); sleep 1; read -r -a b < <(grep '^cpu ' /proc/stat)
    local tot=0 idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) i
    for i in 1 2 3 4 5 6 7 8; do tot=$((tot + b[i] - a[i])); done
    echo $(( tot > 0 ? 100 * (tot - idle) / tot : 0 ))
}
# wait_idle NAME: wait up to IDLE_WAIT seconds for the CPUs to be idle (< 15% busy), log the
# busy figure the measurement NAME started with
wait_idle() {
    local waited=0 b
    b=$(busy)
    while ((b >= 15 && waited < IDLE_WAIT)); do sleep 4; waited=$((waited + 5)); b=$(busy); done
    echo "$1 $b $waited" >>"$LOGS/busy.txt"
    ((b < 15)) || say "  (the machine is $b% busy with other work after ${waited} s of waiting: figures skewed)"
}
say "load average before: $(cut -d' ' -f1-3 /proc/loadavg); each measurement waits up to ${IDLE_WAIT} s for idle CPUs"
cc -O2 "$here/sgemm_bench.c" $(pkg-config --cflags --libs openblas) -o "$root/build/sgemm_bench"
say "sgemm probe: OpenBLAS, $BENCH_THREADS threads"
wait_idle sgemm
"$root/build/sgemm_bench" "$BENCH_THREADS" 1.0 | tee "$LOGS/sgemm.txt" | sed 's/^/    /'

zrun_bench() { # zrun_bench NAME STEPS ARGS...: a fresh run in scratch, log and peak RSS kept
    local name=$1 steps=$2; shift 2
    wait_idle "$name"
    rm -rf "$s/$name"
    /usr/bin/time -f '%e %M' -o "$LOGS/$name.time" "$ZRUN" "$@" --steps "$steps" \
        --resume never --ckpt-dir "$s/$name" --log-json "$LOGS/$name.jsonl" \
        --threads "$BENCH_THREADS" >"$LOGS/$name.out" 2>&1 ||
        { cat "$LOGS/$name.out" >&2; fail "zrun $* failed"; }
    rm -rf "$s/$name" # the 124M checkpoint is ~1.5 GB
}
torch_bench() { # torch_bench NAME SCRIPT ARGS...: SCRIPT torch_gpt2.py or torch_llama.py
    local name=$1 script=$2; shift 2
    [ -n "$torch_py" ] || return 0
    wait_idle "$name"
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "$torch_py" "$here/$script" "$@" \
        --threads "$BENCH_THREADS" --warmup "$WARMUP" --variants "$TORCH_VARIANTS" \
        >"$LOGS/$name.jsonl" 2>"$LOGS/$name.err" ||
        { cat "$LOGS/$name.err" >&2; fail "$script $* failed"; }
}
# zero and torch alternate, ROUNDS times, so that other work on the machine hits both alike
# pair CFG ZRUN_MODEL SCRIPT TORCH_MODEL B T STEPS: one round of zero then torch on a config
pair() {
    local cfg=$1 zm=$2 script=$3 tm=$4 b=$5 t=$6 steps=$7
    say "round $r/$ROUNDS: zero $cfg (zrun --model $zm --batch $b --seq $t, $steps steps)"
    zrun_bench "zero-$cfg.$r" "$steps" --model "$zm" --batch "$b" --seq "$t"
    [ -z "$torch_py" ] || say "round $r/$ROUNDS: torch $cfg ($script, variants $TORCH_VARIANTS)"
    torch_bench "torch-$cfg.$r" "$script" --model "$tm" --batch "$b" --seq "$t" --steps "$steps"
}
for r in $(seq 1 "$ROUNDS"); do
    if [[ ,$FAMILIES, == *,gpt2,* ]]; then
        pair tiny tiny torch_gpt2.py tiny 8 128 "$TINY_STEPS"
        pair gpt2 gpt2 torch_gpt2.py gpt2 4 64 "$GPT2_STEPS"
    fi
    if [[ ,$FAMILIES, == *,llama,* ]]; then
        pair llama-tiny llama-tiny torch_llama.py tiny 8 128 "$TINY_STEPS"
        pair llama-124m llama-124m torch_llama.py 124m 4 64 "$GPT2_STEPS"
    fi
done
say "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# ------------------------------------------------------------------ report
python3 - "$LOGS" "$WARMUP" "$BENCH_THREADS" "$ROUNDS" "${torch_py:+1}" "$FAMILIES" <<'PY'
import json, os, sys
logs, warmup, threads, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
have_torch, families = sys.argv[5] == "1", sys.argv[6].split(",")

def jl(name):
    return [json.loads(l) for l in open(os.path.join(logs, name)) if l.strip().startswith("{")]

def zero(cfg):
    """per round: (mean tokens/s of the steps after warmup, mean step ms, mem, wall s, RSS KiB)"""
    out = []
    for r in range(1, rounds + 1):
        steps = jl(f"zero-{cfg}.{r}.jsonl")
        timed = [x for x in steps if x["step"] > warmup]
        secs, rss = open(os.path.join(logs, f"zero-{cfg}.{r}.time")).read().split()
        out.append((sum(x["tokens_per_s"] for x in timed) / len(timed),
                    sum(x["step_ms"] for x in timed) / len(timed), steps[-1]["mem"],
                    float(secs), int(rss)))
    return out

def torch(cfg):
    """best tokens/s over rounds and variants, and each variant's figure per round"""
    if not have_torch:
        return None, {}
    per = {}
    for r in range(1, rounds + 1):
        for x in jl(f"torch-{cfg}.{r}.jsonl"):
            if x.get("summary"):
                per.setdefault(x["variant"], []).append(f"{x['tokens_per_s']:.0f}")
            elif "error" in x:
                per.setdefault(x["variant"], []).append("failed: " + x["error"])
    rates = [float(v) for vs in per.values() for v in vs if not v.startswith("failed")]
    return (max(rates) if rates else None), {k: "/".join(v) for k, v in per.items()}

sg = {l.split()[0]: float(l.split()[1]) for l in open(os.path.join(logs, "sgemm.txt"))
      if l.split()[0] in ("best", "mix124m")}
busy = [l.split() for l in open(os.path.join(logs, "busy.txt"))]

def ratio_line(what, z, t, need):
    if t is None:
        return f"  {what:<24} zero {z:8.1f} tok/s   torch  (skipped: no torch)"
    r = z / t
    return (f"  {what:<24} zero {z:8.1f} tok/s   torch {t:8.1f} tok/s   ratio {r:5.2f}  "
            f"target >= {need}x  {'PASS' if r >= need else 'BELOW'}")

print(f"[train-bench] results: {threads} threads, fp32; tokens/s = mean over the steps after the "
      f"first {warmup}, best of {rounds} round(s) (and, for torch, of its variants)")
CONFIGS = {"gpt2": [("tiny", "tiny B=8 T=128"), ("gpt2", "gpt2 124M B=4 T=64")],
           "llama": [("llama-tiny", "llama-tiny B=8 T=128"), ("llama-124m", "llama-124m B=4 T=64")]}
for fam in families:
    for cfg, what in CONFIGS[fam]:
        zs = zero(cfg)
        t, v = torch(cfg)
        print(ratio_line(what, max(x[0] for x in zs), t, 1.3))
        print(f"      zero per round (tok/s): {'/'.join(f'{x[0]:.1f}' for x in zs)}, step "
              f"{min(x[1] for x in zs):.1f} ms; torch per variant and round: {v or '-'}")

def gpt2_report():
    zg = zero("gpt2")
    z_gpt = max(x[0] for x in zg)
    # GPT-2 124M at B=4, T=64 (nanoGPT's estimate_mfu, from the PaLM paper): per token
    # 6 N + 12 L C T, N the parameters less the position embedding (the tied wte counts: it is
    # the head's matmul); per step x B T tokens. The attention term counts the whole T x T.
    L, NH, C, V, CTX, B, T = 12, 12, 768, 50257, 1024, 4, 64
    n_params = (V + CTX + 2) * C + L * 12 * C * C + L * 13 * C
    n_flop = n_params - CTX * C
    flops_step = 6 * n_flop * B * T + 12 * L * C * T * T * B
    gflops = flops_step * (z_gpt / (B * T)) / 1e9
    frac = gflops / sg["best"]
    print(f"  124M model FLOPs: 6 x {n_flop/1e6:.2f}M params x {B*T} tokens + 12 x L x C x T^2 x B = "
          f"{flops_step/1e9:.1f} GFLOP/step -> zero {gflops:.1f} GFLOP/s")
    print(f"  sgemm ({threads} threads, OpenBLAS): best {sg['best']:.1f} GFLOP/s, 124M step mix "
          f"{sg['mix124m']:.1f} GFLOP/s; zero / best = {frac:.2f}  target >= 0.65  "
          f"{'PASS' if frac >= 0.65 else 'BELOW'}   (zero / mix = {gflops / sg['mix124m']:.2f})")
    # memory: params + grads + AdamW m and v = 16 bytes/param; activations as zero allocates them
    # (the log's mem.activations: since 769c986 the arena is sized for batch x --seq) and as B x T
    # needs them (the buffers of core/model/model.c's acts_layout at T)
    sixteen = 16 * n_params
    def acts(Tn):
        N = B * Tn
        per_layer = 16 * N * C + 4 * N + B * NH * Tn * Tn
        rows = min(max((1 << 24) // V, 1), N)
        return 4 * (L * per_layer + 2 * N * C + 2 * N + N * V + N + 2 * N + 9 * N * C + rows * V + 2 * Tn)
    rss = max(x[4] for x in zg) * 1024
    arena = zg[0][2]["activations"]
    print(f"  124M peak RSS {rss/2**30:.2f} GiB; 16 B/param {sixteen/2**30:.2f} GiB + activations "
          f"{arena/2**30:.2f} GiB as allocated = {(sixteen+arena)/2**30:.2f} GiB "
          f"(RSS / that = {rss/(sixteen+arena):.2f}); with activations for B x T={T} "
          f"({acts(T)/2**30:.2f} GiB): {(sixteen+acts(T))/2**30:.2f} GiB")
    print(f"  zrun 124M wall time {min(x[3] for x in zg):.1f} s for {len(jl('zero-gpt2.1.jsonl'))} "
          f"steps (init, steps, final checkpoint)")

if "gpt2" in families:
    gpt2_report()
print("  CPU busy with other work when each measurement started (%): " +
      ", ".join(f"{b[0]} {b[1]}" + (f" (after {b[2]} s)" if b[2] != "0" else "") for b in busy))
PY
