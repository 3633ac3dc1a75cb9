#!/usr/bin/env bash
# mpi_bench.sh: part of `make bench`. The communicator's backends at 4 ranks on this machine:
# reduce_scatter and all_gather of MIB MiB (f32) over shm (one shared segment), the TCP star
# through rank 0 (127.0.0.1), MPI over Open MPI's shared memory (vader) and MPI with shared
# memory disabled (--mca btl tcp,self: ranks talking as across nodes, over loopback); then an
# 8-rank training job over loopback: zrun under mpirun --mca btl tcp,self against zrun
# --nproc 8 (shm) and the TCP star (8 one-rank "nodes"), mean step time after the first 3.
#   BENCH (build/comm_world_bench), ZRUN (build/zrun), MIB (64), ITERS (5), STEPS (20)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
BENCH=${BENCH:-$root/build/comm_world_bench}
ZRUN=${ZRUN:-$root/build/zrun}
MIB=${MIB:-64}
ITERS=${ITERS:-5}
STEPS=${STEPS:-20}
if ! command -v mpirun >/dev/null; then echo "[mpi-bench] skip: no mpirun (make deps)"; exit 0; fi
mpirun="mpirun --oversubscribe --allow-run-as-root --bind-to none"
echo "[mpi-bench] collectives, 4 ranks, $MIB MiB, best of $ITERS"
"$BENCH" shm 4 "$MIB" "$ITERS" | sed 's/^\[rank 0\] //'
"$BENCH" tcp 4 "$MIB" "$ITERS" | sed 's/^\[rank 0\] tcp /tcp*/'
$mpirun -np 4 "$BENCH" mpi - "$MIB" "$ITERS"
$mpirun -np 4 --mca btl tcp,self "$BENCH" mpi - "$MIB" "$ITERS" | sed 's/^mpi /mpiT/'
echo "[mpi-bench] (tcp*: the TCP star; mpiT: MPI over TCP only)"

w=$(mktemp -d /tmp/zr-mpi-bench.XXXXXX)
trap 'rm -rf "$w"' EXIT
args="--device cpu --model gpt2:layers=2,heads=4,dim=128,ctx=64,vocab=256 --seq 64 --batch 8
      --threads 1 --zero 2 --steps $STEPS --save-every 0 --resume never --async-save off"
mean() { # mean step_ms after the first 3 steps of a JSON log
    grep -o '"step_ms":[0-9.]*' "$1" | cut -d: -f2 | tail -n +4 |
        awk '{ s += $1; n++ } END { printf "%.1f", s / n }'
}
echo "[mpi-bench] 8-rank job, small GPT-2 at ZeRO 2, batch 8 x 64, $STEPS steps"
$ZRUN $args --nproc 8 --ckpt-dir "$w/shm" --log-json "$w/shm.json" >"$w/shm.log" 2>&1
$mpirun -np 8 $ZRUN $args --ckpt-dir "$w/mpis" --log-json "$w/mpis.json" >"$w/mpis.log" 2>&1
$mpirun -np 8 --mca btl tcp,self $ZRUN $args --ckpt-dir "$w/mpi" --log-json "$w/mpi.json" \
    >"$w/mpi.log" 2>&1
port=$((20000 + RANDOM % 20000))
for k in 7 6 5 4 3 2 1; do
    $ZRUN $args --nproc 1 --nnodes 8 --node-rank $k --master 127.0.0.1:$port \
        --ckpt-dir "$w/tcp" >"$w/tcp$k.log" 2>&1 &
done
$ZRUN $args --nproc 1 --nnodes 8 --node-rank 0 --master 127.0.0.1:$port --ckpt-dir "$w/tcp" \
    --log-json "$w/tcp.json" >"$w/tcp0.log" 2>&1
wait
echo "[mpi-bench] shm $(mean "$w/shm.json") ms/step, mpi (shared memory) $(mean "$w/mpis.json") ms/step, mpi over tcp $(mean "$w/mpi.json") ms/step, tcp star $(mean "$w/tcp.json") ms/step"
