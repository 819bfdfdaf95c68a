#!/usr/bin/python3
"""Writes tests/data/megatron_bert_cases.h5: a pre-split sentence dataset and Megatron's BERT
samples and masks for it.

The expected values come from tests/data/megatron_bert_oracle.py (Megatron-Core's BERT dataset
followed with numpy); tests/unit/data/test_bert_data.cpp reads this file with the HDF5 C API and
checks that lib/data/bert_samples.cpp and lib/data/bert_masking.cpp give the same values. The
outputs of Megatron-Core's own BERTMaskedWordPieceDataset on the same dataset
(tests/data/megatron_core_bert.npz, written by tests/data/megatron_core_bert.py in a venv) are
checked equal to the oracle here and copied into /megatron_core.

Usage: /usr/bin/python3 tests/data/make_bert_cases.py [output.h5]

Layout (strings are uint8 datasets):
  /dataset          tokens (int32, all sentences concatenated), sentence_lengths (int32),
                    document_indices (int64, Megatron's: sentence bounds of each document),
                    is_subword (uint8, per vocabulary id: its piece starts with "##");
                    attrs vocab_size, cls, sep, mask, pad
  /cases/case_K     split (string); attrs split_id, seq_length, seed, binary_head, short_seq_prob,
                    mask_prob, num_samples, pad_id, split_begin, split_end (documents);
                    sample_index (uint32, N x 3) and, for the first `checked` samples, text / types /
                    labels / padding_mask / loss_mask (int64, checked x seq_length), is_random and
                    truncated (int64, checked)
  /megatron_core/case_K  the same, from Megatron-Core itself (when the .npz is present)
  /ngram_cdf/max_N  float64 (N,): cumsum(p) / its last value for masking_max_ngram N, as numpy's
                    RandomState.choice computes it from masked_dataset.py's p
"""

import os
import sys

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import megatron_bert_oracle as bo  # noqa: E402
import megatron_oracle as mo  # noqa: E402

VOCAB_SIZE = 257  # randint(0, 257) draws below a 9-bit mask: an off-by-one vocabulary changes every draw
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
# (split, split_id, seq_length, seed, binary_head, short_seq_prob, mask_prob, num_samples, pad_id)
CASES = [
    ("80,15,5", 0, 64, 1234, True, 0.1, 0.15, 150, PAD),
    ("80,15,5", 0, 128, 1234, True, 0.1, 0.15, 150, PAD),
    ("80,15,5", 0, 64, 7, True, 0.1, 0.15, 150, PAD),
    ("80,15,5", 0, 128, 7, True, 0.1, 0.15, 150, PAD),
    ("80,15,5", 1, 64, 1234, True, 0.5, 0.15, 40, PAD),
    ("80,15,5", 0, 128, 99, False, 0.1, 0.15, 120, PAD),
    ("80,15,5", 0, 64, 31337, True, 0.0, 0.3, 60, -1),
    ("1", 0, 32, 5, False, 1.0, 0.15, 80, PAD),
]
CHECKED = 100  # samples per case whose tokens and masks are stored


def vocabulary():
    """Ids 0-4 special, then words; every third id from 7 on is a "##" continuation piece."""
    names = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for i in range(5, VOCAB_SIZE):
        names.append(("##p%d" % i) if i % 3 == 1 else ("w%d" % i))
    return names


def make_dataset():
    """Documents of sentences of words of 1-3 pieces. Some sentences open with a "##" piece (it
    joins the previous word across [SEP]); one document holds a 513-token sentence (skipped), one is
    a single 600-token sentence (kept without the binary head), some are empty or one sentence."""
    names = vocabulary()
    words = [i for i in range(5, VOCAB_SIZE) if not names[i].startswith("##")]
    pieces = [i for i in range(5, VOCAB_SIZE) if names[i].startswith("##")]
    rng = numpy.random.default_rng(20261127)

    def sentence(length_words):
        out = []
        if rng.random() < 0.1:
            out.append(int(rng.choice(pieces)))
        for _ in range(length_words):
            out.append(int(rng.choice(words)))
            for _ in range(int(rng.choice([0, 0, 0, 1, 2]))):
                out.append(int(rng.choice(pieces)))
        return out

    sentences, document_indices = [], [0]
    for doc in range(120):
        if doc == 17:
            count = 3
        elif doc == 40:
            sentences.append(sentence(400)[:600])
            document_indices.append(len(sentences))
            continue
        else:
            count = int(rng.choice([0, 1, 2, 3, 4, 6, 9, 12]))
        for k in range(count):
            if doc == 17 and k == 1:
                s = sentence(400)[:513]
                assert len(s) == 513
                sentences.append(s)
            else:
                sentences.append(sentence(int(rng.integers(1, 25))))
        document_indices.append(len(sentences))
    lengths = numpy.array([len(s) for s in sentences], dtype=numpy.int32)
    tokens = numpy.array([t for s in sentences for t in s], dtype=numpy.int32)
    return tokens, lengths, numpy.array(document_indices, dtype=numpy.int64), names


def sentence_reader(tokens, lengths):
    offsets = numpy.concatenate([[0], numpy.cumsum(lengths.astype(numpy.int64))])
    return lambda i: tokens[offsets[i]:offsets[i + 1]].tolist()


def oracle_case(dataset, case):
    tokens, lengths, document_indices, names = dataset
    split, split_id, seq_length, seed, binary_head, short_seq_prob, mask_prob, num_samples, pad_id = case
    split_range = mo.split_ranges(split, len(document_indices) - 1)[split_id]
    sample_index = bo.build_sample_index(document_indices, lengths, split_range, num_samples, seq_length,
                                         short_seq_prob, seed, binary_head)
    tokenizer = bo.Tokenizer(dict(enumerate(names)), CLS, SEP, MASK, PAD)
    read = sentence_reader(tokens, lengths)
    items = [bo.get_item(i, sample_index, read, tokenizer, seq_length, seed, binary_head, mask_prob, pad_id)
             for i in range(min(CHECKED, len(sample_index)))]
    return split_range, sample_index, items


def ngram_cdf(max_ngram):
    """masked_dataset.py's p for n_ngrams = max_ngram, then mtrand.pyx choice's cdf."""
    ngram_nvals = numpy.arange(max_ngram, dtype=numpy.int64) + 1
    nprobs = 1.0 / ngram_nvals
    nprobs = nprobs / nprobs.sum(keepdims=True)
    p = nprobs[:max_ngram] / nprobs[:max_ngram].sum(keepdims=True)
    cdf = p.cumsum()
    cdf /= cdf[-1]
    return cdf


def put_string(group, name, text):
    group.create_dataset(name, data=numpy.frombuffer(text.encode(), dtype=numpy.uint8))


def put(group, name, array):
    array = numpy.ascontiguousarray(array)
    if array.size > 256:
        group.create_dataset(name, data=array, compression="gzip", compression_opts=9, shuffle=True)
    else:
        group.create_dataset(name, data=array)


KEYS = ["text", "types", "labels", "padding_mask", "loss_mask", "is_random", "truncated"]


def write_case(group, case, split_range, sample_index, items):
    split, split_id, seq_length, seed, binary_head, short_seq_prob, mask_prob, num_samples, pad_id = case
    put_string(group, "split", split)
    for name, value in [("split_id", split_id), ("seq_length", seq_length), ("seed", seed),
                        ("binary_head", int(binary_head)), ("short_seq_prob", short_seq_prob),
                        ("mask_prob", mask_prob), ("num_samples", num_samples), ("pad_id", pad_id),
                        ("split_begin", split_range[0]), ("split_end", split_range[1])]:
        group.attrs[name] = value
    put(group, "sample_index", sample_index)
    for key in KEYS:
        put(group, key, numpy.array([item[key] for item in items], dtype=numpy.int64))


def check_megatron_core(npz_path, oracle_results):
    """Megatron-Core's outputs equal the oracle's, case by case, array by array."""
    core = numpy.load(npz_path)
    compared = 0
    for k, (_, sample_index, items) in enumerate(oracle_results):
        prefix = "case_%03d_" % k
        if prefix + "sample_index" not in core:
            continue
        if not numpy.array_equal(core[prefix + "sample_index"], sample_index):
            raise SystemExit("megatron-core sample index differs from the oracle in case %d" % k)
        for key in KEYS:
            expected = numpy.array([item[key] for item in items], dtype=numpy.int64)
            if not numpy.array_equal(core[prefix + key], expected):
                raise SystemExit("megatron-core %s differs from the oracle in case %d" % (key, k))
        compared += 1
    if compared == 0:
        raise SystemExit("no case of %s matched" % npz_path)
    return core, compared


def main():
    import h5py

    output = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "megatron_bert_cases.h5")
    dataset = make_dataset()
    tokens, lengths, document_indices, names = dataset
    results = [oracle_case(dataset, case) for case in CASES]
    npz_path = os.path.join(HERE, "megatron_core_bert.npz")
    core = None
    if os.path.exists(npz_path):
        core, compared = check_megatron_core(npz_path, results)
        print("megatron-core outputs equal the oracle in %d cases" % compared)
    temporary = output + ".tmp"
    with h5py.File(temporary, "w") as f:
        group = f.create_group("dataset")
        put(group, "tokens", tokens)
        put(group, "sentence_lengths", lengths)
        put(group, "document_indices", document_indices)
        put(group, "is_subword", numpy.array([n.startswith("##") for n in names], dtype=numpy.uint8))
        for name, value in [("vocab_size", VOCAB_SIZE), ("cls", CLS), ("sep", SEP), ("mask", MASK), ("pad", PAD)]:
            group.attrs[name] = value
        group = f.create_group("ngram_cdf")
        for max_ngram in range(1, 7):
            put(group, "max_%d" % max_ngram, ngram_cdf(max_ngram))
        cases = f.create_group("cases")
        for k, (case, result) in enumerate(zip(CASES, results)):
            write_case(cases.create_group("case_%03d" % k), case, *result)
        if core is not None:
            group = f.create_group("megatron_core")
            for k, case in enumerate(CASES):
                prefix = "case_%03d_" % k
                if prefix + "sample_index" in core:
                    items = [{key: core[prefix + key][i] for key in KEYS} for i in range(len(core[prefix + "text"]))]
                    write_case(group.create_group("case_%03d" % k), case, results[k][0],
                               core[prefix + "sample_index"], items)
    os.replace(temporary, output)
    print("wrote %s: %d cases, %d sentences, %d documents" % (output, len(CASES), len(lengths),
                                                            len(document_indices) - 1))


if __name__ == "__main__":
    main()
