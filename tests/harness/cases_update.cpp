// Cases of the elementwise, reduction, dropout and optimizer entries (see op_cases.h): add, scale
// and bias add exactly as one fp32 operation per element; bias grads accumulated and the same at
// any thread count; sum_squares accumulated in double (squares fp32 could not hold) and the same
// at any thread count; all_finite finding NaN and +-Inf anywhere; dropout masks that are the keyed
// uniform of (seed, stream, iteration, global row, global column), independent of how rows and
// columns are split, the same in backward, another per iteration, dropping a fraction p; AdamW
// equal to PyTorch's formula over three steps with the bf16 copy refreshed.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "kernels/common/half.h"
#include "kernels/common/philox.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

using kernels::DropoutKey;

void add_add_and_scale(std::vector<OpCase>& cases) {
  for (int64_t n : {1, 5, 67, 100003}) {
    cases.push_back({.op = OpId::add_inplace,
                     .mode = CaseMode::forward,
                     .name = shape_text({{"n", n}}) + ", y += x exactly",
                     .body = [n](CaseContext& c) {
                       const auto x = random_floats(n, 90), y0 = random_floats(n, 91);
                       const DeviceArray<float> y = c.upload(y0);
                       c.ops().add_inplace(y.data, c.upload(x).data, n, c.stream());
                       std::vector<float> expected(n);
                       for (int64_t i = 0; i < n; ++i) expected[i] = y0[i] + x[i];
                       c.expect_equal("y", c.download(y, "y"), expected);
                     }});
    cases.push_back({.op = OpId::scale_inplace,
                     .mode = CaseMode::forward,
                     .name = shape_text({{"n", n}}) + ", x *= -0.75 exactly",
                     .body = [n](CaseContext& c) {
                       const auto x0 = random_floats(n, 92);
                       const DeviceArray<float> x = c.upload(x0);
                       c.ops().scale_inplace(x.data, n, -0.75f, c.stream());
                       std::vector<float> expected(n);
                       for (int64_t i = 0; i < n; ++i) expected[i] = x0[i] * -0.75f;
                       c.expect_equal("x", c.download(x, "x"), expected);
                     }});
  }
}

void add_bias(std::vector<OpCase>& cases) {
  for (int64_t rows : {1, 7, 33})
    for (int cols : {1, 5, 67, 768}) {
      const std::string shape = shape_text({{"rows", rows}, {"cols", cols}});
      cases.push_back({.op = OpId::bias_add,
                       .mode = CaseMode::forward,
                       .name = shape + ", y[r] += bias exactly",
                       .body = [rows, cols](CaseContext& c) {
                         const auto y0 = random_floats(rows * cols, 92), bias = random_floats(cols, 93);
                         const DeviceArray<float> y = c.upload(y0);
                         c.ops().bias_add(y.data, c.upload(bias).data, rows, cols, c.stream());
                         std::vector<float> expected(rows * cols);
                         for (int64_t r = 0; r < rows; ++r)
                           for (int col = 0; col < cols; ++col)
                             expected[r * cols + col] = y0[r * cols + col] + bias[col];
                         c.expect_equal("y", c.download(y, "y"), expected);
                       }});
      cases.push_back({.op = OpId::bias_backward,
                       .mode = CaseMode::backward,
                       .name = shape + ", dbias accumulated onto random values",
                       .body = [rows, cols](CaseContext& c) {
                         const auto dy = random_floats(rows * cols, 92), before = random_floats(cols, 94);
                         const DeviceArray<float> dbias = c.upload(before);
                         c.ops().bias_backward(c.upload(dy).data, dbias.data, rows, cols, c.stream());
                         std::vector<double> expected = to_double(before);
                         for (int64_t r = 0; r < rows; ++r)
                           for (int col = 0; col < cols; ++col) expected[col] += dy[r * cols + col];
                         c.expect_close("dbias", c.download(dbias, "dbias"), expected,
                                        tolerances(DType::f32).reference);
                       }});
    }
  cases.push_back({.op = OpId::bias_backward,
                   .mode = CaseMode::accumulate,
                   .name = "two calls add twice, rows=33 cols=67",
                   .body = [](CaseContext& c) {
                     const int64_t rows = 33;
                     const int cols = 67;
                     const auto dy = random_floats(rows * cols, 95), start = random_floats(cols, 96);
                     const DeviceArray<float> d_dy = c.upload(dy), dbias = c.upload(start);
                     for (int call = 0; call < 2; ++call)
                       c.ops().bias_backward(d_dy.data, dbias.data, rows, cols, c.stream());
                     std::vector<double> expected = to_double(start);
                     for (int64_t r = 0; r < rows; ++r)
                       for (int col = 0; col < cols; ++col) expected[col] += 2.0 * dy[r * cols + col];
                     c.expect_close("dbias", c.download(dbias, "dbias"), expected, tolerances(DType::f32).reference);
                   }});
  cases.push_back({.op = OpId::bias_backward,
                   .mode = CaseMode::property,
                   .name = "rows=517 cols=768: dbias the same bits at any thread count",
                   .thread_count_independent = true,
                   .body = [](CaseContext& c) {
                     const int64_t rows = 517;
                     const int cols = 768;
                     const auto dy = random_floats(rows * cols, 32);
                     const DeviceArray<float> dbias = c.filled(cols, 0.0f);
                     c.ops().bias_backward(c.upload(dy).data, dbias.data, rows, cols, c.stream());
                     std::vector<double> expected(cols, 0.0);
                     for (int64_t r = 0; r < rows; ++r)
                       for (int col = 0; col < cols; ++col) expected[col] += dy[r * cols + col];
                     c.expect_close("dbias", c.download(dbias, "dbias"), expected, tolerances(DType::f32).reference);
                   }});
}

void add_reductions(std::vector<OpCase>& cases) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{67}, (int64_t{1} << 20) + 3}) {
    cases.push_back({.op = OpId::sum_squares,
                     .mode = CaseMode::forward,
                     .name = shape_text({{"n", n}}) + ": double accumulation, the same at any thread count",
                     .thread_count_independent = true,
                     .body = [n](CaseContext& c) {
                       const auto x = random_floats(n, 95, -3.0f, 3.0f);
                       double expected = 0;
                       for (float v : x) expected += static_cast<double>(v) * v;
                       const DeviceArray<double> sum = c.filled(1, 0.0);
                       c.ops().sum_squares(c.upload(x).data, n, sum.data, c.stream());
                       const double result = c.download(sum, "sum_squares")[0];
                       c.expect(std::abs(result - expected) <= 1e-12 * expected,
                                "sum_squares " + std::to_string(result) + ", expected " + std::to_string(expected));
                     }});
  }
  cases.push_back({.op = OpId::sum_squares,
                   .mode = CaseMode::property,
                   .name = "squares fp32 cannot hold: 1e20^2 + 1e20^2 + 1",
                   .body = [](CaseContext& c) {
                     const std::vector<float> big{1e20f, 1e20f, 1.0f};
                     const double squared = static_cast<double>(big[0]) * big[0];
                     const DeviceArray<double> sum = c.filled(1, 0.0);
                     c.ops().sum_squares(c.upload(big).data, 3, sum.data, c.stream());
                     const double result = c.download(sum, "sum_squares")[0];
                     c.expect(std::abs(result - 2 * squared) <= 1e-15 * squared,
                              "sum_squares overflowed or lost precision");
                   }});
  cases.push_back({.op = OpId::sum_squares,
                   .mode = CaseMode::property,
                   .name = "adds into the device accumulator: pieces sum in call order, as host sums did",
                   .body = [](CaseContext& c) {
                     const auto x = random_floats(1000, 97, -3.0f, 3.0f);
                     const DeviceArray<float> d_x = c.upload(x);
                     double expected = 0.5;  // the accumulator's start
                     for (int64_t begin : {0, 300, 301, 700}) {
                       double piece = 0;
                       for (int64_t i = begin; i < begin + 299; ++i) piece += static_cast<double>(x[i]) * x[i];
                       expected += piece;
                     }
                     const DeviceArray<double> sum = c.filled(1, 0.5);
                     for (int64_t begin : {0, 300, 301, 700}) c.ops().sum_squares(d_x.data + begin, 299, sum.data, c.stream());
                     const double result = c.download(sum, "sum_squares")[0];
                     c.expect(std::abs(result - expected) <= 1e-12 * expected,
                              "accumulated " + std::to_string(result) + ", expected " + std::to_string(expected));
                   }});
  for (int64_t n : {1, 5, 67, 100003}) {
    cases.push_back(
        {.op = OpId::all_finite,
         .mode = CaseMode::forward,
         .name = shape_text({{"n", n}}) + ": +-FLT_MAX finite; NaN, +-Inf, -NaN at the first, middle, last",
         .body = [n](CaseContext& c) {
           auto x = random_floats(n, 96, -1e3f, 1e3f);
           x[0] = std::numeric_limits<float>::max();
           x[n - 1] = -std::numeric_limits<float>::max();
           const DeviceArray<float> d_x = c.upload(x);
           // The flag the entry clears on a non-finite element, read back like any device result.
           const auto finite = [&c, &d_x, n] {
             const DeviceArray<int32_t> flag = c.filled(1, int32_t{1});
             c.ops().all_finite(d_x.data, n, flag.data, c.stream());
             return c.download(flag, "all_finite")[0] != 0;
           };
           c.expect(finite(), "finite values reported not finite");
           for (float bad : {kNaN, kInf, -kInf, -kNaN})
             for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
               const DeviceArray<float> d_bad = c.upload(std::vector<float>{bad}), d_good = c.upload(std::vector<float>{x[at]});
               c.ops().copy(d_x.data + at, d_bad.data, sizeof(float), backend::CopyKind::device_to_device, c.stream());
               c.expect(!finite(), std::to_string(bad) + " at " + std::to_string(at) + " not found");
               c.ops().copy(d_x.data + at, d_good.data, sizeof(float), backend::CopyKind::device_to_device, c.stream());
             }
           c.expect(finite(), "restored values reported not finite");
         }});
  }
  cases.push_back(
      {.op = OpId::all_finite, .mode = CaseMode::forward, .name = "no elements: finite", .body = [](CaseContext& c) {
         const DeviceArray<int32_t> flag = c.filled(1, int32_t{1});
         c.ops().all_finite(nullptr, 0, flag.data, c.stream());
         c.expect(c.download(flag, "all_finite")[0] == 1, "n = 0");
       }});
  cases.push_back({.op = OpId::all_finite,
                   .mode = CaseMode::property,
                   .name = "a cleared flag stays cleared: finite data never sets it",
                   .body = [](CaseContext& c) {
                     const DeviceArray<int32_t> flag = c.filled(1, int32_t{0});
                     c.ops().all_finite(c.upload(random_floats(9, 98)).data, 9, flag.data, c.stream());
                     c.expect(c.download(flag, "all_finite")[0] == 0, "finite data set a cleared flag");
                   }});
}

// --- dropout ------------------------------------------------------------------------------------

// 10 rows of 67 columns at global rows 5 * 1024 + 100 + 3 r and global column 129 (not a multiple
// of 4: blocks straddle the start).
struct DropoutProblem {
  DropoutKey key{1234, kernels::stream_id("attn.dropout") ^ 3, 17, 0.3f};
  int64_t rows = 10, col0 = 129;
  int cols = 67;
  std::vector<int64_t> row_ids;
  std::vector<float> x = random_floats(10 * 67, 100, 0.5f, 1.5f);
  DropoutProblem() {
    for (int64_t r = 0; r < rows; ++r) row_ids.push_back(5 * 1024 + 100 + r * 3);
  }
  // The keyed-uniform mask applied on the host: kept elements scaled by 1 / (1 - p).
  std::vector<float> expected(const DropoutKey& k) const {
    std::vector<float> out(x.size());
    const float keep_scale = 1.0f / (1.0f - k.p);
    for (int64_t r = 0; r < rows; ++r)
      for (int col = 0; col < cols; ++col) {
        const float u = kernels::keyed_uniform(k.seed, k.stream, k.iteration, row_ids[r], col0 + col);
        out[r * cols + col] = u >= k.p ? x[r * cols + col] * keep_scale : 0.0f;
      }
    return out;
  }
};

void check_dropout_layouts(CaseContext& c) {
  const DropoutProblem p;
  const DeviceArray<int64_t> row_ids = c.upload(p.row_ids);
  const DeviceArray<float> whole = c.upload(p.x), split_rows = c.upload(p.x);
  c.ops().dropout_forward(whole.data, p.rows, p.cols, row_ids.data, p.col0, p.key, c.stream());
  c.ops().dropout_forward(split_rows.data, 5, p.cols, row_ids.data, p.col0, p.key, c.stream());
  c.ops().dropout_forward(split_rows.data + 5 * p.cols, 5, p.cols, row_ids.data + 5, p.col0, p.key, c.stream());
  const std::vector<float> whole_result = c.download(whole, "whole");
  c.expect_bits_equal("rows split at 5", c.download(split_rows, "rows split"), whole_result);
  std::vector<float> left(p.rows * 7), right(p.rows * (p.cols - 7));
  for (int64_t r = 0; r < p.rows; ++r)
    for (int col = 0; col < p.cols; ++col)
      (col < 7 ? left[r * 7 + col] : right[r * (p.cols - 7) + col - 7]) = p.x[r * p.cols + col];
  const DeviceArray<float> d_left = c.upload(left), d_right = c.upload(right);
  c.ops().dropout_forward(d_left.data, p.rows, 7, row_ids.data, p.col0, p.key, c.stream());
  c.ops().dropout_forward(d_right.data, p.rows, p.cols - 7, row_ids.data, p.col0 + 7, p.key, c.stream());
  left = c.download(d_left, "left");
  right = c.download(d_right, "right");
  std::vector<float> joined(p.x.size());
  for (int64_t r = 0; r < p.rows; ++r)
    for (int col = 0; col < p.cols; ++col)
      joined[r * p.cols + col] = col < 7 ? left[r * 7 + col] : right[r * (p.cols - 7) + col - 7];
  c.expect_bits_equal("columns split at 7", joined, whole_result);
}

void add_dropout(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::dropout_forward,
                   .mode = CaseMode::forward,
                   .name = "the keyed uniform of (seed, stream, iteration, global row, global column), rows=10 cols=67 "
                           "col0=129 p=0.3",
                   .body = [](CaseContext& c) {
                     const DropoutProblem p;
                     const DeviceArray<float> x = c.upload(p.x);
                     c.ops().dropout_forward(x.data, p.rows, p.cols, c.upload(p.row_ids).data, p.col0, p.key,
                                             c.stream());
                     c.expect_equal("x", c.download(x, "x"), p.expected(p.key));
                   }});
  cases.push_back({.op = OpId::dropout_forward,
                   .mode = CaseMode::property,
                   .name = "the same mask when rows or columns are split across calls",
                   .body = check_dropout_layouts});
  cases.push_back({.op = OpId::dropout_forward,
                   .mode = CaseMode::property,
                   .name = "another iteration draws another mask; p = 0 is the identity",
                   .body = [](CaseContext& c) {
                     const DropoutProblem p;
                     DropoutKey next = p.key, off = p.key;
                     next.iteration += 1;
                     off.p = 0.0f;
                     const DeviceArray<int64_t> row_ids = c.upload(p.row_ids);
                     const DeviceArray<float> other = c.upload(p.x), same = c.upload(p.x);
                     c.ops().dropout_forward(other.data, p.rows, p.cols, row_ids.data, p.col0, next, c.stream());
                     c.ops().dropout_forward(same.data, p.rows, p.cols, row_ids.data, p.col0, off, c.stream());
                     const std::vector<float> other_result = c.download(other, "next iteration");
                     c.expect(other_result != p.expected(p.key), "iteration + 1 gave the same mask");
                     c.expect_equal("next iteration", other_result, p.expected(next));
                     c.expect_bits_equal("p = 0", c.download(same, "p = 0"), p.x);
                   }});
  cases.push_back({.op = OpId::dropout_backward,
                   .mode = CaseMode::backward,
                   .name = "the forward's mask and scale applied to the gradient",
                   .body = [](CaseContext& c) {
                     const DropoutProblem p;
                     const DeviceArray<float> dx = c.upload(p.x);
                     c.ops().dropout_backward(dx.data, p.rows, p.cols, c.upload(p.row_ids).data, p.col0, p.key,
                                              c.stream());
                     c.expect_equal("dx", c.download(dx, "dx"), p.expected(p.key));
                   }});
  for (float p : {0.1f, 0.5f}) {
    cases.push_back({.op = OpId::dropout_forward,
                     .mode = CaseMode::property,
                     .name = "drops a fraction p = " + std::to_string(p).substr(0, 3) +
                             " within 5 sigma and keeps E[x], rows=256 cols=1024",
                     .body = [p](CaseContext& c) {
                       const int64_t rows = 256;
                       const int cols = 1024;
                       std::vector<int64_t> row_ids(rows);
                       for (int64_t r = 0; r < rows; ++r) row_ids[r] = r;
                       const DropoutKey key{7, 11, 3, p};
                       const DeviceArray<float> x = c.filled(rows * cols, 1.0f);
                       c.ops().dropout_forward(x.data, rows, cols, c.upload(row_ids).data, 0, key, c.stream());
                       int64_t dropped = 0;
                       double sum = 0;
                       for (float v : c.download(x, "x")) {
                         dropped += v == 0.0f;
                         sum += v;
                       }
                       const double n = double(rows) * cols, sigma = std::sqrt(n * p * (1 - p));
                       c.expect(std::abs(dropped - n * p) <= 5 * sigma, std::to_string(dropped) + " dropped");
                       c.expect(std::abs(sum / n - 1.0) <= 5 * sigma / n / (1 - p), "mean " + std::to_string(sum / n));
                     }});
  }
}

// --- AdamW --------------------------------------------------------------------------------------

void check_adamw(CaseContext& c, int64_t n) {
  const auto param0 = random_floats(n, 110);
  const DeviceArray<float> param = c.upload(param0), exp_avg = c.filled(n, 0.0f), exp_avg_sq = c.filled(n, 0.0f);
  const DeviceArray<uint16_t> param_bf16 = c.filled<uint16_t>(n, 0);
  std::vector<double> p_ref = to_double(param0), m_ref(n, 0.0), v_ref(n, 0.0);
  kernels::AdamWParams params;
  params.lr = 1e-2f;
  params.weight_decay = 0.1f;
  params.grad_scale = 0.5f;
  for (int step = 1; step <= 3; ++step) {
    const auto grad = random_floats(n, 111 + step, -2.0f, 2.0f);
    params.bias_correction1 = 1.0f - std::pow(params.beta1, static_cast<float>(step));
    params.bias_correction2 = 1.0f - std::pow(params.beta2, static_cast<float>(step));
    c.ops().adamw_update(param.data, step == 3 ? param_bf16.data : nullptr, c.upload(grad).data, exp_avg.data,
                         exp_avg_sq.data, n, params, c.stream());
    ref_adamw_step(p_ref, m_ref, v_ref, grad, params);
  }
  const double tol = tolerances(DType::f32).reference;
  const std::vector<float> param_result = c.download(param, "param");
  c.expect_close("param", param_result, p_ref, tol);
  c.expect_close("exp_avg", c.download(exp_avg, "exp_avg"), m_ref, tol);
  c.expect_close("exp_avg_sq", c.download(exp_avg_sq, "exp_avg_sq"), v_ref, tol);
  std::vector<uint16_t> expected_bits(n);
  for (int64_t i = 0; i < n; ++i) expected_bits[i] = kernels::fp32_to_bf16_bits(param_result[i]);
  c.expect_equal("bf16 copy", c.download(param_bf16, "param_bf16"), expected_bits);
}

}  // namespace

void add_elementwise_cases(std::vector<OpCase>& cases) {
  add_add_and_scale(cases);
  add_bias(cases);
  add_reductions(cases);
}

void add_dropout_cases(std::vector<OpCase>& cases) { add_dropout(cases); }

void add_optimizer_cases(std::vector<OpCase>& cases) {
  for (int64_t n : {1, 7, 1003, 70001}) {
    cases.push_back({.op = OpId::adamw_update,
                     .mode = CaseMode::forward,
                     .name = shape_text({{"n", n}}) + ": three steps of PyTorch's formula (decay, grad scale), bf16 "
                                                      "copy refreshed at the third",
                     .body = [n](CaseContext& c) { check_adamw(c, n); }});
  }
}

}  // namespace mt::harness
