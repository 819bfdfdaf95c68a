// Counter-based initialisation (see init.h).
#include "model/init.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "kernels/common/philox.h"
#include "model/layout.h"

namespace mt::model {
namespace {

// N(0, std^2) for this rank's shard of the tensor: for each index of the dimensions before the
// shard dimension, the local elements form one run that is contiguous in the global tensor too,
// starting at the shard's offset.
void fill_normal(const ParamEntry& entry, double std, uint64_t seed, float* out) {
  const uint64_t stream = kernels::stream_id(entry.name.c_str());
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

}  // namespace

float counter_normal(uint64_t seed, uint64_t stream, int64_t index) {
  const auto bits = kernels::philox_block(seed, stream, static_cast<uint64_t>(index) / 2);
  const int pair = static_cast<int>(index % 2);
  const double u1 = (static_cast<double>(bits.v[2 * pair]) + 1.0) / 4294967296.0;  // (0, 1]
  const double u2 = static_cast<double>(bits.v[2 * pair + 1]) / 4294967296.0;      // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

void initialize_entry(const ParamEntry& entry, uint64_t seed, float* out) {
  switch (entry.init.kind) {
    case Init::Kind::constant: {
      const float value = static_cast<float>(entry.init.value);
      for (int64_t i = 0; i < entry.numel; ++i) out[i] = value;
      break;
    }
    case Init::Kind::normal:
      fill_normal(entry, entry.init.value, seed, out);
      break;
    case Init::Kind::unset:
      throw Error("parameter " + entry.name, "has no declared init");
  }
}

void initialize_parameters(const ParamLayout& layout, uint64_t seed, float* params) {
  for (const auto& entry : layout.entries) initialize_entry(entry, seed, params + entry.offset);
}

}  // namespace mt::model
