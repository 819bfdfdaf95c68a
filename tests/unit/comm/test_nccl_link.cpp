// comm/nccl_communicator.h's NCCL entries in a program that does not link mt_cuda (backend/cuda_link.h):
// NCCL is refused by name saying why, and entries installed later are the ones used.
#include <gtest/gtest.h>

#include <string>

#include "comm/nccl_communicator.h"
#include "core/error.h"

namespace mt::comm {
namespace {

#ifdef MT_WITH_CUDA
const std::string kExpected =
    "NCCL data group: this program has no CUDA backend linked in, so no NCCL (mt-train and the GPU tests have it)";
#else
const std::string kExpected = "NCCL data group: this build of mt has no CUDA backend, so no NCCL";
#endif

template <typename Call>
std::string refusal(Call call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(NcclLink, ProgramsWithoutTheLinkRefuseNcclByName) {
  ASSERT_FALSE(nccl_built()) << "this test must not link mt_cuda";
  EXPECT_EQ(refusal([] { data_group_factory(backend::Device::cuda); }), kExpected);
  EXPECT_EQ(refusal([] { nccl_data_group_factory(30.0); }), kExpected);
  auto control = make_single_communicator();
  EXPECT_EQ(refusal([&] { make_nccl_data_group(*control, backend::Ops{}, backend::Stream{}); }), kExpected);
}

double joined_with_timeout = 0;
const NcclLink kFakeLink{
    .make_data_group = [](Communicator&, const backend::Ops&, backend::Stream, double timeout_seconds)
        -> std::unique_ptr<Communicator> {
      joined_with_timeout = timeout_seconds;
      return make_single_communicator();
    },
};

TEST(NcclLink, InstalledEntriesAreUsedWithTheTimeout) {
  install_nccl_link(kFakeLink);
  EXPECT_TRUE(nccl_built());
  auto control = make_single_communicator();
  EXPECT_NE(make_nccl_data_group(*control, backend::Ops{}, backend::Stream{}), nullptr);
  EXPECT_EQ(joined_with_timeout, kDefaultDistributedTimeoutSeconds);
  EXPECT_NE(data_group_factory(backend::Device::cuda, 12.5)(*control, backend::Ops{}, backend::Stream{}), nullptr);
  EXPECT_EQ(joined_with_timeout, 12.5);
  EXPECT_EQ(refusal([] { nccl_data_group_factory(0.0); }), "NCCL data group: distributed timeout must be positive");
}

}  // namespace
}  // namespace mt::comm
