// The MFU peak of a run (see peak_source.h).
#include "tools/common/peak_source.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "perf/gemm_probe.h"

namespace mt::tools {

PeakSource resolve_peak(std::optional<double> peak_tflops, const std::string& peak_device, Precision precision,
                        int cores) {
  PeakSource peak;
  if (peak_tflops) {
    peak.flops_per_device = *peak_tflops * 1e12;
    peak.source = "--peak-tflops";
  } else if (!peak_device.empty()) {
    const perf::Device& d = perf::find_device(peak_device);
    peak.flops_per_device = perf::device_peak_flops(d, precision_name(precision));
    peak.source = d.name + " dense " + precision_name(precision) + " (" + d.source + ")";
  } else {
    const perf::CpuPeak cpu = perf::measure_cpu_peak(precision, cores);
    peak.flops_per_device = cpu.flops();
    peak.source = "FMA probe: " + cpu.arithmetic + " x " + std::to_string(cpu.cores) + " cores";
    peak.gemm_flops = perf::measure_gemm_flops(backend::cpu_ops(), precision);  // the CPU the FMA probe measured
    peak.cpu = cpu;
  }
  return peak;
}

namespace {

std::string upper(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return text;
}

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

}  // namespace

std::string gpu_form_factor(const std::string& gpu_name) {
  const std::string name = upper(gpu_name);
  if (contains(name, "GH200")) return "unknown";  // a Grace Hopper superchip: neither
  if (contains(name, "PCIE") || contains(name, "NVL")) return "PCIe";
  if (contains(name, "SXM") || contains(name, "HBM3") || contains(name, "H200")) return "SXM";
  return "unknown";
}

std::string gpu_peak_device(const std::string& gpu_name) {
  const std::string name = upper(gpu_name);
  const std::string form = gpu_form_factor(gpu_name);
  if (contains(name, "NVL") || contains(name, "GH200")) return "";  // peaks the table does not hold
  if (contains(name, "H200")) return "h200";
  if (contains(name, "H100")) return form == "PCIe" ? "h100-pcie" : form == "SXM" ? "h100" : "";
  if (contains(name, "A100")) return contains(name, "40GB") ? "a100-40gb" : "a100";
  return "";
}

PeakSource resolve_gpu_peak(std::optional<double> peak_tflops, const std::string& peak_device, Precision precision,
                            const std::string& gpu_name) {
  if (peak_tflops || !peak_device.empty()) return resolve_peak(peak_tflops, peak_device, precision, 1);
  const std::string device = gpu_peak_device(gpu_name);
  if (device.empty()) {
    throw UsageError("--device cuda", "the dense peak table has no entry for the GPU \"" + gpu_name +
                                          "\": give --peak-tflops or --peak-device");
  }
  PeakSource peak = resolve_peak(std::nullopt, device, precision, 1);
  peak.source = gpu_name + ": " + peak.source;
  return peak;
}

void add_gpu_fields(Record& record, const backend::GpuInfo& gpu) {
  const std::string peak_device = gpu_peak_device(gpu.name);
  record["gpu"] = Record{{"index", gpu.index},
                         {"name", gpu.name},
                         {"form_factor", gpu_form_factor(gpu.name)},
                         {"driver", gpu.driver},
                         {"compute_capability", gpu.compute_capability},
                         {"memory_bytes", gpu.memory_bytes},
                         {"pci_bus_id", gpu.pci_bus_id},
                         {"peak_device", peak_device.empty() ? Record(nullptr) : Record(peak_device)}};
}

void add_peak_fields(Record& record, const PeakSource& peak) {
  record["peak_tflops"] = peak.flops_per_device / 1e12;
  record["peak_source"] = peak.source;
  if (peak.cpu) {
    record["peak_core_tflops"] = peak.cpu->per_core_flops / 1e12;
    record["peak_cores"] = peak.cpu->cores;
  }
  if (peak.gemm_flops) {
    record["gemm_tflops"] = *peak.gemm_flops / 1e12;
    record["gemm_efficiency"] = *peak.gemm_flops / peak.flops_per_device;
  }
}

}  // namespace mt::tools
