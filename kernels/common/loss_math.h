// Arithmetic of the CUDA loss and embedding kernels (kernels/cuda/loss.cu) that is also compiled
// for the host, so a CPU test can hold it to the CPU kernels bit for bit: the per-row
// cross-entropy loss that xent_loss_sums adds up, and the atomic-free embedding-grad walk (a
// thread owns one column of the table rows of one bucket and adds the tokens' grad rows in row
// order, as the CPU kernel does). Tested in tests/unit/kernels/test_loss_math.cpp.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"

namespace mt::kernels {

// loss[r] = log(sumexp) + max - target, in double as the CPU kernel computes it.
MT_HOST_DEVICE double xent_row_loss(float row_max, float row_sumexp, float target_logit) {
  return log(static_cast<double>(row_sumexp)) + static_cast<double>(row_max) - static_cast<double>(target_logit);
}

// The table row (index - index_begin) that a token's index adds to when it lies in
// [index_begin, index_end) and in bucket `bucket` of `buckets` (table row mod buckets); -1 otherwise.
MT_HOST_DEVICE int64_t embedding_bucket_row(int64_t index, int64_t index_begin, int64_t index_end, int64_t buckets,
                                            int64_t bucket) {
  if (index < index_begin || index >= index_end) return -1;
  const int64_t table_row = index - index_begin;
  return table_row % buckets == bucket ? table_row : -1;
}

// One column c of a grad table (rows of `cols` floats) receiving dy values in row order. The
// element of the current table row is held in `value` while consecutive additions hit that row,
// and written back before another row is read, so every element sees its additions in the order
// they come: the same float sums as grad[row, c] += dy one at a time.
struct EmbeddingGradColumn {
  float* grad;
  int cols;
  int c;
  int64_t held = -1;
  float value = 0.0f;

  MT_HOST_DEVICE void add(int64_t table_row, float dy) {
    if (table_row != held) {
      if (held >= 0) grad[held * cols + c] = value;
      held = table_row;
      value = grad[held * cols + c];
    }
    value += dy;
  }
  MT_HOST_DEVICE void finish() {
    if (held >= 0) grad[held * cols + c] = value;
    held = -1;
  }
};

}  // namespace mt::kernels
