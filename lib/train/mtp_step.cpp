// Multi-token prediction's part of a training step (see mtp_step.h).
#include "train/mtp_step.h"

#include <cstddef>

#include "parallel/context_parallel.h"

namespace mt::train {

std::vector<double> mtp_rolled_token_counts(const float* loss_mask, int micro_batches, int samples, int seq,
                                            int depths, int cp_size, int cp_rank) {
  const auto chunks = parallel::context_parallel_chunks(seq, cp_size, cp_rank);
  const int64_t local_seq = chunks[0].length + chunks[1].length;
  std::vector<double> counts(static_cast<size_t>(micro_batches) * depths, 0.0);
  for (int m = 0; m < micro_batches; ++m) {
    for (int b = 0; b < samples; ++b) {
      const float* row = loss_mask + (static_cast<ptrdiff_t>(m) * samples + b) * local_seq;
      for (const parallel::SequenceChunk& chunk : chunks) {
        for (int64_t t = chunk.first; t < chunk.end(); ++t, ++row) {
          // Depth k's rolled mask holds position t at t - k - 1, inside the sequence for t > k.
          for (int k = 0; k < depths && k < t; ++k) counts[static_cast<size_t>(m) * depths + k] += *row;
        }
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
