#!/usr/bin/env bash
# Per-process start-up of the mt-* tools: the shared libraries each loads (`ldd` lines, CUDA ones
# among them) and the wall and CPU (user + system) seconds of RUNS runs of `--help` and, for
# mt-tokenize, of a one-document encode (tokenizer load, MPI_Init and the run record included).
# With MT_BASELINE_BIN (another build's bin directory, e.g. an older commit's) the same runs of
# that build alternate with this build's in one loop, and the CPU ratio (baseline / this) is
# printed. A benchmark, not a test: it prints figures and asserts nothing. Wall time on a loaded
# machine is mostly waiting for a core; CPU seconds are the steadier figure.
# Usage: tests/bench/bench_startup.sh   Env: MT_BIN (default build/bin), MT_BASELINE_BIN, RUNS (default 50).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
BASELINE_BIN="${MT_BASELINE_BIN:-}"
RUNS="${RUNS:-50}"
TOK="$ROOT/data/tokenizers"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
printf '{"text":"Hello world, a one-line encode."}\n' >"$work/one.jsonl"

# `cpu_of BIN ARGS...`: "wall user sys" seconds of one run, stdout and stderr dropped.
cpu_of() {
  local TIMEFORMAT='%R %U %S'
  { time "$@" >/dev/null 2>&1; } 2>&1
}

# `measure LABEL ARGS...` (ARGS after the binary's name): RUNS runs of this build and of the
# baseline, alternating; prints total wall, total CPU and the ratio.
measure() {
  local label="$1" tool="$2"
  shift 2
  local builds=("$MT_BIN")
  [[ -n "$BASELINE_BIN" ]] && builds+=("$BASELINE_BIN")
  declare -A wall cpu
  for b in "${builds[@]}"; do wall[$b]=0 cpu[$b]=0; done
  for _ in $(seq "$RUNS"); do
    for b in "${builds[@]}"; do
      read -r r u s < <(cpu_of "$b/$tool" "$@")
      wall[$b]=$(echo "${wall[$b]} + $r" | bc) cpu[$b]=$(echo "${cpu[$b]} + $u + $s" | bc)
    done
  done
  local line
  line=$(printf '%-28s %4d runs: this %6.2f s wall %6.2f s CPU (%.3f s CPU each)' "$label" "$RUNS" \
    "${wall[$MT_BIN]}" "${cpu[$MT_BIN]}" "$(echo "${cpu[$MT_BIN]} / $RUNS" | bc -l)")
  if [[ -n "$BASELINE_BIN" ]]; then
    line+=$(printf '; baseline %6.2f s wall %6.2f s CPU (%.3f each): CPU ratio %.2f' "${wall[$BASELINE_BIN]}" \
      "${cpu[$BASELINE_BIN]}" "$(echo "${cpu[$BASELINE_BIN]} / $RUNS" | bc -l)" \
      "$(echo "${cpu[$BASELINE_BIN]} / ${cpu[$MT_BIN]}" | bc -l)")
  fi
  echo "$line"
}

libraries() { printf '%s: %d libraries (%d CUDA/NCCL)' "$1" "$(ldd "$1" | wc -l)" \
  "$(ldd "$1" | grep -cE 'lib(cudart|cublas|cublasLt|nccl)\.so' || true)"; }

for tool in mt-tokenize mt-shard mt-train mt-ckpt mt-mfu mt-memreport mt-plot; do
  line="$(libraries "$MT_BIN/$tool")"
  [[ -n "$BASELINE_BIN" ]] && line+="; baseline $(libraries "$BASELINE_BIN/$tool" | sed 's/^[^:]*: //')"
  echo "$line"
done
for tool in mt-tokenize mt-shard mt-train mt-ckpt; do
  measure "$tool --help" "$tool" --help
done
measure "mt-tokenize encode (1 doc)" mt-tokenize encode --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$TOK/gpt2/encoder.json" --merge-file "$TOK/gpt2/vocab.bpe" --input "$work/one.jsonl"
printf 'load average at the end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
