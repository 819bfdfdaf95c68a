// Termination signals (see signals.h).
#include "tools/common/signals.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

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
  raise(signal_number);
  _exit(128 + signal_number);  // only if the signal was blocked
}

void on_signal(int signal_number) {
  // Graceful: the first signal is only recorded; the tool reports it when the run has stopped.
  if (g_mode == static_cast<sig_atomic_t>(SignalMode::graceful) && stop_signal() == 0) {
    request_stop(signal_number);
    return;
  }
  die_by(signal_number, g_mode == static_cast<sig_atomic_t>(SignalMode::graceful) ? "second signal, " : "stopped by ");
}

}  // namespace

void handle_signals(const std::string& tool, SignalMode mode) {
  std::strncpy(g_tool, tool.c_str(), sizeof g_tool - 1);
  g_mode = static_cast<sig_atomic_t>(mode);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int s : kHandled) sigaddset(&action.sa_mask, s);  // one handler at a time
  action.sa_flags = SA_RESTART;
  for (int s : kHandled) {
    // A signal ignored by whoever started the tool (nohup: SIGHUP) stays ignored.
    struct sigaction current {};
    if (sigaction(s, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) continue;
    sigaction(s, &action, nullptr);
  }
}

std::string signal_name(int signal_number) {
  const char* name = static_signal_name(signal_number);
  return name ? name : "signal " + std::to_string(signal_number);
}

}  // namespace mt::tools
