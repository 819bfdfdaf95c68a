// A process-wide request to stop long work at its next safe point. A tool's signal handler sets
// it (request_stop is async-signal-safe); lib loops poll it (the trainer between steps) and
// return early, leaving it to the tool to write what the run was asked to write and to choose
// the exit code: lib never exits or prints. Tested in tests/unit/core/test_stop_request.cpp and
// end to end by tests/tools/bad-input.bats (issue 11 case 3).
#pragma once

namespace mt {

// Records a stop request; the first request's signal number is kept. Async-signal-safe.
void request_stop(int signal_number) noexcept;
// The signal number of the first stop request, 0 when none was made.
int stop_signal() noexcept;
// Forgets the request (tests; a tool that handled it).
void clear_stop_request() noexcept;

}  // namespace mt
