# common.sh: what the benchmark scripts share, sourced first: `. "$(dirname
# "${BASH_SOURCE[0]}")/common.sh" TAG`. Sets here (this folder), root (the repository) and
# BENCH_DIR (the scratch directory: build/bench-scratch unless set), and defines say (a line
# prefixed [TAG]) and fail (an error line on stderr, then exit 1).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
BENCH_DIR=${BENCH_DIR:-$root/build/bench-scratch}
bench_tag=$1
say() { printf '[%s] %s\n' "$bench_tag" "$*"; }
fail() { printf '[%s] error: %s\n' "$bench_tag" "$*" >&2; exit 1; }
