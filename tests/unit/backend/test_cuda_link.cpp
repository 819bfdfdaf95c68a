// backend/cuda_link.h in a program that does not link mt_cuda (this one links mt_backend only, as
// every tool but mt-train): no CUDA entries installed, so no devices, no device libraries and
// --device cuda refused by name saying why; and entries installed later are the ones used.
#include <gtest/gtest.h>

#include <string>

#include "backend/backend_info.h"
#include "backend/cuda_link.h"
#include "backend/registry.h"
#include "core/error.h"

namespace mt::backend {
namespace {

#ifdef MT_WITH_CUDA
const std::string kExpected =
    "--device cuda: this program has no CUDA backend linked in (mt-train and the GPU tests have it)";
#else
const std::string kExpected = "--device cuda: this build has no CUDA backend (configure with -DMT_CUDA=ON)";
#endif

template <typename Call>
std::string refusal(Call call) {
  try {
    call();
  } catch (const UsageError& e) {
    return std::string("a usage error: ") + e.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(CudaLink, ProgramsWithoutTheLinkHaveNoCudaAndSayWhy) {
  ASSERT_EQ(cuda_link(), nullptr) << "this test must not link mt_cuda";
  EXPECT_FALSE(cuda_built());
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_TRUE(device_library_versions().empty());
  EXPECT_EQ(refusal([] { backend_ops(Device::cuda); }), kExpected);
  EXPECT_EQ(refusal([] { select_cuda_device(0); }), kExpected);
  EXPECT_EQ(refusal([] { selected_gpu(); }), kExpected);
  EXPECT_EQ(refusal([] { cuda_pool_reserved_bytes(); }), kExpected);
  EXPECT_EQ(&backend_ops(Device::cpu), &cpu_ops());
}

// A stand-in for mt_cuda's entries: one device, then none.
std::string fake_reason;
int fake_selected = -1;
const CudaLink kFakeLink{
    .device_unavailable_reason = [] { return fake_reason; },
    .device_count = [] { return 1; },
    .select_device = [](int index) { fake_selected = index; },
    .ops = [] () -> const Ops& { return cpu_ops(); },
    .library_versions = [] { return std::vector<std::pair<std::string, std::string>>{{"cuda_runtime", "1.2.3"}}; },
    .selected_gpu = [] { GpuInfo info; info.name = "fake"; return info; },
    .pool_reserved_bytes = [] { return int64_t{42}; },
};

TEST(CudaLink, InstalledEntriesAnswer) {
  install_cuda_link(kFakeLink);
  EXPECT_TRUE(cuda_built());
  EXPECT_EQ(cuda_device_count(), 1);
  EXPECT_EQ(device_library_versions().size(), 1u);
  EXPECT_EQ(&backend_ops(Device::cuda), &cpu_ops());
  EXPECT_EQ(select_cuda_device(3), 0);  // local rank 3 modulo 1 device
  EXPECT_EQ(fake_selected, 0);
  EXPECT_EQ(selected_gpu().name, "fake");
  EXPECT_EQ(cuda_pool_reserved_bytes(), 42);
  fake_reason = "no driver";
  EXPECT_EQ(refusal([] { backend_ops(Device::cuda); }), "--device cuda: no CUDA device found (no driver)");
}

}  // namespace
}  // namespace mt::backend
