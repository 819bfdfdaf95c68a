#!/usr/bin/env bash
# The pipeline bubble: GPT-2 124M, T=256, fp32, 8 micro-batches of 1 sample per step, on the same
# cores: one rank with 2 threads against PP=2 with 1 thread per rank, 1F1B (v = 1) and interleaved
# (v = 2), the last stage given fewer layers for the lm-head (--decoder-last-pipeline-num-layers,
# default 4 of 12: the head's GEMM costs about 5 layers' at this vocabulary). The bubble is
# measured from mt-train's per-rank timers as (pipeline_ms - compute_ms) / compute_ms: the
# longest rank's wall time running the schedule against the busiest rank's forward/backward
# compute; Megatron's theory is (p - 1) / (v m). Runs are interleaved (round after round of every
# layout); each figure is the median over rounds of a run's median over its steps (the first step
# excluded). Prints step time, tokens/s and the ratio to one rank, compute, bubble and theory, and
# the load average before and after (the machine may be shared). A benchmark, not a test: quote
# the figures, never assert on them.
# Usage: tests/bench/bench_pipeline.sh [rounds] [steps]   (MT_BENCH_LAST_LAYERS overrides the 4)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
ROUNDS="${1:-2}"
STEPS="${2:-4}"
LAST_LAYERS="${MT_BENCH_LAST_LAYERS:-4}"
MICRO_BATCHES=8
# shellcheck source=tests/bench/two_cores.sh
source "$ROOT/tests/bench/two_cores.sh"

MODEL=(--model gpt2-124m --mock-data --seq-length 256 --global-batch-size "$MICRO_BATCHES" --micro-batch-size 1
       --train-iters "$STEPS" --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --log-interval 1000 --peak-tflops 1)
NAMES=("1 rank x 2 threads" "PP=2 1F1B (v=1)" "PP=2 interleaved (v=2)")
CHUNKS=(1 1 2)
LAYOUTS=(""
         "--pipeline-model-parallel-size 2 --decoder-last-pipeline-num-layers $LAST_LAYERS"
         "--pipeline-model-parallel-size 2 --decoder-last-pipeline-num-layers $LAST_LAYERS --num-virtual-stages-per-pipeline-rank 2")
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
run_rounds
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

base=0
printf '%-24s %9s %9s %7s %11s %12s %7s %7s\n' layout "step ms" tokens/s ratio "compute ms" "pipeline ms" bubble theory
for i in "${!NAMES[@]}"; do
  ms="$(of_steps "$i" .step_ms)"
  compute="$(of_steps "$i" .compute_ms)"
  pipeline="$(of_steps "$i" .pipeline_ms)"
  bubble="$(of_steps "$i" '((.pipeline_ms - .compute_ms) / .compute_ms)')"
  tps="$(jq -n "$MICRO_BATCHES * 256 / ($ms / 1000)")"
  [[ $i -eq 0 ]] && base="$tps"
  p=$([[ $i -eq 0 ]] && echo 1 || echo 2)
  theory="$(jq -n "($p - 1) / (${CHUNKS[$i]} * $MICRO_BATCHES) * 100")"
  printf '%-24s %9.1f %9.1f %6.2fx %11.1f %12.1f %6.1f%% %6.1f%%\n' "${NAMES[$i]}" "$ms" "$tps" "$(jq -n "$tps / $base")" \
    "$compute" "$pipeline" "$(jq -n "$bubble * 100")" "$theory"
done
echo "(GPT-2 124M fp32, T=256, $MICRO_BATCHES micro-batches of 1; last stage $LAST_LAYERS of 12 layers; $ROUNDS interleaved rounds of $STEPS steps; medians)"
