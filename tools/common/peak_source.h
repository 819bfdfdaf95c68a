// The peak MFU divides by and where it comes from, shared by mt-train and mt-mfu: --peak-tflops,
// a --peak-device of perf/peak.h's dense table at the run's precision, or this CPU's register-only
// FMA probe over the cores a rank uses. With the probe, the 2048^3 GEMM rate is measured beside
// it and reported as an efficiency against that peak, never as the peak. Tested through
// tests/tools/mt-train.bats and tests/tools/mt-mfu.bats.
#pragma once

#include <optional>
#include <string>

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

// Adds peak_tflops, peak_source and, when measured, the probe's peak_core_tflops and peak_cores
// (peak = a core's x cores) and gemm_tflops and gemm_efficiency to `record`.
void add_peak_fields(Record& record, const PeakSource& peak);

}  // namespace mt::tools
