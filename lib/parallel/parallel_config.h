// Parallel layout: degrees (TP, PP, DP, CP, EP, SP) and a rank's coordinates in Megatron's
// tp-cp-ep-dp-pp grid (TP fastest). Single-rank training uses all degrees 1; the layout table
// (model/layout.h) already shards by them. JSON for the run record and checkpoints.
// Tested in tests/unit/model/test_layout.cpp and tests/unit/parallel/test_parallel_config.cpp.
#pragma once

#include <nlohmann/json.hpp>

namespace mt::parallel {

struct ParallelConfig {
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int data_parallel_size = 1;
  int context_parallel_size = 1;
  int expert_model_parallel_size = 1;
  bool sequence_parallel = false;

  int world_size() const {
    return tensor_model_parallel_size * pipeline_model_parallel_size * data_parallel_size *
           context_parallel_size * expert_model_parallel_size;
  }
};

struct RankCoordinates {
  int tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;
};

// The config as JSON with Megatron's argument names, and back (unknown keys, wrong types and
// degrees below 1 are mt::UsageError naming the key; missing keys keep the defaults).
nlohmann::ordered_json to_json(const ParallelConfig& config);
ParallelConfig parallel_config_from_json(const nlohmann::json& json);

}  // namespace mt::parallel
