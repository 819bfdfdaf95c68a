// The GPU a CUDA run names, mapped to its form factor and its dense peak (tools/common/peak_source.h):
// CUDA's device names as the driver reports them, so a PCIe H100 is never divided by the SXM peak.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "tools/common/peak_source.h"

namespace mt::tools {
namespace {

TEST(GpuPeak, FormFactorAndTableEntryFromCudaNames) {
  struct Case {
    const char* name;
    const char* form_factor;
    const char* peak_device;
  };
  const Case cases[] = {
      {"NVIDIA H100 80GB HBM3", "SXM", "h100"},      {"NVIDIA H100 PCIe", "PCIe", "h100-pcie"},
      {"NVIDIA H100 NVL", "PCIe", ""},               {"NVIDIA H200", "SXM", "h200"},
      {"NVIDIA H200 NVL", "PCIe", ""},               {"NVIDIA A100-SXM4-80GB", "SXM", "a100"},
      {"NVIDIA A100-SXM4-40GB", "SXM", "a100-40gb"}, {"NVIDIA A100-PCIE-40GB", "PCIe", "a100-40gb"},
      {"NVIDIA A100 80GB PCIe", "PCIe", "a100"},     {"NVIDIA GeForce RTX 4090", "unknown", ""},
      {"NVIDIA GH200 480GB", "unknown", ""},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(gpu_form_factor(c.name), c.form_factor) << c.name;
    EXPECT_EQ(gpu_peak_device(c.name), c.peak_device) << c.name;
  }
}

TEST(GpuPeak, RunPeakIsTheGpusUnlessAFlagNamesOne) {
  EXPECT_DOUBLE_EQ(resolve_gpu_peak(std::nullopt, "", Precision::bf16, "NVIDIA H100 80GB HBM3").flops_per_device,
                   989.5e12);
  EXPECT_DOUBLE_EQ(resolve_gpu_peak(std::nullopt, "", Precision::bf16, "NVIDIA H100 PCIe").flops_per_device, 756e12);
  EXPECT_DOUBLE_EQ(resolve_gpu_peak(std::nullopt, "", Precision::bf16, "NVIDIA H200").flops_per_device, 989.5e12);
  EXPECT_DOUBLE_EQ(resolve_gpu_peak(std::nullopt, "", Precision::bf16, "NVIDIA A100-SXM4-80GB").flops_per_device,
                   312e12);
  const PeakSource pcie = resolve_gpu_peak(std::nullopt, "", Precision::bf16, "NVIDIA H100 PCIe");
  EXPECT_NE(pcie.source.find("NVIDIA H100 PCIe: h100-pcie dense bf16"), std::string::npos) << pcie.source;
  EXPECT_DOUBLE_EQ(resolve_gpu_peak(2.0, "", Precision::bf16, "NVIDIA H100 PCIe").flops_per_device, 2e12);
  EXPECT_DOUBLE_EQ(resolve_gpu_peak(std::nullopt, "h100", Precision::bf16, "NVIDIA H100 PCIe").flops_per_device,
                   989.5e12);
  try {
    resolve_gpu_peak(std::nullopt, "", Precision::bf16, "NVIDIA H100 NVL");
    FAIL() << "an NVL card has no table entry";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--device cuda: the dense peak table has no entry for the GPU \"NVIDIA H100 NVL\": "
                                     "give --peak-tflops or --peak-device");
  }
}

}  // namespace
}  // namespace mt::tools
