#!/bin/bash
# LLaMA-3 70B on 64 H100 (8 nodes x 8): TP 4 x PP 4 x CP 2 x DP 2, sequence parallel, seq 8192,
# micro-batch 1, global batch 512, bf16, the layout of Megatron-LM's parallelism guide
# (docs/user-guide/parallelism-guide.md, "LLaMA-3 70B": TP4 PP4 CP2, its example script's seq 8192;
# the 4K of a performance page is not what the guide's example runs). Full activation recompute:
# without it mt-memreport puts the first stage at 117 GB, over the H100's 80.
# Run: sbatch recipes/llama70b_tp4_pp4.sh (edit the data variables, SBATCH_PARTITION,
# SBATCH_ACCOUNT); tiny: MT_SCALE=tiny sbatch --nodes=1 --ntasks=32 --ntasks-per-node=32
# --gpus-per-node=0 --cpus-per-task=1 recipes/llama70b_tp4_pp4.sh. README "Running a recipe".
# Tested in tests/slurm/slurm.bats (tiny, under Slurm) and tests/slurm/recipes.bats (dry run).
#SBATCH --job-name=mt-llama70b
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=mt-llama70b-%j.out

RECIPE=llama70b_tp4_pp4
WORLD=64 TP=4 PP=4 CP=2 SP=1
MODEL_ARGS=(--model llama3-70b)
TRAIN_ARGS=(--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 512
            --train-iters 1000 --lr 1.5e-4 --min-lr 1.5e-5 --lr-warmup-iters 100 --lr-decay-style cosine
            --weight-decay 0.1 --clip-grad 1.0 --bf16 --recompute-granularity full --recompute-method uniform
            --recompute-num-layers 1 --overlap-grad-reduce --overlap-param-gather
            --eval-interval 500 --eval-iters 10 --log-interval 10)
TINY_FAMILY=llama
TOKENIZER_ARGS=(--tokenizer-type TikTokenizer --tokenizer-model "${MT_ROOT:-.}/data/tokenizers/llama3/tokenizer.model")
PEAK_DEVICE=h100 CLUSTER=dgx-h100
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
