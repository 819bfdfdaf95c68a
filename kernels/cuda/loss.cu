// CUDA embedding (forward and backward), the vocab-parallel cross-entropy steps and the fp64
// reductions (sum_squares, all_finite): the entries of kernels/cuda/ops.h with the CPU contracts
// of kernels/cpu/ops.h. The cross-entropy row steps take one block per row (a strided loop over up
// to ~130k vocabulary columns and a deterministic block reduction). The embedding backward needs
// no atomics: a block owns a tile of columns and a bucket of table rows (index mod buckets) and
// walks the tokens in order, so every grad element receives its additions in row order, as on the
// CPU. xent_loss_sums adds the rows' losses in row order in double, as the CPU does, and
// sum_squares accumulates in double; each starts from zero and one thread adds the call's total to
// the device doubles at the end. sum_squares sums fixed per-block partials in a second
// kernel through the fixed device scratch g_square_partials (calls are meant to be queued on one
// stream; two streams running it at once would race on that scratch). Tested on a GPU by the op
// harness (tests/gpu/test_cuda_op_harness.cpp) against the double-precision references every
// backend is held to.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/loss_math.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/ops.h"

namespace mt::kernels::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::check_launch;
using detail::grid_for;
using detail::kMaxWarps;
using detail::kRowThreads;
using kernels::EmbeddingGradColumn;
using kernels::embedding_bucket_row;
using kernels::xent_row_loss;

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// --- embedding -------------------------------------------------------------------------------

// One block per row of y (rows, cols), rows strided over the grid, threads over the columns.
__global__ void embedding_forward_kernel(const int32_t* __restrict__ tokens, const int32_t* __restrict__ positions,
                                         const float* __restrict__ wte, const float* __restrict__ wpe,
                                         float* __restrict__ y, int64_t rows, int cols, int64_t vocab_start,
                                         int64_t vocab_end) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* yr = y + r * cols;  // (cols)
    const int64_t token = tokens[r];
    const float* embedding = token >= vocab_start && token < vocab_end ? wte + (token - vocab_start) * cols : nullptr;
    const float* position_embedding = wpe ? wpe + int64_t{positions[r]} * cols : nullptr;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      if (embedding && position_embedding) {
        yr[c] = embedding[c] + position_embedding[c];
      } else if (embedding) {
        yr[c] = embedding[c];
      } else {
        yr[c] = position_embedding ? position_embedding[c] : 0.0f;
      }
    }
  }
}

constexpr int kEmbeddingThreads = 256;      // columns per block
constexpr int64_t kEmbeddingBuckets = 64;   // table rows index % buckets, one bucket per blockIdx.y
constexpr int kIndexTile = 4 * kEmbeddingThreads;  // indices staged in shared memory at a time

// grad[index[r] - index_begin, c] += dy[r, c] for the rows whose index lies in
// [index_begin, index_end), in row order. grid (column tiles, buckets), block kEmbeddingThreads.
// Each thread walks its column with EmbeddingGradColumn (kernels/common/loss_math.h), which keeps
// the current table row's element in a register while consecutive matching rows hit it.
__global__ void embedding_grad_kernel(const int32_t* __restrict__ indices, const float* __restrict__ dy,
                                      float* __restrict__ grad, int64_t rows, int cols, int64_t index_begin,
                                      int64_t index_end, int64_t buckets) {
  __shared__ int64_t tile_rows[kIndexTile];  // table row of each staged row, -1 when not this bucket's
  const int c = blockIdx.x * kEmbeddingThreads + threadIdx.x;
  const int64_t bucket = blockIdx.y;
  EmbeddingGradColumn column{grad, cols, c};
  for (int64_t tile_begin = 0; tile_begin < rows; tile_begin += kIndexTile) {
    const int count = static_cast<int>(rows - tile_begin < kIndexTile ? rows - tile_begin : kIndexTile);
    __syncthreads();  // the previous tile has been read
    for (int k = threadIdx.x; k < count; k += kEmbeddingThreads) {
      tile_rows[k] = embedding_bucket_row(indices[tile_begin + k], index_begin, index_end, buckets, bucket);
    }
    __syncthreads();
    if (c >= cols) continue;
    for (int k = 0; k < count; ++k) {
      if (tile_rows[k] >= 0) column.add(tile_rows[k], dy[(tile_begin + k) * cols + c]);
    }
  }
  if (c < cols) column.finish();
}

void launch_embedding_grad(const int32_t* indices, const float* dy, float* grad, int64_t rows, int cols,
                           int64_t index_begin, int64_t index_end, cudaStream_t stream) {
  const int64_t buckets = rows < kEmbeddingBuckets ? rows : kEmbeddingBuckets;
  const dim3 grid((cols + kEmbeddingThreads - 1) / kEmbeddingThreads, static_cast<unsigned>(buckets));
  embedding_grad_kernel<<<grid, kEmbeddingThreads, 0, stream>>>(indices, dy, grad, rows, cols, index_begin,
                                                                index_end, buckets);
  check_launch("embedding_backward");
}

// --- cross-entropy: one block per row, rows strided over the grid -------------------------------

__global__ void xent_row_max_kernel(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols,
                                    float* row_max) {
  __shared__ float shared[kMaxWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* lr = logits + r * ld;  // (valid_cols) of (ld)
    float best = -INFINITY;
    for (int64_t c = threadIdx.x; c < valid_cols; c += blockDim.x) best = lr[c] > best ? lr[c] : best;
    best = block_max(best, shared);
    if (threadIdx.x == 0) row_max[r] = best;
  }
}

__global__ void xent_row_sumexp_kernel(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols,
                                       const float* row_max, float* row_sumexp) {
  __shared__ float shared[kMaxWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* lr = logits + r * ld;  // (valid_cols) of (ld)
    const float shift = row_max[r];
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < valid_cols; c += blockDim.x) sum += expf(lr[c] - shift);
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) row_sumexp[r] = sum;
  }
}

// One thread per row.
__global__ void xent_target_logit_kernel(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols,
                                         int64_t vocab_start, const int32_t* targets, float* target_logit) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows; r += int64_t{gridDim.x} * blockDim.x) {
    const int64_t column = int64_t{targets[r]} - vocab_start;
    target_logit[r] = column >= 0 && column < valid_cols ? logits[r * ld + column] : 0.0f;
  }
}

// In place: logits -> dloss (softmax - onehot(target)) over the valid columns, 0 on the padding.
__global__ void xent_backward_kernel(float* logits, int64_t rows, int64_t ld, int64_t valid_cols, int64_t vocab_start,
                                     const int32_t* targets, const float* row_max, const float* row_sumexp,
                                     const float* dloss) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* lr = logits + r * ld;  // (ld): softmax over [0, valid_cols), padding after
    const float shift = row_max[r];
    const float row_dloss = dloss[r];
    const float scale = row_dloss / row_sumexp[r];
    const int64_t column = int64_t{targets[r]} - vocab_start;
    for (int64_t c = threadIdx.x; c < ld; c += blockDim.x) {
      if (c >= valid_cols) {
        lr[c] = 0.0f;
        continue;
      }
      const float grad = expf(lr[c] - shift) * scale;
      lr[c] = c == column ? grad - row_dloss : grad;
    }
  }
}

// A single block: the threads compute a tile of rows' masked losses (in double) into shared
// memory, then thread 0 adds them in row order, so the sums are exactly the sequential row-order
// sums the contract names; thread 0 adds them to the device doubles at the end.
constexpr int kLossTile = 256;  // threads of the block, rows per tile

__global__ void xent_loss_sums_kernel(const float* row_max, const float* row_sumexp, const float* target_logit,
                                      const float* loss_mask, int64_t rows, double* loss_sum, double* mask_sum) {
  __shared__ double tile_loss[kLossTile];
  __shared__ double tile_mask[kLossTile];
  double loss = 0.0, mask_total = 0.0;
  for (int64_t tile_begin = 0; tile_begin < rows; tile_begin += kLossTile) {
    const int64_t r = tile_begin + threadIdx.x;
    if (r < rows) {
      const double mask = loss_mask ? static_cast<double>(loss_mask[r]) : 1.0;
      tile_loss[threadIdx.x] = mask * xent_row_loss(row_max[r], row_sumexp[r], target_logit[r]);
      tile_mask[threadIdx.x] = mask;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int count = static_cast<int>(rows - tile_begin < kLossTile ? rows - tile_begin : kLossTile);
      for (int k = 0; k < count; ++k) {
        loss += tile_loss[k];
        mask_total += tile_mask[k];
      }
    }
    __syncthreads();  // the tile has been read before the next one is written
  }
  if (threadIdx.x == 0) {
    *loss_sum += loss;
    *mask_sum += mask_total;
  }
}

// --- reductions --------------------------------------------------------------------------------

constexpr int kReduceThreads = 256;
constexpr int64_t kReduceItemsPerThread = 8;        // at least, before the grid grows
constexpr int64_t kMaxSquareBlocks = 1024;          // partials in the scratch
__device__ double g_square_partials[kMaxSquareBlocks];

// Block b sums x[i]^2 (in double) over its grid-strided elements into g_square_partials[b].
__global__ void square_partials_kernel(const float* x, int64_t n) {
  __shared__ double shared[kMaxWarps];
  double sum = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const double v = x[i];
    sum += v * v;
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) g_square_partials[blockIdx.x] = sum;
}

// One block: *sum += the partials of `blocks` blocks, added up in a fixed order.
__global__ void add_square_partials_kernel(int blocks, double* sum) {
  __shared__ double shared[kMaxWarps];
  double total = 0.0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) total += g_square_partials[b];
  total = block_sum(total, shared);
  if (threadIdx.x == 0) *sum += total;
}

// A float is finite iff its exponent bits are not all ones: any |bits| >= 0x7f800000 clears *finite.
__global__ void all_finite_kernel(const float* x, int64_t n, int32_t* finite) {
  uint32_t largest = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t magnitude = __float_as_uint(x[i]) & 0x7fffffffu;
    largest = magnitude > largest ? magnitude : largest;
  }
  if (largest >= 0x7f800000u) *finite = 0;
}

}  // namespace

void embedding_forward(const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe, float* y,
                       int64_t rows, int cols, int64_t vocab_start, int64_t vocab_end, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  embedding_forward_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(
      tokens, positions, wte, wpe, y, rows, cols, vocab_start, vocab_end);
  check_launch("embedding_forward");
}

void embedding_backward(const int32_t* tokens, const int32_t* positions, const float* dy, float* dwte, float* dwpe,
                        int64_t rows, int cols, int64_t vocab_start, int64_t vocab_end, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  launch_embedding_grad(tokens, dy, dwte, rows, cols, vocab_start, vocab_end, as_stream(stream));
  if (dwpe) launch_embedding_grad(positions, dy, dwpe, rows, cols, 0, INT64_MAX, as_stream(stream));
}

void xent_row_max(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, float* row_max, void* stream) {
  if (rows <= 0) return;
  xent_row_max_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(logits, rows, ld, valid_cols,
                                                                                row_max);
  check_launch("xent_row_max");
}

void xent_row_sumexp(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, const float* row_max,
                     float* row_sumexp, void* stream) {
  if (rows <= 0) return;
  xent_row_sumexp_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(logits, rows, ld, valid_cols,
                                                                                   row_max, row_sumexp);
  check_launch("xent_row_sumexp");
}

void xent_target_logit(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, int64_t vocab_start,
                       const int32_t* targets, float* target_logit, void* stream) {
  if (rows <= 0) return;
  xent_target_logit_kernel<<<grid_for(rows, kRowThreads), kRowThreads, 0, as_stream(stream)>>>(
      logits, rows, ld, valid_cols, vocab_start, targets, target_logit);
  check_launch("xent_target_logit");
}

void xent_backward(float* logits, int64_t rows, int64_t ld, int64_t valid_cols, int64_t vocab_start,
                   const int32_t* targets, const float* row_max, const float* row_sumexp, const float* dloss,
                   void* stream) {
  if (rows <= 0 || ld <= 0) return;
  xent_backward_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(
      logits, rows, ld, valid_cols, vocab_start, targets, row_max, row_sumexp, dloss);
  check_launch("xent_backward");
}

void xent_loss_sums(const float* row_max, const float* row_sumexp, const float* target_logit, const float* loss_mask,
                    int64_t rows, double* loss_sum, double* mask_sum, void* stream) {
  if (rows <= 0) return;
  xent_loss_sums_kernel<<<1, kLossTile, 0, as_stream(stream)>>>(row_max, row_sumexp, target_logit, loss_mask, rows,
                                                                  loss_sum, mask_sum);
  check_launch("xent_loss_sums");
}

void sum_squares(const float* x, int64_t n, double* sum, void* stream) {
  if (n <= 0) return;
  const unsigned blocks = grid_for(n, kReduceThreads * kReduceItemsPerThread, kMaxSquareBlocks);
  square_partials_kernel<<<blocks, kReduceThreads, 0, as_stream(stream)>>>(x, n);
  check_launch("sum_squares");
  add_square_partials_kernel<<<1, kReduceThreads, 0, as_stream(stream)>>>(static_cast<int>(blocks), sum);
  check_launch("sum_squares");
}

void all_finite(const float* x, int64_t n, int32_t* finite, void* stream) {
  if (n <= 0) return;
  all_finite_kernel<<<grid_for(n, kReduceThreads * kReduceItemsPerThread), kReduceThreads, 0, as_stream(stream)>>>(
      x, n, finite);
  check_launch("all_finite");
}

}  // namespace mt::kernels::cuda
