// Times work on a backend stream with two events (ops.h: record_event, elapsed_seconds), so a
// timer measures when the queued work ran, not when the host issued it: on an asynchronous backend
// a host clock read around queued ops measures only the queueing. On the CPU, whose ops finish
// before they return, it equals the host clock around the same calls.
// Tested in tests/unit/backend/test_async_cpu_ops.cpp (a queued host function's sleep is timed)
// and through the pipeline engine's timers in tests/unit/train/test_trainer_async.cpp.
#pragma once

#include <utility>

#include "backend/ops.h"

namespace mt::backend {

class StreamTimer {
 public:
  StreamTimer(const Ops& ops, Stream stream) : ops_(&ops), stream_(stream) {
    start_ = ops.create_event();
    stop_ = ops.create_event();
  }
  ~StreamTimer() {
    ops_->destroy_event(start_);
    ops_->destroy_event(stop_);
  }
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;

  // Marks the stream before and after the work to time (issue the work between the two).
  void start() { ops_->record_event(start_, stream_); }
  void stop() { ops_->record_event(stop_, stream_); }
  // Waits for the work up to stop() and returns the seconds between the two marks.
  double seconds() {
    ops_->synchronize_event(stop_);
    return elapsed_seconds();
  }
  // The same without a wait, for a caller that has synchronized the stream past stop() already
  // (the trainer reads its pipeline's timers after the step's one synchronize).
  double elapsed_seconds() const { return ops_->elapsed_seconds(start_, stop_); }

 private:
  const Ops* ops_;
  Stream stream_;
  Event start_;
  Event stop_;
};

}  // namespace mt::backend
