// CUDA kernels of a MoE layer's experts: the grouped GEMMs (entries grouped_gemm and
// grouped_gemm_ragged_k) and the probs' row scaling (moe_scale_rows and its backward) of
// kernels/cuda/ops.h, with the CPU contracts of kernels/cpu/grouped_gemm.h and
// kernels/cpu/moe_expert_ops.h. A grouped GEMM is one call of gemm.cu's cuBLASLt path per group,
// on the group's slice of A, B and C: the counts are host memory and are read here, on the host,
// while the work is queued (never copied), so the entries allocate, copy and synchronise no more
// than gemm does (nothing after the first GEMM of the process). Ragged rows skip empty groups (a
// GEMM of no rows does nothing); ragged depth gives every group its call, the empty ones as
// gemm's k = 0 (C_g = beta C_g, beta = 0 writing zeros, beta = 1 leaving it). The row-scale
// backward sums d_scale in double in column order (a tile of products in shared memory added by
// one thread, as loss.cu's ordered sums), so it is the CPU's sum. Tested on a GPU by the op
// harness (tests/gpu/test_cuda_op_harness.cpp, tests/harness/cases_grouped_gemm.cpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/ops.h"

namespace mt::kernels::cuda {
namespace {

using detail::check_launch;
using detail::grid_for;

constexpr int kThreads = 256;

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

int64_t operand_bytes(GemmOperand operand) { return operand == GemmOperand::f32 ? 4 : 2; }

const void* offset(const void* base, int64_t elements, GemmOperand operand) {
  return static_cast<const char*>(base) + elements * operand_bytes(operand);
}

void check_counts(const char* entry, int64_t groups, const int64_t* counts) {
  if (groups < 0) throw std::invalid_argument(std::string("cuda ") + entry + ": negative group count");
  for (int64_t g = 0; g < groups; ++g) {
    if (counts[g] < 0) {
      throw std::invalid_argument(std::string("cuda ") + entry + ": group " + std::to_string(g) + " has " +
                                  std::to_string(counts[g]) + " rows");
    }
  }
}

// y[r, c] = scale[r] x[r, c], grid-stride over the elements (y may be x).
__global__ void scale_rows_kernel(const float* x, const float* scale, float* y, int64_t rows, int cols) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = scale[i / cols] * x[i];
}

// One block per row (strided over the grid): a tile of kThreads columns' products dy x (double)
// at a time, added by thread 0 in column order; dx = scale dy for the thread's own columns after
// it read them (dx may be dy: every element is read and written by the same thread).
__global__ void scale_rows_backward_kernel(const float* dy, const float* x, const float* scale, float* dx,
                                           float* d_scale, int64_t rows, int cols) {
  __shared__ double tile[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * cols;  // (cols)
    const float* xr = x + r * cols;    // (cols)
    float* dxr = dx + r * cols;        // (cols)
    const float s = scale[r];
    double sum = 0.0;
    for (int tile_begin = 0; tile_begin < cols; tile_begin += kThreads) {
      const int c = tile_begin + static_cast<int>(threadIdx.x);
      __syncthreads();  // the previous tile has been added
      if (c < cols) {
        const float g = dyr[c];
        tile[threadIdx.x] = static_cast<double>(g) * static_cast<double>(xr[c]);  // exact: no rounding to fuse
        dxr[c] = s * g;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        const int count = cols - tile_begin < kThreads ? cols - tile_begin : kThreads;
        for (int j = 0; j < count; ++j) sum += tile[j];
      }
    }
    if (threadIdx.x == 0) d_scale[r] = static_cast<float>(sum);
  }
}

}  // namespace

void grouped_gemm(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                  const void* a, int64_t lda, const void* b, int64_t ldb, int64_t b_group_stride, float beta, float* c,
                  int64_t ldc, GemmOperand operand, void* stream) {
  check_counts("grouped_gemm", groups, group_rows);
  int64_t first_row = 0;  // r_g
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = group_rows[g];
    if (rows > 0) {
      gemm(false, trans_b, rows, n, k, alpha, offset(a, first_row * lda, operand), lda,
           offset(b, g * b_group_stride, operand), ldb, beta, c + first_row * ldc, ldc, operand, stream);
    }
    first_row += rows;
  }
}

void grouped_gemm_ragged_k(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                           const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc,
                           int64_t c_group_stride, GemmOperand operand, void* stream) {
  check_counts("grouped_gemm_ragged_k", groups, group_depths);
  int64_t first_row = 0;  // r_g
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t depth = group_depths[g];
    // C_g (m, n) = alpha A_g^T B_g + beta C_g: A_g (depth, m) and B_g (depth, n) row-major.
    gemm(true, false, m, n, depth, alpha, offset(a, first_row * lda, operand), lda,
         offset(b, first_row * ldb, operand), ldb, beta, c + g * c_group_stride, ldc, operand, stream);
    first_row += depth;
  }
}

void moe_scale_rows(const float* x, const float* scale, float* y, int64_t rows, int cols, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  scale_rows_kernel<<<grid_for(rows * cols, kThreads), kThreads, 0, as_stream(stream)>>>(x, scale, y, rows, cols);
  check_launch("moe_scale_rows");
}

void moe_scale_rows_backward(const float* dy, const float* x, const float* scale, float* dx, float* d_scale,
                             int64_t rows, int cols, void* stream) {
  if (rows <= 0) return;
  scale_rows_backward_kernel<<<grid_for(rows, 1), kThreads, 0, as_stream(stream)>>>(dy, x, scale, dx, d_scale, rows,
                                                                                    cols);
  check_launch("moe_scale_rows_backward");
}

}  // namespace mt::kernels::cuda
