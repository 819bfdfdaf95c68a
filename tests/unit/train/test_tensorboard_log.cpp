// Megatron's TensorBoard scalars (train/tensorboard_log.h) from filled-in step and eval figures,
// read back with io::read_event_file: names, steps (iteration or consumed samples) and conditions
// (--tensorboard-log-interval, loss scale on by default, grad norm absent on a skipped step,
// params norm and zeros when present, memory, ppl, throughput only with timers), the timers'
// window (the max over ranks of each rank's sum) divided by --log-interval as Megatron's
// timers.write(), and a resumed run's START with the `vs samples` copies. The end-to-end check is
// tests/tools/tensorboard.bats.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../temp_dir.h"
#include "backend/memory.h"
#include "core/error.h"
#include "io/tensorboard_events.h"
#include "train/tensorboard_log.h"

using namespace mt;

namespace {

using Points = std::map<std::string, std::vector<std::pair<int64_t, float>>>;  // tag -> (step, value)

// Scalars of every event file in the directory, in file order.
Points read_points(const std::string& directory, std::vector<int64_t>* starts = nullptr) {
  Points points;
  for (const std::string& file : io::event_files(directory)) {
    for (const io::Event& e : io::read_event_file(file)) {
      if (e.kind == io::Event::Kind::scalar) points[e.tag].emplace_back(e.step, e.value);
      if (e.kind == io::Event::Kind::session_start && starts) starts->push_back(e.step);
    }
  }
  return points;
}

train::StepStats step_stats(int64_t iteration) {
  train::StepStats s;
  s.iteration = iteration;
  s.consumed_samples = iteration * 8;
  s.lm_loss = 10.0 - 0.25 * static_cast<double>(iteration);
  s.grad_norm = 1.0 + 0.125 * static_cast<double>(iteration);
  s.lr = 1e-4 * static_cast<double>(iteration);
  s.loss_scale = 65536;
  s.global_batch_size = 8;
  s.step_ms = 100.0 * static_cast<double>(iteration);
  s.tflops_per_device = 2.0;
  return s;
}

train::TensorBoardOptions options(const mt::testing::TempDir& dir) {
  train::TensorBoardOptions o;
  o.dir = dir.file("tb");
  return o;
}

std::vector<std::pair<int64_t, float>> at(std::initializer_list<std::pair<int64_t, double>> points) {
  std::vector<std::pair<int64_t, float>> out;
  for (const auto& [step, value] : points) out.emplace_back(step, static_cast<float>(value));
  return out;
}

}  // namespace

TEST(TensorBoardLog, StepScalarsHaveMegatronsNamesAndSampleSteps) {
  mt::testing::TempDir dir;
  {
    train::TensorBoardLog log(options(dir), {});
    log.resume(0, 0);
    for (int64_t i = 1; i <= 2; ++i) log.step(step_stats(i));
  }
  const Points p = read_points(dir.file("tb"));
  EXPECT_EQ(p.at("lm loss"), at({{1, 9.75}, {2, 9.5}}));
  EXPECT_EQ(p.at("lm loss vs samples"), at({{8, 9.75}, {16, 9.5}}));
  EXPECT_EQ(p.at("learning-rate"), at({{1, 1e-4}, {2, 2e-4}}));
  EXPECT_EQ(p.at("learning-rate vs samples"), at({{8, 1e-4}, {16, 2e-4}}));
  EXPECT_EQ(p.at("grad-norm vs samples"), at({{8, 1.125}, {16, 1.25}}));
  EXPECT_EQ(p.at("batch-size"), at({{1, 8}, {2, 8}}));
  EXPECT_EQ(p.at("batch-size vs samples"), at({{8, 8}, {16, 8}}));
  EXPECT_EQ(p.at("loss-scale"), at({{1, 65536}, {2, 65536}}));
  for (const char* absent : {"params-norm", "num-zeros", "mem-allocated-bytes", "iteration-time", "throughput"}) {
    EXPECT_EQ(p.count(absent), 0u) << absent;
  }
}

TEST(TensorBoardLog, ConditionsFollowMegatron) {
  mt::testing::TempDir dir;
  train::TensorBoardOptions o = options(dir);
  o.log_interval = 2;
  o.log_loss_scale = false;
  o.log_memory = true;
  {
    train::TensorBoardLog log(o, [] { return train::AllocatorMemory{400, 300, 500, 7}; });
    for (int64_t i = 1; i <= 4; ++i) {
      train::StepStats s = step_stats(i);
      s.skipped = i == 4;
      if (i >= 2) s.params_norm = 3.5;
      if (i >= 2) s.num_zeros = 12;
      log.step(s);
    }
  }
  const Points p = read_points(dir.file("tb"));
  EXPECT_EQ(p.at("lm loss"), at({{2, 9.5}, {4, 9.0}}));    // every --tensorboard-log-interval
  EXPECT_EQ(p.at("grad-norm"), at({{2, 1.25}}));           // not on the skipped step 4
  EXPECT_EQ(p.at("params-norm"), at({{2, 3.5}, {4, 3.5}}));
  EXPECT_EQ(p.at("params-norm vs samples"), at({{16, 3.5}, {32, 3.5}}));
  EXPECT_EQ(p.at("num-zeros"), at({{2, 12}, {4, 12}}));
  EXPECT_EQ(p.count("loss-scale"), 0u);
  EXPECT_EQ(p.at("mem-reserved-bytes"), at({{2, 400}, {4, 400}}));
  EXPECT_EQ(p.at("mem-allocated-bytes"), at({{2, 300}, {4, 300}}));
  EXPECT_EQ(p.at("mem-max-allocated-bytes"), at({{2, 500}, {4, 500}}));
  EXPECT_EQ(p.at("mem-allocated-count"), at({{2, 7}, {4, 7}}));
  EXPECT_EQ(p.count("mem-allocated-bytes vs samples"), 0u);
}

TEST(TensorBoardLog, TimersAreTheLargestRanksSumOverTheLogInterval) {
  mt::testing::TempDir dir;
  train::TensorBoardOptions o = options(dir);
  o.log_timers = true;
  o.log_throughput = true;
  o.timers_interval = 2;
  {
    train::TensorBoardLog log(o, {});
    for (int64_t i = 1; i <= 5; ++i) {
      train::StepStats s = step_stats(i);
      s.tflops_per_device = static_cast<double>(i);
      const double d = static_cast<double>(i);
      // Two ranks; the optimizer's slow rank alternates, so the max over ranks of each rank's sum
      // (Megatron's) is not the sum of each step's max (5 ms, not 8, over two steps).
      const std::vector<double> optimizer_ms = i % 2 == 1 ? std::vector<double>{4.0, 1.0} : std::vector<double>{1.0, 4.0};
      s.timers = {{"forward-backward", 1, 10.0 * d, 20.0 * d, {10.0 * d, 20.0 * d}},
                  {"optimizer", 1, 1.0, 4.0, optimizer_ms}};
      log.step(s);
    }
  }
  const Points p = read_points(dir.file("tb"));
  // Written at the run's first iteration and every 2nd; the first write does not restart the
  // window (Megatron's reset=False there), so iteration 2 covers steps 1 and 2.
  EXPECT_EQ(p.at("forward-backward-time"), at({{1, 0.020 / 2}, {2, (0.020 + 0.040) / 2}, {4, (0.060 + 0.080) / 2}}));
  EXPECT_EQ(p.at("optimizer-time"), at({{1, 0.004 / 2}, {2, 0.005 / 2}, {4, 0.005 / 2}}));
  EXPECT_EQ(p.at("iteration-time"), at({{2, 0.15}, {4, 0.35}}));  // seconds, the window's mean; not at 1
  // TFLOP/s over the window: sum(tflops x seconds) / seconds.
  EXPECT_EQ(p.at("throughput"), at({{1, 1.0}, {2, (1 * 0.1 + 2 * 0.2) / 0.3}, {4, (3 * 0.3 + 4 * 0.4) / 0.7}}));
}

TEST(TensorBoardLog, ThroughputNeedsBothFlagsAndTimersNeedTheirs) {
  mt::testing::TempDir dir;
  train::TensorBoardOptions o = options(dir);
  o.log_throughput = true;  // without --log-timers-to-tensorboard
  {
    train::TensorBoardLog log(o, {});
    train::StepStats s = step_stats(1);
    s.timers = {{"forward-backward", 1, 1.0, 2.0, {1.0, 2.0}}};
    log.step(s);
  }
  const Points p = read_points(dir.file("tb"));
  EXPECT_EQ(p.count("throughput"), 0u);
  EXPECT_EQ(p.count("forward-backward-time"), 0u);
}

TEST(TensorBoardLog, ValidationScalarsAndThePplPairOnlyWithItsFlag) {
  for (const bool ppl : {false, true}) {
    mt::testing::TempDir dir;
    train::TensorBoardOptions o = options(dir);
    o.log_validation_ppl = ppl;
    {
      train::TensorBoardLog log(o, {});
      log.step(step_stats(3));
      log.eval(train::EvalStats{3, 2.5, std::exp(2.5)});
    }
    const Points p = read_points(dir.file("tb"));
    EXPECT_EQ(p.at("lm loss validation"), at({{3, 2.5}}));
    EXPECT_EQ(p.at("lm loss validation vs samples"), at({{24, 2.5}}));
    EXPECT_EQ(p.count("lm loss validation ppl"), ppl ? 1u : 0u);
    if (ppl) {
      EXPECT_EQ(p.at("lm loss validation ppl vs samples"), at({{24, std::exp(2.5)}}));
    }
  }
}

TEST(TensorBoardLog, AResumedRunStartsAtItsFirstIterationAndCopiesTheHiddenSamplePoints) {
  mt::testing::TempDir dir;
  {  // killed after iteration 5, its checkpoint at 3
    train::TensorBoardLog log(options(dir), {});
    log.resume(0, 0);
    for (int64_t i = 1; i <= 5; ++i) log.step(step_stats(i));
  }
  {
    train::TensorBoardLog log(options(dir), {});
    log.resume(3, 24);
    for (int64_t i = 4; i <= 6; ++i) log.step(step_stats(i));
  }
  std::vector<int64_t> starts;
  const Points p = read_points(dir.file("tb"), &starts);
  EXPECT_EQ(starts, (std::vector<int64_t>{1, 4}));
  // The second file: after its START (step 4, hiding steps >= 4 of the first), copies of the
  // first run's samples points 8..24 that the START hides too, then its own from 32 on.
  const std::vector<std::pair<int64_t, float>> loss_vs_samples = p.at("lm loss vs samples");
  EXPECT_EQ(loss_vs_samples, at({{8, 9.75}, {16, 9.5}, {24, 9.25}, {32, 9.0}, {40, 8.75},  // first run
                                 {8, 9.75}, {16, 9.5}, {24, 9.25},                          // copies
                                 {32, 9.0}, {40, 8.75}, {48, 8.5}}));
  EXPECT_EQ(p.at("lm loss"), at({{1, 9.75}, {2, 9.5}, {3, 9.25}, {4, 9.0}, {5, 8.75}, {4, 9.0}, {5, 8.75}, {6, 8.5}}));
}

TEST(TensorBoardLog, BadIntervalsAreRefusedByFlag) {
  mt::testing::TempDir dir;
  train::TensorBoardOptions o = options(dir);
  o.log_interval = 0;
  try {
    train::validate(o);
    FAIL() << "accepted --tensorboard-log-interval 0";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard-log-interval"), std::string::npos) << e.what();
  }
}

TEST(TensorBoardLog, TheLedgerCountsTheBuffersItHolds) {
  backend::MemoryLedger ledger;
  ledger.add(backend::MemoryCategory::weights, 64);
  ledger.add(backend::MemoryCategory::grads, 128);
  EXPECT_EQ(ledger.live_count(), 2);
  ledger.remove(backend::MemoryCategory::weights, 64);
  EXPECT_EQ(ledger.live_count(), 1);
  EXPECT_EQ(ledger.live_total(), 128);
}
