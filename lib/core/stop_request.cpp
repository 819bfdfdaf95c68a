// The process-wide stop request (see stop_request.h).
#include "core/stop_request.h"

#include <atomic>

namespace mt {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

}  // namespace

void request_stop(int signal_number) noexcept {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signal_number);
}

int stop_signal() noexcept { return g_stop_signal.load(); }

void clear_stop_request() noexcept { g_stop_signal.store(0); }

}  // namespace mt
