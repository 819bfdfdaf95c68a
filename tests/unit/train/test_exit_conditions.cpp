// Megatron's --exit-interval and --exit-duration-in-mins (lib/train/exit_conditions.h): the
// decision after an iteration, never at the run's last, the duration before the interval; and the
// Trainer stopping after the agreed iteration and resuming to the end on the next run() call.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "core/error.h"
#include "data/sample_source.h"
#include "train/exit_conditions.h"
#include "train/trainer.h"
#include "../tiny_models.h"

using namespace mt;
using train::ExitConditions;
using train::StopReason;

namespace {

using Clock = std::chrono::steady_clock;

ExitConditions every(int64_t interval) {
  ExitConditions exit;
  exit.interval = interval;
  exit.started = Clock::now();
  return exit;
}

}  // namespace

TEST(ExitConditions, IntervalStopsAfterItsMultiplesButNotTheLastIteration) {
  const ExitConditions exit = every(3);
  std::vector<int64_t> stops;
  for (int64_t iteration = 1; iteration <= 9; ++iteration) {
    if (train::exit_reason(exit, iteration, 9, Clock::now()) == StopReason::exit_interval) stops.push_back(iteration);
  }
  EXPECT_EQ(stops, (std::vector<int64_t>{3, 6}));  // 9 is the last: the run ends there anyway
}

TEST(ExitConditions, DurationCountsFromTheStartAndWinsOverTheInterval) {
  ExitConditions exit = every(2);
  exit.duration_minutes = 1.5;
  const Clock::time_point start = exit.started;
  EXPECT_EQ(train::exit_reason(exit, 1, 10, start + std::chrono::seconds(89)), StopReason::none);
  EXPECT_EQ(train::exit_reason(exit, 2, 10, start + std::chrono::seconds(89)), StopReason::exit_interval);
  EXPECT_EQ(train::exit_reason(exit, 1, 10, start + std::chrono::seconds(91)), StopReason::exit_duration);
  EXPECT_EQ(train::exit_reason(exit, 2, 10, start + std::chrono::seconds(91)), StopReason::exit_duration);
  EXPECT_EQ(train::exit_reason(exit, 10, 10, start + std::chrono::seconds(91)), StopReason::none);
  EXPECT_FALSE(ExitConditions{}.any());
  EXPECT_EQ(train::exit_reason(ExitConditions{}, 1, 10, start + std::chrono::hours(100)), StopReason::none);
}

TEST(ExitConditions, NegativeValuesAreRefusedByFlag) {
  ExitConditions exit = every(-1);
  EXPECT_THROW(train::exit_reason(exit, 1, 10, Clock::now()), UsageError);
  exit = every(0);
  exit.duration_minutes = -1;
  EXPECT_THROW(train::exit_reason(exit, 1, 10, Clock::now()), UsageError);
  EXPECT_EQ(train::stop_reason_name(StopReason::exit_interval), "--exit-interval");
  EXPECT_EQ(train::stop_reason_name(StopReason::exit_duration), "--exit-duration-in-mins");
}

TEST(ExitConditions, TheTrainerStopsAfterTheIntervalAndTheNextRunGoesOnToTheEnd) {
  const model::ModelConfig c = mt::testing::trainer_model(false);
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;
  t.train_iters = 5;
  t.eval_iters = 0;
  train::Trainer trainer(c, t, *data, backend::cpu_ops());
  std::vector<int64_t> ended;
  train::TrainObservers observers;
  observers.on_iteration_end = [&](int64_t iteration) { ended.push_back(iteration); };
  const ExitConditions exit = every(2);
  trainer.run(observers, exit);
  EXPECT_TRUE(trainer.stopped());
  EXPECT_EQ(trainer.stop_reason(), StopReason::exit_interval);
  EXPECT_EQ(trainer.iteration(), 2);
  EXPECT_EQ(ended, (std::vector<int64_t>{1, 2}));  // the iteration's end (its save) comes before the stop
  trainer.run(observers, exit);
  EXPECT_EQ(trainer.iteration(), 4);
  trainer.run(observers, exit);
  EXPECT_FALSE(trainer.stopped());
  EXPECT_EQ(trainer.stop_reason(), StopReason::none);
  EXPECT_EQ(trainer.iteration(), 5);

  ExitConditions expired;
  expired.duration_minutes = 1e-9;
  expired.started = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  train::Trainer timed(c, t, *data, backend::cpu_ops());
  timed.run(observers, expired);
  EXPECT_EQ(timed.stop_reason(), StopReason::exit_duration);
  EXPECT_EQ(timed.iteration(), 1);  // after the first iteration, never before it
}
