// Model FLOPs per token under each convention (lib/perf/flops.h), against the GPT-2 124M figures
// of the CPU baseline measurements.
#include <gtest/gtest.h>

#include "model/config.h"
#include "perf/flops.h"

using namespace mt::model;

TEST(Flops, GptTwoConventionMatchesTheBaselineNotes) {
  const ModelConfig c = preset("gpt2-124m");
  EXPECT_EQ(mt::perf::flops_parameter_count(c), 123653376);  // 123.65M: positions excluded, tied head once
  ModelConfig short_seq = c;
  short_seq.seq_length = 64;
  // 191.7 GFLOP per step at B=4, T=64 (cpu-baselines.md).
  const double step = 4 * 64 * mt::perf::flops_per_token(short_seq, mt::perf::FlopsConvention::full_attention);
  EXPECT_NEAR(step / 1e9, 191.7, 0.1);
  EXPECT_LT(mt::perf::flops_per_token(c, mt::perf::FlopsConvention::causal_attention),
            mt::perf::flops_per_token(c, mt::perf::FlopsConvention::full_attention));
}
