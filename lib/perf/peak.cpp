// Device peaks and the CPU probe (see peak.h).
#include "perf/peak.h"

#include <omp.h>

#include <algorithm>
#include <cctype>
#include <chrono>

#include "core/clock.h"
#include "core/error.h"
#include "kernels/cpu/fma_probe.h"

namespace mt::perf {

const std::vector<Device>& device_table() {
  // Dense figures; NVIDIA's data sheets print the 2:4-sparsity figure first ("1,979 TFLOPS*")
  // and the dense one in a footnote (half of it).
  static const std::vector<Device> table{
      {"v100-sxm", 15.7, 0, 125, 0, 32, 0.9, "NVIDIA Tesla V100 data sheet (2020)"},
      {"a100", 19.5, 156, 312, 0, 80, 2.039, "NVIDIA A100 Tensor Core GPU data sheet (2021), SXM 80GB"},
      {"a100-40gb", 19.5, 156, 312, 0, 40, 1.555, "NVIDIA A100 Tensor Core GPU data sheet (2021), SXM 40GB"},
      {"h100-pcie", 51, 378, 756, 1513, 80, 2.0, "NVIDIA H100 Tensor Core GPU data sheet (2023), PCIe"},
      {"h100", 67, 494.5, 989.5, 1979, 80, 3.35, "NVIDIA H100 Tensor Core GPU data sheet (2023), SXM"},
      {"h200", 67, 494.5, 989.5, 1979, 141, 4.8, "NVIDIA H200 Tensor Core GPU data sheet (2024), SXM"},
      {"b200", 75, 1100, 2250, 4500, 180, 7.7, "NVIDIA HGX B200 specifications (2025), per GPU, dense"},
      {"gb200", 80, 1250, 2500, 5000, 186, 8.0, "NVIDIA GB200 NVL72 specifications (2025), per GPU, dense"},
      {"mi300x", 163.4, 653.7, 1307.4, 2614.9, 192, 5.3, "AMD Instinct MI300X data sheet (2023)"},
  };
  return table;
}

const Device& find_device(const std::string& name) {
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string known;
  for (const Device& device : device_table()) {
    if (device.name == lower) return device;
    known += (known.empty() ? "" : ", ") + device.name;
  }
  throw UsageError("device " + name, "unknown (" + known + "; or give --peak-tflops)");
}

int64_t device_memory_bytes(const Device& device) {
  return static_cast<int64_t>(device.memory_gib * 1024 * 1024 * 1024);
}

double device_peak_flops(const Device& device, const std::string& dtype) {
  double tflops = 0;
  if (dtype == "bf16" || dtype == "fp16") tflops = device.bf16;
  else if (dtype == "fp8") tflops = device.fp8;
  else if (dtype == "tf32") tflops = device.tf32;
  else if (dtype == "fp32") tflops = device.fp32;
  else throw UsageError("dtype " + dtype, "unknown (bf16, fp16, fp8, tf32, fp32)");
  if (tflops <= 0) throw UsageError("device " + device.name, "has no dense " + dtype + " peak");
  return tflops * 1e12;
}

CpuPeak measure_cpu_peak(Precision precision, int cores) {
  using kernels::CpuIsa;
  using kernels::cpu::ProbeArithmetic;
  if (cores < 1) throw UsageError("cores", "must be at least 1");
  const CpuIsa isa = kernels::detected_isa();
  const ProbeArithmetic arithmetic = precision == Precision::bf16 && kernels::cpu::probe_supported(isa, ProbeArithmetic::bf16_dot)
                                         ? ProbeArithmetic::bf16_dot
                                         : ProbeArithmetic::fp32;
  CpuPeak peak;
  peak.cores = cores;
  peak.arithmetic = std::string(arithmetic == ProbeArithmetic::bf16_dot ? "bf16 dot" : "fp32 fma") + " (" +
                    kernels::isa_name(isa) + ")";
  // Every core runs the chains at once (so clocks are those of a loaded chip); each keeps its
  // best of many rounds of a fraction of a millisecond, shorter than a scheduler time slice, so
  // some run undisturbed even on a machine shared with other work (a foreign process can only
  // slow a round down).
  constexpr int64_t kIterations = 50'000;
  constexpr int kRounds = 400;
  std::vector<double> best(static_cast<size_t>(cores), 0.0);
#pragma omp parallel num_threads(cores)
  {
    const int thread = omp_get_thread_num();
    for (int round = 0; round < kRounds; ++round) {
      const auto start = std::chrono::steady_clock::now();
      const double flops = kernels::cpu::run_fma_probe(isa, arithmetic, kIterations);
      const double seconds = seconds_since(start);
      best[static_cast<size_t>(thread)] = std::max(best[static_cast<size_t>(thread)], flops / seconds);
    }
  }
  peak.per_core_flops = *std::max_element(best.begin(), best.end());
  return peak;
}

}  // namespace mt::perf
