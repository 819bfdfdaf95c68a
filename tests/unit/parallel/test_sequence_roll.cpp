// Multi-token prediction's roll (parallel/sequence_roll.h) against a plain roll of the whole
// sequence: every CP rank's two chunks, rolled 1..3 times in a chain (as the MTP depths do), equal
// the context-parallel split of the whole sequence rolled left by k with its last k positions 0;
// CP = 1..4 over threads, chunks of one token (the boundary moves through every chunk) and of
// three, int32 tokens and fp32 loss masks, and one rank at an odd length.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "../thread_communicator.h"
#include "backend/ops.h"
#include "core/error.h"
#include "parallel/context_parallel.h"
#include "parallel/sequence_roll.h"

namespace {

using mt::parallel::roll_left_one;

// The whole (batch, seq) sequences rolled left by `shift`, zeros rolled in.
template <typename T>
std::vector<T> rolled_whole(const std::vector<T>& whole, int batch, int64_t seq, int shift) {
  std::vector<T> out(whole.size(), T{0});
  for (int b = 0; b < batch; ++b) {
    for (int64_t t = 0; t + shift < seq; ++t) out[static_cast<size_t>(b * seq + t)] = whole[static_cast<size_t>(b * seq + t + shift)];
  }
  return out;
}

template <typename T>
void check_chained_rolls(int cp, int64_t chunk, mt::DType dtype) {
  const int batch = 2, depths = 3;
  const int64_t seq = 2 * cp * chunk, local = seq / cp;
  std::vector<T> whole(static_cast<size_t>(batch * seq));
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<T>(i + 1);
  mt::testing::ThreadGroup group(cp);
  mt::testing::run_ranks(cp, [&](int rank) {
    mt::testing::ThreadCommunicator communicator(group, rank);
    const mt::backend::Ops& ops = mt::backend::cpu_ops();
    std::vector<T> current(static_cast<size_t>(batch * local)), next(current.size());
    std::vector<T> boundary(static_cast<size_t>(mt::parallel::sequence_roll_boundary_elements(batch)));
    mt::parallel::split_for_context_parallel(whole.data(), current.data(), batch, seq, 1, cp, rank);
    for (int k = 1; k <= depths; ++k) {
      roll_left_one(ops, ops.default_stream(), &communicator, current.data(), next.data(), batch, local, dtype,
                    boundary.data());
      const std::vector<T> reference_whole = rolled_whole(whole, batch, seq, k);
      std::vector<T> reference(current.size());
      mt::parallel::split_for_context_parallel(reference_whole.data(), reference.data(), batch, seq, 1, cp, rank);
      EXPECT_EQ(next, reference) << "CP " << cp << " rank " << rank << " chunk " << chunk << " roll " << k;
      current.swap(next);
    }
  });
}

TEST(SequenceRoll, ChainedRollsOverContextParallelRanksEqualTheWholeSequenceRolled) {
  for (int cp : {1, 2, 3, 4}) {
    for (int64_t chunk : {1, 3}) {
      check_chained_rolls<int32_t>(cp, chunk, mt::DType::i32);
      check_chained_rolls<float>(cp, chunk, mt::DType::f32);
    }
  }
}

TEST(SequenceRoll, OneRankRollsAnyLength) {
  const std::vector<int32_t> whole{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // two samples of 5
  std::vector<int32_t> out(whole.size()), boundary(8);
  const mt::backend::Ops& ops = mt::backend::cpu_ops();
  roll_left_one(ops, ops.default_stream(), nullptr, whole.data(), out.data(), 2, 5, mt::DType::i32, boundary.data());
  EXPECT_EQ(out, (std::vector<int32_t>{2, 3, 4, 5, 0, 7, 8, 9, 10, 0}));
}

TEST(SequenceRoll, RefusesChunksThatDoNotSplitInTwo) {
  mt::testing::ThreadGroup group(2);
  EXPECT_THROW(mt::testing::run_ranks(2,
                                      [&](int rank) {
                                        mt::testing::ThreadCommunicator communicator(group, rank);
                                        std::vector<int32_t> in(3), out(3), boundary(4);
                                        const mt::backend::Ops& ops = mt::backend::cpu_ops();
                                        roll_left_one(ops, ops.default_stream(), &communicator, in.data(), out.data(),
                                                      1, 3, mt::DType::i32, boundary.data());
                                      }),
               mt::Error);
}

}  // namespace
