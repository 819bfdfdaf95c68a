// Grouped GEMMs on the CPU for a MoE layer's local experts: one call over G groups, each a GEMM
// of its own rows (ragged m: the forward and data-grad products, weights at a per-group stride) or
// of its own reduction depth (ragged k: the weight grads, one output per group at a stride).
// Row-major; A and B are f32 values or bf16 bits (uint16) as kernels/cpu/gemm.h takes them, C
// fp32 with fp32 accumulation. Counts are host int64, 0 allowed. Each output tile is one
// single-threaded GEMM of kernels/cpu/gemm.h over the group's whole depth, the tiles cut by the
// shapes alone, so results do not depend on the thread count (gemm_f32 on a whole group may split
// the depth over threads: the two agree within rounding, not bit for bit). Tested by the op harness
// (tests/harness/cases_grouped_gemm.cpp, run by tests/unit/backend/test_op_harness.cpp).
#pragma once

#include <cstdint>

namespace mt::kernels::cpu {

// Ragged rows: group g's rows start at r_g = group_rows[0] + ... + group_rows[g - 1];
// C_g (m_g, n) = alpha A_g op(B_g) + beta C_g, A_g = a + r_g lda (m_g, k), B_g = b + g b_stride
// ((n, k) with trans_b, else (k, n); ldb), C_g = c + r_g ldc. A group of 0 rows does nothing.
void grouped_gemm_f32(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, int64_t b_stride, float beta,
                      float* c, int64_t ldc);
void grouped_gemm_bf16(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                       const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, int64_t b_stride, float beta,
                       float* c, int64_t ldc);

// Ragged depth: with r_g as above over group_depths, C_g (m, n) = alpha A_g^T B_g + beta C_g,
// A_g = a + r_g lda (k_g, m), B_g = b + r_g ldb (k_g, n), C_g = c + g c_stride (ldc). A group of
// depth 0 sets C_g = beta C_g (beta = 0 writes zeros whatever C held, beta = 1 leaves C_g).
void grouped_gemm_ragged_k_f32(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                               int64_t ldc, int64_t c_stride);
void grouped_gemm_ragged_k_bf16(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                                const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                                int64_t ldc, int64_t c_stride);

}  // namespace mt::kernels::cpu
