// Megatron's tensor-parallel linears (megatron-facts.md sec. 5) on the flat buffers: the weight
// (out, in) and optional bias of a layer, or of a fused group of adjacent tensors (q/k/v,
// SwiGLU gate/up) taken as one, at this rank's local widths.
//   ColumnParallelLinear: output features split over TP. Input enters through
//     gather_from_sequence_parallel_region (SP) or copy_to_tensor_parallel_region; the output
//     stays split (Megatron's gather_output=False).
//   RowParallelLinear: input features split over TP. The partial products leave through
//     reduce_scatter_to_sequence_parallel_region (SP) or reduce_from_tensor_parallel_region;
//     the bias is added after the reduction.
// Backward accumulates dW (and db) and writes the input grad. Tested through the model's finite
// differences and the TP = 2 stage test (tests/unit/model/test_stage.cpp).
#pragma once

#include <cstdint>

#include "model/layers/layer_context.h"

namespace mt::model {

struct LinearParams {
  int64_t weight = -1;  // offset of the (first) weight in the flat buffers
  int64_t bias = -1;    // offset of the (first) bias, -1 without
  int64_t in_features = 0;   // local
  int64_t out_features = 0;  // local
};

class ColumnParallelLinear {
 public:
  explicit ColumnParallelLinear(LinearParams params) : p_(params) {}
  int64_t out_features() const { return p_.out_features; }
  int64_t in_features() const { return p_.in_features; }

  // y (rows, out) = x W^T + b for x_seq (sequence rows, in); gather_buffer (rows, in) takes the
  // gathered input under SP.
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, float* gather_buffer,
               float* y) const;
  // dy (rows, out): dW += dy^T x, db += sum dy, dx_seq (sequence rows, in) = the input grad,
  // summed over TP. Under SP the input is gathered again into gather_buffer and the full input
  // grad goes through dx_full_buffer (rows, in).
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy, const float* x_seq,
                float* gather_buffer, float* dx_full_buffer, float* dx_seq) const;

 private:
  LinearParams p_;
};

class RowParallelLinear {
 public:
  explicit RowParallelLinear(LinearParams params) : p_(params) {}
  int64_t out_features() const { return p_.out_features; }
  int64_t in_features() const { return p_.in_features; }

  // y_seq (sequence rows, out) = reduce(x W^T) + b for x (rows, in); under SP the partial
  // products go through partial_buffer (rows, out).
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x, float* partial_buffer,
               float* y_seq) const;
  // dy_seq (sequence rows, out): dW += dy^T x, db += sum dy_seq, dx (rows, in) written. Under SP
  // the grad rows are gathered into gather_buffer (rows, out) first.
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x,
                float* gather_buffer, float* dx) const;

 private:
  LinearParams p_;
};

}  // namespace mt::model
