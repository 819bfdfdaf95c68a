// The backend registry (backend/registry.h): the CPU table by name, CUDA refused by name where
// the build has no CUDA backend or the machine no device, anything else a usage error naming the flag.
#include <gtest/gtest.h>

#include <string>

#include "backend/backend_info.h"
#include "backend/registry.h"
#include "core/error.h"

namespace mt::backend {
namespace {

TEST(BackendRegistry, NamesAndTables) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu);
  EXPECT_EQ(parse_device("cuda"), Device::cuda);
  EXPECT_STREQ(device_name(Device::cpu), "cpu");
  EXPECT_STREQ(device_name(Device::cuda), "cuda");
  EXPECT_EQ(&backend_ops(Device::cpu), &cpu_ops());
  EXPECT_EQ(backend_ops(Device::cpu).device, Device::cpu);
}

// Without a CUDA build, or with one on a machine without a GPU (CI), --device cuda is refused
// with one line saying which; with a device the CUDA table comes back.
TEST(BackendRegistry, CudaIsRefusedByNameWithoutBackendOrDevice) {
  if (cuda_built() && cuda_device_count() > 0) {
    EXPECT_EQ(backend_ops(Device::cuda).device, Device::cuda);
    EXPECT_STREQ(backend_ops(Device::cuda).name, "cuda");
    GTEST_SKIP() << "a CUDA device is usable here: the refusal is not reachable";
  }
  const std::string expected = cuda_built()
                                   ? "--device cuda: no CUDA device found ("
                                   : "--device cuda: this build has no CUDA backend (configure with -DMT_CUDA=ON)";
  for (int attempt = 0; attempt < 2; ++attempt) {  // the table is asked for, then the device selected
    try {
      if (attempt == 0) backend_ops(Device::cuda);
      if (attempt == 1) select_cuda_device(0);
      FAIL() << "no CUDA table without a device (attempt " << attempt << ")";
    } catch (const UsageError& e) {
      FAIL() << "a missing device is no usage error: " << e.what();
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(expected, 0), 0u) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      if (cuda_built()) {
        EXPECT_EQ(message.back(), ')') << message;
      }
    }
  }
}

TEST(BackendRegistry, UnknownNamesAndNegativeLocalRanksAreUsageErrors) {
  try {
    parse_device("H100", "--device");
    FAIL() << "H100 is no backend";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--device H100"), std::string::npos) << e.what();
  }
  EXPECT_THROW(select_cuda_device(-1), UsageError);
}

}  // namespace
}  // namespace mt::backend
