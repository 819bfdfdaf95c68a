// The host side of the CUDA norm kernels' shared arithmetic (kernels/common/norm_math.h): outputs
// from the CPU kernel's own row statistics give the CPU kernel's bits, input grads of one-column
// rows (where the row sums are single terms) give its bits, and the row-chunk plan covers every row
// once within its limits. Compared with the baseline CPU level, whose loops have no fused
// multiply-add, like this file's.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/norm_math.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace {

using mt::kernels::CpuIsa;

const mt::kernels::cpu::CpuOps& baseline_ops() { return mt::kernels::cpu::cpu_ops(CpuIsa::x86_64_v2); }

std::vector<float> random_values(size_t n, uint32_t seed, float low = -2.0f, float high = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(low, high);
  std::vector<float> values(n);
  for (float& v : values) v = value(rng);
  return values;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << what << " element " << i << ": " << got[i]
                                                                << " vs the CPU kernel's " << want[i];
  }
}

TEST(NormMath, LayerNormOutputsFromTheRowStatisticsGiveTheCpuKernelsBits) {
  const int64_t rows = 5;
  const int cols = 67;
  const auto x = random_values(rows * cols, 1, -3.0f, 5.0f), weight = random_values(cols, 2);
  const auto bias = random_values(cols, 3);
  for (const bool with_bias : {true, false}) {
    std::vector<float> y(rows * cols), mean(rows), rstd(rows), expected(rows * cols);
    baseline_ops().layernorm_forward(x.data(), weight.data(), with_bias ? bias.data() : nullptr, y.data(),
                                     mean.data(), rstd.data(), rows, cols, 1e-5f);
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const float xv = x[r * cols + c];
        expected[r * cols + c] = with_bias ? mt::kernels::layernorm_output(xv, mean[r], rstd[r], weight[c], bias[c])
                                           : mt::kernels::layernorm_output(xv, mean[r], rstd[r], weight[c]);
      }
    expect_same_bits(expected, y, with_bias ? "layernorm y with bias" : "layernorm y");
  }
}

TEST(NormMath, RmsNormOutputsAndStatisticGiveTheCpuKernelsBits) {
  const int64_t rows = 4;
  const int cols = 67;
  const auto x = random_values(rows * cols, 4), weight = random_values(cols, 5);
  std::vector<float> y(rows * cols), rstd(rows), expected(rows * cols);
  baseline_ops().rmsnorm_forward(x.data(), weight.data(), y.data(), rstd.data(), rows, cols, 1e-6f);
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      expected[r * cols + c] = mt::kernels::rmsnorm_output(x[r * cols + c], rstd[r], weight[c]);
    }
  expect_same_bits(expected, y, "rmsnorm y");

  // One column: the sum of squares is the one square, so the statistic is comparable too.
  const auto x1 = random_values(9, 6);
  std::vector<float> y1(9), rstd1(9), expected_rstd(9);
  const float one_weight = 0.75f;
  baseline_ops().rmsnorm_forward(x1.data(), &one_weight, y1.data(), rstd1.data(), 9, 1, 1e-6f);
  for (int r = 0; r < 9; ++r) expected_rstd[r] = mt::kernels::norm_rstd(x1[r] * x1[r], 1.0f, 1e-6f);
  expect_same_bits(expected_rstd, rstd1, "rmsnorm rstd of one column");
}

TEST(NormMath, InputGradsOfOneColumnRowsGiveTheCpuKernelsBits) {
  const int64_t rows = 11;
  const auto x = random_values(rows, 7, -3.0f, 3.0f), dy = random_values(rows, 8);
  const float weight = 1.25f;
  std::vector<float> y(rows), mean(rows), rstd(rows), dx(rows), expected(rows);
  float dweight = 0.0f;

  baseline_ops().rmsnorm_forward(x.data(), &weight, y.data(), rstd.data(), rows, 1, 1e-6f);
  baseline_ops().rmsnorm_backward(dy.data(), x.data(), &weight, rstd.data(), dx.data(), &dweight, rows, 1);
  for (int64_t r = 0; r < rows; ++r) {
    const float sum_dxhat_x = dy[r] * weight * x[r];  // the row's one term
    const float correction = rstd[r] * rstd[r] * rstd[r] * sum_dxhat_x * 1.0f;
    expected[r] = mt::kernels::rmsnorm_input_grad(dy[r], x[r], weight, rstd[r], correction);
  }
  expect_same_bits(expected, dx, "rmsnorm dx");

  baseline_ops().layernorm_forward(x.data(), &weight, nullptr, y.data(), mean.data(), rstd.data(), rows, 1, 1e-5f);
  baseline_ops().layernorm_backward(dy.data(), x.data(), &weight, mean.data(), rstd.data(), dx.data(), &dweight,
                                    nullptr, rows, 1);
  for (int64_t r = 0; r < rows; ++r) {
    const float xhat = (x[r] - mean[r]) * rstd[r];
    const float dxhat = dy[r] * weight;
    expected[r] = mt::kernels::layernorm_input_grad(dy[r], xhat, weight, rstd[r], dxhat * 1.0f, dxhat * xhat * 1.0f);
  }
  expect_same_bits(expected, dx, "layernorm dx");
}

TEST(NormMath, RowChunkPlanCoversEveryRowOnceWithinItsLimits) {
  const int64_t max_chunks = 64, min_rows = 64, capacity = int64_t{1} << 22;
  for (const int64_t rows : {int64_t{1}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{517}, int64_t{4096},
                             int64_t{16384}, int64_t{16385}, int64_t{1000003}})
    for (const int64_t cols : {int64_t{1}, int64_t{67}, int64_t{768}, int64_t{16384}, int64_t{100000},
                               int64_t{5000000}})
      for (const int64_t terms : {int64_t{1}, int64_t{2}}) {
        const auto plan = mt::kernels::plan_row_chunks(rows, cols, terms, max_chunks, min_rows, capacity);
        const std::string where = "rows " + std::to_string(rows) + " cols " + std::to_string(cols) + " terms " +
                                  std::to_string(terms);
        ASSERT_GE(plan.count, 1) << where;
        EXPECT_LE(plan.count, max_chunks) << where;
        if (plan.count > 1) {
          EXPECT_LE(plan.count * cols * terms, capacity) << where;
          EXPECT_LE(plan.count, (rows + min_rows - 1) / min_rows) << where;
        }
        // Chunks [k * rows_per_chunk, ...) for k < count: the last one holds the last row, none is empty.
        EXPECT_GE(plan.count * plan.rows_per_chunk, rows) << where;
        EXPECT_LT((plan.count - 1) * plan.rows_per_chunk, rows) << where;
      }
}

}  // namespace
