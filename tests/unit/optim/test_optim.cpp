// Megatron's LR schedule, the dynamic loss scaler, the clip factor, and AdamW over flat ranges.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "model/layout.h"
#include "optim/adamw.h"
#include "optim/distributed_optimizer.h"
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

// What the trainer's consecutive-skip stop (issue 28 W4) asks: can an overflow still lower the scale?
TEST(LossScaler, AtMinimumOnlyWhenTheScaleCannotGoLower) {
  LossScaler s = LossScaler::dynamic(4.0, 1.0, 1000, 1);
  EXPECT_FALSE(s.at_minimum());
  s.update(true);
  EXPECT_FALSE(s.at_minimum());  // 2
  s.update(true);
  EXPECT_TRUE(s.at_minimum());  // 1, the floor
  EXPECT_TRUE(LossScaler::fixed(1e30).at_minimum());
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

// A scaler restored mid-trace (as a resumed run's) continues exactly as the one never stopped:
// the scale and both trackers are carried, not just the scale.
TEST(LossScaler, RestoredStateContinuesTheTrace) {
  const bool overflows[] = {true, false, false, true, false, false, false, true, true, false, false, false};
  for (size_t cut = 0; cut <= std::size(overflows); ++cut) {
    LossScaler straight = LossScaler::dynamic(1024.0, 1.0, 3, 2);
    for (size_t i = 0; i < cut; ++i) straight.update(overflows[i]);
    LossScaler resumed = LossScaler::dynamic(1024.0, 1.0, 3, 2);
    resumed.restore(straight.state());
    for (size_t i = cut; i < std::size(overflows); ++i) {
      straight.update(overflows[i]);
      resumed.update(overflows[i]);
      ASSERT_EQ(resumed.scale(), straight.scale()) << "cut at " << cut << ", step " << i;
    }
    EXPECT_EQ(resumed.state().growth_tracker, straight.state().growth_tracker);
    EXPECT_EQ(resumed.state().hysteresis_tracker, straight.state().hysteresis_tracker);
  }
}

TEST(Clip, MegatronFactor) {
  EXPECT_EQ(clip_factor(0.4, 0.5), 1.0);
  EXPECT_NEAR(clip_factor(2.0, 1.0), 1.0 / (2.0 + 1e-6), 1e-15);
  EXPECT_EQ(clip_factor(100.0, 0.0), 1.0);
}

namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

}  // namespace

// The distributed optimizer's shards cut tensors: AdamW over ranges split inside tensors steps
// exactly like AdamW over the whole buffer (and keeps no reference to the layout it was built
// from: the layouts here are temporaries). Two cases: one optimizer over two ranges, and the DP
// shards (a slice of every bucket) of three ranks.
TEST(AdamW, FlatRangesThatCutTensorsStepLikeTheWholeBuffer) {
  using namespace mt;
  const model::ModelConfig c = model::preset("tiny-gpt");
  parallel::ParallelConfig dp3;
  dp3.data_parallel_size = 3;
  dp3.use_distributed_optimizer = true;
  model::BucketOptions buckets = DistributedOptimizer::bucket_options(dp3);  // padded to lcm(3, 128)
  buckets.bucket_elements = 30000;
  const model::ParamLayout layout =
      model::build_layout(c, dp3, parallel::RankCoordinates{}, {{0, c.num_layers, true, true}}, buckets);
  ASSERT_GT(layout.buckets.size(), 2u);
  const model::ParamEntry& fc1 = layout.find("decoder.layers.0.mlp.linear_fc1.weight");
  const int64_t cut = fc1.offset + fc1.numel / 3;  // inside a tensor
  const int64_t total = layout.total_elements;
  const backend::Ops& ops = backend::cpu_ops();
  AdamWConfig config;
  config.weight_decay = 0.1;

  std::vector<float> whole_params = random_values(static_cast<size_t>(total), 1);
  std::vector<float> split_params = whole_params, sharded_params = whole_params;
  std::vector<uint16_t> whole_bits(whole_params.size()), split_bits(whole_params.size());
  AdamW whole(layout, config, ops);
  AdamW split(model::build_layout(c, dp3, parallel::RankCoordinates{}, {{0, c.num_layers, true, true}}, buckets),
              {{0, cut}, {cut, total}}, config, ops);
  std::vector<AdamW> shards;
  for (int r = 0; r < 3; ++r) shards.emplace_back(layout, layout.data_parallel_shard(r, 3), config, ops);
  EXPECT_EQ(split.state_bytes(), whole.state_bytes());
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> grads = random_values(whole_params.size(), 10 + step);
    whole.step(whole_params.data(), whole_bits.data(), grads.data(), 1e-2, 0.5);
    split.step(split_params.data(), split_bits.data(), grads.data(), 1e-2, 0.5);
    double shard_squares = 0;
    for (AdamW& shard : shards) {
      shard.step(sharded_params.data(), nullptr, grads.data(), 1e-2, 0.5);
      shard_squares += shard.grad_sum_squares(grads.data());
    }
    const double norm = whole.grad_norm(grads.data(), 0.5);
    EXPECT_NEAR(std::sqrt(shard_squares) * 0.5, norm, 1e-12 * norm);
  }
  EXPECT_EQ(whole_params, split_params);
  EXPECT_EQ(whole_bits, split_bits);
  EXPECT_EQ(whole_params, sharded_params);
  EXPECT_THROW(AdamW(layout, {{-1, 10}}, config, ops), Error);
  EXPECT_THROW(AdamW(layout, {{0, total + 1}}, config, ops), Error);
  EXPECT_THROW(AdamW(layout, {{10, 20}, {15, 30}}, config, ops), Error);  // overlapping
}

// Under TP each replicated tensor is held by every TP rank; only the primary copy (rank 0)
// counts in the grad norm, so summing the ranks' shares counts it once.
TEST(AdamW, GradNormCountsReplicatedTensorsOnTheirPrimaryCopyOnly) {
  using namespace mt;
  const model::ModelConfig c = model::preset("tiny-gpt");
  parallel::ParallelConfig tp2;
  tp2.tensor_model_parallel_size = 2;
  int64_t split_elements = 0, replicated_elements = 0;
  for (int r = 0; r < 2; ++r) {
    parallel::RankCoordinates rank;
    rank.tp = r;
    const model::ParamLayout layout = model::build_layout(c, tp2, rank, 0, c.num_layers);
    const std::vector<float> ones(static_cast<size_t>(layout.total_elements), 1.0f);
    int64_t expected = 0;
    for (const auto& e : layout.entries) {
      if (e.split == model::TensorSplit::replicated) {
        if (r == 0) replicated_elements += e.numel;
        expected += r == 0 ? e.numel : 0;
      } else {
        split_elements += e.numel;
        expected += e.numel;
      }
    }
    AdamW optimizer(layout, AdamWConfig{}, backend::cpu_ops());
    EXPECT_EQ(optimizer.grad_sum_squares(ones.data()), static_cast<double>(expected)) << "rank " << r;
  }
  // Both ranks together count every global element once.
  EXPECT_EQ(split_elements + replicated_elements, model::build_layout(c).parameter_elements());
}
