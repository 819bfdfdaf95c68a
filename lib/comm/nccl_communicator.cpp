// The NCCL data communicator (see nccl_communicator.h): the join, collectives on the bound stream,
// non-blocking forms on a second stream, batched point to point, split, and the watchdog that
// bounds queued operations. Compiled only with the CUDA backend, into the object library mt_cuda
// (lib/CMakeLists.txt), which installs it (nccl_communicator.h's NcclLink).
#include "comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/arguments.h"
#include "core/clock.h"
#include "core/error.h"

namespace mt::comm {
namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(const char* op, cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw Error(op, std::string(call) + " failed: " + cudaGetErrorString(status));
  }
}

std::string nccl_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) text += std::string(" (") + last + ")";
  return text;
}

// NCCL's element type for a reduction; i16/u16 have none.
ncclDataType_t reduction_type(const char* op, DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::f64: return ncclFloat64;
    case DType::i8: return ncclInt8;
    case DType::u8: return ncclUint8;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::i16:
    case DType::u16: break;
  }
  throw Error(op, std::string("NCCL cannot reduce ") + dtype_name(dtype));
}

ncclRedOp_t reduction_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

size_t bytes_of(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

const unsigned char* byte_at(const void* base, int64_t elements, DType dtype) {
  return static_cast<const unsigned char*>(base) + bytes_of(elements, dtype);
}
unsigned char* byte_at(void* base, int64_t elements, DType dtype) {
  return static_cast<unsigned char*>(base) + bytes_of(elements, dtype);
}

// A CUDA event marking the end of queued work; freed with its owner (CUDA releases it once the
// work it marks has run).
struct Marker {
  cudaEvent_t event = nullptr;
  explicit Marker(const char* op) {
    check_cuda(op, cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  ~Marker() { cudaEventDestroy(event); }
  Marker(const Marker&) = delete;
  Marker& operator=(const Marker&) = delete;
};

// Non-blocking work queued (or, for point to point, still to be queued) on the second stream:
// `done` is recorded once it is queued.
struct Batch {
  explicit Batch(const char* op) : done(op) {}
  Marker done;
  bool issued = false;
};

// One message of a point-to-point batch not issued yet.
struct Message {
  bool is_send;
  void* data;
  size_t bytes;
  int peer;
};

// NCCL's communicator handle with its health: the distributed timeout bounds every poll, and the
// watchdog thread aborts it when queued work stays unfinished past the timeout.
class NcclHandle {
 public:
  NcclHandle(ncclComm_t comm, int device, double timeout_seconds)
      : comm_(comm), device_(device), timeout_(timeout_seconds) {
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclHandle() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    if (!aborted_) finalize_and_destroy();
  }
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;

  ncclComm_t comm() const { return comm_; }
  double timeout_seconds() const { return timeout_; }
  double wait_seconds() const { return wait_seconds_; }

  // Throws when the watchdog aborted the communicator or NCCL reports an asynchronous error.
  void check_health(const char* op) {
    if (aborted_) {
      const std::lock_guard lock(mutex_);
      throw Error(op, "the NCCL communicator was aborted: " + failure_);
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
    if (asked != ncclSuccess) throw Error(op, "ncclCommGetAsyncError failed: " + nccl_text(asked, comm_));
    if (state == ncclInProgress) {
      settle(op, state);
    } else if (state != ncclSuccess) {
      throw Error(op, "NCCL reported an error in queued work: " + nccl_text(state, comm_));
    }
  }

  // Checks an NCCL call's result; a non-blocking communicator's "in progress" is polled until it
  // settles, within the distributed timeout.
  void settle(const char* op, ncclResult_t result) { settle_comm(op, comm_, result); }
  void settle_comm(const char* op, ncclComm_t comm, ncclResult_t result) {
    if (result == ncclInProgress) result = poll(op, comm);
    if (result != ncclSuccess) throw Error(op, nccl_text(result, comm));
  }

  // Watches `marker` (recorded after `op`'s queued work): past the timeout it aborts.
  void watch_marker(const char* op, std::shared_ptr<Batch> batch) {
    {
      const std::lock_guard lock(mutex_);
      in_flight_.push_back({op, Clock::now(), std::move(batch)});
    }
    wake_.notify_all();
  }

 private:
  struct InFlight {
    const char* op;
    Clock::time_point queued;
    std::shared_ptr<Batch> batch;
  };

  ncclResult_t poll(const char* op, ncclComm_t comm) {
    const Clock::time_point start = Clock::now();
    const auto deadline = start + std::chrono::duration<double>(timeout_);
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      if (comm == comm_ && aborted_) throw Error(op, "the NCCL communicator was aborted by the watchdog");
      const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
      if (asked != ncclSuccess) state = asked;
      if (state != ncclInProgress) break;
      if (Clock::now() > deadline) {
        ncclCommAbort(comm);
        if (comm == comm_) {
          const std::lock_guard lock(mutex_);
          failure_ = std::string(op) + " got no answer from NCCL within the distributed timeout";
          aborted_ = true;
        }
        throw Error(op, "NCCL did not answer within the distributed timeout (" + std::to_string(timeout_) +
                            " s); the communicator was aborted");
      }
      std::this_thread::yield();
    }
    wait_seconds_ += seconds_since(start);
    return state;
  }

  // The watchdog: every 20 ms while work is in flight, drops what has finished and aborts the
  // communicator when the oldest unfinished operation is older than the timeout.
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock lock(mutex_);
    while (!stop_) {
      if (in_flight_.empty()) {
        wake_.wait(lock, [this] { return stop_ || !in_flight_.empty(); });
        continue;
      }
      while (!in_flight_.empty()) {
        const cudaError_t status = cudaEventQuery(in_flight_.front().batch->done.event);
        if (status == cudaErrorNotReady) break;
        in_flight_.pop_front();
      }
      if (!in_flight_.empty() &&
          Clock::now() - in_flight_.front().queued > std::chrono::duration<double>(timeout_)) {
        failure_ = std::string(in_flight_.front().op) + " did not complete within the distributed timeout (" +
                   std::to_string(timeout_) + " s)";
        ncclCommAbort(comm_);
        aborted_ = true;
        in_flight_.clear();
        return;
      }
      wake_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  void finalize_and_destroy() {
    ncclResult_t result = ncclCommFinalize(comm_);
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_);
    while (result == ncclSuccess || result == ncclInProgress) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t asked = ncclCommGetAsyncError(comm_, &state);
      if (asked != ncclSuccess || state != ncclInProgress) {
        result = asked != ncclSuccess ? asked : state;
        break;
      }
      if (Clock::now() > deadline) {
        result = ncclInProgress;
        break;
      }
      std::this_thread::yield();
    }
    if (result == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);  // a destructor cannot throw; a lost peer must not hang the exit
    }
  }

  ncclComm_t comm_;
  int device_;
  double timeout_;
  double wait_seconds_ = 0;
  std::atomic<bool> aborted_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<InFlight> in_flight_;
  std::string failure_;
  bool stop_ = false;
  std::thread watchdog_;
};

class NcclCommunicator;

class NcclRequest final : public Request {
 public:
  NcclRequest(NcclCommunicator& owner, std::shared_ptr<Batch> batch) : owner_(owner), batch_(std::move(batch)) {}
  ~NcclRequest() override {
    if (waited_) return;
    try {
      wait();
    } catch (...) {  // a destructor cannot throw; the communicator's next call reports the failure
    }
  }
  NcclRequest(const NcclRequest&) = delete;
  NcclRequest& operator=(const NcclRequest&) = delete;

  bool test() override;
  void wait() override;

 private:
  NcclCommunicator& owner_;
  std::shared_ptr<Batch> batch_;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, cudaStream_t stream, double timeout_seconds)
      : handle_(std::make_unique<NcclHandle>(comm, device, timeout_seconds)),
        rank_(rank), size_(size), device_(device), stream_(stream), ready_("NCCL communicator") {
    check_cuda("NCCL communicator", cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    cudaError_t allocated = cudaMalloc(&barrier_word_, sizeof(int32_t));
    if (allocated == cudaSuccess) allocated = cudaMemset(barrier_word_, 0, sizeof(int32_t));
    if (allocated != cudaSuccess) {
      cudaFree(barrier_word_);
      cudaStreamDestroy(side_);
      check_cuda("NCCL communicator", allocated, "cudaMalloc");
    }
  }
  ~NcclCommunicator() override {
    try {
      flush("NCCL communicator");
    } catch (...) {  // a destructor cannot throw; the messages' requests report it
    }
    handle_.reset();  // finalizes NCCL (waiting for queued work) before the memory it uses goes
    cudaFree(barrier_word_);
    cudaStreamDestroy(side_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    const char* name = "all_reduce";
    detail::check_count(name, count);
    const ncclDataType_t type = reduction_type(name, dtype);
    begin(name);
    if (count == 0) return;
    handle_->settle(name, ncclAllReduce(data, data, static_cast<size_t>(count), type, reduction_op(op),
                                        handle_->comm(), stream_));
    mark(name, stream_);
  }

  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override {
    const char* name = "reduce_scatter";
    queue_reduce_scatter(name, send, recv, recv_count, dtype, op, stream_);
  }

  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    queue_all_gather("all_gather", send, recv, send_count, dtype, stream_);
  }

  void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) override {
    const char* name = "all_to_all";
    detail::check_count(name, count_per_rank);
    std::vector<int64_t> counts(static_cast<size_t>(size_), count_per_rank), offsets(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) offsets[static_cast<size_t>(r)] = int64_t(r) * count_per_rank;
    queue_all_to_allv(name, send, counts.data(), offsets.data(), recv, counts.data(), offsets.data(), dtype);
  }

  void all_to_allv(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                   const int64_t* recv_counts, const int64_t* recv_offsets, DType dtype) override {
    const char* name = "all_to_allv";
    detail::check_counts(name, send_counts, send_offsets, size_);
    detail::check_counts(name, recv_counts, recv_offsets, size_);
    queue_all_to_allv(name, send, send_counts, send_offsets, recv, recv_counts, recv_offsets, dtype);
  }

  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    const char* name = "broadcast";
    detail::check_count(name, count);
    detail::check_root(name, root, size_);
    begin(name);
    if (count == 0) return;
    handle_->settle(name, ncclBroadcast(data, data, bytes_of(count, dtype), ncclUint8, root, handle_->comm(), stream_));
    mark(name, stream_);
  }

  void barrier() override {
    const char* name = "barrier";
    begin(name);
    handle_->settle(name, ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, handle_->comm(), stream_));
    mark(name, stream_);
  }

  void send(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    queue_message("send", true, const_cast<void*>(data), count, dtype, peer, tag, stream_);
  }
  void recv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    queue_message("recv", false, data, count, dtype, peer, tag, stream_);
  }

  std::unique_ptr<Request> all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override {
    const char* name = "all_reduce_async";
    detail::check_count(name, count);
    const ncclDataType_t type = reduction_type(name, dtype);
    begin(name);
    auto batch = side_batch(name);
    if (count > 0) {
      handle_->settle(name, ncclAllReduce(data, data, static_cast<size_t>(count), type, reduction_op(op),
                                          handle_->comm(), side_));
    }
    return finish_side_batch(name, std::move(batch));
  }

  std::unique_ptr<Request> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                                ReduceOp op) override {
    const char* name = "reduce_scatter_async";
    detail::check_count(name, recv_count);
    reduction_type(name, dtype);
    begin(name);
    auto batch = side_batch(name);
    queue_reduce_scatter(name, send, recv, recv_count, dtype, op, side_);
    return finish_side_batch(name, std::move(batch));
  }

  std::unique_ptr<Request> all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    const char* name = "all_gather_async";
    detail::check_count(name, send_count);
    begin(name);
    auto batch = side_batch(name);
    queue_all_gather(name, send, recv, send_count, dtype, side_);
    return finish_side_batch(name, std::move(batch));
  }

  std::unique_ptr<Request> send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    return post_message("send_async", true, const_cast<void*>(data), count, dtype, peer, tag);
  }
  std::unique_ptr<Request> recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override {
    return post_message("recv_async", false, data, count, dtype, peer, tag);
  }

  // A non-blocking split fills `*child` from NCCL's own thread, after ncclCommSplit has returned
  // and not before the parent's share of the split is done (NVIDIA/nccl#1472; seen on NCCL 2.28:
  // the parent reads ncclSuccess while the child is still unset). Waits for it within the
  // distributed timeout, watching the parent for errors.
  void wait_for_split_child(const char* name, ncclComm_t* child) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(handle_->timeout_seconds());
    const std::atomic_ref<ncclComm_t> filled(*child);
    while (filled.load() == nullptr) {
      ncclResult_t parent_state = ncclSuccess;
      const ncclResult_t asked = ncclCommGetAsyncError(handle_->comm(), &parent_state);
      if (asked != ncclSuccess) parent_state = asked;
      if (parent_state != ncclSuccess && parent_state != ncclInProgress)
        throw Error(name, nccl_text(parent_state, handle_->comm()));
      if (std::chrono::steady_clock::now() > deadline)
        throw Error(name, "NCCL made no communicator for this rank within the distributed timeout (" +
                              std::to_string(handle_->timeout_seconds()) + " s)");
      std::this_thread::yield();
    }
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    const char* name = "split";
    if (color < 0) throw Error(name, "negative color " + std::to_string(color));
    begin(name);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    const ncclResult_t started = ncclCommSplit(handle_->comm(), color, key, &child, &config);
    if (started != ncclSuccess && started != ncclInProgress) throw Error(name, nccl_text(started, handle_->comm()));
    wait_for_split_child(name, &child);
    handle_->settle_comm(name, child, ncclInProgress);
    int child_rank = 0, child_size = 0;
    handle_->settle_comm(name, child, ncclCommUserRank(child, &child_rank));
    handle_->settle_comm(name, child, ncclCommCount(child, &child_size));
    handle_->check_health(name);
    return std::make_unique<NcclCommunicator>(child, child_rank, child_size, device_, stream_,
                                              handle_->timeout_seconds());
  }

  // Posted messages wait for the next call that issues them (see nccl_communicator.h): issuing
  // half of a ring's messages here could deadlock it, and NCCL needs no host progress.
  void progress() override {}

  double wait_seconds() const override { return handle_->wait_seconds(); }

  // Issues the posted point-to-point messages as one group on the second stream (no-op when none).
  void flush(const char* op) {
    if (pending_.empty()) return;
    std::vector<Message> messages;
    messages.swap(pending_);
    std::shared_ptr<Batch> batch = std::move(pending_batch_);
    handle_->check_health(op);
    order_side_after_compute(op);
    issue_messages(op, messages, side_);
    check_cuda(op, cudaEventRecord(batch->done.event, side_), "cudaEventRecord");
    batch->issued = true;
    handle_->watch_marker("send_async/recv_async", batch);
  }

  void check_health(const char* op) { handle_->check_health(op); }

  void stream_wait(const char* op, const Batch& batch) {
    check_cuda(op, cudaStreamWaitEvent(stream_, batch.done.event, 0), "cudaStreamWaitEvent");
  }

 private:
  // Every operation starts here: posted messages go first (NCCL needs one issue order on every
  // rank), then the communicator's health.
  void begin(const char* op) {
    flush(op);
    handle_->check_health(op);
  }

  // Watches the work just queued on `stream` for `op` (the watchdog's marker).
  void mark(const char* op, cudaStream_t stream) {
    auto batch = std::make_shared<Batch>(op);
    check_cuda(op, cudaEventRecord(batch->done.event, stream), "cudaEventRecord");
    batch->issued = true;
    handle_->watch_marker(op, std::move(batch));
  }

  void order_side_after_compute(const char* op) {
    check_cuda(op, cudaEventRecord(ready_.event, stream_), "cudaEventRecord");
    check_cuda(op, cudaStreamWaitEvent(side_, ready_.event, 0), "cudaStreamWaitEvent");
  }

  std::shared_ptr<Batch> side_batch(const char* op) {
    auto batch = std::make_shared<Batch>(op);
    order_side_after_compute(op);
    return batch;
  }
  std::unique_ptr<Request> finish_side_batch(const char* op, std::shared_ptr<Batch> batch) {
    check_cuda(op, cudaEventRecord(batch->done.event, side_), "cudaEventRecord");
    batch->issued = true;
    handle_->watch_marker(op, batch);
    return std::make_unique<NcclRequest>(*this, std::move(batch));
  }

  void queue_reduce_scatter(const char* op, const void* send, void* recv, int64_t recv_count, DType dtype,
                            ReduceOp reduce, cudaStream_t stream) {
    detail::check_count(op, recv_count);
    const ncclDataType_t type = reduction_type(op, dtype);
    detail::is_own_block(op, send, recv, recv_count, dtype, rank_, size_);  // throws on a bad overlap
    if (stream == stream_) begin(op);
    if (recv_count == 0) return;
    handle_->settle(op, ncclReduceScatter(send, recv, static_cast<size_t>(recv_count), type, reduction_op(reduce),
                                          handle_->comm(), stream));
    if (stream == stream_) mark(op, stream);
  }

  void queue_all_gather(const char* op, const void* send, void* recv, int64_t send_count, DType dtype,
                        cudaStream_t stream) {
    detail::check_count(op, send_count);
    detail::is_own_block(op, recv, send, send_count, dtype, rank_, size_);  // throws on a bad overlap
    if (stream == stream_) begin(op);
    if (send_count == 0) return;
    handle_->settle(op, ncclAllGather(send, recv, bytes_of(send_count, dtype), ncclUint8, handle_->comm(), stream));
    if (stream == stream_) mark(op, stream);
  }

  void queue_all_to_allv(const char* op, const void* send, const int64_t* send_counts, const int64_t* send_offsets,
                         void* recv, const int64_t* recv_counts, const int64_t* recv_offsets, DType dtype) {
    begin(op);
    std::vector<Message> messages;
    for (int peer = 0; peer < size_; ++peer) {
      const size_t p = static_cast<size_t>(peer);
      if (send_counts[p] > 0) {
        messages.push_back({true, const_cast<unsigned char*>(byte_at(send, send_offsets[p], dtype)),
                            bytes_of(send_counts[p], dtype), peer});
      }
      if (recv_counts[p] > 0) {
        messages.push_back({false, byte_at(recv, recv_offsets[p], dtype), bytes_of(recv_counts[p], dtype), peer});
      }
    }
    if (messages.empty()) return;
    issue_messages(op, messages, stream_);
    mark(op, stream_);
  }

  void check_message(const char* op, int64_t count, int peer, int tag) const {
    detail::check_count(op, count);
    detail::check_peer(op, peer, rank_, size_);
    detail::check_tag(op, tag, INT_MAX);
  }

  void queue_message(const char* op, bool is_send, void* data, int64_t count, DType dtype, int peer, int tag,
                     cudaStream_t stream) {
    check_message(op, count, peer, tag);
    begin(op);
    if (count == 0) return;
    const std::vector<Message> message{{is_send, data, bytes_of(count, dtype), peer}};
    issue_messages(op, message, stream);
    mark(op, stream);
  }

  std::unique_ptr<Request> post_message(const char* op, bool is_send, void* data, int64_t count, DType dtype,
                                        int peer, int tag) {
    check_message(op, count, peer, tag);
    if (!pending_batch_) pending_batch_ = std::make_shared<Batch>(op);
    if (count > 0) pending_.push_back({is_send, data, bytes_of(count, dtype), peer});
    return std::make_unique<NcclRequest>(*this, pending_batch_);
  }

  // One ncclGroupStart/ncclGroupEnd around `messages`, on `stream`.
  void issue_messages(const char* op, const std::vector<Message>& messages, cudaStream_t stream) {
    handle_->settle(op, ncclGroupStart());
    ncclResult_t result = ncclSuccess;
    for (const Message& m : messages) {
      result = m.is_send ? ncclSend(m.data, m.bytes, ncclUint8, m.peer, handle_->comm(), stream)
                         : ncclRecv(m.data, m.bytes, ncclUint8, m.peer, handle_->comm(), stream);
      if (result != ncclSuccess && result != ncclInProgress) break;
    }
    const ncclResult_t ended = ncclGroupEnd();
    if (result != ncclSuccess && result != ncclInProgress) handle_->settle(op, result);
    handle_->settle(op, ended);
  }

  std::unique_ptr<NcclHandle> handle_;
  int rank_, size_, device_;
  cudaStream_t stream_;
  cudaStream_t side_ = nullptr;
  Marker ready_;
  int32_t* barrier_word_ = nullptr;
  std::vector<Message> pending_;
  std::shared_ptr<Batch> pending_batch_;
};

bool NcclRequest::test() {
  if (!batch_->issued) owner_.flush("test");
  owner_.check_health("test");
  const cudaError_t status = cudaEventQuery(batch_->done.event);
  if (status == cudaErrorNotReady) return false;
  check_cuda("test", status, "cudaEventQuery");
  return true;
}

void NcclRequest::wait() {
  if (waited_) return;
  waited_ = true;
  if (!batch_->issued) owner_.flush("wait");
  owner_.check_health("wait");
  owner_.stream_wait("wait", *batch_);
}

// Joins the group's NCCL communicator: the id from group rank 0 over `control`, then a
// non-blocking ncclCommInitRankConfig polled within the timeout.
std::unique_ptr<Communicator> join(Communicator& control, const backend::Ops& ops, backend::Stream stream,
                                   double timeout_seconds) {
  const char* name = "NCCL join";
  if (ops.device != backend::Device::cuda) throw Error(name, "the NCCL data group needs the CUDA op table");
  if (!(timeout_seconds > 0)) throw Error(name, "distributed timeout must be positive");
  int device = 0;
  check_cuda(name, cudaGetDevice(&device), "cudaGetDevice");
  ncclUniqueId id{};
  if (control.rank() == 0) {
    const ncclResult_t made = ncclGetUniqueId(&id);
    if (made != ncclSuccess) throw Error(name, "ncclGetUniqueId failed: " + nccl_text(made, nullptr));
  }
  control.broadcast(&id, static_cast<int64_t>(sizeof(id)), DType::u8, 0);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, control.size(), id, control.rank(), &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    if (comm) ncclCommAbort(comm);
    throw Error(name, "ncclCommInitRankConfig failed: " + nccl_text(started, nullptr));
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_seconds);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
    if (asked != ncclSuccess) state = asked;
    if (state == ncclInProgress && Clock::now() > deadline) {
      ncclCommAbort(comm);
      throw Error(name, "the " + std::to_string(control.size()) + " ranks did not join within the distributed timeout (" +
                            std::to_string(timeout_seconds) + " s); the communicator was aborted");
    }
    std::this_thread::yield();
  }
  if (state != ncclSuccess) {
    const std::string text = nccl_text(state, comm);
    ncclCommAbort(comm);
    throw Error(name, "ncclCommInitRankConfig failed: " + text);
  }
  return std::make_unique<NcclCommunicator>(comm, control.rank(), control.size(), device,
                                            static_cast<cudaStream_t>(stream.handle), timeout_seconds);
}

const NcclLink kLink{.make_data_group = &join};

// Runs before main() in every program that links mt_cuda (backend/cuda_link.h).
[[maybe_unused]] const bool kInstalled = [] {
  install_nccl_link(kLink);
  return true;
}();

}  // namespace

}  // namespace mt::comm
