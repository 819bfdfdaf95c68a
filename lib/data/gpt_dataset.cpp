// Megatron's GPT data path over token datasets (see gpt_dataset.h).
// Tested in tests/unit/data/test_gpt_dataset.cpp.
#include "data/gpt_dataset.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/error.h"

namespace mt::data {
namespace {

std::optional<double> parse_number(const std::string& word) {
  if (word.empty()) return std::nullopt;
  try {
    size_t used = 0;
    const double value = std::stod(word, &used);
    if (used != word.size()) return std::nullopt;
    return value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

nlohmann::ordered_json blend_json(const std::optional<Blend>& blend) {
  if (!blend) return nullptr;
  nlohmann::ordered_json json;
  json["prefixes"] = blend->prefixes;
  json["weights"] = blend->weights ? nlohmann::ordered_json(*blend->weights) : nlohmann::ordered_json(nullptr);
  return json;
}

int dataset_position(const std::vector<std::string>& prefixes, const std::string& prefix) {
  return static_cast<int>(std::find(prefixes.begin(), prefixes.end(), prefix) - prefixes.begin());
}

int64_t range_tokens(const TokenDataset& dataset, SequenceRange range) {
  const auto lengths = dataset.sequence_lengths();
  int64_t tokens = 0;
  for (int64_t i = range.begin; i < range.end; ++i) tokens += lengths[static_cast<size_t>(i)];
  return tokens;
}

IndexComponent build_component(const DataConfig& config, const TokenDataset& dataset, const std::string& prefix,
                               int dataset_index, Split split, SequenceRange range,
                               std::optional<int64_t> num_samples) {
  const std::string name = std::string(split_name(split));
  if (range.size() == 0) {
    throw Error("--split " + config.split, "the " + name + " split of " + prefix + " is empty (" +
                                               std::to_string(dataset.sequence_count()) + " sequences give it none)");
  }
  const int64_t tokens = range_tokens(dataset, range);
  if (tokens < config.seq_length + 1) {
    throw Error("--seq-length " + std::to_string(config.seq_length),
                "longer than the " + name + " split of " + prefix + " (" + std::to_string(tokens) +
                    " tokens): no sample of seq_length + 1 tokens fits");
  }
  GptIndexConfig index_config;
  index_config.seq_length = config.seq_length;
  index_config.seed = config.seed;
  index_config.num_samples = num_samples;
  IndexComponent component;
  component.dataset = dataset_index;
  component.sequence_begin = range.begin;
  component.sequence_end = range.end;
  component.num_samples = num_samples.value_or(-1);
  component.indices = build_gpt_indices(dataset.sequence_lengths(), range, index_config);
  return component;
}

}  // namespace

Blend parse_blend(const std::vector<std::string>& words, const std::string& flag) {
  if (words.empty()) throw UsageError(flag, "needs a prefix or a weighted list (0.3 a 0.7 b)");
  Blend blend;
  if (words.size() % 2 == 0) {
    std::vector<double> weights;
    int numbers = 0;
    for (size_t i = 0; i < words.size(); i += 2) {
      const auto value = parse_number(words[i]);
      numbers += value ? 1 : 0;
      weights.push_back(value.value_or(0));
    }
    if (numbers == static_cast<int>(words.size() / 2)) {
      for (size_t i = 1; i < words.size(); i += 2) blend.prefixes.push_back(words[i]);
      for (size_t i = 0; i < weights.size(); ++i) {  // BlendedDataset asserts every weight > 0
        if (!(weights[i] > 0) || !std::isfinite(weights[i])) {
          throw UsageError(flag, "every blend weight must be positive and finite (got " + words[2 * i] + ")");
        }
      }
      blend.weights = weights;
      return blend;
    }
    if (numbers > 0) throw UsageError(flag, "mixes weights and prefixes: give 'W1 P1 W2 P2 ...' or prefixes only");
  }
  blend.prefixes = words;
  return blend;
}

std::array<int64_t, 3> megatron_num_samples(int64_t train_iters, int64_t train_samples, int64_t global_batch_size,
                                            int64_t eval_interval, int64_t eval_iters) {
  if (global_batch_size <= 0) throw UsageError("--global-batch-size", "must be positive");
  if ((train_iters > 0) == (train_samples > 0))
    throw UsageError("--train-iters/--train-samples", "give exactly one of them");
  if (eval_interval <= 0) throw UsageError("--eval-interval", "must be positive");
  if (eval_iters < 0) throw UsageError("--eval-iters", "must be >= 0");
  const int64_t iters = train_samples > 0 ? train_samples / global_batch_size : train_iters;
  const int64_t train = train_samples > 0 ? train_samples : train_iters * global_batch_size;
  const int64_t valid = (iters / eval_interval + 1) * eval_iters * global_batch_size;
  const int64_t test = eval_iters * global_batch_size;
  return {train, valid, test};
}

void validate_data_config(const DataConfig& config) {
  const bool per_split = std::any_of(config.blend_per_split.begin(), config.blend_per_split.end(),
                                     [](const auto& blend) { return blend.has_value(); });
  if (config.blend && per_split) {
    throw UsageError("--data-path", "give either --data-path or --train-data-path/--valid-data-path/--test-data-path");
  }
  if (!config.blend && !per_split) throw UsageError("--data-path", "no token dataset given");
  if (config.seq_length < 2) throw UsageError("--seq-length", "must be at least 2");
  if (config.seed < 0 || config.seed > 0xffffffffLL)
    throw UsageError("--seed", "must be in [0, 2^32) (numpy's RandomState)");
  const auto split = parse_split(config.split);
  for (int s = 0; s < 3; ++s) {
    if (config.num_samples[static_cast<size_t>(s)] < 0) throw UsageError("sample counts", "must be >= 0");
  }
  // A zero valid or test part only skips evaluation; a zero train part leaves nothing to train on.
  if (config.blend && split[0] == 0 && config.num_samples[0] > 0) {
    throw UsageError("--split", "'" + config.split + "' gives the train split no data (its first part is 0), but " +
                                    std::to_string(config.num_samples[0]) + " training samples are needed");
  }
}

std::vector<std::string> dataset_prefixes(const DataConfig& config) {
  std::vector<std::string> prefixes;
  auto add = [&](const std::optional<Blend>& blend) {
    if (!blend) return;
    for (const auto& prefix : blend->prefixes) {
      if (std::find(prefixes.begin(), prefixes.end(), prefix) == prefixes.end()) prefixes.push_back(prefix);
    }
  };
  add(config.blend);
  for (const auto& blend : config.blend_per_split) add(blend);
  return prefixes;
}

std::vector<TokenDataset> open_datasets(const DataConfig& config) {
  std::vector<TokenDataset> datasets;
  for (const auto& prefix : dataset_prefixes(config)) datasets.push_back(TokenDataset::open(prefix));
  return datasets;
}

nlohmann::ordered_json index_parameters(const DataConfig& config) {
  nlohmann::ordered_json p;
  p["class"] = "GPTDataset";
  p["data_path"] = blend_json(config.blend);
  p["train_data_path"] = blend_json(config.blend_per_split[0]);
  p["valid_data_path"] = blend_json(config.blend_per_split[1]);
  p["test_data_path"] = blend_json(config.blend_per_split[2]);
  p["split"] = config.split;
  p["split_vector"] = parse_split(config.split);
  p["seq_length"] = config.seq_length;
  p["seed"] = config.seed;
  p["num_samples"] = config.num_samples;
  p["add_extra_token_to_sequence"] = true;
  p["drop_last_partial_validation_sequence"] = true;
  p["mid_level_dataset_surplus"] = kMidLevelDatasetSurplus;
  return p;
}

nlohmann::ordered_json dataset_fingerprints(const DataConfig& config, const std::vector<TokenDataset>& datasets) {
  const auto prefixes = dataset_prefixes(config);
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (size_t i = 0; i < datasets.size(); ++i) {
    const TokenDataset& d = datasets[i];
    const auto lengths = d.sequence_lengths();
    const std::string_view bytes(reinterpret_cast<const char*>(lengths.data()), lengths.size_bytes());
    nlohmann::ordered_json entry;
    entry["prefix"] = i < prefixes.size() ? prefixes[i] : std::string();
    entry["format"] = d.format() == TokenDatasetFormat::hdf5 ? "hdf5" : "megatron";
    entry["dtype"] = std::string(dtype_name(d.dtype()));
    entry["sequences"] = d.sequence_count();
    entry["documents"] = d.document_count();
    entry["tokens"] = d.token_count();
    entry["sequence_lengths_md5"] = md5_hex(bytes);
    entry["vocab_size"] = d.vocab_size();
    entry["eod_id"] = d.metadata().eod_id;
    list.push_back(entry);
  }
  return list;
}

std::string default_cache_dir(const DataConfig& config) {
  const auto prefixes = dataset_prefixes(config);
  if (prefixes.empty()) throw UsageError("--data-path", "no token dataset given");
  return (std::filesystem::path(prefixes.front()) / "cache" / "GPTDataset_indices").string();
}

std::string index_file_name(const DataConfig& config) {
  return md5_hex(index_parameters(config).dump()) + "-mt-sample-index.h5";
}

SampleIndex build_sample_index(const DataConfig& config, const std::vector<TokenDataset>& datasets) {
  validate_data_config(config);
  const auto prefixes = dataset_prefixes(config);
  if (datasets.size() != prefixes.size()) throw Error("build_sample_index", "datasets do not match the prefixes");
  SampleIndex index;
  index.parameters = index_parameters(config);
  index.datasets = dataset_fingerprints(config, datasets);
  for (int s = 0; s < 3; ++s) {
    const Split split = static_cast<Split>(s);
    const int64_t size = config.num_samples[static_cast<size_t>(s)];
    const bool per_split = !config.blend;
    const std::optional<Blend>& blend = per_split ? config.blend_per_split[static_cast<size_t>(s)] : config.blend;
    if (size == 0 || !blend) continue;
    // The sequence range of every prefix; a split of weight 0 is absent (as in Megatron).
    std::vector<SequenceRange> ranges;
    bool absent = false;
    for (const auto& prefix : blend->prefixes) {
      const TokenDataset& dataset = datasets[static_cast<size_t>(dataset_position(prefixes, prefix))];
      if (per_split) {
        ranges.push_back({0, dataset.sequence_count()});
        continue;
      }
      const auto range = split_ranges(config.split, dataset.sequence_count())[static_cast<size_t>(s)];
      if (!range) {
        absent = true;
        break;
      }
      ranges.push_back(*range);
    }
    if (absent) continue;
    IndexSplit& out = index.splits[static_cast<size_t>(s)];
    out.present = true;
    out.num_samples = size;
    const bool single = blend->prefixes.size() == 1 && (per_split || !blend->weights);
    std::vector<int64_t> counts;
    if (!single && blend->weights) counts = blend_dataset_num_samples(*blend->weights, size);
    for (size_t k = 0; k < blend->prefixes.size(); ++k) {
      const std::string& prefix = blend->prefixes[k];
      const int d = dataset_position(prefixes, prefix);
      const std::optional<int64_t> wanted = single           ? std::optional<int64_t>(size)
                                            : counts.empty() ? std::nullopt
                                                             : std::optional<int64_t>(counts[k]);
      out.components.push_back(
          build_component(config, datasets[static_cast<size_t>(d)], prefix, d, split, ranges[k], wanted));
    }
    if (!single) {
      std::vector<int64_t> lengths;
      for (const auto& component : out.components) lengths.push_back(component.size());
      std::optional<std::span<const double>> weights;
      if (blend->weights) weights = std::span<const double>(*blend->weights);
      BlendingIndices blending = build_blend(weights, size, lengths);
      out.blended = true;
      out.dataset_index = std::move(blending.dataset_index);
      out.dataset_sample_index = std::move(blending.dataset_sample_index);
    }
  }
  return index;
}

SampleIndex load_or_build_index(const DataConfig& config, const std::vector<TokenDataset>& datasets,
                                const std::string& path, bool build, bool* built) {
  const auto parameters = index_parameters(config);
  const auto fingerprints = dataset_fingerprints(config, datasets);
  std::error_code error;
  if (std::filesystem::exists(path, error)) {
    SampleIndex index = read_sample_index(path);
    check_sample_index(path, index, parameters, fingerprints);
    if (built) *built = false;
    return index;
  }
  if (!build) throw Error(path, "no such sample index (build it with mt-shard build)");
  SampleIndex index = build_sample_index(config, datasets);
  const std::filesystem::path directory = std::filesystem::path(path).parent_path();
  if (!directory.empty()) {
    std::filesystem::create_directories(directory, error);
    if (error) throw Error(directory.string(), "cannot create the index directory: " + error.message());
  }
  write_sample_index(path, index);
  if (built) *built = true;
  return index;
}

int64_t loader_eod_id(const std::vector<TokenDataset>& datasets, const LoaderOptions& options) {
  if (!options.needs_eod()) return datasets.empty() ? -1 : datasets.front().metadata().eod_id;
  const char* flag = options.eod_mask_loss        ? "--eod-mask-loss"
                     : options.reset_position_ids ? "--reset-position-ids"
                                                  : "--reset-attention-mask";
  int64_t eod_id = -1;
  for (size_t i = 0; i < datasets.size(); ++i) {
    const int64_t eod = datasets[i].metadata().eod_id;
    if (eod < 0) {
      throw UsageError(flag, datasets[i].path() +
                                 " records no end-of-document id (Megatron .bin/.idx files "
                                 "do not; tokenize into HDF5 with mt-tokenize)");
    }
    if (i > 0 && eod != eod_id) {
      throw UsageError(flag, "the token datasets disagree on the end-of-document id (" + std::to_string(eod_id) +
                                 " and " + std::to_string(eod) + ")");
    }
    eod_id = eod;
  }
  return eod_id;
}

void ltor_masks_and_positions(std::span<const int32_t> tokens, int64_t eod_id, const LoaderOptions& options,
                              float* loss_mask, int32_t* positions, int32_t* doc_start) {
  int32_t document_first = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t position = static_cast<int32_t>(t);
    const bool eod = tokens[t] == eod_id;
    loss_mask[t] = options.eod_mask_loss && eod ? 0.0f : 1.0f;
    positions[t] = options.reset_position_ids ? position - document_first : position;
    doc_start[t] = options.reset_attention_mask ? document_first : 0;
    // The token after an EOD starts a new document (its position is reset, and it no longer
    // sees anything up to and including the EOD).
    if (eod && (options.reset_position_ids || options.reset_attention_mask)) document_first = position + 1;
  }
}

int64_t pretraining_sampler_first(int64_t total_samples, int64_t consumed_samples, int micro_batch_size, int rank,
                                  int world, int64_t micro_batch) {
  if (micro_batch_size <= 0 || world <= 0 || rank < 0 || rank >= world || micro_batch < 0 || consumed_samples < 0) {
    throw UsageError("sampler", "needs micro_batch_size > 0, 0 <= rank < world, micro_batch >= 0, consumed >= 0");
  }
  const int64_t group = static_cast<int64_t>(micro_batch_size) * world;
  const int64_t group_first = consumed_samples + micro_batch * group;
  if (total_samples >= 0 && group_first + group > total_samples) {
    throw Error("data", "exhausted: samples [" + std::to_string(group_first) + ", " +
                            std::to_string(group_first + group) + ") asked, the index holds " +
                            std::to_string(total_samples));
  }
  return group_first + static_cast<int64_t>(rank) * micro_batch_size;
}

GptSampleSource::GptSampleSource(std::vector<TokenDataset> datasets, SampleIndex index, std::string index_path,
                                 int64_t seq_length, LoaderOptions options)
    : datasets_(std::move(datasets)),
      index_(std::move(index)),
      index_path_(std::move(index_path)),
      seq_length_(seq_length),
      options_(options) {
  const int64_t built_for = index_.parameters.value("seq_length", int64_t{-1});
  if (built_for != seq_length_) {
    throw UsageError("--seq-length " + std::to_string(seq_length_),
                     index_path_ + " was built for sequences of " + std::to_string(built_for));
  }
  if (datasets_.size() != index_.datasets.size()) {
    throw Error(index_path_, "lists " + std::to_string(index_.datasets.size()) + " token datasets, " +
                                 std::to_string(datasets_.size()) + " given");
  }
  for (const auto& split : index_.splits) {
    for (const auto& component : split.components) {
      const TokenDataset& dataset = datasets_[static_cast<size_t>(component.dataset)];
      if (component.sequence_end > dataset.sequence_count()) {
        throw Error(index_path_, "names sequences past the end of " + dataset.path());
      }
    }
  }
  eod_id_ = loader_eod_id(datasets_, options_);
}

std::pair<int, int64_t> GptSampleSource::locate(Split split, int64_t index) const {
  const IndexSplit& s = index_.splits[static_cast<size_t>(split)];
  if (!s.present) throw Error(std::string(split_name(split)) + " split", "not in the sample index " + index_path_);
  if (index < 0 || index >= s.size()) {
    throw Error(std::string(split_name(split)) + " sample " + std::to_string(index),
                "outside the index (" + std::to_string(s.size()) + " samples)");
  }
  if (!s.blended) return {0, index};
  return {s.dataset_index[static_cast<size_t>(index)], s.dataset_sample_index[static_cast<size_t>(index)]};
}

void GptSampleSource::sample(Split split, int64_t index, int32_t* tokens) const {
  const auto [k, inner] = locate(split, index);
  const IndexComponent& component = index_.splits[static_cast<size_t>(split)].components[static_cast<size_t>(k)];
  const TokenDataset& dataset = datasets_[static_cast<size_t>(component.dataset)];
  const GptIndices& x = component.indices;
  const int64_t wanted = seq_length_ + 1;
  const int64_t row = x.shuffled(inner);
  const auto [begin, begin_offset] = x.sample(row);
  const auto [end, end_offset] = x.sample(row + 1);
  const auto lengths = dataset.sequence_lengths();
  int64_t filled = 0;
  for (int64_t i = begin; i <= end; ++i) {
    const int32_t sequence = x.document_index[static_cast<size_t>(i)];
    const int64_t offset = i == begin ? begin_offset : 0;
    const int64_t length = i < end ? lengths[static_cast<size_t>(sequence)] - offset : end_offset + 1 - offset;
    if (length < 0 || filled + length > wanted) {
      throw Error(index_path_, "sample " + std::to_string(index) + " of the " + std::string(split_name(split)) +
                                   " split spans more than seq_length + 1 tokens (index and data disagree)");
    }
    // Megatron's get(): at the end of a sequence the last part may be shorter than asked.
    const int64_t available = std::min<int64_t>(length, lengths[static_cast<size_t>(sequence)] - offset);
    if (available > 0)
      dataset.read(sequence, offset, std::span<int32_t>(tokens + filled, static_cast<size_t>(available)));
    filled += std::max<int64_t>(available, 0);
  }
  for (int64_t t = filled; t < wanted; ++t) tokens[t] = -1;  // Megatron's _PAD_TOKEN_ID
}

void GptSampleSource::rows(Split split, int64_t index, int seq_length, const SampleRows& out) const {
  if (seq_length != seq_length_) {
    throw UsageError("--seq-length " + std::to_string(seq_length),
                     "the sample index holds sequences of " + std::to_string(seq_length_));
  }
  thread_local std::vector<int32_t> text;
  text.resize(static_cast<size_t>(seq_length) + 1);  // (seq + 1,)
  sample(split, index, text.data());
  for (int t = 0; t < seq_length; ++t) {
    out.tokens[t] = text[static_cast<size_t>(t)];
    out.labels[t] = text[static_cast<size_t>(t) + 1];
  }
  ltor_masks_and_positions(std::span<const int32_t>(out.tokens, static_cast<size_t>(seq_length)), eod_id_, options_,
                           out.loss_mask, out.positions, out.doc_start);
  for (int t = 0; t < seq_length; ++t) {
    if (out.labels[t] == -1) out.loss_mask[t] = 0.0f;  // padding: no loss
    if (out.tokens[t] == -1) out.tokens[t] = 0;
    if (out.labels[t] == -1) out.labels[t] = 0;
  }
}

int64_t GptSampleSource::split_size(Split split) const { return index_.splits[static_cast<size_t>(split)].size(); }

int64_t GptSampleSource::vocab_size() const {
  int64_t vocab = 0;
  for (const auto& dataset : datasets_) {
    if (dataset.vocab_size() < 0) return -1;
    vocab = std::max(vocab, dataset.vocab_size());
  }
  return vocab;
}

std::string GptSampleSource::describe() const {
  std::string text = "token datasets ";
  int64_t tokens = 0;
  for (size_t i = 0; i < datasets_.size(); ++i) {
    text += (i ? ", " : "") + datasets_[i].path();
    tokens += datasets_[i].token_count();
  }
  return text + " (" + std::to_string(tokens) + " tokens), sample index " + index_path_;
}

}  // namespace mt::data
