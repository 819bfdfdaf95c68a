// Device peaks (dense, never sparse) and the CPU FMA probe (lib/perf/peak.h).
#include <gtest/gtest.h>

#include <omp.h>

#include "core/error.h"
#include "kernels/cpu/fma_probe.h"
#include "kernels/cpu/isa.h"
#include "perf/peak.h"

using namespace mt::perf;

TEST(Peak, DeviceTableHoldsDensePeaks) {
  // Data sheets: H100 SXM and H200 1979 TFLOP/s bf16 "with sparsity", 989.5 dense; A100 312
  // dense bf16 (624 sparse).
  EXPECT_DOUBLE_EQ(device_peak_flops(find_device("h100"), "bf16"), 989.5e12);
  EXPECT_DOUBLE_EQ(device_peak_flops(find_device("h200"), "bf16"), 989.5e12);
  EXPECT_DOUBLE_EQ(device_peak_flops(find_device("h100"), "fp8"), 1979e12);
  EXPECT_DOUBLE_EQ(device_peak_flops(find_device("a100"), "bf16"), 312e12);
  EXPECT_DOUBLE_EQ(device_peak_flops(find_device("b200"), "bf16"), 2250e12);
  for (const Device& d : device_table()) {
    EXPECT_GT(d.bf16, d.tf32) << d.name;  // 16-bit tensor cores are twice TF32 on every device here
    EXPECT_FALSE(d.source.empty()) << d.name;
  }
  EXPECT_THROW(device_peak_flops(find_device("a100"), "fp8"), mt::UsageError);  // Ampere has no FP8
  EXPECT_THROW(find_device("h1000"), mt::UsageError);
  EXPECT_EQ(&find_device("H100"), &find_device("h100"));  // as data sheets spell it
  EXPECT_THROW(device_peak_flops(find_device("a100"), "int4"), mt::UsageError);
}

TEST(Peak, DeviceMemoryIsTheDataSheetsCapacityInGiB) {
  // HBM stacks are sized in GiB: the "80GB" H100 SXM, "141GB" H200, A100 SXM 80GB and 40GB.
  constexpr int64_t GiB = int64_t{1} << 30;
  EXPECT_EQ(device_memory_bytes(find_device("h100")), 80 * GiB);
  EXPECT_EQ(device_memory_bytes(find_device("h200")), 141 * GiB);
  EXPECT_EQ(device_memory_bytes(find_device("a100")), 80 * GiB);
  EXPECT_EQ(device_memory_bytes(find_device("a100-40gb")), 40 * GiB);
  EXPECT_DOUBLE_EQ(device_peak_flops(find_device("a100-40gb"), "bf16"), 312e12);  // the same chip
}

TEST(Peak, ProbeCountsTheOperationsOfItsChains) {
  using mt::kernels::CpuIsa;
  using mt::kernels::cpu::ProbeArithmetic;
  // 12 chains x 4 lanes x (mul + add) per round at SSE; 16 chains x 16 lanes x 2 at AVX-512;
  // 16 chains x 64 per vdpbf16ps.
  EXPECT_DOUBLE_EQ(mt::kernels::cpu::run_fma_probe(CpuIsa::x86_64_v2, ProbeArithmetic::fp32, 10), 12 * 4 * 2 * 10);
  if (mt::kernels::detected_isa() >= CpuIsa::avx512) {
    EXPECT_DOUBLE_EQ(mt::kernels::cpu::run_fma_probe(CpuIsa::avx512, ProbeArithmetic::fp32, 10), 16 * 16 * 2 * 10);
  }
  if (mt::kernels::detected_isa() == CpuIsa::avx512_bf16) {
    EXPECT_DOUBLE_EQ(mt::kernels::cpu::run_fma_probe(CpuIsa::avx512_bf16, ProbeArithmetic::bf16_dot, 10), 16 * 64 * 10);
  }
  EXPECT_FALSE(mt::kernels::cpu::probe_supported(CpuIsa::avx512, ProbeArithmetic::bf16_dot));
}

TEST(Peak, CpuPeakIsPerCoreTimesCores) {
  const CpuPeak one = measure_cpu_peak(mt::Precision::fp32, 1);
  EXPECT_EQ(one.cores, 1);
  // Any x86-64 core does at least 4 fp32 lanes x 2 operations a cycle at over 1 GHz, and no core
  // today exceeds 2 x 16 lanes x 2 FMA ports x 2 at 6 GHz.
  EXPECT_GT(one.per_core_flops, 8e9);
  EXPECT_LT(one.per_core_flops, 800e9);
  const CpuPeak two = measure_cpu_peak(mt::Precision::fp32, 2);
  EXPECT_DOUBLE_EQ(two.flops(), 2 * two.per_core_flops);
  EXPECT_NE(one.arithmetic.find("fp32 fma"), std::string::npos);
  if (mt::kernels::detected_isa() == mt::kernels::CpuIsa::avx512_bf16) {
    const CpuPeak bf16 = measure_cpu_peak(mt::Precision::bf16, 1);
    EXPECT_NE(bf16.arithmetic.find("bf16 dot"), std::string::npos);
    EXPECT_GT(bf16.per_core_flops, 1.5 * one.per_core_flops);  // twice the fp32 rate in theory
  }
  EXPECT_THROW(measure_cpu_peak(mt::Precision::fp32, 0), mt::UsageError);
}
