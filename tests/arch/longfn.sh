#!/bin/sh
# longfn.sh: functions longer than the limit (150 lines) in ckpt/ formats/ core/ cli/ (.c, .cu,
# .h). A function's length runs from the first line of its definition (return type, qualifiers)
# to its closing brace, both included; comments, string and character literals and preprocessor
# lines are skipped when the braces are counted. Each offender prints as
#   too long: FILE:LINE: NAME: N lines (max 150)
# and fails (exit 1) unless the allowlist (--allow FILE) has a line "longfn FILE NAME"; an
# allowlist entry that no longer offends fails too, so the list cannot rot. Exit 2: usage.
#
# usage: longfn.sh [--root DIR] [--allow FILE] [--max N] [FILE...]
#   FILE...  the files to read, relative to the root (default: every source of the four folders)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root="$here/../.."
allow=""
max=150
while [ $# -gt 0 ]; do
    case "$1" in
    --root) root="$2"; shift 2 ;;
    --allow) allow="$2"; shift 2 ;;
    --max) max="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    --*) echo "longfn: error: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
case "$max" in
''|*[!0-9]*) echo "longfn: error: --max wants a number, got '$max'" >&2; exit 2 ;;
esac
# the allowlist is named from where we were started
case "$allow" in ""|/*) ;; *) allow="$PWD/$allow" ;; esac
cd "$root" || exit 2
if [ $# -eq 0 ]; then
    set -- $(find ckpt formats core cli -type f \( -name '*.c' -o -name '*.cu' -o -name '*.h' \) \
             2>/dev/null | LC_ALL=C sort)
fi
[ $# -gt 0 ] || { echo "longfn: error: no sources under $root" >&2; exit 2; }

# one line per function over the limit: "longfn FILE NAME<TAB>FILE:LINE: NAME: N lines"
found=$(awk -v max="$max" '
function reset_head() { head = ""; headline = 0 }
# the name of the function that the head of a definition declares ("" when the head is no function),
# found from the end: the last parenthesized group is the parameter list, the name is right before
# it; the definition starts after the ")" before the name (a macro that expands to a function)
function fn_name(h,    i, p, d, c, name, pre, start, decl, lead) {
    sub(/[ \t\n]*((const|noexcept)[ \t\n]*)*$/, "", h)
    if (substr(h, length(h), 1) != ")")
        return ""
    for (i = length(h); i > 0; i--) {
        c = substr(h, i, 1)
        if (c == ")") d++
        else if (c == "(" && --d == 0) break
    }
    pre = substr(h, 1, i - 1)
    if (!match(pre, /[A-Za-z_][A-Za-z0-9_:~]*[ \t\n]*$/))
        return ""
    name = substr(pre, RSTART)
    sub(/[ \t\n]+$/, "", name)
    start = RSTART
    p = 0
    for (i = start - 1; i > 0; i--)
        if (substr(h, i, 1) == ")") { p = i; break }
    decl = substr(h, p + 1, start - 1 - p)
    if (decl ~ /=/)
        return ""
    # the line where the definition starts: the first line of the head plus the line breaks before
    # the first word of the definition
    match(decl, /^[ \t\n]*/)
    lead = substr(h, 1, p + RLENGTH)
    fstart = headline + gsub(/\n/, "", lead)
    return name
}
function open_brace(    name) {
    if (fdepth > 0) { fdepth++; return }
    name = fn_name(head)
    if (name != "") {
        fdepth = 1; fname = name
    } else {
        blocks++            # struct, initializer, namespace, extern "C": not a function
    }
    reset_head()
}
function close_brace(    len) {
    if (fdepth > 0) {
        if (--fdepth == 0) {
            len = FNR - fstart + 1
            if (len > max)
                printf "longfn %s %s\t%s:%d: %s: %d lines (max %d)\n", FILENAME, fname,
                       FILENAME, fstart, fname, len, max
        }
    } else if (blocks > 0) {
        blocks--
    }
    reset_head()
}
FNR == 1 { fdepth = 0; blocks = 0; incomment = 0; pp = 0; reset_head() }
{
    line = $0
    if (!incomment && (pp || line ~ /^[ \t]*#/)) { pp = (line ~ /\\$/); next }
    n = length(line)
    for (i = 1; i <= n; i++) {
        c = substr(line, i, 1)
        if (incomment) {
            if (c == "*" && substr(line, i + 1, 1) == "/") { incomment = 0; i++ }
            continue
        }
        if (c == "/" && substr(line, i + 1, 1) == "*") { incomment = 1; i++; continue }
        if (c == "/" && substr(line, i + 1, 1) == "/") break
        if (c == "\"" || c == "\047") {
            q = c
            for (i++; i <= n; i++) {
                d = substr(line, i, 1)
                if (d == "\\") { i++; continue }
                if (d == q) break
            }
            if (fdepth == 0) head = head q q
            continue
        }
        if (c == "{") open_brace()
        else if (c == "}") close_brace()
        else if (c == ";") { if (fdepth == 0) reset_head() }
        else if (fdepth == 0) {
            if (!headline && c !~ /[ \t]/) headline = FNR
            head = head c
        }
    }
    if (fdepth == 0 && headline) head = head "\n"
}
' "$@") || exit 2

# the allowlist: "longfn FILE NAME" lines; what is listed passes, a listed name that passes fails
printf '%s\n' "$found" | awk -F '\t' -v allow="$allow" -v max="$max" '
BEGIN {
    if (allow != "") {
        while ((r = getline line < allow) > 0) {
            ln++
            sub(/#.*/, "", line)
            if (split(line, w, /[ \t]+/) >= 1 && line ~ /^[ \t]*longfn[ \t]/) {
                gsub(/^[ \t]+|[ \t]+$/, "", line); gsub(/[ \t]+/, " ", line)
                listed[line] = ln
            }
        }
        if (r < 0) { print "longfn: error: cannot read " allow > "/dev/stderr"; err = 1; exit 2 }
    }
}
$0 != "" {
    total++
    if ($1 in listed) { print "allowed: " $2; seen[$1] = 1; nallowed++ }
    else { print "too long: " $2; bad++ }
}
END {
    if (err)
        exit 2
    for (k in listed)
        if (!(k in seen)) {
            printf "%s:%d: stale allowlist entry, no longer over %d lines: %s\n", allow,
                   listed[k], max, k
            bad++
        }
    printf "longfn: %d functions over %d lines (%d allowed)\n", total, max, nallowed
    exit bad ? 1 : 0
}'
