// BERT's part of a training step and of an evaluation (issue 25), as examples/bert/pretrain_bert.py
// (Megatron-LM 0.16.1) forms and logs its losses: per micro-batch the LM loss is the mean over the
// masked positions (sum(ce * loss_mask) / sum(loss_mask)) and, with the binary head, the sop loss is
// the mean cross-entropy of the sentence-order logits over the micro-batch's samples; the loss is
// their sum. Megatron's loss function returns them as one-element values ("legacy" reporting), so
// its training loop logs each as the mean over the step's micro-batches of the DP-averaged value
// ("lm loss", "sop loss"), and evaluate() as the mean over every evaluation micro-batch.
// The grads follow from the same loss: each micro-batch's backward is scaled by
// loss_scale / (micro-batches x DP) (Megatron's division by the micro-batch count, and the DP
// average folded in as the LM loss's), which for the sop loss is the stage's sop grad factor.
// The sums the model adds per micro-batch live in device memory as kBertSumsPerMicroBatch doubles:
// (LM loss sum, masked tokens, sop loss sum, samples); the last pipeline stage adds them.
// Tested in tests/unit/train/test_bert_training.cpp and end to end by tests/tools/mt-train-bert.bats.
#pragma once

#include <optional>
#include <span>

namespace mt::train {

inline constexpr int kBertSumsPerMicroBatch = 4;

// This rank's micro-batches' logged figures: the sum over micro-batches of each one's LM mean and
// sop mean (a micro-batch with no masked token, or no sample, adds 0: what a stage before the last
// holds, so the sums can be summed over PP).
struct BertLossSums {
  double lm = 0;
  double sop = 0;
};
BertLossSums bert_loss_sums(std::span<const double> sums);

// The logged values from the sums over every rank (summed over PP and DP) and the micro-batches
// they came from (the step's over all DP ranks): each mean over the micro-batches; sop only with
// the binary head.
struct BertLosses {
  double lm = 0;
  std::optional<double> sop;
};
BertLosses bert_logged_losses(const BertLossSums& total, double micro_batches, bool binary_head);

// d(objective) / d(a micro-batch's sop loss): loss_scale / (micro-batches of the step x DP).
float bert_sop_grad_factor(double loss_scale, double micro_batches_in_step);

}  // namespace mt::train
