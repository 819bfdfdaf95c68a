// The layout planner (lib/study/planner.h): every candidate is valid and fits, the ranking is by
// predicted throughput, and the obvious answers come out (no model parallelism for a model that
// fits one GPU; model parallelism for one that does not).
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "study/planner.h"

using namespace mt::study;

TEST(Planner, SmallModelNeedsNoModelParallelism) {
  PlanRequest request;
  request.gpus = 8;
  request.cluster = "dgx-h100";
  request.global_batch_size = 64;
  auto c = mt::model::preset("gpt2-345m");
  const PlanResult plan = plan_layouts(c, request);
  ASSERT_FALSE(plan.best.empty());
  EXPECT_GT(plan.enumerated, plan.fitting / 2);
  const TrainingShape& best = plan.best[0].shape;
  EXPECT_EQ(best.parallel.tensor_model_parallel_size * best.parallel.pipeline_model_parallel_size * best.parallel.context_parallel_size, 1);
  EXPECT_EQ(best.parallel.data_parallel_size, 8);
  for (size_t i = 1; i < plan.best.size(); ++i) {
    EXPECT_GE(plan.best[i - 1].prediction.tokens_per_second, plan.best[i].prediction.tokens_per_second);
  }
}

TEST(Planner, LargeModelIsSplitAndEveryCandidateFits) {
  PlanRequest request;
  request.gpus = 64;
  request.cluster = "dgx-h100";
  request.global_batch_size = 256;
  request.top = 5;
  const auto c = mt::model::preset("llama3-70b");
  const PlanResult plan = plan_layouts(c, request);
  ASSERT_EQ(plan.best.size(), 5u);
  EXPECT_LT(plan.fitting, plan.enumerated);  // 70B with no model parallelism does not fit 80 GB
  for (const PlanCandidate& candidate : plan.best) {
    const TrainingShape& s = candidate.shape;
    EXPECT_EQ(s.world_size(), 64);
    EXPECT_NO_THROW(s.validate(c));
    EXPECT_LE(candidate.peak_bytes, 80.0 * 1024 * 1024 * 1024);
    EXPECT_GT(s.parallel.tensor_model_parallel_size * s.parallel.pipeline_model_parallel_size + (s.fsdp ? 1 : 0), 1);
    EXPECT_GT(candidate.mfu, 0.05);
    EXPECT_LT(candidate.mfu, 0.8);
  }
  // A tighter memory budget leaves fewer layouts.
  request.memory_bytes = 40.0 * 1024 * 1024 * 1024;
  EXPECT_LT(plan_layouts(c, request).fitting, plan.fitting);
}

TEST(Planner, RefusesImpossibleRequests) {
  PlanRequest request;
  request.gpus = 8;
  request.cluster = "dgx-h100";
  request.global_batch_size = 3;  // no micro-batch x DP divides 3 on 8 GPUs without model parallelism...
  request.micro_batch_sizes = {2};
  EXPECT_THROW(plan_layouts(mt::model::preset("gpt2-124m"), request), mt::UsageError);
  request.cluster = "nowhere";
  EXPECT_THROW(plan_layouts(mt::model::preset("gpt2-124m"), request), mt::UsageError);
}
