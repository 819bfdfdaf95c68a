// AVX-512 path of fp32 -> bf16 (compiled with -mavx512f -mavx512bw; called only on such CPUs).
#include <immintrin.h>

#include "kernels/common/half.h"
#include "kernels/cpu/convert.h"

namespace mt::kernels::cpu::detail {

void fp32_to_bf16_avx512(const float* in, uint16_t* out, size_t n) {
  const __m512i rounding_base = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf_bits = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet_bit = _mm512_set1_epi32(0x00400000);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(in + i));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(rounding_base, lsb));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, abs_mask), inf_bits);
    rounded = _mm512_mask_mov_epi32(rounded, is_nan, _mm512_or_si512(bits, quiet_bit));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
  }
  for (; i < n; ++i) out[i] = fp32_to_bf16_bits(in[i]);
}

}  // namespace mt::kernels::cpu::detail
