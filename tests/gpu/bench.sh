#!/usr/bin/env bash
# tests/gpu/bench.sh: one GPU, bf16 mixed precision, GPT-2 124M ("gpt2") and 350M
# ("gpt2-medium"): a training step (forward + backward + norm + AdamW, everything on the GPU,
# what a stage-0 rank does at world 1) in tokens/s, MFU against the bf16 dense peak (989 TFLOP/s:
# H100/H200 SXM; PEAK_TFLOPS=... for another GPU) and the memory held; then the same through
# the engine (zrun --device cuda) at ZeRO stages 0 and 3: tokens/s, MFU and the GPU memory a
# rank holds by category against the ZeRO formula (16 bytes per parameter of fp32 states at
# world 1, divided over the world by stage).
#
# usage: tests/gpu/bench.sh [--no-build]; STEPS (default 20), PEAK_TFLOPS.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" != --no-build ]; then
    if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
        echo "skip: no nvcc on this machine: the CUDA backend cannot be built here"
        exit 0
    fi
    make -j"$(nproc 2>/dev/null || echo 2)" all build/libzr_cuda.so build/gpu_bench >/dev/null
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
fi
steps=${STEPS:-20}
peak=${PEAK_TFLOPS:-989}
run() {
    set +e
    build/gpu_bench --steps "$steps" --peak-tflops "$peak" "$@"
    local rc=$?
    set -e
    if [ $rc = 77 ]; then exit 0; fi
    if [ $rc != 0 ]; then echo "FAIL: gpu_bench $* (exit $rc)"; exit 1; fi
}
echo "== GPT-2 124M"
run --model gpt2 --batch 16 --seq 1024
echo "== GPT-2 124M, activation checkpointing (step time against the run above)"
run --model gpt2 --batch 16 --seq 1024 --recompute layer
run --model gpt2 --batch 16 --seq 1024 --recompute selective
echo "== GPT-2 350M"
run --model gpt2-medium --batch 8 --seq 1024
run --model gpt2-medium --batch 16 --seq 1024

# the engine: zrun on the GPU, stages 0 and 3, world 1 (the median of the steps after the
# first 3). Model FLOPs per token: 6 (12 L C^2 + V C) + 12 L T C.
engine() { # spec L C batch stage
    local dir
    dir=$(mktemp -d /tmp/zr-gpu-bench.XXXXXX)
    if ! "${ZRUN:-build/zrun}" --device cuda --model "$1" --zero "$5" --batch "$4" --seq 1024 \
        --steps $((steps + 3)) --save-every 0 --resume never --ckpt-dir "$dir/ck" \
        --log-json "$dir/log.json" >"$dir/out" 2>&1; then
        tail -n 5 "$dir/out"; echo "FAIL: zrun --device cuda --model $1 --zero $5"
        rm -rf "$dir"; exit 1
    fi
    awk -v L="$2" -v C="$3" -v peak="$peak" -v spec="$1" -v B="$4" -v st="$5" '
        { match($0, /"tokens_per_s":[0-9.]+/); t = substr($0, RSTART + 15, RLENGTH - 15)
          if (NR > 3) tps[++n] = t
          for (k = split("params grads optimizer buffers activations", f, " "); k > 0; k--) {
              if (match($0, "\"" f[k] "\":[0-9]+")) m[f[k]] = substr($0, RSTART + length(f[k]) + 3, RLENGTH - length(f[k]) - 3) } }
        END { for (i = 2; i <= n; i++) for (j = i; j > 1 && tps[j - 1] > tps[j]; j--) {
                  x = tps[j]; tps[j] = tps[j - 1]; tps[j - 1] = x }
              med = tps[int((n + 1) / 2)]
              V = 50257; T = 1024; fl = 6 * (12 * L * C * C + V * C) + 12 * L * T * C
              P = 12 * L * C * C + 13 * L * C + (V + T) * C + 2 * C
              gib = 1073741824
              printf "engine %s B %d stage %d: %.0f tokens/s, MFU %.1f %% | GPU GiB params %.2f grads %.2f optimizer %.2f buffers %.2f activations %.2f | states %.2f GiB vs formula 16 B x %.0f M params = %.2f GiB\n",
                     spec, B, st, med, 100 * med * fl / (peak * 1e12),
                     m["params"] / gib, m["grads"] / gib, m["optimizer"] / gib, m["buffers"] / gib,
                     m["activations"] / gib, (m["params"] + m["grads"] + m["optimizer"]) / gib,
                     P / 1e6, 16 * P / gib }' "$dir/log.json"
    rm -rf "$dir"
}
echo "== the engine (zrun --device cuda), world 1"
for st in 0 3; do
    engine gpt2 12 768 16 $st
    engine gpt2-medium 24 1024 8 $st
done
