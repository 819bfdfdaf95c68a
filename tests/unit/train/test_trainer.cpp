// The training loop: loss goes down, gradient accumulation equals one big micro-batch, fp16
// overflow skips the step without touching parameters and lowers the scale, NaN checks, memory
// refusal before allocation, mock data determinism, and evaluate() equal to a log-softmax over
// logits of the validation samples Megatron's walk picks, computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/stop_request.h"
#include "data/sample_source.h"
#include "train/trainer.h"
#include "../tiny_models.h"

using namespace mt;

namespace {

model::ModelConfig tiny() { return mt::testing::tiny_llama(); }

train::TrainConfig quick(int iters) {
  train::TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;
  t.train_iters = iters;
  t.lr = 1e-2;
  t.eval_iters = 0;
  return t;
}

// The validation split of another source served as its training split, so Trainer::forward_logits
// (which reads training samples) gives the logits of validation samples.
class ValidationAsTraining : public data::SampleSource {
 public:
  explicit ValidationAsTraining(const data::SampleSource& inner) : inner_(inner) {}
  void sample(data::Split, int64_t index, int32_t* tokens) const override {
    inner_.sample(data::Split::valid, index, tokens);
  }
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  std::string describe() const override { return "validation split of " + inner_.describe(); }

 private:
  const data::SampleSource& inner_;
};

// Mean cross-entropy of validation samples [first, first + count) under `params`: logits from a
// second trainer holding the same parameters, log-softmax and the mean over every label here.
double validation_loss(const model::ModelConfig& c, const train::TrainConfig& t, const data::SampleSource& data,
                       const float* params, int64_t first, int count) {
  ValidationAsTraining valid(data);
  train::Trainer reader(c, t, valid, backend::cpu_ops());
  std::copy(params, params + reader.layout().total_elements, reader.parameters());
  reader.parameters_changed();
  const int seq = c.seq_length;
  const int64_t vocab = c.vocab_size;
  std::vector<float> logits(static_cast<size_t>(count) * seq * vocab);
  reader.forward_logits(first, count, logits.data());
  std::vector<int32_t> tokens(static_cast<size_t>(seq) + 1);
  double loss = 0;
  for (int b = 0; b < count; ++b) {
    data.sample(data::Split::valid, first + b, tokens.data());
    for (int p = 0; p < seq; ++p) {
      const float* row = logits.data() + (static_cast<int64_t>(b) * seq + p) * vocab;
      const double peak = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - peak);
      loss += peak + std::log(sum) - row[tokens[static_cast<size_t>(p) + 1]];
    }
  }
  return loss / (static_cast<double>(count) * seq);
}

}  // namespace

TEST(MockData, DeterministicAndInVocabulary) {
  auto a = data::make_mock_data(50, 16, 7);
  auto b = data::make_mock_data(50, 16, 7);
  auto c = data::make_mock_data(50, 16, 8);
  std::vector<int32_t> x(17), y(17), z(17), v(17);
  a->sample(data::Split::train, 5, x.data());
  b->sample(data::Split::train, 5, y.data());
  c->sample(data::Split::train, 5, z.data());
  a->sample(data::Split::valid, 5, v.data());
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  EXPECT_NE(x, v);
  for (int32_t t : x) EXPECT_TRUE(t >= 0 && t < 50);
}

TEST(Trainer, LossDecreasesOnRepetitiveData) {
  const auto c = tiny();
  auto data = data::make_mock_data(4, c.seq_length, 1);  // 4 distinct tokens: easy to learn
  train::Trainer trainer(c, quick(30), *data, backend::cpu_ops());
  std::vector<double> losses;
  train::TrainObservers observers;
  observers.on_step = [&](const train::StepStats& s) { losses.push_back(s.lm_loss); };
  trainer.run(observers);
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), losses.front() - 0.5);
}

TEST(Trainer, GradientAccumulationEqualsOneMicroBatch) {
  const auto c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::TrainConfig accumulate = quick(3), single = quick(3);
  single.micro_batch_size = 4;
  train::Trainer a(c, accumulate, *data, backend::cpu_ops()), b(c, single, *data, backend::cpu_ops());
  for (int i = 0; i < 3; ++i) {
    const auto sa = a.train_step();
    const auto sb = b.train_step();
    EXPECT_NEAR(sa.lm_loss, sb.lm_loss, 1e-5);
    EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-4 * sb.grad_norm);
  }
  const int64_t n = a.layout().total_elements;
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a.parameters()[i], b.parameters()[i], 2e-5) << i;
}

TEST(Trainer, Fp16OverflowSkipsTheStepAndLowersTheScale) {
  const auto c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::TrainConfig t = quick(4);
  t.precision = Precision::fp16;
  t.initial_loss_scale = 1099511627776.0;  // 2^40: the scaled grads overflow fp16
  t.hysteresis = 1;
  train::Trainer trainer(c, t, *data, backend::cpu_ops());
  const int64_t n = trainer.layout().total_elements;
  std::vector<float> before(trainer.parameters(), trainer.parameters() + n);
  const auto first = trainer.train_step();
  EXPECT_TRUE(first.skipped);
  EXPECT_EQ(first.skipped_iters, 1);
  EXPECT_EQ(std::memcmp(before.data(), trainer.parameters(), sizeof(float) * n), 0);
  const auto second = trainer.train_step();
  EXPECT_LT(second.loss_scale, first.loss_scale);
  // With a sane static scale fp16 trains.
  t.loss_scale = 1024;
  train::Trainer fixed(c, t, *data, backend::cpu_ops());
  const auto step = fixed.train_step();
  EXPECT_FALSE(step.skipped);
  EXPECT_EQ(step.loss_scale, 1024);
}

// Megatron's evaluate(): eval_iters global batches of the validation split, each evaluation
// continuing where the last one stopped (consumed_valid_samples), the loss the mean over tokens.
TEST(Trainer, EvaluationIsTheLossOfTheValidationSamplesWalkedInOrder) {
  const auto c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 5);
  train::TrainConfig t = quick(3);
  t.eval_iters = 3;  // 3 global batches of 4: validation samples 0..11, then 12..23
  train::Trainer trainer(c, t, *data, backend::cpu_ops());
  for (int i = 0; i < 3; ++i) trainer.train_step();
  const train::EvalStats first = trainer.evaluate();
  const train::EvalStats second = trainer.evaluate();
  EXPECT_EQ(trainer.consumed_valid_samples(), 24);
  const double expected_first = validation_loss(c, t, *data, trainer.parameters(), 0, 12);
  const double expected_second = validation_loss(c, t, *data, trainer.parameters(), 12, 12);
  EXPECT_NEAR(first.lm_loss, expected_first, 1e-5 * expected_first);
  EXPECT_NEAR(second.lm_loss, expected_second, 1e-5 * expected_second);
  EXPECT_NEAR(first.ppl, std::exp(first.lm_loss), 1e-9 * first.ppl);
  EXPECT_EQ(first.iteration, 3);
}

// Issue 11 case 6: as Megatron by default, a NaN/Inf loss or grad outside fp16 loss scaling is
// fatal and names the iteration; with the check off the step is skipped and counted.
TEST(Trainer, Issue11Case6NanIsFatalByDefaultAndCountedWhenTheCheckIsOff) {
  auto c = tiny();
  c.init_method_std = 1e30f;  // logits overflow to inf
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::TrainConfig t = quick(2);
  {
    train::Trainer strict(c, t, *data, backend::cpu_ops());
    try {
      strict.train_step();
      FAIL() << "a non-finite loss was accepted by default";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("iteration 1: ", 0), 0u) << e.what();
    }
  }
  t.check_for_nan_in_loss_and_grad = false;
  train::Trainer lenient(c, t, *data, backend::cpu_ops());
  const auto s = lenient.train_step();
  EXPECT_TRUE(s.skipped);
  EXPECT_EQ(s.nan_iters, 1);
  EXPECT_EQ(s.skipped_iters, 1);
}

TEST(Trainer, RefusesAModelThatCannotFitBeforeAllocating) {
  const auto c = model::preset("llama3-70b");
  auto data = data::make_mock_data(100, c.seq_length, 1);
  train::TrainConfig t = quick(1);
  t.micro_batch_size = 1;
  t.global_batch_size = 1;
  try {
    train::Trainer trainer(c, t, *data, backend::cpu_ops());
    FAIL() << "a 70B model was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("needs"), std::string::npos) << what;
    EXPECT_NE(what.find("available"), std::string::npos) << what;
  }
}

TEST(Trainer, ValidatesBatchAndScheduleFlags) {
  const auto c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::TrainConfig t = quick(2);
  t.global_batch_size = 5;
  EXPECT_THROW(train::Trainer(c, t, *data, backend::cpu_ops()), UsageError);
  t = quick(2);
  t.train_samples = 8;
  EXPECT_THROW(train::Trainer(c, t, *data, backend::cpu_ops()), UsageError);
  t = quick(2);
  t.lr_warmup_iters = 5;
  t.lr_decay_style = optim::LrDecayStyle::cosine;
  EXPECT_THROW(train::Trainer(c, t, *data, backend::cpu_ops()), UsageError);
}

// Issue 11 case 3: a stop request (a signal, in the tools) ends run() between steps.
TEST(Trainer, Issue11Case3AStopRequestEndsTheRunBetweenSteps) {
  const auto c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::Trainer trainer(c, quick(5), *data, backend::cpu_ops());
  int steps = 0;
  train::TrainObservers observers;
  observers.on_step = [&](const train::StepStats& s) {
    ++steps;
    if (s.iteration == 2) request_stop(SIGTERM);
  };
  clear_stop_request();
  trainer.run(observers);
  clear_stop_request();
  EXPECT_TRUE(trainer.stopped());
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(trainer.iteration(), 2);
  trainer.run(observers);  // resumes where it stopped
  EXPECT_FALSE(trainer.stopped());
  EXPECT_EQ(trainer.iteration(), 5);
}
