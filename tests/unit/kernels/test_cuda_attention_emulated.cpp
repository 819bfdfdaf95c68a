// The CUDA attention kernels (kernels/cuda/attention_kernels.cuh) run on the CPU through a small
// emulation of the CUDA execution model, against the CPU kernels (kernels/cpu/ops.h): one fiber
// per CUDA thread of a block, __syncthreads a barrier of the block, warp shuffles through per-warp
// slots between two warp barriers, __shared__ variables static (one block runs at a time).
// This machine has no GPU, so this is where the kernels' indexing, tiling, masks, lse, dropout
// keying and grads are checked before the op harness runs them on one. Shapes cover every
// head-dim bucket (16 -> 32, 12 and 64 -> 64, 128, 200 -> 256), GQA, global offsets (queries that
// see no key), documents, packed rows with NaN columns never to be read, accumulated grads,
// attention dropout on a TP slice of the heads, and the lse merge.
#include <gtest/gtest.h>
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

// ---- the emulation: what the kernels use of CUDA ------------------------------------------------
struct dim3 {
  unsigned x = 0, y = 1, z = 1;
};
struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// The threads of a block are fibers (ucontext) on one OS thread, switched only at barriers: a
// fiber that waits at a barrier is resumed once every participant arrived. A barrier some
// participant never reaches (divergent __syncthreads or shuffles) is reported as a deadlock.
namespace emulation {
struct Barrier {
  int expected = 0, arrived = 0;
  uint64_t generation = 0;
};
struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  bool done = false;
  Barrier* waiting_on = nullptr;
  uint64_t waiting_generation = 0;
};
dim3 thread_index, block_index, block_dim;
ucontext_t scheduler;
std::vector<Fiber> fibers;
int current = 0;
Barrier block_barrier;
std::vector<Barrier> warp_barriers;
std::vector<std::array<float, 32>> warp_slots;
const std::function<void()>* kernel = nullptr;

inline void wait(Barrier& barrier) {
  if (++barrier.arrived == barrier.expected) {
    barrier.arrived = 0;
    ++barrier.generation;
    return;
  }
  Fiber& self = fibers[size_t(current)];
  self.waiting_on = &barrier;
  self.waiting_generation = barrier.generation;
  swapcontext(&self.context, &scheduler);
}

inline void fiber_main() {
  (*kernel)();
  fibers[size_t(current)].done = true;  // returns to the scheduler through uc_link
}

// Runs every fiber of one block to its end; false on a deadlock.
inline bool run_block(int threads) {
  constexpr size_t kStack = 64 * 1024;
  fibers.resize(size_t(threads));
  for (int t = 0; t < threads; ++t) {
    Fiber& fiber = fibers[size_t(t)];
    fiber.stack.resize(kStack);
    fiber.done = false;
    fiber.waiting_on = nullptr;
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack.data();
    fiber.context.uc_stack.ss_size = kStack;
    fiber.context.uc_link = &scheduler;
    makecontext(&fiber.context, fiber_main, 0);
  }
  for (int finished = 0; finished < threads;) {
    bool progress = false;
    finished = 0;
    for (int t = 0; t < threads; ++t) {
      Fiber& fiber = fibers[size_t(t)];
      if (fiber.done) {
        ++finished;
        continue;
      }
      if (fiber.waiting_on != nullptr && fiber.waiting_on->generation == fiber.waiting_generation) continue;
      fiber.waiting_on = nullptr;
      current = t;
      thread_index = dim3{unsigned(t)};
      swapcontext(&scheduler, &fiber.context);
      progress = true;
    }
    if (!progress && finished < threads) return false;
  }
  return true;
}
}  // namespace emulation

#define threadIdx emulation::thread_index
#define blockIdx emulation::block_index
#define blockDim emulation::block_dim
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

inline void __syncthreads() { emulation::wait(emulation::block_barrier); }
inline void __syncwarp() { emulation::wait(emulation::warp_barriers[threadIdx.x / 32]); }
inline float __shfl_xor_sync(unsigned, float x, int offset) {
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  emulation::warp_slots[warp][lane] = x;
  __syncwarp();
  const float other = emulation::warp_slots[warp][lane ^ unsigned(offset)];
  __syncwarp();
  return other;
}
inline int atomicMin(int* address, int value) {  // fibers never run at once
  const int old = *address;
  *address = std::min(old, value);
  return old;
}
using std::max;
using std::min;

#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention_kernels.cuh"

namespace {

using namespace mt::kernels;
using namespace mt::kernels::cuda::attention_kernels;

// Runs `kernel` over `blocks` blocks of `threads` threads, one block at a time.
void launch(int64_t blocks, int threads, const std::function<void()>& kernel) {
  ASSERT_EQ(threads % 32, 0);
  emulation::kernel = &kernel;
  emulation::block_dim = dim3{unsigned(threads)};
  emulation::block_barrier = emulation::Barrier{threads};
  emulation::warp_barriers.assign(size_t(threads / 32), emulation::Barrier{32});
  emulation::warp_slots.assign(size_t(threads / 32), {});
  for (int64_t b = 0; b < blocks; ++b) {
    emulation::block_index = dim3{unsigned(b)};
    ASSERT_TRUE(emulation::run_block(threads)) << "block " << b << ": threads wait at a barrier others never reach";
  }
}

// The host entries' launches (kernels/cuda/attention.cu), emulated.
template <int kDimMax>
void forward_bucket(const AttentionShape& s, const float* q, const float* k, const float* v, const int32_t* docs,
                    float* out, float* lse) {
  launch(query_blocks<kDimMax>(s), kThreads,
         [&] { forward_kernel<kDimMax>(s, q, k, v, docs, out, lse, query_tiles<kDimMax>(s)); });
}

template <int kDimMax>
void backward_bucket(const AttentionShape& s, const float* q, const float* k, const float* v, const int32_t* docs,
                     const float* out, const float* dout, const float* lse, float* dq, float* dk, float* dv) {
  launch(query_blocks<kDimMax>(s), kThreads,
         [&] { dq_kernel<kDimMax>(s, q, k, v, docs, out, dout, lse, dq, query_tiles<kDimMax>(s)); });
  if (s.kv_len > 0) {
    launch(key_blocks<kDimMax>(s), kThreads, [&] { dkdv_kernel<kDimMax>(s, q, k, v, docs, out, dout, lse, dk, dv); });
  }
}

void emulated_forward(const AttentionShape& s, const float* q, const float* k, const float* v, const int32_t* docs,
                      float* out, float* lse) {
  switch (dim_bucket(s.head_dim)) {
    case 32:
      return forward_bucket<32>(s, q, k, v, docs, out, lse);
    case 64:
      return forward_bucket<64>(s, q, k, v, docs, out, lse);
    case 128:
      return forward_bucket<128>(s, q, k, v, docs, out, lse);
    default:
      return forward_bucket<256>(s, q, k, v, docs, out, lse);
  }
}

void emulated_backward(const AttentionShape& s, const float* q, const float* k, const float* v, const int32_t* docs,
                       const float* out, const float* dout, const float* lse, float* dq, float* dk, float* dv) {
  switch (dim_bucket(s.head_dim)) {
    case 32:
      return backward_bucket<32>(s, q, k, v, docs, out, dout, lse, dq, dk, dv);
    case 64:
      return backward_bucket<64>(s, q, k, v, docs, out, dout, lse, dq, dk, dv);
    case 128:
      return backward_bucket<128>(s, q, k, v, docs, out, dout, lse, dq, dk, dv);
    default:
      return backward_bucket<256>(s, q, k, v, docs, out, dout, lse, dq, dk, dv);
  }
}

struct Spec {
  int batch, q_len, kv_len, heads, kv_heads, dim;
  int64_t q_pos0 = 0, kv_pos0 = 0;
  int extra_columns = 0;    // > 0: packed q|k|v rows with this many NaN columns at the end
  bool documents = false;   // documents every 33 positions
  bool accumulate = false;  // grads added onto random values
  float dropout = 0.0f;     // attention dropout probability, heads 3.. of heads + 5
};

std::string describe(const Spec& s) {
  return "B=" + std::to_string(s.batch) + " Tq=" + std::to_string(s.q_len) + " Tkv=" + std::to_string(s.kv_len) +
         " H=" + std::to_string(s.heads) + " G=" + std::to_string(s.kv_heads) + " D=" + std::to_string(s.dim) +
         " q_pos0=" + std::to_string(s.q_pos0) + " kv_pos0=" + std::to_string(s.kv_pos0) +
         " extra=" + std::to_string(s.extra_columns) + " docs=" + std::to_string(s.documents) +
         " acc=" + std::to_string(s.accumulate) + " p=" + std::to_string(s.dropout);
}

std::vector<float> random_values(size_t n, std::mt19937& rng, float range) {
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> values(n);
  for (float& x : values) x = dist(rng);
  return values;
}

// Elementwise |got - want| <= 1e-4 max(1, |want|); infinities must match exactly. Names the
// first element that fails.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << what << " element " << i << " was written: " << got[i];
    } else if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " element " << i;
    } else {
      ASSERT_NEAR(got[i], want[i], 1e-4 * std::max(1.0f, std::abs(want[i]))) << what << " element " << i;
    }
  }
}

// Forward and backward of one problem, emulated CUDA against the CPU kernels.
void check_problem(const Spec& spec, uint32_t seed) {
  SCOPED_TRACE(describe(spec));
  std::mt19937 rng(seed);
  AttentionShape shape;
  shape.batch = spec.batch;
  shape.q_len = spec.q_len;
  shape.kv_len = spec.kv_len;
  shape.q_heads = spec.heads;
  shape.kv_heads = spec.kv_heads;
  shape.head_dim = spec.dim;
  shape.q_pos0 = spec.q_pos0;
  shape.kv_pos0 = spec.kv_pos0;
  shape.scale = 1.0f / std::sqrt(float(spec.dim));
  shape.accumulate_grads = spec.accumulate;
  const bool packed = spec.extra_columns > 0;
  const int64_t q_width = int64_t(spec.heads) * spec.dim, kv_width = int64_t(spec.kv_heads) * spec.dim;
  const int64_t packed_stride = q_width + 2 * kv_width + spec.extra_columns;
  shape.q_stride = packed ? packed_stride : q_width;
  shape.k_stride = shape.v_stride = packed ? packed_stride : kv_width;
  shape.o_stride = q_width + 3;  // 3 columns never written
  const size_t q_rows = size_t(spec.batch) * spec.q_len, kv_rows = size_t(spec.batch) * spec.kv_len;
  ASSERT_TRUE(!packed || q_rows == kv_rows) << "packed rows need q_len == kv_len";

  // Inputs: q at 0, k at k_offset, v at v_offset of one buffer (packed: column offsets in rows).
  std::vector<float> inputs;
  size_t k_offset, v_offset;
  if (packed) {
    inputs = random_values(q_rows * packed_stride, rng, 2.0f);
    for (size_t r = 0; r < q_rows; ++r)
      for (int c = 0; c < spec.extra_columns; ++c) inputs[r * packed_stride + packed_stride - 1 - c] = std::nanf("");
    k_offset = size_t(q_width);
    v_offset = size_t(q_width + kv_width);
  } else {
    inputs = random_values(q_rows * q_width + 2 * kv_rows * kv_width, rng, 2.0f);
    k_offset = q_rows * q_width;
    v_offset = k_offset + kv_rows * kv_width;
  }
  const float* q = inputs.data();
  const float* k = inputs.data() + k_offset;
  const float* v = inputs.data() + v_offset;
  const size_t q_size = q_rows * shape.q_stride;
  const size_t k_size = packed ? q_size : kv_rows * kv_width;

  std::vector<int32_t> docs;
  if (spec.documents) {
    for (size_t r = 0; r < q_rows; ++r) docs.push_back(int32_t((spec.q_pos0 + int64_t(r % spec.q_len)) / 33 * 33));
  }
  const int32_t* doc_start = docs.empty() ? nullptr : docs.data();
  std::vector<int64_t> row_ids(q_rows);
  if (spec.dropout > 0) {
    for (size_t r = 0; r < q_rows; ++r) {
      row_ids[r] = int64_t(3 + r / spec.q_len) * 4096 + spec.q_pos0 + int64_t(r % spec.q_len);
    }
    shape.dropout.key = DropoutKey{seed, stream_id("attention-probs test"), 17, spec.dropout};
    shape.dropout.row_ids = row_ids.data();
    shape.dropout.q_head0 = 3;
    shape.dropout.q_heads_total = spec.heads + 5;
  }

  const auto& cpu = cpu::cpu_ops();
  const size_t out_size = q_rows * shape.o_stride, lse_size = q_rows * spec.heads;
  std::vector<float> out_cpu(out_size, std::nanf("")), lse_cpu(lse_size);
  std::vector<float> out_gpu = out_cpu, lse_gpu = lse_cpu;
  cpu.attention_forward(shape, q, k, v, doc_start, out_cpu.data(), lse_cpu.data());
  emulated_forward(shape, q, k, v, doc_start, out_gpu.data(), lse_gpu.data());
  expect_close(lse_gpu, lse_cpu, "lse");
  expect_close(out_gpu, out_cpu, "out");

  // Backward from the CPU's out and lse; grads in buffers shaped like the inputs.
  const std::vector<float> dout = random_values(out_size, rng, 1.0f);
  const std::vector<float> grads0 =
      spec.accumulate ? random_values(inputs.size(), rng, 1.0f) : std::vector<float>(inputs.size(), 0.0f);
  std::vector<float> grads_cpu = grads0, grads_gpu = grads0;
  cpu.attention_backward(shape, q, k, v, doc_start, out_cpu.data(), dout.data(), lse_cpu.data(), grads_cpu.data(),
                         grads_cpu.data() + k_offset, grads_cpu.data() + v_offset);
  emulated_backward(shape, q, k, v, doc_start, out_cpu.data(), dout.data(), lse_cpu.data(), grads_gpu.data(),
                    grads_gpu.data() + k_offset, grads_gpu.data() + v_offset);
  const auto slice = [](const std::vector<float>& x, size_t offset, size_t n) {
    return std::vector<float>(x.begin() + ptrdiff_t(offset), x.begin() + ptrdiff_t(offset + n));
  };
  if (packed) {
    expect_close(grads_gpu, grads_cpu, "dq|dk|dv (packed)");
  } else {
    expect_close(slice(grads_gpu, 0, q_size), slice(grads_cpu, 0, q_size), "dq");
    expect_close(slice(grads_gpu, k_offset, k_size), slice(grads_cpu, k_offset, k_size), "dk");
    expect_close(slice(grads_gpu, v_offset, k_size), slice(grads_cpu, v_offset, k_size), "dv");
  }
}

TEST(CudaAttentionEmulated, SmallHeadsWithOffsetsDocumentsGqaAndAccumulatedGrads) {
  check_problem({.batch = 2, .q_len = 70, .kv_len = 90, .heads = 4, .kv_heads = 2, .dim = 16, .q_pos0 = 40,
                 .documents = true, .accumulate = true},
                9);
}

TEST(CudaAttentionEmulated, Dim64AcrossQueryAndKeyTiles) {
  check_problem({.batch = 1, .q_len = 130, .kv_len = 130, .heads = 2, .kv_heads = 1, .dim = 64}, 10);
}

TEST(CudaAttentionEmulated, PackedRowsWithNaNColumnsAndDocuments) {
  check_problem({.batch = 2, .q_len = 67, .kv_len = 67, .heads = 4, .kv_heads = 2, .dim = 12, .extra_columns = 5,
                 .documents = true},
                11);
}

TEST(CudaAttentionEmulated, Dim128DiagonalBlockAndDim200) {
  check_problem({.batch = 1, .q_len = 70, .kv_len = 70, .heads = 2, .kv_heads = 2, .dim = 128, .q_pos0 = 64,
                 .kv_pos0 = 64},
                12);
  check_problem({.batch = 1, .q_len = 37, .kv_len = 37, .heads = 1, .kv_heads = 1, .dim = 200}, 13);
}

TEST(CudaAttentionEmulated, QueriesThatSeeNoKeyAndKeysBeforeQueries) {
  check_problem({.batch = 1, .q_len = 50, .kv_len = 50, .heads = 2, .kv_heads = 1, .dim = 16, .q_pos0 = 0,
                 .kv_pos0 = 30, .accumulate = true},
                14);
  check_problem({.batch = 2, .q_len = 70, .kv_len = 100, .heads = 2, .kv_heads = 1, .dim = 16, .q_pos0 = 100}, 15);
}

TEST(CudaAttentionEmulated, DropoutKeyedLikeTheCpu) {
  check_problem({.batch = 2, .q_len = 70, .kv_len = 134, .heads = 4, .kv_heads = 2, .dim = 16, .q_pos0 = 200,
                 .kv_pos0 = 66, .documents = true, .dropout = 0.2f},
                16);
  check_problem({.batch = 1, .q_len = 100, .kv_len = 100, .heads = 3, .kv_heads = 1, .dim = 64, .dropout = 0.5f}, 17);
  check_problem({.batch = 1, .q_len = 45, .kv_len = 45, .heads = 2, .kv_heads = 1, .dim = 128, .q_pos0 = 3,
                 .kv_pos0 = 3, .dropout = 0.1f},
                18);
}

// The lse merge of a second key block's result (rows of lse -inf on either side).
TEST(CudaAttentionEmulated, MergeMatchesCpu) {
  AttentionShape shape;
  shape.batch = 2;
  shape.q_len = 37;
  shape.q_heads = 3;
  shape.head_dim = 40;
  shape.o_stride = 3 * 40 + 2;
  std::mt19937 rng(19);
  const size_t out_size = size_t(2) * 37 * shape.o_stride, lse_size = size_t(2) * 3 * 37;
  const std::vector<float> part_out = random_values(out_size, rng, 1.0f);
  std::vector<float> out = random_values(out_size, rng, 1.0f), lse = random_values(lse_size, rng, 3.0f);
  std::vector<float> part_lse = random_values(lse_size, rng, 3.0f);
  for (size_t i = 0; i < lse_size; ++i) {
    if (i % 5 == 0) part_lse[i] = -INFINITY;
    if (i % 7 == 0) lse[i] = -INFINITY;
  }
  std::vector<float> out_cpu = out, lse_cpu = lse, out_gpu = out, lse_gpu = lse;
  cpu::cpu_ops().attention_merge(shape, out_cpu.data(), lse_cpu.data(), part_out.data(), part_lse.data());
  launch(merge_blocks(shape), 32 * kMergeWarps,
         [&] { merge_kernel(shape, out_gpu.data(), lse_gpu.data(), part_out.data(), part_lse.data()); });
  expect_close(lse_gpu, lse_cpu, "merged lse");
  expect_close(out_gpu, out_cpu, "merged out");
}

}  // namespace
