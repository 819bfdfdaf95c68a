#!/usr/bin/env bats
# mt-shard bert-samples against the numpy oracle tests/data/megatron_bert_oracle.py: random
# pre-split sentence datasets (Megatron .bin/.idx written here with numpy: empty, one-sentence and
# long-sentence documents, "##" pieces) with a WordPiece vocab.txt, random seeds, sequence
# lengths, splits, short-sequence and mask probabilities, with and without the binary head; every
# printed sample (tokens, types, labels, loss and padding masks, is_random, truncated) and the
# sample count must equal Megatron-Core's BERTMaskedWordPieceDataset as the oracle computes it.
# MT_BIN selects the build (default build/bin).

load common

setup_file() {
  export HELPER="$BATS_FILE_TMPDIR/bert_oracle.py"
  cat >"$HELPER" <<'PYTHON'
import json
import os
import subprocess
import sys

import numpy

sys.path.insert(0, os.environ["ORACLE_DIR"])
import megatron_bert_oracle as bo  # noqa: E402
import megatron_oracle as mo  # noqa: E402
from write_megatron_idx import write_megatron_idx  # noqa: E402

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_dataset(prefix, rng, vocab_size):
    """Megatron's .bin/.idx (uint16), one sequence per sentence; returns (tokens, lengths, docs)."""
    subword = lambda i: i % 4 == 1
    words = [i for i in range(5, vocab_size) if not subword(i)]
    pieces = [i for i in range(5, vocab_size) if subword(i)]
    sentences, docs = [], [0]
    for _ in range(int(rng.integers(20, 60))):
        for _ in range(int(rng.choice([0, 1, 2, 3, 5, 8]))):
            s = [int(rng.choice(pieces))] if rng.random() < 0.1 else []
            long_one = rng.random() < 0.01
            for _ in range(300 if long_one else int(rng.integers(1, 20))):
                s.append(int(rng.choice(words)))
                s += [int(rng.choice(pieces)) for _ in range(int(rng.choice([0, 0, 1, 2])))]
            sentences.append(s)
        docs.append(len(sentences))
    lengths = numpy.array([len(s) for s in sentences], dtype=numpy.int32)
    tokens = numpy.array([t for s in sentences for t in s], dtype=numpy.uint16)
    write_megatron_idx(prefix, tokens, lengths, docs)
    names = SPECIAL + [("##p%d" % i) if subword(i) else ("w%d" % i) for i in range(5, vocab_size)]
    return tokens.astype(numpy.int64), lengths, numpy.array(docs, dtype=numpy.int64), names


def check(seed, directory):
    rng = numpy.random.default_rng(seed)
    vocab_size = int(rng.integers(40, 400))
    prefix = os.path.join(directory, "sentences_%d" % seed)
    tokens, lengths, docs, names = write_dataset(prefix, rng, vocab_size)
    vocab_file = prefix + ".vocab.txt"
    with open(vocab_file, "w") as f:
        f.write("\n".join(names) + "\n")
    split = str(rng.choice(["969,30,1", "80,15,5", "1", "50,50,0"]))
    split_name = ["train", "valid"][int(rng.integers(0, 2))] if not split == "1" else "train"
    split_id = ["train", "valid"].index(split_name)
    split_range = mo.split_ranges(split, len(docs) - 1)[split_id]
    seq_length = int(rng.choice([16, 32, 64, 128]))
    mt_seed = int(rng.integers(1, 2**31 - 1))
    binary_head = bool(rng.random() < 0.7)
    short_seq_prob = float(rng.choice([0.0, 0.1, 0.3, 1.0]))
    mask_prob = float(rng.choice([0.15, 0.3, 0.05]))
    num_samples = int(rng.integers(1, 60))
    args = [os.path.join(os.environ["MT_BIN"], "mt-shard"), "bert-samples", "--data-path", prefix,
            "--split", split, "--show-split", split_name, "--seq-length", str(seq_length), "--seed", str(mt_seed),
            "--num-samples", str(num_samples), "--short-seq-prob", repr(short_seq_prob), "--mask-prob",
            repr(mask_prob), "--show-samples", "1000", "--tokenizer-type", "BertWordPieceLowerCase",
            "--vocab-file", vocab_file] + ([] if binary_head else ["--bert-no-binary-head"])
    try:
        if split_range is None or split_range[1] <= split_range[0]:
            raise bo.MegatronFailure("empty split")
        index = bo.build_sample_index(docs, lengths, split_range, num_samples, seq_length, short_seq_prob, mt_seed,
                                      binary_head)
    except bo.MegatronFailure as failure:
        result = subprocess.run(args, capture_output=True, text=True)
        assert result.returncode != 0, "case %d: mt-shard accepted what Megatron fails on (%s)" % (seed, failure)
        return "refused"
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 0, "case %d: %s\n%s" % (seed, " ".join(args), result.stderr)
    records = [json.loads(line) for line in result.stdout.splitlines()]
    summary = [r for r in records if r.get("record") == "bert_index"][0]
    assert summary["samples"] == len(index), "case %d: %d samples, Megatron %d" % (seed, summary["samples"], len(index))
    samples = [r for r in records if r.get("record") == "bert_sample"]
    assert len(samples) == len(index)
    tokenizer = bo.Tokenizer(dict(enumerate(names)), 2, 3, 4, 0)
    offsets = numpy.concatenate([[0], numpy.cumsum(lengths.astype(numpy.int64))])
    read = lambda i: tokens[offsets[i]:offsets[i + 1]].tolist()
    for i, got in enumerate(samples):
        want = bo.get_item(i, index, read, tokenizer, seq_length, mt_seed, binary_head, mask_prob, 0)
        assert [got["first_sentence"], got["end_sentence"], got["target_length"]] == index[i].tolist(), \
            "case %d sample %d: index row %s" % (seed, i, index[i])
        for key, mine in [("text", "tokens"), ("types", "types"), ("labels", "labels"), ("loss_mask", "loss_mask"),
                          ("padding_mask", "padding_mask")]:
            assert got[mine] == want[key].tolist(), "case %d sample %d %s:\n mt %s\n megatron %s\n%s" % (
                seed, i, key, got[mine], want[key].tolist(), " ".join(args))
        assert int(got["is_random"]) == want["is_random"] and int(got["truncated"]) == want["truncated"]
    return "%d samples" % len(samples)


if __name__ == "__main__":
    for seed in range(int(sys.argv[2]), int(sys.argv[3])):
        print("case", seed, check(seed, sys.argv[1]))
PYTHON
}

setup() {
  mt_load_libs
  export ORACLE_DIR="$MT_ROOT/tests/data" MT_BIN
}

@test "bert-samples: random sentence datasets equal Megatron's BERT samples and masks (numpy oracle)" {
  run_split /usr/bin/python3 "$HELPER" "$BATS_TEST_TMPDIR" 0 "${MT_SHARD_BERT_CASES:-8}"
  echo "$out"
  echo "$err"
  [ "$status" -eq 0 ]
}

@test "bert-samples: bad input is a one-line error" {
  /usr/bin/python3 "$HELPER" "$BATS_TEST_TMPDIR" 0 1 >/dev/null
  prefix="$BATS_TEST_TMPDIR/sentences_0"
  common=(bert-samples --data-path "$prefix" --tokenizer-type BertWordPieceLowerCase --vocab-file "$prefix.vocab.txt")
  run_split mt-shard "${common[@]}" --num-samples 4 --seed 0
  [ "$status" -ne 0 ]
  [[ "$err" == *"--seed"* ]]
  [ "$(line_count "$err")" -eq 1 ]
  run_split mt-shard "${common[@]}" --num-samples 4 --split 1,0,0 --show-split valid
  [ "$status" -ne 0 ]
  [[ "$err" == *"--split 1,0,0"*"valid split weight 0"* ]]
  run_split mt-shard "${common[@]}" --num-samples 4 --mask-prob 1
  [ "$status" -ne 0 ]
  [[ "$err" == *"--mask-prob"* ]]
  run_split mt-shard "${common[@]}" --num-samples 4 --seq-length 4
  [ "$status" -ne 0 ]
  [[ "$err" == *"--seq-length"* ]]
  run_split mt-shard bert-samples --data-path "$prefix" --num-samples 4
  [ "$status" -eq 2 ]
}

@test "the oracle's std::mt19937 and std::mt19937_64 give the C++ standard's check values" {
  run_split /usr/bin/python3 "$MT_ROOT/tests/data/megatron_bert_oracle.py"
  echo "$out$err"
  [ "$status" -eq 0 ]
}

@test "the committed BERT fixture is what the oracle writes today, and Megatron-Core's outputs equal the oracle" {
  run_split /usr/bin/python3 "$MT_ROOT/tests/data/make_bert_cases.py" "$BATS_TEST_TMPDIR/cases.h5"
  echo "$out$err"
  [ "$status" -eq 0 ]
  [[ "$out" == *"megatron-core outputs equal the oracle in 8 cases"* ]]
  run_split /usr/bin/python3 - "$BATS_TEST_TMPDIR/cases.h5" "$MT_ROOT/tests/data/megatron_bert_cases.h5" <<'PYTHON'
import sys

import h5py
import numpy

fresh, committed = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
fresh.visit(names.append)
committed_names = []
committed.visit(committed_names.append)
assert sorted(names) == sorted(committed_names), "different layouts"
for name in names:
    a, b = fresh[name], committed[name]
    assert dict(a.attrs) == dict(b.attrs) or all(numpy.array_equal(a.attrs[k], b.attrs[k]) for k in a.attrs), name
    if isinstance(a, h5py.Dataset):
        assert a.dtype == b.dtype and numpy.array_equal(a[()], b[()]), name
print("equal:", len(names), "objects")
PYTHON
  echo "$out$err"
  [ "$status" -eq 0 ]
}
