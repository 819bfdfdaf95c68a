// The host side of the CUDA loss kernels' shared arithmetic (kernels/common/loss_math.h), held to
// the CPU kernels bit for bit: the embedding-grad walk (a column per thread, table rows split into
// buckets, consecutive hits of a row kept in a register) must give the CPU embedding_backward's
// bits for any bucket count and any order of (bucket, column), and the per-row cross-entropy loss
// summed in row order must give the CPU xent_loss_sums' double.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/loss_math.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace {

using mt::kernels::CpuIsa;
using mt::kernels::EmbeddingGradColumn;
using mt::kernels::embedding_bucket_row;
using mt::kernels::xent_row_loss;

// Values of very different magnitudes, so a sum's bits depend on the order of its additions.
std::vector<float> mixed_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = unit(rng) * (i % 3 == 0 ? 1.0e4f : (i % 3 == 1 ? 1.0f : 1.0e-3f));
  return values;
}

// grad[index[r] - index_begin, :] += dy[r, :] as the CUDA kernel's threads do it: every
// (bucket, column) pair walks the rows in order, the pairs taken from the last to the first.
void bucket_walk(const std::vector<int32_t>& indices, const std::vector<float>& dy, std::vector<float>& grad, int cols,
                 int64_t index_begin, int64_t index_end, int64_t buckets) {
  const int64_t rows = static_cast<int64_t>(indices.size());
  for (int64_t bucket = buckets - 1; bucket >= 0; --bucket) {
    for (int c = cols - 1; c >= 0; --c) {
      EmbeddingGradColumn column{grad.data(), cols, c};
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t table_row = embedding_bucket_row(indices[r], index_begin, index_end, buckets, bucket);
        if (table_row >= 0) column.add(table_row, dy[r * cols + c]);
      }
      column.finish();
    }
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(LossMath, EmbeddingGradWalkGivesTheCpuKernelsBits) {
  // A vocabulary shard [5, 12) of a larger vocabulary; tokens repeat, back to back and apart,
  // and some lie outside the shard. Positions repeat too (two samples of a short sequence).
  const int cols = 19;
  const int64_t vocab_start = 5, vocab_end = 12, positions_count = 6;
  const std::vector<int32_t> tokens = {7, 7, 7, 3, 11, 7, 5, 5, 20, 11, 6, 7, 12, 4, 5, 9, 9, 7, 11, 10, 8,
                                       7, 7, 0, 11, 6, 6, 6, 5, 13, 7, 9, 8, 8, 11, 7, 5};
  const int64_t rows = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> positions(rows);
  for (int64_t r = 0; r < rows; ++r) positions[r] = static_cast<int32_t>(r % positions_count);
  const std::vector<float> dy = mixed_values(rows * cols, 1);
  const std::vector<float> dwte_start = mixed_values((vocab_end - vocab_start) * cols, 2);
  const std::vector<float> dwpe_start = mixed_values(positions_count * cols, 3);

  for (int level = 0; level <= static_cast<int>(mt::kernels::detected_isa()); ++level) {
    const auto& ops = mt::kernels::cpu::cpu_ops(static_cast<CpuIsa>(level));
    std::vector<float> cpu_dwte = dwte_start, cpu_dwpe = dwpe_start;
    ops.embedding_backward(tokens.data(), positions.data(), dy.data(), cpu_dwte.data(), cpu_dwpe.data(), rows, cols,
                           vocab_start, vocab_end);
    for (const int64_t buckets : {int64_t{1}, int64_t{3}, int64_t{64}}) {
      std::vector<float> dwte = dwte_start, dwpe = dwpe_start;
      bucket_walk(tokens, dy, dwte, cols, vocab_start, vocab_end, buckets);
      bucket_walk(positions, dy, dwpe, cols, 0, INT64_MAX, buckets);
      EXPECT_TRUE(same_bits(dwte, cpu_dwte)) << "dwte, level " << level << ", " << buckets << " buckets";
      EXPECT_TRUE(same_bits(dwpe, cpu_dwpe)) << "dwpe, level " << level << ", " << buckets << " buckets";
    }
  }

  // The comparison can fail: the rows added in reverse order give other bits.
  std::vector<int32_t> reversed_tokens(tokens.rbegin(), tokens.rend());
  std::vector<float> reversed_dy(dy.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(&reversed_dy[r * cols], &dy[(rows - 1 - r) * cols], cols * sizeof(float));
  }
  std::vector<float> reversed = dwte_start, cpu_dwte = dwte_start;
  bucket_walk(reversed_tokens, reversed_dy, reversed, cols, vocab_start, vocab_end, 3);
  mt::kernels::cpu::cpu_ops().embedding_backward(tokens.data(), positions.data(), dy.data(), cpu_dwte.data(), nullptr,
                                                 rows, cols, vocab_start, vocab_end);
  EXPECT_FALSE(same_bits(reversed, cpu_dwte));
}

TEST(LossMath, BucketRowsCoverTheShardOnce) {
  for (int64_t index = -3; index < 40; ++index) {
    int hits = 0;
    for (int64_t bucket = 0; bucket < 4; ++bucket) hits += embedding_bucket_row(index, 10, 30, 4, bucket) >= 0;
    EXPECT_EQ(hits, index >= 10 && index < 30 ? 1 : 0) << "index " << index;
  }
  EXPECT_EQ(embedding_bucket_row(17, 10, 30, 4, 3), 7);
}

TEST(LossMath, RowLossSummedInRowOrderGivesTheCpuLossSums) {
  const int64_t rows = 23;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> logit(-20.0f, 20.0f), sumexp(1.0f, 5.0e4f), mask_value(0.0f, 1.0f);
  std::vector<float> row_max(rows), row_sumexp(rows), target(rows), mask(rows);
  for (int64_t r = 0; r < rows; ++r) {
    row_max[r] = logit(rng);
    row_sumexp[r] = sumexp(rng);
    target[r] = logit(rng);
    mask[r] = r % 5 == 0 ? 0.0f : mask_value(rng);
  }
  double loss = 0.0, mask_total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    loss += static_cast<double>(mask[r]) * xent_row_loss(row_max[r], row_sumexp[r], target[r]);
    mask_total += mask[r];
  }
  // The baseline level: its loop has no fused multiply-add, as this file's.
  double cpu_loss = 0.0, cpu_mask = 0.0;
  mt::kernels::cpu::cpu_ops(CpuIsa::x86_64_v2)
      .xent_loss_sums(row_max.data(), row_sumexp.data(), target.data(), mask.data(), rows, &cpu_loss, &cpu_mask);
  EXPECT_EQ(loss, cpu_loss);
  EXPECT_EQ(mask_total, cpu_mask);

  // One unmasked row at every level: the sum is the row's loss itself.
  for (int level = 0; level <= static_cast<int>(mt::kernels::detected_isa()); ++level) {
    double one_loss = 0.0, one_mask = 0.0;
    mt::kernels::cpu::cpu_ops(static_cast<CpuIsa>(level))
        .xent_loss_sums(&row_max[1], &row_sumexp[1], &target[1], nullptr, 1, &one_loss, &one_mask);
    EXPECT_EQ(one_loss, xent_row_loss(row_max[1], row_sumexp[1], target[1])) << "level " << level;
    EXPECT_EQ(one_mask, 1.0);
  }
}

}  // namespace
