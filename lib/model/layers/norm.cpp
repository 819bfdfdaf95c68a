// LayerNorm / RMSNorm (see norm.h).
#include "model/layers/norm.h"

namespace mt::model {

void Norm::declare(ParamDeclarations& declarations, const ModelConfig& config, const std::string& name, int layer) {
  declarations.add_single(name + ".weight", {config.hidden_size}, TensorSplit::replicated, layer);
  if (config.normalization == Normalization::layernorm) {
    declarations.add_single(name + ".bias", {config.hidden_size}, TensorSplit::replicated, layer);
  }
}

Norm::Norm(const ModelConfig& config, const ParamLayout& layout, const std::string& name)
    : layernorm_(config.normalization == Normalization::layernorm),
      cols_(config.hidden_size),
      eps_(config.norm_epsilon),
      weight_(param_offset(layout, name + ".weight")),
      bias_(optional_param_offset(layout, name + ".bias")) {}

void Norm::forward(const LayerContext& ctx, const float* x, float* y, float* mean, float* rstd, int64_t rows) const {
  if (layernorm_) {
    ctx.ops.layernorm_forward(x, ctx.params + weight_, bias_ >= 0 ? ctx.params + bias_ : nullptr, y, mean, rstd, rows,
                              cols_, eps_, ctx.stream);
  } else {
    ctx.ops.rmsnorm_forward(x, ctx.params + weight_, y, rstd, rows, cols_, eps_, ctx.stream);
  }
}

void Norm::backward(const LayerContext& ctx, const float* dy, const float* x, const float* mean, const float* rstd,
                    float* dx, int64_t rows) const {
  if (layernorm_) {
    ctx.ops.layernorm_backward(dy, x, ctx.params + weight_, mean, rstd, dx, ctx.grads + weight_,
                               bias_ >= 0 ? ctx.grads + bias_ : nullptr, rows, cols_, ctx.stream);
  } else {
    ctx.ops.rmsnorm_backward(dy, x, ctx.params + weight_, rstd, dx, ctx.grads + weight_, rows, cols_, ctx.stream);
  }
}

}  // namespace mt::model
