#!/usr/bin/env bats
# Resuming (issue 28, cases W3, W9, W7/U7, W2, W10, U10, each reproduced from the 2026-11-27 probe
# on a tiny model): a resume whose LR schedule differs from the checkpoint's is refused naming the
# fields unless --override-opt_param-scheduler or --use-checkpoint-opt_param-scheduler says which
# wins (Megatron's OptimizerParamScheduler); a finished run resumed trains nothing and says so; an
# iteration count past 64 bits is refused by name first; a damaged checkpoint is refused by every
# reader naming the tensor.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

# Tiny GPT on mock data; extra flags appended. JSONL in $TMP/out.jsonl, log in $TMP/err.log.
train_tiny() {
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --eval-iters 0 --log-interval 1 "$@" >"$TMP/out.jsonl" 2>"$TMP/err.log"
}

last_error() { tail -n 1 "$TMP/err.log"; }
lr_of() { jq -r --argjson i "$1" 'select(.record=="step" and .iteration==$i) | .lr' "$TMP/out.jsonl"; }

@test "W3: a resume with another --train-iters, --global-batch-size, --lr or decay style is refused naming the fields; Megatron's two flags choose" {
  train_tiny --train-iters 4 --save "$TMP/ck" || fail "$(cat "$TMP/err.log")"
  cp -r "$TMP/ck" "$TMP/ck0"
  ckpt="$TMP/ck/iter_0000004/checkpoint.h5"
  train_tiny --train-iters 8 --load "$TMP/ck" && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == "mt-train: error: $ckpt: the LR schedule differs from the checkpoint's: total number of iterations (--lr-decay-iters/--lr-decay-samples, else --train-iters x --global-batch-size) is 32 samples in this run, 16 samples in the checkpoint; resume with the checkpoint's values, or give --override-opt_param-scheduler (this run's values) or --use-checkpoint-opt_param-scheduler (the checkpoint's)" ]] \
    || fail "$status $(cat "$TMP/err.log")"
  train_tiny --train-iters 4 --global-batch-size 8 --load "$TMP/ck" && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == *"total number of iterations "*" is 32 samples in this run, 16 samples in the checkpoint"* ]] || fail "$(last_error)"
  train_tiny --train-iters 4 --lr 5e-3 --lr-decay-style cosine --load "$TMP/ck" && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == *": learning rate (--lr) is 0.005 in this run, 0.0001 in the checkpoint; learning rate decay style (--lr-decay-style) is cosine in this run, linear in the checkpoint; resume"* ]] \
    || fail "$(last_error)"
  train_tiny --train-iters 8 --load "$TMP/ck" --override-opt_param-scheduler --use-checkpoint-opt_param-scheduler && status=0 || status=$?
  [[ $status -eq 2 && "$(last_error)" == "mt-train: error: --override-opt_param-scheduler: conflicts with --use-checkpoint-opt_param-scheduler (this run's schedule or the checkpoint's: give one)" ]] \
    || fail "$status $(last_error)"
  train_tiny --train-iters 8 --use-checkpoint-opt_param-scheduler && status=0 || status=$?
  [[ $status -eq 2 && "$(last_error)" == "mt-train: error: --use-checkpoint-opt_param-scheduler: needs --load DIR" ]] || fail "$(last_error)"
  # The reference: one straight 8-iteration run. Override continues on it; use-checkpoint on the
  # 4-iteration schedule, which has decayed to 0 at iteration 5 (and after).
  train_tiny --train-iters 8 || fail "$(cat "$TMP/err.log")"
  want_lr6="$(lr_of 6)"
  train_tiny --train-iters 8 --load "$TMP/ck" --override-opt_param-scheduler || fail "$(cat "$TMP/err.log")"
  grep -q "^mt-train: --override-opt_param-scheduler: this run's values, not the checkpoint's: total number of iterations" "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  [[ "$(lr_of 6)" == "$want_lr6" && "$want_lr6" != 0 ]] || fail "override: lr $(lr_of 6), want $want_lr6"
  train_tiny --train-iters 8 --load "$TMP/ck0" --save "$TMP/ck0" --use-checkpoint-opt_param-scheduler || fail "$(cat "$TMP/err.log")"
  [[ "$(lr_of 5)" == 0 && "$(lr_of 8)" == 0 ]] || fail "use-checkpoint: lr $(lr_of 5) $(lr_of 8), want 0"
  # The run's checkpoint holds the schedule it used (decay over 16 samples), which the next resume
  # gives as flags.
  train_tiny --train-iters 10 --lr-decay-samples 16 --load "$TMP/ck0" || fail "the adopted schedule was not saved: $(cat "$TMP/err.log")"
  [[ "$(lr_of 9)" == 0 ]] || fail "lr $(lr_of 9)"
  # A longer run whose decay the flags fix resumes unchecked (mt's weight decay is constant).
  train_tiny --train-iters 4 --lr-decay-iters 8 --save "$TMP/ck8" || fail "$(cat "$TMP/err.log")"
  train_tiny --train-iters 8 --lr-decay-iters 8 --load "$TMP/ck8" || fail "$(cat "$TMP/err.log")"
  # A different --weight-decay cannot be adopted after the optimizer is built: named.
  train_tiny --train-iters 4 --weight-decay 0.5 --load "$TMP/ck" --use-checkpoint-opt_param-scheduler && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == "mt-train: error: $ckpt: --use-checkpoint-opt_param-scheduler: the checkpoint's weight decay is 0.01, this run's 0.5 (--weight-decay): give --weight-decay 0.01" ]] \
    || fail "$status $(last_error)"
  # --no-load-optim and --finetune load no scheduler (Megatron's): no check.
  train_tiny --train-iters 8 --load "$TMP/ck" --no-load-optim || fail "$(cat "$TMP/err.log")"
}

@test "W9: resuming a finished run (or --train-iters below the checkpoint) trains nothing, says so, and reports no loss" {
  train_tiny --train-iters 4 --save "$TMP/ck" || fail "$(cat "$TMP/err.log")"
  for iters in 4 2; do
    train_tiny --train-iters "$iters" --load "$TMP/ck" --save "$TMP/ck" --override-opt_param-scheduler || fail "$(cat "$TMP/err.log")"
    grep -qx "warning: mt-train: nothing to train: the checkpoint is at iteration 4, and --train-iters $iters ends the run at iteration $iters (give a larger --train-iters to train on)" "$TMP/err.log" \
      || fail "$(cat "$TMP/err.log")"
    jq -e -s '([.[] | select(.record=="step")] | length) == 0 and (.[-1] | .record == "summary" and .iterations == 4 and
              .lm_loss == null and .median_step_ms == null and .tokens_per_s == null)' "$TMP/out.jsonl" >/dev/null \
      || fail "$(tail -n 1 "$TMP/out.jsonl")"
  done
  [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 4 ]] || fail "the tracker moved"
}

@test "W7, U7: --train-iters x --global-batch-size past 64 bits is refused naming the flag, before anything else" {
  for iters in 4611686018427387905 9223372036854775807 2305843009213693952; do
    timeout 20 mt-train --model tiny-gpt --mock-data --eval-iters 0 --micro-batch-size 2 --global-batch-size 4 --train-iters "$iters" \
      >"$TMP/out.jsonl" 2>"$TMP/err.log" && status=0 || status=$?
    [[ $status -eq 2 && "$(last_error)" == "mt-train: error: --train-iters $iters: x --global-batch-size 4 samples does not fit in 64 bits (at most 2305843009213693951 iterations)" ]] \
      || fail "$iters: $status $(cat "$TMP/err.log")"
    [[ ! -s "$TMP/out.jsonl" ]] || fail "records were written"
  done
  mt-train --model tiny-gpt --mock-data --eval-iters 0 --micro-batch-size 2 --global-batch-size 4 --train-iters 2 \
    --lr-decay-iters 4611686018427387905 >/dev/null 2>"$TMP/err.log" && status=0 || status=$?
  [[ $status -eq 2 && "$(last_error)" == "mt-train: error: --lr-decay-iters 4611686018427387905: x --global-batch-size 4 samples does not fit in 64 bits (at most 2305843009213693951 iterations)" ]] \
    || fail "$status $(cat "$TMP/err.log")"
}

@test "W2: a flipped value in a weight or an Adam moment is refused by --load, mt-ckpt export and convert, naming the tensor and the file" {
  train_tiny --train-iters 2 --lr-decay-iters 4 --save "$TMP/ck" || fail "$(cat "$TMP/err.log")"
  for name in model/decoder.layers.0.mlp.linear_fc1.weight optimizer/exp_avg_sq/decoder.layers.0.mlp.linear_fc1.weight; do
    rm -rf "$TMP/bad" && cp -r "$TMP/ck" "$TMP/bad"
    bad="$TMP/bad/iter_0000002/checkpoint.h5"
    /usr/bin/python3 "$BATS_TEST_DIRNAME/ckpt_h5py.py" corrupt "$bad" value "$name" >/dev/null
    want="$bad: tensor $name: checksum mismatch (stored "
    train_tiny --train-iters 4 --lr-decay-iters 4 --load "$TMP/bad" && status=0 || status=$?
    [[ $status -eq 1 && "$(last_error)" == "mt-train: error: $want"*"): the file is damaged (mt-ckpt verify checks every tensor); use an earlier checkpoint" ]] \
      || fail "load $name: $status $(cat "$TMP/err.log")"
    [[ "$(jq -c 'select(.record=="step")' "$TMP/out.jsonl")" == "" ]] || fail "a step ran"
    mt-ckpt convert "$bad" "$TMP/conv.h5" >/dev/null 2>"$TMP/err.log" && status=0 || status=$?
    [[ $status -eq 1 && "$(last_error)" == "mt-ckpt: error: $want"* && ! -e "$TMP/conv.h5" ]] || fail "convert $name: $status $(cat "$TMP/err.log")"
  done
  # export checks every tensor of the file first (here the damaged moment).
  mt-ckpt export --format hf "$TMP/bad" "$TMP/hf" >/dev/null 2>"$TMP/err.log" && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == "mt-ckpt: error: $bad: tensor optimizer/exp_avg_sq/"*"checksum mismatch"* && ! -e "$TMP/hf/model.safetensors" ]] \
    || fail "export: $status $(cat "$TMP/err.log")"
  # The undamaged checkpoint still loads, exports and converts.
  train_tiny --train-iters 3 --lr-decay-iters 4 --load "$TMP/ck" || fail "$(cat "$TMP/err.log")"
  mt-ckpt export --format hf "$TMP/ck" "$TMP/hf2" >/dev/null || fail "export of a good checkpoint"
}

@test "W2 under mpirun: the ranks share the checksum read, and the rank that finds the damage names it" {
  train_tiny --train-iters 2 --lr-decay-iters 4 --save "$TMP/ck" || fail "$(cat "$TMP/err.log")"
  # Tensors are checked round-robin over the ranks (in the file's order): of three neighbouring
  # tensors some land on each rank, so a rank that skipped its share would let one load.
  for name in model/decoder.layers.0.mlp.linear_fc1.weight model/decoder.layers.0.mlp.linear_fc2.bias \
    model/decoder.layers.0.mlp.linear_fc2.weight; do
    rm -rf "$TMP/bad" && cp -r "$TMP/ck" "$TMP/bad"
    bad="$TMP/bad/iter_0000002/checkpoint.h5"
    /usr/bin/python3 "$BATS_TEST_DIRNAME/ckpt_h5py.py" corrupt "$bad" value "$name" >/dev/null
    mpirun_n 2 mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 \
      --global-batch-size 4 --eval-iters 0 --log-interval 1 --train-iters 4 --lr-decay-iters 4 --load "$TMP/bad" \
      >"$TMP/out.jsonl" 2>"$TMP/err.log" && status=0 || status=$?
    [[ $status -ne 0 ]] || fail "load $name under mpirun exited 0"
    grep -q "mt-train: error: $bad: tensor $name: checksum mismatch (stored " "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
    [[ "$(jq -c 'select(.record=="step")' "$TMP/out.jsonl")" == "" ]] || fail "a step ran"
  done
}

@test "U10: a parameters-only checkpoint (mt-ckpt convert) is named as such, pointing at --finetune, with or without --no-load-optim" {
  train_tiny --train-iters 2 --save "$TMP/ck" || fail "$(cat "$TMP/err.log")"
  mt-ckpt convert "$TMP/ck/iter_0000002/checkpoint.h5" "$TMP/conv" --dtype fp16 >/dev/null 2>&1 || fail "convert"
  want="$TMP/conv/iter_0000002/checkpoint.h5: holds parameters only, not a run to resume (written by --save-init/--save-final, mt-ckpt convert or import); load it with --finetune"
  for flag in "" --no-load-optim; do
    # shellcheck disable=SC2086
    train_tiny --train-iters 4 --load "$TMP/conv" $flag && status=0 || status=$?
    [[ $status -eq 1 && "$(last_error)" == "mt-train: error: $want" ]] || fail "'$flag': $status $(cat "$TMP/err.log")"
  done
  train_tiny --train-iters 2 --load "$TMP/conv" --finetune || fail "$(cat "$TMP/err.log")"
}

@test "W10: a checkpoint's counters are cross-checked on load (iteration, consumed samples, Adam's step), naming the file, the attribute and both values; a resume at another batch size or with a fresh Adam still resumes" {
  train_tiny --train-iters 4 --save "$TMP/ck" || fail "$(cat "$TMP/err.log")"
  damaged() {  # damaged NAME ATTRIBUTE VALUE: a copy of the run with one root attribute changed
    rm -rf "$TMP/$1" && cp -r "$TMP/ck" "$TMP/$1"
    /usr/bin/python3 "$BATS_TEST_DIRNAME/ckpt_h5py.py" corrupt "$TMP/$1/iter_0000004/checkpoint.h5" attribute "$2" "$3" || fail "corrupt $2"
    train_tiny --train-iters 6 --load "$TMP/$1" --override-opt_param-scheduler && status=0 || status=$?
    [[ $status -eq 1 ]] || fail "$2=$3: exit $status"
    [[ "$(jq -c 'select(.record=="step")' "$TMP/out.jsonl")" == "" ]] || fail "$2=$3: a step ran"
  }
  damaged cI iteration 5
  [[ "$(last_error)" == "mt-train: error: $TMP/cI/iter_0000004/checkpoint.h5: attribute iteration is 5, but its directory iter_0000004 is iteration 4 (and the tracker $TMP/cI/latest_checkpointed_iteration.txt names 4): the file was changed or damaged; load another checkpoint" ]] \
    || fail "$(last_error)"
  damaged cC consumed_train_samples 99999999
  [[ "$(last_error)" == "mt-train: error: $TMP/cC/iter_0000004/checkpoint.h5: attribute consumed_train_samples is 99999999, but 4 iterations at global batch 4 give 16: the file was changed or damaged; load another checkpoint" ]] \
    || fail "$(last_error)"
  damaged cO optimizer_step 0
  [[ "$(last_error)" == "mt-train: error: $TMP/cO/iter_0000004/checkpoint.h5: attribute optimizer_step is 0, but iteration 4 with 0 skipped gives 4 Adam steps: the file was changed or damaged; load another checkpoint" ]] \
    || fail "$(last_error)"
  damaged cS skipped_iterations 5
  [[ "$(last_error)" == *"checkpoint.h5: attribute skipped_iterations + nan_iterations is 5, but iteration is 4 (no more iterations are skipped than run)"* ]] \
    || fail "$(last_error)"
  # What can be right resumes: another global batch (the consumed samples then add 8 a step from
  # iteration 4's 16), and a fresh Adam (--no-load-optim: its steps count from 0 at iteration 4),
  # each saved and resumed once more.
  cp -r "$TMP/ck" "$TMP/gbs"
  train_tiny --train-iters 6 --global-batch-size 8 --load "$TMP/gbs" --save "$TMP/gbs" --override-opt_param-scheduler \
    || fail "$(cat "$TMP/err.log")"
  train_tiny --train-iters 7 --global-batch-size 8 --load "$TMP/gbs" --override-opt_param-scheduler || fail "$(cat "$TMP/err.log")"
  jq -e -s '[.[] | select(.record=="step")] | length == 1 and .[0].consumed_samples == 40' "$TMP/out.jsonl" >/dev/null \
    || fail "$(cat "$TMP/out.jsonl")"
  cp -r "$TMP/ck" "$TMP/fresh"
  train_tiny --train-iters 6 --load "$TMP/fresh" --save "$TMP/fresh" --no-load-optim --override-opt_param-scheduler \
    || fail "$(cat "$TMP/err.log")"
  train_tiny --train-iters 7 --load "$TMP/fresh" --override-opt_param-scheduler || fail "$(cat "$TMP/err.log")"
}
