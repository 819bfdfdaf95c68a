#!/usr/bin/env bash
# WordPiece and DeepSeek-V3-style throughput: mt-tokenize (BertWordPieceLowerCase, BertWordPieceCase,
# HuggingFaceTokenizer over tests/golden/deepseek/deepseek_v3_style_tokenizer.json) against Hugging
# Face tokenizers' encode_batch with RAYON_NUM_THREADS=1, one thread each, on the same corpus with
# the committed test vocabularies (tests/golden/wordpiece, tests/golden/deepseek). mt's time is the wall
# time of `mt-tokenize encode --raw` with start-up and loading; HF's excludes loading and is taken
# over line chunks of about 8 KB as tests/bench/tokenize_reference.py does. A benchmark, not a
# test: it prints figures (MB/s = 10^6 input bytes per second, median of 3 runs) and asserts nothing.
# Usage: tests/bench/bench_wordpiece_deepseek.sh [corpus.txt]   (default data/corpus/war_and_peace_pg2600.txt)
# Env: MT_BIN (default build/bin), MT_BENCH_MB (corpus repeated to about this size, default 20),
#      MT_BENCH_PYTHON (an interpreter with tokenizers==0.23.3; default: a temporary venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
GOLDEN="$ROOT/tests/golden/wordpiece"
CORPUS="${1:-$ROOT/data/corpus/war_and_peace_pg2600.txt}"
TARGET_MB="${MT_BENCH_MB:-20}"
RUNS=3

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ -n "${MT_BENCH_PYTHON:-}" ]]; then
  read -r -a PY <<<"$MT_BENCH_PYTHON"
else
  echo "bench: making a venv with tokenizers" >&2
  python3 -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install -q --disable-pip-version-check tokenizers==0.23.3 >&2
  PY=("$work/venv/bin/python")
fi

text="$work/corpus.txt"
while [[ ! -s "$text" || $(stat -c %s "$text") -lt $((TARGET_MB * 1000000)) ]]; do cat "$CORPUS" >>"$text"; done
bytes=$(stat -c %s "$text")

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

DEEPSEEK="$ROOT/tests/golden/deepseek/deepseek_v3_style_tokenizer.json"
for config in "BertWordPieceLowerCase vocab-uncased.txt true" "BertWordPieceCase vocab-cased.txt false" \
              "HuggingFaceTokenizer $DEEPSEEK deepseek"; do
  read -r type vocab lower <<<"$config"
  files=(--vocab-file "$GOLDEN/$vocab")
  [[ "$type" == HuggingFaceTokenizer ]] && files=(--tokenizer-model "$vocab")
  mt_seconds=$(for _ in $(seq $RUNS); do
    start=$(date +%s.%N)
    "$MT_BIN/mt-tokenize" encode --raw --input "$text" --tokenizer-type "$type" "${files[@]}" \
      --tokenizer-hf-no-include-special-tokens --workers 1 >"$work/ids"
    echo "$(date +%s.%N) - $start" | bc
  done | median)
  mt_tokens=$(wc -w <"$work/ids")
  [[ "$type" == HuggingFaceTokenizer ]] || vocab="$GOLDEN/$vocab"
  hf=$(RAYON_NUM_THREADS=1 "${PY[@]}" - "$text" "$vocab" "$lower" "$RUNS" <<'PY'
import json, statistics, sys, time
from tokenizers import BertWordPieceTokenizer, Tokenizer
path, vocab, kind, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if kind == "deepseek":
    tok = Tokenizer.from_file(vocab)
else:
    tok = BertWordPieceTokenizer(vocab, lowercase=kind == "true")
    if kind == "false":
        tok.add_special_tokens([f"<extra_id_{i}>" for i in range(100)])
text = open(path, "rb").read().decode("utf-8")
chunks, cur, size = [], [], 0
for line in text.splitlines(keepends=True):
    cur.append(line); size += len(line)
    if size >= 8192:
        chunks.append("".join(cur)); cur, size = [], 0
if cur:
    chunks.append("".join(cur))
times, tokens = [], 0
for _ in range(runs):
    start = time.perf_counter()
    tokens = sum(len(e.ids) for e in tok.encode_batch(chunks, add_special_tokens=False))
    times.append(time.perf_counter() - start)
print(json.dumps({"seconds": statistics.median(times), "tokens": tokens}))
PY
)
  hf_seconds=$(jq -r .seconds <<<"$hf")
  hf_tokens=$(jq -r .tokens <<<"$hf")
  awk -v t="$type" -v b="$bytes" -v m="$mt_seconds" -v h="$hf_seconds" -v mt="$mt_tokens" -v ht="$hf_tokens" 'BEGIN {
    printf "%s: %.1f MB, mt-tokenize %.2f s (%.1f MB/s, %d tokens), HF encode_batch %.2f s (%.1f MB/s, %d tokens), %.2fx\n",
      t, b / 1e6, m, b / 1e6 / m, mt, h, b / 1e6 / h, ht, h / m }'
done
