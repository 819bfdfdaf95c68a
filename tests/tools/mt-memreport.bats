#!/usr/bin/env bats
# mt-memreport end to end: tiny-gpt's bytes per category against the arithmetic written out, TP/SP
# and pipeline layouts (uneven stages with virtual stages placed as mt-train places them), real
# mt-train runs read back with --from-log (weights, grads and optimizer exact, activations within
# 10%), mt-train's --device, sweeps, --plan and bad input.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

check() {
  jq -e -s "$1" "$TMP/out.jsonl" >/dev/null || fail "jq '$1' is false for: $(cat "$TMP/out.jsonl" "$TMP/err.log")"
}

report() {
  mt-memreport "$@" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "mt-memreport $* exited $?: $(cat "$TMP/err.log")"
}

@test "issue15: tiny-gpt's weights, grads, optimizer and per-layer activations equal the arithmetic written out" {
  # 120576 parameters: embedding 256 x 64, positions 64 x 64, per layer 2 x 128 norms + 64 x 192 + 192 qkv +
  # 64 x 64 + 64 proj + 64 x 256 + 256 fc1 + 256 x 64 + 64 fc2 = 49984, final norm 128. fp32: 4 bytes each,
  # Adam's two moments 8. A layer at micro-batch 2 x 64 tokens keeps 4 x 128 x 64 residual, 4 x 128 LayerNorm
  # statistics, 128 x 192 qkv, 128 x 64 + 128 x 4 core output and log-sum-exp, 2 x 128 x 256 MLP floats.
  report --model tiny-gpt --micro-batch-size 2 --seq-length 64
  check '[.[] | select(.record=="memory")] | length == 1 and (.[0] | .parameters == 120576
    and .weights_bytes == 482304 and .gemm_weights_bytes == 0 and .grads_bytes == 482304 and .optimizer_bytes == 964608
    and .total_bytes == .weights_bytes + .grads_bytes + .optimizer_bytes + .activations_bytes + .comm_buffers_bytes)'
  check '[.[] | select(.record=="layer")][0] | .residual_bytes == 131072 and .norm_stats_bytes == 2048
    and .attention_bytes == 98304 and .core_attention_bytes == 34816 and .mlp_bytes == 262144 and .total_bytes == 528384'
  # Megatron's estimate beside it: 18 bytes a parameter, its formula without the position table.
  check '[.[] | select(.record=="megatron_memory")][0].weights_and_optimizer_bytes == (120576 - 4096) * 18'
}

@test "issue15: layouts mt-train cannot run yet are accounted for: TP 2 with SP, pipelines, the distributed optimizer" {
  # TP 2: the vocabulary-parallel embedding, qkv, fc1 (with their biases) and the proj/fc2 weights halve,
  # positions, norms and row-parallel biases stay: 8192 + 4096 + 2 x 25184 + 128 = 62784 parameters a rank.
  report --model tiny-gpt --tensor-model-parallel-size 2 --sequence-parallel --world-size 4 --global-batch-size 2
  check '[.[] | select(.record=="memory")] | length == 1 and (.[0] | .ranks == 4 and .parameters == 62784
    and .weights_bytes == 251136 and .optimizer_bytes == 502272)'
  report --model tiny-gpt --sweep sequence-parallel=false,true --tensor-model-parallel-size 2 --world-size 2
  check '[.[] | select(.record=="layer") | .residual_bytes] | .[1] * 2 == .[0]'
  # Pipelines: 1F1B keeps min(p - r, m) micro-batches in flight on stage r.
  report --model tiny-gpt --pipeline-model-parallel-size 2 --world-size 4 --global-batch-size 8
  check '[.[] | select(.record=="memory")] | length == 2 and ([.[].in_flight_microbatches] == [2, 1])
    and ([.[].layers] == [1, 1]) and all(.ranks == 2)'
  # The distributed optimizer: Adam's 8 bytes a parameter over 8 data-parallel ranks, a quarter of the fp32 grads.
  report --model gpt2-124m --world-size 8 --global-batch-size 8 --use-distributed-optimizer --bf16
  check '[.[] | select(.record=="memory")][0] | .optimizer_bytes * 4 == .grads_bytes and .gemm_weights_bytes > 0'
}

@test "issue21: uneven stages with virtual stages are accounted for as mt-train places their layers" {
  # 6 layers on 2 stages of 2 chunks: --decoder-first-pipeline-num-layers 2 (a layer a chunk) and
  # --decoder-last-pipeline-num-layers 4 (two a chunk). tiny-gpt's layer holds 49984 parameters: the
  # first stage 2 of them + the embedding 256 x 64 + positions 64 x 64 = 120448, the last 4 + the final
  # norm 128 + its copy of the tied embedding 16384 = 216448.
  report --model tiny-gpt --num-layers 6 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 \
    --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 4 --world-size 2 --global-batch-size 4
  check '[.[] | select(.record=="memory")] | length == 2 and ([.[].layers] == [2, 4])
    and ([.[].parameters] == [120448, 216448]) and all(.parameter_source == "layout table")'
}

@test "issue21: --device is mt-train's backend: cuda keeps the bf16 GEMM copy as bf16 bits, cpu as this CPU's backend does" {
  report --model gpt2-124m --bf16 --seq-length 256 --sweep device=,cpu,cuda
  check '[.[] | select(.record=="memory")] | length == 3 and (.[0] | del(.sweep)) == (.[1] | del(.sweep))
    and .[2].gemm_weights_bytes * 2 == .[2].weights_bytes and .[2].grads_bytes == .[0].grads_bytes'
  run_split mt-memreport --help
  [[ "$out" == *"--device"*"cuda bf16 bits"* ]] || fail "$out"
}

@test "issue15: --from-log against real mt-train runs: weights, grads and optimizer exact, activations within 10%" {
  for args in "--model tiny-gpt" "--model tiny-llama --bf16 --recompute-granularity selective --micro-batch-size 3" \
              "--model tiny-llama --num-layers 4 --recompute-granularity full --recompute-num-layers 2" \
              "--model tiny-gpt --fp16 --micro-batch-size 2 --global-batch-size 4 --recompute-granularity full --recompute-method block"; do
    # shellcheck disable=SC2086
    mt-train $args --mock-data --seq-length 32 --train-iters 2 --eval-iters 0 --peak-tflops 1 >"$TMP/train.jsonl" 2>/dev/null
    mt-memreport --from-log - <"$TMP/train.jsonl" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$args: $(cat "$TMP/err.log")"
    jq -e -s --slurpfile train "$TMP/train.jsonl" '
      ([$train[] | select(.record=="step")][-1]) as $step |
      [.[] | select(.record=="memory_check")] as $c |
      ($c | map(.category)) == ["weights","grads","optimizer","activations","comm_buffers"] and
      ($c | all(.stage == 0 and .rank == 0)) and $c[4].measured_bytes == 0 and $c[4].predicted_bytes == 0 and
      ($c[0].predicted_bytes == $step.mem_weights_bytes and $c[0].measured_bytes == $step.mem_weights_bytes) and
      ($c[1].predicted_bytes == $step.mem_grads_bytes) and ($c[2].predicted_bytes == $step.mem_optim_bytes) and
      ($c[0:3] | all(.error == 0)) and ($c[3].measured_bytes == $step.mem_activations_bytes) and
      ($c[3].error | fabs) <= 0.10' "$TMP/out.jsonl" >/dev/null || fail "$args: $(cat "$TMP/out.jsonl")"
  done
}

@test "issue15: --sweep gives one record set per combination; an empty value leaves the flag unset" {
  report --model tiny-gpt --micro-batch-size 4 --sweep recompute-granularity=,selective,full --sweep micro-batch-size=1,2
  check '[.[] | select(.record=="memory")] | length == 6 and ([.[].sweep] | unique | length == 6)'
  check '[.[] | select(.record=="memory") | .sweep][0:2] == ["recompute-granularity=(unset) micro-batch-size=1",
    "recompute-granularity=(unset) micro-batch-size=2"]'
  # Full recompute keeps less than selective, which keeps less than none, at each micro-batch.
  check '[.[] | select(.record=="memory") | .activations_bytes] as $a | $a[0] > $a[2] and $a[2] > $a[4] and $a[1] > $a[3] and $a[3] > $a[5]'
}

@test "issue15: --plan checks layouts with mt's memory or Megatron's formula" {
  report --model llama3-8b --world-size 16 --global-batch-size 64 --bf16 --plan dgx-h100 --top 3
  check '[.[] | select(.record=="plan")] | length == 3 and all(.peak_gib <= 80)'
  report --model llama3-8b --world-size 16 --global-batch-size 64 --bf16 --plan dgx-h100 --memory-estimate megatron
  check '.[-1] | .record == "plan_summary" and .memory_estimate == "megatron"'
}

@test "issue15: mt-train's arguments work unchanged; the vocabulary comes from the data as mt-train takes it" {
  "$MT_ROOT/tests/tools/make_token_dataset.py" "$TMP/tokens" h5 100 0 counting:50:20:1
  args=(--model tiny-gpt --data-path "$TMP/tokens" --split 80,10,10 --seq-length 8 --micro-batch-size 2
        --global-batch-size 4 --train-iters 2 --eval-iters 0 --lr 1e-3 --data-cache-path "$TMP/cache" --peak-tflops 1)
  mt-train "${args[@]}" >"$TMP/train.jsonl" 2>/dev/null
  report "${args[@]}" --world-size 1
  jq -e -s --slurpfile train "$TMP/train.jsonl" '([$train[] | select(.record=="step")][0]) as $s |
    [.[] | select(.record=="memory")][0] | .weights_bytes + .gemm_weights_bytes == $s.mem_weights_bytes
      and .activations_bytes == $s.mem_activations_bytes' "$TMP/out.jsonl" >/dev/null || fail "$(cat "$TMP/out.jsonl")"
  run_split mt-memreport --help
  section="$(printf '%s\n' "$out" | sed -n '/accepted for compatibility with mt-train, no effect here/,/^$/p')"
  for flag in --peak-tflops --flops-convention --lr --split --save-final --overlap-param-gather; do
    [[ "$section" == *" $flag "* ]] || fail "$flag is not listed as having no effect: $section"
  done
}

@test "issue15: bad input is one line on stderr naming the flag, exit 2, nothing on stdout" {
  printf '{"record":"run","tool":"mt-shard"}\n' >"$TMP/shard.jsonl"
  mt-train --model tiny-gpt --mock-data --train-iters 1 --eval-iters 0 --peak-tflops 1 2>/dev/null | head -n 1 >"$TMP/nosteps.jsonl"
  while IFS='|' read -r args expected; do
    # shellcheck disable=SC2086
    run_split mt-memreport $args
    [[ $status -eq 2 && -z "$out" && "$(line_count "$err")" -eq 1 ]] || fail "mt-memreport $args: $status, $out, $err"
    [[ "$err" == "mt-memreport: error: $expected"* ]] || fail "mt-memreport $args: $err"
  done <<EOF
--model tiny-gpt --pipeline-model-parallel-size 3 --world-size 3|--num-layers 2: not divisible by --pipeline-model-parallel-size 3
--model tiny-gpt --context-parallel-size 2 --world-size 2 --seq-length 6|--seq-length 6
--model tiny-gpt --sweep from-log=x|--sweep from-log=x: cannot be swept
--model tiny-gpt --memory-estimate exact|--memory-estimate: must be one of
--model tiny-gpt --device H100|--device H100: a GPU model for peaks is --peak-device H100; --device names the backend, cpu or cuda
--model llama3-8b --world-size 16 --global-batch-size 64 --device cpu --plan dgx-h100|--device cpu: --plan dgx-h100 models the cluster's GPUs
--from-log $TMP/shard.jsonl|--from-log $TMP/shard.jsonl: line 1 is the run record of mt-shard, not mt-train
--from-log $TMP/nosteps.jsonl|--from-log $TMP/nosteps.jsonl: holds no step records
--from-log $TMP/nosteps.jsonl --sweep micro-batch-size=1,2|--sweep: a log is one run
EOF
}
