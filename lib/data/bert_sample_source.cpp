// BERT's masked samples as model rows (see bert_sample_source.h).
// Tested in tests/unit/train/test_bert_training.cpp.
#include "data/bert_sample_source.h"

#include <string>

#include "core/error.h"

namespace mt::data {

BertSampleSource::BertSampleSource(const BertSourceConfig& config, const BertVocabulary& vocabulary)
    : config_(config), vocabulary_size_(vocabulary.vocab_size()) {
  dataset_ = std::make_unique<TokenDataset>(TokenDataset::open(config.path));
  const auto ranges = split_ranges(config.split, dataset_->document_count());
  for (const Split split : {Split::train, Split::valid, Split::test}) {
    const auto i = static_cast<size_t>(split);
    if (!ranges[i] || config.num_samples[i] <= 0) continue;
    BertDatasetConfig split_config = config.dataset;
    split_config.index.num_samples = config.num_samples[i];
    splits_[i].emplace(*dataset_, config.split, split, vocabulary, split_config);
  }
  if (!splits_[static_cast<size_t>(Split::train)]) {
    throw UsageError("--split " + config.split, "gives the training split no documents (" + config.path + ")");
  }
}

const BertDataset& BertSampleSource::split_dataset(Split split) const {
  const auto& dataset = splits_[static_cast<size_t>(split)];
  if (!dataset) throw Error("BERT data", "the " + std::string(split_name(split)) + " split is absent");
  return *dataset;
}

int64_t BertSampleSource::split_size(Split split) const {
  const auto& dataset = splits_[static_cast<size_t>(split)];
  return dataset ? dataset->size() : 0;
}

void BertSampleSource::sample(Split split, int64_t index, int32_t* tokens) const {
  const BertSample s = split_dataset(split).sample(index);
  const size_t seq = s.tokens.size();
  for (size_t t = 0; t < seq; ++t) tokens[t] = static_cast<int32_t>(s.tokens[t]);
  tokens[seq] = 0;
}

void BertSampleSource::rows(Split split, int64_t index, int seq_length, const SampleRows& out) const {
  if (!out.token_types || !out.key_length || !out.sentence_order) {
    throw Error("BERT data", "rows() needs the token types, key length and sentence order to fill");
  }
  const BertSample s = split_dataset(split).sample(index);
  if (static_cast<int64_t>(s.tokens.size()) != seq_length) {
    throw Error("BERT data", "samples of " + std::to_string(s.tokens.size()) + " tokens, the model's sequence is " +
                                 std::to_string(seq_length));
  }
  int32_t valid = 0;
  for (int t = 0; t < seq_length; ++t) {
    const bool masked = s.loss_mask[t] != 0;
    out.tokens[t] = static_cast<int32_t>(s.tokens[t]);
    out.labels[t] = masked ? static_cast<int32_t>(s.labels[t]) : 0;
    out.loss_mask[t] = masked ? 1.0f : 0.0f;
    out.positions[t] = t;
    out.doc_start[t] = 0;
    out.token_types[t] = s.types[t] == 1 ? 1 : 0;
    if (s.padding_mask[t] == 1) valid = t + 1;
  }
  *out.key_length = valid;
  *out.sentence_order = s.is_random ? 1 : 0;
}

std::string BertSampleSource::describe() const {
  return "BERT masked samples of " + config_.path + " (split " + config_.split + ", " +
         std::to_string(split_size(Split::train)) + " training samples, vocabulary " +
         std::to_string(vocabulary_size_) + ")";
}

}  // namespace mt::data
