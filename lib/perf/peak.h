// Hardware peaks for MFU: a table of accelerators' dense peaks per dtype (data-sheet figures,
// never the 2:4-sparsity ones) and, on CPUs, the peak measured by a register-only FMA probe
// (kernels/cpu/fma_probe.h) per core, times the cores used. MFU divides by these; the GEMM
// rate (gemm_probe.h) is an efficiency, reported separately. The table also gives each device's
// memory, which mt-train --dry-run and the planners check a rank against. Tested in tests/unit/perf/test_peak.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mt::perf {

// Dense peaks in TFLOP/s per device; 0 where the device has no such arithmetic.
struct Device {
  std::string name;       // lower case, as on the command line ("h100": SXM; "h100-pcie")
  double fp32 = 0;        // non-tensor-core fp32
  double tf32 = 0;
  double bf16 = 0;        // fp16 and bf16 tensor cores run at the same dense rate on every device here
  double fp8 = 0;
  double memory_gib = 0;  // HBM per device, the data sheet's "80GB" (HBM stacks are sized in GiB)
  double hbm_tbps = 0;    // HBM bandwidth, TB/s
  std::string source;     // the data sheet the figures come from
};

const std::vector<Device>& device_table();
// The device of that name in any case ("H100" is h100); throws mt::UsageError listing the known names.
const Device& find_device(const std::string& name);
// The device's memory in bytes (what mt-train --dry-run checks each rank against).
int64_t device_memory_bytes(const Device& device);
// The dense peak for a training precision (bf16/fp16 -> tensor-core 16-bit, fp32 -> fp32
// without TF32) in FLOP/s; "fp8" for FP8 runs. Throws mt::UsageError when the device has none.
double device_peak_flops(const Device& device, const std::string& dtype);

// This CPU's peak as the probe measured it.
struct CpuPeak {
  std::string arithmetic;    // "fp32 fma (avx512)" or "bf16 dot (avx512-bf16)"
  double per_core_flops = 0; // the best core's rate
  int cores = 0;
  double flops() const { return per_core_flops * cores; }
};
// Runs the probe on `cores` threads at once (a second or so) at the widest ISA the CPU has,
// for the arithmetic mt's GEMMs use at `precision`: bf16 dot products where AVX512-BF16
// exists and precision is bf16, fp32 FMAs otherwise (bf16 elsewhere and fp16 run fp32 GEMMs).
CpuPeak measure_cpu_peak(Precision precision, int cores);

}  // namespace mt::perf
