// What the compute backends are built with and will use: CPU ISA level, GEMM library, CUDA/cuBLAS/
// NCCL versions and visible devices, the GPU a CUDA run uses (CUDA facts only in a program that
// links the CUDA backend, backend/cuda_link.h). Feeds --version and the run record.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mt::backend {

std::string cpu_isa();            // active level (after MT_CPU_ISA)
std::string cpu_isa_detected();   // the CPU's best level
std::string gemm_library();       // e.g. "oneDNN 2.6.3"
bool cuda_built();                // this program has the CUDA backend (a CUDA build, linked in)
int cuda_device_count();          // 0 without CUDA backend, driver or device
// (name, version) of the device libraries linked in; empty without the CUDA backend.
std::vector<std::pair<std::string, std::string>> device_library_versions();

// The GPU a CUDA run uses (registry.h's select_cuda_device chose it), for the run record.
struct GpuInfo {
  int index = 0;                   // among the visible devices
  std::string name;                // CUDA's, e.g. "NVIDIA H100 80GB HBM3"
  std::string compute_capability;  // e.g. "9.0"
  int64_t memory_bytes = 0;
  std::string pci_bus_id;
  std::string driver;              // the CUDA version the driver supports, e.g. "13.0"
};
// Throws mt::Error when this program has no CUDA backend or the device cannot be queried.
GpuInfo selected_gpu();
// Bytes the CUDA backend's caching pool holds from the driver now (its reserved memory: live
// buffers and the freed blocks it keeps); same errors as selected_gpu.
int64_t cuda_pool_reserved_bytes();

}  // namespace mt::backend
