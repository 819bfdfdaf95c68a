#!/usr/bin/python3
# An independent numpy reader of Megatron-LM's indexed dataset (PREFIX.bin + PREFIX.idx), written
# from the layout in megatron/core/datasets/indexed_dataset.py, not from mt's code. Used by
# tests/unit/data/test_token_dataset.cpp to cross-check mt's writer.
#
# Usage: read_megatron_idx.py PREFIX
# Prints, one item a line:
#   dtype <numpy dtype name>
#   sequences <count>
#   document_indices <i0> <i1> ...
#   sequence <index>: <token> <token> ...
# Exits 1 with a message on stderr when the files do not follow the layout.
import struct
import sys

import numpy

HEADER = b"MMIDIDX\x00\x00"
DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
          6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}


def fail(message):
    print(f"read_megatron_idx.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 2:
        fail("usage: read_megatron_idx.py PREFIX")
    prefix = sys.argv[1]
    with open(prefix + ".idx", "rb") as stream:
        index = stream.read()
    if index[:9] != HEADER:
        fail("bad magic")
    (version,) = struct.unpack_from("<Q", index, 9)
    (code,) = struct.unpack_from("<B", index, 17)
    sequence_count, document_count = struct.unpack_from("<QQ", index, 18)
    if version != 1 or code not in DTYPES:
        fail(f"version {version}, dtype code {code}")
    dtype = DTYPES[code]
    offset = 34
    lengths = numpy.frombuffer(index, dtype="<i4", count=sequence_count, offset=offset)
    offset += lengths.nbytes
    pointers = numpy.frombuffer(index, dtype="<i8", count=sequence_count, offset=offset)
    offset += pointers.nbytes
    document_indices = numpy.frombuffer(index, dtype="<i8", count=document_count, offset=offset)
    if sequence_count != document_indices[-1]:
        fail("last document index is not the sequence count")

    with open(prefix + ".bin", "rb") as stream:
        data = stream.read()
    print(f"dtype {numpy.dtype(dtype).name}")
    print(f"sequences {sequence_count}")
    print("document_indices " + " ".join(str(int(i)) for i in document_indices))
    itemsize = numpy.dtype(dtype).itemsize
    for i in range(sequence_count):
        start = int(pointers[i])
        end = start + int(lengths[i]) * itemsize
        if end > len(data):
            fail(f"sequence {i} ends past the end of the .bin")
        tokens = numpy.frombuffer(data[start:end], dtype=numpy.dtype(dtype).newbyteorder("<"))
        print(f"sequence {i}:" + "".join(f" {int(t)}" for t in tokens))


if __name__ == "__main__":
    main()
