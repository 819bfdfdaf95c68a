// Which data-group factory a backend's device uses (nccl_communicator.h), and the NCCL entry points
// over the entries nccl_communicator.cpp installs where the program links mt_cuda, refusing by
// name in any other program. Tested in tests/gpu/test_nccl_one_rank.cpp
// (the choice, on every build that has the CUDA backend) and tests/unit/comm/test_data_group_factory.cpp.
#include <string>

#include "comm/nccl_communicator.h"
#include "core/error.h"

namespace mt::comm {

namespace {

// Set before main() where the program links mt_cuda; zero-initialised (no initialisation order).
constinit const NcclLink* installed_link = nullptr;

[[noreturn]] void refuse(const char* op) {
#ifdef MT_WITH_CUDA
  throw Error(op, "this program has no CUDA backend linked in, so no NCCL (mt-train and the GPU tests have it)");
#else
  throw Error(op, "this build of mt has no CUDA backend, so no NCCL");
#endif
}

}  // namespace

void install_nccl_link(const NcclLink& link) { installed_link = &link; }

bool nccl_built() { return installed_link != nullptr; }

std::unique_ptr<Communicator> make_nccl_data_group(Communicator& control, const backend::Ops& ops,
                                                   backend::Stream stream) {
  if (!installed_link) refuse("NCCL data group");
  return installed_link->make_data_group(control, ops, stream, kDefaultDistributedTimeoutSeconds);
}

DataGroupFactory nccl_data_group_factory(double timeout_seconds) {
  if (!installed_link) refuse("NCCL data group");
  if (!(timeout_seconds > 0)) throw Error("NCCL data group", "distributed timeout must be positive");
  return [make = installed_link->make_data_group, timeout_seconds](Communicator& control, const backend::Ops& ops,
                                                                    backend::Stream stream) {
    return make(control, ops, stream, timeout_seconds);
  };
}

DataGroupFactory data_group_factory(backend::Device device, double timeout_seconds) {
  switch (device) {
    case backend::Device::cpu: return make_mpi_data_group;
    case backend::Device::cuda: return nccl_data_group_factory(timeout_seconds);
  }
  throw Error("data group", "unknown device");
}

}  // namespace mt::comm
