// oneDNN GEMM wrappers against a reference loop: every transpose combination, odd shapes,
// leading dimensions larger than the matrix, alpha/beta, and the bf16 path (operands rounded to
// bf16, fp32 accumulation) whether or not the CPU has AVX512-BF16.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/common/half.h"
#include "kernels/cpu/gemm.h"

using namespace mt::kernels;

namespace {

struct Case {
  bool ta, tb;
  int64_t m, n, k;
};

// C(m,n) = alpha * op(A) op(B) + beta * C, row-major with the given leading dimensions.
std::vector<double> reference(const Case& c, const std::vector<float>& a, int64_t lda, const std::vector<float>& b,
                              int64_t ldb, float alpha, float beta, const std::vector<float>& c0, int64_t ldc) {
  std::vector<double> out(c0.begin(), c0.end());
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double x = c.ta ? a[p * lda + i] : a[i * lda + p];
        const double y = c.tb ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
      }
      out[i * ldc + j] = alpha * sum + beta * c0[i * ldc + j];
    }
  return out;
}

}  // namespace

TEST(Gemm, Fp32AndBf16MatchTheReference) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (const Case& c : {Case{false, false, 7, 5, 3}, Case{false, true, 33, 17, 65}, Case{true, false, 64, 48, 1},
                        Case{true, true, 5, 129, 31}}) {
    const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
    const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
    const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = c.n + 2;
    std::vector<float> a(a_rows * lda), b(b_rows * ldb), c0(c.m * ldc);
    for (auto* v : {&a, &b, &c0})
      for (auto& x : *v) x = dist(rng);
    std::vector<float> out = c0;
    cpu::gemm_f32(c.ta, c.tb, c.m, c.n, c.k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, out.data(), ldc);
    const auto expected = reference(c, a, lda, b, ldb, 0.5f, 2.0f, c0, ldc);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) ASSERT_NEAR(out[i * ldc + j], expected[i * ldc + j], 1e-4) << i << "," << j;

    // bf16: the reference multiplies the bf16-rounded operands exactly.
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    std::vector<float> a_rounded(a.size()), b_rounded(b.size());
    for (size_t i = 0; i < a.size(); ++i) a_rounded[i] = bf16_bits_to_fp32(a16[i] = fp32_to_bf16_bits(a[i]));
    for (size_t i = 0; i < b.size(); ++i) b_rounded[i] = bf16_bits_to_fp32(b16[i] = fp32_to_bf16_bits(b[i]));
    std::vector<float> out16 = c0;
    cpu::gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a16.data(), lda, b16.data(), ldb, 1.0f, out16.data(), ldc);
    const auto expected16 = reference(c, a_rounded, lda, b_rounded, ldb, 1.0f, 1.0f, c0, ldc);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) ASSERT_NEAR(out16[i * ldc + j], expected16[i * ldc + j], 1e-4) << i << "," << j;
  }
}
