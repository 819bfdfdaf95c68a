#!/usr/bin/env bash
# The main job of README's first command: raw text to a trained tiny model on the CPU.
# Today: mt-train learns a tiny GPT on the UTF-8 bytes of tiny shakespeare (mt-tokenize and
# mt-shard take over the data path when they land), evaluates it, writes its final parameters as
# an HDF5 checkpoint, and prints the step records as a table. Outputs go to demo-out/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
OUT="${MT_DEMO_OUT:-$ROOT/demo-out}"
mkdir -p "$OUT"

"$MT_BIN/mt-train" --model tiny-gpt --byte-data "$ROOT/data/demo/tinyshakespeare.txt" \
  --micro-batch-size 16 --global-batch-size 32 --train-iters 300 \
  --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 30 --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0 \
  --eval-interval 100 --eval-iters 4 --log-interval 50 \
  --save-final "$OUT/tiny-gpt.h5" >"$OUT/train.jsonl"

echo
echo "mt demo: tiny GPT ($(jq -r 'select(.record=="run") | .model.parameters' "$OUT/train.jsonl") parameters) on the bytes of tiny shakespeare"
jq -r 'select(.record=="eval") | "  iteration \(.iteration): validation loss \(.lm_loss * 1000 | round / 1000), perplexity \(.ppl * 100 | round / 100)"' "$OUT/train.jsonl"
jq -r 'select(.record=="summary") | "  \(.iterations) steps, \(.tokens_per_s | round) tokens/s, final training loss \(.lm_loss * 1000 | round / 1000)"' "$OUT/train.jsonl"
echo "  records: $OUT/train.jsonl   checkpoint: $OUT/tiny-gpt.h5"
