// FP8 mode of PrecisionGemm (issue 23) on the CPU emulation: forward, data and weight grads against
// double references before and after the delayed-scaling update (a broken update leaves them far
// off), the shape refusal, and Fp8Scaling's refusal of a backend without the FP8 entries. Training
// under FP8: tests/unit/train/test_fp8_training.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "core/error.h"
#include "model/fp8_scaling.h"
#include "model/layout.h"
#include "model/precision_gemm.h"

using namespace mt;

namespace {

// ---- PrecisionGemm in FP8 mode on one linear ---------------------------------------------------

constexpr int64_t kRows = 32, kIn = 64, kOut = 48;

std::vector<float> random_values(int64_t n, float magnitude, uint32_t seed) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, magnitude);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = normal(random);
  return values;
}

// rms(actual - expected) / rms(expected).
double relative_error(const std::vector<float>& actual, const std::vector<double>& expected) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff += (actual[i] - expected[i]) * (actual[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  return std::sqrt(diff / norm);
}

struct OneLinear {
  const backend::Ops& ops = backend::cpu_ops();
  model::ParamLayout layout;
  std::vector<float> weight = random_values(kOut * kIn, 1e-3f, 1);  // (out, in): e4m3's subnormals at scale 1
  std::vector<float> grads = std::vector<float>(static_cast<size_t>(kOut * kIn), 0.0f);
  std::vector<float> operands0 = std::vector<float>(static_cast<size_t>(kRows * kIn), 0.0f);
  std::vector<float> operands1 = std::vector<float>(static_cast<size_t>(kRows * kIn), 0.0f);
  std::unique_ptr<model::GemmWeights> weights;
  std::unique_ptr<model::Fp8Scaling> scaling;
  std::unique_ptr<model::PrecisionGemm> gemm;

  explicit OneLinear(model::Fp8Format format) {
    model::ParamEntry entry;
    entry.name = "decoder.layers.0.mlp.linear_fc1.weight";
    entry.layer = 0;
    entry.local_shape = {kOut, kIn};
    entry.numel = kOut * kIn;
    layout.entries.push_back(entry);
    layout.total_elements = entry.numel;
    model::Fp8Config config;
    config.enabled = true;
    config.format = format;
    weights = std::make_unique<model::GemmWeights>(ops, Precision::bf16, entry.numel);
    weights->refresh(weight.data());
    scaling = std::make_unique<model::Fp8Scaling>(ops, config, layout, 2);
    gemm = std::make_unique<model::PrecisionGemm>(ops, *weights);
    gemm->bind(weight.data(), grads.data());
    gemm->set_operand_buffers(operands0.data(), operands1.data());
    gemm->set_fp8(scaling.get());
  }
};

std::vector<double> reference_forward(const std::vector<float>& x, const std::vector<float>& w) {
  std::vector<double> y(static_cast<size_t>(kRows * kOut));
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t o = 0; o < kOut; ++o) {
      double sum = 0;
      for (int64_t i = 0; i < kIn; ++i) sum += static_cast<double>(x[r * kIn + i]) * w[o * kIn + i];
      y[r * kOut + o] = sum;
    }
  return y;
}

TEST(Fp8PrecisionGemm, ForwardIsCloseOnceTheScalesFollowTheAmaxes) {
  OneLinear linear(model::Fp8Format::hybrid);
  EXPECT_EQ(linear.scaling->linear(0), 0);
  EXPECT_EQ(linear.scaling->linear(16), -1);
  const std::vector<float> x = random_values(kRows * kIn, 2e-3f, 2);
  const std::vector<double> want = reference_forward(x, linear.weight);
  std::vector<float> y(static_cast<size_t>(kRows * kOut));
  linear.gemm->linear_forward(x.data(), kRows, kIn, 0, kOut, y.data());
  const double first = relative_error(y, want);  // scale 1: most values below e4m3's least normal
  linear.scaling->update_scales();
  linear.gemm->linear_forward(x.data(), kRows, kIn, 0, kOut, y.data());
  const double second = relative_error(y, want);
  EXPECT_GT(first, 0.2) << "scale 1 should lose the tiny values";
  EXPECT_LT(second, 0.04) << "e4m3 x e4m3 with scales from the amaxes";
  // The scales are 448 / amax.
  double x_amax = 0, w_amax = 0;
  for (float v : x) x_amax = std::max(x_amax, std::fabs(static_cast<double>(v)));
  for (float v : linear.weight) w_amax = std::max(w_amax, std::fabs(static_cast<double>(v)));
  EXPECT_EQ(*linear.scaling->scale(0, model::Fp8Operand::input), static_cast<float>(448.0 / x_amax));
  EXPECT_EQ(*linear.scaling->scale(0, model::Fp8Operand::weight), static_cast<float>(448.0 / w_amax));
}

TEST(Fp8PrecisionGemm, DataAndWeightGradsAreCloseWithE5m2Grads) {
  for (model::Fp8Format format : {model::Fp8Format::hybrid, model::Fp8Format::e4m3}) {
    OneLinear linear(format);
    const std::vector<float> x = random_values(kRows * kIn, 2e-3f, 3);
    const std::vector<float> dy = random_values(kRows * kOut, 1e-6f, 4);  // below e5m2's least subnormal at scale 1
    std::vector<double> want_dx(static_cast<size_t>(kRows * kIn)), want_dw(static_cast<size_t>(kOut * kIn));
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t i = 0; i < kIn; ++i) {
        double sum = 0;
        for (int64_t o = 0; o < kOut; ++o) sum += static_cast<double>(dy[r * kOut + o]) * linear.weight[o * kIn + i];
        want_dx[r * kIn + i] = sum;
      }
    for (int64_t o = 0; o < kOut; ++o)
      for (int64_t i = 0; i < kIn; ++i) {
        double sum = 0;
        for (int64_t r = 0; r < kRows; ++r) sum += static_cast<double>(dy[r * kOut + o]) * x[r * kIn + i];
        want_dw[o * kIn + i] = sum;
      }
    std::vector<float> dx(static_cast<size_t>(kRows * kIn));
    linear.gemm->linear_backward_input(dy.data(), kRows, kOut, 0, kIn, dx.data());
    linear.gemm->linear_backward_weight(dy.data(), x.data(), kRows, kOut, kIn, 0);
    EXPECT_GT(relative_error(dx, want_dx), 0.5) << "scale 1 should lose grads of 1e-6";
    linear.scaling->update_scales();
    std::fill(linear.grads.begin(), linear.grads.end(), 0.0f);
    linear.gemm->linear_backward_input(dy.data(), kRows, kOut, 0, kIn, dx.data());
    linear.gemm->linear_backward_weight(dy.data(), x.data(), kRows, kOut, kIn, 0);
    // e5m2 keeps 2 mantissa bits (relative rounding error up to 2^-3), e4m3 3 bits (2^-4).
    const double bound = format == model::Fp8Format::hybrid ? 0.08 : 0.04;
    EXPECT_LT(relative_error(dx, want_dx), bound);
    EXPECT_LT(relative_error(linear.grads, want_dw), bound);
    EXPECT_EQ(linear.scaling->type(model::Fp8Operand::output_grad),
              format == model::Fp8Format::hybrid ? kernels::Fp8Type::e5m2 : kernels::Fp8Type::e4m3);
  }
}

TEST(Fp8PrecisionGemm, RefusesShapesNotMultiplesOf16ByName) {
  OneLinear linear(model::Fp8Format::hybrid);
  std::vector<float> x(static_cast<size_t>(kRows * kIn)), y(static_cast<size_t>(kRows * kOut));
  try {
    linear.gemm->linear_forward(x.data(), 24, kIn, 0, kOut, y.data());
    FAIL() << "24 tokens accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
  }
}

TEST(Fp8Scaling, RefusesABackendWithoutTheFp8Entries) {
  backend::Ops ops = backend::cpu_ops();
  ops.name = "test";
  ops.gemm_fp8 = nullptr;
  model::Fp8Config config;
  config.enabled = true;
  try {
    model::Fp8Scaling scaling(ops, config, model::ParamLayout{}, 2);
    FAIL() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_fp8"), std::string::npos) << e.what();
  }
}

}  // namespace
