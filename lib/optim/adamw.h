// AdamW over the flat fp32 buffers of a layout: one fused pass per tensor (kernels' adamw_update),
// weight decay by the layout's no-decay set, plus the global grad norm and Megatron's clipping.
// Tested in tests/unit/optim/test_optim.cpp.
#pragma once

#include <cstdint>

#include "core/buffer.h"
#include "model/layout.h"

namespace mt::optim {

struct AdamWConfig {
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

class AdamW {
 public:
  AdamW(const model::ParamLayout& layout, AdamWConfig config);

  // L2 norm of the grads over the layout's tensors (fp64 accumulation), after multiplying by
  // grad_scale (1/loss scale). Non-finite when any grad is.
  double grad_norm(const float* grads, double grad_scale) const;
  // One step: grads are multiplied by grad_scale (unscaling and clipping folded in) and the
  // step counter advances. param_bf16 (nullable) receives the refreshed bf16 copy.
  void step(float* params, uint16_t* param_bf16, const float* grads, double lr, double grad_scale);

  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  float* exp_avg() { return exp_avg_.data(); }
  float* exp_avg_sq() { return exp_avg_sq_.data(); }
  int64_t state_bytes() const { return 2 * exp_avg_.size() * static_cast<int64_t>(sizeof(float)); }

 private:
  const model::ParamLayout& layout_;
  AdamWConfig config_;
  Buffer<float> exp_avg_;
  Buffer<float> exp_avg_sq_;
  int64_t steps_ = 0;
};

// Megatron's clip factor: min(1, max_norm / (norm + 1e-6)); 1 when clipping is off (max_norm 0).
double clip_factor(double grad_norm, double max_norm);

}  // namespace mt::optim
