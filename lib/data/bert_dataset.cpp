// A split of a sentence token dataset as Megatron's BERT dataset. See bert_dataset.h.
// Tested in tests/unit/data/test_bert_data.cpp.
#include "data/bert_dataset.h"

#include <string>
#include <utility>

#include "core/error.h"

namespace mt::data {

BertDataset::BertDataset(const TokenDataset& dataset, std::string_view split, Split split_id,
                         BertVocabulary vocabulary, const BertDatasetConfig& config)
    : dataset_(dataset), vocabulary_(std::move(vocabulary)) {
  const auto range = split_ranges(split, dataset.document_count())[static_cast<size_t>(split_id)];
  if (!range)
    throw UsageError("--split " + std::string(split), "gives the " + std::string(split_name(split_id)) +
                                                          " split weight 0: it has no BERT samples");
  documents_ = *range;
  masking_.seq_length = config.index.seq_length;
  masking_.seed = config.index.seed;
  masking_.binary_head = config.index.binary_head;
  masking_.mask_prob = config.mask_prob;
  check_bert_masking_config(vocabulary_, masking_);
  index_ = build_bert_sample_index(dataset.document_indices(), dataset.sequence_lengths(), documents_, config.index);
}

BertSample BertDataset::sample(int64_t i) const {
  if (i < 0 || i >= size())
    throw Error("BERT sample " + std::to_string(i), "outside the split's " + std::to_string(size()) + " samples");
  std::vector<int32_t> buffer;
  const auto sentence = [&](int64_t s) -> std::span<const int32_t> {
    buffer = dataset_.get(s);
    return buffer;
  };
  return make_bert_sample(sentence, index_[static_cast<size_t>(i)], i, vocabulary_, masking_);
}

}  // namespace mt::data
