#!/usr/bin/env bats
# mt-train end to end: records, log lines, checkpoints, and one check per accepted flag that
# fails if the flag were ignored.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

# Tiny GPT on mock data; extra flags appended. JSONL in $TMP/out.jsonl, log in $TMP/err.log.
train_tiny() {
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --train-iters 2 --eval-iters 0 --peak-tflops 1 "$@" >"$TMP/out.jsonl" 2>"$TMP/err.log"
}

# jq over the JSONL records as one array; fails the test with the records when false.
check() {
  jq -e -s "$1" "$TMP/out.jsonl" >/dev/null || fail "jq '$1' is false for: $(cat "$TMP/out.jsonl" "$TMP/err.log")"
}

steps() { jq -c -s '[.[] | select(.record=="step") | '"$1"']' "$TMP/out.jsonl"; }

@test "trains tiny-gpt on the bytes of a text: run, step, eval and summary records; Megatron log lines" {
  head -c 200000 "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/text.txt"
  run_split mt-train --model tiny-gpt --byte-data "$TMP/text.txt" --micro-batch-size 4 --global-batch-size 8 \
    --train-iters 30 --lr 3e-3 --lr-warmup-iters 3 --lr-decay-style cosine --eval-interval 15 --eval-iters 2 \
    --log-interval 10 --peak-tflops 1
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" >"$TMP/out.jsonl"
  check '.[0].record == "run" and .[0].model.vocab_size == 256 and .[0].flops_convention == "megatron" and .[0].train.flops_convention == "megatron"'
  check '[.[] | select(.record=="step")] | length == 30'
  check '[.[] | select(.record=="eval") | .iteration] == [15, 30]'
  check '.[-1].record == "summary" and .[-1].iterations == 30'
  check '[.[] | select(.record=="step")] | (.[0].lm_loss - .[-1].lm_loss) > 1.0'
  check '[.[] | select(.record=="step")][0] | keys == (["consumed_samples","global_batch_size","grad_norm","iteration","lm_loss","loss_scale","lr","mem_activations_bytes","mem_grads_bytes","mem_optim_bytes","mem_weights_bytes","mfu","nan_iters","record","skipped_iters","step_ms","tflops_per_device","tokens_per_s","mem_peak_bytes","mem_peak_rank","comm_wait_ms","comm_share","compute_ms","pipeline_ms"] | sort)'
  [[ "$err" == *" iteration       10/      30 | consumed samples:"* ]] || fail "no Megatron log line: $err"
  [[ "$err" == *"validation loss at iteration 30"* ]] || fail "no validation line"
}

@test "--device cpu runs the CPU table (the same numbers as the default); a GPU model gets the --peak-device hint" {
  train_tiny
  steps '.lm_loss' >"$TMP/default"
  train_tiny --device cpu
  [[ "$(steps '.lm_loss')" == "$(cat "$TMP/default")" ]] || fail "--device cpu changed the numbers"
  check '.[0].device == "cpu" and (.[0] | has("gpu") | not)'
  run train_tiny --device h100
  [[ $status -eq 2 ]] || fail "--device h100: status $status"
  grep -q -- "--peak-device h100" "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
}

@test "--distributed-timeout-minutes: out of range refused by name; on the CPU it says it has no NCCL wait to bound" {
  run train_tiny --distributed-timeout-minutes 0
  [[ $status -eq 2 ]] || fail "--distributed-timeout-minutes 0: status $status"
  grep -q -- "--distributed-timeout-minutes: must be in \[1, 10080\]" "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  train_tiny --distributed-timeout-minutes 5
  grep -q -- "--distributed-timeout-minutes bounds NCCL's waits" "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
}

@test "issue23: --device cuda without a GPU (or without the CUDA backend) exits 1 with one line saying which" {
  if [[ -e /dev/nvidia0 ]]; then skip "this machine has a GPU: the refusal is not reachable"; fi
  run_split mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 \
    --global-batch-size 4 --train-iters 2 --eval-iters 0 --device cuda
  [[ $status -eq 1 ]] || fail "status $status: $err"
  [[ -z "$out" ]] || fail "a refused run wrote records: $out"
  if mt-train --version | grep -q 'cuda=on'; then
    [[ "$err" =~ ^"mt-train: error: --device cuda: no CUDA device found ("[^$'\n']+")"$ ]] || fail "$err"
  else
    [[ "$err" == "mt-train: error: --device cuda: this build has no CUDA backend (configure with -DMT_CUDA=ON)" ]] || fail "$err"
  fi
}

@test "--save-init and --save-final write HDF5 checkpoints of global tensors" {
  train_tiny --save-init "$TMP/init.h5" --save-final "$TMP/final.h5"
  check '[.[] | select(.record=="ckpt") | .path] == ["'"$TMP"'/init.h5", "'"$TMP"'/final.h5"]'
  run h5ls -r "$TMP/final.h5"
  assert_success
  assert_output --partial "/model/embedding.word_embeddings.weight Dataset {128, 64}"
  assert_output --partial "/model/decoder.layers.1.mlp.linear_fc1.weight Dataset {256, 64}"
  if cmp -s "$TMP/init.h5" "$TMP/final.h5"; then fail "--save-final wrote the initial parameters"; fi
  [[ "$(ls "$TMP")" == $'err.log\nfinal.h5\ninit.h5\nout.jsonl' ]] || fail "files other than the outputs: $(ls "$TMP")"
}

@test "model flags reach the model (run record)" {
  train_tiny --num-layers 3 --hidden-size 48 --ffn-hidden-size 40 --num-attention-heads 6 --kv-channels 4 \
    --max-position-embeddings 24 --make-vocab-size-divisible-by 64 --train-iters 1
  check '.[0].model | .num_layers == 3 and .hidden_size == 48 and .ffn_hidden_size == 40 and .num_attention_heads == 6 and .kv_channels == 4 and .max_position_embeddings == 24 and .padded_vocab_size == 128 and .vocab_size == 97 and .seq_length == 16'
  train_tiny --normalization RMSNorm --position-embedding-type rope --swiglu --untie-embeddings-and-output-weights \
    --disable-bias-linear --group-query-attention --num-query-groups 2 --rotary-base 500 --train-iters 1
  check '.[0].model | .normalization == "RMSNorm" and .position_embedding_type == "rope" and .swiglu and .untie_embeddings_and_output_weights and (.add_bias_linear | not) and .num_query_groups == 2 and .rotary_base == 500'
}

@test "numeric model flags change the numbers" {
  train_tiny --train-iters 1; base="$(steps .lm_loss)"
  for flags in "--init-method-std 0.3" "--norm-epsilon 0.5" "--hidden-dropout 0.3" "--seed 99" "--seq-length 12"; do
    # shellcheck disable=SC2086
    train_tiny --train-iters 1 $flags
    [[ "$(steps .lm_loss)" != "$base" ]] || fail "$flags did not change the loss"
  done
  train_tiny --train-iters 1 --position-embedding-type rope; rope="$(steps .lm_loss)"
  train_tiny --train-iters 1 --position-embedding-type rope --rotary-base 7; [[ "$(steps .lm_loss)" != "$rope" ]] || fail "--rotary-base ignored"
}

@test "optimizer flags change the trajectory" {
  train_tiny --train-iters 3 --lr 0.01; base="$(steps .lm_loss)"
  for flags in "--weight-decay 0.9" "--adam-beta1 0.5" "--adam-beta2 0.5" "--adam-eps 0.1" "--clip-grad 0.001" \
      "--lr 0.02" "--bf16" "--fp16 --loss-scale 1024"; do
    # shellcheck disable=SC2086
    train_tiny --train-iters 3 --lr 0.01 $flags
    [[ "$(steps .lm_loss)" != "$base" ]] || fail "$flags did not change the losses: $base"
  done
}

@test "learning-rate schedule flags follow Megatron (in samples, iteration 1 at 0 during warm-up)" {
  train_tiny --train-iters 4 --lr 0.1 --lr-warmup-iters 2 --lr-decay-style constant
  [[ "$(steps .lr)" == "[0,0.05,0.1,0.1]" ]] || fail "warmup: $(steps .lr)"
  train_tiny --train-iters 3 --lr 0.1 --min-lr 0.01 --lr-decay-style linear
  check '[.[] | select(.record=="step") | .lr] as $lr | ($lr | length) == 3 and ([$lr, [0.1, 0.07, 0.04]] | transpose | all(.[0] - .[1] | fabs < 1e-12))' 
  train_tiny --train-iters 3 --lr 0.1 --lr-warmup-samples 4 --lr-decay-style constant
  [[ "$(steps .lr)" == "[0,0.1,0.1]" ]] || fail "warmup samples: $(steps .lr)"
  train_tiny --train-iters 5 --lr 0.1 --min-lr 0 --lr-decay-iters 2 --lr-decay-style linear
  [[ "$(steps .lr)" == "[0.1,0.05,0,0,0]" ]] || fail "decay iters: $(steps .lr)"
  train_tiny --train-iters 5 --lr 0.1 --min-lr 0 --lr-decay-samples 8 --lr-decay-style cosine
  check '[.[] | select(.record=="step") | .lr] | .[0] == 0.1 and (.[1] - 0.05 | fabs) < 1e-12 and .[2] == 0'
  train_tiny --train-iters 4 --lr 0.1 --lr-warmup-fraction 0.5 --lr-decay-style linear
  [[ "$(steps .lr)" == "[0,0.05,0.1,0.05]" ]] || fail "warmup fraction: $(steps .lr)"
}

@test "batch flags: global batch, train-samples, micro-batch" {
  train_tiny --global-batch-size 8 --micro-batch-size 2 --train-iters 2
  [[ "$(steps .consumed_samples)" == "[8,16]" ]] || fail "$(steps .consumed_samples)"
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --train-samples 12 --eval-iters 0 --peak-tflops 1 >"$TMP/out.jsonl" 2>"$TMP/err.log"
  run_split train_tiny --train-samples 12
  [[ $status -eq 2 && "$(cat "$TMP/err.log")" == *"--train-iters/--train-samples"* ]] || fail "both given must be refused: $status"
  train_tiny --micro-batch-size 4 --train-iters 1; a="$(steps .lm_loss)"
  train_tiny --micro-batch-size 1 --train-iters 1; b="$(steps .lm_loss)"
  jq -n -e "($a[0] - $b[0]) | fabs < 1e-5" >/dev/null || fail "micro-batching changed the loss: $a $b"
}

@test "--train-samples sets the number of iterations" {
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --train-samples 12 --eval-iters 0 --peak-tflops 1 >"$TMP/out.jsonl" 2>"$TMP/err.log"
  [[ "$(steps .iteration)" == "[1,2,3]" ]] || fail "$(steps .iteration)"
}

@test "fp16 loss scaling flags" {
  train_tiny --fp16 --initial-loss-scale 1024 --loss-scale-window 2 --train-iters 3
  [[ "$(steps .loss_scale)" == "[1024,1024,2048]" ]] || fail "window: $(steps .loss_scale)"
  train_tiny --fp16 --initial-loss-scale 1099511627776 --hysteresis 1 --train-iters 3
  check '[.[] | select(.record=="step")] | .[0].skipped_iters == 1 and .[1].loss_scale < .[0].loss_scale'
  train_tiny --fp16 --initial-loss-scale 1099511627776 --hysteresis 1 --min-loss-scale 1099511627776 --train-iters 3
  [[ "$(steps .loss_scale)" == "[1099511627776,1099511627776,1099511627776]" ]] || fail "min scale: $(steps .loss_scale)"
  train_tiny --fp16 --initial-loss-scale 1099511627776 --hysteresis 3 --train-iters 3
  [[ "$(steps .loss_scale)" == "[1099511627776,1099511627776,1099511627776]" ]] || fail "hysteresis 3: $(steps .loss_scale)"
  run_split train_tiny --loss-scale 8
  [[ $status -eq 2 && "$(cat "$TMP/err.log")" == *"--loss-scale: applies to --fp16 only"* ]] || fail "--loss-scale without --fp16 must be refused"
}

@test "recompute flags lower the activation memory, never the numbers" {
  train_tiny --num-layers 4; none_loss="$(steps .lm_loss)"; none="$(steps .mem_activations_bytes)"
  train_tiny --num-layers 4 --recompute-granularity selective; sel="$(steps .mem_activations_bytes)"
  [[ "$(steps .lm_loss)" == "$none_loss" ]] || fail "selective changed the loss"
  train_tiny --num-layers 4 --recompute-granularity full; full="$(steps .mem_activations_bytes)"
  [[ "$(steps .lm_loss)" == "$none_loss" ]] || fail "full changed the loss"
  train_tiny --num-layers 4 --recompute-granularity full --recompute-num-layers 2; chunk="$(steps .mem_activations_bytes)"
  train_tiny --num-layers 4 --recompute-granularity full --recompute-method block --recompute-num-layers 2; block="$(steps .mem_activations_bytes)"
  jq -n -e "$full[0] < $sel[0] and $sel[0] < $none[0] and $full[0] < $chunk[0] and $block[0] > $full[0] and $block[0] < $none[0]" >/dev/null \
    || fail "memory order: none $none selective $sel full $full chunk $chunk block $block"
}

@test "evaluation and logging intervals" {
  train_tiny --train-iters 4 --eval-interval 2 --eval-iters 1 --log-interval 2
  check '[.[] | select(.record=="eval") | .iteration] == [2, 4]'
  check '[.[] | select(.record=="eval")] | all(.ppl == (.lm_loss | exp))'
  [[ "$(grep -c '^ iteration ' "$TMP/err.log")" -eq 3 ]] || fail "log lines: $(cat "$TMP/err.log")"  # 1, 2, 4
}

@test "issue27: --log-params-norm, --log-num-zeros-in-grad and --timing-log-level in the log and the step records" {
  train_tiny --train-iters 3 --log-interval 1
  check '[.[] | select(.record=="step")] | all(has("params_norm") or has("num_zeros") or has("timers") | not)'
  ! grep -q "time across ranks" "$TMP/err.log" || fail "timers at level 0: $(cat "$TMP/err.log")"
  train_tiny --train-iters 3 --log-interval 1 --log-params-norm --log-num-zeros-in-grad --timing-log-level 2
  check '[.[] | select(.record=="step")] | all(.params_norm > 0 and .num_zeros > 0 and (.num_zeros | floor) == .num_zeros)'
  check '[.[] | select(.record=="step")][0].timers | keys_unsorted | .[0:4] == ["forward-backward","forward-compute","backward-compute","batch-generator"]'
  check '[.[] | select(.record=="step")] | all(.timers.optimizer.max_ms > 0 and .timers.optimizer.min_ms == .timers.optimizer.max_ms and .timers.optimizer.rank_ms == [.timers.optimizer.max_ms])'
  check '[.[] | select(.record=="step")] | all(.timers | has("forward-recv") | not)'
  grep -q "| grad norm: [0-9.]* | num zeros: [0-9]*\.0 | params norm: [0-9.]* | number of skipped" "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  [[ "$(grep -c '^(min, max) time across ranks (ms):$' "$TMP/err.log")" -eq 3 ]] || fail "$(cat "$TMP/err.log")"
  grep -q '^    forward-backward \.\.*: ([0-9.]*, [0-9.]*)$' "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  train_tiny --timing-log-level 1 --timing-log-option max --no-barrier-with-level-1-timing
  grep -q '^max time across ranks (ms):$' "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  ! grep -q 'forward-compute' "$TMP/err.log" || fail "level 2 at level 1"
  check '[.[] | select(.record=="step")][0].timers | has("optimizer-inner-step") and (has("forward-compute") | not)'
  train_tiny --timing-log-level 1 --timing-log-option all
  grep -q '^times across ranks (ms):$' "$TMP/err.log" && grep -q '^     rank  0: [0-9.]*$' "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  for args in "--timing-log-level 3" "--timing-log-option median"; do
    # shellcheck disable=SC2086
    run_split mt-train --model tiny-gpt --mock-data --train-iters 1 $args
    [[ $status -eq 2 && "$(line_count "$err")" -eq 1 && "$err" == "mt-train: error: --timing-log-"* ]] || fail "'$args': $status $err"
  done
}

@test "MFU from --peak-tflops; precision and flops convention in the run record" {
  train_tiny --peak-tflops 0.5 --bf16 --flops-convention 6N
  check '.[0].peak_tflops == 0.5 and .[0].precision == "bf16" and .[0].peak_source == "--peak-tflops"'
  check '.[0].flops_convention == "6N" and (.[0] | has("gemm_tflops") | not)'
  check '[.[] | select(.record=="step")] | all((.mfu - .tflops_per_device / 0.5) | fabs < 1e-9)'
}

@test "issue15: without --peak-tflops MFU divides by the FMA-probe peak of the cores used, the GEMM rate reported apart" {
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --train-iters 1 --eval-iters 0 >"$TMP/out.jsonl" 2>/dev/null
  check '.[0] as $r | $r.peak_tflops > 0 and ($r.peak_source | startswith("FMA probe: ") and endswith(" x \($r.threads_per_rank) cores"))'
  # The peak is the probe's: its best core's rate times the cores a rank uses.
  check '.[0] as $r | $r.peak_cores == $r.threads_per_rank and (($r.peak_tflops / ($r.peak_core_tflops * $r.peak_cores) - 1) | fabs < 1e-12)'
  # The GEMM rate is an efficiency against the peak, not the peak MFU divides by.
  check '.[0].gemm_tflops > 0 and ((.[0].gemm_efficiency - .[0].gemm_tflops / .[0].peak_tflops) | fabs < 1e-9)'
  check '. as $r | [$r[] | select(.record=="step")] | all((.mfu - .tflops_per_device / $r[0].peak_tflops) | fabs < 1e-9)'
}

@test "issue11 case 6: a NaN/Inf loss or grad stops the run naming the iteration; --no-check-for-nan-in-loss-and-grad skips and counts" {
  # An absurd LR blows the parameters up after the first step.
  run_split train_tiny --lr 1e38 --lr-decay-style constant --train-iters 3
  [[ $status -eq 1 && "$(tail -n 1 "$TMP/err.log")" == "mt-train: error: iteration 2: the loss is NaN (--no-check-for-nan-in-loss-and-grad skips and counts such steps)" ]] \
    || fail "$status $(cat "$TMP/err.log")"
  run_split train_tiny --lr 1e38 --lr-decay-style constant --train-iters 3 --check-for-nan-in-loss-and-grad
  [[ $status -eq 1 ]] || fail "the explicit check did not stop the run: $status"
  train_tiny --lr 1e38 --lr-decay-style constant --train-iters 3 --no-check-for-nan-in-loss-and-grad
  check '[.[] | select(.record=="step") | [.nan_iters, .skipped_iters, (.lm_loss == null)]] == [[0, 0, false], [1, 1, true], [2, 2, true]]'
  # fp16 overflow is the loss scaler's: skipped and counted, never fatal, not a nan iteration.
  train_tiny --fp16 --initial-loss-scale 1099511627776 --hysteresis 1 --train-iters 3
  check '[.[] | select(.record=="step")] | .[0].skipped_iters == 1 and .[-1].nan_iters == 0'
}

@test "--calculate-per-token-loss is accepted and gives the per-token mean" {
  # Mock data counts every token, so both normalisations agree (token data with masks: below).
  train_tiny --calculate-per-token-loss; a="$(steps .lm_loss)"
  train_tiny; b="$(steps .lm_loss)"
  jq -n -e "($a[0] - $b[0]) | fabs < 1e-6" >/dev/null || fail "$a vs $b"
}

@test "output formats: table, csv and json carry no run record" {
  train_tiny --format table
  grep -q '^# step' "$TMP/out.jsonl" || fail "no table header"
  train_tiny --format csv
  head -1 "$TMP/out.jsonl" | grep -q '^record,iteration,consumed_samples,lm_loss' || fail "csv header"
  train_tiny --json
  check '.[0] | map(.record) == ["step", "memory", "step", "memory", "summary"]'
}

@test "bad input: usage errors name the flag, nothing on stdout" {
  for args in "--model nope --mock-data --train-iters 1" \
              "--model tiny-gpt --train-iters 1" \
              "--model tiny-gpt --mock-data --train-iters 1 --tensor-model-parallel-size 2" \
              "--model tiny-gpt --mock-data --train-iters 1 --attention-dropout 1" \
              "--model tiny-gpt --mock-data --train-iters 1 --bf16 --fp16" \
              "--model tiny-gpt --mock-data --train-iters 1 --normalization BatchNorm" \
              "--model tiny-gpt --mock-data --train-iters 1 --num-attention-heads 5" \
              "--model tiny-gpt --mock-data --train-iters 1 --num-query-groups 2" \
              "--model tiny-gpt --mock-data --train-iters 1 --data-path /tmp/x" \
              "--model tiny-gpt --mock-data --train-iters 1 --recompute-method block"; do
    # shellcheck disable=SC2086
    run_split mt-train $args
    [[ $status -eq 2 ]] || fail "'$args' exited $status: $err"
    [[ -z "$out" ]] || fail "'$args' printed on stdout"
    [[ "$(line_count "$err")" -eq 1 && "$err" == "mt-train: error: "* ]] || fail "'$args': $err"
  done
  run_split mt-train --model tiny-gpt --byte-data /nonexistent --train-iters 1
  [[ $status -eq 1 && "$err" == "mt-train: error: --byte-data /nonexistent: no such file" ]] || fail "$status $err"
  run_split mt-train --model llama3-70b --mock-data --train-iters 1 --peak-tflops 1
  [[ $status -eq 1 && "$err" == *"needs"*"GiB"*"available"* ]] || fail "70B on a laptop: $status $err"
}

# ---- token datasets through a sample index (mt-shard's loader) ----

# Token datasets written by an independent numpy writer: $TMP/a (HDF5, EOD 0, short documents so
# every sample crosses several), $TMP/b (.bin/.idx, no EOD id recorded).
make_token_data() {
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/a" h5 100 0 counting:600:6:1
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/b" bin 100 0 counting:300:10:2
}

# Tiny GPT on token data; extra flags appended. JSONL in $TMP/out.jsonl, log in $TMP/err.log.
train_data() {
  mt-train --model tiny-gpt --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 2 \
    --eval-iters 0 --peak-tflops 1 --data-cache-path "$TMP/cache" "$@" >"$TMP/out.jsonl" 2>"$TMP/err.log"
}

@test "trains on a token dataset through a sample index: loss drops, the index is built once, then reused" {
  make_token_data
  run_split mt-train --model tiny-gpt --data-path "$TMP/a" --split 90,5,5 --seq-length 16 --micro-batch-size 4 \
    --global-batch-size 8 --train-iters 30 --lr 3e-3 --eval-interval 15 --eval-iters 2 --peak-tflops 1 \
    --data-cache-path "$TMP/cache"
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" >"$TMP/first.jsonl"
  cp "$TMP/first.jsonl" "$TMP/out.jsonl"
  check '.[0].record == "run" and .[0].model.vocab_size == 100 and (.[0].data | contains("sample index '"$TMP"'/cache/"))'
  check '[.[] | select(.record=="step")] | length == 30 and (.[0].lm_loss - .[-1].lm_loss) > 1.0'
  check '[.[] | select(.record=="eval") | .iteration] == [15, 30]'
  check '.[-1].record == "summary" and .[-1].consumed_samples == 240'
  [[ "$err" == *"mt-train: built sample index $TMP/cache/"*"-mt-sample-index.h5"* ]] || fail "$err"
  [[ "$(ls "$TMP/cache" | wc -l)" -eq 1 ]] || fail "$(ls "$TMP/cache")"
  # mt-shard build with the same parameters names the same file and finds it up to date.
  mt-shard build --data-path "$TMP/a" --split 90,5,5 --seq-length 16 --train-iters 30 --global-batch-size 8 \
    --eval-interval 15 --eval-iters 2 --data-cache-path "$TMP/cache" --json >"$TMP/shard.json" 2>/dev/null
  jq -e '.[0].built == false' "$TMP/shard.json" >/dev/null || fail "mt-shard rebuilt: $(cat "$TMP/shard.json")"
  run_split mt-train --model tiny-gpt --data-path "$TMP/a" --split 90,5,5 --seq-length 16 --micro-batch-size 4 \
    --global-batch-size 8 --train-iters 30 --lr 3e-3 --eval-interval 15 --eval-iters 2 --peak-tflops 1 \
    --data-cache-path "$TMP/cache"
  [[ "$err" == *"mt-train: using sample index $TMP/cache/"* ]] || fail "$err"
  [[ "$(printf '%s\n' "$out" | jq -c -s '[.[] | select(.record=="step") | .lm_loss]')" == \
     "$(jq -c -s '[.[] | select(.record=="step") | .lm_loss]' "$TMP/first.jsonl")" ]] || fail "reuse changed the run"
}

@test "data flags select the data: --data-path blends, --split, per-split paths" {
  make_token_data
  train_data --data-path "$TMP/a" --vocab-size 100; base="$(steps .lm_loss)"
  train_data --data-path "$TMP/a" --vocab-size 100 --split 50,25,25
  [[ "$(steps .lm_loss)" != "$base" ]] || fail "--split ignored"
  train_data --data-path 0.5 "$TMP/a" 0.5 "$TMP/b" --vocab-size 100
  [[ "$(steps .lm_loss)" != "$base" ]] || fail "blend ignored"
  train_data --train-data-path "$TMP/b" --vocab-size 100
  [[ "$(steps .lm_loss)" != "$base" ]] || fail "--train-data-path ignored"
  train_data --train-data-path "$TMP/a" --eval-iters 1 --eval-interval 1
  check '[.[] | select(.record=="eval")] | length == 0'  # no validation split: no evaluation, as Megatron
  train_data --train-data-path "$TMP/a" --valid-data-path "$TMP/b" --test-data-path "$TMP/b" --eval-iters 1 --eval-interval 1
  check '[.[] | select(.record=="eval") | .iteration] == [1, 2]'
  [[ "$(ls "$TMP/cache" | wc -l)" -eq 6 ]] || fail "one index per parameter set: $(ls "$TMP/cache")"
}

@test "--eod-mask-loss, --reset-position-ids and --reset-attention-mask change the loss" {
  make_token_data
  train_data --data-path "$TMP/a" --train-iters 1; base="$(steps .lm_loss)"
  for flag in --eod-mask-loss --reset-position-ids --reset-attention-mask; do
    train_data --data-path "$TMP/a" --train-iters 1 "$flag"
    [[ "$(steps .lm_loss)" != "$base" ]] || fail "$flag did not change the loss"
  done
  train_data --data-path "$TMP/a" --train-iters 1 --reset-position-ids; pos="$(steps .lm_loss)"
  train_data --data-path "$TMP/a" --train-iters 1 --reset-position-ids --reset-attention-mask
  [[ "$(steps .lm_loss)" != "$pos" ]] || fail "--reset-attention-mask ignored next to --reset-position-ids"
  run_split train_data --data-path "$TMP/b" --vocab-size 100 --eod-mask-loss
  [[ $status -eq 2 && "$(cat "$TMP/err.log")" == "mt-train: error: --eod-mask-loss: $TMP/b.bin records no end-of-document id"* ]] || fail "$status $(cat "$TMP/err.log")"
}

@test "--calculate-per-token-loss differs from the per-micro-batch default when masks vary" {
  make_token_data
  train_data --data-path "$TMP/a" --eod-mask-loss --train-iters 3 --micro-batch-size 1; a="$(steps .lm_loss)"
  train_data --data-path "$TMP/a" --eod-mask-loss --train-iters 3 --micro-batch-size 1 --calculate-per-token-loss; b="$(steps .lm_loss)"
  # the same reported loss at iteration 1 (Megatron reports sum / tokens either way), other gradients after
  jq -n -e "($a[0] - $b[0] | fabs) < 1e-9 and ($a[2] - $b[2] | fabs) > 1e-6" >/dev/null || fail "$a vs $b"
}

@test "token data: a stale index is refused, data flags without token data are usage errors" {
  make_token_data
  train_data --data-path "$TMP/a"
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/a" h5 100 0 counting:601:6:1
  run_split train_data --data-path "$TMP/a"
  [[ $status -eq 1 && ! -s "$TMP/out.jsonl" ]] || fail "exit $status, stdout: $(cat "$TMP/out.jsonl")"
  [[ "$(line_count "$(cat "$TMP/err.log")")" -eq 1 && "$(cat "$TMP/err.log")" == "mt-train: error: $TMP/cache/"*"stale sample index"*"datasets[0].sequences: file 600, asked 601"* ]] || fail "$(cat "$TMP/err.log")"
  for args in "--mock-data --vocab-size 97 --eod-mask-loss" "--mock-data --vocab-size 97 --split 1,1,1" \
              "--mock-data --vocab-size 97 --data-cache-path $TMP/c" "--train-data-path $TMP/a --split 1,1,1" \
              "--data-path $TMP/a --train-data-path $TMP/a" "--data-path 0 $TMP/a 0 $TMP/b"; do
    # shellcheck disable=SC2086
    run_split mt-train --model tiny-gpt --train-iters 1 $args
    [[ $status -eq 2 && -z "$out" && "$(line_count "$err")" -eq 1 && "$err" == "mt-train: error: "* ]] || fail "'$args': $status $err"
  done
}

@test "issue11 case 5: mt-train refuses a prefix whose .h5 and .bin/.idx hold different datasets" {
  make_token_data
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/a" bin 100 0 counting:300:10:2  # a later run, same prefix
  run_split train_data --data-path "$TMP/a"
  [[ $status -eq 1 && -z "$out" && "$(cat "$TMP/err.log")" == "mt-train: error: $TMP/a: ambiguous: $TMP/a.h5 and $TMP/a.bin + $TMP/a.idx hold different token datasets ("*"); remove the stale one, or name the one to read ($TMP/a.h5 or $TMP/a.bin)" ]] ||
    fail "$status $(cat "$TMP/err.log")"
  train_data --data-path "$TMP/a.bin" --vocab-size 100 || fail "naming the .bin: $(cat "$TMP/err.log")"
  check '[.[] | select(.record=="step")] | length == 2'
}

@test "issue11 case 16: --split 0,1,0 is refused as --split, before any index is built" {
  make_token_data
  run_split train_data --data-path "$TMP/a" --split 0,1,0
  [[ $status -eq 2 && "$(cat "$TMP/err.log")" == "mt-train: error: --split: '0,1,0' gives the train split no data (its first part is 0), but 8 training samples are needed" ]] ||
    fail "$status $(cat "$TMP/err.log")"
  [[ ! -e "$TMP/cache" ]] || fail "an index was built: $(ls -R "$TMP/cache")"
  train_data --data-path "$TMP/a" --split 1,0,0 --eval-iters 1 --eval-interval 1 || fail "$(cat "$TMP/err.log")"
  check '[.[] | select(.record=="eval")] | length == 0'  # no validation part: no evaluation
}

@test "issue11 case 17: a directory given to mt-train as --byte-data or --data-path says so" {
  mkdir "$TMP/dir"
  run_split mt-train --model tiny-gpt --byte-data "$TMP/dir" --train-iters 1 --micro-batch-size 1 --global-batch-size 1
  [[ $status -eq 1 && "$err" == "mt-train: error: --byte-data $TMP/dir: is a directory, expected a file" ]] || fail "$status $err"
  run_split train_data --data-path "$TMP/dir" --vocab-size 100
  [[ $status -eq 1 && "$(cat "$TMP/err.log")" == "mt-train: error: $TMP/dir: is a directory; a token dataset is named by its prefix X (of X.h5, or X.bin and X.idx)" ]] ||
    fail "$status $(cat "$TMP/err.log")"
}

# ---- checkpoints (issue 14) ----

# mt-train on tiny-gpt with a schedule of 10 iterations whatever --train-iters says, so a run cut
# short and resumed sees the learning rates of the straight run; stdout in $TMP/$1.jsonl.
ckpt_run() {
  local name="$1"
  shift
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --eval-iters 1 --eval-interval 4 --peak-tflops 1 --lr 1e-3 --lr-decay-iters 10 --lr-decay-style cosine \
    --hidden-dropout 0.1 "$@" >"$TMP/$name.jsonl" 2>"$TMP/$name.log"
}

# The step and eval records' numbers (JSON prints doubles exactly, so equal text is equal bits).
trace() { cat "$@" | jq -c 'select(.record == "step" or .record == "eval") | [.record, .iteration, .lm_loss, .grad_norm, .loss_scale]'; }

@test "issue14: 20 steps straight equal 10 + save + load + 10, bit for bit, in fp32, bf16 and fp16 with the loss scaler" {
  # A 20-iteration schedule, evaluated every 5 (the later flags win over ckpt_run's).
  local -a schedule=(--lr-decay-iters 20 --eval-interval 5)
  for precision in "" --bf16 "--fp16 --initial-loss-scale 65536 --loss-scale-window 3"; do
    # shellcheck disable=SC2086
    ckpt_run straight $precision "${schedule[@]}" --train-iters 20 || fail "$(cat "$TMP/straight.log")"
    rm -rf "$TMP/ck"
    # shellcheck disable=SC2086
    ckpt_run first $precision "${schedule[@]}" --train-iters 10 --save "$TMP/ck" || fail "$(cat "$TMP/first.log")"
    # shellcheck disable=SC2086
    ckpt_run second $precision "${schedule[@]}" --train-iters 20 --load "$TMP/ck" --save "$TMP/ck" || fail "$(cat "$TMP/second.log")"
    # Cut where the straight run evaluates too (--eval-interval 5): a run also evaluates at its end.
    [[ "$(trace "$TMP/straight.jsonl")" == "$(trace "$TMP/first.jsonl" "$TMP/second.jsonl")" ]] ||
      fail "'$precision': $(diff <(trace "$TMP/straight.jsonl") <(trace "$TMP/first.jsonl" "$TMP/second.jsonl"))"
    [[ "$(trace "$TMP/second.jsonl" | head -n 1)" == '["step",11,'* ]] || fail "'$precision': resumed at $(trace "$TMP/second.jsonl" | head -n 1)"
    # When each checkpoint started and ended (UTC, milliseconds), its size and speed, loads as saves.
    jq -e -s '[.[] | select(.record == "ckpt")] | .[0].event == "load" and .[0].iteration == 10 and .[1].event == "save"
      and .[1].iteration == 20 and all(.bytes > 0 and .seconds > 0 and .mb_per_s > 0
        and (.started | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}[.][0-9]{3}Z$")) and .started <= .ended)
      and .[0].ended <= .[1].started' "$TMP/second.jsonl" >/dev/null || fail "$(cat "$TMP/second.jsonl")"
    grep -q "^mt-train: loaded $TMP/ck/iter_0000010/checkpoint.h5 (iteration 10) in [0-9.]* s ([0-9.]* MB, [0-9]* MB/s)$" \
      "$TMP/second.log" || fail "$(cat "$TMP/second.log")"
    grep -q "^mt-train: saved $TMP/ck/iter_0000020/checkpoint.h5 (iteration 20, [0-9.]* MB in [0-9.]* s, [0-9]* MB/s)$" \
      "$TMP/second.log" || fail "$(cat "$TMP/second.log")"
  done
}

@test "issue14: --save-interval saves every N iterations and at the end; the tracker names the last" {
  ckpt_run run --train-iters 7 --save "$TMP/ck" --save-interval 3 || fail "$(cat "$TMP/run.log")"
  [[ "$(ls "$TMP/ck")" == $'iter_0000003\niter_0000006\niter_0000007\nlatest_checkpointed_iteration.txt' ]] || fail "$(ls "$TMP/ck")"
  [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 7 ]] || fail "tracker: $(cat "$TMP/ck/latest_checkpointed_iteration.txt")"
  [[ -z "$(find "$TMP/ck" -name '*.tmp-*')" ]] || fail "temporaries left"
  check_file() { jq -e -s "$1" "$TMP/run.jsonl" >/dev/null || fail "jq '$1': $(grep ckpt "$TMP/run.jsonl")"; }
  check_file '[.[] | select(.record == "ckpt") | [.event, .iteration, .what]] == [["save",3,"resumable"],["save",6,"resumable"],["save",7,"resumable"]]'
  # Saving does not change the run's numbers.
  ckpt_run plain --train-iters 7 || fail "$(cat "$TMP/plain.log")"
  [[ "$(trace "$TMP/run.jsonl")" == "$(trace "$TMP/plain.jsonl")" ]] || fail "saving changed the run"
  # A finished run loaded again has nothing left to do and saves nothing new.
  ckpt_run again --train-iters 7 --load "$TMP/ck" --save "$TMP/ck" || fail "$(cat "$TMP/again.log")"
  [[ -z "$(trace "$TMP/again.jsonl")" ]] || fail "steps after the end: $(trace "$TMP/again.jsonl")"
  [[ "$(ls "$TMP/ck" | wc -l)" -eq 4 ]] || fail "$(ls "$TMP/ck")"
}

@test "issue14, issue28: --load with no checkpoint is an error, unless it is the --save directory (Megatron's --save DIR --load DIR: warns and starts fresh); --exit-on-missing-checkpoint makes that an error too" {
  ckpt_run run --train-iters 2 --save "$TMP/empty" --load "$TMP/empty" || fail "$(cat "$TMP/run.log")"
  grep -qx "warning: mt-train: --load $TMP/empty: no checkpoint ($TMP/empty/latest_checkpointed_iteration.txt does not exist); starting from scratch" \
    "$TMP/run.log" || fail "$(cat "$TMP/run.log")"
  [[ "$(trace "$TMP/run.jsonl" | head -n 1)" == '["step",1,'* ]] || fail "$(trace "$TMP/run.jsonl")"
  mkdir -p "$TMP/other"
  run_split ckpt_run run --train-iters 2 --load "$TMP/other" --save "$TMP/empty2"
  [[ $status -eq 1 && "$(cat "$TMP/run.log")" == "mt-train: error: --load $TMP/other: no checkpoint ($TMP/other/latest_checkpointed_iteration.txt does not exist): to start from scratch drop --load, or give the same directory as --save (it resumes when a checkpoint is there)" ]] ||
    fail "$status $(cat "$TMP/run.log")"
  ckpt_run run --train-iters 2 --load "$TMP/other/" --save "$TMP/./other" || fail "DIR/ and ./DIR are one directory: $(cat "$TMP/run.log")"
  run_split ckpt_run run --train-iters 2 --load "$TMP/empty3" --save "$TMP/empty3" --exit-on-missing-checkpoint
  [[ $status -eq 1 && "$(cat "$TMP/run.log")" == "mt-train: error: --load $TMP/empty3: no checkpoint ($TMP/empty3/latest_checkpointed_iteration.txt does not exist) and --exit-on-missing-checkpoint" ]] ||
    fail "$status $(cat "$TMP/run.log")"
  [[ ! -s "$TMP/run.jsonl" ]] || fail "records from a refused run"
}

@test "issue14: checkpoint flags that need --save or --load are refused without them" {
  for flag in "--save-interval 2:--save-interval: needs --save DIR" "--no-save-optim:--no-save-optim: needs --save DIR" \
    "--finetune:--finetune: needs --load DIR" "--no-load-optim:--no-load-optim: needs --load DIR" \
    "--no-load-rng:--no-load-rng: needs --load DIR" \
    "--exit-on-missing-checkpoint:--exit-on-missing-checkpoint: needs --load DIR"; do
    # shellcheck disable=SC2086
    run_split ckpt_run run --train-iters 1 ${flag%%:*}
    [[ $status -eq 2 && "$(cat "$TMP/run.log")" == "mt-train: error: ${flag#*:}" ]] || fail "$flag: $status $(cat "$TMP/run.log")"
  done
}

@test "issue14: a checkpoint of another model, a missing tensor, another shape or dtype, an unknown version: one line naming it" {
  ckpt_run first --train-iters 2 --save "$TMP/ck" || fail "$(cat "$TMP/first.log")"
  local file="$TMP/ck/iter_0000002/checkpoint.h5" name=model/decoder.layers.1.mlp.linear_fc2.weight
  run_split ckpt_run run --train-iters 4 --load "$TMP/ck" --ffn-hidden-size 128
  [[ $status -eq 1 && "$(cat "$TMP/run.log")" == "mt-train: error: $file: written for another model: ffn_hidden_size is 256 there, 128 in this run" ]] ||
    fail "$status $(cat "$TMP/run.log")"
  cp "$file" "$TMP/good.h5"
  for damage in "delete:tensor $name missing" "reshape:tensor $name has shape (256, 64), the model's is (64, 256)" \
    "float64:tensor $name is not float32, bfloat16 or float16" "version:mt_format_version 99 is not supported (this mt reads 2)"; do
    cp "$TMP/good.h5" "$file"
    "$BATS_TEST_DIRNAME/ckpt_h5py.py" corrupt "$file" "${damage%%:*}" "$name"
    run_split ckpt_run run --train-iters 4 --load "$TMP/ck"
    [[ $status -eq 1 && "$(cat "$TMP/run.log")" == "mt-train: error: $file: ${damage#*:}" ]] || fail "$damage: $status $(cat "$TMP/run.log")"
  done
  echo release >"$TMP/ck/latest_checkpointed_iteration.txt"
  run_split ckpt_run run --train-iters 4 --load "$TMP/ck"
  [[ $status -eq 1 && "$(cat "$TMP/run.log")" == "mt-train: error: $TMP/ck/latest_checkpointed_iteration.txt: names a release checkpoint, which mt does not write or read" ]] ||
    fail "$status $(cat "$TMP/run.log")"
}

@test "issue14: --finetune, --no-save-optim with --no-load-optim, and --no-load-rng load what they say" {
  ckpt_run first --train-iters 3 --save "$TMP/ck" --seed 7 --no-save-optim || fail "$(cat "$TMP/first.log")"
  run_split ckpt_run run --train-iters 5 --load "$TMP/ck"
  [[ $status -eq 1 && "$(cat "$TMP/run.log")" == *"holds no optimizer state (saved with --no-save-optim); load it with --no-load-optim or --finetune" ]] ||
    fail "$status $(cat "$TMP/run.log")"
  # --no-load-optim: counters and seed from the checkpoint, a fresh optimizer.
  ckpt_run run --train-iters 5 --load "$TMP/ck" --no-load-optim || fail "$(cat "$TMP/run.log")"
  jq -e -s '.[0].seed == 7 and ([.[] | select(.record == "step") | .iteration] == [4, 5])' "$TMP/run.jsonl" >/dev/null ||
    fail "$(head -c 400 "$TMP/run.jsonl")"
  # --no-load-rng: the command line's seed.
  ckpt_run run --train-iters 5 --load "$TMP/ck" --no-load-optim --no-load-rng --seed 9 || fail "$(cat "$TMP/run.log")"
  jq -e -s '.[0].seed == 9' "$TMP/run.jsonl" >/dev/null || fail "seed: $(jq -s '.[0].seed' "$TMP/run.jsonl")"
  # --finetune: the parameters only; iteration 1 onwards, the command line's seed.
  ckpt_run run --train-iters 2 --load "$TMP/ck" --finetune || fail "$(cat "$TMP/run.log")"
  jq -e -s '.[0].seed == 1234 and ([.[] | select(.record == "step") | .iteration] == [1, 2])' "$TMP/run.jsonl" >/dev/null ||
    fail "$(head -c 400 "$TMP/run.jsonl")"
  ckpt_run fresh --train-iters 2 || fail "$(cat "$TMP/fresh.log")"
  [[ "$(trace "$TMP/run.jsonl" | head -n 1)" != "$(trace "$TMP/fresh.jsonl" | head -n 1)" ]] || fail "--finetune loaded nothing"
  # --save-final is parameters only: --finetune loads it, a resume does not.
  ckpt_run first --train-iters 2 --save-final "$TMP/final.h5" || fail "$(cat "$TMP/first.log")"
  mkdir -p "$TMP/fin/iter_0000002" && cp "$TMP/final.h5" "$TMP/fin/iter_0000002/checkpoint.h5" && echo 2 >"$TMP/fin/latest_checkpointed_iteration.txt"
  run_split ckpt_run run --train-iters 3 --load "$TMP/fin" --no-load-optim
  [[ $status -eq 1 && "$(cat "$TMP/run.log")" == *"holds parameters only, not a run to resume (written by --save-init/--save-final, mt-ckpt convert or import); load it with --finetune" ]] || fail "$(cat "$TMP/run.log")"
  ckpt_run run --train-iters 1 --load "$TMP/fin" --finetune || fail "$(cat "$TMP/run.log")"
}

# mt-train in the background with every signal at its default action; returns once step $1 is out.
start_until_step() {
  local step="$1"
  shift
  env --default-signal mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 \
    --global-batch-size 4 --eval-iters 0 --peak-tflops 1 --lr-decay-iters 100000 --log-interval 1000000 "$@" \
    >"$TMP/bg.jsonl" 2>"$TMP/bg.log" &
  PID=$!
  for _ in $(seq 600); do
    jq -e -s --argjson n "$step" '[.[] | select(.record == "step")] | length >= $n' "$TMP/bg.jsonl" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  fail "no step $step: $(cat "$TMP/bg.log")"
}

@test "issue14: with --save a signal saves a checkpoint and exits 75; the run resumed from it is the straight run" {
  start_until_step 3 --train-iters 100000 --save "$TMP/ck"
  kill -s USR1 "$PID"
  wait "$PID" && status=0 || status=$?
  [[ $status -eq 75 ]] || fail "exit $status: $(cat "$TMP/bg.log")"
  local stopped
  stopped="$(jq -s '[.[] | select(.record == "step")] | length' "$TMP/bg.jsonl")"
  [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == "$stopped" ]] || fail "tracker vs $stopped steps"
  grep -qx "mt-train: stopped by SIGUSR1 after iteration $stopped of 100000; saved a checkpoint in $TMP/ck (resume with --load)" \
    "$TMP/bg.log" || fail "$(cat "$TMP/bg.log")"
  jq -e -s '.[-1].record == "summary" and .[-1].stopped_by == "SIGUSR1" and .[-2].record == "ckpt" and .[-2].event == "save"' \
    "$TMP/bg.jsonl" >/dev/null || fail "$(tail -n 2 "$TMP/bg.jsonl")"
  cp "$TMP/bg.jsonl" "$TMP/first.jsonl"
  local total=$((stopped + 3))
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --eval-iters 0 --peak-tflops 1 --lr-decay-iters 100000 --train-iters "$total" --load "$TMP/ck" >"$TMP/second.jsonl" 2>/dev/null
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --eval-iters 0 --peak-tflops 1 --lr-decay-iters 100000 --train-iters "$total" >"$TMP/straight.jsonl" 2>/dev/null
  [[ "$(trace "$TMP/straight.jsonl")" == "$(trace "$TMP/first.jsonl" "$TMP/second.jsonl")" ]] ||
    fail "$(diff <(trace "$TMP/straight.jsonl") <(trace "$TMP/first.jsonl" "$TMP/second.jsonl"))"
}

@test "issue14: killed at any named point of a save, the previous checkpoint stays named, verifies and resumes" {
  ckpt_run straight --train-iters 8 || fail "$(cat "$TMP/straight.log")"
  for point in mid-tensor before-fsync before-rename before-tracker; do
    rm -rf "$TMP/ck"
    ckpt_run first --train-iters 4 --save "$TMP/ck" || fail "$(cat "$TMP/first.log")"
    local before
    before="$(md5sum "$TMP/ck/iter_0000004/checkpoint.h5")"
    # The hook kills the process (SIGKILL: no clean-up runs) inside the save of iteration 6.
    MT_CHECKPOINT_FAULT="$point:kill" ckpt_run killed --train-iters 8 --load "$TMP/ck" --save "$TMP/ck" --save-interval 2 &&
      status=0 || status=$?
    [[ $status -eq 137 ]] || fail "$point: exit $status: $(cat "$TMP/killed.log")"
    grep -q '"record":"step","iteration":6,' "$TMP/killed.jsonl" || fail "$point: killed before step 6"
    [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 4 ]] || fail "$point: tracker $(cat "$TMP/ck/latest_checkpointed_iteration.txt")"
    [[ "$(md5sum "$TMP/ck/iter_0000004/checkpoint.h5")" == "$before" ]] || fail "$point: the kept checkpoint changed"
    mt-ckpt verify "$TMP/ck" >/dev/null || fail "$point: verify refused the kept checkpoint"
    # Resumed from it: the straight run's numbers, and the killed save's temporary is cleaned up.
    ckpt_run resumed --train-iters 8 --load "$TMP/ck" --save "$TMP/ck" --save-interval 2 || fail "$point: $(cat "$TMP/resumed.log")"
    [[ "$(trace "$TMP/straight.jsonl")" == "$(trace "$TMP/first.jsonl" "$TMP/resumed.jsonl")" ]] ||
      fail "$point: $(diff <(trace "$TMP/straight.jsonl") <(trace "$TMP/first.jsonl" "$TMP/resumed.jsonl"))"
    [[ -z "$(find "$TMP/ck" -name '*.tmp-*')" ]] || fail "$point: temporaries left: $(find "$TMP/ck" -name '*.tmp-*')"
    mt-ckpt verify "$TMP/ck" >/dev/null || fail "$point: verify refused the resumed run's checkpoint"
  done
}

# A model whose save takes long enough (about 20 MB) for kills to land anywhere in it.
CRASH=(--model tiny-gpt --hidden-size 256 --num-attention-heads 4 --num-layers 4 --mock-data --vocab-size 97
       --seq-length 16 --micro-batch-size 2 --global-batch-size 4 --eval-iters 0 --peak-tflops 1 --lr 1e-3
       --lr-decay-iters 40)

@test "issue14: killed 20 times at random moments of a save (seed printed), latest always verifies, resumes, and earlier checkpoints never change" {
  local seed="${MT_CRASH_SEED:-$(( $(date +%s%N) % 1000000 ))}"
  echo "# MT_CRASH_SEED=$seed (set it to replay these kill times)" >&3
  RANDOM=$seed
  mt-train "${CRASH[@]}" --train-iters 24 >"$TMP/straight.jsonl" 2>"$TMP/straight.log" || fail "$(cat "$TMP/straight.log")"
  mt-train "${CRASH[@]}" --train-iters 2 --save "$TMP/ck" --save-interval 1 >"$TMP/first.jsonl" 2>"$TMP/first.log" || fail "$(cat "$TMP/first.log")"
  # The save window, measured: the longest of the two saves, from the log line that starts it.
  local window_us
  window_us="$(jq -s '[.[] | select(.record == "ckpt") | .seconds] | max * 1e6 | floor' "$TMP/first.jsonl")"
  (( window_us > 0 )) || fail "no save measured: $(cat "$TMP/first.jsonl")"
  mkfifo "$TMP/log.fifo"
  local round latest delay_us pid line advanced=0
  for round in $(seq 20); do
    latest="$(cat "$TMP/ck/latest_checkpointed_iteration.txt")"
    # Every checkpoint up to the one the tracker names, as it is now.
    (cd "$TMP/ck" && for i in $(seq -f %07g 1 "$latest"); do sha256sum "iter_$i/checkpoint.h5"; done) >"$TMP/before.sha256"
    mt-train "${CRASH[@]}" --train-iters $((latest + 1)) --load "$TMP/ck" --save "$TMP/ck" >"$TMP/round.jsonl" 2>"$TMP/log.fifo" &
    pid=$!  # mt-train itself (it re-executes itself in place), so the kill reaches the saving process
    exec 4<"$TMP/log.fifo"
    while IFS= read -r line <&4; do [[ "$line" == "mt-train: saving a checkpoint"* ]] && break; done
    [[ "$line" == "mt-train: saving a checkpoint of iteration $((latest + 1))"* ]] || fail "round $round: no save started: $line"
    delay_us=$(( (RANDOM * 32768 + RANDOM) % window_us ))
    sleep "$(printf '%d.%06d' $((delay_us / 1000000)) $((delay_us % 1000000)))"
    kill -KILL "$pid" 2>/dev/null || true
    cat <&4 >/dev/null
    exec 4<&-
    wait "$pid" || true
    # It resumed from the checkpoint the tracker named before the kill.
    jq -e -s --argjson it "$latest" '.[] | select(.record == "ckpt" and .event == "load") | .iteration == $it' "$TMP/round.jsonl" \
      >/dev/null || fail "round $round (killed ${delay_us} us into the save): did not resume from $latest"
    local now
    now="$(cat "$TMP/ck/latest_checkpointed_iteration.txt")"
    (( now == latest || now == latest + 1 )) || fail "round $round: the tracker went from $latest to $now"
    (( now == latest )) || advanced=$((advanced + 1))
    mt-ckpt verify "$TMP/ck/iter_$(printf %07d "$now")/checkpoint.h5" >/dev/null \
      || fail "round $round (killed ${delay_us} us into the save): the checkpoint latest names does not verify"
    (cd "$TMP/ck" && sha256sum --quiet -c "$TMP/before.sha256") \
      || fail "round $round (killed ${delay_us} us into the save): an earlier checkpoint changed"
  done
  echo "# window ${window_us} us; the save completed before the kill in $advanced of 20 rounds" >&3
  # Trained on to the end from what the last kill left: the straight run's numbers, bit for bit.
  latest="$(cat "$TMP/ck/latest_checkpointed_iteration.txt")"
  mt-train "${CRASH[@]}" --train-iters 24 --load "$TMP/ck" >"$TMP/last.jsonl" 2>"$TMP/last.log" || fail "$(cat "$TMP/last.log")"
  [[ "$(trace "$TMP/last.jsonl")" == "$(trace "$TMP/straight.jsonl" | tail -n $((24 - latest)))" ]] ||
    fail "$(diff <(trace "$TMP/straight.jsonl" | tail -n $((24 - latest))) <(trace "$TMP/last.jsonl"))"
}

@test "issue28 U1: an odd --seq-length trains without context parallelism; under CP 2 it is refused at start naming both flags" {
  for seq in 31 3 1; do
    mt-train --model tiny-llama --mock-data --vocab-size 97 --seq-length "$seq" --micro-batch-size 2 \
      --global-batch-size 2 --train-iters 2 --eval-iters 0 --peak-tflops 1 >"$TMP/out.jsonl" 2>"$TMP/err.log" ||
      fail "seq $seq: $(cat "$TMP/err.log")"
    check '[.[] | select(.record=="step")] | length == 2 and all(.lm_loss | isfinite)'
  done
  run mt-train --model tiny-llama --mock-data --vocab-size 97 --seq-length 30 --context-parallel-size 2 \
    --micro-batch-size 2 --global-batch-size 2 --train-iters 1 --dry-run --world-size 2 --peak-tflops 1
  [ "$status" -eq 2 ]
  [[ "$output" == *"--seq-length 30"*"--context-parallel-size 2"* ]] || fail "$output"
}

@test "issue28 U2, U3: --load FILE --finetune starts from a --save-final file's weights; --load takes the --save directory, an iteration directory and its checkpoint file alike" {
  train_tiny --train-iters 4 --save "$TMP/ck" --save-interval 2 --save-final "$TMP/final.h5" || fail "$(cat "$TMP/err.log")"
  train_tiny --train-iters 1 --load "$TMP/final.h5" --finetune || fail "$(cat "$TMP/err.log")"
  steps '.lm_loss' >"$TMP/from_file"
  train_tiny --train-iters 1 --load "$TMP/ck" --finetune || fail "$(cat "$TMP/err.log")"
  steps '.lm_loss' >"$TMP/from_dir"
  train_tiny --train-iters 1
  steps '.lm_loss' >"$TMP/from_scratch"
  [ "$(cat "$TMP/from_file")" = "$(cat "$TMP/from_dir")" ] || fail "file $(cat "$TMP/from_file") dir $(cat "$TMP/from_dir")"
  [ "$(cat "$TMP/from_file")" != "$(cat "$TMP/from_scratch")" ] || fail "the file's weights were not loaded"
  run train_tiny --train-iters 1 --load "$TMP/final.h5"
  [ "$status" -eq 1 ]
  grep -q -- "$TMP/final.h5: holds parameters only, not a run to resume" "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  # Iteration 2 resumed three ways: the tracker moved there, its directory, its file: the same steps 3 and 4.
  mkdir "$TMP/at2" && cp -r "$TMP/ck/iter_0000002" "$TMP/at2/" && printf 2 >"$TMP/at2/latest_checkpointed_iteration.txt"
  train_tiny --train-iters 4 --load "$TMP/at2" || fail "$(cat "$TMP/err.log")"
  steps '[.iteration, .lm_loss, .grad_norm]' >"$TMP/resumed"
  [ "$(jq -c '.[0][0]' "$TMP/resumed")" = 3 ] || fail "$(cat "$TMP/resumed")"
  for form in "$TMP/ck/iter_0000002" "$TMP/ck/iter_0000002/" "$TMP/ck/iter_0000002/checkpoint.h5"; do
    train_tiny --train-iters 4 --load "$form" || fail "$form: $(cat "$TMP/err.log")"
    [ "$(steps '[.iteration, .lm_loss, .grad_norm]')" = "$(cat "$TMP/resumed")" ] || fail "$form: $(steps '[.iteration, .lm_loss, .grad_norm]')"
  done
  for form in "$TMP/ck" "$TMP/ck/iter_0000002" "$TMP/ck/iter_0000002/checkpoint.h5"; do
    mt-ckpt verify "$form" >/dev/null || fail "mt-ckpt verify $form"
  done
  mkdir -p "$TMP/empty-dir"
  run mt-ckpt verify "$TMP/empty-dir"
  [ "$status" -eq 1 ]
  [[ "$output" == "mt-ckpt: error: $TMP/empty-dir: holds neither $TMP/empty-dir/latest_checkpointed_iteration.txt nor a checkpoint.h5 (give a --save directory, an iter_NNNNNNN directory or a checkpoint file)" ]] || fail "$output"
}

@test "issue28 U6, U8: a tracker naming a missing iteration, a missing checkpoint file and --save under a regular file are named as such" {
  train_tiny --train-iters 2 --save "$TMP/ck" --save-interval 2 || fail "$(cat "$TMP/err.log")"
  printf 30 >"$TMP/ck/latest_checkpointed_iteration.txt"
  run train_tiny --load "$TMP/ck"
  [ "$status" -eq 1 ]
  grep -qx "mt-train: error: --load $TMP/ck: its tracker $TMP/ck/latest_checkpointed_iteration.txt names iteration 30, but $TMP/ck/iter_0000030/checkpoint.h5 does not exist" \
    "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  run mt-ckpt export --format hf "$TMP/nonexistent" "$TMP/out"
  [ "$status" -eq 1 ]
  [ "$output" = "mt-ckpt: error: $TMP/nonexistent: no such file" ] || fail "$output"
  touch "$TMP/file"
  run train_tiny --save "$TMP/file/ck"
  [ "$status" -ne 0 ]
  grep -q "cannot write: directory $TMP/file/ck does not exist ($TMP/file is not a directory)" "$TMP/err.log" ||
    fail "$(cat "$TMP/err.log")"
}

@test "issue22: tiny-mixtral (8 experts, top-2) trains on one rank; the step record and Megatron's log line carry load_balancing_loss, z_loss and each MoE layer's tokens per expert" {
  head -c 100000 "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/text.txt"
  run_split mt-train --model tiny-mixtral --byte-data "$TMP/text.txt" --micro-batch-size 4 --global-batch-size 8 \
    --train-iters 20 --lr 3e-3 --lr-warmup-iters 3 --eval-iters 0 --log-interval 10 --moe-z-loss-coeff 1e-3 \
    --moe-per-layer-logging --peak-tflops 1
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" >"$TMP/out.jsonl"
  check '.[0].model.num_experts == 8 and .[0].model.moe_router_topk == 2'
  check '[.[] | select(.record=="step")] | length == 20'
  check '[.[] | select(.record=="step")] | (.[0].lm_loss - .[-1].lm_loss) > 1.0'
  # aux / coeff averaged over layers and micro-batches: 1.0 for balanced routing, above it otherwise.
  check '[.[] | select(.record=="step") | .load_balancing_loss] | all(. >= 0.99 and . < 8)'
  check '[.[] | select(.record=="step") | .z_loss] | all(. > 0)'
  check '[.[] | select(.record=="step")][0].moe_layers | map(.layer) == [0, 1]'
  check '[.[] | select(.record=="step") | .moe_layers[] | (.tokens_min <= .tokens_max and .tokens_cv >= 0 and has("load_balancing_loss") and has("z_loss"))] | all'
  # Every token goes to k = 2 experts: 8 x 64 x 2 = 1024 routed copies per layer, 128 per expert on average.
  check '[.[] | select(.record=="step") | .moe_layers[] | .tokens_max >= 128 and .tokens_min <= 128] | all'
  [[ "$err" == *"| lm loss: "*" | load_balancing_loss: "*" | z_loss: "*" | loss scale: "* ]] || fail "no MoE values in the log line: $err"
}

@test "issue22: a MoE model is not refused on --device cuda, and the values mt-train does not run are refused while parsing" {
  mixtral() {
    mt-train --model tiny-mixtral --mock-data --vocab-size 97 --seq-length 16 --train-iters 1 --eval-iters 0 "$@" \
      >"$TMP/out.jsonl" 2>"$TMP/err.log"
  }
  if [[ ! -e /dev/nvidia0 ]]; then
    # Without a GPU it stops where a dense model does (no device or no CUDA backend), not at MoE.
    run mixtral --device cuda
    [[ $status -eq 1 ]] || fail "status $status: $(cat "$TMP/err.log")"
    grep -q -- "^mt-train: error: --device cuda: \(no CUDA device found\|this build has no CUDA backend\)" \
      "$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  fi
  for args in "--moe-token-dispatcher-type flex" "--moe-router-dtype fp64" "--moe-router-force-load-balancing"; do
    # shellcheck disable=SC2086
    run mixtral $args
    [[ $status -eq 2 ]] || fail "$args: status $status"
    grep -q -- "${args%% *}.*not supported yet" "$TMP/err.log" || fail "$args: $(cat "$TMP/err.log")"
  done
}
