// CUDA attention kernels and their host round-trip entries (see attention.h).
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"

namespace mt::kernels::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// A device copy of `n` elements of a host array (n may be 0, host may be null).
template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  DeviceArray(const T* host, size_t count) : n(count) {
    check(cudaMalloc(&ptr, n * sizeof(T) + 1), "cudaMalloc");
    if (host && n) check(cudaMemcpy(ptr, host, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void to_host(T* host) const {
    if (n) check(cudaMemcpy(host, ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
};

__device__ bool sees(const AttentionShape& s, const int32_t* doc_start, int b, int t, int j) {
  const int64_t query = s.q_pos0 + t, key = s.kv_pos0 + j;
  if (key > query) return false;
  return doc_start == nullptr || key >= doc_start[int64_t(b) * s.q_len + t];
}

__device__ float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// One thread per (sample, query head, query): online softmax over the visible keys.
__global__ void forward_kernel(AttentionShape s, const float* q, const float* k, const float* v,
                               const int32_t* doc_start, float* out, float* lse) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= int64_t(s.batch) * s.q_heads * s.q_len) return;
  const int t = int(row % s.q_len), h = int(row / s.q_len % s.q_heads), b = int(row / s.q_len / s.q_heads);
  const int g = h / (s.q_heads / s.kv_heads), dim = s.head_dim;
  const float* q_row = q + (int64_t(b) * s.q_len + t) * s.q_stride + int64_t(h) * dim;
  float acc[kMaxAttentionHeadDim];
  for (int d = 0; d < dim; ++d) acc[d] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int j = 0; j < s.kv_len; ++j) {
    if (!sees(s, doc_start, b, t, j)) continue;
    const float* k_row = k + (int64_t(b) * s.kv_len + j) * s.k_stride + int64_t(g) * dim;
    const float* v_row = v + (int64_t(b) * s.kv_len + j) * s.v_stride + int64_t(g) * dim;
    const float score = s.scale * dot(q_row, k_row, dim);
    const float new_max = fmaxf(running_max, score);
    const float rescale = running_max == -INFINITY ? 0.0f : expf(running_max - new_max);
    const float p = expf(score - new_max);
    running_sum = running_sum * rescale + p;
    for (int d = 0; d < dim; ++d) acc[d] = acc[d] * rescale + p * v_row[d];
    running_max = new_max;
  }
  float* out_row = out + (int64_t(b) * s.q_len + t) * s.o_stride + int64_t(h) * dim;
  float* row_lse = lse + (int64_t(b) * s.q_heads + h) * s.q_len + t;
  if (running_sum == 0.0f) {
    for (int d = 0; d < dim; ++d) out_row[d] = 0.0f;
    *row_lse = -INFINITY;
    return;
  }
  for (int d = 0; d < dim; ++d) out_row[d] = acc[d] / running_sum;
  *row_lse = running_max + logf(running_sum);
}

// P and dS of one (query, key) pair: p = exp(scale q.k - lse), ds = p (dout.v - delta).
struct PairGrad {
  float p;
  float ds;
};

__device__ PairGrad pair_grad(const AttentionShape& s, const float* q_row, const float* k_row, const float* v_row,
                              const float* dout_row, float row_lse, float delta) {
  const float p = expf(s.scale * dot(q_row, k_row, s.head_dim) - row_lse);
  return {p, p * (dot(dout_row, v_row, s.head_dim) - delta)};
}

// One thread per (sample, query head, query): dq over the visible keys.
__global__ void dq_kernel(AttentionShape s, const float* q, const float* k, const float* v, const int32_t* doc_start,
                          const float* out, const float* dout, const float* lse, float* dq) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= int64_t(s.batch) * s.q_heads * s.q_len) return;
  const int t = int(row % s.q_len), h = int(row / s.q_len % s.q_heads), b = int(row / s.q_len / s.q_heads);
  const int g = h / (s.q_heads / s.kv_heads), dim = s.head_dim;
  const int64_t q_offset = (int64_t(b) * s.q_len + t) * s.q_stride + int64_t(h) * dim;
  const int64_t o_offset = (int64_t(b) * s.q_len + t) * s.o_stride + int64_t(h) * dim;
  const float row_lse = lse[(int64_t(b) * s.q_heads + h) * s.q_len + t];
  const float delta = dot(dout + o_offset, out + o_offset, dim);
  float acc[kMaxAttentionHeadDim];
  for (int d = 0; d < dim; ++d) acc[d] = 0.0f;
  for (int j = 0; row_lse != -INFINITY && j < s.kv_len; ++j) {
    if (!sees(s, doc_start, b, t, j)) continue;
    const float* k_row = k + (int64_t(b) * s.kv_len + j) * s.k_stride + int64_t(g) * dim;
    const float* v_row = v + (int64_t(b) * s.kv_len + j) * s.v_stride + int64_t(g) * dim;
    const PairGrad grad = pair_grad(s, q + q_offset, k_row, v_row, dout + o_offset, row_lse, delta);
    for (int d = 0; d < dim; ++d) acc[d] += s.scale * grad.ds * k_row[d];
  }
  float* dq_row = dq + q_offset;
  for (int d = 0; d < dim; ++d) dq_row[d] = s.accumulate_grads ? dq_row[d] + acc[d] : acc[d];
}

// One thread per (sample, kv head, key): dk, dv over the query heads of its group and the queries.
__global__ void dkdv_kernel(AttentionShape s, const float* q, const float* k, const float* v,
                            const int32_t* doc_start, const float* out, const float* dout, const float* lse, float* dk,
                            float* dv) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= int64_t(s.batch) * s.kv_heads * s.kv_len) return;
  const int j = int(row % s.kv_len), g = int(row / s.kv_len % s.kv_heads), b = int(row / s.kv_len / s.kv_heads);
  const int group = s.q_heads / s.kv_heads, dim = s.head_dim;
  const int64_t k_offset = (int64_t(b) * s.kv_len + j) * s.k_stride + int64_t(g) * dim;
  const int64_t v_offset = (int64_t(b) * s.kv_len + j) * s.v_stride + int64_t(g) * dim;
  float dk_acc[kMaxAttentionHeadDim], dv_acc[kMaxAttentionHeadDim];
  for (int d = 0; d < dim; ++d) dk_acc[d] = dv_acc[d] = 0.0f;
  for (int h = g * group; h < (g + 1) * group; ++h) {
    for (int t = 0; t < s.q_len; ++t) {
      if (!sees(s, doc_start, b, t, j)) continue;
      const float row_lse = lse[(int64_t(b) * s.q_heads + h) * s.q_len + t];
      if (row_lse == -INFINITY) continue;
      const int64_t q_offset = (int64_t(b) * s.q_len + t) * s.q_stride + int64_t(h) * dim;
      const int64_t o_offset = (int64_t(b) * s.q_len + t) * s.o_stride + int64_t(h) * dim;
      const float delta = dot(dout + o_offset, out + o_offset, dim);
      const PairGrad grad = pair_grad(s, q + q_offset, k + k_offset, v + v_offset, dout + o_offset, row_lse, delta);
      for (int d = 0; d < dim; ++d) {
        dv_acc[d] += grad.p * dout[o_offset + d];
        dk_acc[d] += s.scale * grad.ds * q[q_offset + d];
      }
    }
  }
  for (int d = 0; d < dim; ++d) {
    dk[k_offset + d] = s.accumulate_grads ? dk[k_offset + d] + dk_acc[d] : dk_acc[d];
    dv[v_offset + d] = s.accumulate_grads ? dv[v_offset + d] + dv_acc[d] : dv_acc[d];
  }
}

// One thread per (sample, query head, query) row of the lse.
__global__ void merge_kernel(AttentionShape s, float* out, float* lse, const float* part_out, const float* part_lse) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= int64_t(s.batch) * s.q_heads * s.q_len) return;
  const float part = part_lse[row];
  if (part == -INFINITY) return;
  const int t = int(row % s.q_len), h = int(row / s.q_len % s.q_heads), b = int(row / s.q_len / s.q_heads);
  const int64_t offset = (int64_t(b) * s.q_len + t) * s.o_stride + int64_t(h) * s.head_dim;
  const float running = lse[row];
  const float top = fmaxf(running, part);
  const float running_weight = running == -INFINITY ? 0.0f : expf(running - top);
  const float merged = top + logf(running_weight + expf(part - top));
  const float part_scale = expf(part - merged);
  const float running_scale = running_weight == 0.0f ? 0.0f : expf(running - merged);
  for (int d = 0; d < s.head_dim; ++d) {
    const float kept = running_weight == 0.0f ? 0.0f : running_scale * out[offset + d];
    out[offset + d] = kept + part_scale * part_out[offset + d];
  }
  lse[row] = merged;
}

unsigned blocks_for(int64_t threads, unsigned per_block) { return unsigned((threads + per_block - 1) / per_block); }

}  // namespace

void attention_roundtrip(const AttentionShape& shape, const float* q, const float* k, const float* v,
                         const int32_t* doc_start, const float* dout, float* out, float* lse, float* dq, float* dk,
                         float* dv) {
  if (shape.head_dim > kMaxAttentionHeadDim) throw std::runtime_error("attention: head_dim above 256");
  if (shape.dropout.key.p != 0.0f) {
    throw std::runtime_error("attention: dropout (AttentionShape::dropout) is not implemented in the CUDA kernels yet");
  }
  const size_t q_rows = size_t(shape.batch) * shape.q_len, kv_rows = size_t(shape.batch) * shape.kv_len;
  DeviceArray<float> d_q(q, q_rows * shape.q_stride), d_k(k, kv_rows * shape.k_stride);
  DeviceArray<float> d_v(v, kv_rows * shape.v_stride);
  DeviceArray<int32_t> d_docs(doc_start, doc_start ? q_rows : 0);
  DeviceArray<float> d_dout(dout, q_rows * shape.o_stride), d_out(out, q_rows * shape.o_stride);
  DeviceArray<float> d_lse(nullptr, q_rows * shape.q_heads);
  DeviceArray<float> d_dq(dq, q_rows * shape.q_stride), d_dk(dk, kv_rows * shape.k_stride),
      d_dv(dv, kv_rows * shape.v_stride);
  const int32_t* docs = doc_start ? d_docs.ptr : nullptr;
  const unsigned per_block = 128;
  const int64_t query_rows = int64_t(q_rows) * shape.q_heads, key_rows = int64_t(kv_rows) * shape.kv_heads;
  if (query_rows > 0) {
    forward_kernel<<<blocks_for(query_rows, per_block), per_block>>>(shape, d_q.ptr, d_k.ptr, d_v.ptr, docs, d_out.ptr,
                                                                     d_lse.ptr);
    check(cudaGetLastError(), "attention forward");
    dq_kernel<<<blocks_for(query_rows, per_block), per_block>>>(shape, d_q.ptr, d_k.ptr, d_v.ptr, docs, d_out.ptr,
                                                                d_dout.ptr, d_lse.ptr, d_dq.ptr);
    check(cudaGetLastError(), "attention dq");
  }
  if (key_rows > 0) {
    dkdv_kernel<<<blocks_for(key_rows, per_block), per_block>>>(shape, d_q.ptr, d_k.ptr, d_v.ptr, docs, d_out.ptr,
                                                                d_dout.ptr, d_lse.ptr, d_dk.ptr, d_dv.ptr);
    check(cudaGetLastError(), "attention dk dv");
  }
  check(cudaDeviceSynchronize(), "attention");
  d_out.to_host(out);
  d_lse.to_host(lse);
  d_dq.to_host(dq);
  d_dk.to_host(dk);
  d_dv.to_host(dv);
}

void attention_merge_roundtrip(const AttentionShape& shape, float* out, float* lse, const float* part_out,
                               const float* part_lse) {
  const size_t q_rows = size_t(shape.batch) * shape.q_len, lse_rows = q_rows * shape.q_heads;
  DeviceArray<float> d_out(out, q_rows * shape.o_stride), d_lse(lse, lse_rows);
  DeviceArray<float> d_part_out(part_out, q_rows * shape.o_stride), d_part_lse(part_lse, lse_rows);
  const unsigned per_block = 128;
  if (lse_rows > 0) {
    merge_kernel<<<blocks_for(int64_t(lse_rows), per_block), per_block>>>(shape, d_out.ptr, d_lse.ptr, d_part_out.ptr,
                                                                          d_part_lse.ptr);
    check(cudaGetLastError(), "attention merge");
  }
  check(cudaDeviceSynchronize(), "attention merge");
  d_out.to_host(out);
  d_lse.to_host(lse);
}

}  // namespace mt::kernels::cuda
