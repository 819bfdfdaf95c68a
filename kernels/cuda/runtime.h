// Host-side entry points of the CUDA kernels, callable from plain C++ (no CUDA headers here, so
// lib/ and tests compile with the host compiler). Every function that touches a device throws
// std::runtime_error when none is usable. Checked against the CPU twins by the GPU self-test
// tests/gpu/test_cuda_selftest.cpp (CTest label gpu, skipped without a device).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mt::kernels::cuda {

// 0 when there is no driver or no device (never throws).
int device_count();
int runtime_version();  // e.g. 13000
int cublas_version();   // e.g. 130100
int nccl_version();     // e.g. 22809

// Copies `n` floats to the device, converts there, copies back (self-test of the device path).
void fp32_to_bf16_roundtrip(const float* host_in, uint16_t* host_out, size_t n);
// C(m,n) = A(m,k) * B(k,n), row-major fp32, on the device through cuBLAS (self-test helper).
void sgemm_roundtrip(const float* a, const float* b, float* c, int m, int n, int k);

}  // namespace mt::kernels::cuda
