// How the CUDA GEMM (gemm.cu) hands a row-major problem to column-major cuBLAS(Lt): row-major
// C (m x n, ldc) is column-major C^T (n x m), and C^T = op(B)^T op(A)^T, so cuBLAS's first
// operand is the B buffer (op = trans_b), its second the A buffer (op = trans_a). Each matrix is
// described as cuBLASLt's layouts describe them: the stored column-major matrix before its op.
// Plain C++ (no CUDA headers), so the mapping is checked on the host against a row-major loop:
// tests/unit/kernels/test_cuda_math.cpp.
#pragma once

#include <cstdint>

namespace mt::kernels::cuda {

// A stored column-major matrix: element (i, j) at data[i + j * ld], ld >= rows.
struct ColumnMajorMatrix {
  bool transposed;  // the op applied to it
  int64_t rows, cols, ld;
};

// D (rows x cols) = op(first) op(second), inner the shared dimension; D and C are `out`.
struct ColumnMajorGemm {
  int64_t rows, cols, inner;     // n, m, k
  ColumnMajorMatrix first;       // the B buffer
  ColumnMajorMatrix second;      // the A buffer
  ColumnMajorMatrix out;         // the C buffer
};

inline ColumnMajorGemm column_major_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda,
                                         int64_t ldb, int64_t ldc) {
  // op(first) is n x k: stored n x k untransposed, k x n transposed; op(second) is k x m.
  return ColumnMajorGemm{n,
                         m,
                         k,
                         ColumnMajorMatrix{trans_b, trans_b ? k : n, trans_b ? n : k, ldb},
                         ColumnMajorMatrix{trans_a, trans_a ? m : k, trans_a ? k : m, lda},
                         ColumnMajorMatrix{false, n, m, ldc}};
}

}  // namespace mt::kernels::cuda
