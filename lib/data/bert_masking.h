// Megatron-Core's BERT sample, reproduced exactly: from one sample's sentences (a row of
// data/bert_samples.h's index) to the tokens, token types, labels, loss mask and padding mask a
// BERT trainer feeds, with the sentence-order label. Same values as
// BERTMaskedWordPieceDataset.__getitem__ for the same seed and sample index.
//
// Followed (NVIDIA/Megatron-LM, megatron-core 0.16.1, megatron/core/datasets/): bert_dataset.py
// __getitem__ and _get_token_mask, masked_dataset.py _create_masked_lm_predictions with
// examples/bert/pretrain_bert.py's settings (n-grams up to 3, whole words, no permutation, no
// geometric or longer n-grams); numpy 1.24 legacy RandomState (data/megatron_indices.h
// NumpyRandomState). One RandomState((seed + sample index) mod 2^32) drawn in this order:
//   1. binary head only: pivot = randint(1, sentences) when >= 3 sentences (else 1), then
//      is_random = random() < 0.5, which swaps segments A and B (sentence-order prediction);
//   2. truncation while |A| + |B| > target: the longer segment (B on a tie) loses its first token
//      when random() < 0.5, else its last;
//   3. tokens [CLS] A [SEP] (B [SEP]), types 0 for [CLS] A [SEP], 1 for B [SEP];
//   4. masking: candidates are words (a "##" piece joins the previous candidate, even across a
//      [SEP]; [CLS]/[SEP] are never candidates); budget = min(mask_prob * target,
//      max(1, round_half_even(mask_prob * tokens))); the candidate list shuffled
//      (RandomState.shuffle); per candidate until the budget is reached: n from choice([1..3],
//      p proportional to 1/n) (one random()), shrunk while the n words starting there overflow the
//      budget (skipped at n = 0), skipped when it overlaps a masked word; each of its tokens:
//      random() < 0.8 gives [MASK], else random() >= 0.5 a random id randint(0, vocab_size) of the
//      whole vocabulary (special ids included), else the token is kept. Megatron then shuffles the
//      candidates once more, which changes nothing it returns (not drawn here);
//   5. padding to seq_length with Megatron's pad id, then its post-processing: padding_mask is 1,
//      and pad_id wherever the token equals pad_id (a real token equal to it too); tokens equal to
//      pad_id become 0, labels are -1 except the masked positions (the original token), and labels
//      equal to pad_id become 0; types are padded with pad_id; loss_mask is 1 at masked positions.
// Megatron's pad id is tokenizer.pad, or -1 when it collides with another special token (then
// labels -1 become 0 and padding_mask / types hold -1 at padding: Megatron's values, kept).
//
// Tested in tests/unit/data/test_bert_data.cpp against tests/data/megatron_bert_oracle.py (fixture
// tests/data/megatron_bert_cases.h5) and against Megatron-Core's own outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "data/bert_samples.h"

namespace mt::data {

// What Megatron's BERT dataset reads from its tokenizer: ids 0..vocab_size-1 (its token_lookup,
// the sorted vocabulary ids), which of them are "##" continuation pieces, the special ids.
struct BertVocabulary {
  std::vector<uint8_t> is_subword;  // (vocab_size,) 1 where the piece starts with "##"
  int64_t cls = -1;
  int64_t sep = -1;
  int64_t mask = -1;
  int64_t pad = 0;  // Megatron's _pad_token_id: tokenizer.pad, or -1 when it collides with eos/eod
  int64_t vocab_size() const { return static_cast<int64_t>(is_subword.size()); }
};

struct BertMaskingConfig {
  int64_t seq_length = 512;  // --seq-length
  int64_t seed = 1234;       // --seed (the dataset's random_seed)
  bool binary_head = true;   // --bert-binary-head
  double mask_prob = 0.15;   // --mask-prob, in (0, 1)
  int32_t max_ngram = 3;     // masking_max_ngram (pretrain_bert.py: 3)
  bool whole_word = true;    // masking_do_full_word (pretrain_bert.py: true)
};

// One training sample, each array (seq_length,) as Megatron returns it (int64).
struct BertSample {
  std::vector<int64_t> tokens;        // "text": [CLS] A [SEP] B [SEP] masked, padding 0
  std::vector<int64_t> types;         // "types": 0 / 1 per segment, pad_id at padding
  std::vector<int64_t> labels;        // original token at masked positions, -1 elsewhere (see header)
  std::vector<int64_t> loss_mask;     // 1 at masked positions
  std::vector<int64_t> padding_mask;  // 1 for real tokens, pad_id at padding
  bool is_random = false;             // segments swapped (the sentence-order label)
  bool truncated = false;             // A + B was cut to the target length
};

// mt::UsageError for mask_prob outside (0, 1), max_ngram < 1, or a special id outside the vocabulary.
void check_bert_masking_config(const BertVocabulary& vocabulary, const BertMaskingConfig& config);

// The n-gram distribution numpy's choice samples with: cumsum(p) / its last value, p = 1/n over
// n = 1..max_ngram normalised by numpy.sum twice, as masked_dataset.py computes it (for every
// candidate: n_ngrams is always max_ngram). Bit for bit numpy's values (tested).
std::vector<double> bert_ngram_cdf(int32_t max_ngram);

// Megatron's masking step alone (_create_masked_lm_predictions + _get_token_mask) on `tokens`
// ([CLS] A [SEP] B [SEP]), drawing from `random`; masks `tokens` in place and returns the masked
// positions in increasing order, with the original token of each in `labels`.
struct BertMaskedPositions {
  std::vector<int64_t> positions;
  std::vector<int64_t> labels;
};
BertMaskedPositions mask_bert_tokens(std::vector<int64_t>& tokens, int64_t target_length, NumpyRandomState& random,
                                     const BertVocabulary& vocabulary, const BertMaskingConfig& config);

// BERTMaskedWordPieceDataset.__getitem__(sample_index): `sentence(i)` gives sentence i's tokens
// (the dataset's sequence i); `range` is the sample index's row sample_index. Throws mt::UsageError
// for a bad config or vocabulary (mask_prob outside (0, 1), max_ngram < 1, special ids outside
// the vocabulary), and mt::Error where Megatron asserts or raises: fewer than 2 sentences with the
// binary head, a target length over seq_length, more tokens than seq_length, a token outside the
// vocabulary.
BertSample make_bert_sample(const std::function<std::span<const int32_t>(int64_t)>& sentence, BertSampleRange range,
                            int64_t sample_index, const BertVocabulary& vocabulary, const BertMaskingConfig& config);

}  // namespace mt::data
