// What the compute backends are built with and will use on this machine: CPU ISA level, GEMM
// library, CUDA/cuBLAS/NCCL versions and visible devices. Feeds --version and the run record.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mt::backend {

std::string cpu_isa();            // active level (after MT_CPU_ISA)
std::string cpu_isa_detected();   // the CPU's best level
std::string gemm_library();       // e.g. "oneDNN 2.6.3"
bool cuda_built();
int cuda_device_count();          // 0 without CUDA, driver or device
// (name, version) of the device libraries linked in; empty without CUDA.
std::vector<std::pair<std::string, std::string>> device_library_versions();

}  // namespace mt::backend
