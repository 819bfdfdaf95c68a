// CUDA LayerNorm and RMSNorm (forward and backward) and bias_backward: the entries of
// kernels/cuda/ops.h with the CPU contracts of kernels/cpu/ops.h. Row statistics and input grads
// take one block per row (a strided loop over the columns and a deterministic block reduction), so
// cols up to 16384 and rows of 1 need no special case. Parameter grads (dweight, dbias) are summed
// over rows without float atomics: the rows are split into at most kMaxChunks chunks (a partition
// that depends on rows and cols only), each chunk's column sums go to the fixed device scratch
// g_column_partials, and a second kernel adds the chunks in order to the grads (one chunk adds
// directly). That scratch is shared by every call of these entries in the process: they are meant
// to be queued on one compute stream; two streams running them at once would race on it. The
// per-element arithmetic and the chunk plan are kernels/common/norm_math.h's, held to the CPU
// kernels in tests/unit/kernels/test_norm_math.cpp. Tested on a GPU by the op harness
// (tests/gpu/test_cuda_op_harness.cpp) against the double-precision references every backend is
// held to.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/norm_math.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/ops.h"

namespace mt::kernels::cuda {
namespace {

using detail::block_sum;
using detail::check_launch;
using detail::grid_for;
using detail::kMaxWarps;
using detail::kRowThreads;
using kernels::layernorm_input_grad;
using kernels::layernorm_output;
using kernels::norm_rstd;
using kernels::rmsnorm_input_grad;
using kernels::rmsnorm_output;

// --- deterministic column sums over rows (parameter grads) -------------------------------------

constexpr int kColumnTile = 32;  // columns per block: threadIdx.x, one warp reads 32 adjacent floats
constexpr int kRowLanes = 8;     // threadIdx.y: rows r, r + 8, ... of a chunk per thread
constexpr int64_t kMaxChunks = 64;
constexpr int64_t kMinRowsPerChunk = 64;
constexpr int64_t kPartialFloats = int64_t{1} << 22;  // 16 MiB of (terms, chunks, cols) partials

__device__ float g_column_partials[kPartialFloats];

// What row r adds to column c of each grad (terms: 1 or 2).
struct LayerNormWeightAndBias {
  static constexpr int kTerms = 2;
  const float* dy;
  const float* x;
  const float* mean;
  const float* rstd;
  int cols;
  __device__ void operator()(int64_t r, int c, float* acc) const {
    const int64_t i = r * cols + c;
    const float xhat = (x[i] - mean[r]) * rstd[r];
    acc[0] += dy[i] * xhat;
    acc[1] += dy[i];
  }
};

struct LayerNormWeight {
  static constexpr int kTerms = 1;
  const float* dy;
  const float* x;
  const float* mean;
  const float* rstd;
  int cols;
  __device__ void operator()(int64_t r, int c, float* acc) const {
    const int64_t i = r * cols + c;
    const float xhat = (x[i] - mean[r]) * rstd[r];
    acc[0] += dy[i] * xhat;
  }
};

struct RmsNormWeight {
  static constexpr int kTerms = 1;
  const float* dy;
  const float* x;
  const float* rstd;
  int cols;
  __device__ void operator()(int64_t r, int c, float* acc) const {
    const int64_t i = r * cols + c;
    acc[0] += dy[i] * x[i] * rstd[r];
  }
};

struct BiasSum {
  static constexpr int kTerms = 1;
  const float* dy;
  int cols;
  __device__ void operator()(int64_t r, int c, float* acc) const { acc[0] += dy[r * cols + c]; }
};

// grid (column tiles, chunks), block (kColumnTile, kRowLanes). Each thread sums its rows of the
// chunk in order, the kRowLanes lanes are added in lane order, and the chunk's sum is written to
// the scratch (layout (terms, chunks, cols)) or, with one chunk, added to the grads.
template <typename Contribution>
__global__ void column_partials_kernel(Contribution contribution, int64_t rows, int cols, int64_t rows_per_chunk,
                                       int chunks, float* grad0, float* grad1) {
  constexpr int kTerms = Contribution::kTerms;
  __shared__ float lanes[kTerms][kRowLanes][kColumnTile];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int64_t row_begin = blockIdx.y * rows_per_chunk;
  const int64_t row_end = row_begin + rows_per_chunk < rows ? row_begin + rows_per_chunk : rows;
  float acc[kTerms];
  for (int t = 0; t < kTerms; ++t) acc[t] = 0.0f;
  if (c < cols) {
    for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowLanes) contribution(r, c, acc);
  }
  for (int t = 0; t < kTerms; ++t) lanes[t][threadIdx.y][threadIdx.x] = acc[t];
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float* grads[2] = {grad0, grad1};
  for (int t = 0; t < kTerms; ++t) {
    float sum = lanes[t][0][threadIdx.x];
    for (int lane = 1; lane < kRowLanes; ++lane) sum += lanes[t][lane][threadIdx.x];
    if (chunks == 1) {
      grads[t][c] += sum;
    } else {
      g_column_partials[(int64_t{t} * chunks + blockIdx.y) * cols + c] = sum;
    }
  }
}

// grad_t[c] += sum over chunks k, in order, of the scratch's partial (t, k, c).
__global__ void combine_partials_kernel(int terms, int chunks, int cols, float* grad0, float* grad1) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float* grads[2] = {grad0, grad1};
  for (int t = 0; t < terms; ++t) {
    float sum = 0.0f;
    for (int k = 0; k < chunks; ++k) sum += g_column_partials[(int64_t{t} * chunks + k) * cols + c];
    grads[t][c] += sum;
  }
}

// Adds sum_r contribution(r, c) to grad0 (and grad1 for two terms), deterministically.
template <typename Contribution>
void add_column_sums(const Contribution& contribution, int64_t rows, int cols, float* grad0, float* grad1,
                     cudaStream_t stream, const char* entry) {
  constexpr int kTerms = Contribution::kTerms;
  const kernels::RowChunkPlan plan =
      kernels::plan_row_chunks(rows, cols, kTerms, kMaxChunks, kMinRowsPerChunk, kPartialFloats);
  const int chunks = static_cast<int>(plan.count);  // at most kMaxChunks
  const dim3 grid((cols + kColumnTile - 1) / kColumnTile, chunks);
  const dim3 block(kColumnTile, kRowLanes);
  column_partials_kernel<<<grid, block, 0, stream>>>(contribution, rows, cols, plan.rows_per_chunk, chunks, grad0,
                                                     grad1);
  check_launch(entry);
  if (chunks == 1) return;
  constexpr int kCombineThreads = 256;
  combine_partials_kernel<<<(cols + kCombineThreads - 1) / kCombineThreads, kCombineThreads, 0, stream>>>(
      kTerms, chunks, cols, grad0, grad1);
  check_launch(entry);
}

// --- row kernels: one block per row, rows strided over the grid ---------------------------------

__global__ void layernorm_forward_kernel(const float* x, const float* weight, const float* bias, float* y, float* mean,
                                         float* rstd, int64_t rows, int cols, float eps) {
  __shared__ float shared[kMaxWarps];
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;  // (cols)
    float* yr = y + r * cols;        // (cols)
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += xr[c];
    const float row_mean = block_sum(sum, shared) * inv_cols;
    float squares = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      const float centred = xr[c] - row_mean;
      squares += centred * centred;
    }
    const float row_rstd = norm_rstd(block_sum(squares, shared), inv_cols, eps);
    if (bias) {
      for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        yr[c] = layernorm_output(xr[c], row_mean, row_rstd, weight[c], bias[c]);
      }
    } else {
      for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        yr[c] = layernorm_output(xr[c], row_mean, row_rstd, weight[c]);
      }
    }
    if (threadIdx.x == 0) {
      mean[r] = row_mean;
      rstd[r] = row_rstd;
    }
  }
}

// dx = rstd (dy w - mean(dy w) - xhat mean(dy w xhat)), xhat = (x - mean) rstd.
__global__ void layernorm_dx_kernel(const float* dy, const float* x, const float* weight, const float* mean,
                                    const float* rstd, float* dx, int64_t rows, int cols) {
  __shared__ float shared[kMaxWarps];
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * cols;  // (cols)
    const float* xr = x + r * cols;    // (cols)
    float* dxr = dx + r * cols;        // (cols)
    const float row_mean = mean[r], row_rstd = rstd[r];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xhat = (xr[c] - row_mean) * row_rstd;
      const float dxhat = dyr[c] * weight[c];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
    }
    const float mean_dxhat = block_sum(sum_dxhat, shared) * inv_cols;
    const float mean_dxhat_xhat = block_sum(sum_dxhat_xhat, shared) * inv_cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xhat = (xr[c] - row_mean) * row_rstd;
      dxr[c] = layernorm_input_grad(dyr[c], xhat, weight[c], row_rstd, mean_dxhat, mean_dxhat_xhat);
    }
  }
}

__global__ void rmsnorm_forward_kernel(const float* x, const float* weight, float* y, float* rstd, int64_t rows,
                                       int cols, float eps) {
  __shared__ float shared[kMaxWarps];
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;  // (cols)
    float* yr = y + r * cols;        // (cols)
    float squares = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) squares += xr[c] * xr[c];
    const float row_rstd = norm_rstd(block_sum(squares, shared), inv_cols, eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = rmsnorm_output(xr[c], row_rstd, weight[c]);
    if (threadIdx.x == 0) rstd[r] = row_rstd;
  }
}

// dx = rstd dy w - x rstd^3 mean(dy w x).
__global__ void rmsnorm_dx_kernel(const float* dy, const float* x, const float* weight, const float* rstd, float* dx,
                                  int64_t rows, int cols) {
  __shared__ float shared[kMaxWarps];
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * cols;  // (cols)
    const float* xr = x + r * cols;    // (cols)
    float* dxr = dx + r * cols;        // (cols)
    const float row_rstd = rstd[r];
    float sum_dxhat_x = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum_dxhat_x += dyr[c] * weight[c] * xr[c];
    const float correction = row_rstd * row_rstd * row_rstd * block_sum(sum_dxhat_x, shared) * inv_cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      dxr[c] = rmsnorm_input_grad(dyr[c], xr[c], weight[c], row_rstd, correction);
    }
  }
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

void layernorm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                       int64_t rows, int cols, float eps, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  layernorm_forward_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(x, weight, bias, y, mean, rstd,
                                                                                     rows, cols, eps);
  check_launch("layernorm_forward");
}

void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean, const float* rstd,
                        float* dx, float* dweight, float* dbias, int64_t rows, int cols, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  // Parameter grads first: they read dy, which dx may alias (the CPU contract allows dx == dy).
  if (dbias) {
    add_column_sums(LayerNormWeightAndBias{dy, x, mean, rstd, cols}, rows, cols, dweight, dbias, as_stream(stream),
                    "layernorm_backward");
  } else {
    add_column_sums(LayerNormWeight{dy, x, mean, rstd, cols}, rows, cols, dweight, nullptr, as_stream(stream),
                    "layernorm_backward");
  }
  layernorm_dx_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(dy, x, weight, mean, rstd, dx, rows,
                                                                                cols);
  check_launch("layernorm_backward");
}

void rmsnorm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int cols, float eps,
                     void* stream) {
  if (rows <= 0 || cols <= 0) return;
  rmsnorm_forward_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(x, weight, y, rstd, rows, cols,
                                                                                   eps);
  check_launch("rmsnorm_forward");
}

void rmsnorm_backward(const float* dy, const float* x, const float* weight, const float* rstd, float* dx,
                      float* dweight, int64_t rows, int cols, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  // dweight first: it reads dy, which dx may alias.
  add_column_sums(RmsNormWeight{dy, x, rstd, cols}, rows, cols, dweight, nullptr, as_stream(stream),
                  "rmsnorm_backward");
  rmsnorm_dx_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(dy, x, weight, rstd, dx, rows, cols);
  check_launch("rmsnorm_backward");
}

void bias_backward(const float* dy, float* dbias, int64_t rows, int cols, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  add_column_sums(BiasSum{dy, cols}, rows, cols, dbias, nullptr, as_stream(stream), "bias_backward");
}

}  // namespace mt::kernels::cuda
