#!/usr/bin/env python3
"""Small files of PyTorch's own making for the foreign-checkpoint readers' unit tests
(tests/test_foreign.c): torch.save zips and a one-process DCP save, written by torch itself.

  torch_files.py save OUT.pt
      torch.save of a dict that holds what checkpoints hold: an OrderedDict state dict of
      float32, bfloat16, float16 and int64 tensors (one a view into another's storage, one
      transposed), ints (one over 2^31, one negative), a float, text, bytes, a set, None, a
      bool, a list and a torch.Size. Also OUT.pt.expect: one line per tensor of the state dict,
      "name dtype d0,d1,... sha256" ("-" for no dimension), the hash of its values in row-major order.
  torch_files.py dcp DIR
      torch.distributed.checkpoint.save (one process, no process group) of a state dict of
      two tensors (float32 [40, 24], bfloat16 [24]) and a Python int (a bytes item).
  torch_files.py evil OUT.pt KIND MARKER
      a torch.save zip whose data.pkl calls os.system (KIND system) or builtins.eval (KIND
      eval) to create the file MARKER, as a hostile checkpoint would; torch.load(weights_only=
      False) would run it.

Exits 77 with one line when torch cannot be imported (the tests skip).
"""
import collections
import hashlib
import os
import pickle
import sys
import zipfile

try:
    import torch
    import torch.distributed.checkpoint as dcp
except Exception as e:
    print("torch_files.py: cannot import torch: %s" % str(e).splitlines()[0])
    sys.exit(77)


def save(out):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 5, generator=g)
    sd = collections.OrderedDict()
    sd["w"] = base
    sd["view"] = base[2:5]                    # a view: offset 10 into w's storage
    sd["wt"] = base.t()                       # strides (1, 5)
    sd["b"] = torch.randn(7, generator=g).to(torch.bfloat16)
    sd["h"] = torch.randn(3, 2, generator=g).to(torch.float16)
    sd["i"] = torch.tensor([1, -2, 2 ** 40], dtype=torch.int64)
    sd["scalar"] = torch.tensor(2.5)
    obj = {"state_dict": sd, "step": 7, "big": 2 ** 40, "neg": -5, "lr": 1e-3, "name": "x",
           "flag": True, "none": None, "list": [1, 2, 3], "set": {4}, "bytes": b"\x00\xffab",
           "size": torch.Size([3, 4])}
    torch.save(obj, out)
    with open(out + ".expect", "w") as f:
        for name, t in sd.items():
            data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else \
                t.reshape(1).view(torch.uint8).numpy().tobytes()
            dtype = str(t.dtype).replace("torch.", "")
            f.write("%s %s %s %s\n" % (name, dtype, ",".join(str(d) for d in t.shape) or "-",
                                       hashlib.sha256(data).hexdigest()))
    print("%s: torch.save of %d tensors" % (out, len(sd)))


def save_dcp(d):
    g = torch.Generator().manual_seed(5)
    sd = {"model.w": torch.randn(40, 24, generator=g),
          "model.b": torch.randn(24, generator=g).to(torch.bfloat16), "step": 11}
    dcp.save(sd, checkpoint_id=d)
    print("%s: DCP save (%s)" % (d, ", ".join(sorted(os.listdir(d)))))


class Evil:
    def __init__(self, kind, marker):
        self.kind, self.marker = kind, marker

    def __reduce__(self):
        if self.kind == "system":
            return (os.system, ("touch '%s'" % self.marker,))
        return (eval, ("open(%r, 'w').close()" % self.marker,))


def evil(out, kind, marker):
    torch.save({"w": torch.zeros(2)}, out)
    with zipfile.ZipFile(out) as z:
        records = [(i, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info, data in records:
            if info.filename.endswith("/data.pkl"):
                data = pickle.dumps({"w": Evil(kind, marker)}, protocol=2)
            z.writestr(info.filename, data)
    print("%s: data.pkl calls %s" % (out, "os.system" if kind == "system" else "eval"))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "save" and len(args) == 1:
        save(*args)
    elif cmd == "dcp" and len(args) == 1:
        save_dcp(*args)
    elif cmd == "evil" and len(args) == 3:
        evil(*args)
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
