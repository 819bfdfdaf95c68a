#!/usr/bin/env bats
# mt-train's plan and planned stops (issue 24). --dry-run --world-size N: one process, no MPI (no
# mpirun, not even under a Slurm step's variables), one dry_run record, exit 0 when the run would
# run and 2 when not (layout, flags, memory against --peak-device's GPU), missing inputs warned.
# --exit-interval and --exit-duration-in-mins: a checkpoint saved, exit 75 (0 without --save),
# the resumed run's numbers equal the straight run's bit for bit, and under mpirun the ranks agree
# when only one rank's clock has run out.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

# A LLaMA small enough to plan in milliseconds with every layout below: 8 heads, 4 query groups, 8 layers.
SMALL=(--model tiny-llama --num-layers 8 --hidden-size 64 --num-attention-heads 8 --num-query-groups 4 --group-query-attention
       --ffn-hidden-size 128 --seq-length 64 --max-position-embeddings 64 --vocab-size 97 --micro-batch-size 1
       --global-batch-size 16 --train-iters 10 --mock-data)

# LLaMA-3 70B at Megatron's parallelism guide's layout: TP4 PP4 CP2 on 64 GPUs, seq 8192, bf16, full
# recompute (mt keeps fp32 activations: without recompute a rank needs over 100 GiB).
LLAMA70B=(--model llama3-70b --mock-data --seq-length 8192 --max-position-embeddings 8192 --bf16
          --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --context-parallel-size 2
          --sequence-parallel --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 128
          --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
          --train-iters 100 --device cuda --world-size 64 --dry-run)

# jq over the one record of $out; fails with the output when false.
record_is() { jq -e "$1" <<<"$out" >/dev/null || fail "jq '$1' is false for: $out $err"; }

@test "issue24: --dry-run plans TP4 PP4 CP2 on 32 ranks in one process, without mpirun and under a Slurm step's variables" {
  run_split env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK mt-train "${SMALL[@]}" --tensor-model-parallel-size 4 \
    --pipeline-model-parallel-size 4 --context-parallel-size 2 --dry-run --world-size 32
  [[ $status -eq 0 ]] || fail "$status $err"
  [[ "$(line_count "$out")" -eq 1 ]] || fail "$out"
  record_is '.record == "dry_run" and .tool == "mt-train" and .world_size == 32 and .verdict == "runs" and .reason == null'
  record_is '.parallel.tensor_model_parallel_size == 4 and .parallel.pipeline_model_parallel_size == 4 and .parallel.context_parallel_size == 2 and .parallel.data_parallel_size == 1'
  record_is '.model.num_layers == 8 and .device == "cpu" and .backend_built == true and .memory.ranks_sharing == 32'
  record_is '.memory.per_rank.total_bytes > 0 and .memory.per_rank.total_bytes == (.memory.per_rank | .weights_bytes + .grads_bytes + .optim_bytes + .activations_bytes + .other_bytes)'
  [[ "$err" == "mt-train: --dry-run: the run would run on 32 ranks" ]] || fail "$err"
  # The Slurm variables a real run refuses without PMIx (32 tasks that cannot form one world) do not matter.
  run_split env SLURM_STEP_NUM_TASKS=32 mt-train "${SMALL[@]}" --tensor-model-parallel-size 4 \
    --pipeline-model-parallel-size 4 --context-parallel-size 2 --dry-run --world-size 32
  [[ $status -eq 0 ]] || fail "under SLURM_STEP_NUM_TASKS: $status $err"
  # DP follows from the world: 64 ranks give DP 2, and the memory per rank shrinks with the
  # distributed optimizer's shards.
  run_split mt-train "${SMALL[@]}" --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 \
    --context-parallel-size 2 --use-distributed-optimizer --dry-run --world-size 64
  [[ $status -eq 0 ]] || fail "$status $err"
  record_is '.parallel.data_parallel_size == 2'
}

@test "issue24: --dry-run of LLaMA-3 70B at TP4 PP4 CP2 on 64 H100s fits; on 40 GB A100s it is refused with the figure" {
  run_split mt-train "${LLAMA70B[@]}" --peak-device h100
  [[ $status -eq 0 ]] || fail "$status $err"
  local built=false
  if mt-train --version | grep -q 'cuda=on'; then built=true; fi
  record_is '.verdict == "runs" and .device == "cuda" and .backend_built == '"$built"' and .parallel.data_parallel_size == 2'
  record_is '.memory.available_bytes == 80 * 1073741824 and .memory.ranks_sharing == 1 and .memory.estimate == "planned"'
  record_is '.memory.per_rank.total_bytes < .memory.available_bytes and .memory.per_rank.total_bytes > 40 * 1073741824'
  record_is '.peak_tflops == 989.5 and .model.parameters > 70e9'
  # fp32 master weights and grads, and the bf16 copy GPU tensor cores take: weights = 1.5 x grads.
  record_is '.memory.gemm_copy_of == "cuda (planned)" and .memory.per_rank.weights_bytes * 2 == .memory.per_rank.grads_bytes * 3'
  if [[ $built == false ]]; then
    [[ "$err" == *"mt-train: --dry-run: this build has no CUDA backend (configure with -DMT_CUDA=ON): a run with --device cuda refuses it here"* ]] || fail "$err"
  else
    [[ "$err" != *"no CUDA backend"* ]] || fail "$err"
  fi
  # On a 40 GB A100 the floor alone (weights, grads, optimizer) is over: the reason gives it, the
  # record the plan's figure per category.
  run_split mt-train "${LLAMA70B[@]}" --peak-device a100-40gb
  [[ $status -eq 2 ]] || fail "$status $err"
  record_is '.verdict == "refused" and .memory.available_bytes == 40 * 1073741824 and .memory.per_rank.total_bytes > .memory.available_bytes'
  record_is '.reason | test("^model llama3-70b: needs at least [0-9.]+ GiB \\(weights [0-9.]+ GiB, grads [0-9.]+ GiB, optimizer [0-9.]+ GiB, activations [0-9.]+ GiB, other [0-9.]+ GiB\\) but only 40.00 GiB is available; ")'
  [[ "$(tail -n 1 <<<"$err")" == "mt-train: error: $(jq -r .reason <<<"$out")" ]] || fail "$err"
  # Without full recompute a rank's activations do not fit an H100: the plan's own figure is the reason's.
  run_split mt-train "${LLAMA70B[@]/full/selective}" --peak-device h100
  [[ $status -eq 2 ]] || fail "$status $err"
  local needs
  needs="$(jq -r '.memory.per_rank.total_bytes / 1073741824' <<<"$out")"
  [[ "$(tail -n 1 <<<"$err")" == "mt-train: error: model llama3-70b: needs $(printf '%.2f' "$needs") GiB ("*") but only 80.00 GiB is available; "* ]] ||
    fail "plan $needs GiB: $err"
  # --device cuda plans against a GPU only.
  run_split mt-train "${LLAMA70B[@]}"
  [[ $status -eq 2 && "$err" == "mt-train: error: --device cuda: --dry-run needs --peak-device NAME, the GPU whose memory each rank has" ]] ||
    fail "$status $err"
}

@test "issue24: --dry-run refuses bad layouts and flags with exit 2 and one line naming them" {
  # A layout refused: the record says so, and stderr's last line is the reason.
  local -a cases=(
    "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --context-parallel-size 2 --world-size 24|world size 24: not divisible by"
    "--tensor-model-parallel-size 16 --world-size 16|--tensor-model-parallel-size 16"
    "--pipeline-model-parallel-size 3 --world-size 3|--pipeline-model-parallel-size 3"
    "--context-parallel-size 3 --world-size 3|--context-parallel-size 3"
    "--tensor-model-parallel-size 2 --global-batch-size 3 --world-size 4|--global-batch-size 3"
  )
  for case in "${cases[@]}"; do
    # shellcheck disable=SC2086
    run_split mt-train "${SMALL[@]}" --dry-run ${case%|*}
    [[ $status -eq 2 ]] || fail "${case%|*}: exit $status $err"
    [[ "$(line_count "$err")" -eq 1 && "$err" == "mt-train: error: "*"${case#*|}"* ]] || fail "${case%|*}: $err"
    record_is '.record == "dry_run" and .verdict == "refused" and (.reason | length > 0)'
    [[ "$err" == "mt-train: error: $(jq -r .reason <<<"$out")" ]] || fail "${case%|*}: $err vs $out"
  done
  run_split mt-train "${SMALL[@]}" --dry-run
  [[ $status -eq 2 && "$err" == "mt-train: error: --dry-run: needs --world-size N, the ranks the run would start" ]] || fail "$status $err"
  run_split mt-train "${SMALL[@]}" --world-size 2
  [[ $status -eq 2 && "$err" == "mt-train: error: --world-size: applies to --dry-run only"* ]] || fail "$status $err"
  run_split mt-train "${SMALL[@]}" --dry-run --world-size 0
  [[ $status -eq 2 && "$err" == *"--world-size: must be at least 1 (got 0)"* ]] || fail "$status $err"
  run_split mt-train "${SMALL[@]}" --dry-run --world-size 1 --peak-device h300
  [[ $status -eq 2 && "$err" == *"device h300: unknown ("*"a100-40gb"* ]] || fail "$status $err"
  run_split mpirun_n 2 mt-train "${SMALL[@]}" --dry-run --world-size 2
  [[ $status -ne 0 && "$err" == *"--dry-run: plans in one process: start it without mpirun or srun"* ]] || fail "$status $err"
}

@test "issue24: --dry-run warns about inputs that do not exist yet, reads those that do, and writes nothing" {
  run_split mt-train "${SMALL[@]/--mock-data/--data-path}" "$TMP/corpus" --load "$TMP/ck" --save "$TMP/ck" \
    --save-final "$TMP/final.h5" --dry-run --world-size 2
  [[ $status -eq 0 ]] || fail "$status $err"
  [[ "$err" == *"mt-train: --dry-run: token dataset $TMP/corpus does not exist yet; not checked"* ]] || fail "$err"
  [[ "$err" == *"mt-train: --dry-run: --load $TMP/ck does not exist yet; a run would start from scratch"* ]] || fail "$err"
  record_is '[.inputs[] | .found] == [false, false] and .inputs[0].path == "'"$TMP/corpus"'"'
  [[ ! -e "$TMP/ck" && ! -e "$TMP/final.h5" ]] || fail "the dry run wrote: $(ls "$TMP")"
  # Without a preset's or the flag's vocabulary there is nothing to plan the vocabulary from.
  run_split mt-train --num-layers 2 --hidden-size 64 --num-attention-heads 8 --seq-length 64 \
    --max-position-embeddings 64 --micro-batch-size 1 --train-iters 1 --data-path "$TMP/corpus" --dry-run --world-size 1
  [[ $status -eq 2 && "$(tail -n 1 <<<"$err")" == "mt-train: error: --vocab-size: needed to plan: the token datasets that would record it do not exist yet" ]] ||
    fail "$status $err"
  # A byte file that exists is found; a token dataset that exists gives its recorded vocabulary.
  printf 'hello world\n' >"$TMP/text.txt"
  run_split mt-train --model tiny-gpt --byte-data "$TMP/text.txt" --seq-length 4 --micro-batch-size 1 --train-iters 1 \
    --dry-run --world-size 1
  [[ $status -eq 0 && "$err" == "mt-train: --dry-run: the run would run on 1 ranks" ]] || fail "$status $err"
  record_is '.inputs == [{"flag": "--byte-data", "path": "'"$TMP/text.txt"'", "found": true}] and .model.vocab_size == 256'
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/tok" h5 100 0 counting:50:6:1
  run_split mt-train --model tiny-gpt --data-path "$TMP/tok" --seq-length 4 --micro-batch-size 1 --train-iters 1 \
    --dry-run --world-size 1
  [[ $status -eq 0 ]] || fail "$status $err"
  record_is '.inputs == [{"flag": "token dataset", "path": "'"$TMP/tok"'", "found": true}] and .model.vocab_size == 100'
  [[ -z "$(find "$TMP" -name '*sample-index*')" ]] || fail "the dry run built a sample index: $(find "$TMP")"
}

# ---- planned stops: --exit-interval, --exit-duration-in-mins ----

# tiny-gpt on mock data with a 10-iteration schedule whatever --train-iters says (a run cut short
# sees the straight run's learning rates); stdout in $TMP/$1.jsonl, stderr in $TMP/$1.log, exit in $code.
stop_run() {
  local name="$1"
  shift
  mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4 \
    --eval-iters 1 --eval-interval 4 --peak-tflops 1 --lr 1e-3 --lr-decay-iters 10 --lr-decay-style cosine \
    --hidden-dropout 0.1 "$@" >"$TMP/$name.jsonl" 2>"$TMP/$name.log" && code=0 || code=$?
}

# The step and eval records' numbers (JSON prints doubles exactly, so equal text is equal bits).
trace() { cat "$@" | jq -c 'select(.record == "step" or .record == "eval") | [.record, .iteration, .lm_loss, .grad_norm, .loss_scale]'; }

@test "issue24: --exit-interval saves and exits 75 at its multiples; resumed twice, the run is the straight run bit for bit" {
  stop_run straight --train-iters 10
  [[ $code -eq 0 ]] || fail "$(cat "$TMP/straight.log")"
  stop_run first --train-iters 10 --exit-interval 4 --save "$TMP/ck"
  [[ $code -eq 75 ]] || fail "exit $code: $(cat "$TMP/first.log")"
  [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 4 ]] || fail "tracker: $(cat "$TMP/ck/latest_checkpointed_iteration.txt")"
  grep -qx "mt-train: stopped by --exit-interval 4 after iteration 4 of 10; saved a checkpoint in $TMP/ck (resume with --load)" \
    "$TMP/first.log" || fail "$(cat "$TMP/first.log")"
  jq -e -s '.[-1].record == "summary" and .[-1].stopped_by == "--exit-interval" and .[-1].iterations == 4 and
            ([.[] | select(.record == "ckpt" and .event == "save")] | length == 1)' "$TMP/first.jsonl" >/dev/null ||
    fail "$(cat "$TMP/first.jsonl")"
  stop_run second --train-iters 10 --exit-interval 4 --save "$TMP/ck" --load "$TMP/ck"
  [[ $code -eq 75 && "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 8 ]] || fail "exit $code: $(cat "$TMP/second.log")"
  # The last iteration is the run's end, not a stop: 10 is no multiple of 4 and 10 is not stopped at.
  stop_run third --train-iters 10 --exit-interval 5 --save "$TMP/ck" --load "$TMP/ck"
  [[ $code -eq 0 ]] || fail "exit $code: $(cat "$TMP/third.log")"
  jq -e -s '.[-1].stopped_by == null and .[-1].iterations == 10' "$TMP/third.jsonl" >/dev/null || fail "$(tail -n 1 "$TMP/third.jsonl")"
  [[ "$(trace "$TMP/straight.jsonl")" == "$(trace "$TMP/first.jsonl" "$TMP/second.jsonl" "$TMP/third.jsonl")" ]] ||
    fail "$(diff <(trace "$TMP/straight.jsonl") <(trace "$TMP/first.jsonl" "$TMP/second.jsonl" "$TMP/third.jsonl"))"
  # An iteration --save-interval saved is not saved twice.
  rm -rf "$TMP/ck"
  stop_run again --train-iters 10 --exit-interval 4 --save "$TMP/ck" --save-interval 2
  [[ $code -eq 75 ]] || fail "exit $code: $(cat "$TMP/again.log")"
  jq -e -s '[.[] | select(.record == "ckpt") | .iteration] == [2, 4]' "$TMP/again.jsonl" >/dev/null ||
    fail "$(grep ckpt "$TMP/again.jsonl")"
}

@test "issue24: --exit-duration-in-mins stops after the first iteration past it: 75 with --save, 0 without; the resumed run is the straight run" {
  stop_run straight --train-iters 6
  # 0.0001 minutes (6 ms) have passed since the process started by the end of its first iteration.
  stop_run first --train-iters 6 --exit-duration-in-mins 0.0001 --save "$TMP/ck"
  [[ $code -eq 75 && "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 1 ]] || fail "exit $code: $(cat "$TMP/first.log")"
  grep -qx "mt-train: stopped by --exit-duration-in-mins 0.0001 after iteration 1 of 6; saved a checkpoint in $TMP/ck (resume with --load)" \
    "$TMP/first.log" || fail "$(cat "$TMP/first.log")"
  jq -e -s '.[-1].stopped_by == "--exit-duration-in-mins"' "$TMP/first.jsonl" >/dev/null || fail "$(tail -n 1 "$TMP/first.jsonl")"
  stop_run second --train-iters 6 --exit-duration-in-mins 600 --save "$TMP/ck" --load "$TMP/ck"
  [[ $code -eq 0 ]] || fail "exit $code: $(cat "$TMP/second.log")"
  [[ "$(trace "$TMP/straight.jsonl")" == "$(trace "$TMP/first.jsonl" "$TMP/second.jsonl")" ]] ||
    fail "$(diff <(trace "$TMP/straight.jsonl") <(trace "$TMP/first.jsonl" "$TMP/second.jsonl"))"
  # Without --save nothing can be resumed: Megatron's exit 0, the summary still says why.
  stop_run unsaved --train-iters 6 --exit-duration-in-mins 0.0001
  [[ $code -eq 0 ]] || fail "exit $code: $(cat "$TMP/unsaved.log")"
  jq -e -s '.[-1].stopped_by == "--exit-duration-in-mins" and .[-1].iterations == 1' "$TMP/unsaved.jsonl" >/dev/null ||
    fail "$(tail -n 1 "$TMP/unsaved.jsonl")"
  grep -qx "mt-train: stopped by --exit-duration-in-mins 0.0001 after iteration 1 of 6" "$TMP/unsaved.log" || fail "$(cat "$TMP/unsaved.log")"
  for bad in "--exit-interval 0" "--exit-duration-in-mins 0" "--exit-duration-in-mins -1"; do
    # shellcheck disable=SC2086
    stop_run bad --train-iters 6 $bad
    [[ $code -eq 2 && "$(cat "$TMP/bad.log")" == "mt-train: error: ${bad% *}: must be "* ]] || fail "$bad: $code $(cat "$TMP/bad.log")"
  done
}

@test "issue24: under mpirun the ranks agree on --exit-duration-in-mins when only rank 0's clock has run out" {
  command -v mpirun >/dev/null || skip "no mpirun"
  local -a flags=(--model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4
                  --tensor-model-parallel-size 2 --eval-iters 0 --peak-tflops 1 --lr-decay-iters 10 --train-iters 6)
  # Rank 1 starts 8 s after rank 0, which waits for it in MPI_Init: after the first iteration rank 0
  # is past 0.1 minutes, rank 1 is not. Without the agreement rank 0 would save alone and hang.
  timeout 120 mpirun -np 1 mt-train "${flags[@]}" --exit-duration-in-mins 0.1 --save "$TMP/ck" : \
    -np 1 sh -c 'sleep 8; exec "$@"' sh mt-train "${flags[@]}" --exit-duration-in-mins 0.1 --save "$TMP/ck" \
    >"$TMP/first.jsonl" 2>"$TMP/first.log" && code=0 || code=$?
  [[ $code -eq 75 ]] || fail "exit $code: $(cat "$TMP/first.log")"
  [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 1 ]] || fail "$(cat "$TMP/first.log")"
  timeout 120 mpirun -np 2 mt-train "${flags[@]}" --load "$TMP/ck" >"$TMP/second.jsonl" 2>"$TMP/second.log" ||
    fail "$(cat "$TMP/second.log")"
  timeout 120 mpirun -np 2 mt-train "${flags[@]}" >"$TMP/straight.jsonl" 2>"$TMP/straight.log" || fail "$(cat "$TMP/straight.log")"
  [[ "$(trace "$TMP/straight.jsonl")" == "$(trace "$TMP/first.jsonl" "$TMP/second.jsonl")" ]] ||
    fail "$(diff <(trace "$TMP/straight.jsonl") <(trace "$TMP/first.jsonl" "$TMP/second.jsonl"))"
}

@test "issue24: the dry run's weights, grads and optimizer per rank are what the run allocates (CP 2 with the distributed optimizer)" {
  command -v mpirun >/dev/null || skip "no mpirun"
  local -a flags=(--model tiny-llama --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 4
                  --train-iters 1 --eval-iters 0 --peak-tflops 1 --context-parallel-size 2 --use-distributed-optimizer)
  run_split mt-train "${flags[@]}" --dry-run --world-size 2
  [[ $status -eq 0 ]] || fail "$status $err"
  local planned measured
  planned="$(jq -c '.memory.per_rank | [.weights_bytes, .grads_bytes, .optim_bytes]' <<<"$out")"
  # The optimizer's shards are over DP x CP: half the grads' elements, two fp32 moments each.
  jq -e '.memory.per_rank.optim_bytes == .memory.per_rank.grads_bytes' <<<"$out" >/dev/null || fail "$planned"
  timeout 120 mpirun -np 2 mt-train "${flags[@]}" >"$TMP/run.jsonl" 2>"$TMP/run.log" || fail "$(cat "$TMP/run.log")"
  measured="$(jq -c -s '[.[] | select(.record == "memory")][0] | [.weights_bytes, .grads_bytes, .optim_bytes]' "$TMP/run.jsonl")"
  [[ "$planned" == "$measured" ]] || fail "planned $planned, measured $measured"
}
