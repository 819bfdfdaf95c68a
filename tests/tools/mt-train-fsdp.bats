#!/usr/bin/env bats
# mt-train with Megatron-FSDP's flags (issue 25): --use-megatron-fsdp with
# --data-parallel-sharding-strategy optim_grads and optim_grads_params (with and without
# --no-fsdp-prefetch, and with --overlap-grad-reduce) trains one rank's numbers at DP=2 and CP=2
# (the matrix of layouts and models is tests/mpi/test_fsdp.cpp), its step records timing the unit
# gathers (fsdp_gather_ms, fsdp_gather_wait_ms) under optim_grads_params only and the unit grad
# reduce-scatters (fsdp_reduce_ms, fsdp_reduce_wait_ms) under both; its checkpoints are the same
# layout-independent files: saved under FSDP and loaded under plain DP, TP=2 or one rank, and saved under TP=2 and loaded under FSDP,
# the next steps equal the unchanged one-rank run within the fp32 bound; optim_grads_params
# resumed under itself (--ckpt-format fsdp_dtensor and the default) gives the uninterrupted run's
# records exactly. The flags refused by name: --use-torch-fsdp2, hybrid sharding, PP with grad
# sharding, --no-fsdp-prefetch without optim_grads_params, --ckpt-format other than fsdp_dtensor
# or without FSDP; --use-custom-fsdp warns. tiny-mixtral under optim_grads_params x EP=2 trains one
# rank's numbers and its checkpoint loads under one rank. mt-memreport's FSDP prediction against
# mt-train's measured memory at DP=2 and DP=4 (and with --overlap-grad-reduce), and for
# tiny-mixtral at EP=2 x expert-DP=2.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
}

teardown() { rm -rf "$TMP"; }

CKPT20=(--model tiny-llama --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
        --lr 3e-3 --lr-warmup-iters 2 --lr-decay-iters 20 --eval-interval 5 --eval-iters 1 --peak-tflops 1)
FSDP=(--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --ckpt-format fsdp_dtensor)
PARAMS=(--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor)

trace() { cat "$@" | jq -c 'select(.record == "step" or .record == "eval") | [.record, .iteration, .lm_loss, .grad_norm]'; }

launch() {
  local ranks="$1"
  shift
  if [[ "$ranks" == 1 ]]; then mt-train "$@"; else mpirun_n "$ranks" mt-train "$@"; fi
}

# The records of $1 after step $3 equal those of $2 (one rank's) within the fp32 equivalence bound.
same_after() {
  "$MT_TEST_BIN/mt_equivalence_check" "$1" "$2" --after "$3" --steps "$4" --evals "$5" >/dev/null 2>"$TMP/check.err" \
    || fail "$(cat "$TMP/check.err"): $(trace "$1") against $(trace "$2")"
}

@test "issue25: FSDP (optim_grads, optim_grads_params) at DP=2 and over CP=2 (DP x CP shards) trains one rank's numbers" {
  mt-train "${CKPT20[@]}" --train-iters 10 >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  for layout in "${FSDP[*]}" "${FSDP[*]} --context-parallel-size 2" "${PARAMS[*]}" \
                "${PARAMS[*]} --context-parallel-size 2" "${PARAMS[*]} --no-fsdp-prefetch" "${PARAMS[*]} --overlap-grad-reduce"; do
    # shellcheck disable=SC2086
    mpirun_n 2 mt-train "${CKPT20[@]}" $layout --train-iters 10 >"$TMP/fsdp.jsonl" 2>"$TMP/fsdp.err" \
      || fail "'$layout': $(cat "$TMP/fsdp.err")"
    same_after "$TMP/fsdp.jsonl" "$TMP/one.jsonl" 0 10 2
    # optim_grads_params' unit gathers in the step records: the time blocked on them within their
    # time, all of it when every gather blocks.
    local gathers
    case "$layout" in
      *--no-fsdp-prefetch*) gathers='.fsdp_gather_ms > 0 and .fsdp_gather_wait_ms >= 0.9 * .fsdp_gather_ms' ;;
      *optim_grads_params*) gathers='.fsdp_gather_ms > 0 and .fsdp_gather_wait_ms >= 0 and .fsdp_gather_wait_ms <= .fsdp_gather_ms' ;;
      *) gathers='has("fsdp_gather_ms") or has("fsdp_gather_wait_ms") | not' ;;
    esac
    jq -e -s "[.[] | select(.record == \"step\") | $gathers] | length == 10 and all" "$TMP/fsdp.jsonl" >/dev/null \
      || fail "'$layout' gathers: $(jq -c 'select(.record == "step") | [.fsdp_gather_ms, .fsdp_gather_wait_ms]' "$TMP/fsdp.jsonl")"
    # The unit grad reduce-scatters likewise: all wait unless overlapped (--overlap-grad-reduce).
    local reduces='.fsdp_reduce_ms > 0 and .fsdp_reduce_wait_ms >= 0.9 * .fsdp_reduce_ms'
    if [[ "$layout" == *--overlap-grad-reduce* ]]; then
      reduces='.fsdp_reduce_ms > 0 and .fsdp_reduce_wait_ms <= .fsdp_reduce_ms'
    fi
    jq -e -s "[.[] | select(.record == \"step\") | $reduces] | length == 10 and all" "$TMP/fsdp.jsonl" >/dev/null \
      || fail "'$layout' reductions: $(jq -c 'select(.record == "step") | [.fsdp_reduce_ms, .fsdp_reduce_wait_ms]' "$TMP/fsdp.jsonl")"
  done
}

@test "issue25: saved under FSDP (optim_grads, optim_grads_params; DP=2), loaded under DP=2, TP=2 or one rank, and saved under TP=2, loaded under FSDP: the next 10 steps equal the unchanged run" {
  mt-train "${CKPT20[@]}" --train-iters 20 >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  local -a pairs=("2 ${FSDP[*]}|2" "2 ${FSDP[*]}|2 --tensor-model-parallel-size 2"
                  "2 --tensor-model-parallel-size 2|2 ${FSDP[*]}" "2 ${PARAMS[*]}|1"
                  "2 --tensor-model-parallel-size 2|2 ${PARAMS[*]}")
  for pair in "${pairs[@]}"; do
    rm -rf "$TMP/ck"
    # shellcheck disable=SC2086
    launch ${pair%|*} "${CKPT20[@]}" --train-iters 10 --save "$TMP/ck" >/dev/null 2>"$TMP/save.err" || fail "'$pair': $(cat "$TMP/save.err")"
    # shellcheck disable=SC2086
    launch ${pair#*|} "${CKPT20[@]}" --train-iters 20 --load "$TMP/ck" >"$TMP/load.jsonl" 2>"$TMP/load.err" \
      || fail "'$pair': $(cat "$TMP/load.err")"
    same_after "$TMP/load.jsonl" "$TMP/one.jsonl" 10 10 2
  done
}

@test "issue25: optim_grads_params saved at step 10 and resumed under itself (fsdp_dtensor and the default format) gives the uninterrupted run's records exactly" {
  mpirun_n 2 mt-train "${CKPT20[@]}" "${PARAMS[@]}" --train-iters 20 >"$TMP/whole.jsonl" 2>"$TMP/whole.err" \
    || fail "$(cat "$TMP/whole.err")"
  local -a params_default=(--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params)
  for flags in "${PARAMS[*]}" "${params_default[*]}"; do
    rm -rf "$TMP/ck"
    # shellcheck disable=SC2086
    mpirun_n 2 mt-train "${CKPT20[@]}" $flags --train-iters 10 --save "$TMP/ck" >/dev/null 2>"$TMP/save.err" \
      || fail "'$flags': $(cat "$TMP/save.err")"
    # shellcheck disable=SC2086
    mpirun_n 2 mt-train "${CKPT20[@]}" $flags --train-iters 20 --load "$TMP/ck" >"$TMP/resumed.jsonl" 2>"$TMP/load.err" \
      || fail "'$flags': $(cat "$TMP/load.err")"
    local whole resumed
    whole="$(trace "$TMP/whole.jsonl" | jq -c 'select(.[1] > 10)')"
    resumed="$(trace "$TMP/resumed.jsonl" | jq -c 'select(.[1] > 10)')"
    [[ -n "$whole" && "$resumed" == "$whole" ]] || fail "'$flags': resumed $resumed against $whole"
  done
}

MIXTRAL=(--model tiny-mixtral --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
         --lr 3e-3 --lr-warmup-iters 2 --lr-decay-iters 20 --eval-interval 5 --eval-iters 1 --peak-tflops 1)

@test "issue25: tiny-mixtral under FSDP optim_grads_params x EP=2 trains one rank's numbers; saved at step 10 it loads under one rank and the next 10 steps equal the unchanged run" {
  mt-train "${MIXTRAL[@]}" --train-iters 20 >"$TMP/one.jsonl" 2>"$TMP/one.err" || fail "$(cat "$TMP/one.err")"
  mpirun_n 2 mt-train "${MIXTRAL[@]}" "${PARAMS[@]}" --expert-model-parallel-size 2 --train-iters 10 --save "$TMP/ck" \
    >"$TMP/fsdp.jsonl" 2>"$TMP/fsdp.err" || fail "$(cat "$TMP/fsdp.err")"
  same_after "$TMP/fsdp.jsonl" "$TMP/one.jsonl" 0 10 2
  h5ls -r "$TMP/ck/iter_0000010/checkpoint.h5" | grep -q "decoder.layers.1.mlp.experts.7.linear_fc2.weight" \
    || fail "no global expert 7 in the checkpoint: $(h5ls -r "$TMP/ck/iter_0000010/checkpoint.h5")"
  mt-train "${MIXTRAL[@]}" --train-iters 20 --load "$TMP/ck" >"$TMP/load.jsonl" 2>"$TMP/load.err" \
    || fail "$(cat "$TMP/load.err")"
  same_after "$TMP/load.jsonl" "$TMP/one.jsonl" 10 10 2
}

@test "issue25: FSDP settings mt does not run are refused by name; --use-custom-fsdp warns as Megatron does" {
  local -a cases=(
    "--use-torch-fsdp2|--use-torch-fsdp2"
    "--no-fsdp-prefetch|--no-fsdp-prefetch"
    "--use-megatron-fsdp --data-parallel-sharding-strategy optim --num-distributed-optimizer-instances 2|--num-distributed-optimizer-instances 2"
    "--use-megatron-fsdp --data-parallel-sharding-strategy optim --outer-dp-sharding-strategy optim|--outer-dp-sharding-strategy optim"
    "--use-megatron-fsdp --data-parallel-sharding-strategy zero3|--data-parallel-sharding-strategy"
    "--ckpt-format torch_dist|torch_dist"
    "--ckpt-format fsdp_dtensor|needs --use-megatron-fsdp")
  for c in "${cases[@]}"; do
    # shellcheck disable=SC2086
    run_split mt-train "${CKPT20[@]}" --train-iters 1 ${c%|*}
    [[ "$status" != 0 && "$err" == *"mt-train: error: "*"${c#*|}"* ]] || fail "'${c%|*}': exit $status: $err"
  done
  run_split mpirun_n 2 mt-train "${CKPT20[@]}" --train-iters 1 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads \
    --pipeline-model-parallel-size 2
  [[ "$status" != 0 && "$err" == *"--pipeline-model-parallel-size 2"* ]] || fail "PP=2 with FSDP: exit $status: $err"
  run_split mt-train "${CKPT20[@]}" --train-iters 1 --use-custom-fsdp --data-parallel-sharding-strategy optim_grads
  [[ "$status" == 0 ]] || fail "--use-custom-fsdp: exit $status: $err"
  [[ "$err" == *"--use-custom-fsdp is deprecated"* ]] || fail "no deprecation warning: $err"
}

@test "issue25: mt-memreport takes --use-megatron-fsdp: optim_grads_params shards plus gathered layers, optim the distributed optimizer" {
  local -a run=(--model tiny-llama --num-layers 6 --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8
                --world-size 2)
  memory() { mt-memreport "${run[@]}" "$@" | jq -c 'select(.record == "memory") | [.weights_bytes, .grads_bytes, .optimizer_bytes]'; }
  local plain optim fsdp
  plain="$(memory)" optim="$(memory --use-megatron-fsdp --data-parallel-sharding-strategy optim)"
  fsdp="$(memory --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params)"
  [[ "$(memory --use-distributed-optimizer)" == "$optim" ]] || fail "optim: $optim"
  [[ "$(memory --use-megatron-fsdp --data-parallel-sharding-strategy no_shard)" == "$plain" ]] || fail "no_shard"
  # FSDP: grads below the whole model's, moments those of a 1/2 shard (its 8 per-layer buckets padded), weights a
  # shard plus the root and two layers (below the model's).
  jq -e -n --argjson p "$plain" --argjson f "$fsdp" '$f[1] < $p[1] and $f[2] * 2 <= $p[2] + 2048 and $f[0] < $p[0]' \
    >/dev/null || fail "FSDP $fsdp against plain $plain"
}

# mt-memreport's prediction of mt-train's FSDP units, and mt-train's own plan before it allocates
# (the --dry-run record's per-rank memory), against the ledger's high-water marks of
# mt-train's step record (the largest over the ranks), at DP=2 and DP=4, and for tiny-mixtral with
# 3 layers at EP=2 x expert-DP=2 (4 ranks; the experts' buckets sliced over expert-DP, the rest
# over DP=4): weights, grads and optimizer bytes; the prediction leaves out the page rounding of
# the released regions, so the measured bytes are at least the predicted ones and at most two
# 4 KiB pages per bucket (one bucket per layer id and reduction group: 6 layers and the root's 2,
# or 3 layers' dense and expert buckets and the root's 2) above them.
@test "issue25: mt-memreport and mt-train's own check (--dry-run) predict mt-train's FSDP memory (optim_grads, optim_grads_params) at DP=2 and DP=4, and with experts, within two pages per bucket" {
  local -a run=(--model tiny-llama --num-layers 6 --vocab-size 97 --seq-length 16 --micro-batch-size 2 --global-batch-size 8)
  local slack=$((2 * 4096 * 8))
  fsdp_memory_matches() {
    local ranks="$1" strategy="$2"
    shift 2
    local predicted measured planned
    predicted="$(mt-memreport "$@" --world-size "$ranks" --use-megatron-fsdp --data-parallel-sharding-strategy "$strategy" |
      jq -c 'select(.record == "memory") | [.weights_bytes, .grads_bytes, .optimizer_bytes]')"
    measured="$(mpirun_n "$ranks" mt-train "$@" --mock-data --train-iters 1 --lr-warmup-iters 0 --eval-iters 0 \
      --peak-tflops 1 --use-megatron-fsdp --data-parallel-sharding-strategy "$strategy" 2>"$TMP/err" |
      jq -c 'select(.record == "step") | [.mem_weights_bytes, .mem_grads_bytes, .mem_optim_bytes]')" \
      || fail "$ranks $strategy $*: $(cat "$TMP/err")"
    jq -e -n --argjson p "$predicted" --argjson m "$measured" --argjson s "$slack" \
      '[range(3)] | all(. as $i | $m[$i] >= $p[$i] and $m[$i] <= $p[$i] + $s)' >/dev/null \
      || fail "$ranks ranks $strategy $*: predicted $predicted, measured $measured"
    # mt-train's own check before it allocates (its --dry-run record) counts the same.
    planned="$(mt-train "$@" --mock-data --train-iters 1 --use-megatron-fsdp --data-parallel-sharding-strategy "$strategy" \
      --dry-run --world-size "$ranks" 2>"$TMP/err" | jq -c '.memory.per_rank | [.weights_bytes, .grads_bytes, .optim_bytes]')" \
      || fail "dry run $ranks $strategy $*: $(cat "$TMP/err")"
    jq -e -n --argjson p "$planned" --argjson m "$measured" --argjson s "$slack" \
      '[range(3)] | all(. as $i | $m[$i] >= $p[$i] and $m[$i] <= $p[$i] + $s)' >/dev/null \
      || fail "$ranks ranks $strategy $*: mt-train --dry-run planned $planned, measured $measured"
  }
  for ranks in 2 4; do
    for strategy in optim_grads optim_grads_params; do
      fsdp_memory_matches "$ranks" "$strategy" "${run[@]}"
    done
  done
  fsdp_memory_matches 2 optim_grads_params "${run[@]}" --overlap-grad-reduce
  fsdp_memory_matches 4 optim_grads_params --model tiny-mixtral --num-layers 3 --vocab-size 97 --seq-length 16 \
    --micro-batch-size 2 --global-batch-size 8 --expert-model-parallel-size 2
}
