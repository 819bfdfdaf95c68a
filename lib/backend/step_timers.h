// Megatron's timers of a training step (megatron/core/timers.py with the names its training loop
// logs, in its order), measured with events on a backend stream (backend/stream_timer.h): a timer
// brackets work issued on the stream, so it measures when that work ran on the device and adds no
// host wait; its value is read once the stream has passed its last stop (the step's end).
// - Levels as Megatron's --timing-log-level: a timer of level L runs when the level is at least L;
//   at level 0 every call is free (no event is recorded).
// - A timer may start and stop several times within a step (forward-compute once per pass): its
//   value is the sum; reset() clears every timer for the next step. Starting a running timer or
//   stopping a stopped one is a logic error (std::logic_error), as Megatron's assertions.
// - Megatron's barrier_with_L1_time: the barrier given (a host barrier over the world) runs before
//   each level-1 timer starts, so every rank's level-1 timers start together.
// The trainer (train/trainer.h) owns one; the pipeline engine and the distributed optimizer start
// and stop the timers of their parts of the step through a pointer (null: not timed).
// Tested in tests/unit/train/test_trainer_timers.cpp and, over ranks, tests/mpi/test_data_parallel.cpp.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "backend/ops.h"

namespace mt::backend {

// Megatron's timer names (training.py's timers_to_log), in that order.
enum class StepTimer {
  forward_backward,
  forward_compute,
  backward_compute,
  batch_generator,
  forward_recv,
  forward_send,
  backward_recv,
  backward_send,
  forward_send_forward_recv,
  forward_send_backward_recv,
  backward_send_forward_recv,
  backward_send_backward_recv,
  forward_backward_send_forward_backward_recv,
  layernorm_grads_all_reduce,
  embedding_grads_all_reduce,
  all_grads_sync,
  params_all_gather,
  optimizer_copy_to_main_grad,
  optimizer_unscale_and_check_inf,
  optimizer_clip_main_grad,
  optimizer_count_zeros,
  optimizer_inner_step,
  optimizer_copy_main_to_model_params,
  optimizer,
};
inline constexpr int kStepTimers = static_cast<int>(StepTimer::optimizer) + 1;
// "forward-backward", ...
const char* step_timer_name(StepTimer timer);
// 1 or 2, as Megatron's log_level of the timer.
int step_timer_level(StepTimer timer);

class StepTimers {
 public:
  // Timers up to `level` (0, 1 or 2; else std::invalid_argument) on `stream` of `ops`; `barrier`
  // (empty: none) runs before each level-1 timer starts.
  StepTimers(const Ops& ops, Stream stream, int level, std::function<void()> barrier = {});
  ~StepTimers();
  StepTimers(const StepTimers&) = delete;
  StepTimers& operator=(const StepTimers&) = delete;

  int level() const { return level_; }
  bool enabled(StepTimer timer) const { return step_timer_level(timer) <= level_; }
  void start(StepTimer timer);
  void stop(StepTimer timer);
  // Clears every timer (before a step); none may be running.
  void reset();
  // This rank's milliseconds per timer since reset() (0: not run or not enabled), indexed by
  // StepTimer; the stream must have passed the last stop.
  std::array<double, kStepTimers> elapsed_ms() const;

 private:
  struct Interval {
    Event start, stop;
  };
  struct Timer {
    std::vector<Interval> intervals;  // kept from step to step, grown to the most used
    size_t used = 0;
    bool running = false;
  };
  const Ops& ops_;
  Stream stream_;
  int level_;
  std::function<void()> barrier_;
  std::array<Timer, kStepTimers> timers_;
};

// Starts `timer` on construction and stops it at the end of the scope; `timers` may be null.
class TimerScope {
 public:
  TimerScope(StepTimers* timers, StepTimer timer) : timers_(timers), timer_(timer) {
    if (timers_) timers_->start(timer_);
  }
  ~TimerScope() {
    if (timers_) timers_->stop(timer_);
  }
  TimerScope(const TimerScope&) = delete;
  TimerScope& operator=(const TimerScope&) = delete;

 private:
  StepTimers* timers_;
  StepTimer timer_;
};

}  // namespace mt::backend
