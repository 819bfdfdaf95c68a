// BERT's masked samples as mt-train reads them: one pre-split sentence token dataset (one sequence
// per sentence, mt-tokenize's JSON lists) split over documents by --split, each split a
// data/bert_dataset.h BertDataset (Megatron-Core's BERTMaskedWordPieceDataset, the samples it gives
// for the same --seed), turned into the rows the model takes (model/micro_batch.h):
//   tokens   the masked tokens ([CLS] A [SEP] B [SEP], padding 0);
//   labels   the original token at masked positions, 0 elsewhere (Megatron's -1 and its pad-id
//            labels carry loss mask 0: their loss is multiplied by 0 in both);
//   loss_mask 1 at masked positions (Megatron's loss_mask);
//   positions 0, 1, ... (learned absolute positions);
//   token_types 0 / 1 per segment, 0 at padding (Megatron pads with the pad id, [PAD] = 0 in
//            BERT's vocabularies; padded rows reach no loss);
//   key_length the tokens before the padding: one past the last position padding_mask marks real.
//            Megatron also masks a real token equal to the pad id (a random replacement drawn as
//            [PAD], p = 0.1 x 0.15 / vocabulary per token) out of the keys; mt keeps it a key;
//   sentence_order is_random (the segments were swapped).
// sample() gives the masked tokens and a trailing 0 (seq_length + 1, SampleSource's shape).
// Tested in tests/unit/train/test_bert_training.cpp (the trainer on its rows against BertDataset's samples) and
// end to end by tests/tools/mt-train-bert.bats.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>

#include "data/bert_dataset.h"
#include "data/sample_source.h"
#include "data/token_dataset.h"

namespace mt::data {

struct BertSourceConfig {
  std::string path;                     // --data-path: one sentence dataset prefix (.h5 or .bin/.idx)
  std::string split = "969, 30, 1";     // --split, over documents
  BertDatasetConfig dataset;            // seq length, seed, short-seq and mask probabilities, binary head
  std::array<int64_t, 3> num_samples{};  // Megatron's train/valid/test sample counts (index.num_samples unused)
};

class BertSampleSource final : public SampleSource {
 public:
  // Opens the dataset and builds each split's sample index (a split of weight 0 or 0 samples is
  // absent). mt::UsageError for a bad config (BertDataset's), mt::Error for unreadable data.
  BertSampleSource(const BertSourceConfig& config, const BertVocabulary& vocabulary);

  void sample(Split split, int64_t index, int32_t* tokens) const override;
  void rows(Split split, int64_t index, int seq_length, const SampleRows& out) const override;
  int64_t split_size(Split split) const override;
  bool bert() const override { return true; }
  int64_t vocab_size() const override { return vocabulary_size_; }
  std::string describe() const override;
  // The split's BERT dataset (mt::Error when it is absent).
  const BertDataset& split_dataset(Split split) const;

 private:
  BertSourceConfig config_;
  int64_t vocabulary_size_ = 0;
  std::unique_ptr<TokenDataset> dataset_;
  std::array<std::optional<BertDataset>, 3> splits_;
};

}  // namespace mt::data
