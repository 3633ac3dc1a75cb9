#!/usr/bin/env bash
# offload_bench.sh: part of `make bench` (issue 6). In one run, on the filesystem of BENCH_DIR:
#   - the swapper's sustained write and read bandwidth (build/swap_bench: zck_swap, 1 MiB
#     requests, 16 in flight, non-zero data) against fio --ioengine=libaio --direct=1 --bs=1M
#     --iodepth=16 on the same path and size (target >= 0.85);
#   - GPT-2 124M at W=2, stage 3, 1 thread per rank, batch 4 x 64: step time with the optimizer
#     states on NVMe, and with optimizer states and parameters on NVMe, as ratios to no offload
#     (targets <= 1.3 and <= 1.6), and rank 0's peak RSS for each.
# A benchmark: prints PASS/BELOW and exits 0 either way, non-zero only when a command fails.
#   ZRUN, SWAP_BENCH   binaries (default build/zrun, build/swap_bench, brought up to date)
#   BENCH_DIR          scratch directory (build/bench-scratch)
#   SWAP_MIB           size of the bandwidth test (1024)
#   STEPS, WARMUP      steps per run (6) and leading steps not averaged (2)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" offload-bench
SWAP_MIB=${SWAP_MIB:-1024}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
[[ $SWAP_MIB =~ ^[1-9][0-9]*$ && $STEPS =~ ^[1-9][0-9]*$ && $WARMUP =~ ^[0-9]+$ ]] ||
    fail "SWAP_MIB, STEPS and WARMUP must be integers"
((STEPS > WARMUP)) || fail "STEPS must exceed WARMUP"
if [ -z "${ZRUN:-}" ] || [ -z "${SWAP_BENCH:-}" ]; then
    make -C "$root" --no-print-directory build/zrun build/swap_bench >/dev/null ||
        fail "make failed"
fi
ZRUN=${ZRUN:-$root/build/zrun}
SWAP_BENCH=${SWAP_BENCH:-$root/build/swap_bench}
if ! command -v fio >/dev/null; then
    command -v apt-get >/dev/null || fail "fio is missing and apt-get is not available"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    say "fio is missing: installing it with apt-get"
    $sudo apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
        $sudo apt-get install -y -q fio >/dev/null || fail "apt-get install fio failed"
fi
scratch offload
say "scratch $s on $(df -PT "$s" | awk 'NR == 2 {print $1 " (" $2 ")"}'), $(nproc) CPUs"

# ---- bandwidth: fio and the swapper, same path, size, request size and depth
fio_bw() { # rw -> bytes/s
    fio --name=w --ioengine=libaio --direct=1 --bs=1M --iodepth=16 --rw="$1" \
        --size="${SWAP_MIB}M" --numjobs=1 --refill_buffers --filename="$s/fio.dat" \
        --output-format=json | python3 -c '
import json, sys
t = sys.stdin.read(); j = json.loads(t[t.find("{"):])
print(j["jobs"][0][sys.argv[1]]["bw_bytes"])' "$1"
}
fw=$(fio_bw write)
fr=$(fio_bw read)
rm -f "$s/fio.dat"
out=$("$SWAP_BENCH" "$s/swap.dat" "$SWAP_MIB" 1048576 16) || fail "swap_bench failed"
sw=$(echo "$out" | awk '$2 == "write" {print $3}')
sr=$(echo "$out" | awk '$2 == "read" {print $3}')
sd=$(echo "$out" | awk '$2 == "direct" {print $3}')
python3 - "$fw" "$fr" "$sw" "$sr" "$sd" <<'EOF'
import sys
fw, fr, sw, sr = (float(x) for x in sys.argv[1:5])
print("[offload-bench] swap files %s" % ("O_DIRECT" if sys.argv[5] == "1" else "buffered"))
for name, f, z in (("write", fw, sw), ("read", fr, sr)):
    r = z / f
    print("[offload-bench] %-5s swapper %7.0f MB/s, fio %7.0f MB/s: %.2f (target >= 0.85) %s" %
          (name, z / 1e6, f / 1e6, r, "PASS" if r >= 0.85 else "BELOW"))
EOF

# ---- training: 124M, W=2, stage 3
run() { # name extra-args...
    local name=$1
    shift
    "$ZRUN" --model gpt2 --nproc 2 --zero 3 --threads 1 --batch 4 --seq 64 --steps "$STEPS" \
        --warmup 1 --ckpt-dir "$s/run-$name" --log-json "$s/$name.jsonl" "$@" \
        >"$s/$name.log" 2>&1 || { cat "$s/$name.log" >&2; fail "run $name failed"; }
    rm -rf "$s/run-$name"
}
say "GPT-2 124M, W=2, stage 3, 1 thread per rank, batch 4 x 64, $STEPS steps ($WARMUP not averaged)"
run none
run opt --offload-optimizer nvme --nvme-path "$s/swap"
run all --offload-optimizer nvme --offload-params nvme --nvme-path "$s/swap"
python3 - "$s" "$WARMUP" "$fw" "$fr" <<'EOF'
import json, sys
d, w = sys.argv[1], int(sys.argv[2])
fio = (float(sys.argv[3]) + float(sys.argv[4])) / 2
res = {}
for name in ("none", "opt", "all"):
    rows = [json.loads(l) for l in open("%s/%s.jsonl" % (d, name))]
    ms = [r["step_ms"] for r in rows[w:]]
    res[name] = (sum(ms) / len(ms), rows[-1]["rss_peak"], rows[-1]["mem"]["nvme"])
base = res["none"][0]
print("[offload-bench] offload              step ms  vs none  peak RSS rank 0 (MiB)  on NVMe (MiB)")
for name, label, target in (("none", "none", None), ("opt", "optimizer", 1.3),
                            ("all", "optimizer + params", 1.6)):
    ms, rss, nv = res[name]
    verdict = "" if target is None else ("(target <= %.1f) %s" % (target, "PASS" if ms / base <= target else "BELOW"))
    print("[offload-bench] %-20s %7.0f  %7.2f  %21.0f  %13.0f  %s" %
          (label, ms, ms / base, rss / 2**20, nv / 2**20, verdict))
# swap traffic per step and rank: the optimizer states (2/3 of the swap when the parameters
# are there too) read and written once; the parameters read and written by the update and
# read by the forward's and the backward's gathers
for name, label in (("opt", "optimizer"), ("all", "optimizer + params")):
    ms, rss, nv = res[name]
    o = nv if name == "opt" else nv * 2 / 3
    p = 0 if name == "opt" else nv / 3
    moved = 2 * (2 * o + 4 * p)  # 2 ranks
    print("[offload-bench] %-20s swap traffic %5.0f MB per step: %5.0f MB/s over the step, "
          "%.2f of fio's %4.0f MB/s (mean of read and write)" %
          (label, moved / 1e6, moved / (ms / 1e3) / 1e6, moved / (ms / 1e3) / fio, fio / 1e6))
EOF
