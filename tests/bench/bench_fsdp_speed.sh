#!/usr/bin/env bash
# Megatron-FSDP's speed (issue 25): a small LLaMA-shaped model (RMSNorm, SwiGLU, RoPE, untied
# head; 6 layers, hidden 256, vocabulary 4000, T=64, global batch 8, micro-batch 2; 6.9M
# parameters, fp32) on 2
# and on 4 ranks (1 thread each; 4 ranks oversubscribe this 2-core machine), data-parallel with
# the distributed optimizer (the baseline) against --use-megatron-fsdp optim_grads_params with and
# without prefetch (--no-fsdp-prefetch) and with the unit reduce-scatters overlapped
# (--overlap-grad-reduce). Per layout: the median step (steps after the first
# WARMUP excluded; the median over interleaved rounds of each run's median), tokens/s and its
# ratio to the baseline's; the peak memory per rank (the ledger's largest high-water mark over the
# ranks, mem_peak_bytes) and its ratio to the baseline's beside mt-memreport's predicted ratio of
# the same runs (total_bytes) and the issue's bound, predicted + 0.05; and the share of the unit
# gathers hidden behind compute, 1 - fsdp_gather_wait_ms / fsdp_gather_ms of the step records
# (rank 0's host time blocked on the gathers against their time from start to done, per step),
# and the prefetched run's time blocked on them against the blocking gathers' of the run without
# prefetch; and rank 0's unit grad reduce-scatters per step, fsdp_reduce_ms / fsdp_reduce_wait_ms
# (all wait unless overlapped; the wait includes the other ranks' lateness). A benchmark, not a
# test: quote the figures, never assert on them.
# Usage: tests/bench/bench_fsdp_speed.sh [rounds] [steps]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
ROUNDS="${1:-3}"
STEPS="${2:-5}"
WARMUP=2
# shellcheck source=tests/bench/two_cores.sh
source "$ROOT/tests/bench/two_cores.sh"

GLOBAL=8
SEQ=64
SHAPE=(--model tiny-llama --num-layers 6 --hidden-size 256 --num-attention-heads 4 --num-query-groups 4
       --ffn-hidden-size 704 --vocab-size 4000 --seq-length "$SEQ" --max-position-embeddings "$SEQ"
       --micro-batch-size 2 --global-batch-size "$GLOBAL")
MODEL=("${SHAPE[@]}" --mock-data --train-iters "$STEPS" --eval-iters 0 --log-interval 1000 --peak-tflops 1)
FSDP="--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params"
NAMES=("DP, distributed optimizer" "FSDP optim_grads_params" "FSDP, --no-fsdp-prefetch" "FSDP, --overlap-grad-reduce")
LAYOUTS=("--use-distributed-optimizer" "$FSDP" "$FSDP --no-fsdp-prefetch" "$FSDP --overlap-grad-reduce")
RANK_COUNTS=(2 4)
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

for round in $(seq 1 "$ROUNDS"); do
  for ranks in "${RANK_COUNTS[@]}"; do
    for i in "${!NAMES[@]}"; do
      # shellcheck disable=SC2086
      OMP_NUM_THREADS=1 mpirun -np "$ranks" --oversubscribe --bind-to none "$MT_BIN/mt-train" "${MODEL[@]}" ${LAYOUTS[$i]} \
        >"$OUT/$ranks-$i-$round.jsonl" 2>"$OUT/err" \
        || { echo "bench: '${NAMES[$i]}' on $ranks ranks failed: $(tail -3 "$OUT/err")" >&2; exit 1; }
    done
  done
done

# of_runs RANKS I FILTER: the median over rounds of FILTER applied to the array of a run's step
# records after the warm-up.
of_runs() {
  local ranks="$1" i="$2" filter="$3" round
  for round in $(seq 1 "$ROUNDS"); do
    jq -s "[.[] | select(.record == \"step\")][$WARMUP:] | $filter" "$OUT/$ranks-$i-$round.jsonl"
  done | median
}
# predicted RANKS I: mt-memreport's total bytes per rank (the largest over stages) for layout I.
predicted() {
  # shellcheck disable=SC2086
  "$MT_BIN/mt-memreport" "${SHAPE[@]}" --world-size "$1" ${LAYOUTS[$2]} |
    jq -s '[.[] | select(.record == "memory") | .total_bytes] | max'
}

printf '%-5s %-28s %8s %9s %6s %8s %6s %9s %6s %9s %8s %7s %10s\n' ranks layout "step ms" tokens/s "vs DP" "peak MB" \
  "vs DP" predicted bound "gather ms" "wait ms" hidden "reduce/wait"
for ranks in "${RANK_COUNTS[@]}"; do
  for i in "${!NAMES[@]}"; do
    ms="$(of_runs "$ranks" "$i" '[.[].step_ms] | sort | .[(length - 1) / 2 | floor]')"
    peak="$(of_runs "$ranks" "$i" '.[-1].mem_peak_bytes')"
    tps="$(jq -n "$GLOBAL * $SEQ / ($ms / 1000)")"
    total="$(predicted "$ranks" "$i")"
    if [[ $i -eq 0 ]]; then
      base_tps="$tps" base_peak="$peak" base_total="$total"
      gather="-" wait="-" hidden="-" reduce="-"
    else
      reduce="$(printf '%.1f/%.1f' "$(of_runs "$ranks" "$i" '[.[].fsdp_reduce_ms] | add / length')" \
        "$(of_runs "$ranks" "$i" '[.[].fsdp_reduce_wait_ms] | add / length')")"
      gather="$(of_runs "$ranks" "$i" '[.[].fsdp_gather_ms] | add / length')"
      wait="$(of_runs "$ranks" "$i" '[.[].fsdp_gather_wait_ms] | add / length')"
      hidden="$(printf '%.0f%%' "$(jq -n "(1 - $wait / $gather) * 100")")"
      gather="$(printf '%.1f' "$gather")" wait="$(printf '%.1f' "$wait")"
    fi
    ratio="$(jq -n "$peak / $base_peak")" predicted_ratio="$(jq -n "$total / $base_total")"
    printf '%-5s %-28s %8.1f %9.1f %5.2fx %8.1f %5.2fx %8.2fx %5.2fx %9s %8s %7s %10s\n' "$ranks" "${NAMES[$i]}" "$ms" \
      "$tps" "$(jq -n "$tps / $base_tps")" "$(jq -n "$peak / 1048576")" "$ratio" "$predicted_ratio" \
      "$(jq -n "$predicted_ratio + 0.05")" "$gather" "$wait" "$hidden" "$reduce"
  done
  # Against the blocking gathers' cost: the prefetched run's wait over the run whose every gather blocks.
  blocked="$(of_runs "$ranks" 2 '[.[].fsdp_gather_wait_ms] | add / length')"
  exposed="$(of_runs "$ranks" 1 '[.[].fsdp_gather_wait_ms] | add / length')"
  printf '      %d ranks: prefetch leaves %.1f ms of the %.1f ms the blocking gathers take exposed (%.0f%% hidden)\n' \
    "$ranks" "$exposed" "$blocked" "$(jq -n "(1 - $exposed / $blocked) * 100")"
done
echo "(LLaMA-shaped, 6 layers, hidden 256, fp32, T=$SEQ, global batch $GLOBAL, micro-batch 2; 1 thread per rank,"
echo " 4 ranks oversubscribe 2 cores; $ROUNDS interleaved rounds of $STEPS steps, the first $WARMUP of each run"
echo " excluded; medians. Target: FSDP >= 0.85x DP's tokens/s, peak ratio <= bound. gather/wait, reduce/wait: rank 0's"
echo " ms per step)"
