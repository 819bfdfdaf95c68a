#!/bin/bash
# The dense MFU-scaling suite of the FSDP/TP study (KempnerForge benchmarks/mfu_scaling: 14 runs of
# Llama 7B/13B/70B on 1-32 H200, 4 a node, FSDP and TP + FSDP, bf16, full recompute, seq 4096,
# each run's batch, 20 steps; MFU = (6 x all parameters + 12 L h s) x tokens/s / 989 TFLOP/s).
# The rows, their layouts, batches and published figures are data/perf/published_runs.csv's
# fsdp-* rows (sources there). A driver: `bash recipes/fsdp_tp_scaling.sh [ROW...]` submits one
# job per row with that row's resources (this file again, with MT_ROW set); no ROW: every row.
# Rows with FSDP (dp_shard) train with Megatron-FSDP's --use-megatron-fsdp
# --data-parallel-sharding-strategy optim_grads_params --overlap-grad-reduce over the row's DP ranks
# (the study's FSDP2 shards parameters, grads and optimizer state alike); mt-train has no CUDA path
# for FSDP's grad sharding yet, so at full scale those rows are refused by name: MT_SCALE=tiny runs
# them on CPU ranks and MT_DRY_RUN=1 plans them (on the CPU table).
# MT_SCALE=tiny submits each row on CPU ranks of one node (its world: at most 4 ranks here);
# MT_DRY_RUN=1 runs each row's full-scale mt-train --dry-run instead of submitting.
# MT_SBATCH names the submit command (default sbatch). README "Running a recipe".
# Tested in tests/slurm/slurm.bats (a TP row and a TP + FSDP row, tiny) and tests/slurm/recipes.bats (refusals, dry runs).
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append

set -euo pipefail

# sbatch runs a copy of this file from its spool directory: find the checkout from the job.
if [[ -n "${SLURM_JOB_ID:-}" && "$0" == */slurm_script ]]; then
  self="$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')"
else
  self="${BASH_SOURCE[0]}"
fi
MT_ROOT="${MT_ROOT:-$(cd "$(dirname "$self")/.." && pwd)}"
export MT_ROOT

# The row's fields from the published table: id gpus tp fsdp micro global seq model overrides mfu tok/s
row_fields() {
  python3 - "$MT_ROOT/data/perf/published_runs.csv" "$1" <<'PY'
import csv, sys
for row in csv.DictReader(open(sys.argv[1])):
    if row["id"] == sys.argv[2] and row["id"].startswith("fsdp-"):
        print(row["gpus"], row["tp"], row["fsdp"], row["micro_batch"], row["global_batch"], row["seq_length"],
              row["model"], row["model_overrides"] or "-", row["reported_mfu"], row["reported_tokens_per_s"])
        break
else:
    sys.exit(f"fsdp_tp_scaling: {sys.argv[2]}: no such row (data/perf/published_runs.csv's fsdp-* rows)")
PY
}

all_rows() { python3 -c 'import csv,sys; print(*[r["id"] for r in csv.DictReader(open(sys.argv[1])) if r["id"].startswith("fsdp-")])' \
  "$MT_ROOT/data/perf/published_runs.csv"; }

# --- one row: the job ------------------------------------------------------------------------------
run_row() {
  local gpus tp fsdp micro global seq model overrides mfu tokens fields refusal
  fields="$(row_fields "$MT_ROW")" || exit 2
  read -r gpus tp fsdp micro global seq model overrides mfu tokens <<<"$fields"
  refusal="$(fsdp_refusal "$fsdp")"
  [[ -z "$refusal" ]] || { echo "fsdp_tp_scaling: $MT_ROW: refused: $refusal" >&2; exit 2; }
  RECIPE="fsdp_tp_scaling.$MT_ROW"
  WORLD=$gpus TP=$tp PP=1 CP=1 SP=0
  MODEL_ARGS=(--model "$model")
  if [[ "$overrides" != - ]]; then
    local pair
    for pair in ${overrides//;/ }; do MODEL_ARGS+=("--${pair%%=*}" "${pair#*=}"); MODEL_ARGS[-2]="${MODEL_ARGS[-2]//_/-}"; done
  fi
  TRAIN_ARGS=(--seq-length "$seq" --max-position-embeddings "$seq" --micro-batch-size "$micro" --global-batch-size "$global"
              --train-iters 20 --lr 3e-4 --lr-warmup-iters 5 --lr-decay-style constant --clip-grad 1.0 --seed 42 --bf16
              --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
              --flops-convention 6N+12LCT --eval-interval 20 --eval-iters 1 --log-interval 1)
  [[ $fsdp -eq 0 ]] || TRAIN_ARGS+=(--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --overlap-grad-reduce)
  TINY_FAMILY=llama
  TOKENIZER_ARGS=(--tokenizer-type TikTokenizer --tokenizer-model "$MT_ROOT/data/tokenizers/llama3/tokenizer.model")
  PEAK_DEVICE=h200 CLUSTER=h200-4gpu-nodes
  PUBLISHED="MFU $(awk -v m="$mfu" 'BEGIN { printf "%.1f%%", m * 100 }') (6N + 12 L h s over 989 TFLOP/s), $tokens tokens/s"
  PUBLISHED_SOURCE="KempnerForge benchmarks/mfu_scaling, data/perf/published_runs.csv $MT_ROW"
  source "$MT_ROOT/recipes/common.sh"
  mt_recipe_main
}

# Why a row with FSDP (its fsdp field, $1, not 0) cannot run where it is asked to; nothing if it can.
fsdp_refusal() {
  [[ $1 -ne 0 ]] || return 0
  if [[ "${MT_SCALE:-full}" == full && "${MT_DRY_RUN:-0}" != 1 ]]; then
    echo "mt-train refuses FSDP's grad sharding with --device cuda (no CUDA path for its unit reduce-scatters and page pools yet): MT_SCALE=tiny runs the row on CPU ranks, MT_DRY_RUN=1 plans it"
  fi
}

# --- the driver: one job per row ---------------------------------------------------------------------
submit_rows() {
  local rows=("$@") row refused=0 submitted=0 dry_failed=0
  [[ ${#rows[@]} -gt 0 ]] || read -r -a rows <<<"$(all_rows)"
  for row in "${rows[@]}"; do
    local gpus tp fsdp rest fields refusal
    fields="$(row_fields "$row")" || exit 2
    read -r gpus tp fsdp rest <<<"$fields"
    refusal="$(fsdp_refusal "$fsdp")"
    if [[ -n "$refusal" ]]; then
      echo "fsdp_tp_scaling: $row: refused: $refusal" >&2
      refused=$((refused + 1))
      continue
    fi
    if [[ "${MT_DRY_RUN:-0}" == 1 ]]; then
      local status=0
      MT_ROW="$row" bash "$MT_ROOT/recipes/fsdp_tp_scaling.sh" || status=$?
      echo "fsdp_tp_scaling: $row: dry run exit $status" >&2
      [[ $status -eq 0 ]] || dry_failed=$((dry_failed + 1))
      submitted=$((submitted + 1))
      continue
    fi
    local resources=(--job-name="mt-fsdp-$row" --output="mt-fsdp-$row-%j.out")
    if [[ "${MT_SCALE:-full}" == tiny ]]; then
      resources+=(--nodes=1 --ntasks="$gpus" --cpus-per-task=1 --time=15)
    else
      resources+=(--nodes=$(((gpus + 3) / 4)) --ntasks="$gpus" --ntasks-per-node=$((gpus < 4 ? gpus : 4))
                  --gpus-per-node=$((gpus < 4 ? gpus : 4)) --cpus-per-task=16 --time=01:00:00)
    fi
    echo "fsdp_tp_scaling: $row: $(${MT_SBATCH:-sbatch} --parsable "${resources[@]}" --export="ALL,MT_ROW=$row,MT_ROOT=$MT_ROOT" \
      "$MT_ROOT/recipes/fsdp_tp_scaling.sh")"
    submitted=$((submitted + 1))
  done
  [[ $submitted -gt 0 || $refused -eq 0 ]] || exit 2
  [[ $dry_failed -eq 0 ]] || exit 2
}

if [[ -n "${MT_ROW:-}" ]]; then run_row; else submit_rows "$@"; fi
