// The CPU op table (kernels/cpu/ops.h), every entry but attention, at every ISA level this CPU
// has: each op against a simple reference loop in double precision, backward ops also against
// central differences of the reference forward, plus the contract's promises (parameter grads
// accumulate, padded vocab columns stay out, sparse and thread-count-independent reductions,
// layout-independent dropout masks). The kernels are in kernels/cpu/impl/elementwise.inc.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/half.h"
#include "kernels/common/philox.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace {

using mt::kernels::CpuIsa;
using mt::kernels::cpu::AdamWParams;
using mt::kernels::cpu::CpuOps;
using mt::kernels::cpu::DropoutKey;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// fp32 kernels against double references: relative to the scale of the expected values (their
// RMS), so results that cancel to ~0 are not held to a relative bound they cannot meet.
constexpr double kTol = 1e-5;
// Kernel gradients against central differences of the double reference: the kernel runs in fp32
// on fp32 inputs and the differences carry O(h^2) truncation error.
constexpr double kFiniteDifferenceTol = 1e-4;

std::vector<CpuIsa> isa_levels() {
  std::vector<CpuIsa> levels;
  for (CpuIsa isa : {CpuIsa::x86_64_v2, CpuIsa::avx2, CpuIsa::avx512})
    if (static_cast<int>(isa) <= static_cast<int>(mt::kernels::detected_isa())) levels.push_back(isa);
  return levels;
}

// Runs `body(ops)` once per ISA level, tagging failures with the level's name.
void for_each_isa(const std::function<void(const CpuOps&)>& body) {
  for (CpuIsa isa : isa_levels()) {
    SCOPED_TRACE(std::string("isa ") + mt::kernels::isa_name(isa));
    body(mt::kernels::cpu::cpu_ops(isa));
  }
}

std::vector<float> random_floats(size_t n, uint32_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

std::vector<double> to_double(const std::vector<float>& values) { return {values.begin(), values.end()}; }

double rms(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v * v;
  return values.empty() ? 0.0 : std::sqrt(sum / static_cast<double>(values.size()));
}

// |actual - expected| <= tol * (|expected| + scale) elementwise, scale = rms(expected) unless
// given (the size of the terms that cancel into `expected`); reports the first misses.
void expect_close(const std::vector<float>& actual, const std::vector<double>& expected, double tol,
                  const std::string& what, double scale_override = 0.0) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  const double scale = (scale_override > 0 ? scale_override : rms(expected)) + 1e-30;
  int failures = 0;
  for (size_t i = 0; i < actual.size() && failures < 5; ++i) {
    const double bound = tol * (std::abs(expected[i]) + scale);
    if (!(std::abs(static_cast<double>(actual[i]) - expected[i]) <= bound)) {
      ADD_FAILURE() << what << "[" << i << "] = " << actual[i] << ", expected " << expected[i] << " (bound "
                    << bound << ")";
      ++failures;
    }
  }
}

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      ADD_FAILURE() << what << " differs at " << i << ": " << a[i] << " vs " << b[i];
      return;
    }
}

// Gradient of sum(dy * f(at)) with respect to `at`, by central differences in double.
std::vector<double> numeric_gradient(const std::function<std::vector<double>(const std::vector<double>&)>& f,
                                     std::vector<double> at, const std::vector<double>& dy) {
  std::vector<double> gradient(at.size());
  for (size_t i = 0; i < at.size(); ++i) {
    const double saved = at[i];
    const double h = 1e-6 * std::max(1.0, std::abs(saved));
    at[i] = saved + h;
    const std::vector<double> plus = f(at);
    at[i] = saved - h;
    const std::vector<double> minus = f(at);
    at[i] = saved;
    double sum = 0;
    for (size_t j = 0; j < dy.size(); ++j) sum += dy[j] * (plus[j] - minus[j]);
    gradient[i] = sum / (2 * h);
  }
  return gradient;
}

// Runs `body` with the OpenMP team size set to `threads`, restoring the previous size.
template <typename Body>
void with_threads(int threads, Body&& body) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  body();
  omp_set_num_threads(saved);
}

// --- reference implementations (double) -----------------------------------------------------

struct NormReference {
  std::vector<double> y, mean, rstd;
};

NormReference ref_layernorm(const std::vector<double>& x, const std::vector<double>& weight,
                            const std::vector<double>* bias, int64_t rows, int cols, double eps) {
  NormReference out{std::vector<double>(x.size()), std::vector<double>(rows), std::vector<double>(rows)};
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < cols; ++c) mean += x[r * cols + c];
    mean /= cols;
    for (int c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
    var /= cols;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < cols; ++c)
      out.y[r * cols + c] = (x[r * cols + c] - mean) * rstd * weight[c] + (bias ? (*bias)[c] : 0.0);
    out.mean[r] = mean;
    out.rstd[r] = rstd;
  }
  return out;
}

NormReference ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& weight, int64_t rows, int cols,
                          double eps) {
  NormReference out{std::vector<double>(x.size()), {}, std::vector<double>(rows)};
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0;
    for (int c = 0; c < cols; ++c) squares += x[r * cols + c] * x[r * cols + c];
    const double rstd = 1.0 / std::sqrt(squares / cols + eps);
    for (int c = 0; c < cols; ++c) out.y[r * cols + c] = x[r * cols + c] * rstd * weight[c];
    out.rstd[r] = rstd;
  }
  return out;
}

double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

std::vector<double> ref_swiglu(const std::vector<double>& gate_up, int64_t rows, int ffn) {
  std::vector<double> y(rows * ffn);
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < ffn; ++c) y[r * ffn + c] = ref_silu(gate_up[r * 2 * ffn + c]) * gate_up[r * 2 * ffn + ffn + c];
  return y;
}

// RoPE in double on fp32 angles computed exactly as PyTorch does.
std::vector<double> ref_rope(const std::vector<double>& x, int64_t rows, int64_t row_stride, int heads, int head_dim,
                             const std::vector<int32_t>& positions, float base, bool transpose) {
  std::vector<double> out = x;
  const int half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const float inv_freq = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(head_dim));
        const float angle = static_cast<float>(positions[r]) * inv_freq;
        const double c = std::cos(static_cast<double>(angle)), s = std::sin(static_cast<double>(angle));
        const int64_t at = r * row_stride + static_cast<int64_t>(h) * head_dim + i;
        const double x1 = x[at], x2 = x[at + half];
        out[at] = transpose ? x1 * c + x2 * s : x1 * c - x2 * s;
        out[at + half] = transpose ? x2 * c - x1 * s : x2 * c + x1 * s;
      }
  return out;
}

// Per-row loss log(sum exp) - target over the valid columns, and its gradient.
struct XentReference {
  std::vector<double> max, sumexp, target_logit, loss, grad;
};

XentReference ref_xent(const std::vector<double>& logits, int64_t rows, int64_t ld, int64_t valid_cols,
                       int64_t vocab_start, const std::vector<int32_t>& targets, const std::vector<double>& dloss) {
  XentReference out{std::vector<double>(rows), std::vector<double>(rows), std::vector<double>(rows),
                    std::vector<double>(rows), std::vector<double>(rows * ld, 0.0)};
  for (int64_t r = 0; r < rows; ++r) {
    double best = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < valid_cols; ++c) best = std::max(best, logits[r * ld + c]);
    double sum = 0;
    for (int64_t c = 0; c < valid_cols; ++c) sum += std::exp(logits[r * ld + c] - best);
    const int64_t column = targets[r] - vocab_start;
    const bool here = column >= 0 && column < valid_cols;
    out.max[r] = best;
    out.sumexp[r] = sum;
    out.target_logit[r] = here ? logits[r * ld + column] : 0.0;
    out.loss[r] = std::log(sum) + best - out.target_logit[r];
    for (int64_t c = 0; c < valid_cols; ++c)
      out.grad[r * ld + c] = dloss[r] * (std::exp(logits[r * ld + c] - best) / sum - (c == column ? 1.0 : 0.0));
  }
  return out;
}

// --- normalisation ---------------------------------------------------------------------------

TEST(CpuOps, LayerNormForwardMatchesReference) {
  for_each_isa([](const CpuOps& ops) {
    for (int64_t rows : {1, 7, 33})
      for (int cols : {1, 5, 67, 768})
        for (bool with_bias : {true, false}) {
          SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols) + " bias " +
                       std::to_string(with_bias));
          const auto x = random_floats(rows * cols, 1, -2.0f, 3.0f);
          const auto weight = random_floats(cols, 2, 0.5f, 1.5f);
          const auto bias = random_floats(cols, 3);
          std::vector<float> y(rows * cols, kNaN), mean(rows, kNaN), rstd(rows, kNaN);
          ops.layernorm_forward(x.data(), weight.data(), with_bias ? bias.data() : nullptr, y.data(), mean.data(),
                                rstd.data(), rows, cols, 1e-5f);
          const auto bias_d = to_double(bias);
          const NormReference ref = ref_layernorm(to_double(x), to_double(weight), with_bias ? &bias_d : nullptr,
                                                  rows, cols, 1e-5);
          expect_close(y, ref.y, kTol, "y");
          expect_close(mean, ref.mean, kTol, "mean");
          expect_close(rstd, ref.rstd, kTol, "rstd");
        }
  });
}

TEST(CpuOps, LayerNormBackwardMatchesReferenceAndAccumulates) {
  for_each_isa([](const CpuOps& ops) {
    for (int64_t rows : {1, 7, 33, 130})
      for (int cols : {1, 5, 67, 768}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
        const auto x = random_floats(rows * cols, 4, -2.0f, 2.0f);
        const auto weight = random_floats(cols, 5, 0.5f, 1.5f);
        const auto bias = random_floats(cols, 6);
        const auto dy = random_floats(rows * cols, 7);
        std::vector<float> y(rows * cols), mean(rows), rstd(rows);
        ops.layernorm_forward(x.data(), weight.data(), bias.data(), y.data(), mean.data(), rstd.data(), rows, cols,
                              1e-5f);
        std::vector<float> dx(rows * cols, kNaN);
        const auto dweight_before = random_floats(cols, 8), dbias_before = random_floats(cols, 9);
        std::vector<float> dweight = dweight_before, dbias = dbias_before;
        ops.layernorm_backward(dy.data(), x.data(), weight.data(), mean.data(), rstd.data(), dx.data(),
                               dweight.data(), dbias.data(), rows, cols);
        // Analytic reference: xhat = (x - mean) rstd; dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w.
        std::vector<double> dx_ref(rows * cols), dweight_ref(to_double(dweight_before)),
            dbias_ref(to_double(dbias_before)), dx_terms(rows * cols);
        const NormReference fwd = ref_layernorm(to_double(x), to_double(weight), nullptr, rows, cols, 1e-5);
        for (int64_t r = 0; r < rows; ++r) {
          double mean_g = 0, mean_g_xhat = 0;
          for (int c = 0; c < cols; ++c) {
            const double xhat = (x[r * cols + c] - fwd.mean[r]) * fwd.rstd[r];
            const double g = static_cast<double>(dy[r * cols + c]) * weight[c];
            mean_g += g / cols;
            mean_g_xhat += g * xhat / cols;
            dweight_ref[c] += dy[r * cols + c] * xhat;
            dbias_ref[c] += dy[r * cols + c];
          }
          for (int c = 0; c < cols; ++c) {
            const double xhat = (x[r * cols + c] - fwd.mean[r]) * fwd.rstd[r];
            const double g = static_cast<double>(dy[r * cols + c]) * weight[c];
            dx_ref[r * cols + c] = fwd.rstd[r] * (g - mean_g - xhat * mean_g_xhat);
            dx_terms[r * cols + c] = fwd.rstd[r] * g;
          }
        }
        // dx is a difference of terms of size rstd*dy*w (exactly 0 when cols = 1): fp32 rounding
        // of those terms, not of dx, sets the error.
        expect_close(dx, dx_ref, kTol, "dx", rms(dx_terms));
        expect_close(dweight, dweight_ref, kTol, "dweight");
        expect_close(dbias, dbias_ref, kTol, "dbias");
        // dbias is optional.
        std::vector<float> dweight_no_bias = dweight_before;
        ops.layernorm_backward(dy.data(), x.data(), weight.data(), mean.data(), rstd.data(), dx.data(),
                               dweight_no_bias.data(), nullptr, rows, cols);
        expect_bits_equal(dweight_no_bias, dweight, "dweight without dbias");
      }
  });
}

TEST(CpuOps, LayerNormBackwardMatchesFiniteDifferences) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t rows = 3;
    for (int cols : {5, 67}) {
      SCOPED_TRACE("cols " + std::to_string(cols));
      const auto x = random_floats(rows * cols, 10, -2.0f, 2.0f);
      const auto weight = random_floats(cols, 11, 0.5f, 1.5f);
      const auto bias = random_floats(cols, 12);
      const auto dy = random_floats(rows * cols, 13);
      std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx(rows * cols);
      std::vector<float> dweight(cols, 0.0f), dbias(cols, 0.0f);
      ops.layernorm_forward(x.data(), weight.data(), bias.data(), y.data(), mean.data(), rstd.data(), rows, cols,
                            1e-5f);
      ops.layernorm_backward(dy.data(), x.data(), weight.data(), mean.data(), rstd.data(), dx.data(), dweight.data(),
                             dbias.data(), rows, cols);
      const auto x_d = to_double(x), weight_d = to_double(weight), bias_d = to_double(bias), dy_d = to_double(dy);
      expect_close(dx,
                   numeric_gradient([&](const auto& v) { return ref_layernorm(v, weight_d, &bias_d, rows, cols, 1e-5).y; },
                                    x_d, dy_d),
                   kFiniteDifferenceTol, "dx");
      expect_close(dweight,
                   numeric_gradient([&](const auto& v) { return ref_layernorm(x_d, v, &bias_d, rows, cols, 1e-5).y; },
                                    weight_d, dy_d),
                   kFiniteDifferenceTol, "dweight");
      expect_close(dbias,
                   numeric_gradient([&](const auto& v) { return ref_layernorm(x_d, weight_d, &v, rows, cols, 1e-5).y; },
                                    bias_d, dy_d),
                   kFiniteDifferenceTol, "dbias");
    }
  });
}

TEST(CpuOps, RmsNormForwardMatchesReference) {
  for_each_isa([](const CpuOps& ops) {
    for (int64_t rows : {1, 7, 33})
      for (int cols : {1, 5, 67, 768}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
        const auto x = random_floats(rows * cols, 20, -2.0f, 3.0f);
        const auto weight = random_floats(cols, 21, 0.5f, 1.5f);
        std::vector<float> y(rows * cols, kNaN), rstd(rows, kNaN);
        ops.rmsnorm_forward(x.data(), weight.data(), y.data(), rstd.data(), rows, cols, 1e-6f);
        const NormReference ref = ref_rmsnorm(to_double(x), to_double(weight), rows, cols, 1e-6);
        expect_close(y, ref.y, kTol, "y");
        expect_close(rstd, ref.rstd, kTol, "rstd");
      }
  });
}

TEST(CpuOps, RmsNormBackwardMatchesFiniteDifferencesAndAccumulates) {
  for_each_isa([](const CpuOps& ops) {
    // cols = 1 is left out: there dx = dy w rstd (1 - x^2 rstd^2) cancels to ~eps in fp32.
    for (int64_t rows : {1, 3, 70})
      for (int cols : {5, 67}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
        const auto x = random_floats(rows * cols, 22, -2.0f, 2.0f);
        const auto weight = random_floats(cols, 23, 0.5f, 1.5f);
        const auto dy = random_floats(rows * cols, 24);
        std::vector<float> y(rows * cols), rstd(rows), dx(rows * cols, kNaN);
        const auto dweight_before = random_floats(cols, 25);
        std::vector<float> dweight = dweight_before;
        ops.rmsnorm_forward(x.data(), weight.data(), y.data(), rstd.data(), rows, cols, 1e-6f);
        ops.rmsnorm_backward(dy.data(), x.data(), weight.data(), rstd.data(), dx.data(), dweight.data(), rows, cols);
        const auto x_d = to_double(x), weight_d = to_double(weight), dy_d = to_double(dy);
        expect_close(dx, numeric_gradient([&](const auto& v) { return ref_rmsnorm(v, weight_d, rows, cols, 1e-6).y; },
                                          x_d, dy_d),
                     kFiniteDifferenceTol, "dx");
        std::vector<double> dweight_expected =
            numeric_gradient([&](const auto& v) { return ref_rmsnorm(x_d, v, rows, cols, 1e-6).y; }, weight_d, dy_d);
        for (int c = 0; c < cols; ++c) dweight_expected[c] += dweight_before[c];
        expect_close(dweight, dweight_expected, kFiniteDifferenceTol, "dweight (accumulated)");
      }
  });
}

TEST(CpuOps, NormParameterGradsDoNotDependOnThreadCount) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t rows = 517;
    const int cols = 768;
    const auto x = random_floats(rows * cols, 30, -2.0f, 2.0f);
    const auto weight = random_floats(cols, 31, 0.5f, 1.5f);
    const auto dy = random_floats(rows * cols, 32);
    std::vector<float> y(rows * cols), mean(rows), rstd(rows);
    ops.layernorm_forward(x.data(), weight.data(), nullptr, y.data(), mean.data(), rstd.data(), rows, cols, 1e-5f);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2}) {
      with_threads(threads, [&] {
        std::vector<float> dx(rows * cols), dweight(cols, 0.0f), dbias(cols, 0.0f), rms_dweight(cols, 0.0f);
        std::vector<float> bias_grad(cols, 0.0f);
        ops.layernorm_backward(dy.data(), x.data(), weight.data(), mean.data(), rstd.data(), dx.data(),
                               dweight.data(), dbias.data(), rows, cols);
        ops.rmsnorm_backward(dy.data(), x.data(), weight.data(), rstd.data(), dx.data(), rms_dweight.data(), rows,
                             cols);
        ops.bias_backward(dy.data(), bias_grad.data(), rows, cols);
        results.insert(results.end(), {dweight, dbias, rms_dweight, bias_grad});
      });
    }
    for (size_t i = 0; i < 4; ++i) expect_bits_equal(results[i], results[i + 4], "grad " + std::to_string(i));
  });
}

// --- activations -----------------------------------------------------------------------------

TEST(CpuOps, GeluForwardAndBackwardMatchReference) {
  for_each_isa([](const CpuOps& ops) {
    for (int64_t n : {1, 5, 67, 100003}) {
      SCOPED_TRACE("n " + std::to_string(n));
      auto x = random_floats(n, 40, -6.0f, 6.0f);
      if (n > 8) {  // saturated tails: exp overflows / underflows inside the kernel
        x[0] = -100.0f;
        x[1] = 100.0f;
        x[2] = -30.0f;
        x[3] = 30.0f;
        x[4] = 0.0f;
      }
      const auto dy = random_floats(n, 41);
      std::vector<float> y(n, kNaN), dx(n, kNaN);
      ops.gelu_forward(x.data(), y.data(), n);
      ops.gelu_backward(dy.data(), x.data(), dx.data(), n);
      std::vector<double> y_ref(n), dx_ref(n);
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[i], k = std::sqrt(2.0 / M_PI);
        const double t = std::tanh(k * (v + 0.044715 * v * v * v));
        y_ref[i] = ref_gelu(v);
        dx_ref[i] = dy[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v));
      }
      expect_close(y, y_ref, kTol, "y");
      expect_close(dx, dx_ref, kTol, "dx");
    }
  });
}

TEST(CpuOps, GeluBackwardMatchesFiniteDifferences) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t n = 67;
    const auto x = random_floats(n, 42, -4.0f, 4.0f);
    const auto dy = random_floats(n, 43);
    std::vector<float> dx(n);
    ops.gelu_backward(dy.data(), x.data(), dx.data(), n);
    const auto gelu_all = [](const std::vector<double>& v) {
      std::vector<double> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = ref_gelu(v[i]);
      return out;
    };
    expect_close(dx, numeric_gradient(gelu_all, to_double(x), to_double(dy)), kFiniteDifferenceTol, "dx");
  });
}

TEST(CpuOps, SwigluForwardAndBackwardMatchReference) {
  for_each_isa([](const CpuOps& ops) {
    for (int64_t rows : {1, 7, 33})
      for (int ffn : {1, 37, 768}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " ffn " + std::to_string(ffn));
        auto gate_up = random_floats(rows * 2 * ffn, 50, -8.0f, 8.0f);
        gate_up[0] = -120.0f;  // silu saturates to -0: exp(120) overflows inside the kernel
        if (ffn > 1) gate_up[1] = 120.0f;
        const auto dy = random_floats(rows * ffn, 51);
        std::vector<float> y(rows * ffn, kNaN), d_gate_up(rows * 2 * ffn, kNaN);
        ops.swiglu_forward(gate_up.data(), y.data(), rows, ffn);
        ops.swiglu_backward(dy.data(), gate_up.data(), d_gate_up.data(), rows, ffn);
        expect_close(y, ref_swiglu(to_double(gate_up), rows, ffn), kTol, "y");
        std::vector<double> d_ref(rows * 2 * ffn);
        for (int64_t r = 0; r < rows; ++r)
          for (int c = 0; c < ffn; ++c) {
            const double g = gate_up[r * 2 * ffn + c], u = gate_up[r * 2 * ffn + ffn + c];
            const double s = 1.0 / (1.0 + std::exp(-g));
            d_ref[r * 2 * ffn + c] = dy[r * ffn + c] * u * (s + g * s * (1 - s));
            d_ref[r * 2 * ffn + ffn + c] = dy[r * ffn + c] * g * s;
          }
        expect_close(d_gate_up, d_ref, kTol, "d_gate_up");
      }
  });
}

TEST(CpuOps, SwigluBackwardMatchesFiniteDifferences) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t rows = 3;
    const int ffn = 37;
    const auto gate_up = random_floats(rows * 2 * ffn, 52, -4.0f, 4.0f);
    const auto dy = random_floats(rows * ffn, 53);
    std::vector<float> d_gate_up(rows * 2 * ffn);
    ops.swiglu_backward(dy.data(), gate_up.data(), d_gate_up.data(), rows, ffn);
    expect_close(d_gate_up,
                 numeric_gradient([&](const auto& v) { return ref_swiglu(v, rows, ffn); }, to_double(gate_up),
                                  to_double(dy)),
                 kFiniteDifferenceTol, "d_gate_up");
  });
}

// --- rotary position embedding -----------------------------------------------------------------

TEST(CpuOps, RopeForwardMatchesReferenceAndBackwardIsItsTranspose) {
  for_each_isa([](const CpuOps& ops) {
    struct Case {
      int64_t rows;
      int heads, head_dim;
      int64_t row_stride;
      float base;
    };
    // row_stride > heads*head_dim: the heads sit inside a wider (e.g. packed QKV) row.
    for (const Case& shape : {Case{1, 1, 2, 2, 10000.0f}, Case{7, 3, 6, 18, 10000.0f}, Case{33, 4, 64, 300, 10000.0f},
                              Case{5, 2, 128, 256, 500000.0f}}) {
      SCOPED_TRACE("rows " + std::to_string(shape.rows) + " head_dim " + std::to_string(shape.head_dim));
      std::vector<int32_t> positions(shape.rows);
      std::mt19937 rng(60);
      for (auto& p : positions) p = static_cast<int32_t>(rng() % 2048);
      positions[0] = 0;
      if (shape.rows > 2) positions[1] = 70000;  // past the kernel's cached table
      const auto x = random_floats(shape.rows * shape.row_stride, 61);
      const auto y = random_floats(shape.rows * shape.row_stride, 62);
      std::vector<float> rotated = x;
      ops.rope_forward(rotated.data(), shape.rows, shape.row_stride, shape.heads, shape.head_dim, positions.data(),
                       shape.base);
      expect_close(rotated,
                   ref_rope(to_double(x), shape.rows, shape.row_stride, shape.heads, shape.head_dim, positions,
                            shape.base, false),
                   kTol, "rope_forward");
      std::vector<float> back = y;
      ops.rope_backward(back.data(), shape.rows, shape.row_stride, shape.heads, shape.head_dim, positions.data(),
                        shape.base);
      expect_close(back,
                   ref_rope(to_double(y), shape.rows, shape.row_stride, shape.heads, shape.head_dim, positions,
                            shape.base, true),
                   kTol, "rope_backward");
      // <rope(x), y> == <x, rope_backward(y)> (columns outside the heads are untouched by both).
      double lhs = 0, rhs = 0, scale = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        lhs += static_cast<double>(rotated[i]) * y[i];
        rhs += static_cast<double>(x[i]) * back[i];
        scale += std::abs(static_cast<double>(x[i]) * y[i]);
      }
      EXPECT_NEAR(lhs, rhs, 1e-5 * scale);
      // Backward undoes forward (the rotation is orthogonal).
      std::vector<float> round_trip = rotated;
      ops.rope_backward(round_trip.data(), shape.rows, shape.row_stride, shape.heads, shape.head_dim,
                        positions.data(), shape.base);
      expect_close(round_trip, to_double(x), kTol, "backward(forward(x))");
    }
  });
}

// --- embedding -------------------------------------------------------------------------------

TEST(CpuOps, EmbeddingForwardMatchesReference) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t rows = 33, vocab_start = 20, vocab_end = 50, max_positions = 16;
    for (int cols : {1, 67}) {
      const auto wte = random_floats((vocab_end - vocab_start) * cols, 70);
      const auto wpe = random_floats(max_positions * cols, 71);
      std::vector<int32_t> tokens(rows), positions(rows);
      for (int64_t r = 0; r < rows; ++r) {
        tokens[r] = static_cast<int32_t>((r * 37) % 70);  // in and out of this shard's range
        positions[r] = static_cast<int32_t>(r % max_positions);
      }
      for (bool with_wpe : {true, false}) {
        SCOPED_TRACE("cols " + std::to_string(cols) + " wpe " + std::to_string(with_wpe));
        std::vector<float> y(rows * cols, kNaN);
        ops.embedding_forward(tokens.data(), positions.data(), wte.data(), with_wpe ? wpe.data() : nullptr, y.data(),
                              rows, cols, vocab_start, vocab_end);
        for (int64_t r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) {
            const bool here = tokens[r] >= vocab_start && tokens[r] < vocab_end;
            const float expected = (here ? wte[(tokens[r] - vocab_start) * cols + c] : 0.0f) +
                                   (with_wpe ? wpe[positions[r] * cols + c] : 0.0f);
            ASSERT_EQ(y[r * cols + c], expected) << "row " << r << " col " << c;
          }
      }
    }
  });
}

TEST(CpuOps, EmbeddingBackwardIsSparseAccumulatesAndIgnoresThreadCount) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t rows = 700, vocab_start = 100, vocab_end = 400, max_positions = 64;
    const int cols = 67 * 2;
    const int64_t vocab = vocab_end - vocab_start;
    std::vector<int32_t> tokens(rows), positions(rows);
    std::mt19937 rng(72);
    for (int64_t r = 0; r < rows; ++r) {
      tokens[r] = static_cast<int32_t>(rng() % 40 * 13);  // few distinct tokens, many repeats, some outside
      positions[r] = static_cast<int32_t>(rng() % 32);    // positions [32, 64) never used
    }
    const auto dy = random_floats(rows * cols, 73);
    // Rows the tokens touch start at 0.5; untouched rows hold -0.0, which any "+= 0" would turn into +0.0.
    std::vector<char> token_used(vocab, 0), position_used(max_positions, 0);
    for (int64_t r = 0; r < rows; ++r) {
      if (tokens[r] >= vocab_start && tokens[r] < vocab_end) token_used[tokens[r] - vocab_start] = 1;
      position_used[positions[r]] = 1;
    }
    std::vector<float> dwte_start(vocab * cols), dwpe_start(max_positions * cols);
    for (int64_t v = 0; v < vocab; ++v)
      for (int c = 0; c < cols; ++c) dwte_start[v * cols + c] = token_used[v] ? 0.5f : -0.0f;
    for (int64_t p = 0; p < max_positions; ++p)
      for (int c = 0; c < cols; ++c) dwpe_start[p * cols + c] = position_used[p] ? 0.5f : -0.0f;

    std::vector<std::vector<float>> results;
    for (int threads : {1, 2}) {
      with_threads(threads, [&] {
        std::vector<float> dwte = dwte_start, dwpe = dwpe_start;
        ops.embedding_backward(tokens.data(), positions.data(), dy.data(), dwte.data(), dwpe.data(), rows, cols,
                               vocab_start, vocab_end);
        results.push_back(dwte);
        results.push_back(dwpe);
      });
    }
    expect_bits_equal(results[0], results[2], "dwte, 1 vs 2 threads");
    expect_bits_equal(results[1], results[3], "dwpe, 1 vs 2 threads");

    std::vector<double> dwte_ref = to_double(dwte_start), dwpe_ref = to_double(dwpe_start);
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        if (tokens[r] >= vocab_start && tokens[r] < vocab_end) dwte_ref[(tokens[r] - vocab_start) * cols + c] += dy[r * cols + c];
        dwpe_ref[positions[r] * cols + c] += dy[r * cols + c];
      }
    expect_close(results[0], dwte_ref, kTol, "dwte");
    expect_close(results[1], dwpe_ref, kTol, "dwpe");
    for (int64_t v = 0; v < vocab; ++v) {
      if (token_used[v]) continue;
      for (int c = 0; c < cols; ++c) ASSERT_TRUE(std::signbit(results[0][v * cols + c])) << "dwte row " << v;
    }
    for (int64_t p = 0; p < max_positions; ++p) {
      if (position_used[p]) continue;
      for (int c = 0; c < cols; ++c) ASSERT_TRUE(std::signbit(results[1][p * cols + c])) << "dwpe row " << p;
    }

    // dwpe is optional.
    std::vector<float> dwte = dwte_start;
    ops.embedding_backward(tokens.data(), positions.data(), dy.data(), dwte.data(), nullptr, rows, cols, vocab_start,
                           vocab_end);
    expect_bits_equal(dwte, results[0], "dwte without dwpe");
  });
}

// --- cross-entropy ---------------------------------------------------------------------------

// Runs the four xent steps over one block of logits; returns per-row loss and the gradient block.
struct XentResult {
  std::vector<float> max, sumexp, target_logit, grad;
};

XentResult run_xent(const CpuOps& ops, const std::vector<float>& logits, int64_t rows, int64_t ld,
                    int64_t valid_cols, int64_t vocab_start, const std::vector<int32_t>& targets,
                    const std::vector<float>& dloss) {
  XentResult out{std::vector<float>(rows, kNaN), std::vector<float>(rows, kNaN), std::vector<float>(rows, kNaN),
                 logits};
  ops.xent_row_max(logits.data(), rows, ld, valid_cols, out.max.data());
  ops.xent_row_sumexp(logits.data(), rows, ld, valid_cols, out.max.data(), out.sumexp.data());
  ops.xent_target_logit(logits.data(), rows, ld, valid_cols, vocab_start, targets.data(), out.target_logit.data());
  ops.xent_backward(out.grad.data(), rows, ld, valid_cols, vocab_start, targets.data(), out.max.data(),
                    out.sumexp.data(), dloss.data());
  return out;
}

TEST(CpuOps, CrossEntropyMatchesReferenceAndIgnoresPadding) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t vocab = 101, ld = 128;
    for (int64_t rows : {1, 7, 33}) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      auto logits = random_floats(rows * ld, 80, -8.0f, 8.0f);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = vocab; c < ld; ++c) logits[r * ld + c] = 1e30f;  // padding: would dominate if it leaked in
      logits[3] = -kInf;                                                 // exp(-inf) must give 0, not NaN
      logits[4] = -1e4f;
      std::vector<int32_t> targets(rows);
      for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 29 + 5) % vocab);
      const auto dloss = random_floats(rows, 81, 0.1f, 2.0f);
      const XentResult result = run_xent(ops, logits, rows, ld, vocab, 0, targets, dloss);
      const XentReference ref = ref_xent(to_double(logits), rows, ld, vocab, 0, targets, to_double(dloss));
      expect_close(result.max, ref.max, kTol, "row_max");
      expect_close(result.sumexp, ref.sumexp, kTol, "row_sumexp");
      expect_close(result.target_logit, ref.target_logit, kTol, "target_logit");
      std::vector<float> loss(rows);
      for (int64_t r = 0; r < rows; ++r)
        loss[r] = std::log(result.sumexp[r]) + result.max[r] - result.target_logit[r];
      expect_close(loss, ref.loss, kTol, "loss");
      expect_close(result.grad, ref.grad, kTol, "dlogits");
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = vocab; c < ld; ++c) ASSERT_EQ(std::bit_cast<uint32_t>(result.grad[r * ld + c]), 0u);
      EXPECT_EQ(result.grad[3], 0.0f);
    }
  });
}

TEST(CpuOps, CrossEntropyGradientMatchesFiniteDifferences) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t rows = 3, vocab = 101, ld = 128;
    const auto logits = random_floats(rows * ld, 82, -4.0f, 4.0f);
    const std::vector<int32_t> targets{0, 57, 100};
    const auto dloss = random_floats(rows, 83, 0.5f, 1.5f);
    const XentResult result = run_xent(ops, logits, rows, ld, vocab, 0, targets, dloss);
    // loss_r = log(sum exp) + max - target, as the vocab-parallel steps compose it.
    const auto losses = [&](const std::vector<double>& v) {
      return ref_xent(v, rows, ld, vocab, 0, targets, std::vector<double>(rows, 1.0)).loss;
    };
    expect_close(result.grad, numeric_gradient(losses, to_double(logits), to_double(dloss)), kFiniteDifferenceTol,
                 "dlogits");
  });
}

TEST(CpuOps, CrossEntropyVocabShardsComposeToTheFullSoftmax) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t rows = 7, vocab = 101, ld = 128;
    const int64_t shard_ld = 64, shard_split = 50;  // shard 0: [0, 50), shard 1: [50, 101)
    const auto logits = random_floats(rows * ld, 84, -6.0f, 6.0f);
    std::vector<int32_t> targets(rows);
    for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 31 + 7) % vocab);
    targets[0] = 49;
    targets[1] = 50;
    const auto dloss = random_floats(rows, 85, 0.5f, 1.5f);
    const XentReference ref = ref_xent(to_double(logits), rows, ld, vocab, 0, targets, to_double(dloss));

    const int64_t starts[2] = {0, shard_split}, widths[2] = {shard_split, vocab - shard_split};
    std::vector<float> shards[2];
    std::vector<float> maxes[2], targets_local[2];
    for (int s = 0; s < 2; ++s) {
      shards[s].assign(rows * shard_ld, 1e30f);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < widths[s]; ++c) shards[s][r * shard_ld + c] = logits[r * ld + starts[s] + c];
      maxes[s].resize(rows);
      targets_local[s].resize(rows);
      ops.xent_row_max(shards[s].data(), rows, shard_ld, widths[s], maxes[s].data());
      ops.xent_target_logit(shards[s].data(), rows, shard_ld, widths[s], starts[s], targets.data(),
                            targets_local[s].data());
    }
    std::vector<float> global_max(rows), global_sumexp(rows, 0.0f), sumexp(rows);
    for (int64_t r = 0; r < rows; ++r) global_max[r] = std::max(maxes[0][r], maxes[1][r]);
    for (int s = 0; s < 2; ++s) {
      ops.xent_row_sumexp(shards[s].data(), rows, shard_ld, widths[s], global_max.data(), sumexp.data());
      for (int64_t r = 0; r < rows; ++r) global_sumexp[r] += sumexp[r];
    }
    std::vector<float> loss(rows);
    for (int64_t r = 0; r < rows; ++r)
      loss[r] = std::log(global_sumexp[r]) + global_max[r] - (targets_local[0][r] + targets_local[1][r]);
    expect_close(loss, ref.loss, kTol, "loss");
    for (int s = 0; s < 2; ++s) {
      ops.xent_backward(shards[s].data(), rows, shard_ld, widths[s], starts[s], targets.data(), global_max.data(),
                        global_sumexp.data(), dloss.data());
      std::vector<double> expected(rows * shard_ld, 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < widths[s]; ++c) expected[r * shard_ld + c] = ref.grad[r * ld + starts[s] + c];
      expect_close(shards[s], expected, kTol, "shard " + std::to_string(s) + " dlogits");
    }
  });
}

// The loss from the three global steps: masked row losses summed in fp64 in row order, so the
// result is exactly the sequential sum (and the same on every ISA).
TEST(CpuOps, CrossEntropyLossSumsAreMaskedRowLossesInRowOrder) {
  const int64_t rows = 9;
  const auto max = random_floats(rows, 86, -2.0f, 2.0f), target = random_floats(rows, 87, -4.0f, 1.0f);
  const auto sumexp = random_floats(rows, 88, 1.0f, 50.0f);
  std::vector<float> mask(rows, 1.0f);
  mask[2] = 0.0f;
  mask[5] = 0.25f;
  double loss = 0, tokens = 0;
  for (int64_t r = 0; r < rows; ++r) {
    loss += mask[r] * (std::log(static_cast<double>(sumexp[r])) + max[r] - target[r]);
    tokens += mask[r];
  }
  for_each_isa([&](const CpuOps& ops) {
    double loss_sum = -1, mask_sum = -1;
    ops.xent_loss_sums(max.data(), sumexp.data(), target.data(), mask.data(), rows, &loss_sum, &mask_sum);
    EXPECT_EQ(loss_sum, loss);
    EXPECT_EQ(mask_sum, tokens);
    ops.xent_loss_sums(max.data(), sumexp.data(), target.data(), nullptr, rows, &loss_sum, &mask_sum);
    EXPECT_EQ(mask_sum, static_cast<double>(rows));  // no mask: every row counts
  });
}

// The kernels' exp (seen through row_sumexp with one column and max 0) over the whole fp32 range.
TEST(CpuOps, SoftmaxExpIsAccurateAndSaturates) {
  for_each_isa([](const CpuOps& ops) {
    std::vector<float> x;
    for (float v = -87.0f; v <= 88.5f; v += 0.0137f) x.push_back(v);
    const int64_t n = static_cast<int64_t>(x.size());
    const std::vector<float> zeros(n, 0.0f);
    std::vector<float> result(n);
    ops.xent_row_sumexp(x.data(), n, 1, 1, zeros.data(), result.data());
    for (int64_t i = 0; i < n; ++i) {
      const double expected = std::exp(static_cast<double>(x[i]));
      ASSERT_NEAR(result[i], expected, 4e-7 * expected) << "exp(" << x[i] << ")";  // a few ulp
    }
    const std::vector<float> edges{-kInf, -1e30f, -200.0f, -104.0f, 89.0f, 1e30f, kInf, kNaN};
    std::vector<float> edge_result(edges.size());
    ops.xent_row_sumexp(edges.data(), static_cast<int64_t>(edges.size()), 1, 1, zeros.data(), edge_result.data());
    for (int i = 0; i < 4; ++i) EXPECT_EQ(edge_result[i], 0.0f) << "exp(" << edges[i] << ")";
    for (int i = 4; i < 7; ++i) EXPECT_EQ(edge_result[i], kInf) << "exp(" << edges[i] << ")";
    EXPECT_TRUE(std::isnan(edge_result[7]));
  });
}

// --- elementwise, bias, reductions -------------------------------------------------------------

TEST(CpuOps, AddScaleAndBiasOps) {
  for_each_isa([](const CpuOps& ops) {
    for (int64_t n : {1, 5, 67, 100003}) {
      const auto x = random_floats(n, 90), y0 = random_floats(n, 91);
      std::vector<float> y = y0;
      ops.add_inplace(y.data(), x.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], y0[i] + x[i]);
      ops.scale_inplace(y.data(), n, -0.75f);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], (y0[i] + x[i]) * -0.75f);
    }
    for (int64_t rows : {1, 7, 33})
      for (int cols : {1, 5, 67, 768}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
        const auto y0 = random_floats(rows * cols, 92), bias = random_floats(cols, 93);
        std::vector<float> y = y0;
        ops.bias_add(y.data(), bias.data(), rows, cols);
        for (int64_t r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) ASSERT_EQ(y[r * cols + c], y0[r * cols + c] + bias[c]);
        const auto dbias_before = random_floats(cols, 94);
        std::vector<float> dbias = dbias_before;
        ops.bias_backward(y0.data(), dbias.data(), rows, cols);
        std::vector<double> expected = to_double(dbias_before);
        for (int64_t r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) expected[c] += y0[r * cols + c];
        expect_close(dbias, expected, kTol, "dbias (accumulated)");
      }
  });
}

TEST(CpuOps, SumSquaresAccumulatesInDoubleIndependentOfThreads) {
  for_each_isa([](const CpuOps& ops) {
    for (int64_t n : {0, 1, 5, 67, (1 << 20) + 3}) {
      const auto x = random_floats(n, 95, -3.0f, 3.0f);
      double expected = 0;
      for (float v : x) expected += static_cast<double>(v) * v;
      double results[2];
      for (int threads : {1, 2}) with_threads(threads, [&] { results[threads - 1] = ops.sum_squares(x.data(), n); });
      EXPECT_NEAR(results[0], expected, 1e-12 * expected) << "n " << n;  // fp64 accumulation
      EXPECT_EQ(results[0], results[1]) << "n " << n;
    }
    // Squares fp32 could not hold: 1e20^2 overflows fp32, fp64 holds it.
    const std::vector<float> big{1e20f, 1e20f, 1.0f};
    const double big_squared = static_cast<double>(big[0]) * big[0];
    EXPECT_NEAR(ops.sum_squares(big.data(), 3), 2 * big_squared, 1e-15 * big_squared);
  });
}

TEST(CpuOps, AllFiniteDetectsNanAndInf) {
  for_each_isa([](const CpuOps& ops) {
    for (int64_t n : {1, 5, 67, 100003}) {
      auto x = random_floats(n, 96, -1e3f, 1e3f);
      x[0] = std::numeric_limits<float>::max();
      x[n - 1] = -std::numeric_limits<float>::max();
      EXPECT_TRUE(ops.all_finite(x.data(), n)) << "n " << n;
      for (float bad : {kNaN, kInf, -kInf, -kNaN})
        for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
          auto y = x;
          y[at] = bad;
          EXPECT_FALSE(ops.all_finite(y.data(), n)) << bad << " at " << at << " of " << n;
        }
    }
    EXPECT_TRUE(ops.all_finite(nullptr, 0));
  });
}

// --- dropout ---------------------------------------------------------------------------------

TEST(CpuOps, DropoutMatchesKeyedUniformAndIsLayoutIndependent) {
  for_each_isa([](const CpuOps& ops) {
    const DropoutKey key{1234, mt::kernels::stream_id("attn.dropout") ^ 3, 17, 0.3f};
    const float keep_scale = 1.0f / (1.0f - key.p);
    const int64_t rows = 10;
    const int cols = 67;
    std::vector<int64_t> row_ids(rows);
    for (int64_t r = 0; r < rows; ++r) row_ids[r] = 5 * 1024 + 100 + r * 3;  // global sample * seq + position
    const auto x = random_floats(rows * cols, 100, 0.5f, 1.5f);
    const int64_t col0 = 129;  // not a multiple of 4: blocks straddle the start
    std::vector<float> whole = x;
    ops.dropout_forward(whole.data(), rows, cols, row_ids.data(), col0, key);
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const float u = mt::kernels::keyed_uniform(key.seed, key.stream, key.iteration, row_ids[r], col0 + c);
        ASSERT_EQ(whole[r * cols + c], u >= key.p ? x[r * cols + c] * keep_scale : 0.0f) << r << "," << c;
      }
    // Rows [0, 5) and [5, 10) in two calls, and columns split at 7, give the same bits.
    std::vector<float> split_rows = x;
    ops.dropout_forward(split_rows.data(), 5, cols, row_ids.data(), col0, key);
    ops.dropout_forward(split_rows.data() + 5 * cols, 5, cols, row_ids.data() + 5, col0, key);
    expect_bits_equal(split_rows, whole, "rows split");
    std::vector<float> left(rows * 7), right(rows * (cols - 7));
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) (c < 7 ? left[r * 7 + c] : right[r * (cols - 7) + c - 7]) = x[r * cols + c];
    ops.dropout_forward(left.data(), rows, 7, row_ids.data(), col0, key);
    ops.dropout_forward(right.data(), rows, cols - 7, row_ids.data(), col0 + 7, key);
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        ASSERT_EQ(c < 7 ? left[r * 7 + c] : right[r * (cols - 7) + c - 7], whole[r * cols + c]) << r << "," << c;
    // Backward applies the same mask and scale.
    std::vector<float> grad = x;
    ops.dropout_backward(grad.data(), rows, cols, row_ids.data(), col0, key);
    expect_bits_equal(grad, whole, "backward");
    // Another iteration draws another mask; p = 0 is the identity.
    DropoutKey next = key;
    next.iteration += 1;
    std::vector<float> other = x;
    ops.dropout_forward(other.data(), rows, cols, row_ids.data(), col0, next);
    EXPECT_NE(other, whole);
    DropoutKey off = key;
    off.p = 0.0f;
    std::vector<float> same = x;
    ops.dropout_forward(same.data(), rows, cols, row_ids.data(), col0, off);
    expect_bits_equal(same, x, "p = 0");
  });
}

TEST(CpuOps, DropoutDropsFractionP) {
  for_each_isa([](const CpuOps& ops) {
    const int64_t rows = 256;
    const int cols = 1024;
    std::vector<int64_t> row_ids(rows);
    for (int64_t r = 0; r < rows; ++r) row_ids[r] = r;
    for (float p : {0.1f, 0.5f}) {
      const DropoutKey key{7, 11, 3, p};
      std::vector<float> x(rows * cols, 1.0f);
      ops.dropout_forward(x.data(), rows, cols, row_ids.data(), 0, key);
      int64_t dropped = 0;
      double sum = 0;
      for (float v : x) {
        dropped += v == 0.0f;
        sum += v;
      }
      const double n = static_cast<double>(x.size());
      const double sigma = std::sqrt(n * p * (1 - p));
      EXPECT_NEAR(static_cast<double>(dropped), n * p, 5 * sigma) << "p " << p;
      EXPECT_NEAR(sum / n, 1.0, 5 * sigma / n / (1 - p)) << "p " << p;  // unbiased: E[x] is kept
    }
  });
}

// --- optimizer -------------------------------------------------------------------------------

TEST(CpuOps, AdamWMatchesPyTorchFormula) {
  for_each_isa([](const CpuOps& ops) {
    for (int64_t n : {1, 7, 1003, 70001}) {
      SCOPED_TRACE("n " + std::to_string(n));
      const auto param0 = random_floats(n, 110);
      std::vector<float> param = param0, exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);
      std::vector<uint16_t> param_bf16(n, 0);
      std::vector<double> p_ref = to_double(param0), m_ref(n, 0.0), v_ref(n, 0.0);
      AdamWParams params;
      params.lr = 1e-2f;
      params.weight_decay = 0.1f;
      params.grad_scale = 0.5f;
      for (int step = 1; step <= 3; ++step) {
        const auto grad = random_floats(n, 111 + step, -2.0f, 2.0f);
        params.bias_correction1 = 1.0f - std::pow(params.beta1, static_cast<float>(step));
        params.bias_correction2 = 1.0f - std::pow(params.beta2, static_cast<float>(step));
        ops.adamw_update(param.data(), step == 3 ? param_bf16.data() : nullptr, grad.data(), exp_avg.data(),
                         exp_avg_sq.data(), n, params);
        for (int64_t i = 0; i < n; ++i) {
          const double g = static_cast<double>(grad[i]) * params.grad_scale;
          p_ref[i] *= 1.0 - static_cast<double>(params.lr) * params.weight_decay;
          m_ref[i] = params.beta1 * m_ref[i] + (1.0 - params.beta1) * g;
          v_ref[i] = params.beta2 * v_ref[i] + (1.0 - params.beta2) * g * g;
          const double denom = std::sqrt(v_ref[i]) / std::sqrt(static_cast<double>(params.bias_correction2)) +
                               params.eps;
          p_ref[i] -= static_cast<double>(params.lr) / params.bias_correction1 * m_ref[i] / denom;
        }
      }
      expect_close(param, p_ref, kTol, "param");
      expect_close(exp_avg, m_ref, kTol, "exp_avg");
      expect_close(exp_avg_sq, v_ref, kTol, "exp_avg_sq");
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(param_bf16[i], mt::kernels::fp32_to_bf16_bits(param[i])) << i;
    }
  });
}

}  // namespace
