#!/usr/bin/env bats
# mt-train under mpirun: the world gives DP = world / (TP x CP x PP); every layout trains the same numbers as
# one rank (per-step loss and grad norm, evaluation loss within the fp32 equivalence bound of
# tests/mpi/training_equivalence.h, checked by its mt_equivalence_check) through the
# tool's flags; only rank 0 writes stdout; step records carry the multi-rank keys; N Slurm tasks
# that cannot form one world are refused (a faked environment); layouts mt-train does not run yet
# are refused by name; checkpoints (issue 14) resume bit for bit under DP, TP, PP, CP and their
# combinations, load under any other layout, and SIGUSR1 to mpirun saves and exits 75 (SIGTERM and
# SIGINT to mpirun save given OpenMPI's window, a signal to a rank ends with mt's last line: issue 28);
# --overlap-param-gather trains, saves and resumes as the blocking gather does. CP=2 runs on
# token data with document masks (and its memory is predicted to the byte), and LLaMA-3 70B's layout
# in miniature on 32 ranks; tiny-mixtral under EP, expert TP, TP + SP and PP with EP (issue 22). The full matrix of layouts, models and recompute modes is
# tests/mpi/test_data_parallel.cpp and tests/mpi/test_context_parallel_training.cpp.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

TINY=(--model tiny-llama --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
      --train-iters 10 --lr 3e-3 --lr-warmup-iters 2 --eval-interval 5 --eval-iters 2 --peak-tflops 1)

# Per-step [loss, grad norm] and eval losses of a record stream.
numbers() { jq -c -s '[[.[] | select(.record=="step") | [.lm_loss, .grad_norm]], [.[] | select(.record=="eval") | .lm_loss]]' "$1"; }

# The records of $1 equal those of $2 (one rank's) within the fp32 equivalence bound, step by step,
# with $3 steps (default 10) and $4 evals (default 2).
same_numbers() {
  "$MT_TEST_BIN/mt_equivalence_check" "$1" "$2" --steps "${3:-10}" --evals "${4:-2}" >/dev/null 2>"$TMP/check.err" \
    || fail "$(cat "$TMP/check.err"): $(numbers "$1") against one rank's $(numbers "$2")"
}

@test "DP=2, TP=2, TP=2 + SP and DP=2 with the distributed optimizer and overlap train one rank's numbers" {
  mt-train "${TINY[@]}" >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  local -a layouts=("" "--tensor-model-parallel-size 2" "--tensor-model-parallel-size 2 --sequence-parallel"
                    "--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 20000")
  for layout in "${layouts[@]}"; do
    # shellcheck disable=SC2086
    mpirun_n 2 mt-train "${TINY[@]}" $layout >"$TMP/two.jsonl" 2>"$TMP/two.err" || fail "'$layout': $(cat "$TMP/two.err")"
    same_numbers "$TMP/two.jsonl" "$TMP/one.jsonl"
  done
  # The run record says how the world was laid out.
  jq -e -s '.[0].world_size == 2 and .[0].parallel.data_parallel_size == 2 and .[0].parallel.use_distributed_optimizer' \
    "$TMP/two.jsonl" >/dev/null || fail "$(head -c 600 "$TMP/two.jsonl")"
}

@test "TP=2 x DP=2 on 4 ranks trains one rank's numbers" {
  mt-train "${TINY[@]}" >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  mpirun_n 4 mt-train "${TINY[@]}" --tensor-model-parallel-size 2 >"$TMP/four.jsonl" 2>"$TMP/four.err" \
    || fail "$(cat "$TMP/four.err")"
  same_numbers "$TMP/four.jsonl" "$TMP/one.jsonl"
  jq -e -s '.[0].parallel.data_parallel_size == 2 and .[0].parallel.tensor_model_parallel_size == 2' \
    "$TMP/four.jsonl" >/dev/null || fail "run record"
}

@test "DP=2 on token data with --eod-mask-loss and --hidden-dropout trains one rank's numbers" {
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/a" h5 100 0 counting:600:6:1
  local data=(--model tiny-gpt --data-path "$TMP/a" --split 90,5,5 --seq-length 16 --micro-batch-size 2
              --global-batch-size 8 --train-iters 10 --lr 3e-3 --eval-interval 5 --eval-iters 2 --peak-tflops 1
              --data-cache-path "$TMP/cache" --eod-mask-loss --hidden-dropout 0.1)
  mt-train "${data[@]}" >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  mpirun_n 2 mt-train "${data[@]}" --use-distributed-optimizer >"$TMP/two.jsonl" 2>"$TMP/two.err" \
    || fail "$(cat "$TMP/two.err")"
  same_numbers "$TMP/two.jsonl" "$TMP/one.jsonl"
}

@test "CP=2 on token data with document masks, --eod-mask-loss and --hidden-dropout trains one rank's numbers" {
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/a" h5 100 0 counting:600:6:1
  local data=(--model tiny-llama --data-path "$TMP/a" --split 90,5,5 --seq-length 16 --micro-batch-size 2
              --global-batch-size 8 --train-iters 10 --lr 3e-3 --eval-interval 5 --eval-iters 2 --peak-tflops 1
              --data-cache-path "$TMP/cache" --eod-mask-loss --reset-attention-mask --reset-position-ids
              --hidden-dropout 0.1 --recompute-granularity selective)
  mt-train "${data[@]}" >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  mpirun_n 2 mt-train "${data[@]}" --context-parallel-size 2 >"$TMP/two.jsonl" 2>"$TMP/two.err" \
    || fail "$(cat "$TMP/two.err")"
  same_numbers "$TMP/two.jsonl" "$TMP/one.jsonl"
  jq -e -s '.[0].parallel.context_parallel_size == 2 and .[0].parallel.data_parallel_size == 1' \
    "$TMP/two.jsonl" >/dev/null || fail "run record"
  # The memory model counts ring attention's buffers: activations predicted to the byte.
  mt-memreport --from-log "$TMP/two.jsonl" >"$TMP/memory.jsonl" 2>"$TMP/memory.err" || fail "$(cat "$TMP/memory.err")"
  jq -e -s '[.[] | select(.record=="memory_check" and .category=="activations")] | length == 1 and .[0].error == 0' \
    "$TMP/memory.jsonl" >/dev/null || fail "$(cat "$TMP/memory.jsonl")"
}

@test "LLaMA-3 70B's layout in miniature (TP=4 + SP x CP=2 x PP=4, 32 ranks) trains one rank's numbers" {
  # Shaped as the seed layout: GQA with query groups a multiple of TP, layers split over 4 stages,
  # sequences split over CP then TP. --peak-tflops is given so no rank probes the FMA peak.
  local seed=(--model tiny-llama --num-layers 4 --hidden-size 64 --num-attention-heads 8 --group-query-attention
              --num-query-groups 4 --ffn-hidden-size 128 --seq-length 32 --max-position-embeddings 32 --mock-data
              --vocab-size 97 --micro-batch-size 1 --global-batch-size 4 --train-iters 3 --lr 3e-3 --eval-interval 3
              --eval-iters 1 --peak-tflops 1)
  mt-train "${seed[@]}" >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  mpirun_n 32 mt-train "${seed[@]}" --tensor-model-parallel-size 4 --sequence-parallel --context-parallel-size 2 \
    --pipeline-model-parallel-size 4 >"$TMP/seed.jsonl" 2>"$TMP/seed.err" || fail "$(cat "$TMP/seed.err")"
  same_numbers "$TMP/seed.jsonl" "$TMP/one.jsonl" 3 1
  jq -e -s '.[0].world_size == 32 and .[0].parallel.data_parallel_size == 1' "$TMP/seed.jsonl" >/dev/null \
    || fail "run record"
}

@test "under mpirun only rank 0 writes stdout; step records carry the multi-rank keys" {
  run_split mpirun_n 2 mt-train "${TINY[@]}" --train-iters 3 --log-interval 1
  [[ $status -eq 0 ]] || fail "$err"
  printf '%s\n' "$out" >"$TMP/out.jsonl"
  jq -e -s '[.[] | select(.record=="run")] | length == 1' "$TMP/out.jsonl" >/dev/null || fail "$out"
  jq -e -s '[.[] | select(.record=="step")] | length == 3 and all(.mem_peak_bytes > 0 and (.mem_peak_rank | IN(0, 1))
    and .comm_wait_ms >= 0 and .comm_share >= 0 and .comm_share <= 1)' "$TMP/out.jsonl" >/dev/null || fail "$out"
  # Megatron's log line once per iteration, from rank 0.
  [[ "$(grep -c ' iteration        2/       3 |' <<<"$err")" -eq 1 ]] || fail "$err"
  [[ "$err" != *"[rank 1]  iteration"* ]] || fail "rank 1 logged: $err"
}

@test "N Slurm tasks without PMIx or OpenMPI variables are refused, not run as N copies" {
  run_split env SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0 mt-train "${TINY[@]}" --train-iters 3
  [[ $status -eq 2 && -z "$out" ]] || fail "exited $status: $out $err"
  [[ "$err" == "mt-train: error: SLURM_STEP_NUM_TASKS=2: started as 2 tasks without PMIx or OpenMPI variables, so they cannot form one world (each would train alone); launch with srun --mpi=pmix or mpirun" ]] \
    || fail "$err"
  # One task is a one-rank run.
  run_split env SLURM_STEP_NUM_TASKS=1 mt-train "${TINY[@]}" --train-iters 3
  [[ $status -eq 0 ]] || fail "$err"
}

@test "PP=2 (1F1B), PP=2 with 2 virtual stages and PP=2 with uneven stages train one rank's numbers" {
  # Tiny GPT: the tied embedding's grads are summed between the first and the last stage.
  local -a model=(--model tiny-gpt --num-layers 4)
  mt-train "${TINY[@]}" "${model[@]}" >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  local -a layouts=("--pipeline-model-parallel-size 2"
                    "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2"
                    "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --microbatch-group-size-per-virtual-pipeline-stage 4"
                    "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3")
  for layout in "${layouts[@]}"; do
    # shellcheck disable=SC2086
    mpirun_n 2 mt-train "${TINY[@]}" "${model[@]}" $layout >"$TMP/two.jsonl" 2>"$TMP/two.err" \
      || fail "'$layout': $(cat "$TMP/two.err")"
    same_numbers "$TMP/two.jsonl" "$TMP/one.jsonl"
    # The busiest stage's compute and the longest schedule run: the run holds the compute.
    jq -e -s '[.[] | select(.record=="step")] | all(.compute_ms > 0 and .pipeline_ms >= .compute_ms)' \
      "$TMP/two.jsonl" >/dev/null || fail "'$layout': $(cat "$TMP/two.jsonl")"
  done
  jq -e -s '.[0].parallel.pipeline_model_parallel_size == 2 and .[0].parallel.data_parallel_size == 1' \
    "$TMP/two.jsonl" >/dev/null || fail "run record"
}

@test "PP=2 x DP=2 and PP=2 x TP=2 on 4 ranks train one rank's numbers" {
  mt-train "${TINY[@]}" >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  for layout in "--use-distributed-optimizer" "--tensor-model-parallel-size 2 --sequence-parallel"; do
    # shellcheck disable=SC2086
    mpirun_n 4 mt-train "${TINY[@]}" --pipeline-model-parallel-size 2 $layout >"$TMP/four.jsonl" 2>"$TMP/four.err" \
      || fail "'$layout': $(cat "$TMP/four.err")"
    same_numbers "$TMP/four.jsonl" "$TMP/one.jsonl"
  done
}

@test "layouts mt-train does not run yet, or that do not fit the world, are refused by name on every rank" {
  run_split mpirun_n 2 mt-train "${TINY[@]}" --context-parallel-size 2 --seq-length 18
  [[ $status -ne 0 && "$err" == *"mt-train: error: --seq-length 18: not divisible by 2 x --context-parallel-size 2 (each context-parallel rank holds two of 2 x CP chunks)"* ]] \
    || fail "$status $err"
  run_split mpirun_n 2 mt-train "${TINY[@]}" --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2
  [[ $status -ne 0 && "$err" == *"mt-train: error: "*"--num-layers 2"* ]] || fail "$status $err"
  run_split mpirun_n 2 mt-train "${TINY[@]}" --tensor-model-parallel-size 4
  [[ $status -ne 0 && "$err" == *"mt-train: error: world size 2: not divisible by --tensor-model-parallel-size 4"* ]] \
    || fail "$status $err"
  run_split mpirun_n 2 mt-train "${TINY[@]}" --use-distributed-optimizer --overlap-param-gather
  [[ $status -ne 0 && "$err" == *"mt-train: error: --overlap-param-gather: needs --overlap-grad-reduce"* ]] \
    || fail "$status $err"
}

@test "DP=2, TP=2 and PP=2 --save-final write the parameters one rank trains" {
  mt-train "${TINY[@]}" --train-iters 3 --eval-iters 0 --save-final "$TMP/one.h5" >/dev/null 2>"$TMP/one.err" \
    || fail "$(cat "$TMP/one.err")"
  mpirun_n 2 mt-train "${TINY[@]}" --train-iters 3 --eval-iters 0 --use-distributed-optimizer \
    --save-final "$TMP/two.h5" >/dev/null 2>"$TMP/two.err" || fail "$(cat "$TMP/two.err")"
  mpirun_n 2 mt-train "${TINY[@]}" --train-iters 3 --eval-iters 0 --tensor-model-parallel-size 2 \
    --save-final "$TMP/tp.h5" >/dev/null 2>"$TMP/tp.err" || fail "$(cat "$TMP/tp.err")"
  mpirun_n 2 mt-train "${TINY[@]}" --train-iters 3 --eval-iters 0 --pipeline-model-parallel-size 2 \
    --save-final "$TMP/pp.h5" >/dev/null 2>"$TMP/pp.err" || fail "$(cat "$TMP/pp.err")"
  mt-ckpt verify "$TMP/tp.h5" >/dev/null || fail "TP=2's --save-final does not verify"
  mt-ckpt verify "$TMP/pp.h5" >/dev/null || fail "PP=2's --save-final does not verify"
  for two in two tp pp; do
  /usr/bin/python3 - "$TMP/one.h5" "$TMP/$two.h5" <<'EOF' || fail "$two: checkpoints differ"
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
names = []
a["model"].visit(lambda n: names.append(n) if isinstance(a["model"][n], h5py.Dataset) else None)
assert names, "no parameters"
for n in names:
    x, y = a["model"][n][...], b["model"][n][...]
    assert np.allclose(x, y, rtol=1e-4, atol=1e-6), n
EOF
  done
}

# ---- issue 14: checkpoints on several ranks (every rank writes its slices through parallel HDF5) ----

CKPT=(--model tiny-llama --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
      --lr 3e-3 --lr-warmup-iters 2 --lr-decay-iters 10 --eval-interval 5 --eval-iters 1 --peak-tflops 1)

# [record, iteration, loss, grad norm] of steps and evaluations, in the order of the files.
trace() { cat "$@" | jq -c 'select(.record == "step" or .record == "eval") | [.record, .iteration, .lm_loss, .grad_norm]'; }

# `launch RANKS ...`: mt-train on one rank without mpirun, else under mpirun -np RANKS.
launch() {
  local ranks="$1"
  shift
  if [[ "$ranks" == 1 ]]; then mt-train "$@"; else mpirun_n "$ranks" mt-train "$@"; fi
}

# `resumes_exactly LAYOUT CUT TOTAL FLAGS...`: TOTAL steps straight under LAYOUT ("RANKS flags...")
# equal CUT + save + load + the rest, bit for bit; the checkpoint is one verified file, written
# once (rank 0 alone logged it), with no temporaries left.
resumes_exactly() {
  local layout="$1" cut="$2" total="$3"
  shift 3
  rm -rf "$TMP/ck"
  # shellcheck disable=SC2086
  launch $layout "$@" --train-iters "$total" >"$TMP/straight.jsonl" 2>"$TMP/straight.err" || fail "$(cat "$TMP/straight.err")"
  # shellcheck disable=SC2086
  launch $layout "$@" --train-iters "$cut" --save "$TMP/ck" >"$TMP/first.jsonl" 2>"$TMP/first.err" || fail "$(cat "$TMP/first.err")"
  # shellcheck disable=SC2086
  launch $layout "$@" --train-iters "$total" --load "$TMP/ck" >"$TMP/second.jsonl" 2>"$TMP/second.err" \
    || fail "$(cat "$TMP/second.err")"
  [[ "$(trace "$TMP/straight.jsonl")" == "$(trace "$TMP/first.jsonl" "$TMP/second.jsonl")" ]] ||
    fail "'$layout': $(diff <(trace "$TMP/straight.jsonl") <(trace "$TMP/first.jsonl" "$TMP/second.jsonl"))"
  [[ "$(trace "$TMP/second.jsonl" | head -n 1)" == "[\"step\",$((cut + 1)),"* ]] || fail "'$layout': resumed at $(trace "$TMP/second.jsonl" | head -n 1)"
  mt-ckpt verify "$TMP/ck/iter_$(printf %07d "$cut")/checkpoint.h5" >/dev/null || fail "'$layout': the checkpoint does not verify"
  [[ -z "$(find "$TMP/ck" -name '*.tmp-*')" ]] || fail "'$layout': temporaries left: $(find "$TMP/ck")"
  [[ "$(grep -c 'mt-train: saved ' "$TMP/first.err")" == 1 ]] || fail "'$layout': $(cat "$TMP/first.err")"
}

# CKPT with a 20-iteration schedule (the later flag wins).
CKPT20=("${CKPT[@]}" --lr-decay-iters 20)

@test "issue14: 20 steps straight equal 10 + save + load + 10 bit for bit on TP=2 x DP=2 with the distributed optimizer, DP=2 with it, TP=2 + SP and CP=2" {
  local -a layouts=("4 --tensor-model-parallel-size 2 --use-distributed-optimizer" "2 --use-distributed-optimizer"
                    "2 --tensor-model-parallel-size 2 --sequence-parallel"
                    "2 --context-parallel-size 2 --use-distributed-optimizer")
  for layout in "${layouts[@]}"; do resumes_exactly "$layout" 10 20 "${CKPT20[@]}"; done
}

# The steps and evaluations after iteration $3 of $1 equal those of $2 (the unchanged run) within
# the fp32 equivalence bound: $4 steps and $5 evaluations of them.
same_after() {
  "$MT_TEST_BIN/mt_equivalence_check" "$1" "$2" --after "$3" --steps "$4" --evals "$5" >/dev/null 2>"$TMP/check.err" \
    || fail "$(cat "$TMP/check.err"): $(trace "$1") against $(trace "$2")"
}

@test "issue14: saved under TP=2, DP=2 with the distributed optimizer or CP=2, loaded on one rank (and the reverse): the next 10 steps equal the unchanged run within the fp32 bound" {
  mt-train "${CKPT20[@]}" --train-iters 20 >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  local -a pairs=("2 --tensor-model-parallel-size 2|1" "2 --use-distributed-optimizer|1"
                  "1|2 --tensor-model-parallel-size 2" "1|2 --use-distributed-optimizer"
                  "2 --tensor-model-parallel-size 2|2 --use-distributed-optimizer"
                  "2 --context-parallel-size 2 --use-distributed-optimizer|1" "1|2 --context-parallel-size 2")
  for pair in "${pairs[@]}"; do
    rm -rf "$TMP/ck"
    # shellcheck disable=SC2086
    launch ${pair%|*} "${CKPT20[@]}" --train-iters 10 --save "$TMP/ck" >/dev/null 2>"$TMP/save.err" || fail "'$pair': $(cat "$TMP/save.err")"
    # shellcheck disable=SC2086
    launch ${pair#*|} "${CKPT20[@]}" --train-iters 20 --load "$TMP/ck" >"$TMP/load.jsonl" 2>"$TMP/load.err" \
      || fail "'$pair': $(cat "$TMP/load.err")"
    same_after "$TMP/load.jsonl" "$TMP/one.jsonl" 10 10 2  # steps 11 to 20 and the evaluations at 15 and 20
  done
}

# Pipeline layouts: tiny GPT (a tied word embedding, held by the first and the last stage) with 4
# layers, 20 iterations.
PIPE=(--model tiny-gpt --num-layers 4 --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
      --lr 3e-3 --lr-warmup-iters 2 --lr-decay-iters 20 --eval-interval 5 --eval-iters 1 --peak-tflops 1)

@test "issue14: 20 steps straight equal 10 + save + load + 10 bit for bit under PP=2, PP=2 x 2 virtual stages and PP=2 x DP=2 with the distributed optimizer" {
  local -a layouts=("2 --pipeline-model-parallel-size 2"
                    "2 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2"
                    "4 --pipeline-model-parallel-size 2 --use-distributed-optimizer")
  for layout in "${layouts[@]}"; do
    resumes_exactly "$layout" 10 20 "${PIPE[@]}"
    # Every tensor of the whole model (the tied word embedding once, no output layer), with its optimizer state.
    /usr/bin/python3 - "$TMP/ck/iter_0000010/checkpoint.h5" <<'EOF' || fail "'$layout': the checkpoint's tensors"
import sys, h5py
f = h5py.File(sys.argv[1], "r")
names = set(f["model"].keys())
assert "embedding.word_embeddings.weight" in names and not any(n.startswith("output_layer") for n in names), sorted(names)
assert {n.split(".")[2] for n in names if n.startswith("decoder.layers.")} == {"0", "1", "2", "3"}, sorted(names)
assert set(f["optimizer/exp_avg"].keys()) == names and set(f["optimizer/exp_avg_sq"].keys()) == names
EOF
  done
}

@test "issue14: saved under PP=2 (with 2 virtual stages, or uneven) and loaded under PP=1, and the reverse: the next steps equal the unchanged run within the fp32 bound" {
  mt-train "${PIPE[@]}" --train-iters 20 >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  local -a pairs=("2 --pipeline-model-parallel-size 2|1" "1|2 --pipeline-model-parallel-size 2"
                  "2 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2|2 --tensor-model-parallel-size 2"
                  "2 --use-distributed-optimizer|2 --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3")
  for pair in "${pairs[@]}"; do
    rm -rf "$TMP/ck"
    # shellcheck disable=SC2086
    launch ${pair%|*} "${PIPE[@]}" --train-iters 10 --save "$TMP/ck" >/dev/null 2>"$TMP/save.err" || fail "'$pair': $(cat "$TMP/save.err")"
    # shellcheck disable=SC2086
    launch ${pair#*|} "${PIPE[@]}" --train-iters 20 --load "$TMP/ck" >"$TMP/load.jsonl" 2>"$TMP/load.err" \
      || fail "'$pair': $(cat "$TMP/load.err")"
    same_after "$TMP/load.jsonl" "$TMP/one.jsonl" 10 10 2
  done
}

@test "issue14: SIGUSR1 to mpirun with --save: the ranks stop at one step, save, exit 75; the resumed run is the straight run" {
  local -a run=("${CKPT[@]}" --train-iters 200 --lr-decay-iters 200 --eval-interval 1000 --use-distributed-optimizer)
  mpirun_n 2 mt-train "${run[@]}" >"$TMP/straight.jsonl" 2>"$TMP/straight.err" || fail "$(cat "$TMP/straight.err")"
  # mpirun itself gets the signal (as from a launcher), not a shell or timeout around it.
  mpirun -np 2 --oversubscribe mt-train "${run[@]}" --save "$TMP/ck" >"$TMP/first.jsonl" 2>"$TMP/first.err" &
  local launcher=$!
  for _ in $(seq 300); do grep -q '"record":"step"' "$TMP/first.jsonl" && break; sleep 0.1; done
  kill -USR1 "$launcher"
  local status=0
  wait "$launcher" || status=$?
  [[ $status == 75 ]] || fail "mpirun exited $status: $(cat "$TMP/first.err")"
  local stopped
  stopped="$(cat "$TMP/ck/latest_checkpointed_iteration.txt")"
  (( stopped >= 1 && stopped < 200 )) || fail "stopped at $stopped"
  grep -q "mt-train: stopped by SIGUSR1 after iteration $stopped of 200; saved a checkpoint in $TMP/ck" "$TMP/first.err" \
    || fail "$(cat "$TMP/first.err")"
  jq -e -s '.[-1].record == "summary" and .[-1].stopped_by == "SIGUSR1"' "$TMP/first.jsonl" >/dev/null || fail "$(tail -n 1 "$TMP/first.jsonl")"
  mt-ckpt verify "$TMP/ck/iter_$(printf %07d "$stopped")/checkpoint.h5" >/dev/null || fail "the checkpoint does not verify"
  mpirun_n 2 mt-train "${run[@]}" --load "$TMP/ck" >"$TMP/second.jsonl" 2>"$TMP/second.err" || fail "$(cat "$TMP/second.err")"
  [[ "$(trace "$TMP/straight.jsonl")" == "$(trace "$TMP/first.jsonl" "$TMP/second.jsonl")" ]] ||
    fail "$(diff <(trace "$TMP/straight.jsonl") <(trace "$TMP/first.jsonl" "$TMP/second.jsonl"))"
}

@test "issue14: a save failing under mpirun fails every rank with one line and leaves the previous checkpoint named" {
  local -a run=("${CKPT[@]}" --train-iters 4 --eval-iters 0 --use-distributed-optimizer --save "$TMP/ck")
  mpirun_n 2 mt-train "${run[@]}" >/dev/null 2>"$TMP/first.err" || fail "$(cat "$TMP/first.err")"
  local point
  for point in mid-tensor before-rename before-tracker; do
    run_split env MT_CHECKPOINT_FAULT="$point" timeout 300 mpirun -np 2 --oversubscribe -x MT_CHECKPOINT_FAULT \
      mt-train "${run[@]}" --train-iters 6 --load "$TMP/ck"
    [[ $status -ne 0 && "$err" == *"mt-train: error: checkpoint: injected fault at $point (MT_CHECKPOINT_FAULT)"* ]] \
      || fail "$point: $status $err"
    [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 4 ]] || fail "$point: the tracker moved"
    mt-ckpt verify "$TMP/ck/iter_0000004/checkpoint.h5" >/dev/null || fail "$point: the previous checkpoint does not verify"
  done
}

@test "--overlap-param-gather: DP=2 trains the blocking gather's numbers bit for bit and writes the same verified checkpoint; it resumes bit for bit" {
  local -a sharded=(--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 2000)
  mpirun_n 2 mt-train "${CKPT[@]}" "${sharded[@]}" --train-iters 6 --save "$TMP/blocking" >"$TMP/blocking.jsonl" \
    2>"$TMP/blocking.err" || fail "$(cat "$TMP/blocking.err")"
  mpirun_n 2 mt-train "${CKPT[@]}" "${sharded[@]}" --overlap-param-gather --train-iters 6 --save "$TMP/overlap" \
    >"$TMP/overlap.jsonl" 2>"$TMP/overlap.err" || fail "$(cat "$TMP/overlap.err")"
  [[ "$(trace "$TMP/blocking.jsonl" | wc -l)" == 8 ]] || fail "$(trace "$TMP/blocking.jsonl")"
  [[ "$(trace "$TMP/overlap.jsonl")" == "$(trace "$TMP/blocking.jsonl")" ]] ||
    fail "$(diff <(trace "$TMP/blocking.jsonl") <(trace "$TMP/overlap.jsonl"))"
  mt-ckpt verify "$TMP/overlap/iter_0000006/checkpoint.h5" >/dev/null || fail "the checkpoint does not verify"
  /usr/bin/python3 - "$TMP/blocking/iter_0000006/checkpoint.h5" "$TMP/overlap/iter_0000006/checkpoint.h5" <<'EOF' \
    || fail "the checkpoints differ"
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
names = []
a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
assert any(n.startswith("model/") for n in names) and any(n.startswith("optimizer/") for n in names), names
for n in names:
    assert np.array_equal(a[n][...], b[n][...]), n
EOF
  resumes_exactly "2 ${sharded[*]} --overlap-param-gather" 5 10 "${CKPT[@]}"
}

@test "issue14: every rank writes its own slices: DP=2 with the distributed optimizer and TP=2 split the save between two writers, DP=2 without it leaves one" {
  local layout
  for layout in "--use-distributed-optimizer" "--tensor-model-parallel-size 2" ""; do
    rm -rf "$TMP/ck"
    # shellcheck disable=SC2086
    mpirun_n 2 mt-train "${CKPT[@]}" --train-iters 2 --eval-iters 0 --save "$TMP/ck" $layout >"$TMP/save.jsonl" 2>"$TMP/save.err" \
      || fail "'$layout': $(cat "$TMP/save.err")"
    local split
    split="$(jq -c 'select(.record == "ckpt" and .event == "save") | [.writers, .largest_share_bytes, .bytes]' "$TMP/save.jsonl")"
    if [[ -z "$layout" ]]; then
      jq -e '.[0] == 1 and .[1] < .[2]' <<<"$split" >/dev/null || fail "'$layout': $split"
    else
      # Two writers, neither writing more than 60% of the file's tensor bytes.
      jq -e '.[0] == 2 and .[1] * 10 < .[2] * 6' <<<"$split" >/dev/null || fail "'$layout': $split"
    fi
    mt-ckpt verify "$TMP/ck/iter_0000002/checkpoint.h5" >/dev/null || fail "'$layout': the checkpoint does not verify"
  done
}

@test "signals: every thread of every rank blocks SIGHUP, SIGINT, SIGUSR1 and SIGTERM (one waiting thread takes them; no handler interrupts the compute)" {
  local -a run=("${CKPT[@]}" --train-iters 100000 --lr-decay-iters 100000 --eval-interval 100000 --use-distributed-optimizer)
  mpirun -np 2 --oversubscribe mt-train "${run[@]}" --save "$TMP/ck" >"$TMP/run.jsonl" 2>"$TMP/run.err" &
  local launcher=$!
  for _ in $(seq 300); do grep -q '"record":"step"' "$TMP/run.jsonl" && break; sleep 0.1; done
  local -a ranks
  local pid
  for pid in $(pgrep -f -- "--save $TMP/ck"); do [[ "$(readlink "/proc/$pid/exe")" == */mt-train ]] && ranks+=("$pid"); done
  # Every thread blocks them (bits 0, 1, 9 and 14 of SigBlk) but the one waiting for them in
  # sigwait, whose mask the kernel lifts while it waits: one per rank.
  local threads=0 waiting=0 unblocked="" task mask
  for pid in "${ranks[@]}"; do
    for task in /proc/"$pid"/task/*; do
      mask="$(awk '/^SigBlk:/ { print $2 }' "$task/status" 2>/dev/null)" || continue
      [[ -n "$mask" ]] || continue
      threads=$((threads + 1))
      if [[ "$(cat "$task/wchan" 2>/dev/null)" == *sigtimedwait* ]]; then waiting=$((waiting + 1))
      elif (( (16#$mask & 16#4203) != 16#4203 )); then unblocked+=" $task:$mask"; fi
    done
  done
  kill -USR1 "$launcher"
  wait "$launcher" || true
  (( ${#ranks[@]} == 2 )) || fail "ranks found: ${ranks[*]}"
  (( threads > 2 )) || fail "only $threads threads"
  [[ -z "$unblocked" ]] || fail "threads that do not block the signals:$unblocked"
  (( waiting == 2 )) || fail "$waiting threads waiting for the signals, not one per rank"
}

# The pid of the rank $2 of mpirun $1.
rank_pid() {
  local pid
  for pid in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$pid/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$pid"
  done
}

@test "issue28 L4: SIGTERM or SIGINT (Ctrl-C) to mpirun, given OpenMPI's window before SIGKILL, saves a checkpoint that verifies" {
  # mpirun told to terminate sends the ranks SIGCONT, SIGTERM odls_base_sigkill_timeout seconds
  # later and SIGKILL as long again after that, and stops reading their output (rank 0 used to
  # block in write(2) and never save). README "Signals under mpirun".
  local -a run=("${CKPT[@]}" --train-iters 100000 --lr-decay-iters 100000 --eval-interval 100000)
  local signal
  for signal in TERM INT; do
    rm -rf "$TMP/ck"
    OMPI_MCA_odls_base_sigkill_timeout=4 mpirun -np 2 --oversubscribe mt-train "${run[@]}" --save "$TMP/ck" \
      >"$TMP/run.jsonl" 2>"$TMP/run.err" &
    local launcher=$!
    for _ in $(seq 300); do grep -q '"record":"step"' "$TMP/run.jsonl" && break; sleep 0.1; done
    kill "-$signal" "$launcher"
    wait "$launcher" || true
    local saved
    saved="$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" || fail "SIG$signal: no checkpoint: $(cat "$TMP/run.err")"
    (( saved >= 1 )) || fail "SIG$signal: tracker $saved"
    mt-ckpt verify "$TMP/ck" >/dev/null || fail "SIG$signal: the checkpoint does not verify"
  done
}

@test "issue28 U9: a signal to one rank under mpirun -q (OMPI_MCA_orte_execute_quiet=1) ends with mt's last line and exit 75, no job-aborted banner" {
  local -a run=("${CKPT[@]}" --train-iters 100000 --lr-decay-iters 100000 --eval-interval 100000)
  local rank
  for rank in 1 0; do
    rm -rf "$TMP/ck"
    OMPI_MCA_orte_execute_quiet=1 mpirun -np 2 --oversubscribe mt-train "${run[@]}" --save "$TMP/ck" \
      >"$TMP/run.jsonl" 2>"$TMP/run.err" &
    local launcher=$!
    for _ in $(seq 300); do grep -q '"record":"step"' "$TMP/run.jsonl" && break; sleep 0.1; done
    kill -TERM "$(rank_pid "$launcher" "$rank")"
    local status=0
    wait "$launcher" || status=$?
    [[ $status == 75 ]] || fail "rank $rank: mpirun exited $status: $(cat "$TMP/run.err")"
    local saved
    saved="$(cat "$TMP/ck/latest_checkpointed_iteration.txt")"
    [[ "$(tail -n 1 "$TMP/run.err")" == "[rank 0] mt-train: stopped by SIGTERM after iteration $saved of 100000; saved a checkpoint in $TMP/ck (resume with --load)" ]] \
      || fail "rank $rank: $(tail -n 5 "$TMP/run.err")"
    ! grep -q -e "job has been aborted" -e "mpirun detected" "$TMP/run.err" || fail "rank $rank: $(cat "$TMP/run.err")"
  done
}

MIXTRAL=(--model tiny-mixtral --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
         --train-iters 6 --lr 3e-3 --lr-warmup-iters 2 --eval-interval 3 --eval-iters 1 --moe-z-loss-coeff 1e-3
         --peak-tflops 1)

@test "issue22: tiny-mixtral under EP=2 (x DP=2), EP=4, EP=2 x ETP=2, TP=2 + SP with EP=2, PP=2 with EP=2 and TP=2 + SP x PP=2 x EP=2 on 8 ranks trains one rank's numbers (loss, grad norm, aux and z-loss, tokens per expert)" {
  mt-train "${MIXTRAL[@]}" >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  mpirun_n 2 mt-train "${MIXTRAL[@]}" --expert-model-parallel-size 2 >"$TMP/two.jsonl" 2>"$TMP/two.err" \
    || fail "EP=2: $(cat "$TMP/two.err")"
  same_numbers "$TMP/two.jsonl" "$TMP/one.jsonl" 6 2
  local -a layouts=("--expert-model-parallel-size 2" "--expert-model-parallel-size 4"
                    "--expert-model-parallel-size 2 --expert-tensor-parallel-size 2"
                    "--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2"
                    "--pipeline-model-parallel-size 2 --expert-model-parallel-size 2")
  for layout in "${layouts[@]}"; do
    # shellcheck disable=SC2086
    mpirun_n 4 mt-train "${MIXTRAL[@]}" $layout >"$TMP/four.jsonl" 2>"$TMP/four.err" || fail "'$layout': $(cat "$TMP/four.err")"
    same_numbers "$TMP/four.jsonl" "$TMP/one.jsonl" 6 2
  done
  mpirun_n 8 mt-train "${MIXTRAL[@]}" --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2 \
    --expert-model-parallel-size 2 >"$TMP/eight.jsonl" 2>"$TMP/eight.err" || fail "$(cat "$TMP/eight.err")"
  same_numbers "$TMP/eight.jsonl" "$TMP/one.jsonl" 6 2
}

# tiny-mixtral with sigmoid routing and the expert bias (which moves the routing every step), 8 iterations.
MIXTRAL_BIAS=(--model tiny-mixtral --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
              --lr 3e-3 --lr-warmup-iters 2 --lr-decay-iters 8 --eval-interval 4 --eval-iters 1 --peak-tflops 1
              --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.05)

@test "issue22: tiny-mixtral with the expert bias resumes bit for bit on one rank and under EP=2; saved under EP=2 it loads on one rank and under EP=2 x ETP=2 within the fp32 bound" {
  resumes_exactly "1" 4 8 "${MIXTRAL_BIAS[@]}"
  resumes_exactly "2 --expert-model-parallel-size 2" 4 8 "${MIXTRAL_BIAS[@]}"
  h5ls -r "$TMP/ck/iter_0000004/checkpoint.h5" | grep -q "decoder.layers.1.mlp.router.expert_bias" \
    || fail "no expert bias in the checkpoint: $(h5ls -r "$TMP/ck/iter_0000004/checkpoint.h5")"
  h5ls -r "$TMP/ck/iter_0000004/checkpoint.h5" | grep -q "decoder.layers.0.mlp.experts.7.linear_fc2.weight" \
    || fail "no global expert 7 in the checkpoint"
  mt-train "${MIXTRAL_BIAS[@]}" --train-iters 8 >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  for load in "1" "4 --expert-model-parallel-size 2 --expert-tensor-parallel-size 2"; do
    # shellcheck disable=SC2086
    launch $load "${MIXTRAL_BIAS[@]}" --train-iters 8 --load "$TMP/ck" >"$TMP/load.jsonl" 2>"$TMP/load.err" \
      || fail "'$load': $(cat "$TMP/load.err")"
    same_after "$TMP/load.jsonl" "$TMP/one.jsonl" 4 4 1
  done
}

@test "issue22: tiny-mixtral with --calculate-per-token-loss under TP=2 + SP x EP=2 trains one rank's numbers; full recompute counts tokens and logs losses once (bit for bit the run without it)" {
  mt-train "${MIXTRAL[@]}" --calculate-per-token-loss >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  mpirun_n 4 mt-train "${MIXTRAL[@]}" --calculate-per-token-loss --tensor-model-parallel-size 2 --sequence-parallel \
    --expert-model-parallel-size 2 >"$TMP/four.jsonl" 2>"$TMP/four.err" || fail "$(cat "$TMP/four.err")"
  same_numbers "$TMP/four.jsonl" "$TMP/one.jsonl" 6 2
  mt-train "${MIXTRAL[@]}" >"$TMP/plain.jsonl" 2>"$TMP/plain.err" || fail "$(cat "$TMP/plain.err")"
  mt-train "${MIXTRAL[@]}" --recompute-granularity full --recompute-num-layers 1 >"$TMP/recompute.jsonl" \
    2>"$TMP/recompute.err" || fail "$(cat "$TMP/recompute.err")"
  moe_trace() { jq -c 'select(.record=="step") | [.lm_loss, .grad_norm, .load_balancing_loss, .z_loss, .moe_layers]' "$1"; }
  [[ "$(moe_trace "$TMP/recompute.jsonl")" == "$(moe_trace "$TMP/plain.jsonl")" ]] \
    || fail "$(diff <(moe_trace "$TMP/recompute.jsonl") <(moe_trace "$TMP/plain.jsonl"))"
}

# issue 22, global_aux_loss: layout-dependent by design (README "Mixture of experts"). Megatron sums
# each micro-batch's tokens per expert over TP x DP x CP and averages them over the global batch's
# micro-batches so far, so DP = 2 of micro-batch 2 sees what one rank sees with micro-batch 4; its
# aux grad is then the one rank's over DP (Megatron's, issue #3672), so one rank runs at half the
# coefficient. The counts restart every global batch: a resumed run equals the straight one only
# so, and full recompute counts each micro-batch once.
GLOBAL_AUX=(--model tiny-mixtral --mock-data --vocab-size 97 --seq-length 16 --global-batch-size 4 --lr 3e-3
            --lr-warmup-iters 2 --lr-decay-iters 6 --eval-interval 2 --eval-iters 1 --peak-tflops 1
            --moe-router-load-balancing-type global_aux_loss)

@test "issue22: global_aux_loss: DP=2 trains one rank's numbers at half the coefficient (global_load_balancing_loss included); the counts restart every global batch (resume bit for bit) and full recompute counts once" {
  mt-train "${GLOBAL_AUX[@]}" --train-iters 4 --micro-batch-size 4 --moe-aux-loss-coeff 5e-2 >"$TMP/one.jsonl" \
    2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  mpirun_n 2 mt-train "${GLOBAL_AUX[@]}" --train-iters 4 --micro-batch-size 2 --moe-aux-loss-coeff 1e-1 \
    >"$TMP/two.jsonl" 2>"$TMP/two.err" || fail "$(cat "$TMP/two.err")"
  jq -e -s '[.[] | select(.record=="step") | .global_load_balancing_loss | numbers] | length == 4' "$TMP/two.jsonl" \
    >/dev/null || fail "no global_load_balancing_loss: $(head -c 600 "$TMP/two.jsonl")"
  same_numbers "$TMP/two.jsonl" "$TMP/one.jsonl" 4 2
  resumes_exactly "1" 2 4 "${GLOBAL_AUX[@]}" --micro-batch-size 1 --moe-aux-loss-coeff 1e-1
  mt-train "${GLOBAL_AUX[@]}" --train-iters 2 --micro-batch-size 1 --moe-aux-loss-coeff 1e-1 >"$TMP/plain.jsonl" \
    2>"$TMP/plain.err" || fail "$(cat "$TMP/plain.err")"
  mt-train "${GLOBAL_AUX[@]}" --train-iters 2 --micro-batch-size 1 --moe-aux-loss-coeff 1e-1 \
    --recompute-granularity full --recompute-num-layers 1 >"$TMP/recompute.jsonl" 2>"$TMP/recompute.err" \
    || fail "$(cat "$TMP/recompute.err")"
  aux_trace() { jq -c 'select(.record=="step") | [.lm_loss, .grad_norm, .global_load_balancing_loss, .moe_layers]' "$1"; }
  [[ "$(aux_trace "$TMP/recompute.jsonl")" == "$(aux_trace "$TMP/plain.jsonl")" ]] \
    || fail "$(diff <(aux_trace "$TMP/recompute.jsonl") <(aux_trace "$TMP/plain.jsonl"))"
}
