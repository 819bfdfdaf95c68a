// The seam between libmt and its CUDA backend, so that only the programs that run on a GPU load
// the CUDA libraries (cudart, cuBLAS, cuBLASLt, NCCL and what they bring: 7 of a tool's 56 shared
// libraries, but 0.15 s of the 0.17 s of CPU and 25,800 of the 26,800 page faults of a
// `mt-shard --help`, paid by every rank of `mt-tokenize --partitions`). The CUDA code
// (backend/cuda_backend.cpp, backend/cuda_link.cpp, comm/nccl_communicator.cpp) is built into the
// object library mt_cuda, not into mt_backend and mt_comm; the programs that link it (mt-train, the GPU tests and
// benchmark: lib/CMakeLists.txt says how) get its entries installed by a static initialiser in
// cuda_link.cpp before main(). In every other program none is installed: registry.h and
// backend_info.h then answer as a build without CUDA does (no devices, no device libraries), and
// refuse CUDA by name, saying the program has no CUDA backend linked in.
// Tested in tests/unit/backend/test_cuda_link.cpp (a program without the link) and
// tests/unit/backend/test_registry.cpp (linked with it where the build has CUDA).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend_info.h"
#include "backend/ops.h"

namespace mt::backend {

// The CUDA backend's entries behind registry.h and backend_info.h.
struct CudaLink {
  std::string (*device_unavailable_reason)();  // empty when a device is usable
  int (*device_count)();                       // devices visible (0 without driver or device)
  void (*select_device)(int index);            // binds `index` for the whole process
  const Ops& (*ops)();                         // the CUDA op table (ops.h's cuda_ops)
  std::vector<std::pair<std::string, std::string>> (*library_versions)();
  GpuInfo (*selected_gpu)();
  int64_t (*pool_reserved_bytes)();
};

// Installs `link` (static storage) for the whole process; cuda_link.cpp calls it at start-up.
void install_cuda_link(const CudaLink& link);

// The installed entries; nullptr in a program that does not link mt_cuda.
const CudaLink* cuda_link();

// The refusal of --device cuda where cuda_link() is nullptr: in a build without CUDA "this build
// has no CUDA backend (configure with -DMT_CUDA=ON)", in one with CUDA "this program has no CUDA
// backend linked in (mt-train and the GPU tests have it)".
std::string cuda_unlinked_reason();

}  // namespace mt::backend
