"""Megatron's indexed dataset (PREFIX.bin + PREFIX.idx) written with numpy, uint16 tokens.

The layout of megatron/core/datasets/indexed_dataset.py, as tests/data/read_megatron_idx.py reads
it, written independently of mt's writer. Imported by the oracle suites
tests/tools/mt-shard-oracle.bats and tests/tools/mt-shard-bert.bats.
"""
import struct

import numpy


def write_megatron_idx(prefix, tokens, lengths, document_indices):
    """Writes `tokens` (uint16) as sequences of `lengths` grouped by `document_indices` (0, ..., n)."""
    tokens = numpy.asarray(tokens, dtype=numpy.uint16)
    lengths = numpy.asarray(lengths, dtype=numpy.int32)
    with open(prefix + ".bin", "wb") as f:
        f.write(tokens.tobytes())
    pointers = numpy.zeros(len(lengths), dtype=numpy.int64)
    pointers[1:] = numpy.cumsum(lengths[:-1].astype(numpy.int64)) * 2
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # uint16
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(numpy.asarray(document_indices, dtype=numpy.int64).tobytes())
