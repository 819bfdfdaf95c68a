#!/usr/bin/env bats
# mt-mfu end to end: FLOPs of tiny-gpt under each convention against the arithmetic written out,
# TFLOP/s and MFU from --step-time and a peak (--peak-tflops, --peak-device, the CPU's FMA probe),
# mt-train's --device (the backend, never a GPU model), a real mt-train run read back with
# --from-log, sweeps, --predict (uneven pipelines with virtual stages included), --plan and bad input.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

# jq over the records in $TMP/out.jsonl as one array; fails the test with them when false.
check() {
  jq -e -s "$1" "$TMP/out.jsonl" >/dev/null || fail "jq '$1' is false for: $(cat "$TMP/out.jsonl" "$TMP/err.log")"
}

mfu() { mt-mfu "$@" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "mt-mfu $* exited $?: $(cat "$TMP/err.log")"; }

# tiny-gpt: L 2, h 64, 4 heads (q = kv = 64), F 256, V 256 (padded 256), 16 tokens a sequence.
TINY=(--model tiny-gpt --seq-length 16)

@test "issue15: FLOPs per token of tiny-gpt under every convention equal the arithmetic written out" {
  # Megatron (today): MLP 12 T h F L + attention 6 T (h (q + 2 kv) + q h) L + causal core 6 T s q L + logits 6 T h V
  #   = 393216 + 196608 + 12288 + 98304 = 700416 per token.
  # Megatron-2024: core attention not halved: + 12288 = 712704. 6N: N = 120576 - 4096 position = 116480 -> 698880.
  # 6N+12LCT: + 12 x 2 x 64 x 16 = 24576 -> 723456; 6N+6LCT: 711168. Narayanan: layers x 4/3 with core attention
  # doubled, logits once more: (393216 + 196608 + 24576) x 4/3 + 98304 x 1 = 819200 + 98304 = 917504.
  mfu "${TINY[@]}" --global-batch-size 4 --sweep flops-convention=megatron,megatron-2024,6N,6N+12LCT,6N+6LCT,narayanan
  check '[.[] | select(.record=="mfu") | [.flops_convention, .flops_per_token]] ==
    [["megatron",700416],["megatron-2024",712704],["6N",698880],["6N+12LCT",723456],["6N+6LCT",711168],["narayanan",917504]]'
  check '[.[] | select(.record=="mfu")] | all(.model_flops_per_step == .flops_per_token * 64)'
  # Hardware FLOPs add what recompute repeats: full recompute a forward of every layer (602112 / 3 a token),
  # selective the core attention's forward (12288 / 3).
  mfu "${TINY[@]}" --global-batch-size 4 --sweep recompute-granularity=,selective,full
  check '[.[] | select(.record=="mfu") | .hardware_flops_per_step / 64] == [700416, 704512, 901120]'
}

@test "issue15: TFLOP/s per device and MFU from --step-time over the world size, against --peak-tflops or --peak-device" {
  mfu "${TINY[@]}" --global-batch-size 4 --world-size 2 --step-time 0.5 --peak-tflops 0.001
  # 64 tokens x 700416 = 44826624 FLOPs in 0.5 s on 2 devices of 1 GFLOP/s.
  check '.[1] | .tflops_per_device == 44826624 / (0.5 * 2) / 1e12 and ((.mfu - 0.044826624) | fabs < 1e-12)
    and .tokens_per_s == 128 and .peak_source == "--peak-tflops" and (has("gemm_efficiency") | not)'
  mfu "${TINY[@]}" --global-batch-size 4 --step-time 0.5 --peak-device h100 --bf16
  check '.[1] | .peak_tflops == 989.5 and (.peak_source | startswith("h100 dense bf16"))
    and ((.mfu - 44826624 / 0.5 / 989.5e12) | fabs < 1e-15)'
  mfu "${TINY[@]}" --global-batch-size 4 --step-time 0.5 --peak-device A100 --fp16  # as data sheets spell it
  check '.[1].peak_tflops == 312'
}

@test "issue21: --device is mt-train's backend: cpu takes the FMA probe, cuda needs a named peak, a GPU model is refused with a hint" {
  mfu "${TINY[@]}" --step-time 0.01 --device cpu
  check '.[1] | (.peak_source | startswith("FMA probe: ")) and .gemm_tflops > 0'
  mfu "${TINY[@]}" --global-batch-size 4 --step-time 0.5 --device cuda --peak-device h100 --bf16
  check '.[1] | .peak_tflops == 989.5 and (.peak_source | startswith("h100 dense bf16"))'
  mfu "${TINY[@]}" --global-batch-size 4 --step-time 0.5 --device cuda --peak-tflops 0.001
  check '.[1].peak_source == "--peak-tflops"'
  # FLOPs do not depend on the backend; the prediction of a cluster is of its GPUs.
  mfu "${TINY[@]}" --global-batch-size 4 --sweep device=,cpu,cuda
  check '[.[] | select(.record=="mfu") | .model_flops_per_step] | length == 3 and (unique | length == 1)'
  mfu --model tiny-gpt --world-size 8 --global-batch-size 8 --bf16 --device cuda --predict dgx-h100
  check '.[1] | .record == "prediction" and .step_ms > 0'
  run_split mt-mfu --help
  [[ "$out" == *"--device"*"cpu this CPU's FMA probe, cuda needs --peak-device or --peak-tflops"* ]] || fail "$out"
}

@test "issue15: on the CPU the peak is the FMA probe over a rank's cores, the GEMM efficiency beside it" {
  mfu "${TINY[@]}" --step-time 0.01
  check '.[0] as $run | .[1] | (.peak_source | startswith("FMA probe: ") and endswith(" x \($run.threads_per_rank) cores"))
    and .peak_cores == $run.threads_per_rank and ((.peak_tflops / (.peak_core_tflops * .peak_cores) - 1) | fabs < 1e-12)
    and .gemm_tflops > 0 and ((.gemm_efficiency - .gemm_tflops / .peak_tflops) | fabs < 1e-12)
    and ((.mfu - .tflops_per_device / .peak_tflops) | fabs < 1e-12)'
}

@test "issue15: --from-log reads a real mt-train run: MFU per step equal to mt-train's, and averaged after the first" {
  mt-train "${TINY[@]}" --mock-data --micro-batch-size 2 --global-batch-size 4 --train-iters 4 --eval-iters 0 \
    --peak-tflops 0.5 >"$TMP/train.jsonl" 2>/dev/null
  mt-mfu --from-log - <"$TMP/train.jsonl" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  check '[.[] | select(.record=="mfu")] | length == 4 and ([.[].iteration] == [1,2,3,4])
    and all(((.mfu - .mt_train_mfu) | fabs) < 1e-12 and ((.mfu - .tflops_per_device / 0.5) | fabs) < 1e-12)'
  steps="$(jq -c -s '[.[] | select(.record=="step") | .step_ms]' "$TMP/train.jsonl")"
  jq -e -s --argjson ms "$steps" '[.[] | select(.record=="mfu_summary")][0] |
    .steps_averaged == 3 and ((.step_ms - ($ms[1:] | add / 3)) | fabs < 1e-9) and .flops_convention == "megatron"
    and (.peak_source | startswith("the log: --peak-tflops"))' "$TMP/out.jsonl" >/dev/null || fail "$(cat "$TMP/out.jsonl")"
  # Another convention and peak over the same log.
  mt-mfu --from-log "$TMP/train.jsonl" --flops-convention 6N --peak-tflops 1 >"$TMP/out.jsonl"
  check '[.[] | select(.record=="mfu")] | all(.flops_per_token == 698880 and .flops_convention == "6N"
    and ((.mfu - .tflops_per_device) | fabs < 1e-12))'
}

@test "issue15: --sweep gives one record per combination, labelled" {
  mfu "${TINY[@]}" --global-batch-size 8 --step-time 1 --peak-tflops 1 --sweep micro-batch-size=1,2,4 \
    --sweep --flops-convention=6N,megatron
  check '[.[] | select(.record=="mfu")] | length == 6 and ([.[].sweep] | unique | length == 6)'
  check '[.[] | select(.record=="mfu") | .sweep][0] == "micro-batch-size=1 flops-convention=6N"'
  mfu "${TINY[@]}" --global-batch-size 8 --sweep world-size=1,2,4,8 --format table
  [[ "$(grep -c 'world-size=' "$TMP/out.jsonl")" -eq 4 ]] || fail "$(cat "$TMP/out.jsonl")"
}

@test "issue15: --predict on a named cluster: step time, TFLOP/s and MFU against the device's dense peak" {
  mfu --model llama3-8b --tensor-model-parallel-size 4 --sequence-parallel --world-size 64 --global-batch-size 128 \
    --bf16 --predict dgx-h100
  check '.[1] | .record == "prediction" and .device == "h100" and .step_ms > 0 and .mfu > 0.1 and .mfu < 0.9
    and ((.mfu - .tflops_per_device / 989.5) | fabs < 1e-9)
    and ((.tokens_per_s * .step_ms / 1e3 / (128 * 8192) - 1) | fabs < 1e-9)'
  # Uneven first/last stages with virtual stages, as mt-train runs them: 32 layers on 4 stages of 2
  # chunks, 6 on the first and the last, 10 on each middle stage.
  mfu --model llama3-8b --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 \
    --decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 6 --world-size 32 --global-batch-size 64 \
    --bf16 --predict dgx-h100
  check '.[1] | .record == "prediction" and .step_ms > 0 and .bubble_ms > 0 and .world_size == 32'
}

@test "issue15: --plan ranks the layouts that fit by predicted throughput, --top of them" {
  mfu --model llama3-8b --world-size 64 --global-batch-size 128 --bf16 --plan dgx-h100 --top 4
  check '[.[] | select(.record=="plan")] | length == 4 and ([.[].rank] == [1,2,3,4])
    and ([.[].tokens_per_s] | . == (sort | reverse)) and all(.peak_gib <= 80 and .tp * .pp * .cp * .dp == 64)'
  check '.[-1] | .record == "plan_summary" and .fitting <= .layouts and .fitting > 4'
  mt-mfu --model llama3-8b --world-size 64 --global-batch-size 128 --bf16 --plan dgx-h100 --top 2 --format table \
    >"$TMP/out.txt"
  [[ "$(head -n 1 "$TMP/out.txt")" == "# plan" && "$(grep -c '^ *[12] ' "$TMP/out.txt")" -ge 2 ]] || fail "$(cat "$TMP/out.txt")"
}

@test "issue15: mt-train's arguments work unchanged, no-effect flags are listed as such in --help" {
  printf 'hello world, ' >"$TMP/text.txt"
  args=(--model tiny-gpt --byte-data "$TMP/text.txt" --seq-length 16 --micro-batch-size 2 --global-batch-size 4
        --train-iters 30 --lr 3e-3 --lr-decay-style cosine --log-interval 10 --save-final "$TMP/final.h5"
        --data-cache-path "$TMP/cache" --use-flash-attn --eval-iters 0)
  mfu "${args[@]}" --world-size 2 --step-time 0.1 --peak-tflops 1
  check '.[1].flops_per_token == 700416 and .[1].world_size == 2'
  [[ ! -e "$TMP/final.h5" ]] || fail "mt-mfu wrote --save-final"
  run_split mt-mfu --help
  section="$(printf '%s\n' "$out" | sed -n '/accepted for compatibility with mt-train, no effect here/,/^$/p')"
  for flag in --lr --seed --save-final --data-cache-path --use-flash-attn --log-interval; do
    [[ "$section" == *" $flag "* ]] || fail "$flag is not listed as having no effect: $section"
  done
  [[ "$section" != *" --micro-batch-size "* && "$section" != *" --peak-tflops "* ]] || fail "effective flags listed: $section"
}

@test "issue15: bad input is one line on stderr naming the flag, exit 2, nothing on stdout" {
  printf 'not json\n' >"$TMP/bad.jsonl"
  jq -c 'select(.record != "run")' <(mt-train "${TINY[@]}" --mock-data --train-iters 1 --eval-iters 0 --peak-tflops 1 2>/dev/null) >"$TMP/norun.jsonl"
  while IFS='|' read -r args expected; do
    # shellcheck disable=SC2086
    run_split mt-mfu $args
    [[ $status -eq 2 && -z "$out" && "$(line_count "$err")" -eq 1 ]] || fail "mt-mfu $args: $status, $out, $err"
    [[ "$err" == "mt-mfu: error: $expected"* ]] || fail "mt-mfu $args: $err"
  done <<EOF
--model tiny-gpt --step-time 0|--step-time: must be positive (got 0)
--model tiny-gpt --world-size 0|--world-size: must be at least 1
--model tiny-gpt --tensor-model-parallel-size 3 --world-size 3|--num-attention-heads 4: not divisible by --tensor-model-parallel-size 3
--model tiny-gpt --world-size 3 --global-batch-size 4|--global-batch-size 4
--model tiny-gpt --step-time 1 --peak-device x100|device x100: unknown
--model tiny-gpt --step-time 1 --device H100|--device H100: a GPU model for peaks is --peak-device H100; --device names the backend, cpu or cuda
--model tiny-gpt --sweep device=cpu,h100|--device h100: a GPU model for peaks is --peak-device h100
--model tiny-gpt --step-time 1 --device cuda|--device cuda: a peak needs --peak-device NAME or --peak-tflops
--model tiny-gpt --step-time 1 --device cpu --peak-device h100|--peak-device h100: contradicts --device cpu
--model tiny-gpt --world-size 8 --global-batch-size 8 --device cpu --predict dgx-h100|--device cpu: --predict dgx-h100 models the cluster's GPUs
--model tiny-gpt --flops-convention 7N|--flops-convention: must be one of
--model tiny-gpt --peak-tflops 2|--peak-tflops: a peak needs --step-time
--model tiny-gpt --sweep nope=1,2|--sweep nope=1,2: no such flag
--model tiny-gpt --sweep micro-batch-size|--sweep micro-batch-size: give FLAG=a,b,c
--model tiny-gpt --sweep lr=1,2|--sweep lr=1,2: cannot be swept
--model tiny-gpt --sweep micro-batch-size=1,0|--sweep micro-batch-size=0: --micro-batch-size: must be at least 1 (got 0)
--model tiny-gpt --plan dgx-h100|--plan: needs --global-batch-size
--model tiny-gpt --plan dgx-h100 --global-batch-size 8 --tensor-model-parallel-size 2|--tensor-model-parallel-size: chosen by --plan
--model tiny-gpt --plan nowhere --global-batch-size 8|cluster nowhere: unknown
--from-log $TMP/missing.jsonl|--from-log $TMP/missing.jsonl: cannot be read
--from-log $TMP/bad.jsonl|--from-log $TMP/bad.jsonl: line 1 is not a JSON record
--from-log $TMP/norun.jsonl|--from-log $TMP/norun.jsonl: holds no run record of mt-train
--from-log $TMP/bad.jsonl --model tiny-gpt|--model: the configuration comes from the log
--from-log $TMP/bad.jsonl --device cpu|--device: the configuration comes from the log
--num-layers 2|--vocab-size: needed
EOF
}

@test "issue28 U11, W12: a cut last line is ignored with a warning, a bad step field is named, an MFU above 1 is warned about" {
  mt-train "${TINY[@]}" --mock-data --micro-batch-size 2 --global-batch-size 4 --train-iters 4 --eval-iters 0 \
    --peak-tflops 0.5 >"$TMP/train.jsonl" 2>/dev/null
  head -c -40 "$TMP/train.jsonl" >"$TMP/cut.jsonl"  # the summary record cut short, no newline
  for tool in mt-memreport mt-mfu; do
    $tool --from-log "$TMP/cut.jsonl" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$tool: $(cat "$TMP/err.log")"
    [[ "$(cat "$TMP/err.log")" == "warning: $tool: --from-log $TMP/cut.jsonl: line "*", the last, is cut (no newline, not JSON): ignored" ]] ||
      fail "$tool: $(cat "$TMP/err.log")"
  done
  check '[.[] | select(.record=="mfu")] | length == 4'
  sed 's/"step_ms":[0-9.e-]*/"step_ms":"abc"/' "$TMP/train.jsonl" >"$TMP/string.jsonl"
  sed 's/"step_ms":[0-9.e-]*/"step_ms":-5/' "$TMP/train.jsonl" >"$TMP/negative.jsonl"
  for log in string negative; do
    run_split mt-mfu --from-log "$TMP/$log.jsonl"
    [[ $status -eq 2 && -z "$out" && "$err" == "mt-mfu: error: --from-log $TMP/$log.jsonl: line "*": the step record's step_ms is "*", not a positive number of milliseconds" ]] ||
      fail "$log: $status $err"
  done
  run_split mt-mfu --model gpt2-124m --global-batch-size 8 --step-time 1 --peak-tflops 5
  [[ $status -eq 0 && "$err" == "warning: mt-mfu: mfu 1.3"*" exceeds 1: a step of 1000.0 ms at a peak of 5.0 TFLOP/s per device is impossible; check the step time and the peak" ]] ||
    fail "$status $err"
  run_split mt-mfu --model gpt2-124m --global-batch-size 8 --step-time 10 --peak-tflops 5
  [[ $status -eq 0 && -z "$err" ]] || fail "$err"
}
