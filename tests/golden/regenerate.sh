#!/usr/bin/env bash
# Regenerates the committed goldens: mt-train writes each case's initial parameters
# (--save-init), then make_goldens.py trains the same model in PyTorch from them.
# Needs Debian's python3-torch (/usr/bin/python3). Usage: tests/golden/regenerate.sh [case ...]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MT_BIN="${MT_BIN:-$HERE/../../build/bin}"
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(tiny-gpt2 tiny-llama)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for case in "${cases[@]}"; do
  # shellcheck disable=SC2046
  "$MT_BIN/mt-train" $("$HERE/case_flags.py" "$case") --peak-tflops 1 \
    --save-init "$work/$case-init.h5" >/dev/null
  /usr/bin/python3 "$HERE/make_goldens.py" --case "$case" --init "$work/$case-init.h5" --out "$HERE/$case.h5"
done
