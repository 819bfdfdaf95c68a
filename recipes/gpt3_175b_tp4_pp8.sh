#!/bin/bash
# GPT-3 175B on 512 H100 (64 nodes x 8): TP 4 x PP 8 x DP 16, sequence parallel, seq 2048, the
# layout of Megatron-LM's parallelism guide ("GPT-3 175B": TP4 PP8 on 128-512 GPUs; 512 here, the
# size the seed's figure names), global batch 1536 and micro-batch 1 from Megatron's
# examples/gpt3/train_gpt3_175b_distributed.sh (whose own layout is TP8 PP16, fp16); bf16 here, as
# the guide's H100 runs. Full recompute: with selective mt puts a rank at 108 GB. The seed's "390 TFLOP/s at 47%" has no primary source and does not add up
# (390/989 is 39%): not printed as published. Tiny mode keeps TP 4 x PP 8 (DP 16 -> 1, 32 ranks).
# Run: sbatch recipes/gpt3_175b_tp4_pp8.sh; tiny: MT_SCALE=tiny sbatch --nodes=1 --ntasks=32
# --ntasks-per-node=32 --gpus-per-node=0 --cpus-per-task=1 recipes/gpt3_175b_tp4_pp8.sh.
# Tested in tests/slurm/slurm.bats (tiny) and tests/slurm/recipes.bats (dry run).
#SBATCH --job-name=mt-gpt3-175b
#SBATCH --nodes=64
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=mt-gpt3-175b-%j.out

RECIPE=gpt3_175b_tp4_pp8
WORLD=512 TP=4 PP=8 CP=1 SP=1
MODEL_ARGS=(--model gpt3-175b)
TRAIN_ARGS=(--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 1536
            --train-iters 1000 --lr 6e-5 --min-lr 6e-6 --lr-warmup-iters 100 --lr-decay-style cosine
            --weight-decay 0.1 --clip-grad 1.0 --bf16 --recompute-granularity full --recompute-method uniform
            --recompute-num-layers 1 --overlap-grad-reduce --overlap-param-gather --eval-interval 500 --eval-iters 10 --log-interval 10)
TINY_FAMILY=gpt
TOKENIZER_ARGS=(--tokenizer-type GPT2BPETokenizer --vocab-file "${MT_ROOT:-.}/data/tokenizers/gpt2/encoder.json"
                --merge-file "${MT_ROOT:-.}/data/tokenizers/gpt2/vocab.bpe")
PEAK_DEVICE=h100 CLUSTER=dgx-h100
PUBLISHED="none for this layout (the seed's 390 TFLOP/s at 47% has no primary source and is inconsistent)"
PUBLISHED_SOURCE="Megatron-LM parallelism guide"

# sbatch runs a copy of this file from its spool directory: find the checkout from the job.
if [[ -n "${SLURM_JOB_ID:-}" && "$0" == */slurm_script ]]; then
  self="$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')"
else
  self="${BASH_SOURCE[0]}"
fi
source "${MT_ROOT:-$(cd "$(dirname "$self")/.." && pwd)}/recipes/common.sh"
mt_recipe_main
