// The sample-index file (DESIGN.md sec. 4): the arrays of Megatron-Core's GPTDataset and
// BlendedDataset for the train/valid/test splits of one run, in one HDF5 file, with the
// parameters that produced them as attributes. A reader asked for other parameters refuses the
// file (a stale index never feeds a run silently).
//
// Layout (arrays named as in megatron/core/datasets/{gpt_dataset,blended_dataset}.py):
//   /                      attrs mt_format = "mt-sample-index", mt_format_version = 1,
//                          parameters (JSON text: what was asked, hashed for cache names),
//                          parameters_md5, datasets (JSON text: paths and fingerprints),
//                          seq_length, seed, split, num_samples (train, valid, test)
//   /<split>               one group per built split (train, valid, test); attrs num_samples
//                          (requested), size (samples it serves), components, blended (0/1)
//   /<split>/dataset_index          (size,) int16    blends only: the component of each sample
//   /<split>/dataset_sample_index   (size,) int64    blends only: the sample inside it
//   /<split>/component_<k>          one GPTDataset: attrs dataset (index into `datasets`),
//                          sequence_begin, sequence_end, num_samples, num_epochs,
//                          separate_final_epoch, num_tokens_per_epoch
//   /<split>/component_<k>/document_index  (documents * epochs,) int32
//   /<split>/component_<k>/sample_index    (samples + 1, 2) int32 or int64 (as Megatron's)
//   /<split>/component_<k>/shuffle_index   (samples,) uint32 or int64 (as Megatron's)
// Written to `<path>.tmp-<pid>` and renamed into place.
// Tested in tests/unit/data/test_sample_index.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "data/megatron_indices.h"

namespace mt::data {

// One GPTDataset: a token dataset's sequence range [sequence_begin, sequence_end) and its indices.
struct IndexComponent {
  int dataset = 0;  // index into SampleIndex::datasets
  int64_t sequence_begin = 0, sequence_end = 0;
  int64_t num_samples = 0;  // requested from this component
  GptIndices indices;
  int64_t size() const { return indices.num_samples(); }  // samples it serves
};

// One split: a single GPTDataset, or a BlendedDataset over one or more (a weighted single prefix
// is a blend of one, as in Megatron's builder).
struct IndexSplit {
  bool present = false;
  bool blended = false;
  int64_t num_samples = 0;  // requested
  std::vector<IndexComponent> components;
  std::vector<int16_t> dataset_index;         // (size,) blends only
  std::vector<int64_t> dataset_sample_index;  // (size,) blends only
  int64_t size() const;
};

struct SampleIndex {
  nlohmann::ordered_json parameters;  // what was asked (the identity the cache name hashes)
  nlohmann::ordered_json datasets;    // [{path, resolved, weight..., fingerprint}] per token dataset
  std::array<IndexSplit, 3> splits;   // train, valid, test
};

// Writes `index` to `path` (temporary name, then rename). Throws mt::Error.
void write_sample_index(const std::string& path, const SampleIndex& index);

// Reads a whole index file; throws mt::Error naming the file when it is not one.
SampleIndex read_sample_index(const std::string& path);

// Throws mt::Error when `index` (read from `path`) was built from other parameters or other
// data than `parameters` and `datasets`: the message names the differing keys and both values.
void check_sample_index(const std::string& path, const SampleIndex& index, const nlohmann::ordered_json& parameters,
                        const nlohmann::ordered_json& datasets);

// MD5 of `data` as 32 lowercase hex digits (the digest Megatron names its index caches by).
std::string md5_hex(std::string_view data);

}  // namespace mt::data
