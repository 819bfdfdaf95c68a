// CPU kernels of the MoE router (contracts in moe_router.h). Per-row work runs over OpenMP
// threads, each row written by one thread; sums over rows run in row order on one thread, so no
// result depends on the thread count. Forward scores are computed in fp32 as PyTorch computes
// them; backward and the sums accumulate in double.
#include "kernels/cpu/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt::kernels::cpu {
namespace {

constexpr float kSigmoidNormEpsilon = 1e-20f;  // Megatron's "+ 1e-20" in the sigmoid normalisations

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// out = softmax(in) over n values, fp32 (max subtracted).
void softmax_row(const float* in, int n, float* out) {
  float max_value = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) max_value = std::max(max_value, in[i]);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    out[i] = std::exp(in[i] - max_value);
    sum += out[i];
  }
  for (int i = 0; i < n; ++i) out[i] /= sum;
}

double logsumexp_row(const float* in, int n) {
  double max_value = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) max_value = std::max(max_value, static_cast<double>(in[i]));
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += std::exp(in[i] - max_value);
  return max_value + std::log(sum);
}

// The first `k` entries of `order` become the indices of the k largest values (descending; equal
// values by lower index). `order` holds n entries.
void top_indices(const float* values, int n, int k, int32_t* order) {
  std::iota(order, order + n, 0);
  std::partial_sort(order, order + k, order + n, [values](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
}

// Scratch of one thread for one row of E experts.
struct RowScratch {
  explicit RowScratch(int experts)
      : scores(static_cast<size_t>(experts)), choose(static_cast<size_t>(experts)),
        order(static_cast<size_t>(experts)), group_scores(static_cast<size_t>(experts)),
        group_order(static_cast<size_t>(experts)), group_kept(static_cast<size_t>(experts)),
        selected(static_cast<size_t>(experts)) {}
  std::vector<float> scores, choose;
  std::vector<int32_t> order;
  std::vector<float> group_scores;
  std::vector<int32_t> group_order;
  std::vector<uint8_t> group_kept;
  std::vector<float> selected;
};

// Masks to -inf the choosing scores of every expert outside the row's group_topk best groups.
void mask_groups(const MoeTopkParams& params, RowScratch& scratch) {
  const int groups = params.num_groups;
  const int per_group = params.num_experts / groups;
  const int picks = params.topk / params.group_topk;
  for (int g = 0; g < groups; ++g) {
    const float* group = scratch.choose.data() + static_cast<ptrdiff_t>(g) * per_group;
    top_indices(group, per_group, picks, scratch.order.data());
    float sum = 0.0f;
    for (int j = 0; j < picks; ++j) sum += group[scratch.order[static_cast<size_t>(j)]];
    scratch.group_scores[static_cast<size_t>(g)] = sum;
  }
  top_indices(scratch.group_scores.data(), groups, params.group_topk, scratch.group_order.data());
  std::vector<uint8_t>& kept = scratch.group_kept;
  std::fill(kept.begin(), kept.end(), uint8_t{0});
  for (int j = 0; j < params.group_topk; ++j) kept[static_cast<size_t>(scratch.group_order[static_cast<size_t>(j)])] = 1;
  for (int e = 0; e < params.num_experts; ++e) {
    if (!kept[static_cast<size_t>(e / per_group)]) scratch.choose[static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
  }
}

// The choosing scores of one row (scratch.choose) and, for pre-softmax and sigmoid, the gate
// scores (scratch.scores).
void choosing_scores(const float* logits, const float* expert_bias, const MoeTopkParams& params,
                     RowScratch& scratch) {
  const int experts = params.num_experts;
  if (params.score_function == MoeScoreFunction::sigmoid) {
    for (int e = 0; e < experts; ++e) {
      scratch.scores[static_cast<size_t>(e)] = sigmoid(logits[e]);
      scratch.choose[static_cast<size_t>(e)] = scratch.scores[static_cast<size_t>(e)] + (expert_bias ? expert_bias[e] : 0.0f);
    }
  } else if (params.pre_softmax) {
    softmax_row(logits, experts, scratch.scores.data());
    std::copy(scratch.scores.begin(), scratch.scores.end(), scratch.choose.begin());
  } else {
    std::copy(logits, logits + experts, scratch.choose.begin());
  }
  if (params.group_topk > 0) mask_groups(params, scratch);
}

// The gates of the row's k chosen experts (index order of `chosen`), before scaling.
void gates(const float* logits, const MoeTopkParams& params, RowScratch& scratch, const int32_t* chosen,
           float* gate) {
  const int k = params.topk;
  if (params.score_function == MoeScoreFunction::softmax && !params.pre_softmax) {
    for (int j = 0; j < k; ++j) scratch.selected[static_cast<size_t>(j)] = logits[chosen[j]];
    softmax_row(scratch.selected.data(), k, gate);
    return;
  }
  for (int j = 0; j < k; ++j) gate[j] = scratch.scores[static_cast<size_t>(chosen[j])];
  if (params.score_function == MoeScoreFunction::sigmoid && k > 1) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += gate[j];
    for (int j = 0; j < k; ++j) gate[j] /= sum + kSigmoidNormEpsilon;
  }
}

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
}

// Row t's group of moe_router_aux_sums.
int64_t row_group(const int64_t* row_ids, int64_t sequence_length, int64_t groups, int64_t t) {
  if (!row_ids) return 0;
  const int64_t group = sequence_length > 0 ? row_ids[t] / sequence_length : -1;
  if (group < 0 || group >= groups) {
    throw std::invalid_argument("moe_router_aux_sums: row id " + std::to_string(row_ids[t]) +
                                " is outside the " + std::to_string(groups) + " sequences of length " +
                                std::to_string(sequence_length));
  }
  return group;
}

// The aux loss's scores P of one row (softmax, or sigmoid normalised over E), fp32.
void aux_scores(const float* logits, int experts, MoeScoreFunction score_function, float* scores) {
  if (score_function == MoeScoreFunction::softmax) {
    softmax_row(logits, experts, scores);
    return;
  }
  float sum = 0.0f;
  for (int e = 0; e < experts; ++e) {
    scores[e] = sigmoid(logits[e]);
    sum += scores[e];
  }
  for (int e = 0; e < experts; ++e) scores[e] /= sum + kSigmoidNormEpsilon;
}

}  // namespace

void moe_router_topk(const float* logits, const float* expert_bias, int64_t rows, const MoeTopkParams& params,
                     int32_t* topk_indices, float* probs, uint8_t* routing_map) {
  check_topk_params(params);
  const int experts = params.num_experts, k = params.topk;
  const float scaling = params.scaling_factor;
#pragma omp parallel
  {
    RowScratch scratch(experts);
    std::vector<float> gate(static_cast<size_t>(k));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows; ++t) {
      const float* row_logits = logits + t * experts;
      choosing_scores(row_logits, expert_bias, params, scratch);
      top_indices(scratch.choose.data(), experts, k, scratch.order.data());
      int32_t* chosen = topk_indices + t * k;
      std::copy(scratch.order.begin(), scratch.order.begin() + k, chosen);
      gates(row_logits, params, scratch, chosen, gate.data());
      float* row_probs = probs + t * experts;
      uint8_t* row_map = routing_map + t * experts;
      std::fill(row_probs, row_probs + experts, 0.0f);
      std::fill(row_map, row_map + experts, uint8_t{0});
      for (int j = 0; j < k; ++j) {
        row_probs[chosen[j]] = gate[static_cast<size_t>(j)] * scaling;
        row_map[chosen[j]] = 1;
      }
    }
  }
}

void moe_router_topk_backward(const float* logits, const int32_t* topk_indices, const float* dprobs,
                              const uint8_t* routing_map, int64_t rows, const MoeTopkParams& params, float* dlogits) {
  check_topk_params(params);
  const int experts = params.num_experts, k = params.topk;
  const double scaling = params.scaling_factor;
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(experts));
    std::vector<float> selected(static_cast<size_t>(k)), gate(static_cast<size_t>(k));
    std::vector<double> dgate(static_cast<size_t>(k)), dscore(static_cast<size_t>(experts));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows; ++t) {
      const float* row_logits = logits + t * experts;
      const int32_t* chosen = topk_indices + t * k;
      float* dl = dlogits + t * experts;
      std::fill(dl, dl + experts, 0.0f);
      for (int j = 0; j < k; ++j) {
        const int64_t at = t * experts + chosen[j];
        const bool kept = !routing_map || routing_map[at] != 0;
        dgate[static_cast<size_t>(j)] = kept ? scaling * dprobs[at] : 0.0;
      }
      if (params.score_function == MoeScoreFunction::softmax && !params.pre_softmax) {
        for (int j = 0; j < k; ++j) selected[static_cast<size_t>(j)] = row_logits[chosen[j]];
        softmax_row(selected.data(), k, gate.data());
        double dot = 0.0;
        for (int j = 0; j < k; ++j) dot += gate[static_cast<size_t>(j)] * dgate[static_cast<size_t>(j)];
        for (int j = 0; j < k; ++j) {
          dl[chosen[j]] = static_cast<float>(gate[static_cast<size_t>(j)] * (dgate[static_cast<size_t>(j)] - dot));
        }
      } else if (params.score_function == MoeScoreFunction::softmax) {
        softmax_row(row_logits, experts, scores.data());
        double dot = 0.0;
        for (int j = 0; j < k; ++j) dot += scores[static_cast<size_t>(chosen[j])] * dgate[static_cast<size_t>(j)];
        std::fill(dscore.begin(), dscore.end(), 0.0);
        for (int j = 0; j < k; ++j) dscore[static_cast<size_t>(chosen[j])] = dgate[static_cast<size_t>(j)];
        for (int e = 0; e < experts; ++e) {
          dl[e] = static_cast<float>(scores[static_cast<size_t>(e)] * (dscore[static_cast<size_t>(e)] - dot));
        }
      } else {
        double sum = 0.0, weighted = 0.0;
        for (int j = 0; j < k; ++j) {
          const double s = sigmoid(row_logits[chosen[j]]);
          sum += s;
          weighted += s * dgate[static_cast<size_t>(j)];
        }
        const double denominator = sum + static_cast<double>(kSigmoidNormEpsilon);
        for (int j = 0; j < k; ++j) {
          const double s = sigmoid(row_logits[chosen[j]]);
          const double ds = k > 1 ? dgate[static_cast<size_t>(j)] / denominator - weighted / (denominator * denominator)
                                  : dgate[static_cast<size_t>(j)];
          dl[chosen[j]] = static_cast<float>(ds * s * (1.0 - s));
        }
      }
    }
  }
}

void moe_router_aux_sums(const float* logits, int64_t rows, int experts, int topk, MoeScoreFunction score_function,
                         const int64_t* row_ids, int64_t sequence_length, int64_t groups, float* counts,
                         float* prob_sums) {
  if (topk < 1 || topk > experts) throw std::invalid_argument("moe_router_aux_sums: topk outside [1, experts]");
  const size_t cells = static_cast<size_t>(groups) * static_cast<size_t>(experts);
  std::vector<double> prob_total(cells, 0.0);
  std::vector<int64_t> count_total(cells, 0);
  std::vector<float> scores(static_cast<size_t>(experts));
  std::vector<int32_t> order(static_cast<size_t>(experts));
  for (int64_t t = 0; t < rows; ++t) {
    const size_t base = static_cast<size_t>(row_group(row_ids, sequence_length, groups, t)) * static_cast<size_t>(experts);
    aux_scores(logits + t * experts, experts, score_function, scores.data());
    top_indices(scores.data(), experts, topk, order.data());
    for (int j = 0; j < topk; ++j) ++count_total[base + static_cast<size_t>(order[static_cast<size_t>(j)])];
    for (int e = 0; e < experts; ++e) prob_total[base + static_cast<size_t>(e)] += scores[static_cast<size_t>(e)];
  }
  for (size_t i = 0; i < cells; ++i) {
    counts[i] = static_cast<float>(count_total[i]);
    prob_sums[i] = static_cast<float>(prob_total[i]);
  }
}

void moe_router_aux_backward(const float* logits, int64_t rows, int experts, MoeScoreFunction score_function,
                             const int64_t* row_ids, int64_t sequence_length, int64_t groups, const float* weights,
                             float scale, float* dlogits) {
  for (int64_t t = 0; t < rows; ++t) row_group(row_ids, sequence_length, groups, t);  // checks before writing
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(experts));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows; ++t) {
      const float* row_logits = logits + t * experts;
      const float* w = weights + row_group(row_ids, sequence_length, groups, t) * experts;
      float* dl = dlogits + t * experts;
      aux_scores(row_logits, experts, score_function, scores.data());
      double mean_weight = 0.0;  // sum_i P_i w_i
      for (int e = 0; e < experts; ++e) mean_weight += static_cast<double>(scores[static_cast<size_t>(e)]) * w[e];
      if (score_function == MoeScoreFunction::softmax) {
        for (int e = 0; e < experts; ++e) {
          dl[e] += static_cast<float>(scale * scores[static_cast<size_t>(e)] * (w[e] - mean_weight));
        }
        continue;
      }
      double sum = 0.0;
      for (int e = 0; e < experts; ++e) sum += sigmoid(row_logits[e]);
      const double denominator = sum + static_cast<double>(kSigmoidNormEpsilon);
      for (int e = 0; e < experts; ++e) {
        const double s = sigmoid(row_logits[e]);
        dl[e] += static_cast<float>(scale * (w[e] - mean_weight) / denominator * s * (1.0 - s));
      }
    }
  }
}

double moe_router_z_loss_sum(const float* logits, int64_t rows, int experts) {
  double sum = 0.0;
  for (int64_t t = 0; t < rows; ++t) {
    const double lse = logsumexp_row(logits + t * experts, experts);
    sum += lse * lse;
  }
  return sum;
}

void moe_router_z_loss_backward(const float* logits, int64_t rows, int experts, float scale, float* dlogits) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    const float* row_logits = logits + t * experts;
    const double lse = logsumexp_row(row_logits, experts);
    float* dl = dlogits + t * experts;
    for (int e = 0; e < experts; ++e) {
      dl[e] += static_cast<float>(scale * 2.0 * lse * std::exp(row_logits[e] - lse));
    }
  }
}

void moe_router_capacity_drop(float* probs, uint8_t* routing_map, int64_t rows, int experts, int64_t capacity,
                              MoeDropPolicy policy, bool pad_to_capacity) {
  if (capacity < 0) throw std::invalid_argument("moe_router_capacity_drop: negative capacity");
  const bool keep_all = capacity >= rows;
#pragma omp parallel
  {
    std::vector<int64_t> order(static_cast<size_t>(rows));
    std::vector<uint8_t> keep(static_cast<size_t>(rows));
#pragma omp for schedule(static)
    for (int e = 0; e < experts; ++e) {
      if (keep_all) {
        std::fill(keep.begin(), keep.end(), uint8_t{1});
      } else {
        std::iota(order.begin(), order.end(), int64_t{0});
        // Both policies: a strict total order over rows, so the kept set is unique.
        auto before = [&](int64_t a, int64_t b) {
          const float va = policy == MoeDropPolicy::probs ? probs[a * experts + e] : routing_map[a * experts + e];
          const float vb = policy == MoeDropPolicy::probs ? probs[b * experts + e] : routing_map[b * experts + e];
          return va > vb || (va == vb && a < b);
        };
        std::nth_element(order.begin(), order.begin() + capacity, order.end(), before);
        std::fill(keep.begin(), keep.end(), uint8_t{0});
        for (int64_t j = 0; j < capacity; ++j) keep[static_cast<size_t>(order[static_cast<size_t>(j)])] = 1;
      }
      for (int64_t t = 0; t < rows; ++t) {
        uint8_t& mapped = routing_map[t * experts + e];
        mapped = pad_to_capacity ? keep[static_cast<size_t>(t)] : static_cast<uint8_t>(mapped && keep[static_cast<size_t>(t)]);
        if (!mapped) probs[t * experts + e] = 0.0f;
      }
    }
  }
}

void moe_router_tokens_per_expert(const uint8_t* routing_map, int64_t rows, int experts, float* counts) {
  std::vector<int64_t> totals(static_cast<size_t>(experts), 0);
  for (int64_t t = 0; t < rows; ++t) {
    for (int e = 0; e < experts; ++e) totals[static_cast<size_t>(e)] += routing_map[t * experts + e];
  }
  for (int e = 0; e < experts; ++e) counts[e] += static_cast<float>(totals[static_cast<size_t>(e)]);
}

void moe_router_expert_bias_update(float* bias, const float* counts, int experts, float rate) {
  float sum = 0.0f;
  for (int e = 0; e < experts; ++e) sum += counts[e];
  const float mean = sum / static_cast<float>(experts);
  for (int e = 0; e < experts; ++e) {
    const float offset = mean - counts[e];
    const float sign = offset > 0.0f ? 1.0f : (offset < 0.0f ? -1.0f : 0.0f);
    bias[e] += sign * rate;
  }
}

}  // namespace mt::kernels::cpu
