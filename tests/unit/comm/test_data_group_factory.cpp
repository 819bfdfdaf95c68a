// Unit test of comm::data_group_factory (comm/nccl_communicator.h): which data-group factory each
// device gets, and NCCL refused by name in a build without the CUDA backend. The NCCL
// communicator itself is tested on a GPU (tests/gpu/test_nccl_one_rank.cpp).
#include <gtest/gtest.h>

#include <string>

#include "comm/nccl_communicator.h"
#include "core/error.h"

namespace mt::comm {
namespace {

using FactoryFunction = std::unique_ptr<Communicator> (*)(Communicator&, const backend::Ops&, backend::Stream);

TEST(DataGroupFactory, CpuUsesMpiDataGroups) {
  const DataGroupFactory factory = data_group_factory(backend::Device::cpu);
  const FactoryFunction* target = factory.target<FactoryFunction>();
  ASSERT_NE(target, nullptr);
  EXPECT_EQ(*target, &make_mpi_data_group);
}

TEST(DataGroupFactory, CudaUsesNcclWhereBuilt) {
  if (nccl_built()) {
    const DataGroupFactory factory = data_group_factory(backend::Device::cuda, 30.0);
    EXPECT_TRUE(static_cast<bool>(factory));
    EXPECT_EQ(factory.target<FactoryFunction>(), nullptr);  // NCCL's, not MPI's
    EXPECT_THROW(nccl_data_group_factory(0.0), Error);
  } else {
    try {
      data_group_factory(backend::Device::cuda);
      FAIL() << "a build without CUDA made a CUDA data group factory";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("no CUDA backend"), std::string::npos) << error.what();
    }
  }
}

TEST(DataGroupFactory, NcclRefusesTheCpuTable) {
  if (!nccl_built()) GTEST_SKIP() << "this build has no CUDA backend";
  auto control = make_single_communicator();
  const backend::Ops cpu_table{};  // device cpu
  try {
    make_nccl_data_group(*control, cpu_table, backend::Stream{});
    FAIL() << "NCCL accepted the CPU table";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("CUDA op table"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace mt::comm
