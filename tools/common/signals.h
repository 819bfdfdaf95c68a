// Catchable termination signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1) for every mt-* tool. Two modes:
// - immediate (every tool from start-up): remove the live temporaries of lib's writers
//   (core/temporary_file.h), print one line naming the signal, die by the signal (128 + n);
// - graceful (mt-train around its training loop): the first signal only requests a stop
//   (core/stop_request.h), which the trainer honours after the current step so the tool can write
//   what the run was asked to write and exit 128 + n (75 when it saved a checkpoint); a second
//   signal acts at once, as immediate, unless a save is in progress (SaveInProgress): then it waits
//   for the save, at most kSaveGraceSeconds, and the run ends as the first signal asked (issue 28
//   L7: Slurm's SIGTERM after its USR1 warning, or mpirun's SIGTERM after a Ctrl-C, must not
//   abandon the checkpoint being written).
// SIGPIPE is ignored in every tool (ignore_broken_pipes): a closed stdout is a write error the
// tool reports (RecordWriter), or a stop with a save in mt-train, never a silent death (L5).
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

// Ignores SIGPIPE: a write to a closed pipe fails with EPIPE instead of killing the process. Every
// tool, first thing in main (tool_main).
void ignore_broken_pipes();

// How long a signal that arrives during a save waits for it before it acts as a second signal.
inline constexpr int kSaveGraceSeconds = 120;

// Held while a checkpoint or --save-final file is written (nesting allowed): in graceful mode a
// later signal then waits for the save instead of abandoning it. Only SIGKILL can lose it; the
// previous checkpoint then stays the latest (the tracker is written last). Test hook:
// MT_TEST_SAVE_DELAY_SECONDS=S makes each save S seconds longer (tests/tools/bad-input.bats, L7).
class SaveInProgress {
 public:
  SaveInProgress();
  ~SaveInProgress();
  SaveInProgress(const SaveInProgress&) = delete;
  SaveInProgress& operator=(const SaveInProgress&) = delete;
};

// Once a run's exit code is decided (its stop saved, its last records written), a later signal
// ends the process at once with that code instead of 128 + the signal: srun and mpirun end the
// other ranks with SIGTERM as soon as one rank exits, and a resumable stop must read as 75 on
// every rank for the launcher to requeue it (tests/slurm/slurm.bats, the time-limit requeue).
void exit_with_on_later_signal(int code);

// Starts taking the four signals in `mode` (the first call starts the waiting thread; later calls
// change the mode). Signals the parent ignores, as nohup does SIGHUP, stay ignored; `tool` names
// the process in the message.
void handle_signals(const std::string& tool, SignalMode mode);

// "SIGTERM" for 15, ... (the four handled signals and SIGPIPE; "signal N" otherwise).
std::string signal_name(int signal_number);

}  // namespace mt::tools
