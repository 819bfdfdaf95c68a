// The MLP (Megatron's MLP): a column-parallel fc1 (GELU: linear_fc1; SwiGLU: separate global
// linear_fc1_gate and linear_fc1_up, adjacent locally so fc1 is one GEMM whose output rows are
// [gate | up] of this rank's ffn columns), the activation, and a row-parallel fc2. Tested through
// the model's finite differences, the PyTorch goldens and the TP = 2 stage test.
#pragma once

#include "model/layers/layer_context.h"
#include "model/layers/linear.h"

namespace mt::model {

class Mlp {
 public:
  struct Saved {
    float* fc1 = nullptr;  // (rows, fc1_width): pre-activation
    float* act = nullptr;  // (rows, ffn)
  };
  struct Buffers {
    SequenceParallelBuffers sequence_parallel;
    float* d_act = nullptr;     // (rows, ffn)
    float* d_fc1 = nullptr;     // (rows, fc1_width)
  };

  static void declare(ParamDeclarations& declarations, const ModelConfig& config, int layer);
  Mlp(const ModelConfig& config, const ParamLayout& layout, int layer);

  int64_t ffn() const { return fc2_.in_features(); }  // local
  int64_t fc1_width() const { return fc1_.out_features(); }

  // out_seq (sequence rows, hidden) = fc2(act(fc1(x_seq))) + bias, before dropout.
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, const Saved& saved,
               const Buffers& buffers, float* out_seq) const;
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                const Saved& saved, const Buffers& buffers, float* dx_seq) const;

 private:
  bool swiglu_;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
};

}  // namespace mt::model
