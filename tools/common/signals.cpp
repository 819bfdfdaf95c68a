// Termination signals (see signals.h).
#include "tools/common/signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "core/stop_request.h"
#include "core/temporary_file.h"

namespace mt::tools {
namespace {

constexpr int kHandled[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};

// Everything the handler touches is fixed-size and written before the handlers are installed.
char g_tool[64] = "mt";
volatile sig_atomic_t g_mode = 0;  // SignalMode

const char* static_signal_name(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
  }
  return nullptr;
}

// write(2) of a few NUL-terminated pieces: async-signal-safe, unlike stdio.
void write_stderr(const char* const* pieces, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const ssize_t ignored = write(STDERR_FILENO, pieces[i], std::strlen(pieces[i]));
    (void)ignored;
  }
}

[[noreturn]] void die_by(int signal_number, const char* how) {
  remove_live_temporaries();
  const char* name = static_signal_name(signal_number);
  const char* pieces[] = {g_tool, ": ", how, name ? name : "a signal", "; exiting now\n"};
  write_stderr(pieces, sizeof pieces / sizeof pieces[0]);
  signal(signal_number, SIG_DFL);
  // The waiting thread blocks the signal like every other: unblock it here, so raising it kills.
  sigset_t just_this;
  sigemptyset(&just_this);
  sigaddset(&just_this, signal_number);
  pthread_sigmask(SIG_UNBLOCK, &just_this, nullptr);
  raise(signal_number);
  _exit(128 + signal_number);  // only if the signal could not be delivered
}

void on_signal(int signal_number) {
  // Graceful: the first signal is only recorded; the tool reports it when the run has stopped.
  if (g_mode == static_cast<sig_atomic_t>(SignalMode::graceful) && stop_signal() == 0) {
    request_stop(signal_number);
    return;
  }
  die_by(signal_number, g_mode == static_cast<sig_atomic_t>(SignalMode::graceful) ? "second signal, " : "stopped by ");
}

sigset_t handled_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kHandled) sigaddset(&set, s);
  return set;
}

// The thread that takes the signals: each one, waited for, acts as a handler would, but outside
// any other thread's work.
void wait_for_signals(sigset_t waited) {
  for (;;) {
    int signal_number = 0;
    if (sigwait(&waited, &signal_number) == 0) on_signal(signal_number);
  }
}

}  // namespace

void block_signals() {
  const sigset_t set = handled_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void handle_signals(const std::string& tool, SignalMode mode) {
  std::strncpy(g_tool, tool.c_str(), sizeof g_tool - 1);
  g_mode = static_cast<sig_atomic_t>(mode);
  static bool started = false;
  if (started) return;
  started = true;
  // A thread that does not block the signals (one started before block_signals) still runs the
  // same logic as a handler.
  struct sigaction action {};
  action.sa_handler = on_signal;
  action.sa_mask = handled_set();  // one handler at a time
  action.sa_flags = SA_RESTART;
  sigset_t waited;
  sigemptyset(&waited);
  for (int s : kHandled) {
    // A signal ignored by whoever started the tool (nohup: SIGHUP) stays ignored.
    struct sigaction current {};
    if (sigaction(s, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) continue;
    sigaction(s, &action, nullptr);
    sigaddset(&waited, s);
  }
  block_signals();  // this thread too, whatever its caller did
  std::thread(wait_for_signals, waited).detach();
}

std::string signal_name(int signal_number) {
  const char* name = static_signal_name(signal_number);
  return name ? name : "signal " + std::to_string(signal_number);
}

}  // namespace mt::tools
