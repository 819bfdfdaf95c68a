// LayerNorm or RMSNorm over the hidden size (ModelConfig::normalization) on the rows of the
// sequence-parallel region; its weight (and LayerNorm bias) is replicated over TP. Parameters
// "<name>.weight" (init 1) and, for LayerNorm, "<name>.bias" (init 0). Tested through the model's
// finite differences (tests/unit/model/test_model_gradients.cpp).
#pragma once

#include <string>

#include "model/layers/block.h"
#include "model/layers/layer_context.h"
#include "model/layout.h"

namespace mt::model {

class Norm {
 public:
  Norm(const ModelConfig& config, std::string name, int layer);

  void declare(ParamDeclarations& declarations) const;
  void bind(const ParamLayout& layout);

  bool has_mean() const { return layernorm_; }  // RMSNorm keeps only rstd
  // y = norm(x); mean (LayerNorm only) and rstd (rows) kept for backward.
  void forward(const LayerContext& ctx, const float* x, float* y, float* mean, float* rstd, int64_t rows) const;
  // dx written; the weight (and bias) grads accumulate.
  void backward(const LayerContext& ctx, const float* dy, const float* x, const float* mean, const float* rstd,
                float* dx, int64_t rows) const;

  // What forward keeps for backward over `rows` rows: the mean (LayerNorm only) and rstd.
  struct Statistics {
    float* mean = nullptr;  // (rows)
    float* rstd = nullptr;  // (rows)
  };
  Statistics lay_out_statistics(BufferSource& source, int64_t rows) const;

 private:
  std::string name_;
  int layer_;
  bool layernorm_;
  int cols_;
  float eps_;
  int64_t weight_ = -1, bias_ = -1;
};

}  // namespace mt::model
