#!/usr/bin/python3
"""Megatron-Core's dataset index arrays, computed the way Megatron computes them, with numpy.

An independent oracle for lib/data/megatron_indices.{h,cpp}: it follows Megatron-LM's
megatron/core/datasets/ gpt_dataset.py (002398e7f3b3), helpers.cpp (298c71d28a88), helpers.py
(0733dbe1b5b7), blended_megatron_dataset_builder.py, blended_megatron_dataset_config.py, utils.py
(00caa53af309) and blended_dataset.py (68eac5c9f3ac) step by step, calls numpy's RandomState itself
(nothing of numpy is re-implemented) and ports helpers.cpp's loops to Python line by line.
Where Megatron asserts, loops forever or raises, this raises MegatronFailure instead.

Used by tests/data/make_index_cases.py (the fixture read by
tests/unit/data/test_megatron_indices.cpp) and tests/tools/mt-shard-oracle.bats.
"""

import functools
import math
import re

import numpy

THRESHOLD = 0.80
MID_LEVEL_DATASET_SURPLUS = 0.005


class MegatronFailure(Exception):
    """Megatron would assert, hang or raise on this input."""


def normalize(weights):
    """utils.normalize."""
    w = numpy.array(weights, dtype=numpy.float64)
    w_sum = numpy.sum(w)
    if not w_sum > 0:
        raise MegatronFailure("weights sum to zero")
    return (w / w_sum).tolist()


def parse_and_normalize_split(split):
    """blended_megatron_dataset_config.parse_and_normalize_split."""
    try:
        parts = list(map(float, re.findall(r"[.0-9]+", split)))
    except ValueError as error:
        raise MegatronFailure(str(error))
    parts = parts + [0.0 for _ in range(3 - len(parts))]
    if len(parts) != 3:
        raise MegatronFailure("more than three split parts")
    return normalize(parts)


def convert_split_vector_to_split_matrix(vector):
    """blended_megatron_dataset_config.convert_split_vector_to_split_matrix (one vector)."""
    expansion = functools.reduce(lambda a, b: a + [a[len(a) - 1] + b], [[0], *vector])
    bookends = list(zip(expansion[:-1], expansion[1:]))
    return [None if b[1] <= b[0] else (b[0], b[1]) for b in bookends]


def split_ranges(split, num_elements):
    """The builder's indexed_indices bounds per split: (begin, end) or None."""
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    out = []
    for bookend in matrix:
        if bookend is None:
            out.append(None)
        else:
            out.append((int(round(bookend[0] * float(num_elements))),
                        int(round(bookend[1] * float(num_elements)))))
    return out


def _build_document_index(documents, num_epochs, numpy_random_state, separate_final_epoch):
    """gpt_dataset._build_document_index."""
    if not separate_final_epoch or num_epochs == 1:
        document_index = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        document_index[:] = documents
        document_index = document_index.reshape(-1)
        document_index = document_index.astype(numpy.int32)
        numpy_random_state.shuffle(document_index)
        return document_index
    doc_idx_first = _build_document_index(documents, num_epochs - 1, numpy_random_state, False)
    doc_idx_last = _build_document_index(documents, 1, numpy_random_state, False)
    return numpy.concatenate((doc_idx_first, doc_idx_last))


def _build_shuffle_index(num_samples, total_size, numpy_random_state):
    """gpt_dataset._build_shuffle_index."""
    dtype_ = numpy.uint32
    if total_size >= (numpy.iinfo(numpy.uint32).max - 1):
        dtype_ = numpy.int64
    shuffle_idx_first = numpy.arange(start=0, stop=num_samples, step=1, dtype=dtype_)
    numpy_random_state.shuffle(shuffle_idx_first)
    if num_samples == total_size:
        return shuffle_idx_first
    shuffle_idx_last = numpy.arange(start=num_samples, stop=total_size, step=1, dtype=dtype_)
    numpy_random_state.shuffle(shuffle_idx_last)
    return numpy.concatenate((shuffle_idx_first, shuffle_idx_last))


def _build_sample_idx_cpp(sizes, document_idx, seq_length, num_epochs, tokens_per_epoch,
                          drop_last_partial_sequence, add_extra_token_to_sequence, dtype):
    """helpers.cpp build_sample_idx<T>, its asserts active (Megatron's Makefile keeps them)."""
    if not seq_length > 1:
        raise MegatronFailure("assert seq_length > 1")
    if not num_epochs > 0:
        raise MegatronFailure("assert num_epochs > 0")
    if not tokens_per_epoch > 1:
        raise MegatronFailure("assert tokens_per_epoch > 1")
    if drop_last_partial_sequence:
        num_samples = (num_epochs * tokens_per_epoch - add_extra_token_to_sequence) // seq_length
    else:
        # ceil(float(...) / seq_length) in C++ single precision
        num_samples = int(numpy.ceil(numpy.float32(num_epochs * tokens_per_epoch - add_extra_token_to_sequence)
                                     / numpy.float32(seq_length)))
    sample_idx = numpy.zeros((num_samples + 1, 2), dtype=dtype)
    sizes = sizes.tolist()
    document_idx = document_idx.tolist()
    sample_idx_index = 0
    document_idx_index = 0
    doc_offset = 0
    sample_idx[sample_idx_index] = (document_idx_index, doc_offset)
    sample_idx_index += 1
    while sample_idx_index <= num_samples:
        remaining_seq_length = seq_length + add_extra_token_to_sequence
        while remaining_seq_length != 0:
            document_index = document_idx[document_idx_index]
            document_length = sizes[document_index] - doc_offset
            remaining_seq_length -= document_length
            if remaining_seq_length <= 0:
                doc_offset += remaining_seq_length + document_length - add_extra_token_to_sequence
                remaining_seq_length = 0
            else:
                if document_idx_index == len(document_idx) - 1:
                    if sample_idx_index != num_samples:
                        raise MegatronFailure("assert sample_idx_index == num_samples")
                    doc_offset = sizes[document_idx[document_idx_index]] - add_extra_token_to_sequence
                    break
                document_idx_index += 1
                doc_offset = 0
        sample_idx[sample_idx_index] = (document_idx_index, doc_offset)
        sample_idx_index += 1
    return sample_idx


def build_sample_idx(sizes, document_indices, sequence_length, num_epochs, tokens_per_epoch,
                     drop_last_partial_sequence=True, add_extra_token_to_sequence=True):
    """helpers.build_sample_idx: the int32 / int64 variant choice."""
    if len(sizes) == 0:
        raise MegatronFailure("sizes.max() of an empty array")
    sample_idx_max = max(document_indices.shape[0], sizes.max())
    extra = 1 if add_extra_token_to_sequence else 0
    if sample_idx_max <= numpy.iinfo(numpy.int32).max:
        sample_idx = _build_sample_idx_cpp(sizes, document_indices, sequence_length, num_epochs,
                                           tokens_per_epoch, drop_last_partial_sequence, extra, numpy.int32)
        if not (sample_idx.min() >= 0 and sample_idx.max() <= sample_idx_max):
            raise MegatronFailure("assert sample_idx.min() >= 0 and sample_idx.max() <= sample_idx_max")
    else:
        sample_idx = _build_sample_idx_cpp(sizes, document_indices, sequence_length, num_epochs,
                                           tokens_per_epoch, drop_last_partial_sequence, extra, numpy.int64)
    return sample_idx


def gpt_indices(sequence_lengths, begin, end, sequence_length, random_seed, num_samples,
                add_extra_token_to_sequence=True, drop_last_partial_sequence=True):
    """GPTDataset._build_document_sample_shuffle_indices for indexed_indices = arange(begin, end).

    sequence_lengths: the whole dataset's int32 lengths. num_samples: int or None.
    Returns a dict of the three arrays and the scalars Megatron derives on the way.
    """
    sequence_lengths = numpy.asarray(sequence_lengths, dtype=numpy.int32)
    indices = numpy.arange(start=begin, stop=end, step=1, dtype=numpy.int32)
    extra = 1 if add_extra_token_to_sequence else 0

    # _get_num_tokens_per_epoch
    num_tokens_per_epoch = int(numpy.sum(sequence_lengths[indices]))

    # _get_num_epochs (a loop that never ends when the epoch holds no token)
    num_epochs = 1
    if num_samples is not None:
        num_tokens = num_tokens_per_epoch
        num_tokens_requested = num_samples * sequence_length + extra
        if num_tokens_per_epoch <= 0 and num_tokens < num_tokens_requested:
            raise MegatronFailure("_get_num_epochs never ends")
        while num_tokens < num_tokens_requested:
            num_epochs += 1
            num_tokens += num_tokens_per_epoch

    num_samples_sans_final_epoch = None
    if num_epochs == 1:
        separate_final_epoch = False
    else:
        num_samples_sans_final_epoch = ((num_epochs - 1) * num_tokens_per_epoch - extra) // sequence_length
        num_samples_from_final_epoch = num_samples - num_samples_sans_final_epoch
        num_samples_per_epoch = (num_tokens_per_epoch - extra) // sequence_length
        if not num_samples_from_final_epoch >= 0:
            raise MegatronFailure("assert num_samples_from_final_epoch >= 0")
        if not num_samples_from_final_epoch <= num_samples_per_epoch + 1:
            raise MegatronFailure("assert num_samples_from_final_epoch <= num_samples_per_epoch + 1")
        separate_final_epoch = num_samples_from_final_epoch < int(THRESHOLD * num_samples_per_epoch)

    numpy_random_state = numpy.random.RandomState(random_seed)
    document_index = _build_document_index(indices, num_epochs, numpy_random_state, separate_final_epoch)
    assert document_index.dtype == numpy.int32

    sample_index = build_sample_idx(sequence_lengths, document_index, sequence_length, num_epochs,
                                    num_tokens_per_epoch, drop_last_partial_sequence, add_extra_token_to_sequence)

    if separate_final_epoch:
        shuffle_index = _build_shuffle_index(num_samples_sans_final_epoch, sample_index.shape[0] - 1,
                                             numpy_random_state)
    else:
        shuffle_index = _build_shuffle_index(sample_index.shape[0] - 1, sample_index.shape[0] - 1,
                                             numpy_random_state)
    return {
        "document_index": document_index,
        "sample_index": sample_index,
        "shuffle_index": shuffle_index,
        "num_tokens_per_epoch": num_tokens_per_epoch,
        "num_epochs": num_epochs,
        "separate_final_epoch": separate_final_epoch,
        "num_samples_sans_final_epoch": num_samples_sans_final_epoch if separate_final_epoch else 0,
    }


def get_size_per_split_per_dataset(normalized_weights, target_size_per_split, surplus=0.0):
    """blended_megatron_dataset_builder._get_size_per_split_per_dataset."""
    assert numpy.isclose(sum(normalized_weights), 1.0)
    return [[int(math.ceil(math.ceil(target_size * weight) * (1 + surplus)))
             for target_size in target_size_per_split] for weight in normalized_weights]


def build_blending_indices(weights, size):
    """helpers.cpp build_blending_indices."""
    num_datasets = len(weights)
    dataset_index = numpy.zeros(size, dtype=numpy.int16)
    dataset_sample_index = numpy.zeros(size, dtype=numpy.int64)
    current_samples = [0] * num_datasets
    for sample_idx in range(size):
        sample_idx_double = max(float(sample_idx), 1.0)
        max_error_index = 0
        max_error = weights[0] * sample_idx_double - float(current_samples[0])
        for dataset_idx in range(1, num_datasets):
            error = weights[dataset_idx] * sample_idx_double - float(current_samples[dataset_idx])
            if error > max_error:
                max_error = error
                max_error_index = dataset_idx
        dataset_index[sample_idx] = max_error_index
        dataset_sample_index[sample_idx] = current_samples[max_error_index]
        current_samples[max_error_index] += 1
    return dataset_index, dataset_sample_index


def build_exhaustive_blending_indices(sizes):
    """helpers.cpp build_exhaustive_blending_indices."""
    num_datasets = len(sizes)
    total_size = sum(sizes)
    counts = [0] * num_datasets
    unspent = set(range(num_datasets))
    weights = [sizes[i] / float(total_size) for i in range(num_datasets)]
    dataset_index = numpy.zeros(total_size, dtype=numpy.int16)
    dataset_sample_index = numpy.zeros(total_size, dtype=numpy.int64)
    index_sample = 0
    while unspent:
        index_sample_double = max(float(index_sample), 1.0)
        error_argmax = -1
        error_max = -numpy.finfo(numpy.float64).max
        for index_dataset in sorted(unspent):
            error = weights[index_dataset] * index_sample_double - float(counts[index_dataset])
            if error > error_max:
                error_argmax = index_dataset
                error_max = error
        dataset_index[index_sample] = error_argmax
        dataset_sample_index[index_sample] = counts[error_argmax]
        counts[error_argmax] += 1
        if sizes[error_argmax] - float(counts[error_argmax]) == 0:
            unspent.discard(error_argmax)
        index_sample += 1
    return dataset_index, dataset_sample_index


def blend(weights, size, dataset_lengths):
    """One split of BlendedMegatronDatasetBuilder + BlendedDataset.

    weights: raw weights or None; size: the split's size or None; dataset_lengths: len() of each
    built GPTDataset. Returns (per-dataset num_samples or None, dataset_index, dataset_sample_index).
    """
    if len(dataset_lengths) >= 32767:
        raise MegatronFailure("assert len(datasets) < 32767")
    if weights is not None:
        if size is None:
            raise MegatronFailure("ValueError: client-specified weights require a size")
        weights = normalize(weights)
        target = get_size_per_split_per_dataset(weights, [size])
        buffer = get_size_per_split_per_dataset(weights, [size], surplus=MID_LEVEL_DATASET_SURPLUS)
        num_samples = [b[0] for b in buffer]
        size_i = sum(t[0] for t in target)
        weights_i = weights
    else:
        num_samples = None
        weights_i = list(dataset_lengths)
        size_i = None if size is None else min(size, sum(weights_i))
    # BlendedDataset
    if not all(w > 0 for w in weights_i):
        raise MegatronFailure("assert all weights > 0")
    if size_i is not None:
        weights_i = normalize(weights_i)
        dataset_index, dataset_sample_index = build_blending_indices(weights_i, size_i)
    else:
        dataset_index, dataset_sample_index = build_exhaustive_blending_indices(weights_i)
    for d, length in enumerate(dataset_lengths):
        chosen = dataset_sample_index[dataset_index == d]
        if chosen.size and chosen.max() >= length:
            raise MegatronFailure("IndexError: dataset %d oversampled" % d)
    return num_samples, dataset_index, dataset_sample_index
