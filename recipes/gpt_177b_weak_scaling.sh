#!/bin/bash
# Megatron-Core r0.8's weak-scaling row "177B" on 2304 H100 (288 nodes x 8): TP 8 x PP 6 x DP 48,
# 96 layers, hidden 12288, 96 heads, vocabulary 131072, seq 4096, global batch 1152, bf16, the
# communication overlaps on; published 432.8 TFLOP/s per GPU, 44% MFU (Megatron-LM README, "Training
# speed and scalability", images/model_table.png). Not the gpt3-175b preset: vocabulary 131072 and
# seq 4096. Tiny mode: TP 8 kept, PP 6 -> 4 and DP 48 -> 1 (32 ranks).
# Run: sbatch recipes/gpt_177b_weak_scaling.sh; tiny: MT_SCALE=tiny sbatch --nodes=1 --ntasks=32
# --ntasks-per-node=32 --gpus-per-node=0 --cpus-per-task=1 recipes/gpt_177b_weak_scaling.sh.
# Tested in tests/slurm/slurm.bats (tiny) and tests/slurm/recipes.bats (dry run).
#SBATCH --job-name=mt-gpt-177b
#SBATCH --nodes=288
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=mt-gpt-177b-%j.out

RECIPE=gpt_177b_weak_scaling
WORLD=2304 TP=8 PP=6 CP=1 SP=1
MODEL_ARGS=(--model gpt3-175b --vocab-size 131072)
TRAIN_ARGS=(--seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 1152
            --train-iters 1000 --lr 6e-5 --min-lr 6e-6 --lr-warmup-iters 100 --lr-decay-style cosine
            --weight-decay 0.1 --clip-grad 1.0 --bf16 --recompute-granularity selective
            --overlap-grad-reduce --overlap-param-gather --eval-interval 500 --eval-iters 10 --log-interval 10)
TINY_FAMILY=gpt
TOKENIZER_ARGS=(--tokenizer-type GPT2BPETokenizer --vocab-file "${MT_ROOT:-.}/data/tokenizers/gpt2/encoder.json"
                --merge-file "${MT_ROOT:-.}/data/tokenizers/gpt2/vocab.bpe")
PEAK_DEVICE=h100 CLUSTER=dgx-h100
PUBLISHED="432.8 TFLOP/s per GPU, 44% MFU"
PUBLISHED_SOURCE="Megatron-LM README, r0.8 weak scaling, 177B row"

# sbatch runs a copy of this file from its spool directory: find the checkout from the job.
if [[ -n "${SLURM_JOB_ID:-}" && "$0" == */slurm_script ]]; then
  self="$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')"
else
  self="${BASH_SOURCE[0]}"
fi
source "${MT_ROOT:-$(cd "$(dirname "$self")/.." && pwd)}/recipes/common.sh"
mt_recipe_main
