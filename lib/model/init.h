// Counter-based parameter initialisation: every global element of every tensor (of any rank,
// sharded along one dimension) draws from Philox keyed by (seed, tensor name, global row-major
// element index), so any parallel layout and any model chunking starts from the same model.
// Megatron's scheme: weights ~ N(0, std), the output projections of each layer (linear_proj,
// linear_fc2) ~ N(0, std / sqrt(2 * num_layers)), biases 0, norm weights 1.
// Tested in tests/unit/model/test_layout.cpp.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/layout.h"

namespace mt::model {

// Standard normal for element `index` of the stream (Box-Muller over Philox, in double).
float counter_normal(uint64_t seed, uint64_t stream, int64_t index);

// Writes this rank's shards into `params` (host memory laid out by `layout`).
void initialize_parameters(const ModelConfig& config, const ParamLayout& layout, uint64_t seed, float* params);

}  // namespace mt::model
