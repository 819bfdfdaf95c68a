// A host communicator bound to a backend stream (see stream_communicator.h): itself on a
// synchronous table; on an asynchronous one, staging copies and host functions in stream order.
#include "comm/stream_communicator.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/arguments.h"
#include "core/error.h"

namespace mt::comm {
namespace {

size_t bytes_of(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtype_size(dtype); }

// Host memory that one queued operation owns until its last queued step has run, and the host
// communicator's request a non-blocking operation started (guarded: the stream's host thread
// starts and waits for it, test() asks it from the caller's thread).
struct Staged {
  std::vector<unsigned char> send, recv;
  std::mutex mutex;
  std::unique_ptr<Request> request;
  bool completed = false;
};

// Queues `work` on the stream as a host function; the closure is freed once it has run.
template <typename Work>
void queue_host(const backend::Ops& ops, backend::Stream stream, Work work) {
  Work* closure = new Work(std::move(work));
  ops.launch_host_function(
      stream,
      [](void* argument) {
        const std::unique_ptr<Work> run(static_cast<Work*>(argument));
        (*run)();
      },
      closure);
}

// The stream-order steps every queued operation shares: copies between device memory and its
// staging, host functions, and the release of the staging after the last step.
class StreamSteps {
 public:
  StreamSteps(const backend::Ops& ops, backend::Stream stream) : ops_(ops), stream_(stream) {}

  // `bytes` of device memory at `device` into `staging`, in stream order.
  void copy_in(std::vector<unsigned char>& staging, const void* device, size_t bytes) const {
    staging.resize(bytes);
    if (bytes > 0) {
      ops_.copy(staging.data(), device, static_cast<int64_t>(bytes), backend::CopyKind::device_to_host, stream_);
    }
  }
  // `staging` back to device memory at `device`, in stream order.
  void copy_out(void* device, const std::vector<unsigned char>& staging) const {
    if (!staging.empty()) {
      ops_.copy(device, staging.data(), static_cast<int64_t>(staging.size()), backend::CopyKind::host_to_device,
                stream_);
    }
  }
  template <typename Work>
  void host(Work work) const {
    queue_host(ops_, stream_, std::move(work));
  }
  // Frees the staging once the steps queued before have run.
  void release(std::shared_ptr<Staged> staged) const {
    host([staged = std::move(staged)] {});
  }
  void copy_out_and_release(void* device, std::shared_ptr<Staged> staged) const {
    copy_out(device, staged->recv);
    release(std::move(staged));
  }

  const backend::Ops& ops() const { return ops_; }
  backend::Stream stream() const { return stream_; }

 private:
  const backend::Ops& ops_;
  backend::Stream stream_;
};

// A non-blocking operation on an asynchronous stream (see stream_communicator.h).
class StreamRequest final : public Request {
 public:
  // `results`: device memory that receives the staged results after completion (null for a send).
  StreamRequest(StreamSteps steps, std::shared_ptr<Staged> staged, void* results)
      : steps_(steps), staged_(std::move(staged)), results_(results) {}
  ~StreamRequest() override {
    if (waited_) return;
    try {
      wait();
    } catch (...) {  // a destructor cannot throw; the stream's synchronize reports queued failures
    }
  }
  StreamRequest(const StreamRequest&) = delete;
  StreamRequest& operator=(const StreamRequest&) = delete;

  bool test() override {
    const std::unique_lock lock(staged_->mutex, std::try_to_lock);
    if (!lock.owns_lock()) return false;  // the stream's host thread is starting it or waiting for it
    if (!staged_->completed && staged_->request) staged_->completed = staged_->request->test();
    return staged_->completed;
  }

  void wait() override {
    if (waited_) return;
    waited_ = true;
    steps_.host([staged = staged_] {
      const std::lock_guard lock(staged->mutex);
      if (staged->request) staged->request->wait();  // null when starting it failed (reported already)
      staged->completed = true;
    });
    if (results_) {
      steps_.copy_out_and_release(results_, staged_);
    } else {
      steps_.release(staged_);
    }
  }

 private:
  StreamSteps steps_;
  std::shared_ptr<Staged> staged_;
  void* results_;
  bool waited_ = false;
};

// `host_` bound to a stream of an asynchronous table.
class StreamCommunicator final : public Communicator {
 public:
  StreamCommunicator(std::unique_ptr<Communicator> host, const backend::Ops& ops, backend::Stream stream)
      : host_(std::move(host)), steps_(ops, stream) {}
  ~StreamCommunicator() override {
    try {
      steps_.ops().synchronize(steps_.stream());  // queued work calls host_
    } catch (...) {  // a destructor cannot throw
    }
  }
  StreamCommunicator(const StreamCommunicator&) = delete;
  StreamCommunicator& operator=(const StreamCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    detail::check_count("all_reduce", count);
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->recv, data, bytes_of(count, dtype));
    steps_.host([staged, host = host_.get(), count, dtype, op] {
      host->all_reduce(staged->recv.data(), count, dtype, op);
    });
    steps_.copy_out_and_release(data, std::move(staged));
  }

  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override {
    detail::check_count("reduce_scatter", recv_count);
    detail::is_own_block("reduce_scatter", send, recv, recv_count, dtype, rank(), size());
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->send, send, bytes_of(recv_count * size(), dtype));
    staged->recv.resize(bytes_of(recv_count, dtype));
    steps_.host([staged, host = host_.get(), recv_count, dtype, op] {
      host->reduce_scatter(staged->send.data(), staged->recv.data(), recv_count, dtype, op);
    });
    steps_.copy_out_and_release(recv, std::move(staged));
  }

  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    detail::check_count("all_gather", send_count);
    detail::is_own_block("all_gather", recv, send, send_count, dtype, rank(), size());
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->send, send, bytes_of(send_count, dtype));
    staged->recv.resize(bytes_of(send_count * size(), dtype));
    steps_.host([staged, host = host_.get(), send_count, dtype] {
      host->all_gather(staged->send.data(), staged->recv.data(), send_count, dtype);
    });
    steps_.copy_out_and_release(recv, std::move(staged));
  }

  void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) override {
    detail::check_count("all_to_all", count_per_rank);
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->send, send, bytes_of(count_per_rank * size(), dtype));
    staged->recv.resize(bytes_of(count_per_rank * size(), dtype));
    steps_.host([staged, host = host_.get(), count_per_rank, dtype] {
      host->all_to_all(staged->send.data(), staged->recv.data(), count_per_rank, dtype);
    });
    steps_.copy_out_and_release(recv, std::move(staged));
  }

  void all_to_allv(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                   const int64_t* recv_counts, const int64_t* recv_offsets, DType dtype) override {
    detail::check_counts("all_to_allv", send_counts, send_offsets, size());
    detail::check_counts("all_to_allv", recv_counts, recv_offsets, size());
    const auto n = static_cast<size_t>(size());
    // The host arrays are read now; the pieces travel in staging that spans every piece, the
    // receive side copied in first so the gaps between pieces come back unchanged.
    std::vector<int64_t> arrays(send_counts, send_counts + n);
    arrays.insert(arrays.end(), send_offsets, send_offsets + n);
    arrays.insert(arrays.end(), recv_counts, recv_counts + n);
    arrays.insert(arrays.end(), recv_offsets, recv_offsets + n);
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->send, send, bytes_of(extent(send_counts, send_offsets), dtype));
    steps_.copy_in(staged->recv, recv, bytes_of(extent(recv_counts, recv_offsets), dtype));
    steps_.host([staged, host = host_.get(), arrays = std::move(arrays), n, dtype] {
      host->all_to_allv(staged->send.data(), arrays.data(), arrays.data() + n, staged->recv.data(),
                        arrays.data() + 2 * n, arrays.data() + 3 * n, dtype);
    });
    steps_.copy_out_and_release(recv, std::move(staged));
  }

  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    detail::check_count("broadcast", count);
    detail::check_root("broadcast", root, size());
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->recv, data, bytes_of(count, dtype));
    steps_.host([staged, host = host_.get(), count, dtype, root] {
      host->broadcast(staged->recv.data(), count, dtype, root);
    });
    steps_.copy_out_and_release(data, std::move(staged));
  }

  void barrier() override {
    steps_.host([host = host_.get()] { host->barrier(); });
  }

  void send(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    check_message("send", count, peer, tag);
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->send, data, bytes_of(count, dtype));
    steps_.host([staged, host = host_.get(), count, dtype, peer, tag] {
      host->send(staged->send.data(), count, dtype, peer, tag);
    });
    steps_.release(std::move(staged));
  }

  void recv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    check_message("recv", count, peer, tag);
    auto staged = std::make_shared<Staged>();
    staged->recv.resize(bytes_of(count, dtype));
    steps_.host([staged, host = host_.get(), count, dtype, peer, tag] {
      host->recv(staged->recv.data(), count, dtype, peer, tag);
    });
    steps_.copy_out_and_release(data, std::move(staged));
  }

  std::unique_ptr<Request> all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override {
    detail::check_count("all_reduce_async", count);
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->recv, data, bytes_of(count, dtype));
    return start(std::move(staged), data, [count, dtype, op](Communicator& host, Staged& s) {
      return host.all_reduce_async(s.recv.data(), count, dtype, op);
    });
  }

  std::unique_ptr<Request> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                                ReduceOp op) override {
    detail::check_count("reduce_scatter_async", recv_count);
    detail::is_own_block("reduce_scatter_async", send, recv, recv_count, dtype, rank(), size());
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->send, send, bytes_of(recv_count * size(), dtype));
    staged->recv.resize(bytes_of(recv_count, dtype));
    return start(std::move(staged), recv, [recv_count, dtype, op](Communicator& host, Staged& s) {
      return host.reduce_scatter_async(s.send.data(), s.recv.data(), recv_count, dtype, op);
    });
  }

  std::unique_ptr<Request> all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    detail::check_count("all_gather_async", send_count);
    detail::is_own_block("all_gather_async", recv, send, send_count, dtype, rank(), size());
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->send, send, bytes_of(send_count, dtype));
    staged->recv.resize(bytes_of(send_count * size(), dtype));
    return start(std::move(staged), recv, [send_count, dtype](Communicator& host, Staged& s) {
      return host.all_gather_async(s.send.data(), s.recv.data(), send_count, dtype);
    });
  }

  std::unique_ptr<Request> send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    check_message("send_async", count, peer, tag);
    auto staged = std::make_shared<Staged>();
    steps_.copy_in(staged->send, data, bytes_of(count, dtype));
    return start(std::move(staged), nullptr, [count, dtype, peer, tag](Communicator& host, Staged& s) {
      return host.send_async(s.send.data(), count, dtype, peer, tag);
    });
  }

  std::unique_ptr<Request> recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override {
    check_message("recv_async", count, peer, tag);
    auto staged = std::make_shared<Staged>();
    staged->recv.resize(bytes_of(count, dtype));
    return start(std::move(staged), data, [count, dtype, peer, tag](Communicator& host, Staged& s) {
      return host.recv_async(s.recv.data(), count, dtype, peer, tag);
    });
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    steps_.ops().synchronize(steps_.stream());
    return std::make_unique<StreamCommunicator>(host_->split(color, key), steps_.ops(), steps_.stream());
  }

  void progress() override { host_->progress(); }
  double wait_seconds() const override { return host_->wait_seconds(); }

 private:
  // The element extent of the pieces (count, offset) of every rank.
  int64_t extent(const int64_t* counts, const int64_t* offsets) const {
    int64_t end = 0;
    for (int r = 0; r < size(); ++r) {
      if (counts[r] > 0) end = std::max(end, offsets[r] + counts[r]);
    }
    return end;
  }
  void check_message(const char* op, int64_t count, int peer, int tag) const {
    detail::check_count(op, count);
    detail::check_peer(op, peer, rank(), size());
    if (tag < 0) throw Error(op, "negative tag " + std::to_string(tag));
  }
  // Queues the host function that starts `host_`'s non-blocking operation on the staging.
  template <typename Start>
  std::unique_ptr<Request> start(std::shared_ptr<Staged> staged, void* results, Start start_on_host) {
    steps_.host([staged, host = host_.get(), start_on_host] {
      const std::lock_guard lock(staged->mutex);
      staged->request = start_on_host(*host, *staged);
    });
    return std::make_unique<StreamRequest>(steps_, std::move(staged), results);
  }

  std::unique_ptr<Communicator> host_;
  StreamSteps steps_;
};

}  // namespace

std::unique_ptr<Communicator> make_stream_communicator(std::unique_ptr<Communicator> host, const backend::Ops& ops,
                                                       backend::Stream stream) {
  if (ops.synchronous) return host;  // program order is stream order, host memory the table's
  return std::make_unique<StreamCommunicator>(std::move(host), ops, stream);
}

std::unique_ptr<Communicator> make_mpi_data_group(Communicator& control, const backend::Ops& ops,
                                                  backend::Stream stream) {
  return make_stream_communicator(control.split(0, control.rank()), ops, stream);
}

}  // namespace mt::comm
