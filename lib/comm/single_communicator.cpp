// The single-rank communicator (see communicator.h): a group of one, where every collective is an
// identity or a copy and point-to-point messages have no peer.
#include <cstring>

#include "comm/arguments.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace mt::comm {
namespace {

class DoneRequest final : public Request {
 public:
  bool test() override { return true; }
  void wait() override {}
};

void copy_elements(const void* from, void* to, int64_t count, DType dtype) {
  if (from != to && count > 0) std::memmove(to, from, static_cast<size_t>(count) * dtype_size(dtype));
}

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

  void all_reduce(void*, int64_t count, DType, ReduceOp) override { detail::check_count("all_reduce", count); }
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp) override {
    detail::check_count("reduce_scatter", recv_count);
    copy_elements(send, recv, recv_count, dtype);
  }
  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    detail::check_count("all_gather", send_count);
    copy_elements(send, recv, send_count, dtype);
  }
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) override {
    detail::check_count("all_to_all", count_per_rank);
    copy_elements(send, recv, count_per_rank, dtype);
  }
  void all_to_allv(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                   const int64_t* recv_counts, const int64_t* recv_offsets, DType dtype) override {
    detail::check_counts("all_to_allv", send_counts, send_offsets, 1);
    detail::check_counts("all_to_allv", recv_counts, recv_offsets, 1);
    if (send_counts[0] != recv_counts[0]) {
      throw Error("all_to_allv", "rank 0 sends itself " + std::to_string(send_counts[0]) + " elements but receives " +
                                     std::to_string(recv_counts[0]));
    }
    const size_t element = dtype_size(dtype);
    copy_elements(static_cast<const unsigned char*>(send) + send_offsets[0] * element,
                  static_cast<unsigned char*>(recv) + recv_offsets[0] * element, send_counts[0], dtype);
  }
  void broadcast(void*, int64_t count, DType, int root) override {
    detail::check_count("broadcast", count);
    detail::check_root("broadcast", root, 1);
  }
  void barrier() override {}
  void send(const void*, int64_t, DType, int peer, int) override { detail::check_peer("send", peer, 0, 1); }
  void recv(void*, int64_t, DType, int peer, int) override { detail::check_peer("recv", peer, 0, 1); }

  std::unique_ptr<Request> all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override {
    all_reduce(data, count, dtype, op);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                                ReduceOp op) override {
    reduce_scatter(send, recv, recv_count, dtype, op);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    all_gather(send, recv, send_count, dtype);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    send(data, count, dtype, peer, tag);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override {
    recv(data, count, dtype, peer, tag);
    return std::make_unique<DoneRequest>();
  }

  std::unique_ptr<Communicator> split(int color, int) override {
    if (color < 0) throw Error("split", "negative color " + std::to_string(color));
    return std::make_unique<SingleCommunicator>();
  }
  double wait_seconds() const override { return 0.0; }
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

}  // namespace mt::comm
