// Element types and training precisions, the one list of each in mt: a DType names what a buffer
// or a file's token array holds (lib/data stores token ids as u16/i32 and reads every integer type
// Megatron's .idx names); a Precision is how training rounds GEMM inputs.
// Tested in tests/unit/core/test_dtype.cpp.
#pragma once

#include <cstddef>

namespace mt {

enum class DType { f32, bf16, f16, f64, u8, i8, i16, u16, i32, i64 };

constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::u8:
    case DType::i8: return 1;
    case DType::bf16:
    case DType::f16:
    case DType::i16:
    case DType::u16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f64:
    case DType::i64: return 8;
  }
  return 0;
}

// numpy's names ("float32", "bfloat16", "uint16", ...): what h5py, Megatron and mt's records print.
constexpr const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::f64: return "float64";
    case DType::u8: return "uint8";
    case DType::i8: return "int8";
    case DType::i16: return "int16";
    case DType::u16: return "uint16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

constexpr bool is_integer(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::bf16:
    case DType::f16:
    case DType::f64: return false;
    case DType::u8:
    case DType::i8:
    case DType::i16:
    case DType::u16:
    case DType::i32:
    case DType::i64: return true;
  }
  return false;
}

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
