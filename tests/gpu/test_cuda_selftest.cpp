// GPU self-test: each CUDA op case against its CPU twin. CTest label gpu; skipped when this
// machine has no usable CUDA device (every machine of this project's CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/half.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/runtime.h"

using namespace mt::kernels;

namespace {
bool have_device() { return cuda::device_count() > 0; }
}  // namespace

TEST(CudaSelfTest, LibrariesReportVersions) {
  EXPECT_GE(cuda::runtime_version(), 12000);
  EXPECT_GT(cuda::nccl_version(), 0);
  EXPECT_GT(cuda::cublas_version(), 0);
}

TEST(CudaSelfTest, Bf16ConversionMatchesCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(3);
  std::vector<float> input(4097);
  for (auto& x : input) x = bits_float(static_cast<uint32_t>(rng()));
  std::vector<uint16_t> device_out(input.size());
  cuda::fp32_to_bf16_roundtrip(input.data(), device_out.data(), input.size());
  for (size_t i = 0; i < input.size(); ++i) ASSERT_EQ(device_out[i], fp32_to_bf16_bits(input[i])) << i;
}

TEST(CudaSelfTest, SgemmMatchesCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int m = 37, n = 29, k = 53;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  cuda::sgemm_roundtrip(a.data(), b.data(), c.data(), m, n, k);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double ref = 0;
      for (int p = 0; p < k; ++p) ref += static_cast<double>(a[i * k + p]) * b[p * n + j];
      ASSERT_NEAR(c[i * n + j], ref, 1e-4) << i << "," << j;
    }
}
