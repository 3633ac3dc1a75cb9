#!/usr/bin/env bash
# dcp_export_bench.sh: `zckpt export --format dcp --optim` of a GPT-2 124M checkpoint (one zrun
# step, so AdamW's moments are there) beside torch.distributed.checkpoint.save of the same model
# and AdamW state from the venv (tests/formats/dcp_torch.py save: GPT2LMHeadModel.from_pretrained
# of `zckpt export --format hf` of the checkpoint, one AdamW step, then dcp.save of {"model",
# "optimizer"}): wall time and peak RSS of each process (torch's includes importing torch and
# building the model; its dcp.save call alone is printed too), ROUNDS rounds alternating,
# medians; then the two .metadata files compared: the same names, dtypes and shapes.
# A benchmark, not a test: exits 0 whatever the figures.
#   ROUNDS    rounds of each (default 3)
#   BENCH_DIR scratch (default build/bench-scratch); the checkpoint is kept there as gpt2-124m
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" dcp-export
ROUNDS=${ROUNDS:-3}
py=${ZT_VENV:-$root/build/venv}/bin/python
[ -x "$py" ] || fail "no oracle venv ($py): run make oracle-venv"
"$py" -c 'import torch, transformers, safetensors' 2>/dev/null ||
    fail "the venv lacks torch, transformers or safetensors"
need_zrun
make -C "$root" --no-print-directory build/zckpt >/dev/null || fail "make build/zckpt failed"
zckpt=$root/build/zckpt
mkdir -p "$BENCH_DIR"
ck=$BENCH_DIR/gpt2-124m
if [ ! -f "$ck/latest" ]; then
    rm -rf "$ck"
    say "training GPT-2 124M for one step into $ck"
    "$ZRUN" --model gpt2 --steps 1 --save-every 1 --batch 1 --seq 16 --ckpt-dir "$ck" \
        >/dev/null || fail "zrun failed"
fi
scratch dcp-export
"$zckpt" export "$ck" --format hf -o "$s/hf" >/dev/null || fail "export --format hf failed"
timed() { # one timed run: "seconds max_rss_kib"
    /usr/bin/time -f '%e %M' -o "$s/time" "$@" >"$s/out" 2>"$s/err" ||
        { cat "$s/err" >&2; fail "$* failed"; }
    cat "$s/time"
}
zs=(); zm=(); ts=(); tm=(); tc=()
for r in $(seq 1 "$ROUNDS"); do
    rm -rf "$s/z" "$s/t"
    read -r t m < <(timed "$zckpt" export "$ck" --format dcp --optim -o "$s/z")
    zs+=("$t"); zm+=("$m")
    read -r t2 m2 < <(timed "$py" "$root/tests/formats/dcp_torch.py" save "$s/hf" "$s/t")
    ts+=("$t2"); tm+=("$m2"); tc+=("$(cat "$s/out")")
    say "round $r: zckpt ${t} s ${m} KiB; torch ${t2} s ${m2} KiB (dcp.save alone $(cat "$s/out") s)"
done
"$py" - "$s/z" "$s/t" <<'PY' || fail "the two checkpoints hold different items"
import pickle, sys
a, b = (pickle.load(open(d + "/.metadata", "rb")).state_dict_metadata for d in sys.argv[1:])
desc = lambda m: {k: (type(v).__name__, str(getattr(getattr(v, "properties", None), "dtype", "")),
                      tuple(getattr(v, "size", ()))) for k, v in m.items()}
da, db = desc(a), desc(b)
assert da == db, "differ: %s" % sorted(set(da.items()) ^ set(db.items()))[:5]
print("[dcp-export] same %d items (names, dtypes, shapes) as torch's" % len(da))
PY
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
zt=$(median "${zs[@]}"); tt=$(median "${ts[@]}"); zr=$(median "${zm[@]}"); tr=$(median "${tm[@]}")
say "zckpt export --format dcp --optim: median $zt s, peak RSS $((zr / 1024)) MiB"
say "torch (python, from_pretrained, dcp.save): median $tt s, peak RSS $((tr / 1024)) MiB;" \
    "dcp.save alone median $(median "${tc[@]}") s"
