// The rank grid (see rank_grid.h).
#include "parallel/rank_grid.h"

#include <string>

#include "core/error.h"

namespace mt::parallel {
namespace {

std::array<int, 4> decompose(int rank, const std::array<int, 4>& shape) {
  std::array<int, 4> coordinates{};
  for (size_t d = 0; d < 4; ++d) {
    coordinates[d] = rank % shape[d];
    rank /= shape[d];
  }
  return coordinates;
}

int compose(const std::array<int, 4>& coordinates, const std::array<int, 4>& shape) {
  int rank = 0;
  for (size_t d = 4; d-- > 0;) rank = rank * shape[d] + coordinates[d];
  return rank;
}

}  // namespace

const char* group_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::tp: return "tp";
    case GroupKind::cp: return "cp";
    case GroupKind::dp: return "dp";
    case GroupKind::pp: return "pp";
    case GroupKind::dp_cp: return "dp_cp";
    case GroupKind::tp_cp: return "tp_cp";
    case GroupKind::mp: return "mp";
    case GroupKind::tp_dp_cp: return "tp_dp_cp";
    case GroupKind::embedding: return "embedding";
    case GroupKind::position_embedding: return "position_embedding";
    case GroupKind::expert_tp: return "expert_tp";
    case GroupKind::ep: return "ep";
    case GroupKind::expert_dp: return "expert_dp";
    case GroupKind::expert_tp_ep: return "expert_tp_ep";
    case GroupKind::expert_mp: return "expert_mp";
  }
  return "?";
}

RankGrid::RankGrid(const ParallelConfig& config)
    : config_(config),
      world_size_(config.world_size()),
      dense_{config.tensor_model_parallel_size, config.context_parallel_size, config.data_parallel_size,
             config.pipeline_model_parallel_size},
      expert_{config.expert_tensor_parallel(), config.expert_model_parallel_size, 0,
              config.pipeline_model_parallel_size} {
  for (int size : dense_) {
    if (size < 1) throw Error("rank grid", "parallel sizes must be at least 1");
  }
  const int expert_model = expert_[0] * expert_[1] * expert_[3];
  if (expert_[0] < 1 || expert_[1] < 1 || world_size_ % expert_model != 0) {
    throw Error("rank grid", "expert-TP x EP x PP = " + std::to_string(expert_model) + " does not divide the world of " +
                                 std::to_string(world_size_));
  }
  expert_[2] = world_size_ / expert_model;
}

RankCoordinates RankGrid::coordinates(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    throw Error("rank grid", "rank " + std::to_string(rank) + " outside the world of " + std::to_string(world_size_));
  }
  const auto dense = decompose(rank, dense_), expert = decompose(rank, expert_);
  RankCoordinates c;
  c.tp = dense[0];
  c.cp = dense[1];
  c.dp = dense[2];
  c.pp = dense[3];
  c.expert_tp = expert[0];
  c.ep = expert[1];
  c.expert_dp = expert[2];
  return c;
}

int RankGrid::rank_at(int tp, int cp, int dp, int pp) const { return compose({tp, cp, dp, pp}, dense_); }

std::vector<int> RankGrid::masked_group(const Shape& shape, std::array<bool, 4> mask, int rank) {
  Shape masked_shape{1, 1, 1, 1};
  int group_size = 1;
  for (size_t d = 0; d < 4; ++d) {
    if (mask[d]) {
      masked_shape[d] = shape[d];
      group_size *= shape[d];
    }
  }
  const auto own = decompose(rank, shape);
  std::vector<int> members;
  members.reserve(static_cast<size_t>(group_size));
  for (int i = 0; i < group_size; ++i) {
    const auto varied = decompose(i, masked_shape);
    auto coordinates = own;
    for (size_t d = 0; d < 4; ++d) {
      if (mask[d]) coordinates[d] = varied[d];
    }
    members.push_back(compose(coordinates, shape));
  }
  return members;
}

std::vector<int> RankGrid::members(GroupKind kind, int rank) const {
  coordinates(rank);  // range check
  // Masks over (TP, CP, DP, PP) on the dense grid and (expert-TP, EP, expert-DP, PP) on the expert one.
  switch (kind) {
    case GroupKind::tp: return masked_group(dense_, {true, false, false, false}, rank);
    case GroupKind::cp: return masked_group(dense_, {false, true, false, false}, rank);
    case GroupKind::dp: return masked_group(dense_, {false, false, true, false}, rank);
    case GroupKind::pp: return masked_group(dense_, {false, false, false, true}, rank);
    case GroupKind::dp_cp: return masked_group(dense_, {false, true, true, false}, rank);
    case GroupKind::tp_cp: return masked_group(dense_, {true, true, false, false}, rank);
    case GroupKind::mp: return masked_group(dense_, {true, false, false, true}, rank);
    case GroupKind::tp_dp_cp: return masked_group(dense_, {true, true, true, false}, rank);
    case GroupKind::embedding:
    case GroupKind::position_embedding: {
      const auto pipeline = masked_group(dense_, {false, false, false, true}, rank);
      std::vector<int> stages{pipeline.front()};
      if (kind == GroupKind::embedding && pipeline.size() > 1) stages.push_back(pipeline.back());
      for (int member : stages) {
        if (member == rank) return stages;
      }
      return {};
    }
    case GroupKind::expert_tp: return masked_group(expert_, {true, false, false, false}, rank);
    case GroupKind::ep: return masked_group(expert_, {false, true, false, false}, rank);
    case GroupKind::expert_dp: return masked_group(expert_, {false, false, true, false}, rank);
    case GroupKind::expert_tp_ep: return masked_group(expert_, {true, true, false, false}, rank);
    case GroupKind::expert_mp: return masked_group(expert_, {true, true, false, true}, rank);
  }
  throw Error("rank grid", "unknown group kind");
}

std::vector<std::vector<int>> RankGrid::groups(GroupKind kind) const {
  std::vector<std::vector<int>> all;
  for (int rank = 0; rank < world_size_; ++rank) {
    auto group = members(kind, rank);
    if (!group.empty() && group.front() == rank) all.push_back(std::move(group));
  }
  return all;
}

}  // namespace mt::parallel
