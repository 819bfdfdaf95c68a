// The backend registry (see registry.h).
#include "backend/registry.h"

#include "core/error.h"

namespace mt::backend {

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
  throw Error(std::string("--device ") + device_name(device),
              "the CUDA backend is not built yet (this build runs on the CPU: --device cpu)");
}

}  // namespace mt::backend
