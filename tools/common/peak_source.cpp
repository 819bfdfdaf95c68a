// The MFU peak of a run (see peak_source.h).
#include "tools/common/peak_source.h"

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
