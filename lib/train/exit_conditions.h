// Megatron's planned stops, --exit-interval N and --exit-duration-in-mins M (megatron/training/
// training.py): after an iteration (after its evaluation and its --save-interval save), the run
// stops when the iteration is a multiple of N, or when more than M minutes have passed since the
// process started; the ranks agree (the duration by a max over the world, as Megatron's
// all_reduce of its done flag), so all stop after the same iteration. The run's last iteration
// is never such a stop: the run ends there anyway. The tool saves (--save) and chooses the exit
// code. Tested in tests/unit/train/test_exit_conditions.cpp and tests/tools/mt-train-plan.bats.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mt::train {

// Why a run stopped before its last iteration. Ordered so that the largest of the ranks' reasons
// is the agreed one: the duration (one rank's clock) over the interval (the same on every rank).
enum class StopReason : int { none = 0, exit_interval = 1, exit_duration = 2, signal = 3 };

struct ExitConditions {
  int64_t interval = 0;          // --exit-interval: stop after an iteration divisible by it (0: never)
  double duration_minutes = 0;   // --exit-duration-in-mins: stop once this much time has passed (0: never)
  std::chrono::steady_clock::time_point started;  // what the duration counts from: the process start

  bool any() const { return interval > 0 || duration_minutes > 0; }
  // Whether the decision needs the ranks' agreement (a clock differs between ranks; iterations do not).
  bool needs_agreement() const { return duration_minutes > 0; }
};

// This rank's reason to stop after `iteration` of `last_iteration`, the iteration ending at `now`
// (none at the last iteration). Throws mt::UsageError for a negative interval or duration.
StopReason exit_reason(const ExitConditions& exit, int64_t iteration, int64_t last_iteration,
                       std::chrono::steady_clock::time_point now);

// The flag that asked for the stop ("--exit-interval", "--exit-duration-in-mins"), "signal" or "".
std::string stop_reason_name(StopReason reason);

}  // namespace mt::train
