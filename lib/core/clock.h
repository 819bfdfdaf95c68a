// Elapsed time on the steady clock, in seconds: the one conversion the FSDP buckets' timers, the
// communicators' blocked and wait times, the CPU backend's events, checkpointing, the GEMM
// probes and mt-tokenize's summaries share. Header-only; std::chrono's arithmetic, with no test
// of its own (its users' timing tests exercise it).
#pragma once

#include <chrono>

namespace mt {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_between(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

inline double seconds_since(SteadyClock::time_point start) { return seconds_between(start, SteadyClock::now()); }

}  // namespace mt
