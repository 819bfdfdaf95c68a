// Megatron's LR schedule, the dynamic loss scaler and the clip factor.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>

#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

using namespace mt::optim;

TEST(LrSchedule, WarmupStartsAtZeroThenCosine) {
  LrSchedule s;
  s.max_lr = 3e-3;
  s.min_lr = 3e-4;
  s.warmup_samples = 8;  // 2 iterations of 4
  s.decay_samples = 40;  // 10 iterations
  s.style = LrDecayStyle::cosine;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);  // iteration 1, as Megatron (init_lr 0)
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1.5e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(8), 3e-3);
  EXPECT_NEAR(s.lr_at(24), 3e-4 + 0.5 * (std::cos(M_PI * 0.5) + 1) * 2.7e-3, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(40), 3e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(44), 3e-4);
  s.style = LrDecayStyle::linear;
  EXPECT_NEAR(s.lr_at(24), 3e-4 + 0.5 * 2.7e-3, 1e-15);
  s.style = LrDecayStyle::constant;
  EXPECT_DOUBLE_EQ(s.lr_at(30), 3e-3);
}

TEST(LossScaler, HysteresisBackoffAndGrowth) {
  LossScaler s = LossScaler::dynamic(1024.0, 1.0, 3, 2);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024.0);  // first overflow absorbed by hysteresis
  s.update(true);
  EXPECT_EQ(s.scale(), 512.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 256.0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 256.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0);  // 3 clean steps double it
  LossScaler floor = LossScaler::dynamic(2.0, 1.0, 1000, 1);
  floor.update(true);
  floor.update(true);
  floor.update(true);
  EXPECT_EQ(floor.scale(), 1.0);
  LossScaler fixed = LossScaler::fixed(128.0);
  fixed.update(true);
  EXPECT_EQ(fixed.scale(), 128.0);
}

// A mixed run of overflowing and clean steps against Megatron's DynamicGradScaler.update()
// (megatron/core/optimizer/grad_scaler.py), traced by hand from its rules:
//   overflow: growth_tracker = 0; hysteresis_tracker -= 1;
//             if hysteresis_tracker <= 0: scale = max(scale * 0.5, min_scale)
//   clean:    growth_tracker += 1;
//             if growth_tracker == growth_interval:
//                 growth_tracker = 0; hysteresis_tracker = hysteresis; scale *= 2
// A clean step never restores the hysteresis budget (only a growth does), so overflows need not
// be consecutive to back off, and once the budget is spent every overflow halves the scale.
// Here initial_scale 1024, min_scale 128, growth_interval 3, hysteresis 2.
TEST(LossScaler, MixedOverflowsFollowMegatronsTrace) {
  struct Step {
    bool overflow;
    double scale_after;  // Megatron's scale after update(); trackers after the step in the comment
  };
  const Step trace[] = {
      {true, 1024},   //  1 growth 0, hysteresis 1: absorbed
      {false, 1024},  //  2 growth 1, hysteresis stays 1 (a clean step does not restore it)
      {true, 512},    //  3 growth 0, hysteresis 0: backs off although step 2 was clean
      {false, 512},   //  4 growth 1
      {false, 512},   //  5 growth 2
      {true, 256},    //  6 growth 0, hysteresis -1: spent, so every overflow halves
      {false, 256},   //  7 growth 1
      {false, 256},   //  8 growth 2
      {false, 512},   //  9 growth 3 = interval: growth 0, hysteresis 2, scale doubles
      {true, 512},    // 10 growth 0, hysteresis 1: absorbed again after the growth
      {false, 512},   // 11 growth 1
      {false, 512},   // 12 growth 2
      {false, 1024},  // 13 growth 3: doubles, hysteresis 2 (was 1)
      {true, 1024},   // 14 hysteresis 1
      {true, 512},    // 15 hysteresis 0
      {true, 256},    // 16 hysteresis -1
      {true, 128},    // 17 hysteresis -2
      {true, 128},    // 18 hysteresis -3: max(64, min_scale 128)
      {false, 128},   // 19 growth 1
      {true, 128},    // 20 growth 0 again, hysteresis -4: the floor holds
      {false, 128},   // 21 growth 1
      {false, 128},   // 22 growth 2
      {false, 256},   // 23 growth 3: doubles from the floor, hysteresis 2
      {true, 256},    // 24 hysteresis 1: absorbed
  };
  LossScaler s = LossScaler::dynamic(1024.0, 128.0, 3, 2);
  for (size_t step = 0; step < std::size(trace); ++step) {
    s.update(trace[step].overflow);
    EXPECT_EQ(s.scale(), trace[step].scale_after) << "after step " << step + 1;
  }
}

TEST(Clip, MegatronFactor) {
  EXPECT_EQ(clip_factor(0.4, 0.5), 1.0);
  EXPECT_NEAR(clip_factor(2.0, 1.0), 1.0 / (2.0 + 1e-6), 1e-15);
  EXPECT_EQ(clip_factor(100.0, 0.0), 1.0);
}
