// Ring attention in a group of one (the single-rank communicator): the same results as the
// backend's attention on the whole sequence, with and without documents, non-causal with padding,
// and bad shapes refused.
// The multi-rank cases are in tests/mpi/test_ring_attention.cpp.
#include <gtest/gtest.h>

#include "core/error.h"
#include "ring_attention_check.h"

namespace {

TEST(RingAttention, OneRankEqualsFullAttention) {
  auto group = mt::comm::make_single_communicator();
  for (int kind = 0; kind < 3; ++kind) {
    ring_check::RingCase c;
    c.documents = kind == 1;
    c.bidirectional = kind == 2;
    const ring_check::RingErrors e = ring_check::ring_attention_errors(mt::backend::cpu_ops(), *group, c, 7);
    EXPECT_TRUE(e.finite);
    EXPECT_LE(e.out, 1e-5) << kind;
    EXPECT_LE(e.lse, 1e-5) << kind;
    EXPECT_LE(e.dq, 1e-5) << kind;
    EXPECT_LE(e.dk, 1e-5) << kind;
    EXPECT_LE(e.dv, 1e-5) << kind;
  }
}

TEST(RingAttention, NeedsTwoEqualChunksPerRank) {
  auto group = mt::comm::make_single_communicator();
  mt::kernels::AttentionShape shape;
  shape.q_len = shape.kv_len = 7;
  shape.head_dim = 4;
  EXPECT_THROW(mt::parallel::RingAttention(mt::backend::cpu_ops(), *group, shape), mt::Error);
  shape.kv_len = 8;
  shape.q_len = 8;
  EXPECT_NO_THROW(mt::parallel::RingAttention(mt::backend::cpu_ops(), *group, shape));
}

}  // namespace
