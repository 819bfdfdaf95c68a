// Training precisions and element types.
#pragma once

#include <string>

namespace mt {

// fp32: everything fp32. bf16: GEMM inputs (weights and activations) rounded to bf16 and
// multiplied with fp32 accumulation, fp32 master weights, grads and optimizer states.
// fp16: the same with fp16 rounding (values outside fp16's range become inf) and a loss scaler.
enum class Precision { fp32, bf16, fp16 };

inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

}  // namespace mt
