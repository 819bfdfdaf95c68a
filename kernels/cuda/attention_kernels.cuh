// CUDA fused causal attention: attention_forward, attention_backward and attention_merge of
// kernels/cuda/ops.h, the twins of the CPU kernels (kernels/cpu/impl/attention.inc; contracts in
// kernels/cpu/ops.h and AttentionShape): global positions, document masks, GQA, strides, lse,
// written or accumulated grads, and attention dropout keyed exactly like the CPU's.
// Flash-style tiling in fp32 on the CUDA cores. Head dims are padded to a bucket kDimMax of 32,
// 64, 128 or 256; a "row" (one query, or one key in the dk/dv kernel) is owned by kLanes =
// kDimMax / 16 adjacent lanes of a warp, each holding 16 of its dims (four float4s, dims
// 4 (lane + kLanes i) .. +3, so the lanes of a row read adjacent 16-byte words of shared memory and
// every row of a warp reads the same shared row: broadcasts, no bank conflicts). Dot products are
// the lanes' partial sums reduced by xor shuffles in a fixed order, so every kernel computes the
// same score bits for a (query, key) pair and every result is the same run to run (no atomics on
// floats; every output element is summed by one thread in a fixed order).
//   forward: one block per (batch, query head, tile of kRows queries); key tiles of kTile keys
//            staged in shared memory, online softmax in steps of 16 keys; only the keys the tile
//            can see (causality, the tile's earliest document start) are visited, so key tiles
//            above the diagonal are skipped entirely.
//   backward: dk/dv kernel, one block per (batch, kv head, tile of kRows keys), iterating the
//            query heads of its GQA group and the query tiles that can see its keys (staged in
//            shared memory with their lse and delta = rowsum(dO * O), computed on the fly), P
//            recomputed from q, k and lse; dq kernel like the forward, one block per query tile.
//   merge:   one warp per lse row.
// The kernels use at most 38 KiB of static shared memory and, at 256 threads, at most 128
// registers (two blocks per SM; no spills at sm_80 and sm_90).
// Dropout: the keep bit of a (query, key) pair is Philox4x32-10 with counter (key position / 4,
// row lo, row hi, iteration) and key seed ^ stream, row = row_ids[query] * q_heads_total +
// q_head0 + h (op_params.h); each tile pair draws its bits into shared memory, one Philox call
// per query and 4-key block. P V uses P * keep / (1 - p); the lse keeps the undropped P.
// No allocation, copy or synchronisation: the entries only queue kernels on the given stream.
// Device code only (host entries in attention.cu), so that it also compiles as plain C++ over the
// CPU emulation of the CUDA execution model that tests it against the CPU kernels:
// Tested in tests/unit/kernels/test_cuda_attention_emulated.cpp; on a GPU by the op harness's
// CUDA runner (label gpu; cases in tests/harness/cases_attention.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/op_params.h"
#include "kernels/common/philox.h"

// Full unrolling in device code; nothing for the host compiler (the emulation test).
#if defined(__CUDACC__)
#define MT_UNROLL _Pragma("unroll")
#else
#define MT_UNROLL
#endif

namespace mt::kernels::cuda::attention_kernels {

constexpr int kThreads = 256;  // per block, every kernel but the merge
constexpr int kMaxHeadDim = 256;
constexpr unsigned kFullMask = 0xffffffffu;

// The tiling of one head-dim bucket.
template <int kDimMax>
struct Tiling {
  static constexpr int kLanes = kDimMax / 16;                        // lanes per row (2, 4, 8, 16)
  static constexpr int kRows = kThreads / kLanes;                    // rows per block (128, 64, 32, 16)
  static constexpr int kTile = kDimMax <= 64 ? 64 : 4096 / kDimMax;  // staged rows: <= 32 KiB for two tiles
  static constexpr int kRowVecs = kDimMax / 4;                       // float4s per staged row
  // The dk/dv kernel computes the delta of staged query i with row group i.
  static_assert(kRows >= kTile, "a block has a row group for every staged row");
  // Two staged tiles and the keep bits stay within 48 KiB of static shared memory.
  static_assert(2 * kTile * kDimMax * sizeof(float) + kRows * kTile <= 40 * 1024, "shared memory");
};

struct RowSlice {
  float4 v[4];
};

__device__ __forceinline__ int64_t query_row(const AttentionShape& s, int b, int t) { return int64_t(b) * s.q_len + t; }
__device__ __forceinline__ int64_t key_row(const AttentionShape& s, int b, int j) { return int64_t(b) * s.kv_len + j; }
__device__ __forceinline__ int64_t lse_index(const AttentionShape& s, int b, int h, int t) {
  return (int64_t(b) * s.q_heads + h) * s.q_len + t;
}

// The first dim of float4 number i of a lane.
template <int kDimMax>
__device__ __forceinline__ int slice_dim(int lane, int i) {
  return 4 * (lane + Tiling<kDimMax>::kLanes * i);
}

// scale * the lane's dims of a global row (zero past dim, or everywhere when row is null).
template <int kDimMax>
__device__ RowSlice load_slice(const float* row, int dim, int lane, float scale) {
  RowSlice slice;
  MT_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int d = slice_dim<kDimMax>(lane, i);
    float x[4];
    MT_UNROLL
    for (int e = 0; e < 4; ++e) x[e] = row != nullptr && d + e < dim ? scale * row[d + e] : 0.0f;
    slice.v[i] = make_float4(x[0], x[1], x[2], x[3]);
  }
  return slice;
}

template <int kDimMax>
__device__ void store_slice(float* row, int dim, int lane, const RowSlice& slice, float scale, bool accumulate) {
  MT_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int d = slice_dim<kDimMax>(lane, i);
    const float x[4] = {slice.v[i].x, slice.v[i].y, slice.v[i].z, slice.v[i].w};
    MT_UNROLL
    for (int e = 0; e < 4; ++e) {
      if (d + e < dim) row[d + e] = accumulate ? row[d + e] + scale * x[e] : scale * x[e];
    }
  }
}

__device__ __forceinline__ void zero(RowSlice& slice) {
  MT_UNROLL
  for (int i = 0; i < 4; ++i) slice.v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// The lane's partial dot product of its slice with a staged row (kRowVecs float4s).
template <int kDimMax>
__device__ __forceinline__ float partial_dot(const RowSlice& slice, const float4* staged, int lane) {
  float sum = 0.0f;
  MT_UNROLL
  for (int i = 0; i < 4; ++i) {
    const float4 b = staged[lane + Tiling<kDimMax>::kLanes * i];
    sum = fmaf(slice.v[i].x, b.x, sum);
    sum = fmaf(slice.v[i].y, b.y, sum);
    sum = fmaf(slice.v[i].z, b.z, sum);
    sum = fmaf(slice.v[i].w, b.w, sum);
  }
  return sum;
}

// Sum over the kLanes lanes of a row (every lane gets it). All 32 lanes must call it.
template <int kDimMax>
__device__ __forceinline__ float row_sum(float x) {
  MT_UNROLL
  for (int offset = Tiling<kDimMax>::kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// slice += a * staged row.
template <int kDimMax>
__device__ __forceinline__ void add_scaled(RowSlice& slice, float a, const float4* staged, int lane) {
  MT_UNROLL
  for (int i = 0; i < 4; ++i) {
    const float4 b = staged[lane + Tiling<kDimMax>::kLanes * i];
    slice.v[i].x = fmaf(a, b.x, slice.v[i].x);
    slice.v[i].y = fmaf(a, b.y, slice.v[i].y);
    slice.v[i].z = fmaf(a, b.z, slice.v[i].z);
    slice.v[i].w = fmaf(a, b.w, slice.v[i].w);
  }
}

__device__ __forceinline__ void scale_slice(RowSlice& slice, float a) {
  MT_UNROLL
  for (int i = 0; i < 4; ++i) {
    slice.v[i].x *= a;
    slice.v[i].y *= a;
    slice.v[i].z *= a;
    slice.v[i].w *= a;
  }
}

// Stages `rows` rows of a head (row r at base + r * stride, dims < dim) into `tile` (kTile rows of
// kDimMax floats, zero-padded), scaled by `scale`. Called by the whole block.
template <int kDimMax>
__device__ void stage_rows(float4* tile, const float* base, int64_t stride, int rows, int dim, float scale) {
  float* out = reinterpret_cast<float*>(tile);
  for (int idx = threadIdx.x; idx < Tiling<kDimMax>::kTile * kDimMax; idx += blockDim.x) {
    const int r = idx / kDimMax, d = idx % kDimMax;
    out[idx] = r < rows && d < dim ? scale * base[r * stride + d] : 0.0f;
  }
}

__device__ __forceinline__ bool dropping(const AttentionShape& s) { return s.dropout.key.p > 0.0f; }

// keep[i * query_step + j * key_step] = whether the dropout keeps (query t0 + i, key at global
// position k_first + j) of head h, for i < queries, j < keys; drawn as kernels/cpu/impl/attention.inc
// draws them (one Philox call per query and 4-key block). Called by the whole block.
__device__ inline void draw_keep(const AttentionShape& s, int b, int h, int t0, int queries, int64_t k_first, int keys,
                                 uint8_t* keep, int query_step, int key_step) {
  const DropoutKey& key = s.dropout.key;
  const uint64_t mixed_key = key.seed ^ key.stream;
  const Philox4x32Key philox_key{{static_cast<uint32_t>(mixed_key), static_cast<uint32_t>(mixed_key >> 32)}};
  const int64_t first_block = k_first >> 2;
  const int blocks = static_cast<int>(((k_first + keys - 1) >> 2) - first_block + 1);
  const int64_t* ids = s.dropout.row_ids + query_row(s, b, t0);
  const uint64_t head = static_cast<uint64_t>(s.dropout.q_head0 + h);
  for (int idx = threadIdx.x; idx < queries * blocks; idx += blockDim.x) {
    const int i = idx / blocks;
    const int64_t block = first_block + idx % blocks;
    const uint64_t row = static_cast<uint64_t>(ids[i]) * static_cast<uint64_t>(s.dropout.q_heads_total) + head;
    const Philox4x32Counter bits =
        philox4x32_10(Philox4x32Counter{{static_cast<uint32_t>(block), static_cast<uint32_t>(row),
                                         static_cast<uint32_t>(row >> 32), static_cast<uint32_t>(key.iteration)}},
                      philox_key);
    MT_UNROLL
    for (int word = 0; word < 4; ++word) {
      const int64_t j = 4 * block + word - k_first;
      if (j >= 0 && j < keys) keep[i * query_step + int(j) * key_step] = uint_to_unit_float(bits.v[word]) >= key.p;
    }
  }
}

// The keys [begin, end) a query tile [t0, t0 + queries) can see at all (end <= begin: none);
// doc_min: the tile's earliest document start (INT64_MIN without documents).
__device__ inline void visible_keys(const AttentionShape& s, int t0, int queries, int64_t doc_min, int& begin,
                                    int& end) {
  const int64_t last_query = s.q_pos0 + t0 + queries - 1;
  const int64_t e = min(max(last_query - s.kv_pos0 + 1, int64_t(0)), int64_t(s.kv_len));
  end = static_cast<int>(e);
  begin = doc_min == INT64_MIN ? 0 : static_cast<int>(min(max(doc_min - s.kv_pos0, int64_t(0)), e));
}

// The smallest document start of the block's active query rows (INT64_MIN without documents).
__device__ inline int64_t block_doc_min(const int32_t* doc_start, int64_t doc, bool active, int lane, int* shared_min) {
  if (doc_start == nullptr) return INT64_MIN;
  if (threadIdx.x == 0) *shared_min = INT32_MAX;
  __syncthreads();
  if (active && lane == 0) atomicMin(shared_min, static_cast<int>(doc));
  __syncthreads();
  return *shared_min;
}

// ---- forward -----------------------------------------------------------------------------------

constexpr int kSoftmaxChunk = 16;  // keys per online-softmax step (their scores stay in registers)

// One online-softmax step of a query row over `keys` staged keys (at most kSoftmaxChunk), the first
// at global position k_first: scores (-inf where hidden: key after q_pos or before doc), the
// running max and sum moved to the new maximum, acc += P V with P * keep / (1 - p) when keep is
// given (the sum keeps the undropped P). All lanes of the warp call it with the same `keys`.
template <int kDimMax>
__device__ __forceinline__ void softmax_chunk(const RowSlice& q_slice, const float4* k_rows, const float4* v_rows,
                                              int keys, int64_t k_first, int64_t q_pos, int64_t doc, int lane,
                                              const uint8_t* keep, float keep_scale, RowSlice& acc, float& run_max,
                                              float& run_sum) {
  constexpr int kRowVecs = Tiling<kDimMax>::kRowVecs;
  float scores[kSoftmaxChunk];
  float chunk_max = -INFINITY;
  MT_UNROLL
  for (int j = 0; j < kSoftmaxChunk; ++j) {
    scores[j] = -INFINITY;
    if (j < keys) {
      const float dot = row_sum<kDimMax>(partial_dot<kDimMax>(q_slice, k_rows + j * kRowVecs, lane));
      const int64_t k_pos = k_first + j;
      if (k_pos <= q_pos && k_pos >= doc) scores[j] = dot;
      chunk_max = fmaxf(chunk_max, scores[j]);
    }
  }
  const float new_max = fmaxf(run_max, chunk_max);
  const float shift = new_max == -INFINITY ? 0.0f : new_max;  // a query that saw nothing yet keeps P = 0
  const float rescale = expf(run_max - shift);
  scale_slice(acc, rescale);
  float chunk_sum = 0.0f;
  MT_UNROLL
  for (int j = 0; j < kSoftmaxChunk; ++j) {
    if (j < keys) {
      float p = expf(scores[j] - shift);
      chunk_sum += p;
      if (keep != nullptr) p *= keep[j] ? keep_scale : 0.0f;
      add_scaled<kDimMax>(acc, p, v_rows + j * kRowVecs, lane);
    }
  }
  run_sum = run_sum * rescale + chunk_sum;
  run_max = new_max;
}

template <int kDimMax>
__global__ void __launch_bounds__(kThreads, 2)
    forward_kernel(AttentionShape s, const float* q, const float* k, const float* v, const int32_t* doc_start,
                   float* out, float* lse, int q_tiles) {
  using T = Tiling<kDimMax>;
  __shared__ float4 k_tile[T::kTile * T::kRowVecs];
  __shared__ float4 v_tile[T::kTile * T::kRowVecs];
  __shared__ uint8_t keep[T::kRows * T::kTile];  // (query, key) dropout keep bits
  __shared__ int doc_min_shared;

  // Costly (late) tiles of every (sample, head) first.
  const int tile = q_tiles - 1 - static_cast<int>(blockIdx.x / (unsigned(s.batch) * s.q_heads));
  const int h = static_cast<int>(blockIdx.x % s.q_heads);
  const int b = static_cast<int>(blockIdx.x / s.q_heads % s.batch);
  const int g = h / (s.q_heads / s.kv_heads), dim = s.head_dim;
  const int row = threadIdx.x / T::kLanes, lane = threadIdx.x % T::kLanes;
  const int t0 = tile * T::kRows, queries = min(T::kRows, s.q_len - t0);
  const bool active = row < queries;
  const int t = t0 + row;
  const int64_t q_pos = s.q_pos0 + t;
  const int64_t doc = active && doc_start != nullptr ? doc_start[query_row(s, b, t)] : INT64_MIN;
  const int64_t doc_min = block_doc_min(doc_start, doc, active, lane, &doc_min_shared);
  int begin, end;
  visible_keys(s, t0, queries, doc_min, begin, end);

  const RowSlice q_slice = load_slice<kDimMax>(
      active ? q + query_row(s, b, t) * s.q_stride + int64_t(h) * dim : nullptr, dim, lane, s.scale);
  RowSlice acc;
  zero(acc);
  float run_max = -INFINITY, run_sum = 0.0f;
  const bool drop = dropping(s);
  const float keep_scale = drop ? 1.0f / (1.0f - s.dropout.key.p) : 1.0f;

  for (int s0 = begin; s0 < end; s0 += T::kTile) {
    const int keys = min(T::kTile, end - s0);
    const int64_t k_first = s.kv_pos0 + s0;
    __syncthreads();  // the previous tile is read
    stage_rows<kDimMax>(k_tile, k + key_row(s, b, s0) * s.k_stride + int64_t(g) * dim, s.k_stride, keys, dim, 1.0f);
    stage_rows<kDimMax>(v_tile, v + key_row(s, b, s0) * s.v_stride + int64_t(g) * dim, s.v_stride, keys, dim, 1.0f);
    if (drop) draw_keep(s, b, h, t0, queries, k_first, keys, keep, T::kTile, 1);
    __syncthreads();

    for (int c0 = 0; c0 < keys; c0 += kSoftmaxChunk) {
      softmax_chunk<kDimMax>(q_slice, k_tile + c0 * T::kRowVecs, v_tile + c0 * T::kRowVecs,
                             min(kSoftmaxChunk, keys - c0), k_first + c0, active ? q_pos : INT64_MIN, doc, lane,
                             drop ? keep + row * T::kTile + c0 : nullptr, keep_scale, acc, run_max, run_sum);
    }
  }

  if (!active) return;
  float* out_row = out + query_row(s, b, t) * s.o_stride + int64_t(h) * dim;
  const bool empty = run_sum == 0.0f;
  store_slice<kDimMax>(out_row, dim, lane, acc, empty ? 0.0f : 1.0f / run_sum, false);
  if (lane == 0) lse[lse_index(s, b, h, t)] = empty ? -INFINITY : run_max + logf(run_sum);
}

// ---- backward: dq over query tiles -----------------------------------------------------------

// delta = rowsum(dO * O) of one query row, reduced over the row's lanes (every lane gets it).
template <int kDimMax>
__device__ float row_delta(const float* out_row, const RowSlice& dout_slice, int dim, int lane) {
  const RowSlice out_slice = load_slice<kDimMax>(out_row, dim, lane, 1.0f);
  float sum = 0.0f;
  MT_UNROLL
  for (int i = 0; i < 4; ++i) {
    sum = fmaf(dout_slice.v[i].x, out_slice.v[i].x, sum);
    sum = fmaf(dout_slice.v[i].y, out_slice.v[i].y, sum);
    sum = fmaf(dout_slice.v[i].z, out_slice.v[i].z, sum);
    sum = fmaf(dout_slice.v[i].w, out_slice.v[i].w, sum);
  }
  return row_sum<kDimMax>(sum);
}

template <int kDimMax>
__global__ void __launch_bounds__(kThreads, 2)
    dq_kernel(AttentionShape s, const float* q, const float* k, const float* v, const int32_t* doc_start,
              const float* out, const float* dout, const float* lse, float* dq, int q_tiles) {
  using T = Tiling<kDimMax>;
  __shared__ float4 k_tile[T::kTile * T::kRowVecs];
  __shared__ float4 v_tile[T::kTile * T::kRowVecs];
  __shared__ uint8_t keep[T::kRows * T::kTile];
  __shared__ int doc_min_shared;

  const int tile = q_tiles - 1 - static_cast<int>(blockIdx.x / (unsigned(s.batch) * s.q_heads));
  const int h = static_cast<int>(blockIdx.x % s.q_heads);
  const int b = static_cast<int>(blockIdx.x / s.q_heads % s.batch);
  const int g = h / (s.q_heads / s.kv_heads), dim = s.head_dim;
  const int row = threadIdx.x / T::kLanes, lane = threadIdx.x % T::kLanes;
  const int t0 = tile * T::kRows, queries = min(T::kRows, s.q_len - t0);
  const bool active = row < queries;
  const int t = t0 + row;
  const int64_t q_pos = s.q_pos0 + t;
  const int64_t doc = active && doc_start != nullptr ? doc_start[query_row(s, b, t)] : INT64_MIN;
  const int64_t doc_min = block_doc_min(doc_start, doc, active, lane, &doc_min_shared);
  int begin, end;
  visible_keys(s, t0, queries, doc_min, begin, end);

  const int64_t q_offset = query_row(s, b, t) * s.q_stride + int64_t(h) * dim;
  const int64_t o_offset = query_row(s, b, t) * s.o_stride + int64_t(h) * dim;
  const RowSlice q_slice = load_slice<kDimMax>(active ? q + q_offset : nullptr, dim, lane, s.scale);
  const RowSlice dout_slice = load_slice<kDimMax>(active ? dout + o_offset : nullptr, dim, lane, 1.0f);
  const float delta = row_delta<kDimMax>(active ? out + o_offset : nullptr, dout_slice, dim, lane);
  const float row_lse = active ? lse[lse_index(s, b, h, t)] : -INFINITY;
  const bool sees_any = active && row_lse != -INFINITY;
  const bool drop = dropping(s);
  const float keep_scale = drop ? 1.0f / (1.0f - s.dropout.key.p) : 1.0f;
  RowSlice acc;  // dQ / scale
  zero(acc);

  for (int s0 = begin; s0 < end; s0 += T::kTile) {
    const int keys = min(T::kTile, end - s0);
    const int64_t k_first = s.kv_pos0 + s0;
    __syncthreads();
    stage_rows<kDimMax>(k_tile, k + key_row(s, b, s0) * s.k_stride + int64_t(g) * dim, s.k_stride, keys, dim, 1.0f);
    stage_rows<kDimMax>(v_tile, v + key_row(s, b, s0) * s.v_stride + int64_t(g) * dim, s.v_stride, keys, dim, 1.0f);
    if (drop) draw_keep(s, b, h, t0, queries, k_first, keys, keep, T::kTile, 1);
    __syncthreads();
    for (int j = 0; j < keys; ++j) {
      const float score = row_sum<kDimMax>(partial_dot<kDimMax>(q_slice, k_tile + j * T::kRowVecs, lane));
      const float dp = row_sum<kDimMax>(partial_dot<kDimMax>(dout_slice, v_tile + j * T::kRowVecs, lane));
      const int64_t k_pos = k_first + j;
      const bool visible = sees_any && k_pos <= q_pos && k_pos >= doc;
      const float p = visible ? expf(score - row_lse) : 0.0f;
      const float z = drop ? (keep[row * T::kTile + j] ? keep_scale : 0.0f) : 1.0f;
      const float ds = p * (dp * z - delta);
      add_scaled<kDimMax>(acc, ds, k_tile + j * T::kRowVecs, lane);
    }
  }
  if (active) store_slice<kDimMax>(dq + q_offset, dim, lane, acc, s.scale, s.accumulate_grads);
}

// ---- backward: dk, dv over key tiles -----------------------------------------------------------

template <int kDimMax>
__global__ void __launch_bounds__(kThreads, 2)
    dkdv_kernel(AttentionShape s, const float* q, const float* k, const float* v, const int32_t* doc_start,
                const float* out, const float* dout, const float* lse, float* dk, float* dv) {
  using T = Tiling<kDimMax>;
  __shared__ float4 q_tile[T::kTile * T::kRowVecs];     // scale Q
  __shared__ float4 dout_tile[T::kTile * T::kRowVecs];  // dO
  __shared__ float lse_tile[T::kTile];
  __shared__ float delta_tile[T::kTile];
  __shared__ int64_t doc_tile[T::kTile];
  __shared__ uint8_t keep[T::kTile * T::kRows];  // (query, key) dropout keep bits

  // Early key tiles, which the most queries see, of every (sample, kv head) first.
  const int tile = static_cast<int>(blockIdx.x / (unsigned(s.batch) * s.kv_heads));
  const int g = static_cast<int>(blockIdx.x % s.kv_heads);
  const int b = static_cast<int>(blockIdx.x / s.kv_heads % s.batch);
  const int group = s.q_heads / s.kv_heads, dim = s.head_dim;
  const int row = threadIdx.x / T::kLanes, lane = threadIdx.x % T::kLanes;
  const int j0 = tile * T::kRows, keys = min(T::kRows, s.kv_len - j0);
  const bool active = row < keys;
  const int64_t k_first = s.kv_pos0 + j0, k_pos = k_first + row;
  const int64_t k_offset = key_row(s, b, j0 + row) * s.k_stride + int64_t(g) * dim;
  const int64_t v_offset = key_row(s, b, j0 + row) * s.v_stride + int64_t(g) * dim;
  const RowSlice k_slice = load_slice<kDimMax>(active ? k + k_offset : nullptr, dim, lane, 1.0f);
  const RowSlice v_slice = load_slice<kDimMax>(active ? v + v_offset : nullptr, dim, lane, 1.0f);
  const bool drop = dropping(s);
  const float keep_scale = drop ? 1.0f / (1.0f - s.dropout.key.p) : 1.0f;
  RowSlice dk_acc, dv_acc;  // dK (from the staged scale Q), dV
  zero(dk_acc);
  zero(dv_acc);

  const int first_query = static_cast<int>(min(max(k_first - s.q_pos0, int64_t(0)), int64_t(s.q_len)));
  for (int h = g * group; h < (g + 1) * group; ++h) {
    for (int t0 = first_query; t0 < s.q_len; t0 += T::kTile) {
      const int queries = min(T::kTile, s.q_len - t0);
      __syncthreads();  // the previous query tile is read
      stage_rows<kDimMax>(q_tile, q + query_row(s, b, t0) * s.q_stride + int64_t(h) * dim, s.q_stride, queries, dim,
                          s.scale);
      stage_rows<kDimMax>(dout_tile, dout + query_row(s, b, t0) * s.o_stride + int64_t(h) * dim, s.o_stride, queries,
                          dim, 1.0f);
      for (int i = threadIdx.x; i < queries; i += blockDim.x) {
        lse_tile[i] = lse[lse_index(s, b, h, t0 + i)];
        doc_tile[i] = doc_start != nullptr ? doc_start[query_row(s, b, t0 + i)] : INT64_MIN;
      }
      if (drop) draw_keep(s, b, h, t0, queries, k_first, keys, keep, T::kRows, 1);
      // delta of query i by row group i (kRows >= kTile); every lane takes part in the shuffles.
      {
        const bool has_query = row < queries;
        const int64_t o_offset = query_row(s, b, t0 + row) * s.o_stride + int64_t(h) * dim;
        const RowSlice dout_slice = load_slice<kDimMax>(has_query ? dout + o_offset : nullptr, dim, lane, 1.0f);
        const float delta = row_delta<kDimMax>(has_query ? out + o_offset : nullptr, dout_slice, dim, lane);
        if (has_query && lane == 0) delta_tile[row] = delta;
      }
      __syncthreads();

      for (int i = 0; i < queries; ++i) {
        const float4* q_row = q_tile + i * T::kRowVecs;
        const float4* dout_row = dout_tile + i * T::kRowVecs;
        const float score = row_sum<kDimMax>(partial_dot<kDimMax>(k_slice, q_row, lane));
        const float dp = row_sum<kDimMax>(partial_dot<kDimMax>(v_slice, dout_row, lane));
        const int64_t q_pos = s.q_pos0 + t0 + i;
        const float row_lse = lse_tile[i];
        const bool visible = active && k_pos <= q_pos && k_pos >= doc_tile[i] && row_lse != -INFINITY;
        const float p = visible ? expf(score - row_lse) : 0.0f;
        const float z = drop ? (keep[i * T::kRows + row] ? keep_scale : 0.0f) : 1.0f;
        const float ds = p * (dp * z - delta_tile[i]);
        add_scaled<kDimMax>(dv_acc, p * z, dout_row, lane);
        add_scaled<kDimMax>(dk_acc, ds, q_row, lane);
      }
    }
  }
  if (!active) return;
  store_slice<kDimMax>(dk + k_offset, dim, lane, dk_acc, 1.0f, s.accumulate_grads);
  store_slice<kDimMax>(dv + v_offset, dim, lane, dv_acc, 1.0f, s.accumulate_grads);
}

// ---- merge --------------------------------------------------------------------------------------

constexpr int kMergeWarps = 8;

// One warp per (sample, query head, query) row of the lse.
__global__ void __launch_bounds__(32 * kMergeWarps)
    merge_kernel(AttentionShape s, float* out, float* lse, const float* part_out, const float* part_lse) {
  const int64_t row = int64_t(blockIdx.x) * kMergeWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t(s.batch) * s.q_heads * s.q_len) return;  // whole warps leave together
  const float part = part_lse[row];
  if (part == -INFINITY) return;
  const int t = static_cast<int>(row % s.q_len);
  const int h = static_cast<int>(row / s.q_len % s.q_heads);
  const int b = static_cast<int>(row / s.q_len / s.q_heads);
  const int64_t offset = query_row(s, b, t) * s.o_stride + int64_t(h) * s.head_dim;
  const float running = lse[row];
  const float top = fmaxf(running, part);
  const float running_weight = running == -INFINITY ? 0.0f : expf(running - top);
  const float merged = top + logf(running_weight + expf(part - top));
  const float part_scale = expf(part - merged);
  const float running_scale = expf(running - merged);
  for (int d = lane; d < s.head_dim; d += 32) {
    // A running row that saw no key is not read: it may be uninitialised.
    const float kept = running_weight == 0.0f ? 0.0f : running_scale * out[offset + d];
    out[offset + d] = kept + part_scale * part_out[offset + d];
  }
  __syncwarp();
  if (lane == 0) lse[row] = merged;
}

// ---- grids: blocks along grid.x of each kernel (the host entries and the emulation test) -------

template <int kDimMax>
int query_tiles(const AttentionShape& s) {
  return (s.q_len + Tiling<kDimMax>::kRows - 1) / Tiling<kDimMax>::kRows;
}

template <int kDimMax>
int64_t query_blocks(const AttentionShape& s) {  // forward_kernel, dq_kernel
  return int64_t(s.batch) * s.q_heads * query_tiles<kDimMax>(s);
}

template <int kDimMax>
int64_t key_blocks(const AttentionShape& s) {  // dkdv_kernel
  return int64_t(s.batch) * s.kv_heads * ((s.kv_len + Tiling<kDimMax>::kRows - 1) / Tiling<kDimMax>::kRows);
}

inline int64_t merge_blocks(const AttentionShape& s) {
  return (int64_t(s.batch) * s.q_heads * s.q_len + kMergeWarps - 1) / kMergeWarps;
}

// The head-dim bucket: 32, 64, 128 or 256.
inline int dim_bucket(int head_dim) { return head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256; }

}  // namespace mt::kernels::cuda::attention_kernels
