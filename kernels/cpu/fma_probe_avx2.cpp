// AVX2 + FMA path of the FMA probe (compiled with -mavx2 -mfma; called only on such CPUs).
#include <immintrin.h>

#include "kernels/cpu/fma_probe.h"

namespace mt::kernels::cpu::detail {

double fma_probe_avx2(int64_t iterations) {
  constexpr int kChains = 12;  // 2 FMA ports x 4-5 cycles latency, within 16 ymm registers
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 scale = _mm256_set1_ps(0.999999f), step = _mm256_set1_ps(1e-3f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], scale, step);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  const double flops = 2.0 * 8 * kChains * static_cast<double>(iterations);
  return flops + 0.0 * _mm256_cvtss_f32(sum);
}

}  // namespace mt::kernels::cpu::detail
