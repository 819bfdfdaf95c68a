#!/usr/bin/env bash
# Checkpoint speed: GPT-2 124M with optimizer state (about 1.5 GB) against the disk, in one script.
#   disk      dd of 1.5 GB of random bytes with conv=fsync (write) and back to /dev/null (read;
#             cold when the page cache can be dropped, else labelled warm)
#   writers   tests/bench/bench_checkpoint_writers.cpp on the same tensors (random values) at 1, 2
#             and 4 ranks: gather to rank 0 + serial HDF5 against parallel HDF5 independent and
#             collective hyperslab writes (mt writes independent hyperslabs)
#   mt-train  save (--save, at the end of one step) and load (--load, cold like dd's read; the
#             slowest rank's time) on one rank, DP=2 and DP=4 with the distributed optimizer (every
#             rank writes its shard), as MB/s and as a share of dd's
#   steps     the median step time of a run saving every --save-interval steps against the same
#             run without saves (the steps between saves; the saves themselves are not steps)
# Every measured write or read starts after `settle`: sync, drop the page cache, wait
# MT_BENCH_SETTLE seconds (default 10). On the VMs this was written on, memory freed by a drop or
# a deleted file goes back to the host within seconds, and a read right after the drop ran 2-3x
# faster than the same read 5 s later (dd: 1.6-2.6 GB/s against 0.64-0.78 GB/s), so dd measured at
# once and mt-train measured after its start-up compared different disks.
# Figures are medians over rounds, interleaved so the machine's load falls on all alike; the load
# average is printed since the machine is shared. A benchmark, not a test: quote the figures,
# never assert on them. Usage: tests/bench/bench_checkpoint.sh [rounds] [DIR on the disk to measure]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
WRITERS="${MT_BENCH_WRITERS:-$ROOT/build/tests/mt_bench_checkpoint_writers}"
ROUNDS="${1:-2}"
DISK="$(mktemp -d "${2:-${TMPDIR:-/tmp}}/mt-bench-ckpt.XXXXXX")"
OUT="$(mktemp -d)"
SOURCE="$(mktemp /dev/shm/mt-bench-random.XXXXXX)"  # in memory: dropping the page cache keeps it
trap 'rm -rf "$DISK" "$OUT" "$SOURCE"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_WAIT_POLICY=passive

MODEL=(--model gpt2-124m --mock-data --seq-length 128 --micro-batch-size 1 --global-batch-size 4 --eval-iters 0
       --hidden-dropout 0 --attention-dropout 0 --log-interval 1000 --peak-tflops 1 --lr-decay-iters 1000)
LAYOUTS=("1" "2 --use-distributed-optimizer" "4 --use-distributed-optimizer")

cold=warm
SETTLE="${MT_BENCH_SETTLE:-10}"
drop_cache() { sync; { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null && cold=cold; }
settle() { drop_cache || true; sleep "$SETTLE"; }
settle
head -c 1500M /dev/urandom >"$SOURCE"  # dd's source: bytes that no layer below can compress

launch() {
  local ranks="$1"
  shift
  if [[ "$ranks" == 1 ]]; then OMP_NUM_THREADS=2 "$MT_BIN/mt-train" "$@"
  else OMP_NUM_THREADS=1 mpirun -np "$ranks" --oversubscribe --bind-to none "$MT_BIN/mt-train" "$@"; fi
}

# "name value" lines; figures are medians over the values of one name.
record() { echo "$1 $2" >>"$OUT/figures"; }
median() { awk -v k="$1" '$1 == k { print $2 }' "$OUT/figures" | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "n/a" }'; }
ckpt_field() { jq -r --arg e "$2" "select(.record == \"ckpt\" and .event == \$e) | .$3" "$1" | head -n 1; }

echo "bench_checkpoint: $ROUNDS rounds on $(df -h --output=source,target "$DISK" | tail -n 1), load average $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  # The disk.
  settle
  dd if="$SOURCE" of="$DISK/dd" bs=16M conv=fsync 2>"$OUT/dd" && record dd_write "$(awk '/copied/ { print $(NF-1) * ($NF == "GB/s" ? 1000 : 1) }' "$OUT/dd")"
  settle
  dd if="$DISK/dd" of=/dev/null bs=16M 2>"$OUT/dd" && record dd_read "$(awk '/copied/ { print $(NF-1) * ($NF == "GB/s" ? 1000 : 1) }' "$OUT/dd")"
  rm -f "$DISK/dd"
  # The writers on the same tensors.
  for ranks in 1 2 4; do
    for writer in gather independent collective; do
      settle
      mpirun -np "$ranks" --oversubscribe --bind-to none "$WRITERS" "$DISK" "$writer" >"$OUT/writers.jsonl"
      record "writer_${writer}_$ranks" "$(jq -r .mb_per_s "$OUT/writers.jsonl")"
    done
  done
  # mt-train's save and load.
  for layout in "${LAYOUTS[@]}"; do
    ranks="${layout%% *}"
    rm -rf "$DISK/ck"
    settle
    # shellcheck disable=SC2086
    launch $layout "${MODEL[@]}" --train-iters 1 --save "$DISK/ck" >"$OUT/save.jsonl" 2>"$OUT/save.err" \
      || { echo "bench: save on '$layout' failed: $(tail -3 "$OUT/save.err")" >&2; exit 1; }
    record "save_$ranks" "$(ckpt_field "$OUT/save.jsonl" save mb_per_s)"
    record "bytes" "$(ckpt_field "$OUT/save.jsonl" save bytes)"
    settle
    # shellcheck disable=SC2086
    launch $layout "${MODEL[@]}" --train-iters 1 --load "$DISK/ck" >"$OUT/load.jsonl" 2>"$OUT/load.err" \
      || { echo "bench: load on '$layout' failed: $(tail -3 "$OUT/load.err")" >&2; exit 1; }
    record "load_$ranks" "$(ckpt_field "$OUT/load.jsonl" load mb_per_s)"
  done
  # Step time with and without saves (one rank; the median over every step but the first).
  rm -rf "$DISK/ck"
  for saves in no yes; do
    extra=()
    [[ $saves == yes ]] && extra=(--save "$DISK/ck" --save-interval 3)
    launch 1 "${MODEL[@]}" --train-iters 10 "${extra[@]}" >"$OUT/steps.jsonl" 2>"$OUT/steps.err" \
      || { echo "bench: step run failed: $(tail -3 "$OUT/steps.err")" >&2; exit 1; }
    record "step_ms_$saves" "$(jq -s '[.[] | select(.record == "step" and .iteration > 1) | .step_ms] | sort | .[(length - 1) / 2 | floor]' "$OUT/steps.jsonl")"
  done
done

dd_write="$(median dd_write)"
dd_read="$(median dd_read)"
share() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a != "n/a") printf "%.0f%%", 100 * a / b; else print "n/a" }'; }
printf 'checkpoint %.0f MB; disk: dd write (conv=fsync) %s MB/s, dd read (%s) %s MB/s\n' "$(awk -v b="$(median bytes)" 'BEGIN { print b / 1e6 }')" \
  "$dd_write" "$cold" "$dd_read"
printf '%-34s %16s %16s %16s\n' "MB/s (share of dd)" "1 rank" "2 ranks" "4 ranks"
row() {
  local label="$1" key="$2" base="$3" line value
  line="$(printf '%-34s' "$label")"
  for ranks in 1 2 4; do
    value="$(median "${key}_$ranks")"
    line+="$(printf ' %16s' "$(awk -v v="$value" 'BEGIN { printf "%.0f", v }') ($(share "$value" "$base"))")"
  done
  echo "$line"
}
row "mt-train save (parallel HDF5)" save "$dd_write"
row "mt-train load ($cold, slowest rank)" load "$dd_read"
row "writer: gather + serial HDF5" writer_gather "$dd_write"
row "writer: parallel HDF5 independent" writer_independent "$dd_write"
row "writer: parallel HDF5 collective" writer_collective "$dd_write"
no="$(median step_ms_no)"
yes="$(median step_ms_yes)"
printf 'median step: %.0f ms without saves, %.0f ms saving every 3 steps (%+.1f%%)\n' "$no" "$yes" \
  "$(awk -v a="$yes" -v b="$no" 'BEGIN { print 100 * (a - b) / b }')"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
