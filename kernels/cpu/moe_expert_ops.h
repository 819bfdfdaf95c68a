// Row scaling for a MoE layer's experts: the routing probs multiply each row of the experts'
// activations (after swiglu, before fc2, as Megatron's experts.py), and the backward of that.
// Plain C++ with OpenMP over rows; each row is computed by one thread in column order, so results
// do not depend on the thread count. Tested by the op harness (tests/harness/cases_grouped_gemm.cpp,
// run by tests/unit/backend/test_op_harness.cpp).
#pragma once

#include <cstdint>

namespace mt::kernels::cpu {

// y (rows, cols) = scale[r] x (rows, cols); y may be x.
void moe_scale_rows(const float* x, const float* scale, float* y, int64_t rows, int cols);
// d_scale[r] = sum_c dy[r, c] x[r, c] (written; summed in double in column order, then rounded),
// dx[r, c] = scale[r] dy[r, c] (written; dx may be dy).
void moe_scale_rows_backward(const float* dy, const float* x, const float* scale, float* dx, float* d_scale,
                             int64_t rows, int cols);

}  // namespace mt::kernels::cpu
