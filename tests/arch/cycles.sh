#!/bin/sh
# cycles.sh: object files in a dependency circle, per library (ckpt, formats, core). Object A
# depends on object B of the same library when A has an undefined symbol that B defines (nm).
# Each strongly connected component of more than one object is a circle; it prints as
#   circle in core: core/zero/zero.o core/zero/zero_dev.o
# followed by the arrows inside it, each with the symbols that make it, and fails (exit 1)
# unless the allowlist (--allow FILE) has the line "cycle LIB OBJ..." (the objects in the
# order printed); an allowlist entry that is no longer a circle fails too, so the list cannot
# rot. The last line gives the count. Exit 2: usage, or a library without objects.
#
# usage: cycles.sh [--allow FILE] [BUILD_DIR]    (BUILD_DIR: default build/ of the repository)
set -u
here=$(cd "$(dirname "$0")" && pwd)
allow=""
while [ $# -gt 0 ]; do
    case "$1" in
    --allow) allow="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    --*) echo "cycles: error: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
# the allowlist is named from where we were started
case "$allow" in ""|/*) ;; *) allow="$PWD/$allow" ;; esac
build="${1:-$here/../../build}"
cd "$build" 2>/dev/null || { echo "cycles: error: no build directory $build" >&2; exit 2; }
command -v nm >/dev/null 2>&1 || { echo "cycles: error: nm not found (binutils)" >&2; exit 2; }

# "LIB OBJ TYPE SYMBOL" for every symbol of every object of the three libraries
syms=""
for lib in ckpt formats core; do
    objs=$(find "$lib" -name '*.o' 2>/dev/null | LC_ALL=C sort)
    if [ -z "$objs" ]; then
        echo "cycles: error: no objects in $build/$lib (run make first)" >&2
        exit 2
    fi
    # shellcheck disable=SC2086 # object paths have no spaces (the Makefile names them)
    out=$(nm -A -P $objs) || { echo "cycles: error: nm failed in $build/$lib" >&2; exit 2; }
    syms="$syms$(printf '%s\n' "$out" | awk -v lib="$lib" 'NF >= 3 { sub(/:$/, "", $1);
                                                                   print lib, $1, $3, $2 }')
"
done

printf '%s' "$syms" | awk -v allow="$allow" '
# defined globals: upper-case types other than U (text, data, bss, read-only, weak, common)
$3 ~ /^[ABCDGRSTVWi]$/ { def[$1 SUBSEP $4] = $2 }
$3 == "U" { nu++; ulib[nu] = $1; uobj[nu] = $2; usym[nu] = $4 }
{ if (!(($1 SUBSEP $2) in known)) { known[$1 SUBSEP $2] = 1; n[$1]++; node[$1, n[$1]] = $2;
                                    idx[$1, $2] = n[$1] } }
END {
    if (allow != "") {
        while ((r = getline line < allow) > 0) {
            ln++
            sub(/#.*/, "", line)
            if (line ~ /^[ \t]*cycle[ \t]/) {
                gsub(/^[ \t]+|[ \t]+$/, "", line); gsub(/[ \t]+/, " ", line)
                listed[line] = ln
            }
        }
        if (r < 0) { print "cycles: error: cannot read " allow > "/dev/stderr"; exit 2 }
    }
    # the arrows, with the symbols behind each
    for (k = 1; k <= nu; k++) {
        l = ulib[k]
        if (!((l SUBSEP usym[k]) in def)) continue
        b = def[l SUBSEP usym[k]]
        if (b == uobj[k]) continue
        i = idx[l, uobj[k]]; j = idx[l, b]
        reach[l, i, j] = 1
        if ((l SUBSEP i SUBSEP j) in why) why[l, i, j] = why[l, i, j] " " usym[k]
        else why[l, i, j] = usym[k]
    }
    total = 0; bad = 0
    # libraries in a fixed order, so the output is stable
    split("ckpt formats core", order, " ")
    for (o = 1; o <= 3; o++) {
        l = order[o]
        m = n[l]
        # the transitive closure (Warshall): a few dozen objects per library
        for (k = 1; k <= m; k++)
            for (i = 1; i <= m; i++)
                if ((l SUBSEP i SUBSEP k) in reach)
                    for (j = 1; j <= m; j++)
                        if ((l SUBSEP k SUBSEP j) in reach) reach[l, i, j] = 1
        delete done
        for (i = 1; i <= m; i++) {
            if (i in done) continue
            members = node[l, i]; cnt = 1; mem[1] = i
            for (j = i + 1; j <= m; j++)
                if (((l SUBSEP i SUBSEP j) in reach) && ((l SUBSEP j SUBSEP i) in reach)) {
                    members = members " " node[l, j]; mem[++cnt] = j; done[j] = 1
                }
            if (cnt < 2) continue
            total++
            key = "cycle " l " " members
            if (key in listed) { seen[key] = 1; print "allowed: circle in " l ": " members }
            else { bad++; print "circle in " l ": " members }
            for (a = 1; a <= cnt; a++)
                for (b = 1; b <= cnt; b++)
                    if ((l SUBSEP mem[a] SUBSEP mem[b]) in why)
                        print "    " node[l, mem[a]] " -> " node[l, mem[b]] ": " \
                              why[l, mem[a], mem[b]]
        }
    }
    for (k in listed)
        if (!(k in seen)) {
            printf "%s:%d: stale allowlist entry, no longer a circle: %s\n", allow, listed[k], k
            bad++
        }
    printf "cycles: %d circles between objects (ckpt, formats, core)\n", total
    exit bad ? 1 : 0
}'
