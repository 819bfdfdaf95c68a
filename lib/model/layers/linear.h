// Megatron's tensor-parallel linears (megatron-facts.md sec. 5) on the flat buffers: the weight
// (out, in) and optional bias of a layer, or of a fused group of adjacent tensors (q/k/v,
// SwiGLU gate/up) taken as one, at this rank's local widths.
//   ColumnParallelLinear: output features split over TP. Input enters through
//     gather_from_sequence_parallel_region (SP) or copy_to_tensor_parallel_region; the output
//     stays split (Megatron's gather_output=False).
//   RowParallelLinear: input features split over TP. The partial products leave through
//     reduce_scatter_to_sequence_parallel_region (SP) or reduce_from_tensor_parallel_region;
//     the bias is added after the reduction (so it stays a separate bias_add, never the GEMM's
//     epilogue: the GEMM makes partial sums).
// Backward accumulates dW (and db) and writes the input grad. Tested through the model's finite
// differences and the TP = 2 stage test (tests/unit/model/test_stage.cpp).
#pragma once

#include <cstdint>

#include "model/layers/layer_context.h"

namespace mt::model {

// Full-row (rows, hidden) scratch of the sequence-parallel regions, shared by the linears of a
// stage; unused (null) without sequence parallelism.
struct SequenceParallelBuffers {
  float* gathered = nullptr;  // gathered inputs of column-parallel layers, gathered grads of row-parallel ones
  float* partial = nullptr;   // partial sums of row-parallel layers before their reduce-scatter
  float* d_full = nullptr;    // input grads of column-parallel layers before their reduce-scatter
};

struct LinearParams {
  int64_t weight = -1;  // offset of the (first) weight in the flat buffers
  int64_t bias = -1;    // offset of the (first) bias, -1 without
  int64_t in_features = 0;   // local
  int64_t out_features = 0;  // local
};

class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;  // unbound (no weight yet)
  explicit ColumnParallelLinear(LinearParams params) : p_(params) {}
  int64_t out_features() const { return p_.out_features; }
  int64_t in_features() const { return p_.in_features; }

  // y (rows, out) = x W^T + b for x_seq (sequence rows, in): the bias in the GEMM's epilogue
  // (Ops::gemm_bias), as it is added right after the local product.
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq,
               const SequenceParallelBuffers& buffers, float* y) const;
  // pre (rows, out) = x W^T + b, y (rows, out) = gelu(pre) (tanh GELU): one fused GEMM
  // (Ops::gemm_bias_gelu), pre kept for gelu_backward.
  void forward_gelu(const LayerContext& ctx, const LayerPass& pass, const float* x_seq,
                    const SequenceParallelBuffers& buffers, float* pre, float* y) const;
  // dy (rows, out): dW += dy^T x, db += sum dy, dx_seq (sequence rows, in) = the input grad,
  // summed over TP. Under SP the input is gathered again (Megatron keeps only the shard).
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy, const float* x_seq,
                const SequenceParallelBuffers& buffers, float* dx_seq) const;

 private:
  // The full input rows: gathered under SP, else x_seq itself.
  const float* full_input(const LayerContext& ctx, const LayerPass& pass, const float* x_seq,
                          const SequenceParallelBuffers& buffers) const;

  LinearParams p_;
};

class RowParallelLinear {
 public:
  RowParallelLinear() = default;  // unbound (no weight yet)
  explicit RowParallelLinear(LinearParams params) : p_(params) {}
  int64_t out_features() const { return p_.out_features; }
  int64_t in_features() const { return p_.in_features; }

  // y_seq (sequence rows, out) = reduce(x W^T) + b for x (rows, in).
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x, const SequenceParallelBuffers& buffers,
               float* y_seq) const;
  // dy_seq (sequence rows, out): dW += dy^T x, db += sum dy_seq, dx (rows, in) written.
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x,
                const SequenceParallelBuffers& buffers, float* dx) const;

 private:
  LinearParams p_;
};

}  // namespace mt::model
