// Activation recompute (Megatron's --recompute-granularity / --recompute-method /
// --recompute-num-layers): which layers of a chunk keep everything for backward, which keep only
// their input and are run again in backward, and which (selective) rebuild only the core
// attention. Tested through tests/unit/model/test_model_gradients.cpp (bit-identical grads, ordered
// activation memory).
#pragma once

#include <vector>

namespace mt::model {

enum class RecomputeGranularity { none, selective, full };
enum class RecomputeMethod { uniform, block };

struct RecomputeConfig {
  RecomputeGranularity granularity = RecomputeGranularity::none;
  RecomputeMethod method = RecomputeMethod::uniform;
  int num_layers = 1;  // uniform: layers per recomputed chunk; block: layers recomputed
};

// The plan for a chunk of `layers` layers.
struct RecomputePlan {
  std::vector<bool> recomputed;  // per layer: rebuilt in backward from its group's kept input
  std::vector<int> group_start;  // per layer: first layer of its recompute group (itself if not recomputed)
  int group_length = 1;          // layers per recompute group (the scratch sets backward needs)
  bool selective = false;        // core attention outputs are rebuilt in backward

  bool any_recomputed() const;
};

RecomputePlan plan_recompute(const RecomputeConfig& config, int layers);

}  // namespace mt::model
