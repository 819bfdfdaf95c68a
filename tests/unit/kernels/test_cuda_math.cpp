// The per-element arithmetic the CUDA elementwise kernels run (kernels/common/elementwise_math.h),
// checked on the host, bit for bit, against the CPU kernels (kernels/cpu/impl/elementwise.inc) at
// the x86-64-v2 level, which like this file is built without FMA contraction: GELU, SwiGLU, RoPE
// and YaRN, keyed dropout (the same elements dropped, the same scale) and AdamW with its bf16 copy.
// Each loop below walks the elements the way the CUDA kernel's threads do (kernels/cuda/elementwise.cu).
// Also the GEMM's row-major to column-major mapping (kernels/cuda/gemm_layout.h), run through a
// column-major BLAS loop. No GPU needed; the GPU itself is checked by the op harness
// (tests/gpu/test_cuda_op_harness.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/elementwise_math.h"
#include "kernels/common/yarn_rope.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gemm_layout.h"

using namespace mt::kernels;

namespace {

const cpu::CpuOps& reference_ops() { return cpu::cpu_ops(CpuIsa::x86_64_v2); }

std::vector<float> random_values(size_t n, float scale, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> values(n);
  for (float& v : values) v = uniform(generator);
  return values;
}

// Equal bit patterns, element by element; names the first element that differs.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], sizeof a);
    std::memcpy(&b, &want[i], sizeof b);
    ASSERT_EQ(a, b) << what << ": element " << i << " is " << got[i] << ", the CPU kernel gives " << want[i];
  }
}

// Inputs across the range where exp, sigmoid and GELU change regime, plus the clamps of exp.
std::vector<float> activation_inputs() {
  std::vector<float> x = random_values(1000, 12.0f, 1);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 88.5f, -88.5f, 89.0f, -89.0f, 100.0f, -100.0f,
                  1e6f, -1e6f})
    x.push_back(v);
  return x;
}

TEST(CudaMath, CephesExpMatchesCpuExp) {
  // xent_row_sumexp of a one-column row with row_max 0 is the CPU's vexp(x), exactly.
  std::vector<float> x = activation_inputs();
  x.push_back(-std::numeric_limits<float>::infinity());
  std::vector<float> want(x.size()), got(x.size());
  const float row_max = 0.0f;
  for (size_t i = 0; i < x.size(); ++i) {
    reference_ops().xent_row_sumexp(&x[i], 1, 1, 1, &row_max, &want[i]);
    got[i] = cephes_exp(x[i]);
  }
  expect_same_bits(got, want, "exp");
}

TEST(CudaMath, GeluMatchesCpuBitForBit) {
  const std::vector<float> x = activation_inputs();
  const std::vector<float> dy = random_values(x.size(), 2.0f, 2);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> want_y(x.size()), want_dx(x.size()), got_y(x.size()), got_dx(x.size());
  reference_ops().gelu_forward(x.data(), want_y.data(), n);
  reference_ops().gelu_backward(dy.data(), x.data(), want_dx.data(), n);
  for (size_t i = 0; i < x.size(); ++i) {
    got_y[i] = gelu_value(x[i]);
    got_dx[i] = gelu_gradient(dy[i], x[i]);
  }
  expect_same_bits(got_y, want_y, "gelu_forward");
  expect_same_bits(got_dx, want_dx, "gelu_backward");
}

TEST(CudaMath, SwigluMatchesCpuBitForBit) {
  const int64_t rows = 5;
  const int ffn = 37;
  const std::vector<float> gate_up = random_values(rows * 2 * ffn, 10.0f, 3);
  const std::vector<float> dy = random_values(rows * ffn, 2.0f, 4);
  std::vector<float> want_y(rows * ffn), want_d(rows * 2 * ffn), got_y(rows * ffn), got_d(rows * 2 * ffn);
  reference_ops().swiglu_forward(gate_up.data(), want_y.data(), rows, ffn);
  reference_ops().swiglu_backward(dy.data(), gate_up.data(), want_d.data(), rows, ffn);
  for (int64_t i = 0; i < rows * ffn; ++i) {  // one CUDA thread per (row, column)
    const int64_t r = i / ffn, c = i % ffn;
    const float* gate = gate_up.data() + r * 2 * ffn;
    float* d_gate = got_d.data() + r * 2 * ffn;
    got_y[i] = swiglu_value(gate[c], gate[ffn + c]);
    swiglu_gradient(dy[i], gate[c], gate[ffn + c], d_gate[c], d_gate[ffn + c]);
  }
  expect_same_bits(got_y, want_y, "swiglu_forward");
  expect_same_bits(got_d, want_d, "swiglu_backward");
}

// RoPE as the CUDA kernel runs it: inv_freq from the host (`inv_freq`), one thread per (row, head,
// pair), cos and sin times `concentration` (YaRN's; 1 for RoPE).
std::vector<float> rope_as_cuda(std::vector<float> x, int64_t rows, int64_t row_stride, int heads, int head_dim,
                                const std::vector<int32_t>& positions, const std::vector<float>& inv_freq,
                                float concentration, bool transpose) {
  const int half = head_dim / 2;
  for (int64_t index = 0; index < rows * heads * half; ++index) {
    const int i = static_cast<int>(index % half);
    const int h = static_cast<int>(index / half % heads);
    const int64_t r = index / half / heads;
    float* first = x.data() + r * row_stride + static_cast<int64_t>(h) * head_dim;
    float cos_value, sin_value;
    rope_cos_sin_scaled(positions[r], inv_freq[i], concentration, cos_value, sin_value);
    rope_rotate(first[i], first[half + i], cos_value, sin_value, transpose);
  }
  return x;
}

struct RopeShape {
  int64_t rows;
  int heads, head_dim;
  int64_t row_stride;
  float base;
};

std::vector<int32_t> rope_test_positions(int64_t rows) {
  std::vector<int32_t> positions(rows);
  for (int64_t r = 0; r < rows; ++r) positions[r] = static_cast<int32_t>(r * 9973 % 70000);
  return positions;
}

TEST(CudaMath, RopeMatchesCpuBitForBit) {
  // Odd head_dim leaves its last element alone; positions past the CPU's cos/sin table included.
  for (const RopeShape s :
       {RopeShape{7, 3, 6, 20, 10000.0f}, RopeShape{4, 2, 9, 19, 500000.0f}, RopeShape{3, 1, 128, 130, 10000.0f}}) {
    const std::vector<int32_t> positions = rope_test_positions(s.rows);
    const std::vector<float> x = random_values(s.rows * s.row_stride, 3.0f, 5);
    std::vector<float> inv_freq(s.head_dim / 2);
    for (int i = 0; i < s.head_dim / 2; ++i) inv_freq[i] = rope_inv_freq(s.base, i, s.head_dim);
    for (const bool transpose : {false, true}) {
      std::vector<float> want = x;
      const auto rope = transpose ? reference_ops().rope_backward : reference_ops().rope_forward;
      rope(want.data(), s.rows, s.row_stride, s.heads, s.head_dim, positions.data(), s.base);
      expect_same_bits(
          rope_as_cuda(x, s.rows, s.row_stride, s.heads, s.head_dim, positions, inv_freq, 1.0f, transpose), want,
          std::string(transpose ? "rope_backward" : "rope_forward") + " head_dim " + std::to_string(s.head_dim));
    }
  }
}

// YaRN (kernels/cuda/elementwise.cu's rope_yarn entries): yarn_inv_freq's frequencies, the
// concentration factor on cos and sin, against the CPU's rope_yarn entries: DeepSeek-V3's settings
// on a 64-dim rotary head, and a narrow odd head with a concentration other than 1 and positions
// far past the original context.
TEST(CudaMath, YarnMatchesCpuBitForBit) {
  YarnRope deepseek;
  deepseek.scaling_factor = 40.0;
  YarnRope narrow;
  narrow.scaling_factor = 4.0;
  narrow.original_max_position_embeddings = 64;
  narrow.concentration = yarn_concentration(4.0, 1.0, 0.707);
  ASSERT_NE(narrow.concentration, 1.0f);
  const std::pair<RopeShape, YarnRope> cases[] = {{RopeShape{9, 3, 64, 200, 10000.0f}, deepseek},
                                                  {RopeShape{7, 2, 7, 16, 10000.0f}, narrow}};
  for (const auto& [s, yarn] : cases) {
    const std::vector<int32_t> positions = rope_test_positions(s.rows);
    const std::vector<float> x = random_values(s.rows * s.row_stride, 3.0f, 6);
    std::vector<float> inv_freq(s.head_dim / 2);
    yarn_inv_freq(yarn, s.head_dim, inv_freq.data());
    for (const bool transpose : {false, true}) {
      std::vector<float> want = x;
      const auto rope = transpose ? reference_ops().rope_yarn_backward : reference_ops().rope_yarn_forward;
      rope(want.data(), s.rows, s.row_stride, s.heads, s.head_dim, positions.data(), yarn);
      expect_same_bits(
          rope_as_cuda(x, s.rows, s.row_stride, s.heads, s.head_dim, positions, inv_freq, yarn.concentration,
                       transpose),
          want, std::string(transpose ? "rope_yarn_backward" : "rope_yarn_forward") + " head_dim " +
                    std::to_string(s.head_dim));
    }
  }
}

TEST(CudaMath, DropoutBlockIsKeyedUniform) {
  const DropoutKey key{0x1234567890abcdefull, stream_id("hidden_dropout") ^ 7, 41, 0.25f};
  const int64_t row = (int64_t{5} << 32) + 77;
  for (int64_t block = 0; block < 6; ++block) {
    const DropoutBlock uniforms = dropout_block(key, row, block);
    for (int64_t col = 4 * block; col < 4 * block + 4; ++col)
      EXPECT_EQ(uniforms.uniform[col & 3], keyed_uniform(key.seed, key.stream, key.iteration, row, col))
          << "column " << col;
  }
}

TEST(CudaMath, DropoutDropsTheCpuElements) {
  // col0 not a multiple of 4 and cols not either: partial Philox blocks at both ends of a row.
  const int64_t rows = 6;
  const int cols = 37;
  const DropoutKey key{20261127, stream_id("hidden_dropout") ^ 3, 1000, 0.3f};
  const std::vector<int64_t> row_ids = {0, 1, 4097, (int64_t{3} << 32) + 5, 123456789, 2};
  const std::vector<float> x = random_values(rows * cols, 4.0f, 6);
  for (const int64_t col0 : {int64_t{0}, int64_t{6}, int64_t{4099}}) {
    std::vector<float> want = x;
    reference_ops().dropout_forward(want.data(), rows, cols, row_ids.data(), col0, key);
    std::vector<float> got = x;
    const float keep_scale = 1.0f / (1.0f - key.p);
    const int64_t blocks_per_row = dropout_blocks_per_row(col0, cols);
    for (int64_t index = 0; index < rows * blocks_per_row; ++index) {  // one CUDA thread per (row, block)
      const int64_t r = index / blocks_per_row;
      dropout_row_block(got.data() + r * cols, cols, col0, row_ids[r], (col0 >> 2) + index % blocks_per_row, key,
                        keep_scale);
    }
    expect_same_bits(got, want, "dropout col0 " + std::to_string(col0));
    int dropped = 0;
    for (float v : got) dropped += v == 0.0f;
    EXPECT_GT(dropped, rows * cols / 6) << "col0 " << col0;
    EXPECT_LT(dropped, rows * cols / 2) << "col0 " << col0;
  }
}

TEST(CudaMath, AdamWMatchesCpuBitForBit) {
  const int64_t n = 777;
  AdamWParams params;
  params.lr = 3e-4f;
  params.weight_decay = 0.1f;
  params.beta2 = 0.95f;
  params.bias_correction1 = 1.0f - std::pow(0.9f, 3.0f);
  params.bias_correction2 = 1.0f - std::pow(0.95f, 3.0f);
  params.grad_scale = 0.37f;
  const std::vector<float> param = random_values(n, 1.0f, 7);
  const std::vector<float> grad = random_values(n, 5.0f, 8);
  const std::vector<float> exp_avg = random_values(n, 0.1f, 9);
  std::vector<float> exp_avg_sq = random_values(n, 0.01f, 10);
  for (float& v : exp_avg_sq) v = std::fabs(v);

  std::vector<float> want_p = param, want_m = exp_avg, want_v = exp_avg_sq;
  std::vector<uint16_t> want_bf16(n);
  reference_ops().adamw_update(want_p.data(), want_bf16.data(), grad.data(), want_m.data(), want_v.data(), n, params);

  std::vector<float> got_p = param, got_m = exp_avg, got_v = exp_avg_sq;
  std::vector<uint16_t> got_bf16(n);
  const AdamWConstants constants = adamw_constants(params);
  for (int64_t i = 0; i < n; ++i) {
    adamw_element(constants, got_p[i], grad[i], got_m[i], got_v[i]);
    got_bf16[i] = fp32_to_bf16_bits(got_p[i]);
  }
  expect_same_bits(got_p, want_p, "adamw param");
  expect_same_bits(got_m, want_m, "adamw exp_avg");
  expect_same_bits(got_v, want_v, "adamw exp_avg_sq");
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got_bf16[i], want_bf16[i]) << "adamw param_bf16 element " << i;
}

// Column-major BLAS as cuBLAS defines it, reading each matrix through its layout:
// D = alpha op(first) op(second) + beta D, D (rows x cols).
void column_major_reference(const mt::kernels::cuda::ColumnMajorGemm& g, float alpha, const std::vector<float>& first,
                            const std::vector<float>& second, float beta, std::vector<float>& out) {
  const auto element = [](const mt::kernels::cuda::ColumnMajorMatrix& layout, const std::vector<float>& data,
                          int64_t i, int64_t j) {  // element (i, j) of op(matrix)
    return layout.transposed ? data[j + i * layout.ld] : data[i + j * layout.ld];
  };
  for (int64_t i = 0; i < g.rows; ++i)
    for (int64_t j = 0; j < g.cols; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < g.inner; ++p) sum += element(g.first, first, i, p) * element(g.second, second, p, j);
      float& d = out[i + j * g.out.ld];
      d = static_cast<float>(alpha * sum + beta * d);
    }
}

TEST(CudaGemmLayout, ColumnMajorMappingIsTheRowMajorGemm) {
  struct Shape {
    bool trans_a, trans_b;
    int64_t m, n, k, extra_lda, extra_ldb, extra_ldc;
  };
  for (const Shape s : {Shape{false, false, 7, 5, 3, 3, 1, 2}, Shape{false, true, 4, 9, 6, 0, 2, 1},
                        Shape{true, false, 6, 3, 1, 1, 0, 3}, Shape{true, true, 5, 8, 7, 2, 3, 0},
                        Shape{false, false, 1, 1, 1, 0, 0, 0}}) {
    const int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
    const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
    const int64_t lda = a_cols + s.extra_lda, ldb = b_cols + s.extra_ldb, ldc = s.n + s.extra_ldc;
    // Small integers: every product and sum is exact, so both orders give the same floats.
    std::vector<float> a(a_rows * lda), b(b_rows * ldb), c(s.m * ldc);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i * 7 % 11) - 5);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i * 5 % 9) - 4);
    for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
    const float alpha = 2.0f, beta = -1.0f;
    std::vector<float> want = c;  // row-major: C = alpha op(A) op(B) + beta C, columns past n untouched
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < s.k; ++p)
          sum += (s.trans_a ? a[p * lda + i] : a[i * lda + p]) * (s.trans_b ? b[j * ldb + p] : b[p * ldb + j]);
        want[i * ldc + j] = static_cast<float>(alpha * sum + beta * c[i * ldc + j]);
      }
    const auto g = mt::kernels::cuda::column_major_gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, lda, ldb, ldc);
    const std::string name = std::string(s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N") + " m=" +
                             std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
    for (const auto& layout : {g.first, g.second, g.out}) ASSERT_GE(layout.ld, layout.rows) << name;  // cuBLAS's rule
    ASSERT_EQ(g.first.transposed ? g.first.cols : g.first.rows, g.rows) << name;
    ASSERT_EQ(g.second.transposed ? g.second.rows : g.second.cols, g.cols) << name;
    ASSERT_EQ(g.first.transposed ? g.first.rows : g.first.cols, g.inner) << name;
    std::vector<float> got = c;
    column_major_reference(g, alpha, b, a, beta, got);
    expect_same_bits(got, want, "gemm " + name);
  }
}

}  // namespace
