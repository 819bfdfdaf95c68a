#!/usr/bin/env bash
# GPT-2 124M training throughput: mt-train against PyTorch in the same script, same threads.
# Prints tokens/s per implementation, the ratios, and mt's model FLOP/s against the same-dtype
# GEMM rate mt-train measures in the same run (its 2048^3 probe on the path the model takes). A benchmark, not a test:
# quote the figures, don't assert on them. Usage: tests/bench/bench_gpt2.sh [steps]
# Extra PyTorch interpreters (e.g. a venv with a current torch) via MT_BENCH_TORCH="python ...".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
STEPS="${1:-6}"
THREADS="${OMP_NUM_THREADS:-$(nproc)}"
TORCHES=("/usr/bin/python3" ${MT_BENCH_TORCH:-})

# Debian's python3-torch runs on whatever libblas.so.3 is selected: the reference BLAS makes it
# ~10x slower than it can be, so the benchmark installs OpenBLAS (what PyTorch's baseline used).
if ! update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep -q '^Value: .*openblas'; then
  echo "bench: installing libopenblas0-pthread so PyTorch does not run on the reference BLAS" >&2
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends libopenblas0-pthread >&2
fi

printf '%-28s %-5s %-8s %12s %10s %s\n' implementation dtype "B,T" "step ms" "tokens/s" "notes"
for shape in "4 64" "8 256"; do
  read -r B T <<<"$shape"
  for dtype in fp32 bf16; do
    flag=(); [[ $dtype == bf16 ]] && flag=(--bf16)
    mt_json="$(OMP_NUM_THREADS=$THREADS "$MT_BIN/mt-train" --model gpt2-124m --mock-data --seq-length "$T" \
      --micro-batch-size "$B" --train-iters "$STEPS" --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --log-interval 1000 \
      "${flag[@]}" 2>/dev/null)"
    mt_tps="$(jq -r 'select(.record=="summary") | .tokens_per_s' <<<"$mt_json")"
    mt_ms="$(jq -r 'select(.record=="summary") | .median_step_ms' <<<"$mt_json")"
    mt_tflops="$(jq -r 'select(.record=="summary") | .tflops_per_device' <<<"$mt_json")"
    gemm="$(jq -r 'select(.record=="run") | .peak_tflops' <<<"$mt_json")"
    printf '%-28s %-5s %-8s %12.1f %10.1f model %.1f GFLOP/s = %.0f%% of %s GEMM %.1f GFLOP/s\n' mt-train "$dtype" "$B,$T" \
      "$mt_ms" "$mt_tps" "$(jq -n "$mt_tflops*1000")" "$(jq -n "100*$mt_tflops/$gemm")" "$dtype" "$(jq -n "$gemm*1000")"
    best=0
    for py in "${TORCHES[@]}"; do
      for mode in eager compile; do
        extra=(); [[ $mode == compile ]] && extra=(--compile)
        [[ $mode == compile && "$py" == /usr/bin/python3 ]] && continue  # torch 1.13 has no compile
        line="$(OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4 OMP_NUM_THREADS=$THREADS \
          $py "$ROOT/tests/bench/torch_gpt2.py" --batch "$B" --seq "$T" --dtype "$dtype" --steps "$STEPS" \
          --threads "$THREADS" "${extra[@]}" 2>/dev/null)" || continue
        tps="$(jq -r .tokens_per_s <<<"$line")"
        printf '%-28s %-5s %-8s %12.1f %10.1f\n' "$(jq -r .impl <<<"$line")" "$dtype" "$B,$T" \
          "$(jq -r .median_step_ms <<<"$line")" "$tps"
        best="$(jq -n "[$best, $tps] | max")"
      done
    done
    printf '%-28s %-5s %-8s %12s %10s mt / fastest PyTorch = %.2fx\n' ratio "$dtype" "$B,$T" "" "" "$(jq -n "$mt_tps/$best")"
  done
done
