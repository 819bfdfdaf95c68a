#!/usr/bin/env bash
# SentencePiece throughput: mt-tokenize against Debian's spm_encode --output_format=id (C++) and
# python3-sentencepiece's batch encode (num_threads=1), one thread, on the same text in the same run,
# for the test models of tests/golden/sentencepiece. Wall time including process start and model
# loading, median of 3 runs (and that run's CPU seconds); MB/s = 10^6 input bytes per second. Also checks that mt's ids equal
# spm_encode's, line for line. A benchmark, not a test: it prints figures and asserts only the ids.
# Usage: tests/bench/bench_sentencepiece.sh [corpus.txt]   (default data/corpus/war_and_peace_pg2600.txt)
# Env: MT_BIN (default build/bin), MT_BENCH_MB (corpus repeated to about this size, default 20),
#      MT_BENCH_MODELS (default "llama_style_2k nfkc_4k").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
CORPUS="${1:-$ROOT/data/corpus/war_and_peace_pg2600.txt}"
TARGET_MB="${MT_BENCH_MB:-20}"
MODELS="${MT_BENCH_MODELS:-llama_style_2k nfkc_4k}"
RUNS=3

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The corpus without CRs (spm_encode keeps them, JSON lines would not), repeated to about TARGET_MB;
# one sentence per line for spm_encode and Python, the same lines as JSONL documents for mt.
text="$work/corpus.txt"
: >"$text"
while [[ $(stat -c %s "$text") -lt $((TARGET_MB * 1000000)) ]]; do tr -d '\r' <"$CORPUS" >>"$text"; done
jq -R -c '{text: .}' "$text" >"$work/corpus.jsonl"
bytes=$(stat -c %s "$text")
echo "bench: $(basename "$CORPUS") repeated to $bytes bytes, $(wc -l <"$text") lines; one thread; $(nproc) cores" >&2

cat >"$work/py_encode.py" <<'PY'
import sys
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    lines = f.read().split("\n")[:-1]
ids = sp.encode(lines, num_threads=1)
print(sum(len(x) for x in ids))
PY

# Median wall time in seconds of RUNS runs of a command (its stdout to $work/last.out); the CPU
# seconds (user + system) of the same run go to $work/cpu.<tag>, as wall time on a loaded machine
# measures the load as much as the program.
median_time() {
  local tag="$1" lines=() t0 t1 i
  shift
  for ((i = 0; i < RUNS; i++)); do
    t0=$EPOCHREALTIME
    /usr/bin/time -f "%U %S" -o "$work/time" "$@" >"$work/last.out" 2>"$work/stderr" ||
      { echo "bench: failed: $* ($(head -c 300 "$work/stderr"))" >&2; exit 1; }
    t1=$EPOCHREALTIME
    lines+=("$(echo "$t1 - $t0" | bc -l) $(awk '{print $1 + $2}' "$work/time")")
  done
  local median
  median="$(printf '%s\n' "${lines[@]}" | sort -g | sed -n "$(((RUNS + 1) / 2))p")"
  echo "${median#* }" >"$work/cpu.$tag"
  echo "${median%% *}"
}

mbps() { echo "scale=2; $bytes / 1000000 / $1" | bc -l; }

printf '%-16s %-30s %8s %8s %8s %8s %8s\n' model tool wall_s MB/s mt_vs cpu_s mt_vs
for model in $MODELS; do
  file="$ROOT/tests/golden/sentencepiece/$model.model"
  t_mt=$(median_time mt "$MT_BIN/mt-tokenize" encode --tokenizer-type SentencePieceTokenizer \
    --tokenizer-model "$file" --input "$work/corpus.jsonl" --workers 1)
  cp "$work/last.out" "$work/mt.ids"
  t_spm=$(median_time spm spm_encode --model="$file" --output_format=id --input="$text")
  cp "$work/last.out" "$work/spm.ids"
  t_py=$(median_time py /usr/bin/python3 "$work/py_encode.py" "$file" "$text")
  cmp -s "$work/mt.ids" "$work/spm.ids" || { echo "bench: $model: mt's ids differ from spm_encode's" >&2; exit 1; }
  c_mt=$(cat "$work/cpu.mt")
  row() {  # tool wall cpu
    printf '%-16s %-30s %8.2f %8s %8s %8.2f %8s\n' "$model" "$1" "$2" "$(mbps "$2")" \
      "$(echo "scale=2; $2 / $t_mt" | bc -l)" "$3" "$(echo "scale=2; $3 / $c_mt" | bc -l)"
  }
  row "mt-tokenize encode" "$t_mt" "$c_mt"
  row "spm_encode --output_format=id" "$t_spm" "$(cat "$work/cpu.spm")"
  row "python3-sentencepiece batch" "$t_py" "$(cat "$work/cpu.py")"
done
echo "bench: ids equal spm_encode's for: $MODELS" >&2
