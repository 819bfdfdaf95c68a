// Scalar conversions and the ISA dispatch for cpu/convert.h.
#include "kernels/cpu/convert.h"

#include "kernels/common/half.h"

namespace mt::kernels::cpu {

namespace detail {
void fp32_to_bf16_scalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fp32_to_bf16_bits(in[i]);
}
}  // namespace detail

void fp32_to_bf16_isa(CpuIsa isa, const float* in, uint16_t* out, size_t n) {
  switch (isa) {
    case CpuIsa::avx512_bf16:
    case CpuIsa::avx512: detail::fp32_to_bf16_avx512(in, out, n); return;
    case CpuIsa::avx2: detail::fp32_to_bf16_avx2(in, out, n); return;
    case CpuIsa::x86_64_v2: detail::fp32_to_bf16_scalar(in, out, n); return;
  }
}

void fp32_to_bf16(const float* in, uint16_t* out, size_t n) { fp32_to_bf16_isa(active_isa(), in, out, n); }

void bf16_to_fp32(const uint16_t* in, float* out, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_fp32(in[i]);
}

void fp32_to_fp16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fp32_to_fp16_bits(in[i]);
}

void fp16_to_fp32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fp16_bits_to_fp32(in[i]);
}

void round_through_bf16(const float* in, float* out, size_t n) {
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = round_to_bf16(in[i]);
}

void round_through_fp16(const float* in, float* out, size_t n) {
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = fp16_bits_to_fp32(fp32_to_fp16_bits(in[i]));
}

}  // namespace mt::kernels::cpu
