// ProcessGroups under mpirun (4 and 8 ranks): for every layout that fits the world, each group's
// control communicator (made by split) and data communicator (MPI bound to the CPU table's
// stream) hold exactly the ranks the rank grid lists, in its order, and reduce over them; one
// layout is also checked against a hand-computed table; with the asynchronous CPU table
// (tests/backend/async_cpu_ops.h) the data groups reduce device memory in stream order.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "comm/communicator.h"
#include "tests/mpi/world.h"
#include "core/error.h"
#include "parallel/process_groups.h"
#include "parallel/rank_grid.h"
#include "tests/backend/async_cpu_ops.h"

namespace {

using mt::DType;
using mt::comm::Communicator;
using mt::parallel::GroupKind;
using mt::parallel::ParallelConfig;
using mt::parallel::ProcessGroups;
using mt::parallel::RankGrid;

auto& g_world = mt::mpi_test::world_holder();
[[maybe_unused]] auto* const g_environment = ::testing::AddGlobalTestEnvironment(new mt::mpi_test::WorldEnvironment);

struct Layout {
  int tp, cp, pp, ep, expert_tp;
};

// The layout with DP filling the world, or nothing when it does not fit.
std::optional<ParallelConfig> config_for(const Layout& l, int world) {
  const int model = l.tp * l.cp * l.pp;
  if (world % model != 0) return std::nullopt;
  ParallelConfig c;
  c.tensor_model_parallel_size = l.tp;
  c.context_parallel_size = l.cp;
  c.pipeline_model_parallel_size = l.pp;
  c.data_parallel_size = world / model;
  c.expert_model_parallel_size = l.ep;
  c.expert_tensor_parallel_size = l.expert_tp;
  if ((l.tp * l.cp * c.data_parallel_size) % (l.ep * l.expert_tp) != 0) return std::nullopt;
  return c;
}

// The world ranks of `group`'s members, in group order.
std::vector<int> members_of(Communicator& group, int world_rank) {
  std::vector<int> ranks(static_cast<size_t>(group.size()));
  group.all_gather(&world_rank, ranks.data(), 1, DType::i32);
  return ranks;
}

TEST(ProcessGroups, EveryGroupHoldsTheGridsMembers) {
  Communicator& world = *g_world;
  const int n = world.size(), me = world.rank();
  const Layout layouts[] = {{1, 1, 1, 1, 1}, {2, 1, 1, 2, 1}, {2, 1, 2, 1, 2}, {1, 2, 2, 1, 1}, {1, 1, 4, 1, 1},
                            {2, 2, 1, 4, 1}, {2, 2, 2, 1, 1}, {2, 1, 2, 2, 1}, {1, 1, 4, 2, 1}, {2, 1, 1, 4, 2},
                            {1, 2, 1, 2, 2}, {4, 1, 2, 1, 2}};
  int checked = 0;
  for (const Layout& layout : layouts) {
    const auto config = config_for(layout, n);
    if (!config) continue;
    ++checked;
    const RankGrid grid(*config);
    const ProcessGroups groups(world, grid);
    for (GroupKind kind : mt::parallel::kAllGroupKinds) {
      const auto expected = grid.members(kind, me);
      SCOPED_TRACE(std::string(mt::parallel::group_name(kind)) + " tp" + std::to_string(layout.tp) + " cp" +
                   std::to_string(layout.cp) + " pp" + std::to_string(layout.pp) + " ep" + std::to_string(layout.ep) +
                   " etp" + std::to_string(layout.expert_tp));
      ASSERT_EQ(groups.has(kind), !expected.empty());
      if (expected.empty()) {
        EXPECT_THROW(groups.control(kind), mt::Error);
        EXPECT_THROW(groups.data(kind), mt::Error);
        continue;
      }
      // Both communicators of the group, the data one on the CPU table's (host) memory.
      for (Communicator* group : {&groups.control(kind), &groups.data(kind)}) {
        EXPECT_EQ(members_of(*group, me), expected);
        // A reduction runs over exactly these ranks.
        int64_t sum = me;
        group->all_reduce(&sum, 1, DType::i64, mt::comm::ReduceOp::sum);
        int64_t expected_sum = 0;
        for (int r : expected) expected_sum += r;
        EXPECT_EQ(sum, expected_sum);
      }
    }
    EXPECT_EQ(members_of(groups.data_world(), me), members_of(world, me));
    EXPECT_EQ(groups.coordinates().pp, grid.coordinates(me).pp);
  }
  EXPECT_GE(checked, 5);
}

TEST(ProcessGroups, Tp2Dp2Pp2AgainstAHandTable) {
  Communicator& world = *g_world;
  if (world.size() != 8) GTEST_SKIP() << "needs 8 ranks";
  ParallelConfig c;  // rank = tp + 2 dp + 4 pp
  c.tensor_model_parallel_size = 2;
  c.data_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  const ProcessGroups groups(world, RankGrid(c));
  const int r = world.rank();
  EXPECT_EQ(members_of(groups.control(GroupKind::tp), r), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  const std::vector<std::vector<int>> dp = {{0, 2}, {1, 3}, {0, 2}, {1, 3}, {4, 6}, {5, 7}, {4, 6}, {5, 7}};
  EXPECT_EQ(members_of(groups.control(GroupKind::dp), r), dp[static_cast<size_t>(r)]);
  EXPECT_EQ(members_of(groups.control(GroupKind::pp), r), (std::vector<int>{r % 4, r % 4 + 4}));
  EXPECT_EQ(members_of(groups.control(GroupKind::embedding), r), (std::vector<int>{r % 4, r % 4 + 4}));
  EXPECT_EQ(groups.has(GroupKind::position_embedding), r < 4);
  const std::vector<std::vector<int>> mp = {{0, 1, 4, 5}, {2, 3, 6, 7}};
  EXPECT_EQ(members_of(groups.control(GroupKind::mp), r), mp[static_cast<size_t>(r % 4 / 2)]);
}

// The data groups made for the asynchronous table: each reduces device memory written by stream
// work before it, and stream work after it sees the sum, with no synchronize between.
TEST(ProcessGroups, DataGroupsOnTheAsynchronousTableReduceDeviceMemory) {
  Communicator& world = *g_world;
  ParallelConfig c;
  c.tensor_model_parallel_size = 2;
  c.pipeline_model_parallel_size = 2;
  c.data_parallel_size = world.size() / 4;
  const RankGrid grid(c);
  const mt::backend::Ops& ops = mt::test_backend::async_cpu_ops();
  const mt::backend::Stream stream = ops.default_stream();
  const ProcessGroups groups(world, grid, ops, stream);
  EXPECT_EQ(&groups.ops(), &ops);
  const int me = world.rank();
  for (GroupKind kind : {GroupKind::tp, GroupKind::dp, GroupKind::pp, GroupKind::mp}) {
    SCOPED_TRACE(mt::parallel::group_name(kind));
    mt::backend::DeviceBuffer<float> value(ops, 1, mt::backend::MemoryCategory::comm_buffers);
    ops.fill(value.data(), 1, static_cast<float>(me), stream);
    groups.data(kind).all_reduce(value.data(), 1, DType::f32, mt::comm::ReduceOp::sum);
    ops.scale_inplace(value.data(), 1, 2.0f, stream);
    float sum = -1;
    ops.copy(&sum, value.data(), sizeof sum, mt::backend::CopyKind::device_to_host, stream);
    ops.synchronize(stream);
    float expected = 0;
    for (int r : grid.members(kind, me)) expected += 2.0f * static_cast<float>(r);
    EXPECT_EQ(sum, expected);
  }
}

}  // namespace
