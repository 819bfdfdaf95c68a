#!/usr/bin/python3
"""Megatron-Core's BERT samples and masks, computed the way Megatron computes them, with numpy.

An independent oracle for lib/data/bert_samples.{h,cpp} and lib/data/bert_masking.{h,cpp}: it
follows Megatron-LM's megatron/core/datasets/ (megatron-core 0.16.1) bert_dataset.py,
masked_dataset.py (_build_sample_index, _create_masked_lm_predictions) and helpers.cpp
(build_mapping, get_target_sample_len) step by step, with examples/bert/pretrain_bert.py's
masking settings (max n-gram 3, whole words, no permutation, no geometric, no longer n-grams).
numpy's RandomState is called (nothing of numpy re-implemented); helpers.cpp's std::mt19937 and
std::mt19937_64 are written out below (the C++ standard's definitions) and its loops ported line by
line. Where Megatron asserts, loops forever or raises, this raises MegatronFailure instead.

Used by tests/data/make_bert_cases.py (the fixture read by tests/unit/data/test_bert_data.cpp)
and checked against Megatron-Core's own code by tests/data/megatron_core_bert.py.
Run it directly for its self-check: /usr/bin/python3 tests/data/megatron_bert_oracle.py
"""

import numpy

LONG_SENTENCE_LEN = 512  # helpers.cpp
UINT32 = 0xFFFFFFFF
UINT64 = 0xFFFFFFFFFFFFFFFF


class MegatronFailure(Exception):
    """Megatron would assert, hang or raise on this input."""


class Mt19937:
    """std::mt19937 (32-bit Mersenne twister, seed by init_genrand)."""

    def __init__(self, seed):
        self.state = [seed & UINT32]
        for i in range(1, 624):
            prev = self.state[-1]
            self.state.append((1812433253 * (prev ^ (prev >> 30)) + i) & UINT32)
        self.index = 624

    def _twist(self):
        s = self.state
        for i in range(624):
            y = (s[i] & 0x80000000) | (s[(i + 1) % 624] & 0x7FFFFFFF)
            s[i] = s[(i + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        self.index = 0

    def __call__(self):
        if self.index >= 624:
            self._twist()
        y = self.state[self.index]
        self.index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y & UINT32


class Mt19937_64:
    """std::mt19937_64."""

    def __init__(self, seed):
        self.state = [seed & UINT64]
        for i in range(1, 312):
            prev = self.state[-1]
            self.state.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & UINT64)
        self.index = 312

    def _twist(self):
        s = self.state
        for i in range(312):
            y = (s[i] & 0xFFFFFFFF80000000) | (s[(i + 1) % 312] & 0x7FFFFFFF)
            s[i] = s[(i + 156) % 312] ^ (y >> 1) ^ (0xB5026F5AA96619E9 if y & 1 else 0)
        self.index = 0

    def __call__(self):
        if self.index >= 312:
            self._twist()
        y = self.state[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & UINT64


def _get_target_sample_len(short_seq_ratio, max_length, rand32_gen):
    """helpers.cpp get_target_sample_len (uint32 arithmetic: the draw is unsigned)."""
    if short_seq_ratio == 0:
        return max_length
    random_number = rand32_gen()
    if random_number % short_seq_ratio == 0:
        return 2 + random_number % (max_length - 1)
    return max_length


def build_mapping(docs, sizes, num_epochs, max_num_samples, max_seq_length, short_seq_prob, seed,
                  min_num_sent):
    """helpers.cpp build_mapping_impl, its asserts active. Returns (num_samples, 3) rows of
    (first sentence, end sentence, target length), in uint32 (uint64 above 2^32 sentences)."""
    if not num_epochs > 0:
        raise MegatronFailure("assert num_epochs > 0")
    if not max_seq_length > 1:
        raise MegatronFailure("assert max_seq_length > 1")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise MegatronFailure("assert 0 <= short_seq_prob <= 1")
    if not 0 < seed < 2**31 - 1:  # seed + 1 must not overflow int32 either
        raise MegatronFailure("assert seed > 0")
    docs = [int(d) for d in docs]
    sizes = [int(s) for s in sizes]
    short_seq_ratio = 0
    if short_seq_prob > 0:
        short_seq_ratio = int(round_half_away(1.0 / short_seq_prob))
    rand32_gen = Mt19937(seed)
    maps = []
    for epoch in range(num_epochs):
        if len(maps) >= max_num_samples:
            break
        samples_before = len(maps)
        for doc in range(len(docs) - 1):
            sent_index_first = docs[doc]
            sent_index_last = docs[doc + 1]
            prev_start_index = sent_index_first
            num_remain_sent = sent_index_last - sent_index_first
            contains_long_sentence = False
            if num_remain_sent > 1:
                for sent_index in range(sent_index_first, sent_index_last):
                    if sizes[sent_index] > LONG_SENTENCE_LEN:
                        contains_long_sentence = True
                        break
            if num_remain_sent >= min_num_sent and not contains_long_sentence:
                seq_len = 0
                num_sent = 0
                target_seq_len = _get_target_sample_len(short_seq_ratio, max_seq_length, rand32_gen)
                for sent_index in range(sent_index_first, sent_index_last):
                    seq_len += sizes[sent_index]
                    num_sent += 1
                    num_remain_sent -= 1
                    if ((seq_len >= target_seq_len and num_remain_sent > 1 and num_sent >= min_num_sent)
                            or num_remain_sent == 0):
                        maps.append((prev_start_index, sent_index + 1, target_seq_len))
                        prev_start_index = sent_index + 1
                        target_seq_len = _get_target_sample_len(short_seq_ratio, max_seq_length, rand32_gen)
                        seq_len = 0
                        num_sent = 0
        if len(maps) == samples_before and num_epochs > 1:
            raise MegatronFailure("build_mapping loops forever: an epoch yields no sample")
    rand64_gen = Mt19937_64(seed + 1)
    for i in range(len(maps) - 1, 0, -1):
        j = rand64_gen() % (i + 1)
        maps[i], maps[j] = maps[j], maps[i]
    dtype = numpy.uint64 if len(sizes) > UINT32 else numpy.uint32
    return numpy.array(maps, dtype=dtype).reshape(-1, 3)


def round_half_away(x):
    """C's round()."""
    return numpy.floor(x + 0.5) if x >= 0 else numpy.ceil(x - 0.5)


def build_sample_index(document_indices, sequence_lengths, split_range, num_samples, sequence_length,
                       short_seq_prob, seed, binary_head):
    """MaskedWordPieceDataset._build_sample_index for BERTMaskedWordPieceDataset: the split's
    documents [begin, end) of the whole dataset's document_indices (sentence bounds)."""
    begin, end = split_range
    if end <= begin:
        raise MegatronFailure("self.indices[-1] of an empty split")
    indices = numpy.append(numpy.arange(begin, end, dtype=numpy.int32), end)
    docs = numpy.asarray(document_indices, dtype=numpy.int64)[indices]
    num_epochs = numpy.iinfo(numpy.int32).max - 1 if num_samples is not None else 1
    if num_samples is None:
        raise MegatronFailure("build_mapping takes no None for max_num_samples")
    return build_mapping(docs, sequence_lengths, num_epochs, num_samples, sequence_length - 3,
                         short_seq_prob, seed, 2 if binary_head else 1)


class Tokenizer:
    """The tokenizer attributes Megatron's BERT dataset reads."""

    def __init__(self, inv_vocab, cls, sep, mask, pad):
        self.inv_vocab = inv_vocab
        self.cls = cls
        self.sep = sep
        self.mask = mask
        self.pad = pad


def create_masked_lm_predictions(token_ids, target_sequence_length, numpy_random_state, tokenizer,
                                 token_lookup, masking_probability, max_ngram=3, do_full_word=True):
    """masked_dataset._create_masked_lm_predictions without permutation, geometric or longer
    n-grams (pretrain_bert.py), with bert_dataset._get_token_mask. Returns the masked tokens,
    positions and labels."""
    candidates = []
    for i, token_id in enumerate(token_ids):
        if token_id == tokenizer.cls or token_id == tokenizer.sep:
            continue
        if token_id not in tokenizer.inv_vocab:
            raise MegatronFailure("KeyError: token %d not in the vocabulary" % token_id)
        if not tokenizer.inv_vocab[token_id].startswith("##"):
            candidates.append([i])
        elif do_full_word and len(candidates) > 0:
            candidates[-1].append(i)
        else:
            candidates.append([i])

    n_maskings = min(masking_probability * target_sequence_length,
                     max(1, int(round(len(token_ids) * masking_probability))))
    ngram_nvals = numpy.arange(max_ngram, dtype=numpy.int64) + 1
    nprobs = 1.0 / ngram_nvals
    nprobs = nprobs / nprobs.sum(keepdims=True)
    candidate_ngrams = [[candidates[idx:idx + n] for n in ngram_nvals] for idx in range(len(candidates))]
    numpy_random_state.shuffle(candidate_ngrams)

    masked_token_ids = list(token_ids)
    masked_positions_and_labels = []
    masked_indices = set()
    for candidate_idx in range(len(candidate_ngrams)):
        n_ngrams = len(candidate_ngrams[candidate_idx])
        if len(masked_positions_and_labels) >= n_maskings:
            break
        if not candidate_ngrams[candidate_idx]:
            continue
        p = nprobs[:n_ngrams] / nprobs[:n_ngrams].sum(keepdims=True)
        n = numpy_random_state.choice(ngram_nvals[:n_ngrams], p=p)
        while True:
            ngram_indices = sum(candidate_ngrams[candidate_idx][n - 1], [])
            n = n - 1
            if n_maskings >= len(masked_positions_and_labels) + len(ngram_indices):
                skip_candidate = False
                break
            if n == 0:
                skip_candidate = True
                break
        if skip_candidate:
            continue
        if any(idx in masked_indices for idx in ngram_indices):
            continue
        for index in ngram_indices:
            masked_indices.add(index)
            mask = get_token_mask(numpy_random_state, tokenizer, token_lookup)
            masked_token_ids[index] = token_ids[index] if mask is None else mask
            masked_positions_and_labels.append((index, token_ids[index]))
    if not len(masked_positions_and_labels) <= n_maskings:
        raise MegatronFailure("assert len(masked_positions_and_labels) <= n_maskings")
    numpy_random_state.shuffle(candidate_ngrams)  # Megatron draws it; nothing reads it after
    masked_positions_and_labels = sorted(masked_positions_and_labels, key=lambda x: x[0])
    return (masked_token_ids, [pos for pos, _ in masked_positions_and_labels],
            [label for _, label in masked_positions_and_labels])


def get_token_mask(numpy_random_state, tokenizer, token_lookup):
    """bert_dataset._get_token_mask: 80% [MASK], 10% a random id of the vocabulary, 10% kept."""
    if numpy_random_state.random() < 0.8:
        return tokenizer.mask
    if numpy_random_state.random() >= 0.5:
        return token_lookup[numpy_random_state.randint(0, len(token_lookup))]
    return None


def get_item(idx, sample_index, sentences, tokenizer, sequence_length, seed, binary_head, masking_probability,
             pad_token_id):
    """BERTMaskedWordPieceDataset.__getitem__: `sentences(i)` returns sentence i's token ids;
    pad_token_id is Megatron's _pad_token_id (tokenizer.pad, or -1 when it collides)."""
    token_lookup = sorted(tokenizer.inv_vocab.keys())
    idx_beg, idx_end, target_sequence_length = (int(v) for v in sample_index[idx])
    sample = [list(sentences(i)) for i in range(idx_beg, idx_end)]
    numpy_random_state = numpy.random.RandomState(seed=(seed + idx) % 2**32)
    if not target_sequence_length <= sequence_length:
        raise MegatronFailure("assert target_sequence_length <= sequence_length")
    pivot = len(sample)
    is_next_random = False
    if binary_head:
        if not len(sample) > 1:
            raise MegatronFailure("the sample must contain at least two sentences")
        pivot = 1
        if len(sample) >= 3:
            pivot = numpy_random_state.randint(low=1, high=len(sample))
        is_next_random = numpy_random_state.random() < 0.5
    split_a = [t for s in sample[:pivot] for t in s]
    split_b = [t for s in sample[pivot:] for t in s]
    if is_next_random:
        split_a, split_b = split_b, split_a
    truncated = len(split_a) + len(split_b) > target_sequence_length
    while len(split_a) + len(split_b) > target_sequence_length:
        split = split_a if len(split_a) > len(split_b) else split_b
        if numpy_random_state.random() < 0.5:
            del split[0]
        else:
            del split[-1]
    tokens = [tokenizer.cls, *split_a, tokenizer.sep]
    assignments = [0] * (len(split_a) + 2)
    if split_b:
        tokens += [*split_b, tokenizer.sep]
        assignments += [1] * (len(split_b) + 1)
    tokens, masked_positions, masked_labels = create_masked_lm_predictions(
        tokens, target_sequence_length, numpy_random_state, tokenizer, token_lookup, masking_probability)
    length_pads = sequence_length - len(tokens)
    if not length_pads >= 0:
        raise MegatronFailure("assert length_pads >= 0")
    tokens = numpy.pad(numpy.array(tokens, dtype=numpy.int64), (0, length_pads), constant_values=pad_token_id)
    assignments = numpy.pad(numpy.array(assignments, dtype=numpy.int64), (0, length_pads),
                            constant_values=pad_token_id)
    mask_pads = numpy.ones(sequence_length, dtype=numpy.int64)
    mask_pads[tokens == pad_token_id] = pad_token_id
    labels = numpy.zeros(sequence_length, dtype=numpy.int64) - 1
    labels[masked_positions] = masked_labels
    mask_loss = numpy.zeros(sequence_length, dtype=numpy.int64)
    mask_loss[masked_positions] = 1
    tokens[tokens == pad_token_id] = 0
    labels[labels == pad_token_id] = 0
    return {"text": tokens, "types": assignments, "labels": labels, "is_random": int(is_next_random),
            "padding_mask": mask_pads, "loss_mask": mask_loss, "truncated": int(truncated)}


def _self_check():
    """The C++ standard's check values (10000th output of the default-seeded engines), and
    std::mt19937 equal to numpy's MT19937 raw stream."""
    gen = Mt19937(5489)
    for _ in range(9999):
        gen()
    assert gen() == 4123659995
    gen = Mt19937_64(5489)
    for _ in range(9999):
        gen()
    assert gen() == 9981545732273789042
    gen = Mt19937(1234)
    raw = numpy.random.RandomState(1234).randint(0, 2**32, size=1300, dtype=numpy.uint64)
    assert [gen() for _ in range(1300)] == raw.tolist()
    print("megatron_bert_oracle: self-check passed")


if __name__ == "__main__":
    _self_check()
