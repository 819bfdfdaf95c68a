#!/usr/bin/env bash
# Regenerates the BPE trainer goldens of this folder: Hugging Face tokenizers' BpeTrainer merges
# for data/demo/tinyshakespeare.txt at the vocabulary sizes below, which
# tests/unit/text/test_bpe_trainer.cpp (BpeTrainer.MatchesHuggingFaceMerges) compares mt's trainer
# with. Run by hand, never in CI: it installs `tokenizers` from PyPI into a venv of its own
# ($MT_HF_VENV, default /tmp/venv-hf). Usage: tests/golden/bpe/make_bpe_goldens.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
VENV="${MT_HF_VENV:-/tmp/venv-hf}"
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import tokenizers' 2>/dev/null; then
  echo "make_bpe_goldens: installing tokenizers into $VENV" >&2
  /usr/bin/python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q tokenizers >&2
fi
for vocab in 500 2000; do
  "$VENV/bin/python" "$HERE/make_bpe_goldens.py" --corpus "$ROOT/data/demo/tinyshakespeare.txt" \
    --vocab-size "$vocab" --out "$HERE/tinyshakespeare-$vocab-merges.txt"
done
