// When the FP8 scales change (issue 23): Fp8Scaling's phases driven the way a stage drives them
// (forward and backward of each micro-batch, two in flight, a recompute) against a reference loop
// of Transformer Engine's delayed scaling written here without mt's classes: TE's amax history in
// its own layout (slot 0 the amax being gathered; an update reads it, rolls the history by -1 and
// zeroes slot 0), the forward group reduced and updated at every forward's fp8_autocast exit, the
// backward group at every backward's end, the weight quantized once per step (Megatron's
// is_first_microbatch), the input of a backward or recompute quantized with its forward's scale.
// Each reduction goes through a stand-in for the other ranks of the amax group (a MAX with known
// values), so the test also checks which amaxes are reduced when. Source of the rule: TE
// transformer_engine/pytorch/fp8.py (1.x) and quantization.py (2.x) FP8GlobalStateManager
// (autocast exit, reduce_and_update_fp8_tensors), module/linear.py (reduce_and_update_bwd_fp8_tensors).
// Multi-token prediction's two fp8_autocasts per depth (Megatron-Core multi_token_prediction.py)
// against the same reference with three linears: each region's end updates all of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "kernels/common/fp8.h"
#include "model/fp8_scaling.h"
#include "model/layout.h"
#include "model/precision_gemm.h"

using namespace mt;

namespace {

constexpr int64_t kRows = 32, kIn = 64, kOut = 48, kHistory = 3;
constexpr int kSteps = 3, kMicroBatches = 3;

std::vector<float> random_values(int64_t n, float magnitude, uint32_t seed) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, magnitude);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = normal(random);
  return values;
}

float abs_max(const std::vector<float>& values) {
  float m = 0;
  for (float v : values) m = std::max(m, std::fabs(v));
  return m;
}

// ---- the reference: one TE FP8 tensor ----------------------------------------------------------

struct TeTensor {
  float fp8_max = 448.0f;
  std::vector<float> amax_history = std::vector<float>(kHistory, 0.0f);  // TE's layout: [0] being gathered
  float scale = 1.0f, scale_inv = 1.0f;

  void record(float amax) { amax_history[0] = std::max(amax_history[0], amax); }
  // _default_get_amax_and_update_history + _update_amax_history + _default_sf_compute, margin 0.
  void update(bool max_algo) {
    float amax = amax_history[0];
    if (max_algo) amax = *std::max_element(amax_history.begin(), amax_history.end());
    std::rotate(amax_history.begin(), amax_history.begin() + 1, amax_history.end());  // torch.roll(-1)
    amax_history[0] = 0.0f;
    float sf = fp8_max / amax;
    if (!(amax > 0.0f) || !std::isfinite(amax)) sf = scale;
    if (std::isinf(sf)) sf = FLT_MAX;
    scale = sf;
    scale_inv = 1.0f / sf;
  }
  // The past amaxes newest first (TE keeps kHistory - 1 of them between updates).
  std::vector<float> past_newest_first() const {
    std::vector<float> past;
    for (int64_t i = kHistory - 1; i >= 1; --i) past.push_back(amax_history[static_cast<size_t>(i)]);
    return past;
  }
};

// The other ranks of the amax group: their amax for reduction `call`, tensor `i`.
float peer_amax(int call, int64_t i) { return 0.25f * static_cast<float>(1 + (call * 7 + i * 3) % 9); }

// y (rows, out) = x . W^T through FP8 codes of both, as a GEMM of decoded codes would.
std::vector<float> fp8_product(const std::vector<float>& a, float a_scale, kernels::Fp8Type a_type,
                               const std::vector<float>& b, float b_scale, kernels::Fp8Type b_type, int64_t m,
                               int64_t n, int64_t k) {
  auto decoded = [](const std::vector<float>& values, float scale, kernels::Fp8Type type) {
    std::vector<float> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = kernels::fp8_to_fp32(kernels::fp32_to_fp8(values[i] * scale, type), type);
    return out;
  };
  const std::vector<float> a8 = decoded(a, a_scale, a_type), b8 = decoded(b, b_scale, b_type);
  std::vector<float> c(static_cast<size_t>(m * n), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += a8[i * k + p] * b8[j * k + p];
      c[i * n + j] = sum / a_scale / b_scale;
    }
  }
  return c;
}

std::vector<float> transposed(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> t(a.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  }
  return t;
}

void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  float scale = abs_max(want), worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LE(worst, 1e-5f * scale) << what << ": worst difference " << worst << " of " << scale;
}

model::ParamLayout one_linear_layout() {
  model::ParamLayout layout;
  model::ParamEntry entry;
  entry.name = "decoder.layers.0.mlp.linear_fc1.weight";
  entry.layer = 0;
  entry.local_shape = {kOut, kIn};
  entry.numel = kOut * kIn;
  layout.entries.push_back(entry);
  layout.total_elements = entry.numel;
  return layout;
}

// One step's schedule with two micro-batches in flight: F0 F1 B0 F2 B1 B2 (B1 recomputes first).
struct Event {
  bool forward;
  int micro_batch;
};
const Event kSchedule[] = {{true, 0}, {true, 1}, {false, 0}, {true, 2}, {false, 1}, {false, 2}};

void run_against_reference(kernels::Fp8AmaxAlgo algo) {
  const bool max_algo = algo == kernels::Fp8AmaxAlgo::max;
  const backend::Ops& ops = backend::cpu_ops();
  model::Fp8Config config;
  config.enabled = true;
  config.format = model::Fp8Format::hybrid;
  config.amax_history_len = kHistory;
  config.amax_compute_algo = algo;
  const model::ParamLayout layout = one_linear_layout();
  model::Fp8Scaling scaling(ops, config, layout, 1);
  scaling.reserve_slots(2);
  int reductions = 0;
  std::vector<int64_t> reduced_counts;
  scaling.set_amax_reduction([&](float* amaxes, int64_t count) {
    for (int64_t i = 0; i < count; ++i) amaxes[i] = std::max(amaxes[i], peer_amax(reductions, i));
    reduced_counts.push_back(count);
    ++reductions;
  });
  std::vector<float> weight = random_values(kOut * kIn, 0.05f, 11);
  model::GemmWeights weights{ops, Precision::bf16, kOut * kIn};
  std::vector<float> grads(static_cast<size_t>(kOut * kIn), 0.0f);
  std::vector<float> operands0(static_cast<size_t>(kRows * kIn * 2)), operands1(operands0.size());
  model::PrecisionGemm gemm(ops, weights);
  gemm.bind(weight.data(), grads.data());
  gemm.set_operand_buffers(operands0.data(), operands1.data());
  gemm.set_fp8(&scaling);

  TeTensor input, weight_te, grad;
  grad.fp8_max = 57344.0f;
  std::vector<float> reference_grads(grads.size(), 0.0f);
  const kernels::Fp8Type e4m3 = kernels::Fp8Type::e4m3, e5m2 = kernels::Fp8Type::e5m2;
  int reference_reductions = 0;
  auto reduce_reference = [&](std::vector<TeTensor*> group) {
    for (size_t i = 0; i < group.size(); ++i) group[i]->record(peer_amax(reference_reductions, static_cast<int64_t>(i)));
    ++reference_reductions;
  };
  auto expect_state = [&](const std::string& when) {
    const std::pair<model::Fp8Operand, const TeTensor*> tensors[] = {
        {model::Fp8Operand::input, &input}, {model::Fp8Operand::weight, &weight_te}, {model::Fp8Operand::output_grad, &grad}};
    for (const auto& [operand, te] : tensors) {
      const std::string what = when + ", operand " + std::to_string(static_cast<int>(operand));
      EXPECT_EQ(*scaling.scale(0, operand), te->scale) << what;
      EXPECT_EQ(*scaling.scale_inv(0, operand), te->scale_inv) << what;
      const std::vector<float> past = te->past_newest_first();
      const std::vector<float> history(scaling.amax_history(0, operand), scaling.amax_history(0, operand) + past.size());
      EXPECT_EQ(history, past) << what << ": the amax history, newest first";
    }
  };

  for (int step = 0; step < kSteps; ++step) {
    for (float& w : weight) w *= 1.0f + 0.3f * static_cast<float>(step);  // the optimizer moved the weights
    weights.refresh(weight.data());
    scaling.start_step();
    bool weight_quantized = false;
    float weight_scale_of_step = 0;
    std::vector<float> x[kMicroBatches], dy[kMicroBatches], y[kMicroBatches];
    float input_scale_of[kMicroBatches] = {};
    for (int m = 0; m < kMicroBatches; ++m) {
      const float size = 1.0f + static_cast<float>((step * kMicroBatches + m) % 4);  // amaxes that change
      x[m] = random_values(kRows * kIn, size, 100 + 10 * step + m);
      dy[m] = random_values(kRows * kOut, 1e-3f * size, 200 + 10 * step + m);
    }
    for (const Event& event : kSchedule) {
      const int m = event.micro_batch;
      const std::string when = "step " + std::to_string(step) + (event.forward ? " forward " : " backward ") +
                               std::to_string(m) + (max_algo ? " (max)" : " (most_recent)");
      if (event.forward) {
        y[m].assign(static_cast<size_t>(kRows * kOut), 0.0f);
        scaling.begin_forward(m % 2, true);
        gemm.linear_forward(x[m].data(), kRows, kIn, 0, kOut, y[m].data());
        scaling.end_forward();
        // TE: the input quantizes with its live scale; the weight at the step's first forward.
        input_scale_of[m] = input.scale;
        input.record(abs_max(x[m]));
        if (!weight_quantized) {
          weight_quantized = true;
          weight_scale_of_step = weight_te.scale;
          weight_te.record(abs_max(weight));
        }
        expect_near_all(y[m], fp8_product(x[m], input_scale_of[m], e4m3, weight, weight_scale_of_step, e4m3, kRows, kOut, kIn),
                        when + ": y");
        reduce_reference({&input, &weight_te});
        input.update(max_algo);
        weight_te.update(max_algo);
      } else {
        scaling.begin_backward(m % 2);
        if (m == 1) {  // a recompute of the forward: the forward's codes again, no amax recorded
          std::vector<float> again(y[m].size(), 0.0f);
          scaling.begin_recompute();
          gemm.linear_forward(x[m].data(), kRows, kIn, 0, kOut, again.data());
          scaling.end_recompute();
          EXPECT_EQ(again, y[m]) << when << ": the recompute equals the forward bit for bit";
        }
        std::vector<float> dx(static_cast<size_t>(kRows * kIn), 0.0f);
        gemm.linear_backward_input(dy[m].data(), kRows, kOut, 0, kIn, dx.data());
        gemm.linear_backward_weight(dy[m].data(), x[m].data(), kRows, kOut, kIn, 0);
        scaling.end_backward();
        // TE: the output grad with the live backward scale, the saved FP8 weight and input.
        const std::vector<float> w_t = transposed(weight, kOut, kIn);  // (in, out)
        expect_near_all(dx, fp8_product(dy[m], grad.scale, e5m2, w_t, weight_scale_of_step, e4m3, kRows, kIn, kOut),
                        when + ": dx");
        const std::vector<float> dw = fp8_product(transposed(dy[m], kRows, kOut), grad.scale, e5m2,
                                                  transposed(x[m], kRows, kIn), input_scale_of[m], e4m3, kOut, kIn, kRows);
        for (size_t i = 0; i < dw.size(); ++i) reference_grads[i] += dw[i];
        expect_near_all(grads, reference_grads, when + ": dW accumulated");
        grad.record(abs_max(dy[m]));
        reduce_reference({&grad});
        grad.update(max_algo);
      }
      expect_state(when);
    }
  }
  EXPECT_EQ(reductions, reference_reductions);
  const std::vector<int64_t> per_event = {2, 2, 1, 2, 1, 1};  // forward group (input, weight), backward group
  ASSERT_EQ(reduced_counts.size(), per_event.size() * kSteps);
  for (size_t i = 0; i < reduced_counts.size(); ++i) EXPECT_EQ(reduced_counts[i], per_event[i % per_event.size()]);
}

TEST(Fp8MicroBatchScaling, ScalesAndHistoriesFollowTransformerEnginesRuleUnderMax) {
  run_against_reference(kernels::Fp8AmaxAlgo::max);
}

TEST(Fp8MicroBatchScaling, ScalesAndHistoriesFollowTransformerEnginesRuleUnderMostRecent) {
  run_against_reference(kernels::Fp8AmaxAlgo::most_recent);
}

// ---- multi-token prediction: two more fp8_autocasts per depth -----------------------------------

// A decoder linear (layer 0 of a 1-layer model), then an MTP depth's eh_proj and its layer's
// linear (layer id 1 = L + 0), each (kOut, kIn).
model::ParamLayout mtp_layout() {
  model::ParamLayout layout;
  for (const char* name : {"decoder.layers.0.mlp.linear_fc1.weight", "mtp.layers.0.eh_proj.weight",
                           "decoder.layers.1.mlp.linear_fc1.weight"}) {
    model::ParamEntry entry;
    entry.name = name;
    entry.layer = layout.entries.empty() ? 0 : 1;
    entry.local_shape = {kOut, kIn};
    entry.numel = kOut * kIn;
    entry.offset = layout.total_elements;
    layout.entries.push_back(entry);
    layout.total_elements += entry.numel;
  }
  return layout;
}

// One linear of the reference: its three TE tensors and what its step's GEMMs quantized with.
struct TeLinear {
  TeTensor input, weight, grad;
  bool weight_quantized = false;
  float weight_scale_of_step = 0;
  float input_scale_of[kMicroBatches] = {};
};

// Megatron's MTP (multi_token_prediction.py): per micro-batch the decoder's fp8_autocast, then one
// around eh_proj and one around the depth's layer; TE's global buffer holds every linear of the
// rank, so each region's exit updates all of them (the ones it did not run push a zero), and each
// region's first module's backward updates all output grads. Fp8Scaling driven as the stage and
// the MTP block drive it (begin_region / end_region) against that reference.
TEST(Fp8MicroBatchScaling, MtpDepthRegionsUpdateEveryLinearAsTransformerEngineDoes) {
  const backend::Ops& ops = backend::cpu_ops();
  model::Fp8Config config;
  config.enabled = true;
  config.format = model::Fp8Format::hybrid;
  config.amax_history_len = kHistory;
  config.amax_compute_algo = kernels::Fp8AmaxAlgo::max;
  const model::ParamLayout layout = mtp_layout();
  model::Fp8Scaling scaling(ops, config, layout, 1);
  ASSERT_EQ(scaling.linears(), 3);
  scaling.reserve_slots(2);
  int reductions = 0;
  scaling.set_amax_reduction([&](float* amaxes, int64_t count) {
    for (int64_t i = 0; i < count; ++i) amaxes[i] = std::max(amaxes[i], peer_amax(reductions, i));
    ++reductions;
  });
  std::vector<float> weights_all = random_values(layout.total_elements, 0.05f, 21);
  model::GemmWeights weights{ops, Precision::bf16, layout.total_elements};
  std::vector<float> grads(weights_all.size(), 0.0f);
  std::vector<float> operands0(static_cast<size_t>(kRows * kIn * 2)), operands1(operands0.size());
  model::PrecisionGemm gemm(ops, weights);
  gemm.bind(weights_all.data(), grads.data());
  gemm.set_operand_buffers(operands0.data(), operands1.data());
  gemm.set_fp8(&scaling);

  TeLinear te[3];
  for (TeLinear& linear : te) linear.grad.fp8_max = 57344.0f;
  int reference_reductions = 0;
  auto update_reference = [&](bool forward) {  // TE's reduce_and_update_fp8_tensors over the global buffer
    std::vector<TeTensor*> group;
    for (TeLinear& linear : te) {
      if (forward) {
        group.push_back(&linear.input);
        group.push_back(&linear.weight);
      }
    }
    for (TeLinear& linear : te) {
      if (!forward) group.push_back(&linear.grad);
    }
    for (size_t i = 0; i < group.size(); ++i) group[i]->record(peer_amax(reference_reductions, static_cast<int64_t>(i)));
    ++reference_reductions;
    for (TeTensor* tensor : group) tensor->update(true);
  };
  auto expect_state = [&](const std::string& when) {
    for (int64_t l = 0; l < 3; ++l) {
      const TeLinear& r = te[l];
      const std::pair<model::Fp8Operand, const TeTensor*> tensors[] = {
          {model::Fp8Operand::input, &r.input}, {model::Fp8Operand::weight, &r.weight}, {model::Fp8Operand::output_grad, &r.grad}};
      for (const auto& [operand, tensor] : tensors) {
        const std::string what = when + ", linear " + std::to_string(l) + " operand " + std::to_string(static_cast<int>(operand));
        EXPECT_EQ(*scaling.scale(l, operand), tensor->scale) << what;
        const std::vector<float> past = tensor->past_newest_first();
        EXPECT_EQ(std::vector<float>(scaling.amax_history(l, operand), scaling.amax_history(l, operand) + past.size()), past)
            << what;
      }
    }
  };
  auto weight_of = [&](int64_t l) {
    return std::vector<float>(weights_all.begin() + l * kOut * kIn, weights_all.begin() + (l + 1) * kOut * kIn);
  };

  for (int step = 0; step < 2; ++step) {
    for (float& w : weights_all) w *= 1.0f + 0.3f * static_cast<float>(step);
    weights.refresh(weights_all.data());
    scaling.start_step();
    for (TeLinear& linear : te) linear.weight_quantized = false;
    std::vector<float> x[kMicroBatches][3], dy[kMicroBatches][3];
    for (int m = 0; m < 2; ++m) {
      for (int64_t l = 0; l < 3; ++l) {
        const float size = 1.0f + static_cast<float>((step + m + l) % 4);
        x[m][l] = random_values(kRows * kIn, size, static_cast<uint32_t>(300 + 30 * step + 3 * m + l));
        dy[m][l] = random_values(kRows * kOut, 1e-3f * size, static_cast<uint32_t>(400 + 30 * step + 3 * m + l));
      }
    }
    // One linear's GEMM inside a region: the forward against TE's quantization, or the backward.
    auto forward_gemm = [&](int m, int64_t l, const std::string& when) {
      std::vector<float> y(static_cast<size_t>(kRows * kOut), 0.0f);
      gemm.linear_forward(x[m][l].data(), kRows, kIn, l * kOut * kIn, kOut, y.data());
      TeLinear& r = te[l];
      r.input_scale_of[m] = r.input.scale;
      r.input.record(abs_max(x[m][l]));
      if (!r.weight_quantized) {
        r.weight_quantized = true;
        r.weight_scale_of_step = r.weight.scale;
        r.weight.record(abs_max(weight_of(l)));
      }
      expect_near_all(y, fp8_product(x[m][l], r.input_scale_of[m], kernels::Fp8Type::e4m3, weight_of(l),
                                     r.weight_scale_of_step, kernels::Fp8Type::e4m3, kRows, kOut, kIn),
                      when + ": y of linear " + std::to_string(l));
    };
    auto backward_gemm = [&](int m, int64_t l, const std::string& when) {
      std::vector<float> dx(static_cast<size_t>(kRows * kIn), 0.0f);
      gemm.linear_backward_input(dy[m][l].data(), kRows, kOut, l * kOut * kIn, kIn, dx.data());
      TeLinear& r = te[l];
      expect_near_all(dx, fp8_product(dy[m][l], r.grad.scale, kernels::Fp8Type::e5m2, transposed(weight_of(l), kOut, kIn),
                                      r.weight_scale_of_step, kernels::Fp8Type::e4m3, kRows, kIn, kOut),
                      when + ": dx of linear " + std::to_string(l));
      r.grad.record(abs_max(dy[m][l]));
    };
    for (const Event& event : {Event{true, 0}, Event{true, 1}, Event{false, 0}, Event{false, 1}}) {
      const int m = event.micro_batch;
      const std::string when = "step " + std::to_string(step) + (event.forward ? " forward " : " backward ") + std::to_string(m);
      if (event.forward) {
        scaling.begin_forward(m, true);  // the decoder's fp8_autocast
        forward_gemm(m, 0, when);
        scaling.end_forward();
        update_reference(true);
        for (int64_t l : {1, 2}) {  // eh_proj's fp8_autocast, then the depth's layer's
          scaling.begin_region();
          forward_gemm(m, l, when);
          scaling.end_region();
          update_reference(true);
          expect_state(when + " region " + std::to_string(l));
        }
      } else {
        scaling.begin_backward(m);
        for (int64_t l : {2, 1}) {  // the depth's layer, then eh_proj, before the decoder
          scaling.begin_region();
          backward_gemm(m, l, when);
          scaling.end_region();
          update_reference(false);
          expect_state(when + " region " + std::to_string(l));
        }
        scaling.begin_backward(m);
        backward_gemm(m, 0, when);
        scaling.end_backward();
        update_reference(false);
      }
      expect_state(when);
    }
  }
  EXPECT_EQ(reductions, reference_reductions);
  EXPECT_EQ(reductions, 2 * 2 * 3 * 2);  // steps x micro-batches x regions x (forward, backward)
}

// An evaluation forward uses the live scales and changes no amax, scale or history.
TEST(Fp8MicroBatchScaling, EvaluationFeedsNoAmax) {
  const backend::Ops& ops = backend::cpu_ops();
  model::Fp8Config config;
  config.enabled = true;
  config.amax_history_len = kHistory;
  model::Fp8Scaling scaling(ops, config, one_linear_layout(), 1);
  std::vector<float> weight = random_values(kOut * kIn, 0.05f, 1), x = random_values(kRows * kIn, 3.0f, 2);
  model::GemmWeights weights{ops, Precision::bf16, kOut * kIn};
  std::vector<float> grads(weight.size()), operands0(static_cast<size_t>(kRows * kIn * 2)), operands1(operands0.size());
  std::vector<float> y(static_cast<size_t>(kRows * kOut));
  model::PrecisionGemm gemm(ops, weights);
  gemm.bind(weight.data(), grads.data());
  gemm.set_operand_buffers(operands0.data(), operands1.data());
  gemm.set_fp8(&scaling);
  int reductions = 0;
  scaling.set_amax_reduction([&](float*, int64_t) { ++reductions; });
  scaling.begin_forward(0, false);
  gemm.linear_forward(x.data(), kRows, kIn, 0, kOut, y.data());
  scaling.end_forward();
  EXPECT_EQ(reductions, 0);
  for (int64_t t = 0; t < scaling.tensors(); ++t) EXPECT_EQ(scaling.amaxes()[t], 0.0f);
  EXPECT_EQ(*scaling.scale(0, model::Fp8Operand::input), 1.0f);
  EXPECT_EQ(scaling.amax_history(0, model::Fp8Operand::input)[0], 0.0f);
}

}  // namespace
