// bf16 and fp16 storage types with round-to-nearest-even conversions from fp32, shared by the CPU
// and CUDA backends (header-only, host and device). Tested in tests/unit/kernels/test_half.cpp.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/host_device.h"

namespace mt::kernels {

MT_HOST_DEVICE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MT_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// bf16: the upper 16 bits of an fp32, rounded to nearest even; NaN stays a quiet NaN.
MT_HOST_DEVICE uint16_t fp32_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

MT_HOST_DEVICE float bf16_bits_to_fp32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// fp16 (IEEE binary16) with round-to-nearest-even, subnormals, overflow to infinity.
MT_HOST_DEVICE uint16_t fp32_to_fp16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                              // below 2^-14: subnormal
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);          // below half the least subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t rebased = abs - 0x38000000u;  // exponent bias 127 -> 15
  rebased += 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | (rebased >> 13));
}

MT_HOST_DEVICE float fp16_bits_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // subnormal: value = mantissa * 2^-24
    float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -value : value;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Round an fp32 to the nearest bf16 value, keeping fp32 storage (bf16-rounded GEMM inputs).
MT_HOST_DEVICE float round_to_bf16(float f) { return bf16_bits_to_fp32(fp32_to_bf16_bits(f)); }

}  // namespace mt::kernels
