// Counter-based parameter initialisation: every global element of every tensor (of any rank,
// sharded along one dimension) draws from Philox keyed by (seed, tensor name, global row-major
// element index), so any parallel layout and any model chunking starts from the same model.
// What each tensor starts from is the Init its block declared with it (model/layout.h
// ParamDeclaration); the standard blocks declare Megatron's scheme: weights ~ N(0, std), the
// output projections of each layer (linear_proj, linear_fc2) ~ N(0, std / sqrt(2 * num_layers)),
// biases 0, norm weights 1. Tested in tests/unit/model/test_layout.cpp and
// tests/unit/model/test_spec.cpp (init comes from the declared kind).
#pragma once

#include <cstdint>

namespace mt::model {

struct ParamLayout;
struct ParamEntry;

// How a tensor's elements start.
struct Init {
  enum class Kind {
    unset,     // declared without one: refused by the layout
    constant,  // every element `value`
    normal,    // N(0, value^2), element i drawn from Philox keyed by (seed, name, global index i)
  };
  Kind kind = Kind::unset;
  double value = 0;  // the constant, or the standard deviation

  static Init constant(float value) { return Init{Kind::constant, value}; }
  static Init normal(double std) { return Init{Kind::normal, std}; }
  bool operator==(const Init&) const = default;
};

// Standard normal for element `index` of the stream (Box-Muller over Philox, in double).
float counter_normal(uint64_t seed, uint64_t stream, int64_t index);

// Writes this rank's shard of one tensor, from its entry's Init, into `out` (host memory,
// entry.numel floats): a device run initialises tensor by tensor in one reused host buffer and
// copies each into its parameters (train/trainer.cpp).
void initialize_entry(const ParamEntry& entry, uint64_t seed, float* out);
// Writes this rank's shards into `params` (host memory laid out by `layout`), each tensor from
// its entry's Init.
void initialize_parameters(const ParamLayout& layout, uint64_t seed, float* params);

}  // namespace mt::model
