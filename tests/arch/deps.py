#!/usr/bin/env python3
"""deps.py: the include graph between the folders of zero, and the rules it must follow.

Every source (.c, .cu) and header of each folder is read with the include paths its folder is
compiled with (the Makefile's INC_<folder>, read by asking make), and each #include is resolved
the way the compiler does: a quoted name in the directory of the file that holds the #include,
then in the -I directories in order; an angle name in the -I directories only. A name found in
none of them is a system header and is no part of the graph. Every #include line counts,
whatever #if surrounds it.

It fails (exit 1) when a folder includes a folder it may not use (RULES below), when cli/
includes anything but the three public headers, when a file outside tests/ uses a relative
include ("../x.h"), or with --check when the picture in docs/ARCHITECTURE.md (between
<!-- deps:begin --> and <!-- deps:end -->) differs from the one the sources give; --write
rewrites that picture (make arch). Offenders listed in the allowlist (--allow, lines
"include FILE HEADER" or "relative FILE NAME") are reported but pass, and an allowlist entry
that no longer offends fails, so the list cannot rot. Exit status 2: usage or a broken tree.

usage: deps.py [--root DIR] [--allow FILE] [--check | --write]
"""
import argparse
import difflib
import os
import re
import subprocess
import sys

# folder -> what it is compiled with (the Makefile's INC_ variable) and where its files are
FOLDERS = {
    "ckpt": ("INC_ckpt", "ckpt"),
    "formats": ("INC_formats", "formats"),
    "core/model": ("INC_model", "core/model"),
    "core/dist": ("INC_dist", "core/dist"),
    "core/device": ("INC_device", "core/device"),
    "cuda": ("INC_cuda", "core/device/cuda"),
    "core/zero": ("INC_zero", "core/zero"),
    "core/train": ("INC_train", "core/train"),
    "cli": ("INC_cli", "cli"),
}
# the folders each folder may include (besides itself); "core" is the umbrella header core/zr.h
RULES = {
    "ckpt": set(),
    "formats": {"ckpt"},
    "core/model": {"ckpt"},
    "core/dist": {"ckpt"},
    "core/device": {"core/model", "core/dist", "ckpt"},
    "cuda": {"core/device", "core/model", "ckpt"},
    "core/zero": {"core/device", "core/model", "core/dist", "ckpt"},
    "core/train": {"core", "core/zero", "core/device", "core/model", "core/dist", "ckpt"},
    "core": {"core/train", "core/model", "core/dist", "ckpt"},
    "cli": {"ckpt", "formats", "core"},
}
# cli/ reaches the other folders only through these files, and core/zr.h gathers only these
CLI_PUBLIC = {"ckpt/zck.h", "formats/zfmt.h", "core/zr.h"}
CORE_PUBLIC = {"ckpt/zck.h", "core/model/model.h", "core/train/train.h", "core/dist/dist.h"}
# the order of the picture, top to bottom
ORDER = ["cli", "core", "core/train", "core/zero", "cuda", "core/device", "core/model",
         "core/dist", "formats", "ckpt", "tests"]
BEGIN = "<!-- deps:begin -->"
END = "<!-- deps:end -->"
DOC = "docs/ARCHITECTURE.md"
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def die(msg):
    print("deps: error: " + msg, file=sys.stderr)
    sys.exit(2)


def folder_of(path):
    """the graph node of a repository-relative path (None: outside every known folder)"""
    if path.startswith("core/") and path.count("/") == 1:
        return "core"  # core/zr.h, the umbrella header
    if path.startswith("tests/"):
        return "tests"
    best = None
    for name, (_, d) in FOLDERS.items():
        if path.startswith(d + "/") and (best is None or len(d) > len(FOLDERS[best][1])):
            best = name
    if best is None and path.startswith("core/") and path.count("/") >= 2:
        return "core/" + path.split("/")[1]  # a new core folder: no rules yet, reported
    return best


def make_includes(root):
    """the INC_* variables of the Makefile, as make expands them: {name: [dir, ...]}"""
    prog = 'zr-arch-inc:\n\t@:$(foreach v,$(filter INC_%,$(.VARIABLES)),' \
           '$(info $(v)=$($(v))))\n'
    # a make of its own, not a part of the make that may have started us (make arch, make test)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    try:
        p = subprocess.run(["make", "--no-print-directory", "-s", "-C", root, "-f", "Makefile",
                            "-f", "-", "zr-arch-inc"], input=prog, capture_output=True,
                           text=True, check=False, env=env)
    except OSError as e:
        die("cannot run make: %s" % e)
    if p.returncode != 0:
        die("make could not read %s/Makefile: %s" % (root, p.stderr.strip()))
    inc = {}
    for line in p.stdout.splitlines():
        m = re.match(r"^(INC_\w+)=(.*)$", line)
        if m:
            inc[m.group(1)] = re.findall(r"-I\s*(\S+)", m.group(2))
    return inc


def read_includes(root, rel):
    """[(line, kind, name)] of the #include lines of a file"""
    out = []
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        for n, text in enumerate(f, 1):
            m = INCLUDE_RE.match(text)
            if m:
                out.append((n, m.group(1), m.group(2)))
    return out


def resolve(root, rel, kind, name, dirs):
    """the repository-relative path the compiler would open, or None for a system header"""
    cand = ([os.path.dirname(rel)] if kind == '"' else []) + dirs
    for d in cand:
        p = os.path.normpath(os.path.join(d, name))
        if not p.startswith("..") and os.path.isfile(os.path.join(root, p)):
            return p
    return None


def sources(root, d):
    """the files of folder d itself (not of its subfolders), sorted"""
    full = os.path.join(root, d)
    if not os.path.isdir(full):
        return []
    return sorted(os.path.join(d, f) for f in os.listdir(full)
                  if f.endswith((".c", ".cu", ".h")) and os.path.isfile(os.path.join(full, f)))


def scan(root, inc):
    """walk every translation unit: the edges {(from, to): {header}} and the offenders"""
    edges, offenders, relatives = {}, {}, {}
    for name, (var, d) in FOLDERS.items():
        if var not in inc and sources(root, d):
            die("the Makefile has no %s (the include paths of %s/)" % (var, d))
        dirs = inc.get(var, [])
        seen = set()
        stack = sources(root, d)
        while stack:
            rel = stack.pop()
            if rel in seen:
                continue
            seen.add(rel)
            src = folder_of(rel)
            for line, kind, hname in read_includes(root, rel):
                where = "%s:%d" % (rel, line)
                if ".." in hname.split("/") and src != "tests":
                    relatives[("relative", rel, hname)] = "%s: relative include \"%s\"" % (
                        where, hname)
                target = resolve(root, rel, kind, hname, dirs)
                if target is None:
                    continue
                dst = folder_of(target) or os.path.dirname(target)
                if target.endswith((".h", ".c", ".cu")):
                    stack.append(target)
                if dst == src:
                    continue
                edges.setdefault((src, dst), set()).add(os.path.basename(target))
                why = forbidden(src, dst, target)
                if why:
                    offenders[("include", rel, target)] = "%s: %s includes %s: %s" % (
                        where, src, target, why)
    offenders.update(relatives)
    return edges, offenders


def forbidden(src, dst, target):
    """why src may not include target (in folder dst), or None"""
    if src == "tests":
        return None
    if src not in RULES:
        return "%s/ has no rules in tests/arch/deps.py" % src
    if dst not in RULES[src]:
        allowed = ", ".join(sorted(RULES[src])) or "nothing"
        return "%s may use only: %s" % (src, allowed)
    if src == "cli" and target not in CLI_PUBLIC:
        return "cli/ may include only the public headers %s" % ", ".join(sorted(CLI_PUBLIC))
    if src == "core" and target not in CORE_PUBLIC:
        return "core/zr.h may gather only the public headers %s" % ", ".join(sorted(CORE_PUBLIC))
    return None


def picture(edges):
    """the mermaid flowchart of the folder graph, one edge per line, labelled by header"""
    def rank(n):
        return (ORDER.index(n) if n in ORDER else len(ORDER), n)

    def node(n):
        return re.sub(r"[^A-Za-z0-9]", "_", n)

    label = {"core": "core/zr.h", "cuda": "core/device/cuda/"}
    nodes = sorted({n for e in edges for n in e}, key=rank)
    out = [BEGIN,
           "<!-- generated by tests/arch/deps.py from the #include lines (make arch); "
           "do not edit by hand -->",
           "```mermaid", "flowchart TD"]
    for n in nodes:
        out.append('    %s["%s"]' % (node(n), label.get(n, n + "/")))
    for (a, b) in sorted(edges, key=lambda e: (rank(e[0]), rank(e[1]))):
        out.append('    %s -->|"%s"| %s' % (node(a), " ".join(sorted(edges[(a, b)])), node(b)))
    out += ["```", END]
    return "\n".join(out) + "\n"


def doc_split(root):
    """(text before the picture, the picture, text after it) of ARCHITECTURE.md"""
    path = os.path.join(root, DOC)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        die("%s: %s" % (DOC, e.strerror))
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b or text.count(BEGIN) != 1 or text.count(END) != 1:
        die("%s: expected one %s ... %s pair" % (DOC, BEGIN, END))
    e += len(END)
    if text[e:e + 1] == "\n":
        e += 1
    return text[:b], text[b:e], text[e:]


def read_allow(path):
    """the include and relative entries of the allowlist: {key: line number}"""
    allow = {}
    if not path:
        return allow
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                w = line.split("#", 1)[0].split()
                if w and w[0] in ("include", "relative"):
                    if len(w) != 3:
                        die("%s:%d: expected '%s FILE HEADER'" % (path, n, w[0]))
                    allow[tuple(w)] = n
    except OSError as e:
        die("%s: %s" % (path, e.strerror))
    return allow


def main():
    ap = argparse.ArgumentParser(description="the include graph between folders, and its rules")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--allow", help="allowlist of known offenders (tests/arch/allow.txt)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail when the picture is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the picture in " + DOC)
    a = ap.parse_args()
    root = os.path.normpath(a.root)
    edges, offenders = scan(root, make_includes(root))
    allow = read_allow(a.allow)
    bad = 0
    for key in sorted(offenders):
        if key in allow:
            print("allowed: " + offenders[key])
        else:
            print("forbidden: " + offenders[key])
            bad += 1
    for key in sorted(set(allow) - set(offenders)):
        print("%s:%d: stale allowlist entry, no longer offends: %s" % (a.allow, allow[key],
                                                                      " ".join(key)))
        bad += 1
    pic = picture(edges)
    if a.write or a.check:
        head, old, tail = doc_split(root)
        if a.write and old != pic:
            with open(os.path.join(root, DOC), "w", encoding="utf-8") as f:
                f.write(head + pic + tail)
            print("deps: rewrote the picture in " + DOC)
        elif a.check and old != pic:
            print("deps: the picture in %s is stale (run make arch):" % DOC)
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), pic.splitlines(True), DOC + " (committed)",
                DOC + " (from the sources)", n=1))
            bad += 1
    else:
        print(pic, end="")
    print("deps: %d folders, %d arrows, %d forbidden includes (%d allowed)" % (
        len({n for e in edges for n in e}), len(edges), len(offenders) - len(
            set(offenders) & set(allow)), len(set(offenders) & set(allow))))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
