// FP8 training on the CPU emulation (issue 23): tiny GPT and LLaMA runs under --fp8-format hybrid
// and e4m3 stay close to the bf16 run and learn; the trainer refuses fp32 + FP8 by name and takes
// MoE + FP8 on every backend. PrecisionGemm's FP8 products: tests/unit/model/test_fp8_gemm.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "data/sample_source.h"
#include "train/trainer.h"
#include "../tiny_models.h"

using namespace mt;

namespace {

// ---- training runs -----------------------------------------------------------------------------

train::TrainConfig train_config(Precision precision, bool fp8, model::Fp8Format format) {
  train::TrainConfig t;
  t.micro_batch_size = 2;  // 32 tokens a micro-batch: a multiple of 16
  t.global_batch_size = 4;  // two micro-batches a step: the amaxes are their max
  t.train_iters = 10;
  t.lr = 1e-3;
  t.precision = precision;
  t.eval_iters = 0;
  t.fp8.enabled = fp8;
  t.fp8.format = format;
  t.fp8.amax_history_len = 4;
  t.fp8.amax_compute_algo = kernels::Fp8AmaxAlgo::max;
  return t;
}

struct TrainRun {
  std::vector<double> loss, grad_norm;
};

TrainRun train_run(const model::ModelConfig& model, const train::TrainConfig& t) {
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  train::Trainer trainer(model, t, *data, backend::cpu_ops());
  TrainRun run;
  train::TrainObservers observers;
  observers.on_step = [&](const train::StepStats& s) {
    run.loss.push_back(s.lm_loss);
    run.grad_norm.push_back(s.grad_norm);
  };
  trainer.run(observers);
  return run;
}

// max_i |a_i - b_i| / |b_i|.
double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return worst;
}

// Bound: FP8's rounding (e4m3 2^-4 relative, e5m2 2^-3) on every decoder linear moves the tiny
// models' losses by at most 0.06% over 10 steps at lr 1e-3 (measured); 0.5% allowed. (A tiny
// model's values sit in e4m3's range even at scale 1, so the scales are checked apart below.)
TEST(Fp8Training, TinyGptAndLlamaStayCloseToBf16) {
  for (bool llama : {false, true}) {
    const model::ModelConfig model = mt::testing::trainer_model(llama);
    const TrainRun bf16 = train_run(model, train_config(Precision::bf16, false, model::Fp8Format::hybrid));
    for (model::Fp8Format format : {model::Fp8Format::hybrid, model::Fp8Format::e4m3}) {
      const TrainRun fp8 = train_run(model, train_config(Precision::bf16, true, format));
      ASSERT_EQ(fp8.loss.size(), bf16.loss.size());
      std::string trace;
      for (size_t i = 0; i < fp8.loss.size(); ++i) trace += " " + std::to_string(bf16.loss[i]) + "/" + std::to_string(fp8.loss[i]);
      const std::string name = std::string(llama ? "llama " : "gpt ") +
                               (format == model::Fp8Format::hybrid ? "hybrid" : "e4m3") + ", bf16/fp8 loss per step:" + trace;
      const double loss_error = worst_relative(fp8.loss, bf16.loss);
      EXPECT_LT(loss_error, 0.005) << name;
      EXPECT_GT(loss_error, 0.0) << "FP8 changed nothing: are the linears in FP8? " << name;
    }
  }
}

// After each step every FP8 tensor the step used has scale = fp8_max / (the max of its amax
// history): TE updates after every micro-batch (the forward group at each forward's fp8_autocast
// exit, the backward group at each backward's end), so a step of two micro-batches pushes two
// entries. An input's and an output grad's are both this step's (newest first); a weight's newest
// is 0, its older one the weight's amax: Megatron quantizes the weight at the step's first
// micro-batch only (is_first_microbatch) and the second records none. The gradients' scales use
// e5m2's 57344 under hybrid. (The rule itself against a reference loop of TE's recurrence:
// tests/unit/model/test_fp8_microbatch_scaling.cpp.)
TEST(Fp8Training, EachMicroBatchSetsTheScalesFromTheAmaxHistory) {
  for (bool llama : {false, true}) {
    const model::ModelConfig model = mt::testing::trainer_model(llama);
    auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
    train::Trainer trainer(model, train_config(Precision::bf16, true, model::Fp8Format::hybrid), *data,
                           backend::cpu_ops());
    const model::Fp8Scaling& fp8 = *trainer.fp8_scaling();
    for (int step = 1; step <= 3; ++step) {
      trainer.train_step();
      int used = 0;
      for (int64_t linear = 0; linear < fp8.linears(); ++linear) {
        for (model::Fp8Operand operand :
             {model::Fp8Operand::input, model::Fp8Operand::weight, model::Fp8Operand::output_grad}) {
          const float* history = fp8.amax_history(linear, operand);
          float window = 0;
          for (int64_t i = 0; i < fp8.config().amax_history_len; ++i) window = std::max(window, history[i]);
          if (window == 0.0f) continue;  // k and v entries of a fused qkv: not a GEMM of their own
          ++used;
          const std::string what = "step " + std::to_string(step) + " linear " + std::to_string(linear) +
                                   " operand " + std::to_string(static_cast<int>(operand));
          const float fp8_max = kernels::fp8_max(fp8.type(operand));
          EXPECT_EQ(*fp8.scale(linear, operand), fp8_max / window) << what;
          EXPECT_EQ(*fp8.scale_inv(linear, operand), 1.0f / (fp8_max / window)) << what;
          if (operand == model::Fp8Operand::weight) {
            EXPECT_EQ(history[0], 0.0f) << what << ": the second micro-batch reuses the step's FP8 weight";
            EXPECT_GT(history[1], 0.0f) << what;
          } else {
            EXPECT_GT(history[0], 0.0f) << what << ": the second micro-batch's amax";
            EXPECT_GT(history[1], 0.0f) << what << ": the first micro-batch's amax";
          }
        }
      }
      EXPECT_EQ(used, 3 * 4 * model.num_layers) << "qkv, projection, fc1, fc2 of every layer, three tensors each";
      EXPECT_EQ(fp8.type(model::Fp8Operand::output_grad), kernels::Fp8Type::e5m2);
    }
  }
}

TEST(Fp8Training, RefusesWhatItDoesNotRunByName) {
  const model::ModelConfig model = mt::testing::tiny_llama();
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  const auto refusal = [&](const model::ModelConfig& m, const train::TrainConfig& t,
                           const backend::Ops& ops = backend::cpu_ops()) -> std::string {
    try {
      train::Trainer trainer(m, t, *data, ops);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(refusal(model, train_config(Precision::fp32, true, model::Fp8Format::hybrid)).find("--bf16"),
            std::string::npos);
  model::ModelConfig moe = model;
  moe.num_experts = 4;
  moe.moe_router_topk = 2;
  // MoE runs under FP8 (tests/unit/model/test_fp8_experts.cpp), on CUDA too: each expert's rows are
  // padded to 16 for every backend (a copy of the CPU table that says cuda stands in for it).
  EXPECT_EQ(refusal(moe, train_config(Precision::bf16, true, model::Fp8Format::hybrid)), "accepted");
  backend::Ops cuda_named = backend::cpu_ops();
  cuda_named.device = backend::Device::cuda;
  EXPECT_EQ(refusal(moe, train_config(Precision::bf16, true, model::Fp8Format::hybrid), cuda_named), "accepted");
}

}  // namespace
