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
  const int64_t linear = fp8_linear(weight_offset, rows, in_features, out_features);
  if (linear >= 0) return fp8_forward(x, rows, in_features, weight_offset, linear, out_features, y);
  gemm(false, true, rows, out_features, in_features, activation_operand(x, rows * in_features, 0), in_features,
       weights_.operand(params_, weight_offset), in_features, 0.0f, y, out_features);
}

void PrecisionGemm::linear_forward_bias(const float* x, int64_t rows, int64_t in_features, int64_t weight_offset,
                                        int64_t out_features, const float* bias, float* y) const {
  const int64_t linear = fp8_linear(weight_offset, rows, in_features, out_features);
  if (linear >= 0) {
    fp8_forward(x, rows, in_features, weight_offset, linear, out_features, y);
    ops_.bias_add(y, bias, rows, static_cast<int>(out_features), ops_.default_stream());
    return;
  }
  ops_.gemm_bias(false, true, rows, out_features, in_features, activation_operand(x, rows * in_features, 0),
                 in_features, weights_.operand(params_, weight_offset), in_features, bias, y,
                 weights_.operand_type(), ops_.default_stream());
}

void PrecisionGemm::linear_forward_bias_gelu(const float* x, int64_t rows, int64_t in_features,
                                             int64_t weight_offset, int64_t out_features, const float* bias,
                                             float* pre, float* y) const {
  const int64_t linear = fp8_linear(weight_offset, rows, in_features, out_features);
  if (linear >= 0) {
    fp8_forward(x, rows, in_features, weight_offset, linear, out_features, pre);
    if (bias) ops_.bias_add(pre, bias, rows, static_cast<int>(out_features), ops_.default_stream());
    ops_.gelu_forward(pre, y, rows * out_features, ops_.default_stream());
    return;
  }
  ops_.gemm_bias_gelu(false, true, rows, out_features, in_features, activation_operand(x, rows * in_features, 0),
                      in_features, weights_.operand(params_, weight_offset), in_features, bias, pre, y,
                      weights_.operand_type(), ops_.default_stream());
}

void PrecisionGemm::linear_backward_input(const float* dy, int64_t rows, int64_t out_features, int64_t weight_offset,
                                          int64_t in_features, float* dx) const {
  const int64_t linear = fp8_linear(weight_offset, rows, in_features, out_features);
  if (linear >= 0) return fp8_backward_input(dy, rows, out_features, weight_offset, linear, in_features, dx);
  gemm(false, false, rows, in_features, out_features, activation_operand(dy, rows * out_features, 0), out_features,
       weights_.operand(params_, weight_offset), in_features, 0.0f, dx, in_features);
}

void PrecisionGemm::linear_backward_weight(const float* dy, const float* x, int64_t rows, int64_t out_features,
                                           int64_t in_features, int64_t weight_offset) const {
  const int64_t linear = fp8_linear(weight_offset, rows, in_features, out_features);
  // --no-fp8-wgrad: the weight-gradient GEMM of an FP8 linear in the run's precision (TE's wgrad override).
  if (linear >= 0 && fp8_->config().wgrad) {
    return fp8_backward_weight(dy, x, rows, out_features, in_features, weight_offset, linear);
  }
  gemm(true, false, out_features, in_features, rows, activation_operand(dy, rows * out_features, 0), out_features,
       activation_operand(x, rows * in_features, 1), in_features, 1.0f, grads_ + weight_offset, in_features);
}

// ---- FP8 mode ------------------------------------------------------------------------------

Fp8RowPadding fp8_row_padding(int64_t rows) {
  Fp8RowPadding padding;
  padding.rows = rows;
  padding.body = rows / Fp8RowPadding::kBlock * Fp8RowPadding::kBlock;
  padding.padded = (rows + Fp8RowPadding::kBlock - 1) / Fp8RowPadding::kBlock * Fp8RowPadding::kBlock;
  return padding;
}

int64_t PrecisionGemm::fp8_linear(int64_t weight_offset, int64_t rows, int64_t in_features,
                                  int64_t out_features) const {
  if (!fp8_) return -1;
  const int64_t linear = fp8_->linear(weight_offset);
  if (linear < 0) return -1;
  if ((!fp8_rows_padded_ && rows % 16 != 0) || in_features % 16 != 0 || out_features % 16 != 0) {
    throw UsageError("--fp8-format", "an FP8 linear's tokens, input and output features must be multiples of 16 "
                                     "(cuBLASLt's FP8 GEMMs); this one is " + std::to_string(rows) + " tokens, " +
                                     std::to_string(in_features) + " -> " + std::to_string(out_features));
  }
  if (out_features * in_features > fp8_->weight_capacity()) {
    throw Error("FP8 linear", "weight of " + std::to_string(out_features * in_features) +
                                  " elements exceeds the weight scratch of " + std::to_string(fp8_->weight_capacity()));
  }
  return linear;
}

// Quantizes `count` floats of `x` as `operand` of `linear` with the scale the phase gives; returns
// the scale inverse the GEMM applies to the codes.
const float* PrecisionGemm::fp8_quantize(const float* x, int64_t count, int64_t linear, Fp8Operand operand,
                                         uint8_t* codes) const {
  const Fp8Scaling::Quantization q = fp8_->quantization(linear, operand);
  ops_.fp8_quantize(x, count, q.scale, fp8_->type(operand), codes, q.amax, ops_.default_stream());
  return q.scale_inv;
}

PrecisionGemm::Fp8Codes PrecisionGemm::fp8_weight(int64_t weight_offset, int64_t linear, int64_t out_features,
                                                  int64_t in_features, bool transposed) const {
  uint8_t* codes = fp8_->weight_codes();  // (out, in)
  const float* scale_inv = fp8_quantize(params_ + weight_offset, out_features * in_features, linear,
                                        Fp8Operand::weight, codes);
  if (!transposed) return {codes, scale_inv};
  uint8_t* codes_t = fp8_->weight_codes_transposed();  // (in, out)
  ops_.fp8_transpose(codes, out_features, in_features, codes_t, ops_.default_stream());
  return {codes_t, scale_inv};
}

uint8_t* PrecisionGemm::fp8_row_codes(const Fp8RowPadding& padding, int64_t cols, int64_t n) const {
  if (padding.tail() == 0) return byte_scratch(0);  // (rows, cols): no padding
  uint8_t* codes = fp8_->padding_codes(padding.scratch_bytes(cols, n));  // (padded, cols), then (16, n) fp32
  ops_.zero(codes + padding.rows * cols, (padding.padded - padding.rows) * cols, ops_.default_stream());
  return codes;
}

void PrecisionGemm::fp8_gemm_rows(const Fp8RowPadding& padding, int64_t n, int64_t k, uint8_t* a,
                                  kernels::Fp8Type a_type, const float* a_scale_inv, const Fp8Codes& b,
                                  kernels::Fp8Type b_type, float* c) const {
  const backend::Stream stream = ops_.default_stream();
  if (padding.body > 0) {
    ops_.gemm_fp8(padding.body, n, k, 1.0f, a, a_type, a_scale_inv, k, b.codes, b_type, b.scale_inv, k, 0.0f, c, n,
                  stream);
  }
  if (padding.tail() == 0) return;
  float* tail_out = reinterpret_cast<float*>(a + padding.tail_output_offset(k));  // (16, n)
  ops_.gemm_fp8(Fp8RowPadding::kBlock, n, k, 1.0f, a + padding.body * k, a_type, a_scale_inv, k, b.codes, b_type,
                b.scale_inv, k, 0.0f, tail_out, n, stream);
  ops_.copy(c + padding.body * n, tail_out, padding.tail() * n * static_cast<int64_t>(sizeof(float)),
            backend::CopyKind::device_to_device, stream);
}

void PrecisionGemm::fp8_forward(const float* x, int64_t rows, int64_t in_features, int64_t weight_offset,
                                int64_t linear, int64_t out_features, float* y) const {
  if (rows == 0) {  // an expert without tokens: TE's GroupedLinear still casts its weight (amax, cache)
    fp8_weight(weight_offset, linear, out_features, in_features, false);
    return;
  }
  const Fp8RowPadding padding = fp8_row_padding(rows);
  uint8_t* x_codes = fp8_row_codes(padding, in_features, out_features);  // (rows, in), padded
  const float* x_scale_inv = fp8_quantize(x, rows * in_features, linear, Fp8Operand::input, x_codes);
  const Fp8Codes w = fp8_weight(weight_offset, linear, out_features, in_features, false);  // (out, in)
  fp8_gemm_rows(padding, out_features, in_features, x_codes, fp8_->type(Fp8Operand::input), x_scale_inv, w,
                fp8_->type(Fp8Operand::weight), y);
}

void PrecisionGemm::fp8_backward_input(const float* dy, int64_t rows, int64_t out_features, int64_t weight_offset,
                                       int64_t linear, int64_t in_features, float* dx) const {
  const Fp8RowPadding padding = fp8_row_padding(rows);
  uint8_t* dy_codes = fp8_row_codes(padding, out_features, in_features);  // (rows, out), padded
  const float* dy_scale_inv = fp8_quantize(dy, rows * out_features, linear, Fp8Operand::output_grad, dy_codes);
  const Fp8Codes w_t = fp8_weight(weight_offset, linear, out_features, in_features, true);  // (in, out)
  fp8_gemm_rows(padding, in_features, out_features, dy_codes, fp8_->type(Fp8Operand::output_grad), dy_scale_inv, w_t,
                fp8_->type(Fp8Operand::weight), dx);
}

void PrecisionGemm::fp8_backward_weight(const float* dy, const float* x, int64_t rows, int64_t out_features,
                                        int64_t in_features, int64_t weight_offset, int64_t linear) const {
  // The GEMM's depth is the rows: an expert's rows are padded with zero codes (FP8's +0) to a
  // multiple of 16 (TE's Fp8Padding), in scratch of their own; the quantize sees the real rows only.
  const int64_t depth = fp8_row_padding(rows).padded;
  uint8_t *dy_codes, *x_codes;
  if (depth == rows) {
    // Each scratch buffer holds rows * widest floats: room for an operand's codes and their transpose.
    dy_codes = byte_scratch(0);
    x_codes = byte_scratch(1);
  } else {
    dy_codes = fp8_->padding_codes(2 * depth * (out_features + in_features));
    x_codes = dy_codes + 2 * depth * out_features;
    ops_.zero(dy_codes, depth * out_features, ops_.default_stream());
    ops_.zero(x_codes, depth * in_features, ops_.default_stream());
  }
  uint8_t* dy_codes_t = dy_codes + depth * out_features;  // (out, depth) of dy_codes (depth, out)
  uint8_t* x_codes_t = x_codes + depth * in_features;     // (in, depth) of x_codes (depth, in)
  const float* dy_scale_inv = fp8_quantize(dy, rows * out_features, linear, Fp8Operand::output_grad, dy_codes);
  ops_.fp8_transpose(dy_codes, depth, out_features, dy_codes_t, ops_.default_stream());
  const float* x_scale_inv = fp8_quantize(x, rows * in_features, linear, Fp8Operand::input, x_codes);
  ops_.fp8_transpose(x_codes, depth, in_features, x_codes_t, ops_.default_stream());
  ops_.gemm_fp8(out_features, in_features, depth, 1.0f, dy_codes_t, fp8_->type(Fp8Operand::output_grad), dy_scale_inv,
                depth, x_codes_t, fp8_->type(Fp8Operand::input), x_scale_inv, depth, 1.0f, grads_ + weight_offset,
                in_features, ops_.default_stream());
}

}  // namespace mt::model
