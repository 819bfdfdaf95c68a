// The CUDA backend's runtime entries (kernels/cuda/runtime.h through lib/backend/cuda_backend.cpp's
// table): zero-filled pool memory and its ledger, copies both ways and 2d, events, host functions'
// order and errors through synchronize, conversions bit-exact against kernels/common/half.h. CTest
// label gpu; every test skips when no CUDA device is usable (never passes without one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/memory.h"
#include "backend/registry.h"
#include "kernels/common/half.h"
#include "kernels/cuda/runtime.h"

namespace mt::backend {
namespace {

using kernels::bits_float;
using kernels::float_bits;

#define MT_REQUIRE_CUDA_DEVICE()                                                                            \
  if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << kernels::cuda::device_unavailable_reason()

const Ops& cuda() { return backend_ops(Device::cuda); }

template <typename T>
std::vector<T> to_host(const Ops& ops, const T* device, int64_t count) {
  std::vector<T> host(static_cast<size_t>(count));
  ops.copy(host.data(), device, count * static_cast<int64_t>(sizeof(T)), CopyKind::device_to_host,
           ops.default_stream());
  ops.synchronize(ops.default_stream());
  return host;
}

template <typename T>
void to_device(const Ops& ops, const std::vector<T>& host, T* device) {
  ops.copy(device, host.data(), static_cast<int64_t>(host.size() * sizeof(T)), CopyKind::host_to_device,
           ops.default_stream());
}

TEST(CudaRuntime, TableIsTheCudaBackend) {
  MT_REQUIRE_CUDA_DEVICE();
  EXPECT_EQ(select_cuda_device(0), 0);
  const Ops& ops = cuda();
  EXPECT_STREQ(ops.name, "cuda");
  EXPECT_EQ(ops.device, Device::cuda);
  EXPECT_FALSE(ops.synchronous);
  EXPECT_NE(ops.default_stream().handle, nullptr);
  EXPECT_EQ(ops.default_stream().handle, ops.default_stream().handle);
  EXPECT_EQ(ops.gemm_operand_type(Precision::fp32), DType::f32);
  EXPECT_EQ(ops.gemm_operand_type(Precision::bf16), DType::bf16);
  EXPECT_EQ(ops.gemm_operand_type(Precision::fp16), DType::f16);
  EXPECT_TRUE(ops.supports(OpId::gemm, DType::f16));
  EXPECT_FALSE(ops.supports(OpId::layernorm_forward, DType::bf16));
  const kernels::cuda::DeviceProperties props = kernels::cuda::device_properties(0);
  EXPECT_FALSE(props.name.empty());
  EXPECT_GT(props.memory_bytes, 0);
  EXPECT_GT(kernels::cuda::driver_version(), 0);
}

// Fresh memory reads zero, also where the pool hands back a block just written and freed; the
// ledger counts the bytes by category.
TEST(CudaRuntime, MemoryIsZeroFilledAndCounted) {
  MT_REQUIRE_CUDA_DEVICE();
  const Ops& ops = cuda();
  MemoryLedger ledger;
  const int64_t count = 100003;  // not a multiple of 64 bytes
  for (int round = 0; round < 3; ++round) {
    DeviceBuffer<float> buffer(ops, count, MemoryCategory::activations, &ledger);
    EXPECT_EQ(ledger.live(MemoryCategory::activations), buffer_bytes<float>(count));
    const std::vector<float> host = to_host(ops, buffer.data(), count);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(float_bits(host[size_t(i)]), 0u) << "round " << round << " element " << i;
    ops.fill(buffer.data(), count, 7.5f, ops.default_stream());  // dirty it for the next round's reuse
  }
  EXPECT_EQ(ledger.live_total(), 0);
  EXPECT_EQ(ledger.peak(MemoryCategory::activations), buffer_bytes<float>(count));
  EXPECT_GE(kernels::cuda::pool_reserved_bytes(), buffer_bytes<float>(count));  // kept, not returned
  // Twice the device's memory cannot come from the pool: std::bad_alloc, as the contract says.
  const int64_t too_many = kernels::cuda::device_properties(kernels::cuda::selected_device()).memory_bytes / 2;
  EXPECT_THROW(DeviceBuffer<float>(ops, too_many, MemoryCategory::weights), std::bad_alloc);
  DeviceBuffer<float> after(ops, 1000, MemoryCategory::weights);  // the failure left no sticky error
  EXPECT_EQ(to_host(ops, after.data(), 1000), std::vector<float>(1000, 0.0f));
}

TEST(CudaRuntime, CopiesBothWaysAnd2d) {
  MT_REQUIRE_CUDA_DEVICE();
  const Ops& ops = cuda();
  const Stream stream = ops.default_stream();
  std::vector<int32_t> host(1031);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int32_t>(i * 2654435761u);
  DeviceBuffer<int32_t> a(ops, 1031, MemoryCategory::activations), b(ops, 1031, MemoryCategory::activations);
  to_device(ops, host, a.data());
  ops.copy(b.data(), a.data(), 1031 * 4, CopyKind::device_to_device, stream);
  EXPECT_EQ(to_host(ops, b.data(), 1031), host);

  // 13 rows of 7 ints from a pitch of 11 ints into a packed device block, back out at a pitch of 9.
  const int rows = 13, width = 7, src_pitch = 11, dst_pitch = 9;
  DeviceBuffer<int32_t> packed(ops, rows * width, MemoryCategory::activations);
  ops.copy_2d(packed.data(), width * 4, host.data(), src_pitch * 4, width * 4, rows, CopyKind::host_to_device, stream);
  std::vector<int32_t> out(size_t(rows) * dst_pitch, -1);
  ops.copy_2d(out.data(), dst_pitch * 4, packed.data(), width * 4, width * 4, rows, CopyKind::device_to_host, stream);
  ops.synchronize(stream);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < dst_pitch; ++c) {
      const int32_t want = c < width ? host[size_t(r * src_pitch + c)] : -1;
      ASSERT_EQ(out[size_t(r * dst_pitch + c)], want) << "row " << r << " column " << c;
    }
  }
  ops.zero(b.data(), 1031 * 4, stream);
  EXPECT_EQ(to_host(ops, b.data(), 1031), std::vector<int32_t>(1031, 0));
}

TEST(CudaRuntime, EventsTimeAnIntervalAndRefuseUnrecordedOnes) {
  MT_REQUIRE_CUDA_DEVICE();
  const Ops& ops = cuda();
  const Stream stream = ops.default_stream();
  const Event start = ops.create_event(), end = ops.create_event(), never = ops.create_event();
  ops.record_event(start, stream);
  ops.record_event(end, stream);
  ops.synchronize_event(end);
  const double seconds = ops.elapsed_seconds(start, end);
  EXPECT_GE(seconds, 0.0);
  EXPECT_LT(seconds, 1.0);
  EXPECT_THROW(ops.elapsed_seconds(start, never), std::logic_error);
  EXPECT_THROW(ops.elapsed_seconds(never, end), std::logic_error);
  ops.destroy_event(start);
  ops.destroy_event(end);
  ops.destroy_event(never);
}

struct HostLog {
  std::vector<int> calls;
};
struct HostStep {
  HostLog* log;
  int value;
  bool throws;
};

void host_step(void* argument) {
  const auto* step = static_cast<HostStep*>(argument);
  step->log->calls.push_back(step->value);
  if (step->throws) throw std::runtime_error("host step " + std::to_string(step->value) + " failed");
}

// Host functions run in stream order, after the copies queued before them; the first exception
// one throws comes back from the next synchronize (once), and later host work still runs.
TEST(CudaRuntime, HostFunctionsRunInOrderAndTheirErrorsReachSynchronize) {
  MT_REQUIRE_CUDA_DEVICE();
  const Ops& ops = cuda();
  const Stream stream = ops.default_stream();
  HostLog log;
  HostStep steps[] = {{&log, 1, false}, {&log, 2, true}, {&log, 3, true}, {&log, 4, false}};
  for (HostStep& step : steps) ops.launch_host_function(stream, host_step, &step);
  try {
    ops.synchronize(stream);
    FAIL() << "the exception of host step 2 was lost";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "host step 2 failed");
  }
  EXPECT_EQ(log.calls, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_NO_THROW(ops.synchronize(stream));
}

// Inputs that test every branch of half.h's conversions: signed zeros, fp32 subnormals, ties
// to even, the fp16 overflow and subnormal edges, infinities, NaNs with payloads; then random bits.
std::vector<float> conversion_inputs() {
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x3f800000u,
                              0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f817fffu, 0x7f7fffffu, 0xff7fffffu,
                              0x7f7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                              0x7fbfffffu, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x47800000u, 0x38800000u,
                              0x387fffffu, 0x33800000u, 0x33000000u, 0x33000001u, 0x32ffffffu, 0x33c00000u,
                              0x34200000u, 0x3a001000u, 0x3a003000u, 0xc77ff000u, 0xb3000001u};
  std::vector<float> inputs;
  for (uint32_t bits : special) inputs.push_back(bits_float(bits));
  std::mt19937 rng(23);
  for (int i = 0; i < 100000; ++i) inputs.push_back(bits_float(static_cast<uint32_t>(rng())));
  return inputs;
}

TEST(CudaRuntime, ConversionsMatchHalfHBitForBit) {
  MT_REQUIRE_CUDA_DEVICE();
  const Ops& ops = cuda();
  const Stream stream = ops.default_stream();
  const std::vector<float> inputs = conversion_inputs();
  const auto n = static_cast<int64_t>(inputs.size());
  DeviceBuffer<float> in(ops, n, MemoryCategory::activations), rounded(ops, n, MemoryCategory::activations);
  DeviceBuffer<uint16_t> bits(ops, n, MemoryCategory::activations);
  to_device(ops, inputs, in.data());
  for (DType type : {DType::bf16, DType::f16}) {
    const bool bf16 = type == DType::bf16;
    ops.convert(in.data(), DType::f32, bits.data(), type, n, stream);
    ops.round_through(in.data(), rounded.data(), n, type, stream);
    const std::vector<uint16_t> got_bits = to_host(ops, bits.data(), n);
    const std::vector<float> got_rounded = to_host(ops, rounded.data(), n);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const uint16_t want = bf16 ? kernels::fp32_to_bf16_bits(inputs[i]) : kernels::fp32_to_fp16_bits(inputs[i]);
      const float want_rounded = bf16 ? kernels::bf16_bits_to_fp32(want) : kernels::fp16_bits_to_fp32(want);
      ASSERT_EQ(got_bits[i], want) << dtype_name(type) << " of input " << i << " (bits 0x" << std::hex
                                   << float_bits(inputs[i]) << ")";
      ASSERT_EQ(float_bits(got_rounded[i]), float_bits(want_rounded))
          << "round through " << dtype_name(type) << " of input " << i << " (bits 0x" << std::hex
          << float_bits(inputs[i]) << ")";
    }
  }
  // Every 16-bit pattern back to f32.
  std::vector<uint16_t> patterns(65536);
  for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<uint16_t>(i);
  DeviceBuffer<uint16_t> all(ops, 65536, MemoryCategory::activations);
  DeviceBuffer<float> widened(ops, 65536, MemoryCategory::activations);
  to_device(ops, patterns, all.data());
  for (DType type : {DType::bf16, DType::f16}) {
    ops.convert(all.data(), type, widened.data(), DType::f32, 65536, stream);
    const std::vector<float> got = to_host(ops, widened.data(), 65536);
    for (size_t i = 0; i < patterns.size(); ++i) {
      const float want = type == DType::bf16 ? kernels::bf16_bits_to_fp32(patterns[i])
                                             : kernels::fp16_bits_to_fp32(patterns[i]);
      ASSERT_EQ(float_bits(got[i]), float_bits(want)) << dtype_name(type) << " pattern 0x" << std::hex << i;
    }
  }
  EXPECT_THROW(ops.convert(in.data(), DType::f32, rounded.data(), DType::f32, n, stream), std::invalid_argument);
  EXPECT_THROW(ops.round_through(in.data(), rounded.data(), n, DType::f32, stream), std::invalid_argument);
}

TEST(CudaRuntime, FillWritesEveryElement) {
  MT_REQUIRE_CUDA_DEVICE();
  const Ops& ops = cuda();
  const int64_t n = 70001;
  DeviceBuffer<float> x(ops, n + 1, MemoryCategory::activations);
  ops.fill(x.data(), n, -2.25f, ops.default_stream());
  const std::vector<float> host = to_host(ops, x.data(), n + 1);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(host[size_t(i)], -2.25f) << "element " << i;
  EXPECT_EQ(host[size_t(n)], 0.0f) << "fill wrote past its n";
}

}  // namespace
}  // namespace mt::backend
