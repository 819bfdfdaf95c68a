#!/usr/bin/python3
"""Philox4x32-10 in numpy and mt's mock-data token function.

Used by make_goldens.py to reproduce, bit for bit, the token stream mt's mock data source
(lib/data/sample_source.cpp, kernels/common/philox.h) feeds the trainer, so the PyTorch goldens
see the same samples as mt. Run `philox.py --self-test` to check the generator against the
Random123 known-answer vectors and the mock-data function against a scalar reference.
"""

import argparse
import sys

import numpy as np

PHILOX_MUL0 = 0xD2511F53
PHILOX_MUL1 = 0xCD9E8D57
PHILOX_WEYL0 = 0x9E3779B9
PHILOX_WEYL1 = 0xBB67AE85
PHILOX_ROUNDS = 10

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF

MOCK_DATA_STREAM_NAME = "mock-data"


def _mulhilo(multiplier, value):
    """(hi, lo) 32-bit halves of multiplier * value; value is a uint64 array of 32-bit words."""
    product = np.uint64(multiplier) * value
    return product >> np.uint64(32), product & np.uint64(MASK32)


def philox4x32_10(counter, key):
    """Philox4x32-10 over arrays.

    counter: four uint32-valued arrays (or scalars) c0..c3, broadcast together.
    key: two uint32-valued arrays (or scalars) k0, k1.
    Returns a tuple of four uint32 arrays, the output words x0..x3.
    """
    c0, c1, c2, c3 = (np.asarray(word, dtype=np.uint64) & np.uint64(MASK32) for word in counter)
    k0, k1 = (np.asarray(word, dtype=np.uint64) & np.uint64(MASK32) for word in key)
    mask = np.uint64(MASK32)
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo(PHILOX_MUL0, c0)
        hi1, lo1 = _mulhilo(PHILOX_MUL1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(PHILOX_WEYL0)) & mask
        k1 = (k1 + np.uint64(PHILOX_WEYL1)) & mask
    return tuple(word.astype(np.uint32) for word in (c0, c1, c2, c3))


def stream_id(name):
    """FNV-1a 64-bit hash of the UTF-8 bytes of name (mt's stream id for a random site)."""
    value = FNV_OFFSET
    for byte in name.encode("utf-8"):
        value = ((value ^ byte) * FNV_PRIME) & MASK64
    return value


def philox_block(seed, stream, block):
    """Four words for block `block` (int or uint64 array) of stream `stream` under `seed`.

    Counter = (block lo, block hi, stream lo, stream hi); key = (seed lo, seed hi).
    """
    block = np.asarray(block, dtype=np.uint64)
    counter = (
        block & np.uint64(MASK32),
        block >> np.uint64(32),
        np.uint64(stream & MASK32),
        np.uint64(stream >> 32),
    )
    key = (np.uint64(seed & MASK32), np.uint64(seed >> 32))
    return philox4x32_10(counter, key)


def mock_tokens(seed, vocab_size, seq_length, first_sample, num_samples):
    """Tokens of global samples first_sample .. first_sample+num_samples-1 of mt's mock data.

    token(s, t) = philox_block(seed, stream_id("mock-data"), s*(seq_length+1) + t)[0] % vocab_size
    for t in [0, seq_length]. Returns int64 array (num_samples, seq_length + 1).
    """
    tokens_per_sample = seq_length + 1
    samples = np.arange(first_sample, first_sample + num_samples, dtype=np.uint64)
    positions = np.arange(tokens_per_sample, dtype=np.uint64)
    blocks = samples[:, None] * np.uint64(tokens_per_sample) + positions[None, :]
    words = philox_block(seed, stream_id(MOCK_DATA_STREAM_NAME), blocks)[0]
    return (words.astype(np.uint64) % np.uint64(vocab_size)).astype(np.int64)


KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def _scalar_philox4x32_10(counter, key):
    """Plain-integer Philox4x32-10, an independent reference for the self-test."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(PHILOX_ROUNDS):
        product0 = PHILOX_MUL0 * c0
        product1 = PHILOX_MUL1 * c2
        hi0, lo0 = product0 >> 32, product0 & MASK32
        hi1, lo1 = product1 >> 32, product1 & MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_WEYL0) & MASK32
        k1 = (k1 + PHILOX_WEYL1) & MASK32
    return (c0, c1, c2, c3)


def self_test():
    """Check the known answers, the vectorised path and the mock-data indexing; return ok."""
    ok = True
    for counter, key, expected in KNOWN_ANSWERS:
        got = tuple(int(word) for word in philox4x32_10(counter, key))
        scalar = _scalar_philox4x32_10(counter, key)
        status = "ok" if got == expected and scalar == expected else "FAIL"
        ok = ok and status == "ok"
        print("philox4x32_10 counter=%s key=%s -> %s [%s]" % (
            " ".join("%08x" % w for w in counter), " ".join("%08x" % w for w in key),
            " ".join("%08x" % w for w in got), status))

    if stream_id("") != FNV_OFFSET or stream_id("a") != 0xAF63DC4C8601EC8C:
        print("stream_id FNV-1a check [FAIL]")
        ok = False
    else:
        print("stream_id FNV-1a check [ok]")

    seed, vocab_size, seq_length = (1 << 32) + 1234, 101, 5
    stream = stream_id(MOCK_DATA_STREAM_NAME)
    batch = mock_tokens(seed, vocab_size, seq_length, first_sample=3, num_samples=2)
    tokens_ok = True
    for row, sample in enumerate((3, 4)):
        for position in range(seq_length + 1):
            block = sample * (seq_length + 1) + position
            counter = (block & MASK32, block >> 32, stream & MASK32, stream >> 32)
            word = _scalar_philox4x32_10(counter, (seed & MASK32, seed >> 32))[0]
            if batch[row, position] != word % vocab_size:
                tokens_ok = False
    ok = ok and tokens_ok
    print("mock_tokens vs scalar reference [%s]" % ("ok" if tokens_ok else "FAIL"))
    print("stream_id(%r) = %016x; first tokens (seed 1234, vocab 101, seq 32): %s" % (
        MOCK_DATA_STREAM_NAME, stream, mock_tokens(1234, 101, 32, 0, 1)[0, :8].tolist()))
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true", help="run the known-answer checks")
    args = parser.parse_args()
    if not args.self_test:
        parser.print_help()
        return 0
    ok = self_test()
    print("self-test %s" % ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
