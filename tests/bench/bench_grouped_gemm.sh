#!/usr/bin/env bash
# The MoE experts' grouped GEMM against the loop over experts (mt_bench_grouped_gemm, whose header
# says what it times), with idle OpenMP threads yielding; arguments pass through.
#   tests/bench/bench_grouped_gemm.sh [--model tiny|bench|all] [--rounds N] [--ffn F] [--max-tokens N]
# BUILD_DIR (default build) holds the binary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${BUILD_DIR:-$ROOT/build}/tests/mt_bench_grouped_gemm"
[[ -x "$BIN" ]] || { echo "bench_grouped_gemm: build it first: cmake --build build --target mt_bench_grouped_gemm" >&2; exit 1; }
OMP_WAIT_POLICY=passive exec "$BIN" "$@"
