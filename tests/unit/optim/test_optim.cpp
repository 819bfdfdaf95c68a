// Megatron's LR schedule, the dynamic loss scaler and the clip factor.
#include <gtest/gtest.h>

#include <cmath>

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

TEST(Clip, MegatronFactor) {
  EXPECT_EQ(clip_factor(0.4, 0.5), 1.0);
  EXPECT_NEAR(clip_factor(2.0, 1.0), 1.0 / (2.0 + 1e-6), 1e-15);
  EXPECT_EQ(clip_factor(100.0, 0.0), 1.0);
}
