// Which data-group factory a backend's device uses (nccl_communicator.h), and, in a build without
// the CUDA backend, the NCCL entry points refusing by name. Tested in tests/gpu/test_nccl_one_rank.cpp
// (the choice, on every build that has the CUDA backend) and tests/unit/comm/test_data_group_factory.cpp.
#include <string>

#include "comm/nccl_communicator.h"
#include "core/error.h"

namespace mt::comm {

#ifndef MT_WITH_CUDA
namespace {
[[noreturn]] void refuse(const char* op) { throw Error(op, "this build of mt has no CUDA backend, so no NCCL"); }
}  // namespace

bool nccl_built() { return false; }

std::unique_ptr<Communicator> make_nccl_data_group(Communicator&, const backend::Ops&, backend::Stream) {
  refuse("NCCL data group");
}

DataGroupFactory nccl_data_group_factory(double) { refuse("NCCL data group"); }
#endif

DataGroupFactory data_group_factory(backend::Device device, double timeout_seconds) {
  switch (device) {
    case backend::Device::cpu: return make_mpi_data_group;
    case backend::Device::cuda: return nccl_data_group_factory(timeout_seconds);
  }
  throw Error("data group", "unknown device");
}

}  // namespace mt::comm
