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

}  // namespace mt::backend
