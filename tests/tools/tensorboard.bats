#!/usr/bin/env bats
# mt-train --tensorboard-dir end to end, read by an independent reader (tensorboard_reader.py:
# Debian's python3-protobuf over TensorBoard's field numbers, its own CRC-32C, TensorBoard's
# START purge): every scalar equals the step and eval records' value rounded to float32 under
# Megatron's names, steps and conditions (params-norm, num-zeros and the timers' <timer>-time, the
# max over ranks of each rank's rank_ms summed over the log block, included); the last rank writes;
# kill -9 at random moments leaves readable files, and after the resumes the directory reads as the
# straight run.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  READER="$MT_ROOT/tests/tools/tensorboard_reader.py"
}

teardown() {
  [[ -z "${PID:-}" ]] || kill -9 "$PID" 2>/dev/null || true
  rm -rf "$TMP"
}

TINY=(--model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4
      --peak-tflops 1)

@test "issue27: every scalar is the JSONL value as float32, with Megatron's names, steps and conditions" {
  mt-train "${TINY[@]}" --fp16 --initial-loss-scale 33554432 --train-iters 10 --eval-interval 3 --eval-iters 1 --log-interval 4 \
    --tensorboard-dir "$TMP/all" --tensorboard-log-interval 2 --tensorboard-queue-size 3 --log-timers-to-tensorboard \
    --log-throughput --log-memory-to-tensorboard --log-validation-ppl-to-tensorboard \
    >"$TMP/all.jsonl" 2>"$TMP/all.log" || fail "$(cat "$TMP/all.log")"
  run_split "$READER" check "$TMP/all" "$TMP/all.jsonl" --tensorboard-log-interval 2 --log-interval 4 --timers \
    --throughput --memory --ppl
  [[ $status -eq 0 ]] || fail "$out $err"
  # fp16 from a scale of 2^25 skips its first 6 steps: grad-norm is left out there, and is checked.
  jq -e -s '[.[] | select(.record == "step")] | .[5].skipped_iters == 6 and .[-1].skipped_iters == 6' "$TMP/all.jsonl" \
    >/dev/null || fail "not 6 skipped steps then none: grad-norm's condition is not exercised"
  echo "$out" | jq -e '.tags >= 20 and .starts == [1] and .truncated == 0' >/dev/null || fail "$out"
  grep -q "^mt-train: TensorBoard events in $TMP/all/events.out.tfevents." "$TMP/all.log" || fail "$(cat "$TMP/all.log")"

  # The defaults: every step, loss-scale on, and nothing of the optional scalars.
  mt-train "${TINY[@]}" --train-iters 4 --eval-interval 2 --eval-iters 1 --tensorboard-dir "$TMP/plain" \
    --log-throughput >"$TMP/plain.jsonl" 2>"$TMP/plain.log" || fail "$(cat "$TMP/plain.log")"
  run_split "$READER" check "$TMP/plain" "$TMP/plain.jsonl"
  [[ $status -eq 0 ]] || fail "$out $err"
  echo "$out" | jq -e '.tags == 12' >/dev/null || fail "$out"
  mt-train "${TINY[@]}" --train-iters 2 --eval-iters 0 --tensorboard-dir "$TMP/noscale" --no-log-loss-scale-to-tensorboard \
    >"$TMP/noscale.jsonl" 2>/dev/null
  run_split "$READER" check "$TMP/noscale" "$TMP/noscale.jsonl" --no-loss-scale
  [[ $status -eq 0 ]] || fail "$out $err"
}

@test "issue27: bad TensorBoard flags are refused by name, and so are its flags without --tensorboard-dir" {
  run_split mt-train "${TINY[@]}" --train-iters 1 --tensorboard-dir "$TMP/tb" --tensorboard-log-interval 0
  [[ $status -eq 2 && "$err" == *"--tensorboard-log-interval"* ]] || fail "$status: $err"
  run_split mt-train "${TINY[@]}" --train-iters 1 --tensorboard-dir "$TMP/tb" --tensorboard-queue-size 0
  [[ $status -eq 2 && "$err" == *"--tensorboard-queue-size"* ]] || fail "$status: $err"
  run_split mt-train "${TINY[@]}" --train-iters 1 --log-timers-to-tensorboard
  [[ $status -eq 2 && "$err" == *"--log-timers-to-tensorboard"*"--tensorboard-dir"* && $(line_count "$err") -eq 1 ]] ||
    fail "a TensorBoard flag without --tensorboard-dir: $status: $err"
  touch "$TMP/file"
  run_split mt-train "${TINY[@]}" --train-iters 1 --tensorboard-dir "$TMP/file"
  [[ $status -ne 0 && "$(tail -n 1 <<<"$err")" == *"$TMP/file"*"cannot create"* ]] || fail "$status: $err"
}

@test "issue27: under MPI the last rank writes the events, equal to rank 0's records" {
  mpirun_n 2 mt-train "${TINY[@]}" --pipeline-model-parallel-size 2 --train-iters 3 --eval-interval 3 --eval-iters 1 \
    --tensorboard-dir "$TMP/pp" >"$TMP/pp.jsonl" 2>"$TMP/pp.log" || fail "$(cat "$TMP/pp.log")"
  [[ $(find "$TMP/pp" -name 'events.out.tfevents.*' | wc -l) -eq 1 ]] || fail "$(ls "$TMP/pp")"
  run_split "$READER" check "$TMP/pp" "$TMP/pp.jsonl"
  [[ $status -eq 0 ]] || fail "$out $err"
}

# Megatron's timers, params-norm and num-zeros, from a run that logs them all.
NORMS=(--log-timers-to-tensorboard --timing-log-level 2 --log-params-norm --log-num-zeros-in-grad)

@test "issue27: params-norm, num-zeros and every <timer>-time are the records' values (timers: max over ranks of each rank's sum / --log-interval)" {
  mt-train "${TINY[@]}" --fp16 --initial-loss-scale 2097152 --train-iters 8 --eval-iters 0 --log-interval 3 \
    --tensorboard-dir "$TMP/norms" --tensorboard-log-interval 2 "${NORMS[@]}" >"$TMP/norms.jsonl" 2>"$TMP/norms.log" ||
    fail "$(cat "$TMP/norms.log")"
  run_split "$READER" check "$TMP/norms" "$TMP/norms.jsonl" --tensorboard-log-interval 2 --log-interval 3 --timers \
    --params-norm --num-zeros
  [[ $status -eq 0 ]] || fail "$out $err"
  # Skipped steps and taken ones (num-zeros is left out on a skipped step, and that is checked).
  jq -e -s '[.[] | select(.record == "step")] | (.[0].skipped_iters > 0) and (.[-1].skipped_iters < 8)' \
    "$TMP/norms.jsonl" >/dev/null || fail "no skipped step, or no taken one: num-zeros' condition is not exercised"
  "$READER" points "$TMP/norms" >"$TMP/norms.points"
  local tag
  for tag in params-norm "params-norm vs samples" num-zeros "num-zeros vs samples" forward-backward-time \
      forward-compute-time backward-compute-time batch-generator-time optimizer-time all-grads-sync-time; do
    jq -e --arg tag "$tag" '.points[$tag] | length > 0' "$TMP/norms.points" >/dev/null || fail "no $tag: $(jq -c '.points | keys' "$TMP/norms.points")"
  done
  # The log blocks: the run's first iteration, 3 and 6.
  jq -e '.points["forward-backward-time"] | map(.[0]) == [1, 3, 6]' "$TMP/norms.points" >/dev/null ||
    fail "$(jq -c '.points["forward-backward-time"]' "$TMP/norms.points")"
  # The printed timer blocks (after the log lines of iterations 1, 3 and 6) give the same maxima
  # in ms, to their two decimals.
  python3 - "$TMP/norms.log" "$TMP/norms.points" <<'PY' || fail "$(cat "$TMP/norms.log")"
import json, re, sys
blocks, current = [], None
for line in open(sys.argv[1]):
    if line.startswith("(min, max) time across ranks (ms):"):
        current = {}
        blocks.append(current)
    elif current is not None and (m := re.match(r"    (\S+) \.*: \(([0-9.]+), ([0-9.]+)\)$", line)):
        current[m.group(1)] = float(m.group(3))
    else:
        current = None
points = json.load(open(sys.argv[2]))["points"]
timers = {t[:-len("-time")]: dict(v) for t, v in points.items() if t.endswith("-time") and t != "iteration-time"}
assert len(blocks) == 3, f"{len(blocks)} timer blocks"
for step, block in zip((1, 3, 6), blocks):
    written = {name for name, at in timers.items() if step in at}
    assert block.keys() == written, f"at {step}: printed {sorted(block)}, TensorBoard {sorted(written)}"
    for name, printed in block.items():
        seconds = timers[name][step]
        assert abs(printed - seconds * 1e3) <= 0.0051, f"{name} at {step}: printed {printed}, TensorBoard {seconds * 1e3}"
PY
}

@test "issue27: under MPI the last rank writes the timers as the max over ranks of each rank's sum, and the norms" {
  mpirun_n 2 mt-train "${TINY[@]}" --pipeline-model-parallel-size 2 --train-iters 4 --eval-iters 0 --log-interval 2 \
    --tensorboard-dir "$TMP/pp" "${NORMS[@]}" >"$TMP/pp.jsonl" 2>"$TMP/pp.log" || fail "$(cat "$TMP/pp.log")"
  [[ $(find "$TMP/pp" -name 'events.out.tfevents.*' | wc -l) -eq 1 ]] || fail "$(ls "$TMP/pp")"
  jq -e -s '[.[] | select(.record == "step")][0].timers["forward-backward"].rank_ms | length == 2' "$TMP/pp.jsonl" \
    >/dev/null || fail "no per-rank timers in the records"
  # The records are rank 0's, the writer is rank 1: iteration-time is rank 1's own step time.
  run_split "$READER" check "$TMP/pp" "$TMP/pp.jsonl" --log-interval 2 --timers --params-norm --num-zeros \
    --other-writer-rank
  [[ $status -eq 0 ]] || fail "$out $err"
  "$READER" points "$TMP/pp" | jq -e '.points | has("forward-recv-time") and has("params-norm") and has("num-zeros")' \
    >/dev/null || fail "$("$READER" points "$TMP/pp" | jq -c '.points | keys')"
}

# The runs the kills land in: resuming from and saving to $TMP/ck every 3 iterations.
CRASH=("${TINY[@]}" --train-iters 24 --eval-interval 5 --eval-iters 1 --lr-decay-iters 24 --tensorboard-queue-size 4
       --save-interval 3)

# Event files in $1 (0 when it does not exist yet).
event_files() { find "$1" -name 'events.out.tfevents.*' 2>/dev/null | wc -l; }

# Waits (up to 60 s) until directory $1 holds more than $2 event files or process $3 has ended.
wait_for_event_file() {
  local tries=0
  while (( $(event_files "$1") <= $2 )) && kill -0 "$3" 2>/dev/null && (( tries++ < 3000 )); do sleep 0.02; done
}

@test "issue27: killed 6 times at random moments (seed printed), the files stay readable and the resumed directory reads as the straight run" {
  local seed="${MT_CRASH_SEED:-$(( $(date +%s%N) % 1000000 ))}"
  echo "# MT_CRASH_SEED=$seed (set it to replay these kill times)" >&3
  RANDOM=$seed
  # The window: from the straight run's event file appearing to its end (it saves as the others do).
  mt-train "${CRASH[@]}" --tensorboard-dir "$TMP/straight" --save "$TMP/ck-straight" >"$TMP/straight.jsonl" \
    2>"$TMP/straight.log" &
  PID=$!
  wait_for_event_file "$TMP/straight" 0 "$PID"
  local start_ns end_ns
  start_ns=$(date +%s%N)
  wait "$PID" || fail "$(cat "$TMP/straight.log")"
  end_ns=$(date +%s%N)
  PID=""
  local window_us=$(( (end_ns - start_ns) / 1000 + 1 )) round delay_us files latest
  for round in $(seq 6); do
    files=$(event_files "$TMP/killed")
    latest="$(cat "$TMP/ck/latest_checkpointed_iteration.txt" 2>/dev/null || echo 0)"
    mt-train "${CRASH[@]}" --tensorboard-dir "$TMP/killed" --load "$TMP/ck" --save "$TMP/ck" \
      >"$TMP/round.jsonl" 2>"$TMP/round.log" &
    PID=$!
    wait_for_event_file "$TMP/killed" "$files" "$PID"
    # A moment of what is left to run (four fifths of the window's share of the iterations left).
    delay_us=$(( (RANDOM * 32768 + RANDOM) % (window_us * (24 - latest) / 30 + 1) ))
    sleep "$(printf '%d.%06d' $((delay_us / 1000000)) $((delay_us % 1000000)))"
    kill -KILL "$PID" 2>/dev/null || true
    wait "$PID" || true
    PID=""
    # Every complete record reads back with its CRCs (a truncated last one is allowed).
    run_split "$READER" points "$TMP/killed"
    [[ $status -eq 0 ]] || fail "round $round (killed ${delay_us} us in): $out $err"
  done
  mt-train "${CRASH[@]}" --tensorboard-dir "$TMP/killed" --load "$TMP/ck" --save "$TMP/ck" \
    >"$TMP/last.jsonl" 2>"$TMP/last.log" || fail "$(cat "$TMP/last.log")"
  "$READER" points "$TMP/straight" | jq -S '.points | map_values(sort)' >"$TMP/straight.points"
  "$READER" points "$TMP/killed" | jq -S '.points | map_values(sort)' >"$TMP/killed.points"
  diff "$TMP/straight.points" "$TMP/killed.points" >"$TMP/diff" || fail "$(head -40 "$TMP/diff")"
  # One point per (tag, step), and the straight run's own check.
  jq -e 'all(.[]; (map(.[0]) | length) == (map(.[0]) | unique | length))' "$TMP/killed.points" >/dev/null ||
    fail "a step twice: $(cat "$TMP/killed.points")"
  run_split "$READER" check "$TMP/straight" "$TMP/straight.jsonl"
  [[ $status -eq 0 ]] || fail "$out $err"
  echo "# window ${window_us} us; $(event_files "$TMP/killed") event files; $("$READER" points "$TMP/killed" | jq -c '{starts, truncated}')" >&3
}
