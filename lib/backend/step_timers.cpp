// Megatron's step timers on stream events (see step_timers.h).
#include "backend/step_timers.h"

#include <stdexcept>
#include <string>

namespace mt::backend {
namespace {

struct TimerInfo {
  const char* name;
  int level;
};

// Indexed by StepTimer.
constexpr TimerInfo kTimerInfo[kStepTimers] = {
    {"forward-backward", 1},
    {"forward-compute", 2},
    {"backward-compute", 2},
    {"batch-generator", 2},
    {"forward-recv", 2},
    {"forward-send", 2},
    {"backward-recv", 2},
    {"backward-send", 2},
    {"forward-send-forward-recv", 2},
    {"forward-send-backward-recv", 2},
    {"backward-send-forward-recv", 2},
    {"backward-send-backward-recv", 2},
    {"forward-backward-send-forward-backward-recv", 2},
    {"layernorm-grads-all-reduce", 1},
    {"embedding-grads-all-reduce", 1},
    {"all-grads-sync", 1},
    {"params-all-gather", 1},
    {"optimizer-copy-to-main-grad", 1},
    {"optimizer-unscale-and-check-inf", 1},
    {"optimizer-clip-main-grad", 1},
    {"optimizer-count-zeros", 1},
    {"optimizer-inner-step", 1},
    {"optimizer-copy-main-to-model-params", 1},
    {"optimizer", 1},
};

}  // namespace

const char* step_timer_name(StepTimer timer) { return kTimerInfo[static_cast<int>(timer)].name; }

int step_timer_level(StepTimer timer) { return kTimerInfo[static_cast<int>(timer)].level; }

StepTimers::StepTimers(const Ops& ops, Stream stream, int level, std::function<void()> barrier)
    : ops_(ops), stream_(stream), level_(level), barrier_(std::move(barrier)) {
  if (level < 0 || level > 2) throw std::invalid_argument("step timers: level " + std::to_string(level) + " not in 0..2");
}

StepTimers::~StepTimers() {
  for (Timer& timer : timers_) {
    for (Interval& interval : timer.intervals) {
      ops_.destroy_event(interval.start);
      ops_.destroy_event(interval.stop);
    }
  }
}

void StepTimers::start(StepTimer id) {
  if (!enabled(id)) return;
  Timer& timer = timers_[static_cast<size_t>(id)];
  if (timer.running) throw std::logic_error(std::string("timer ") + step_timer_name(id) + " has already been started");
  if (step_timer_level(id) == 1 && barrier_) barrier_();
  if (timer.used == timer.intervals.size()) timer.intervals.push_back(Interval{ops_.create_event(), ops_.create_event()});
  ops_.record_event(timer.intervals[timer.used].start, stream_);
  timer.running = true;
}

void StepTimers::stop(StepTimer id) {
  if (!enabled(id)) return;
  Timer& timer = timers_[static_cast<size_t>(id)];
  if (!timer.running) throw std::logic_error(std::string("timer ") + step_timer_name(id) + " is not started");
  ops_.record_event(timer.intervals[timer.used].stop, stream_);
  ++timer.used;
  timer.running = false;
}

void StepTimers::reset() {
  for (size_t i = 0; i < timers_.size(); ++i) {
    if (timers_[i].running) {
      throw std::logic_error(std::string("timer ") + step_timer_name(static_cast<StepTimer>(i)) + " is still running");
    }
    timers_[i].used = 0;
  }
}

std::array<double, kStepTimers> StepTimers::elapsed_ms() const {
  std::array<double, kStepTimers> ms{};
  for (size_t i = 0; i < timers_.size(); ++i) {
    for (size_t k = 0; k < timers_[i].used; ++k) {
      ms[i] += ops_.elapsed_seconds(timers_[i].intervals[k].start, timers_[i].intervals[k].stop) * 1e3;
    }
  }
  return ms;
}

}  // namespace mt::backend
