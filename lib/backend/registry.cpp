// The backend registry (see registry.h).
#include "backend/registry.h"

#include "backend/cuda_link.h"
#include "core/error.h"

namespace mt::backend {
namespace {

const std::string kCudaFlag = "--device cuda";

// Set before main() by mt_cuda's cuda_link.cpp where the program links it; zero-initialised, so
// no static-initialisation order matters.
constinit const CudaLink* installed_link = nullptr;

// The CUDA entries, or the one-line refusal when this program has none or no device is usable.
const CudaLink& require_cuda_device() {
  if (!installed_link) throw Error(kCudaFlag, cuda_unlinked_reason());
  const std::string reason = installed_link->device_unavailable_reason();
  if (!reason.empty()) throw Error(kCudaFlag, "no CUDA device found (" + reason + ")");
  return *installed_link;
}

}  // namespace

void install_cuda_link(const CudaLink& link) { installed_link = &link; }

const CudaLink* cuda_link() { return installed_link; }

std::string cuda_unlinked_reason() {
#ifdef MT_WITH_CUDA
  return "this program has no CUDA backend linked in (mt-train and the GPU tests have it)";
#else
  return "this build has no CUDA backend (configure with -DMT_CUDA=ON)";
#endif
}

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
  return require_cuda_device().ops();
}

int select_cuda_device(int local_rank) {
  if (local_rank < 0) throw UsageError("local rank " + std::to_string(local_rank), "must be 0 or more");
  const CudaLink& link = require_cuda_device();
  const int index = local_rank % link.device_count();
  try {
    link.select_device(index);
  } catch (const std::exception& e) {
    throw Error(kCudaFlag, e.what());
  }
  return index;
}

}  // namespace mt::backend
