#!/usr/bin/env bash
# mt-tokenize --partitions: 2 MPI ranks x 1 worker (--partitions 2 --workers 2 under mpirun -np 2)
# against 1 rank x 2 workers (--workers 2, no partitions) on the same cores and corpus, GPT-2,
# Megatron .bin/.idx out. The partitioned time includes writing the partition files and the merge.
# Partitions exist to spread a corpus over nodes; one machine cannot measure that, only that
# the extra steps cost little on the same cores. A benchmark, not a test: it prints the median of
# 3 runs' wall seconds (process start included; the 1-rank run also under mpirun -np 1, whose
# start-up the 2-rank run pays too) and the ratio, the CPU seconds of both (timed in runs of their
# own: on a loaded machine wall time is mostly waiting for a core), and asserts nothing.
# Usage: tests/bench/bench_partitions.sh [corpus.txt]   (default data/corpus/war_and_peace_pg2600.txt)
# Env: MT_BIN (default build/bin), MT_BENCH_MB (corpus repeated to about this size, default 20),
# MT_BASELINE_BIN (another build's bin directory, e.g. an older commit's: its 2-rank run is timed
# in the same loop, alternating with this build's, and its outputs compared with this build's).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
TOK="$ROOT/data/tokenizers"
CORPUS="${1:-$ROOT/data/corpus/war_and_peace_pg2600.txt}"
TARGET_MB="${MT_BENCH_MB:-20}"
RUNS=3
# Ranks waiting at a barrier yield their core (rank 1 waits while rank 0 writes partitions and merges).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/in" "$work/out"
# One JSONL document per paragraph, repeated to about TARGET_MB.
tr -d '\r' <"$CORPUS" | jq -R -s -c 'split("\n\n")[] | select(length > 0) | {text: .}' >"$work/one.jsonl"
while (($(stat -c %s "$work/in/corpus.jsonl" 2>/dev/null || echo 0) < TARGET_MB * 1000000)); do
  cat "$work/one.jsonl" >>"$work/in/corpus.jsonl"
done
GPT2=(--tokenizer-type GPT2BPETokenizer --vocab-file "$TOK/gpt2/encoder.json" --merge-file "$TOK/gpt2/vocab.bpe"
      --output-format megatron --append-eod --log-interval 0)

seconds() { local start end; start=$(date +%s.%N); "$@" >/dev/null; end=$(date +%s.%N); echo "$end - $start" | bc; }
# CPU seconds (user + system) of the command and its children: the steadier figure on a loaded machine.
cpu_seconds() { local TIMEFORMAT='%U + %S'; echo "$({ time "$@" >/dev/null 2>&1; } 2>&1)" | bc; }
median() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"; }

BASELINE_BIN="${MT_BASELINE_BIN:-}"
one=() one_mpi=() two=() two_base=() one_cpu=() two_cpu=()
for _ in $(seq $RUNS); do
  one+=("$(seconds "$MT_BIN/mt-tokenize" "${GPT2[@]}" --input "$work/in/corpus.jsonl" --workers 2 --output-prefix "$work/out/one")")
  one_mpi+=("$(seconds mpirun -np 1 --bind-to none "$MT_BIN/mt-tokenize" "${GPT2[@]}" --input "$work/in/corpus.jsonl" \
    --workers 2 --output-prefix "$work/out/one")")
  rm -f "$work"/in/corpus_?.jsonl
  two+=("$(seconds mpirun -np 2 --bind-to none "$MT_BIN/mt-tokenize" "${GPT2[@]}" --input "$work/in/corpus.jsonl" \
    --partitions 2 --workers 2 --output-prefix "$work/out/two")")
  one_cpu+=("$(cpu_seconds "$MT_BIN/mt-tokenize" "${GPT2[@]}" --input "$work/in/corpus.jsonl" --workers 2 \
    --output-prefix "$work/out/one")")
  rm -f "$work"/in/corpus_?.jsonl
  two_cpu+=("$(cpu_seconds mpirun -np 2 --bind-to none "$MT_BIN/mt-tokenize" "${GPT2[@]}" --input "$work/in/corpus.jsonl" \
    --partitions 2 --workers 2 --output-prefix "$work/out/two")")
  if [[ -n "$BASELINE_BIN" ]]; then
    rm -f "$work"/in/corpus_?.jsonl
    two_base+=("$(seconds mpirun -np 2 --bind-to none "$BASELINE_BIN/mt-tokenize" "${GPT2[@]}" --input "$work/in/corpus.jsonl" \
      --partitions 2 --workers 2 --output-prefix "$work/out/base")")
  fi
done
cmp -s "$work/out/one_text_document.bin" "$work/out/two_text_document.bin" && same="identical" || same="differ (round robin)"
mb=$(echo "scale=1; $(stat -c %s "$work/in/corpus.jsonl") / 1000000" | bc)
t1=$(median "${one[@]}") t1m=$(median "${one_mpi[@]}") t2=$(median "${two[@]}")
printf 'corpus %s MB, %s documents, %s cores\n' "$mb" "$(wc -l <"$work/in/corpus.jsonl")" "$(nproc)"
printf '1 rank x 2 workers:           %6.2f s (under mpirun -np 1: %.2f s)\n' "$t1" "$t1m"
printf '2 ranks x 1 worker (2 parts): %6.2f s   speed ratio %.3f (1-rank time / 2-rank time); outputs %s\n' \
  "$t2" "$(echo "$t1 / $t2" | bc -l)" "$same"
printf '  against 1 rank under mpirun -np 1: speed ratio %.3f\n' "$(echo "$t1m / $t2" | bc -l)"
printf 'CPU seconds (user + system, separate runs): 1 rank x 2 workers %.2f s, 2 ranks x 1 worker %.2f s (+%.2f s)\n' \
  "$(median "${one_cpu[@]}")" "$(median "${two_cpu[@]}")" "$(echo "$(median "${two_cpu[@]}") - $(median "${one_cpu[@]}")" | bc)"
if [[ -n "$BASELINE_BIN" ]]; then
  for ext in bin idx; do
    cmp -s "$work/out/base_text_document.$ext" "$work/out/two_text_document.$ext" || echo "baseline .$ext DIFFERS"
  done
  tb=$(median "${two_base[@]}")
  printf 'baseline %s, 2 ranks x 1 worker: %6.2f s   speed ratio %.3f against the 1-rank time\n' \
    "$BASELINE_BIN" "$tb" "$(echo "$t1 / $tb" | bc -l)"
fi
printf 'load average at the end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
