#!/usr/bin/env bash
# tcp_bench.sh: part of `make bench`. The tcp communicator (two launchers on this machine as
# two "nodes", one rank each, over 127.0.0.1) against the shm one (one launcher, two ranks) on
# the same training job: a small GPT-2 at ZeRO stage 2, the mean step time over the steps after
# the first 3, ROUNDS rounds alternating the two. Prints the ratio tcp / shm per round; no
# target (the tcp backend is a star through rank 0, meant for the host's small collectives
# and CPU jobs of a few nodes; GPU jobs reduce over NCCL).
#   ZRUN (build/zrun), ROUNDS (3), STEPS (30), MODEL (gpt2:layers=4,heads=4,dim=256,...)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" tcp-bench
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-30}
MODEL=${MODEL:-gpt2:layers=4,heads=4,dim=256,ctx=128,vocab=4096}
if [ -z "${ZRUN:-}" ]; then
    make -C "$root" --no-print-directory build/zrun >/dev/null
    ZRUN=$root/build/zrun
fi
w=$(mktemp -d /tmp/zr-tcp-bench.XXXXXX)
trap 'rm -rf "$w"' EXIT
args="--device cpu --model $MODEL --seq 128 --batch 8 --threads 1 --zero 2 --steps $STEPS
      --save-every 0 --resume never --async-save off"
mean() { # mean step_ms after the first 3 steps of a JSON log
    grep -o '"step_ms":[0-9.]*' "$1" | cut -d: -f2 | tail -n +4 |
        awk '{ s += $1; n++ } END { printf "%.1f", s / n }'
}
port=$((20000 + RANDOM % 20000))
say "$MODEL, 2 ranks, ZeRO 2, batch 8 x 128, $STEPS steps, $ROUNDS rounds"
for r in $(seq 1 "$ROUNDS"); do
    $ZRUN $args --nproc 2 --ckpt-dir "$w/shm$r" --log-json "$w/shm$r.json" >"$w/shm$r.log" 2>&1
    port=$((port + 1))
    $ZRUN $args --nproc 1 --nnodes 2 --node-rank 1 --master 127.0.0.1:$port \
        --ckpt-dir "$w/tcp$r" --log-json "$w/tcp$r-1.json" >"$w/tcp$r-1.log" 2>&1 &
    $ZRUN $args --nproc 1 --nnodes 2 --node-rank 0 --master 127.0.0.1:$port \
        --ckpt-dir "$w/tcp$r" --log-json "$w/tcp$r.json" >"$w/tcp$r.log" 2>&1
    wait
    s=$(mean "$w/shm$r.json"); t=$(mean "$w/tcp$r.json")
    say "round $r: shm $s ms/step, tcp $t ms/step, tcp/shm $(awk -v a="$t" -v b="$s" 'BEGIN { printf "%.2f", a / b }')"
done
