#!/usr/bin/env bash
# recompute_bench.sh (issue 26, activation checkpointing): in one run, on this machine's CPUs,
#   - activations per rank that `zrun --dry-run --json` predicts for GPT-2 124M at --seq 1024
#     --batch 16 --nproc 2 --zero 3 with --recompute none, selective and layer (micro-batch 8),
#     and layer at --micro-batch 4 (goal: layer <= 1.5 GB);
#   - the step time of layer and selective against none on MODEL (batch BATCH x SEQ, one rank,
#     BENCH_THREADS threads): ROUNDS rounds, each running the three modes one after the other
#     (STEPS steps, the first WARMUP excluded, the median step_ms of the JSON log); per round
#     the ratio mode / none; printed: the median ratio over the rounds with its min and max
#     (goal: layer <= 1.4x); the same for the CPU seconds of each whole run (user + system,
#     /usr/bin/time: less sensitive to other load on the machine than the wall clock, though
#     it includes the start and the final save, the same in every mode). Every mode's final
#     checkpoint must equal none's (zckpt diff). Also the ratio of each mode's fastest step over
#     all rounds to none's (the least disturbed by other work).
# A benchmark: prints PASS/BELOW and exits 0 either way, non-zero only when a command fails.
#   ZRUN           the zrun binary (default: build/zrun, brought up to date with make)
#   MODEL          (gpt2:layers=4,heads=4,dim=256,ctx=256,vocab=8192), SEQ (256), BATCH (4);
#                  MODEL=gpt2 SEQ=128 BATCH=2 measures 124M (about 8 s a step on 2 threads)
#   STEPS (4), WARMUP (1), ROUNDS (5), BENCH_THREADS (2)
#   NPROC (1), ZERO (0): ranks and ZeRO stage of the step-time runs (NPROC=2 ZERO=3
#                  BENCH_THREADS=1: the embedding's gradient in pieces, whose logits layer
#                  recomputes once more)
#   BASE_ZRUN      another zrun (say, main's) also run each round with --recompute none, after
#                  the three modes: printed, none's step time against it (no checkpoint diff:
#                  another build may round differently)
#   BENCH_DIR      scratch directory (build/bench-scratch)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" recompute-bench
MODEL=${MODEL:-gpt2:layers=4,heads=4,dim=256,ctx=256,vocab=8192}
SEQ=${SEQ:-256}
BATCH=${BATCH:-4}
STEPS=${STEPS:-4}
WARMUP=${WARMUP:-1}
ROUNDS=${ROUNDS:-5}
BENCH_THREADS=${BENCH_THREADS:-2}
NPROC=${NPROC:-1}
ZERO=${ZERO:-0}
[[ $ZERO =~ ^[0-3]$ ]] || fail "ZERO=$ZERO: expected 0..3"
for v in SEQ BATCH STEPS ROUNDS BENCH_THREADS NPROC; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || fail "$v=${!v}: expected a positive integer"
done
[[ $WARMUP =~ ^[0-9]+$ ]] && ((WARMUP < STEPS)) || fail "WARMUP=$WARMUP: expected 0..STEPS-1"
need_zrun
ZCKPT=${ZCKPT:-$(dirname "$ZRUN")/zckpt}
[ -x "$ZCKPT" ] || fail "$ZCKPT: not an executable (make build/zckpt)"
scratch recompute

say "dry run, GPT-2 124M, --seq 1024 --batch 16 --nproc 2 --zero 3: activations of rank 0"
for spec in "none 8" "selective 8" "layer 8" "layer 4"; do
    set -- $spec
    "$ZRUN" --model gpt2 --seq 1024 --batch 16 --nproc 2 --zero 3 --micro-batch "$2" \
        --recompute "$1" --dry-run --json >"$s/plan.json" || fail "dry run --recompute $1 failed"
    python3 - "$s/plan.json" "$1" "$2" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["ranks"][0]
a = r["activations"]
goal = "" if sys.argv[2] != "layer" else (" PASS" if a <= 1.5e9 else " BELOW") + " (goal <= 1.5 GB)"
print("[recompute-bench]   %-9s micro-batch %s: activations %7.0f MiB (%.2f GB), total %7.0f MiB%s"
      % (sys.argv[2], sys.argv[3], a / 2**20, a / 1e9, r["total_bytes"] / 2**20, goal))
EOF
done

say "step time: $MODEL, batch $BATCH x $SEQ, $NPROC rank(s) at ZeRO-$ZERO, $BENCH_THREADS threads, $STEPS steps ($WARMUP warmup), $ROUNDS rounds"
modes=(none layer selective)
if [ -n "${BASE_ZRUN:-}" ]; then
    [ -x "$BASE_ZRUN" ] || fail "BASE_ZRUN=$BASE_ZRUN: not an executable"
    modes+=(base)
fi
: >"$s/times"
for ((r = 1; r <= ROUNDS; r++)); do
    for m in "${modes[@]}"; do
        rm -rf "$s/run-$m"
        /usr/bin/time -f "%U %S" -o "$s/cpu" \
            "$([ "$m" = base ] && echo "$BASE_ZRUN" || echo "$ZRUN")" --model "$MODEL" \
            --seq "$SEQ" --batch "$BATCH" --steps "$STEPS" --warmup 1 --threads "$BENCH_THREADS" \
            --nproc "$NPROC" --zero "$ZERO" \
            --recompute "${m/base/none}" --resume never --ckpt-dir "$s/run-$m" \
            --log-json "$s/$m.jsonl" >"$s/$m.log" 2>&1 || { cat "$s/$m.log" >&2; fail "--recompute $m failed"; }
        python3 - "$s/$m.jsonl" "$WARMUP" "$r" "$m" "$s/cpu" >>"$s/times" <<'EOF'
import json, statistics, sys
ms = [j["step_ms"] for j in map(json.loads, open(sys.argv[1])) if "step_ms" in j]
cpu = sum(map(float, open(sys.argv[5]).read().split()[-2:]))
print(sys.argv[3], sys.argv[4], statistics.median(ms[int(sys.argv[2]):]), cpu,
      min(ms[int(sys.argv[2]):]))
EOF
        rm -f "$s/$m.jsonl"
    done
    for m in layer selective; do
        "$ZCKPT" diff "$s/run-none" "$s/run-$m" >"$s/diff.txt" 2>&1 ||
            { cat "$s/diff.txt" >&2; fail "round $r: --recompute $m's checkpoint differs from none's"; }
    done
done
python3 - "$s/times" <<'EOF'
import collections, statistics, sys
t, c, b = collections.defaultdict(dict), collections.defaultdict(dict), {}
for line in open(sys.argv[1]):
    r, m, ms, cpu, best = line.split()
    t[int(r)][m] = float(ms)
    c[int(r)][m] = float(cpu)
    b[m] = min(b.get(m, float("inf")), float(best))
for m in ("layer", "selective"):
    ratios = sorted(t[r][m] / t[r]["none"] for r in t)
    cr = sorted(c[r][m] / c[r]["none"] for r in c)
    med = statistics.median(ratios)
    goal = (" PASS" if med <= 1.4 else " BELOW") + " (goal <= 1.4x)" if m == "layer" else ""
    print("[recompute-bench]   %-9s / none: step time %.3fx (median of %d rounds; min %.3f, max %.3f)%s"
          % (m, med, len(ratios), ratios[0], ratios[-1], goal))
    print("[recompute-bench]   %-9s / none: CPU seconds of the run %.3fx (min %.3f, max %.3f); "
          "fastest step of all rounds %.3fx" % (m, statistics.median(cr), cr[0], cr[-1],
                                               b[m] / b["none"]))
print("[recompute-bench]   none: median step %.1f ms, median CPU %.1f s per run"
      % (statistics.median(t[r]["none"] for r in t), statistics.median(c[r]["none"] for r in c)))
if "base" in b:
    ratios = sorted(t[r]["none"] / t[r]["base"] for r in t)
    cr = sorted(c[r]["none"] / c[r]["base"] for r in c)
    print("[recompute-bench]   none / BASE_ZRUN's none: step time %.3fx (min %.3f, max %.3f); "
          "CPU seconds %.3fx (min %.3f, max %.3f); fastest step %.3fx"
          % (statistics.median(ratios), ratios[0], ratios[-1], statistics.median(cr), cr[0],
             cr[-1], b["none"] / b["base"]))
EOF
say "every mode's checkpoint equals none's in every round"
