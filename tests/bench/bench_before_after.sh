#!/usr/bin/env bash
# Single-rank regression check: the mt-train runs of bench_gpt2.sh (GPT-2 124M, B,T = 4,64 and
# 8,256, fp32 and bf16) with two builds, interleaved round after round on the same cores. Prints
# each build's median step time over rounds (each run's own median step, first step excluded) and
# the ratio after/before. A benchmark, not a test: quote the figures, never assert on them.
# Usage: tests/bench/bench_before_after.sh BEFORE_BIN_DIR AFTER_BIN_DIR [rounds] [steps]
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BEFORE_BIN_DIR AFTER_BIN_DIR [rounds] [steps]" >&2
  exit 2
fi
BEFORE="$1"
AFTER="$2"
ROUNDS="${3:-3}"
STEPS="${4:-6}"
THREADS="${OMP_NUM_THREADS:-$(nproc)}"
for dir in "$BEFORE" "$AFTER"; do
  [[ -x "$dir/mt-train" ]] || { echo "$0: error: $dir/mt-train: not an executable" >&2; exit 2; }
done
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

CASES=("4 64 fp32" "4 64 bf16" "8 256 fp32" "8 256 bf16")
run_case() {
  local bin="$1" case="$2" out="$3" B T dtype
  read -r B T dtype <<<"$case"
  local flag=()
  [[ $dtype == bf16 ]] && flag=(--bf16)
  OMP_NUM_THREADS=$THREADS "$bin/mt-train" --model gpt2-124m --mock-data --seq-length "$T" \
    --micro-batch-size "$B" --train-iters "$STEPS" --eval-iters 0 --hidden-dropout 0 --log-interval 1000 \
    "${flag[@]}" 2>"$OUT/err" | jq 'select(.record=="summary") | .median_step_ms' >"$out" ||
    { echo "bench: $bin/mt-train ($case) failed: $(tail -3 "$OUT/err")" >&2; exit 1; }
}

for round in $(seq 1 "$ROUNDS"); do
  for c in "${!CASES[@]}"; do
    run_case "$BEFORE" "${CASES[$c]}" "$OUT/before-$c-$round"
    run_case "$AFTER" "${CASES[$c]}" "$OUT/after-$c-$round"
  done
done

median() { jq -s 'sort | .[(length - 1) / 2 | floor]'; }
printf '%-16s %14s %14s %8s\n' "B,T dtype" "before ms" "after ms" "ratio"
for c in "${!CASES[@]}"; do
  before="$(cat "$OUT"/before-"$c"-* | median)"
  after="$(cat "$OUT"/after-"$c"-* | median)"
  read -r B T dtype <<<"${CASES[$c]}"
  printf '%-16s %14.1f %14.1f %7.3fx\n' "$B,$T $dtype" "$before" "$after" "$(jq -n "$after / $before")"
done
echo "(GPT-2 124M, $THREADS threads, $ROUNDS interleaved rounds of $STEPS steps; ratio = after / before step time, below 1 is faster)"
