#!/usr/bin/env bash
# zckpt_bench.sh: part of `make bench`. On a checkpoint of BENCH_GIB GiB (default 1) in 4
# shards, in one run: `zckpt reshard --world 16` against `cp -r` + sync, `zckpt verify` against
# two parallel `openssl dgst -sha256`, `zckpt consolidate` to safetensors against `cat` of the
# shards + sync (medians of CS_ROUNDS alternating pairs, default 5), and the peak RSS of
# reshard and consolidate. Caches are dropped before each
# timed command when the machine allows it (said in the output). A benchmark: exits 0 whether or
# not targets are met, non-zero only when a command fails.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/common.sh" zckpt-bench
ZCKPT=${ZCKPT:-$root/build/zckpt}
MKCKPT=${MKCKPT:-$root/build/mkckpt}
BENCH_GIB=${BENCH_GIB:-1}
CS_ROUNDS=${CS_ROUNDS:-5}
[[ $CS_ROUNDS =~ ^[1-9][0-9]*$ ]] || fail "CS_ROUNDS must be a positive integer"
scratch zckpt

cold() {
    sync
    if { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null; then echo cold; else echo warm; fi
}
# time a command: prints "seconds peak_rss_kib"
timed() {
    /usr/bin/time -f '%e %M' -o "$s/time" "$@" >/dev/null
    cat "$s/time"
}

say "making a ${BENCH_GIB} GiB checkpoint in 4 shards (random non-zero data)"
"$MKCKPT" "$s/src" "$BENCH_GIB" 4
ck=$(ls -d "$s"/src/step-*)
bytes=$(du -sb "$ck" | cut -f1)

c=$(cold); read -r t_cp _ < <(timed bash -c "cp -r '$ck' '$s/copy' && sync")
c2=$(cold); read -r t_rs rss_rs < <(timed "$ZCKPT" reshard "$ck" --world 16 -o "$s/r16")
sync
c3=$(cold); read -r t_ossl _ < <(timed bash -c \
    "openssl dgst -sha256 $ck/shard-0000[01]-*.bin >/dev/null & \
     openssl dgst -sha256 $ck/shard-0000[23]-*.bin >/dev/null; wait")
c4=$(cold); read -r t_vf _ < <(timed "$ZCKPT" verify "$ck" --jobs 2)
# consolidate and cat in CS_ROUNDS alternating pairs (the shared disk varies by 2x from one
# command to the next): the medians
t_cats=() t_css=() rss_cs=0
for ((i = 0; i < CS_ROUNDS; i++)); do
    c5=$(cold); read -r t _ < <(timed bash -c "cat $ck/shard-*.bin > '$s/cat.bin' && sync")
    t_cats+=("$t")
    rm -f "$s/cat.bin"
    c6=$(cold); read -r t r < <(timed bash -c \
        "'$ZCKPT' consolidate '$ck' -o '$s/all.safetensors' && sync")
    t_css+=("$t")
    ((r > rss_cs)) && rss_cs=$r
    rm -f "$s/all.safetensors"
    say "consolidate pair $((i + 1))/$CS_ROUNDS: cat + sync $(echo "${t_cats[-1]}") s, consolidate + sync $t s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
t_cat=$(median "${t_cats[@]}")
t_cs=$(median "${t_css[@]}")

python3 - "$bytes" "$t_cp" "$t_rs" "$rss_rs" "$t_ossl" "$t_vf" "$t_cat" "$t_cs" "$rss_cs" \
    "$c $c2 $c3 $c4 $c5 $c6" <<'PY'
import sys
b, tcp, trs, rrs, tos, tvf, tcat, tcs, rcs = map(float, sys.argv[1:10])
caches = sys.argv[10]
g = b / 1e9
def row(name, t, base, tb, target, ok):
    print(f"  {name:<34} {t:7.2f} s {g/t:6.2f} GB/s   vs {base:<26} {tb:7.2f} s   ratio {t/tb if 'time' in target else tb/t:5.2f}  target {target:<12} {'PASS' if ok else 'BELOW'}")
print(f"[zckpt-bench] checkpoint {b/2**30:.2f} GiB in 4 shards; caches: {caches}")
row("zckpt reshard --world 16", trs, "cp -r + sync", tcp, "time <= 1.3x", trs <= 1.3 * tcp)
row("zckpt verify --jobs 2", tvf, "2 x openssl dgst -sha256", tos, "rate >= 0.9x", tos / tvf >= 0.9)
row("zckpt consolidate -> safetensors", tcs, "cat shards + sync", tcat, "time <= 1.3x", tcs <= 1.3 * tcat)
print(f"  peak RSS: reshard {rrs/1024:.0f} MiB, consolidate {rcs/1024:.0f} MiB (target < 300 MiB): "
      f"{'PASS' if max(rrs, rcs) < 300 * 1024 else 'BELOW'}")
PY
