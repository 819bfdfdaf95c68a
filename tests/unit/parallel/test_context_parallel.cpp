// Context-parallel split: rank i holds chunks i and 2 CP - 1 - i, the ranks together hold every
// position once, causal work is balanced, and split position ids and document starts (computed on
// the whole sequence, --reset-attention-mask) stay the global values, also for documents that
// start in a chunk another rank holds.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "parallel/context_parallel.h"

namespace {

using mt::parallel::context_parallel_chunks;
using mt::parallel::SequenceChunk;
using mt::parallel::split_for_context_parallel;

TEST(ContextParallel, RankHoldsAnEarlyAndTheMirroredLateChunk) {
  // T = 16, CP = 2: chunks of 4; rank 0 holds [0,4) and [12,16), rank 1 [4,8) and [8,12).
  EXPECT_EQ(context_parallel_chunks(16, 2, 0), (std::array<SequenceChunk, 2>{{{0, 4}, {12, 4}}}));
  EXPECT_EQ(context_parallel_chunks(16, 2, 1), (std::array<SequenceChunk, 2>{{{4, 4}, {8, 4}}}));
  // CP = 4, T = 16: chunks of 2; rank 1 holds chunks 1 and 6.
  EXPECT_EQ(context_parallel_chunks(16, 4, 1), (std::array<SequenceChunk, 2>{{{2, 2}, {12, 2}}}));
  // CP = 1: the two halves of the sequence, in order.
  EXPECT_EQ(context_parallel_chunks(6, 1, 0), (std::array<SequenceChunk, 2>{{{0, 3}, {3, 3}}}));
}

TEST(ContextParallel, RanksCoverTheSequenceOnceWithEqualCausalWork) {
  for (int cp : {1, 2, 3, 4, 8}) {
    const int64_t seq = 2 * cp * 5;
    std::vector<int> owners(static_cast<size_t>(seq), 0);
    int64_t first_rank_work = -1;
    for (int rank = 0; rank < cp; ++rank) {
      int64_t work = 0;  // keys seen by the rank's queries under the causal mask
      for (const SequenceChunk& chunk : context_parallel_chunks(seq, cp, rank)) {
        for (int64_t pos = chunk.first; pos < chunk.end(); ++pos) {
          ++owners[static_cast<size_t>(pos)];
          work += pos + 1;
        }
      }
      if (rank == 0) first_rank_work = work;
      EXPECT_EQ(work, first_rank_work) << "CP " << cp << " rank " << rank;
    }
    for (int64_t pos = 0; pos < seq; ++pos) EXPECT_EQ(owners[static_cast<size_t>(pos)], 1) << pos;
  }
}

TEST(ContextParallel, SplitKeepsGlobalPositionsAndDocumentStarts) {
  // Two samples of 16 tokens; documents of sample 0 start at 0, 3 and 9, of sample 1 at 0 and 14.
  const int batch = 2, cp = 2;
  const int64_t seq = 16;
  const std::vector<std::vector<int32_t>> starts{{0, 3, 9}, {0, 14}};
  std::vector<int32_t> positions, doc_start;
  for (int b = 0; b < batch; ++b) {
    for (int32_t t = 0; t < seq; ++t) {
      positions.push_back(t);
      int32_t start = 0;
      for (int32_t s : starts[static_cast<size_t>(b)]) start = s <= t ? s : start;
      doc_start.push_back(start);
    }
  }
  for (int rank = 0; rank < cp; ++rank) {
    std::vector<int32_t> local_positions(positions.size() / cp), local_docs(doc_start.size() / cp);
    split_for_context_parallel(positions.data(), local_positions.data(), batch, seq, 1, cp, rank);
    split_for_context_parallel(doc_start.data(), local_docs.data(), batch, seq, 1, cp, rank);
    const auto chunks = context_parallel_chunks(seq, cp, rank);
    size_t i = 0;
    for (int b = 0; b < batch; ++b) {
      for (const SequenceChunk& chunk : chunks) {
        for (int64_t pos = chunk.first; pos < chunk.end(); ++pos, ++i) {
          EXPECT_EQ(local_positions[i], pos) << "rank " << rank;
          EXPECT_EQ(local_docs[i], doc_start[static_cast<size_t>(b * seq + pos)]) << "rank " << rank;
        }
      }
    }
  }
  // Rank 1 holds [4, 8) and [8, 12): its first tokens belong to the document that starts at 3,
  // in chunk 0 on rank 0; rank 0's late chunk [12, 16) of sample 0 to the one starting at 9.
  std::vector<int32_t> rank1_docs(doc_start.size() / cp), rank0_docs(doc_start.size() / cp);
  split_for_context_parallel(doc_start.data(), rank1_docs.data(), batch, seq, 1, cp, 1);
  split_for_context_parallel(doc_start.data(), rank0_docs.data(), batch, seq, 1, cp, 0);
  EXPECT_EQ(rank1_docs[0], 3);
  EXPECT_EQ(rank0_docs[4], 9);
  EXPECT_EQ(rank0_docs[8 + 6], 14);  // sample 1's late chunk: position 14 starts a document
}

TEST(ContextParallel, SplitCopiesWholeRowsOfAnyWidth) {
  // (1 sample, 8 tokens, 3 features): rank 1 of CP 2 holds tokens 2, 3, 4, 5.
  std::vector<float> full(8 * 3);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
  std::vector<float> local(4 * 3);
  split_for_context_parallel(full.data(), local.data(), 1, 8, 3, 2, 1);
  for (size_t i = 0; i < local.size(); ++i) EXPECT_EQ(local[i], full[2 * 3 + i]) << i;
}

// Probe case U1: without context parallelism an odd --seq-length trains (the split keeps the
// whole sequence in order), as Megatron does.
TEST(ContextParallel, OneRankSplitsAnyLengthInOrder) {
  for (int64_t seq : {1, 3, 31, 32}) {
    const auto chunks = context_parallel_chunks(seq, 1, 0);
    EXPECT_EQ(chunks[0].first, 0);
    EXPECT_EQ(chunks[0].end(), chunks[1].first);
    EXPECT_EQ(chunks[1].end(), seq);
    std::vector<int32_t> full(2 * seq), local(2 * seq);
    for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<int32_t>(i);
    split_for_context_parallel(full.data(), local.data(), 2, seq, 1, 1, 0);
    EXPECT_EQ(local, full) << "seq " << seq;
  }
  EXPECT_THROW(context_parallel_chunks(0, 1, 0), mt::Error);
}

TEST(ContextParallel, BadSplitsAreErrors) {
  EXPECT_THROW(context_parallel_chunks(10, 2, 0), mt::Error);  // 10 not divisible by 4
  EXPECT_THROW(context_parallel_chunks(16, 2, 2), mt::Error);  // no rank 2
  EXPECT_THROW(context_parallel_chunks(16, 0, 0), mt::Error);
}

}  // namespace
