#!/usr/bin/env bats
# The tools under `mpirun -np 2`: the README's "under MPI only rank 0 writes stdout" (mt-shard
# build and inspect print exactly the records of a single-process run, once, in every format),
# and a failure on one rank ends the whole job (rank 0 failing while rank 1 waits at a barrier:
# an exit code, not a hang).

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/tokens" h5 100 0 counting:50:20:1
  BUILD=(mt-shard build --data-path "$TMP/tokens" --split 80,10,10 --seq-length 8 --train-samples 16
         --global-batch-size 4 --eval-interval 4 --eval-iters 1)
}

teardown() { rm -rf "$TMP"; }

mpirun2() { timeout 120 mpirun -np 2 --oversubscribe "$@"; }

# A JSONL stream without its run record (whose world size, time and argv differ by design).
without_run() { jq -c 'select(.record != "run")' <<<"$1"; }

@test "mpirun -np 2 mt-shard build: one copy of the records, the run record says world size 2" {
  run_split "${BUILD[@]}" --output "$TMP/one.h5" --format jsonl
  [[ $status -eq 0 ]] || fail "single process: $err"
  local single="$out"
  run_split mpirun2 "${BUILD[@]}" --output "$TMP/two.h5" --format jsonl
  [[ $status -eq 0 ]] || fail "mpirun exited $status: $err"
  [[ "$(line_count "$out")" -eq 2 ]] || fail "want a run and an index record, got: $out"
  jq -e -s '.[0].record == "run" and .[0].world_size == 2 and .[1].record == "index"' <<<"$out" >/dev/null ||
    fail "records: $out"
  # the same index record as the single process's, but for the path, time and the built flag's file
  local fields='{train_samples, valid_samples, test_samples, parameters_md5, built}'
  [[ "$(without_run "$out" | jq -c "$fields")" == "$(without_run "$single" | jq -c "$fields")" ]] ||
    fail "mpirun: $out single: $single"
  [[ "$(grep -c 'mt-shard: built' <<<"$err")" -eq 1 ]] || fail "the build is logged once (rank 0): $err"
}

@test "mpirun -np 2 mt-shard inspect: every record once, in jsonl, json and csv" {
  "${BUILD[@]}" --output "$TMP/index.h5" >/dev/null 2>&1
  local inspect=(mt-shard inspect "$TMP/index.h5" --show-samples 3)
  run_split "${inspect[@]}" --format jsonl
  [[ $status -eq 0 ]] || fail "single process: $err"
  local single="$out"
  [[ "$(line_count "$single")" -gt 5 ]] || fail "too few records to tell: $single"
  run_split mpirun2 "${inspect[@]}" --format jsonl
  [[ $status -eq 0 ]] || fail "mpirun exited $status: $err"
  [[ "$(without_run "$out")" == "$(without_run "$single")" ]] || fail "mpirun: $out"
  [[ "$(jq -s '[.[] | select(.record == "run")] | length' <<<"$out")" -eq 1 ]] || fail "run records: $out"
  run_split mpirun2 "${inspect[@]}" --json
  [[ $status -eq 0 ]] || fail "mpirun --json exited $status: $err"
  jq -e -s 'length == 1' <<<"$out" >/dev/null || fail "--json is not one JSON value: $out"
  run_split "${inspect[@]}" --format csv
  local single_csv="$out"
  run_split mpirun2 "${inspect[@]}" --format csv
  [[ $status -eq 0 && "$out" == "$single_csv" ]] || fail "csv under mpirun: $out"
}

@test "a failure on rank 0 alone aborts the job: rank 1 does not wait at its barrier" {
  mkdir -p "$TMP/taken/inside"  # rank 0 cannot put the index there; rank 1 waits for rank 0's file
  run_split mpirun2 "${BUILD[@]}" --output "$TMP/taken"
  [[ $status -ne 124 ]] || fail "the job hung"
  [[ $status -eq 1 ]] || fail "mpirun exited $status: $err"
  [[ -z "$out" ]] || fail "stdout: $out"
  [[ "$err" == *"[rank 0] mt-shard: error: $TMP/taken"* ]] || fail "no rank-0 error line: $err"
  [[ "$err" != *"[rank 1] mt-shard: error"* ]] || fail "rank 1 failed on its own: $err"
}
