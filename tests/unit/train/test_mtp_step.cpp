// Multi-token prediction's step arithmetic (lib/train/mtp_step.h) against hand-counted values:
// the rolled masks' token counts (also split over CP ranks), the grad scales in both normalisations, and the logged mean over
// micro-batches of each micro-batch's masked mean.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/context_parallel.h"
#include "train/mtp_step.h"

using namespace mt::train;

TEST(MtpStep, CountsTheMaskRolledLeftOncePerDepth) {
  // Two micro-batches of one sample of 4 tokens.
  const std::vector<float> mask = {1, 0, 1, 1,  //
                                   1, 1, 1, 0};
  // Depth 0 counts positions 1..3, depth 1 positions 2..3.
  EXPECT_EQ(mtp_rolled_token_counts(mask.data(), 2, 1, 4, 2), (std::vector<double>{2, 2, 2, 1}));
  // One micro-batch of both samples.
  EXPECT_EQ(mtp_rolled_token_counts(mask.data(), 1, 2, 4, 1), (std::vector<double>{4}));
}

TEST(MtpStep, ContextParallelRanksCountsSumToTheWholeSequencesCounts) {
  // One micro-batch of two samples of 8 tokens; CP = 2 holds chunks of 2: rank 0 positions
  // 0, 1, 6, 7, rank 1 positions 2..5, so depth 2's positions 1 and 2 are on different ranks.
  const std::vector<float> mask = {1, 1, 0, 1, 1, 1, 0, 1,  //
                                   0, 1, 1, 1, 1, 0, 1, 1};
  const std::vector<double> whole = mtp_rolled_token_counts(mask.data(), 1, 2, 8, 3);
  EXPECT_EQ(whole, (std::vector<double>{11, 9, 8}));
  std::vector<double> summed(3, 0.0);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<float> local(8);
    mt::parallel::split_for_context_parallel(mask.data(), local.data(), 2, 8, 1, 2, rank);
    const std::vector<double> part = mtp_rolled_token_counts(local.data(), 1, 2, 8, 3, 2, rank);
    for (size_t k = 0; k < part.size(); ++k) summed[k] += part[k];
  }
  EXPECT_EQ(summed, whole);
}

TEST(MtpStep, GradScalesAreLambdaOverDepthsTimesTheLmLossScale) {
  const std::vector<double> counts = {2, 4, 0, 1};  // 2 micro-batches x 2 depths
  // Per micro-batch means over 2 micro-batches x DP 2: lambda / D * scale / (count * 4).
  EXPECT_EQ(mtp_loss_grad_scales(counts, 2, 0.3f, 8.0, 4, false, 0),
            (std::vector<float>{static_cast<float>(0.15 * 8 / 8), static_cast<float>(0.15 * 8 / 16), 0.0f,
                                static_cast<float>(0.15 * 8 / 4)}));
  // Per token: over the step's tokens, whatever the depth's count.
  const std::vector<float> per_token = mtp_loss_grad_scales(counts, 2, 0.3f, 1.0, 4, true, 10);
  for (float scale : per_token) EXPECT_FLOAT_EQ(scale, 0.015f);
}

TEST(MtpStep, LogsTheMeanOverMicroBatchesOfEachMicroBatchsMean) {
  // (loss, tokens) per [micro-batch][depth]: 2 micro-batches x 2 depths.
  const std::vector<double> sums = {6, 3, 4, 2,  //
                                    1, 1, 0, 0};
  EXPECT_EQ(mtp_logged_losses(sums, 2, 2), (std::vector<double>{1.5, 1.0}));
}
