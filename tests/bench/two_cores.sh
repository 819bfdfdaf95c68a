# Sourced by the benchmarks that compare one rank on 2 threads with 2 MPI ranks on 1 thread each
# (bench_parallel.sh, bench_pipeline.sh, bench_context_parallel.sh): the MPI environment, running one layout or
# interleaved rounds of all, medians.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_WAIT_POLICY=passive

# run_on_two_cores RANKS NAME OUT ERR ARGS...: mt-train ARGS on one rank with 2 threads (RANKS 1)
# or on 2 ranks with 1 thread each, records to OUT, stderr to ERR; exits naming NAME on failure.
run_on_two_cores() {
  local ranks="$1" name="$2" out="$3" err="$4"
  shift 4
  if [[ $ranks -eq 1 ]]; then
    OMP_NUM_THREADS=2 "$MT_BIN/mt-train" "$@" >"$out" 2>"$err"
  else
    OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe --bind-to none "$MT_BIN/mt-train" "$@" >"$out" 2>"$err"
  fi || { echo "bench: '$name' failed: $(tail -3 "$err")" >&2; exit 1; }
}

# The middle value; of an even count the lower of the two middle ones (an outlier above cannot be it).
median() { jq -s 'sort | if length == 0 then 0 else .[(length - 1) / 2 | floor] end'; }

# run_rounds: $ROUNDS interleaved rounds (every layout once per round) of the caller's layouts:
# layout i is NAMES[i] with flags LAYOUTS[i] added to MODEL, layout 0 on one rank with 2 threads,
# the others on 2 ranks; records in $OUT/i-round.jsonl.
run_rounds() {
  local round i
  for round in $(seq 1 "$ROUNDS"); do
    for i in "${!NAMES[@]}"; do
      # shellcheck disable=SC2086
      run_on_two_cores "$([[ $i -eq 0 ]] && echo 1 || echo 2)" "${NAMES[$i]}" "$OUT/$i-$round.jsonl" "$OUT/err" \
        "${MODEL[@]}" ${LAYOUTS[$i]}
    done
  done
}

# of_steps I FILTER: the median over rounds of layout I's runs' median of FILTER over their step
# records after the first.
of_steps() {
  local i="$1" filter="$2" round
  for round in $(seq 1 "$ROUNDS"); do
    jq -s "[.[] | select(.record==\"step\") | $filter][1:] | sort | .[(length - 1) / 2 | floor]" "$OUT/$i-$round.jsonl"
  done | median
}
