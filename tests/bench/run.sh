#!/usr/bin/env bash
# run.sh: `make bench`. Measures, in one run and on the filesystem of the repository, what the
# machine allows (fio O_DIRECT sequential write and read, 2-core SHA-256 rate) and what the ckpt
# library achieves (bench_ckpt: save, verify, load with verification), then prints each figure
# with its ratio against the targets. A benchmark, not a test: exits 0 whether targets are met
# or not, non-zero only when a command fails.
#   BENCH_BIN     the bench_ckpt binary (set by make)
#   BENCH_DIR     scratch directory (default build/bench-scratch in the repository)
#   BENCH_GIB     checkpoint size in GiB, also the fio size (default 1)
#   BENCH_SHARDS  ranks / shard files (default 4); BENCH_JOBS threads (default 2)
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/common.sh" bench
BENCH_BIN=${BENCH_BIN:-$root/build/bench_ckpt}
BENCH_GIB=${BENCH_GIB:-1}
BENCH_SHARDS=${BENCH_SHARDS:-4}
BENCH_JOBS=${BENCH_JOBS:-2}


[[ $BENCH_GIB =~ ^[1-9][0-9]*$ ]] || fail "BENCH_GIB=$BENCH_GIB: expected a positive integer"
[ -x "$BENCH_BIN" ] || fail "$BENCH_BIN: not built (run: make bench)"
command -v python3 >/dev/null || fail "python3 is needed to parse fio's JSON output"
command -v openssl >/dev/null || fail "openssl is needed for the hashing baseline"
if ! command -v fio >/dev/null; then
    command -v apt-get >/dev/null || fail "fio is missing and apt-get is not available"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    say "fio is missing: installing it with apt-get"
    $sudo apt-get update -q >/dev/null || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q fio >/dev/null ||
        fail "apt-get install fio failed"
fi

mkdir -p "$BENCH_DIR"
scratch=$(mktemp -d "$BENCH_DIR/run.XXXXXX")
hdir=""
cleanup() {
    rm -rf "$scratch"
    [ -z "$hdir" ] || [ "$hdir" = "$scratch" ] || rm -rf "$hdir"
    rmdir "$BENCH_DIR" 2>/dev/null || true
}
trap cleanup EXIT

bytes=$((BENCH_GIB << 30))
fs=$(df -PT "$scratch" | awk 'NR == 2 {print $1 " (" $2 ") mounted on " $7}')
say "scratch $scratch on $fs; size ${BENCH_GIB} GiB; $(nproc) CPUs"
if [ "$(stat -c %d "$scratch")" != "$(stat -c %d "$root")" ]; then
    say "note: BENCH_DIR is not on the repository's filesystem"
fi

drop_caches() {
    sync
    if { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null; then echo yes; else echo no; fi
}
now() { date +%s.%N; }

# ---- fio: O_DIRECT sequential write then read of one file of the checkpoint's size. fio's
# default buffers are random (no --zero_buffers); --refill_buffers also gives every write fresh
# random data, as a checkpoint has, so the virtual disk cannot profit from repeated blocks.
fio_bw() { # rw [extra fio options] -> bytes/s
    local rw=$1 out
    shift
    out=$(fio --name=w --ioengine=libaio --direct=1 --bs=1M --iodepth=16 --rw="$rw" \
              --size="$bytes" --numjobs=1 --refill_buffers --filename="$scratch/fio.dat" \
              --output-format=json "$@") || fail "fio --rw=$rw $* failed"
    printf '%s' "$out" | python3 -c '
import json, sys
text = sys.stdin.read()
j = json.loads(text[text.find("{"):])  # fio may print notes before the JSON
print(j["jobs"][0][sys.argv[1]]["bw_bytes"])' "$rw"
}
say "fio sequential write (O_DIRECT, 1 MiB, QD 16, random data)..."
fio_write=$(fio_bw write)
cold_fio=$(drop_caches)
say "fio sequential read (O_DIRECT, 1 MiB, QD 16; caches dropped: $cold_fio)..."
fio_read=$(fio_bw read)
rm -f "$scratch/fio.dat"
# The library fsyncs every shard before it reports it; fio's write figure above includes no
# flush. For reference only: the same write with an fsync at the end (durable bandwidth).
say "fio sequential write + fsync at the end (reference: durable bandwidth)..."
fio_write_sync=$(fio_bw write --end_fsync=1)
rm -f "$scratch/fio.dat"

# ---- 2-core SHA-256 rate: two files of half the size in the page cache (on /dev/shm when it
# has room, so that making them does not load the disk), hashed by two openssl processes at once
hdir=$scratch
shm_free=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {printf "%.0f", $4 * 1024}') || shm_free=0
if [ "${shm_free:-0}" -gt $((bytes + (256 << 20))) ]; then
    hdir=$(mktemp -d /dev/shm/zck-bench.XXXXXX)
fi
say "2-core SHA-256 (two openssl dgst processes over files cached in $hdir)..."
half=$((bytes / 2))
openssl rand -out "$hdir/h0" "$half"
openssl rand -out "$hdir/h1" "$half"
cat "$hdir/h0" "$hdir/h1" >/dev/null  # make sure both are cached
t0=$(now)
openssl dgst -sha256 "$hdir/h0" >/dev/null & p0=$!
openssl dgst -sha256 "$hdir/h1" >/dev/null & p1=$!
wait "$p0" || fail "openssl dgst failed"
wait "$p1" || fail "openssl dgst failed"
t1=$(now)
rm -f "$hdir/h0" "$hdir/h1"
hash_bw=$(python3 -c 'import sys; print(int(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2])))' \
          $((2 * half)) "$t0" "$t1")
# For reference only: SHA-256 compute alone on 2 cores (no file reading), 4 MiB blocks
sha_raw=$(openssl speed -seconds 2 -bytes 4194304 -multi 2 -evp sha256 2>/dev/null |
          awk '$1 == "sha256" {sub(/k$/, "", $2); printf "%.0f", $2 * 1000}') || sha_raw=0

# ---- the library
say "bench_ckpt --gib $BENCH_GIB --shards $BENCH_SHARDS --jobs $BENCH_JOBS..."
lib_out=$("$BENCH_BIN" "$scratch/ckpt" --gib "$BENCH_GIB" --shards "$BENCH_SHARDS" \
          --jobs "$BENCH_JOBS") || { printf '%s\n' "${lib_out:-}"; fail "bench_ckpt failed"; }
printf '%s\n' "$lib_out" | sed 's/^/  /'

# ---- table
python3 - "$fio_write" "$fio_read" "$hash_bw" "$fio_write_sync" "${sha_raw:-0}" "$lib_out" <<'PY'
import sys
fio_w, fio_r, hash_bw, fio_ws, sha_raw = (float(x or 0) / 1e9 for x in sys.argv[1:6])
lib = {}
for line in sys.argv[6].splitlines():
    for f in line.split():
        if "=" in f:
            k, v = f.split("=", 1)
            if k.endswith("_gbps") or k == "cold_cache":
                lib[k] = v
save, verify, load = (float(lib[k]) for k in ("save_gbps", "verify_gbps", "load_verify_gbps"))
print()
print("%-58s %7s" % ("machine", "GB/s"))
print("%-58s %7.3f" % ("fio write (O_DIRECT, 1 MiB, QD 16)", fio_w))
print("%-58s %7.3f" % ("fio read (O_DIRECT, 1 MiB, QD 16)", fio_r))
print("%-58s %7.3f" % ("SHA-256, 2 cores (2 x openssl dgst, cached files)", hash_bw))
print("%-58s %7.3f" % ("  reference: fio write + end_fsync (durable)", fio_ws))
print("%-58s %7.3f" % ("  reference: SHA-256 compute only, 2 cores (openssl speed)", sha_raw))
print()
rows = [
    ("save", save, "fio write", fio_w, 0.9),
    ("verify", verify, "2-core hash", hash_bw, 0.9),
    ("load + verification", load, "min(fio read, 2-core hash)", min(fio_r, hash_bw), 0.8),
]
fmt = "%-20s %7s  %-27s %7s %6s %5s  %s"
print(fmt % ("library", "GB/s", "against", "GB/s", "ratio", "need", "result"))
for name, got, what, ref, need in rows:
    ratio = got / ref if ref else 0.0
    print(fmt % (name, "%.3f" % got, what, "%.3f" % ref, "%.3f" % ratio, "%.2f" % need,
                 "PASS" if ratio >= need else "BELOW"))
if fio_ws:
    print(fmt % ("  save (reference)", "%.3f" % save, "fio write + end_fsync", "%.3f" % fio_ws,
                 "%.3f" % (save / fio_ws), "-", "(info)"))
print()
print("cold cache between library phases: %s (shard files are read with O_DIRECT either way)"
      % lib.get("cold_cache", "?"))
PY
