#!/usr/bin/env bash
# mt-tokenize --partitions: 2 MPI ranks x 1 worker (--partitions 2 --workers 2 under mpirun -np 2)
# against 1 rank x 2 workers (--workers 2, no partitions, no mpirun) on the same cores and corpus,
# GPT-2, Megatron .bin/.idx out. The partitioned time includes mpirun's start, dealing the lines
# (in memory; a build that writes partition files, as a --baseline before issue 26's in-memory
# dealing does, has them removed before each run so that it writes them every time) and putting
# the partitions together in order (rank 0 writes the index; each rank its tokens, or, in a build
# before that, rank 0 all of them; partitions after the first appended to the outputs at the end).
# Partitions exist to spread a corpus over nodes; one machine cannot measure that, only that the
# extra steps cost little on the same cores. A benchmark, not a test: for each size it runs
# --repeat rounds, each running every mode once in a shuffled order (this machine's speed drifts
# by 10-20% from one run to the next, so no mode may always run first or after the same one), and
# prints the modes' median wall seconds (process start included), the speed ratio 1-rank time /
# 2-rank time (issue 26's target is at least 0.95) of the medians and as the median and quartiles
# of the rounds' ratios, the same ratio without the fixed costs (both modes timed on 20 lines
# first: the ratio a corpus far bigger than these sizes tends to), the CPU seconds (user + system)
# and the load average before and after; it asserts nothing but that the outputs of this build and
# of the baseline build are byte-identical. The 2-rank mode also runs with OMPI_MCA_pml=ob1 (what
# OpenMPI picks on one node anyway, after 0.2 s of probing for UCX and OFI hardware at MPI_Init),
# and each round times the corpus's two halves tokenized at once by two processes of one worker
# each, without MPI (the bound for any split of the work over two processes on these cores).
# Usage: tests/bench/bench_partitions.sh [--sizes 20,60,150] [--repeat 3] [--baseline BIN_DIR] [corpus.txt]
#   --sizes: corpus sizes in MB (the corpus repeated to about each; default 20)
#   --repeat: rounds per size (default 3; medians are printed)
#   --baseline: another build's bin directory (e.g. an older commit's): its 2-rank run is timed in
#     the same rounds, and its outputs compared with this build's
#   corpus.txt: default data/corpus/war_and_peace_pg2600.txt (one JSONL document per paragraph)
# Env: MT_BIN (default build/bin); MT_BENCH_MB and MT_BASELINE_BIN as --sizes and --baseline.
# About 6 minutes on 2 quiet cores for --sizes 450 --repeat 5 --baseline DIR; 16 for --sizes 900 --repeat 9.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
TOK="$ROOT/data/tokenizers"
SIZES="${MT_BENCH_MB:-20}"
RUNS=3
BASELINE_BIN="${MT_BASELINE_BIN:-}"
CORPUS="$ROOT/data/corpus/war_and_peace_pg2600.txt"
while (($#)); do
  case "$1" in
    --sizes) SIZES="$2"; shift 2 ;;
    --repeat) RUNS="$2"; shift 2 ;;
    --baseline) BASELINE_BIN="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench_partitions.sh: unknown option $1" >&2; exit 2 ;;
    *) CORPUS="$1"; shift ;;
  esac
done
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "bench_partitions.sh: --repeat $RUNS: a positive integer" >&2; exit 2; }
[[ "$SIZES" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "bench_partitions.sh: --sizes $SIZES: MB figures, comma-separated" >&2; exit 2; }
[[ -z "$BASELINE_BIN" || -x "$BASELINE_BIN/mt-tokenize" ]] || { echo "bench_partitions.sh: --baseline $BASELINE_BIN: no mt-tokenize there" >&2; exit 2; }
# Ranks waiting at a barrier yield their core.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/in" "$work/out"
tr -d '\r' <"$CORPUS" | jq -R -s -c 'split("\n\n")[] | select(length > 0) | {text: .}' >"$work/one.jsonl"
GPT2=(--tokenizer-type GPT2BPETokenizer --vocab-file "$TOK/gpt2/encoder.json" --merge-file "$TOK/gpt2/vocab.bpe"
      --output-format megatron --append-eod --log-interval 0)

# timed CMD...: "wall cpu" seconds of one run (cpu = user + system of it and its children).
timed() {
  local TIMEFORMAT='%R %U %S' t
  t="$({ time "$@" >/dev/null 2>"$work/err.log"; } 2>&1)" || { cat "$work/err.log" >&2; exit 1; }
  awk '{ printf "%.3f %.3f\n", $1, $2 + $3 }' <<<"$t"
}
median() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"; }
one_rank() { timed "$1/mt-tokenize" "${GPT2[@]}" --input "$work/in/corpus.jsonl" --workers 2 --output-prefix "$work/out/$2"; }
two_ranks() {
  rm -f "$work"/in/corpus_?.jsonl
  timed mpirun -np 2 --bind-to none "$1/mt-tokenize" "${GPT2[@]}" --input "$work/in/corpus.jsonl" --partitions 2 \
    --workers 2 --output-prefix "$work/out/$2"
}

# The bound for any split over two processes on these cores: each half of the corpus (by lines)
# tokenized by its own process with one worker, both at once, each writing its own output: no
# MPI, no sending, no merging.
tokenize_halves() {
  "$MT_BIN/mt-tokenize" "${GPT2[@]}" --input "$work/in/half_a.jsonl" --output-prefix "$work/out/half_a" &
  local first=$!
  "$MT_BIN/mt-tokenize" "${GPT2[@]}" --input "$work/in/half_b.jsonl" --output-prefix "$work/out/half_b" || return 1
  wait "$first"
}
halves() {
  local lines times
  lines=$(wc -l <"$work/in/corpus.jsonl")
  head -n $((lines / 2)) "$work/in/corpus.jsonl" >"$work/in/half_a.jsonl"
  tail -n +$((lines / 2 + 1)) "$work/in/corpus.jsonl" >"$work/in/half_b.jsonl"
  times="$(timed tokenize_halves)"
  rm -f "$work"/in/half_?.jsonl
  echo "$times"
}

printf '%s cores (%s); %s rounds per size, each mode once per round in a shuffled order; medians; ratio = 1-rank wall / 2-rank wall (target >= 0.95)\n' \
  "$(nproc)" "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$RUNS"
# Fixed costs: the same runs on 20 lines (process start, mpirun and MPI_Init, the tokenizer load,
# writing and syncing the outputs), taken out of each size's walls for the per-byte ratio.
head -n 20 "$work/one.jsonl" >"$work/in/corpus.jsonl"
fixed_one=() fixed_two=() fixed_ob1=()
for _ in $(seq "$RUNS"); do
  read -r w _ < <(one_rank "$MT_BIN" one); fixed_one+=("$w")
  read -r w _ < <(two_ranks "$MT_BIN" two); fixed_two+=("$w")
  read -r w _ < <(OMPI_MCA_pml=ob1 two_ranks "$MT_BIN" two); fixed_ob1+=("$w")
done
f1=$(median "${fixed_one[@]}") f2=$(median "${fixed_two[@]}")
printf 'fixed cost (20 lines): 1 rank %.2f s, 2 ranks %.2f s (%.2f s with OMPI_MCA_pml=ob1: OpenMPI then skips probing UCX and OFI at MPI_Init)\n' \
  "$f1" "$f2" "$(median "${fixed_ob1[@]}")"
# ratios A B: "median q1-q3" of the per-round ratios A[i] / B[i] (two arrays of walls, by name).
ratios() {
  local -n a=$1 b=$2
  local i r=()
  for i in "${!a[@]}"; do r+=("$(echo "${a[$i]} / ${b[$i]}" | bc -l)"); done
  printf '%s\n' "${r[@]}" | sort -g | awk '{ v[NR] = $1 } END { printf "%.3f (quartiles %.3f-%.3f)", v[int((NR + 1) / 2)], v[int((NR + 3) / 4)], v[int((3 * NR + 3) / 4)] }'
}
for mb in ${SIZES//,/ }; do
  : >"$work/in/corpus.jsonl"
  while (($(stat -c %s "$work/in/corpus.jsonl") < mb * 1000000)); do cat "$work/one.jsonl" >>"$work/in/corpus.jsonl"; done
  load_before="$(cut -d' ' -f1 /proc/loadavg)"
  one_wall=() one_cpu=() two_wall=() two_cpu=() ob1_wall=() base_wall=() base_cpu=() half_wall=()
  modes=(one two ob1 halves)
  [[ -n "$BASELINE_BIN" ]] && modes+=(base)
  for _ in $(seq "$RUNS"); do
    for mode in $(printf '%s\n' "${modes[@]}" | shuf); do
      case "$mode" in
        one) read -r w c < <(one_rank "$MT_BIN" one); one_wall+=("$w"); one_cpu+=("$c") ;;
        two) read -r w c < <(two_ranks "$MT_BIN" two); two_wall+=("$w"); two_cpu+=("$c") ;;
        ob1) read -r w _ < <(OMPI_MCA_pml=ob1 two_ranks "$MT_BIN" two); ob1_wall+=("$w") ;;
        halves) read -r w _ < <(halves); half_wall+=("$w") ;;
        base) read -r w c < <(two_ranks "$BASELINE_BIN" base); base_wall+=("$w"); base_cpu+=("$c") ;;
      esac
    done
  done
  t1=$(median "${one_wall[@]}") t2=$(median "${two_wall[@]}")
  printf '%6.1f MB: 1 rank x 2 workers %6.2f s (cpu %5.2f); 2 ranks x 1 worker %6.2f s (cpu %5.2f) ratio %.3f, of the rounds %s' \
    "$(echo "scale=1; $(stat -c %s "$work/in/corpus.jsonl") / 1000000" | bc)" "$t1" "$(median "${one_cpu[@]}")" \
    "$t2" "$(median "${two_cpu[@]}")" "$(echo "$t1 / $t2" | bc -l)" "$(ratios one_wall two_wall)"
  printf ', without the fixed costs %.3f' "$(echo "($t1 - $f1) / ($t2 - $f2)" | bc -l)"
  printf '; with OMPI_MCA_pml=ob1 %6.2f s ratio %.3f, of the rounds %s' "$(median "${ob1_wall[@]}")" \
    "$(echo "$t1 / $(median "${ob1_wall[@]}")" | bc -l)" "$(ratios one_wall ob1_wall)"
  th=$(median "${half_wall[@]}")
  printf '; its halves in two processes without MPI %6.2f s ratio %.3f' "$th" "$(echo "$t1 / $th" | bc -l)"
  if [[ -n "$BASELINE_BIN" ]]; then
    tb=$(median "${base_wall[@]}")
    printf '; baseline 2 ranks %6.2f s (cpu %5.2f) ratio %.3f, of the rounds %s' "$tb" "$(median "${base_cpu[@]}")" \
      "$(echo "$t1 / $tb" | bc -l)" "$(ratios one_wall base_wall)"
    for ext in bin idx; do
      cmp -s "$work/out/base_text_document.$ext" "$work/out/two_text_document.$ext" || { echo; echo "baseline .$ext DIFFERS"; exit 1; }
    done
  fi
  printf '; load %s -> %s\n' "$load_before" "$(cut -d' ' -f1 /proc/loadavg)"
done
