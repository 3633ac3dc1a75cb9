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

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
BENCH_BIN=${BENCH_BIN:-$root/build/bench_ckpt}
BENCH_DIR=${BENCH_DIR:-$root/build/bench-scratch}
BENCH_GIB=${BENCH_GIB:-1}
BENCH_SHARDS=${BENCH_SHARDS:-4}
BENCH_JOBS=${BENCH_JOBS:-2}

say() { printf '[bench] %s\n' "$*"; }
fail() { printf '[bench] error: %s\n' "$*" >&2; exit 1; }

[[ $BENCH_GIB =~ ^[1-9][0-9]*$ ]] || fail "BENCH_GIB=$BENCH_GIB: expected a positive integer"
[ -x "$BENCH_BIN" ] || fail "$BENCH_BIN: not built (run: make bench)"
command -v python3 >/dev/null || fail "python3 is needed to parse fio's JSON output"
command -v openssl >/dev/null || fail "openssl is needed for the hashing baseline"
if ! command -v fio >/dev/null; then
    command -v apt-get >/dev/null || fail "fio is missing and apt-get is not available"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    say "fio is missing: installing it with apt-get"
    $sudo apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q fio >/dev/null
fi

mkdir -p "$BENCH_DIR"
scratch=$(mktemp -d "$BENCH_DIR/run.XXXXXX")
cleanup() { rm -rf "$scratch"; rmdir "$BENCH_DIR" 2>/dev/null || true; }
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
gbps() { python3 -c "import sys; print('%.3f' % (float(sys.argv[1]) / float(sys.argv[2]) / 1e9))" "$@"; }

# ---- fio: O_DIRECT sequential write then read of one file of the checkpoint's size. fio's
# default buffers are random (no --zero_buffers); --refill_buffers gives every write fresh
# random data, as a checkpoint has, so the virtual disk cannot profit from repeated blocks.
fio_bw() { # rw -> bytes/s
    local rw=$1 out
    out=$(fio --name=w --ioengine=libaio --direct=1 --bs=1M --iodepth=16 --rw="$rw" \
              --size="$bytes" --numjobs=1 --refill_buffers --filename="$scratch/fio.dat" \
              --output-format=json) || fail "fio --rw=$rw failed"
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

# ---- 2-core SHA-256 rate: two files of half the size, in the page cache, hashed by two
# openssl processes at once
say "2-core SHA-256 (openssl dgst, two processes, files in the page cache)..."
half=$((bytes / 2))
openssl rand -out "$scratch/h0" "$half"
openssl rand -out "$scratch/h1" "$half"
cat "$scratch/h0" "$scratch/h1" >/dev/null  # make sure both are cached
t0=$(now)
openssl dgst -sha256 "$scratch/h0" >/dev/null & p0=$!
openssl dgst -sha256 "$scratch/h1" >/dev/null & p1=$!
wait "$p0" || fail "openssl dgst failed"
wait "$p1" || fail "openssl dgst failed"
t1=$(now)
hash_secs=$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$t1")
hash_bw=$(python3 -c "import sys; print(int(sys.argv[1]) / float(sys.argv[2]))" $((2 * half)) "$hash_secs")
rm -f "$scratch/h0" "$scratch/h1"

# ---- the library
say "bench_ckpt --gib $BENCH_GIB --shards $BENCH_SHARDS --jobs $BENCH_JOBS..."
lib_out=$("$BENCH_BIN" "$scratch/ckpt" --gib "$BENCH_GIB" --shards "$BENCH_SHARDS" \
          --jobs "$BENCH_JOBS") || { printf '%s\n' "${lib_out:-}"; fail "bench_ckpt failed"; }
printf '%s\n' "$lib_out" | sed 's/^/  /'

# ---- table
python3 - "$fio_write" "$fio_read" "$hash_bw" "$lib_out" <<'EOF'
import sys
fio_w, fio_r, hash_bw = (float(x) / 1e9 for x in sys.argv[1:4])
lib = {}
for line in sys.argv[4].splitlines():
    kv = dict(f.split("=", 1) for f in line.split() if "=" in f)
    for k, v in kv.items():
        if k.endswith("_gbps") or k == "cold_cache":
            lib[k] = v
save, verify, load = (float(lib[k]) for k in ("save_gbps", "verify_gbps", "load_verify_gbps"))
print()
print("%-34s %8s" % ("machine", "GB/s"))
print("%-34s %8.3f" % ("fio write (O_DIRECT, QD16)", fio_w))
print("%-34s %8.3f" % ("fio read (O_DIRECT, QD16)", fio_r))
print("%-34s %8.3f" % ("SHA-256, 2 cores (cached)", hash_bw))
print()
print("%-24s %8s %8s %-32s %6s  %s" % ("library", "GB/s", "target", "(target rule)", "ratio", ""))
rows = [
    ("save", save, 0.9 * fio_w, "0.9 x fio write", 0.9),
    ("verify", verify, 0.9 * hash_bw, "0.9 x 2-core hash", 0.9),
    ("load + verification", load, 0.8 * min(fio_r, hash_bw),
     "0.8 x min(fio read, 2-core hash)", 0.8),
]
for name, got, target, rule, k in rows:
    ratio = got / (target / k)
    print("%-24s %8.3f %8.3f %-32s %6.2f  %s" % (name, got, target, rule, ratio,
                                                  "PASS" if got >= target else "BELOW"))
print()
print("ratio = library / machine figure (the target is %s of it); cold cache between phases: %s"
      % ("0.9 or 0.8", lib.get("cold_cache", "?")))
EOF
