#!/bin/bash
# LLaMA-3 8B on 8 H100 (one node): TP 1 x PP 1 x CP 2 x DP 4, seq 8192, the layout of Megatron-LM's
# parallelism guide ("LLaMA-3 8B": TP1 PP1 CP2 on 8 GPUs). The guide gives no batch: this recipe
# assumes micro-batch 1, global batch 128 (1M tokens a step), bf16, full activation recompute.
# At this layout a rank needs about 89 GiB at mt's memory (mt keeps fp32 master weights and grads
# whole on every rank; its distributed optimizer shards Adam's moments only), over the H100's 80 GB,
# so the dry run refuses it naming the memory (MT_GPU=h200 fits); Megatron fits it with bf16
# weights and sharded fp32 masters. Tiny mode keeps the whole layout (8 ranks).
# Run: sbatch recipes/llama8b_cp2.sh; tiny: MT_SCALE=tiny sbatch --ntasks=8 --gpus-per-node=0
# --cpus-per-task=1 recipes/llama8b_cp2.sh. README "Running a recipe".
# Tested in tests/slurm/slurm.bats (tiny, preemption, time limit) and tests/slurm/recipes.bats.
#SBATCH --job-name=mt-llama8b
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=mt-llama8b-%j.out

RECIPE=llama8b_cp2
WORLD=8 TP=1 PP=1 CP=2 SP=0
MODEL_ARGS=(--model llama3-8b)
TRAIN_ARGS=(--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 128
            --train-iters 1000 --lr 3e-4 --min-lr 3e-5 --lr-warmup-iters 100 --lr-decay-style cosine
            --weight-decay 0.1 --clip-grad 1.0 --bf16 --recompute-granularity full --recompute-method uniform
            --recompute-num-layers 1 --overlap-grad-reduce --overlap-param-gather
            --eval-interval 500 --eval-iters 10 --log-interval 10)
TINY_FAMILY=llama
TOKENIZER_ARGS=(--tokenizer-type TikTokenizer --tokenizer-model "${MT_ROOT:-.}/data/tokenizers/llama3/tokenizer.model")
PEAK_DEVICE=h100 CLUSTER=dgx-h100 NEEDS_GPU=h200
PUBLISHED="none: the guide gives the layout, no throughput"
PUBLISHED_SOURCE="Megatron-LM parallelism guide"

# sbatch runs a copy of this file from its spool directory: find the checkout from the job.
if [[ -n "${SLURM_JOB_ID:-}" && "$0" == */slurm_script ]]; then
  self="$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')"
else
  self="${BASH_SOURCE[0]}"
fi
source "${MT_ROOT:-$(cd "$(dirname "$self")/.." && pwd)}/recipes/common.sh"
mt_recipe_main
