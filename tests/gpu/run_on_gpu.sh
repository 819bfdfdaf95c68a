#!/usr/bin/env bash
# The one script run on a lent GPU machine, from the repository root, over the archive that
# tests/gpu/pack.sh made (.gpu/mt-gpu.tar.xz, carried there as the git-ignored .gpu/). It unpacks
# the archive, finds the CUDA libraries there (the CUDA toolkit, else PyTorch's nvidia/* wheels;
# none are packed), prints the GPU, driver and library versions, then runs its parts in order:
#   selftest   every GPU test binary but the training one (mt_gpu_tests, mt_gpu_op_harness_tests,
#              mt_gpu_fp8_tests, the NCCL ones, ...: every packed mt_gpu_*), run directly (CTest files
#              hold this machine's build paths); mt_gpu_fp8_tests prints the FP8-vs-bf16 GEMM
#              TFLOP/s at 8192^3 ("[fp8] speed"), copied into summary.txt
#   training   mt_gpu_training_tests: 10 fp32 steps (TF32 off), CUDA table against the CPU table
#              (dense, MLA with RoPE and YaRN, MoE), and 10 FP8 steps against the CPU emulation
#              (dense, MoE)
#   bench      mt-train --device cuda (GPT-2 124M in bf16 and with FP8, a LLaMA-3-8B-shaped stack) and
#              mt_bench_gpu_attention (tests/bench/gpu_bench_attention.cpp), then
#              tests/bench/gpu_bench_torch.py (PyTorch on the same GPU)
#   bench-mt   (only when named) the bench part without PyTorch's runs
#   sanitize   (only when named) compute-sanitizer memcheck over the op-harness families matching
#              MT_GPU_SANITIZE_FILTER (a gtest filter; default the MoE and FP8 families), then
#              racecheck over the same: a memory error or hazard fails the part (sanitize.log)
# Each part writes its files into $OUT (default .gpu/out) as it ends, at most 8 files in all:
# summary.txt (versions, then one line per part), selftest.log, selftest.xml, training.log,
# training.xml, bench.log, bench.jsonl. Without a GPU every part says skipped and the script
# still ends with its summary (exit 0); a part that fails makes the exit status 1. The whole run
# ends within 6 minutes: each binary and benchmark has a time limit, cut to what is left of a
# 350-second budget (MT_GPU_BUDGET_S); a run the budget no longer fits is reported as skipped.
# The benchmarks run cheapest first (attention, eager, then torch.compile).
#   tests/gpu/run_on_gpu.sh [--archive FILE | --unpacked DIR] [selftest] [training] [bench] [bench-mt] [sanitize]
# Tested by hand on a machine without a GPU (README "Running on a GPU").
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ARCHIVE="$ROOT/.gpu/mt-gpu.tar.xz"
UNPACKED=""
OUT="${OUT:-$ROOT/.gpu/out}"
PARTS=()
while (($#)); do
  case "$1" in
    --archive) ARCHIVE="$2"; shift 2 ;;
    --unpacked) UNPACKED="$2"; shift 2 ;;
    selftest | training | bench | bench-mt | sanitize) PARTS+=("$1"); shift ;;
    -h | --help) sed -n '2,/^# Tested by hand/p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "run_on_gpu.sh: unknown argument '$1' (parts: selftest training bench bench-mt sanitize)" >&2; exit 2 ;;
  esac
done
((${#PARTS[@]})) || PARTS=(selftest training bench)
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
START=$SECONDS
STATUS=0
BUDGET_S="${MT_GPU_BUDGET_S:-350}"  # the whole run's seconds (6 minutes, less unpacking and slack)
# A run's time limit: `limit`, cut to what is left of the budget; 0 when under 20 s is left.
limit_within_budget() {
  local left=$((BUDGET_S - (SECONDS - START)))
  ((left < 20)) && { echo 0; return; }
  echo $(($1 < left ? $1 : left))
}
note() { echo "$*" | tee -a "$SUMMARY"; }

# --- unpack --------------------------------------------------------------------------------------
if [[ -z $UNPACKED ]]; then
  [[ -f $ARCHIVE ]] || { echo "run_on_gpu.sh: no archive $ARCHIVE (run tests/gpu/pack.sh first)" >&2; exit 2; }
  UNPACKED="$(mktemp -d /tmp/mt-gpu.XXXXXX)"
  trap 'rm -rf "$UNPACKED"' EXIT
  # tar without xz falls back to Python's lzma.
  tar -C "$UNPACKED" -xJf "$ARCHIVE" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$ARCHIVE" "$UNPACKED" ||
    { echo "run_on_gpu.sh: cannot unpack $ARCHIVE" >&2; exit 2; }
fi
PACK="$UNPACKED/mt-gpu"
[[ -x $PACK/bin/mt-train ]] || { echo "run_on_gpu.sh: $PACK/bin/mt-train is missing" >&2; exit 2; }

# --- the CUDA libraries of this machine ----------------------------------------------------------
CUDA_LIBS=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2)
cuda_dirs=()
candidates=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
if command -v python3 >/dev/null; then
  while read -r site; do
    [[ -d $site/nvidia ]] && candidates+=("$site"/nvidia/*/lib "$site"/nvidia/*/*/lib)
  done < <(python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
fi
for lib in "${CUDA_LIBS[@]}"; do
  for dir in "${candidates[@]}"; do
    if [[ -e $dir/$lib ]]; then
      [[ " ${cuda_dirs[*]} " == *" $dir "* ]] || cuda_dirs+=("$dir")
      break
    fi
  done
done
MT_LD_PATH="$PACK/lib"
for dir in "${cuda_dirs[@]}"; do MT_LD_PATH+=":$dir"; done
# mt's binaries see the packed libraries and this machine's CUDA libraries; PyTorch sees neither.
run_mt() { LD_LIBRARY_PATH="$MT_LD_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
export NVIDIA_TF32_OVERRIDE=0 OMP_WAIT_POLICY=passive

# The packed binaries and libraries were built on Debian 12: they need glibc 2.36 or newer.
GLIBC="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
if [[ -n $GLIBC ]] && ! printf '2.36\n%s\n' "$GLIBC" | sort -C -V; then
  echo "run_on_gpu.sh: this machine's glibc $GLIBC is older than the 2.36 the packed binaries need (built on Debian 12)" >&2
  exit 2
fi

HAVE_GPU=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then HAVE_GPU=1; fi

note "mt GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), glibc ${GLIBC:-unknown}; $(head -1 "$PACK/PACKED")"
if ((HAVE_GPU)); then
  note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
else
  note "gpu: none found (nvidia-smi lists no GPU): every GPU part is skipped"
fi
command -v nvcc >/dev/null && note "nvcc: $(nvcc --version | tail -1)"
resolved_libs=()
for lib in "${CUDA_LIBS[@]}"; do
  resolved="$(run_mt ldd "$PACK/bin/mt-train" | awk -v l="$lib" '$1 == l {print $3}')"
  note "$lib: ${resolved:-NOT FOUND} $([[ -n $resolved && -e $resolved ]] && echo "-> $(readlink -f "$resolved")")"
  [[ -n $resolved && -e $resolved ]] && resolved_libs+=("$resolved")
done
# The versions the libraries themselves report (their C entry points, through ctypes).
if command -v python3 >/dev/null && ((${#resolved_libs[@]})); then
  note "versions: $(python3 - "${resolved_libs[@]}" <<'PY' 2>&1
import ctypes, sys
out = []
for path in sys.argv[1:]:
    lib, value = ctypes.CDLL(path), ctypes.c_int(0)
    if "cudart" in path:
        lib.cudaRuntimeGetVersion(ctypes.byref(value)); out.append(f"cuda runtime {value.value}")
        value = ctypes.c_int(0); lib.cudaDriverGetVersion(ctypes.byref(value)); out.append(f"driver API {value.value}")
    elif "cublasLt" in path:
        lib.cublasLtGetVersion.restype = ctypes.c_size_t; out.append(f"cublasLt {lib.cublasLtGetVersion()}")
    elif "nccl" in path:
        lib.ncclGetVersion(ctypes.byref(value)); out.append(f"nccl {value.value}")
print(", ".join(out))
PY
)"
fi
note "mt-train --version: $(run_mt "$PACK/bin/mt-train" --version 2>&1 | tr '\n' ' ')"
command -v python3 >/dev/null &&
  note "torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo none)"

# --- gtest binaries --------------------------------------------------------------------------------
# Runs each binary with its XML into $2's folder, its output appended to log $1 (each within
# $3 seconds), merges the XML into $4 and writes a line of counts to the summary.
run_gtests() {
  local part="$1" log="$2" limit="$3" merged="$4"
  shift 4
  local xml_dir
  xml_dir="$(mktemp -d)"
  : >"$log"
  local failed_binaries=()
  for binary in "$@"; do
    local name
    name="$(basename "$binary")"
    echo "=== $name" >>"$log"
    local binary_limit
    binary_limit="$(limit_within_budget "$limit")"
    if ((binary_limit == 0)); then
      failed_binaries+=("$name (not run: the run's time budget is spent)")
      continue
    fi
    run_mt timeout "$binary_limit" "$binary" --gtest_output="xml:$xml_dir/$name.xml" >>"$log" 2>&1
    local rc=$?
    echo "=== $name exit $rc" >>"$log"
    ((rc == 0)) || failed_binaries+=("$name (exit $rc$( ((rc == 124)) && echo ", over ${binary_limit} s"))")
  done
  local counts
  counts="$(python3 "$ROOT/tests/gpu/merge_gtest_xml.py" "$merged" "$xml_dir"/*.xml 2>&1)" || counts="no XML ($counts)"
  rm -rf "$xml_dir"
  if ((${#failed_binaries[@]})); then
    STATUS=1
    note "$part: FAILED: ${failed_binaries[*]}; $counts"
  else
    note "$part: $counts"
  fi
}

part_selftest() {
  local binaries=()
  for b in "$PACK"/tests/mt_gpu_*; do [[ $(basename "$b") == mt_gpu_training_tests ]] || binaries+=("$b"); done
  run_gtests selftest "$OUT/selftest.log" 150 "$OUT/selftest.xml" "${binaries[@]}"
  grep -h '^\[fp8\] speed' "$OUT/selftest.log" 2>/dev/null | tee -a "$SUMMARY" || true
}

part_training() {
  [[ -x $PACK/tests/mt_gpu_training_tests ]] || { STATUS=1; note "training: FAILED: mt_gpu_training_tests not packed"; return; }
  run_gtests training "$OUT/training.log" 180 "$OUT/training.xml" "$PACK/tests/mt_gpu_training_tests"
}

# mt-train's dense bf16 peak for this GPU (its --peak-device names), or nothing.
mt_peak_device() {
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H100*PCIe*) echo h100-pcie ;;
    *H100*) echo h100 ;;
    *H200*) echo h200 ;;
  esac
}

# One mt-train --device cuda run (label, then its flags): its summary as a JSON line in
# bench.jsonl (tokens/s, median step, TFLOP/s, MFU: the median of its steps' after the first).
bench_mt() {
  local label="$1" peak records limit
  shift
  limit="$(limit_within_budget 90)"
  if ((limit == 0)); then
    echo "{\"impl\": \"mt-train\", \"model\": \"$label\", \"error\": \"skipped: the run's time budget is spent\"}" >>"$BENCH_JSONL"
    return 0
  fi
  peak="$(mt_peak_device)"
  records="$(mktemp)"
  echo "=== mt-train $label: $*" >>"$BENCH_LOG"
  run_mt timeout "$limit" "$PACK/bin/mt-train" --device cuda --mock-data --bf16 --eval-iters 0 --log-interval 1000 \
    --hidden-dropout 0 --attention-dropout 0 ${peak:+--peak-device "$peak"} "$@" >"$records" 2>>"$BENCH_LOG"
  local rc=$?
  echo "=== mt-train $label exit $rc" >>"$BENCH_LOG"
  python3 - "$records" "$label" "$rc" >>"$BENCH_JSONL" <<'PY'
import json, statistics, sys
path, label, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
records = [json.loads(line) for line in open(path) if line.startswith("{")]
steps = [r for r in records if r.get("record") == "step"]
summary = next((r for r in records if r.get("record") == "summary"), None)
line = dict(impl="mt-train", model=label, exit=rc)
if summary:
    mfu = [s["mfu"] for s in steps[1:] if s.get("mfu") is not None]
    line.update(median_step_ms=summary["median_step_ms"], tokens_per_s=summary["tokens_per_s"],
                tflops=summary["tflops_per_device"], mfu=statistics.median(mfu) if mfu else None,
                flops_per_token=summary["tflops_per_device"] * 1e12 / summary["tokens_per_s"] if summary["tokens_per_s"] else None)
print(json.dumps(line))
PY
  rm -f "$records"
  return "$rc"
}

# One run of tests/bench/gpu_bench_torch.py (its flags) within `limit` seconds.
bench_torch() {
  local limit
  limit="$(limit_within_budget "$1")"
  shift
  if ((limit == 0)); then
    echo "{\"impl\": \"torch\", \"args\": \"$*\", \"error\": \"skipped: the run's time budget is spent\"}" >>"$BENCH_JSONL"
    return 0
  fi
  echo "=== gpu_bench_torch.py $*" >>"$BENCH_LOG"
  timeout "$limit" python3 "$ROOT/tests/bench/gpu_bench_torch.py" "$@" >>"$BENCH_JSONL" 2>>"$BENCH_LOG"
  local rc=$?
  echo "=== gpu_bench_torch.py $* exit $rc" >>"$BENCH_LOG"
  ((rc == 0)) || echo "{\"impl\": \"torch\", \"args\": \"$*\", \"exit\": $rc}" >>"$BENCH_JSONL"
  return "$rc"
}

# mt's attention forward+backward on the CUDA table (tests/bench/gpu_bench_attention.cpp).
bench_mt_attention() {
  local limit
  limit="$(limit_within_budget 40)"
  if ((limit == 0)); then
    echo '{"impl": "mt-cuda-attention", "error": "skipped: the run'"'"'s time budget is spent"}' >>"$BENCH_JSONL"
    return 0
  fi
  echo "=== mt_bench_gpu_attention" >>"$BENCH_LOG"
  run_mt timeout "$limit" "$PACK/tests/mt_bench_gpu_attention" >>"$BENCH_JSONL" 2>>"$BENCH_LOG"
  local rc=$?
  echo "=== mt_bench_gpu_attention exit $rc" >>"$BENCH_LOG"
  ((rc == 0)) || echo "{\"impl\": \"mt-cuda-attention\", \"exit\": $rc}" >>"$BENCH_JSONL"
  return "$rc"
}

# The figures as a table; PyTorch's MFU also under mt-train's FLOP count where mt's run gave one.
bench_table() {
  python3 - "$BENCH_JSONL" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
mt_flops = {r["model"]: r.get("flops_per_token") for r in rows if r.get("impl") == "mt-train"}
peak = next((r["tflops"] / r["mfu"] for r in rows if r.get("impl") == "mt-train" and r.get("mfu")), None)
for r in rows:
    name = f"bench {r.get('impl')} {r.get('model', r.get('args', ''))}"
    if "fwd_bwd_ms" in r:
        print(f"{name}: attention fwd+bwd {r.get('dtype', '')} B{r['batch']} H{r['heads']}/{r['kv_heads']} "
              f"T{r['seq']} D{r['head_dim']}: {r['fwd_bwd_ms']:.3f} ms, {r['tflops']:.0f} TFLOP/s")
    elif "tokens_per_s" in r:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "n/a"
        extra = ""
        if r["impl"] != "mt-train" and mt_flops.get(r["model"]) and peak:
            extra = f" ({100 * r['tokens_per_s'] * mt_flops[r['model']] / 1e12 / peak:.1f}% in mt's FLOP count)"
        print(f"{name}: {r['tokens_per_s']:.0f} tokens/s, step {r['median_step_ms']:.1f} ms, MFU {mfu}{extra}")
    else:
        print(f"{name}: no figures ({r.get('error') or 'exit ' + str(r.get('exit'))})")
PY
}

# mt's own benchmark runs (the bench part's first four, the whole bench-mt part); how many failed.
bench_mt_runs() {
  local failures=0
  bench_mt gpt2 --model gpt2-124m --seq-length 1024 --micro-batch-size 16 --global-batch-size 16 --train-iters 12 ||
    failures=$((failures + 1))
  bench_mt gpt2-fp8 --model gpt2-124m --seq-length 1024 --micro-batch-size 16 --global-batch-size 16 --train-iters 5 \
    --fp8-format hybrid || failures=$((failures + 1))
  bench_mt llama --model llama3-8b --num-layers 4 --seq-length 4096 --micro-batch-size 1 --global-batch-size 8 \
    --train-iters 5 || failures=$((failures + 1))
  bench_mt_attention || failures=$((failures + 1))
  return "$failures"
}

# Runs the benchmarks (with PyTorch's beside mt's unless `mt_only` is 1) and writes their table.
run_benchmarks() {
  local mt_only="$1" part="$2"
  if ((!HAVE_GPU)); then
    note "$part: skipped (no GPU)"
    return
  fi
  BENCH_LOG="$OUT/bench.log"
  BENCH_JSONL="$OUT/bench.jsonl"
  : >"$BENCH_LOG"
  : >"$BENCH_JSONL"
  local failures=0 runs=4
  bench_mt_runs || failures=$?
  if ((!mt_only)); then
    runs=9
    bench_torch 30 --attention || failures=$((failures + 1))
    bench_torch 45 --model gpt2 --mode eager --steps 10 || failures=$((failures + 1))
    bench_torch 60 --model llama --mode eager --steps 4 --warmup 2 || failures=$((failures + 1))
    bench_torch 100 --model gpt2 --mode compile --steps 10 || failures=$((failures + 1))
    bench_torch 100 --model llama --mode compile --steps 4 --warmup 2 || failures=$((failures + 1))
  fi
  bench_table | tee -a "$SUMMARY"
  if ((failures)); then
    STATUS=1
    note "$part: $failures of $runs runs FAILED (bench.log says how)"
  fi
}

part_bench() { run_benchmarks 0 bench; }
part_bench-mt() { run_benchmarks 1 bench-mt; }

part_sanitize() {
  if ((!HAVE_GPU)); then
    note "sanitize: skipped (no GPU)"
    return
  fi
  local sanitizer log="$OUT/sanitize.log" filter="${MT_GPU_SANITIZE_FILTER:-*/moe_*:*/fp8*}" failed=()
  sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
  [[ -n $sanitizer ]] || { STATUS=1; note "sanitize: FAILED: no compute-sanitizer on this machine"; return; }
  : >"$log"
  for tool in memcheck racecheck; do
    local limit
    limit="$(limit_within_budget 90)"
    ((limit == 0)) && { failed+=("$tool (not run: the budget is spent)"); continue; }
    echo "=== $tool --gtest_filter=$filter" >>"$log"
    run_mt timeout "$limit" "$sanitizer" --tool "$tool" --error-exitcode 99 \
      "$PACK/tests/mt_gpu_op_harness_tests" --gtest_filter="$filter" >>"$log" 2>&1
    local rc=$?
    echo "=== $tool exit $rc" >>"$log"
    ((rc == 0)) || failed+=("$tool (exit $rc)")
  done
  if ((${#failed[@]})); then
    STATUS=1
    note "sanitize: FAILED: ${failed[*]}; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tr '\n' ' ')"
  else
    note "sanitize: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tr '\n' ' ')"
  fi
}

for part in "${PARTS[@]}"; do
  part_start=$SECONDS
  "part_$part"
  note "$part: $((SECONDS - part_start)) s"
done
note "done in $((SECONDS - START)) s, exit $STATUS"
exit "$STATUS"
