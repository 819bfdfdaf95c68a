// The cuBLASLt state gemm.cu keeps per device, shared with the FP8 GEMM (fp8.cu) so that both
// GEMMs use one handle and one workspace per stream (GEMMs queued on one stream never overlap, so
// they may share its workspace; no second set of 32 MiB slots). CUDA-only header (.cu files).
// Tested on a GPU through gemm_fp8 by tests/gpu/test_cuda_fp8.cpp.
#pragma once

#include <cublasLt.h>

#include <cstddef>

namespace mt::kernels::cuda {

struct LtStreamContext {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // nullptr when every workspace slot went to earlier streams
  size_t workspace_bytes = 0;
};

// The current device's handle and `stream`'s workspace. The first call on a device creates the
// state (a cudaMalloc: not under stream capture); later calls never allocate or synchronise.
LtStreamContext lt_stream_context(void* stream);

}  // namespace mt::kernels::cuda
