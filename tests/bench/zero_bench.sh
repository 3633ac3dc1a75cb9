#!/usr/bin/env bash
# zero_bench.sh: part of `make bench` (issue 5). In one run, on this machine's CPUs:
#   - GPT-2 124M at W=2 ranks (zrun --nproc 2, 1 thread per rank), batch 4 x 64 tokens, stages
#     0, 1, 2, 3: tokens/s (mean of the steps after WARMUP, from --log-json) as a ratio to stage
#     0 (target: stage 3 >= 0.85), and rank 0's peak RSS (the JSON log's rss_peak) against the
#     model-state formula (16, 4+4+8/W, 4+12/W, 16/W bytes per parameter);
#   - the collectives on 256 MiB against memcpy (build/comm_bench), when it is built.
# A benchmark: prints PASS/BELOW and exits 0 either way, non-zero only when a command fails.
#   ZRUN       the zrun binary (default: build/zrun, brought up to date with make)
#   STEPS      steps per stage (6), WARMUP leading steps not averaged (2)
#   BENCH_DIR  scratch directory (build/bench-scratch); checkpoints are deleted after each stage
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" zero-bench
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
[[ $STEPS =~ ^[1-9][0-9]*$ && $WARMUP =~ ^[0-9]+$ ]] || fail "STEPS and WARMUP must be integers"
((STEPS > WARMUP)) || fail "STEPS must exceed WARMUP"
need_zrun
scratch zero
numel=$("$ZRUN" --dry-run --model gpt2 --nproc 2 --batch 4 --seq 64 --resume never \
    --ckpt-dir "$s/none" | sed -n 's/.*layers, \([0-9]*\) parameters.*/\1/p')
[ -n "$numel" ] || fail "zrun --dry-run did not give the parameter count"
say "GPT-2 124M, W=2, 1 thread per rank, batch 4 x 64, $STEPS steps per stage ($WARMUP not averaged)"
declare -A tps rss
for stage in 0 1 2 3; do
    "$ZRUN" --model gpt2 --nproc 2 --zero "$stage" --threads 1 --batch 4 --seq 64 \
        --steps "$STEPS" --warmup 1 --ckpt-dir "$s/run$stage" --log-json "$s/s$stage.jsonl" \
        >"$s/s$stage.log" 2>&1 || { cat "$s/s$stage.log" >&2; fail "stage $stage run failed"; }
    read -r t r < <(python3 - "$s/s$stage.jsonl" "$WARMUP" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
w = int(sys.argv[2])
xs = [r["tokens_per_s"] for r in rows[w:]]
print(sum(xs) / len(xs), rows[-1]["rss_peak"])
EOF
)
    tps[$stage]=$t
    rss[$stage]=$r
    rm -rf "$s/run$stage"
done
python3 - "$numel" "${tps[0]}" "${tps[1]}" "${tps[2]}" "${tps[3]}" \
    "${rss[0]}" "${rss[1]}" "${rss[2]}" "${rss[3]}" <<'EOF'
import sys
n = int(sys.argv[1]); t = [float(x) for x in sys.argv[2:6]]; r = [int(x) for x in sys.argv[6:10]]
W = 2
f = [16, 4 + 4 + 8 / W, 4 + 12 / W, 16 / W]
print("[zero-bench] stage  tokens/s  vs stage 0  peak RSS rank 0 (MiB)  formula (MiB)  RSS/formula")
for s in range(4):
    print("[zero-bench] %5d %9.1f %11.2f %22.0f %14.0f %12.2f" %
          (s, t[s], t[s] / t[0], r[s] / 2**20, f[s] * n / 2**20, r[s] / (f[s] * n)))
ratio = t[3] / t[0]
print("[zero-bench] stage 3 / stage 0 tokens/s: %.2f (target >= 0.85): %s" %
      (ratio, "PASS" if ratio >= 0.85 else "BELOW"))
EOF
if [ -x "$root/build/comm_bench" ]; then
    "$root/build/comm_bench"
else
    say "build/comm_bench not built: collective bandwidth skipped"
fi
