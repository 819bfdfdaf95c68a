// Megatron's step timers (backend/step_timers.h) and the params norm and zero count of one rank's
// trainer (train/trainer.h): the timers' levels, sums and names; the level-1 timers of rank 0
// within 5% of the step's time and the level-2 ones inside forward-backward; --log-params-norm
// and --log-num-zeros-in-grad against host loops over the parameters and grads; the log line and
// the timer block as Megatron prints them; none of it changes a number or adds a host wait (on
// the asynchronous table). Layouts against one rank: tests/mpi/test_data_parallel.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/step_timers.h"
#include "core/error.h"
#include "data/sample_source.h"
#include "tests/backend/async_cpu_ops.h"
#include "train/trainer.h"
#include "../tiny_models.h"

using namespace mt;
using backend::StepTimer;

namespace {

train::TrainConfig watched_config(int timing_level) {
  train::TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;
  t.train_iters = 3;
  t.lr = 1e-2;
  t.eval_iters = 0;
  t.log_interval = 1;
  t.timing_log_level = timing_level;
  t.log_params_norm = true;
  t.log_num_zeros_in_grad = true;
  return t;
}

// Host loops over the rank's flat buffers: each tensor's primary copy once.
double host_params_norm(const train::Trainer& trainer, const float* params) {
  double sum = 0;
  for (const model::ParamEntry& entry : trainer.layout().entries) {
    if (!entry.primary()) continue;
    for (int64_t i = 0; i < entry.numel; ++i) sum += static_cast<double>(params[entry.offset + i]) * params[entry.offset + i];
  }
  return std::sqrt(sum);
}

int64_t host_zero_grads(const train::Trainer& trainer) {
  int64_t zeros = 0;
  const float* grads = trainer.gradients();
  for (const model::ParamEntry& entry : trainer.layout().entries) {
    if (!entry.primary()) continue;
    zeros += std::count(grads + entry.offset, grads + entry.offset + entry.numel, 0.0f);
  }
  return zeros;
}

const train::TimerReading* find_timer(const train::StepStats& stats, const std::string& name) {
  for (const train::TimerReading& t : stats.timers) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

double timer_ms(const train::StepStats& stats, const std::string& name) {
  const train::TimerReading* t = find_timer(stats, name);
  return t ? t->max_ms : 0.0;
}

}  // namespace

TEST(StepTimers, NamesAndLevelsAreMegatronsInItsOrder) {
  EXPECT_STREQ(backend::step_timer_name(StepTimer::forward_backward), "forward-backward");
  EXPECT_STREQ(backend::step_timer_name(StepTimer::forward_backward_send_forward_backward_recv),
               "forward-backward-send-forward-backward-recv");
  EXPECT_STREQ(backend::step_timer_name(StepTimer::optimizer_copy_main_to_model_params),
               "optimizer-copy-main-to-model-params");
  EXPECT_STREQ(backend::step_timer_name(StepTimer::optimizer), "optimizer");
  EXPECT_EQ(backend::step_timer_level(StepTimer::forward_compute), 2);
  EXPECT_EQ(backend::step_timer_level(StepTimer::batch_generator), 2);
  EXPECT_EQ(backend::step_timer_level(StepTimer::all_grads_sync), 1);
  EXPECT_EQ(backend::step_timer_level(StepTimer::params_all_gather), 1);
}

TEST(StepTimers, SumTheirIntervalsAtTheirLevelAndRefuseMisuse) {
  const backend::Ops& ops = backend::cpu_ops();
  int barriers = 0;
  backend::StepTimers timers(ops, ops.default_stream(), 1, [&] { ++barriers; });
  for (int i = 0; i < 3; ++i) {
    timers.start(StepTimer::optimizer);
    timers.stop(StepTimer::optimizer);
    timers.start(StepTimer::forward_compute);  // level 2: free at level 1
    timers.stop(StepTimer::forward_compute);
  }
  EXPECT_EQ(barriers, 3);  // before each level-1 start only
  std::array<double, backend::kStepTimers> ms = timers.elapsed_ms();
  EXPECT_GT(ms[static_cast<size_t>(StepTimer::optimizer)], 0);
  EXPECT_EQ(ms[static_cast<size_t>(StepTimer::forward_compute)], 0);
  EXPECT_EQ(ms[static_cast<size_t>(StepTimer::forward_backward)], 0);
  timers.start(StepTimer::optimizer);
  EXPECT_THROW(timers.start(StepTimer::optimizer), std::logic_error);
  EXPECT_THROW(timers.reset(), std::logic_error);
  timers.stop(StepTimer::optimizer);
  EXPECT_THROW(timers.stop(StepTimer::optimizer), std::logic_error);
  timers.reset();
  EXPECT_EQ(timers.elapsed_ms()[static_cast<size_t>(StepTimer::optimizer)], 0);
  EXPECT_THROW(backend::StepTimers(ops, ops.default_stream(), 3), std::invalid_argument);
}

// Megatron's calc_params_l2_norm after the step and count_zeros_fp32 of the step's grads, against
// host loops over the trainer's buffers (tiny GPT: the tied embedding once), every step.
TEST(TrainerWatch, ParamsNormAndZeroCountEqualHostLoops) {
  for (bool llama : {false, true}) {
    const model::ModelConfig model = mt::testing::trainer_model(llama);
    auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
    train::Trainer trainer(model, watched_config(0), *data, backend::cpu_ops());
    for (int step = 0; step < 3; ++step) {
      const train::StepStats stats = trainer.train_step();
      ASSERT_TRUE(stats.params_norm.has_value());
      ASSERT_TRUE(stats.num_zeros.has_value());
      const double want_norm = host_params_norm(trainer, trainer.parameters());
      EXPECT_NEAR(*stats.params_norm, want_norm, 1e-12 * want_norm) << "step " << step;
      const int64_t want_zeros = host_zero_grads(trainer);
      EXPECT_EQ(*stats.num_zeros, want_zeros) << "step " << step;
      // The padded vocabulary rows' grads at least are zero.
      EXPECT_GE(*stats.num_zeros, (model.padded_vocab_size() - model.vocab_size) * model.hidden_size);
      EXPECT_TRUE(stats.timers.empty());  // --timing-log-level 0
    }
  }
}

TEST(TrainerWatch, AbsentUnlessAskedFor) {
  const model::ModelConfig model = mt::testing::tiny_llama();
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  train::TrainConfig config = watched_config(0);
  config.log_params_norm = config.log_num_zeros_in_grad = false;
  train::Trainer trainer(model, config, *data, backend::cpu_ops());
  const train::StepStats stats = trainer.train_step();
  EXPECT_FALSE(stats.params_norm.has_value());
  EXPECT_FALSE(stats.num_zeros.has_value());
  EXPECT_TRUE(stats.timers.empty());
}

// Timers, norms and zero counts change no number, and on the asynchronous table a step still
// waits for the stream twice (the grads' copy rides on the step's sums, the parameters' sum on
// its end).
TEST(TrainerWatch, ChangesNoNumberAndAddsNoHostWait) {
  const model::ModelConfig model = mt::testing::tiny_llama();
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  train::TrainConfig plain = watched_config(0);
  plain.log_params_norm = plain.log_num_zeros_in_grad = false;
  train::Trainer reference(model, plain, *data, backend::cpu_ops());
  train::Trainer watched(model, watched_config(2), *data, backend::cpu_ops());
  train::Trainer async(model, watched_config(2), *data, test_backend::async_cpu_ops());
  test_backend::set_async_start_delay(std::chrono::microseconds(200));
  for (int step = 0; step < 3; ++step) {
    const train::StepStats want = reference.train_step();
    const train::StepStats got = watched.train_step();
    const int64_t before = test_backend::async_host_waits();
    const train::StepStats got_async = async.train_step();
    EXPECT_EQ(test_backend::async_host_waits() - before, 2) << "step " << step;
    EXPECT_EQ(std::bit_cast<uint64_t>(got.lm_loss), std::bit_cast<uint64_t>(want.lm_loss));
    EXPECT_EQ(std::bit_cast<uint64_t>(got.grad_norm), std::bit_cast<uint64_t>(want.grad_norm));
    EXPECT_EQ(std::bit_cast<uint64_t>(got_async.grad_norm), std::bit_cast<uint64_t>(want.grad_norm));
    ASSERT_TRUE(got_async.params_norm && got.params_norm && got_async.num_zeros && got.num_zeros);
    EXPECT_EQ(*got_async.params_norm, *got.params_norm);
    EXPECT_EQ(*got_async.num_zeros, *got.num_zeros);
    EXPECT_FALSE(got_async.timers.empty());
  }
  test_backend::set_async_start_delay(std::chrono::microseconds(0));
}

// Rank 0's level-1 timers tile the step: forward-backward + all-grads-sync +
// layernorm-grads-all-reduce + embedding-grads-all-reduce + optimizer within 5% of step_ms. The
// model is sized for steps of tens of milliseconds, so the untimed gaps between the timers
// (microseconds: zeroing the grads, the step's bookkeeping) are far below 5%; a descheduling that
// lands in a gap under load is absorbed by taking the median of seven steps' ratios. The sum never
// exceeds the step (the intervals are disjoint and inside it).
TEST(TrainerWatch, LevelOneTimersTileTheStepAndLevelTwoFitInsideForwardBackward) {
  model::ModelConfig model = mt::testing::trainer_model(true);
  model.hidden_size = 128;
  model.num_attention_heads = 8;
  model.num_query_groups = 4;
  model.ffn_hidden_size = 256;
  model.seq_length = 64;
  model.max_position_embeddings = 64;
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  train::TrainConfig config = watched_config(2);
  config.train_iters = 8;
  train::Trainer trainer(model, config, *data, backend::cpu_ops());
  trainer.train_step();  // warm-up
  const char* const level_one[] = {"forward-backward", "all-grads-sync", "layernorm-grads-all-reduce",
                                   "embedding-grads-all-reduce", "optimizer"};
  const char* const level_two[] = {"batch-generator", "forward-compute", "backward-compute"};
  std::vector<double> ratios, step_ms;
  for (int step = 0; step < 7; ++step) {
    const train::StepStats stats = trainer.train_step();
    double level_one_ms = 0;
    for (const char* name : level_one) {
      ASSERT_NE(find_timer(stats, name), nullptr) << name;
      level_one_ms += timer_ms(stats, name);
    }
    EXPECT_LE(level_one_ms, stats.step_ms) << "step " << step;
    ratios.push_back(level_one_ms / stats.step_ms);
    step_ms.push_back(stats.step_ms);
    double level_two_ms = 0;
    for (const char* name : level_two) level_two_ms += timer_ms(stats, name);
    EXPECT_GT(level_two_ms, 0);
    EXPECT_LE(level_two_ms, timer_ms(stats, "forward-backward")) << "step " << step;
    // The optimizer's parts inside it.
    EXPECT_LE(timer_ms(stats, "optimizer-inner-step") + timer_ms(stats, "optimizer-unscale-and-check-inf"),
              timer_ms(stats, "optimizer"));
    EXPECT_EQ(find_timer(stats, "forward-recv"), nullptr);  // no pipeline: never run
  }
  std::sort(ratios.begin(), ratios.end());
  EXPECT_GE(ratios[ratios.size() / 2], 0.95) << "median level-1 share of the step";
  std::sort(step_ms.begin(), step_ms.end());
  std::printf("level-1 share of the step: median %.4f, lowest %.4f over %zu steps of median %.1f ms\n",
              ratios[ratios.size() / 2], ratios.front(), ratios.size(), step_ms[step_ms.size() / 2]);
}

// The log line's " num zeros:" and " params norm:" (Megatron's places and formats) and the timer
// block after it: "(min, max) time across ranks (ms):" then one dot-padded line per timer.
TEST(TrainerWatch, LogLinesAreMegatrons) {
  const model::ModelConfig model = mt::testing::tiny_llama();
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 5);
  for (train::TimingLogOption option :
       {train::TimingLogOption::minmax, train::TimingLogOption::max, train::TimingLogOption::all}) {
    train::TrainConfig config = watched_config(1);
    config.timing_log_option = option;
    train::Trainer trainer(model, config, *data, backend::cpu_ops());
    std::vector<std::string> lines;
    train::TrainObservers observers;
    observers.on_log_line = [&](const std::string& line) { lines.push_back(line); };
    trainer.run(observers);
    ASSERT_EQ(lines.size(), 6u);  // a log line and a timer block per step
    EXPECT_NE(lines[0].find("| grad norm: "), std::string::npos);
    const size_t zeros = lines[0].find("| num zeros: "), norm = lines[0].find(" | params norm: ");
    ASSERT_NE(zeros, std::string::npos);
    ASSERT_NE(norm, std::string::npos);
    EXPECT_LT(lines[0].find("| grad norm: "), zeros);
    EXPECT_LT(zeros, norm);
    EXPECT_LT(norm, lines[0].find("| number of skipped iterations:"));
    const std::string& block = lines[1];
    if (option == train::TimingLogOption::minmax) {
      EXPECT_EQ(block.rfind("(min, max) time across ranks (ms):\n    forward-backward ......", 0), 0u) << block;
      EXPECT_NE(block.find("\n    optimizer ......................................: ("), std::string::npos) << block;
    } else if (option == train::TimingLogOption::max) {
      EXPECT_EQ(block.rfind("max time across ranks (ms):\n    forward-backward ...", 0), 0u) << block;
      EXPECT_EQ(block.find(": ("), std::string::npos) << block;
    } else {
      EXPECT_EQ(block.rfind("times across ranks (ms):\n  forward-backward:\n     rank  0: ", 0), 0u) << block;
    }
    EXPECT_EQ(block.find("forward-compute"), std::string::npos) << "level 2 at level 1";
  }
}

TEST(TrainerWatch, RefusesATimingLevelOutOfRange) {
  train::TrainConfig config = watched_config(3);
  EXPECT_THROW(train::validate_train_config(config), UsageError);
}
