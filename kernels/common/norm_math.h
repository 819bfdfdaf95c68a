// Per-element arithmetic of the CUDA LayerNorm and RMSNorm kernels (kernels/cuda/norms.cu), also
// compiled for the host so a CPU test holds it to the CPU kernels bit for bit: the outputs and
// input grads from a row's statistics, the parameter-grad terms, and the fixed partition of rows
// into chunks that makes the parameter-grad sums deterministic. Each expression is the CPU
// kernel's (kernels/cpu/impl/elementwise.inc), operand for operand. Tested in
// tests/unit/kernels/test_norm_math.cpp.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"

namespace mt::kernels {

// y = (x - mean) rstd w (+ b).
MT_HOST_DEVICE float layernorm_output(float x, float mean, float rstd, float weight) {
  return (x - mean) * rstd * weight;
}
MT_HOST_DEVICE float layernorm_output(float x, float mean, float rstd, float weight, float bias) {
  return (x - mean) * rstd * weight + bias;
}

// dx = rstd (dy w - mean(dy w) - xhat mean(dy w xhat)).
MT_HOST_DEVICE float layernorm_input_grad(float dy, float xhat, float weight, float rstd, float mean_dxhat,
                                          float mean_dxhat_xhat) {
  return rstd * (dy * weight - mean_dxhat - xhat * mean_dxhat_xhat);
}

// y = x rstd w.
MT_HOST_DEVICE float rmsnorm_output(float x, float rstd, float weight) { return x * rstd * weight; }

// dx = rstd dy w - x correction, correction = rstd^3 mean(dy w x).
MT_HOST_DEVICE float rmsnorm_input_grad(float dy, float x, float weight, float rstd, float correction) {
  return rstd * dy * weight - x * correction;
}

// The row statistic rstd = 1 / sqrt(mean of squares + eps).
MT_HOST_DEVICE float norm_rstd(float sum_squares, float inv_cols, float eps) {
  return 1.0f / sqrtf(sum_squares * inv_cols + eps);
}

// Rows [chunk * rows_per_chunk, min(rows, (chunk + 1) * rows_per_chunk)) for chunk < count: one
// chunk per min_rows rows (rounded up), at most max_chunks, fewer when `capacity` floats cannot
// hold terms x chunks x cols partials, one when even that does not fit. Depends on its arguments only,
// so the sums (and their bits) are the same on every device and run.
struct RowChunkPlan {
  int64_t count;
  int64_t rows_per_chunk;
};

MT_HOST_DEVICE RowChunkPlan plan_row_chunks(int64_t rows, int64_t cols, int64_t terms, int64_t max_chunks,
                                            int64_t min_rows, int64_t capacity) {
  int64_t chunks = (rows + min_rows - 1) / min_rows;
  if (chunks > max_chunks) chunks = max_chunks;
  const int64_t fit = capacity / (cols * terms);
  if (chunks > fit) chunks = fit;
  if (chunks < 1) chunks = 1;
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  return RowChunkPlan{(rows + rows_per_chunk - 1) / rows_per_chunk, rows_per_chunk};
}

}  // namespace mt::kernels
