// The case list (see op_cases.h) and the family of each entry.
#include "op_cases.h"

namespace mt::harness {

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> list;
    add_memory_cases(list);
    add_conversion_cases(list);
    add_gemm_cases(list);
    add_norm_cases(list);
    add_activation_cases(list);
    add_attention_cases(list);
    add_embedding_cases(list);
    add_cross_entropy_cases(list);
    add_elementwise_cases(list);
    add_dropout_cases(list);
    add_optimizer_cases(list);
    add_moe_router_cases(list);
    add_moe_expert_cases(list);
    add_moe_permute_cases(list);
    add_fp8_cases(list);
    return list;
  }();
  return cases;
}

const char* op_family(OpId op) {
  switch (op) {
    case OpId::allocate:
    case OpId::release:
    case OpId::default_stream:
    case OpId::synchronize:
    case OpId::launch_host_function:
    case OpId::create_event:
    case OpId::destroy_event:
    case OpId::record_event:
    case OpId::synchronize_event:
    case OpId::elapsed_seconds:
    case OpId::copy:
    case OpId::copy_2d:
    case OpId::fill:
    case OpId::zero: return "memory";
    case OpId::convert:
    case OpId::round_through: return "conversions";
    case OpId::gemm_operand_type:
    case OpId::gemm:
    case OpId::gemm_bias:
    case OpId::gemm_bias_gelu: return "gemm";
    case OpId::layernorm_forward:
    case OpId::layernorm_backward:
    case OpId::rmsnorm_forward:
    case OpId::rmsnorm_backward: return "norms";
    case OpId::gelu_forward:
    case OpId::gelu_backward:
    case OpId::gelu_erf_forward:
    case OpId::gelu_erf_backward:
    case OpId::tanh_forward:
    case OpId::tanh_backward:
    case OpId::swiglu_forward:
    case OpId::swiglu_backward:
    case OpId::rope_forward:
    case OpId::rope_backward:
    case OpId::rope_yarn_forward:
    case OpId::rope_yarn_backward: return "activations";
    case OpId::attention_forward:
    case OpId::attention_backward:
    case OpId::attention_merge: return "attention";
    case OpId::embedding_forward:
    case OpId::embedding_backward: return "embedding";
    case OpId::xent_row_max:
    case OpId::xent_row_sumexp:
    case OpId::xent_target_logit:
    case OpId::xent_backward:
    case OpId::xent_loss_sums: return "cross_entropy";
    case OpId::add_inplace:
    case OpId::scale_inplace:
    case OpId::bias_add:
    case OpId::bias_backward:
    case OpId::sum_squares:
    case OpId::all_finite: return "elementwise";
    case OpId::dropout_forward:
    case OpId::dropout_backward: return "dropout";
    case OpId::adamw_update: return "optimizer";
    case OpId::moe_router_topk:
    case OpId::moe_router_topk_backward:
    case OpId::moe_router_aux_sums:
    case OpId::moe_router_aux_backward:
    case OpId::moe_router_z_loss_sum:
    case OpId::moe_router_z_loss_backward:
    case OpId::moe_router_capacity_drop:
    case OpId::moe_router_tokens_per_expert:
    case OpId::moe_router_expert_bias_update: return "moe_router";
    case OpId::grouped_gemm:
    case OpId::grouped_gemm_ragged_k:
    case OpId::moe_scale_rows:
    case OpId::moe_scale_rows_backward: return "moe_experts";
    case OpId::moe_expert_counts:
    case OpId::moe_route_index:
    case OpId::moe_permute_rows:
    case OpId::moe_unpermute_rows:
    case OpId::moe_unroute_probs:
    case OpId::moe_sort_chunks: return "moe_permute";
    case OpId::fp8_quantize:
    case OpId::fp8_transpose:
    case OpId::gemm_fp8:
    case OpId::fp8_update_scales: return "fp8";
  }
  return "?";
}

}  // namespace mt::harness
