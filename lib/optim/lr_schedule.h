// Megatron's learning-rate schedule (OptimizerParamScheduler), counted in samples: linear warm-up
// from 0, then constant, linear or cosine decay to min_lr. The LR of iteration i (1-based) is
// lr_at(samples consumed before it), so iteration 1 runs at 0 during warm-up, as in Megatron.
// Tested in tests/unit/optim/test_optim.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace mt::optim {

enum class LrDecayStyle { constant, linear, cosine };

LrDecayStyle parse_decay_style(const std::string& name);  // throws mt::UsageError

struct LrSchedule {
  double max_lr = 0;
  double min_lr = 0;
  int64_t warmup_samples = 0;
  int64_t decay_samples = 1;
  LrDecayStyle style = LrDecayStyle::linear;

  double lr_at(int64_t consumed_samples) const;
};

}  // namespace mt::optim
