// Host entries of the CUDA fused causal attention (kernels/cuda/ops.h: attention_forward,
// attention_backward, attention_merge): shape checks, the head-dim bucket, grids and launches on
// the given stream, a launch-error check naming the entry and the shape. The kernels and their
// tiling: attention_kernels.cuh. Tested on a GPU by the op harness's CUDA runner (label gpu; cases
// in tests/harness/cases_attention.cpp), the kernels on the CPU in
// tests/unit/kernels/test_cuda_attention_emulated.cpp.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/ops.h"

namespace mt::kernels::cuda {
namespace {

using namespace attention_kernels;

// ---- host side ----------------------------------------------------------------------------------

std::string describe(const AttentionShape& s) {
  return "B=" + std::to_string(s.batch) + " Tq=" + std::to_string(s.q_len) + " Tkv=" + std::to_string(s.kv_len) +
         " Hq=" + std::to_string(s.q_heads) + " Hkv=" + std::to_string(s.kv_heads) +
         " D=" + std::to_string(s.head_dim) + " q_pos0=" + std::to_string(s.q_pos0) +
         " kv_pos0=" + std::to_string(s.kv_pos0) + " dropout p=" + std::to_string(s.dropout.key.p);
}

void check_launch(const char* entry, const AttentionShape& s) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(entry) + ": kernel launch failed (" + describe(s) +
                             "): " + cudaGetErrorString(status));
  }
}

void check_shape(const char* entry, const AttentionShape& s) {
  if (s.head_dim > kMaxHeadDim) {
    throw std::runtime_error(std::string(entry) + ": head_dim above " + std::to_string(kMaxHeadDim) + " (" +
                             describe(s) + ")");
  }
  if (s.kv_heads <= 0 || s.q_heads % s.kv_heads != 0) {
    throw std::runtime_error(std::string(entry) + ": q_heads must be a multiple of kv_heads (" + describe(s) + ")");
  }
  if (s.dropout.key.p > 0.0f && s.dropout.row_ids == nullptr) {
    throw std::runtime_error(std::string(entry) + ": dropout without row_ids (" + describe(s) + ")");
  }
}

// Blocks of a grid over `count` tiles of (batch, heads); grid.x holds up to 2^31 - 1.
unsigned grid_of(const char* entry, const AttentionShape& s, int64_t blocks) {
  if (blocks > 0x7fffffff) throw std::runtime_error(std::string(entry) + ": grid too large (" + describe(s) + ")");
  return static_cast<unsigned>(blocks);
}

template <int kDimMax>
void launch_forward(const AttentionShape& s, const float* q, const float* k, const float* v, const int32_t* doc_start,
                    float* out, float* lse, cudaStream_t stream) {
  const unsigned grid = grid_of("attention_forward", s, query_blocks<kDimMax>(s));
  forward_kernel<kDimMax><<<grid, kThreads, 0, stream>>>(s, q, k, v, doc_start, out, lse, query_tiles<kDimMax>(s));
  check_launch("attention_forward", s);
}

template <int kDimMax>
void launch_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const int32_t* doc_start,
                     const float* out, const float* dout, const float* lse, float* dq, float* dk, float* dv,
                     cudaStream_t stream) {
  if (s.q_len > 0) {
    const unsigned q_grid = grid_of("attention_backward", s, query_blocks<kDimMax>(s));
    dq_kernel<kDimMax>
        <<<q_grid, kThreads, 0, stream>>>(s, q, k, v, doc_start, out, dout, lse, dq, query_tiles<kDimMax>(s));
    check_launch("attention_backward (dq)", s);
  }
  if (s.kv_len == 0) return;
  const unsigned kv_grid = grid_of("attention_backward", s, key_blocks<kDimMax>(s));
  dkdv_kernel<kDimMax><<<kv_grid, kThreads, 0, stream>>>(s, q, k, v, doc_start, out, dout, lse, dk, dv);
  check_launch("attention_backward (dk, dv)", s);
}

}  // namespace

void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                       const int32_t* doc_start, float* out, float* lse, void* stream) {
  check_shape("attention_forward", shape);
  if (shape.batch == 0 || shape.q_len == 0 || shape.q_heads == 0 || shape.head_dim == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (dim_bucket(shape.head_dim)) {
    case 32:
      return launch_forward<32>(shape, q, k, v, doc_start, out, lse, cuda_stream);
    case 64:
      return launch_forward<64>(shape, q, k, v, doc_start, out, lse, cuda_stream);
    case 128:
      return launch_forward<128>(shape, q, k, v, doc_start, out, lse, cuda_stream);
    default:
      return launch_forward<256>(shape, q, k, v, doc_start, out, lse, cuda_stream);
  }
}

void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                        const int32_t* doc_start, const float* out, const float* dout, const float* lse, float* dq,
                        float* dk, float* dv, void* stream) {
  check_shape("attention_backward", shape);
  // q_len == 0 still writes dk and dv (zeros, as the CPU does unless accumulating).
  if (shape.batch == 0 || shape.q_heads == 0 || shape.head_dim == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (dim_bucket(shape.head_dim)) {
    case 32:
      return launch_backward<32>(shape, q, k, v, doc_start, out, dout, lse, dq, dk, dv, cuda_stream);
    case 64:
      return launch_backward<64>(shape, q, k, v, doc_start, out, dout, lse, dq, dk, dv, cuda_stream);
    case 128:
      return launch_backward<128>(shape, q, k, v, doc_start, out, dout, lse, dq, dk, dv, cuda_stream);
    default:
      return launch_backward<256>(shape, q, k, v, doc_start, out, dout, lse, dq, dk, dv, cuda_stream);
  }
}

void attention_merge(const AttentionShape& shape, float* out, float* lse, const float* part_out, const float* part_lse,
                     void* stream) {
  const int64_t rows = int64_t(shape.batch) * shape.q_heads * shape.q_len;
  if (rows == 0 || shape.head_dim == 0) return;
  const unsigned grid = grid_of("attention_merge", shape, merge_blocks(shape));
  merge_kernel<<<grid, 32 * kMergeWarps, 0, static_cast<cudaStream_t>(stream)>>>(shape, out, lse, part_out, part_lse);
  check_launch("attention_merge", shape);
}

}  // namespace mt::kernels::cuda
