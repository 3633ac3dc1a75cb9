#!/usr/bin/env bash
# save_bench.sh: part of `make bench` (issue 8). GPT-2 124M at W=2 (1 thread per rank), stage
# 3, batch 4 x 64, STEPS steps saving every EVERY steps, in one run: with asynchronous saves,
# with synchronous saves, and with no saves. From the JSON log: the training time (the sum of
# step_ms and save_blocked_ms over all steps; the final checkpoint after the last step, which
# every configuration writes, is outside it) and the time each save blocked training.
# Targets: an asynchronous save blocks <= 10% of a synchronous one; training time with
# asynchronous saves <= 1.1x the time with none. Prints PASS/BELOW; exits 0 either way.
#   ZRUN (build/zrun), BENCH_DIR (build/bench-scratch), STEPS (30), EVERY (10)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" save-bench
STEPS=${STEPS:-30}
EVERY=${EVERY:-10}
[[ $STEPS =~ ^[1-9][0-9]*$ && $EVERY =~ ^[1-9][0-9]*$ ]] || fail "STEPS and EVERY: integers"
((STEPS > EVERY)) || fail "STEPS must exceed EVERY"
need_zrun
scratch save
say "GPT-2 124M, W=2, stage 3, 1 thread per rank, batch 4 x 64, $STEPS steps, saves every $EVERY"
run() { # name extra-args...
    local name=$1
    shift
    "$ZRUN" --model gpt2 --nproc 2 --zero 3 --threads 1 --batch 4 --seq 64 --steps "$STEPS" \
        --warmup 1 --keep-last 2 --ckpt-dir "$s/run-$name" --log-json "$s/$name.jsonl" "$@" \
        >"$s/$name.log" 2>&1 || { cat "$s/$name.log" >&2; fail "run $name failed"; }
    rm -rf "$s/run-$name"
}
run async --save-every "$EVERY" --async-save on
run sync --save-every "$EVERY" --async-save off
run none --save-every 0
python3 - "$s" <<'EOF2'
import json, sys
d = sys.argv[1]
res = {}
for name in ("async", "sync", "none"):
    rows = [json.loads(l) for l in open("%s/%s.jsonl" % (d, name))]
    total = sum(r["step_ms"] + r.get("save_blocked_ms", 0) for r in rows) / 1e3
    saves = [r["save_blocked_ms"] for r in rows if r.get("save_blocked_ms", 0) > 0]
    res[name] = (total, saves)
print("[save-bench] saves   training time   blocked per save (ms)")
for name in ("async", "sync", "none"):
    t, sv = res[name]
    print("[save-bench] %-6s %12.1f s   %s" % (name, t, ", ".join("%.0f" % x for x in sv) or "-"))
a, s_ = res["async"][1], res["sync"][1]
if a and s_:
    r = (sum(a) / len(a)) / (sum(s_) / len(s_))
    print("[save-bench] async blocking / sync blocking: %.3f (target <= 0.10) %s" %
          (r, "PASS" if r <= 0.10 else "BELOW"))
r = res["async"][0] / res["none"][0]
print("[save-bench] training time, async saves / no saves: %.3f (target <= 1.10) %s" %
      (r, "PASS" if r <= 1.10 else "BELOW"))
EOF2
