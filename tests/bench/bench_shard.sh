#!/usr/bin/env bash
# mt-shard at scale: builds Megatron's split and sample index for 10 million documents and 10
# billion tokens and prints the build time, peak memory and index size. The index needs only sequence lengths, so the .bin is a sparse file
# (truncate -s) beside a real .idx. A benchmark, not a test: it prints figures and asserts nothing.
# Usage: tests/bench/bench_shard.sh [documents] [mean tokens per document]   (default 10000000 1000)
# Env: MT_BIN (default build/bin).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
DOCUMENTS="${1:-10000000}"
MEAN="${2:-1000}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A Megatron .idx of DOCUMENTS single-sequence documents, lengths MEAN/2..3*MEAN/2 (uint16 tokens).
/usr/bin/python3 - "$work/corpus" "$DOCUMENTS" "$MEAN" <<'PY'
import sys, numpy
prefix, documents, mean = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lengths = numpy.random.RandomState(0).randint(mean // 2, mean * 3 // 2 + 1, documents).astype(numpy.int32)
pointers = numpy.zeros(documents, numpy.int64)
numpy.cumsum(lengths[:-1].astype(numpy.int64) * 2, out=pointers[1:])
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([8]))
    f.write(documents.to_bytes(8, "little") + (documents + 1).to_bytes(8, "little"))
    f.write(lengths.tobytes()); f.write(pointers.tobytes())
    f.write(numpy.arange(documents + 1, dtype=numpy.int64).tobytes())
with open(prefix + ".bin", "wb") as f:
    f.truncate(int(lengths.astype(numpy.int64).sum()) * 2)
print(f"bench: {documents} documents, {int(lengths.astype(numpy.int64).sum())} tokens", file=sys.stderr)
PY

# Two epochs of 2048-token samples, Megatron's 969,30,1 split.
tokens=$(stat -c %s "$work/corpus.bin"); tokens=$((tokens / 2))
samples=$((tokens * 2 * 969 / 1000 / 2048))
/usr/bin/time -f "%e %M" -o "$work/time" "$MT_BIN/mt-shard" build --data-path "$work/corpus" --split 969,30,1 \
  --seq-length 2048 --train-samples "$samples" --global-batch-size 512 --eval-interval 1000 --eval-iters 10 \
  --output "$work/index.h5" --json >"$work/build.json"
read -r seconds kilobytes <"$work/time"
index_bytes=$(stat -c %s "$work/index.h5")
echo "mt-shard build: $DOCUMENTS documents, $tokens tokens, $samples training samples of 2048"
echo "  wall time ${seconds} s, peak memory $((kilobytes / 1024)) MiB, index file $((index_bytes / 1048576)) MiB"
