#!/usr/bin/env bash
# Regression check of two builds: GPT-2 124M in mt-train at B,T = 4,64 and 8,256, fp32 and bf16 on
# one rank (2 threads), and fp32 at 8,256 under DP=2, TP=2 and PP=2 (2 ranks of 1 thread each),
# with the BEFORE build, the AFTER build and the BEFORE build again, interleaved round after round
# on the same cores. Prints each build's median step time over rounds (each run's own median step,
# first step excluded), the ratio after/before, and the ratio of the BEFORE build against itself:
# the spread a ratio has to beat to mean anything. A benchmark, not a test: quote the figures,
# never assert on them.
# Usage: tests/bench/bench_before_after.sh BEFORE_BIN_DIR AFTER_BIN_DIR [rounds] [steps]
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BEFORE_BIN_DIR AFTER_BIN_DIR [rounds] [steps]" >&2
  exit 2
fi
BEFORE="$1"
AFTER="$2"
ROUNDS="${3:-5}"
STEPS="${4:-6}"
for dir in "$BEFORE" "$AFTER"; do
  [[ -x "$dir/mt-train" ]] || { echo "$0: error: $dir/mt-train: not an executable" >&2; exit 2; }
done
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_WAIT_POLICY=passive

# "B T dtype ranks layout flags": one rank runs on 2 threads, 2 ranks on 1 thread each.
CASES=("4 64 fp32 1" "4 64 bf16 1" "8 256 fp32 1" "8 256 bf16 1"
       "8 256 fp32 2 --global-batch-size 16"
       "8 256 fp32 2 --tensor-model-parallel-size 2"
       "8 256 fp32 2 --pipeline-model-parallel-size 2 --global-batch-size 16")
NAMES=("4,64 fp32" "4,64 bf16" "8,256 fp32" "8,256 bf16" "8,256 fp32 DP=2" "8,256 fp32 TP=2" "8,256 fp32 PP=2")

run_case() {
  local bin="$1" case="$2" out="$3" B T dtype ranks
  read -r B T dtype ranks flags <<<"$case"
  local args=(--model gpt2-124m --mock-data --seq-length "$T" --micro-batch-size "$B" --train-iters "$STEPS"
              --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --log-interval 1000 --peak-tflops 1)
  [[ $dtype == bf16 ]] && args+=(--bf16)
  # shellcheck disable=SC2206
  [[ -n ${flags:-} ]] && args+=($flags)
  if [[ $ranks -eq 1 ]]; then
    OMP_NUM_THREADS=2 "$bin/mt-train" "${args[@]}" 2>"$OUT/err"
  else
    OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe --bind-to none "$bin/mt-train" "${args[@]}" 2>"$OUT/err"
  fi | jq 'select(.record=="summary") | .median_step_ms' >"$out" ||
    { echo "bench: $bin/mt-train ($case) failed: $(tail -3 "$OUT/err")" >&2; exit 1; }
}

for round in $(seq 1 "$ROUNDS"); do
  for c in "${!CASES[@]}"; do
    run_case "$BEFORE" "${CASES[$c]}" "$OUT/before-$c-$round"
    run_case "$AFTER" "${CASES[$c]}" "$OUT/after-$c-$round"
    run_case "$BEFORE" "${CASES[$c]}" "$OUT/again-$c-$round"
  done
done

median() { jq -s 'sort | .[(length - 1) / 2 | floor]'; }
printf '%-18s %11s %11s %11s %14s %14s\n' case "before ms" "after ms" "again ms" "after/before" "again/before"
for c in "${!CASES[@]}"; do
  before="$(cat "$OUT"/before-"$c"-* | median)"
  after="$(cat "$OUT"/after-"$c"-* | median)"
  again="$(cat "$OUT"/again-"$c"-* | median)"
  printf '%-18s %11.1f %11.1f %11.1f %13.3fx %13.3fx\n' "${NAMES[$c]}" "$before" "$after" "$again" \
    "$(jq -n "$after / $before")" "$(jq -n "$again / $before")"
done
echo "(GPT-2 124M on $(nproc) cores, $ROUNDS interleaved rounds of $STEPS steps; ratio = step time / the BEFORE"
echo " build's, below 1 is faster; again/before is the BEFORE build against itself: the noise a ratio must beat)"
