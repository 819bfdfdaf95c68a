// One split of a pre-split sentence token dataset as Megatron-Core's BERTMaskedWordPieceDataset:
// the sample index of data/bert_samples.h built once, and data/bert_masking.h's sample i read
// from the token dataset (one sequence per sentence). This is what a BERT trainer and
// `mt-shard bert-samples` use; the index lives in memory (Megatron caches it as a .npy, mt builds
// it on open: one pass over the sentence lengths per epoch).
//
// Tested in tests/unit/data/test_bert_data.cpp (the fixture's sentences written as an mt token
// dataset, its samples equal to the oracle's).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "data/bert_masking.h"
#include "data/bert_samples.h"
#include "data/megatron_indices.h"
#include "data/token_dataset.h"

namespace mt::data {

struct BertDatasetConfig {
  BertSampleIndexConfig index;  // seq_length, seed, short_seq_prob, binary_head, num_samples
  double mask_prob = 0.15;      // --mask-prob
};

class BertDataset {
 public:
  // The split's documents are split_ranges(split, dataset.document_count())[split_id] (Megatron's
  // split over documents); a split of weight 0 is an mt::UsageError naming it, and so is a bad
  // masking config (check_bert_masking_config). `dataset` must
  // outlive this object.
  BertDataset(const TokenDataset& dataset, std::string_view split, Split split_id, BertVocabulary vocabulary,
              const BertDatasetConfig& config);

  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  const std::vector<BertSampleRange>& index() const { return index_; }
  SequenceRange documents() const { return documents_; }
  const BertVocabulary& vocabulary() const { return vocabulary_; }
  // Sample i in [0, size()) (mt::Error otherwise), as BERTMaskedWordPieceDataset[i].
  BertSample sample(int64_t i) const;

 private:
  const TokenDataset& dataset_;
  BertVocabulary vocabulary_;
  BertMaskingConfig masking_;
  SequenceRange documents_;
  std::vector<BertSampleRange> index_;
};

}  // namespace mt::data
