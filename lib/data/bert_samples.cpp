// Megatron-Core's BERT sample index (helpers.cpp build_mapping). See bert_samples.h.
// Tested in tests/unit/data/test_bert_data.cpp.
#include "data/bert_samples.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>

#include "core/error.h"

namespace mt::data {
namespace {

std::string num(int64_t value) { return std::to_string(value); }

// helpers.cpp get_target_sample_len: the draw is unsigned (uint_fast32_t), so is the arithmetic.
int32_t target_sample_length(int32_t short_seq_ratio, int32_t max_length, std::mt19937& rand32) {
  if (short_seq_ratio == 0) return max_length;
  const uint64_t draw = rand32();
  if (draw % static_cast<uint64_t>(short_seq_ratio) == 0)
    return static_cast<int32_t>(2 + draw % static_cast<uint64_t>(max_length - 1));
  return max_length;
}

void check_mapping_arguments(std::span<const int64_t> document_bounds, std::span<const int32_t> sentence_lengths,
                             int64_t num_epochs, int32_t max_seq_length, double short_seq_prob, int64_t seed,
                             int32_t min_sentences) {
  if (num_epochs < 1) throw UsageError("BERT sample index", "num_epochs must be >= 1, got " + num(num_epochs));
  if (max_seq_length < 2)
    throw UsageError("BERT sample index", "the maximum sample length (seq_length - 3) must be >= 2, got " +
                                              num(max_seq_length));
  if (!(short_seq_prob >= 0.0 && short_seq_prob <= 1.0))
    throw UsageError("--short-seq-prob", "must be in [0, 1], got " + std::to_string(short_seq_prob));
  if (short_seq_prob > 0 && std::round(1.0 / short_seq_prob) > std::numeric_limits<int32_t>::max())
    throw UsageError("--short-seq-prob",
                     "must be 0 or at least 1 / (2^31 - 1) (helpers.cpp keeps 1 / p in int32), got " +
                         std::to_string(short_seq_prob));
  if (seed <= 0 || seed >= std::numeric_limits<int32_t>::max())
    throw UsageError("--seed", "the BERT sample index needs a seed in [1, 2^31 - 2] (Megatron's helpers.cpp "
                               "asserts seed > 0 and adds 1 in int32), got " + num(seed));
  if (min_sentences < 1) throw UsageError("BERT sample index", "min_sentences must be >= 1");
  if (document_bounds.empty()) throw Error("BERT sample index", "no document bounds (need D + 1 values)");
  for (size_t d = 0; d < document_bounds.size(); ++d) {
    const int64_t bound = document_bounds[d];
    if (bound < 0 || bound > static_cast<int64_t>(sentence_lengths.size()) ||
        (d > 0 && bound < document_bounds[d - 1]))
      throw Error("BERT sample index", "document bound " + num(static_cast<int64_t>(d)) + " = " + num(bound) +
                                           " is not non-decreasing inside [0, " +
                                           num(static_cast<int64_t>(sentence_lengths.size())) + "]");
  }
  for (size_t s = 0; s < sentence_lengths.size(); ++s)
    if (sentence_lengths[s] < 0)
      throw Error("BERT sample index", "sentence " + num(static_cast<int64_t>(s)) + " has a negative length");
}

// True when a document of more than one sentence holds one over kBertLongSentenceLength tokens.
bool has_long_sentence(std::span<const int32_t> sentence_lengths, int64_t first, int64_t last) {
  if (last - first <= 1) return false;
  for (int64_t s = first; s < last; ++s)
    if (sentence_lengths[s] > kBertLongSentenceLength) return true;
  return false;
}

// One document's samples appended to `maps`, drawing target lengths from `rand32`.
void map_document(std::span<const int32_t> sentence_lengths, int64_t first, int64_t last, int32_t short_seq_ratio,
                  int32_t max_seq_length, int32_t min_sentences, std::mt19937& rand32,
                  std::vector<BertSampleRange>& maps) {
  int64_t remaining = last - first;
  if (remaining < min_sentences || has_long_sentence(sentence_lengths, first, last)) return;
  int64_t start = first;
  int64_t length = 0;
  int64_t sentences = 0;
  int32_t target = target_sample_length(short_seq_ratio, max_seq_length, rand32);
  for (int64_t s = first; s < last; ++s) {
    length += sentence_lengths[s];
    ++sentences;
    --remaining;
    if ((length >= target && remaining > 1 && sentences >= min_sentences) || remaining == 0) {
      maps.push_back({start, s + 1, target});
      start = s + 1;
      target = target_sample_length(short_seq_ratio, max_seq_length, rand32);
      length = 0;
      sentences = 0;
    }
  }
}

}  // namespace

std::vector<BertSampleRange> build_bert_mapping(std::span<const int64_t> document_bounds,
                                                std::span<const int32_t> sentence_lengths, int64_t num_epochs,
                                                uint64_t max_num_samples, int32_t max_seq_length,
                                                double short_seq_prob, int64_t seed, int32_t min_sentences) {
  check_mapping_arguments(document_bounds, sentence_lengths, num_epochs, max_seq_length, short_seq_prob, seed,
                          min_sentences);
  const int32_t short_seq_ratio = short_seq_prob > 0 ? static_cast<int32_t>(std::round(1.0 / short_seq_prob)) : 0;
  std::mt19937 rand32(static_cast<uint32_t>(seed));
  std::vector<BertSampleRange> maps;
  for (int64_t epoch = 0; epoch < num_epochs; ++epoch) {
    if (maps.size() >= max_num_samples) break;
    const size_t before = maps.size();
    for (size_t d = 0; d + 1 < document_bounds.size(); ++d)
      map_document(sentence_lengths, document_bounds[d], document_bounds[d + 1], short_seq_ratio, max_seq_length,
                   min_sentences, rand32, maps);
    if (maps.size() == before && num_epochs > 1)
      throw Error("BERT sample index",
                  "no document of the split yields a sample (each needs >= " + num(min_sentences) +
                      " sentences and none over " + num(kBertLongSentenceLength) +
                      " tokens); Megatron would loop over epochs forever");
  }
  std::mt19937_64 rand64(static_cast<uint64_t>(seed + 1));
  for (int64_t i = static_cast<int64_t>(maps.size()) - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rand64() % static_cast<uint64_t>(i + 1));
    std::swap(maps[i], maps[j]);
  }
  return maps;
}

std::vector<BertSampleRange> build_bert_sample_index(std::span<const int64_t> document_indices,
                                                     std::span<const int32_t> sentence_lengths,
                                                     SequenceRange documents, const BertSampleIndexConfig& config) {
  const int64_t document_count = static_cast<int64_t>(document_indices.size()) - 1;
  if (documents.begin < 0 || documents.end > document_count || documents.begin >= documents.end)
    throw Error("BERT sample index", "the split's documents [" + num(documents.begin) + ", " + num(documents.end) +
                                         ") are empty or outside the dataset's " + num(document_count) +
                                         " documents");
  if (config.seq_length < 5 || config.seq_length > std::numeric_limits<int32_t>::max())
    throw UsageError("--seq-length", "a BERT sample needs more than 4 tokens ([CLS], two [SEP], 2 of text), got " +
                                         num(config.seq_length));
  if (config.num_samples < 0) throw UsageError("BERT sample index", "num_samples must be >= 0");
  const auto bounds = document_indices.subspan(static_cast<size_t>(documents.begin),
                                               static_cast<size_t>(documents.size() + 1));
  const int64_t num_epochs = std::numeric_limits<int32_t>::max() - 1;  // Megatron's, with num_samples given
  return build_bert_mapping(bounds, sentence_lengths, num_epochs, static_cast<uint64_t>(config.num_samples),
                            static_cast<int32_t>(config.seq_length - 3), config.short_seq_prob, config.seed,
                            config.binary_head ? 2 : 1);
}

}  // namespace mt::data
