// Backend facts (see backend_info.h).
#include "backend/backend_info.h"

#include <oneapi/dnnl/dnnl.h>

#include <stdexcept>

#include "backend/cuda_link.h"
#include "core/error.h"
#include "kernels/cpu/isa.h"

namespace mt::backend {

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

bool cuda_built() { return cuda_link() != nullptr; }

int cuda_device_count() { return cuda_link() ? cuda_link()->device_count() : 0; }

std::vector<std::pair<std::string, std::string>> device_library_versions() {
  if (!cuda_link()) return {};
  return cuda_link()->library_versions();
}

GpuInfo selected_gpu() {
  if (!cuda_link()) throw Error("--device cuda", cuda_unlinked_reason());
  return cuda_link()->selected_gpu();
}

int64_t cuda_pool_reserved_bytes() {
  if (!cuda_link()) throw Error("--device cuda", cuda_unlinked_reason());
  return cuda_link()->pool_reserved_bytes();
}

}  // namespace mt::backend
