// AVX-512 path of the FMA probe (compiled with -mavx512f; called only on such CPUs).
#include <immintrin.h>

#include "kernels/cpu/fma_probe.h"

namespace mt::kernels::cpu::detail {

double fma_probe_avx512(int64_t iterations) {
  constexpr int kChains = 16;  // 2 FMA ports x 4 cycles latency, twice over, within 32 zmm registers
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 scale = _mm512_set1_ps(0.999999f), step = _mm512_set1_ps(1e-3f);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], scale, step);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  const double flops = 2.0 * 16 * kChains * static_cast<double>(iterations);
  float lanes[16];  // not _mm512_reduce_add_ps: GCC 12's header trips -Wuninitialized on it
  _mm512_storeu_ps(lanes, sum);
  return flops + 0.0 * lanes[0];
}

}  // namespace mt::kernels::cpu::detail
