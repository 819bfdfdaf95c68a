// CUDA runtime, cuBLAS and NCCL queries, and the device round-trip helpers of runtime.h.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "kernels/common/half.h"
#include "kernels/cuda/runtime.h"

namespace mt::kernels::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(status));
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t n) { check(cudaMalloc(&ptr, n * sizeof(T) + 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

__global__ void fp32_to_bf16_kernel(const float* in, uint16_t* out, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = fp32_to_bf16_bits(in[i]);
}

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

int runtime_version() {
  int version = 0;
  cudaRuntimeGetVersion(&version);
  return version;
}

int cublas_version() {
  int major = 0, minor = 0, patch = 0;
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  return major * 10000 + minor * 100 + patch;
}

int nccl_version() {
  int version = 0;
  ncclGetVersion(&version);
  return version;
}

void fp32_to_bf16_roundtrip(const float* host_in, uint16_t* host_out, size_t n) {
  DeviceBuffer<float> in(n);
  DeviceBuffer<uint16_t> out(n);
  check(cudaMemcpy(in.ptr, host_in, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  if (n > 0) fp32_to_bf16_kernel<<<blocks, threads>>>(in.ptr, out.ptr, n);
  check(cudaGetLastError(), "fp32_to_bf16_kernel");
  check(cudaMemcpy(host_out, out.ptr, n * sizeof(uint16_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
}

void sgemm_roundtrip(const float* a, const float* b, float* c, int m, int n, int k) {
  DeviceBuffer<float> da(static_cast<size_t>(m) * k), db(static_cast<size_t>(k) * n), dc(static_cast<size_t>(m) * n);
  check(cudaMemcpy(da.ptr, a, sizeof(float) * m * k, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(db.ptr, b, sizeof(float) * k * n, cudaMemcpyHostToDevice), "cudaMemcpy");
  cublasHandle_t handle;
  check_cublas(cublasCreate(&handle), "cublasCreate");
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major C = A B is column-major C^T = B^T A^T.
  const cublasStatus_t status =
      cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, db.ptr, n, da.ptr, k, &beta, dc.ptr, n);
  cublasDestroy(handle);
  check_cublas(status, "cublasSgemm");
  check(cudaMemcpy(c, dc.ptr, sizeof(float) * m * n, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace mt::kernels::cuda
