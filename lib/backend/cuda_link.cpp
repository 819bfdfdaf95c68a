// The CUDA backend's entries over kernels/cuda/runtime.h, installed at start-up (see cuda_link.h).
// Built into the object library mt_cuda only, never into mt_backend (lib/CMakeLists.txt).
// Tested on a GPU by tests/gpu/test_cuda_runtime.cpp; without a device by
// tests/unit/backend/test_registry.cpp.
#include <stdexcept>
#include <string>

#include "backend/cuda_link.h"
#include "core/error.h"
#include "kernels/cuda/runtime.h"

namespace mt::backend {
namespace {

namespace cuda = kernels::cuda;

std::string dotted(int version, int major_div, int minor_div) {
  return std::to_string(version / major_div) + "." + std::to_string((version % major_div) / minor_div) + "." +
         std::to_string(version % minor_div);
}

std::vector<std::pair<std::string, std::string>> library_versions() {
  return {{"cuda_runtime", dotted(cuda::runtime_version(), 1000, 10)},
          {"cublas", dotted(cuda::cublas_version(), 10000, 100)},
          {"nccl", dotted(cuda::nccl_version(), 10000, 100)}};
}

GpuInfo selected_gpu() {
  try {
    const int index = cuda::selected_device();
    const cuda::DeviceProperties props = cuda::device_properties(index);
    const int driver = cuda::driver_version();
    GpuInfo info;
    info.index = index;
    info.name = props.name;
    info.compute_capability = std::to_string(props.compute_major) + "." + std::to_string(props.compute_minor);
    info.memory_bytes = props.memory_bytes;
    info.pci_bus_id = props.pci_bus_id;
    info.driver = std::to_string(driver / 1000) + "." + std::to_string((driver % 1000) / 10);
    return info;
  } catch (const std::runtime_error& e) {
    throw Error("--device cuda", e.what());
  }
}

int64_t pool_reserved_bytes() {
  try {
    return cuda::pool_reserved_bytes();
  } catch (const std::runtime_error& e) {
    throw Error("--device cuda", e.what());
  }
}

const CudaLink kLink{
    .device_unavailable_reason = &cuda::device_unavailable_reason,
    .device_count = &cuda::device_count,
    .select_device = &cuda::select_device,
    .ops = &cuda_ops,
    .library_versions = &library_versions,
    .selected_gpu = &selected_gpu,
    .pool_reserved_bytes = &pool_reserved_bytes,
};

// Runs before main() in every program that links mt_cuda.
[[maybe_unused]] const bool kInstalled = [] {
  install_cuda_link(kLink);
  return true;
}();

}  // namespace
}  // namespace mt::backend
