// Multi-token prediction's step arithmetic (lib/train/mtp_step.h) against hand-counted values:
// the rolled masks' token counts, the grad scales in both normalisations, and the logged mean over
// micro-batches of each micro-batch's masked mean.
#include <gtest/gtest.h>

#include <vector>

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
