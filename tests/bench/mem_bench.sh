#!/usr/bin/env bash
# mem_bench.sh (issue 16, memory): rank 0's peak RSS (the JSON log's rss_peak, getrusage's
# maxrss) at 2 ranks, ZeRO stages 0 and 3, asynchronous saves on (--save-every SAVE_EVERY),
# on each model of MODELS, next to what `zrun --dry-run --json` predicts for that rank
# (total_bytes). Prints the stage-3 / stage-0 ratio per model (goal <= 0.6 on a model whose
# states dominate) and measured / predicted per stage (goal 0.8-1.2). A benchmark: exits 0
# either way, non-zero only when a command fails.
#   ZRUN        the zrun binary (default: build/zrun, brought up to date with make)
#   MODELS      (gpt2:layers=6,heads=8,dim=512,ctx=128,vocab=8192, 23M parameters, and
#               gpt2:layers=20,heads=12,dim=768,ctx=128,vocab=8192, 143M, whose states
#               dominate: about 2.5 GiB per rank at stage 0), STEPS (4), SAVE_EVERY (2)
#   STAGES      (0 3), EXTRA extra zrun options (e.g. --save-buffer 16777216)
#   BENCH_DIR   scratch directory (build/bench-scratch)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" mem-bench
MODELS=${MODELS:-${MODEL:-gpt2:layers=6,heads=8,dim=512,ctx=128,vocab=8192 gpt2:layers=20,heads=12,dim=768,ctx=128,vocab=8192}}
STEPS=${STEPS:-4}
SAVE_EVERY=${SAVE_EVERY:-2}
STAGES=${STAGES:-0 3}
EXTRA=${EXTRA:-}
need_zrun
scratch mem
for MODEL in $MODELS; do
    common=(--model "$MODEL" --nproc 2 --threads 1 --batch 4 --seq 64 --steps "$STEPS"
            --warmup 1 --save-every "$SAVE_EVERY" --async-save on $EXTRA)
    say "$MODEL, W=2, batch 4 x 64, $STEPS steps, async save every $SAVE_EVERY"
    declare -A rss=() plan=()
    for stage in $STAGES; do
        "$ZRUN" "${common[@]}" --zero "$stage" --ckpt-dir "$s/run$stage" --log-json \
            "$s/s$stage.jsonl" >"$s/s$stage.log" 2>&1 || { cat "$s/s$stage.log" >&2;
            fail "stage $stage run failed"; }
        rss[$stage]=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["rss_peak"])' "$s/s$stage.jsonl")
        if "$ZRUN" "${common[@]}" --zero "$stage" --ckpt-dir "$s/none" --dry-run --json \
            >"$s/p$stage.json" 2>/dev/null; then
            plan[$stage]=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][0]["total_bytes"])' "$s/p$stage.json")
        else
            plan[$stage]=0
        fi
        rm -rf "$s/run$stage"
        python3 -c 'import sys; r,p=int(sys.argv[2]),int(sys.argv[3]); print("[mem-bench] stage %s: peak RSS rank 0 %.0f MiB, dry run %s" % (sys.argv[1], r/2**20, "%.0f MiB (measured/predicted %.2f)" % (p/2**20, r/p) if p else "n/a"))' \
            "$stage" "${rss[$stage]}" "${plan[$stage]}"
    done
    if [ -n "${rss[0]:-}" ] && [ -n "${rss[3]:-}" ]; then
        python3 -c 'import sys; a,b=int(sys.argv[1]),int(sys.argv[2]); r=b/a; print("[mem-bench] stage 3 / stage 0 peak RSS: %.2f (goal <= 0.60: %s)" % (r, "PASS" if r <= 0.6 else "BELOW"))' "${rss[0]}" "${rss[3]}"
    fi
done
