#!/usr/bin/env bash
# Megatron-FSDP's memory per rank (issue 25): a LLaMA-shaped model of about 70M parameters (8
# layers, hidden 768, vocabulary 8000; 280 MB of fp32 weights), fp32, 2 steps at DP=2 under each
# --data-parallel-sharding-strategy. Prints, per strategy, the ledger's high-water marks of the last
# step record (weights, grads, optimizer, all categories: the largest over the ranks) and the
# largest peak resident set over the ranks (GNU time's maximum RSS, which also holds the
# activations, MPI and the program). A benchmark, not a test: quote the figures, never assert on
# them. Usage: tests/bench/bench_fsdp_memory.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
# shellcheck source=tests/bench/two_cores.sh
source "$ROOT/tests/bench/two_cores.sh"

MODEL=(--model tiny-llama --num-layers 8 --hidden-size 768 --num-attention-heads 12 --num-query-groups 12
       --ffn-hidden-size 2048 --vocab-size 8000 --seq-length 64 --max-position-embeddings 64 --mock-data
       --micro-batch-size 2 --global-batch-size 8 --train-iters 2 --eval-iters 0 --log-interval 1000
       --peak-tflops 1)
STRATEGIES=(no_shard optim optim_grads optim_grads_params)
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

mb() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }

printf '%-20s %12s %12s %12s %12s %14s\n' strategy "weights MB" "grads MB" "optim MB" "ledger MB" "peak RSS MB"
for strategy in "${STRATEGIES[@]}"; do
  OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe --bind-to none /usr/bin/time -f "rss_kb %M" -o "$OUT/rss-%q{OMPI_COMM_WORLD_RANK}" \
    "$MT_BIN/mt-train" "${MODEL[@]}" --use-megatron-fsdp --data-parallel-sharding-strategy "$strategy" \
    >"$OUT/$strategy.jsonl" 2>"$OUT/err" || { echo "bench: $strategy failed: $(tail -3 "$OUT/err")" >&2; exit 1; }
  read -r weights grads optim peak < <(jq -r 'select(.record == "step") |
    "\(.mem_weights_bytes) \(.mem_grads_bytes) \(.mem_optim_bytes) \(.mem_peak_bytes)"' "$OUT/$strategy.jsonl" | tail -1)
  rss_kb="$(cat "$OUT"/rss-* | awk '/rss_kb/ { if ($2 > m) m = $2 } END { print m }')"
  rm -f "$OUT"/rss-*
  printf '%-20s %12s %12s %12s %12s %14s\n' "$strategy" "$(mb "$weights")" "$(mb "$grads")" "$(mb "$optim")" \
    "$(mb "$peak")" "$((rss_kb / 1024))"
done
