// GEMMs in the run's precision (core/dtype.h) through the backend op table. The fp32 master
// weights stay the parameters; GemmWeights keeps the copy a precision multiplies with (nothing in
// fp32; bf16 bits where the backend's GEMM takes bf16; else fp32 values rounded through bf16 or
// fp16), one per rank over its whole flat buffer. PrecisionGemm runs a layer's linear products,
// converting activations into one of two operand buffers the same way. Tested through
// tests/unit/model/test_model_gradients.cpp (bf16 stays near fp32) and tests/unit/train/test_golden.cpp;
// FP8 in tests/unit/model/test_fp8_gemm.cpp, its MoE row padding in test_fp8_experts.cpp.
#pragma once

#include <cstdint>

#include "backend/memory.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "model/fp8_scaling.h"

namespace mt::model {

class GemmWeights {
 public:
  GemmWeights(const backend::Ops& ops, Precision precision, int64_t elements, backend::MemoryLedger* ledger = nullptr);

  // Bytes the copy of `elements` weights takes in `precision` on `ops`' backend.
  static int64_t bytes(const backend::Ops& ops, Precision precision, int64_t elements);

  Precision precision() const { return precision_; }
  DType operand_type() const { return operand_type_; }
  // Re-derives the copy from the master weights; call after every parameter change. The ranged
  // form re-derives elements [begin, end) only (a bucket whose parameters just arrived).
  void refresh(const float* params);
  void refresh(const float* params, int64_t begin, int64_t end);
  // The bf16 bits a fused optimizer pass may refresh directly (kernels' adamw_update), or
  // nullptr when the copy is not bf16 bits (then call refresh after the step).
  uint16_t* bf16_bits();
  // The GEMM operand of the weights at `offset` of the flat buffer.
  const void* operand(const float* params, int64_t offset) const;

 private:
  const backend::Ops& ops_;
  Precision precision_;
  DType operand_type_;
  int64_t elements_;
  backend::DeviceBuffer<uint16_t> bits_;     // bf16 / fp16 bits
  backend::DeviceBuffer<float> rounded_;     // fp32 rounded through bf16 / fp16
};

// The element type activations are rounded through for a precision (bf16, f16; f32 for fp32).
DType precision_dtype(Precision precision);

// TE's Fp8Padding of one MoE expert's rows for its FP8 GEMMs (PrecisionGemm::set_fp8_rows_padded):
// cuBLASLt's FP8 GEMMs take rows in multiples of 16 only. Zero rows change no output row, gradient
// or amax, so a GEMM whose M is the rows (the forward, the data gradient) multiplies the `body`
// rows in whole 16-row blocks straight into its output and the `tail` rows (rows % 16) as one
// 16-row block whose codes past them are zero, into a 16-row fp32 scratch whose first `tail` rows
// are copied out; a GEMM whose depth is the rows (the weight gradient) takes all `padded` rows, the
// padding as zero codes. Host arithmetic only: the device sees sizes and offsets.
struct Fp8RowPadding {
  static constexpr int64_t kBlock = 16;     // cuBLASLt's FP8 multiple
  static constexpr int64_t kAlign = 256;    // the tail's fp32 block within the scratch
  int64_t rows = 0;
  int64_t body = 0;    // rows / 16 * 16
  int64_t padded = 0;  // rows rounded up to a multiple of 16
  int64_t tail() const { return rows - body; }
  // The padding scratch of an operand (padded, k) of codes followed by the tail's output (16, n)
  // fp32 at tail_output_offset(k) bytes: the bytes it takes.
  int64_t tail_output_offset(int64_t k) const { return (padded * k + kAlign - 1) / kAlign * kAlign; }
  int64_t scratch_bytes(int64_t k, int64_t n) const {
    return tail_output_offset(k) + kBlock * n * static_cast<int64_t>(sizeof(float));
  }
};
Fp8RowPadding fp8_row_padding(int64_t rows);

class PrecisionGemm {
 public:
  PrecisionGemm(const backend::Ops& ops, const GemmWeights& weights) : ops_(ops), weights_(weights) {}
  // The weight copy it multiplies with (the MoE experts' grouped GEMMs read it too).
  const GemmWeights& weights() const { return weights_; }

  void bind(const float* params, float* grads) {
    params_ = params;
    grads_ = grads;
  }
  // Two scratch buffers of at least rows * widest elements (unused in fp32).
  void set_operand_buffers(float* first, float* second) {
    operands_[0] = first;
    operands_[1] = second;
  }
  // Elements of operand scratch a precision needs per buffer for products of `elements`.
  static int64_t operand_elements(Precision precision, int64_t elements) {
    return precision == Precision::fp32 ? 0 : elements;
  }

  // FP8 mode: the linears `fp8` covers run FP8 GEMMs with the scales its phase gives and feed its
  // amaxes (null: off);
  // their weight-gradient GEMMs too unless its config says --no-fp8-wgrad. Needs the operand
  // buffers (a precision other than fp32).
  void set_fp8(Fp8Scaling* fp8) { fp8_ = fp8; }
  Fp8Scaling* fp8() const { return fp8_; }
  // The MoE experts' FP8 GEMMs (TE's Fp8Padding before GroupedLinear): each expert's rows are
  // padded with zero rows to a multiple of 16 (Fp8RowPadding, in Fp8Scaling::padding_codes), so
  // their count need not be one and every FP8 GEMM takes rows in multiples of 16, as cuBLASLt
  // needs; the same calls run on every backend. Zero rows add nothing to an amax (a max of |x|)
  // and give zero output rows that Fp8Unpadding drops. tests/unit/model/test_fp8_experts.cpp holds
  // the numbers equal to those of rows padded by the caller and checks every GEMM's shape.
  void set_fp8_rows_padded(bool padded) { fp8_rows_padded_ = padded; }

  // y (rows, out) = x (rows, in) . W^T, W (out, in) at `weight_offset`. An FP8 linear with 0 rows
  // (an expert no token reached) only quantizes its weight, recording its amax as TE does.
  void linear_forward(const float* x, int64_t rows, int64_t in_features, int64_t weight_offset, int64_t out_features,
                      float* y) const;
  // y (rows, out) = x (rows, in) . W^T + bias (out), one fused entry (Ops::gemm_bias); an FP8
  // linear runs its FP8 GEMM, then bias_add.
  void linear_forward_bias(const float* x, int64_t rows, int64_t in_features, int64_t weight_offset,
                           int64_t out_features, const float* bias, float* y) const;
  // pre (rows, out) = x . W^T + bias (null: none), y (rows, out) = gelu(pre), one fused entry
  // (Ops::gemm_bias_gelu); an FP8 linear runs its FP8 GEMM, then bias_add and gelu_forward.
  void linear_forward_bias_gelu(const float* x, int64_t rows, int64_t in_features, int64_t weight_offset,
                                int64_t out_features, const float* bias, float* pre, float* y) const;
  // dx (rows, in) = dy (rows, out) . W
  void linear_backward_input(const float* dy, int64_t rows, int64_t out_features, int64_t weight_offset,
                             int64_t in_features, float* dx) const;
  // dW (out, in) += dy^T . x, into the grads at `weight_offset`.
  void linear_backward_weight(const float* dy, const float* x, int64_t rows, int64_t out_features,
                              int64_t in_features, int64_t weight_offset) const;

 private:
  const void* activation_operand(const float* x, int64_t count, int slot) const;
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b,
            int64_t ldb, float beta, float* c, int64_t ldc) const;

  // FP8 mode (see the header comment): the FP8 linear at `weight_offset`, or -1.
  int64_t fp8_linear(int64_t weight_offset, int64_t rows, int64_t in_features, int64_t out_features) const;
  const float* fp8_quantize(const float* x, int64_t count, int64_t linear, Fp8Operand operand, uint8_t* codes) const;
  uint8_t* byte_scratch(int slot) const { return reinterpret_cast<uint8_t*>(operands_[slot]); }
  struct Fp8Codes {
    const uint8_t* codes = nullptr;
    const float* scale_inv = nullptr;
  };
  // W's codes (out, in) in the weight scratch, and with `transposed` their transpose (in, out).
  Fp8Codes fp8_weight(int64_t weight_offset, int64_t linear, int64_t out_features, int64_t in_features,
                            bool transposed) const;
  // The codes scratch of an operand of `rows` rows of `cols` (padded rows with zero codes past
  // `rows` when set_fp8_rows_padded asks for padding).
  uint8_t* fp8_row_codes(const Fp8RowPadding& padding, int64_t cols, int64_t n) const;
  // c (rows, n) = scaled a (rows, k) . b (n, k)^T, a's codes in fp8_row_codes's scratch.
  void fp8_gemm_rows(const Fp8RowPadding& padding, int64_t n, int64_t k, uint8_t* a, kernels::Fp8Type a_type,
                     const float* a_scale_inv, const Fp8Codes& b, kernels::Fp8Type b_type, float* c) const;
  void fp8_forward(const float* x, int64_t rows, int64_t in_features, int64_t weight_offset, int64_t linear,
                   int64_t out_features, float* y) const;
  void fp8_backward_input(const float* dy, int64_t rows, int64_t out_features, int64_t weight_offset, int64_t linear,
                          int64_t in_features, float* dx) const;
  void fp8_backward_weight(const float* dy, const float* x, int64_t rows, int64_t out_features, int64_t in_features,
                           int64_t weight_offset, int64_t linear) const;

  const backend::Ops& ops_;
  const GemmWeights& weights_;
  Fp8Scaling* fp8_ = nullptr;
  bool fp8_rows_padded_ = false;
  const float* params_ = nullptr;
  float* grads_ = nullptr;
  float* operands_[2] = {nullptr, nullptr};
};

}  // namespace mt::model
