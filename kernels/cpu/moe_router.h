// CPU kernels of the MoE router (Megatron-Core's router math, megatron/core/transformer/moe/
// moe_utils.py): scores and top-k with their backward, the aux-loss sums and backward, the
// z-loss, capacity dropping, token counts and the expert-bias update. Plain C++ (no per-ISA
// variants: E is small), OpenMP over rows where it pays; every result is independent of the
// thread count (per-row work, or sums over rows in row order in double). The backend op table
// (lib/backend/ops.h, entries moe_router_*) calls them with the stream dropped; the Router of
// lib/model/moe/router.h composes them in Megatron's order.
//
// Conventions: logits, probs, dprobs, dlogits are (rows, E) fp32 row-major; routing maps (rows, E)
// uint8 0/1. Tie-breaking in every top-k: a higher value first, equal values by lower index
// (torch.topk leaves the order of ties unspecified and on the CPU prefers higher indices: see
// lib/model/moe/router.h); NaN logits are not supported.
// Tested in tests/harness/cases_moe_router.cpp against double-precision reference loops.
#pragma once

#include <cstdint>

#include "kernels/common/moe_router_params.h"

namespace mt::kernels::cpu {

// Scores and top-k of every row (topk_routing_with_score_function; see MoeTopkParams):
//   softmax, post-softmax: top-k on the logits (group-limited on the logits), p = softmax over
//     the k chosen logits;
//   softmax, pre_softmax: s = softmax over E, top-k on s (group-limited on s), p = the chosen s;
//   sigmoid: s = sigmoid(logit); choosing score s + expert_bias (bias nullable: s alone), top-k
//     on it (group-limited on it), p = the chosen s, / (sum of the k chosen s + 1e-20) when k > 1;
//   then p *= scaling_factor.
// Group-limited: group g = experts [g E/G, (g+1) E/G); its score = sum of its top (k / group_topk)
// choosing scores; the group_topk best groups are kept (ties: lower group), the others' experts
// are masked to -inf before the top-k. Writes topk_indices (rows, k) in descending choosing score,
// probs (rows, E) (p at the chosen experts, 0 elsewhere) and routing_map (rows, E).
void moe_router_topk(const float* logits, const float* expert_bias, int64_t rows, const MoeTopkParams& params,
                     int32_t* topk_indices, float* probs, uint8_t* routing_map);

// Gradient of moe_router_topk's probs: dlogits (rows, E) WRITTEN, from dprobs read at each row's k
// chosen experts (topk_indices) where routing_map (nullable: all kept) is 1 (dropped entries get
// no gradient); unchosen experts get 0 (post-softmax, sigmoid) or the softmax's coupling
// (pre_softmax). The expert bias and the group mask carry no gradient.
void moe_router_topk_backward(const float* logits, const int32_t* topk_indices, const float* dprobs,
                              const uint8_t* routing_map, int64_t rows, const MoeTopkParams& params, float* dlogits);

// The aux loss's scores and counts (compute_routing_scores_for_aux_loss), summed per row group:
// P = softmax over E (softmax) or sigmoid / (sum_E sigmoid + 1e-20) (sigmoid); the aux map = a
// plain top-k of P. Row t is in group row_ids[t] / sequence_length (row_ids null: every row in
// group 0); groups outside [0, groups) throw std::invalid_argument (from the stream's next
// synchronize on an asynchronous table). Writes counts (groups, E)
// (rows of the group whose aux map picks the expert) and prob_sums (groups, E) (sum of P over the
// group's rows, in row order in double, rounded once).
void moe_router_aux_sums(const float* logits, int64_t rows, int experts, int topk, MoeScoreFunction score_function,
                         const int64_t* row_ids, int64_t sequence_length, int64_t groups, float* counts,
                         float* prob_sums);

// dlogits (rows, E) ACCUMULATED with scale * d/dlogits sum_t sum_i P_ti weights[g(t), i] (P and
// g(t) as moe_router_aux_sums; weights (groups, E)).
void moe_router_aux_backward(const float* logits, int64_t rows, int experts, MoeScoreFunction score_function,
                             const int64_t* row_ids, int64_t sequence_length, int64_t groups, const float* weights,
                             float scale, float* dlogits);

// sum over rows of logsumexp(logits_t)^2, accumulated in double in row order (z_loss_func's sum).
double moe_router_z_loss_sum(const float* logits, int64_t rows, int experts);

// dlogits ACCUMULATED with scale * 2 logsumexp(logits_t) softmax(logits_t) (the gradient of scale
// * logsumexp(logits_t)^2 for every row).
void moe_router_z_loss_backward(const float* logits, int64_t rows, int experts, float scale, float* dlogits);

// Capacity dropping (apply_router_token_dropping) in place on probs and routing_map (rows, E):
// capacity >= rows keeps every row of every expert (the keep mask is all ones); else each expert
// (column) keeps `capacity` rows: policy probs the highest probs (ties: lower row), policy position
// the routed rows by ascending row (map value 1 before 0, then lower row), so in both the
// unrouted rows (prob 0, map 0) come last. pad_to_capacity: map := keep mask; else map := map AND
// keep mask; probs := probs * map.
void moe_router_capacity_drop(float* probs, uint8_t* routing_map, int64_t rows, int experts, int64_t capacity,
                              MoeDropPolicy policy, bool pad_to_capacity);

// counts (E) ACCUMULATED with the column sums of routing_map (rows, E).
void moe_router_tokens_per_expert(const uint8_t* routing_map, int64_t rows, int experts, float* counts);

// get_updated_expert_bias on summed counts (E): bias[i] += rate * sign(mean - counts[i]),
// mean = (sum of counts in fp32, in index order) / E in fp32, sign(0) = 0.
void moe_router_expert_bias_update(float* bias, const float* counts, int experts, float rate);

}  // namespace mt::kernels::cpu
