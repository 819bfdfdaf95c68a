// The MPI communicator (communicator.h) over any MPI communicator, with the tunables tests and
// benchmarks set; make_world_communicator() uses the defaults on MPI_COMM_WORLD (with or without the
// progress thread).
// Tested in tests/mpi/test_communicator.cpp; measured by tests/bench/bench_comm_overlap.cpp.
#pragma once

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>

#include "comm/communicator.h"

namespace mt::comm {

struct MpiCommunicatorOptions {
  // The largest element count handed to one MPI call (MPI counts are int). Longer buffers move as
  // one element of a derived datatype, and reductions run in chunks of this many elements; tests
  // lower it to cross the boundary with small buffers.
  int64_t max_count_per_call = INT_MAX;
  // Run a ProgressThread polling every `progress_interval` while non-blocking operations are in
  // flight (1 ms: shorter intervals take more of the compute's core than they give back, see
  // comm/progress_thread.h). Used only when MPI provides MPI_THREAD_MULTIPLE (MpiRuntime::init
  // asks for it); without it operations advance inside test(), wait() and progress() only.
  bool progress_thread = true;
  std::chrono::microseconds progress_interval{1000};
};

// A communicator over a duplicate of `comm` (so its messages never match the caller's), with
// errors returned as mt::Error instead of aborting. Groups split from it share its options and
// progress thread. Collective over `comm`.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const MpiCommunicatorOptions& options = {});

// Whether `communicator` (made by make_mpi_communicator) runs a progress thread, and how many
// times that thread has polled MPI; 0 and false for other communicators.
bool has_progress_thread(const Communicator& communicator);
// The MPI communicator behind `communicator` (for libraries that take one, as parallel HDF5 does);
// MPI_COMM_NULL for communicators not made by make_mpi_communicator.
MPI_Comm mpi_comm_of(const Communicator& communicator);
long long progress_thread_polls(const Communicator& communicator);

}  // namespace mt::comm
