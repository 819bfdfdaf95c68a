// Catchable termination signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1) for every mt-* tool. Two modes:
// - immediate (every tool from start-up): remove the live temporaries of lib's writers
//   (core/temporary_file.h), print one line naming the signal, die by the signal (128 + n);
// - graceful (mt-train around its training loop): the first signal only requests a stop
//   (core/stop_request.h), which the trainer honours after the current step so the tool can write
//   what the run was asked to write and exit 128 + n; a second signal acts at once, as immediate.
// mt's handler is always on (Megatron's --exit-signal-handler is opt-in). Tested by
// tests/tools/bad-input.bats (issue 11 cases 3 and 4).
#pragma once

#include <string>

namespace mt::tools {

enum class SignalMode { immediate, graceful };

// Installs the handlers for the four signals (those the parent ignores, as nohup does SIGHUP, stay
// ignored); `tool` names the process in the message.
void handle_signals(const std::string& tool, SignalMode mode);

// "SIGTERM" for 15, ... (the four handled signals; "signal N" otherwise).
std::string signal_name(int signal_number);

}  // namespace mt::tools
