// Every process group of a rank, made once from the world communicator with
// Communicator::split: one communicator per GroupKind of the rank grid (rank_grid.h), each
// ordered as the grid orders its members. Owned by whoever runs the engine (no globals); the
// world communicator must outlive it. Tested in tests/mpi/test_process_groups.cpp (4 and 8
// ranks) and tests/unit/parallel/test_rank_grid.cpp (one rank).
#pragma once

#include <array>
#include <memory>

#include "comm/communicator.h"
#include "parallel/rank_grid.h"

namespace mt::parallel {

class ProcessGroups {
 public:
  // Collective over `world`, whose size must be grid.world_size().
  ProcessGroups(comm::Communicator& world, const RankGrid& grid);

  comm::Communicator& world() const { return world_; }
  const RankGrid& grid() const { return grid_; }
  const RankCoordinates& coordinates() const { return coordinates_; }

  // Whether this rank belongs to a group of `kind` (always, except embedding groups on middle
  // pipeline stages), and that group's communicator (an error when it belongs to none).
  bool has(GroupKind kind) const { return groups_[index(kind)] != nullptr; }
  comm::Communicator& get(GroupKind kind) const;

 private:
  static size_t index(GroupKind kind) { return static_cast<size_t>(kind); }

  comm::Communicator& world_;
  RankGrid grid_;
  RankCoordinates coordinates_;
  std::array<std::unique_ptr<comm::Communicator>, std::size(kAllGroupKinds)> groups_;
};

}  // namespace mt::parallel
