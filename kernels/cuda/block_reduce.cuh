// Device helpers shared by norms.cu and loss.cu: the launch-status check of an entry and
// deterministic block-wide reductions (a fixed shuffle tree per warp, then the warps' results
// added in warp order by every thread, so the bits depend only on the block size). Tested on a GPU
// through the entries that use them by the op harness (tests/gpu/test_cuda_op_harness.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mt::kernels::cuda::detail {

// Threads per block of the row kernels (one block per row): a multiple of 32, at most 1024.
constexpr int kRowThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kMaxWarps = 1024 / kWarpSize;

// Throws naming the entry when the launch just queued failed (bad configuration, no device).
inline void check_launch(const char* entry) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA ") + entry + ": kernel launch failed: " + cudaGetErrorString(status));
  }
}

// Blocks of a grid-stride launch over `work` items: enough to fill the device, never past the
// grid limit (the kernels loop over what is left).
inline unsigned grid_for(int64_t work, int64_t per_block, int64_t max_blocks = int64_t{1} << 16) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

// The sum over the block of every thread's `value`, returned to every thread. `shared` holds
// kMaxWarps values; every thread of the block must call it (it synchronises), blockDim.x a
// multiple of 32.
template <typename T>
__device__ __forceinline__ T block_sum(T value, T* shared) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warps = blockDim.x / kWarpSize;
  __syncthreads();  // a previous call's readers are done with `shared`
  if (threadIdx.x % kWarpSize == 0) shared[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  T total = shared[0];
  for (int w = 1; w < warps; ++w) total += shared[w];
  return total;
}

// The largest `value` of the block, as block_sum; NaN inputs are passed over (a > b ? a : b with
// the running value second, as the CPU kernel's max).
__device__ __forceinline__ float block_max(float value, float* shared) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = other > value ? other : value;
  }
  const int warps = blockDim.x / kWarpSize;
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) shared[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  float best = shared[0];
  for (int w = 1; w < warps; ++w) best = shared[w] > best ? shared[w] : best;
  return best;
}

}  // namespace mt::kernels::cuda::detail
