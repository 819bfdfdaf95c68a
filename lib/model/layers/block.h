// What every block of the model spec (model/spec.h) shares for its activation buffers: each block
// lays out its own buffers (what it keeps for backward, its workspace of one pass) with a
// BufferSource, and the stage holds them as opaque BlockBuffers that only the block reads. The
// same layout code first counts (a source without memory) and then places the buffers, so the
// planned bytes are the allocated bytes. Tested through tests/unit/model/test_spec.cpp and the
// planned-equals-measured checks of tests/unit/model/test_model_gradients.cpp.
#pragma once

#include <cstdint>

namespace mt::model {

// A micro-batch at the buffers' capacity: rows (tokens on this rank, N) and the rows of the
// sequence-parallel region held here (S: N / TP under sequence parallelism, else N).
struct ActivationRows {
  int64_t rows = 0;
  int64_t sequence_rows = 0;
};

// Hands out float ranges one after the other, each rounded up to 64 bytes (so each starts 64-byte
// aligned in a 64-byte aligned block), from `base`, or with no base only counts them.
class BufferSource {
 public:
  explicit BufferSource(float* base = nullptr) : base_(base) {}
  // `count` floats (nullptr when counting or when count is 0).
  float* take(int64_t count);
  // Floats handed out so far, rounding included.
  int64_t floats() const { return floats_; }

 private:
  float* base_;
  int64_t floats_ = 0;
};

// A block's buffers (its saved set or its workspace): made by the block's lay_out, read only by
// the block, which knows their type.
struct BlockBuffers {
  virtual ~BlockBuffers() = default;
};

}  // namespace mt::model
