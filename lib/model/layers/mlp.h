// The dense MLP (Megatron's MLP), the MlpKind::dense variant: a column-parallel fc1 (GELU:
// linear_fc1; SwiGLU: separate global linear_fc1_gate and linear_fc1_up, adjacent locally so fc1
// is one GEMM whose output rows are [gate | up] of this rank's ffn columns), the activation (GELU:
// fused into fc1's GEMM as its epilogue with the bias, Ops::gemm_bias_gelu), and a row-parallel
// fc2, at the ffn width of its MlpSpec (layers may differ). Init: fc1 N(0, init_method_std), fc2
// N(0, init_method_std / sqrt(2 num_layers)), biases 0. Tested through
// the model's finite differences, the PyTorch goldens, the TP = 2 stage test and the mixed-width
// chunk of tests/unit/model/test_spec.cpp.
#pragma once

#include <string>

#include "model/layers/decoder_layer.h"
#include "model/spec.h"

namespace mt::model {

class Mlp : public MlpVariant {
 public:
  // `prefix`: its tensors' names after "decoder.layers.<i>." (a MoE layer's shared experts are
  // "mlp.shared_experts.").
  Mlp(const ModelConfig& config, const MlpSpec& spec, int layer, std::string prefix = "mlp.");

  void declare(ParamDeclarations& declarations) const override;
  void bind(const ParamLayout& layout) override;

  int64_t ffn() const { return fc2_.in_features(); }  // local
  int64_t fc1_width() const { return fc1_.out_features(); }

  std::unique_ptr<BlockBuffers> lay_out_saved(BufferSource& source, const ActivationRows& rows) const override;
  std::unique_ptr<BlockBuffers> lay_out_workspace(BufferSource& source, const ActivationRows& rows) const override;
  int64_t widest_gemm_operand() const override;

  // out_seq (sequence rows, hidden) = fc2(act(fc1(x_seq))) + bias, before dropout.
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, BlockBuffers& saved,
               BlockBuffers& workspace, const SequenceParallelBuffers& full_rows, float* out_seq) const override;
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                BlockBuffers& saved, BlockBuffers& workspace, const SequenceParallelBuffers& full_rows,
                float* dx_seq) const override;

 private:
  struct Saved;
  struct Workspace;

  std::string name(const char* tensor) const;

  int layer_;
  std::string prefix_;
  int64_t hidden_, ffn_hidden_size_;  // global widths
  bool swiglu_, bias_;
  double init_std_;
  int num_layers_;  // fc2's init scale
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
};

}  // namespace mt::model
