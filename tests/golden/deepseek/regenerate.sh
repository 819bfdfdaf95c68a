#!/usr/bin/env bash
# Regenerates the DeepSeek-V3-style tokenizer.json and its goldens (make_deepseek_goldens.py, in a
# venv with the pinned HF tokenizers from PyPI), and lib/text/punct_symbol_tables.inc from Debian's
# unicode-data 15.0.0 (make_punct_symbol_table.py, Debian's python3).
# Env: MT_TOKEN_VENV (venv folder, default a temporary one, removed afterwards).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOKENIZERS_VERSION=0.23.3

if [[ ! -f /usr/share/unicode/UnicodeData.txt ]]; then
  echo "regenerate: installing Debian's unicode-data (the Unicode 15.0.0 UCD)" >&2
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q unicode-data >&2
fi
/usr/bin/python3 "$HERE/make_punct_symbol_table.py"

if [[ -n "${MT_TOKEN_VENV:-}" ]]; then
  venv="$MT_TOKEN_VENV"
else
  venv="$(mktemp -d)/venv"
  trap 'rm -rf "$(dirname "$venv")"' EXIT
fi
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "tokenizers==$TOKENIZERS_VERSION" >&2
"$venv/bin/python" "$HERE/make_deepseek_goldens.py"
