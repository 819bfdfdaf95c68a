// Counter-based initialisation (see init.h).
#include "model/init.h"

#include <cmath>
#include <string>

#include "kernels/common/philox.h"

namespace mt::model {
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

float counter_normal(uint64_t seed, uint64_t stream, int64_t index) {
  const auto bits = kernels::philox_block(seed, stream, static_cast<uint64_t>(index) / 2);
  const int pair = static_cast<int>(index % 2);
  const double u1 = (static_cast<double>(bits.v[2 * pair]) + 1.0) / 4294967296.0;  // (0, 1]
  const double u2 = static_cast<double>(bits.v[2 * pair + 1]) / 4294967296.0;      // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

void initialize_parameters(const ModelConfig& config, const ParamLayout& layout, uint64_t seed, float* params) {
  for (const auto& entry : layout.entries) {
    float* out = params + entry.offset;
    const bool is_norm = entry.name.find("layernorm") != std::string::npos;
    if (entry.global_shape.size() == 1) {
      const float value = is_norm && ends_with(entry.name, ".weight") ? 1.0f : 0.0f;
      for (int64_t i = 0; i < entry.numel; ++i) out[i] = value;
      continue;
    }
    const bool output_projection = ends_with(entry.name, "linear_proj.weight") || ends_with(entry.name, "linear_fc2.weight");
    const double std = output_projection ? config.init_method_std / std::sqrt(2.0 * config.num_layers)
                                         : config.init_method_std;
    const uint64_t stream = kernels::stream_id(entry.name.c_str());
    // For each index of the dimensions before the shard dimension, the local elements form one
    // run that is contiguous in the global tensor too, starting at the shard's offset.
    const int dim = entry.shard_dim < 0 ? 0 : entry.shard_dim;
    int64_t inner = 1;
    for (size_t d = static_cast<size_t>(dim) + 1; d < entry.local_shape.size(); ++d) inner *= entry.local_shape[d];
    const int64_t run = entry.local_shape[static_cast<size_t>(dim)] * inner;
    const int64_t runs = run > 0 ? entry.numel / run : 0;
    const int64_t global_run = entry.global_shape[static_cast<size_t>(dim)] * inner;
    const int64_t first = (entry.shard_dim < 0 ? 0 : entry.shard_offset) * inner;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t r = 0; r < runs; ++r) {
      for (int64_t i = 0; i < run; ++i) {
        out[r * run + i] = static_cast<float>(std * counter_normal(seed, stream, r * global_run + first + i));
      }
    }
  }
}

}  // namespace mt::model
