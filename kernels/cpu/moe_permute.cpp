// The MoE dispatcher's row moves (see moe_permute.h): OpenMP over experts, rows, tokens or
// chunks, each output element written by one thread.
#include "kernels/cpu/moe_permute.h"

#include <cstring>
#include <vector>

namespace mt::kernels::cpu {
namespace {

// Big enough that a parallel region pays for itself.
constexpr int64_t kParallelElements = int64_t{1} << 15;

void copy_row(const float* in, float* out, int64_t cols) {
  std::memcpy(out, in, static_cast<size_t>(cols) * sizeof(float));
}

}  // namespace

void moe_expert_counts(const uint8_t* routing_map, int64_t tokens, int experts, int64_t* counts) {
#pragma omp parallel for schedule(static) if (tokens * experts >= kParallelElements)
  for (int e = 0; e < experts; ++e) {
    int64_t count = 0;
    for (int64_t t = 0; t < tokens; ++t) count += routing_map[t * experts + e] != 0;
    counts[e] = count;
  }
}

void moe_route_index(const uint8_t* routing_map, const float* probs, int64_t tokens, int experts, int32_t* row_token,
                     float* row_probs) {
  std::vector<int64_t> first_row(static_cast<size_t>(experts) + 1, 0);
  moe_expert_counts(routing_map, tokens, experts, first_row.data() + 1);
  for (int e = 0; e < experts; ++e) first_row[e + 1] += first_row[e];
#pragma omp parallel for schedule(static) if (tokens * experts >= kParallelElements)
  for (int e = 0; e < experts; ++e) {
    int64_t r = first_row[e];
    for (int64_t t = 0; t < tokens; ++t) {
      if (routing_map[t * experts + e] == 0) continue;
      row_token[r] = static_cast<int32_t>(t);
      row_probs[r] = probs[t * experts + e];
      ++r;
    }
  }
}

void moe_permute_rows(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) copy_row(in + row_index[r] * cols, out + r * cols, cols);
}

void moe_unpermute_rows(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out,
                        int64_t out_rows) {
  // The rows of each output row, ascending (a counting sort by index: CSR).
  std::vector<int64_t> first(static_cast<size_t>(out_rows) + 1, 0);
  for (int64_t r = 0; r < rows; ++r) ++first[static_cast<size_t>(row_index[r]) + 1];
  for (int64_t t = 0; t < out_rows; ++t) first[t + 1] += first[t];
  std::vector<int64_t> sources(static_cast<size_t>(rows));
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  for (int64_t r = 0; r < rows; ++r) sources[static_cast<size_t>(next[row_index[r]]++)] = r;
#pragma omp parallel for schedule(static) if (out_rows * cols >= kParallelElements)
  for (int64_t t = 0; t < out_rows; ++t) {
    float* y = out + t * cols;
    for (int64_t c = 0; c < cols; ++c) y[c] = 0.0f;
    for (int64_t i = first[t]; i < first[t + 1]; ++i) {
      const float* x = in + sources[static_cast<size_t>(i)] * cols;
      for (int64_t c = 0; c < cols; ++c) y[c] += x[c];
    }
  }
}

void moe_unroute_probs(const float* row_grads, const int32_t* row_token, const int64_t* expert_rows, int64_t tokens,
                       int experts, float* dprobs) {
  if (tokens * experts > 0) std::memset(dprobs, 0, static_cast<size_t>(tokens * experts) * sizeof(float));
  int64_t r = 0;
  for (int e = 0; e < experts; ++e) {
    for (int64_t i = 0; i < expert_rows[e]; ++i, ++r) dprobs[int64_t{row_token[r]} * experts + e] = row_grads[r];
  }
}

void moe_sort_chunks(const float* in, int64_t cols, const int64_t* chunk_rows, const int32_t* order, int chunks,
                     float* out) {
  std::vector<int64_t> in_first(static_cast<size_t>(chunks) + 1, 0), out_first(static_cast<size_t>(chunks) + 1, 0);
  for (int i = 0; i < chunks; ++i) in_first[i + 1] = in_first[i] + chunk_rows[i];
  for (int j = 0; j < chunks; ++j) out_first[j + 1] = out_first[j] + chunk_rows[order[j]];
#pragma omp parallel for schedule(static) if (in_first[chunks] * cols >= kParallelElements)
  for (int j = 0; j < chunks; ++j) {
    const int64_t rows = chunk_rows[order[j]];
    if (rows > 0) {
      std::memcpy(out + out_first[j] * cols, in + in_first[order[j]] * cols,
                  static_cast<size_t>(rows * cols) * sizeof(float));
    }
  }
}

}  // namespace mt::kernels::cpu
