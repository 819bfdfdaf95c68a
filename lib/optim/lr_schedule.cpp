// Megatron's learning-rate schedule (see lr_schedule.h).
#include "optim/lr_schedule.h"

#include <cmath>

#include "core/error.h"

namespace mt::optim {

LrDecayStyle parse_decay_style(const std::string& name) {
  if (name == "constant") return LrDecayStyle::constant;
  if (name == "linear") return LrDecayStyle::linear;
  if (name == "cosine") return LrDecayStyle::cosine;
  throw UsageError("--lr-decay-style " + name, "unknown style (constant, linear, cosine)");
}

double LrSchedule::lr_at(int64_t n) const {
  if (warmup_samples > 0 && n <= warmup_samples) {
    return max_lr * static_cast<double>(n) / static_cast<double>(warmup_samples);
  }
  if (style == LrDecayStyle::constant) return max_lr;
  if (n > decay_samples) return min_lr;
  const double ratio = static_cast<double>(n - warmup_samples) / static_cast<double>(decay_samples - warmup_samples);
  const double coeff = style == LrDecayStyle::linear ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace mt::optim
