// GEMMs in the run's precision (see precision_gemm.h).
#include "model/precision_gemm.h"

#include <string>

#include "core/error.h"

namespace mt::model {

DType precision_dtype(Precision precision) {
  switch (precision) {
    case Precision::fp32: return DType::f32;
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
  }
  return DType::f32;
}

GemmWeights::GemmWeights(const backend::Ops& ops, Precision precision, int64_t elements,
                         backend::MemoryLedger* ledger)
    : ops_(ops), precision_(precision), operand_type_(ops.gemm_operand_type(precision)), elements_(elements) {
  if (precision_ == Precision::fp32) return;
  if (operand_type_ == DType::f32) {
    rounded_ = backend::DeviceBuffer<float>(ops, elements, backend::MemoryCategory::weights, ledger);
  } else {
    bits_ = backend::DeviceBuffer<uint16_t>(ops, elements, backend::MemoryCategory::weights, ledger);
  }
}

int64_t GemmWeights::bytes(const backend::Ops& ops, Precision precision, int64_t elements) {
  if (precision == Precision::fp32) return 0;
  return ops.gemm_operand_type(precision) == DType::f32 ? elements * 4 : elements * 2;
}

void GemmWeights::refresh(const float* params) { refresh(params, 0, elements_); }

void GemmWeights::refresh(const float* params, int64_t begin, int64_t end) {
  if (begin < 0 || end > elements_ || begin > end) {
    throw Error("GEMM weight copy", "range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                        ") outside its " + std::to_string(elements_) + " elements");
  }
  const backend::Stream stream = ops_.default_stream();
  if (!bits_.empty()) {
    ops_.convert(params + begin, DType::f32, bits_.data() + begin, operand_type_, end - begin, stream);
  } else if (!rounded_.empty()) {
    ops_.round_through(params + begin, rounded_.data() + begin, end - begin, precision_dtype(precision_), stream);
  }
}

uint16_t* GemmWeights::bf16_bits() { return operand_type_ == DType::bf16 && !bits_.empty() ? bits_.data() : nullptr; }

const void* GemmWeights::operand(const float* params, int64_t offset) const {
  if (!bits_.empty()) return bits_.data() + offset;
  if (!rounded_.empty()) return rounded_.data() + offset;
  return params + offset;
}

const void* PrecisionGemm::activation_operand(const float* x, int64_t count, int slot) const {
  const Precision precision = weights_.precision();
  if (precision == Precision::fp32) return x;
  float* scratch = operands_[slot];
  const backend::Stream stream = ops_.default_stream();
  if (weights_.operand_type() == DType::f32) {
    ops_.round_through(x, scratch, count, precision_dtype(precision), stream);
  } else {
    ops_.convert(x, DType::f32, scratch, weights_.operand_type(), count, stream);
  }
  return scratch;
}

void PrecisionGemm::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                         const void* b, int64_t ldb, float beta, float* c, int64_t ldc) const {
  ops_.gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc, weights_.operand_type(),
            ops_.default_stream());
}

void PrecisionGemm::linear_forward(const float* x, int64_t rows, int64_t in_features, int64_t weight_offset,
                                   int64_t out_features, float* y) const {
  gemm(false, true, rows, out_features, in_features, activation_operand(x, rows * in_features, 0), in_features,
       weights_.operand(params_, weight_offset), in_features, 0.0f, y, out_features);
}

void PrecisionGemm::linear_backward_input(const float* dy, int64_t rows, int64_t out_features, int64_t weight_offset,
                                          int64_t in_features, float* dx) const {
  gemm(false, false, rows, in_features, out_features, activation_operand(dy, rows * out_features, 0), out_features,
       weights_.operand(params_, weight_offset), in_features, 0.0f, dx, in_features);
}

void PrecisionGemm::linear_backward_weight(const float* dy, const float* x, int64_t rows, int64_t out_features,
                                           int64_t in_features, int64_t weight_offset) const {
  gemm(true, false, out_features, in_features, rows, activation_operand(dy, rows * out_features, 0), out_features,
       activation_operand(x, rows * in_features, 1), in_features, 1.0f, grads_ + weight_offset, in_features);
}

}  // namespace mt::model
