// CPU FP8 kernels (see fp8.h): OpenMP over elements or rows, each output written by one thread;
// the amax is a max, so its value does not depend on how the threads split the elements.
#include "kernels/cpu/fp8.h"

#include <omp.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace mt::kernels::cpu {
namespace {

// max(running, |value|) where a NaN on either side wins.
inline float nan_max_abs(float running, float value) {
  const float magnitude = value < 0.0f ? -value : value;
  if (running != running) return running;
  if (magnitude != magnitude || magnitude > running) return magnitude;
  return running;
}

void check_fp8_gemm_shape(int64_t k, int64_t lda, int64_t ldb, Fp8Type a_type, Fp8Type b_type) {
  if (a_type == Fp8Type::e5m2 && b_type == Fp8Type::e5m2) {
    throw std::invalid_argument("gemm_fp8: e5m2 x e5m2 is not an FP8 GEMM cuBLASLt runs (one operand must be e4m3)");
  }
  if (k % 16 != 0 || lda % 16 != 0 || ldb % 16 != 0) {
    throw std::invalid_argument("gemm_fp8: k, lda and ldb must be multiples of 16 (got k " + std::to_string(k) +
                                ", lda " + std::to_string(lda) + ", ldb " + std::to_string(ldb) + ")");
  }
}

// (rows, k) codes, rows `ld` apart -> (rows, k) fp32 values.
std::vector<float> decode_rows(const uint8_t* codes, int64_t rows, int64_t k, int64_t ld, Fp8Type type) {
  std::vector<float> values(static_cast<size_t>(rows * k));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < k; ++i) values[static_cast<size_t>(r * k + i)] = fp8_to_fp32(codes[r * ld + i], type);
  }
  return values;
}

}  // namespace

void fp8_quantize(const float* x, int64_t n, const float* scale, Fp8Type type, uint8_t* out, float* amax) {
  const float s = *scale;
  std::vector<float> thread_max(static_cast<size_t>(omp_get_max_threads()), 0.0f);
#pragma omp parallel
  {
    float local = 0.0f;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      out[i] = fp32_to_fp8(x[i] * s, type);
      local = nan_max_abs(local, x[i]);
    }
    thread_max[static_cast<size_t>(omp_get_thread_num())] = local;
  }
  float result = *amax;
  for (float m : thread_max) result = nan_max_abs(result, m);
  *amax = result;
}

void fp8_transpose(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) out[c * rows + r] = in[r * cols + c];
  }
}

void gemm_fp8(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, Fp8Type a_type, const float* a_scale_inv,
              int64_t lda, const uint8_t* b, Fp8Type b_type, const float* b_scale_inv, int64_t ldb, float beta,
              float* c, int64_t ldc) {
  check_fp8_gemm_shape(k, lda, ldb, a_type, b_type);
  const std::vector<float> a_values = decode_rows(a, m, k, lda, a_type);  // (m, k)
  const std::vector<float> b_values = decode_rows(b, n, k, ldb, b_type);  // (n, k)
  const float scaled_alpha = alpha * *a_scale_inv * *b_scale_inv;
  gemm_f32(false, true, m, n, k, scaled_alpha, a_values.data(), k, b_values.data(), k, beta, c, ldc);
}

void fp8_update_scales(float* amax, float* amax_history, float* scale, float* scale_inv, int64_t tensors,
                       const Fp8ScalingParams& params) {
  if (params.history_len < 1) throw std::invalid_argument("fp8_update_scales: history_len must be >= 1");
  for (int64_t t = 0; t < tensors; ++t) {
    fp8_update_scale(amax + t, amax_history + t * params.history_len, scale + t, scale_inv + t, params);
  }
}

}  // namespace mt::kernels::cpu
