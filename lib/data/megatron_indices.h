// The index arrays Megatron-Core builds for GPT pre-training, reproduced exactly (values and
// dtypes). Pure functions over sequence lengths: no files here (data/sample_index.h stores them).
//
// Followed (NVIDIA/Megatron-LM, megatron/core/datasets/): gpt_dataset.py @ 002398e7f3b3,
// helpers.cpp @ 298c71d28a88, helpers.py @ 0733dbe1b5b7, blended_megatron_dataset_builder.py,
// blended_megatron_dataset_config.py and utils.py @ 00caa53af309, blended_dataset.py @ 68eac5c9f3ac;
// numpy 1.24 legacy RandomState (checked empirically against /usr/bin/python3's numpy).
//
// The Megatron pipeline for one token dataset ("prefix") and one split:
//   1. split_ranges(split string, sequence_count): Megatron's split matrix and its rounding,
//      counted in sequences (GPTDataset.numel_low_level_dataset), a split of weight 0 is absent;
//   2. build_gpt_indices(all sequence lengths, the split's range, config): GPTDataset's document,
//      sample and shuffle index from one RandomState(seed);
// and for a blend of several prefixes (BlendedMegatronDatasetBuilder + BlendedDataset):
//   3. blend_dataset_num_samples(weights, size): num_samples of each prefix's GPTDataset;
//   4. build_blend(weights, size, lengths of those GPTDatasets): dataset / dataset-sample index.
// Megatron's builder uses steps 3-4 whenever weights are given, even for a single prefix with a
// weight ("1.0 X" blends X with itself: surplus included); a single prefix without weights, and
// a single prefix in a per-split blend, skip them (num_samples = the split's size).
//
// Where Megatron loops forever or aborts (assert) on an input, these functions throw mt::Error
// (mt::UsageError for bad parameters) instead; everything else equals Megatron, including the
// cases it accepts silently (num_samples 0 or none builds one whole epoch, which may hold zero
// samples when the split has fewer tokens than a sequence).
//
// Tested in tests/unit/data/test_megatron_indices.cpp against tests/data/megatron_oracle.py
// (fixture tests/data/megatron_index_cases.h5, written by tests/data/make_index_cases.py).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace mt::data {

// numpy.random.RandomState(seed) for an integer seed (legacy MT19937, init_genrand seeding).
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : engine_(seed) {}
  uint32_t next_uint32() { return static_cast<uint32_t>(engine_()); }
  // numpy's mt19937_next64: the first 32-bit draw is the high half.
  uint64_t next_uint64() {
    const uint64_t high = next_uint32();
    return (high << 32) | next_uint32();
  }
  // numpy's legacy random_interval: uniform in [0, max] by masked rejection, 32-bit draws when
  // max fits 32 bits, else 64-bit draws.
  uint64_t interval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffULL) {
      do value = next_uint32() & mask; while (value > max);
    } else {
      do value = next_uint64() & mask; while (value > max);
    }
    return value;
  }
  // RandomState.shuffle of a 1-D array: Fisher-Yates from the end, j = interval(i).
  template <class T>
  void shuffle(std::span<T> values) {
    for (size_t i = values.size(); i > 1; --i) {
      const size_t j = static_cast<size_t>(interval(i - 1));
      std::swap(values[i - 1], values[j]);
    }
  }

 private:
  std::mt19937 engine_;  // std::mt19937(seed) is numpy's init_genrand + genrand_int32
};

// numpy.sum of a float64 array (pairwise summation, as numpy does it), and Megatron's
// utils.normalize (w / numpy.sum(w)). An empty list, a negative or non-finite weight, or a zero
// sum is an mt::UsageError.
double numpy_sum(std::span<const double> values);
std::vector<double> normalize_weights(std::span<const double> weights);

// ---- splits -------------------------------------------------------------------------------

enum class Split : int { train = 0, valid = 1, test = 2 };
std::string_view split_name(Split split);

// Megatron's parse_and_normalize_split: up to three proportions separated by commas ("969, 30, 1"),
// slashes ("99/1") or spaces ("98 2"), padded with zeros to three, normalised. Each part is a plain
// non-negative decimal (digits, at most one '.'). Megatron picks the runs of [.0-9] out of any
// string, so "-1,2,3" is 1,2,3, "nan,1,1" is 1,1 and "1e3,1,1" four parts; mt refuses every string
// that is not such a list (an empty part, a sign, an exponent, nan, more than three parts, a zero
// sum) with an mt::UsageError saying which part is wrong.
std::array<double, 3> parse_split(std::string_view split);

// Megatron's convert_split_vector_to_split_matrix: per split the (begin, end) fractions, absent
// when the split's weight is 0.
std::array<std::optional<std::pair<double, double>>, 3> split_matrix(const std::array<double, 3>& split);

// A half-open range of sequence indices (Megatron's indexed_indices = arange(begin, end), int32).
struct SequenceRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const SequenceRange&) const = default;
};

// The builder's bounds: begin = int(round(f0 * n)), end = int(round(f1 * n)), Python's round
// (half to even). Absent for a split of weight 0; present but possibly empty otherwise
// (build_gpt_indices rejects an empty one). num_sequences above int32 is an mt::Error.
std::array<std::optional<SequenceRange>, 3> split_ranges(const std::array<double, 3>& split, int64_t num_sequences);
std::array<std::optional<SequenceRange>, 3> split_ranges(std::string_view split, int64_t num_sequences);

// ---- GPTDataset ---------------------------------------------------------------------------

struct GptIndexConfig {
  int64_t seq_length = 0;  // config.sequence_length, > 1
  int64_t seed = 1234;     // config.random_seed, in [0, 2^32)
  // The split's requested size (the builder's sizes[i], or the blend's per-dataset count);
  // nullopt = Megatron's None (one epoch). 0 also builds one epoch, as in Megatron.
  std::optional<int64_t> num_samples;
  bool add_extra_token_to_sequence = true;
  // Megatron: true for train and test; config.drop_last_partial_validation_sequence (default
  // true) for the valid split.
  bool drop_last_partial_sequence = true;
};

// One GPTDataset's arrays, each in the dtype Megatron gives it.
struct GptIndices {
  // (num_epochs * range.size(),) int32: sequence indices, each epoch's copy shuffled (the last
  // epoch shuffled on its own when separate_final_epoch).
  std::vector<int32_t> document_index;
  // (num_samples + 1, 2) row-major: [i] = (position in document_index, token offset) where
  // sample i starts; int32 when max(document_index.size(), max sequence length of the whole
  // dataset) fits int32 (helpers.build_sample_idx_int32), else int64.
  std::variant<std::vector<int32_t>, std::vector<int64_t>> sample_index;
  // (num_samples,) a permutation of [0, num_samples) (two separately shuffled blocks when
  // separate_final_epoch); uint32 unless num_samples >= 2^32 - 2, then int64.
  std::variant<std::vector<uint32_t>, std::vector<int64_t>> shuffle_index;

  int64_t num_tokens_per_epoch = 0;
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;
  int64_t num_samples_sans_final_epoch = 0;  // the first shuffle block's size when separate

  int64_t num_samples() const;  // len(GPTDataset) = sample_index rows - 1
  std::array<int64_t, 2> sample(int64_t row) const;  // sample_index[row]
  int64_t shuffled(int64_t i) const;                  // shuffle_index[i]
  std::string_view sample_index_dtype() const;        // "int32" or "int64"
  std::string_view shuffle_index_dtype() const;       // "uint32" or "int64"
};

// `sequence_lengths` of the whole token dataset (int32, as Megatron's IndexedDataset), `range`
// the split's sequences. Throws mt::UsageError for seq_length < 2 or a bad seed, and mt::Error
// where Megatron hangs or aborts: a range outside the dataset or beyond int32, a split with fewer
// than 2 tokens (an empty split included), and its internal asserts (sample index past the
// documents, a negative offset in the int32 variant).
GptIndices build_gpt_indices(std::span<const int32_t> sequence_lengths, SequenceRange range,
                             const GptIndexConfig& config);

// ---- blends -------------------------------------------------------------------------------

inline constexpr double kMidLevelDatasetSurplus = 0.005;  // config.mid_level_dataset_surplus

// The builder's _get_size_per_split_per_dataset for one split: per dataset
// int(ceil(ceil(size * w) * (1 + surplus))) with w = normalize(weights). These are the
// num_samples of each prefix's GPTDataset. Weights: see normalize_weights; a zero weight is an
// mt::UsageError (BlendedDataset asserts every weight > 0).
std::vector<int64_t> blend_dataset_num_samples(std::span<const double> weights, int64_t size,
                                               double surplus = kMidLevelDatasetSurplus);

// The blended dataset's size: sum over datasets of ceil(size * w) (the target, no surplus).
int64_t blend_size(std::span<const double> weights, int64_t size);

// BlendedDataset's two arrays.
struct BlendingIndices {
  std::vector<int16_t> dataset_index;         // (size,) int16: which dataset
  std::vector<int64_t> dataset_sample_index;  // (size,) int64: which sample of it
};

// helpers.cpp build_blending_indices with the weights exactly as given (Megatron passes
// normalize(normalize(raw weights))): sample i goes to the first dataset of largest
// w * max(i, 1) - taken so far.
BlendingIndices build_blending_indices(std::span<const double> weights, int64_t size);
// helpers.cpp build_exhaustive_blending_indices: exactly sizes[d] samples of dataset d.
BlendingIndices build_exhaustive_blending_indices(std::span<const int64_t> sizes);

// The whole top level of a blend for one split, as BlendedMegatronDatasetBuilder +
// BlendedDataset do it:
//   weights given, size given: weights normalised twice, size = blend_size(weights, size);
//   weights absent, size given: weights = dataset_lengths normalised, size = min(size, sum);
//   weights absent, size absent: exhaustive over dataset_lengths;
//   weights given, size absent: mt::UsageError (Megatron's ValueError).
// `dataset_lengths` are the built GPTDatasets' num_samples(). Throws mt::Error where Megatron
// would fail (more than 32766 datasets, a dataset of length 0 when lengths are the weights, a
// sample index past a dataset's length, which Megatron only hits as an IndexError in training).
BlendingIndices build_blend(std::optional<std::span<const double>> weights, std::optional<int64_t> size,
                            std::span<const int64_t> dataset_lengths);

}  // namespace mt::data
