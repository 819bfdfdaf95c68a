// The tiny training run on the CUDA op table against the CPU table (CTest label gpu): one rank,
// 10 steps in fp32 with TF32 off (NVIDIA_TF32_OVERRIDE=0, set before the CUDA table is first
// used), a GPT-2-style and a LLaMA-style tiny model (tests/unit/tiny_models.h) on mock data with
// documents, run in this process by two Trainers, one per table (no mt-train binary, no files).
// Every step's loss and grad norm must be within 1e-5 relative of the CPU's, and within the fp32
// equivalence bound the layout tests use (tests/mpi/training_equivalence.h), which stays below
// 1e-5 at these learning rates; so do a tiny multi-latent attention model with RoPE and with YaRN
// (CudaMlaTraining) and multi-token prediction after each (CudaMtpTraining). The mixture-of-experts block at the end does the same for two tiny-mixtral
// variants (moe::CudaMoeTraining), and the FP8 block compares --fp8-format hybrid runs, dense and
// with experts and with a multi-token-prediction depth, with the CPU emulation
// (fp8::CudaFp8Training, fp8::CudaFp8MoeTraining, fp8::CudaFp8MtpTraining, its own bound). Skipped, never passed, when no CUDA device is usable or the CUDA table is not built.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "backend/registry.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "tests/mpi/training_equivalence.h"
#include "tests/unit/tiny_models.h"

using namespace mt;

namespace {

constexpr double kRelative = 1e-5;

// The CUDA table, or the reason there is none (for GTEST_SKIP).
const backend::Ops* cuda_ops(std::string& missing) {
  setenv("NVIDIA_TF32_OVERRIDE", "0", 1);  // cuBLAS reads it when its handle is made
  if (kernels::cuda::device_count() == 0) {
    missing = "no CUDA device";
    return nullptr;
  }
  try {
    return &backend::backend_ops(backend::Device::cuda);
  } catch (const std::exception& e) {
    missing = std::string("no CUDA op table: ") + e.what();
    return nullptr;
  }
}

// The equivalence schedule (10 steps, 2 of warm-up, 2 evaluations) at a learning rate that keeps
// the layout tests' bound below 1e-5 over the 10 steps.
train::TrainConfig fp32_config() {
  train::TrainConfig config = equivalence::ten_step_config();
  config.lr = 1e-4;
  config.precision = Precision::fp32;
  return config;
}

// One run's per-step numbers (and evaluations) on `ops`.
equivalence::RunNumbers train_numbers(const backend::Ops& ops, const model::ModelConfig& model,
                                      const train::TrainConfig& config, const data::SampleSource& data) {
  train::Trainer trainer(model, config, data, ops);
  equivalence::RunNumbers numbers;
  train::TrainObservers observers;
  observers.on_step = [&](const train::StepStats& s) {
    numbers.loss.push_back(s.lm_loss);
    numbers.grad_norm.push_back(s.grad_norm);
    numbers.lr.push_back(s.lr);
  };
  observers.on_eval = [&](const train::EvalStats& e) {
    numbers.eval_loss.push_back(e.lm_loss);
    numbers.eval_iteration.push_back(e.iteration);
  };
  trainer.run(observers);
  return numbers;
}

equivalence::RunNumbers train_on(const backend::Ops& ops, const model::ModelConfig& model) {
  data::LoaderOptions options;
  options.reset_position_ids = true;
  options.reset_attention_mask = true;
  options.eod_mask_loss = true;
  const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 7, options);
  return train_numbers(ops, model, fp32_config(), data);
}

class CudaTraining : public ::testing::TestWithParam<bool> {};  // LLaMA-style or GPT-2-style

// Each step's loss and grad norm of `gpu` within kRelative of `cpu`'s, and the equivalence bound;
// every step printed with `label`.
void expect_steps_match(const equivalence::RunNumbers& cpu, const equivalence::RunNumbers& gpu, const char* label) {
  ASSERT_EQ(cpu.loss.size(), 10u);
  ASSERT_EQ(gpu.loss.size(), cpu.loss.size());
  for (size_t i = 0; i < cpu.loss.size(); ++i) {
    std::printf("%s step %2zu  loss cpu %.9g cuda %.9g  grad norm cpu %.9g cuda %.9g\n", label, i + 1, cpu.loss[i],
                gpu.loss[i], cpu.grad_norm[i], gpu.grad_norm[i]);
    EXPECT_LE(std::fabs(gpu.loss[i] - cpu.loss[i]), kRelative * std::fabs(cpu.loss[i]))
        << label << ": lm loss at step " << i + 1 << ": cuda " << gpu.loss[i] << ", cpu " << cpu.loss[i];
    EXPECT_LE(std::fabs(gpu.grad_norm[i] - cpu.grad_norm[i]), kRelative * std::fabs(cpu.grad_norm[i]))
        << label << ": grad norm at step " << i + 1 << ": cuda " << gpu.grad_norm[i] << ", cpu " << cpu.grad_norm[i];
  }
  const auto difference = equivalence::first_difference(gpu, cpu, fp32_config().adam.eps);
  EXPECT_FALSE(difference.has_value()) << label << ": " << *difference;
}

TEST_P(CudaTraining, TenFp32StepsMatchTheCpu) {
  std::string missing;
  const backend::Ops* cuda = cuda_ops(missing);
  if (!cuda) GTEST_SKIP() << missing;
  const model::ModelConfig model = mt::testing::trainer_model(GetParam());
  expect_steps_match(train_on(backend::cpu_ops(), model), train_on(*cuda, model),
                     GetParam() ? "llama_style" : "gpt2_style");
}

INSTANTIATE_TEST_SUITE_P(TinyModels, CudaTraining, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "llama_style" : "gpt2_style");
                         });

// Multi-latent attention (issue 22) with RoPE and with YaRN (issue 23: the CUDA rope_yarn
// entries, kernels/cuda/elementwise.cu): mt::testing::tiny_mla, the same 10 fp32 steps and bound.
class CudaMlaTraining : public ::testing::TestWithParam<bool> {};  // YaRN or RoPE

TEST_P(CudaMlaTraining, TenFp32StepsMatchTheCpu) {
  std::string missing;
  const backend::Ops* cuda = cuda_ops(missing);
  if (!cuda) GTEST_SKIP() << missing;
  const model::ModelConfig model = mt::testing::tiny_mla(GetParam());
  expect_steps_match(train_on(backend::cpu_ops(), model), train_on(*cuda, model), GetParam() ? "mla yarn" : "mla rope");
}

INSTANTIATE_TEST_SUITE_P(TinyMla, CudaMlaTraining, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "yarn" : "rope");
                         });

// Multi-token prediction (DeepSeek-V3's, model/layers/mtp.h): two depths after a tiny LLaMA-style
// decoder and one after the tiny MLA model with YaRN; their losses reach the grad norm through
// --mtp-loss-scaling-factor, so a depth that goes wrong on CUDA moves it. Same steps and bound.
class CudaMtpTraining : public ::testing::TestWithParam<bool> {};  // MLA with YaRN or LLaMA-style

TEST_P(CudaMtpTraining, TenFp32StepsMatchTheCpu) {
  std::string missing;
  const backend::Ops* cuda = cuda_ops(missing);
  if (!cuda) GTEST_SKIP() << missing;
  model::ModelConfig model = GetParam() ? mt::testing::tiny_mla(true) : mt::testing::trainer_model(true);
  model.mtp_num_layers = GetParam() ? 1 : 2;
  expect_steps_match(train_on(backend::cpu_ops(), model), train_on(*cuda, model),
                     GetParam() ? "mtp mla yarn" : "mtp llama_style");
}

INSTANTIATE_TEST_SUITE_P(TinyMtp, CudaMtpTraining, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "mla_yarn" : "llama_style");
                         });

}  // namespace

// --- mixture of experts (issue 22): the trainer model with tiny-mixtral's routing, CUDA table
// against the CPU table, 10 fp32 steps, the same 1e-5 relative bound. Two variants
// (mt::testing::trainer_moe_model): Mixtral's router (softmax top-2, aux_loss, z-loss) on the loop
// over experts, and DeepSeek-V3's (sigmoid, expert bias, group-limited, scaling, seq_aux_loss,
// z-loss) on the grouped GEMM. The balancing and z-loss values are held to the same bound and the
// tokens per expert (min, max) must be equal: a routing decision that flips on a rounding
// difference shows there first.
namespace moe {

struct Variant {
  const char* name;
  bool deepseek_router;
};

// One run's numbers and, per step, its MoE figures: the balancing and z-loss values and each
// layer's tokens per expert (min, max).
struct MoeRun {
  equivalence::RunNumbers numbers;
  std::vector<train::MoeStepStats> moe;
};

MoeRun train_moe_on(const backend::Ops& ops, const model::ModelConfig& model) {
  data::LoaderOptions options;
  options.reset_position_ids = true;
  options.reset_attention_mask = true;
  options.eod_mask_loss = true;
  const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 7, options);
  train::Trainer trainer(model, fp32_config(), data, ops);
  MoeRun run;
  train::TrainObservers observers;
  observers.on_step = [&](const train::StepStats& s) {
    run.numbers.loss.push_back(s.lm_loss);
    run.numbers.grad_norm.push_back(s.grad_norm);
    run.numbers.lr.push_back(s.lr);
    run.moe.push_back(s.moe.value_or(train::MoeStepStats{}));
  };
  observers.on_eval = [&](const train::EvalStats& e) {
    run.numbers.eval_loss.push_back(e.lm_loss);
    run.numbers.eval_iteration.push_back(e.iteration);
  };
  trainer.run(observers);
  return run;
}

bool within(double value, double reference) { return std::fabs(value - reference) <= kRelative * std::fabs(reference); }

class CudaMoeTraining : public ::testing::TestWithParam<Variant> {};

TEST_P(CudaMoeTraining, TenFp32StepsMatchTheCpu) {
  std::string missing;
  const backend::Ops* cuda = cuda_ops(missing);
  if (!cuda) GTEST_SKIP() << missing;
  const model::ModelConfig model = mt::testing::trainer_moe_model(GetParam().deepseek_router);
  const MoeRun cpu = train_moe_on(backend::cpu_ops(), model);
  const MoeRun gpu = train_moe_on(*cuda, model);
  ASSERT_EQ(cpu.numbers.loss.size(), 10u);
  ASSERT_EQ(gpu.numbers.loss.size(), cpu.numbers.loss.size());
  for (size_t i = 0; i < cpu.numbers.loss.size(); ++i) {
    const train::MoeStepStats &c = cpu.moe[i], &g = gpu.moe[i];
    std::printf("%s step %2zu  loss cpu %.9g cuda %.9g  grad norm cpu %.9g cuda %.9g  balancing cpu %.9g cuda %.9g  "
                "z cpu %.9g cuda %.9g\n",
                GetParam().name, i + 1, cpu.numbers.loss[i], gpu.numbers.loss[i], cpu.numbers.grad_norm[i],
                gpu.numbers.grad_norm[i], c.balancing_loss, g.balancing_loss, c.z_loss.value_or(-1),
                g.z_loss.value_or(-1));
    EXPECT_TRUE(within(gpu.numbers.loss[i], cpu.numbers.loss[i])) << "lm loss at step " << i + 1;
    EXPECT_TRUE(within(gpu.numbers.grad_norm[i], cpu.numbers.grad_norm[i])) << "grad norm at step " << i + 1;
    EXPECT_TRUE(within(g.balancing_loss, c.balancing_loss)) << c.balancing_name << " at step " << i + 1;
    EXPECT_TRUE(within(g.z_loss.value_or(-1), c.z_loss.value_or(-1))) << "z_loss at step " << i + 1;
    ASSERT_EQ(g.layers.size(), c.layers.size());
    for (size_t l = 0; l < c.layers.size(); ++l) {
      std::printf("    layer %d tokens per expert min/max cpu %lld/%lld cuda %lld/%lld\n", c.layers[l].layer,
                  static_cast<long long>(c.layers[l].tokens_min), static_cast<long long>(c.layers[l].tokens_max),
                  static_cast<long long>(g.layers[l].tokens_min), static_cast<long long>(g.layers[l].tokens_max));
      EXPECT_EQ(g.layers[l].tokens_min, c.layers[l].tokens_min) << "layer " << l << " step " << i + 1;
      EXPECT_EQ(g.layers[l].tokens_max, c.layers[l].tokens_max) << "layer " << l << " step " << i + 1;
    }
  }
  const auto difference = equivalence::first_difference(gpu.numbers, cpu.numbers, fp32_config().adam.eps);
  EXPECT_FALSE(difference.has_value()) << *difference;
}

INSTANTIATE_TEST_SUITE_P(TinyMixtral, CudaMoeTraining,
                         ::testing::Values(Variant{"mixtral", false}, Variant{"deepseek_router_grouped_gemm", true}),
                         [](const ::testing::TestParamInfo<Variant>& info) { return std::string(info.param.name); });

}  // namespace moe

// --- FP8 (issue 23): the tiny GPT-2-style and LLaMA-style models under --bf16 --fp8-format hybrid
// (delayed scaling, history 4, max), 10 steps at lr 1e-3, two micro-batches a step, the CUDA table
// (cuBLASLt FP8 GEMMs on sm_89+) against the CPU table's emulation in one process. Both quantise
// the same values with the same scales, so they part only where the GEMMs' sums part: Hopper's FP8
// tensor cores keep about 14 bits inside each 32-term MMA (tests/gpu/test_cuda_fp8.cpp bounds one
// GEMM by 2^-8 of sum |ab|; measured 1e-4), and a sum that lands across an fp8 rounding boundary
// moves one element by an fp8 step. Bound: 2e-3 relative on the loss and 2e-2 on the grad norm per
// step (a wrong scale or operand layout moves the loss by more than 1e-2 within two steps); every
// step is printed so the measured gap can tighten it.
namespace fp8 {

train::TrainConfig fp8_config() {
  train::TrainConfig t;
  t.micro_batch_size = 2;   // 32 tokens a micro-batch: a multiple of 16
  t.global_batch_size = 4;  // two micro-batches a step: the amaxes are their max
  t.train_iters = 10;
  t.lr = 1e-3;
  t.precision = Precision::bf16;
  t.eval_iters = 0;
  t.fp8.enabled = true;
  t.fp8.format = model::Fp8Format::hybrid;
  t.fp8.amax_history_len = 4;
  t.fp8.amax_compute_algo = kernels::Fp8AmaxAlgo::max;
  return t;
}

equivalence::RunNumbers train_fp8_on(const backend::Ops& ops, const model::ModelConfig& model) {
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  return train_numbers(ops, model, fp8_config(), *data);
}

class CudaFp8Training : public ::testing::TestWithParam<bool> {};  // LLaMA-style or GPT-2-style

// Each step of `gpu` within 2e-3 relative of `cpu` in loss and 2e-2 in grad norm (printed with
// `label`); returns the worst gaps.
std::pair<double, double> expect_near_emulation(const equivalence::RunNumbers& cpu,
                                                const equivalence::RunNumbers& gpu, const char* label) {
  EXPECT_EQ(cpu.loss.size(), 10u);
  EXPECT_EQ(gpu.loss.size(), cpu.loss.size());
  double worst_loss = 0, worst_norm = 0;
  for (size_t i = 0; i < std::min(cpu.loss.size(), gpu.loss.size()); ++i) {
    const double loss_gap = std::fabs(gpu.loss[i] - cpu.loss[i]) / std::fabs(cpu.loss[i]);
    const double norm_gap = std::fabs(gpu.grad_norm[i] - cpu.grad_norm[i]) / std::fabs(cpu.grad_norm[i]);
    worst_loss = std::max(worst_loss, loss_gap);
    worst_norm = std::max(worst_norm, norm_gap);
    std::printf("fp8 %s step %2zu  loss cpu %.9g cuda %.9g (%.2e)  grad norm cpu %.9g cuda %.9g (%.2e)\n", label,
                i + 1, cpu.loss[i], gpu.loss[i], loss_gap, cpu.grad_norm[i], gpu.grad_norm[i], norm_gap);
    EXPECT_LE(loss_gap, 2e-3) << label << ": lm loss at step " << i + 1;
    EXPECT_LE(norm_gap, 2e-2) << label << ": grad norm at step " << i + 1;
  }
  return {worst_loss, worst_norm};
}

TEST_P(CudaFp8Training, TenHybridStepsStayNearTheCpuEmulation) {
  std::string missing;
  const backend::Ops* cuda = cuda_ops(missing);
  if (!cuda) GTEST_SKIP() << missing;
  const model::ModelConfig model = mt::testing::trainer_model(GetParam());
  const char* name = GetParam() ? "llama_style" : "gpt2_style";
  const auto [worst_loss, worst_norm] =
      expect_near_emulation(train_fp8_on(backend::cpu_ops(), model), train_fp8_on(*cuda, model), name);
  std::printf("[fp8] training %s: worst relative gap, cuda against the cpu emulation: loss %.2e, grad norm %.2e\n",
              name, worst_loss, worst_norm);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, CudaFp8Training, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "llama_style" : "gpt2_style");
                         });

// FP8 with one multi-token-prediction depth (eh_proj and the depth's layer in FP8 regions of their
// own, as on the CPU): the tiny LLaMA-style model, the same schedule and bounds.
TEST(CudaFp8MtpTraining, TenHybridStepsStayNearTheCpuEmulation) {
  std::string missing;
  const backend::Ops* cuda = cuda_ops(missing);
  if (!cuda) GTEST_SKIP() << missing;
  model::ModelConfig model = mt::testing::trainer_model(true);
  model.mtp_num_layers = 1;
  const auto [worst_loss, worst_norm] =
      expect_near_emulation(train_fp8_on(backend::cpu_ops(), model), train_fp8_on(*cuda, model), "mtp llama_style");
  std::printf("[fp8] training mtp llama_style: worst relative gap, cuda against the cpu emulation: loss %.2e, grad "
              "norm %.2e\n",
              worst_loss, worst_norm);
}

// FP8 with mixture of experts (issue 23): the two tiny-mixtral variants (moe::CudaMoeTraining's)
// under the same FP8 schedule, CUDA against the CPU emulation, the same bounds. Each expert's rows
// are padded to 16 in device scratch (model/precision_gemm.h Fp8RowPadding), so every FP8 GEMM
// can take cuBLASLt; how many took gemm_fp8's plain kernel instead is printed (the weights of
// experts and the tails' 16-row blocks included), not asserted.
class CudaFp8MoeTraining : public ::testing::TestWithParam<bool> {};  // DeepSeek-V3's router or Mixtral's

TEST_P(CudaFp8MoeTraining, TenHybridStepsStayNearTheCpuEmulation) {
  std::string missing;
  const backend::Ops* cuda = cuda_ops(missing);
  if (!cuda) GTEST_SKIP() << missing;
  const model::ModelConfig model = mt::testing::trainer_moe_model(GetParam());
  const equivalence::RunNumbers cpu = train_fp8_on(backend::cpu_ops(), model);
  const int64_t fallbacks_before = kernels::cuda::gemm_fp8_fallback_calls();
  const equivalence::RunNumbers gpu = train_fp8_on(*cuda, model);
  const int64_t fallbacks = kernels::cuda::gemm_fp8_fallback_calls() - fallbacks_before;
  const char* name = GetParam() ? "deepseek_router_grouped_gemm" : "mixtral";
  const auto [worst_loss, worst_norm] = expect_near_emulation(cpu, gpu, name);
  std::printf("[fp8] training moe %s: worst relative gap, cuda against the cpu emulation: loss %.2e, grad norm %.2e; "
              "%lld FP8 GEMMs took the plain kernel\n",
              name, worst_loss, worst_norm, static_cast<long long>(fallbacks));
}

INSTANTIATE_TEST_SUITE_P(TinyMixtral, CudaFp8MoeTraining, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "deepseek_router_grouped_gemm" : "mixtral");
                         });

}  // namespace fp8
