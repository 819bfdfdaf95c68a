// LayerNorm or RMSNorm over the hidden size (ModelConfig::normalization) on the rows of the
// sequence-parallel region; its weight (and LayerNorm bias) is replicated over TP. Parameters
// "<name>.weight" and, for LayerNorm, "<name>.bias". Tested through the model's finite
// differences (tests/unit/model/test_transformer.cpp).
#pragma once

#include <string>

#include "model/layers/layer_context.h"
#include "model/layout.h"

namespace mt::model {

class Norm {
 public:
  static void declare(ParamDeclarations& declarations, const ModelConfig& config, const std::string& name, int layer);
  Norm(const ModelConfig& config, const ParamLayout& layout, const std::string& name);

  bool has_mean() const { return layernorm_; }  // RMSNorm keeps only rstd
  // y = norm(x); mean (LayerNorm only) and rstd (rows) kept for backward.
  void forward(const LayerContext& ctx, const float* x, float* y, float* mean, float* rstd, int64_t rows) const;
  // dx written; the weight (and bias) grads accumulate.
  void backward(const LayerContext& ctx, const float* dy, const float* x, const float* mean, const float* rstd,
                float* dx, int64_t rows) const;

 private:
  bool layernorm_;
  int cols_;
  float eps_;
  int64_t weight_, bias_;
};

}  // namespace mt::model
