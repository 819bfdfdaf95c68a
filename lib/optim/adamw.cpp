// AdamW, grad norm and clipping (see adamw.h).
#include "optim/adamw.h"

#include <cmath>

#include "kernels/cpu/ops.h"

namespace mt::optim {

AdamW::AdamW(const model::ParamLayout& layout, AdamWConfig config)
    : layout_(layout), config_(config), exp_avg_(layout.total_elements), exp_avg_sq_(layout.total_elements) {}

double AdamW::grad_norm(const float* grads, double grad_scale) const {
  const auto& ops = kernels::cpu::cpu_ops();
  double sum = 0;
  for (const auto& entry : layout_.entries) sum += ops.sum_squares(grads + entry.offset, entry.numel);
  return std::sqrt(sum) * grad_scale;
}

void AdamW::step(float* params, uint16_t* param_bf16, const float* grads, double lr, double grad_scale) {
  ++steps_;
  const auto& ops = kernels::cpu::cpu_ops();
  kernels::cpu::AdamWParams p;
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(config_.beta1);
  p.beta2 = static_cast<float>(config_.beta2);
  p.eps = static_cast<float>(config_.eps);
  p.bias_correction1 = static_cast<float>(1.0 - std::pow(config_.beta1, static_cast<double>(steps_)));
  p.bias_correction2 = static_cast<float>(1.0 - std::pow(config_.beta2, static_cast<double>(steps_)));
  p.grad_scale = static_cast<float>(grad_scale);
  for (const auto& entry : layout_.entries) {
    p.weight_decay = entry.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    ops.adamw_update(params + entry.offset, param_bf16 ? param_bf16 + entry.offset : nullptr, grads + entry.offset,
                     exp_avg_.data() + entry.offset, exp_avg_sq_.data() + entry.offset, entry.numel, p);
  }
}

double clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double factor = max_norm / (grad_norm + 1e-6);
  return factor < 1.0 ? factor : 1.0;
}

}  // namespace mt::optim
