#!/usr/bin/env bats
# Memory and throughput accounting of multi-rank mt-train runs: its memory records (one per pipeline
# stage after the first step and at the end, the stage's most loaded rank, categories adding
# up to the step records' maxima, the first stage's in-flight activations above the last's under
# 1F1B); mt-memreport --from-log on TP, TP + SP and pipeline logs (1F1B and interleaved) across the
# recompute modes, on uneven stages with virtual stages and on an interleaved group size other than
# PP, on CP=2 x DP=2 with the distributed optimizer (Adam's moments sharded over DP x CP), and on GPT-2 124M (micro-batch 8, T 256) under TP=2 + SP, every stage's weights, grads and
# optimizer exact and activations within 10%; and
# mt-mfu --from-log dividing by the world size.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

# 4 layers so that two virtual stages of two pipeline stages each hold one; 4 micro-batches a step.
TINY=(--model tiny-llama --num-layers 4 --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2
      --global-batch-size 8 --train-iters 2 --eval-iters 0 --peak-tflops 1)

# Trains on $1 ranks with the remaining arguments into $TMP/train.jsonl.
train() {
  local ranks="$1"
  shift
  mpirun_n "$ranks" mt-train "${TINY[@]}" "$@" >"$TMP/train.jsonl" 2>"$TMP/train.err" \
    || fail "mt-train $* on $ranks ranks: $(cat "$TMP/train.err")"
}

# The memory records of $TMP/train.jsonl hold $1 stages: written right after the first step record and
# after the last (at the end of the run, before the summary); every stage's categories add up to its peak (everything is allocated once),
# each category's largest over the stages is the step record's and the largest peak is the step's
# mem_peak_bytes on mem_peak_rank; $2 (a jq array per stage) lists the ranks each stage may report.
check_memory_records() {
  jq -e -s --argjson stages "$1" --argjson ranks "$2" '
    def sum_of: .weights_bytes + .grads_bytes + .optim_bytes + .activations_bytes + .comm_buffers_bytes;
    . as $all | [$all[] | .record] as $kinds |
    ($kinds | index("step")) as $first_step | ($kinds | rindex("step")) as $last_step |
    [$all[] | select(.record=="memory")] as $memory |
    ($memory | length) == 2 * $stages and $first_step < $last_step and
    $kinds[$first_step + 1 : $first_step + 1 + $stages] == [range(0; $stages) | "memory"] and
    $kinds[$last_step + 1 :] == [(range(0; $stages) | "memory"), "summary"] and
    ($memory[0:$stages] | map(.stage)) == [range(0; $stages)] and ($memory[$stages:] | map(.stage)) == [range(0; $stages)] and
    ($memory[0:$stages] | all(.iteration == 1)) and
    ($memory | all(sum_of == .peak_bytes and . as $m | $ranks[$m.stage] | index($m.rank) != null)) and
    ([$all[] | select(.record=="step")] | .[0]) as $step |
    ($memory[0:$stages]) as $first |
    ($first | map(.weights_bytes) | max) == $step.mem_weights_bytes and
    ($first | map(.grads_bytes) | max) == $step.mem_grads_bytes and
    ($first | map(.optim_bytes) | max) == $step.mem_optim_bytes and
    ($first | map(.activations_bytes) | max) == $step.mem_activations_bytes and
    ($first | max_by(.peak_bytes)) as $top | $top.peak_bytes == $step.mem_peak_bytes and $top.rank == $step.mem_peak_rank
  ' "$TMP/train.jsonl" >/dev/null || fail "memory records of $1 stages: $(jq -c 'select(.record=="memory" or .record=="step")' "$TMP/train.jsonl")"
}

# mt-memreport --from-log on $TMP/train.jsonl: every stage's prediction beside that stage's last
# memory record, weights, grads and optimizer exact and activations within 10%; $1 names the run.
check_memreport() {
  mt-memreport --from-log - <"$TMP/train.jsonl" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$1: $(cat "$TMP/err.log")"
  local stages
  stages="$(jq -s '.[0].parallel.pipeline_model_parallel_size' "$TMP/train.jsonl")"
  jq -e -s --argjson stages "$stages" --slurpfile train "$TMP/train.jsonl" '
    [$train[] | select(.record=="memory")][-$stages:] as $measured |
    [.[] | select(.record=="memory_check")] as $checks |
    ([.[] | select(.record=="memory")] | map(.stage)) == [range(0; $stages)] and
    ($checks | length) == 5 * $stages and
    all(range(0; $stages) as $s | $checks | map(select(.stage == $s)) as $c | $measured[$s] as $m |
      ($c | map(.category)) == ["weights", "grads", "optimizer", "activations", "comm_buffers"] and
      $c[0].measured_bytes == $m.weights_bytes and $c[1].measured_bytes == $m.grads_bytes and
      $c[2].measured_bytes == $m.optim_bytes and $c[3].measured_bytes == $m.activations_bytes and
      ($c | all(.rank == $m.rank)) and ($c[0:3] | all(.error == 0)) and ($c[3].error | fabs) <= 0.10)
  ' "$TMP/out.jsonl" >/dev/null || fail "$1: $(jq -c 'select(.record=="memory_check")' "$TMP/out.jsonl")"
}

@test "issue13: memory records: one per pipeline stage after the first step and at the end, adding up to the step's maxima" {
  mt-train "${TINY[@]}" >"$TMP/train.jsonl" 2>"$TMP/train.err" || fail "$(cat "$TMP/train.err")"
  check_memory_records 1 '[[0]]'
  jq -e -s '[.[] | select(.record=="memory")] | all(.comm_buffers_bytes == 0)' "$TMP/train.jsonl" >/dev/null \
    || fail "one rank has no communication buffers: $(cat "$TMP/train.jsonl")"
  # 1F1B keeps min(p - r, m) = 2 micro-batches in flight on the first stage, 1 on the last (which
  # also holds the head: its logits are small here).
  train 2 --pipeline-model-parallel-size 2
  check_memory_records 2 '[[0], [1]]'
  jq -e -s '[.[] | select(.record=="memory")][0:2] | .[0].activations_bytes > .[1].activations_bytes
    and all(.comm_buffers_bytes > 0)' "$TMP/train.jsonl" >/dev/null \
    || fail "first stage not above the last: $(jq -c 'select(.record=="memory")' "$TMP/train.jsonl")"
  train 2 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2
  check_memory_records 2 '[[0], [1]]'
  # TP fastest, then DP, then PP: stage 0 is ranks 0 and 1, stage 1 ranks 2 and 3.
  train 4 --pipeline-model-parallel-size 2 --use-distributed-optimizer
  check_memory_records 2 '[[0, 1], [2, 3]]'
}

@test "issue15: mt-memreport --from-log on TP=2, TP=2 + SP and PP=2 (1F1B, interleaved) runs across recompute modes: every stage exact, activations within 10%" {
  local -a layouts=("--tensor-model-parallel-size 2" "--tensor-model-parallel-size 2 --sequence-parallel"
                    "--pipeline-model-parallel-size 2"
                    "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2")
  local -a recomputes=("" "--recompute-granularity selective" "--recompute-granularity full --recompute-num-layers 1")
  for layout in "${layouts[@]}"; do
    for recompute in "${recomputes[@]}"; do
      # shellcheck disable=SC2086
      train 2 $layout $recompute
      check_memreport "$layout $recompute"
    done
  done
  # DP=2 with the distributed optimizer: Adam's moments of one shard, exact.
  train 2 --use-distributed-optimizer --bf16
  mt-memreport --from-log "$TMP/train.jsonl" >"$TMP/out.jsonl"
  jq -e -s '[.[] | select(.record=="memory_check")][0:3] | all(.error == 0)' "$TMP/out.jsonl" >/dev/null \
    || fail "$(cat "$TMP/out.jsonl")"
  # A pipeline log without its memory records (cut out) cannot be compared stage by stage.
  train 2 --pipeline-model-parallel-size 2
  jq -c 'select(.record != "memory")' "$TMP/train.jsonl" >"$TMP/cut.jsonl"
  run_split mt-memreport --from-log "$TMP/cut.jsonl"
  [[ $status -eq 2 && -z "$out" && "$err" == *"holds no memory records"* ]] || fail "$status $out $err"
}

@test "issue21: mt-memreport --from-log on PP=2 with uneven stages and virtual stages, and with a micro-batch group of 4: every stage exact, activations within 10%" {
  # 6 layers: the first stage 2 (a layer a chunk), the last 4 (two a chunk), placed as mt-train places them.
  train 2 --num-layers 6 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 \
    --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 4
  check_memreport "uneven stages with virtual stages"
  # The interleaved schedule's group of 4 micro-batches (not PP's 2) keeps more of them in flight.
  train 2 --num-layers 8 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 \
    --microbatch-group-size-per-virtual-pipeline-stage 4
  check_memreport "a micro-batch group of 4"
}

@test "issue24: mt-memreport --from-log on CP=2 x DP=2 with the distributed optimizer: Adam's moments sharded over DP x CP as the run shards them; weights, grads and optimizer exact, activations within 10%" {
  # The optimizer's reduction group is DP x CP (4 ranks here), not DP alone: a prediction sharding
  # over DP counts twice the optimizer bytes the run allocates.
  train 4 --context-parallel-size 2 --use-distributed-optimizer
  jq -e -s '.[0].parallel | .context_parallel_size == 2 and .data_parallel_size == 2' "$TMP/train.jsonl" >/dev/null \
    || fail "not CP 2 x DP 2: $(head -1 "$TMP/train.jsonl")"
  check_memreport "CP=2 x DP=2 with the distributed optimizer"
}

@test "issue15: mt-memreport --from-log on GPT-2 124M, micro-batch 8, T 256, TP=2 + SP on 2 ranks, across recompute modes: exact, activations within 10%" {
  local -a recomputes=("" "--recompute-granularity selective" "--recompute-granularity full --recompute-num-layers 1")
  for recompute in "${recomputes[@]}"; do
    # One train iteration, no evaluation: the fewest steps that write the memory records.
    # shellcheck disable=SC2086
    mpirun_n 2 mt-train --model gpt2-124m --mock-data --seq-length 256 --micro-batch-size 8 --global-batch-size 8 \
      --train-iters 1 --eval-iters 0 --peak-tflops 1 --tensor-model-parallel-size 2 --sequence-parallel $recompute \
      >"$TMP/train.jsonl" 2>"$TMP/train.err" || fail "gpt2-124m $recompute: $(cat "$TMP/train.err")"
    check_memreport "gpt2-124m TP=2 + SP $recompute"
  done
}

@test "issue15: mt-mfu --from-log on a 2-rank run: tflops_per_device = FLOPs / (step time x world size), as mt-train's" {
  train 2 --tensor-model-parallel-size 2
  mt-mfu --from-log - <"$TMP/train.jsonl" >"$TMP/out.jsonl" 2>"$TMP/err.log" || fail "$(cat "$TMP/err.log")"
  jq -e -s --slurpfile train "$TMP/train.jsonl" '
    [$train[] | select(.record=="step")] as $steps |
    [.[] | select(.record=="mfu")] as $mfu |
    ($mfu | length) == ($steps | length) and ($mfu | all(.world_size == 2)) and
    all(range(0; $steps | length) as $i | $mfu[$i] as $m | $steps[$i] as $s |
      (($m.tflops_per_device - $m.model_flops_per_step / ($s.step_ms / 1e3) / 2 / 1e12) | fabs) <= 1e-9 * $m.tflops_per_device and
      (($m.tflops_per_device - $s.tflops_per_device) | fabs) <= 1e-9 * $s.tflops_per_device and
      (($m.mfu - $s.mfu) | fabs) <= 1e-9 * $s.mfu)
  ' "$TMP/out.jsonl" >/dev/null || fail "$(cat "$TMP/out.jsonl")"
}
