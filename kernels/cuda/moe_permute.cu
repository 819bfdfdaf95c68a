// CUDA kernels of the MoE token dispatcher's row moves: the entries moe_expert_counts,
// moe_route_index, moe_permute_rows, moe_unpermute_rows, moe_unroute_probs and moe_sort_chunks of
// kernels/cuda/ops.h with the CPU contracts of kernels/cpu/moe_permute.h. Every output element is
// written by one thread, index outputs equal the CPU's bit for bit, and the scatter-add of
// moe_unpermute_rows adds each output row's sources in ascending source row from +0.0f, as the CPU
// does (no atomics), so its sums are the CPU's too. The prefix sums the CPU keeps in host vectors
// are worked out on the device (shared memory, or recomputed per block), so no entry allocates,
// copies to or from the host or synchronises. Tested on a GPU by the op harness
// (tests/gpu/test_cuda_op_harness.cpp, the cases of tests/harness/cases_moe_permute.cpp).
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
constexpr int kMaxExperts = 4096;  // int64 counts of every expert in one block's shared memory

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// One thread per expert: counts[e] = its column's nonzeros.
__global__ void expert_counts_kernel(const uint8_t* routing_map, int64_t tokens, int experts, int64_t* counts) {
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < experts; e += gridDim.x * blockDim.x) {
    int64_t count = 0;
    for (int64_t t = 0; t < tokens; ++t) count += routing_map[t * experts + e] != 0 ? 1 : 0;
    counts[e] = count;
  }
}

// One block: the experts' counts and their prefix sums in shared memory (first_row, E + 1), then
// one thread per expert writes its rows in token order.
__global__ void route_index_kernel(const uint8_t* routing_map, const float* probs, int64_t tokens, int experts,
                                   int32_t* row_token, float* row_probs) {
  extern __shared__ int64_t first_row[];  // (E + 1)
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int64_t count = 0;
    for (int64_t t = 0; t < tokens; ++t) count += routing_map[t * experts + e] != 0 ? 1 : 0;
    first_row[e + 1] = count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    first_row[0] = 0;
    for (int e = 0; e < experts; ++e) first_row[e + 1] += first_row[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int64_t r = first_row[e];
    for (int64_t t = 0; t < tokens; ++t) {
      if (routing_map[t * experts + e] == 0) continue;
      row_token[r] = static_cast<int32_t>(t);
      row_probs[r] = probs[t * experts + e];
      ++r;
    }
  }
}

// out[r, c] = in[row_index[r], c], grid-stride over the elements.
__global__ void permute_rows_kernel(const float* in, const int32_t* row_index, int64_t rows, int64_t cols,
                                    float* out) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = in[int64_t{row_index[r]} * cols + c];
  }
}

// One block per output row t (strided over the grid): the block scans row_index a tile at a time
// (flags in shared memory), and each thread adds, for its columns, the flagged source rows of the
// tile in ascending order; so out[t, c] receives its sources in ascending r, starting from +0.0f.
__global__ void unpermute_rows_kernel(const float* in, const int32_t* row_index, int64_t rows, int64_t cols,
                                      float* out, int64_t out_rows) {
  __shared__ int is_source[kThreads];
  for (int64_t t = blockIdx.x; t < out_rows; t += gridDim.x) {
    float* y = out + t * cols;  // (cols)
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[c] = 0.0f;
    for (int64_t tile_begin = 0; tile_begin < rows; tile_begin += kThreads) {
      const int64_t r = tile_begin + threadIdx.x;
      __syncthreads();  // the previous tile's flags have been read
      is_source[threadIdx.x] = r < rows && row_index[r] == t ? 1 : 0;
      __syncthreads();
      const int count = static_cast<int>(rows - tile_begin < kThreads ? rows - tile_begin : kThreads);
      for (int j = 0; j < count; ++j) {
        if (!is_source[j]) continue;
        const float* x = in + (tile_begin + j) * cols;  // (cols)
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[c] += x[c];
      }
    }
  }
}

// dprobs (tokens, experts) = 0, grid-stride.
__global__ void zero_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = 0.0f;
}

// One block per expert e (strided over the grid): its rows start after the rows of the experts
// before it; threads write dprobs[row_token[r], e] = row_grads[r] for its rows.
__global__ void unroute_probs_kernel(const float* row_grads, const int32_t* row_token, const int64_t* expert_rows,
                                     int experts, float* dprobs) {
  for (int e = blockIdx.x; e < experts; e += gridDim.x) {
    int64_t first = 0;
    for (int before = 0; before < e; ++before) first += expert_rows[before];
    for (int64_t i = threadIdx.x; i < expert_rows[e]; i += blockDim.x) {
      const int64_t r = first + i;
      dprobs[int64_t{row_token[r]} * experts + e] = row_grads[r];
    }
  }
}

// One block per output chunk j (strided over the grid): thread 0 finds where in's chunk order[j]
// starts and where out's chunk j starts; the block copies its rows.
__global__ void sort_chunks_kernel(const float* in, int64_t cols, const int64_t* chunk_rows, const int32_t* order,
                                   int chunks, float* out) {
  __shared__ int64_t in_first, out_first;
  for (int j = blockIdx.x; j < chunks; j += gridDim.x) {
    if (threadIdx.x == 0) {
      int64_t in_start = 0, out_start = 0;
      for (int i = 0; i < order[j]; ++i) in_start += chunk_rows[i];
      for (int before = 0; before < j; ++before) out_start += chunk_rows[order[before]];
      in_first = in_start;
      out_first = out_start;
    }
    __syncthreads();
    const int64_t elements = chunk_rows[order[j]] * cols;
    const float* source = in + in_first * cols;
    float* target = out + out_first * cols;
    for (int64_t i = threadIdx.x; i < elements; i += blockDim.x) target[i] = source[i];
    __syncthreads();  // the starts are read before the next chunk writes them
  }
}

}  // namespace

void moe_expert_counts(const uint8_t* routing_map, int64_t tokens, int experts, int64_t* counts, void* stream) {
  if (experts <= 0) return;
  expert_counts_kernel<<<grid_for(experts, kThreads), kThreads, 0, as_stream(stream)>>>(routing_map, tokens,
                                                                                       experts, counts);
  check_launch("moe_expert_counts");
}

void moe_route_index(const uint8_t* routing_map, const float* probs, int64_t tokens, int experts, int32_t* row_token,
                     float* row_probs, void* stream) {
  if (experts <= 0 || tokens <= 0) return;
  if (experts > kMaxExperts) {
    throw std::invalid_argument("cuda moe_route_index: " + std::to_string(experts) + " experts, more than the " +
                                std::to_string(kMaxExperts) + " its kernel takes");
  }
  const size_t shared = (static_cast<size_t>(experts) + 1) * sizeof(int64_t);
  route_index_kernel<<<1, kThreads, shared, as_stream(stream)>>>(routing_map, probs, tokens, experts, row_token,
                                                                 row_probs);
  check_launch("moe_route_index");
}

void moe_permute_rows(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out,
                      void* stream) {
  if (rows <= 0 || cols <= 0) return;
  permute_rows_kernel<<<grid_for(rows * cols, kThreads), kThreads, 0, as_stream(stream)>>>(in, row_index, rows, cols,
                                                                                          out);
  check_launch("moe_permute_rows");
}

void moe_unpermute_rows(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out,
                        int64_t out_rows, void* stream) {
  if (out_rows <= 0 || cols <= 0) return;
  unpermute_rows_kernel<<<grid_for(out_rows, 1), kThreads, 0, as_stream(stream)>>>(in, row_index, rows, cols, out,
                                                                                   out_rows);
  check_launch("moe_unpermute_rows");
}

void moe_unroute_probs(const float* row_grads, const int32_t* row_token, const int64_t* expert_rows, int64_t tokens,
                       int experts, float* dprobs, void* stream) {
  if (tokens <= 0 || experts <= 0) return;
  zero_kernel<<<grid_for(tokens * experts, kThreads), kThreads, 0, as_stream(stream)>>>(dprobs, tokens * experts);
  check_launch("moe_unroute_probs");
  unroute_probs_kernel<<<grid_for(experts, 1), kThreads, 0, as_stream(stream)>>>(row_grads, row_token, expert_rows,
                                                                                 experts, dprobs);
  check_launch("moe_unroute_probs");
}

void moe_sort_chunks(const float* in, int64_t cols, const int64_t* chunk_rows, const int32_t* order, int chunks,
                     float* out, void* stream) {
  if (chunks <= 0 || cols <= 0) return;
  sort_chunks_kernel<<<grid_for(chunks, 1), kThreads, 0, as_stream(stream)>>>(in, cols, chunk_rows, order, chunks,
                                                                              out);
  check_launch("moe_sort_chunks");
}

}  // namespace mt::kernels::cuda
