#!/bin/bash
# LLaMA-3.1 405B on 1024 H100 (128 nodes x 8): TP 8 x PP 8 x CP 2 x DP 8, sequence parallel, the
# layout of Megatron-LM's parallelism guide ("LLaMA-3.1 405B": TP8 PP8 CP2). 126 layers do not
# divide by 8: uneven stages, 15 layers on the first and the last stage (each also holds the
# embedding or the output layer and loss) and 16 on the six others. The guide gives no batch: this
# recipe assumes seq 8192, micro-batch 1, global batch 2048 (16M tokens), bf16, full recompute.
# Meta's published 400 TFLOP/s per GPU is another layout (16,384 GPUs, TP8 CP1 PP16): not this one.
# Tiny mode: TP 8 x CP 2 kept, PP 8 -> 2 and DP 8 -> 1 (32 ranks), uneven stages kept (1 + 2 layers).
# Run: sbatch recipes/llama405b_tp8_pp8.sh; tiny: MT_SCALE=tiny sbatch --nodes=1 --ntasks=32
# --ntasks-per-node=32 --gpus-per-node=0 --cpus-per-task=1 recipes/llama405b_tp8_pp8.sh.
# Tested in tests/slurm/slurm.bats (tiny) and tests/slurm/recipes.bats (dry run).
#SBATCH --job-name=mt-llama405b
#SBATCH --nodes=128
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=mt-llama405b-%j.out

RECIPE=llama405b_tp8_pp8
WORLD=1024 TP=8 PP=8 CP=2 SP=1
FIRST_STAGE_LAYERS=15 LAST_STAGE_LAYERS=15
MODEL_ARGS=(--model llama3.1-405b)
TRAIN_ARGS=(--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 2048
            --train-iters 1000 --lr 8e-5 --min-lr 8e-7 --lr-warmup-iters 100 --lr-decay-style cosine
            --weight-decay 0.1 --clip-grad 1.0 --bf16 --recompute-granularity full --recompute-method uniform
            --recompute-num-layers 1 --overlap-grad-reduce --overlap-param-gather
            --eval-interval 500 --eval-iters 10 --log-interval 10)
TINY_FAMILY=llama
TOKENIZER_ARGS=(--tokenizer-type TikTokenizer --tokenizer-model "${MT_ROOT:-.}/data/tokenizers/llama3/tokenizer.model")
PEAK_DEVICE=h100 CLUSTER=dgx-h100
PUBLISHED="none for this layout (Meta's 400 TFLOP/s per GPU is TP8 CP1 PP16 on 16,384 GPUs)"
PUBLISHED_SOURCE="Megatron-LM parallelism guide; Llama 3 paper, Table 4"

# sbatch runs a copy of this file from its spool directory: find the checkout from the job.
if [[ -n "${SLURM_JOB_ID:-}" && "$0" == */slurm_script ]]; then
  self="$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')"
else
  self="${BASH_SOURCE[0]}"
fi
source "${MT_ROOT:-$(cd "$(dirname "$self")/.." && pwd)}/recipes/common.sh"
mt_recipe_main
