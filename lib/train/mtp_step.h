// Multi-token prediction's part of a training step (issue 22; the block is model/layers/mtp.h),
// as Megatron-Core 0.16.1 does it: per micro-batch and depth k the tokens of the loss mask rolled
// left k + 1 times per sample (roll_tensor's num_tokens), the grad scale each depth's backward
// starts from (MTPLossAutoScaler: lambda / D times the main loss's backward scale, the scale of
// gpt_model.py _postprocess), and the figure Megatron logs as "mtp_<k+1> loss" (each micro-batch's
// masked mean, summed by MTPLossLoggingHelper over the step's micro-batches, times
// 1 / micro-batches, then averaged over DP x CP; the caller does the DP average). Under context
// parallelism the counts and the logged sums are those of whole sequences, summed over the CP
// ranks by the caller, as mt's LM loss is (Megatron divides each CP rank's sums by its own count,
// which differs from the whole sequence's mean when the ranks' counts differ).
// Tested in tests/unit/train/test_mtp_step.cpp and end to end by tests/tools/mt-train-mtp.bats.
#pragma once

#include <vector>

namespace mt::train {

// Per micro-batch m and depth k, [m * depths + k]: the loss mask's sum over positions k + 1 ..
// seq - 1 of each of the micro-batch's samples (rows: micro_batches * samples * seq / cp_size,
// sample-major). Under context parallelism the mask is CP rank cp_rank's part of each sequence
// (parallel/context_parallel.h) and the counts are its share, which the caller sums over CP.
std::vector<double> mtp_rolled_token_counts(const float* loss_mask, int micro_batches, int samples, int seq,
                                            int depths, int cp_size = 1, int cp_rank = 0);

// d(objective) / d(depth k's loss sum) for each [m * depths + k]: lambda / depths times the
// LM loss's scale, which is loss_scale / (counts x micro_batches_in_step) by default (per
// micro-batch means; a depth without tokens gets 0), or loss_scale / step_tokens with
// --calculate-per-token-loss (Megatron's per-token MTP loss, divided with the LM loss by the
// step's tokens).
std::vector<float> mtp_loss_grad_scales(const std::vector<double>& counts, int depths, float lambda,
                                        double loss_scale, double micro_batches_in_step, bool per_token,
                                        double step_tokens);

// This rank's logged value per depth from the step's device sums read back, `sums` holding
// (loss, tokens) per [m * depths + k]: the mean over micro-batches of loss / tokens (a micro-batch
// without tokens adds 0).
std::vector<double> mtp_logged_losses(const std::vector<double>& sums, int micro_batches, int depths);

}  // namespace mt::train
