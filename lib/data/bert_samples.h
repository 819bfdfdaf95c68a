// Megatron-Core's BERT sample index, reproduced exactly: which runs of sentences form each sample
// and the target length of each. Pure functions over sentence lengths and document bounds (the
// token dataset's sequence_lengths() and document_indices(), one sequence per sentence, as
// Megatron's --split-sentences preprocessing writes them); data/bert_masking.h turns one sample's
// sentences into tokens and masks.
//
// Followed (NVIDIA/Megatron-LM, megatron-core 0.16.1, megatron/core/datasets/): helpers.cpp
// build_mapping / get_target_sample_len, masked_dataset.py _build_sample_index, bert_dataset.py
// (max length = sequence length - 3 for [CLS] and two [SEP]; at least 2 sentences per sample with
// the binary head, else 1). In order:
//   - documents with fewer sentences than that minimum are skipped, and so are documents of more
//     than one sentence holding a sentence over 512 tokens (a one-sentence document is not checked);
//   - a target length per sample from one std::mt19937(seed) run through all epochs and documents:
//     with ratio = C round(1 / short_seq_prob) (0 when the probability is 0), a draw r with
//     r % ratio == 0 gives 2 + r % (max_len - 1), else max_len; one draw at each document's start
//     and one after each sample (the last one of a document unused);
//   - sentences are added until the run reaches the target with more than one sentence left in
//     the document and the minimum met, or the document ends;
//   - epochs repeat (up to 2^31 - 2) until at least num_samples samples exist, whole epochs only;
//   - the samples are shuffled by Fisher-Yates from the end with std::mt19937_64(seed + 1),
//     j = draw % (i + 1).
// The split is over documents (MaskedWordPieceDataset.numel_low_level_dataset): the split's range
// comes from data/megatron_indices.h split_ranges(split, document_count).
//
// Where Megatron asserts or loops forever, these throw mt::Error (mt::UsageError for a bad
// parameter): an epoch that yields no sample (Megatron would loop for 2^31 epochs), an empty split
// (IndexError), a seed outside (0, 2^31 - 1) (assert seed > 0; seed + 1 must fit int32).
//
// Tested in tests/unit/data/test_bert_data.cpp against tests/data/megatron_bert_oracle.py (fixture
// tests/data/megatron_bert_cases.h5, written by tests/data/make_bert_cases.py) and against
// Megatron-Core's own outputs (tests/data/megatron_core_bert.py).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "data/megatron_indices.h"

namespace mt::data {

inline constexpr int32_t kBertLongSentenceLength = 512;  // helpers.cpp LONG_SENTENCE_LEN

// One row of Megatron's sample index (stored there as uint32, or uint64 above 2^32 sentences).
struct BertSampleRange {
  int64_t first_sentence = 0;  // sentences [first_sentence, end_sentence) of the dataset
  int64_t end_sentence = 0;
  int32_t target_length = 0;   // tokens of A + B the sample is truncated to (without [CLS]/[SEP])
  bool operator==(const BertSampleRange&) const = default;
};

// helpers.cpp build_mapping: `document_bounds` are the sentence bounds of the documents taken
// (Megatron's document_indices[indices] with the end appended: D + 1 non-decreasing values),
// `sentence_lengths` all sentences of the dataset. Throws mt::UsageError for num_epochs < 1,
// max_seq_length < 2, short_seq_prob outside [0, 1] or in (0, 1 / (2^31 - 1)) (1 / p must fit
// int32), a bad seed or min_sentences < 1, and mt::Error for bounds outside the sentences or
// not non-decreasing, a negative sentence length, or an epoch without a sample when more epochs
// are needed.
std::vector<BertSampleRange> build_bert_mapping(std::span<const int64_t> document_bounds,
                                                std::span<const int32_t> sentence_lengths, int64_t num_epochs,
                                                uint64_t max_num_samples, int32_t max_seq_length,
                                                double short_seq_prob, int64_t seed, int32_t min_sentences);

struct BertSampleIndexConfig {
  int64_t seq_length = 512;     // --seq-length: the tokens of a sample, [CLS] and [SEP]s included (> 4)
  int64_t seed = 1234;          // --seed, in (0, 2^31 - 1)
  double short_seq_prob = 0.1;  // --short-seq-prob
  bool binary_head = true;      // --bert-binary-head (the default): two segments per sample
  int64_t num_samples = 0;      // the split's sample count (Megatron's sizes[split]); >= 0
};

// BERTMaskedWordPieceDataset's sample index for one split: `document_indices` of the whole
// dataset (Megatron's: D + 1 sentence bounds from 0), `documents` the split's document range.
// Holds at least num_samples samples (whole epochs; none when num_samples is 0).
std::vector<BertSampleRange> build_bert_sample_index(std::span<const int64_t> document_indices,
                                                     std::span<const int32_t> sentence_lengths,
                                                     SequenceRange documents, const BertSampleIndexConfig& config);

}  // namespace mt::data
