#!/usr/bin/python3
"""Writes tests/data/megatron_index_cases.h5: random inputs and Megatron's arrays for them.

The expected arrays come from tests/data/megatron_oracle.py (Megatron's code followed with numpy);
tests/unit/data/test_megatron_indices.cpp reads this file with the HDF5 C API and checks that
lib/data/megatron_indices.cpp gives the same values and dtypes.

Usage: /usr/bin/python3 tests/data/make_index_cases.py [output.h5] [--seed N] [--gpt N] [--blend N]

Layout (strings are uint8 datasets; -1 stands for Python's None):
  /rng/case_K       attrs seed, shuffle_sizes; raw32 (uint32), interval_max + interval (uint64),
                    shuffle_J (int64): arange(n_J) shuffled by one RandomState in turn
  /split/case_K     split (string), attr num_elements; ranges (int64, 3x2, -1 when absent)
  /gpt/case_K       sequence_lengths (int32), split (string); attrs split_id, seq_length, seed,
                    num_samples, add_extra, drop_last, expect_error; when not an error: attrs
                    begin, end, num_tokens_per_epoch, num_epochs, separate_final_epoch,
                    num_samples_sans_final_epoch and document_index / sample_index /
                    shuffle_index in Megatron's dtypes
  /blend/case_K     weights (float64, absent = None), dataset_lengths (int64); attrs size,
                    expect_error; num_samples (int64, with weights), dataset_index (int16),
                    dataset_sample_index (int64)
  /blend_e2e/case_K per prefix d: sequence_lengths_d (int32) and the train split's arrays
                    document_index_d / sample_index_d / shuffle_index_d; split (string),
                    weights, attrs size, seq_length, seed, add_extra; dataset_index,
                    dataset_sample_index
"""

import argparse
import os
import sys

import h5py
import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_oracle as mo  # noqa: E402

SPLITS = ["969,30,1", "98,2,0", "1,1,1", "100,0,0", "949,50,1", "90,5,5", "8,1,1", "99/1", "0,1,0",
          "0.7 0.2 0.1", "1", "3,0,1", "50,50", "998,1,1", "1,2,3"]


def put_string(group, name, text):
    group.create_dataset(name, data=numpy.frombuffer(text.encode(), dtype=numpy.uint8))


def put(group, name, array):
    array = numpy.ascontiguousarray(array)
    if array.size > 256:
        group.create_dataset(name, data=array, compression="gzip", compression_opts=9, shuffle=True)
    else:
        group.create_dataset(name, data=array)


def random_lengths(rng, count):
    kind = rng.integers(0, 4)
    if kind == 0:
        lengths = rng.integers(0, 12, size=count)
    elif kind == 1:
        lengths = rng.integers(1, 80, size=count)
    elif kind == 2:
        lengths = rng.integers(0, 4, size=count) * rng.integers(0, 60, size=count)
    else:
        lengths = rng.integers(1, 30, size=count)
        lengths[rng.integers(0, count, size=max(1, count // 20))] = rng.integers(100, 600)
    zeros = rng.random(count) < 0.1
    lengths[zeros] = 0
    return lengths.astype(numpy.int32)


def rng_cases(root):
    group = root.create_group("rng")
    seeds = [0, 1, 1234, 42, 2**31 - 1, 2**31, 2**32 - 1, 987654321]
    for k, seed in enumerate(seeds):
        case = group.create_group("case_%03d" % k)
        case.attrs["seed"] = seed
        rs = numpy.random.RandomState(seed)
        put(case, "raw32", rs.randint(0, 2**32, size=700, dtype=numpy.uint64).astype(numpy.uint32))
        rs = numpy.random.RandomState(seed)
        maxima = numpy.array([0, 1, 2, 3, 5, 100, 2**31, 2**32 - 1, 2**32, 2**33 + 7, 2**40 + 1, 2**63 - 1, 2**64 - 1],
                             dtype=numpy.uint64)
        values = [rs.randint(0, int(m) + 1, dtype=numpy.uint64) if m < 2**64 - 1
                  else rs.randint(0, 2**64, dtype=numpy.uint64) for m in maxima]
        put(case, "interval_max", maxima)
        put(case, "interval", numpy.array(values, dtype=numpy.uint64))
        rs = numpy.random.RandomState(seed)
        sizes = [0, 1, 2, 3, 10, 1000, 5, 2000]
        case.attrs["shuffle_sizes"] = numpy.array(sizes, dtype=numpy.int64)
        for j, n in enumerate(sizes):
            x = numpy.arange(n, dtype=numpy.int64)
            rs.shuffle(x)
            put(case, "shuffle_%d" % j, x)


def split_cases(root, rng, count):
    group = root.create_group("split")
    strings = SPLITS + ["0,0,1", "1,0,1", "0.5,0.25,0.25", "33,33,34", "7,2,1", "1.5,1.5"]
    for k in range(count):
        case = group.create_group("case_%03d" % k)
        split = strings[k % len(strings)] if k < 2 * len(strings) else ",".join(
            str(int(x)) for x in rng.integers(0, 1000, size=rng.integers(1, 4)))
        if not any(c in "123456789" for c in split):
            split = "1,1,1"
        n = int(rng.choice([0, 1, 2, 3, 7, 10, 100, 101, 999, 1000, 12345, 2**31 - 1]))
        if k >= 2 * len(strings) and rng.random() < 0.5:
            n = int(rng.integers(0, 10**6))
        put_string(case, "split", split)
        case.attrs["num_elements"] = n
        ranges = numpy.full((3, 2), -1, dtype=numpy.int64)
        for i, r in enumerate(mo.split_ranges(split, n)):
            if r is not None:
                ranges[i] = r
        put(case, "ranges", ranges)


def gpt_case(case, lengths, split, split_id, seq_length, seed, num_samples, add_extra, drop_last):
    put(case, "sequence_lengths", lengths)
    put_string(case, "split", split)
    case.attrs["split_id"] = split_id
    case.attrs["seq_length"] = seq_length
    case.attrs["seed"] = seed
    case.attrs["num_samples"] = -1 if num_samples is None else num_samples
    case.attrs["add_extra"] = int(add_extra)
    case.attrs["drop_last"] = int(drop_last)
    try:
        ranges = mo.split_ranges(split, len(lengths))
        begin, end = ranges[split_id]
        out = mo.gpt_indices(lengths, begin, end, seq_length, seed, num_samples, add_extra, drop_last)
    except mo.MegatronFailure:
        case.attrs["expect_error"] = 1
        return None
    case.attrs["expect_error"] = 0
    case.attrs["begin"] = begin
    case.attrs["end"] = end
    for key in ["num_tokens_per_epoch", "num_epochs", "num_samples_sans_final_epoch"]:
        case.attrs[key] = int(out[key])
    case.attrs["separate_final_epoch"] = int(out["separate_final_epoch"])
    for key in ["document_index", "sample_index", "shuffle_index"]:
        put(case, key, out[key])
    return out


def gpt_cases(root, rng, count, stats):
    group = root.create_group("gpt")
    k = 0
    while k < count:
        n = int(rng.choice([1, 2, 3, 5, 10, 40, 100, 300, 1000]))
        lengths = random_lengths(rng, n)
        split = SPLITS[int(rng.integers(0, len(SPLITS)))]
        ranges = mo.split_ranges(split, n)
        present = [i for i, r in enumerate(ranges) if r is not None]
        split_id = int(rng.choice(present))
        seq_length = int(rng.choice([2, 3, 4, 7, 8, 16, 31, 64, 128]))
        begin, end = ranges[split_id]
        tokens = int(lengths[begin:end].sum())
        choice = rng.random()
        if choice < 0.15:
            num_samples = None
        elif choice < 0.25:
            num_samples = 0
        else:
            per_epoch = max(1, tokens // seq_length)
            num_samples = int(rng.integers(1, max(2, per_epoch * rng.choice([1, 2, 3, 8]) + 2)))
        # keep the fixture small: bounded document index and sample count
        if tokens > 0 and num_samples is not None:
            epochs = (num_samples * seq_length + 1) // tokens + 1
            if epochs * (end - begin) > 2500 or num_samples > 2000:
                continue
        elif tokens // seq_length > 2000:
            continue
        seed = int(rng.choice([0, 1234, int(rng.integers(0, 2**32))]))
        add_extra = bool(rng.random() < 0.8)
        drop_last = bool(rng.random() < 0.6)
        try:
            mo.gpt_indices(lengths, begin, end, seq_length, seed, num_samples, add_extra, drop_last)
        except mo.MegatronFailure:
            if rng.random() > 0.12:
                continue
        case = group.create_group("case_%03d" % k)
        out = gpt_case(case, lengths, split, split_id, seq_length, seed, num_samples, add_extra, drop_last)
        if out is None:
            stats["gpt_error"] += 1
        else:
            stats["gpt"] += 1
            stats["epochs>1"] += out["num_epochs"] > 1
            stats["separate"] += bool(out["separate_final_epoch"])
            stats["zero_samples"] += out["sample_index"].shape[0] == 1
        k += 1
    # hand-made error and edge cases
    fixed = [
        (numpy.array([5, 0, 7], numpy.int32), "98,1,1", 1, 4, 1, 10, True, True),  # empty valid split
        (numpy.array([1, 0, 0], numpy.int32), "1,0,0", 0, 4, 1, 3, True, True),  # one token
        (numpy.array([0, 0], numpy.int32), "1,0,0", 0, 4, 1, None, True, True),  # no tokens, None
        (numpy.array([3, 4, 5], numpy.int32), "1,0,0", 0, 100, 7, None, True, True),  # sequence > data
        (numpy.array([3, 4, 5], numpy.int32), "1,0,0", 0, 100, 7, 0, True, False),  # partial kept
        (numpy.array([3, 4, 5, 0], numpy.int32), "1,0,0", 0, 5, 7, None, True, False),  # last doc empty
    ]
    for lengths, split, split_id, seq, seed, ns, extra, drop in fixed:
        case = group.create_group("case_%03d" % k)
        out = gpt_case(case, lengths, split, split_id, seq, seed, ns, extra, drop)
        stats["gpt_error" if out is None else "gpt"] += 1
        k += 1
    group.attrs["count"] = k


def blend_cases(root, rng, count, stats):
    group = root.create_group("blend")
    for k in range(count):
        case = group.create_group("case_%03d" % k)
        d = int(rng.choice([1, 2, 3, 5, 8, 9, 17, 130]))
        kind = rng.random()
        weights = None
        if kind < 0.7:
            weights = rng.random(d) * rng.choice([1, 100, 1e-3])
            if rng.random() < 0.2:
                weights = numpy.round(weights * 10) + 1
        size = None if kind > 0.85 else int(rng.integers(0, 1200 if d < 100 else 300))
        if k == count - 3:
            weights, size = numpy.zeros(d), 100  # weights sum to zero
        if k == count - 2:
            weights, size = numpy.ones(d), None  # weights without a size
        lengths = rng.integers(0 if rng.random() < 0.05 else 1, 800, size=d).astype(numpy.int64)
        if weights is not None and size is not None and rng.random() < 0.7:
            try:
                ww = mo.normalize(weights)
                lengths = numpy.array(mo.get_size_per_split_per_dataset(ww, [size], mo.MID_LEVEL_DATASET_SURPLUS),
                                      dtype=numpy.int64).reshape(-1) + rng.integers(0, 3, size=d)
            except mo.MegatronFailure:
                pass
        if weights is None and size is None and d > 20:
            lengths = lengths // 10 + 1
        if weights is not None:
            put(case, "weights", numpy.asarray(weights, dtype=numpy.float64))
        put(case, "dataset_lengths", lengths)
        case.attrs["size"] = -1 if size is None else size
        try:
            num_samples, dataset_index, dataset_sample_index = mo.blend(
                None if weights is None else list(weights), size, [int(x) for x in lengths])
        except mo.MegatronFailure:
            case.attrs["expect_error"] = 1
            stats["blend_error"] += 1
            continue
        case.attrs["expect_error"] = 0
        stats["blend"] += 1
        if num_samples is not None:
            put(case, "num_samples", numpy.array(num_samples, dtype=numpy.int64))
        put(case, "dataset_index", dataset_index)
        put(case, "dataset_sample_index", dataset_sample_index)
    group.attrs["count"] = count


def blend_e2e_cases(root, rng, count, stats):
    """Whole blends: per prefix the train split's GPTDataset with the blend's num_samples."""
    group = root.create_group("blend_e2e")
    k = 0
    while k < count:
        d = int(rng.integers(1, 4))
        split = SPLITS[int(rng.integers(0, 6))]
        seq_length = int(rng.choice([4, 8, 16]))
        seed = int(rng.integers(0, 2**32))
        add_extra = bool(rng.random() < 0.8)
        weights = list(rng.random(d) + 0.1)
        size = int(rng.integers(1, 300))
        prefixes = [random_lengths(rng, int(rng.integers(20, 120))) for _ in range(d)]
        try:
            ww = mo.normalize(weights)
            buffer = [b[0] for b in mo.get_size_per_split_per_dataset(ww, [size], mo.MID_LEVEL_DATASET_SURPLUS)]
            outs = []
            for lengths, ns in zip(prefixes, buffer):
                begin, end = mo.split_ranges(split, len(lengths))[0]
                outs.append(mo.gpt_indices(lengths, begin, end, seq_length, seed, ns, add_extra, True))
            lens = [o["sample_index"].shape[0] - 1 for o in outs]
            _, dataset_index, dataset_sample_index = mo.blend(weights, size, lens)
        except mo.MegatronFailure:
            continue
        if any(o["document_index"].size > 3000 for o in outs):
            continue
        case = group.create_group("case_%03d" % k)
        put_string(case, "split", split)
        put(case, "weights", numpy.array(weights, dtype=numpy.float64))
        case.attrs["size"] = size
        case.attrs["seq_length"] = seq_length
        case.attrs["seed"] = seed
        case.attrs["add_extra"] = int(add_extra)
        case.attrs["datasets"] = d
        for i, (lengths, out) in enumerate(zip(prefixes, outs)):
            put(case, "sequence_lengths_%d" % i, lengths)
            for key in ["document_index", "sample_index", "shuffle_index"]:
                put(case, "%s_%d" % (key, i), out[key])
        put(case, "dataset_index", dataset_index)
        put(case, "dataset_sample_index", dataset_sample_index)
        stats["blend_e2e"] += 1
        k += 1
    group.attrs["count"] = count


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("output", nargs="?", default=os.path.join(here, "megatron_index_cases.h5"))
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--gpt", type=int, default=220)
    parser.add_argument("--blend", type=int, default=80)
    parser.add_argument("--splits", type=int, default=80)
    parser.add_argument("--blend-e2e", type=int, default=12)
    args = parser.parse_args()
    rng = numpy.random.default_rng(args.seed)
    stats = {k: 0 for k in ["gpt", "gpt_error", "epochs>1", "separate", "zero_samples", "blend", "blend_error",
                            "blend_e2e"]}
    tmp = args.output + ".tmp"
    with h5py.File(tmp, "w", libver=("v110", "latest")) as root:
        root.attrs["numpy_version"] = numpy.__version__
        root.attrs["generator_seed"] = args.seed
        rng_cases(root)
        split_cases(root, rng, args.splits)
        root["split"].attrs["count"] = args.splits
        root["rng"].attrs["count"] = len(root["rng"])
        gpt_cases(root, rng, args.gpt, stats)
        blend_cases(root, rng, args.blend, stats)
        blend_e2e_cases(root, rng, args.blend_e2e, stats)
    os.replace(tmp, args.output)
    print(" ".join("%s=%d" % kv for kv in stats.items()), "bytes=%d" % os.path.getsize(args.output))


if __name__ == "__main__":
    main()
