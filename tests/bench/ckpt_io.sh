#!/usr/bin/env bash
# ckpt_io.sh: part of `make bench` (issue 27). Checkpoint I/O against the machine's limits, in
# one run, ROUNDS rounds (median, min-max). Each round runs every operation beside its limit on
# the same bytes and, for writes, the same number of files:
#   save         zrun --async-save off (MODEL at 2 ranks): save_blocked_ms of the JSON log,
#                the whole write + hash + fsync + commit of all ranks; vs fio write
#   import       zckpt import of the model exported as safetensors, --world 4 (moments as
#                zeros, as an import writes them), its source in the page cache; vs fio write
#                (also printed: the same from a cold source, which the cache drops before
#                the other operations leave it, as import_cold)
#   reshard      zckpt reshard of the save to --world 4; vs cp -r + sync (time), and fio write
#   verify       zckpt verify --jobs 2; vs two openssl dgst -sha256 in parallel over the shards,
#                and vs the read + hash limit as load (below)
#   load         a zrun resume that has nothing left to do: "resumed from ... (X s)", the read +
#                hash + place of every rank; vs min(fio read, SHA-256 on as many cores (openssl
#                speed -multi, compute only)) on its bytes
#   consolidate  zckpt consolidate -> safetensors + sync; vs cat of the shards + sync (time)
# fio: libaio, O_DIRECT, 1 MiB, QD 16, --refill_buffers (fresh random data: the virtual disk
# writes zero pages about 3x faster), --end_fsync=1, one job per file of the operation. Also,
# for comparison and once per round: torch.save and DCP's save of the same bytes (ckpt_io.py,
# from the oracle venv, when it has torch). Peak RSS of every zckpt command (/usr/bin/time).
# Caches are dropped before reads when the machine allows it (said in the output). A benchmark:
# exits 0 whether or not goals are met, non-zero only when a command fails.
#   ZRUN, ZCKPT (build/), BENCH_DIR (build/bench-scratch), ROUNDS (5), MODEL (gpt2),
#   VENV (build/venv, else /work/main/build/venv), SHORT=1: tiny model, 1 round
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" ckpt-io
ZCKPT=${ZCKPT:-$root/build/zckpt}
if [ "${SHORT:-0}" = 1 ]; then
    ROUNDS=${ROUNDS:-1}
    MODEL=${MODEL:-tiny}
fi
ROUNDS=${ROUNDS:-5}
MODEL=${MODEL:-gpt2}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || fail "ROUNDS=$ROUNDS: expected a positive integer"
need_zrun
[ -x "$ZCKPT" ] || fail "$ZCKPT: not built (make build/zckpt)"
for tool in fio openssl python3; do
    command -v "$tool" >/dev/null || fail "$tool is missing (make bench-deps installs it)"
done
[ -x /usr/bin/time ] || fail "/usr/bin/time is missing (make bench-deps installs it)"
VENV=${VENV:-}
if [ -z "$VENV" ]; then
    for v in "$root/build/venv" /work/main/build/venv; do
        [ -x "$v/bin/python" ] && { VENV=$v; break; }
    done
fi
scratch ckpt-io
T=$s/times # one line per measurement: op round seconds bytes [rss_kib]

cold() {
    sync
    if { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null; then echo cold; else echo warm; fi
}
timed() { # op round bytes cmd...: time (and peak RSS) of one command, appended to $T
    local op=$1 rnd=$2 bytes=$3
    shift 3
    /usr/bin/time -f '%e %M' -o "$s/time" "$@" >"$s/cmd.log" 2>&1 ||
        { cat "$s/cmd.log" >&2; fail "$op failed: $*"; }
    read -r sec rss <"$s/time"
    echo "$op $rnd $sec $bytes $rss" >>"$T"
}
fio_run() { # op round rw bytes files: fio over FILES files of BYTES/FILES each
    local op=$1 rnd=$2 rw=$3 bytes=$4 files=$5 out
    out=$(fio --name=lim --directory="$s/fio" --ioengine=libaio --direct=1 --bs=1M \
              --iodepth=16 --rw="$rw" --size=$(((bytes / files + (1 << 20) - 1) >> 20 << 20)) \
              --numjobs="$files" --group_reporting --refill_buffers --end_fsync=1 \
              --output-format=json) || fail "fio --rw=$rw failed"
    printf '%s' "$out" | python3 -c '
import json, sys
t = sys.stdin.read()
j = json.loads(t[t.find("{"):])["jobs"][0][sys.argv[1]]
print(sys.argv[2], sys.argv[3], j["runtime"] / 1e3, j["io_bytes"])' "$rw" "$op" "$rnd" >>"$T"
}
ossl2() { # op round files...: two openssl dgst processes, each over half of the files
    local op=$1 rnd=$2
    shift 2
    local a=() b=() i=0 f bytes
    for f in "$@"; do
        if ((i++ % 2)); then b+=("$f"); else a+=("$f"); fi
    done
    # (sizes from stat: reading the files here would warm the cache the limit is measured cold)
    bytes=$(stat -c %s "$@" | awk '{ s += $1 } END { print s }')
    timed "$op" "$rnd" "$bytes" bash -c 'openssl dgst -sha256 "$@" >/dev/null' _ "${a[@]}" &
    local p=$!
    if ((${#b[@]})); then
        /usr/bin/time -f '%e %M' -o "$s/time2" openssl dgst -sha256 "${b[@]}" >/dev/null ||
            fail "openssl dgst failed"
    fi
    wait "$p"
    # the pair's time: the slower of the two
    if ((${#b[@]})); then
        read -r t2 _ <"$s/time2"
        python3 - "$T" "$t2" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
f = lines[-1].split()
f[2] = "%.2f" % max(float(f[2]), float(sys.argv[2]))
lines[-1] = " ".join(f)
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
    fi
}

mkdir -p "$s/fio"
fs=$(df -PT "$s" | awk 'NR == 2 {print $1 " (" $2 ")"}')
say "scratch $s on $fs; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg); model $MODEL; $ROUNDS rounds"

# ---- the save: one zrun run, ROUNDS + 1 steps, a synchronous save after every step (the
# last step's is outside the JSON log's save_blocked_ms); --keep-last 0 keeps every checkpoint,
# so that no save also deletes an older one (the scratch directory goes at the end)
say "zrun --model $MODEL --nproc 2 --async-save off, $((ROUNDS + 1)) steps, a save after each"
"$ZRUN" --model "$MODEL" --nproc 2 --zero 3 --threads 1 --batch 4 --seq 64 \
    --steps $((ROUNDS + 1)) --warmup 1 --save-every 1 --async-save off --keep-last 0 \
    --ckpt-dir "$s/run" --log-json "$s/run.jsonl" >"$s/zrun.log" 2>&1 ||
    { cat "$s/zrun.log" >&2; fail "zrun failed"; }
ck=$(readlink -f "$s/run/latest")
[ -d "$ck" ] || ck=$(ls -d "$s"/run/step-* | tail -1)
save_bytes=$(du -sb --apparent-size "$ck" | cut -f1)
save_files=$(ls "$ck"/shard-*.bin | wc -l)
python3 - "$s/run.jsonl" "$save_bytes" >>"$T" <<'PY'
import json, sys
rnd = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("save_blocked_ms", 0) > 0:
        rnd += 1
        print("save", rnd, r["save_blocked_ms"] / 1e3, sys.argv[2])
PY
say "checkpoint $ck: $save_bytes bytes in $save_files shard files"

# the model as safetensors in our names: the import's source
"$ZCKPT" export "$ck" -o "$s/model.safetensors" --format safetensors >/dev/null ||
    fail "zckpt export failed"

for ((r = 1; r <= ROUNDS; r++)); do
    say "round $r/$ROUNDS"
    # save's limit: fio write, the same bytes in as many files
    fio_run save_lim "$r" write "$save_bytes" "$save_files"
    rm -f "$s"/fio/*

    # import into 4 shards, with the moments (zeros), then its limit
    rm -rf "$s/imp"
    sync # the removals' write-back (fio's files, the last import) outside the timed import
    # first from a cold source (import_cold), then again with the source in the page cache,
    # as fio reads nothing: the write path against fio's (import)
    c=$(cold); timed import_cold "$r" 0 "$ZCKPT" import "$s/model.safetensors" -o "$s/imp" \
        --world 4
    rm -rf "$s/imp"
    sync
    timed import "$r" 0 "$ZCKPT" import "$s/model.safetensors" -o "$s/imp" --world 4
    imp=$(ls -d "$s"/imp/step-*)
    imp_bytes=$(du -sb --apparent-size "$imp" | cut -f1)
    sed -i 's/^\(import[a-z_]* '"$r"' [0-9.]*\) 0\( \|$\)/\1 '"$imp_bytes"'\2/' "$T"
    fio_run import_lim "$r" write "$imp_bytes" 4
    rm -f "$s"/fio/*

    # reshard 2 -> 4 against cp -r + sync, and fio on the same bytes in 4 files
    c=$(cold); timed cp "$r" "$save_bytes" bash -c "cp -r '$ck' '$s/copy' && sync"
    rm -rf "$s/copy"
    c=$(cold); timed reshard "$r" "$save_bytes" "$ZCKPT" reshard "$ck" --world 4 -o "$s/r4"
    rm -rf "$s/r4"
    fio_run reshard_lim "$r" write "$save_bytes" 4
    rm -f "$s"/fio/*

    # verify against 2 openssl processes over the same shards, and SHA-256 compute alone on as
    # many processes as cores (4 MiB blocks)
    c=$(cold); ossl2 verify_lim "$r" "$ck"/shard-*.bin
    openssl speed -seconds 1 -bytes 4194304 -multi "$(nproc)" -evp sha256 2>/dev/null |
        awk -v r="$r" '$1 == "sha256" {sub(/k$/, "", $2); print "sha_lim", r, 1, $2 * 1000}' >>"$T"
    c=$(cold); timed verify "$r" "$save_bytes" "$ZCKPT" verify "$ck" --jobs 2

    # load at resume: a zrun resume with nothing left to do; its limit: min(fio read, hashing)
    c=$(cold)
    "$ZRUN" --model "$MODEL" --nproc 2 --zero 3 --threads 1 --batch 4 --seq 64 \
        --steps $((ROUNDS + 1)) --resume "$ck" --ckpt-dir "$s/run2" --log-json none \
        >"$s/resume.log" 2>&1 || { cat "$s/resume.log" >&2; fail "zrun resume failed"; }
    rm -rf "$s/run2"
    t=$(sed -n 's/.*resumed from .*, \([0-9.]*\) s) at world.*/\1/p' "$s/resume.log")
    [ -n "$t" ] || { cat "$s/resume.log" >&2; fail "no resume time in zrun's log"; }
    echo "load $r $t $save_bytes" >>"$T"
    fio_run read_lim "$r" read "$save_bytes" "$save_files"
    rm -f "$s"/fio/*

    # consolidate against cat + sync
    c=$(cold); timed cat "$r" "$save_bytes" bash -c "cat '$ck'/shard-*.bin >'$s/cat.bin' && sync"
    rm -f "$s/cat.bin"
    c=$(cold); timed consolidate "$r" "$save_bytes" bash -c \
        "'$ZCKPT' consolidate '$ck' -o '$s/all.safetensors' && sync"
    rm -f "$s/all.safetensors"

    # for comparison: torch.save and DCP's save of the same bytes (2 files)
    if [ -n "$VENV" ] && "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
        "$VENV/bin/python" -W ignore "$here/ckpt_io.py" "$s/torch" "$save_bytes" "$save_files" |
            sed "s/^\([a-z_]*\) /\1 $r /" >>"$T" || fail "ckpt_io.py failed"
        rm -rf "$s/torch"
    fi
done
say "caches between commands: $c"

python3 - "$T" "$ROUNDS" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows.setdefault(f[0], {})[int(f[1])] = (float(f[2]), float(f[3]), float(f[4]) if len(f) > 4 else 0)
def per_round(op, lim, kind):
    """ratios per round: 'rate' (op rate / limit rate) or 'time' (op time / limit time)"""
    out = []
    for r, (t, b, _) in rows.get(op, {}).items():
        if r not in rows.get(lim, {}) or t <= 0:
            continue
        lt, lb, _ = rows[lim][r]
        out.append((b / t) / (lb / lt) if kind == "rate" else t / lt)
    return out
def read_hash_ratio(op):
    """op's rate against min(fio read, SHA-256 on every core): the read + hash limit"""
    out = []
    for r, (t, b, _) in rows.get(op, {}).items():
        rd, hs = rows.get("read_lim", {}).get(r), rows.get("sha_lim", {}).get(r)
        if not rd or not hs or t <= 0:
            continue
        limit = min(rd[1] / rd[0], hs[1] / hs[0])
        out.append((b / t) / limit)
    return out
def reshard_ceiling():
    """the best write rate / fio's a reshard can reach here: it hashes every byte twice (the
    source's verification, the new shards' sums), so it takes at least 2 x bytes / SHA-256 rate
    on every core (openssl speed), however fast the disk"""
    out = []
    for r, (t, b, _) in rows.get("reshard_lim", {}).items():
        hs = rows.get("sha_lim", {}).get(r)
        if hs and t > 0:
            out.append(t / max(t, 2 * b / (hs[1] / hs[0])))
    return out
def fmt(v):
    if not v:
        return "-"
    return "%.2f (%.2f-%.2f)" % (statistics.median(v), min(v), max(v))
table = [
    ("save (zrun --async-save off, 2 ranks)", per_round("save", "save_lim", "rate"), "fio write", "rate", ">= 0.85"),
    ("zckpt import --world 4", per_round("import", "import_lim", "rate"), "fio write", "rate", ">= 0.85"),
    ("zckpt import, cold source (info)", per_round("import_cold", "import_lim", "rate"), "fio write", "rate", None),
    ("zckpt reshard --world 4 (time)", per_round("reshard", "cp", "time"), "cp -r + sync", "time", "<= 1.0"),
    ("zckpt reshard --world 4 (rate)", per_round("reshard", "reshard_lim", "rate"), "fio write", "rate", ">= 0.85"),
    ("  its ceiling, hashing 2x the bytes (info)", reshard_ceiling(), "fio write", "rate", None),
    ("zckpt verify --jobs 2", per_round("verify", "verify_lim", "rate"), "2 x openssl dgst", "rate", ">= 0.9"),
    ("zckpt verify --jobs 2", read_hash_ratio("verify"), "min(fio read, openssl speed)", "rate", ">= 0.9"),
    ("load at resume (read + hash + place)", read_hash_ratio("load"), "min(fio read, openssl speed)", "rate", ">= 0.8"),
    ("zckpt consolidate + sync (time)", per_round("consolidate", "cat", "time"), "cat + sync", "time", "<= 1.1"),
    ("torch.save, 2 files (info)", per_round("torch_save", "save_lim", "rate"), "fio write", "rate", None),
    ("DCP save, 1 process (info)", per_round("dcp_save", "save_lim", "rate"), "fio write", "rate", None),
]
print()
print("%-40s %-28s %-20s %-8s %s" % ("operation", "against", "ratio median (min-max)", "goal", "result"))
for name, v, against, kind, goal in table:
    if not v:
        continue
    m = statistics.median(v)
    res = "(info)" if goal is None else (
        "PASS" if (m >= float(goal.split()[1]) if goal.startswith(">=") else m <= float(goal.split()[1]))
        else "BELOW")
    print("%-40s %-28s %-20s %-8s %s" % (name, against, fmt(v), goal or "-", res))
print()
def gbps(op):
    v = [b / t / 1e9 for t, b, _ in rows.get(op, {}).values() if t > 0]
    return fmt(v)
print("GB/s, median (min-max):")
for op in ("save", "save_lim", "import", "import_cold", "import_lim", "reshard", "reshard_lim", "cp", "verify",
           "verify_lim", "sha_lim", "load", "read_lim", "consolidate", "cat", "torch_save", "dcp_save"):
    if op in rows:
        print("  %-12s %s" % (op, gbps(op)))
rss = {op: max(x[2] for x in rows[op].values()) for op in ("import", "reshard", "verify", "consolidate") if op in rows}
print("peak RSS (MiB, max over rounds): " + ", ".join("%s %.0f" % (k, v / 1024) for k, v in rss.items()) +
      "  (goal < 300: %s)" % ("PASS" if rss and max(rss.values()) < 300 * 1024 else "BELOW"))
PY
