// Multi-token prediction's part of a training step (see mtp_step.h).
#include "train/mtp_step.h"

#include <cstddef>

namespace mt::train {

std::vector<double> mtp_rolled_token_counts(const float* loss_mask, int micro_batches, int samples, int seq,
                                            int depths) {
  std::vector<double> counts(static_cast<size_t>(micro_batches) * depths, 0.0);
  for (int m = 0; m < micro_batches; ++m) {
    for (int b = 0; b < samples; ++b) {
      const float* row = loss_mask + (static_cast<ptrdiff_t>(m) * samples + b) * seq;
      for (int k = 0; k < depths; ++k) {
        double& count = counts[static_cast<size_t>(m) * depths + k];
        for (int t = k + 1; t < seq; ++t) count += row[t];
      }
    }
  }
  return counts;
}

std::vector<float> mtp_loss_grad_scales(const std::vector<double>& counts, int depths, float lambda,
                                        double loss_scale, double micro_batches_in_step, bool per_token,
                                        double step_tokens) {
  std::vector<float> scales(counts.size(), 0.0f);
  const double weight = static_cast<double>(lambda) / depths;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double denominator = per_token ? step_tokens : counts[i] * micro_batches_in_step;
    scales[i] = denominator > 0 ? static_cast<float>(weight * loss_scale / denominator) : 0.0f;
  }
  return scales;
}

std::vector<double> mtp_logged_losses(const std::vector<double>& sums, int micro_batches, int depths) {
  std::vector<double> losses(static_cast<size_t>(depths), 0.0);
  for (int m = 0; m < micro_batches; ++m) {
    for (int k = 0; k < depths; ++k) {
      const size_t at = 2 * (static_cast<size_t>(m) * depths + k);
      if (sums[at + 1] > 0) losses[static_cast<size_t>(k)] += sums[at] / sums[at + 1];
    }
  }
  for (double& loss : losses) loss /= micro_batches;
  return losses;
}

}  // namespace mt::train
