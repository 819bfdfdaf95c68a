// Termination signals (see signals.h).
#include "tools/common/signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
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
char g_grace_seconds[16] = "?";  // kSaveGraceSeconds as text
std::atomic<int> g_saves_in_progress{0};
std::atomic<int> g_deferred_signal{0};             // a later signal that arrived during a save
std::atomic<int64_t> g_deferred_deadline_ns{0};  // CLOCK_MONOTONIC: when a deferred signal acts anyway

int64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
}

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
    case SIGPIPE:
      return "SIGPIPE";
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

// A later signal during a save waits for the save (at most kSaveGraceSeconds): the run is already
// stopping, and the save is what the first signal asked for.
void defer_until_saved(int signal_number) {
  int none = 0;
  if (!g_deferred_signal.compare_exchange_strong(none, signal_number)) return;  // the first one's deadline holds
  g_deferred_deadline_ns = monotonic_ns() + int64_t{kSaveGraceSeconds} * 1000000000;
  const char* name = static_signal_name(signal_number);
  const char* pieces[] = {g_tool, ": ", name ? name : "a signal", " during a save; finishing the save first (at most ",
                          g_grace_seconds, " s)\n"};
  write_stderr(pieces, sizeof pieces / sizeof pieces[0]);
}

// The exit code a signal ends the process with once the run's end is decided (-1: not yet).
std::atomic<int> g_decided_exit_code{-1};

void on_signal(int signal_number) {
  if (const int decided = g_decided_exit_code.load(); decided >= 0) {
    const char* name = static_signal_name(signal_number);
    const char* pieces[] = {g_tool, ": ", name ? name : "a signal", " after the run's end was decided; exiting with its code\n"};
    write_stderr(pieces, sizeof pieces / sizeof pieces[0]);
    _exit(decided);
  }
  const bool graceful = g_mode == static_cast<sig_atomic_t>(SignalMode::graceful);
  // Graceful: the first signal is only recorded; the tool reports it when the run has stopped.
  if (graceful && stop_signal() == 0) {
    request_stop(signal_number);
    return;
  }
  if (graceful && g_saves_in_progress > 0) {
    defer_until_saved(signal_number);
    return;
  }
  die_by(signal_number, graceful ? "second signal, " : "stopped by ");
}

// A deferred signal: forgotten once no save is in progress (the run goes on to its end and its
// exit code); acts as a second signal when the save outlives its deadline.
void check_deferred_signal() {
  const int deferred = g_deferred_signal;
  if (deferred == 0) return;
  if (g_saves_in_progress == 0) {
    g_deferred_signal = 0;
  } else if (monotonic_ns() > g_deferred_deadline_ns) {
    die_by(deferred, "the save did not finish in time after ");
  }
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
    const timespec poll{0, 200000000};  // a deferred signal's deadline is checked this often
    const int signal_number = sigtimedwait(&waited, nullptr, &poll);
    if (signal_number > 0) on_signal(signal_number);
    check_deferred_signal();
  }
}

}  // namespace

void block_signals() {
  const sigset_t set = handled_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void ignore_broken_pipes() { signal(SIGPIPE, SIG_IGN); }

SaveInProgress::SaveInProgress() {
  ++g_saves_in_progress;
  // Test hook (as MT_CHECKPOINT_FAULT): a save that takes this many seconds longer, so a test can
  // send a signal while it is in progress.
  if (const char* seconds = std::getenv("MT_TEST_SAVE_DELAY_SECONDS")) {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(seconds)));
  }
}

SaveInProgress::~SaveInProgress() { --g_saves_in_progress; }

void handle_signals(const std::string& tool, SignalMode mode) {
  std::strncpy(g_tool, tool.c_str(), sizeof g_tool - 1);
  std::snprintf(g_grace_seconds, sizeof g_grace_seconds, "%d", kSaveGraceSeconds);
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

void exit_with_on_later_signal(int code) { g_decided_exit_code.store(code); }

}  // namespace mt::tools
