// The one-rank trainer on the asynchronous CPU table (tests/backend/async_cpu_ops.h): every op
// queued on a worker thread, device memory unreadable from the host between ops. A run there
// gives the CPU table's numbers bit for bit (the same kernels in the same order) and waits for the
// stream twice per training step (the loss, grad norm and finiteness read together; the step's
// time at its end) and once per
// evaluation step (its staging rows reused; the last one also reads the evaluation's sums), and
// its checkpoints pass through host staging (HDF5 never sees device memory): a run saved and
// resumed there equals the CPU table's straight run bit for bit. Mixture-of-experts models too
// (both routers, both expert paths, and under FP8).
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "data/sample_source.h"
#include "tests/backend/async_cpu_ops.h"
#include "io/checkpoint.h"
#include "train/checkpointing.h"
#include "train/trainer.h"
#include "../temp_dir.h"
#include "../tiny_models.h"

using namespace mt;

namespace {

struct Numbers {
  std::vector<double> loss, grad_norm, eval_loss;
  // MoE models: per step the balancing and z-loss values, then per layer the tokens' min, max, CV.
  std::vector<double> moe;
};

train::TrainConfig config(Precision precision) {
  train::TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 6;  // three micro-batches a step
  t.train_iters = 4;
  t.lr = 1e-2;
  t.precision = precision;
  t.initial_loss_scale = 1024;  // fp16: a scale the tiny model's grads fit, so steps are taken
  t.eval_interval = 2;
  t.eval_iters = 3;
  t.recompute.granularity = model::RecomputeGranularity::selective;
  return t;
}

Numbers train_on(const backend::Ops& ops, const model::ModelConfig& model, const train::TrainConfig& t) {
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  train::Trainer trainer(model, t, *data, ops);
  Numbers numbers;
  train::TrainObservers observers;
  observers.on_step = [&](const train::StepStats& s) {
    numbers.loss.push_back(s.lm_loss);
    numbers.grad_norm.push_back(s.grad_norm);
    if (!s.moe) return;
    numbers.moe.push_back(s.moe->balancing_loss);
    numbers.moe.push_back(s.moe->z_loss.value_or(-1.0));
    for (const train::MoeLayerStats& layer : s.moe->layers) {
      numbers.moe.insert(numbers.moe.end(), {static_cast<double>(layer.tokens_min),
                                             static_cast<double>(layer.tokens_max), layer.tokens_cv});
    }
  };
  observers.on_eval = [&](const train::EvalStats& e) { numbers.eval_loss.push_back(e.lm_loss); };
  trainer.run(observers);
  return numbers;
}

// The values' bits (NaN included: a skipped fp16 step's norm must be the same NaN).
std::vector<uint64_t> bits(const std::vector<double>& values) {
  std::vector<uint64_t> out;
  for (double v : values) out.push_back(std::bit_cast<uint64_t>(v));
  return out;
}

class TrainerOnAsyncTable : public ::testing::TestWithParam<Precision> {};

TEST_P(TrainerOnAsyncTable, GivesTheCpuTablesNumbersBitForBit) {
  // A worker that waits before starting queued work: a host read of device memory or of a copy's
  // destination before its synchronize reads stale data every time.
  test_backend::set_async_start_delay(std::chrono::microseconds(200));
  for (const model::ModelConfig& model : {mt::testing::tiny_llama(), mt::testing::trainer_model(false)}) {
    const Numbers cpu = train_on(backend::cpu_ops(), model, config(GetParam()));
    const Numbers async = train_on(test_backend::async_cpu_ops(), model, config(GetParam()));
    ASSERT_EQ(cpu.loss.size(), 4u);
    EXPECT_EQ(bits(async.loss), bits(cpu.loss));
    EXPECT_EQ(bits(async.grad_norm), bits(cpu.grad_norm));
    ASSERT_EQ(cpu.eval_loss.size(), 2u);
    EXPECT_EQ(bits(async.eval_loss), bits(cpu.eval_loss));
    for (double norm : cpu.grad_norm) EXPECT_TRUE(std::isfinite(norm));
  }
  test_backend::set_async_start_delay(std::chrono::microseconds(0));
}

INSTANTIATE_TEST_SUITE_P(Precisions, TrainerOnAsyncTable,
                         ::testing::Values(Precision::fp32, Precision::bf16, Precision::fp16));

// Mixture of experts (issue 22): the router, the dispatcher and the experts read device memory
// on the host only through copies and a synchronize (what --device cuda needs), both routers and
// both expert paths (trainer_moe_model), and the host counts of the grouped GEMM.
TEST(TrainerOnAsyncTable, MixtureOfExpertsGivesTheCpuTablesNumbersBitForBit) {
  test_backend::set_async_start_delay(std::chrono::microseconds(200));
  for (bool deepseek_router : {false, true}) {
    const model::ModelConfig model = mt::testing::trainer_moe_model(deepseek_router);
    train::TrainConfig t = config(Precision::fp32);
    t.train_iters = 2;  // the expert bias moves after step 1; MoE's many small ops make steps slow here
    t.eval_iters = 1;
    const Numbers cpu = train_on(backend::cpu_ops(), model, t);
    const Numbers async = train_on(test_backend::async_cpu_ops(), model, t);
    ASSERT_EQ(cpu.loss.size(), 2u);
    EXPECT_EQ(bits(async.loss), bits(cpu.loss)) << "deepseek_router " << deepseek_router;
    EXPECT_EQ(bits(async.grad_norm), bits(cpu.grad_norm)) << "deepseek_router " << deepseek_router;
    EXPECT_EQ(bits(async.eval_loss), bits(cpu.eval_loss)) << "deepseek_router " << deepseek_router;
    ASSERT_EQ(cpu.moe.size(), 2u * (2 + 3 * 2));  // 2 steps: 2 losses, 3 token figures of 2 layers
    EXPECT_EQ(bits(async.moe), bits(cpu.moe)) << "deepseek_router " << deepseek_router;
    for (double norm : cpu.grad_norm) EXPECT_TRUE(std::isfinite(norm));
  }
  test_backend::set_async_start_delay(std::chrono::microseconds(0));
}

// FP8 with mixture of experts (issue 23): each expert's rows padded to 16 in device scratch
// (model/precision_gemm.h Fp8RowPadding) with zero fills, quantize, the FP8 GEMMs and a device
// copy of the tail's rows, no host read between them: the CPU table's numbers bit for bit.
TEST(TrainerOnAsyncTable, Fp8MixtureOfExpertsGivesTheCpuTablesNumbersBitForBit) {
  test_backend::set_async_start_delay(std::chrono::microseconds(200));
  const model::ModelConfig model = mt::testing::trainer_moe_model(false);
  train::TrainConfig t = config(Precision::bf16);
  t.train_iters = 2;
  t.eval_iters = 1;
  t.fp8.enabled = true;
  t.fp8.format = model::Fp8Format::hybrid;
  const Numbers cpu = train_on(backend::cpu_ops(), model, t);
  const Numbers async = train_on(test_backend::async_cpu_ops(), model, t);
  ASSERT_EQ(cpu.loss.size(), 2u);
  EXPECT_EQ(bits(async.loss), bits(cpu.loss));
  EXPECT_EQ(bits(async.grad_norm), bits(cpu.grad_norm));
  EXPECT_EQ(bits(async.eval_loss), bits(cpu.eval_loss));
  EXPECT_EQ(bits(async.moe), bits(cpu.moe));
  for (double norm : cpu.grad_norm) EXPECT_TRUE(std::isfinite(norm));
  test_backend::set_async_start_delay(std::chrono::microseconds(0));
}

// A step waits twice: once to read its loss, token count and grad sum of squares together (the
// optimizer's step needs the clip factor on the host), and once at its end, for the step's time
// on the stream (its event timer). Evaluation waits once per step.
TEST(TrainerOnAsyncTable, WaitsForTheStreamTwicePerStepAndOncePerEvaluationStep) {
  const model::ModelConfig model = mt::testing::tiny_llama();
  train::TrainConfig t = config(Precision::fp32);
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  train::Trainer trainer(model, t, *data, test_backend::async_cpu_ops());
  for (int step = 0; step < 3; ++step) {
    const int64_t before = test_backend::async_host_waits();
    const train::StepStats stats = trainer.train_step();
    EXPECT_EQ(test_backend::async_host_waits() - before, 2) << "step " << step;
    // Event timers: the passes lie inside the schedule's run, the run inside the step.
    EXPECT_GT(stats.compute_ms, 0) << "step " << step;
    EXPECT_LE(stats.compute_ms, stats.pipeline_ms) << "step " << step;
    EXPECT_LE(stats.pipeline_ms, stats.step_ms) << "step " << step;
  }
  const int64_t before = test_backend::async_host_waits();
  trainer.evaluate();
  EXPECT_EQ(test_backend::async_host_waits() - before, t.eval_iters);
}

// Steps of `trainer`, their losses and grad norms appended to `numbers`.
void run_steps(train::Trainer& trainer, int steps, Numbers& numbers) {
  for (int i = 0; i < steps; ++i) {
    const train::StepStats s = trainer.train_step();
    numbers.loss.push_back(s.lm_loss);
    numbers.grad_norm.push_back(s.grad_norm);
  }
}

TEST(TrainerOnAsyncTable, CheckpointsStageThroughTheHostAndResumeBitForBit) {
  mt::testing::TempDir dir("mt_test_async_resume");
  const model::ModelConfig model = mt::testing::tiny_llama();
  train::TrainConfig t = config(Precision::bf16);
  t.train_iters = 6;
  t.eval_iters = 0;
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  Numbers straight, resumed;
  {
    train::Trainer trainer(model, t, *data, backend::cpu_ops());
    run_steps(trainer, 6, straight);
  }
  const std::string directory = dir.file("checkpoint");
  {
    train::Trainer first(model, t, *data, test_backend::async_cpu_ops());
    run_steps(first, 3, resumed);
    train::save_checkpoint(directory, first, {});
  }
  train::Trainer second(model, t, *data, test_backend::async_cpu_ops());
  const io::CheckpointReader checkpoint(io::checkpoint_path(directory, *io::read_tracker(directory)));
  train::load_checkpoint(checkpoint, second, {});
  EXPECT_EQ(second.iteration(), 3);
  run_steps(second, 3, resumed);
  EXPECT_EQ(bits(resumed.loss), bits(straight.loss));
  EXPECT_EQ(bits(resumed.grad_norm), bits(straight.grad_norm));
}

}  // namespace
