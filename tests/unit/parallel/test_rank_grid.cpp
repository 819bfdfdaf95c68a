// The rank grid against hand-computed tables: TP2 x CP2 x DP2 x PP2 with EP2 (every group kind),
// Megatron's own example in initialize_model_parallel's docstring (16 ranks, TP2, PP4), expert
// TP folding, and ProcessGroups over a single-rank world. The groups built by split under
// mpirun are checked in tests/mpi/test_process_groups.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "parallel/process_groups.h"
#include "parallel/rank_grid.h"

namespace {

using mt::parallel::GroupKind;
using mt::parallel::ParallelConfig;
using mt::parallel::RankGrid;
using Groups = std::vector<std::vector<int>>;

ParallelConfig layout(int tp, int cp, int dp, int pp, int ep = 1, int expert_tp = 0) {
  ParallelConfig c;
  c.tensor_model_parallel_size = tp;
  c.context_parallel_size = cp;
  c.data_parallel_size = dp;
  c.pipeline_model_parallel_size = pp;
  c.expert_model_parallel_size = ep;
  if (expert_tp > 0) c.expert_tensor_parallel_size = expert_tp;
  return c;
}

Groups singletons(int n) {
  Groups g;
  for (int r = 0; r < n; ++r) g.push_back({r});
  return g;
}

TEST(RankGrid, EveryGroupOfTp2Cp2Dp2Pp2WithEp2) {
  const RankGrid grid(layout(2, 2, 2, 2, 2, 1));  // rank = tp + 2 cp + 4 dp + 8 pp
  ASSERT_EQ(grid.world_size(), 16);
  EXPECT_EQ(grid.groups(GroupKind::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::cp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::pp), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::dp_cp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::tp_cp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::mp), (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::tp_dp_cp), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::embedding), grid.groups(GroupKind::pp));  // two stages: first and last
  EXPECT_EQ(grid.groups(GroupKind::position_embedding), singletons(8));
  // Expert grid: expert-TP 1 x EP 2 x expert-DP 4 x PP 2, rank = ep + 2 expert_dp + 8 pp.
  EXPECT_EQ(grid.groups(GroupKind::expert_tp), singletons(16));
  EXPECT_EQ(grid.groups(GroupKind::ep), grid.groups(GroupKind::tp));
  EXPECT_EQ(grid.groups(GroupKind::expert_dp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::expert_tp_ep), grid.groups(GroupKind::ep));
  EXPECT_EQ(grid.groups(GroupKind::expert_mp), (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
}

TEST(RankGrid, CoordinatesOnBothGrids) {
  const RankGrid grid(layout(2, 2, 2, 2, 2, 1));
  const auto c = grid.coordinates(13);  // 13 = 1 + 2*0 + 4*1 + 8*1 = ep 1 + 2*2 + 8*1
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.expert_tp, 0);
  EXPECT_EQ(c.ep, 1);
  EXPECT_EQ(c.expert_dp, 2);
  for (int r = 0; r < 16; ++r) {
    const auto x = grid.coordinates(r);
    EXPECT_EQ(grid.rank_at(x.tp, x.cp, x.dp, x.pp), r);
  }
  EXPECT_THROW(grid.coordinates(16), mt::Error);
}

TEST(RankGrid, MegatronsDocumentedSixteenRankExample) {
  // initialize_model_parallel's docstring: 16 GPUs, TP 2, PP 4 (so DP 2).
  const RankGrid grid(layout(2, 1, 2, 4));
  EXPECT_EQ(grid.groups(GroupKind::dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::pp), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  // The tied embedding lives on the first and last stage; middle stages are in no embedding group.
  EXPECT_EQ(grid.groups(GroupKind::embedding), (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::position_embedding), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_TRUE(grid.members(GroupKind::embedding, 6).empty());
  EXPECT_EQ(grid.members(GroupKind::embedding, 13), (std::vector<int>{1, 13}));
}

TEST(RankGrid, ExpertTensorParallelFoldsIntoDataParallelRanks) {
  // TP 2 x DP 4 on 8 ranks; experts: expert-TP 2 (the default: TP) x EP 2 x expert-DP 2.
  const RankGrid grid(layout(2, 1, 4, 1, 2));
  EXPECT_EQ(grid.groups(GroupKind::expert_tp), grid.groups(GroupKind::tp));
  EXPECT_EQ(grid.groups(GroupKind::ep), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(grid.groups(GroupKind::expert_dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(grid.groups(GroupKind::expert_tp_ep), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Expert-TP 1 x EP 4: expert-DP 2, EP groups span the DP ranks of one TP rank... and TP.
  const RankGrid wide(layout(2, 1, 4, 1, 4, 1));
  EXPECT_EQ(wide.groups(GroupKind::ep), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(wide.groups(GroupKind::expert_dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_THROW(RankGrid(layout(2, 1, 1, 1, 3)), mt::Error);  // EP 3 x expert-TP 2 does not fold into 2 ranks
}

TEST(RankGrid, EveryKindPartitionsTheWorld) {
  const RankGrid grid(layout(2, 2, 3, 2, 3, 1));
  for (GroupKind kind : mt::parallel::kAllGroupKinds) {
    std::vector<int> seen(static_cast<size_t>(grid.world_size()), 0);
    for (const auto& group : grid.groups(kind))
      for (int r : group) ++seen[static_cast<size_t>(r)];
    for (int r = 0; r < grid.world_size(); ++r) {
      const bool in_one = kind != GroupKind::embedding && kind != GroupKind::position_embedding;
      if (in_one || !grid.members(kind, r).empty()) {
        EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << mt::parallel::group_name(kind) << " rank " << r;
      }
    }
  }
}

TEST(ProcessGroups, OneRankIsInAGroupOfOneOfEveryKind) {
  auto world = mt::comm::make_single_communicator();
  const mt::parallel::ProcessGroups groups(*world, RankGrid(ParallelConfig{}));
  for (GroupKind kind : mt::parallel::kAllGroupKinds) {
    ASSERT_TRUE(groups.has(kind)) << mt::parallel::group_name(kind);
    EXPECT_EQ(groups.control(kind).size(), 1);
    EXPECT_EQ(groups.data(kind).size(), 1);
    EXPECT_NE(&groups.control(kind), &groups.data(kind));
  }
  EXPECT_EQ(groups.data_world().size(), 1);
  EXPECT_EQ(groups.coordinates().pp, 0);
  EXPECT_THROW(mt::parallel::ProcessGroups(*world, RankGrid(layout(2, 1, 1, 1))), mt::Error);  // world of 1, layout of 2
}

}  // namespace
