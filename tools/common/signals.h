// Catchable termination signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1) for every mt-* tool. Two modes:
// - immediate (every tool from start-up): remove the live temporaries of lib's writers
//   (core/temporary_file.h), print one line naming the signal, die by the signal (128 + n);
// - graceful (mt-train around its training loop): the first signal only requests a stop
//   (core/stop_request.h), which the trainer honours after the current step so the tool can write
//   what the run was asked to write and exit 128 + n; a second signal acts at once, as immediate.
// mt's handler is always on (Megatron's --exit-signal-handler is opt-in). The signals are taken by
// one thread of mt's own that waits for them (sigwait), never by a handler that interrupts the
// compute: every other thread blocks them (block_signals, first thing in main, so that OpenMP's,
// MPI's and mt's threads inherit the block). A handler interrupting a thread writes its frame
// below the thread's stack pointer, and under mpirun a forwarded SIGUSR1 corrupted the heap inside
// oneDNN's sgemm in about one run of 30 (tests/tools/mt-train-mpi.bats, the SIGUSR1 case). Tested
// by tests/tools/bad-input.bats (issue 11 cases 3 and 4), tests/tools/mt-train.bats and
// tests/tools/mt-train-mpi.bats (graceful stops, second signals).
#pragma once

#include <string>

namespace mt::tools {

enum class SignalMode { immediate, graceful };

// Blocks the four signals in the calling thread and so in every thread it starts afterwards. Call
// before any other thread exists; until handle_signals runs, a signal waits (it is not lost).
void block_signals();

// Starts taking the four signals in `mode` (the first call starts the waiting thread; later calls
// change the mode). Signals the parent ignores, as nohup does SIGHUP, stay ignored; `tool` names
// the process in the message.
void handle_signals(const std::string& tool, SignalMode mode);

// "SIGTERM" for 15, ... (the four handled signals; "signal N" otherwise).
std::string signal_name(int signal_number);

}  // namespace mt::tools
