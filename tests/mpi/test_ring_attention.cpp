// Ring attention under mpirun (2 and 4 ranks, the world as the context-parallel group): each
// rank's output, lse and grads equal its part of the full-sequence attention within 1e-5, with
// and without document masks, non-causal with padding (BERT), for several samples with GQA in the
// packed q|k|v layout; on the CPU table and on the asynchronous CPU table
// (tests/backend/async_cpu_ops.h: device memory the host cannot touch, ops and messages queued on
// a worker), each over the world's data communicator
// (MPI bound to the table's stream), so the ring needs no stream synchronisation of its own.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "comm/communicator.h"
#include "tests/mpi/world.h"
#include "comm/stream_communicator.h"
#include "tests/mpi/on_each_table.h"
#include "../unit/parallel/ring_attention_check.h"

namespace {

auto& g_world = mt::mpi_test::world_holder();
const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new mt::mpi_test::WorldEnvironment);

class RingAttentionOn : public mt::mpi_test::OnEachTable {
 protected:
  RingAttentionOn() : OnEachTable(std::chrono::milliseconds(50)) {}

  void expect_equal_to_full(const ring_check::RingCase& c, uint32_t seed) {
    ASSERT_GT(g_world->size(), 1) << "run under mpirun";
    auto cp_group = mt::comm::make_mpi_data_group(*g_world, ops(), ops().default_stream());
    const ring_check::RingErrors e = ring_check::ring_attention_errors(ops(), *cp_group, c, seed);
    EXPECT_TRUE(e.finite);
    EXPECT_LE(e.out, 1e-5);
    EXPECT_LE(e.lse, 1e-5);
    EXPECT_LE(e.dq, 1e-5);
    EXPECT_LE(e.dk, 1e-5);
    EXPECT_LE(e.dv, 1e-5);
  }
};

TEST_P(RingAttentionOn, EqualsFullSequenceAttention) { expect_equal_to_full({}, 11); }

TEST_P(RingAttentionOn, EqualsFullSequenceAttentionWithDocuments) {
  ring_check::RingCase c;
  c.documents = true;
  expect_equal_to_full(c, 12);
}

TEST_P(RingAttentionOn, MultiHeadAttentionAndLongerChunks) {
  ring_check::RingCase c;
  c.batch = 1;
  c.seq_length = 160;  // chunks of 40 (CP 2) or 20 (CP 4)
  c.kv_heads = c.q_heads;
  c.documents = true;
  expect_equal_to_full(c, 13);
}

TEST_P(RingAttentionOn, NonCausalWithPaddingEqualsFullSequenceAttention) {
  ring_check::RingCase c;
  c.bidirectional = true;
  expect_equal_to_full(c, 14);
}

MT_INSTANTIATE_ON_EACH_TABLE(RingAttentionOn);

}  // namespace
