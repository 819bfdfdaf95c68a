// Megatron-exact split bounds, GPTDataset document/sample/shuffle indices and blending indices
// (see megatron_indices.h for the Megatron files and commits followed). Tested in
// tests/unit/data/test_megatron_indices.cpp.
#include "data/megatron_indices.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <type_traits>

#include "core/error.h"

namespace mt::data {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// numpy's pairwise_sum (loops_utils.h.src): blocks of 8 accumulators up to 128 elements, halves
// (rounded down to a multiple of 8) above.
double pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double result = -0.0;
    for (size_t i = 0; i < n; ++i) result += a[i];
    return result;
  }
  if (n <= 128) {
    double r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    double result = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) result += a[i];
    return result;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

std::string num(int64_t value) { return std::to_string(value); }

// Python's int(round(x)) for a finite double: round half to even.
int64_t python_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

void check_positive_weights(std::span<const double> weights, const char* what) {
  if (weights.empty()) throw UsageError(what, "no datasets");
  if (weights.size() >= 32767)
    throw UsageError(what, num(static_cast<int64_t>(weights.size())) + " datasets (Megatron's blend takes at most 32766)");
  for (double w : weights)
    if (!(w > 0) || !std::isfinite(w)) throw UsageError(what, "every blend weight must be positive and finite");
}

// helpers.cpp build_sample_idx<T>, with its asserts as errors.
template <class T>
std::vector<T> build_sample_index(std::span<const int32_t> sizes, std::span<const int32_t> document_index,
                                  int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch,
                                  bool drop_last_partial_sequence, int64_t extra) {
  int64_t num_samples;
  if (drop_last_partial_sequence) {
    num_samples = (num_epochs * tokens_per_epoch - extra) / seq_length;
  } else {
    // Megatron computes this in single precision: ceil(float(tokens - extra) / seq_length).
    const float tokens = static_cast<float>(num_epochs * tokens_per_epoch - extra);
    num_samples = static_cast<int64_t>(std::ceil(tokens / static_cast<float>(seq_length)));
  }
  std::vector<T> sample_index(static_cast<size_t>(2 * (num_samples + 1)));
  T* out = sample_index.data();
  const int64_t last_document = static_cast<int64_t>(document_index.size()) - 1;
  int64_t document_position = 0;
  int64_t doc_offset = 0;
  out[0] = 0;
  out[1] = 0;
  for (int64_t row = 1; row <= num_samples; ++row) {
    int64_t remaining = seq_length + extra;
    while (remaining != 0) {
      const int64_t document_length = sizes[document_index[document_position]] - doc_offset;
      remaining -= document_length;
      if (remaining <= 0) {
        doc_offset += remaining + document_length - extra;
        remaining = 0;
      } else {
        if (document_position == last_document) {
          if (row != num_samples)
            throw Error("sample index", "ran past the last document at sample " + num(row - 1) + " of " +
                                            num(num_samples) + " (Megatron's build_sample_idx aborts here)");
          doc_offset = sizes[document_index[document_position]] - extra;
          break;
        }
        ++document_position;
        doc_offset = 0;
      }
    }
    out[2 * row] = static_cast<T>(document_position);
    out[2 * row + 1] = static_cast<T>(doc_offset);
  }
  if constexpr (std::is_same_v<T, int32_t>) {
    // helpers.py asserts sample_idx.min() >= 0 for the int32 variant.
    if (num_samples > 0 && out[2 * num_samples + 1] < 0)
      throw Error("sample index", "the last document of the final epoch is empty, so the partial last sample "
                                  "starts at offset -1 (Megatron's helpers.build_sample_idx asserts)");
  }
  return sample_index;
}

// gpt_dataset._build_shuffle_index.
template <class T>
std::vector<T> build_shuffle_index(int64_t first_block, int64_t total, NumpyRandomState& random) {
  const int64_t size = std::max(first_block, total);
  std::vector<T> shuffle(static_cast<size_t>(size));
  std::iota(shuffle.begin(), shuffle.end(), T{0});
  random.shuffle(std::span<T>(shuffle.data(), static_cast<size_t>(first_block)));
  if (first_block == total) return shuffle;
  if (total > first_block)
    random.shuffle(std::span<T>(shuffle.data() + first_block, static_cast<size_t>(total - first_block)));
  return shuffle;
}

}  // namespace

double numpy_sum(std::span<const double> values) { return pairwise_sum(values.data(), values.size()); }

std::vector<double> normalize_weights(std::span<const double> weights) {
  if (weights.empty()) throw UsageError("weights", "empty list");
  for (double w : weights)
    if (!(w >= 0) || !std::isfinite(w)) throw UsageError("weights", "every weight must be finite and >= 0");
  const double sum = numpy_sum(weights);
  if (!(sum > 0)) throw UsageError("weights", "the weights sum to zero");
  std::vector<double> normalized(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) normalized[i] = weights[i] / sum;
  return normalized;
}

std::string_view split_name(Split split) {
  switch (split) {
    case Split::train: return "train";
    case Split::valid: return "valid";
    case Split::test: return "test";
  }
  return "?";
}

std::array<double, 3> parse_split(std::string_view split) {
  const auto fail = [&](const std::string& why) {
    throw UsageError("--split", "'" + std::string(split) + "': " + why +
                                    " (expected up to three proportions for train, valid, test, such as 969,30,1)");
  };
  const auto trim = [](std::string_view text) {
    const size_t first = text.find_first_not_of(" \t");
    return first == std::string_view::npos ? std::string_view() : text.substr(first, text.find_last_not_of(" \t") - first + 1);
  };
  // Parts are separated by commas, or by slashes, or (with neither) by spaces.
  std::vector<std::string_view> parts;
  const bool by_spaces = split.find_first_of(",/") == std::string_view::npos;
  const char separator = by_spaces ? ' ' : (split.find(',') != std::string_view::npos ? ',' : '/');
  if (!by_spaces && split.find(separator == ',' ? '/' : ',') != std::string_view::npos) fail("mixes ',' and '/'");
  for (size_t start = 0; start <= split.size();) {
    size_t end = split.find(separator, start);
    if (end == std::string_view::npos) end = split.size();
    const std::string_view part = trim(split.substr(start, end - start));
    if (!by_spaces || !part.empty()) parts.push_back(part);
    start = end + 1;
  }
  if (parts.empty() || (parts.size() == 1 && parts[0].empty())) fail("no proportions");
  if (parts.size() > 3) fail(std::to_string(parts.size()) + " parts, at most three");
  std::array<double, 3> values{};
  for (size_t k = 0; k < parts.size(); ++k) {
    const std::string part(parts[k]);
    if (part.empty()) fail("part " + std::to_string(k + 1) + " is empty");
    const size_t digits = part.find_first_not_of("0123456789");
    const bool decimal = part.find_first_of("0123456789") != std::string::npos &&
                         (digits == std::string::npos ||
                          (part[digits] == '.' && part.find_first_not_of("0123456789", digits + 1) == std::string::npos));
    if (!decimal) {
      if (part[0] == '-') fail("'" + part + "' is negative");
      if (part.find_first_of("eE") != std::string::npos && part.find_first_of("0123456789") != std::string::npos) {
        fail("'" + part + "' has an exponent; write the number out");
      }
      fail("'" + part + "' is not a number");
    }
    values[k] = std::strtod(part.c_str(), nullptr);
  }
  try {
    const auto normalized = normalize_weights(values);
    return {normalized[0], normalized[1], normalized[2]};
  } catch (const UsageError&) {
    fail("the parts sum to zero");
  }
  return {};
}

std::array<std::optional<std::pair<double, double>>, 3> split_matrix(const std::array<double, 3>& split) {
  std::array<std::optional<std::pair<double, double>>, 3> matrix;
  double begin = 0.0;
  for (size_t i = 0; i < 3; ++i) {
    const double end = begin + split[i];
    if (end > begin) matrix[i] = std::make_pair(begin, end);
    begin = end;
  }
  return matrix;
}

std::array<std::optional<SequenceRange>, 3> split_ranges(const std::array<double, 3>& split, int64_t num_sequences) {
  if (num_sequences < 0 || num_sequences > kInt32Max)
    throw Error("split", num(num_sequences) + " sequences: Megatron's split indices are int32");
  std::array<std::optional<SequenceRange>, 3> ranges;
  const auto matrix = split_matrix(split);
  const double n = static_cast<double>(num_sequences);
  for (size_t i = 0; i < 3; ++i)
    if (matrix[i]) ranges[i] = SequenceRange{python_round(matrix[i]->first * n), python_round(matrix[i]->second * n)};
  return ranges;
}

std::array<std::optional<SequenceRange>, 3> split_ranges(std::string_view split, int64_t num_sequences) {
  return split_ranges(parse_split(split), num_sequences);
}

int64_t GptIndices::num_samples() const {
  return std::visit([](const auto& v) { return static_cast<int64_t>(v.size() / 2) - 1; }, sample_index);
}

std::array<int64_t, 2> GptIndices::sample(int64_t row) const {
  return std::visit(
      [row](const auto& v) {
        return std::array<int64_t, 2>{static_cast<int64_t>(v[2 * row]), static_cast<int64_t>(v[2 * row + 1])};
      },
      sample_index);
}

int64_t GptIndices::shuffled(int64_t i) const {
  return std::visit([i](const auto& v) { return static_cast<int64_t>(v[i]); }, shuffle_index);
}

std::string_view GptIndices::sample_index_dtype() const {
  return std::holds_alternative<std::vector<int32_t>>(sample_index) ? "int32" : "int64";
}

std::string_view GptIndices::shuffle_index_dtype() const {
  return std::holds_alternative<std::vector<uint32_t>>(shuffle_index) ? "uint32" : "int64";
}

GptIndices build_gpt_indices(std::span<const int32_t> sequence_lengths, SequenceRange range,
                             const GptIndexConfig& config) {
  const int64_t seq_length = config.seq_length;
  if (seq_length < 2 || seq_length > kInt32Max - 1)
    throw UsageError("--seq-length", num(seq_length) + ": must be in [2, 2^31 - 2] (Megatron asserts seq_length > 1)");
  if (config.seed < 0 || config.seed > 0xffffffffLL)
    throw UsageError("--seed", num(config.seed) + ": numpy's RandomState takes seeds in [0, 2^32)");
  if (config.num_samples && *config.num_samples < 0)
    throw UsageError("num_samples", num(*config.num_samples) + ": must be >= 0");
  const int64_t total_sequences = static_cast<int64_t>(sequence_lengths.size());
  if (range.begin < 0 || range.end < range.begin || range.end > total_sequences)
    throw Error("split", "sequences [" + num(range.begin) + ", " + num(range.end) + ") outside the dataset's " +
                             num(total_sequences));
  if (range.end > kInt32Max) throw Error("split", "sequence indices beyond int32 (Megatron's indices are int32)");
  const int64_t extra = config.add_extra_token_to_sequence ? 1 : 0;
  const int64_t num_documents = range.size();

  GptIndices result;
  int64_t tokens = 0;
  for (int64_t i = range.begin; i < range.end; ++i) tokens += sequence_lengths[i];
  result.num_tokens_per_epoch = tokens;
  if (tokens < 2)
    throw Error("split", "sequences [" + num(range.begin) + ", " + num(range.end) + ") hold " + num(tokens) +
                             " tokens; a split needs at least 2 (Megatron hangs or aborts on it)");

  // _get_num_epochs: the fewest epochs holding num_samples * seq_length + extra tokens.
  int64_t num_epochs = 1;
  if (config.num_samples) {
    const int64_t n = *config.num_samples;
    if (n > (std::numeric_limits<int64_t>::max() - extra) / seq_length)
      throw UsageError("num_samples", num(n) + " samples of " + num(seq_length) + " tokens overflow int64");
    const int64_t requested = n * seq_length + extra;
    num_epochs = std::max<int64_t>(1, (requested + tokens - 1) / tokens);
  }
  if (num_epochs > kInt32Max || num_epochs > std::numeric_limits<int64_t>::max() / tokens ||
      (num_documents > 0 && num_epochs > std::numeric_limits<int64_t>::max() / num_documents))
    throw Error("split", num(num_epochs) + " epochs needed: too many (helpers.cpp takes an int32 epoch count)");
  result.num_epochs = num_epochs;

  if (num_epochs > 1) {
    const int64_t n = *config.num_samples;
    const int64_t sans_final = ((num_epochs - 1) * tokens - extra) / seq_length;
    const int64_t from_final = n - sans_final;
    const int64_t per_epoch = (tokens - extra) / seq_length;
    if (from_final < 0 || from_final > per_epoch + 1)
      throw Error("split", "final epoch would give " + num(from_final) + " samples of at most " +
                               num(per_epoch + 1) + " (Megatron asserts)");
    result.separate_final_epoch = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
    if (result.separate_final_epoch) result.num_samples_sans_final_epoch = sans_final;
  }

  NumpyRandomState random(static_cast<uint32_t>(config.seed));

  // _build_document_index: the split's sequences once per epoch, shuffled as one block, or the
  // first num_epochs - 1 epochs and the final epoch as two blocks.
  const size_t doc_count = static_cast<size_t>(num_epochs * num_documents);
  result.document_index.resize(doc_count);
  {
    int32_t* out = result.document_index.data();
    for (int64_t e = 0; e < num_epochs; ++e)
      for (int64_t i = 0; i < num_documents; ++i) *out++ = static_cast<int32_t>(range.begin + i);
    std::span<int32_t> all(result.document_index);
    if (result.separate_final_epoch) {
      const size_t head = static_cast<size_t>((num_epochs - 1) * num_documents);
      random.shuffle(all.first(head));
      random.shuffle(all.subspan(head));
    } else {
      random.shuffle(all);
    }
  }

  // helpers.build_sample_idx: int32 variant when max(len(document_index), max(sizes)) fits.
  const int32_t max_size = *std::max_element(sequence_lengths.begin(), sequence_lengths.end());
  const int64_t sample_index_max = std::max<int64_t>(static_cast<int64_t>(doc_count), max_size);
  int64_t total_samples;
  if (sample_index_max <= kInt32Max) {
    auto index = build_sample_index<int32_t>(sequence_lengths, result.document_index, seq_length, num_epochs,
                                             tokens, config.drop_last_partial_sequence, extra);
    total_samples = static_cast<int64_t>(index.size() / 2) - 1;
    result.sample_index = std::move(index);
  } else {
    auto index = build_sample_index<int64_t>(sequence_lengths, result.document_index, seq_length, num_epochs,
                                             tokens, config.drop_last_partial_sequence, extra);
    total_samples = static_cast<int64_t>(index.size() / 2) - 1;
    result.sample_index = std::move(index);
  }

  // _build_shuffle_index: uint32 unless total >= uint32 max - 1.
  const int64_t first_block = result.separate_final_epoch ? result.num_samples_sans_final_epoch : total_samples;
  if (total_samples >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1)
    result.shuffle_index = build_shuffle_index<int64_t>(first_block, total_samples, random);
  else
    result.shuffle_index = build_shuffle_index<uint32_t>(first_block, total_samples, random);
  return result;
}

std::vector<int64_t> blend_dataset_num_samples(std::span<const double> weights, int64_t size, double surplus) {
  check_positive_weights(weights, "blend");
  if (size < 0) throw UsageError("blend", "size " + num(size) + " < 0");
  const std::vector<double> w = normalize_weights(weights);
  std::vector<int64_t> counts(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const double target = std::ceil(static_cast<double>(size) * w[i]);
    counts[i] = static_cast<int64_t>(std::ceil(target * (1.0 + surplus)));
  }
  return counts;
}

int64_t blend_size(std::span<const double> weights, int64_t size) {
  check_positive_weights(weights, "blend");
  if (size < 0) throw UsageError("blend", "size " + num(size) + " < 0");
  const std::vector<double> w = normalize_weights(weights);
  int64_t total = 0;
  for (double wi : w) total += static_cast<int64_t>(std::ceil(static_cast<double>(size) * wi));
  return total;
}

BlendingIndices build_blending_indices(std::span<const double> weights, int64_t size) {
  if (weights.empty()) throw UsageError("blend", "no datasets");
  if (size < 0) throw UsageError("blend", "size " + num(size) + " < 0");
  const size_t n = weights.size();
  BlendingIndices result;
  result.dataset_index.resize(static_cast<size_t>(size));
  result.dataset_sample_index.resize(static_cast<size_t>(size));
  std::vector<int64_t> taken(n, 0);
  for (int64_t i = 0; i < size; ++i) {
    const double position = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * position - static_cast<double>(taken[0]);
    for (size_t d = 1; d < n; ++d) {
      const double error = weights[d] * position - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    result.dataset_index[static_cast<size_t>(i)] = static_cast<int16_t>(best);
    result.dataset_sample_index[static_cast<size_t>(i)] = taken[best]++;
  }
  return result;
}

BlendingIndices build_exhaustive_blending_indices(std::span<const int64_t> sizes) {
  if (sizes.empty()) throw UsageError("blend", "no datasets");
  const size_t n = sizes.size();
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s <= 0) throw Error("blend", "a dataset of " + num(s) + " samples (Megatron asserts every weight > 0)");
    total += s;
  }
  std::vector<double> weights(n);
  for (size_t d = 0; d < n; ++d) weights[d] = static_cast<double>(sizes[d]) / static_cast<double>(total);
  std::vector<int64_t> taken(n, 0);
  std::vector<size_t> unspent(n);
  std::iota(unspent.begin(), unspent.end(), size_t{0});
  BlendingIndices result;
  result.dataset_index.reserve(static_cast<size_t>(total));
  result.dataset_sample_index.reserve(static_cast<size_t>(total));
  for (int64_t i = 0; !unspent.empty(); ++i) {
    const double position = std::max(static_cast<double>(i), 1.0);
    size_t best_slot = 0;
    double best_error = std::numeric_limits<double>::lowest();
    for (size_t slot = 0; slot < unspent.size(); ++slot) {
      const size_t d = unspent[slot];
      const double error = weights[d] * position - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best_slot = slot;
      }
    }
    const size_t best = unspent[best_slot];
    result.dataset_index.push_back(static_cast<int16_t>(best));
    result.dataset_sample_index.push_back(taken[best]++);
    if (static_cast<double>(sizes[best]) - static_cast<double>(taken[best]) == 0)
      unspent.erase(unspent.begin() + static_cast<std::ptrdiff_t>(best_slot));
  }
  return result;
}

BlendingIndices build_blend(std::optional<std::span<const double>> weights, std::optional<int64_t> size,
                            std::span<const int64_t> dataset_lengths) {
  if (weights && weights->size() != dataset_lengths.size())
    throw UsageError("blend", num(static_cast<int64_t>(weights->size())) + " weights for " +
                                  num(static_cast<int64_t>(dataset_lengths.size())) + " datasets");
  if (dataset_lengths.empty()) throw UsageError("blend", "no datasets");
  if (dataset_lengths.size() >= 32767)
    throw UsageError("blend", num(static_cast<int64_t>(dataset_lengths.size())) +
                                  " datasets (Megatron's blend takes at most 32766)");
  BlendingIndices result;
  if (weights) {
    if (!size) throw UsageError("blend", "weights need a size (Megatron's ValueError)");
    const std::vector<double> once = normalize_weights(*weights);
    result = build_blending_indices(normalize_weights(once), blend_size(*weights, *size));
  } else {
    for (int64_t length : dataset_lengths)
      if (length <= 0)
        throw Error("blend", "a dataset with no samples cannot be blended by length (Megatron asserts weights > 0)");
    if (size) {
      std::vector<double> lengths(dataset_lengths.begin(), dataset_lengths.end());
      const int64_t sum = std::accumulate(dataset_lengths.begin(), dataset_lengths.end(), int64_t{0});
      if (*size < 0) throw UsageError("blend", "size " + num(*size) + " < 0");
      result = build_blending_indices(normalize_weights(lengths), std::min(*size, sum));
    } else {
      result = build_exhaustive_blending_indices(dataset_lengths);
    }
  }
  std::vector<int64_t> used(dataset_lengths.size(), 0);
  for (size_t i = 0; i < result.dataset_index.size(); ++i) {
    const size_t d = static_cast<size_t>(result.dataset_index[i]);
    used[d] = std::max(used[d], result.dataset_sample_index[i] + 1);
  }
  for (size_t d = 0; d < used.size(); ++d)
    if (used[d] > dataset_lengths[d])
      throw Error("blend", "dataset " + num(static_cast<int64_t>(d)) + " is asked for " + num(used[d]) +
                               " samples but has " + num(dataset_lengths[d]) +
                               " (Megatron fails with an IndexError in training)");
  return result;
}

}  // namespace mt::data
