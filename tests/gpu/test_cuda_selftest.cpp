// GPU self-test: each CUDA op case against its CPU twin, through the CUDA backend's op table
// (lib/backend/cuda_backend.cpp). CTest label gpu; skipped when this machine has no usable CUDA
// device (every machine of this project's CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/memory.h"
#include "backend/registry.h"
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

// The table's f32 -> bf16 conversion against the CPU's, on random bit patterns (special values:
// tests/gpu/test_cuda_runtime.cpp).
TEST(CudaSelfTest, Bf16ConversionMatchesCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const mt::backend::Ops& ops = mt::backend::backend_ops(mt::backend::Device::cuda);
  std::mt19937 rng(3);
  std::vector<float> input(4097);
  for (auto& x : input) x = bits_float(static_cast<uint32_t>(rng()));
  const auto n = static_cast<int64_t>(input.size());
  mt::backend::DeviceBuffer<float> in(ops, n, mt::backend::MemoryCategory::activations);
  mt::backend::DeviceBuffer<uint16_t> out(ops, n, mt::backend::MemoryCategory::activations);
  std::vector<uint16_t> device_out(input.size()), cpu_out(input.size());
  const mt::backend::Stream stream = ops.default_stream();
  ops.copy(in.data(), input.data(), n * 4, mt::backend::CopyKind::host_to_device, stream);
  ops.convert(in.data(), mt::DType::f32, out.data(), mt::DType::bf16, n, stream);
  ops.copy(device_out.data(), out.data(), n * 2, mt::backend::CopyKind::device_to_host, stream);
  ops.synchronize(stream);
  mt::backend::cpu_ops().convert(input.data(), mt::DType::f32, cpu_out.data(), mt::DType::bf16, n, {});
  for (size_t i = 0; i < input.size(); ++i) ASSERT_EQ(device_out[i], cpu_out[i]) << "element " << i;
}

// The table's fp32 GEMM (cuBLASLt, TF32 off) against a double-precision product: TF32's 10-bit
// mantissas (errors near 1e-3 at k = 53) would miss the 1e-4 bound.
TEST(CudaSelfTest, SgemmMatchesCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const mt::backend::Ops& ops = mt::backend::backend_ops(mt::backend::Device::cuda);
  const int m = 37, n = 29, k = 53;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  mt::backend::DeviceBuffer<float> da(ops, m * k, mt::backend::MemoryCategory::activations);
  mt::backend::DeviceBuffer<float> db(ops, k * n, mt::backend::MemoryCategory::activations);
  mt::backend::DeviceBuffer<float> dc(ops, m * n, mt::backend::MemoryCategory::activations);
  const mt::backend::Stream stream = ops.default_stream();
  ops.copy(da.data(), a.data(), int64_t{4} * m * k, mt::backend::CopyKind::host_to_device, stream);
  ops.copy(db.data(), b.data(), int64_t{4} * k * n, mt::backend::CopyKind::host_to_device, stream);
  ops.gemm(false, false, m, n, k, 1.0f, da.data(), k, db.data(), n, 0.0f, dc.data(), n, mt::DType::f32, stream);
  ops.copy(c.data(), dc.data(), int64_t{4} * m * n, mt::backend::CopyKind::device_to_host, stream);
  ops.synchronize(stream);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double ref = 0;
      for (int p = 0; p < k; ++p) ref += static_cast<double>(a[i * k + p]) * b[p * n + j];
      ASSERT_NEAR(c[i * n + j], ref, 1e-4) << i << "," << j;
    }
}
