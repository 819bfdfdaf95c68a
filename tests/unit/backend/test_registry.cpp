// The backend registry (backend/registry.h): the CPU table by name, CUDA refused by name until a
// CUDA backend fills a table, anything else a usage error naming the flag.
#include <gtest/gtest.h>

#include <string>

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

TEST(BackendRegistry, CudaIsRefusedByNameAndUnknownNamesAreUsageErrors) {
  try {
    backend_ops(Device::cuda);
    FAIL() << "the CUDA table is not built yet";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not built yet"), std::string::npos) << e.what();
  }
  try {
    parse_device("H100", "--device");
    FAIL() << "H100 is no backend";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--device H100"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::backend
