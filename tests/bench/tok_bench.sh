#!/bin/sh
# tok_bench.sh: `ztok encode` against the Hugging Face tokenizers library on one thread
# (RAYON_NUM_THREADS=1), same tokenizer, same text, ids compared. Not part of make test.
#   sh tests/bench/tok_bench.sh [MIB]        (default 8 MiB of text; needs make tok-venv)
# The tokenizer is GPT-2's (tests/tok/oracle.py gpt2), or one the library trains when the
# openai-whisper package (which ships GPT-2's ranks) is not installed. The text is the varied
# test text (tests/data/tok/text.txt) and the engine's synthetic corpus, shuffled into lines.
# Times: ztok's whole command (load, encode, write) against the library's encode call alone.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MIB=${1:-8}
PY=$ROOT/build/venv/bin/python
ORACLE=$ROOT/tests/tok/oracle.py
ZTOK=$ROOT/build/ztok
[ -x "$PY" ] || { echo "skip: no build/venv (make tok-venv)"; exit 0; }
[ -x "$ZTOK" ] || make -C "$ROOT" build/ztok >/dev/null
W=$(mktemp -d /tmp/tok_bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
"$PY" - "$ROOT/tests/data/tok/text.txt" "$W/text.txt" "$MIB" <<'PYEOF'
import random, sys
random.seed(5)
words = open(sys.argv[1], encoding="utf-8").read().split()
eng = ("the cat sat on the mat and the dog ran far away , then a small bird sang very "
       "quietly near the old river . It's 42 degrees ; we'll see them again tomorrow").split()
out, n, goal = [], 0, int(sys.argv[3]) << 20
while n < goal:
    src = words if random.random() < 0.2 else eng
    line = " ".join(random.choice(src) for _ in range(random.randint(4, 20)))
    line += random.choice(["\n", "\n\n", " ", ".\n"])
    out.append(line)
    n += len(line.encode("utf-8"))
open(sys.argv[2], "w", encoding="utf-8", newline="").write("".join(out))
PYEOF
if "$PY" "$ORACLE" gpt2 "$W/tok.json"; then which="GPT-2 (50257)"; else
  "$PY" "$ORACLE" train "$W/text.txt" "$W/tok.json" 32000; which="trained by the library (32000)"
fi
bytes=$(wc -c < "$W/text.txt")
echo "text: $bytes bytes; tokenizer: $which"
t0=$(date +%s.%N)
"$ZTOK" encode --tokenizer "$W/tok.json" "$W/text.txt" -o "$W/tok.bin" >/dev/null
t1=$(date +%s.%N)
zt=$(echo "$t1 - $t0" | bc -l)
hf=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$PY" "$ORACLE" time "$W/tok.json" "$W/text.txt" | cut -d' ' -f1)
RAYON_NUM_THREADS=1 "$PY" "$ORACLE" compare "$W/tok.json" "$W/text.txt" "$W/tok.bin" | sed 's/^/ids: /'
printf 'ztok encode:      %6.2f s  %6.1f MB/s\n' "$zt" "$(echo "$bytes / $zt / 1000000" | bc -l)"
printf 'tokenizers (1 thread): %6.2f s  %6.1f MB/s\n' "$hf" "$(echo "$bytes / $hf / 1000000" | bc -l)"
