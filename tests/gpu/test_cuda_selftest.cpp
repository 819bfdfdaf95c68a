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
#include "kernels/cuda/attention.h"
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

// Causal attention with global offsets (queries at 40.., keys at 0..), GQA, documents and
// accumulated grads, then the lse merge: the CUDA kernels against the CPU ones.
TEST(CudaSelfTest, AttentionMatchesCpu) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  AttentionShape shape;
  shape.batch = 2;
  shape.q_len = 70;
  shape.kv_len = 90;
  shape.q_heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 16;
  shape.q_stride = shape.o_stride = 64;
  shape.k_stride = shape.v_stride = 32;
  shape.q_pos0 = 40;
  shape.scale = 0.25f;
  shape.accumulate_grads = true;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-1, 1);
  const auto random = [&](size_t n) {
    std::vector<float> values(n);
    for (auto& x : values) x = dist(rng);
    return values;
  };
  const size_t q_size = 2 * 70 * 64, kv_size = 2 * 90 * 32;
  const auto q = random(q_size), k = random(kv_size), v = random(kv_size), dout = random(q_size);
  std::vector<int32_t> docs(2 * 70);
  for (int t = 0; t < 140; ++t) docs[size_t(t)] = (40 + t % 70) / 33 * 33;  // documents every 33 positions
  const auto dq0 = random(q_size), dk0 = random(kv_size), dv0 = random(kv_size);  // grads accumulated onto

  const auto& cpu = cpu::cpu_ops();
  std::vector<float> out_cpu(q_size), lse_cpu(2 * 4 * 70), dq_cpu = dq0, dk_cpu = dk0, dv_cpu = dv0;
  cpu.attention_forward(shape, q.data(), k.data(), v.data(), docs.data(), out_cpu.data(), lse_cpu.data());
  cpu.attention_backward(shape, q.data(), k.data(), v.data(), docs.data(), out_cpu.data(), dout.data(), lse_cpu.data(),
                         dq_cpu.data(), dk_cpu.data(), dv_cpu.data());
  std::vector<float> out_gpu(q_size), lse_gpu(lse_cpu.size()), dq_gpu = dq0, dk_gpu = dk0, dv_gpu = dv0;
  cuda::attention_roundtrip(shape, q.data(), k.data(), v.data(), docs.data(), dout.data(), out_gpu.data(),
                            lse_gpu.data(), dq_gpu.data(), dk_gpu.data(), dv_gpu.data());
  const auto expect_near = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isinf(want[i])) {
        ASSERT_EQ(got[i], want[i]) << what << " " << i;
      } else {
        ASSERT_NEAR(got[i], want[i], 1e-4 * std::max(1.0f, std::abs(want[i]))) << what << " " << i;
      }
    }
  };
  expect_near(lse_gpu, lse_cpu, "lse");
  for (size_t row = 0; row < 140; ++row) {  // only the head columns of out are written
    expect_near(std::vector<float>(out_gpu.begin() + row * 64, out_gpu.begin() + row * 64 + 64),
                std::vector<float>(out_cpu.begin() + row * 64, out_cpu.begin() + row * 64 + 64), "out");
  }
  expect_near(dq_gpu, dq_cpu, "dq");
  expect_near(dk_gpu, dk_cpu, "dk");
  expect_near(dv_gpu, dv_cpu, "dv");

  // Merge a second block's result into the first (rows that saw no key have lse -inf).
  std::vector<float> part_out = random(q_size), part_lse(lse_cpu.size());
  for (size_t i = 0; i < part_lse.size(); ++i) part_lse[i] = i % 5 == 0 ? -INFINITY : dist(rng) * 3;
  std::vector<float> merged_cpu = out_cpu, merged_lse_cpu = lse_cpu, merged_gpu = out_cpu, merged_lse_gpu = lse_cpu;
  cpu.attention_merge(shape, merged_cpu.data(), merged_lse_cpu.data(), part_out.data(), part_lse.data());
  cuda::attention_merge_roundtrip(shape, merged_gpu.data(), merged_lse_gpu.data(), part_out.data(), part_lse.data());
  expect_near(merged_gpu, merged_cpu, "merged out");
  expect_near(merged_lse_gpu, merged_lse_cpu, "merged lse");
}
