// The pre-norm decoder layer (Megatron's TransformerLayer; NormPlacement::pre_norm):
//   x_mid = x_in + dropout(attention(input_layernorm(x_in)))
//   x_out = x_mid + dropout(mlp(pre_mlp_layernorm(x_mid)))
// on the rows of the sequence-parallel region, over any attention and MLP variant (their
// collectives placed by their linears). Its saved set holds the norms' outputs and statistics,
// x_mid and the variants' own saved sets. Tested through the model's finite differences,
// recompute equivalence and the PyTorch goldens (tests/unit/model/test_model_gradients.cpp,
// tests/golden/).
#pragma once

#include <memory>

#include "model/layers/decoder_layer.h"
#include "model/layers/norm.h"

namespace mt::model {

class PreNormLayer : public DecoderLayer {
 public:
  PreNormLayer(const ModelConfig& config, int layer, std::unique_ptr<AttentionVariant> attention,
               std::unique_ptr<MlpVariant> mlp);

  void declare(ParamDeclarations& declarations) const override;
  void bind(const ParamLayout& layout) override;

  std::unique_ptr<BlockBuffers> lay_out_saved(BufferSource& source, const ActivationRows& rows,
                                              bool keep_core) const override;
  std::unique_ptr<BlockBuffers> lay_out_workspace(BufferSource& source, const ActivationRows& rows,
                                                  bool rebuild_core) const override;
  int64_t widest_gemm_operand() const override;
  std::optional<kernels::AttentionShape> attention_core_shape(int batch, int seq) const override;

  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_in, float* x_out, BlockBuffers& saved,
               BlockBuffers& workspace, const LayerTemporaries& temporaries) const override;
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* x_in, const float* d_out, float* d_in,
                BlockBuffers& saved, BlockBuffers& workspace, const LayerTemporaries& temporaries) const override;

 private:
  struct Saved;
  struct Workspace;
  kernels::DropoutKey dropout_key(const LayerContext& ctx, const LayerPass& pass, const char* site) const;

  int64_t hidden_;
  float hidden_dropout_;
  Norm norm1_;
  std::unique_ptr<AttentionVariant> attention_;
  Norm norm2_;
  std::unique_ptr<MlpVariant> mlp_;
};

}  // namespace mt::model
