// Recompute plans (see recompute.h).
#include "model/recompute.h"

#include <algorithm>

namespace mt::model {

bool RecomputePlan::any_recomputed() const {
  return std::any_of(recomputed.begin(), recomputed.end(), [](bool r) { return r; });
}

RecomputePlan plan_recompute(const RecomputeConfig& config, int layers) {
  RecomputePlan plan;
  plan.recomputed.assign(static_cast<size_t>(layers), false);
  plan.group_start.resize(static_cast<size_t>(layers));
  for (int i = 0; i < layers; ++i) plan.group_start[static_cast<size_t>(i)] = i;
  plan.selective = config.granularity == RecomputeGranularity::selective;
  if (config.granularity != RecomputeGranularity::full) return plan;
  const int k = std::max(1, config.num_layers);
  if (config.method == RecomputeMethod::uniform) {
    plan.group_length = k;
    for (int i = 0; i < layers; ++i) {
      plan.recomputed[static_cast<size_t>(i)] = true;
      plan.group_start[static_cast<size_t>(i)] = i / k * k;
    }
  } else {
    for (int i = 0; i < std::min(k, layers); ++i) plan.recomputed[static_cast<size_t>(i)] = true;
  }
  return plan;
}

}  // namespace mt::model
