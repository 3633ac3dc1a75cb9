#!/usr/bin/env python3
"""bigmanifest.py: make a checkpoint with a big but valid manifest, to measure what parsing one
costs (docs/FORMAT.md section 2): `bigmanifest.py DIR GROUPS TENSORS [JUNK]` writes DIR/
manifest.json for GROUPS groups of TENSORS tensors each (shape [4], f32), three f32 states, one
rank, with one sparse shard of the right size (its hash is not that of its bytes: a quick check
passes, a full one does not) and SHA256SUMS. With JUNK, an unknown top-level field "junk" of
JUNK empty objects is added (the hostile case the reader refuses before parsing).

  tests/bench/bigmanifest.py /tmp/big 30000 30      # 900k tensors, about 50 MB
  /usr/bin/time -v build/zckpt inspect /tmp/big     # "Maximum resident set size"
"""
import hashlib
import json
import os
import sys


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    d, groups, tensors = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    junk = int(sys.argv[4]) if len(sys.argv) == 5 else 0
    os.makedirs(d, exist_ok=True)
    states = ["param", "exp_avg", "exp_avg_sq"]
    fake = "0" * 64
    extents, off = [], 0
    g_json = []
    for g in range(groups):
        t_json = [{"name": "g%d.t%d" % (g, t), "dtype": "f32", "shape": [4], "offset": 4 * t}
                  for t in range(tensors)]
        g_json.append({"name": "g%d" % g, "numel": 4 * tensors, "tensors": t_json})
        for s in range(len(states)):
            extents.append({"group": g, "state": s, "start": 0, "count": 4 * tensors,
                            "offset": off})
            off += (16 * tensors + 4095) // 4096 * 4096
    shard = "shard-00000-of-00001.bin"
    m = {"format": "zckpt", "version": "1.0", "step": 1, "created": "2026-01-01T00:00:00Z",
         "producer": "bigmanifest.py", "world_size": 1, "zero_stage": 0,
         "partition_align": 64, "file_align": 4096, "model": {}, "training": {},
         "dtypes": {"f32": 4}, "states": [{"name": s, "dtype": "f32"} for s in states],
         "groups": g_json,
         "shards": [{"file": shard, "rank": 0, "bytes": off, "sha256": fake,
                     "extents": extents}]}
    text = json.dumps(m, separators=(",", ":"))
    if junk:
        text = text[:text.rindex("}")] + ', "junk": [' + ",".join(["{}"] * junk) + "]}"
    text += "\n"
    with open(os.path.join(d, "manifest.json"), "w") as f:
        f.write(text)
    with open(os.path.join(d, shard), "wb") as f:
        f.truncate(off)
    mh = hashlib.sha256(text.encode()).hexdigest()
    with open(os.path.join(d, "SHA256SUMS"), "w") as f:
        f.write("%s  %s\n%s  manifest.json\n" % (fake, shard, mh))
    print("%s: %d tensors, manifest %d bytes, shard %d bytes (sparse)"
          % (d, groups * tensors, len(text), off))


if __name__ == "__main__":
    main()
