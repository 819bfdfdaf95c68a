// CUDA kernels of the MoE router: the entries moe_router_* of kernels/cuda/ops.h with the CPU
// contracts of kernels/cpu/moe_router.h (Megatron-Core's router math), the same tie-breaking in
// every top-k (a higher value first, equal values by lower index) and the same sums. Simple on
// purpose (E is small): one block per row (or per expert column), where the order of the CPU's
// fp32 arithmetic matters one thread does the row's selections and sums in the CPU's order and the
// other threads only write; sums over rows go through a shared tile that one thread adds in row
// order in double, as loss.cu's xent_loss_sums. Products that feed a sum are rounded on their own
// (__fmul_rn / __dmul_rn) so nvcc does not contract them into FMAs the CPU build does not use.
//
// Row ids outside the aux sums' groups cannot throw from a kernel: the kernel skips the row and
// records the first offender in a device word, tagged with the stream the kernel was queued on;
// moe_router_take_deferred_error(stream) (called by the backend's synchronize after the stream
// has drained) turns that stream's record into the std::invalid_argument the CPU throws, naming
// the row id, and leaves another stream's record for that stream's synchronize. No entry
// allocates, copies to or from the host or synchronises. Tested on a GPU by the op harness
// (tests/gpu/test_cuda_op_harness.cpp, the moe_router cases of tests/harness/cases_moe_router.cpp).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace mt::kernels::cuda {
namespace {

using detail::check_launch;
using detail::grid_for;

constexpr float kSigmoidNormEpsilon = 1e-20f;  // Megatron's "+ 1e-20" in the sigmoid normalisations
constexpr int kRowThreads = 32;                // one warp per row: the row's writes are spread over it
constexpr int kTileThreads = 256;              // rows (or columns) per tile of the ordered sums
// The largest E and the most aux groups the shared-memory scratch takes (48 KiB per block).
constexpr int kMaxExperts = 2048;
constexpr int64_t kMaxAuxGroups = 2048;

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Whether (value a, index ia) comes before (value b, index ib) in every top-k's order.
__device__ bool ranks_before(float a, int64_t ia, float b, int64_t ib) { return a > b || (a == b && ia < ib); }

// The next entry of values[0, n) in top-k order after (previous value, previous index); the first
// when previous_index < 0. Selecting k times this way gives std::partial_sort's first k.
__device__ int next_in_order(const float* values, int n, float previous_value, int previous_index) {
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (previous_index >= 0 && !ranks_before(previous_value, previous_index, values[i], i)) continue;
    if (best < 0 || ranks_before(values[i], i, values[best], best)) best = i;
  }
  return best;
}

// The CPU's softmax_row: max, exp and sum in index order (fp32), then out[i] = exp / sum.
__device__ void softmax_row(const float* in, int n, float* out) {
  float max_value = -INFINITY;
  for (int i = 0; i < n; ++i) max_value = fmaxf(max_value, in[i]);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    out[i] = expf(in[i] - max_value);
    sum += out[i];
  }
  for (int i = 0; i < n; ++i) out[i] /= sum;
}

__device__ double logsumexp_row(const float* in, int n) {
  double max_value = -INFINITY;
  for (int i = 0; i < n; ++i) max_value = fmax(max_value, static_cast<double>(in[i]));
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += exp(static_cast<double>(in[i]) - max_value);
  return max_value + log(sum);
}

// ---- top-k ----------------------------------------------------------------------------------

// Masks to -inf the choosing scores of the experts outside the row's group_topk best groups
// (choose: E floats, group_scores: num_groups floats; one thread).
__device__ void mask_groups(const MoeTopkParams& params, float* choose, float* group_scores) {
  const int groups = params.num_groups, per_group = params.num_experts / groups;
  const int picks = params.topk / params.group_topk;
  for (int g = 0; g < groups; ++g) {
    const float* group = choose + g * per_group;
    float sum = 0.0f, value = 0.0f;
    int index = -1;
    for (int j = 0; j < picks; ++j) {
      index = next_in_order(group, per_group, value, index);
      value = group[index];
      sum += value;
    }
    group_scores[g] = sum;
  }
  // Group g is kept when fewer than group_topk groups come before it.
  for (int g = 0; g < groups; ++g) {
    int before = 0;
    for (int h = 0; h < groups; ++h) before += ranks_before(group_scores[h], h, group_scores[g], g) ? 1 : 0;
    if (before >= params.group_topk) {
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) choose[e] = -INFINITY;
    }
  }
}

// One block of kRowThreads per row (rows strided over the grid). Shared: scores[E], choose[E],
// group_scores[E]. Thread 0 computes the row's scores and choices in the CPU's order.
__global__ void topk_kernel(const float* logits, const float* expert_bias, int64_t rows, MoeTopkParams params,
                            int32_t* topk_indices, float* probs, uint8_t* routing_map) {
  extern __shared__ float topk_shared[];
  const int experts = params.num_experts, k = params.topk;
  float* scores = topk_shared;
  float* choose = scores + experts;
  float* group_scores = choose + experts;
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const float* row_logits = logits + t * experts;  // (E)
    float* row_probs = probs + t * experts;          // (E)
    uint8_t* row_map = routing_map + t * experts;    // (E)
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
      row_probs[e] = 0.0f;
      row_map[e] = 0;
    }
    __syncthreads();  // the zeros land before thread 0 writes the chosen entries
    if (threadIdx.x == 0) {
      if (params.score_function == MoeScoreFunction::sigmoid) {
        for (int e = 0; e < experts; ++e) {
          scores[e] = sigmoid(row_logits[e]);
          choose[e] = scores[e] + (expert_bias ? expert_bias[e] : 0.0f);
        }
      } else if (params.pre_softmax) {
        softmax_row(row_logits, experts, scores);
        for (int e = 0; e < experts; ++e) choose[e] = scores[e];
      } else {
        for (int e = 0; e < experts; ++e) choose[e] = row_logits[e];
      }
      if (params.group_topk > 0) mask_groups(params, choose, group_scores);
      int32_t* chosen = topk_indices + t * k;  // (k)
      int index = -1;
      float value = 0.0f;
      for (int j = 0; j < k; ++j) {
        index = next_in_order(choose, experts, value, index);
        value = choose[index];
        chosen[j] = index;
      }
      // The gates, before scaling, into scores[chosen[j]] order-free: gate j is kept in group_scores[j].
      float* gate = group_scores;
      if (params.score_function == MoeScoreFunction::softmax && !params.pre_softmax) {
        for (int j = 0; j < k; ++j) choose[j] = row_logits[chosen[j]];  // choose is no longer needed
        softmax_row(choose, k, gate);
      } else {
        for (int j = 0; j < k; ++j) gate[j] = scores[chosen[j]];
        if (params.score_function == MoeScoreFunction::sigmoid && k > 1) {
          float sum = 0.0f;
          for (int j = 0; j < k; ++j) sum += gate[j];
          for (int j = 0; j < k; ++j) gate[j] /= sum + kSigmoidNormEpsilon;
        }
      }
      for (int j = 0; j < k; ++j) {
        row_probs[chosen[j]] = __fmul_rn(gate[j], params.scaling_factor);
        row_map[chosen[j]] = 1;
      }
    }
    __syncthreads();  // shared scratch is free for the next row
  }
}

// One block of kRowThreads per row. Thread 0 works out the row's coupling terms; post-softmax and
// sigmoid then write the k chosen entries (thread 0), pre-softmax every entry (all threads).
__global__ void topk_backward_kernel(const float* logits, const int32_t* topk_indices, const float* dprobs,
                                     const uint8_t* routing_map, int64_t rows, MoeTopkParams params,
                                     float* dlogits) {
  __shared__ float shared_max, shared_sum;
  __shared__ double shared_dot;
  const int experts = params.num_experts, k = params.topk;
  const double scaling = params.scaling_factor;
  const bool pre_softmax = params.score_function == MoeScoreFunction::softmax && params.pre_softmax;
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const float* row_logits = logits + t * experts;  // (E)
    const int32_t* chosen = topk_indices + t * k;    // (k)
    float* dl = dlogits + t * experts;               // (E)
    // The gradient reaching chosen expert j's gate.
    auto dgate = [&](int j) {
      const int64_t at = t * experts + chosen[j];
      const bool kept = !routing_map || routing_map[at] != 0;
      return kept ? __dmul_rn(scaling, static_cast<double>(dprobs[at])) : 0.0;
    };
    if (!pre_softmax) {
      for (int e = threadIdx.x; e < experts; e += blockDim.x) dl[e] = 0.0f;
    }
    __syncthreads();  // the zeros land before thread 0 writes the chosen entries
    if (threadIdx.x == 0) {
      if (params.score_function == MoeScoreFunction::softmax && !params.pre_softmax) {
        float max_value = -INFINITY, sum = 0.0f;
        for (int j = 0; j < k; ++j) max_value = fmaxf(max_value, row_logits[chosen[j]]);
        for (int j = 0; j < k; ++j) sum += expf(row_logits[chosen[j]] - max_value);
        double dot = 0.0;
        for (int j = 0; j < k; ++j) {
          const float gate = expf(row_logits[chosen[j]] - max_value) / sum;
          dot += __dmul_rn(gate, dgate(j));
        }
        for (int j = 0; j < k; ++j) {
          const float gate = expf(row_logits[chosen[j]] - max_value) / sum;
          dl[chosen[j]] = static_cast<float>(__dmul_rn(gate, dgate(j) - dot));
        }
      } else if (pre_softmax) {
        float max_value = -INFINITY, sum = 0.0f;
        for (int e = 0; e < experts; ++e) max_value = fmaxf(max_value, row_logits[e]);
        for (int e = 0; e < experts; ++e) sum += expf(row_logits[e] - max_value);
        double dot = 0.0;
        for (int j = 0; j < k; ++j) {
          const float score = expf(row_logits[chosen[j]] - max_value) / sum;
          dot += __dmul_rn(score, dgate(j));
        }
        shared_max = max_value;
        shared_sum = sum;
        shared_dot = dot;
      } else {
        double sum = 0.0, weighted = 0.0;
        for (int j = 0; j < k; ++j) {
          const double s = sigmoid(row_logits[chosen[j]]);
          sum += s;
          weighted += __dmul_rn(s, dgate(j));
        }
        const double denominator = sum + static_cast<double>(kSigmoidNormEpsilon);
        for (int j = 0; j < k; ++j) {
          const double s = sigmoid(row_logits[chosen[j]]);
          const double ds = k > 1 ? dgate(j) / denominator - weighted / __dmul_rn(denominator, denominator) : dgate(j);
          dl[chosen[j]] = static_cast<float>(__dmul_rn(__dmul_rn(ds, s), 1.0 - s));
        }
      }
    }
    __syncthreads();
    if (pre_softmax) {
      for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        double dscore = 0.0;
        for (int j = 0; j < k; ++j) {
          if (chosen[j] == e) dscore = dgate(j);
        }
        const float score = expf(row_logits[e] - shared_max) / shared_sum;
        dl[e] = static_cast<float>(__dmul_rn(score, dscore - shared_dot));
      }
    }
    __syncthreads();  // the shared terms are read before the next row writes them
  }
}

// ---- aux sums and their backward --------------------------------------------------------------

// The first out-of-range row id an aux kernel met. `owner` (0: none) is the queuing stream's tag
// and the claim in one atomic word, so a synchronize of another stream never takes (or clears)
// it; the other fields are written after the claim and read only by the owner's synchronize,
// after that stream has drained.
struct DeferredRowError {
  unsigned long long owner;
  int entry;  // 0: moe_router_aux_sums, 1: moe_router_aux_backward
  long long row_id;
  long long groups;
  long long sequence_length;
};
__device__ DeferredRowError g_row_error = {0, 0, 0, 0, 0};
// Set for good by the first aux kernel queued with row ids: a captured graph replays its kernels
// without queuing them again, so no host-side "since the last check" flag can be trusted.
std::atomic<bool> g_row_ids_queued{false};
std::mutex g_row_error_mutex;  // one host thread at a time reads and clears the word

// A stream's tag in g_row_error.owner: never 0 (the legacy stream's null handle included).
unsigned long long stream_tag(void* stream) {
  return static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(stream)) + 1;
}

// Row t's group as the CPU's row_group, or -1 (the row is skipped and the error recorded for the
// stream tagged `stream`).
__device__ int64_t row_group(const int64_t* row_ids, int64_t sequence_length, int64_t groups, int64_t t, int entry,
                             unsigned long long stream) {
  if (!row_ids) return 0;
  const int64_t group = sequence_length > 0 ? row_ids[t] / sequence_length : -1;
  if (group >= 0 && group < groups) return group;
  if (atomicCAS(&g_row_error.owner, 0ull, stream) == 0ull) {
    g_row_error.entry = entry;
    g_row_error.row_id = row_ids[t];
    g_row_error.groups = groups;
    g_row_error.sequence_length = sequence_length;
    __threadfence();
  }
  return -1;
}

// The aux loss's score P_e of a row (CPU aux_scores: softmax over E, or sigmoid / (sum + 1e-20)),
// given the row's max (softmax) and its fp32 sum (of exps or of sigmoids, in index order).
__device__ float aux_score(const float* row_logits, int e, MoeScoreFunction function, float max_value, float sum) {
  return function == MoeScoreFunction::softmax ? expf(row_logits[e] - max_value) / sum
                                               : sigmoid(row_logits[e]) / (sum + kSigmoidNormEpsilon);
}

// The row's max logit (softmax) and its fp32 sum of exps or sigmoids, in index order.
__device__ void aux_row_terms(const float* row_logits, int experts, MoeScoreFunction function, float* max_value,
                              float* sum) {
  *max_value = -INFINITY;
  *sum = 0.0f;
  if (function == MoeScoreFunction::softmax) {
    for (int e = 0; e < experts; ++e) *max_value = fmaxf(*max_value, row_logits[e]);
    for (int e = 0; e < experts; ++e) *sum += expf(row_logits[e] - *max_value);
  } else {
    for (int e = 0; e < experts; ++e) *sum += sigmoid(row_logits[e]);
  }
}

// One block per expert column e (strided over the grid). A tile of kTileThreads rows at a time:
// each thread computes its row's P_e and whether e is in the row's plain top-k of P; thread 0
// adds them to the group's totals in row order (double sums, int64 counts in shared memory).
__global__ void aux_sums_kernel(const float* logits, int64_t rows, int experts, int topk, MoeScoreFunction function,
                                const int64_t* row_ids, int64_t sequence_length, int64_t groups, float* counts,
                                float* prob_sums, unsigned long long stream) {
  extern __shared__ double aux_shared[];
  double* prob_total = aux_shared;                                             // (groups)
  auto* count_total = reinterpret_cast<long long*>(prob_total + groups);       // (groups)
  __shared__ double tile_prob[kTileThreads];
  __shared__ int64_t tile_group[kTileThreads];
  __shared__ int tile_picked[kTileThreads];
  for (int e = blockIdx.x; e < experts; e += gridDim.x) {
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      prob_total[g] = 0.0;
      count_total[g] = 0;
    }
    for (int64_t tile_begin = 0; tile_begin < rows; tile_begin += kTileThreads) {
      const int64_t t = tile_begin + threadIdx.x;
      __syncthreads();  // the previous tile has been added (and the totals zeroed)
      if (t < rows) {
        const float* row_logits = logits + t * experts;  // (E)
        tile_group[threadIdx.x] = row_group(row_ids, sequence_length, groups, t, 0, stream);
        float max_value = 0.0f, sum = 0.0f;
        aux_row_terms(row_logits, experts, function, &max_value, &sum);
        const float p = aux_score(row_logits, e, function, max_value, sum);
        int before = 0;  // experts ahead of e in the row's top-k order
        for (int i = 0; i < experts && before < topk; ++i) {
          before += ranks_before(aux_score(row_logits, i, function, max_value, sum), i, p, e) ? 1 : 0;
        }
        tile_prob[threadIdx.x] = p;
        tile_picked[threadIdx.x] = before < topk ? 1 : 0;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        const int count = static_cast<int>(rows - tile_begin < kTileThreads ? rows - tile_begin : kTileThreads);
        for (int i = 0; i < count; ++i) {
          const int64_t g = tile_group[i];
          if (g < 0) continue;
          prob_total[g] += tile_prob[i];
          count_total[g] += tile_picked[i];
        }
      }
    }
    __syncthreads();
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      counts[g * experts + e] = static_cast<float>(count_total[g]);
      prob_sums[g * experts + e] = static_cast<float>(prob_total[g]);
    }
    __syncthreads();  // the totals are read before the next column zeroes them
  }
}

// One block of kRowThreads per row: thread 0 works out the row's terms in the CPU's order, then
// every thread adds the gradient of its experts.
__global__ void aux_backward_kernel(const float* logits, int64_t rows, int experts, MoeScoreFunction function,
                                    const int64_t* row_ids, int64_t sequence_length, int64_t groups,
                                    const float* weights, float scale, float* dlogits, unsigned long long stream) {
  __shared__ float shared_max, shared_sum;
  __shared__ double shared_mean, shared_denominator;
  __shared__ int64_t shared_group;
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const float* row_logits = logits + t * experts;  // (E)
    if (threadIdx.x == 0) {
      shared_group = row_group(row_ids, sequence_length, groups, t, 1, stream);
      if (shared_group >= 0) {
        const float* w = weights + shared_group * experts;  // (E)
        float max_value = 0.0f, sum = 0.0f;
        aux_row_terms(row_logits, experts, function, &max_value, &sum);
        double mean = 0.0;  // sum_e P_e w_e
        for (int e = 0; e < experts; ++e) {
          mean += __dmul_rn(aux_score(row_logits, e, function, max_value, sum), w[e]);
        }
        double sigmoid_sum = 0.0;
        if (function == MoeScoreFunction::sigmoid) {
          for (int e = 0; e < experts; ++e) sigmoid_sum += sigmoid(row_logits[e]);
        }
        shared_max = max_value;
        shared_sum = sum;
        shared_mean = mean;
        shared_denominator = sigmoid_sum + static_cast<double>(kSigmoidNormEpsilon);
      }
    }
    __syncthreads();
    if (shared_group >= 0) {
      const float* w = weights + shared_group * experts;  // (E)
      float* dl = dlogits + t * experts;                   // (E)
      for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        const double centred = static_cast<double>(w[e]) - shared_mean;
        if (function == MoeScoreFunction::softmax) {
          const float p = aux_score(row_logits, e, function, shared_max, shared_sum);
          dl[e] += static_cast<float>(__dmul_rn(__fmul_rn(scale, p), centred));  // scale p in fp32, as the CPU
        } else {
          const double s = sigmoid(row_logits[e]);
          dl[e] += static_cast<float>(__dmul_rn(__dmul_rn(__dmul_rn(scale, centred) / shared_denominator, s), 1.0 - s));
        }
      }
    }
    __syncthreads();  // the shared terms are read before the next row writes them
  }
}

// ---- z-loss -----------------------------------------------------------------------------------

// One block: a tile of rows' logsumexp^2 at a time into shared memory, added by thread 0 in row
// order; *sum is written at the end.
__global__ void z_loss_sum_kernel(const float* logits, int64_t rows, int experts, double* sum) {
  __shared__ double tile[kTileThreads];
  double total = 0.0;
  for (int64_t tile_begin = 0; tile_begin < rows; tile_begin += kTileThreads) {
    const int64_t t = tile_begin + threadIdx.x;
    if (t < rows) {
      const double lse = logsumexp_row(logits + t * experts, experts);
      tile[threadIdx.x] = __dmul_rn(lse, lse);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int count = static_cast<int>(rows - tile_begin < kTileThreads ? rows - tile_begin : kTileThreads);
      for (int i = 0; i < count; ++i) total += tile[i];
    }
    __syncthreads();  // the tile has been read before the next one is written
  }
  if (threadIdx.x == 0) *sum = total;
}

__global__ void z_loss_backward_kernel(const float* logits, int64_t rows, int experts, float scale, float* dlogits) {
  __shared__ double shared_lse;
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    const float* row_logits = logits + t * experts;  // (E)
    if (threadIdx.x == 0) shared_lse = logsumexp_row(row_logits, experts);
    __syncthreads();
    const double lse = shared_lse;
    float* dl = dlogits + t * experts;  // (E)
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
      const double factor = __dmul_rn(__dmul_rn(static_cast<double>(scale), 2.0), lse);
      dl[e] += static_cast<float>(__dmul_rn(factor, exp(static_cast<double>(row_logits[e]) - lse)));
    }
    __syncthreads();  // lse is read before the next row writes it
  }
}

// ---- capacity, counts, expert bias ----------------------------------------------------------------

// One block per expert column e. The new map entry of every row is worked out first (a row's
// keep depends on the other rows' old values), then the probs of unmapped rows are zeroed.
// Policy probs: row t is kept when fewer than `capacity` rows come before it in (prob descending,
// row ascending) order (each thread counts for its rows; the map is not read, so each thread
// writes its rows' new map at once). Policy position: thread 0 walks the rows in order, a routed
// row's rank being the routed rows before it, an unrouted row's all routed rows plus the
// unrouted rows before it.
__global__ void capacity_drop_kernel(float* probs, uint8_t* routing_map, int64_t rows, int experts, int64_t capacity,
                                     MoeDropPolicy policy, bool pad_to_capacity) {
  const bool keep_all = capacity >= rows;
  for (int e = blockIdx.x; e < experts; e += gridDim.x) {
    auto new_map = [&](int64_t t, bool keep) {
      const uint8_t mapped = routing_map[t * experts + e];
      return pad_to_capacity ? static_cast<uint8_t>(keep ? 1 : 0) : static_cast<uint8_t>(mapped && keep ? 1 : 0);
    };
    if (keep_all || policy == MoeDropPolicy::probs) {
      for (int64_t t = threadIdx.x; t < rows; t += blockDim.x) {
        bool keep = true;
        if (!keep_all) {
          const float value = probs[t * experts + e];
          int64_t before = 0;
          for (int64_t u = 0; u < rows && before < capacity; ++u) {
            before += ranks_before(probs[u * experts + e], u, value, t) ? 1 : 0;
          }
          keep = before < capacity;
        }
        routing_map[t * experts + e] = new_map(t, keep);
      }
    } else if (threadIdx.x == 0) {
      int64_t routed = 0;
      for (int64_t t = 0; t < rows; ++t) routed += routing_map[t * experts + e] != 0 ? 1 : 0;
      int64_t routed_before = 0, unrouted_before = 0;
      for (int64_t t = 0; t < rows; ++t) {
        const bool mapped = routing_map[t * experts + e] != 0;
        const int64_t rank = mapped ? routed_before : routed + unrouted_before;
        (mapped ? routed_before : unrouted_before) += 1;
        routing_map[t * experts + e] = new_map(t, rank < capacity);
      }
    }
    __syncthreads();  // every new map entry of the column is written
    for (int64_t t = threadIdx.x; t < rows; t += blockDim.x) {
      if (!routing_map[t * experts + e]) probs[t * experts + e] = 0.0f;
    }
  }
}

// One thread per expert: counts[e] += its column's ones.
__global__ void tokens_per_expert_kernel(const uint8_t* routing_map, int64_t rows, int experts, float* counts) {
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < experts; e += gridDim.x * blockDim.x) {
    int64_t total = 0;
    for (int64_t t = 0; t < rows; ++t) total += routing_map[t * experts + e];
    counts[e] += static_cast<float>(total);
  }
}

// One thread: the CPU's loop (fp32 sum in index order, sign(0) = 0).
__global__ void expert_bias_update_kernel(float* bias, const float* counts, int experts, float rate) {
  float sum = 0.0f;
  for (int e = 0; e < experts; ++e) sum += counts[e];
  const float mean = sum / static_cast<float>(experts);
  for (int e = 0; e < experts; ++e) {
    const float offset = mean - counts[e];
    const float sign = offset > 0.0f ? 1.0f : (offset < 0.0f ? -1.0f : 0.0f);
    bias[e] += __fmul_rn(sign, rate);
  }
}

// ---- argument checks (the CPU's, thrown before anything is queued) -----------------------------

void check_topk_params(const MoeTopkParams& params) {
  const int experts = params.num_experts;
  if (experts < 1 || params.topk < 1 || params.topk > experts) {
    throw std::invalid_argument("moe_router_topk: topk " + std::to_string(params.topk) + " outside [1, " +
                                std::to_string(experts) + "]");
  }
  if (params.group_topk > 0 &&
      (params.num_groups < 1 || experts % params.num_groups != 0 || params.group_topk > params.num_groups ||
       params.topk < params.group_topk || params.topk > params.group_topk * (experts / params.num_groups))) {
    throw std::invalid_argument("moe_router_topk: groups " + std::to_string(params.num_groups) + " / top " +
                                std::to_string(params.group_topk) + " do not fit " + std::to_string(experts) +
                                " experts and topk " + std::to_string(params.topk));
  }
  if (experts > kMaxExperts) {
    throw std::invalid_argument("cuda moe_router_topk: " + std::to_string(experts) + " experts, more than the " +
                                std::to_string(kMaxExperts) + " its kernel takes");
  }
}

}  // namespace

void moe_router_topk(const float* logits, const float* expert_bias, int64_t rows, const MoeTopkParams& params,
                     int32_t* topk_indices, float* probs, uint8_t* routing_map, void* stream) {
  check_topk_params(params);
  if (rows <= 0) return;
  // 3E floats, rounded up to 16 bytes and 16 more: nvcc pairs and quads the scratch's loads
  // (ld.shared.v2/.v4), and compute-sanitizer's memcheck on an H200 caught an 8-byte read past a
  // 12-byte scratch (E = 1).
  const size_t shared = ((3 * static_cast<size_t>(params.num_experts) + 3) / 4 + 1) * 4 * sizeof(float);
  topk_kernel<<<grid_for(rows, 1), kRowThreads, shared, as_stream(stream)>>>(logits, expert_bias, rows, params,
                                                                             topk_indices, probs, routing_map);
  check_launch("moe_router_topk");
}

void moe_router_topk_backward(const float* logits, const int32_t* topk_indices, const float* dprobs,
                              const uint8_t* routing_map, int64_t rows, const MoeTopkParams& params, float* dlogits,
                              void* stream) {
  check_topk_params(params);
  if (rows <= 0) return;
  topk_backward_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(logits, topk_indices, dprobs,
                                                                                 routing_map, rows, params, dlogits);
  check_launch("moe_router_topk_backward");
}

void moe_router_aux_sums(const float* logits, int64_t rows, int experts, int topk, MoeScoreFunction score_function,
                         const int64_t* row_ids, int64_t sequence_length, int64_t groups, float* counts,
                         float* prob_sums, void* stream) {
  if (topk < 1 || topk > experts) throw std::invalid_argument("moe_router_aux_sums: topk outside [1, experts]");
  if (groups == 0 && rows <= 0) return;  // no rows and no outputs: nothing to do, as on the CPU
  if (groups < 1 || groups > kMaxAuxGroups) {
    throw std::invalid_argument("cuda moe_router_aux_sums: " + std::to_string(groups) + " groups outside [1, " +
                                std::to_string(kMaxAuxGroups) + "]");
  }
  if (row_ids) g_row_ids_queued.store(true);
  const size_t shared = 2 * static_cast<size_t>(groups) * sizeof(double);
  aux_sums_kernel<<<grid_for(experts, 1), kTileThreads, shared, as_stream(stream)>>>(
      logits, rows, experts, topk, score_function, row_ids, sequence_length, groups, counts, prob_sums,
      stream_tag(stream));
  check_launch("moe_router_aux_sums");
}

void moe_router_aux_backward(const float* logits, int64_t rows, int experts, MoeScoreFunction score_function,
                             const int64_t* row_ids, int64_t sequence_length, int64_t groups, const float* weights,
                             float scale, float* dlogits, void* stream) {
  if (rows <= 0 || experts <= 0) return;
  if (row_ids) g_row_ids_queued.store(true);
  aux_backward_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(
      logits, rows, experts, score_function, row_ids, sequence_length, groups, weights, scale, dlogits,
      stream_tag(stream));
  check_launch("moe_router_aux_backward");
}

void moe_router_take_deferred_error(void* stream) {
  if (!g_row_ids_queued.load()) return;
  const std::lock_guard<std::mutex> lock(g_row_error_mutex);
  bind_selected_device();  // the symbol lives on the selected device
  DeferredRowError error{};
  const cudaError_t read = cudaMemcpyFromSymbol(&error, g_row_error, sizeof error);
  if (read != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA moe_router: reading the row-id check: ") + cudaGetErrorString(read));
  }
  if (error.owner != stream_tag(stream)) return;  // none, or another stream's (its synchronize throws it)
  const unsigned long long released = 0;  // the claim alone: the other fields are rewritten by the next claim
  const cudaError_t reset = cudaMemcpyToSymbol(g_row_error, &released, sizeof released);
  if (reset != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA moe_router: resetting the row-id check: ") + cudaGetErrorString(reset));
  }
  throw std::invalid_argument(std::string(error.entry == 0 ? "moe_router_aux_sums" : "moe_router_aux_backward") +
                              ": row id " + std::to_string(error.row_id) + " is outside the " +
                              std::to_string(error.groups) + " sequences of length " +
                              std::to_string(error.sequence_length));
}

void moe_router_z_loss_sum(const float* logits, int64_t rows, int experts, double* sum, void* stream) {
  z_loss_sum_kernel<<<1, kTileThreads, 0, as_stream(stream)>>>(logits, rows, experts, sum);
  check_launch("moe_router_z_loss_sum");
}

void moe_router_z_loss_backward(const float* logits, int64_t rows, int experts, float scale, float* dlogits,
                                void* stream) {
  if (rows <= 0 || experts <= 0) return;
  z_loss_backward_kernel<<<grid_for(rows, 1), kRowThreads, 0, as_stream(stream)>>>(logits, rows, experts, scale,
                                                                                   dlogits);
  check_launch("moe_router_z_loss_backward");
}

void moe_router_capacity_drop(float* probs, uint8_t* routing_map, int64_t rows, int experts, int64_t capacity,
                              MoeDropPolicy policy, bool pad_to_capacity, void* stream) {
  if (capacity < 0) throw std::invalid_argument("moe_router_capacity_drop: negative capacity");
  if (rows <= 0 || experts <= 0) return;
  capacity_drop_kernel<<<grid_for(experts, 1), kTileThreads, 0, as_stream(stream)>>>(
      probs, routing_map, rows, experts, capacity, policy, pad_to_capacity);
  check_launch("moe_router_capacity_drop");
}

void moe_router_tokens_per_expert(const uint8_t* routing_map, int64_t rows, int experts, float* counts, void* stream) {
  if (experts <= 0) return;
  tokens_per_expert_kernel<<<grid_for(experts, kTileThreads), kTileThreads, 0, as_stream(stream)>>>(
      routing_map, rows, experts, counts);
  check_launch("moe_router_tokens_per_expert");
}

void moe_router_expert_bias_update(float* bias, const float* counts, int experts, float rate, void* stream) {
  if (experts <= 0) return;
  expert_bias_update_kernel<<<1, 1, 0, as_stream(stream)>>>(bias, counts, experts, rate);
  check_launch("moe_router_expert_bias_update");
}

}  // namespace mt::kernels::cuda
