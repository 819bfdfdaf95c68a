// Megatron's data-path flags, defined once for every tool that reads token datasets (mt-shard
// build, mt-train): --data-path (PREFIX..., or W1 PREFIX1 W2 PREFIX2 ...), the per-split paths
// and --split, turned into the blend part of data::DataConfig. Tested through
// tests/tools/mt-shard.bats and tests/tools/mt-train.bats.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "data/gpt_dataset.h"

namespace mt::tools {

struct DataPathFlags {
  std::vector<std::string> data_path, train_data_path, valid_data_path, test_data_path;
  std::string split = "969, 30, 1";
  bool any() const {
    return !data_path.empty() || !train_data_path.empty() || !valid_data_path.empty() || !test_data_path.empty();
  }
};

// Adds the four path flags and --split to `app`, in option group `group` ("": the default group).
void add_data_path_flags(CLI::App& app, DataPathFlags& flags, const std::string& group = "");

// The blend, per-split blends and split of `flags` (each list parsed with data::parse_blend).
void apply_data_path_flags(const DataPathFlags& flags, data::DataConfig& config);

}  // namespace mt::tools
