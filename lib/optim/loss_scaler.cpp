// Loss scaling (see loss_scaler.h).
#include "optim/loss_scaler.h"

#include <algorithm>

namespace mt::optim {

LossScaler LossScaler::dynamic(double initial_scale, double min_scale, int growth_interval, int hysteresis) {
  LossScaler s;
  s.scale_ = initial_scale;
  s.min_scale_ = min_scale;
  s.growth_interval_ = growth_interval;
  s.hysteresis_ = hysteresis;
  s.hysteresis_tracker_ = hysteresis;
  s.dynamic_ = true;
  return s;
}

LossScaler LossScaler::fixed(double scale) {
  LossScaler s;
  s.scale_ = scale;
  return s;
}

void LossScaler::update(bool found_nonfinite) {
  if (!dynamic_) return;
  if (found_nonfinite) {
    growth_tracker_ = 0;
    --hysteresis_tracker_;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5, min_scale_);
    return;
  }
  ++growth_tracker_;
  if (growth_tracker_ == growth_interval_) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = hysteresis_;
    scale_ *= 2.0;
  }
}

void LossScaler::restore(const LossScalerState& state) {
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
  hysteresis_tracker_ = state.hysteresis_tracker;
}

}  // namespace mt::optim
