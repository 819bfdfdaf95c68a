// The communicator interface every parallel dimension talks through: blocking and non-blocking
// collectives and point-to-point messages over one process group, and group split. The MPI
// implementation works on host buffers (the one every test uses), NCCL (later) on device buffers
// behind the same interface, and the single-rank one makes every collective an identity or a copy.
// Counts are in elements of `dtype`; every rank of a group issues the same collectives in the same
// order. Tested in tests/mpi/test_communicator.cpp (under mpirun) and
// tests/unit/comm/test_single_communicator.cpp.
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace mt::comm {

enum class ReduceOp { sum, max, min };

// A non-blocking operation in flight. Its buffers must stay alive and untouched until it
// completes. test() makes progress and says whether it is done; wait() blocks until it is (and
// rethrows its failure). Destroying an unfinished request waits for it.
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
  // `send` holds size() * recv_count elements; rank r receives the reduction of block r.
  virtual void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) = 0;
  // `recv` holds size() * send_count elements: block r is rank r's `send`.
  virtual void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) = 0;
  // Block r of `send` (count_per_rank elements) goes to rank r; block r of `recv` comes from it.
  virtual void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) = 0;
  // As all_to_all with per-rank counts and element offsets (arrays of size() entries).
  virtual void all_to_allv(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                           const int64_t* recv_counts, const int64_t* recv_offsets, DType dtype) = 0;
  virtual void broadcast(void* data, int64_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;
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

  // Seconds this communicator's calls have spent blocked (blocking collectives, wait(), and
  // test()) since it was made: the source of the step records' comm_wait_ms.
  virtual double wait_seconds() const = 0;
};

// A group of one: collectives are identities (or copies between distinct buffers); send and
// recv to oneself are an error.
std::unique_ptr<Communicator> make_single_communicator();

// MPI_COMM_WORLD when MpiRuntime is active, else a single-rank communicator.
std::unique_ptr<Communicator> make_world_communicator();

}  // namespace mt::comm
