#!/usr/bin/python3
"""Megatron's --partitions dealing, restated from tools/preprocess_data.py (Megatron-LM), for
tests/tools/mt-tokenize-partitions.bats: expands the --input glob with glob.glob (unsorted, as
Megatron), reads each file in text mode (universal newlines), and deals the lines round robin
(`index = (index + 1) % partitions`) or, with --keep-sequential-samples, in contiguous blocks of
ceil(lines / partitions). Writes <out_dir>/ref_<i>.jsonl and prints their paths, partition 0
first, so a one-process mt-tokenize run over them gives the documents in Megatron's merged order.
Independent of mt's partition code: mt's own output is never read here."""
import glob
import math
import sys


def main():
    pattern, partitions, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sequential = len(sys.argv) > 4 and sys.argv[4] == "sequential"
    files = glob.glob(pattern)
    lines = []
    for name in files:
        with open(name, "r", encoding="utf-8") as fin:
            # mt ends a last line that has none; Megatron writes it bare and the next line of
            # its partition joins it (malformed JSON), so no valid Megatron run differs.
            lines.extend(line if line.endswith("\n") else line + "\n" for line in fin)
    paths = [f"{out_dir}/ref_{i}.jsonl" for i in range(partitions)]
    outs = [open(p, "w", encoding="utf-8") for p in paths]
    if sequential:
        size = math.ceil(len(lines) / partitions)
        for j, line in enumerate(lines):
            outs[j // size].write(line)
    else:
        for j, line in enumerate(lines):
            outs[j % partitions].write(line)
    for out in outs:
        out.close()
    print(" ".join(paths))


if __name__ == "__main__":
    main()
