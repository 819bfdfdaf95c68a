// A MoE layer's local experts (model/moe/experts.h) on the CPU table: forward and backward of both
// paths (the loop over experts and the grouped GEMM) against a double-precision loop over tokens,
// the backward against central differences of that loop's forward, the two paths against each
// other (fp32 and bf16), experts with no tokens (their grads untouched, an all-empty call), grads
// accumulating over calls, and the inputs refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "model/moe/experts.h"
#include "model/precision_gemm.h"

using namespace mt;
using namespace mt::model;

namespace {

const backend::Ops& cpu() { return backend::cpu_ops(); }

std::vector<float> uniform(size_t n, uint32_t seed, float low, float high) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

// One problem: the shape (weights of E_local experts at an offset inside a larger flat buffer,
// fc2 after fc1 with a gap), the rows per expert, and random weights, inputs, probs and d_out.
struct Problem {
  LocalExpertsShape shape;
  std::vector<int64_t> counts;
  int64_t rows = 0;
  std::vector<float> params, x, probs, d_out;

  Problem(int64_t experts, int64_t hidden, int64_t ffn, std::vector<int64_t> tokens, uint32_t seed = 1)
      : counts(std::move(tokens)) {
    shape.num_local_experts = experts;
    shape.hidden = hidden;
    shape.ffn = ffn;
    shape.fc1_offset = 11;
    shape.fc1_stride = 2 * ffn * hidden;
    shape.fc2_offset = shape.fc1_offset + experts * shape.fc1_stride + 5;
    shape.fc2_stride = hidden * ffn;
    rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    params = uniform(static_cast<size_t>(shape.fc2_offset + experts * shape.fc2_stride + 3), seed, -0.5f, 0.5f);
    x = uniform(static_cast<size_t>(rows * hidden), seed + 1, -1.0f, 1.0f);
    probs = uniform(static_cast<size_t>(rows), seed + 2, 0.0f, 1.0f);
    if (rows > 1) probs[1] = 0.0f;  // a zero prob still gets its grad
    d_out = uniform(static_cast<size_t>(rows * hidden), seed + 3, -1.0f, 1.0f);
  }
  int64_t fc1(int64_t e) const { return shape.fc1_offset + e * shape.fc1_stride; }
  int64_t fc2(int64_t e) const { return shape.fc2_offset + e * shape.fc2_stride; }
};

// ---- the double-precision loop over tokens -----------------------------------------------------

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double silu_derivative(double v) {
  const double s = 1.0 / (1.0 + std::exp(-v));
  return s * (1.0 + v * (1.0 - s));
}

struct Reference {
  std::vector<double> out, d_x, d_probs, d_params;  // d_params over the whole flat buffer
};

// out_r = W2_e (p_r * silu(W1g_e x_r) * (W1u_e x_r)) for each row r of its expert e, and with
// `backward` the grads of sum(d_out * out).
Reference reference(const Problem& p, const std::vector<double>& params, const std::vector<double>& x,
                    const std::vector<double>& probs, bool backward) {
  const int64_t C = p.shape.hidden, F = p.shape.ffn;
  Reference ref{std::vector<double>(p.rows * C), std::vector<double>(p.rows * C), std::vector<double>(p.rows),
                std::vector<double>(params.size())};
  std::vector<double> gate(F), up(F), act(F), d_act(F);
  for (int64_t e = 0, r = 0; e < p.shape.num_local_experts; ++e) {
    const double* w1 = params.data() + p.fc1(e);  // (2F, C): gate rows, then up rows
    const double* w2 = params.data() + p.fc2(e);  // (C, F)
    for (int64_t i = 0; i < p.counts[e]; ++i, ++r) {
      const double* xr = x.data() + r * C;
      for (int64_t f = 0; f < F; ++f) {
        gate[f] = up[f] = 0.0;
        for (int64_t c = 0; c < C; ++c) {
          gate[f] += w1[f * C + c] * xr[c];
          up[f] += w1[(F + f) * C + c] * xr[c];
        }
        act[f] = silu(gate[f]) * up[f];
      }
      for (int64_t c = 0; c < C; ++c) {
        double sum = 0.0;
        for (int64_t f = 0; f < F; ++f) sum += w2[c * F + f] * probs[r] * act[f];
        ref.out[r * C + c] = sum;
      }
      if (!backward) continue;
      const float* dy = p.d_out.data() + r * C;
      double* dw1 = ref.d_params.data() + p.fc1(e);
      double* dw2 = ref.d_params.data() + p.fc2(e);
      for (int64_t f = 0; f < F; ++f) {
        double d_scaled = 0.0;
        for (int64_t c = 0; c < C; ++c) {
          d_scaled += dy[c] * w2[c * F + f];
          dw2[c * F + f] += dy[c] * probs[r] * act[f];
        }
        ref.d_probs[r] += d_scaled * act[f];
        d_act[f] = probs[r] * d_scaled;
      }
      for (int64_t f = 0; f < F; ++f) {
        const double d_gate = d_act[f] * up[f] * silu_derivative(gate[f]), d_up = d_act[f] * silu(gate[f]);
        for (int64_t c = 0; c < C; ++c) {
          dw1[f * C + c] += d_gate * xr[c];
          dw1[(F + f) * C + c] += d_up * xr[c];
          ref.d_x[r * C + c] += d_gate * w1[f * C + c] + d_up * w1[(F + f) * C + c];
        }
      }
    }
  }
  return ref;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

Reference reference(const Problem& p) { return reference(p, widen(p.params), widen(p.x), widen(p.probs), true); }

// ---- running LocalExperts ----------------------------------------------------------------------

struct Result {
  std::vector<float> out, d_x, d_probs, grads;
};

// Forward and backward of `path` in `precision`; grads start from `initial_grads` (zeros if empty).
Result run(const Problem& p, ExpertGemmPath path, Precision precision = Precision::fp32,
           const backend::Ops& ops = cpu(), std::vector<float> initial_grads = {}, int calls = 1) {
  const LocalExperts experts(p.shape, path);
  GemmWeights weights(ops, precision, static_cast<int64_t>(p.params.size()));
  weights.refresh(p.params.data());
  Result result{std::vector<float>(p.rows * p.shape.hidden, NAN), std::vector<float>(p.rows * p.shape.hidden, NAN),
                std::vector<float>(p.rows, NAN),
                initial_grads.empty() ? std::vector<float>(p.params.size(), 0.0f) : std::move(initial_grads)};
  const int64_t capacity = p.rows + 3;
  std::vector<float> saved_block(experts.saved_floats(capacity)),
      workspace_block(experts.workspace_floats(capacity, precision));
  BufferSource saved_source(saved_block.data()), workspace_source(workspace_block.data());
  const ExpertsSaved saved = experts.lay_out_saved(saved_source, capacity);
  const ExpertsWorkspace workspace = experts.lay_out_workspace(workspace_source, capacity, precision);
  const ExpertsContext ctx{ops, ops.default_stream(), weights, p.params.data(), result.grads.data()};
  const ExpertRows rows{p.x.data(), p.probs.data(), p.counts.data(), p.rows};
  for (int call = 0; call < calls; ++call) {
    experts.forward(ctx, rows, saved, workspace, result.out.data());
    experts.backward(ctx, rows, saved, workspace, p.d_out.data(), result.d_x.data(), result.d_probs.data());
  }
  return result;
}

// |actual - expected| <= tol (|expected| + rms(expected)) elementwise; the first miss reported.
void expect_close(const std::string& what, const std::vector<float>& actual, const std::vector<double>& expected,
                  double tol) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double squares = 0.0;
  for (double v : expected) squares += v * v;
  const double rms = expected.empty() ? 0.0 : std::sqrt(squares / expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_LE(std::abs(actual[i] - expected[i]), tol * (std::abs(expected[i]) + rms))
        << what << "[" << i << "] = " << actual[i] << ", expected " << expected[i];
  }
}

void expect_close(const std::string& what, const std::vector<float>& actual, const std::vector<float>& expected,
                  double tol) {
  expect_close(what, actual, widen(expected), tol);
}

Problem mixed_problem() { return Problem(4, 13, 7, {5, 0, 9, 1}); }

}  // namespace

TEST(LocalExperts, BothPathsMatchADoubleLoopOverTokens) {
  const Problem p = mixed_problem();
  const Reference ref = reference(p);
  for (ExpertGemmPath path : {ExpertGemmPath::loop, ExpertGemmPath::grouped}) {
    SCOPED_TRACE(expert_gemm_path_name(path));
    const Result r = run(p, path);
    expect_close("out", r.out, ref.out, 1e-5);
    expect_close("d_x", r.d_x, ref.d_x, 1e-5);
    expect_close("d_probs", r.d_probs, ref.d_probs, 1e-5);
    expect_close("grads", r.grads, ref.d_params, 1e-5);
  }
}

// d f / d at by central differences (step 1e-6 max(1, |x|)), f evaluated in double.
std::vector<double> central_differences(const std::function<double(const std::vector<double>&)>& f,
                                        std::vector<double> at) {
  std::vector<double> grad(at.size());
  for (size_t i = 0; i < at.size(); ++i) {
    const double keep = at[i], h = 1e-6 * std::max(1.0, std::abs(keep));
    at[i] = keep + h;
    const double plus = f(at);
    at[i] = keep - h;
    const double minus = f(at);
    at[i] = keep;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

// Central differences of the double loop's forward, sum(d_out * out), against the backward of both
// paths: every input, prob and weight element (the weights outside the experts' included: 0).
TEST(LocalExperts, BackwardMatchesCentralDifferences) {
  const Problem p(3, 6, 4, {3, 0, 2});
  const std::vector<double> params = widen(p.params), x = widen(p.x), probs = widen(p.probs);
  const auto objective = [&](const std::vector<double>& w, const std::vector<double>& in,
                             const std::vector<double>& gates) {
    const std::vector<double> out = reference(p, w, in, gates, false).out;
    double sum = 0.0;
    for (size_t i = 0; i < out.size(); ++i) sum += p.d_out[i] * out[i];
    return sum;
  };
  const auto d_params = central_differences([&](const auto& at) { return objective(at, x, probs); }, params);
  const auto d_x = central_differences([&](const auto& at) { return objective(params, at, probs); }, x);
  const auto d_probs = central_differences([&](const auto& at) { return objective(params, x, at); }, probs);
  for (ExpertGemmPath path : {ExpertGemmPath::loop, ExpertGemmPath::grouped}) {
    SCOPED_TRACE(expert_gemm_path_name(path));
    const Result r = run(p, path);
    expect_close("d_x", r.d_x, d_x, 1e-4);
    expect_close("d_probs", r.d_probs, d_probs, 1e-4);
    expect_close("grads", r.grads, d_params, 1e-4);
  }
}

// At the widths of tiny-mixtral (hidden 64, expert ffn 128, 8 experts) with uneven and empty
// experts, more rows than one of the grouped GEMM's tiles: the paths agree within fp32 rounding.
TEST(LocalExperts, LoopAndGroupedPathsAgree) {
  const Problem p(8, 64, 128, {0, 1, 7, 300, 0, 64, 2, 0});
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    const Result loop = run(p, ExpertGemmPath::loop, precision);
    const Result grouped = run(p, ExpertGemmPath::grouped, precision);
    expect_close("out", grouped.out, loop.out, 1e-5);
    expect_close("d_x", grouped.d_x, loop.d_x, 1e-5);
    expect_close("d_probs", grouped.d_probs, loop.d_probs, 1e-5);
    expect_close("grads", grouped.grads, loop.grads, 1e-5);
  }
}

// bf16 rounds the GEMM operands only: near the fp32 result.
TEST(LocalExperts, Bf16StaysNearFp32) {
  const Problem p = mixed_problem();
  const Result fp32 = run(p, ExpertGemmPath::grouped, Precision::fp32);
  for (ExpertGemmPath path : {ExpertGemmPath::loop, ExpertGemmPath::grouped}) {
    const Result bf16 = run(p, path, Precision::bf16);
    expect_close("out", bf16.out, fp32.out, 2e-2);
    expect_close("grads", bf16.grads, fp32.grads, 2e-2);
  }
}

// Experts without tokens leave their grads as they were (bit for bit), and a call where no expert
// has a token runs and changes no grad.
TEST(LocalExperts, EmptyExpertsLeaveTheirGrads) {
  for (ExpertGemmPath path : {ExpertGemmPath::loop, ExpertGemmPath::grouped}) {
    SCOPED_TRACE(expert_gemm_path_name(path));
    const Problem p = mixed_problem();  // expert 1 has no token
    const std::vector<float> initial = uniform(p.params.size(), 9, -1.0f, 1.0f);
    const Result r = run(p, path, Precision::fp32, cpu(), initial);
    for (int64_t i = 0; i < p.shape.fc1_stride; ++i) ASSERT_EQ(r.grads[p.fc1(1) + i], initial[p.fc1(1) + i]) << i;
    for (int64_t i = 0; i < p.shape.fc2_stride; ++i) ASSERT_EQ(r.grads[p.fc2(1) + i], initial[p.fc2(1) + i]) << i;
    EXPECT_NE(r.grads[p.fc1(0)], initial[p.fc1(0)]);

    const Problem none(3, 5, 4, {0, 0, 0});
    const std::vector<float> none_initial = uniform(none.params.size(), 10, -1.0f, 1.0f);
    EXPECT_EQ(run(none, path, Precision::fp32, cpu(), none_initial).grads, none_initial);
  }
}

TEST(LocalExperts, WeightGradsAccumulateOverCalls) {
  const Problem p = mixed_problem();
  for (ExpertGemmPath path : {ExpertGemmPath::loop, ExpertGemmPath::grouped}) {
    const Result once = run(p, path), twice = run(p, path, Precision::fp32, cpu(), {}, 2);
    std::vector<double> doubled(once.grads.size());
    for (size_t i = 0; i < doubled.size(); ++i) doubled[i] = 2.0 * once.grads[i];
    expect_close("grads", twice.grads, doubled, 1e-6);
    EXPECT_EQ(twice.d_x, once.d_x);  // input grads are written, not accumulated
    EXPECT_EQ(twice.d_probs, once.d_probs);
  }
}

TEST(LocalExperts, RefusesBadShapesCountsAndBackends) {
  LocalExpertsShape shape{2, 4, 3, 0, 24, 48, 12};
  EXPECT_NO_THROW(LocalExperts(shape, ExpertGemmPath::grouped));
  shape.fc1_stride = 23;
  EXPECT_THROW(LocalExperts(shape, ExpertGemmPath::grouped), Error);
  shape.fc1_stride = 24;
  shape.fc2_stride = 11;
  EXPECT_THROW(LocalExperts(shape, ExpertGemmPath::loop), Error);
  shape.fc2_stride = 12;
  shape.num_local_experts = 0;
  EXPECT_THROW(LocalExperts(shape, ExpertGemmPath::loop), Error);

  Problem p = mixed_problem();
  p.counts[2] += 1;  // sums to one more than the rows
  EXPECT_THROW(run(p, ExpertGemmPath::grouped), Error);
  p.counts[2] -= 2;
  p.counts[0] += 1;  // sums right, but a count is negative
  p.counts[1] = -1;
  p.counts[2] += 1;
  EXPECT_THROW(run(p, ExpertGemmPath::loop), Error);

  backend::Ops without = cpu();
  without.grouped_gemm = nullptr;
  const Problem q = mixed_problem();
  try {
    run(q, ExpertGemmPath::grouped, Precision::fp32, without);
    ADD_FAILURE() << "a table without grouped_gemm ran the grouped path";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grouped_gemm"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(run(q, ExpertGemmPath::loop, Precision::fp32, without));
}

TEST(LocalExperts, RefusesMoreRowsThanTheBuffersHold) {
  const Problem p = mixed_problem();
  const LocalExperts experts(p.shape, ExpertGemmPath::grouped);
  GemmWeights weights(cpu(), Precision::fp32, static_cast<int64_t>(p.params.size()));
  std::vector<float> grads(p.params.size()), out(p.rows * p.shape.hidden);
  const int64_t capacity = p.rows - 1;
  std::vector<float> saved_block(experts.saved_floats(capacity)),
      workspace_block(experts.workspace_floats(capacity, Precision::fp32));
  BufferSource saved_source(saved_block.data()), workspace_source(workspace_block.data());
  const ExpertsSaved saved = experts.lay_out_saved(saved_source, capacity);
  const ExpertsWorkspace workspace = experts.lay_out_workspace(workspace_source, capacity, Precision::fp32);
  const ExpertsContext ctx{cpu(), cpu().default_stream(), weights, p.params.data(), grads.data()};
  EXPECT_THROW(
      experts.forward(ctx, {p.x.data(), p.probs.data(), p.counts.data(), p.rows}, saved, workspace, out.data()), Error);
  EXPECT_EQ(experts.saved_floats(16), 16 * 3 * 7);  // fc1 (16, 14) and act (16, 7), both 64-byte multiples
}
