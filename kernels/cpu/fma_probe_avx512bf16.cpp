// AVX512-BF16 path of the probe: vdpbf16ps, 32 bf16 products summed pairwise into 16 fp32 lanes
// (64 operations per instruction). Compiled with -mavx512bf16; called only on such CPUs.
#include <immintrin.h>

#include "kernels/cpu/fma_probe.h"

namespace mt::kernels::cpu::detail {

double bf16_dot_probe_avx512bf16(int64_t iterations) {
  constexpr int kChains = 16;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  // bf16 pairs of (1e-3, 1e-3): accumulators grow by 2e-6 a round and stay finite.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3a83);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, a);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  const double flops = 64.0 * kChains * static_cast<double>(iterations);
  float lanes[16];  // not _mm512_reduce_add_ps: GCC 12's header trips -Wuninitialized on it
  _mm512_storeu_ps(lanes, sum);
  return flops + 0.0 * lanes[0];
}

}  // namespace mt::kernels::cpu::detail
