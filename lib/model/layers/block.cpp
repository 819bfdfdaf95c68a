// Buffer layout of blocks (see block.h).
#include "model/layers/block.h"

#include "backend/memory.h"

namespace mt::model {

float* BufferSource::take(int64_t count) {
  float* range = base_ && count > 0 ? base_ + floats_ : nullptr;
  floats_ += backend::buffer_bytes<float>(count) / static_cast<int64_t>(sizeof(float));
  return range;
}

}  // namespace mt::model
