// A background thread that drives MPI's progress engine while non-blocking operations are in
// flight: OpenMPI moves a large all-reduce's data only inside MPI calls, so without it a bucket
// started before a layer's backward waits, untouched, until the next MPI call. It calls
// MPI_Iprobe on a private communicator (nothing is ever sent there, so each call only runs the
// progress engine) every `interval` while the in-flight count is positive, and sleeps on a
// condition variable otherwise. Needs MPI_THREAD_MULTIPLE, which costs ~0.02 us on an 8-byte
// all-reduce (0.28-0.30 us FUNNELED, 0.31-0.32 us MULTIPLE).
//
// Measured by tests/bench/bench_comm_overlap.cpp: 2 ranks x 1 thread on 2 cores, OpenMPI 4.1
// over shared memory, a 25 / 100 MB fp32 all-reduce started before ~1.5x its time of 0.3 ms
// sgemm chunks, medians of 9 interleaved runs, as a share of the non-blocking all-reduce hidden:
//   no progress until wait()        -21% / 1%  (all of it after the compute)
//   test() between sgemm chunks      21% / 24%
//   this thread, every 100 us         7% / 35% (its polls take the compute's core)
//   this thread, every 1 ms          33% / 50% (the default; 3 ms gives 36% / 54%)
// MPI's non-blocking all-reduce takes 2.2-2.5x its blocking one here (18.7 vs 7.4 ms, 150 vs
// 68 ms), so on ranks with one core each the best overlapped run only comes close to computing
// and then calling the blocking all-reduce (1.12x / 1.04x of it): the sum needs the core the
// compute uses. Overlap pays where the wait is on a network or on late ranks.
// Exercised by tests/mpi/test_communicator.cpp.
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
