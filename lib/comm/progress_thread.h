// A background thread that drives MPI's progress engine while non-blocking operations are in
// flight: OpenMPI moves a large all-reduce's data only inside MPI calls, so without it a bucket
// started before a layer's backward waits, untouched, until the next MPI call. It calls
// MPI_Iprobe on a private communicator (nothing is ever sent there, so each call only runs the
// progress engine) every `interval` while the in-flight count is positive, and sleeps on a
// condition variable otherwise. Needs MPI_THREAD_MULTIPLE. Measured by
// tests/bench/bench_comm_overlap.cpp; exercised by tests/mpi/test_communicator.cpp.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace mt::comm {

class ProgressThread {
 public:
  explicit ProgressThread(std::chrono::microseconds interval);
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // Bracket every non-blocking operation: the thread polls while any is in flight.
  void operation_started();
  void operation_finished();
  // Polls since construction (tests check the thread ran).
  long long polls() const;

 private:
  void run();

  const std::chrono::microseconds interval_;
  MPI_Comm probe_comm_ = MPI_COMM_NULL;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  int in_flight_ = 0;
  bool stopping_ = false;
  long long polls_ = 0;
  std::thread thread_;
};

}  // namespace mt::comm
