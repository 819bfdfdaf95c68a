// The FMA probe's dispatch and its SSE path (x86-64-v2 has no FMA: a multiply and an add per
// lane, both counted). See fma_probe.h.
#include "kernels/cpu/fma_probe.h"

#include <immintrin.h>

#include <stdexcept>

namespace mt::kernels::cpu {

namespace detail {

double fma_probe_x86_64_v2(int64_t iterations) {
  constexpr int kChains = 12;
  __m128 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm_set1_ps(static_cast<float>(c));
  const __m128 scale = _mm_set1_ps(0.999999f), step = _mm_set1_ps(1e-3f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], scale), step);
  }
  __m128 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm_add_ps(sum, acc[c]);
  const double flops = 2.0 * 4 * kChains * static_cast<double>(iterations);
  return flops + 0.0 * _mm_cvtss_f32(sum);
}

}  // namespace detail

bool probe_supported(CpuIsa isa, ProbeArithmetic arithmetic) {
  return arithmetic == ProbeArithmetic::fp32 || isa == CpuIsa::avx512_bf16;
}

double run_fma_probe(CpuIsa isa, ProbeArithmetic arithmetic, int64_t iterations) {
  if (!probe_supported(isa, arithmetic)) throw std::invalid_argument("bf16 dot products need AVX512-BF16");
  if (arithmetic == ProbeArithmetic::bf16_dot) return detail::bf16_dot_probe_avx512bf16(iterations);
  switch (isa) {
    case CpuIsa::avx512_bf16:
    case CpuIsa::avx512: return detail::fma_probe_avx512(iterations);
    case CpuIsa::avx2: return detail::fma_probe_avx2(iterations);
    case CpuIsa::x86_64_v2: return detail::fma_probe_x86_64_v2(iterations);
  }
  return 0;
}

}  // namespace mt::kernels::cpu
