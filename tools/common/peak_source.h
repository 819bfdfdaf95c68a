// The peak MFU divides by and where it comes from, shared by mt-train and mt-mfu: --peak-tflops,
// a --peak-device of perf/peak.h's dense table at the run's precision, on a CUDA run the table's
// entry for the GPU it runs on (named by CUDA: model and form factor), or this CPU's register-only
// FMA probe over the cores a rank uses. With the probe, the 2048^3 GEMM rate is measured beside
// it and reported as an efficiency against that peak, never as the peak. Tested through
// tests/tools/mt-train.bats and tests/tools/mt-mfu.bats; the GPU names in tests/unit/tools/test_peak_source.cpp.
#pragma once

#include <optional>
#include <string>

#include "backend/backend_info.h"
#include "core/dtype.h"
#include "perf/peak.h"
#include "tools/common/records.h"

namespace mt::tools {

struct PeakSource {
  double flops_per_device = 0;       // FLOP/s of one device, or of one CPU rank's cores
  std::string source;                // "--peak-tflops", "h100 dense bf16", "FMA probe: fp32 fma (avx512) x 2 cores"
  std::optional<double> gemm_flops;  // this CPU's GEMM rate at the precision (with the probe only)
  std::optional<perf::CpuPeak> cpu;  // the probe's figures (with the probe only)
};

// `peak_tflops` wins, then `peak_device` (empty: none); otherwise the probe runs on `cores` threads
// (about two seconds with the GEMM rate).
PeakSource resolve_peak(std::optional<double> peak_tflops, const std::string& peak_device, Precision precision,
                        int cores);

// The form factor of a GPU CUDA names ("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3"): "PCIe" for
// PCIe and NVL cards, "SXM" for SXM modules (A100-SXM4, the HBM3 H100, the H200), else "unknown".
std::string gpu_form_factor(const std::string& gpu_name);
// The dense peak table's entry (perf/peak.h) for that GPU: h100 (SXM), h100-pcie, h200, a100 (80GB;
// the PCIe card has the same 312 TFLOP/s), a100-40gb; empty for one the table lacks (an NVL card).
std::string gpu_peak_device(const std::string& gpu_name);
// A CUDA run's peak: `peak_tflops`, else `peak_device`, else the table's entry for `gpu_name`;
// mt::UsageError naming the GPU when the table has none.
PeakSource resolve_gpu_peak(std::optional<double> peak_tflops, const std::string& peak_device, Precision precision,
                            const std::string& gpu_name);

// Adds the GPU a CUDA run uses to its run record: record["gpu"] = {index, name, form_factor,
// driver, compute_capability, memory_bytes, pci_bus_id, peak_device (the table entry, or null)}.
void add_gpu_fields(Record& record, const backend::GpuInfo& gpu);

// Adds peak_tflops, peak_source and, when measured, the probe's peak_core_tflops and peak_cores
// (peak = a core's x cores) and gemm_tflops and gemm_efficiency to `record`.
void add_peak_fields(Record& record, const PeakSource& peak);

}  // namespace mt::tools
