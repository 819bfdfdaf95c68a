// Value checks on tensors (see value_checks.h).
#include "io/value_checks.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "kernels/common/half.h"

namespace mt::io {
namespace {

std::string value_text(float value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Inf" : "-Inf";
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", static_cast<double>(value));
  return text;
}

float rounded_to(float value, DType stored) {
  if (stored == DType::bf16) return kernels::round_to_bf16(value);
  if (stored == DType::f16) return kernels::fp16_bits_to_fp32(kernels::fp32_to_fp16_bits(value));
  return value;
}

}  // namespace

int64_t first_nonfinite(const float* values, int64_t count) {
  // Blocks tested with a branch-free OR over the exponent bits (all ones: NaN or Inf), which the
  // compiler vectorizes, so a load's scan runs at memory speed; the scalar search only in a hit.
  constexpr int64_t kBlock = 4096;
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t end = std::min(count, begin + kBlock);
    uint32_t hit = 0;
    for (int64_t i = begin; i < end; ++i) hit |= (std::bit_cast<uint32_t>(values[i]) & 0x7f800000u) == 0x7f800000u;
    if (hit == 0) continue;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(values[i])) return i;
    }
  }
  return -1;
}

std::string nonfinite_text(const std::string& tensor, float value, int64_t element) {
  return "tensor " + tensor + " holds " + value_text(value) + " at element " + std::to_string(element);
}

std::string nonfinite_problem(const std::string& tensor, const float* values, int64_t count) {
  const int64_t at = first_nonfinite(values, count);
  return at < 0 ? "" : nonfinite_text(tensor, values[at], at);
}

void check_finite(const std::string& where, const std::string& tensor, const float* values, int64_t count,
                  const std::string& why) {
  const std::string problem = nonfinite_problem(tensor, values, count);
  if (!problem.empty()) throw Error(where, problem + why);
}

void check_fits_dtype(const std::string& where, const std::string& tensor, const float* values, int64_t count,
                      DType stored) {
  for (int64_t i = 0; i < count; ++i) {
    if (std::isfinite(values[i]) && !std::isfinite(rounded_to(values[i], stored))) {
      throw Error(where, "tensor " + tensor + " holds " + value_text(values[i]) + " at element " + std::to_string(i) +
                             ", beyond " + dtype_name(stored) + "'s range (it would be stored as inf); keep --dtype " +
                             (stored == DType::f16 ? "fp32 or bf16" : "fp32"));
    }
  }
}

}  // namespace mt::io
