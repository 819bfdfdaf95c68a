#!/usr/bin/env bats
# Divergence and silent numerics (issue 28, cases W1, W4, W6, W11, U4, each reproduced from the
# 2026-11-27 probe on a tiny model): a non-finite forward loss stops an fp16 run as it stops an
# fp32 one, steps skipped in a row at a scale that cannot go lower stop the run, loss scales
# below 1 are refused, a checkpoint is never written from a non-finite state (the tracker keeps
# the last good one), and mt-ckpt convert/import and --load refuse non-finite or out-of-range
# weights naming the tensor.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

# Tiny GPT on mock data; extra flags appended. JSONL in $TMP/out.jsonl, log in $TMP/err.log.
train_tiny() {
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --eval-iters 0 "$@" >"$TMP/out.jsonl" 2>"$TMP/err.log"
}

last_error() { tail -n 1 "$TMP/err.log"; }

@test "W1: fp16, a NaN forward loss stops the run naming the iteration; the tracker keeps the last good checkpoint" {
  # lr 1e9: the scaler skips steps 1-14 while it backs off, step 15 updates, step 16's loss is NaN.
  train_tiny --fp16 --lr 1e9 --lr-decay-style constant --train-iters 30 --save "$TMP/ck" --save-interval 5 && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == "mt-train: error: iteration 16: the loss is NaN (--no-check-for-nan-in-loss-and-grad skips and counts such steps)" ]] \
    || fail "$status $(cat "$TMP/err.log")"
  [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 15 && ! -e "$TMP/ck/iter_0000020" ]] || fail "$(ls "$TMP/ck")"
  mt-ckpt verify "$TMP/ck" >/dev/null || fail "the kept checkpoint does not verify"
  # The user may ask to skip such steps: then they are counted as nan iterations.
  train_tiny --fp16 --lr 1e9 --lr-decay-style constant --train-iters 20 --no-check-for-nan-in-loss-and-grad \
    --max-consecutive-skipped-iters 0 || fail "$(cat "$TMP/err.log")"
  jq -e -s '[.[] | select(.record=="step")][-1] | .nan_iters == 5 and .skipped_iters == 19' "$TMP/out.jsonl" >/dev/null \
    || fail "$(jq -c -s '[.[] | select(.record=="step")][-1]' "$TMP/out.jsonl")"
}

@test "W4: loss scales below 1 are refused; fp16 steps skipped in a row at a scale that cannot go lower stop the run" {
  train_tiny --fp16 --loss-scale 1e-30 --train-iters 2 && status=0 || status=$?
  [[ $status -eq 2 && "$(last_error)" == "mt-train: error: --loss-scale: must be at least 1: a loss scale below 1 flushes fp16 gradients to zero" ]] \
    || fail "$status $(cat "$TMP/err.log")"
  train_tiny --fp16 --initial-loss-scale 1e-30 --train-iters 2 && status=0 || status=$?
  [[ $status -eq 2 && "$(last_error)" == "mt-train: error: --initial-loss-scale: must be at least 1: a loss scale below 1 flushes fp16 gradients to zero" ]] \
    || fail "$status $(cat "$TMP/err.log")"
  # A static scale that overflows every step: stopped after the default 10, with no checkpoint.
  train_tiny --fp16 --loss-scale 1e30 --train-iters 30 --save "$TMP/ck" --save-interval 20 && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == "mt-train: error: iteration 10: 10 steps in a row skipped for a non-finite loss or gradient at the static loss scale 1e+30 (a diverged run; --max-consecutive-skipped-iters sets how many, 0 never stops)" ]] \
    || fail "$status $(cat "$TMP/err.log")"
  [[ ! -e "$TMP/ck/latest_checkpointed_iteration.txt" ]] || fail "a checkpoint of the skipped steps was made latest"
  # The dynamic scaler counts only once at its floor: 2^40 falls to the floor 2^38 after 3 skips.
  train_tiny --fp16 --initial-loss-scale 1099511627776 --min-loss-scale 274877906944 --hysteresis 1 --train-iters 12 \
    --max-consecutive-skipped-iters 4 && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == "mt-train: error: iteration 6: 4 steps in a row skipped for a non-finite loss or gradient at the minimum loss scale 2.74878e+11 (a diverged run; --max-consecutive-skipped-iters sets how many, 0 never stops)" ]] \
    || fail "$status $(cat "$TMP/err.log")"
  train_tiny --fp16 --loss-scale 1e30 --train-iters 12 --max-consecutive-skipped-iters 0 || fail "0 stopped the run: $(cat "$TMP/err.log")"
  jq -e -s '[.[] | select(.record=="step")][-1].skipped_iters == 12' "$TMP/out.jsonl" >/dev/null || fail "$(cat "$TMP/out.jsonl")"
  # fp32 with the check off: NaN steps are skipped and counted, and the same limit ends them.
  train_tiny --lr 1e38 --lr-decay-style constant --train-iters 20 --no-check-for-nan-in-loss-and-grad \
    --max-consecutive-skipped-iters 3 && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == "mt-train: error: iteration 4: 3 steps in a row skipped for a non-finite loss or gradient (a diverged run; --max-consecutive-skipped-iters sets how many, 0 never stops)" ]] \
    || fail "$status $(cat "$TMP/err.log")"
}

@test "W1: a checkpoint is never written from a non-finite state (--save and --save-final)" {
  # lr 1e39 overflows float in the first update: the parameters become Inf/NaN after a finite step 1.
  train_tiny --lr 1e39 --lr-decay-style constant --train-iters 2 --save "$TMP/ck" --save-interval 1 \
    --no-check-for-nan-in-loss-and-grad && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" =~ ^"mt-train: error: checkpoint of iteration 1: not written: tensor model/".*" holds "(NaN|Inf|-Inf)" at element "[0-9]+" (a diverged state; the tracker keeps the last checkpoint)"$ ]] \
    || fail "$status $(cat "$TMP/err.log")"
  [[ ! -e "$TMP/ck/latest_checkpointed_iteration.txt" && -z "$(find "$TMP/ck" -name '*.h5*' 2>/dev/null)" ]] || fail "$(find "$TMP/ck")"
  train_tiny --lr 1e39 --lr-decay-style constant --train-iters 1 --save-final "$TMP/final.h5" && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == *"not written: tensor model/"* && ! -e "$TMP/final.h5" ]] || fail "$status $(cat "$TMP/err.log")"
}

@test "W6: mt-ckpt convert --dtype fp16 refuses weights beyond fp16's range naming the tensor and value; bf16 keeps them" {
  # One step at lr 1e9 leaves |w| ~ 1e9, finite in float32.
  train_tiny --lr 1e9 --lr-decay-style constant --train-iters 1 --save-final "$TMP/big.h5" || fail "$(cat "$TMP/err.log")"
  run_split mt-ckpt convert --dtype fp16 "$TMP/big.h5" "$TMP/c16.h5"
  [[ $status -eq 1 && "$err" =~ "mt-ckpt: error: $TMP/big.h5: tensor model/".*" holds "-?[0-9.e+]+" at element "[0-9]+", beyond float16's range (it would be stored as inf); keep --dtype fp32 or bf16" ]] \
    || fail "$status $err"
  [[ ! -e "$TMP/c16.h5" ]] || fail "a partial output was left"
  run_split mt-ckpt convert --dtype bf16 "$TMP/big.h5" "$TMP/c16.h5"
  [[ $status -eq 0 ]] || fail "$err"
  mt-ckpt verify "$TMP/c16.h5" >/dev/null || fail "the bf16 conversion does not verify"
}

@test "W11: mt-ckpt import --format hf refuses a NaN weight naming the tensor" {
  train_tiny --train-iters 1 --save-final "$TMP/final.h5" || fail "$(cat "$TMP/err.log")"
  mt-ckpt export --format hf "$TMP/final.h5" "$TMP/hf" >/dev/null
  # One float32 NaN written over element 3 of transformer.h.0.mlp.c_fc.weight, located from the
  # safetensors header (8-byte size, JSON, then the data; offsets relative to the data).
  /usr/bin/python3 - "$TMP/hf/model.safetensors" <<'EOF'
import json, struct, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    size = struct.unpack("<Q", f.read(8))[0]
    begin = json.loads(f.read(size))["transformer.h.0.mlp.c_fc.weight"]["data_offsets"][0]
    f.seek(8 + size + begin + 3 * 4)
    f.write(struct.pack("<f", float("nan")))
EOF
  run_split mt-ckpt import --format hf "$TMP/hf" "$TMP/imported.h5"
  [[ $status -eq 1 && "$err" == "mt-ckpt: error: $TMP/hf: tensor transformer.h.0.mlp.c_fc.weight holds NaN at element 3 (mt imports finite weights only)" ]] \
    || fail "$status $err"
  [[ ! -e "$TMP/imported.h5" ]] || fail "a partial output was left"
}

@test "U4: a NaN inside a loaded checkpoint is named as such, before any step" {
  train_tiny --train-iters 2 --save "$TMP/ck" --save-interval 2 || fail "$(cat "$TMP/err.log")"
  /usr/bin/python3 "$BATS_TEST_DIRNAME/ckpt_h5py.py" corrupt "$TMP/ck/iter_0000002/checkpoint.h5" nan \
    model/decoder.layers.1.mlp.linear_fc2.weight >/dev/null
  train_tiny --train-iters 4 --load "$TMP/ck" && status=0 || status=$?
  [[ $status -eq 1 && "$(last_error)" == "mt-train: error: $TMP/ck/iter_0000002/checkpoint.h5: tensor model/decoder.layers.1.mlp.linear_fc2.weight holds NaN at element 0: the checkpoint is damaged or was saved from a diverged run (mt-ckpt verify scans it); load an earlier one" ]] \
    || fail "$status $(cat "$TMP/err.log")"
  [[ -z "$(jq -c 'select(.record=="step")' "$TMP/out.jsonl")" ]] || fail "steps ran before the refusal"
}

@test "W1, U4 under mpirun (TP 2): every rank refuses a non-finite save and a NaN load with the same line, no hang" {
  run_split mpirun_n 2 mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 \
    --global-batch-size 4 --eval-iters 0 --tensor-model-parallel-size 2 --train-iters 2 --lr 1e39 --lr-decay-style constant \
    --save "$TMP/ck" --save-interval 1 --no-check-for-nan-in-loss-and-grad
  [[ $status -eq 1 && $(grep -c "mt-train: error: checkpoint of iteration 1: not written: tensor model/" <<<"$err") -eq 2 ]] \
    || fail "$status $err"
  [[ ! -e "$TMP/ck/latest_checkpointed_iteration.txt" ]] || fail "the tracker moved"
  train_tiny --train-iters 2 --save "$TMP/good" --save-interval 2 || fail "$(cat "$TMP/err.log")"
  # The last element: in rank 1's shard, named by its index in the whole tensor.
  local at
  at=$(/usr/bin/python3 "$BATS_TEST_DIRNAME/ckpt_h5py.py" corrupt "$TMP/good/iter_0000002/checkpoint.h5" nan \
    model/decoder.layers.1.mlp.linear_fc2.weight -1)
  run_split mpirun_n 2 mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 \
    --global-batch-size 4 --eval-iters 0 --tensor-model-parallel-size 2 --train-iters 4 --load "$TMP/good"
  [[ $status -ne 0 && $at -gt 0 && $(grep -c "tensor model/decoder.layers.1.mlp.linear_fc2.weight holds NaN at element $at: the checkpoint is damaged" <<<"$err") -eq 2 ]] \
    || fail "$status $err"
}
