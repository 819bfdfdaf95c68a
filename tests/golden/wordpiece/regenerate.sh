#!/usr/bin/env bash
# Regenerates the WordPiece tables and goldens: makes a venv with the pinned HF tokenizers from PyPI,
# then runs make_wordpiece_tables.py (writes lib/text/wordpiece_tables.inc) and
# make_wordpiece_goldens.py (trains vocab-uncased.txt and vocab-cased.txt on the repository's
# corpus, writes torture.jsonl, random.jsonl, corpora.jsonl and meta.json here). Both read only the
# repository; the tables take a few minutes (every code point is asked of the reference).
# Env: MT_TOKEN_VENV (venv folder, default a temporary one, removed afterwards).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOKENIZERS_VERSION=0.23.3

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
"$venv/bin/python" "$HERE/make_wordpiece_tables.py"
"$venv/bin/python" "$HERE/make_wordpiece_goldens.py"
