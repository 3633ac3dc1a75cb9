#!/usr/bin/env python3
"""st_read.py: an independent reader of safetensors files for the tests of formats/.

Usage: st_read.py FILE            parse with the standard library only (struct, json)
       st_read.py --numpy FILE    load with safetensors.numpy.load_file instead

Prints one line per tensor in data order: name, dtype, shape (comma-separated), and the SHA-256
of its bytes, separated by tabs; then one line per metadata entry: "__metadata__", key, value.
Checks the file's structure on the way (header length, padding, contiguous offsets, sizes) and
exits with status 1 and a message on stderr when something is wrong.
"""
import hashlib
import json
import struct
import sys

SIZES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "U16": 2,
         "I8": 1, "U8": 1}


def fail(msg):
    sys.stderr.write("st_read.py: %s\n" % msg)
    sys.exit(1)


def read_plain(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail("%s: shorter than 8 bytes" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        fail("%s: header length %d beyond the file" % (path, n))
    if (8 + n) % 8:
        fail("%s: data starts at %d, not a multiple of 8" % (path, 8 + n))
    raw = data[8:8 + n]
    if raw.rstrip(b" ") != raw.rstrip():
        fail("%s: header padded with something other than spaces" % path)
    header = json.loads(raw.decode("utf-8"))
    meta = header.pop("__metadata__", {})
    buf = data[8 + n:]
    at = 0
    rows = []
    for name, e in header.items():  # json keeps the file's order
        b, end = e["data_offsets"]
        if b != at:
            fail("%s: tensor %s starts at %d, expected %d (gap or disorder)" % (path, name, b, at))
        numel = 1
        for d in e["shape"]:
            numel *= d
        if end - b != numel * SIZES[e["dtype"]]:
            fail("%s: tensor %s: %d bytes for shape %s %s" % (path, name, end - b, e["shape"],
                                                             e["dtype"]))
        at = end
        rows.append((name, e["dtype"], e["shape"], hashlib.sha256(buf[b:end]).hexdigest()))
    if at != len(buf):
        fail("%s: %d bytes after the last tensor" % (path, len(buf) - at))
    return rows, meta


def read_numpy(path):
    from safetensors.numpy import load_file  # only when asked: not a dependency
    names = {"float32": "F32", "float16": "F16", "float64": "F64", "int64": "I64",
             "int32": "I32", "int16": "I16", "uint16": "U16", "int8": "I8", "uint8": "U8"}
    # load_file does not say the order; take it from the header
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    meta = header.pop("__metadata__", {})
    order = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    arrays = load_file(path)
    rows = []
    for name in order:
        a = arrays[name]
        rows.append((name, names[str(a.dtype)], list(a.shape),
                     hashlib.sha256(a.tobytes()).hexdigest()))
    return rows, meta


def main():
    args = sys.argv[1:]
    use_numpy = bool(args) and args[0] == "--numpy"
    if use_numpy:
        args = args[1:]
    if len(args) != 1:
        fail("usage: st_read.py [--numpy] FILE")
    rows, meta = (read_numpy if use_numpy else read_plain)(args[0])
    out = sys.stdout
    for name, dtype, shape, digest in rows:
        out.write("%s\t%s\t%s\t%s\n" % (name, dtype, ",".join(str(d) for d in shape), digest))
    for k, v in meta.items():
        out.write("__metadata__\t%s\t%s\n" % (k, v))


if __name__ == "__main__":
    main()
