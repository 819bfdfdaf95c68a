// Megatron's dynamic loss scaler for fp16 (DynamicGradScaler): start at initial_scale; an
// overflow (non-finite grads) skips the step and, after `hysteresis` overflows, halves the scale
// (not below min_scale); `growth_interval` clean steps in a row double it. A static scaler keeps
// one scale. Its state (scale and the two trackers) is what a checkpoint keeps to resume exactly.
// Tested in tests/unit/optim/test_optim.cpp.
#pragma once

namespace mt::optim {

// What changes as training runs; a checkpoint stores it (io/checkpoint.h).
struct LossScalerState {
  double scale = 1.0;
  int growth_tracker = 0;      // clean steps in a row
  int hysteresis_tracker = 0;  // overflows left before the scale halves
};

class LossScaler {
 public:
  static LossScaler dynamic(double initial_scale = 4294967296.0, double min_scale = 1.0, int growth_interval = 1000,
                            int hysteresis = 2);
  static LossScaler fixed(double scale);

  double scale() const { return scale_; }
  // Whether an overflow can no longer lower the scale (static, or dynamic at its floor).
  bool at_minimum() const { return !dynamic_ || scale_ <= min_scale_; }
  // Records the outcome of a step: found_nonfinite means the step is skipped.
  void update(bool found_nonfinite);

  LossScalerState state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  // Continues from a saved state (the configuration stays this scaler's).
  void restore(const LossScalerState& state);

 private:
  double scale_ = 1.0;
  double min_scale_ = 1.0;
  int growth_interval_ = 1000;
  int hysteresis_ = 2;
  int growth_tracker_ = 0;
  int hysteresis_tracker_ = 2;
  bool dynamic_ = false;
};

}  // namespace mt::optim
