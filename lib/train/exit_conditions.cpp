// Megatron's --exit-interval and --exit-duration-in-mins (see exit_conditions.h).
#include "train/exit_conditions.h"

#include "core/error.h"

namespace mt::train {

StopReason exit_reason(const ExitConditions& exit, int64_t iteration, int64_t last_iteration,
                       std::chrono::steady_clock::time_point now) {
  if (exit.interval < 0) throw UsageError("--exit-interval", "must be at least 1");
  if (!(exit.duration_minutes >= 0)) throw UsageError("--exit-duration-in-mins", "must be positive");
  if (iteration >= last_iteration) return StopReason::none;
  // Megatron checks the duration first: train_time > exit_duration_in_mins.
  const double minutes = std::chrono::duration<double, std::ratio<60>>(now - exit.started).count();
  if (exit.duration_minutes > 0 && minutes > exit.duration_minutes) return StopReason::exit_duration;
  if (exit.interval > 0 && iteration % exit.interval == 0) return StopReason::exit_interval;
  return StopReason::none;
}

std::string stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::exit_interval: return "--exit-interval";
    case StopReason::exit_duration: return "--exit-duration-in-mins";
    case StopReason::signal: return "signal";
    case StopReason::none: break;
  }
  return "";
}

}  // namespace mt::train
