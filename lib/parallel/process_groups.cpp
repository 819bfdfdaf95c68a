// Process groups by Communicator::split (see process_groups.h).
#include "parallel/process_groups.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace mt::parallel {
namespace {

// This rank in `world`, after checking the world is the grid's.
int rank_in_grid(const comm::Communicator& world, const RankGrid& grid) {
  if (world.size() != grid.world_size()) {
    throw Error("process groups", "the world has " + std::to_string(world.size()) + " ranks, the parallel layout " +
                                      std::to_string(grid.world_size()));
  }
  return world.rank();
}

}  // namespace

ProcessGroups::ProcessGroups(comm::Communicator& world, const RankGrid& grid)
    : world_(world), grid_(grid), coordinates_(grid.coordinates(rank_in_grid(world, grid))) {
  for (GroupKind kind : kAllGroupKinds) {
    // Color: the group's first member (one per group); ranks in no group of this kind share the
    // color world size and drop the group they get. Key: the position in the group.
    const auto members = grid.members(kind, world.rank());
    const auto position = std::find(members.begin(), members.end(), world.rank()) - members.begin();
    auto group = world.split(members.empty() ? world.size() : members.front(), static_cast<int>(position));
    if (!members.empty()) groups_[index(kind)] = std::move(group);
  }
}

comm::Communicator& ProcessGroups::get(GroupKind kind) const {
  const auto& group = groups_[index(kind)];
  if (!group) {
    throw Error(std::string(group_name(kind)) + " group", "rank " + std::to_string(world_.rank()) + " belongs to none");
  }
  return *group;
}

}  // namespace mt::parallel
