#!/usr/bin/env bash
# tests/gpu/run.sh: build the CUDA backend (build/libzr_cuda.so) and the GPU checks
# (build/gpu_kernels, tests/gpu/kernels.c), then run them all: every layer's kernels forward and
# backward against CPU references, AdamW and the norm bit for bit, the device model against
# core/model/model.c, 30 training steps against the CPU engine's arithmetic, NCCL; then the engine
# through zrun (tests/gpu/engine.sh: GPU vs CPU losses, world 2 sharing the GPU at stages 0-3,
# the pinned-memory optimizer, a checkpoint GPU -> CPU -> GPU). Well under the 8 minutes the
# issue allows (a minute of GPU work; the build takes the most).
#
# usage: tests/gpu/run.sh [--no-build] [--quick] [--only NAME]
#   --no-build   use the binaries already in build/ (a machine that cannot run make deps)
#   the rest goes to build/gpu_kernels
# Without nvcc, or without a GPU, it prints one "skip:" line and exits 0. BUILD_JOBS sets
# make's -j (default: the CPU count).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=1
args=()
for a in "$@"; do
    if [ "$a" = --no-build ]; then build=0; else args+=("$a"); fi
done
start=$(date +%s)
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
if [ "$build" = 1 ]; then
    if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
        echo "skip: no nvcc on this machine: the CUDA backend cannot be built here"
        exit 0
    fi
    jobs=${BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
    echo "== build: make -j$jobs all build/libzr_cuda.so build/gpu_kernels"
    log=$(mktemp)
    if ! make -j"$jobs" all build/libzr_cuda.so build/gpu_kernels >"$log" 2>&1; then
        tail -n 40 "$log"
        rm -f "$log"
        echo "FAIL: the build failed"
        exit 1
    fi
    rm -f "$log"
    echo "   built in $(( $(date +%s) - start )) s"
fi
for f in build/libzr_cuda.so build/gpu_kernels; do
    [ -e "$f" ] || { echo "FAIL: $f is missing (run without --no-build)"; exit 1; }
done
echo "== GPU checks: build/gpu_kernels ${args[*]:-}"
set +e
timeout 420 build/gpu_kernels "${args[@]}"
rc=$?
set -e
case $rc in
0) echo "== every kernel check passed ($(( $(date +%s) - start )) s so far)" ;;
77) echo "(nothing run: no usable GPU here)"; exit 0 ;;
124) echo "FAIL: the GPU checks ran past 7 minutes"; exit 1 ;;
*) echo "FAIL: GPU kernel checks failed (exit $rc); the engine checks run all the same" ;;
esac
left=$(( 460 - ($(date +%s) - start) ))
[ $left -gt 30 ] || { echo "FAIL: no time left for the engine checks"; exit 1; }
set +e
timeout $left tests/gpu/engine.sh
erc=$?
set -e
[ $erc = 124 ] && echo "FAIL: the engine checks ran out of time"
if [ $rc = 0 ] && [ $erc = 0 ]; then
    echo "== every GPU check passed ($(( $(date +%s) - start )) s in all)"
    exit 0
fi
exit 1
