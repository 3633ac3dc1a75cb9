"""ckpt_io.py: ckpt_io.sh's comparison (issue 27): torch.save and DCP's save of BYTES bytes of
random f32 tensors (16 MiB each), from the oracle venv.

usage: python ckpt_io.py DIR BYTES FILES

torch.save writes FILES files (one state dict each), DCP (torch.distributed.checkpoint.save,
one process, no process group) one checkpoint directory; each is followed by an fsync of every
file it wrote (DCP's own writer does not fsync) and of the directory. Prints one line per
writer: "torch_save SECONDS BYTES" and "dcp_save SECONDS BYTES".
"""
import os
import sys
import time

import torch


def fsync_tree(d):
    for base, _, files in os.walk(d):
        for f in files:
            fd = os.open(os.path.join(base, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(base, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    d, total, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    per = 4 << 20  # elements per tensor (16 MiB)
    n = max(1, total // 4)
    gen = torch.Generator().manual_seed(27)
    states = [{} for _ in range(files)]
    k = 0
    while n > 0:
        m = min(per, n)
        states[k % files]["t%05d" % k] = torch.rand(m, generator=gen) + 0.5
        n -= m
        k += 1
    written = sum(t.numel() * 4 for s in states for t in s.values())

    os.makedirs(os.path.join(d, "torch"), exist_ok=True)
    t0 = time.perf_counter()
    for i, s in enumerate(states):
        torch.save(s, os.path.join(d, "torch", "rank%d.pt" % i))
    fsync_tree(os.path.join(d, "torch"))
    print("torch_save %.3f %d" % (time.perf_counter() - t0, written), flush=True)

    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:
        return
    flat = {k: v for s in states for k, v in s.items()}
    t0 = time.perf_counter()
    dcp.save(flat, checkpoint_id=os.path.join(d, "dcp"))
    fsync_tree(os.path.join(d, "dcp"))
    print("dcp_save %.3f %d" % (time.perf_counter() - t0, written), flush=True)


if __name__ == "__main__":
    main()
