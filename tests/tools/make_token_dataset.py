#!/usr/bin/python3
# Writes a small token dataset for the Bats suites, independently of mt's writer: Megatron's
# .bin/.idx (layout of megatron/core/datasets/indexed_dataset.py, as tests/data/read_megatron_idx.py
# reads it) or mt's HDF5 token dataset (lib/data/token_dataset.h) through h5py.
#
# Usage: make_token_dataset.py PREFIX {bin,h5} VOCAB EOD DOCUMENTS
#   DOCUMENTS: JSON list of documents, each a list of sequences (lists of token ids), or
#   "counting:N:LEN:SEED": N documents of one sequence each, LEN +- LEN/2 tokens counting up
#   from a random start (mod VOCAB - 1, skipping EOD) and ending with EOD (learnable text).
# EOD -1 records no end-of-document id (HDF5) and appends none (counting).
import json
import struct
import sys

import numpy


def counting(spec, vocab, eod):
    _, count, length, seed = spec.split(":")
    rng = numpy.random.RandomState(int(seed))
    documents = []
    for _ in range(int(count)):
        n = int(rng.randint(int(length) // 2, int(length) * 3 // 2 + 1))
        start = int(rng.randint(0, vocab - 1))
        tokens = [(start + i) % (vocab - 1) for i in range(n)]
        tokens = [t + 1 if eod >= 0 and t >= eod else t for t in tokens]
        if eod >= 0:
            tokens.append(eod)
        documents.append([tokens])
    return documents


def main():
    prefix, kind, vocab, eod, spec = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    documents = counting(spec, vocab, eod) if spec.startswith("counting:") else json.loads(spec)
    dtype = numpy.uint16 if vocab < 65500 else numpy.int32
    sequences = [numpy.asarray(s, dtype=dtype) for d in documents for s in d]
    lengths = numpy.array([len(s) for s in sequences], dtype=numpy.int32)
    offsets = numpy.concatenate([[0], numpy.cumsum(lengths)[:-1]]).astype(numpy.int64) if len(lengths) else numpy.zeros(0, numpy.int64)
    document_indices = numpy.concatenate([[0], numpy.cumsum([len(d) for d in documents])]).astype(numpy.int64)
    tokens = numpy.concatenate(sequences).astype(dtype) if sequences else numpy.zeros(0, dtype)
    if kind == "bin":
        tokens.tofile(prefix + ".bin")
        with open(prefix + ".idx", "wb") as out:
            out.write(b"MMIDIDX\x00\x00")
            out.write(struct.pack("<Q", 1))
            out.write(struct.pack("<B", 8 if dtype == numpy.uint16 else 4))
            out.write(struct.pack("<Q", len(lengths)))
            out.write(struct.pack("<Q", len(document_indices)))
            out.write(lengths.tobytes())
            out.write((offsets * numpy.dtype(dtype).itemsize).tobytes())
            out.write(document_indices.tobytes())
    else:
        import h5py
        with h5py.File(prefix + ".h5", "w") as f:
            f.create_dataset("tokens", data=tokens)
            f.create_dataset("sequence_lengths", data=lengths)
            f.create_dataset("sequence_offsets", data=offsets)
            f.create_dataset("document_indices", data=document_indices)
            # Fixed-length strings of exactly their size, as h5py writes numpy.bytes_ (no NUL).
            for name, value in (("mt_format", "mt-token-dataset"), ("tokenizer", "test"), ("tokenizer_hash", "none")):
                f.attrs[name] = numpy.bytes_(value.encode())
            f.attrs["mt_format_version"] = numpy.int64(1)
            f.attrs["vocab_size"] = numpy.int64(vocab)
            f.attrs["eod_id"] = numpy.int64(eod)


if __name__ == "__main__":
    main()
