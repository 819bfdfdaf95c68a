// Process groups by Communicator::split, and their data groups (see process_groups.h).
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

ProcessGroups::ProcessGroups(comm::Communicator& world, const RankGrid& grid, const backend::Ops& ops,
                             backend::Stream stream, const comm::DataGroupFactory& make_data_group)
    : world_(world),
      grid_(grid),
      coordinates_(grid.coordinates(rank_in_grid(world, grid))),
      ops_(ops),
      stream_(stream) {
  data_world_ = make_data_group(world, ops, stream);
  for (GroupKind kind : kAllGroupKinds) {
    // Color: the group's first member (one per group); ranks in no group of this kind share the
    // color world size and drop the group they get. Key: the position in the group.
    const auto members = grid.members(kind, world.rank());
    const auto position = std::find(members.begin(), members.end(), world.rank()) - members.begin();
    auto group = world.split(members.empty() ? world.size() : members.front(), static_cast<int>(position));
    if (members.empty()) continue;
    data_[index(kind)] = make_data_group(*group, ops, stream);  // collective over the group's members
    control_[index(kind)] = std::move(group);
  }
}

ProcessGroups::ProcessGroups(comm::Communicator& world, const RankGrid& grid)
    : ProcessGroups(world, grid, backend::cpu_ops(), backend::cpu_ops().default_stream()) {}

comm::Communicator& ProcessGroups::member_of(const Groups& groups, GroupKind kind) const {
  const auto& group = groups[index(kind)];
  if (!group) {
    throw Error(std::string(group_name(kind)) + " group", "rank " + std::to_string(world_.rank()) + " belongs to none");
  }
  return *group;
}

comm::Communicator& ProcessGroups::control(GroupKind kind) const { return member_of(control_, kind); }
comm::Communicator& ProcessGroups::data(GroupKind kind) const { return member_of(data_, kind); }

}  // namespace mt::parallel
