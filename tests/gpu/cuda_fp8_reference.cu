// The device kernels of tests/gpu/cuda_fp8_reference.h: NVIDIA's conversions (cuda_fp8.h) and mt's
// decode, each over a whole array in one grid-stride launch on the legacy stream, then a wait.
// Used by tests/gpu/test_cuda_fp8.cpp.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "tests/gpu/cuda_fp8_reference.h"

namespace mt::fp8_reference {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

__nv_fp8_interpretation_t interpretation(kernels::Fp8Type type) {
  return type == kernels::Fp8Type::e4m3 ? __NV_E4M3 : __NV_E5M2;
}

unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

void finish(const char* what) {
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) status = cudaDeviceSynchronize();
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

__global__ void nvidia_encode_kernel(const float* in, int64_t n, __nv_fp8_interpretation_t type, uint8_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, type);
}

__global__ void nvidia_decode_kernel(__nv_fp8_interpretation_t type, float* out) {
  const int code = threadIdx.x;  // one block of 256 threads
  out[code] = __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), type)));
}

__global__ void mt_decode_kernel(kernels::Fp8Type type, float* out) {
  const int code = threadIdx.x;
  out[code] = kernels::fp8_to_fp32(static_cast<uint8_t>(code), type);
}

}  // namespace

void nvidia_fp32_to_fp8(const float* in, int64_t n, kernels::Fp8Type type, uint8_t* out) {
  if (n <= 0) return;
  nvidia_encode_kernel<<<blocks_for(n), kThreads>>>(in, n, interpretation(type), out);
  finish("nvidia_fp32_to_fp8");
}

void nvidia_fp8_to_fp32(kernels::Fp8Type type, float* out) {
  nvidia_decode_kernel<<<1, 256>>>(interpretation(type), out);
  finish("nvidia_fp8_to_fp32");
}

void mt_fp8_to_fp32_on_device(kernels::Fp8Type type, float* out) {
  mt_decode_kernel<<<1, 256>>>(type, out);
  finish("mt_fp8_to_fp32_on_device");
}

int compute_capability() {
  int device = 0, major = 0, minor = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (status != cudaSuccess) throw std::runtime_error(std::string("compute_capability: ") + cudaGetErrorString(status));
  return major * 10 + minor;
}

}  // namespace mt::fp8_reference
