// Backend facts (see backend_info.h).
#include "backend/backend_info.h"

#include <oneapi/dnnl/dnnl.h>

#include <stdexcept>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#ifdef MT_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace mt::backend {
namespace {

[[maybe_unused]] std::string dotted(int version, int major_div, int minor_div) {  // used with CUDA only
  return std::to_string(version / major_div) + "." + std::to_string((version % major_div) / minor_div) + "." +
         std::to_string(version % minor_div);
}

}  // namespace

std::string cpu_isa() {
  try {
    return kernels::isa_name(kernels::active_isa());
  } catch (const std::invalid_argument& e) {
    throw UsageError("MT_CPU_ISA", e.what());
  }
}

std::string cpu_isa_detected() { return kernels::isa_name(kernels::detected_isa()); }

std::string gemm_library() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

bool cuda_built() {
#ifdef MT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef MT_WITH_CUDA
  return kernels::cuda::device_count();
#else
  return 0;
#endif
}

std::vector<std::pair<std::string, std::string>> device_library_versions() {
#ifdef MT_WITH_CUDA
  return {{"cuda_runtime", dotted(kernels::cuda::runtime_version(), 1000, 10)},
          {"cublas", dotted(kernels::cuda::cublas_version(), 10000, 100)},
          {"nccl", dotted(kernels::cuda::nccl_version(), 10000, 100)}};
#else
  return {};
#endif
}

GpuInfo selected_gpu() {
#ifdef MT_WITH_CUDA
  try {
    const int index = kernels::cuda::selected_device();
    const kernels::cuda::DeviceProperties props = kernels::cuda::device_properties(index);
    const int driver = kernels::cuda::driver_version();
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
#else
  throw Error("--device cuda", "this build has no CUDA backend (configure with -DMT_CUDA=ON)");
#endif
}

int64_t cuda_pool_reserved_bytes() {
#ifdef MT_WITH_CUDA
  try {
    return kernels::cuda::pool_reserved_bytes();
  } catch (const std::runtime_error& e) {
    throw Error("--device cuda", e.what());
  }
#else
  throw Error("--device cuda", "this build has no CUDA backend (configure with -DMT_CUDA=ON)");
#endif
}

}  // namespace mt::backend
