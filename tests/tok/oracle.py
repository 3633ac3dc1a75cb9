#!/usr/bin/env python3
"""The Hugging Face `tokenizers` library as the oracle for ztok (tests/test_tok.c, tok_bench.sh).

  oracle.py gpt2 OUT.json          GPT-2's tokenizer.json, built from the GPT-2 ranks that the
                                   openai-whisper package ships (whisper/assets/gpt2.tiktoken):
                                   vocab = ranks, merges derived by BPE over lower ranks;
                                   exit 77 when that package is not installed
  oracle.py train CORPUS OUT.json VOCAB [split]
                                   train a byte-level BPE with the library (GPT-2 setup; with
                                   `split`, the pre-tokenizer is Sequence[Split(GPT-2 pattern),
                                   ByteLevel(use_regex=False)])
  oracle.py ids TOK.json TEXT      print the ids of TEXT's contents, one line, space separated
  oracle.py compare TOK.json TEXT TOKENS.bin
                                   exit 0 when the llm.c token file holds exactly the library's
                                   ids for TEXT, else 1 with the first difference
  oracle.py time TOK.json TEXT     seconds the library takes to encode TEXT (one call)
"""
import base64, os, struct, sys, time

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_level_map():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def gpt2(out):
    import importlib.util
    spec = importlib.util.find_spec("whisper")  # only its data file, not the package (torch)
    path = spec and os.path.join(os.path.dirname(spec.origin), "assets", "gpt2.tiktoken")
    if not path or not os.path.exists(path):
        sys.exit(77)
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            tok, r = line.split()
            ranks[base64.b64decode(tok)] = int(r)
    m = byte_level_map()
    enc = lambda b: "".join(m[x] for x in b)
    merges = []
    for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = [bytes([x]) for x in tok]
        while len(parts) > 2:  # BPE with the ranks below r, until two parts are left
            best = None
            for i in range(len(parts) - 1):
                q = ranks.get(parts[i] + parts[i + 1])
                if q is not None and q < r and (best is None or q < best[0]):
                    best = (q, i)
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        merges.append((enc(parts[0]), enc(parts[1])))
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, processors, AddedToken
    vocab = {enc(t): r for t, r in ranks.items()}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tk.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tk.save(out)


def train(corpus, out, vocab, split=False):
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers
    tk = Tokenizer(models.BPE())
    if split:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tk.train([corpus], tr)
    tk.save(out)


def ids(tok, text):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(tok).encode(open(text, encoding="utf-8", newline="").read()).ids


def read_tokens(path):
    data = open(path, "rb").read()
    h = struct.unpack("<256i", data[:1024])
    fmt = "H" if h[1] == 1 else "I"
    return list(struct.unpack("<%d%s" % (h[2], fmt), data[1024:]))


def main(a):
    if a[0] == "gpt2":
        gpt2(a[1])
    elif a[0] == "train":
        train(a[1], a[2], int(a[3]), len(a) > 4 and a[4] == "split")
    elif a[0] == "ids":
        print(" ".join(map(str, ids(a[1], a[2]))))
    elif a[0] == "compare":
        want, got = ids(a[1], a[2]), read_tokens(a[3])
        if want != got:
            i = next((k for k, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
            print("differ: %d ids from the library, %d from ztok; first difference at %d: "
                  "library %s, ztok %s" % (len(want), len(got), i, want[i:i + 6], got[i:i + 6]))
            sys.exit(1)
        print("same %d ids" % len(want))
    elif a[0] == "time":
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(a[1])
        text = open(a[2], encoding="utf-8", newline="").read()
        t0 = time.perf_counter()
        n = len(tk.encode(text).ids)
        print("%.3f %d" % (time.perf_counter() - t0, n))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
