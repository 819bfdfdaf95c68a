#!/usr/bin/env bash
# Regenerates the committed transformers logits (tests/golden/hf/<case>-logits.h5): for each golden
# case, mt-train trains the case's model for its train_iters on mock data (--save-final), mt-ckpt
# exports it (--format hf), and hf_logits.py loads the export with transformers' GPT2LMHeadModel or
# LlamaForCausalLM and records its logits on fixed tokens. tests/unit/train/test_golden.cpp
# (Golden.*MatchesTransformers) trains the same model in mt and compares. The case tiny-mixtral is
# mt-train's preset of that name at its initial parameters (--save-init, seed 1234), run by
# MixtralForCausalLM; tests/unit/train/test_hf_mixtral_logits.cpp compares. The committed
# tiny-mixtral-logits.h5 was made with MT_HF_VENV=/work/venv-hfdrop (a venv made by hand: torch
# 2.5.1 CPU, transformers 4.46.3) TRANSFORMERS_VERSION=4.46.3. Run by hand, never in CI:
# it makes a venv ($MT_HF_VENV, default /tmp/venv-mt-hf) over Debian's /usr/bin/python3 (torch
# 1.13, numpy, h5py as system site packages) and pip-installs transformers $TRANSFORMERS_VERSION
# (default 4.38.2, one that works with torch 1.13) from PyPI.
# The case tiny-deepseek is mt-train's preset with --moe-router-topk 4 (so that each of its 4 groups
# is scored by its best 2 experts in Megatron as in HF: top-k / group-topk = 2) and its MTP depth,
# at its initial parameters, run by DeepseekV3ForCausalLM (main model only: transformers ignores
# model.layers.2.*); tests/unit/train/test_hf_deepseek_logits.cpp compares. The committed
# tiny-deepseek-logits.h5 was made with MT_HF_VENV=/work/venv-mp-hf (a venv made by hand over
# /work/venv-megatron's torch 2.6.0 CPU, with transformers 4.53.3 and h5py from PyPI)
# TRANSFORMERS_VERSION=4.53.3.
# Usage: tests/golden/hf/make_hf_goldens.sh [case ...]   (MT_BIN defaults to build/bin)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GOLDEN="$HERE/.."
MT_BIN="${MT_BIN:-$HERE/../../../build/bin}"
VENV="${MT_HF_VENV:-/tmp/venv-mt-hf}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-4.38.2}"
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(tiny-gpt2 tiny-llama)

if [[ ! -x "$VENV/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
if ! "$VENV/bin/python" -c "import transformers, sys; sys.exit(transformers.__version__ != '$TRANSFORMERS_VERSION')" 2>/dev/null; then
  "$VENV/bin/pip" install --quiet "transformers==$TRANSFORMERS_VERSION"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for case in "${cases[@]}"; do
  if [[ "$case" == tiny-deepseek ]]; then
    "$MT_BIN/mt-train" --model tiny-deepseek --moe-router-topk 4 --mtp-num-layers 1 --mock-data --eval-iters 0 \
      --train-iters 1 --micro-batch-size 2 --global-batch-size 2 --peak-tflops 1 --save-init "$work/$case.h5" >/dev/null
  elif [[ "$case" == tiny-mixtral ]]; then
    "$MT_BIN/mt-train" --model tiny-mixtral --mock-data --eval-iters 0 --train-iters 1 --micro-batch-size 2 \
      --global-batch-size 2 --peak-tflops 1 --save-init "$work/$case.h5" >/dev/null
  else
    # shellcheck disable=SC2046
    "$MT_BIN/mt-train" $("$GOLDEN/case_flags.py" "$case") --peak-tflops 1 \
      --save-final "$work/$case.h5" >/dev/null
  fi
  "$MT_BIN/mt-ckpt" export --format hf "$work/$case.h5" "$work/$case-hf" >/dev/null
  "$VENV/bin/python" "$HERE/hf_logits.py" --case "$case" --model "$work/$case-hf" --out "$HERE/$case-logits.h5"
done
