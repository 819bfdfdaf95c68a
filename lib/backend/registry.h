// The backends mt can run on, and the op table of each: the one place a run's table is chosen at
// start-up (mt-train's --device). The CPU table is cpu_ops(); the CUDA table is cuda_ops() when
// this program has the CUDA backend (built and linked in: backend/cuda_link.h) and a device is
// usable, else refused with one line saying which. CUDA runs one GPU per rank: select_cuda_device
// picks it from the rank's local index (backend stays below comm: the caller passes it in). Tested in
// tests/unit/backend/test_registry.cpp (the refusals, on machines without a GPU) and
// tests/gpu/test_cuda_runtime.cpp (the table, on a GPU).
#pragma once

#include <string>

#include "backend/ops.h"

namespace mt::backend {

// "cpu", "cuda".
const char* device_name(Device device);

// The device a name gives ("cpu", "cuda"); anything else is mt::UsageError naming `flag`.
Device parse_device(const std::string& name, const std::string& flag = "--device");

// The op table of `device`: cpu_ops() for the CPU; for CUDA cuda_ops(), or mt::Error "--device cuda:
// this build has no CUDA backend (configure with -DMT_CUDA=ON)" / "...: this program has no CUDA backend
// linked in (mt-train and the GPU tests have it)" / "...: no CUDA device found (<CUDA's reason>)".
const Ops& backend_ops(Device device);

// The CUDA device of a rank whose index among its node's ranks is `local_rank`: local_rank modulo
// the devices visible (after CUDA_VISIBLE_DEVICES), bound for the whole process; returns that
// index. Call before the table is first used. Refused like backend_ops(Device::cuda) when there
// is no backend or device; mt::UsageError for a negative local rank.
int select_cuda_device(int local_rank);

}  // namespace mt::backend
