#!/usr/bin/env python3
"""Runs Megatron-Core's own BERTMaskedWordPieceDataset on the fixture dataset of
tests/data/make_bert_cases.py and writes its outputs to tests/data/megatron_core_bert.npz.

Not run by CI: it needs megatron-core 0.16.1 and torch in a venv made by hand outside the
repository, e.g.
    python3 -m venv /work/venv-megatron && /work/venv-megatron/bin/pip install megatron-core==0.16.1 torch numpy
    /work/venv-megatron/bin/python tests/data/megatron_core_bert.py
The committed .npz is then checked equal to tests/data/megatron_bert_oracle.py by
tests/data/make_bert_cases.py (which copies it into tests/data/megatron_bert_cases.h5, where
tests/unit/data/test_bert_data.cpp compares mt with it directly).

The dataset is written with Megatron's own IndexedDatasetBuilder (int32 tokens, one sequence per
sentence, document bounds), the splits and sample counts go through BlendedMegatronDatasetBuilder
as pretrain_bert.py builds them, and the tokenizer is a stand-in object with the attributes the
dataset reads (inv_vocab, cls, sep, mask, pad).
"""

import os
import sys
import tempfile

import numpy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_bert_cases as cases  # noqa: E402

from megatron.core.datasets.bert_dataset import (  # noqa: E402
    BERTMaskedWordPieceDataset, BERTMaskedWordPieceDatasetConfig)
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # noqa: E402


class StandInTokenizer:
    """The attributes BERTMaskedWordPieceDataset reads. Without eos/eod the dataset pads with
    tokenizer.pad; with eod = pad (a collision) it pads with -1 (megatron_dataset._PAD_TOKEN_ID)."""

    def __init__(self, names, pad_collides):
        self.inv_vocab = dict(enumerate(names))
        self.cls, self.sep, self.mask, self.pad = cases.CLS, cases.SEP, cases.MASK, cases.PAD
        if pad_collides:
            self.eod = cases.PAD
        self.unique_identifiers = {"class": "StandInTokenizer", "vocab_size": len(names),
                                   "pad_collides": pad_collides}


def write_indexed_dataset(prefix, tokens, lengths, document_indices):
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.int32)
    offsets = numpy.concatenate([[0], numpy.cumsum(lengths.astype(numpy.int64))])
    for doc in range(len(document_indices) - 1):
        for sentence in range(document_indices[doc], document_indices[doc + 1]):
            builder.add_item(torch.from_numpy(tokens[offsets[sentence]:offsets[sentence + 1]].copy()))
        builder.end_document()
    builder.finalize(prefix + ".idx")


def run_case(prefix, cache, names, case):
    split, split_id, seq_length, seed, binary_head, short_seq_prob, mask_prob, num_samples, pad_id = case
    tokenizer = StandInTokenizer(names, pad_collides=pad_id == -1)
    config = BERTMaskedWordPieceDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=([prefix], None), split=split,
        path_to_cache=cache, tokenizer=tokenizer, masking_probability=mask_prob,
        short_sequence_probability=short_seq_prob, masking_max_ngram=3, masking_do_full_word=True,
        masking_do_permutation=False, masking_use_longer_ngrams=False,
        masking_use_geometric_distribution=False, classification_head=binary_head)
    sizes = [0, 0, 0]
    sizes[split_id] = num_samples
    datasets = BlendedMegatronDatasetBuilder(BERTMaskedWordPieceDataset, sizes, lambda: True, config).build()
    dataset = datasets[split_id]
    out = {"sample_index": numpy.asarray(dataset.sample_index)}
    items = [dataset[i] for i in range(min(cases.CHECKED, len(dataset)))]
    for key in cases.KEYS:
        out[key] = numpy.array([item[key] for item in items], dtype=numpy.int64)
    return out


def main():
    torch.distributed.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    tokens, lengths, document_indices, names = cases.make_dataset()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        prefix = os.path.join(work, "sentences")
        write_indexed_dataset(prefix, tokens, lengths, document_indices)
        for k, case in enumerate(cases.CASES):
            out = run_case(prefix, os.path.join(work, "cache%d" % k), names, case)
            for key, value in out.items():
                results["case_%03d_%s" % (k, key)] = value
            print("case %d: %d samples" % (k, len(out["sample_index"])))
    path = os.path.join(HERE, "megatron_core_bert.npz")
    numpy.savez_compressed(path + ".tmp.npz", **results)
    os.replace(path + ".tmp.npz", path)
    print("wrote", path)


if __name__ == "__main__":
    main()
