#!/usr/bin/env bash
# Expert parallelism throughput (issue 22): a small Mixtral-shaped model (4 layers, hidden 256,
# 8 experts of width 512, top-2, aux_loss, T=256, global batch 16, micro-batch 4, fp32) on the same
# 2 cores: one rank with 2 threads, then 2 MPI ranks with 1 thread each as EP=1 x DP=2 (experts
# replicated, their grads all-reduced) and as EP=2 (each rank 4 experts, tokens through the
# all-to-all dispatcher), each with the loop over experts and with --moe-grouped-gemm. Runs are
# interleaved and each figure is the median over rounds (first step excluded). Prints tokens/s,
# the ratio to EP=1 x DP=2 (the issue's target: EP=2 at least 0.9x) and the share of the step rank
# 0 spent blocked in communication. A benchmark, not a test. Usage:
# tests/bench/bench_moe_ep.sh [rounds] [steps]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
ROUNDS="${1:-3}"
STEPS="${2:-6}"
# shellcheck source=tests/bench/two_cores.sh
source "$ROOT/tests/bench/two_cores.sh"

MODEL=(--model tiny-mixtral --num-layers 4 --hidden-size 256 --num-attention-heads 8 --group-query-attention
       --num-query-groups 4 --kv-channels 32 --ffn-hidden-size 704 --moe-ffn-hidden-size 512 --seq-length 256
       --max-position-embeddings 256 --vocab-size 1024 --mock-data --global-batch-size 16 --micro-batch-size 4
       --train-iters "$STEPS" --eval-iters 0 --log-interval 1000 --peak-tflops 1)
NAMES=("1 rank x 2 threads" "EP=1 x DP=2" "EP=2" "EP=1 x DP=2, grouped GEMM" "EP=2, grouped GEMM")
LAYOUTS=("" "" "--expert-model-parallel-size 2" "--moe-grouped-gemm" "--expert-model-parallel-size 2 --moe-grouped-gemm")
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

run_rounds

declare -a tps
printf '%-28s %10s %10s %14s %11s\n' layout "step ms" tokens/s "vs EP1xDP2" comm_share
for i in "${!NAMES[@]}"; do
  ms="$(for round in $(seq 1 "$ROUNDS"); do jq 'select(.record=="summary") | .median_step_ms' "$OUT/$i-$round.jsonl"; done | median)"
  tps[i]="$(jq -n "16 * 256 / ($ms / 1000)")"
done
for i in "${!NAMES[@]}"; do
  ms="$(jq -n "16 * 256 / ${tps[i]} * 1000")"
  base="${tps[1]}"
  [[ $i -ge 3 ]] && base="${tps[3]}"
  share="$(of_steps "$i" .comm_share)"
  printf '%-28s %10.1f %10.1f %13.2fx %10.1f%%\n' "${NAMES[$i]}" "$ms" "${tps[i]}" "$(jq -n "${tps[i]} / $base")" \
    "$(jq -n "$share * 100")"
done
echo "(ratios: each layout against EP=1 x DP=2 with the same expert GEMM path; $ROUNDS interleaved rounds of $STEPS steps; medians)"
