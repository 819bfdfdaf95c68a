# recipes/common.sh: what every recipe shares, sourced by recipes/*.sh after they set their
# configuration (the variables below). It picks the scale, lowers the layout in tiny mode, runs
# the chain mt-tokenize -> mt-shard -> mt-train -> mt-ckpt verify -> mt-mfu / mt-memreport through
# sbatch/mt-launch, survives preemption (USR1 forwarded, exit 75 requeued, a restart resumes with
# --load and skips data steps whose outputs verify) and ends with the summary table.
# README "Running a recipe" documents the user's side. Tested in tests/slurm/slurm.bats (tiny runs
# under a real Slurm) and tests/slurm/recipes.bats (layouts, dry runs, refusals).
#
# A recipe sets, before sourcing this file:
#   RECIPE          its name (file name without .sh)
#   WORLD           GPUs of the published layout; TP PP CP (degrees), SP=1 for sequence parallel
#   FIRST_STAGE_LAYERS / LAST_STAGE_LAYERS   uneven pipeline stages (optional)
#   MODEL_ARGS      mt-train model flags of the full-scale model (a preset and overrides)
#   TRAIN_ARGS      full-scale batch, sequence, precision, recompute and schedule flags
#   TINY_FAMILY     llama, gpt or bert: which tiny model stands in for it
#   DATA_KIND       gpt (default: documents, BPE, mt-shard's cache) or bert (the block "BERT data")
#   TOKENIZER_ARGS  mt-tokenize flags of the full-scale tokenizer (files under $MT_ROOT)
#   PEAK_DEVICE, CLUSTER   GPU of perf/peak.h and cluster of study/predict.h it was published on
#   PUBLISHED, PUBLISHED_SOURCE   the published throughput ("none" where nothing was published)
#   NEEDS_GPU       set where the layout does not fit PEAK_DEVICE at mt's memory: the GPU it fits
#
# User variables (README "Running a recipe"): MT_SCALE (full|tiny, default full), MT_ROOT (the
# checkout, default: found from the script), MT_BIN (default $MT_ROOT/build/bin), MT_OUT (this
# run's directory), MT_DATA_JSONL (documents to tokenize), MT_DATA_DIR (tokenized data, shared by
# jobs), MT_DATA_PREFIX (an existing token dataset: skips tokenizing), MT_DRY_RUN=1 (only the
# full-scale mt-train --dry-run), MT_GPU (h100, h200 or a100: the GPU whose memory and cluster
# the dry run and the predictions use, default the published one), MT_TRAIN_ITERS (tiny mode's
# steps, default 4), MT_SAVE_INTERVAL (default 100, tiny 2), MT_TRAIN_EXTRA (more mt-train flags,
# split on spaces, e.g. "--exit-duration-in-mins 230").
# Partition and account are sbatch's own variables: SBATCH_PARTITION, SBATCH_ACCOUNT.

set -euo pipefail

MT_TINY_RANKS=32  # the CPU ranks tiny mode may use (tests/slurm's node advertises 32 CPUs)

say() { echo "recipe $RECIPE: $*" >&2; }
refuse() { echo "recipe $RECIPE: error: $*" >&2; exit 2; }

# --- scale and layout ----------------------------------------------------------------------------

# Tiny mode keeps every degree when the published world fits in MT_TINY_RANKS; otherwise it keeps
# TP and CP and lowers PP until TP x CP x PP fits, then fills the rest with DP. Prints what changed.
tiny_layout() {
  local full_dp=$((WORLD / (TP * CP * PP)))
  DP=$full_dp
  if [[ $WORLD -le $MT_TINY_RANKS ]]; then
    RANKS=$WORLD
    say "tiny mode keeps the published layout (TP $TP PP $PP CP $CP DP $DP on $RANKS ranks)"
    return 0
  fi
  local full_pp=$PP
  while [[ $((TP * CP * PP)) -gt $MT_TINY_RANKS && $PP -gt 1 ]]; do PP=$((PP - 1)); done
  [[ $((TP * CP * PP)) -le $MT_TINY_RANKS ]] || refuse "TP $TP x CP $CP does not fit in $MT_TINY_RANKS ranks"
  DP=$((MT_TINY_RANKS / (TP * CP * PP)))
  RANKS=$((TP * CP * PP * DP))
  local changed=()
  [[ $PP -eq $full_pp ]] || changed+=("PP $full_pp -> $PP")
  [[ $DP -eq $full_dp ]] || changed+=("DP $full_dp -> $DP")
  say "tiny mode: $WORLD GPUs do not fit in $MT_TINY_RANKS ranks: ${changed[*]} (TP $TP and CP $CP kept; $RANKS ranks)"
}

# Flags of the layout now in TP PP CP (and uneven stages).
layout_args() {
  local args=(--tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP" --context-parallel-size "$CP")
  [[ "${SP:-0}" != 1 || $TP -eq 1 ]] || args+=(--sequence-parallel)
  if [[ -n "${FIRST_STAGE_LAYERS:-}" && $PP -gt 1 ]]; then
    args+=(--decoder-first-pipeline-num-layers "$FIRST_STAGE_LAYERS" --decoder-last-pipeline-num-layers "$LAST_STAGE_LAYERS")
  fi
  args+=(--use-distributed-optimizer)
  printf '%s\n' "${args[@]}"
}

# The tiny stand-in's layers: one a stage; uneven stages stay uneven (1 layer on the first and the
# last stage, 2 on each middle one; at PP 2, 1 and 2).
tiny_stages() {
  TINY_LAYERS=$PP
  if [[ -n "${FIRST_STAGE_LAYERS:-}" && $PP -gt 1 ]]; then
    FIRST_STAGE_LAYERS=1 LAST_STAGE_LAYERS=1
    TINY_LAYERS=$((PP > 2 ? 2 + 2 * (PP - 2) : 3))
    [[ $PP -gt 2 ]] || LAST_STAGE_LAYERS=2
    say "tiny mode: uneven stages kept: $FIRST_STAGE_LAYERS layer on the first stage, $LAST_STAGE_LAYERS on the last, $TINY_LAYERS in all"
  fi
}

# The tiny stand-in model: TINY_LAYERS layers, heads and query groups that TP divides, a sequence
# that CP x TP divide.
tiny_model_args() {
  local groups=4 layers=$TINY_LAYERS
  [[ $TP -le 4 ]] || groups=$TP
  if [[ "$TINY_FAMILY" == llama ]]; then
    printf '%s\n' --model tiny-llama --group-query-attention --num-query-groups "$groups"
  elif [[ "$TINY_FAMILY" == bert ]]; then
    printf '%s\n' --model tiny-bert
  else
    printf '%s\n' --model tiny-gpt
  fi
  printf '%s\n' --num-layers "$layers" --hidden-size 64 --num-attention-heads 8 --ffn-hidden-size 128 \
    --seq-length 32 --max-position-embeddings 32
}

uses_megatron_fsdp() { [[ " ${TRAIN_ARGS[*]} " == *" --use-megatron-fsdp "* ]]; }

# The published run's precision and recompute flags, which tiny mode keeps, and its Megatron-FSDP
# flags (with FSDP, --overlap-grad-reduce too).
kept_train_flags() {
  local i=0
  while [[ $i -lt ${#TRAIN_ARGS[@]} ]]; do
    case "${TRAIN_ARGS[$i]}" in
      --bf16|--fp16|--use-megatron-fsdp) echo "${TRAIN_ARGS[$i]}" ;;
      --overlap-grad-reduce) ! uses_megatron_fsdp || echo "${TRAIN_ARGS[$i]}" ;;
      --data-parallel-sharding-strategy) echo "${TRAIN_ARGS[$i]}"; i=$((i + 1)); echo "${TRAIN_ARGS[$i]}" ;;
      --recompute-granularity|--recompute-method|--recompute-num-layers) echo "${TRAIN_ARGS[$i]}"; i=$((i + 1)); echo "${TRAIN_ARGS[$i]}" ;;
    esac
    i=$((i + 1))
  done
}

# --- steps ---------------------------------------------------------------------------------------

# A data step's outputs verify when each file listed in its manifest (size, mtime, path) is still
# there with the same size and mtime: written once, never rewritten by a restart.
outputs_verify() {
  local manifest="$1" size mtime path
  [[ -s "$manifest" ]] || return 1
  while read -r size mtime path; do
    [[ -f "$path" && "$(stat -c '%s %Y' "$path")" == "$size $mtime" ]] || return 1
  done <"$manifest"
}

write_manifest() {
  local manifest="$1"; shift
  stat -c '%s %Y %n' "$@" >"$manifest.tmp" && mv "$manifest.tmp" "$manifest"
}

STOP_REQUESTED=0
STEP_PID=""
on_usr1() {
  STOP_REQUESTED=1 INTERRUPTED=1
  say "SIGUSR1 (preemption or time limit ahead): forwarded to the running step"
  [[ -z "$STEP_PID" ]] || kill -USR1 "$STEP_PID" 2>/dev/null || true
}

# Runs one step through mt-launch in the background, so the batch shell's USR1 trap runs at once
# and forwards the signal. A stop asked for during a data step (which then ends early) requeues
# the job; mt-train's exit 75 has been requeued by mt-launch already.
run_step() {
  local status=0
  "$MT_ROOT/sbatch/mt-launch" "$@" &
  STEP_PID=$!
  # wait returns early when the USR1 trap runs: then wait again (127: it had ended already).
  local waited
  while :; do
    INTERRUPTED=0 waited=0
    wait "$STEP_PID" || waited=$?
    [[ $INTERRUPTED -eq 1 && $waited -eq 127 ]] && break
    status=$waited
    [[ $INTERRUPTED -eq 1 ]] || break
  done
  STEP_PID=""
  if [[ $status -eq 75 ]]; then
    say "stopped after a resumable checkpoint (exit 75)"
    exit 75
  fi
  if [[ $STOP_REQUESTED -eq 1 && $TRAINED -eq 0 ]]; then
    say "stopping before training ended: requeued, the restart resumes"
    [[ -z "${SLURM_JOB_ID:-}" ]] || scontrol requeue "$SLURM_JOB_ID"
    exit 75
  fi
  [[ $status -eq 0 ]] || { say "step '$*' failed (exit $status)"; exit "$status"; }
}

# --- the chain -----------------------------------------------------------------------------------

prepare_data() {
  mkdir -p "$MT_DATA_DIR"
  if [[ -n "${MT_DATA_PREFIX:-}" ]]; then DATA_PREFIX="$MT_DATA_PREFIX"; return 0; fi
  if is_bert; then bert_prepare_data; return 0; fi
  local tokenizer=("${TOKENIZER_ARGS[@]}")
  if [[ "$MT_SCALE" == tiny ]]; then
    # A 512-token BPE learned from the corpus stands in for the published tokenizer: a 128K
    # vocabulary would make the tiny model's embedding 99% of it and each step 4x slower.
    local bpe="$MT_DATA_DIR/bpe"
    if outputs_verify "$MT_DATA_DIR/bpe.manifest"; then
      say "tokenizer: outputs verify, skipped"
    else
      run_step --output "$MT_RUN_DIR/bpe.jsonl" -- "$MT_BIN/mt-tokenize" train --raw --input "$MT_TINY_TEXT" \
        --vocab-size 512 --output-dir "$bpe"
      write_manifest "$MT_DATA_DIR/bpe.manifest" "$bpe/encoder.json" "$bpe/vocab.bpe"
    fi
    tokenizer=(--tokenizer-type GPT2BPETokenizer --vocab-file "$bpe/encoder.json" --merge-file "$bpe/vocab.bpe")
  fi
  DATA_PREFIX="$MT_DATA_DIR/corpus_text_document"
  if outputs_verify "$MT_DATA_DIR/tokenize.manifest"; then
    say "mt-tokenize: outputs verify, skipped"
  else
    [[ -f "$MT_DATA_JSONL" ]] || refuse "MT_DATA_JSONL=$MT_DATA_JSONL: no such file (the documents to tokenize, one JSON object a line)"
    run_step --output "$MT_RUN_DIR/tokenize.jsonl" -- "$MT_BIN/mt-tokenize" --input "$MT_DATA_JSONL" "${tokenizer[@]}" \
      --append-eod --workers "${SLURM_CPUS_PER_TASK:-2}" --output-prefix "$MT_DATA_DIR/corpus" --log-interval 0
    write_manifest "$MT_DATA_DIR/tokenize.manifest" "$DATA_PREFIX.h5"
  fi
}

# Tiny mode's corpus: tiny shakespeare, one JSONL document per speech (as scripts/demo.sh).
tiny_corpus() {
  MT_TINY_TEXT="$MT_ROOT/data/demo/tinyshakespeare.txt"
  if is_bert; then bert_tiny_corpus; return 0; fi
  if [[ -z "${MT_DATA_JSONL:-}" ]]; then
    MT_DATA_JSONL="$MT_DATA_DIR/shakespeare.jsonl"
    if ! outputs_verify "$MT_DATA_DIR/corpus.manifest"; then
      mkdir -p "$MT_DATA_DIR"
      jq -R -s -c 'split("\n\n")[] | select(length > 0) | {text: (. + "\n\n")}' "$MT_TINY_TEXT" >"$MT_DATA_JSONL.tmp"
      mv "$MT_DATA_JSONL.tmp" "$MT_DATA_JSONL"
      write_manifest "$MT_DATA_DIR/corpus.manifest" "$MT_DATA_JSONL"
    fi
  fi
}

shard_data() {
  if is_bert; then say "mt-shard: skipped (mt-train builds BERT's sample index in memory)"; return 0; fi
  local manifest="$MT_DATA_DIR/shard-$RECIPE-$MT_SCALE.manifest"
  if outputs_verify "$manifest"; then
    say "mt-shard: outputs verify, skipped"
    return 0
  fi
  run_step --output "$MT_RUN_DIR/shard.jsonl" -- "$MT_BIN/mt-shard" build "${DATA_ARGS[@]}" "${SHARD_ARGS[@]}"
  local index
  index="$(jq -r 'select(.record=="summary" or .record=="index") | .output // .path // empty' "$MT_RUN_DIR/shard.jsonl" | head -1)"
  [[ -n "$index" && -f "$index" ]] || index="$(ls -t "$MT_DATA_DIR"/cache/*.h5 | head -1)"
  write_manifest "$manifest" "$index"
}

train() {
  local load=()
  if [[ -f "$CKPT_DIR/latest_checkpointed_iteration.txt" ]]; then
    load=(--load "$CKPT_DIR")
    say "resuming from $CKPT_DIR (iteration $(cat "$CKPT_DIR/latest_checkpointed_iteration.txt"), restart ${SLURM_RESTART_COUNT:-0})"
  fi
  # train.restart-N.jsonl: N is Slurm's restart count, or outside Slurm the next unused number.
  local start="${SLURM_RESTART_COUNT:-}"
  if [[ -z "$start" ]]; then
    start=0
    while [[ -e "$MT_RUN_DIR/train.restart-$start.jsonl" ]]; do start=$((start + 1)); done
  fi
  TRAIN_LOG="$MT_RUN_DIR/train.restart-$start.jsonl"
  local extra=()
  [[ -z "${MT_TRAIN_EXTRA:-}" ]] || read -r -a extra <<<"$MT_TRAIN_EXTRA"
  run_step --ranks "$RANKS" --output "$TRAIN_LOG" -- "$MT_BIN/mt-train" "${RUN_ARGS[@]}" "${extra[@]}" --save "$CKPT_DIR" --save-interval "$SAVE_INTERVAL" "${load[@]}"
  # srun can answer 0 for a step whose tasks never started: mt-train's summary record says it ran.
  jq -e -s 'any(.[]; .record == "summary")' "$TRAIN_LOG" >/dev/null 2>&1 ||
    { say "mt-train ended without its summary record (see the job's output): $TRAIN_LOG"; exit 1; }
  TRAINED=1
}

# --- the full-scale command line (dry run and the predictions) -----------------------------------

full_scale_args() {
  local layout
  mapfile -t layout < <(layout_args)
  FULL_ARGS=("${MODEL_ARGS[@]}" "${layout[@]}" "${TRAIN_ARGS[@]}")
}

# mt-train refuses --device cuda with BERT and with FSDP's grad sharding: their dry runs plan the
# CPU table.
dry_run() {
  local device=(--device cuda)
  if is_bert; then
    device=("${TOKENIZER_ARGS[@]}" --device cpu)
  elif uses_megatron_fsdp; then
    device=(--device cpu)
  fi
  "$MT_BIN/mt-train" "${FULL_ARGS[@]}" "${device[@]}" --data-path "${MT_DATA_PREFIX:-$MT_DATA_DIR/corpus_text_document}" \
    --split 969,30,1 --save "$CKPT_DIR" --dry-run --world-size "$WORLD" --peak-device "$PEAK_DEVICE"
}

# --- BERT data (DATA_KIND=bert) -----------------------------------------------------------------
# Pre-split sentences, a JSON list per document, tokenized by WordPiece without [CLS]/[SEP] (the
# dataset adds them per sample); mt-train builds the sample index itself (no mt-shard, no cache).
# Its dry run plans the CPU table, since mt-train refuses --device cuda with BERT.

is_bert() { [[ "${DATA_KIND:-gpt}" == bert ]]; }

# Tiny mode's vocabulary, the 3,000 uncased WordPiece tokens learned from tiny shakespeare (and War
# and Peace) for the tokenizer's goldens, and its sentences: one document per speech of tiny
# shakespeare, one sentence per line (the speaker's name, then each line of verse or prose).
bert_tiny_corpus() {
  TOKENIZER_ARGS=(--tokenizer-type BertWordPieceLowerCase --vocab-file "$MT_ROOT/tests/golden/wordpiece/vocab-uncased.txt")
  [[ -z "${MT_DATA_JSONL:-}" ]] || return 0
  MT_DATA_JSONL="$MT_DATA_DIR/shakespeare-sentences.jsonl"
  outputs_verify "$MT_DATA_DIR/corpus-sentences.manifest" && return 0
  mkdir -p "$MT_DATA_DIR"
  jq -R -s -c 'split("\n\n")[] | [split("\n")[] | select(length > 0)] | select(length > 0) | {text: .}' \
    "$MT_TINY_TEXT" >"$MT_DATA_JSONL.tmp"
  mv "$MT_DATA_JSONL.tmp" "$MT_DATA_JSONL"
  write_manifest "$MT_DATA_DIR/corpus-sentences.manifest" "$MT_DATA_JSONL"
}

# Tokenizes MT_DATA_JSONL's sentences.
bert_prepare_data() {
  DATA_PREFIX="$MT_DATA_DIR/corpus_text_document"
  if outputs_verify "$MT_DATA_DIR/tokenize.manifest"; then
    say "mt-tokenize: outputs verify, skipped"
    return 0
  fi
  [[ -f "$MT_DATA_JSONL" ]] || refuse "MT_DATA_JSONL=$MT_DATA_JSONL: no such file (documents whose text is a JSON list of sentences)"
  run_step --output "$MT_RUN_DIR/tokenize.jsonl" -- "$MT_BIN/mt-tokenize" --input "$MT_DATA_JSONL" "${TOKENIZER_ARGS[@]}" \
    --tokenizer-hf-no-include-special-tokens --workers "${SLURM_CPUS_PER_TASK:-2}" --output-prefix "$MT_DATA_DIR/corpus" --log-interval 0
  write_manifest "$MT_DATA_DIR/tokenize.manifest" "$DATA_PREFIX.h5"
}

# --- summary -------------------------------------------------------------------------------------

summary() {
  local predict="$MT_RUN_DIR/predict-full.jsonl" memory="$MT_RUN_DIR/memreport-full.jsonl"
  if [[ -n "$CLUSTER" ]]; then
    "$MT_BIN/mt-mfu" "${FULL_ARGS[@]}" --world-size "$WORLD" --device cuda --predict "$CLUSTER" >"$predict"
  fi
  "$MT_BIN/mt-memreport" "${FULL_ARGS[@]}" --world-size "$WORLD" --device cuda >"$memory"
  local gpu_bytes
  gpu_bytes="$(gpu_memory_bytes "$PEAK_DEVICE")"
  echo
  echo "== mt recipe $RECIPE: summary (MT_SCALE=$MT_SCALE) =="
  printf '%-22s %s\n' "published" "$PUBLISHED${PUBLISHED_SOURCE:+ ($PUBLISHED_SOURCE)}"
  [[ -n "$CLUSTER" ]] || printf '%-22s %s\n' "predicted, full scale" "none: study/predict.h has no cluster of ${PEAK_DEVICE}s"
  [[ -z "$CLUSTER" ]] || printf '%-22s %s\n' "predicted, full scale" "$(jq -r --arg c "$CLUSTER" 'select(.record=="prediction") |
    "mt-mfu --predict \($c), \(.world_size) GPUs: \(.tflops_per_device * 10 | round / 10) TFLOP/s per GPU, MFU \(.mfu * 1000 | round / 10)%, step \(.step_ms / 100 | round / 10) s"' "$predict")"
  printf '%-22s %s\n' "memory, full scale" "$(jq -r -s --argjson gpu "$gpu_bytes" --arg d "$PEAK_DEVICE" '[.[] | select(.record=="memory")] |
    max_by(.total_bytes) | "mt-memreport: \(.total_bytes / 1e9 * 10 | round / 10) GB on the most loaded rank (stage \(.stage)) of the \($d)'"'"'s \($gpu / 1e9) GB: \(if .total_bytes <= $gpu then "fits" else "does not fit" end)"' "$memory")"
  if [[ "$MT_SCALE" == tiny ]]; then measured_row; fi
}

# Bytes of memory of the GPUs the recipes name (data sheets).
gpu_memory_bytes() {
  case "$1" in
    h100) echo 80000000000 ;;
    h200) echo 141000000000 ;;
    a100) echo 80000000000 ;;
    v100-sxm) echo 32000000000 ;;
    *) refuse "GPU $1: no memory size known (h100, h200, a100, v100-sxm)" ;;
  esac
}

measured_row() {
  local logs=("$MT_RUN_DIR"/train.restart-*.jsonl)
  # One run per log for the tools: the last start's (the steps of every start are counted below).
  "$MT_BIN/mt-mfu" --from-log "$TRAIN_LOG" >"$MT_RUN_DIR/mfu.jsonl"
  "$MT_BIN/mt-memreport" --from-log "$TRAIN_LOG" >"$MT_RUN_DIR/memreport.jsonl"
  printf '%-22s %s\n' "measured, tiny" "$(jq -r -s --arg layout "TP $TP PP $PP CP $CP DP $DP" '
    [.[] | select(.record=="step")] as $s | [.[] | select(.record=="run")][0] as $r
    | "\($r.world_size) CPU ranks (\($layout)), \($s | length) steps: loss \($s[0].lm_loss * 1000 | round / 1000) -> \($s[-1].lm_loss * 1000 | round / 1000), last step \($s[-1].step_ms | round) ms"' "${logs[@]}")"
  printf '%-22s %s\n' "checkpoint" "$(jq -r 'select(.record=="verify") | "mt-ckpt verify: iteration \(.iteration), \(.tensors) tensors, \(.failed) failed"' "$MT_RUN_DIR/verify.jsonl")"
  printf '%-22s %s\n' "memory, tiny" "$(jq -r -s '[.[] | select(.record=="memory_check")] | max_by(.error | fabs) as $w
    | "mt-memreport --from-log: \(length) checks (stage x category), largest error \($w.error * 1000 | round / 10)% (\($w.category), predicted \($w.predicted_bytes) B, measured \($w.measured_bytes) B)"' "$MT_RUN_DIR/memreport.jsonl")"
}

# --- main ----------------------------------------------------------------------------------------

mt_recipe_main() {
  MT_SCALE="${MT_SCALE:-full}"
  if [[ -n "${MT_GPU:-}" ]]; then
    gpu_memory_bytes "$MT_GPU" >/dev/null
    PEAK_DEVICE="$MT_GPU" CLUSTER="dgx-$MT_GPU"
    [[ "$MT_GPU" != v100-sxm ]] || CLUSTER=""
  fi
  if [[ -n "${NEEDS_GPU:-}" && "$PEAK_DEVICE" != "$NEEDS_GPU" ]]; then
    say "warning: at mt's memory this layout does not fit a $PEAK_DEVICE (see the recipe's header); MT_GPU=$NEEDS_GPU fits"
  fi
  [[ "$MT_SCALE" == full || "$MT_SCALE" == tiny ]] || refuse "MT_SCALE=$MT_SCALE: expected full or tiny"
  MT_BIN="${MT_BIN:-$MT_ROOT/build/bin}"
  [[ -x "$MT_BIN/mt-train" ]] || refuse "MT_BIN=$MT_BIN: no mt-train there (build first: ./setup.sh build)"
  MT_OUT="${MT_OUT:-$PWD/runs/$RECIPE.$MT_SCALE.${SLURM_JOB_ID:-local-$(date -u +%Y%m%dT%H%M%S)}}"
  MT_DATA_DIR="${MT_DATA_DIR:-$MT_OUT/data}"
  export MT_RUN_DIR="${MT_RUN_DIR:-$MT_OUT/run}"
  CKPT_DIR="$MT_OUT/checkpoints"
  mkdir -p "$MT_RUN_DIR"
  TRAINED=0
  trap on_usr1 USR1
  full_scale_args
  if [[ "${MT_DRY_RUN:-0}" == 1 ]]; then
    dry_run
    return
  fi
  [[ "$MT_SCALE" == tiny ]] || run_full_scale
  tiny_layout
  tiny_stages
  local tiny_model layout kept
  mapfile -t tiny_model < <(tiny_model_args)
  mapfile -t layout < <(layout_args)
  mapfile -t kept < <(kept_train_flags)
  local iters="${MT_TRAIN_ITERS:-4}" gbs=$((DP * (PP > 2 ? PP : 2)))
  tiny_corpus
  prepare_data
  DATA_ARGS=(--data-path "$DATA_PREFIX" --split 98,1,1 --data-cache-path "$MT_DATA_DIR/cache")
  ! is_bert || DATA_ARGS=(--data-path "$DATA_PREFIX" --split 98,1,1 "${TOKENIZER_ARGS[@]}")
  SHARD_ARGS=(--seq-length 32 --global-batch-size "$gbs" --train-iters "$iters" --eval-interval "$iters" --eval-iters 1)
  shard_data
  RUN_ARGS=("${tiny_model[@]}" "${layout[@]}" "${kept[@]}" "${DATA_ARGS[@]}" --micro-batch-size 1 --global-batch-size "$gbs"
            --train-iters "$iters" --eval-interval "$iters" --eval-iters 1 --lr 3e-3 --lr-warmup-iters 1
            --log-interval 1 --peak-tflops 1)
  SAVE_INTERVAL="${MT_SAVE_INTERVAL:-2}"
  train
  run_step --output "$MT_RUN_DIR/verify.jsonl" -- "$MT_BIN/mt-ckpt" verify "$CKPT_DIR"
  summary
}

# Full scale: the dry run first (a flag or a layout that cannot work fails in seconds, before any
# data is touched), then the chain on the GPUs. mt-train refuses --device cuda with one line where
# the build has no CUDA backend or the node no GPU; the job then stops there, naming it.
run_full_scale() {
  dry_run >"$MT_RUN_DIR/dry-run.jsonl"
  RANKS=$WORLD
  prepare_data
  DATA_ARGS=(--data-path "$DATA_PREFIX" --split 969,30,1)
  SHARD_ARGS=("${TRAIN_ARGS[@]}")
  RUN_ARGS=("${FULL_ARGS[@]}" "${DATA_ARGS[@]}" --device cuda)
  SAVE_INTERVAL="${MT_SAVE_INTERVAL:-100}"
  train
  run_step --output "$MT_RUN_DIR/verify.jsonl" -- "$MT_BIN/mt-ckpt" verify "$CKPT_DIR"
  summary
  exit 0
}

# The checkout: MT_ROOT, else the directory above this file.
MT_ROOT="${MT_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
export MT_ROOT
