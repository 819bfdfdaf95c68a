// The MPI communicator (see mpi_communicator.h and communicator.h). Blocking operations use MPI's
// blocking collectives (OpenMPI tunes those better than the non-blocking ones); non-blocking ones
// wrap MPI_I* requests. Buffers longer than max_count_per_call elements move as one element of a
// derived datatype, reductions in chunks of max_count_per_call (MPI's predefined reduction ops
// take only basic datatypes); all_to_allv sends each rank's piece as a datatype that holds its
// absolute address, so its int64 counts and offsets never pass through MPI's int arguments.
#include "comm/mpi_communicator.h"

#include <atomic>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/arguments.h"
#include "comm/mpi_runtime.h"
#include "comm/progress_thread.h"
#include "core/clock.h"
#include "core/error.h"
#include "kernels/common/half.h"

namespace mt::comm {
namespace {

using Clock = std::chrono::steady_clock;

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(call, std::string(text, static_cast<size_t>(length)));
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

MPI_Datatype basic_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i8: return MPI_INT8_T;
    case DType::i16: return MPI_INT16_T;
    case DType::bf16:
    case DType::f16:
    case DType::u16: return MPI_UINT16_T;
  }
  throw Error("communicator", "unknown dtype");
}

const unsigned char* at(const void* base, int64_t index, DType dtype) {
  return static_cast<const unsigned char*>(base) + index * static_cast<int64_t>(dtype_size(dtype));
}
unsigned char* at(void* base, int64_t index, DType dtype) {
  return static_cast<unsigned char*>(base) + index * static_cast<int64_t>(dtype_size(dtype));
}

// Calls fn(first, n) over [0, count) in pieces of at most `max_count` elements.
template <typename Fn>
void for_each_chunk(int64_t count, int64_t max_count, Fn fn) {
  for (int64_t first = 0; first < count; first += max_count) {
    fn(first, static_cast<int>(std::min(max_count, count - first)));
  }
}

// ---- bf16 and f16 reductions: MPI has neither type, so user-defined ops over the uint16 bits,
// combining in fp32 and rounding each pairwise result (round to nearest even).
struct Sum {
  static float apply(float a, float b) { return a + b; }
};
struct Max {
  static float apply(float a, float b) { return b > a ? b : a; }
};
struct Min {
  static float apply(float a, float b) { return b < a ? b : a; }
};

template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float), typename Combine>
void reduce_half(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = Narrow(Combine::apply(Widen(a[i]), Widen(b[i])));
}

using kernels::bf16_bits_to_fp32;
using kernels::fp16_bits_to_fp32;
using kernels::fp32_to_bf16_bits;
using kernels::fp32_to_fp16_bits;

// A committed derived datatype, freed with its owner (MPI keeps it alive for operations in flight).
class OwnedType {
 public:
  OwnedType() = default;
  explicit OwnedType(MPI_Datatype type) : type_(type) {}
  OwnedType(OwnedType&& other) noexcept : type_(std::exchange(other.type_, MPI_DATATYPE_NULL)) {}
  OwnedType& operator=(OwnedType&& other) noexcept {
    reset();
    type_ = std::exchange(other.type_, MPI_DATATYPE_NULL);
    return *this;
  }
  ~OwnedType() { reset(); }
  MPI_Datatype get() const { return type_; }

 private:
  void reset() {
    if (type_ != MPI_DATATYPE_NULL && !mpi_finalized()) MPI_Type_free(&type_);
    type_ = MPI_DATATYPE_NULL;
  }
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// `count` elements as MPI sees them: (count, basic type) when the count fits one call, else one
// element of a contiguous derived type of exactly count elements.
struct Elements {
  int count = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  OwnedType owned;
};

Elements describe(int64_t count, DType dtype, int64_t max_count) {
  Elements elements;
  const MPI_Datatype basic = basic_type(dtype);
  if (count <= max_count) {
    elements.count = static_cast<int>(count);
    elements.type = basic;
    return elements;
  }
  const int64_t chunks = count / max_count, rest = count % max_count;
  const auto element = static_cast<MPI_Aint>(dtype_size(dtype));
  MPI_Datatype chunk, body, whole, sized;
  check(MPI_Type_contiguous(static_cast<int>(max_count), basic, &chunk), "MPI_Type_contiguous");
  check(MPI_Type_contiguous(static_cast<int>(chunks), chunk, &body), "MPI_Type_contiguous");
  MPI_Type_free(&chunk);
  if (rest == 0) {
    whole = body;
  } else {
    MPI_Datatype tail;
    check(MPI_Type_contiguous(static_cast<int>(rest), basic, &tail), "MPI_Type_contiguous");
    int lengths[2] = {1, 1};
    MPI_Aint displacements[2] = {0, static_cast<MPI_Aint>(chunks * max_count) * element};
    MPI_Datatype types[2] = {body, tail};
    check(MPI_Type_create_struct(2, lengths, displacements, types, &whole), "MPI_Type_create_struct");
    MPI_Type_free(&body);
    MPI_Type_free(&tail);
  }
  check(MPI_Type_create_resized(whole, 0, static_cast<MPI_Aint>(count) * element, &sized), "MPI_Type_create_resized");
  MPI_Type_free(&whole);
  check(MPI_Type_commit(&sized), "MPI_Type_commit");
  elements.count = 1;
  elements.type = sized;
  elements.owned = OwnedType(sized);
  return elements;
}

// `count` elements at `pointer` as one datatype holding their absolute address (for MPI_BOTTOM).
OwnedType addressed(const void* pointer, int64_t count, DType dtype, int64_t max_count) {
  const Elements elements = describe(count, dtype, max_count);
  MPI_Aint address;
  check(MPI_Get_address(pointer, &address), "MPI_Get_address");
  MPI_Datatype type;
  check(MPI_Type_create_struct(1, &elements.count, &address, &elements.type, &type), "MPI_Type_create_struct");
  check(MPI_Type_commit(&type), "MPI_Type_commit");
  return OwnedType(type);
}

// What a communicator and every group split from it share: options, the half-precision
// reduction ops, the progress thread and a private communicator for progress().
struct ProcessContext {
  explicit ProcessContext(const MpiCommunicatorOptions& options_in) : options(options_in) {
    if (options.max_count_per_call < 1 || options.max_count_per_call > INT_MAX) {
      throw Error("max_count_per_call", std::to_string(options.max_count_per_call) + " is outside [1, INT_MAX]");
    }
    int* tag_ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
    if (found && tag_ub) tag_upper_bound = *tag_ub;
    check(MPI_Op_create(&reduce_half<bf16_bits_to_fp32, fp32_to_bf16_bits, Sum>, 1, &half_ops[0][0]), "MPI_Op_create");
    check(MPI_Op_create(&reduce_half<bf16_bits_to_fp32, fp32_to_bf16_bits, Max>, 1, &half_ops[0][1]), "MPI_Op_create");
    check(MPI_Op_create(&reduce_half<bf16_bits_to_fp32, fp32_to_bf16_bits, Min>, 1, &half_ops[0][2]), "MPI_Op_create");
    check(MPI_Op_create(&reduce_half<fp16_bits_to_fp32, fp32_to_fp16_bits, Sum>, 1, &half_ops[1][0]), "MPI_Op_create");
    check(MPI_Op_create(&reduce_half<fp16_bits_to_fp32, fp32_to_fp16_bits, Max>, 1, &half_ops[1][1]), "MPI_Op_create");
    check(MPI_Op_create(&reduce_half<fp16_bits_to_fp32, fp32_to_fp16_bits, Min>, 1, &half_ops[1][2]), "MPI_Op_create");
    check(MPI_Comm_dup(MPI_COMM_SELF, &probe_comm), "MPI_Comm_dup");
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (options.progress_thread && provided == MPI_THREAD_MULTIPLE) {
      progress = std::make_unique<ProgressThread>(options.progress_interval);
    }
  }
  ~ProcessContext() {
    progress.reset();
    if (mpi_finalized()) return;
    for (auto& row : half_ops)
      for (MPI_Op& op : row) MPI_Op_free(&op);
    MPI_Comm_free(&probe_comm);
  }
  ProcessContext(const ProcessContext&) = delete;
  ProcessContext& operator=(const ProcessContext&) = delete;

  MPI_Op op(DType dtype, ReduceOp reduce) const {
    const int which = reduce == ReduceOp::sum ? 0 : reduce == ReduceOp::max ? 1 : 2;
    if (dtype == DType::bf16) return half_ops[0][which];
    if (dtype == DType::f16) return half_ops[1][which];
    return which == 0 ? MPI_SUM : which == 1 ? MPI_MAX : MPI_MIN;
  }

  MpiCommunicatorOptions options;
  int tag_upper_bound = 32767;  // the least MPI guarantees
  MPI_Op half_ops[2][3] = {};   // [bf16, f16][sum, max, min]
  MPI_Comm probe_comm = MPI_COMM_NULL;
  std::unique_ptr<ProgressThread> progress;
};

// One process group: its MPI communicator and blocked-time account, shared with its requests.
struct Group {
  Group(std::shared_ptr<ProcessContext> process_in, MPI_Comm comm_in) : process(std::move(process_in)), comm(comm_in) {
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  ~Group() {
    if (!mpi_finalized()) MPI_Comm_free(&comm);
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  std::shared_ptr<ProcessContext> process;
  MPI_Comm comm;
  int rank = 0, size = 1;
  // Written by the one thread using the group at a time (a stream's worker, for a communicator
  // bound to an asynchronous stream), read by any: relaxed, a plain load and store.
  std::atomic<double> wait_seconds{0};
};

// Adds the time from construction to destruction to a group's blocked time.
class BlockedTime {
 public:
  explicit BlockedTime(Group& group) : group_(group), start_(Clock::now()) {}
  ~BlockedTime() {
    const double blocked = seconds_since(start_);
    group_.wait_seconds.store(group_.wait_seconds.load(std::memory_order_relaxed) + blocked, std::memory_order_relaxed);
  }
  BlockedTime(const BlockedTime&) = delete;
  BlockedTime& operator=(const BlockedTime&) = delete;

 private:
  Group& group_;
  Clock::time_point start_;
};

// The number of basic elements a receive got, checked against what the caller expected.
void check_received(const char* op, const MPI_Status& status, MPI_Datatype type, int64_t expected, int peer, int tag) {
  MPI_Count received = 0;
  check(MPI_Get_elements_x(&status, type, &received), "MPI_Get_elements_x");
  if (received != expected) {
    throw Error(op, "the message from rank " + std::to_string(peer) + " with tag " + std::to_string(tag) + " has " +
                        std::to_string(received) + " elements, expected " + std::to_string(expected));
  }
}

class MpiRequest final : public Request {
 public:
  MpiRequest(std::shared_ptr<Group> group, const char* op) : group_(std::move(group)), op_(op) {}
  ~MpiRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (...) {  // a destructor cannot throw; the failure was the caller's to collect
    }
  }
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;

  // Starting: the MPI_I* calls append their handles, then launched() registers the operation.
  MPI_Request* next_handle() {
    handles_.push_back(MPI_REQUEST_NULL);
    return &handles_.back();
  }
  std::vector<unsigned char>& staging() { return staging_; }
  // Runs once after every handle completed, with their statuses (copy-outs, length checks).
  void on_complete(std::function<void(const std::vector<MPI_Status>&)> fn) { on_complete_ = std::move(fn); }
  void launched() {
    if (group_->process->progress && !handles_.empty()) {
      group_->process->progress->operation_started();
      registered_ = true;
    }
  }

  bool test() override {
    if (done_) return finished();
    BlockedTime blocked(*group_);
    statuses_.resize(handles_.size());
    int flag = 0;
    const int code = MPI_Testall(static_cast<int>(handles_.size()), handles_.data(), &flag, statuses_.data());
    if (code != MPI_SUCCESS || flag) complete(code);
    return done_ ? finished() : false;
  }

  void wait() override {
    if (done_) {
      finished();
      return;
    }
    BlockedTime blocked(*group_);
    statuses_.resize(handles_.size());
    complete(MPI_Waitall(static_cast<int>(handles_.size()), handles_.data(), statuses_.data()));
    finished();
  }

 private:
  void complete(int code) {
    done_ = true;
    if (registered_) group_->process->progress->operation_finished();
    try {
      if (code == MPI_ERR_IN_STATUS) {
        for (const MPI_Status& status : statuses_) check(status.MPI_ERROR, op_);
      }
      check(code, op_);
      if (on_complete_) on_complete_(statuses_);
    } catch (...) {
      failure_ = std::current_exception();
    }
  }
  bool finished() const {
    if (failure_) std::rethrow_exception(failure_);
    return true;
  }

  std::shared_ptr<Group> group_;
  const char* op_;
  std::vector<MPI_Request> handles_;
  std::vector<MPI_Status> statuses_;
  std::vector<unsigned char> staging_;
  std::function<void(const std::vector<MPI_Status>&)> on_complete_;
  bool registered_ = false, done_ = false;
  std::exception_ptr failure_;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::shared_ptr<Group> group) : group_(std::move(group)) {}

  int rank() const override { return group_->rank; }
  int size() const override { return group_->size; }

  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    detail::check_count("all_reduce", count);
    const MPI_Datatype type = basic_type(dtype);
    const MPI_Op mpi_op = process().op(dtype, op);
    BlockedTime blocked(*group_);
    for_each_chunk(count, max_count(), [&](int64_t first, int n) {
      check(MPI_Allreduce(MPI_IN_PLACE, at(data, first, dtype), n, type, mpi_op, comm()), "MPI_Allreduce");
    });
  }

  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override {
    detail::check_count("reduce_scatter", recv_count);
    const bool in_place = detail::is_own_block("reduce_scatter", send, recv, recv_count, dtype, rank(), size());
    std::vector<unsigned char> staging(in_place ? static_cast<size_t>(recv_count) * dtype_size(dtype) : 0);
    void* out = in_place ? staging.data() : recv;
    const MPI_Datatype type = basic_type(dtype);
    const MPI_Op mpi_op = process().op(dtype, op);
    BlockedTime blocked(*group_);
    if (recv_count <= max_count()) {
      check(MPI_Reduce_scatter_block(send, out, static_cast<int>(recv_count), type, mpi_op, comm()),
            "MPI_Reduce_scatter_block");
    } else {
      for (int root = 0; root < size(); ++root) {
        for_each_chunk(recv_count, max_count(), [&](int64_t first, int n) {
          check(MPI_Reduce(at(send, root * recv_count + first, dtype), root == rank() ? at(out, first, dtype) : nullptr,
                           n, type, mpi_op, root, comm()),
                "MPI_Reduce");
        });
      }
    }
    if (in_place && !staging.empty()) std::memcpy(recv, staging.data(), staging.size());
  }

  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override {
    detail::check_count("all_gather", send_count);
    if (send_count == 0) return;
    const bool in_place = detail::is_own_block("all_gather", recv, send, send_count, dtype, rank(), size());
    const Elements elements = describe(send_count, dtype, max_count());
    BlockedTime blocked(*group_);
    check(MPI_Allgather(in_place ? MPI_IN_PLACE : send, elements.count, elements.type, recv, elements.count,
                        elements.type, comm()),
          "MPI_Allgather");
  }

  void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) override {
    detail::check_count("all_to_all", count_per_rank);
    if (count_per_rank == 0) return;
    const Elements elements = describe(count_per_rank, dtype, max_count());
    BlockedTime blocked(*group_);
    check(MPI_Alltoall(send, elements.count, elements.type, recv, elements.count, elements.type, comm()),
          "MPI_Alltoall");
  }

  void all_to_allv(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                   const int64_t* recv_counts, const int64_t* recv_offsets, DType dtype) override {
    detail::check_counts("all_to_allv", send_counts, send_offsets, size());
    detail::check_counts("all_to_allv", recv_counts, recv_offsets, size());
    const auto n = static_cast<size_t>(size());
    std::vector<OwnedType> owned;
    owned.reserve(2 * n);
    std::vector<int> send_lengths(n), recv_lengths(n), displacements(n, 0);
    std::vector<MPI_Datatype> send_types(n, MPI_BYTE), recv_types(n, MPI_BYTE);
    for (size_t r = 0; r < n; ++r) {
      if (send_counts[r] > 0) {
        owned.push_back(addressed(at(send, send_offsets[r], dtype), send_counts[r], dtype, max_count()));
        send_types[r] = owned.back().get();
        send_lengths[r] = 1;
      }
      if (recv_counts[r] > 0) {
        owned.push_back(addressed(at(recv, recv_offsets[r], dtype), recv_counts[r], dtype, max_count()));
        recv_types[r] = owned.back().get();
        recv_lengths[r] = 1;
      }
    }
    BlockedTime blocked(*group_);
    check(MPI_Alltoallw(MPI_BOTTOM, send_lengths.data(), displacements.data(), send_types.data(), MPI_BOTTOM,
                        recv_lengths.data(), displacements.data(), recv_types.data(), comm()),
          "MPI_Alltoallw");
  }

  void broadcast(void* data, int64_t count, DType dtype, int root) override {
    detail::check_count("broadcast", count);
    detail::check_root("broadcast", root, size());
    if (count == 0) return;
    const Elements elements = describe(count, dtype, max_count());
    BlockedTime blocked(*group_);
    check(MPI_Bcast(data, elements.count, elements.type, root, comm()), "MPI_Bcast");
  }

  void barrier() override {
    BlockedTime blocked(*group_);
    check(MPI_Barrier(comm()), "MPI_Barrier");
  }

  void send(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    check_message("send", count, peer, tag);
    const Elements elements = describe(count, dtype, max_count());
    BlockedTime blocked(*group_);
    check(MPI_Send(data, elements.count, elements.type, peer, tag, comm()), "MPI_Send");
  }

  void recv(void* data, int64_t count, DType dtype, int peer, int tag) override {
    check_message("recv", count, peer, tag);
    const Elements elements = describe(count, dtype, max_count());
    MPI_Status status;
    BlockedTime blocked(*group_);
    check(MPI_Recv(data, elements.count, elements.type, peer, tag, comm(), &status), "MPI_Recv");
    check_received("recv", status, basic_type(dtype), count, peer, tag);
  }

  std::unique_ptr<Request> all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override {
    detail::check_count("all_reduce_async", count);
    const MPI_Datatype type = basic_type(dtype);
    const MPI_Op mpi_op = process().op(dtype, op);
    auto request = std::make_unique<MpiRequest>(group_, "MPI_Iallreduce");
    for_each_chunk(count, max_count(), [&](int64_t first, int n) {
      check(MPI_Iallreduce(MPI_IN_PLACE, at(data, first, dtype), n, type, mpi_op, comm(), request->next_handle()),
            "MPI_Iallreduce");
    });
    request->launched();
    return request;
  }

  std::unique_ptr<Request> reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                                ReduceOp op) override {
    detail::check_count("reduce_scatter_async", recv_count);
    const bool in_place = detail::is_own_block("reduce_scatter_async", send, recv, recv_count, dtype, rank(), size());
    const MPI_Datatype type = basic_type(dtype);
    const MPI_Op mpi_op = process().op(dtype, op);
    auto request = std::make_unique<MpiRequest>(group_, "MPI_Ireduce_scatter_block");
    void* out = recv;
    if (in_place) {
      auto& staging = request->staging();
      staging.resize(static_cast<size_t>(recv_count) * dtype_size(dtype));
      out = staging.data();
      request->on_complete([recv, &staging](const std::vector<MPI_Status>&) {
        if (!staging.empty()) std::memcpy(recv, staging.data(), staging.size());
      });
    }
    if (recv_count <= max_count()) {
      check(MPI_Ireduce_scatter_block(send, out, static_cast<int>(recv_count), type, mpi_op, comm(),
                                      request->next_handle()),
            "MPI_Ireduce_scatter_block");
    } else {
      for (int root = 0; root < size(); ++root) {
        for_each_chunk(recv_count, max_count(), [&](int64_t first, int n) {
          check(MPI_Ireduce(at(send, root * recv_count + first, dtype), root == rank() ? at(out, first, dtype) : nullptr,
                            n, type, mpi_op, root, comm(), request->next_handle()),
                "MPI_Ireduce");
        });
      }
    }
    request->launched();
    return request;
  }

  std::unique_ptr<Request> all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    detail::check_count("all_gather_async", send_count);
    auto request = std::make_unique<MpiRequest>(group_, "MPI_Iallgather");
    if (send_count == 0) return request;
    const bool in_place = detail::is_own_block("all_gather_async", recv, send, send_count, dtype, rank(), size());
    const Elements elements = describe(send_count, dtype, max_count());
    check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, elements.count, elements.type, recv, elements.count,
                         elements.type, comm(), request->next_handle()),
          "MPI_Iallgather");
    request->launched();
    return request;
  }

  std::unique_ptr<Request> send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    check_message("send_async", count, peer, tag);
    const Elements elements = describe(count, dtype, max_count());
    auto request = std::make_unique<MpiRequest>(group_, "MPI_Isend");
    check(MPI_Isend(data, elements.count, elements.type, peer, tag, comm(), request->next_handle()), "MPI_Isend");
    request->launched();
    return request;
  }

  std::unique_ptr<Request> recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override {
    check_message("recv_async", count, peer, tag);
    const Elements elements = describe(count, dtype, max_count());
    auto request = std::make_unique<MpiRequest>(group_, "MPI_Irecv");
    check(MPI_Irecv(data, elements.count, elements.type, peer, tag, comm(), request->next_handle()), "MPI_Irecv");
    const MPI_Datatype basic = basic_type(dtype);
    request->on_complete([basic, count, peer, tag](const std::vector<MPI_Status>& statuses) {
      check_received("recv_async", statuses.front(), basic, count, peer, tag);
    });
    request->launched();
    return request;
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) throw Error("split", "negative color " + std::to_string(color));
    MPI_Comm child = MPI_COMM_NULL;
    {
      BlockedTime blocked(*group_);
      check(MPI_Comm_split(comm(), color, key, &child), "MPI_Comm_split");
    }
    return std::make_unique<MpiCommunicator>(std::make_shared<Group>(group_->process, child));
  }

  void progress() override {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, process().probe_comm, &flag, MPI_STATUS_IGNORE);
  }

  double wait_seconds() const override { return group_->wait_seconds.load(std::memory_order_relaxed); }

  const ProcessContext& process() const { return *group_->process; }
  MPI_Comm comm() const { return group_->comm; }

 private:
  int64_t max_count() const { return process().options.max_count_per_call; }
  void check_message(const char* op, int64_t count, int peer, int tag) const {
    detail::check_count(op, count);
    detail::check_peer(op, peer, rank(), size());
    detail::check_tag(op, tag, process().tag_upper_bound);
  }

  std::shared_ptr<Group> group_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const MpiCommunicatorOptions& options) {
  auto process = std::make_shared<ProcessContext>(options);
  MPI_Comm duplicate = MPI_COMM_NULL;
  check(MPI_Comm_dup(comm, &duplicate), "MPI_Comm_dup");
  return std::make_unique<MpiCommunicator>(std::make_shared<Group>(std::move(process), duplicate));
}

bool has_progress_thread(const Communicator& communicator) {
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(&communicator);
  return mpi && mpi->process().progress;
}

MPI_Comm mpi_comm_of(const Communicator& communicator) {
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(&communicator);
  return mpi ? mpi->comm() : MPI_COMM_NULL;
}

long long progress_thread_polls(const Communicator& communicator) {
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(&communicator);
  return mpi && mpi->process().progress ? mpi->process().progress->polls() : 0;
}

std::unique_ptr<Communicator> make_world_communicator(bool progress_thread) {
  if (!MpiRuntime::active()) return make_single_communicator();
  MpiCommunicatorOptions options;
  options.progress_thread = progress_thread;
  return make_mpi_communicator(MPI_COMM_WORLD, options);
}

}  // namespace mt::comm
