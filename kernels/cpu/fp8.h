// The CPU twins of the op table's FP8 entries (lib/backend/ops.h, family "fp8"): quantize with
// amax, byte transpose, the scaled FP8 GEMM (codes decoded to fp32, then the fp32 GEMM of
// kernels/cpu/gemm.h) and TE's delayed-scaling update. The arithmetic of one element and of one
// tensor's update is kernels/common/fp8.h, shared with the CUDA kernels, so the CPU emulates what
// an sm_90 GPU computes up to the GEMM's summation order. Results are the same at any thread
// count. Tested in tests/harness/cases_fp8.cpp (against double loops) and
// tests/unit/kernels/test_fp8.cpp.
#pragma once

#include <cstdint>

#include "kernels/common/fp8.h"

namespace mt::kernels::cpu {

// out[i] = fp32_to_fp8(x[i] * *scale, type); *amax = max(*amax, max_i |x[i]|), NaN-propagating.
void fp8_quantize(const float* x, int64_t n, const float* scale, Fp8Type type, uint8_t* out, float* amax);

// out (cols, rows) = in (rows, cols)^T.
void fp8_transpose(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out);

// C (m, n) = alpha (*a_scale_inv) (*b_scale_inv) A (m, k) . B (n, k)^T + beta C; throws
// std::invalid_argument for k, lda, ldb not multiples of 16 and for e5m2 x e5m2 (see ops.h).
void gemm_fp8(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, Fp8Type a_type, const float* a_scale_inv,
              int64_t lda, const uint8_t* b, Fp8Type b_type, const float* b_scale_inv, int64_t ldb, float beta,
              float* c, int64_t ldc);

// fp8_update_scale (kernels/common/fp8.h) on each of `tensors` tensors; history rows history_len apart.
void fp8_update_scales(float* amax, float* amax_history, float* scale, float* scale_inv, int64_t tensors,
                       const Fp8ScalingParams& params);

}  // namespace mt::kernels::cpu
