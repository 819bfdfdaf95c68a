// The backend registry (see registry.h).
#include "backend/registry.h"

#include "core/error.h"
#ifdef MT_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace mt::backend {
namespace {

const std::string kCudaFlag = "--device cuda";

#ifdef MT_WITH_CUDA
// Throws the one-line refusal when no CUDA device is usable here.
void require_cuda_device() {
  const std::string reason = kernels::cuda::device_unavailable_reason();
  if (!reason.empty()) throw Error(kCudaFlag, "no CUDA device found (" + reason + ")");
}
#else
Error no_cuda_backend() { return Error(kCudaFlag, "this build has no CUDA backend (configure with -DMT_CUDA=ON)"); }
#endif

}  // namespace

const char* device_name(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "?";
}

Device parse_device(const std::string& name, const std::string& flag) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") return Device::cuda;
  throw UsageError(flag + " " + name, "the backend is cpu or cuda");
}

const Ops& backend_ops(Device device) {
  if (device == Device::cpu) return cpu_ops();
#ifdef MT_WITH_CUDA
  require_cuda_device();
  return cuda_ops();
#else
  throw no_cuda_backend();
#endif
}

int select_cuda_device(int local_rank) {
  if (local_rank < 0) throw UsageError("local rank " + std::to_string(local_rank), "must be 0 or more");
#ifdef MT_WITH_CUDA
  require_cuda_device();
  const int index = local_rank % kernels::cuda::device_count();
  try {
    kernels::cuda::select_device(index);
  } catch (const std::exception& e) {
    throw Error(kCudaFlag, e.what());
  }
  return index;
#else
  throw no_cuda_backend();
#endif
}

}  // namespace mt::backend
