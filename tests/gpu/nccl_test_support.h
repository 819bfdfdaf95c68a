// Helpers of the NCCL communicator's GPU tests (tests/gpu/test_nccl_one_rank.cpp,
// tests/gpu/test_nccl_two_ranks.cpp): device buffers, a CUDA op table and stream to bind to, and
// element values of every dtype built from small integers (exact in every type, so sums of a few
// ranks are exact and any order of addition gives the same bits).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/dtype.h"
#include "kernels/common/half.h"

namespace mt::nccl_test {

inline void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status));
}

// Bytes on the device, freed with the object.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) { check(cudaMalloc(&data_, bytes > 0 ? bytes : 1), "cudaMalloc"); }
  ~DeviceBytes() { cudaFree(data_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  unsigned char* data() const { return static_cast<unsigned char*>(data_); }
  void zero(cudaStream_t stream) const { check(cudaMemsetAsync(data_, 0, bytes_, stream), "cudaMemsetAsync"); }
  void upload(const std::vector<unsigned char>& host, cudaStream_t stream) const {
    check(cudaMemcpyAsync(data_, host.data(), host.size(), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  }
  // The first `bytes` bytes (all by default), read after the work queued on `stream`.
  std::vector<unsigned char> download(cudaStream_t stream, size_t bytes = SIZE_MAX) const {
    std::vector<unsigned char> host(bytes == SIZE_MAX ? bytes_ : bytes);
    check(cudaMemcpyAsync(host.data(), data_, host.size(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return host;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

// A stream of the current device and a CUDA op table naming it (the NCCL factory reads the
// table's device and the stream's handle).
struct CudaBinding {
  CudaBinding() {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    table.device = backend::Device::cuda;
  }
  ~CudaBinding() { cudaStreamDestroy(stream); }
  CudaBinding(const CudaBinding&) = delete;
  CudaBinding& operator=(const CudaBinding&) = delete;
  backend::Stream bound() const { return backend::Stream{stream}; }
  cudaStream_t stream = nullptr;
  backend::Ops table{};
};

// The dtypes NCCL reduces, and every dtype (copies take them all).
inline const std::vector<DType> kReducible = {DType::f32, DType::bf16, DType::f16, DType::f64,
                                              DType::i8,  DType::u8,   DType::i32, DType::i64};
inline const std::vector<DType> kAll = {DType::f32, DType::bf16, DType::f16, DType::f64, DType::u8,
                                        DType::i8,  DType::i16,  DType::u16, DType::i32, DType::i64};

// `value` (a small integer) as one element of `dtype`, appended to `bytes`.
inline void append(std::vector<unsigned char>& bytes, DType dtype, int value) {
  unsigned char element[8] = {};
  switch (dtype) {
    case DType::f32: { const float v = float(value); std::memcpy(element, &v, 4); break; }
    case DType::f64: { const double v = double(value); std::memcpy(element, &v, 8); break; }
    case DType::bf16: { const uint16_t v = kernels::fp32_to_bf16_bits(float(value)); std::memcpy(element, &v, 2); break; }
    case DType::f16: { const uint16_t v = kernels::fp32_to_fp16_bits(float(value)); std::memcpy(element, &v, 2); break; }
    case DType::u8: { const uint8_t v = uint8_t(value & 0x3f); std::memcpy(element, &v, 1); break; }
    case DType::i8: { const int8_t v = int8_t(value % 60); std::memcpy(element, &v, 1); break; }
    case DType::i16: { const int16_t v = int16_t(value); std::memcpy(element, &v, 2); break; }
    case DType::u16: { const uint16_t v = uint16_t(value & 0x3fff); std::memcpy(element, &v, 2); break; }
    case DType::i32: { const int32_t v = value; std::memcpy(element, &v, 4); break; }
    case DType::i64: { const int64_t v = int64_t(value) * 3000000000LL; std::memcpy(element, &v, 8); break; }
  }
  bytes.insert(bytes.end(), element, element + dtype_size(dtype));
}

// `count` elements of `dtype`: small integers in [-50, 50] (u8/u16 non-negative) from `seed`.
inline std::vector<unsigned char> values(DType dtype, int64_t count, unsigned seed) {
  std::vector<unsigned char> bytes;
  uint32_t state = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    append(bytes, dtype, int((state >> 8) % 101) - 50);
  }
  return bytes;
}

// Element `i` of a 2-byte dtype held in `bytes`.
inline uint16_t element16(const std::vector<unsigned char>& bytes, int64_t i) {
  uint16_t v = 0;
  std::memcpy(&v, bytes.data() + 2 * i, 2);
  return v;
}

// The index of the first element of `dtype` where `got` differs from `want` (-1: none).
inline int64_t first_difference(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                                DType dtype) {
  const size_t size = dtype_size(dtype);
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); i += size) {
    if (std::memcmp(got.data() + i, want.data() + i, size) != 0) return int64_t(i / size);
  }
  return -1;
}

}  // namespace mt::nccl_test
