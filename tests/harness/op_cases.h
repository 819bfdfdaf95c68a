// The op harness's case list: every case of every entry of the backend op table, made once. The
// cases are written per family of entries, one file each (cases_<family>.cpp), and runners may
// group their runs by family. Tested in tests/unit/backend/test_op_harness.cpp.
#pragma once

#include <vector>

#include "op_harness.h"

namespace mt::harness {

// Every case, families in the order below.
const std::vector<OpCase>& op_cases();

// The family an entry's cases belong to ("memory", "gemm", "norms", ...).
const char* op_family(OpId op);

// Each family's cases (the files they are written in).
void add_memory_cases(std::vector<OpCase>& cases);         // cases_memory.cpp: memory, stream, copies, fill, zero
void add_conversion_cases(std::vector<OpCase>& cases);     // cases_memory.cpp: convert, round_through
void add_gemm_cases(std::vector<OpCase>& cases);           // cases_gemm.cpp: gemm, gemm_bias, gemm_bias_gelu
void add_norm_cases(std::vector<OpCase>& cases);           // cases_norms.cpp: layernorm, rmsnorm
void add_activation_cases(std::vector<OpCase>& cases);     // cases_activations.cpp: gelu, swiglu, rope
void add_attention_cases(std::vector<OpCase>& cases);      // cases_attention.cpp
void add_embedding_cases(std::vector<OpCase>& cases);      // cases_loss.cpp: embedding
void add_cross_entropy_cases(std::vector<OpCase>& cases);  // cases_loss.cpp: xent_*
void add_elementwise_cases(std::vector<OpCase>& cases);  // cases_update.cpp: add, scale, bias, sum_squares, all_finite
void add_dropout_cases(std::vector<OpCase>& cases);      // cases_update.cpp
void add_optimizer_cases(std::vector<OpCase>& cases);    // cases_update.cpp: adamw_update
void add_moe_router_cases(std::vector<OpCase>& cases);   // cases_moe_router.cpp: moe_router_*
void add_moe_expert_cases(std::vector<OpCase>& cases);   // cases_grouped_gemm.cpp: grouped GEMMs, moe_scale_rows*
void add_moe_permute_cases(std::vector<OpCase>& cases);  // cases_moe_permute.cpp: the dispatcher's moe_* entries
void add_fp8_cases(std::vector<OpCase>& cases);          // cases_fp8.cpp: fp8_quantize, fp8_transpose, gemm_fp8, fp8_update_scales

}  // namespace mt::harness
