#!/usr/bin/env bats
# mt-train with multi-token prediction (issue 22): tiny-deepseek trains with an MTP depth (its MoE
# layer among the model's MoE layers), the MTP loss is in the step record (mtp_1_loss) and in
# Megatron's log line (" mtp_1 loss: "), --mtp-loss-scaling-factor 0 trains the model without MTP
# bit for bit (the flag is read, and the block leaves the main model alone), a checkpoint holds the
# depth under layout-independent names and resumes bit for bit, DP = 2 and TP = 2 with sequence
# parallelism under mpirun train one rank's numbers (MTP losses included), so do CP = 2 (the rolls
# cross the ranks' chunks) and CP = 2 x TP = 2, and PP = 2 (1F1B and
# interleaved, tied and untied output layer, and PP = 2 x TP = 2) with the block on the last stage,
# whose checkpoints resume bit for bit and load on one rank, and what MTP does not run with is
# refused by name. The block's numbers against Megatron-Core are
# tests/unit/model/test_mtp_megatron.cpp; TP over threads tests/unit/model/test_mtp.cpp.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

check() {
  jq -e -s "$1" "$TMP/out.jsonl" >/dev/null || fail "jq '$1' is false for: $(head -c 3000 "$TMP/out.jsonl") $(cat "$TMP/err.log")"
}

TINY=(--model tiny-llama --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
      --train-iters 4 --lr 3e-3 --lr-warmup-iters 1 --eval-iters 0 --peak-tflops 1 --log-interval 1)

# Per-step [lm loss, grad norm, mtp_1 loss, mtp_2 loss] of a record stream.
numbers() { jq -c -s '[.[] | select(.record=="step") | [.lm_loss, .grad_norm, .mtp_1_loss, .mtp_2_loss]]' "$1"; }

# Every number of $1 within 1e-5 (relative) of $2's.
same_numbers() {
  jq -e -n --argjson a "$(numbers "$1")" --argjson b "$(numbers "$2")" \
    '($a | length) == ($b | length) and ($a | length) > 0 and
     ([range($a | length) as $i | range($a[$i] | length) as $j |
       (($a[$i][$j] // 0) - ($b[$i][$j] // 0) | fabs) <= 1e-5 * (($b[$i][$j] // 0) | fabs) + 1e-7] | all)' >/dev/null \
    || fail "$(numbers "$1") against one rank's $(numbers "$2")"
}

@test "issue22: tiny-deepseek trains with --mtp-num-layers 1; mtp_1 loss in the step record and Megatron's log line" {
  head -c 60000 "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/text.txt"
  mt-train --model tiny-deepseek --mtp-num-layers 1 --byte-data "$TMP/text.txt" --micro-batch-size 4 \
    --global-batch-size 8 --train-iters 12 --lr 3e-3 --lr-warmup-iters 2 --eval-iters 0 --log-interval 6 \
    --peak-tflops 1 >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '.[0].model.mtp_num_layers == 1 and (.[0].model.mtp_loss_scaling_factor - 0.1 | fabs) < 1e-7'
  check '[.[] | select(.record=="step")] | length == 12'
  check '[.[] | select(.record=="step")] | (.[0].mtp_1_loss - .[-1].mtp_1_loss) > 0.5 and (.[0].lm_loss - .[-1].lm_loss) > 0.5'
  check '[.[] | select(.record=="step")] | all(has("mtp_2_loss") | not)'
  # The MTP depth is a MoE layer like the last decoder layer, after the decoder's (layer 2).
  check '[.[] | select(.record=="step")][0].moe_layers | map(.layer) == [1, 2]'
  grep -q " lm loss: [0-9.E+-]* | seq_load_balancing_loss: [0-9.E+-]* | mtp_1 loss: [0-9.E+-]* | loss scale:" "$TMP/err.log" \
    || fail "no mtp_1 loss in the log line: $(grep 'iteration' "$TMP/err.log" | head -2)"
}

@test "issue22: --mtp-loss-scaling-factor 0 trains the model without MTP bit for bit; 0.3 does not" {
  mt-train "${TINY[@]}" >"$TMP/plain.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  mt-train "${TINY[@]}" --mtp-num-layers 2 --mtp-loss-scaling-factor 0 >"$TMP/out.jsonl" 2>"$TMP/err.log" \
    || fail "$(cat "$TMP/err.log")"
  plain=$(jq -c -s '[.[] | select(.record=="step") | [.lm_loss, .grad_norm]]' "$TMP/plain.jsonl")
  zero=$(jq -c -s '[.[] | select(.record=="step") | [.lm_loss, .grad_norm]]' "$TMP/out.jsonl")
  [[ "$plain" == "$zero" ]] || fail "lambda 0: $zero, without MTP: $plain"
  check '[.[] | select(.record=="step")] | all(.mtp_1_loss > 0 and .mtp_2_loss > 0)'
  mt-train "${TINY[@]}" --mtp-num-layers 2 --mtp-loss-scaling-factor 0.3 >"$TMP/out.jsonl" 2>"$TMP/err.log" \
    || fail "$(cat "$TMP/err.log")"
  weighted=$(jq -c -s '[.[] | select(.record=="step") | [.lm_loss, .grad_norm]]' "$TMP/out.jsonl")
  [[ "$plain" != "$weighted" ]] || fail "lambda 0.3 trained the model without MTP: $weighted"
}

@test "issue22: a checkpoint holds the MTP depth under layout-independent names and resumes bit for bit" {
  mt-train "${TINY[@]}" --mtp-num-layers 1 >"$TMP/whole.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  mt-train "${TINY[@]}" --mtp-num-layers 1 --train-iters 4 --exit-interval 2 --save "$TMP/ckpt" --save-interval 2 \
    >"$TMP/first.jsonl" 2>"$TMP/err.log" || [[ $? -eq 75 ]] || fail "$(cat "$TMP/err.log")"
  mt-train "${TINY[@]}" --mtp-num-layers 1 --load "$TMP/ckpt" --save "$TMP/ckpt" >"$TMP/second.jsonl" \
    2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  whole=$(jq -c -s '[.[] | select(.record=="step") | [.iteration, .lm_loss, .mtp_1_loss, .grad_norm]]' "$TMP/whole.jsonl")
  resumed=$(jq -c -s '[.[] | select(.record=="step") | [.iteration, .lm_loss, .mtp_1_loss, .grad_norm]]' \
    "$TMP/first.jsonl" "$TMP/second.jsonl")
  [[ "$whole" == "$resumed" ]] || fail "resumed $resumed, whole $whole"
  mt-ckpt inspect "$TMP/ckpt" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  for name in mtp.layers.0.enorm.weight mtp.layers.0.hnorm.weight mtp.layers.0.eh_proj.weight \
      mtp.layers.0.final_layernorm.weight decoder.layers.2.self_attention.linear_q.weight; do
    grep -q "\"model/$name\"" "$TMP/out.jsonl" || fail "$name not in the checkpoint: $(head -c 2000 "$TMP/out.jsonl")"
  done
  run mt-ckpt export --format hf "$TMP/ckpt" "$TMP/hf"
  [[ $status -eq 2 ]] || fail "status $status: $output"
  [[ "$output" == *"--mtp-num-layers has no Hugging Face export"* ]] || fail "$output"
}

@test "issue22: DP=2 and TP=2 with --sequence-parallel under mpirun train one rank's MTP numbers" {
  mt-train "${TINY[@]}" --mtp-num-layers 2 >"$TMP/one.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  for layout in "" "--tensor-model-parallel-size 2 --sequence-parallel"; do
    # shellcheck disable=SC2086
    mpirun_n 2 mt-train "${TINY[@]}" --mtp-num-layers 2 $layout >"$TMP/two.jsonl" 2>"$TMP/err.log" \
      || fail "'$layout': $(cat "$TMP/err.log")"
    same_numbers "$TMP/two.jsonl" "$TMP/one.jsonl"
  done
}

@test "issue22: CP=2 and CP=2 x TP=2 with --sequence-parallel roll the MTP tokens across the CP ranks and train one rank's numbers" {
  # Two depths: the second rolls what the first rolled across the ranks' chunks. Documents of 6
  # tokens with their EODs masked out of the loss, so the ranks' chunks count different tokens, and
  # positions reset per document, so a rolled position id is not its neighbour's plus one.
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/a" h5 100 0 counting:600:6:1
  cp=(--model tiny-llama --data-path "$TMP/a" --split 90,5,5 --data-cache-path "$TMP/cache" --seq-length 16
      --micro-batch-size 2 --global-batch-size 8 --train-iters 4 --lr 3e-3 --lr-warmup-iters 1 --eval-iters 0
      --peak-tflops 1 --log-interval 1 --mtp-num-layers 2 --eod-mask-loss --reset-attention-mask --reset-position-ids)
  mt-train "${cp[@]}" >"$TMP/one.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  for layout in "2 " "4 --tensor-model-parallel-size 2 --sequence-parallel"; do
    # shellcheck disable=SC2086
    mpirun_n ${layout%% *} mt-train "${cp[@]}" --context-parallel-size 2 ${layout#* } >"$TMP/cp.jsonl" \
      2>"$TMP/err.log" || fail "'$layout': $(cat "$TMP/err.log")"
    same_numbers "$TMP/cp.jsonl" "$TMP/one.jsonl"
  done
}

# 4 layers, so that PP = 2 with 2 virtual stages has a layer per chunk.
PIPE=("${TINY[@]}" --num-layers 4 --mtp-num-layers 2)

@test "issue22: PP=2 (1F1B, 2 virtual stages, tied output layer) and PP=2 x TP=2 with SP train one rank's MTP numbers" {
  mt-train "${PIPE[@]}" >"$TMP/one.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  for layout in "2 " "2 --num-virtual-stages-per-pipeline-rank 2" "4 --tensor-model-parallel-size 2 --sequence-parallel"; do
    # shellcheck disable=SC2086
    mpirun_n ${layout%% *} mt-train "${PIPE[@]}" --pipeline-model-parallel-size 2 ${layout#* } >"$TMP/pp.jsonl" \
      2>"$TMP/err.log" || fail "'$layout': $(cat "$TMP/err.log")"
    same_numbers "$TMP/pp.jsonl" "$TMP/one.jsonl"
  done
  # A tied output layer (tiny-gpt on rope): the last stage's one copy of the word table serves both.
  tied=(--model tiny-gpt --position-embedding-type rope --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2
        --global-batch-size 8 --train-iters 3 --lr 3e-3 --eval-iters 0 --peak-tflops 1 --mtp-num-layers 1)
  mt-train "${tied[@]}" >"$TMP/one.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  mpirun_n 2 mt-train "${tied[@]}" --pipeline-model-parallel-size 2 >"$TMP/pp.jsonl" 2>"$TMP/err.log" \
    || fail "tied: $(cat "$TMP/err.log")"
  same_numbers "$TMP/pp.jsonl" "$TMP/one.jsonl"
}

# DeepSeek-V3-shaped (MLA, a dense then a MoE layer with the expert bias, two MoE MTP depths): one
# decoder layer per stage under PP = 2, the depths and their expert biases on the last.
DEEP=(--model tiny-deepseek --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
      --train-iters 4 --lr 3e-3 --lr-warmup-iters 1 --eval-iters 0 --peak-tflops 1 --mtp-num-layers 2)

@test "issue22: under PP=2 a DeepSeek-shaped MTP checkpoint resumes bit for bit, holds each tensor once (MTP expert biases too), and loads on one rank" {
  mpirun_n 2 mt-train "${DEEP[@]}" --pipeline-model-parallel-size 2 >"$TMP/whole.jsonl" 2>"$TMP/err.log" \
    || fail "$(cat "$TMP/err.log")"
  mt-train "${DEEP[@]}" >"$TMP/one.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  same_numbers "$TMP/whole.jsonl" "$TMP/one.jsonl"
  mpirun_n 2 mt-train "${DEEP[@]}" --pipeline-model-parallel-size 2 --exit-interval 2 --save "$TMP/ckpt" \
    --save-interval 2 >"$TMP/first.jsonl" 2>"$TMP/err.log" || [[ $? -eq 75 ]] || fail "$(cat "$TMP/err.log")"
  mpirun_n 2 mt-train "${DEEP[@]}" --pipeline-model-parallel-size 2 --load "$TMP/ckpt" >"$TMP/second.jsonl" \
    2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  steps='[.[] | select(.record=="step") | [.iteration, .lm_loss, .mtp_1_loss, .mtp_2_loss, .grad_norm]]'
  whole=$(jq -c -s "$steps" "$TMP/whole.jsonl")
  resumed=$(jq -c -s "$steps" "$TMP/first.jsonl" "$TMP/second.jsonl")
  [[ "$whole" == "$resumed" ]] || fail "resumed $resumed, whole $whole"
  mt-ckpt verify "$TMP/ckpt" >/dev/null || fail "the PP=2 checkpoint does not verify"
  # The whole model's tensors once: one word table (the last stage's copy is not written), the
  # untied output layer, both depths, the expert bias of every MoE layer (the depths' too).
  /usr/bin/python3 - "$TMP/ckpt/iter_0000002/checkpoint.h5" <<'PY' || fail "the checkpoint's tensors"
import sys, h5py
names = set(h5py.File(sys.argv[1], "r")["model"].keys())
assert "embedding.word_embeddings.weight" in names and "output_layer.weight" in names, sorted(names)
assert {n.split(".")[2] for n in names if n.startswith("mtp.layers.")} == {"0", "1"}, sorted(names)
assert {n.split(".")[2] for n in names if n.startswith("decoder.layers.")} == {"0", "1", "2", "3"}, sorted(names)
assert {n for n in names if n.endswith("expert_bias")} == {"decoder.layers.%d.mlp.router.expert_bias" % l for l in (1, 2, 3)}, sorted(names)
PY
  # Loaded on one rank, the next steps are PP=2's within the fp32 bound.
  mt-train "${DEEP[@]}" --load "$TMP/ckpt" >"$TMP/one.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  same_numbers "$TMP/one.jsonl" "$TMP/second.jsonl"
}

@test "issue22: MTP refuses PP with learned positions by name, and a NaN --mtp-loss-scaling-factor" {
  base=(mt-train --model tiny-llama --mtp-num-layers 1 --mock-data --vocab-size 97 --seq-length 16 --train-iters 1)
  run mt-train --model tiny-gpt --mtp-num-layers 1 --mock-data --train-iters 1 --dry-run --world-size 2 \
    --pipeline-model-parallel-size 2
  [[ $status -eq 2 ]] || fail "status $status: $output"
  [[ "$output" == *"--mtp-num-layers with --pipeline-model-parallel-size 2 and --position-embedding-type learned_absolute: not supported yet"* ]] \
    || fail "$output"
  run "${base[@]}" --mtp-loss-scaling-factor nan
  [[ $status -eq 2 ]] || fail "status $status: $output"
  [[ "$output" == *"--mtp-loss-scaling-factor"* ]] || fail "$output"
}
