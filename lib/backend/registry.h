// The backends mt can run on, and the op table of each: the one place a run's table is chosen at
// start-up (mt-train's --device). The CPU table is cpu_ops(); the CUDA table is not built yet, so
// asking for it is refused by name. Tested in tests/unit/backend/test_registry.cpp.
#pragma once

#include <string>

#include "backend/ops.h"

namespace mt::backend {

// "cpu", "cuda".
const char* device_name(Device device);

// The device a name gives ("cpu", "cuda"); anything else is mt::UsageError naming `flag`.
Device parse_device(const std::string& name, const std::string& flag = "--device");

// The op table of `device`: cpu_ops() for the CPU; the CUDA table is refused with mt::Error
// ("not built yet") until a CUDA backend fills one.
const Ops& backend_ops(Device device);

}  // namespace mt::backend
