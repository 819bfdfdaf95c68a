// Megatron-Core's GPT data path over mt's token datasets: what a run asks for (DataConfig: the
// blend or the per-split blends, --split, --seq-length, --seed, the sample counts Megatron's
// training.py derives), building the sample index of all three splits (BlendedMegatronDataset
// Builder's logic over data/megatron_indices.h) and caching it under Megatron's kind of name
// (md5 of the parameters), and the loader: GPTDataset.__getitem__ (seq_length + 1 tokens through
// shuffle_index and sample_index, padding with -1), BlendedDataset's mapping, and
// _get_ltor_masks_and_position_ids (--eod-mask-loss, --reset-position-ids,
// --reset-attention-mask as per-document attention windows). Also MegatronPretrainingSampler:
// which samples DP rank r of D reads for a consumed-samples count.
// Tested in tests/unit/data/test_gpt_dataset.cpp; end to end by tests/tools/mt-shard.bats and
// tests/tools/mt-train.bats.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/megatron_indices.h"
#include "data/sample_index.h"
#include "data/sample_source.h"
#include "data/token_dataset.h"

namespace mt::data {

// A --data-path style list: "X" or "X Y" (no weights) or "0.3 X 0.7 Y" (Megatron's
// get_blend_from_list: weights when the list has even length and every other word is a number).
struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;  // as given (normalised when building)
};
// Throws mt::UsageError naming `flag` for an empty list or weights mixed with non-numbers.
Blend parse_blend(const std::vector<std::string>& words, const std::string& flag);

struct DataConfig {
  std::optional<Blend> blend;                           // --data-path
  std::array<std::optional<Blend>, 3> blend_per_split;  // --train/valid/test-data-path
  std::string split = "969, 30, 1";                     // Megatron's default
  int64_t seq_length = 0;
  int64_t seed = 1234;
  std::array<int64_t, 3> num_samples{};  // requested per split; 0: the split is not built
};

// Megatron's get_train_valid_test_num_samples: train = train_samples or train_iters * gbs;
// valid = (iters // eval_interval + 1) * eval_iters * gbs with iters = train_samples // gbs when
// counted in samples; test = eval_iters * gbs. Throws mt::UsageError for non-positive inputs.
std::array<int64_t, 3> megatron_num_samples(int64_t train_iters, int64_t train_samples, int64_t global_batch_size,
                                            int64_t eval_interval, int64_t eval_iters);

// Checks the combination (exactly one of --data-path and the per-split paths, positive
// sequence length, seed in [0, 2^32), a parseable split whose train part is not 0 when training samples
// are needed); throws mt::UsageError.
void validate_data_config(const DataConfig& config);

// Token-dataset prefixes in index order (--data-path first, then train, valid, test), each once.
std::vector<std::string> dataset_prefixes(const DataConfig& config);
std::vector<TokenDataset> open_datasets(const DataConfig& config);

// What the index is built from (hashed for its cache name), and what it was built over (path,
// format, counts and an md5 of the sequence lengths of every token dataset).
nlohmann::ordered_json index_parameters(const DataConfig& config);
nlohmann::ordered_json dataset_fingerprints(const DataConfig& config, const std::vector<TokenDataset>& datasets);

// Megatron's cache layout: `<cache_dir>/<md5 of the parameters>-mt-sample-index.h5`, with
// cache_dir defaulting to `<first prefix>/cache/GPTDataset_indices` (as GPTDataset's).
std::string default_cache_dir(const DataConfig& config);
std::string index_file_name(const DataConfig& config);

// Builds every split with a positive num_samples. Throws mt::Error naming the flag and dataset
// for a split that would be empty, a sequence longer than a split's tokens, or weights that
// Megatron refuses.
SampleIndex build_sample_index(const DataConfig& config, const std::vector<TokenDataset>& datasets);

// The index at `path`, checked against `config` and the datasets (stale: mt::Error); when the
// file is missing and `build` is set, built and written there (directories created). `built`
// tells which happened.
SampleIndex load_or_build_index(const DataConfig& config, const std::vector<TokenDataset>& datasets,
                                const std::string& path, bool build, bool* built = nullptr);

struct LoaderOptions {
  bool eod_mask_loss = false;         // loss mask 0 where the input token is EOD
  bool reset_position_ids = false;    // positions restart at 0 after each EOD
  bool reset_attention_mask = false;  // tokens after an EOD do not attend to anything before it
  bool needs_eod() const { return eod_mask_loss || reset_position_ids || reset_attention_mask; }
};

// The end-of-document id the loader uses: the datasets' common eod_id (-1 when none is needed and
// none is recorded). Throws mt::UsageError naming the flag when `options` need one and a dataset
// records none (Megatron .bin/.idx) or the datasets disagree.
int64_t loader_eod_id(const std::vector<TokenDataset>& datasets, const LoaderOptions& options);

// Megatron's _get_ltor_masks_and_position_ids for one sample's input tokens (tokens.size() rows):
// loss_mask 1 (0 at EOD with eod_mask_loss); positions 0.. (restarting after each EOD with
// reset_position_ids); doc_start[t] = 1 + the last EOD before t with reset_attention_mask, else 0
// (the attention op's document window, equal to Megatron's attention mask).
void ltor_masks_and_positions(std::span<const int32_t> tokens, int64_t eod_id, const LoaderOptions& options,
                              float* loss_mask, int32_t* positions, int32_t* doc_start);

// Megatron's MegatronPretrainingSampler (drop_last): micro-batch `micro_batch` (0-based, counted
// from consumed_samples) of data-parallel rank `rank` of `world` holds samples
// [first, first + micro_batch_size) with first = consumed + micro_batch * mbs * world + rank * mbs.
// total_samples < 0 is unbounded; a micro-batch whose global group of mbs * world samples does
// not fit in total_samples throws mt::Error (the data is exhausted).
int64_t pretraining_sampler_first(int64_t total_samples, int64_t consumed_samples, int micro_batch_size, int rank,
                                  int world, int64_t micro_batch);

// The loader: samples of a built index over its token datasets.
class GptSampleSource final : public SampleSource {
 public:
  // Checks that the index matches `seq_length`, and that the EOD flags have an end-of-document
  // id (all datasets must record the same one). Throws mt::UsageError otherwise.
  GptSampleSource(std::vector<TokenDataset> datasets, SampleIndex index, std::string index_path, int64_t seq_length,
                  LoaderOptions options);
  // seq_length + 1 tokens of a split's sample (Megatron's text); -1 pads past the data.
  void sample(Split split, int64_t index, int32_t* tokens) const override;
  void rows(Split split, int64_t index, int seq_length, const SampleRows& out) const override;
  int64_t split_size(Split split) const override;
  bool document_attention() const override { return options_.reset_attention_mask; }
  int64_t vocab_size() const override;  // the datasets' largest; -1 when one does not record it
  std::string describe() const override;

  // The component (position in the split's blend) and its own sample index of a split's sample.
  std::pair<int, int64_t> locate(Split split, int64_t index) const;
  const SampleIndex& index() const { return index_; }
  const std::vector<TokenDataset>& datasets() const { return datasets_; }
  int64_t eod_id() const { return eod_id_; }

 private:
  std::vector<TokenDataset> datasets_;
  SampleIndex index_;
  std::string index_path_;
  int64_t seq_length_;
  LoaderOptions options_;
  int64_t eod_id_ = -1;
};

}  // namespace mt::data
