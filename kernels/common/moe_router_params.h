// Parameter struct of the MoE router's top-k entries (backend::Ops::moe_router_topk and its
// backward), shared by every backend's kernels and the backend op table: plain values only. The
// math is Megatron-Core's topk_routing_with_score_function and group_limited_topk
// (megatron/core/transformer/moe/moe_utils.py); the contract is in kernels/cpu/moe_router.h.
// Tested through the op harness (tests/harness/cases_moe_router.cpp).
#pragma once

#include <cstdint>

namespace mt::kernels {

// --moe-router-score-function.
enum class MoeScoreFunction : int32_t { softmax = 0, sigmoid = 1 };
// --moe-token-drop-policy.
enum class MoeDropPolicy : int32_t { probs = 0, position = 1 };

struct MoeTopkParams {
  int32_t num_experts = 0;  // E: columns of the logits
  int32_t topk = 1;         // k, 1 <= k <= E
  MoeScoreFunction score_function = MoeScoreFunction::softmax;
  bool pre_softmax = false;  // softmax only: softmax over E, then top-k, no renormalising
  // Group-limited top-k: group_topk > 0 keeps the group_topk best of num_groups contiguous groups
  // of E / num_groups experts per row (group score = sum of its top k / group_topk scores); 0 =
  // plain top-k over all E.
  int32_t num_groups = 0;
  int32_t group_topk = 0;
  float scaling_factor = 1.0f;  // --moe-router-topk-scaling-factor (1 when unset)
};

}  // namespace mt::kernels
