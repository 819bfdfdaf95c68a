// AVX2 path of fp32 -> bf16 (compiled with -mavx2 -mfma; called only when the CPU has AVX2).
#include <immintrin.h>

#include "kernels/common/half.h"
#include "kernels/cpu/convert.h"

namespace mt::kernels::cpu::detail {

void fp32_to_bf16_avx2(const float* in, uint16_t* out, size_t n) {
  const __m256i rounding_base = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf_bits = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet_bit = _mm256_set1_epi32(0x00400000);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(in + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(rounding_base, lsb));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf_bits);
    rounded = _mm256_blendv_epi8(rounded, _mm256_or_si256(bits, quiet_bit), is_nan);
    const __m256i shifted = _mm256_srli_epi32(rounded, 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(shifted), _mm256_extracti128_si256(shifted, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
  for (; i < n; ++i) out[i] = fp32_to_bf16_bits(in[i]);
}

}  // namespace mt::kernels::cpu::detail
