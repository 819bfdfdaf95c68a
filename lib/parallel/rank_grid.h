// Megatron's rank grid: which coordinates a global rank has and which ranks form each process
// group. The dense grid is TP x CP x DP x PP with TP fastest (rank = tp + TP*(cp + CP*(dp +
// DP*pp))); the expert grid lays expert-TP x EP x expert-DP x PP over the same ranks, also
// fastest first, so its PP groups are the dense ones (parallel folding, Megatron's RankGenerator
// with order tp-cp-ep-dp-pp). A group of several dimensions holds the ranks that agree on every
// other coordinate, in the order of the grid (the first dimension fastest), e.g. DP x CP groups
// run over cp fastest, then dp. The embedding group is the first and last stage of each pipeline
// group (the tied embedding's copies), the position-embedding group its first stage.
// Tested in tests/unit/parallel/test_rank_grid.cpp and tests/mpi/test_process_groups.cpp.
#pragma once

#include <array>
#include <vector>

#include "parallel/parallel_config.h"

namespace mt::parallel {

enum class GroupKind {
  tp,                  // tensor parallel
  cp,                  // context parallel
  dp,                  // data parallel
  pp,                  // pipeline
  dp_cp,               // DP x CP: dense grads are reduced over it
  tp_cp,               // TP x CP
  mp,                  // TP x PP: the model-parallel group (a model replica's ranks within one CP slice)
  tp_dp_cp,            // TP x DP x CP: one pipeline stage
  embedding,           // first and last pipeline stage: the tied embedding's grads
  position_embedding,  // first pipeline stage
  expert_tp,           // expert grid: expert tensor parallel
  ep,                  // expert parallel
  expert_dp,           // expert data parallel: expert grads are reduced over it
  expert_tp_ep,        // expert-TP x EP: the MoE token dispatcher's group
  expert_mp,           // expert-TP x EP x PP: the expert model-parallel group
};
inline constexpr GroupKind kAllGroupKinds[] = {
    GroupKind::tp,        GroupKind::cp,        GroupKind::dp,           GroupKind::pp,
    GroupKind::dp_cp,     GroupKind::tp_cp,     GroupKind::mp,           GroupKind::tp_dp_cp,
    GroupKind::embedding, GroupKind::position_embedding, GroupKind::expert_tp, GroupKind::ep,
    GroupKind::expert_dp, GroupKind::expert_tp_ep, GroupKind::expert_mp};

const char* group_name(GroupKind kind);

class RankGrid {
 public:
  // `config` as validate() left it (data_parallel_size set); throws when the expert grid does not
  // fold into the dense one.
  explicit RankGrid(const ParallelConfig& config);

  int world_size() const { return world_size_; }
  const ParallelConfig& config() const { return config_; }
  RankCoordinates coordinates(int rank) const;
  // The global rank at dense coordinates (tp, cp, dp, pp).
  int rank_at(int tp, int cp, int dp, int pp) const;

  // The global ranks of `rank`'s group of `kind`, in group order (group rank i is members[i]);
  // empty when `rank` belongs to no group of that kind (embedding groups on middle stages).
  std::vector<int> members(GroupKind kind, int rank) const;
  // Every group of `kind`, ordered by their first member.
  std::vector<std::vector<int>> groups(GroupKind kind) const;

 private:
  using Shape = std::array<int, 4>;  // sizes, fastest first
  static std::vector<int> masked_group(const Shape& shape, std::array<bool, 4> mask, int rank);

  ParallelConfig config_;
  int world_size_;
  Shape dense_;   // TP, CP, DP, PP
  Shape expert_;  // expert-TP, EP, expert-DP, PP
};

}  // namespace mt::parallel
