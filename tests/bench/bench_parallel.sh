#!/usr/bin/env bash
# Parallel training throughput: GPT-2 124M, T=256, global batch 16, micro-batch 8, fp32, on the
# same cores: one rank with 2 threads against 2 MPI ranks with 1 thread each as DP=2 (plain,
# distributed optimizer, overlapped grad reduction, both) and as TP=2. Runs are interleaved
# (round after round of every layout) and each layout's figure is the median over rounds of its
# runs' median step (first step excluded). Prints tokens/s, the ratio to one rank and the share of
# the step rank 0 spent blocked in communication. A benchmark, not a test: quote the figures,
# never assert on them. Usage: tests/bench/bench_parallel.sh [rounds] [steps]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
ROUNDS="${1:-3}"
STEPS="${2:-6}"
# shellcheck source=tests/bench/two_cores.sh
source "$ROOT/tests/bench/two_cores.sh"

MODEL=(--model gpt2-124m --mock-data --seq-length 256 --global-batch-size 16 --micro-batch-size 8
       --train-iters "$STEPS" --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --log-interval 1000 --peak-tflops 1)
NAMES=("1 rank x 2 threads" "DP=2" "DP=2 distributed optimizer" "DP=2 overlap" "DP=2 dist. opt. + overlap" "TP=2")
LAYOUTS=("" "" "--use-distributed-optimizer" "--overlap-grad-reduce --ddp-bucket-size 20000000"
         "--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 20000000" "--tensor-model-parallel-size 2")
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

run_rounds

base=0
printf '%-30s %10s %10s %8s %11s\n' layout "step ms" tokens/s ratio comm_share
for i in "${!NAMES[@]}"; do
  ms="$(for round in $(seq 1 "$ROUNDS"); do jq 'select(.record=="summary") | .median_step_ms' "$OUT/$i-$round.jsonl"; done | median)"
  share="$(of_steps "$i" .comm_share)"
  tps="$(jq -n "16 * 256 / ($ms / 1000)")"
  [[ $i -eq 0 ]] && base="$tps"
  printf '%-30s %10.1f %10.1f %7.2fx %10.1f%%\n' "${NAMES[$i]}" "$ms" "$tps" "$(jq -n "$tps / $base")" \
    "$(jq -n "$share * 100")"
done
echo "(GPT-2 124M fp32, T=256, global batch 16, micro-batch 8; $ROUNDS interleaved rounds of $STEPS steps; medians)"
