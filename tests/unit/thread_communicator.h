// Ranks as threads of one process, for unit suites that test collectives without MPI: a
// ThreadGroup is the group, each thread holds a ThreadCommunicator for its rank. fp32 all-reduce
// (sum or max) and reduce-scatter (sum), all-gather of any dtype, in place as the distributed
// optimizer calls them, combined in rank order, and all_to_allv of any dtype. Non-blocking forms
// run the collective when the request is waited (or destroyed), so a suite can see what a rank
// holds before it waits; every rank must then wait its requests in the same order. Used by
// tests/unit/optim/test_distributed_optimizer.cpp, tests/unit/model/test_stage.cpp (tensor
// parallelism over threads) and tests/unit/model/test_token_dispatcher.cpp (the MoE dispatcher).
#pragma once

#include <algorithm>
#include <barrier>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace mt::testing {

struct ThreadGroup {
  explicit ThreadGroup(int size)
      : sync(size), buffers(static_cast<size_t>(size)), counts(buffers.size()), offsets(buffers.size()) {}
  std::barrier<> sync;
  std::vector<const float*> buffers;
  std::vector<const int64_t*> counts, offsets;  // all_to_allv's send counts and offsets per rank
};

class ThreadCommunicator : public comm::Communicator {
 public:
  ThreadCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_.buffers.size()); }

  void all_reduce(void* data, int64_t count, DType dtype, comm::ReduceOp op) override {
    if (dtype != DType::f32 || (op != comm::ReduceOp::sum && op != comm::ReduceOp::max)) {
      throw std::logic_error("fp32 sums and maxima only");
    }
    auto* values = static_cast<float*>(data);
    publish(values);
    std::vector<float> result(group_.buffers[0], group_.buffers[0] + count);
    for (int r = 1; r < size(); ++r) {
      for (int64_t i = 0; i < count; ++i) {
        const float v = group_.buffers[static_cast<size_t>(r)][i];
        float& combined = result[static_cast<size_t>(i)];
        combined = op == comm::ReduceOp::max ? std::max(combined, v) : combined + v;
      }
    }
    group_.sync.arrive_and_wait();
    std::copy(result.begin(), result.end(), values);
    ++collectives_;
  }
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, comm::ReduceOp op) override {
    check(dtype, op);
    publish(static_cast<const float*>(send));
    std::vector<float> sums(static_cast<size_t>(recv_count), 0.0f);
    for (int r = 0; r < size(); ++r) {
      const float* block = group_.buffers[static_cast<size_t>(r)] + rank_ * recv_count;
      for (int64_t i = 0; i < recv_count; ++i) sums[static_cast<size_t>(i)] += block[i];
    }
    group_.sync.arrive_and_wait();
    std::copy(sums.begin(), sums.end(), static_cast<float*>(recv));
    ++collectives_;
  }
  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    publish(static_cast<const float*>(send));
    const auto bytes = static_cast<int64_t>(dtype_size(dtype)) * send_count;
    auto* out = static_cast<char*>(recv);
    for (int r = 0; r < size(); ++r) {
      const auto* block = reinterpret_cast<const char*>(group_.buffers[static_cast<size_t>(r)]);
      char* to = out + r * bytes;
      if (block != to && bytes > 0) std::memcpy(to, block, static_cast<size_t>(bytes));
    }
    group_.sync.arrive_and_wait();
    ++collectives_;
  }
  void all_to_allv(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                   const int64_t* recv_counts, const int64_t* recv_offsets, DType dtype) override {
    group_.counts[static_cast<size_t>(rank_)] = send_counts;
    group_.offsets[static_cast<size_t>(rank_)] = send_offsets;
    publish(static_cast<const float*>(send));
    const auto element = static_cast<int64_t>(dtype_size(dtype));
    bool agree = true;
    for (int r = 0; r < size(); ++r) {
      const int64_t count = group_.counts[static_cast<size_t>(r)][rank_];
      agree = agree && count == recv_counts[r];
      if (count <= 0 || count != recv_counts[r]) continue;
      const auto* from = reinterpret_cast<const char*>(group_.buffers[static_cast<size_t>(r)]) +
                         group_.offsets[static_cast<size_t>(r)][rank_] * element;
      std::memcpy(static_cast<char*>(recv) + recv_offsets[r] * element, from, static_cast<size_t>(count * element));
    }
    group_.sync.arrive_and_wait();
    ++collectives_;
    if (!agree) throw std::logic_error("all_to_allv: a rank's send count differs from this rank's receive count");
  }
  void barrier() override { group_.sync.arrive_and_wait(); }
  double wait_seconds() const override { return 0; }

  std::unique_ptr<comm::Request> all_reduce_async(void* data, int64_t count, DType dtype, comm::ReduceOp op) override {
    return deferred([=, this] { all_reduce(data, count, dtype, op); });
  }
  std::unique_ptr<comm::Request> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                                      comm::ReduceOp op) override {
    return deferred([=, this] { reduce_scatter(send, recv, recv_count, dtype, op); });
  }
  std::unique_ptr<comm::Request> all_gather_async(const void* send, void* recv, int64_t send_count,
                                                  DType dtype) override {
    return deferred([=, this] { all_gather(send, recv, send_count, dtype); });
  }

  [[noreturn]] void unused() const { throw std::logic_error("not a collective the suite runs"); }
  void all_to_all(const void*, void*, int64_t, DType) override { unused(); }
  void broadcast(void*, int64_t, DType, int) override { unused(); }
  void send(const void*, int64_t, DType, int, int) override { unused(); }
  void recv(void*, int64_t, DType, int, int) override { unused(); }
  std::unique_ptr<comm::Request> send_async(const void*, int64_t, DType, int, int) override { unused(); }
  std::unique_ptr<comm::Request> recv_async(void*, int64_t, DType, int, int) override { unused(); }
  std::unique_ptr<comm::Communicator> split(int, int) override { unused(); }

  // Collectives this rank has run so far (a deferred one counts once waited).
  int collectives() const { return collectives_; }

 private:
  class DeferredRequest : public comm::Request {
   public:
    explicit DeferredRequest(std::function<void()> run) : run_(std::move(run)) {}
    ~DeferredRequest() override { wait(); }
    bool test() override { return done_; }
    void wait() override {
      if (done_) return;
      done_ = true;
      run_();
    }

   private:
    std::function<void()> run_;
    bool done_ = false;
  };

  static std::unique_ptr<comm::Request> deferred(std::function<void()> run) {
    return std::make_unique<DeferredRequest>(std::move(run));
  }
  static void check(DType dtype, comm::ReduceOp op) {
    if (dtype != DType::f32 || op != comm::ReduceOp::sum) throw std::logic_error("fp32 sums only");
  }
  void publish(const float* buffer) {
    group_.buffers[static_cast<size_t>(rank_)] = buffer;
    group_.sync.arrive_and_wait();
  }

  ThreadGroup& group_;
  int rank_;
  int collectives_ = 0;
};

// Runs body(rank) on `ranks` threads and rethrows the first failure.
inline void run_ranks(int ranks, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> failures(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        failures[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}

}  // namespace mt::testing
