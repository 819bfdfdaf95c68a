// LayerNorm / RMSNorm (see norm.h).
#include "model/layers/norm.h"

#include <utility>

namespace mt::model {

Norm::Norm(const ModelConfig& config, std::string name, int layer)
    : name_(std::move(name)),
      layer_(layer),
      layernorm_(config.normalization == Normalization::layernorm),
      cols_(config.hidden_size),
      eps_(config.norm_epsilon) {}

void Norm::declare(ParamDeclarations& declarations) const {
  declarations.add_single({name_ + ".weight", {cols_}, TensorSplit::replicated, layer_, Init::constant(1.0f)});
  if (layernorm_) {
    declarations.add_single({name_ + ".bias", {cols_}, TensorSplit::replicated, layer_, Init::constant(0.0f)});
  }
}

void Norm::bind(const ParamLayout& layout) {
  weight_ = param_offset(layout, name_ + ".weight");
  bias_ = optional_param_offset(layout, name_ + ".bias");
}

Norm::Statistics Norm::lay_out_statistics(BufferSource& source, int64_t rows) const {
  Statistics statistics;
  if (layernorm_) statistics.mean = source.take(rows);
  statistics.rstd = source.take(rows);
  return statistics;
}

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
