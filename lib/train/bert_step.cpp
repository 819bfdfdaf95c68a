// BERT's losses in a step (see bert_step.h). Tested in tests/unit/train/test_bert_training.cpp.
#include "train/bert_step.h"

#include <string>

#include "core/error.h"

namespace mt::train {

BertLossSums bert_loss_sums(std::span<const double> sums) {
  if (sums.size() % kBertSumsPerMicroBatch != 0) {
    throw Error("BERT loss sums", "not a whole number of micro-batches (" + std::to_string(sums.size()) + " values)");
  }
  BertLossSums total;
  for (size_t at = 0; at < sums.size(); at += kBertSumsPerMicroBatch) {
    const double lm = sums[at], tokens = sums[at + 1], sop = sums[at + 2], samples = sums[at + 3];
    total.lm += tokens > 0 ? lm / tokens : 0.0;
    total.sop += samples > 0 ? sop / samples : 0.0;
  }
  return total;
}

BertLosses bert_logged_losses(const BertLossSums& total, double micro_batches, bool binary_head) {
  BertLosses losses;
  if (micro_batches <= 0) return losses;
  losses.lm = total.lm / micro_batches;
  if (binary_head) losses.sop = total.sop / micro_batches;
  return losses;
}

float bert_sop_grad_factor(double loss_scale, double micro_batches_in_step) {
  return micro_batches_in_step > 0 ? static_cast<float>(loss_scale / micro_batches_in_step) : 0.0f;
}

}  // namespace mt::train
