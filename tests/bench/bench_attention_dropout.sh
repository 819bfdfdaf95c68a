#!/usr/bin/env bash
# Cost of attention dropout (issue 29): GPT-2 124M, B=8, T=256, one rank, mt-train with
# --attention-dropout 0.1 against 0 (hidden dropout 0 in both, fp32), alternating runs so that a
# change in machine load hits both. Prints each run's median step time and the ratio (target: at
# most 1.10), then the attention kernel alone (mt_bench_attention_dropout_kernel: what dropout adds
# to the 12 layers' attention forward + backward). A benchmark, not a test: quote the figure,
# don't assert on it.
# Usage: tests/bench/bench_attention_dropout.sh [steps] [rounds]   (MT_BIN defaults to build/bin)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
MT_BENCH_BIN="${MT_BENCH_BIN:-$ROOT/build/tests}"
STEPS="${1:-4}"
ROUNDS="${2:-2}"
THREADS="${OMP_NUM_THREADS:-$(nproc)}"

median_ms() {  # attention dropout -> the run's median step ms
  OMP_NUM_THREADS=$THREADS "$MT_BIN/mt-train" --model gpt2-124m --mock-data --seq-length 256 --micro-batch-size 8 \
    --global-batch-size 8 --train-iters "$STEPS" --eval-iters 0 --hidden-dropout 0 --attention-dropout "$1" \
    --log-interval 1000 --peak-tflops 1 2>/dev/null | jq -r 'select(.record=="summary") | .median_step_ms'
}

printf '%-6s %-20s %12s\n' round "--attention-dropout" "step ms"
best_off="" best_on=""
for ((round = 1; round <= ROUNDS; ++round)); do
  for p in 0 0.1; do
    ms="$(median_ms "$p")"
    printf '%-6s %-20s %12.1f\n' "$round" "$p" "$ms"
    if [[ $p == 0 ]]; then
      best_off="$(jq -n "[${best_off:-$ms}, $ms] | min")"
    else
      best_on="$(jq -n "[${best_on:-$ms}, $ms] | min")"
    fi
  done
done
printf 'best of %d: %.1f ms without, %.1f ms with attention dropout 0.1: ratio %.3f (target <= 1.10)\n' "$ROUNDS" \
  "$best_off" "$best_on" "$(jq -n "$best_on / $best_off")"
OMP_NUM_THREADS=$THREADS "$MT_BENCH_BIN/mt_bench_attention_dropout_kernel" 10
