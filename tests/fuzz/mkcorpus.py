#!/usr/bin/env python3
"""mkcorpus.py: write the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/), valid
inputs and invalid variants of them, small enough to replay in make test. The valid llm.c model
is made here; the checkpoint behind the archive and shard seeds is imported from it and packed
by the real zckpt (build/zckpt, or $ZCKPT). The manifest corpus is test_manifest.c's
(ZT_WRITE_CORPUS); this script leaves it alone.

usage: tests/fuzz/mkcorpus.py            (from the repository root, after make)
"""
import gzip, json, os, shutil, struct, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
ZCKPT = os.environ.get("ZCKPT", os.path.join(ROOT, "build", "zckpt"))

# the tiny GPT-2 every seed describes: L 1, NH 1, C 4, T 2, V 3
L, NH, C, T, V = 1, 1, 4, 2, 3
KINDS = [("ln_1.weight", [C]), ("ln_1.bias", [C]), ("attn.c_attn.weight", [3 * C, C]),
         ("attn.c_attn.bias", [3 * C]), ("attn.c_proj.weight", [C, C]), ("attn.c_proj.bias", [C]),
         ("ln_2.weight", [C]), ("ln_2.bias", [C]), ("mlp.c_fc.weight", [4 * C, C]),
         ("mlp.c_fc.bias", [4 * C]), ("mlp.c_proj.weight", [C, 4 * C]), ("mlp.c_proj.bias", [C])]
CONV1D = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def floats(n, seed):
    return struct.pack("<%df" % n, *[((i * 7 + seed) % 13 - 6) / 8.0 for i in range(n)])


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def reset(target):
    shutil.rmtree(os.path.join(CORPUS, target), ignore_errors=True)


def llmc_model(version=3, Vp=4, hdr_edit=None, tail=b""):
    h = [20240326, version, T, V, L, NH, C, Vp if version == 3 else 0] + [0] * 248
    if hdr_edit:
        hdr_edit(h)
    rows = Vp if version == 3 else V
    sizes = [rows * C, T * C] + [L * numel(s) for _, s in KINDS] + [C, C]
    body = b"".join(floats(n, i) for i, n in enumerate(sizes))
    return struct.pack("<256i", *h) + body + tail


def safetensors(tensors, meta=None, edit=None):
    """tensors: [(name, dtype, shape)]; F32 zeros of the right size"""
    hdr, at = {}, 0
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape in tensors:
        nb = numel(shape) * {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "U8": 1}[dt]
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + nb]}
        at += nb
    if edit:
        edit(hdr)
    text = json.dumps(hdr, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + bytes(at)


def ours():
    t = [("wte", "F32", [V, C]), ("wpe", "F32", [T, C])]
    t += [("h.0." + k, "F32", s) for k, s in KINDS]
    return t + [("ln_f.weight", "F32", [C]), ("ln_f.bias", "F32", [C])]


def gen_safetensors():
    reset("safetensors")
    model = json.dumps({"arch": "gpt2", "layers": L, "heads": NH, "dim": C, "ctx": T, "vocab": V})
    put("safetensors", "ours.safetensors", safetensors(ours(), {"zero.model": model}))
    put("safetensors", "small.safetensors", safetensors([("a", "BF16", [2, 3]), ("b", "U8", [5]),
                                                         ("c", "I64", [])]))
    put("safetensors", "empty.safetensors", safetensors([]))
    good = safetensors([("a", "F32", [2, 2])])
    put("safetensors", "truncated.safetensors", good[:-3])
    put("safetensors", "trailing.safetensors", good + b"\0\0\0\0")
    put("safetensors", "short.safetensors", b"\x02\0\0")
    put("safetensors", "hlen-huge.safetensors", struct.pack("<Q", 1 << 40) + b"{}")
    put("safetensors", "not-json.safetensors", struct.pack("<Q", 4) + b"{x:1")
    put("safetensors", "not-object.safetensors", struct.pack("<Q", 2) + b"[]")

    def gap(h): h["a"]["data_offsets"] = [4, 20]
    put("safetensors", "gap.safetensors", safetensors([("a", "F32", [2, 2])], edit=gap))

    def overlap(h): h["b"]["data_offsets"] = [0, 16]
    put("safetensors", "overlap.safetensors",
        safetensors([("a", "F32", [2, 2]), ("b", "F32", [4])], edit=overlap))

    def dtype(h): h["a"]["dtype"] = "F8_E4M3"
    put("safetensors", "dtype.safetensors", safetensors([("a", "F32", [2, 2])], edit=dtype))

    def shape(h): h["a"]["shape"] = [2, -2]
    put("safetensors", "shape.safetensors", safetensors([("a", "F32", [2, 2])], edit=shape))

    def extra(h): h["a"]["extra"] = 1
    put("safetensors", "extra-field.safetensors", safetensors([("a", "F32", [2, 2])], edit=extra))

    def meta(h): h["__metadata__"] = {"k": 1}
    put("safetensors", "meta.safetensors", safetensors([("a", "F32", [2, 2])], edit=meta))
    dup = safetensors([("a", "F32", [1])]).replace(b'{"a"', b'{"a":{},"a"', 1)
    put("safetensors", "dupkey.safetensors", struct.pack("<Q", len(dup) - 8 + 7) + dup[8:])


def gen_llmc_model():
    reset("llmc_model")
    put("llmc_model", "v3.bin", llmc_model())
    put("llmc_model", "v1.bin", llmc_model(version=1))
    put("llmc_model", "v3-padded.bin", llmc_model(Vp=8))
    put("llmc_model", "truncated.bin", llmc_model()[:-4])
    put("llmc_model", "trailing.bin", llmc_model(tail=b"\0" * 4))
    put("llmc_model", "header-only.bin", llmc_model()[:1024])
    put("llmc_model", "short-header.bin", llmc_model()[:100])
    put("llmc_model", "version2.bin", llmc_model(hdr_edit=lambda h: h.__setitem__(1, 2)))
    put("llmc_model", "vp-below-v.bin", llmc_model(hdr_edit=lambda h: h.__setitem__(7, 2)))
    put("llmc_model", "zero-layers.bin", llmc_model(hdr_edit=lambda h: h.__setitem__(4, 0)))
    put("llmc_model", "heads-not-dividing.bin", llmc_model(hdr_edit=lambda h: h.__setitem__(5, 3)))
    put("llmc_model", "huge-dims.bin",
        llmc_model(hdr_edit=lambda h: h.__setitem__(6, 0x7fffffff)))
    model = json.dumps({"arch": "gpt2", "layers": L, "heads": NH, "dim": C, "ctx": T, "vocab": V})
    put("llmc_model", "ours.safetensors", safetensors(ours(), {"zero.model": model}))
    put("llmc_model", "ours-no-meta.safetensors", safetensors(ours()))
    put("llmc_model", "ours-missing.safetensors", safetensors(ours()[:-1]))
    put("llmc_model", "bad-magic.bin", b"\x01\x02\x03\x04" + llmc_model()[4:])


def tokens(n, magic=20240520, version=1, count=None, tok=lambda i: i % 300, tail=b""):
    h = [magic, version, n if count is None else count] + [0] * 253
    return struct.pack("<256i", *h) + struct.pack("<%dH" % n, *[tok(i) for i in range(n)]) + tail


def gen_llmc_tokens():
    reset("llmc_tokens")
    put("llmc_tokens", "tokens.bin", tokens(64))
    put("llmc_tokens", "tokens-min.bin", tokens(9))
    put("llmc_tokens", "text.txt", "the quick brown fox jumps over the lazy dog\n" * 3)
    put("llmc_tokens", "too-few.bin", tokens(8))
    put("llmc_tokens", "truncated.bin", tokens(64)[:-2])
    put("llmc_tokens", "trailing.bin", tokens(64, tail=b"\0"))
    put("llmc_tokens", "version2.bin", tokens(64, version=2))
    put("llmc_tokens", "negative-count.bin", tokens(64, count=-1))
    put("llmc_tokens", "out-of-vocab.bin", tokens(64, tok=lambda i: 60000 if i == 40 else 1))
    put("llmc_tokens", "bad-magic.bin", tokens(64, magic=20240521))
    put("llmc_tokens", "model-file.bin", llmc_model())
    put("llmc_tokens", "short-header.bin", tokens(64)[:512])
    put("llmc_tokens", "empty.bin", b"")
    put("llmc_tokens", "short-text.txt", "tiny")


def gen_model_and_training():
    reset("model")
    good = {"arch": "gpt2", "layers": L, "heads": NH, "dim": C, "ctx": T, "vocab": V}
    put("model", "valid.json", json.dumps(good))
    put("model", "gpt2-124M.json", json.dumps({"arch": "gpt2", "layers": 12, "heads": 12,
                                               "dim": 768, "ctx": 1024, "vocab": 50257}))
    put("model", "note.json", json.dumps(dict(good, note="hand made")))
    cases = {"arch.json": dict(good, arch="llama"), "arch-int.json": dict(good, arch=2),
             "zero.json": dict(good, layers=0), "negative.json": dict(good, heads=-4),
             "big.json": dict(good, vocab=1 << 33), "real.json": dict(good, dim=4.0),
             "heads.json": dict(good, heads=3), "string.json": dict(good, ctx="2")}
    for name, v in cases.items():
        put("model", name, json.dumps(v))
    missing = dict(good)
    del missing["vocab"]
    put("model", "missing.json", json.dumps(missing))
    put("model", "dupkey.json", '{"arch":"gpt2","arch":"gpt2"}')
    put("model", "array.json", "[1,2]")
    put("model", "broken.json", '{"arch":"gpt2",')

    reset("training")
    put("training", "valid.json", json.dumps({"optimizer_step": 10, "next_sample": 80, "seed": 1,
                                              "batch": 8, "seq": 64, "data": "synthetic",
                                              "lr": 0.0003, "loss": 5.5}))
    put("training", "imported.json", '{"optimizer_step":0,"imported_from":"model.bin"}')
    put("training", "empty.json", "{}")
    put("training", "bad-seed.json", '{"optimizer_step":3,"seed":"x","data":7}')
    put("training", "step-negative.json", '{"optimizer_step":-1}')
    put("training", "step-string.json", '{"optimizer_step":"10"}')
    put("training", "next-real.json", '{"optimizer_step":1,"next_sample":2.5}')
    put("training", "big.json", '{"optimizer_step":9223372036854775807}')
    put("training", "too-big.json", '{"optimizer_step":18446744073709551616}')
    put("training", "broken.json", '{"optimizer_step":')
    put("training", "array.json", "[]")


def gen_hf_config():
    reset("hf_config")
    good = {"model_type": "gpt2", "n_layer": L, "n_head": NH, "n_embd": C, "n_positions": T,
            "vocab_size": V, "n_inner": None, "architectures": ["GPT2LMHeadModel"]}
    put("hf_config", "valid.json", json.dumps(good, indent=2))
    put("hf_config", "n_ctx.json", json.dumps(dict((k, v) for k, v in good.items()
                                                   if k != "n_positions"), indent=1)
        .replace('"vocab_size"', '"n_ctx": %d, "vocab_size"' % T))
    put("hf_config", "n_inner.json", json.dumps(dict(good, n_inner=4 * C)))
    cases = {"n_inner-other.json": dict(good, n_inner=8), "layers.json": dict(good, n_layer=2),
             "zero.json": dict(good, n_head=0), "string.json": dict(good, n_embd="4"),
             "big.json": dict(good, vocab_size=1 << 32), "heads.json": dict(good, n_head=3)}
    for name, v in cases.items():
        put("hf_config", name, json.dumps(v))
    put("hf_config", "missing.json", json.dumps({"n_layer": L}))
    put("hf_config", "array.json", "[]")
    put("hf_config", "broken.json", '{"n_layer": 1,')
    put("hf_config", "dupkey.json", '{"n_layer": 1, "n_layer": 1}')
    # Llama configs (the model file is a GPT-2: each is refused, by a field or by its tensors)
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
             "intermediate_size": 8, "num_hidden_layers": L, "num_attention_heads": NH,
             "num_key_value_heads": NH, "max_position_embeddings": T, "vocab_size": V,
             "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
             "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
             "tie_word_embeddings": True}
    put("hf_config", "llama.json", json.dumps(llama, indent=2))
    put("hf_config", "llama-rope-params.json", json.dumps(dict(
        ((k, v) for k, v in llama.items() if k != "rope_theta"),
        rope_parameters={"rope_theta": 5e5, "rope_type": "default"})))
    put("hf_config", "llama-scaling.json", json.dumps(dict(
        llama, rope_scaling={"rope_type": "llama3", "factor": 8.0})))
    put("hf_config", "mistral.json", json.dumps(dict(
        llama, architectures=["MistralForCausalLM"], model_type="mistral")))


def gen_tokenizer():
    reset("tokenizer")
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    vocab = {chr(c): i for i, c in enumerate(range(ord("!"), ord("~") + 1))}
    vocab.update({"\u0120": len(vocab), "\u0120t": len(vocab) + 1, "he": len(vocab) + 2})
    def tok(merges, pre=bl, norm=None, added=(), model_type="BPE", **extra):
        m = dict({"type": model_type, "dropout": None, "unk_token": None, "vocab": vocab,
                  "merges": merges}, **extra)
        return json.dumps({"version": "1.0", "truncation": None, "padding": None,
                           "added_tokens": list(added), "normalizer": norm, "pre_tokenizer": pre,
                           "post_processor": None, "decoder": bl, "model": m})
    eot = {"id": 500, "content": "<|endoftext|>", "special": True}
    put("tokenizer", "strings.json", tok(["\u0120 t", "h e"], added=[eot]))
    put("tokenizer", "lists.json", tok([["\u0120", "t"], ["h", "e"]]))
    split = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+|\\S+"}, "behavior": "Isolated",
         "invert": False}, dict(bl, use_regex=False)]}
    put("tokenizer", "split.json", tok(["h e"], pre=split))
    put("tokenizer", "prefix.json", tok(["h e"], pre=dict(bl, add_prefix_space=True)))
    put("tokenizer", "ignore-merges.json", tok(["h e"], ignore_merges=True))
    with open(os.path.join(ROOT, "tests", "data", "tok", "hf_bpe.json"), "rb") as f:
        put("tokenizer", "hf_bpe.json", f.read())
    put("tokenizer", "wordpiece.json", tok([], model_type="WordPiece"))
    put("tokenizer", "nfc.json", tok([], norm={"type": "NFC"}))
    put("tokenizer", "merge-unknown.json", tok(["x y z"]))
    put("tokenizer", "merge-result.json", tok(["t h"]))
    put("tokenizer", "lstrip.json", tok([], added=[dict(eot, lstrip=True)]))
    put("tokenizer", "big-id.json", tok([], added=[dict(eot, id=1 << 30)]))
    put("tokenizer", "bad-regex.json", tok([], pre={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(("}, "behavior": "Isolated"},
        dict(bl, use_regex=False)]}))
    put("tokenizer", "broken.json", tok([])[:-7])
    put("tokenizer", "array.json", "[]")


def zckpt(*args):
    subprocess.run([ZCKPT] + list(args), check=True, stdout=subprocess.DEVNULL)


def flip(data, at):
    b = bytearray(data)
    b[at] ^= 0x5A
    return bytes(b)


def gen_archive_and_shard(tmp):
    src = os.path.join(tmp, "model.bin")
    with open(src, "wb") as f:
        f.write(llmc_model())
    run = os.path.join(tmp, "run")
    zckpt("import", src, "-o", run, "--world", "2")
    ckpt = os.path.join(run, "step-00000000")
    tar, tgz = os.path.join(tmp, "c.tar"), os.path.join(tmp, "c.tar.gz")
    zckpt("pack", ckpt, "-o", tar)
    zckpt("pack", ckpt, "-o", tgz)
    with open(tar, "rb") as f:
        t = f.read()
    with open(tgz, "rb") as f:
        g = f.read()
    reset("archive")
    put("archive", "ckpt.tar", t)
    put("archive", "ckpt.tar.gz", g)
    put("archive", "truncated.tar", t[:len(t) // 2])
    put("archive", "data-flip.tar", flip(t, len(t) - 2048 - 700))
    put("archive", "manifest-flip.tar", flip(t, 512 + 40))
    put("archive", "gz-truncated.tar.gz", g[:len(g) - 20])
    put("archive", "empty.tar", bytes(1024))
    put("archive", "not-an-archive", "hello\n")
    put("archive", "gzip-of-text.gz", gzip.compress(b"not a tar at all\n" * 10))

    with open(os.path.join(ckpt, "manifest.json")) as f:
        shards = json.load(f)["shards"]
    reset("shard")
    for i, s in enumerate(shards):
        put("shard", "rank%d.json" % i, json.dumps(s, indent=2))
    s = shards[0]
    variants = {"rank-negative.json": dict(s, rank=-1), "bytes-string.json": dict(s, bytes="9"),
                "sha-short.json": dict(s, sha256="abc"), "file-slash.json": dict(s, file="../x"),
                "extents-none.json": dict(s, extents=[]), "extents-object.json": dict(s, extents={})}
    for name, v in variants.items():
        put("shard", name, json.dumps(v))
    no_file = dict(s)
    del no_file["file"]
    put("shard", "missing-file.json", json.dumps(no_file))
    put("shard", "array.json", "[]")
    put("shard", "broken.json", json.dumps(s)[:-5])


def main():
    if not os.access(ZCKPT, os.X_OK):
        sys.exit("mkcorpus.py: %s not found: run make first (or set ZCKPT)" % ZCKPT)
    gen_safetensors()
    gen_llmc_model()
    gen_llmc_tokens()
    gen_model_and_training()
    gen_hf_config()
    gen_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        gen_archive_and_shard(tmp)


if __name__ == "__main__":
    main()
