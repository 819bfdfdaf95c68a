#!/usr/bin/env bash
# The main job of README's first command. Grows with the tools: today it shows the toolkit is
# built and what each tool will do; training lands with issue #3.
set -euo pipefail
MT_BIN="${MT_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/bin}"
for tool in mt-tokenize mt-shard mt-train mt-ckpt mt-mfu mt-memreport; do
  "$MT_BIN/$tool" --version | head -1
done
