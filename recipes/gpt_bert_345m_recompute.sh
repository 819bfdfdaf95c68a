#!/bin/bash
# The GPT-345M / BERT-345M recompute and sequence-parallel study (github.com/sidjha1/Megatron-LM-
# Benchmarks: 24 layers, hidden 1024, 16 heads on 8 V100; GPT at TP4 PP2 and TP8 PP1, BERT at TP2
# PP2 and TP4 PP2; seq 512-2048; baseline, SP, selective, SP + selective, full recompute; ms per
# iteration over 100 iterations). Its batch and precision were never published: this recipe
# assumes micro-batch 4, global batch 32 and fp16 (V100s have no bf16), 100 iterations.
# A driver: `bash recipes/gpt_bert_345m_recompute.sh [ROW...]` submits one job per row (this file
# again, with MT_ROW set), ROW = MODEL-tpTppP-sSEQ-MODE, e.g. gpt-tp4pp2-s1024-selective; no ROW:
# every row. MT_SCALE=tiny submits each row on 8 CPU ranks; MT_DRY_RUN=1 runs each row's full-scale
# mt-train --dry-run instead. BERT rows train BERT-345M (tiny-bert in tiny mode) on WordPiece
# sentences (common.sh's DATA_KIND=bert: tiny mode splits the corpus into sentences and tokenizes
# them with tests/golden/wordpiece/vocab-uncased.txt, learned from the same corpus). What mt-train
# refuses with BERT the recipe refuses by name: a full-scale run (--device cuda: the CUDA attention
# is causal only); BERT's dry run plans the CPU table's run against the V100's memory (--device cpu
# --peak-device), its SP rows included.
# MT_SBATCH names the submit command (default sbatch). README "Running a recipe".
# Tested in tests/slurm/slurm.bats (a GPT row and a BERT SP row, tiny) and tests/slurm/recipes.bats.
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append

set -euo pipefail

if [[ -n "${SLURM_JOB_ID:-}" && "$0" == */slurm_script ]]; then
  self="$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')"
else
  self="${BASH_SOURCE[0]}"
fi
MT_ROOT="${MT_ROOT:-$(cd "$(dirname "$self")/.." && pwd)}"
export MT_ROOT

all_rows() {
  local model layout seq mode
  for model in gpt bert; do
    for layout in $([[ $model == gpt ]] && echo tp4pp2 tp8pp1 || echo tp2pp2 tp4pp2); do
      for seq in 512 1024 1536 2048; do
        for mode in baseline sp selective sp-selective full; do echo "$model-$layout-s$seq-$mode"; done
      done
    done
  done
}

# MODEL TP PP SEQ MODE of a row name, or a one-line error naming it.
parse_row() {
  [[ "$1" =~ ^(gpt|bert)-tp([0-9]+)pp([0-9]+)-s([0-9]+)-(baseline|sp|selective|sp-selective|full)$ ]] &&
    all_rows | grep -x "$1" >/dev/null ||
    { echo "gpt_bert_345m_recompute: $1: no such row (MODEL-tpTppP-sSEQ-MODE of the study)" >&2; return 2; }
  echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]} ${BASH_REMATCH[3]} ${BASH_REMATCH[4]} ${BASH_REMATCH[5]}"
}

run_row() {
  local model tp pp seq mode
  read -r model tp pp seq mode <<<"$(parse_row "$MT_ROW")"
  local refusal
  refusal="$(bert_refusal "$model")"
  [[ -z "$refusal" ]] || { echo "gpt_bert_345m_recompute: $MT_ROW: refused: $refusal" >&2; exit 2; }
  RECIPE="gpt_bert_345m_recompute.$MT_ROW"
  WORLD=8 TP=$tp PP=$pp CP=1 SP=0
  [[ $mode != sp && $mode != sp-selective ]] || SP=1
  TRAIN_ARGS=(--seq-length "$seq" --max-position-embeddings "$seq" --micro-batch-size 4 --global-batch-size 32
              --train-iters 100 --lr 1.5e-4 --lr-warmup-iters 10 --fp16 --eval-interval 100 --eval-iters 1 --log-interval 10)
  case $mode in
    selective|sp-selective) TRAIN_ARGS+=(--recompute-granularity selective) ;;
    full) TRAIN_ARGS+=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1) ;;
  esac
  if [[ $model == gpt ]]; then
    MODEL_ARGS=(--model gpt2-345m) TINY_FAMILY=gpt
    TOKENIZER_ARGS=(--tokenizer-type GPT2BPETokenizer --vocab-file "$MT_ROOT/data/tokenizers/gpt2/encoder.json"
                    --merge-file "$MT_ROOT/data/tokenizers/gpt2/vocab.bpe")
  else
    # BERT-345M's uncased WordPiece vocabulary (30,522 tokens, the preset's) is not in the
    # repository: the full-scale dry run needs only the tokenizer type.
    MODEL_ARGS=(--model bert-345m) TINY_FAMILY=bert DATA_KIND=bert
    TOKENIZER_ARGS=(--tokenizer-type BertWordPieceLowerCase)
  fi
  PEAK_DEVICE=v100-sxm CLUSTER=""
  PUBLISHED="ms per iteration in the study's tables (not copied into this repository)"
  PUBLISHED_SOURCE="github.com/sidjha1/Megatron-LM-Benchmarks README"
  source "$MT_ROOT/recipes/common.sh"
  mt_recipe_main
}

# Why mt-train cannot run a row of MODEL as asked (empty: it can).
bert_refusal() {
  [[ $1 == bert ]] || return 0
  if [[ "${MT_SCALE:-full}" == full && "${MT_DRY_RUN:-0}" != 1 ]]; then
    echo "mt-train refuses BERT with --device cuda (the CUDA attention is causal only, with no padding mask): MT_SCALE=tiny runs the row on CPU ranks, MT_DRY_RUN=1 plans it"
  fi
}

submit_rows() {
  local rows=("$@") row refused=0 submitted=0 dry_failed=0
  [[ ${#rows[@]} -gt 0 ]] || mapfile -t rows < <(all_rows)
  for row in "${rows[@]}"; do
    local fields
    fields="$(parse_row "$row")" || exit 2
    local refusal model tp pp seq mode
    read -r model tp pp seq mode <<<"$fields"
    refusal="$(bert_refusal "$model")"
    if [[ -n "$refusal" ]]; then
      echo "gpt_bert_345m_recompute: $row: refused: $refusal" >&2
      refused=$((refused + 1))
      continue
    fi
    if [[ "${MT_DRY_RUN:-0}" == 1 ]]; then
      local status=0
      MT_ROW="$row" bash "$MT_ROOT/recipes/gpt_bert_345m_recompute.sh" || status=$?
      echo "gpt_bert_345m_recompute: $row: dry run exit $status" >&2
      [[ $status -eq 0 ]] || dry_failed=$((dry_failed + 1))
      submitted=$((submitted + 1))
      continue
    fi
    local resources=(--job-name="mt-345m-$row" --output="mt-345m-$row-%j.out" --nodes=1 --ntasks=8)
    if [[ "${MT_SCALE:-full}" == tiny ]]; then
      resources+=(--cpus-per-task=1 --time=15)
    else
      resources+=(--ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=8 --time=01:00:00)
    fi
    echo "gpt_bert_345m_recompute: $row: $(${MT_SBATCH:-sbatch} --parsable "${resources[@]}" --export="ALL,MT_ROW=$row,MT_ROOT=$MT_ROOT" \
      "$MT_ROOT/recipes/gpt_bert_345m_recompute.sh")"
    submitted=$((submitted + 1))
  done
  [[ $submitted -gt 0 || $refused -eq 0 ]] || exit 2
  [[ $dry_failed -eq 0 ]] || exit 2
}

if [[ -n "${MT_ROW:-}" ]]; then run_row; else submit_rows "$@"; fi
