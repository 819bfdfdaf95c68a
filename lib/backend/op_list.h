// The entries of the backend op table (backend/ops.h) as one list: an X-macro names every entry
// of backend::Ops in declaration order, so the identifiers (OpId), their names and the check that
// the list and the struct agree come from one place (an entry added to Ops without its line here
// stops lib/backend/op_list.cpp from compiling). Backends say per entry and element type what they
// run (Ops::supports); the op harness (tests/harness/) runs its cases per entry and prints which
// entries each backend fills. Tested in tests/unit/backend/test_op_harness.cpp.
#pragma once

#include <optional>
#include <string_view>

#define MT_BACKEND_OPS(X)          \
  X(allocate)                      \
  X(release)                       \
  X(default_stream)                \
  X(synchronize)                   \
  X(launch_host_function)          \
  X(create_event)                  \
  X(destroy_event)                 \
  X(record_event)                  \
  X(synchronize_event)             \
  X(elapsed_seconds)               \
  X(copy)                          \
  X(copy_2d)                       \
  X(fill)                          \
  X(zero)                          \
  X(convert)                       \
  X(round_through)                 \
  X(gemm_operand_type)             \
  X(gemm)                          \
  X(gemm_bias)                     \
  X(gemm_bias_gelu)                \
  X(layernorm_forward)             \
  X(layernorm_backward)            \
  X(rmsnorm_forward)               \
  X(rmsnorm_backward)              \
  X(gelu_forward)                  \
  X(gelu_backward)                 \
  X(gelu_erf_forward)              \
  X(gelu_erf_backward)             \
  X(tanh_forward)                  \
  X(tanh_backward)                 \
  X(swiglu_forward)                \
  X(swiglu_backward)               \
  X(rope_forward)                  \
  X(rope_backward)                 \
  X(rope_yarn_forward)             \
  X(rope_yarn_backward)            \
  X(attention_forward)             \
  X(attention_backward)            \
  X(attention_merge)               \
  X(embedding_forward)             \
  X(embedding_backward)            \
  X(xent_row_max)                  \
  X(xent_row_sumexp)               \
  X(xent_target_logit)             \
  X(xent_backward)                 \
  X(xent_loss_sums)                \
  X(add_inplace)                   \
  X(scale_inplace)                 \
  X(bias_add)                      \
  X(bias_backward)                 \
  X(sum_squares)                   \
  X(all_finite)                    \
  X(dropout_forward)               \
  X(dropout_backward)              \
  X(adamw_update)                  \
  X(moe_router_topk)               \
  X(moe_router_topk_backward)      \
  X(moe_router_aux_sums)           \
  X(moe_router_aux_backward)       \
  X(moe_router_z_loss_sum)         \
  X(moe_router_z_loss_backward)    \
  X(moe_router_capacity_drop)      \
  X(moe_router_tokens_per_expert)  \
  X(moe_router_expert_bias_update) \
  X(grouped_gemm)                  \
  X(grouped_gemm_ragged_k)         \
  X(moe_scale_rows)                \
  X(moe_scale_rows_backward)       \
  /* MoE token dispatcher */       \
  X(moe_expert_counts)             \
  X(moe_route_index)               \
  X(moe_permute_rows)              \
  X(moe_unpermute_rows)            \
  X(moe_unroute_probs)             \
  X(moe_sort_chunks)               \
  /* FP8 (issue 23) */             \
  X(fp8_quantize)                  \
  X(fp8_transpose)                 \
  X(gemm_fp8)                      \
  X(fp8_update_scales)

namespace mt::backend {

enum class OpId : int {
#define MT_BACKEND_OP_ID(entry) entry,
  MT_BACKEND_OPS(MT_BACKEND_OP_ID)
#undef MT_BACKEND_OP_ID
};

#define MT_BACKEND_OP_COUNT(entry) +1
inline constexpr int kOpCount = 0 MT_BACKEND_OPS(MT_BACKEND_OP_COUNT);
#undef MT_BACKEND_OP_COUNT

// The entry's name in Ops ("layernorm_backward").
const char* op_name(OpId op);
// The OpId of an entry name; nullopt for a name that is not an entry.
std::optional<OpId> op_from_name(std::string_view name);
// Whether the entry's contract makes the host wait for queued stream work: synchronize and
// synchronize_event (the host asks for them), release (as cudaFree). Every other entry, the
// reductions included, only queues work (the op harness's coverage table prints this).
bool op_waits_for_stream(OpId op);

}  // namespace mt::backend
