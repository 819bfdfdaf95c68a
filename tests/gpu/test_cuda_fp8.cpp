// The CUDA table's FP8 entries on a GPU (CTest label gpu; every test skips, never passes, without a
// usable CUDA device): the conversion fp8_quantize runs (kernels/common/fp8.h's fp32_to_fp8 in the
// kernel) bit for bit equal to NVIDIA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) over a sweep
// of fp32 bit patterns and every class (ties, subnormals, overflow, NaN, +-0), the decode equal to
// __nv_cvt_fp8_to_halfraw widened; fp8_quantize, fp8_transpose and fp8_update_scales equal to the
// CPU table's bit for bit; gemm_fp8 against the CPU table's gemm_fp8 on the same bytes (a bound
// below, and exactly where every partial sum is an integer) at tiny-model shapes and 1024^3, e4m3 x
// e4m3 and e4m3 x e5m2 both ways, with its refusals and its plain fallback kernel (which A off its
// 16-byte boundary and a shape first met under stream capture take, the latter cuBLASLt later); and a reported
// (not asserted) timing of the FP8 GEMM against the bf16 GEMM at 8192^3. Failures print the inputs
// that differ, so one run's log is enough to diagnose them. The NVIDIA reference kernels:
// tests/gpu/cuda_fp8_reference.cu.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/registry.h"
#include "kernels/common/fp8.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "tests/gpu/cuda_fp8_reference.h"

namespace mt::backend {
namespace {

using kernels::bits_float;
using kernels::float_bits;
using kernels::Fp8Type;

#define MT_REQUIRE_CUDA_DEVICE() \
  if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << kernels::cuda::device_unavailable_reason()

const Ops& cuda() { return backend_ops(Device::cuda); }
const Ops& cpu() { return backend_ops(Device::cpu); }

const char* type_name(Fp8Type type) { return type == Fp8Type::e4m3 ? "e4m3" : "e5m2"; }

std::string hex(uint32_t value, int digits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%0*x", digits, value);
  return text;
}

// A device array of the CUDA table, released at scope end.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t count) : count_(std::max<int64_t>(count, 1)) {
    data_ = static_cast<T*>(cuda().allocate(bytes(), MemoryCategory::activations));
    // The zero fill is queued on the table's stream; the reference kernels run on another.
    cuda().synchronize(cuda().default_stream());
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(static_cast<int64_t>(host.size())) { upload(host); }
  ~DeviceArray() { cuda().release(data_, bytes(), MemoryCategory::activations); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  void upload(const std::vector<T>& host) {
    cuda().copy(data_, host.data(), static_cast<int64_t>(host.size() * sizeof(T)), CopyKind::host_to_device,
                cuda().default_stream());
    cuda().synchronize(cuda().default_stream());
  }
  std::vector<T> download(int64_t count) const {
    std::vector<T> host(static_cast<size_t>(count));
    cuda().synchronize(cuda().default_stream());
    cuda().copy(host.data(), data_, count * static_cast<int64_t>(sizeof(T)), CopyKind::device_to_host,
                cuda().default_stream());
    cuda().synchronize(cuda().default_stream());
    return host;
  }

 private:
  int64_t bytes() const { return count_ * static_cast<int64_t>(sizeof(T)); }
  int64_t count_;
  T* data_ = nullptr;
};

// ---- the conversion against NVIDIA's ------------------------------------------------------------

// fp32 bit patterns of every class: every 4099th pattern of the 2^32 (both signs, every exponent),
// then for each finite fp8 code its value, the midpoint to the next code (a tie), and the floats
// either side of both, the overflow boundary (max finite, the tie above it, past it, inf), fp32
// subnormals, the fp8 subnormal boundaries, NaNs of both signs and payloads, +-0.
std::vector<float> conversion_sweep(Fp8Type type) {
  std::vector<float> values;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 4099) values.push_back(bits_float(static_cast<uint32_t>(bits)));
  const auto around = [&](float x) {
    for (float v : {x, std::nextafter(x, 0.0f), std::nextafter(x, std::numeric_limits<float>::infinity())}) {
      values.push_back(v);
      values.push_back(-v);
    }
  };
  for (int code = 0; code < 0x7f; ++code) {
    const float value = kernels::fp8_to_fp32(static_cast<uint8_t>(code), type);
    const float next = kernels::fp8_to_fp32(static_cast<uint8_t>(code + 1), type);
    if (!std::isfinite(value)) continue;
    around(value);
    if (std::isfinite(next)) around(value + (next - value) / 2);  // exact: fp8 values have few bits
  }
  const float max = kernels::fp8_max(type);
  const float max_ulp = type == Fp8Type::e4m3 ? 32.0f : 8192.0f;
  for (float x : {max, max + max_ulp / 2, max + max_ulp, 2 * max, 1e30f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity()})
    around(x);
  const float least_subnormal = type == Fp8Type::e4m3 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, -16);
  for (float x : {least_subnormal / 2, least_subnormal / 4, least_subnormal * 1.5f, least_subnormal * 2.5f})
    around(x);
  for (uint32_t bits : {0x00000001u, 0x00000123u, 0x007fffffu, 0x00800000u, 0x7f800001u, 0x7fc00000u, 0x7fffffffu,
                        0x7fa12345u, 0x00000000u})
    around(bits_float(bits));
  for (uint32_t bits : {0xffc00000u, 0xff800001u, 0x80000000u}) values.push_back(bits_float(bits));
  return values;
}

// Compares mt's bytes (from fp8_quantize at scale 1) with NVIDIA's; prints up to 20 mismatches.
void expect_same_bytes(const std::vector<float>& x, const std::vector<uint8_t>& mt_bytes,
                       const std::vector<uint8_t>& nvidia, Fp8Type type, const char* what) {
  int64_t mismatches = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (mt_bytes[i] == nvidia[i]) continue;
    if (++mismatches <= 20)
      ADD_FAILURE() << what << " " << type_name(type) << ": x = " << hex(float_bits(x[i]), 8) << " ("
                    << x[i] << "): mt " << hex(mt_bytes[i], 2) << ", NVIDIA " << hex(nvidia[i], 2);
  }
  EXPECT_EQ(mismatches, 0) << what << " " << type_name(type) << ": mismatches among " << x.size() << " values";
  std::printf("[fp8] %s %s: %zu values, %lld mismatches\n", what, type_name(type), x.size(),
              static_cast<long long>(mismatches));
}

TEST(CudaFp8, QuantizeConversionEqualsNvidiasBitForBit) {
  MT_REQUIRE_CUDA_DEVICE();
  std::printf("[fp8] device compute capability %d (NVIDIA's conversion is the PTX cvt.rn.satfinite "
              "instruction from 89 on, cuda_fp8.hpp's emulation below)\n",
              fp8_reference::compute_capability());
  for (Fp8Type type : {Fp8Type::e4m3, Fp8Type::e5m2}) {
    const std::vector<float> x = conversion_sweep(type);
    const auto n = static_cast<int64_t>(x.size());
    DeviceArray<float> device_x(x), scale(std::vector<float>{1.0f}), amax(std::vector<float>{0.0f});
    DeviceArray<uint8_t> mt_out(n), nvidia_out(n);
    cuda().fp8_quantize(device_x.get(), n, scale.get(), type, mt_out.get(), amax.get(), cuda().default_stream());
    cuda().synchronize(cuda().default_stream());
    fp8_reference::nvidia_fp32_to_fp8(device_x.get(), n, type, nvidia_out.get());
    const std::vector<uint8_t> mt_bytes = mt_out.download(n), nvidia = nvidia_out.download(n);
    expect_same_bytes(x, mt_bytes, nvidia, type, "fp8_quantize on the GPU against __nv_cvt_float_to_fp8");
    // The same function on the host (the CPU backend's) gives the same bytes.
    std::vector<uint8_t> host(x.size());
    for (size_t i = 0; i < x.size(); ++i) host[i] = kernels::fp32_to_fp8(x[i], type);
    expect_same_bytes(x, host, nvidia, type, "fp32_to_fp8 on the host against __nv_cvt_float_to_fp8");
    EXPECT_TRUE(std::isnan(amax.download(1)[0])) << "the sweep holds NaNs: amax must be NaN";
  }
}

TEST(CudaFp8, DecodeEqualsNvidiasWidenedHalf) {
  MT_REQUIRE_CUDA_DEVICE();
  for (Fp8Type type : {Fp8Type::e4m3, Fp8Type::e5m2}) {
    DeviceArray<float> mt_device(256), nvidia_device(256);
    fp8_reference::mt_fp8_to_fp32_on_device(type, mt_device.get());
    fp8_reference::nvidia_fp8_to_fp32(type, nvidia_device.get());
    const std::vector<float> mt_values = mt_device.download(256), nvidia = nvidia_device.download(256);
    for (int code = 0; code < 256; ++code) {
      const float host = kernels::fp8_to_fp32(static_cast<uint8_t>(code), type);
      const std::string where = std::string(type_name(type)) + " code " + hex(static_cast<uint32_t>(code), 2);
      if (std::isnan(nvidia[code])) {
        EXPECT_TRUE(std::isnan(mt_values[code]) && std::isnan(host))
            << where << ": NVIDIA gives NaN, mt " << mt_values[code] << " (device), " << host << " (host)";
      } else {
        EXPECT_EQ(float_bits(mt_values[code]), float_bits(nvidia[code]))
            << where << ": mt (device) " << mt_values[code] << ", NVIDIA " << nvidia[code];
        EXPECT_EQ(float_bits(host), float_bits(nvidia[code]))
            << where << ": mt (host) " << host << ", NVIDIA " << nvidia[code];
      }
    }
  }
}

// ---- quantize, transpose, scale update against the CPU table ------------------------------------

// fp8_quantize of `x` on both tables from the same *amax; expects equal bytes and amax bits.
void expect_quantize_matches_cpu(const std::vector<float>& x, float scale_value, float amax_start, Fp8Type type,
                                 const std::string& what) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> cpu_out(x.size());
  float cpu_amax = amax_start;
  cpu().fp8_quantize(x.data(), n, &scale_value, type, cpu_out.data(), &cpu_amax, cpu().default_stream());
  DeviceArray<float> device_x(x), scale(std::vector<float>{scale_value}), amax(std::vector<float>{amax_start});
  DeviceArray<uint8_t> out(n);
  cuda().fp8_quantize(device_x.get(), n, scale.get(), type, out.get(), amax.get(), cuda().default_stream());
  const std::vector<uint8_t> cuda_out = out.download(n);
  const float cuda_amax = amax.download(1)[0];
  int64_t differing = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (cuda_out[i] != cpu_out[i] && ++differing <= 10)
      ADD_FAILURE() << what << ": x[" << i << "] = " << x[i] << " * " << scale_value << ": cuda "
                    << hex(cuda_out[i], 2) << ", cpu " << hex(cpu_out[i], 2);
  }
  EXPECT_EQ(differing, 0) << what << ": bytes differing among " << n;
  if (std::isnan(cpu_amax)) {
    EXPECT_TRUE(std::isnan(cuda_amax)) << what << ": cpu amax NaN, cuda " << cuda_amax;
  } else {
    EXPECT_EQ(float_bits(cuda_amax), float_bits(cpu_amax)) << what << ": amax cuda " << cuda_amax << ", cpu " << cpu_amax;
  }
}

TEST(CudaFp8, QuantizeEqualsTheCpuTable) {
  MT_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(100003);  // an odd length: a partial last block
  for (float& v : x) v = normal(rng);
  for (Fp8Type type : {Fp8Type::e4m3, Fp8Type::e5m2}) {
    const std::string name = type_name(type);
    expect_quantize_matches_cpu(x, 37.25f, 0.0f, type, name + " scale 37.25 (values saturate)");
    expect_quantize_matches_cpu(x, 0.015625f, 0.5f, type, name + " scale 2^-6, amax starting at 0.5");
    expect_quantize_matches_cpu(x, 1.0f, 1000.0f, type, name + " amax starting above every |x|");
    expect_quantize_matches_cpu({}, 1.0f, 2.5f, type, name + " n = 0 (amax untouched)");
    std::vector<float> with_nan = x;
    with_nan[77777] = std::numeric_limits<float>::quiet_NaN();
    expect_quantize_matches_cpu(with_nan, 1.0f, 0.0f, type, name + " one NaN (amax NaN)");
    std::vector<float> with_negative_max = x;
    with_negative_max[12345] = -5000.0f;
    expect_quantize_matches_cpu(with_negative_max, 0.5f, 0.0f, type, name + " largest magnitude negative");
  }
}

TEST(CudaFp8, TransposeEqualsTheCpuTable) {
  MT_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(5);
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 45}, {33, 70}, {64, 48}, {1000, 3}, {257, 129}, {0, 5}}) {
    std::vector<uint8_t> in(static_cast<size_t>(rows * cols));
    for (uint8_t& v : in) v = static_cast<uint8_t>(rng());
    std::vector<uint8_t> cpu_out(in.size());
    cpu().fp8_transpose(in.data(), rows, cols, cpu_out.data(), cpu().default_stream());
    DeviceArray<uint8_t> device_in(in), out(rows * cols);
    cuda().fp8_transpose(device_in.get(), rows, cols, out.get(), cuda().default_stream());
    const std::vector<uint8_t> cuda_out = out.download(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(cuda_out[c * rows + r], in[r * cols + c]) << rows << "x" << cols << " at (" << r << ", " << c << ")";
    EXPECT_EQ(cuda_out, cpu_out) << rows << "x" << cols;
  }
}

TEST(CudaFp8, UpdateScalesEqualsTheCpuTableBitForBit) {
  MT_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(0.0f, 10.0f);
  const int64_t tensors = 37;
  for (Fp8Type type : {Fp8Type::e4m3, Fp8Type::e5m2}) {
    for (kernels::Fp8AmaxAlgo algo : {kernels::Fp8AmaxAlgo::most_recent, kernels::Fp8AmaxAlgo::max}) {
      for (int64_t history_len : {int64_t{1}, int64_t{4}}) {
        for (int margin : {0, 2}) {
          kernels::Fp8ScalingParams params;
          params.type = type;
          params.algo = algo;
          params.history_len = history_len;
          params.margin = margin;
          std::vector<float> amax(tensors), history(static_cast<size_t>(history_len * tensors)), scale(tensors);
          for (float& v : amax) v = uniform(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
          for (float& v : history) v = uniform(rng);
          for (float& v : scale) v = uniform(rng) + 0.5f;
          // Every class: zero, NaN, inf, tiny (the scale overflows to FLT_MAX), huge.
          amax[0] = 0.0f;
          amax[1] = std::numeric_limits<float>::quiet_NaN();
          amax[2] = std::numeric_limits<float>::infinity();
          amax[3] = 1e-38f;
          amax[4] = 3e38f;
          history[5] = std::numeric_limits<float>::quiet_NaN();
          std::vector<float> scale_inv(tensors, 0.0f);
          std::vector<float> cpu_amax = amax, cpu_history = history, cpu_scale = scale, cpu_scale_inv = scale_inv;
          cpu().fp8_update_scales(cpu_amax.data(), cpu_history.data(), cpu_scale.data(), cpu_scale_inv.data(), tensors,
                                  params, cpu().default_stream());
          DeviceArray<float> d_amax(amax), d_history(history), d_scale(scale), d_scale_inv(scale_inv);
          cuda().fp8_update_scales(d_amax.get(), d_history.get(), d_scale.get(), d_scale_inv.get(), tensors, params,
                                   cuda().default_stream());
          const std::string what = std::string(type_name(type)) +
                                   (algo == kernels::Fp8AmaxAlgo::max ? " max" : " most_recent") +
                                   " history " + std::to_string(history_len) + " margin " + std::to_string(margin);
          const auto expect_bits = [&](const std::vector<float>& cuda_values, const std::vector<float>& cpu_values,
                                       const char* name) {
            for (size_t i = 0; i < cpu_values.size(); ++i) {
              const bool both_nan = std::isnan(cuda_values[i]) && std::isnan(cpu_values[i]);
              EXPECT_TRUE(both_nan || float_bits(cuda_values[i]) == float_bits(cpu_values[i]))
                  << what << ": " << name << "[" << i << "] cuda " << cuda_values[i] << " ("
                  << hex(float_bits(cuda_values[i]), 8) << "), cpu " << cpu_values[i] << " ("
                  << hex(float_bits(cpu_values[i]), 8) << ")";
            }
          };
          expect_bits(d_amax.download(tensors), cpu_amax, "amax");
          expect_bits(d_history.download(history_len * tensors), cpu_history, "amax_history");
          expect_bits(d_scale.download(tensors), cpu_scale, "scale");
          expect_bits(d_scale_inv.download(tensors), cpu_scale_inv, "scale_inv");
        }
      }
    }
  }
}

// ---- the GEMM against the CPU table -------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
  Fp8Type a_type, b_type;
  float alpha, beta;
  int64_t lda_pad = 0, ldb_pad = 0, ldc_pad = 0;  // leading dimensions beyond k, k, n (multiples of 16)
  int64_t a_offset = 0;  // bytes before A in its device buffer (not a multiple of 16: A off its boundary)
  // Floats before each scale in one device array (the scaling state keeps every tensor's scale in
  // one array, so most sit off a 16-byte boundary): A's at scale_offset, B's at 2 scale_offset + 1.
  int64_t scale_offset = 0;
};

std::string describe(const GemmCase& g) {
  return std::string(type_name(g.a_type)) + " x " + type_name(g.b_type) + " m=" + std::to_string(g.m) +
         " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + " alpha=" + std::to_string(g.alpha) +
         " beta=" + std::to_string(g.beta) + " lda=" + std::to_string(g.k + g.lda_pad) +
         " ldb=" + std::to_string(g.k + g.ldb_pad) + " ldc=" + std::to_string(g.n + g.ldc_pad) +
         (g.a_offset ? " A at byte " + std::to_string(g.a_offset) : "") +
         (g.scale_offset ? " scales at floats " + std::to_string(g.scale_offset) + ", " +
                               std::to_string(2 * g.scale_offset + 1)
                         : "");
}

// Bytes of `type` for a rows x ld matrix: random values quantised by the shared conversion
// (integers in [-4, 4] when `integers`, exact in both types), padding bytes a NaN code that must
// never be read.
std::vector<uint8_t> random_fp8(int64_t rows, int64_t cols, int64_t ld, Fp8Type type, bool integers,
                                std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * ld), 0x7f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      bytes[r * ld + c] = kernels::fp32_to_fp8(integers ? static_cast<float>(small(rng)) : 4.0f * normal(rng), type);
  return bytes;
}

// Runs one case on both tables. The bound: both sides form the same exact products (an fp8 x fp8
// product has at most 8 significant bits, exact in fp32) and differ only in how they add k of
// them. The CPU adds in fp32 (error <= k 2^-24 sum |a_i b_i|). Hopper's FP8 tensor cores add the
// products of one MMA (k = 32) in an accumulator of about 14 significant bits (the DeepSeek-V3
// report, section 3.3.2, measured "around 14 bits" on H800), and cuBLASLt with fast accumulation
// off promotes each such partial sum into an fp32 accumulator. Each of an MMA's 32 additions may
// lose up to 2^-13 of its partial sum: at worst 32 2^-13 = 2^-8 of sum |a_i b_i|, and for these
// random inputs (partial sums of mixed signs, |S_j| ~ sqrt(j) |ab|) about 2^-13 sqrt(32) ~ 2^-10.5.
// So |cuda - cpu| <= 2^-8 alpha sa sb sum_i |a_i b_i| + 2^-22 |beta c_old| (the worst case of the
// tensor cores' rounding; the scalings' own fp32 roundings are far below it). A transposed or
// mis-scaled operand gives errors of the size of |c|, typically 1.6 / sqrt(k) of sum |a_i b_i|
// (2^-4.3 at k = 1024). The largest ratio seen is printed for later tightening. With integer inputs in [-4, 4]
// and k <= 128 every partial sum is an integer below 2^11, exact at 14 bits and in fp32: the
// results must be equal bit for bit.
// `plain`: run gemm_fp8's plain fallback kernel directly instead (fp32 adds in order on both sides:
// within 2 k 2^-24 <= 2^-12 of sum |a_i b_i| for k <= 1024).
void expect_gemm_matches_cpu(const GemmCase& g, bool integers, std::mt19937& rng, bool plain = false) {
  const int64_t lda = g.k + g.lda_pad, ldb = g.k + g.ldb_pad, ldc = g.n + g.ldc_pad;
  const std::vector<uint8_t> a = random_fp8(g.m, g.k, lda, g.a_type, integers, rng);
  const std::vector<uint8_t> b = random_fp8(g.n, g.k, ldb, g.b_type, integers, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> c(static_cast<size_t>(g.m * ldc));
  for (float& v : c) v = integers ? static_cast<float>(static_cast<int>(rng() % 9) - 4) : normal(rng);
  const float a_scale_inv = integers ? 1.0f : 0.25f, b_scale_inv = integers ? 1.0f : 0.5f;

  std::vector<float> cpu_c = c;
  cpu().gemm_fp8(g.m, g.n, g.k, g.alpha, a.data(), g.a_type, &a_scale_inv, lda, b.data(), g.b_type, &b_scale_inv,
                 ldb, g.beta, cpu_c.data(), ldc, cpu().default_stream());
  std::vector<uint8_t> a_buffer(static_cast<size_t>(g.a_offset), 0x7f);
  a_buffer.insert(a_buffer.end(), a.begin(), a.end());
  DeviceArray<uint8_t> d_a(a_buffer), d_b(b);
  const uint8_t* a_device = d_a.get() + g.a_offset;
  std::vector<float> scales(static_cast<size_t>(2 * g.scale_offset + 2), -1.0f);
  scales[static_cast<size_t>(g.scale_offset)] = a_scale_inv;
  scales[static_cast<size_t>(2 * g.scale_offset + 1)] = b_scale_inv;
  DeviceArray<float> d_c(c), d_scales(scales);
  const float* d_a_scale = d_scales.get() + g.scale_offset;
  const float* d_b_scale = d_scales.get() + 2 * g.scale_offset + 1;
  const int64_t fallbacks_before = kernels::cuda::gemm_fp8_fallback_calls();
  if (plain) {
    kernels::cuda::gemm_fp8_plain(g.m, g.n, g.k, g.alpha, a_device, g.a_type, d_a_scale, lda, d_b.get(), g.b_type,
                                  d_b_scale, ldb, g.beta, d_c.get(), ldc, cuda().default_stream().handle);
  } else {
    cuda().gemm_fp8(g.m, g.n, g.k, g.alpha, a_device, g.a_type, d_a_scale, lda, d_b.get(), g.b_type, d_b_scale, ldb,
                    g.beta, d_c.get(), ldc, cuda().default_stream());
  }
  const std::vector<float> cuda_c = d_c.download(g.m * ldc);
  const bool on_cublaslt = !plain && kernels::cuda::gemm_fp8_fallback_calls() == fallbacks_before;
  // Shapes of multiples of 16 are what training runs: they must reach the FP8 tensor cores. FP8
  // cuBLASLt also asks 16-byte aligned leading dimensions (ldc of fp32 C a multiple of 4); a case
  // padding C to an odd ldc only prints the path it took.
  if (!plain && g.m % 16 == 0 && g.n % 16 == 0 && ldc % 4 == 0 && g.a_offset % 16 == 0) {
    EXPECT_TRUE(on_cublaslt) << describe(g) << ": cuBLASLt turned the shape down (the plain kernel ran)";
  }
  // cuBLASLt's FP8 kernels read A and B in 16-byte pieces: A off its boundary takes the plain kernel.
  if (g.a_offset % 16 != 0) {
    EXPECT_FALSE(on_cublaslt) << describe(g) << ": A off 16 bytes reached cuBLASLt";
  }

  std::vector<double> a_values(a.size()), b_values(b.size());  // decoded once for the bound's sums
  for (size_t i = 0; i < a.size(); ++i) a_values[i] = kernels::fp8_to_fp32(a[i], g.a_type);
  for (size_t i = 0; i < b.size(); ++i) b_values[i] = kernels::fp8_to_fp32(b[i], g.b_type);
  double worst_ratio = 0;
  int64_t failures = 0;
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i * ldc + j);
      if (j >= g.n) {  // padding columns of C: untouched
        EXPECT_EQ(float_bits(cuda_c[at]), float_bits(c[at])) << describe(g) << ": C padding written at (" << i << ", "
                                                               << j << ")";
        continue;
      }
      double magnitude = 0;
      for (int64_t p = 0; p < g.k; ++p) magnitude += std::fabs(a_values[i * lda + p] * b_values[j * ldb + p]);
      magnitude *= std::fabs(double(g.alpha) * a_scale_inv * b_scale_inv);
      const double error = std::fabs(double(cuda_c[at]) - cpu_c[at]);
      const double bound =
          integers ? 0.0 : std::ldexp(magnitude, plain ? -12 : -8) + std::ldexp(std::fabs(g.beta * c[at]), -22);
      if (magnitude > 0) worst_ratio = std::max(worst_ratio, error / magnitude);
      if (!(error <= bound) && ++failures <= 10)
        ADD_FAILURE() << describe(g) << (integers ? " (integers)" : "") << ": C(" << i << ", " << j << ") cuda "
                      << cuda_c[at] << ", cpu " << cpu_c[at] << ", |difference| " << error << " > bound " << bound
                      << " (sum |a b| scaled " << magnitude << ")";
    }
  }
  EXPECT_EQ(failures, 0) << describe(g) << ": elements outside the bound";
  std::printf("[fp8] gemm_fp8 %s%s on %s: max |cuda - cpu| / sum|ab| = %.3g (bound %s)\n", describe(g).c_str(),
              integers ? " (integers)" : "", on_cublaslt ? "cuBLASLt" : "the plain fallback kernel", worst_ratio,
              integers ? "0" : plain ? "2^-12 = 2.4e-4" : "2^-8 = 3.9e-3");
}

TEST(CudaFp8, GemmEqualsTheCpuTable) {
  MT_REQUIRE_CUDA_DEVICE();
  if (fp8_reference::compute_capability() < 89)
    GTEST_SKIP() << "FP8 GEMMs need compute capability 8.9 (this device: " << fp8_reference::compute_capability()
                 << "); CudaFp8.GemmRefusesOldDevicesByName covers it";
  std::mt19937 rng(11);
  const Fp8Type e4m3 = Fp8Type::e4m3, e5m2 = Fp8Type::e5m2;
  // tiny-gpt-like shapes (tokens x hidden 64, QKV 192, MLP 256), a wgrad-like long k, 1024^3.
  const std::vector<GemmCase> cases = {
      {64, 192, 64, e4m3, e4m3, 1.0f, 0.0f},       {64, 256, 64, e4m3, e4m3, 1.0f, 0.0f},
      {64, 64, 256, e4m3, e4m3, 1.0f, 1.0f},       {64, 64, 256, e5m2, e4m3, 1.0f, 0.0f},
      {64, 256, 64, e4m3, e5m2, 1.0f, 1.0f},       {192, 64, 512, e5m2, e4m3, 1.0f, 1.0f},
      {7, 5, 16, e4m3, e4m3, 1.0f, 0.0f},          {3, 33, 48, e4m3, e5m2, 0.5f, 2.0f},
      {64, 192, 64, e4m3, e4m3, 1.0f, 0.5f, 16, 32, 3},
      {1024, 1024, 1024, e4m3, e4m3, 1.0f, 0.0f},  {1024, 1024, 1024, e4m3, e5m2, 1.0f, 0.0f},
  };
  for (const GemmCase& g : cases) expect_gemm_matches_cpu(g, false, rng);
  for (const GemmCase& g : {GemmCase{64, 192, 64, e4m3, e4m3, 1.0f, 1.0f}, GemmCase{32, 48, 128, e5m2, e4m3, 1.0f, 0.0f}})
    expect_gemm_matches_cpu(g, true, rng);
  // A 1 byte past a 16-byte boundary: no refusal (the CPU takes it), the plain kernel, exact.
  expect_gemm_matches_cpu(GemmCase{64, 64, 64, e4m3, e4m3, 1.0f, 1.0f, 0, 0, 0, 1}, true, rng);
  // Scales 4 and 12 bytes into their array, as the training's scaling state holds them: still on
  // cuBLASLt (gemm_fp8 copies them to a 16-byte boundary; cuBLASLt turns such pointers down).
  expect_gemm_matches_cpu(GemmCase{64, 192, 64, e4m3, e5m2, 1.0f, 1.0f, 0, 0, 0, 0, 1}, false, rng);
  expect_gemm_matches_cpu(GemmCase{64, 192, 64, e4m3, e4m3, 1.0f, 0.0f, 0, 0, 0, 0, 1}, true, rng);
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// A GEMM shape first met while its stream captures must not ask cuBLASLt's heuristic (it may fail
// under capture): the captured graph runs the plain kernel; the shape's first uncaptured call
// makes its plan and runs on cuBLASLt. Integer inputs, so both paths equal the CPU bit for bit.
TEST(CudaFp8, GemmShapeFirstMetUnderCaptureRunsThePlainKernelThenCublasLt) {
  MT_REQUIRE_CUDA_DEVICE();
  if (fp8_reference::compute_capability() < 89) GTEST_SKIP() << "no FP8 tensor cores";
  const int64_t m = 48, n = 80, k = 96;  // a shape no other test of this binary uses
  std::mt19937 rng(17);
  const std::vector<uint8_t> a = random_fp8(m, k, k, Fp8Type::e4m3, true, rng);
  const std::vector<uint8_t> b = random_fp8(n, k, k, Fp8Type::e4m3, true, rng);
  const float one_value = 1.0f;
  std::vector<float> cpu_c(static_cast<size_t>(m * n), 0.0f);
  cpu().gemm_fp8(m, n, k, 1.0f, a.data(), Fp8Type::e4m3, &one_value, k, b.data(), Fp8Type::e4m3, &one_value, k, 0.0f,
                 cpu_c.data(), n, cpu().default_stream());
  DeviceArray<uint8_t> d_a(a), d_b(b), warm_up(16 * 16);
  DeviceArray<float> d_c(m * n), warm_up_c(16 * 16), one(std::vector<float>{1.0f});
  cudaStream_t raw_stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  const Stream stream{raw_stream};
  const auto gemm = [&] {
    cuda().gemm_fp8(m, n, k, 1.0f, d_a.get(), Fp8Type::e4m3, one.get(), k, d_b.get(), Fp8Type::e4m3, one.get(), k, 0.0f,
                    d_c.get(), n, stream);
  };
  const auto expect_cpu_result = [&](const char* what) {
    check_cuda(cudaStreamSynchronize(raw_stream), what);
    const std::vector<float> got = d_c.download(m * n);
    int64_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (float_bits(got[i]) != float_bits(cpu_c[i]) && ++differing <= 5)
        ADD_FAILURE() << what << ": C[" << i << "] = " << got[i] << ", cpu " << cpu_c[i];
    EXPECT_EQ(differing, 0) << what << ": elements differing among " << got.size();
  };
  // One-time state (gemm.cu's handle and workspaces, this stream's slot) made outside the capture.
  cuda().gemm_fp8(16, 16, 16, 1.0f, warm_up.get(), Fp8Type::e4m3, one.get(), 16, warm_up.get(), Fp8Type::e4m3,
                  one.get(), 16, 0.0f, warm_up_c.get(), 16, stream);
  check_cuda(cudaStreamSynchronize(raw_stream), "the warm-up GEMM");

  const int64_t before_capture = kernels::cuda::gemm_fp8_fallback_calls();
  check_cuda(cudaStreamBeginCapture(raw_stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  std::string thrown;
  try {
    gemm();
  } catch (const std::exception& e) {
    thrown = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(raw_stream, &graph);
  EXPECT_EQ(thrown, "") << "gemm_fp8 under capture threw";
  ASSERT_EQ(ended, cudaSuccess) << "gemm_fp8 broke the capture: " << cudaGetErrorString(ended);
  EXPECT_EQ(kernels::cuda::gemm_fp8_fallback_calls(), before_capture + 1)
      << "a shape first met under capture must take the plain kernel";
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  check_cuda(cudaGraphLaunch(exec, raw_stream), "cudaGraphLaunch");
  expect_cpu_result("the captured GEMM (plain kernel)");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  const int64_t before_plain_call = kernels::cuda::gemm_fp8_fallback_calls();
  d_c.upload(std::vector<float>(static_cast<size_t>(m * n), 0.0f));
  gemm();
  EXPECT_EQ(kernels::cuda::gemm_fp8_fallback_calls(), before_plain_call)
      << "the shape's first uncaptured call did not reach cuBLASLt";
  expect_cpu_result("the uncaptured GEMM (cuBLASLt)");
  check_cuda(cudaStreamDestroy(raw_stream), "cudaStreamDestroy");
}

// The kernel gemm_fp8 falls back to for shapes cuBLASLt turns down, run directly (cuBLASLt may take
// every shape GemmEqualsTheCpuTable has), on odd shapes and the contract's layouts.
TEST(CudaFp8, PlainFallbackKernelEqualsTheCpuTable) {
  MT_REQUIRE_CUDA_DEVICE();
  std::mt19937 rng(13);
  const Fp8Type e4m3 = Fp8Type::e4m3, e5m2 = Fp8Type::e5m2;
  for (const GemmCase& g : {GemmCase{7, 5, 16, e4m3, e4m3, 1.0f, 0.0f}, GemmCase{3, 33, 48, e4m3, e5m2, 0.5f, 2.0f},
                            GemmCase{65, 17, 512, e5m2, e4m3, 1.0f, 1.0f, 16, 0, 5}})
    expect_gemm_matches_cpu(g, false, rng, true);
  expect_gemm_matches_cpu(GemmCase{9, 11, 64, e4m3, e4m3, 1.0f, 1.0f}, true, rng, true);
}

// Expects `call` to throw std::invalid_argument whose message holds `needle`.
template <typename Call>
void expect_refusal(const Call& call, const std::string& needle, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": not refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": refused as \"" << e.what() << "\"";
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw something other than std::invalid_argument: " << e.what();
  }
}

TEST(CudaFp8, GemmRefusesWhatTheContractRefuses) {
  MT_REQUIRE_CUDA_DEVICE();
  DeviceArray<uint8_t> a(64 * 64), b(64 * 64);
  DeviceArray<float> c(64 * 64), one(std::vector<float>{1.0f});
  const Stream stream = cuda().default_stream();
  const auto gemm = [&](int64_t k, int64_t lda, Fp8Type a_type, Fp8Type b_type) {
    return [=, &a, &b, &c, &one] {
      cuda().gemm_fp8(16, 16, k, 1.0f, a.get(), a_type, one.get(), lda, b.get(), b_type, one.get(), 64, 0.0f,
                      c.get(), 64, stream);
    };
  };
  expect_refusal(gemm(24, 64, Fp8Type::e4m3, Fp8Type::e4m3), "multiples of 16", "k = 24");
  expect_refusal(gemm(32, 40, Fp8Type::e4m3, Fp8Type::e4m3), "multiples of 16", "lda = 40");
  expect_refusal(gemm(32, 64, Fp8Type::e5m2, Fp8Type::e5m2), "e5m2 x e5m2", "e5m2 x e5m2");
  cuda().synchronize(stream);
}

TEST(CudaFp8, GemmRefusesOldDevicesByName) {
  MT_REQUIRE_CUDA_DEVICE();
  if (fp8_reference::compute_capability() >= 89) GTEST_SKIP() << "this device has FP8 tensor cores";
  DeviceArray<uint8_t> a(16 * 16), b(16 * 16);
  DeviceArray<float> c(16 * 16), one(std::vector<float>{1.0f});
  try {
    cuda().gemm_fp8(16, 16, 16, 1.0f, a.get(), Fp8Type::e4m3, one.get(), 16, b.get(), Fp8Type::e4m3, one.get(), 16,
                    0.0f, c.get(), 16, cuda().default_stream());
    ADD_FAILURE() << "gemm_fp8 ran on a device below compute capability 8.9";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("compute capability 8.9"), std::string::npos) << e.what();
  }
}

// ---- speed, reported --------------------------------------------------------------------------

// Milliseconds per call of `gemm` on the CUDA table's stream: 3 warm-up calls, then the median of
// 5 timed batches of 5 calls each.
template <typename Gemm>
double milliseconds_per_gemm(const Gemm& gemm) {
  const Ops& ops = cuda();
  const Stream stream = ops.default_stream();
  for (int i = 0; i < 3; ++i) gemm();
  std::vector<double> per_call;
  const Event start = ops.create_event(), end = ops.create_event();
  for (int batch = 0; batch < 5; ++batch) {
    ops.record_event(start, stream);
    for (int i = 0; i < 5; ++i) gemm();
    ops.record_event(end, stream);
    ops.synchronize_event(end);
    per_call.push_back(ops.elapsed_seconds(start, end) * 1e3 / 5);
  }
  ops.destroy_event(start);
  ops.destroy_event(end);
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

TEST(CudaFp8, ReportsFp8AgainstBf16GemmSpeed) {
  MT_REQUIRE_CUDA_DEVICE();
  if (fp8_reference::compute_capability() < 89) GTEST_SKIP() << "no FP8 tensor cores";
  const int64_t size = 8192, count = size * size;
  const Ops& ops = cuda();
  const Stream stream = ops.default_stream();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> host(static_cast<size_t>(count));
  for (float& v : host) v = uniform(rng);
  DeviceArray<float> values(host), c(count), scale(std::vector<float>{1.0f}), amax(std::vector<float>{0.0f});
  host = {};
  DeviceArray<uint8_t> fp8(count);
  DeviceArray<uint16_t> bf16(count);
  ops.fp8_quantize(values.get(), count, scale.get(), Fp8Type::e4m3, fp8.get(), amax.get(), stream);
  ops.convert(values.get(), DType::f32, bf16.get(), DType::bf16, count, stream);
  const int64_t fallbacks_before = kernels::cuda::gemm_fp8_fallback_calls();
  const double fp8_ms = milliseconds_per_gemm([&] {
    ops.gemm_fp8(size, size, size, 1.0f, fp8.get(), Fp8Type::e4m3, scale.get(), size, fp8.get(), Fp8Type::e4m3,
                 scale.get(), size, 0.0f, c.get(), size, stream);
  });
  const double bf16_ms = milliseconds_per_gemm([&] {
    ops.gemm(false, true, size, size, size, 1.0f, bf16.get(), size, bf16.get(), size, 0.0f, c.get(), size,
             DType::bf16, stream);
  });
  EXPECT_EQ(kernels::cuda::gemm_fp8_fallback_calls(), fallbacks_before) << "the 8192^3 FP8 GEMM did not run on cuBLASLt";
  const double flop = 2.0 * size * size * size;
  const double fp8_tflops = flop / (fp8_ms * 1e-3) / 1e12, bf16_tflops = flop / (bf16_ms * 1e-3) / 1e12;
  std::printf("[fp8] speed at %lld^3 (A . B^T, fp32 C): FP8 e4m3 GEMM %.3f ms = %.0f TFLOP/s; bf16 GEMM %.3f ms = "
              "%.0f TFLOP/s; FP8 / bf16 = %.2fx (%s)\n",
              static_cast<long long>(size), fp8_ms, fp8_tflops, bf16_ms, bf16_tflops, fp8_tflops / bf16_tflops,
              kernels::cuda::device_properties(kernels::cuda::selected_device()).name.c_str());
  testing::Test::RecordProperty("fp8_tflops", std::to_string(fp8_tflops));
  testing::Test::RecordProperty("bf16_tflops", std::to_string(bf16_tflops));
}

}  // namespace
}  // namespace mt::backend
