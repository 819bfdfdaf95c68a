#!/usr/bin/env bash
# Regenerates the committed tokenizer goldens (tests/golden/tokenizer/*.jsonl, meta.json, and the
# post-processor template goldens and fixtures): makes a venv with the pinned tiktoken and HF
# tokenizers from PyPI, then runs make_token_goldens.py and make_template_goldens.py, which
# read the tokenizer files and corpora from the repository's data/ and the Unicode 15.0.0 UCD from
# Debian's unicode-data (/usr/share/unicode).
# Usage: tests/golden/tokenizer/regenerate.sh [make_token_goldens.py options]
# Env: MT_TOKEN_VENV (venv folder, default a temporary one, removed afterwards).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TIKTOKEN_VERSION=0.14.0
TOKENIZERS_VERSION=0.23.3

if [[ ! -f /usr/share/unicode/UnicodeData.txt ]]; then
  echo "regenerate: installing Debian's unicode-data (the Unicode 15.0.0 UCD)" >&2
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q unicode-data >&2
fi

if [[ -n "${MT_TOKEN_VENV:-}" ]]; then
  venv="$MT_TOKEN_VENV"
else
  venv="$(mktemp -d)/venv"
  trap 'rm -rf "$(dirname "$venv")"' EXIT
fi
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "tiktoken==$TIKTOKEN_VERSION" "tokenizers==$TOKENIZERS_VERSION" >&2
"$venv/bin/python" "$HERE/make_token_goldens.py" "$@"
"$venv/bin/python" "$HERE/make_template_goldens.py" "$@"
