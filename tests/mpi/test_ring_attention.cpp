// Ring attention under mpirun (2 and 4 ranks, the world as the context-parallel group): each
// rank's output, lse and grads equal its part of the full-sequence attention within 1e-5, with
// and without document masks, for several samples with GQA in the packed q|k|v layout.
#include <gtest/gtest.h>

#include <memory>

#include "comm/communicator.h"
#include "../unit/parallel/ring_attention_check.h"

namespace {

std::unique_ptr<mt::comm::Communicator> g_world;

class WorldEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { g_world = mt::comm::make_world_communicator(); }
  void TearDown() override { g_world.reset(); }
};
const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new WorldEnvironment);

void expect_equal_to_full(const ring_check::RingCase& c, uint32_t seed) {
  const ring_check::RingErrors e = ring_check::ring_attention_errors(mt::backend::cpu_ops(), *g_world, c, seed);
  EXPECT_TRUE(e.finite);
  EXPECT_LE(e.out, 1e-5);
  EXPECT_LE(e.lse, 1e-5);
  EXPECT_LE(e.dq, 1e-5);
  EXPECT_LE(e.dk, 1e-5);
  EXPECT_LE(e.dv, 1e-5);
}

TEST(RingAttention, EqualsFullSequenceAttention) {
  ASSERT_GT(g_world->size(), 1) << "run under mpirun";
  expect_equal_to_full({}, 11);
}

TEST(RingAttention, EqualsFullSequenceAttentionWithDocuments) {
  ring_check::RingCase c;
  c.documents = true;
  expect_equal_to_full(c, 12);
}

TEST(RingAttention, MultiHeadAttentionAndLongerChunks) {
  ring_check::RingCase c;
  c.batch = 1;
  c.seq_length = 160;  // chunks of 40 (CP 2) or 20 (CP 4)
  c.kv_heads = c.q_heads;
  c.documents = true;
  expect_equal_to_full(c, 13);
}

}  // namespace
