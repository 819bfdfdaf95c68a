#!/usr/bin/env bash
# Regenerates tests/golden/hf/default-config/: transformers' GPT2LMHeadModel and LlamaForCausalLM at
# their config classes' defaults (sizes shrunk, see make_default_config_goldens.py), saved with
# save_pretrained, and losses.json, transformers' loss on a periodic token sequence with dropout
# off. tests/tools/mt-ckpt.bats imports them with mt-ckpt import --format hf and compares mt-train's
# first lm_loss. Run by hand, never in CI: it makes a venv ($MT_HF_VENV, default
# /tmp/venv-mt-hf-default) over Debian's /usr/bin/python3 and pip-installs torch $TORCH_VERSION
# (default 2.5.1) and transformers $TRANSFORMERS_VERSION (default 4.46.3) from PyPI.
# Usage: tests/golden/hf/make_default_config_goldens.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${MT_HF_VENV:-/tmp/venv-mt-hf-default}"
TORCH_VERSION="${TORCH_VERSION:-2.5.1}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-4.46.3}"

if [[ ! -x "$VENV/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, transformers, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION' or transformers.__version__ != '$TRANSFORMERS_VERSION')" 2>/dev/null; then
  "$VENV/bin/pip" install --quiet "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION"
fi
"$VENV/bin/python" "$HERE/make_default_config_goldens.py" --out "$HERE/default-config"
