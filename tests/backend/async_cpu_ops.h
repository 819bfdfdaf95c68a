// An asynchronous CPU op table for tests: the CPU table's kernels, copies and conversions, run the
// way an asynchronous device runs them, so code that is right only because the CPU table is
// synchronous fails a test here, on a machine without a GPU.
// - Each stream has a worker thread that runs its ops in FIFO order; an entry returns once its op
//   is queued (the reductions too: they write device memory); copies with a host side copy on the
//   worker;
//   synchronize drains the stream's queue and rethrows the first error its work raised; events
//   record in stream order (the worker's clock when it reaches them); host functions run on the
//   worker in stream order.
// - "Device" memory (allocate) comes from an arena of anonymous mmap'ed pages kept PROT_NONE
//   while no worker runs an op, and made read-write only while one does (one mprotect over the
//   arena's used pages per op), so the host reading or writing device memory outside an op dies
//   with SIGSEGV. Host functions run with the arena closed, as a CUDA host function cannot touch
//   device memory. Kernels and copies check their pointers on the calling thread: a host pointer
//   where device memory belongs (or the other way round for a copy's host side) throws
//   std::invalid_argument naming the entry. Freed memory is handed back to the kernel (madvise),
//   so allocations are zero-filled; release waits for every stream first, as cudaFree does.
// - set_async_start_delay() lets a worker that finds work on an idle queue wait before starting
//   it (until the delay passes, or the host waits for the stream), so the host reading a queued
//   copy's destination without a synchronize reads a stale value every time, not by chance.
// One table per process (the entries are plain function pointers), made on first use. The
// equivalence suites can take it by being handed async_cpu_ops() where they take an Ops.
// Tested in tests/unit/backend/test_async_cpu_ops.cpp; used by tests/mpi/test_stream_communicator.cpp,
// tests/mpi/test_process_groups.cpp and tests/mpi/test_ring_attention.cpp.
#pragma once

#include <chrono>
#include <cstdint>

#include "backend/ops.h"

namespace mt::test_backend {

// The table: name "async-cpu", device cpu, not synchronous; default_stream() is its first stream.
const backend::Ops& async_cpu_ops();

// A new stream with a worker of its own (streams live as long as the process).
backend::Stream new_async_stream();

// The wait of a worker that finds work on an idle queue (0, the default: it starts at once).
void set_async_start_delay(std::chrono::microseconds delay);

// Whether the `bytes` at `pointer` lie in the table's device memory.
bool is_async_device_memory(const void* pointer, int64_t bytes = 1);

// How many times the host has waited for the table's work so far (synchronize and
// synchronize_event calls, on any stream): a test counts a training step's host syncs with it.
int64_t async_host_waits();

}  // namespace mt::test_backend
