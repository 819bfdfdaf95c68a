#!/usr/bin/env bats
# mt-train --fp8-format (issue 23): a tiny GPT trains under FP8 on the CPU emulation, and what FP8
# does not run is refused by name with exit 2 (tests/BAD_INPUTS.md rows "issue 23").

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

tiny() {
  run_split mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 \
    --global-batch-size 4 --train-iters 2 --eval-iters 0 --peak-tflops 1 "$@"
}

@test "issue23: --fp8-format hybrid trains a tiny GPT with --bf16; the losses differ from the bf16 run" {
  tiny --bf16
  [[ $status -eq 0 ]] || fail "$err"
  local bf16
  bf16="$(jq -c -s '[.[] | select(.record=="step") | .lm_loss]' <<<"$out")"
  tiny --bf16 --fp8-format hybrid --fp8-amax-history-len 4 --fp8-amax-compute-algo max --fp8-margin 1
  [[ $status -eq 0 ]] || fail "$err"
  local fp8
  fp8="$(jq -c -s '[.[] | select(.record=="step") | .lm_loss]' <<<"$out")"
  [[ "$fp8" != "$bf16" ]] || fail "FP8 changed nothing: $fp8"
  jq -e -s --argjson b "$bf16" '[.[] | select(.record=="step") | .lm_loss] | to_entries
    | all(((.value - $b[.key]) | fabs) < 0.01 * $b[.key])' <<<"$out" >/dev/null || fail "$fp8 vs $bf16"
}

@test "issue23: FP8 recipes, options and layouts mt does not run are refused by name, exit 2" {
  local cases=(
    "--bf16 --fp8-format hybrid --fp8-recipe tensorwise|--fp8-recipe tensorwise: not supported"
    "--bf16 --fp8-format hybrid --fp8-recipe mxfp8|--fp8-recipe mxfp8: not supported"
    "--bf16 --fp8-format e4m3 --fp8-param-gather|--fp8-param-gather: not supported"
    "--fp8-format hybrid|--fp8-format: needs --bf16 or --fp16"
    "--bf16 --fp8-format e5m2|--fp8-format"
    "--bf16 --fp8-format hybrid --fp8-amax-compute-algo mean|--fp8-amax-compute-algo"
    "--bf16 --fp8-format hybrid --fp8-amax-history-len 0|--fp8-amax-history-len"
  )
  for entry in "${cases[@]}"; do
    local args="${entry%%|*}" want="${entry#*|}"
    # shellcheck disable=SC2086
    tiny $args
    [[ $status -eq 2 && "$(line_count "$err")" -eq 1 && "$err" == "mt-train: error: $want"* ]] ||
      fail "'$args': status $status, $err"
  done
  # 24 tokens a micro-batch (seq 12 x 2) is not a multiple of 16: refused at the first FP8 GEMM.
  run_split mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 12 --micro-batch-size 2 \
    --global-batch-size 2 --train-iters 1 --eval-iters 0 --peak-tflops 1 --bf16 --fp8-format hybrid
  [[ $status -eq 2 && "$err" == *"--fp8-format: an FP8 linear's tokens, input and output features must be multiples of 16"* ]] ||
    fail "seq 12: status $status, $err"
}

# FP8 under TP, DP, CP (np 2 each) and TP x CP (np 4) against one rank's FP8 run, 10 steps. The
# amaxes are reduced over TP x DP x CP, so every rank quantizes with one rank's scales; the losses
# then differ by fp32 summation order, which an FP8 rounding can amplify: measured at most 9e-5
# relative, bound 3e-4 (without the reduction TP's shards take their own scales and drift apart).
# TE updates the scales after every micro-batch of each rank (amaxes reduced over TP x DP x CP), so
# DP=2 at micro-batch 2 meets the samples of one rank's micro-batch 4 in each update (Megatron's
# sampler gives DP rank r the r-th micro-batch of each DP-wide slice), not one rank's micro-batch 2.
@test "issue23: FP8 under TP=2, DP=2, CP=2 and TP=2 x CP=2 trains one rank's FP8 numbers" {
  local -a tiny=(--model tiny-llama --mock-data --vocab-size 97 --seq-length 32
                 --global-batch-size 8 --train-iters 10 --lr 3e-3 --lr-warmup-iters 2 --eval-iters 0 --peak-tflops 1
                 --bf16 --fp8-format hybrid --ffn-hidden-size 192)
  local micro
  for micro in 2 4; do
    mt-train "${tiny[@]}" --micro-batch-size "$micro" >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
    jq -c -s '[.[] | select(.record=="step") | .lm_loss]' "$TMP/one.jsonl" >"$TMP/one-$micro.json"
  done
  # ranks|one rank's micro-batch|bound|layout. DP sums the same rows in the same order as one rank
  # (measured 5.5e-8; without the DP amax reduction 1.7e-4), TP and CP split sums (measured 9e-5).
  local -a layouts=("2|2|3e-4|--tensor-model-parallel-size 2" "2|4|1e-6|" "2|2|3e-4|--context-parallel-size 2"
                    "4|2|3e-4|--tensor-model-parallel-size 2 --context-parallel-size 2")
  for entry in "${layouts[@]}"; do
    local ranks one_micro bound layout one
    IFS='|' read -r ranks one_micro bound layout <<<"$entry"
    one="$(cat "$TMP/one-$one_micro.json")"
    # shellcheck disable=SC2086
    mpirun_n "$ranks" mt-train "${tiny[@]}" --micro-batch-size 2 $layout >"$TMP/many.jsonl" 2>"$TMP/many.err" ||
      fail "'$layout': $(cat "$TMP/many.err")"
    jq -e -s --argjson one "$one" --argjson bound "$bound" '[.[] | select(.record=="step") | .lm_loss]
      | length == 10 and (to_entries | all(((.value - $one[.key]) | fabs) <= $bound * $one[.key]))' \
      "$TMP/many.jsonl" >/dev/null ||
      fail "np $ranks '$layout': $(jq -c -s '[.[] | select(.record=="step") | .lm_loss]' "$TMP/many.jsonl") vs one rank's (micro-batch $one_micro) $one"
  done
}

# TE's saved FP8 tensors: a micro-batch's backward and its recompute quantize with the scales of its
# forward (kept per activation slot), so full recompute changes nothing, bit for bit, though the
# scales move after every micro-batch; PP=2 (two micro-batches in flight per stage, each stage
# updating its own linears) gives one rank's losses. 4 micro-batches a step, a 4-entry history
# under max.
@test "issue23: FP8 with full recompute and under PP=2 equals the plain one-rank FP8 run" {
  local -a tiny=(--model tiny-llama --mock-data --vocab-size 97 --seq-length 32 --micro-batch-size 2
                 --global-batch-size 8 --train-iters 6 --lr 3e-3 --lr-warmup-iters 2 --eval-iters 0 --peak-tflops 1
                 --bf16 --fp8-format hybrid --ffn-hidden-size 192 --fp8-amax-history-len 4 --fp8-amax-compute-algo max)
  local steps='[.[] | select(.record=="step") | [.lm_loss, .grad_norm]]'
  mt-train "${tiny[@]}" >"$TMP/plain.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  mt-train "${tiny[@]}" --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
    >"$TMP/recompute.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  mpirun_n 2 mt-train "${tiny[@]}" --pipeline-model-parallel-size 2 >"$TMP/pp.jsonl" 2>"$TMP/err" ||
    fail "$(cat "$TMP/err")"
  local plain losses='[.[] | select(.record=="step") | .lm_loss]'
  plain="$(jq -c -s "$steps" "$TMP/plain.jsonl")"
  [[ "$(jq -s "$steps | length" "$TMP/plain.jsonl")" == 6 ]] || fail "plain: $plain"
  [[ "$(jq -c -s "$steps" "$TMP/recompute.jsonl")" == "$plain" ]] ||
    fail "recompute: $(jq -c -s "$steps" "$TMP/recompute.jsonl") vs $plain"
  # PP: the losses bit for bit (the grad norm sums the stages' squares in another order).
  [[ "$(jq -c -s "$losses" "$TMP/pp.jsonl")" == "$(jq -c -s "$losses" "$TMP/plain.jsonl")" ]] ||
    fail "pp: $(jq -c -s "$losses" "$TMP/pp.jsonl") vs $(jq -c -s "$losses" "$TMP/plain.jsonl")"
}

# The FP8 scaling state in checkpoints across a layout change: TP=2 saves at step 2 (a 4-step amax
# history under max); TP=2 resumed equals TP=2 straight bit for bit; TP=1 loads exactly what TP=2
# saved (its --save-final of the loaded state equals the checkpoint's FP8 tensors bit for bit: the
# state is per linear, the same on every rank after the TP x DP x CP amax reduction) and its steps
# 3-4 stay within the TP bound of TP=2's; the checkpoint verifies.
@test "issue23: FP8 state saved at TP=2 resumes bit for bit at TP=2 and loads unchanged at TP=1" {
  local -a tiny=(--model tiny-llama --mock-data --vocab-size 97 --seq-length 32 --micro-batch-size 2
                 --global-batch-size 4 --lr 3e-3 --lr-decay-iters 4 --eval-iters 0 --peak-tflops 1 --bf16 --fp8-format hybrid
                 --fp8-amax-history-len 4 --fp8-amax-compute-algo max --ffn-hidden-size 192)
  local losses='[.[] | select(.record=="step") | .lm_loss]'
  mpirun_n 2 mt-train "${tiny[@]}" --tensor-model-parallel-size 2 --train-iters 4 >"$TMP/straight.jsonl" 2>"$TMP/err" ||
    fail "$(cat "$TMP/err")"
  mpirun_n 2 mt-train "${tiny[@]}" --tensor-model-parallel-size 2 --train-iters 2 --save "$TMP/ck" >/dev/null 2>"$TMP/err" ||
    fail "$(cat "$TMP/err")"
  mt-ckpt verify "$TMP/ck" >/dev/null || fail "the FP8 checkpoint does not verify"
  mpirun_n 2 mt-train "${tiny[@]}" --tensor-model-parallel-size 2 --train-iters 4 --load "$TMP/ck" >"$TMP/tp2.jsonl" 2>"$TMP/err" ||
    fail "$(cat "$TMP/err")"
  local straight tp2
  straight="$(jq -c -s "$losses | .[2:]" "$TMP/straight.jsonl")"
  tp2="$(jq -c -s "$losses" "$TMP/tp2.jsonl")"
  [[ "$tp2" == "$straight" ]] || fail "TP=2 resumed $tp2, straight $straight"
  # TP=1 loads the TP=2 checkpoint; with nothing left to train its --save-final holds the loaded state.
  mt-train "${tiny[@]}" --train-iters 2 --load "$TMP/ck" --save-final "$TMP/loaded.h5" >/dev/null 2>"$TMP/err" ||
    fail "$(cat "$TMP/err")"
  run_split mt-ckpt diff "$TMP/ck" "$TMP/loaded.h5"  # exit 3: the optimizer state is only in the checkpoint
  jq -e -s '[.[] | select(.record=="tensor_diff" and (.name | startswith("fp8/")))] | length == 14 and
    all(.ok and .max_abs == 0)' <<<"$out" >/dev/null || fail "FP8 state changed through a TP=1 load: $out"
  local saved
  saved="$(h5dump -d /fp8/decoder.layers.0.mlp.linear_fc2.weight "$TMP/ck/iter_0000002/checkpoint.h5")"
  [[ "$saved" == *"(0,0): "* && "$saved" != *"(0,0): 1,"* ]] || fail "the saved input scale is still 1: $saved"
  mt-train "${tiny[@]}" --train-iters 4 --load "$TMP/ck" >"$TMP/tp1.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  jq -e -s --argjson tp2 "$tp2" "$losses | length == 2 and (to_entries
    | all(((.value - \$tp2[.key]) | fabs) <= 3e-4 * \$tp2[.key]))" "$TMP/tp1.jsonl" >/dev/null ||
    fail "TP=1 from the TP=2 checkpoint: $(jq -c -s "$losses" "$TMP/tp1.jsonl") vs TP=2's $tp2"
}

@test "issue23: --first-last-layers-bf16, --num-layers-at-*-in-bf16 and --no-fp8-wgrad are refused where they change nothing" {
  local cases=(
    "--bf16 --first-last-layers-bf16|--first-last-layers-bf16: needs --fp8-format"
    "--bf16 --no-fp8-wgrad|--no-fp8-wgrad: needs --fp8-format"
    "--bf16 --fp8-format hybrid --num-layers-at-end-in-bf16 0|--num-layers-at-end-in-bf16: needs --first-last-layers-bf16"
    "--bf16 --fp8-format hybrid --first-last-layers-bf16 --num-layers-at-start-in-bf16 3|--num-layers-at-start-in-bf16: 3 is not between 0 and the 2 layers of a pipeline stage"
  )
  for entry in "${cases[@]}"; do
    local args="${entry%%|*}" want="${entry#*|}"
    # shellcheck disable=SC2086
    tiny $args
    [[ $status -eq 2 && "$(line_count "$err")" -eq 1 && "$err" == "mt-train: error: $want"* ]] ||
      fail "'$args': status $status, $err"
  done
  tiny --bf16 --fp8-format e4m3 --first-last-layers-bf16 --num-layers-at-start-in-bf16 0 --no-fp8-wgrad
  [[ $status -eq 0 ]] || fail "$err"
}

# fp8/<weight> of a checkpoint file as one line of comma-separated values (row-major (3, 2 + history)).
fp8_state() {
  h5dump -y -w 0 -m %.9g -d "/fp8/$1" "$2" | sed -n '/DATA {/,/}/p' | tr -d 'DATA{} \n'
}

# FP8 with MoE (Megatron's TEGroupedMLP): tiny-mixtral (8 experts, top-2) at EP=2 x DP=2 against an
# independent one-rank run of the same samples (micro-batch 4, one micro-batch a step). The first
# step, before any amax reaches a scale, gives one rank's loss; after it, each EP rank's local
# expert i holds the amaxes of TE's reduction over TP x DP x CP, which EP sits inside: the max of
# what the one-rank run recorded for the global experts i and i + 4 sharing that local index (so
# EP=2 runs other numbers than EP=1 from step 2 on, as Megatron's do). The experts' FP8 state,
# written by one rank per EP coordinate, resumes at EP=2 bit for bit. No load-balancing loss: it is
# computed per micro-batch, so micro-batch 2 and 4 would send other grads into the experts' output
# grads (1.1e-4 apart with aux_loss) for a reason that is not FP8's.
@test "issue23: FP8 with MoE: EP=2 gives one rank's first step, merges the amaxes of experts sharing a local index, and resumes exactly" {
  local -a moe=(--model tiny-mixtral --mock-data --vocab-size 97 --seq-length 16 --global-batch-size 4 --lr 3e-3
                --lr-decay-iters 4 --eval-iters 0 --peak-tflops 1 --bf16 --fp8-format hybrid
                --moe-router-load-balancing-type none)
  local losses='[.[] | select(.record=="step") | .lm_loss]'
  mt-train "${moe[@]}" --micro-batch-size 4 --train-iters 1 --save-final "$TMP/one.h5" >"$TMP/one.jsonl" 2>"$TMP/err" ||
    fail "$(cat "$TMP/err")"
  mpirun_n 2 mt-train "${moe[@]}" --micro-batch-size 2 --expert-model-parallel-size 2 --train-iters 1 \
    --save-final "$TMP/two.h5" >"$TMP/two.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  local one two
  one="$(jq -c -s "$losses" "$TMP/one.jsonl")"
  two="$(jq -c -s "$losses" "$TMP/two.jsonl")"
  jq -e -n --argjson one "$one" --argjson two "$two" \
    '($one | length) == 1 and ($two | length) == 1 and (($two[0] - $one[0]) | fabs) <= 1e-6 * $one[0]' >/dev/null ||
    fail "first step: EP=2 $two, one rank $one"
  local layer local_expert linear
  for layer in 0 1; do
    for local_expert in 0 1 2 3; do
      for linear in linear_fc1_gate linear_fc2; do
        local name="decoder.layers.$layer.mlp.experts" first second merged partner
        first="$(fp8_state "$name.$local_expert.$linear.weight" "$TMP/one.h5")"
        second="$(fp8_state "$name.$((local_expert + 4)).$linear.weight" "$TMP/one.h5")"
        merged="$(fp8_state "$name.$local_expert.$linear.weight" "$TMP/two.h5")"
        partner="$(fp8_state "$name.$((local_expert + 4)).$linear.weight" "$TMP/two.h5")"
        [[ "$merged" == "$partner" ]] || fail "$name.{$local_expert,$((local_expert + 4))}.$linear: $merged vs $partner"
        # Rows input, weight, output grad; columns scale, scale_inv, amax (history 1): the amaxes.
        jq -e -n "[$first] as \$a | [$second] as \$b | [$merged] as \$m | [2, 5, 8]
          | all(. as \$i | ([\$a[\$i], \$b[\$i]] | max) as \$want | ((\$m[\$i] - \$want) | fabs) <= 1e-6 * \$want)" \
          >/dev/null || fail "$name.$local_expert.$linear: EP=2 $merged; one rank: $first and $second"
      done
    done
  done
  # Resume: EP=2 saved at step 2 and resumed to 4 equals EP=2 straight, bit for bit.
  local -a ep2=(mpirun_n 2 mt-train "${moe[@]}" --micro-batch-size 2 --expert-model-parallel-size 2)
  "${ep2[@]}" --train-iters 4 >"$TMP/straight.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  "${ep2[@]}" --train-iters 2 --save "$TMP/ck" >/dev/null 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  mt-ckpt verify "$TMP/ck" >/dev/null || fail "the FP8 MoE checkpoint does not verify"
  "${ep2[@]}" --train-iters 4 --load "$TMP/ck" >"$TMP/resumed.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  local straight resumed
  straight="$(jq -c -s "$losses | .[2:]" "$TMP/straight.jsonl")"
  resumed="$(jq -c -s "$losses" "$TMP/resumed.jsonl")"
  [[ "$resumed" == "$straight" && "$resumed" != "[]" ]] || fail "EP=2 resumed $resumed, straight $straight"
}

# FP8 with multi-token prediction (Megatron-Core's MTP layer: eh_proj and the depth's layer each in
# an fp8_autocast of its own, two more scale updates per depth and micro-batch): the depth's linears
# have FP8 state (checkpointed, moved off 1), DP=2 at micro-batch 2 gives one rank's micro-batch 4
# numbers (LM and mtp_1 losses, within 1e-6 as the dense DP case), TP=2 + SP one rank's within the
# TP bound, a resume at step 2 gives the straight run's steps 3-4 bit for bit, and a weight's amax
# history shows the three updates a micro-batch.
@test "issue23: FP8 with MTP trains, equals one rank under DP=2 and TP=2, checkpoints the depth's FP8 state and resumes bit for bit" {
  local -a mtp=(--model tiny-llama --mock-data --vocab-size 97 --seq-length 32 --global-batch-size 8 --lr 3e-3
                --lr-decay-iters 4 --eval-iters 0 --peak-tflops 1 --bf16 --fp8-format hybrid --ffn-hidden-size 192
                --fp8-amax-history-len 16 --fp8-amax-compute-algo max --mtp-num-layers 1 --train-iters 4)
  local steps='[.[] | select(.record=="step") | [.lm_loss, .mtp_1_loss]]'
  local full='[.[] | select(.record=="step") | [.iteration, .lm_loss, .mtp_1_loss, .grad_norm]]'
  mt-train "${mtp[@]}" --micro-batch-size 4 >"$TMP/one4.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  mt-train "${mtp[@]}" --micro-batch-size 2 >"$TMP/one2.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  jq -e -s "$steps | length == 4 and all(.[]; .[1] > 0)" "$TMP/one2.jsonl" >/dev/null || fail "$(cat "$TMP/one2.jsonl")"
  # layout|ranks|one rank's run|bound
  local -a layouts=("|2|one4|1e-6" "--tensor-model-parallel-size 2 --sequence-parallel|2|one2|3e-4")
  for entry in "${layouts[@]}"; do
    local layout ranks one bound
    IFS='|' read -r layout ranks one bound <<<"$entry"
    # shellcheck disable=SC2086
    mpirun_n "$ranks" mt-train "${mtp[@]}" --micro-batch-size 2 $layout >"$TMP/many.jsonl" 2>"$TMP/err" ||
      fail "'$layout': $(cat "$TMP/err")"
    jq -e -n --argjson a "$(jq -c -s "$steps" "$TMP/many.jsonl")" --argjson b "$(jq -c -s "$steps" "$TMP/$one.jsonl")" \
      --argjson bound "$bound" '($a | length) == 4 and ([range(4) as $i | range(2) as $j |
        (($a[$i][$j] - $b[$i][$j]) | fabs) <= $bound * $b[$i][$j]] | all)' >/dev/null ||
      fail "'$layout': $(jq -c -s "$steps" "$TMP/many.jsonl") vs one rank's $(jq -c -s "$steps" "$TMP/$one.jsonl")"
  done
  mt-train "${mtp[@]}" --micro-batch-size 2 --exit-interval 2 --save "$TMP/ck" --save-interval 2 >"$TMP/first.jsonl" \
    2>"$TMP/err" || [[ $? -eq 75 ]] || fail "$(cat "$TMP/err")"
  mt-train "${mtp[@]}" --micro-batch-size 2 --load "$TMP/ck" >"$TMP/second.jsonl" 2>"$TMP/err" || fail "$(cat "$TMP/err")"
  [[ "$(jq -c -s "$full" "$TMP/first.jsonl" "$TMP/second.jsonl")" == "$(jq -c -s "$full" "$TMP/one2.jsonl")" ]] ||
    fail "resumed $(jq -c -s "$full" "$TMP/first.jsonl" "$TMP/second.jsonl"), straight $(jq -c -s "$full" "$TMP/one2.jsonl")"
  local name saved
  for name in mtp.layers.0.eh_proj.weight decoder.layers.2.mlp.linear_fc2.weight; do
    saved="$(h5dump -d "/fp8/$name" "$TMP/ck/iter_0000002/checkpoint.h5")" || fail "no FP8 state for $name"
    [[ "$saved" == *"(0,0): "* && "$saved" != *"(0,0): 1,"* ]] || fail "$name's saved input scale is still 1: $saved"
  done
  # Three forward-group updates a micro-batch (the decoder's, eh_proj's, the depth's layer's), 4
  # micro-batches a step: a decoder weight's amax, recorded at the step's first forward only, is 11
  # updates old in its history (newest first) when step 2 ends; one update a micro-batch would leave it 3.
  /usr/bin/python3 - "$TMP/ck/iter_0000002/checkpoint.h5" <<'PY' || fail "the weight's amax history"
import sys, h5py
state = h5py.File(sys.argv[1], "r")["fp8/decoder.layers.0.mlp.linear_fc2.weight"][()]
history = state[1][2:]  # row 1: the weight; columns scale, scale_inv, then the history newest first
assert [i for i, v in enumerate(history) if v != 0] == [11], list(history)
PY
}
