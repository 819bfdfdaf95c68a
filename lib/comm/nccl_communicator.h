// NCCL data communicators (communicator.h's data kind) for the CUDA backend, and the choice of a
// backend's data-group factory (stream_communicator.h's DataGroupFactory).
//
// make_nccl_data_group(control, ops, stream) makes one NCCL communicator over the ranks of
// `control`: group rank 0 makes the unique id, the control communicator (MPI) broadcasts it, and
// every rank joins with ncclCommInitRankConfig on its current CUDA device, non-blocking, so the
// join is polled (ncclCommGetAsyncError) and bounded by the distributed timeout: past it the
// communicator is aborted (ncclCommAbort) and mt::Error names the operation. Then:
// - Blocking operations are queued on the bound stream (`stream`, the compute stream: the tensor-
//   parallel collectives), with nothing synchronised: the host returns once NCCL has queued them.
// - Non-blocking operations (all_reduce/reduce_scatter/all_gather_async: the data-parallel bucket
//   reductions and parameter gathers) run on a second stream the communicator owns, ordered after
//   the compute stream's work by an event; wait() makes the compute stream wait on the operation's
//   event (the host does not block), test() asks the event. So they overlap with compute.
// - Point to point: NCCL has no tags; a message matches the receive of the same peer in issue
//   order (mt's callers post matching sends and receives in the same order on both sides, which
//   MPI's tag matching then agrees with). Non-blocking sends and receives are collected and
//   issued together as one ncclGroupStart/ncclGroupEnd batch on the second stream at the next
//   other call on the communicator (a request's wait() or test(), a blocking call, a collective,
//   split): a ring's send to the next rank and receive from the previous one cannot deadlock, as
//   they could issued one by one (NCCL runs one communicator's operations in issue order). So
//   posted messages do not move during the compute issued before their wait(); progress() is a
//   no-op (NCCL needs no host progress, and issuing half a ring's messages could deadlock it).
//   all_to_all/all_to_allv are one grouped batch of sends and receives on the bound stream;
//   barrier is a one-element all-reduce on the bound stream.
// - Reductions take f32, bf16, f16, f64, i8, u8, i32 and i64 (NCCL's types; bf16 and f16 are
//   added in fp32 and rounded per step like MPI's); i16/u16 reductions throw naming the dtype.
//   Copies (all_gather, broadcast, all_to_all[v], send/recv) move bytes and take every dtype.
// - NCCL cannot see a receive's length: a count that differs from the message's is not detected
//   (MPI's communicator throws); callers must agree on counts as they do on the collectives.
// - Errors: an NCCL call's failure throws mt::Error naming the operation with NCCL's text and
//   last error. A failure of queued work (a peer lost) is raised by the communicator's next call
//   (every call first asks ncclCommGetAsyncError). A watchdog thread aborts the communicator when
//   an operation it queued has not completed within the distributed timeout, so a stream stuck on
//   a lost peer returns, and the next call throws mt::Error naming the operation that timed out.
// - split is ncclCommSplit (non-blocking, polled and bounded like the join); the child is bound to
//   the same stream. wait_seconds() counts the host time spent polling NCCL (join, split, and
//   operations NCCL answered "in progress"); stream waits do not block the host.
// NCCL needs one GPU per rank: two ranks on one GPU are refused by NCCL at the join.
// Tested in tests/gpu/test_nccl_one_rank.cpp (one rank, CTest label gpu, skipped without a
// device) and tests/gpu/test_nccl_two_ranks.cpp (mpirun -np 2, needs two GPUs, skipped with fewer).
#pragma once

#include <memory>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "comm/stream_communicator.h"

namespace mt::comm {

// Megatron's --distributed-timeout-minutes default (10 minutes), in seconds.
inline constexpr double kDefaultDistributedTimeoutSeconds = 600.0;

// Whether this program has the NCCL communicator (a CUDA build, linked with mt_cuda:
// backend/cuda_link.h).
bool nccl_built();

// A group's NCCL data communicator bound to `stream` of `ops` (a CUDA table), with the default
// distributed timeout: a DataGroupFactory. Collective over `control`. Throws mt::Error in a program
// without the NCCL communicator, for a table that is not CUDA's, and when the join fails or times out.
std::unique_ptr<Communicator> make_nccl_data_group(Communicator& control, const backend::Ops& ops,
                                                   backend::Stream stream);

// The NCCL factory with a distributed timeout of `timeout_seconds` (> 0) bounding the join, split
// and every queued operation (the watchdog).
DataGroupFactory nccl_data_group_factory(double timeout_seconds);

// The data-group factory for a backend's device: the CPU's is make_mpi_data_group; CUDA's is NCCL
// (with `timeout_seconds`) when this program has it, and an mt::Error naming the device otherwise.
DataGroupFactory data_group_factory(backend::Device device,
                                    double timeout_seconds = kDefaultDistributedTimeoutSeconds);

// The NCCL entries behind the three above: nccl_communicator.cpp (in mt_cuda only) installs them
// before main(), as backend/cuda_link.h's; unset, NCCL is refused by name.
struct NcclLink {
  std::unique_ptr<Communicator> (*make_data_group)(Communicator& control, const backend::Ops& ops,
                                                   backend::Stream stream, double timeout_seconds);
};
void install_nccl_link(const NcclLink& link);

}  // namespace mt::comm
