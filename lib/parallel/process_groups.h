// Every process group of a rank, made once from the world communicator: per GroupKind of the
// rank grid (rank_grid.h), ordered as the grid orders its members, a control communicator
// (Communicator::split of the world: host memory, immediate; host values, barriers, tools, HDF5's
// MPI-IO) and beside it the data communicator the backend makes from it (comm/communicator.h's
// two kinds): a DataGroupFactory turns each control group into the data group for the backend's
// (ops, stream), MPI bound to the stream on the CPU (comm::make_mpi_data_group), NCCL on CUDA
// later. The world has its data communicator too. Owned by whoever runs the engine (no globals);
// the world communicator must outlive it. Tested in tests/mpi/test_process_groups.cpp (4 and 8
// ranks, the data groups on the CPU and the asynchronous CPU table) and
// tests/unit/parallel/test_rank_grid.cpp (one rank).
#pragma once

#include <array>
#include <memory>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "comm/stream_communicator.h"
#include "parallel/rank_grid.h"

namespace mt::parallel {

class ProcessGroups {
 public:
  // Collective over `world` (a control communicator), whose size must be grid.world_size(); the
  // data groups bound to (ops, stream) by `make_data_group`.
  ProcessGroups(comm::Communicator& world, const RankGrid& grid, const backend::Ops& ops, backend::Stream stream,
                const comm::DataGroupFactory& make_data_group = comm::make_mpi_data_group);
  // The CPU table's default stream with MPI data groups.
  ProcessGroups(comm::Communicator& world, const RankGrid& grid);

  // The control world, and the world's data communicator.
  comm::Communicator& world() const { return world_; }
  comm::Communicator& data_world() const { return *data_world_; }
  const RankGrid& grid() const { return grid_; }
  const RankCoordinates& coordinates() const { return coordinates_; }
  // The table and stream the data groups are bound to.
  const backend::Ops& ops() const { return ops_; }
  backend::Stream stream() const { return stream_; }

  // Whether this rank belongs to a group of `kind` (always, except embedding groups on middle
  // pipeline stages), and that group's control and data communicators (an error when it belongs
  // to none).
  bool has(GroupKind kind) const { return control_[index(kind)] != nullptr; }
  comm::Communicator& control(GroupKind kind) const;
  comm::Communicator& data(GroupKind kind) const;

 private:
  static size_t index(GroupKind kind) { return static_cast<size_t>(kind); }
  using Groups = std::array<std::unique_ptr<comm::Communicator>, std::size(kAllGroupKinds)>;
  comm::Communicator& member_of(const Groups& groups, GroupKind kind) const;

  comm::Communicator& world_;
  RankGrid grid_;
  RankCoordinates coordinates_;
  const backend::Ops& ops_;
  backend::Stream stream_;
  std::unique_ptr<comm::Communicator> data_world_;
  Groups control_;
  Groups data_;
};

}  // namespace mt::parallel
