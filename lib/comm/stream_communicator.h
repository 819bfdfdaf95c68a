// Data communicators (communicator.h): a host communicator bound to a backend stream, and the
// factory type by which a backend turns a process group's control communicator into its data
// communicator (parallel/process_groups.h takes one).
//
// make_stream_communicator(host, ops, stream) orders `host`'s operations on `stream`:
// - On a synchronous table (the CPU) it returns `host` as it is: a control communicator already
//   works on the table's memory (host memory) in program order, which is that table's stream
//   order. So a data communicator on the CPU makes the same MPI calls, blocks and completes
//   requests as the control communicator does, at no cost per call (a wrapper that forwarded each
//   call cost 5 ns per call, tests/bench/bench_stream_communicator.cpp).
// - On an asynchronous table MPI never touches device memory. A blocking operation queues a copy
//   of its inputs into host staging memory it owns (the table's device_to_host copy), a host
//   function running `host`'s blocking operation on the staging (launch_host_function), and a
//   copy of the results back (host_to_device): MPI runs on the stream's host thread in stream
//   order, as a device communication library's kernel would. A non-blocking operation queues the
//   copy in and a host function that starts `host`'s non-blocking operation on the staging;
//   its wait() queues a host function that waits for it, then the copy out. So ring messages can
//   cross while the stream computes, and no progress MPI makes in the background reads memory
//   the backend protects. split() synchronizes the stream first (a host MPI call must not run
//   beside queued ones on the same communicator). Destroying it synchronizes the stream.
// Tested in tests/mpi/test_stream_communicator.cpp (under mpirun, on the CPU table and on the
// asynchronous CPU table of tests/backend/async_cpu_ops.h) and
// tests/unit/comm/test_stream_communicator.cpp (one rank).
#pragma once

#include <functional>
#include <memory>

#include "backend/ops.h"
#include "comm/communicator.h"

namespace mt::comm {

// `host` (a control communicator: MPI or a group of one) bound to `stream` of `ops`.
std::unique_ptr<Communicator> make_stream_communicator(std::unique_ptr<Communicator> host, const backend::Ops& ops,
                                                       backend::Stream stream);

// How a backend makes a group's data communicator from the group's control communicator:
// collective over `control`; the result holds the same ranks in the same order, bound to (ops,
// stream), and its messages never match the control communicator's.
using DataGroupFactory =
    std::function<std::unique_ptr<Communicator>(Communicator& control, const backend::Ops& ops, backend::Stream stream)>;

// MPI's data group, the CPU's factory (and any backend's without a device communication
// library): a duplicate of `control` (split) bound to the stream by make_stream_communicator.
std::unique_ptr<Communicator> make_mpi_data_group(Communicator& control, const backend::Ops& ops,
                                                  backend::Stream stream);

}  // namespace mt::comm
