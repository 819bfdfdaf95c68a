#!/usr/bin/env bash
# BPE vocabulary training, mt against Hugging Face tokenizers' BpeTrainer (the issue's check:
# compression within 1%). Trains both on the first 90% of War and Peace at vocab sizes 1000, 4000
# and 16000 and prints the held-out tokens per byte of each, their ratio, how many leading merges
# agree, and training times; then times tinyshakespeare -> 8k and all of War and Peace -> 32k.
# A benchmark, not a test: quote the figures, don't assert on them.
# mt's side runs through tests/bench/bench_bpe_train.cpp (MT_BPE_BENCH_BIN, default
# build-bpe/tests/mt_bench_bpe_train, else build/tests/); HF's side through
# tests/bench/bpe_train_reference.py in a venv (MT_BENCH_VENV) with `pip install tokenizers`.
# Usage: tests/bench/bench_bpe_train.sh [corpus]   (default: data/corpus/war_and_peace_pg2600.txt)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CORPUS="${1:-$ROOT/data/corpus/war_and_peace_pg2600.txt}"
SHAKESPEARE="$ROOT/data/demo/tinyshakespeare.txt"
VENV="${MT_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mt-bench-tokenizers-venv}"
MIN_FREQUENCY="${MT_BPE_MIN_FREQUENCY:-2}"

BENCH_BIN="${MT_BPE_BENCH_BIN:-}"
if [[ -z $BENCH_BIN ]]; then
  for candidate in "$ROOT/build-bpe/tests/mt_bench_bpe_train" "$ROOT/build/tests/mt_bench_bpe_train"; do
    [[ -x $candidate ]] && { BENCH_BIN="$candidate"; break; }
  done
fi
[[ -x $BENCH_BIN ]] || { echo "bench: build mt_bench_bpe_train first (or set MT_BPE_BENCH_BIN)" >&2; exit 1; }
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import tokenizers' 2>/dev/null; then
  echo "bench: installing tokenizers into $VENV" >&2
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q tokenizers >&2
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# mt_run TRAIN HELDOUT VOCAB PREFIX: the mt record (JSON) of one training run.
mt_run() {
  "$BENCH_BIN" "$1" "$2" "$3" "$4" "$MIN_FREQUENCY"
}

echo "corpus: $CORPUS (first 90% trained, last 10% held out), min_frequency $MIN_FREQUENCY, tokenizers $("$VENV/bin/python" -c 'import tokenizers; print(tokenizers.__version__)')"
printf '%-7s %12s %12s %9s %15s %9s %9s\n' vocab "HF tok/byte" "mt tok/byte" "mt/HF" "shared merges" "HF s" "mt s"
first=1
for vocab in 1000 4000 16000; do
  split=(); [[ $first == 1 ]] && split=(--write-split "$TMP")
  hf="$("$VENV/bin/python" "$ROOT/tests/bench/bpe_train_reference.py" --corpus "$CORPUS" --vocab-size "$vocab" \
    --min-frequency "$MIN_FREQUENCY" "${split[@]}")"
  first=0
  mt="$(mt_run "$TMP/train.txt" "$TMP/heldout.txt" "$vocab" "$TMP/mt$vocab")"
  cross="$("$VENV/bin/python" "$ROOT/tests/bench/bpe_train_reference.py" --corpus "$CORPUS" --vocab-size "$vocab" \
    --min-frequency "$MIN_FREQUENCY" --mt-vocab "$TMP/mt$vocab-vocab.json" --mt-merges "$TMP/mt$vocab-merges.txt")"
  hf_tpb="$(jq -r .tokens_per_byte <<<"$hf")"
  mt_tpb="$(jq -r .tokens_per_byte <<<"$mt")"
  if [[ "$(jq -r .mt_files_heldout_tokens_hf_encoder <<<"$cross")" != "$(jq -r .heldout_tokens <<<"$mt")" ]]; then
    echo "bench: warning: HF's encoder gives $(jq -r .mt_files_heldout_tokens_hf_encoder <<<"$cross") tokens with mt's files, mt's $(jq -r .heldout_tokens <<<"$mt")" >&2
  fi
  printf '%-7s %12.6f %12.6f %9.5f %15s %9.2f %9.2f\n' "$vocab" "$hf_tpb" "$mt_tpb" "$(jq -n "$mt_tpb/$hf_tpb")" \
    "$(jq -r '"\(.shared_leading_merges)/\(.merges)"' <<<"$cross")" "$(jq -r .train_s <<<"$hf")" "$(jq -r .train_s <<<"$mt")"
done

echo
echo "training time (whole file, counting + merging; mt single-threaded, HF on all cores; a vocab below"
echo "the asked size means no pair was left with min_frequency occurrences)"
printf '%-24s %7s %9s %9s %9s %9s %15s\n' corpus vocab "HF vocab" "mt vocab" "HF s" "mt s" "shared merges"
for run in "$SHAKESPEARE 8000" "$CORPUS 32000"; do
  read -r file vocab <<<"$run"
  : >"$TMP/empty.txt"
  mt="$(mt_run "$file" "$TMP/empty.txt" "$vocab" "$TMP/whole$vocab")"
  hf="$("$VENV/bin/python" "$ROOT/tests/bench/bpe_train_reference.py" --corpus "$file" --train-fraction 1 \
    --vocab-size "$vocab" --min-frequency "$MIN_FREQUENCY" --mt-vocab "$TMP/whole$vocab-vocab.json" \
    --mt-merges "$TMP/whole$vocab-merges.txt")"
  printf '%-24s %7s %9s %9s %9.2f %9.2f %15s\n' "$(basename "$file")" "$vocab" "$(jq -r .vocab_size <<<"$hf")" \
    "$(jq -r .vocab_size <<<"$mt")" "$(jq -r .train_s <<<"$hf")" \
    "$(jq -r .train_s <<<"$mt")" "$(jq -r '"\(.shared_leading_merges)/\(.merges)"' <<<"$hf")"
done
