// The communicator interface every parallel dimension talks through: blocking and non-blocking
// collectives and point-to-point messages over one process group, and group split. Counts are in
// elements of `dtype` and may exceed INT_MAX; every rank of a group issues the same collectives in
// the same order with the same counts. Reductions take every dtype (bf16 and f16 are summed in
// fp32 and rounded once per pairwise step). Bad arguments (negative counts, a peer or root outside
// the group, a message to oneself, a negative tag) and MPI failures throw mt::Error naming the
// operation. A communicator is used by one thread at a time.
//
// Two kinds of communicator share this interface (parallel/process_groups.h holds both per group):
// - A control communicator works on host memory and is immediate: a blocking call returns when
//   its operation has completed, wait() blocks the host until it has. MPI's (mpi_communicator.h,
//   make_world_communicator) and the single-rank one are control communicators. They carry host
//   values (a loss, token counts, the decision to stop), barriers, tools, and HDF5's MPI-IO.
// - A data communicator is bound to a backend op table and one of its streams and takes that
//   backend's memory (stream_communicator.h: MPI bound to a stream; nccl_communicator.h: NCCL).
//   Its operations are ordered on the stream like the table's ops. The contract, for every backend:
//     * An operation reads its buffers after the work issued on the stream before the call, and
//       the work issued on the stream after a blocking call, or after a request's wait(), sees its
//       results.
//     * A call returns once the operation is ordered on the stream. The host may read or write a
//       buffer an operation uses (its inputs included) only after synchronizing the stream, or an
//       event recorded on it, after the blocking call or the wait(). Scalar arguments and
//       all_to_allv's count and offset arrays are read during the call.
//     * Stream work issued between a non-blocking operation and its wait() must not write the
//       operation's buffers, nor read a receive's (the synchronous CPU table runs MPI on them).
//     * Non-blocking forms: wait() orders later stream work after the operation's completion and
//       returns without blocking the host where the backend is asynchronous; test() says whether
//       the communication has completed (a true answer does not move a receive's data into its
//       buffer on an asynchronous backend: stream work issued after wait(), or after the request
//       is destroyed, which waits, sees it).
//     * An error in queued work is rethrown by the stream's next synchronize (NCCL's: by the
//       communicator's next call, nccl_communicator.h).
//   On a synchronous table (the CPU: ops.h `synchronous`) stream order is program order, so a data
//   communicator behaves, and costs, call for call as the control communicator it was made from.
//
// Progress: MPI moves a non-blocking operation's data only inside MPI calls. The MPI
// communicator runs one progress thread per process (MPI_THREAD_MULTIPLE) that polls MPI every
// millisecond while an operation this library started is in flight and sleeps otherwise; callers
// may also call progress() between chunks of compute. comm/progress_thread.h has the measured
// effect (tests/bench/bench_comm_overlap.cpp).
// Tested in tests/mpi/test_communicator.cpp (under mpirun), tests/mpi/test_stream_communicator.cpp
// (data communicators on the CPU and an asynchronous table) and
// tests/unit/comm/test_single_communicator.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace mt::comm {

enum class ReduceOp { sum, max, min };

// A non-blocking operation in flight. Its buffers must stay alive and untouched until it
// completes. test() makes progress and says whether it is done; wait() blocks until it is (and
// rethrows its failure); on a data communicator both keep their meaning in stream order (see
// above). Destroying an unfinished request waits for it.
class Request {
 public:
  virtual ~Request() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: every rank ends with the reduction of all ranks' `data`.
  virtual void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  // `send` holds size() * recv_count elements; rank r receives the reduction of block r. `recv`
  // may be block rank() of `send` (in place), as a distributed optimizer's grad shard is.
  virtual void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) = 0;
  // `recv` holds size() * send_count elements: block r is rank r's `send`. `send` may be block
  // rank() of `recv` (in place), as a distributed optimizer's parameter shard is.
  virtual void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) = 0;
  // Block r of `send` (count_per_rank elements) goes to rank r; block r of `recv` comes from it.
  virtual void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) = 0;
  // As all_to_all with per-rank counts and element offsets (arrays of size() entries); rank r's
  // send_counts[q] must equal rank q's recv_counts[r].
  virtual void all_to_allv(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                           const int64_t* recv_counts, const int64_t* recv_offsets, DType dtype) = 0;
  virtual void broadcast(void* data, int64_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;
  // Point to point with another rank of the group; a message matches the recv with the same
  // peer and tag (tag >= 0), in order. recv throws when the message's length differs from `count`.
  virtual void send(const void* data, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual void recv(void* data, int64_t count, DType dtype, int peer, int tag) = 0;

  // Non-blocking forms of the above.
  virtual std::unique_ptr<Request> all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual std::unique_ptr<Request> reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                                        DType dtype, ReduceOp op) = 0;
  virtual std::unique_ptr<Request> all_gather_async(const void* send, void* recv, int64_t send_count,
                                                    DType dtype) = 0;
  virtual std::unique_ptr<Request> send_async(const void* data, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual std::unique_ptr<Request> recv_async(void* data, int64_t count, DType dtype, int peer, int tag) = 0;

  // The ranks that pass the same `color` form a new group, ordered by `key` then by rank
  // (MPI_Comm_split). Collective over this group.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Lets MPI advance every non-blocking operation in flight in this process, without blocking:
  // cheap enough to call between layers or GEMM chunks. A no-op where nothing needs it.
  virtual void progress() {}

  // Seconds this communicator's calls have spent blocked (blocking collectives, wait(), and
  // test()) since it was made: the source of the step records' comm_wait_ms.
  virtual double wait_seconds() const = 0;
};

// Every rank ends with `root`'s `text`: its length, then its bytes (two broadcasts). Collective
// over the group, a control communicator (host memory); other ranks' `text` is replaced.
inline void broadcast_text(Communicator& group, std::string& text, int root) {
  int64_t length = static_cast<int64_t>(text.size());
  group.broadcast(&length, 1, DType::i64, root);
  text.resize(static_cast<size_t>(length));
  group.broadcast(text.data(), length, DType::u8, root);
}

// A control group of one: collectives are identities (or copies between distinct buffers); send
// and recv to oneself are an error.
std::unique_ptr<Communicator> make_single_communicator();

// The control world: MPI_COMM_WORLD when MpiRuntime is active, else a single-rank communicator.
// `progress_thread` false: MPI's world runs no progress thread (see "Progress" above), for a
// caller that tests its requests between pieces of work itself, as mt-tokenize --partitions does:
// the thread's thousand wake-ups a second would only take its core.
std::unique_ptr<Communicator> make_world_communicator(bool progress_thread = true);

}  // namespace mt::comm
