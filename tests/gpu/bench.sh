#!/usr/bin/env bash
# tests/gpu/bench.sh: one GPU, bf16 mixed precision, GPT-2 124M ("gpt2") and 350M
# ("gpt2-medium"): a training step (forward + backward + norm + AdamW, everything on the GPU,
# what a stage-0 rank does at world 1) in tokens/s, MFU against the bf16 dense peak (989 TFLOP/s:
# H100/H200 SXM; PEAK_TFLOPS=... for another GPU) and the memory held. At world 1 the ZeRO
# stages hold the same (16 bytes per parameter of fp32 states: stages divide it by the world
# size), so one run per model stands for stages 0-3 until the engine drives the GPU.
#
# usage: tests/gpu/bench.sh [--no-build]; STEPS (default 20), PEAK_TFLOPS.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" != --no-build ]; then
    if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
        echo "skip: no nvcc on this machine: the CUDA backend cannot be built here"
        exit 0
    fi
    make -j"$(nproc 2>/dev/null || echo 2)" build/libzr_cuda.so build/gpu_bench >/dev/null
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
echo "== GPT-2 350M"
run --model gpt2-medium --batch 8 --seq 1024
run --model gpt2-medium --batch 16 --seq 1024
