// The MPI progress thread (see progress_thread.h).
#include "comm/progress_thread.h"

#include "core/error.h"

namespace mt::comm {

ProgressThread::ProgressThread(std::chrono::microseconds interval) : interval_(interval) {
  if (MPI_Comm_dup(MPI_COMM_SELF, &probe_comm_) != MPI_SUCCESS) {
    throw Error("MPI_Comm_dup", "cannot make the progress thread's communicator");
  }
  thread_ = std::thread([this] { run(); });
}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&probe_comm_);
}

void ProgressThread::operation_started() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++in_flight_;
  }
  wake_.notify_one();
}

void ProgressThread::operation_finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  --in_flight_;
}

long long ProgressThread::polls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return polls_;
}

void ProgressThread::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || in_flight_ > 0; });
    if (stopping_) return;
    ++polls_;
    lock.unlock();
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, probe_comm_, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(interval_);
    lock.lock();
  }
}

}  // namespace mt::comm
