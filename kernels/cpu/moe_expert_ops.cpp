// Row scaling for the MoE experts (see moe_expert_ops.h).
#include "kernels/cpu/moe_expert_ops.h"

namespace mt::kernels::cpu {
namespace {

bool rows_worth_threads(int64_t rows, int cols) { return rows * static_cast<int64_t>(cols) >= (int64_t{1} << 14); }

}  // namespace

void moe_scale_rows(const float* x, const float* scale, float* y, int64_t rows, int cols) {
  if (rows <= 0 || cols <= 0) return;
#pragma omp parallel for schedule(static) if (rows_worth_threads(rows, cols))
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scale[r];
    const float* xr = x + r * cols;  // (cols)
    float* yr = y + r * cols;        // (cols)
#pragma omp simd
    for (int c = 0; c < cols; ++c) yr[c] = s * xr[c];
  }
}

void moe_scale_rows_backward(const float* dy, const float* x, const float* scale, float* dx, float* d_scale,
                             int64_t rows, int cols) {
  if (rows <= 0) return;
#pragma omp parallel for schedule(static) if (rows_worth_threads(rows, cols))
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;  // (cols)
    const float* xr = x + r * cols;    // (cols)
    double sum = 0.0;
    for (int c = 0; c < cols; ++c) sum += static_cast<double>(dyr[c]) * xr[c];
    d_scale[r] = static_cast<float>(sum);
    const float s = scale[r];
    float* dxr = dx + r * cols;  // (cols), may be dyr: each element is read
                                 // before it is written
#pragma omp simd
    for (int c = 0; c < cols; ++c) dxr[c] = s * dyr[c];
  }
}

}  // namespace mt::kernels::cpu
