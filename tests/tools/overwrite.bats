#!/usr/bin/env bats
# Issue 28, overwriting (cases L1, L2, L3 and L6 of the 2026-11-27 probe), one policy for every
# tool: an input is never an output; an output that exists and is not this run's own earlier
# output is refused unless --force; a tracker never moves backwards or onto a checkpoint that
# cannot resume; a --save directory holds one run (a lock file with the run's identity; a stale
# lock of this host is taken over with a warning).

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  TR=(mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4
      --eval-iters 0)
}

teardown() {
  if [[ -n "${FIRST:-}" ]]; then kill -KILL "$FIRST" 2>/dev/null || true; fi
  rm -rf "$TMP"
}

# ckA: resumable checkpoints at 10 and 20, the tracker at 20.
make_ckA() { "${TR[@]}" --train-iters 20 --save "$TMP/ckA" --save-interval 10 >/dev/null 2>&1 || fail "ckA"; }

# `refused STATUS TEXT CMD...`: CMD exits STATUS and its stderr holds TEXT.
refused() {
  local want="$1" text="$2"
  shift 2
  run_split "$@"
  [[ $status -eq $want && "$err" == *"$text"* ]] || fail "$*: exit $status: $err"
}

@test "L2: --save-init/--save-final never write over an input (--byte-data, --data-path, the --save tracker's checkpoint), --force or not" {
  head -c 20000 "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/tiny.txt"
  cp "$TMP/tiny.txt" "$TMP/tiny.orig"
  for force in "" --force; do
    refused 2 "--save-init $TMP/tiny.txt: is this run's input (--byte-data $TMP/tiny.txt)" \
      mt-train --model tiny-gpt --byte-data "$TMP/tiny.txt" --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
      --eval-iters 0 --train-iters 2 --save-init "$TMP/tiny.txt" $force
  done
  cmp -s "$TMP/tiny.txt" "$TMP/tiny.orig" || fail "the --byte-data text was overwritten"
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/victim" h5 97 0 counting:200:20:1
  md5="$(md5sum <"$TMP/victim.h5")"
  refused 2 "--save-final $TMP/victim.h5: is this run's input (--data-path $TMP/victim.h5)" \
    mt-train --model tiny-gpt --data-path "$TMP/victim" --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --eval-iters 0 --train-iters 2 --save-final "$TMP/victim.h5" --force
  [[ "$(md5sum <"$TMP/victim.h5")" == "$md5" ]] || fail "the dataset was overwritten"
  make_ckA
  refused 2 "is this run's input (--save (its latest checkpoint)" \
    "${TR[@]}" --train-iters 2 --save "$TMP/ckA" --save-final "$TMP/ckA/iter_0000020/checkpoint.h5" --force
  refused 2 "is this run's input (--load $TMP/ckA/iter_0000020/checkpoint.h5)" \
    "${TR[@]}" --train-iters 25 --load "$TMP/ckA" --save-final "$TMP/ckA/iter_0000020/checkpoint.h5" --force
  mt-ckpt verify "$TMP/ckA" >/dev/null || fail "the latest checkpoint of ckA changed"
}

@test "L2: an existing file is overwritten only when it is this run's own earlier parameters file, or with --force" {
  echo '{"text": "keep me"}' >"$TMP/some.jsonl"
  refused 2 "--save-final $TMP/some.jsonl: exists and is not this run's output; give --force" \
    "${TR[@]}" --train-iters 2 --save-final "$TMP/some.jsonl"
  [[ "$(cat "$TMP/some.jsonl")" == '{"text": "keep me"}' ]] || fail "overwritten without --force"
  "${TR[@]}" --train-iters 2 --save-final "$TMP/some.jsonl" --force >/dev/null 2>&1 || fail "--force refused"
  # S30, S38: another run's resumable checkpoint is not this run's output.
  make_ckA
  md5="$(md5sum <"$TMP/ckA/iter_0000010/checkpoint.h5")"
  refused 2 "exists and is not this run's output" "${TR[@]}" --train-iters 3 --save-final "$TMP/ckA/iter_0000020/checkpoint.h5"
  refused 2 "exists and is not this run's output" \
    "${TR[@]}" --train-iters 22 --load "$TMP/ckA" --save-init "$TMP/ckA/iter_0000010/checkpoint.h5"
  [[ "$(md5sum <"$TMP/ckA/iter_0000010/checkpoint.h5")" == "$md5" ]] || fail "a checkpoint of ckA changed"
  # The same run again (a requeued job): its own earlier --save-final is written again.
  "${TR[@]}" --train-iters 2 --seed 5 --save-final "$TMP/final.h5" >/dev/null 2>&1 || fail "first"
  "${TR[@]}" --train-iters 3 --seed 5 --save-final "$TMP/final.h5" >/dev/null 2>"$TMP/err" || fail "requeued: $(cat "$TMP/err")"
  refused 2 "exists and is not this run's output" "${TR[@]}" --train-iters 2 --seed 6 --save-final "$TMP/final.h5"
}

@test "L1: mt-ckpt import and convert never move a --save directory's tracker backwards or onto a parameters-only checkpoint" {
  make_ckA
  mt-ckpt export --format hf "$TMP/ckA" "$TMP/hfx" >/dev/null || fail "export"
  cp -r "$TMP/ckA" "$TMP/ckI"
  refused 2 "its tracker names iteration 20; this writes iteration 0, parameters only (not resumable)" \
    mt-ckpt import --format hf "$TMP/hfx" "$TMP/ckI"
  [[ "$(cat "$TMP/ckI/latest_checkpointed_iteration.txt")" == 20 && ! -e "$TMP/ckI/iter_0000000" ]] || fail "ckI changed"
  cp -r "$TMP/ckA" "$TMP/ckB" && rm -rf "$TMP/ckB/iter_0000010"
  refused 2 "a tracker never moves backwards" mt-ckpt convert "$TMP/ckA/iter_0000010/checkpoint.h5" "$TMP/ckB" --dtype bf16
  refused 2 "its tracker names iteration 20; this writes iteration 10," mt-ckpt convert "$TMP/ckA/iter_0000010/checkpoint.h5" "$TMP/ckB" --force
  [[ "$(cat "$TMP/ckB/latest_checkpointed_iteration.txt")" == 20 && ! -e "$TMP/ckB/iter_0000010" ]] || fail "ckB changed"
  # A longer run than the checkpoint's: its LR schedule is this run's (issue 28 W3).
  "${TR[@]}" --train-iters 25 --load "$TMP/ckB" --override-opt_param-scheduler >/dev/null 2>&1 || fail "ckB no longer resumes"
  # Into a new directory (the documented path) it still works, tracker and all.
  mt-ckpt import --format hf "$TMP/hfx" "$TMP/ckN" >/dev/null || fail "import into a new directory"
  [[ "$(cat "$TMP/ckN/latest_checkpointed_iteration.txt")" == 0 ]] || fail "no tracker in the new directory"
  refused 2 "is this run's input (IN $TMP/ckA/iter_0000020/checkpoint.h5)" \
    mt-ckpt convert "$TMP/ckA" "$TMP/ckA/iter_0000020/checkpoint.h5" --force
}

@test "L3: a --save directory holds one run: a live run's lock refuses a second, a stale one is taken over" {
  "${TR[@]}" --train-iters 100000 --save "$TMP/dup" >/dev/null 2>"$TMP/first.log" &
  FIRST=$!
  local first=$FIRST
  for _ in $(seq 200); do [[ -s "$TMP/dup/mt-train.lock" ]] && break; sleep 0.1; done
  refused 1 "$TMP/dup: is in use by another run (host $(hostname), pid $first, started " \
    "${TR[@]}" --train-iters 5 --save "$TMP/dup" --seed 2
  kill -KILL "$first"
  wait "$first" || true
  [[ -e "$TMP/dup/mt-train.lock" ]] || fail "a SIGKILLed run leaves its lock (the test of the take-over needs it)"
  # The SIGKILLed run's lock is stale: taken over with a warning, and removed at the end.
  "${TR[@]}" --train-iters 2 --save "$TMP/dup2" >/dev/null 2>&1 || fail "dup2"
  cp "$TMP/dup/mt-train.lock" "$TMP/dup2/mt-train.lock"
  run_split "${TR[@]}" --train-iters 4 --load "$TMP/dup2" --save "$TMP/dup2" --override-opt_param-scheduler
  [[ $status -eq 0 && "$err" == *"taking over the stale lock of host $(hostname), pid $first"* ]] || fail "exit $status: $err"
  [[ ! -e "$TMP/dup2/mt-train.lock" ]] || fail "the lock outlived its run"
}

@test "L3: a new run into another run's --save directory is refused unless it resumes it; the tracker never moves back" {
  make_ckA
  md5="$(md5sum <"$TMP/ckA/iter_0000010/checkpoint.h5")"
  # S22: a new run of another model, no --load.
  refused 2 "--save $TMP/ckA: holds another run's checkpoints (its tracker names iteration 20) and this run does not resume from it" \
    "${TR[@]}" --hidden-size 128 --train-iters 10 --save "$TMP/ckA"
  # S40: fine-tuning in place restarts at iteration 0; --force does not let the tracker move back.
  refused 2 "holds another run's checkpoints" \
    "${TR[@]}" --train-iters 10 --load "$TMP/ckA" --finetune --save "$TMP/ckA" --save-interval 10
  refused 1 "its tracker names iteration 20, later than this save's 0; a tracker never moves backwards" \
    "${TR[@]}" --train-iters 10 --load "$TMP/ckA" --finetune --save "$TMP/ckA" --save-interval 10 --force
  [[ "$(md5sum <"$TMP/ckA/iter_0000010/checkpoint.h5")" == "$md5" && "$(cat "$TMP/ckA/latest_checkpointed_iteration.txt")" == 20 ]] ||
    fail "ckA changed"
  # Resuming it is the normal case.
  "${TR[@]}" --train-iters 22 --load "$TMP/ckA" --save "$TMP/ckA" --override-opt_param-scheduler >/dev/null 2>&1 ||
    fail "resume refused"
}

@test "L6: mt-ckpt export does not overwrite an HF model directory without --force" {
  make_ckA
  mt-ckpt export --format hf "$TMP/ckA" "$TMP/hfO" >/dev/null || fail "first export"
  "${TR[@]}" --hidden-size 128 --train-iters 2 --save "$TMP/ck128" >/dev/null 2>&1 || fail "ck128"
  md5="$(md5sum <"$TMP/hfO/model.safetensors")"
  refused 2 "OUTDIR $TMP/hfO/config.json: exists and is not this run's output; give --force" \
    mt-ckpt export --format hf "$TMP/ck128" "$TMP/hfO"
  [[ "$(md5sum <"$TMP/hfO/model.safetensors")" == "$md5" ]] || fail "the HF model was replaced"
  mt-ckpt export --format hf "$TMP/ck128" "$TMP/hfO" --force >/dev/null || fail "--force refused"
  [[ "$(md5sum <"$TMP/hfO/model.safetensors")" != "$md5" ]] || fail "--force did not export"
}
