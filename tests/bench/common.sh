# common.sh: what the benchmark scripts share, sourced first: `. "$(dirname
# "${BASH_SOURCE[0]}")/common.sh" TAG`. Sets here (this folder), root (the repository) and
# BENCH_DIR (the scratch directory: build/bench-scratch unless set), and defines say (a line
# prefixed [TAG]), fail (an error line on stderr, then exit 1), need_zrun (ZRUN: the zrun
# given, or build/zrun brought up to date with make) and scratch NAME (s: a fresh directory
# under BENCH_DIR, removed on exit).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
BENCH_DIR=${BENCH_DIR:-$root/build/bench-scratch}
bench_tag=$1
say() { printf '[%s] %s\n' "$bench_tag" "$*"; }
fail() { printf '[%s] error: %s\n' "$bench_tag" "$*" >&2; exit 1; }
need_zrun() {
    if [ -z "${ZRUN:-}" ]; then
        make -C "$root" --no-print-directory build/zrun >/dev/null || fail "make build/zrun failed"
        ZRUN=$root/build/zrun
    fi
    [ -x "$ZRUN" ] || fail "$ZRUN: not an executable"
}
scratch() {
    mkdir -p "$BENCH_DIR"
    s=$(mktemp -d "$BENCH_DIR/$1.XXXXXX")
    trap 'rm -rf "$s"' EXIT
}
