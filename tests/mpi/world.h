// The MPI world communicator an mpirun suite shares across its tests: made by a gtest environment
// after MPI starts (tests/mpi/mpi_gtest_main.cpp) and freed before it finishes. A suite registers
// the environment once (AddGlobalTestEnvironment(new mt::mpi_test::WorldEnvironment)) and reads
// world(). Used by the suites of tests/mpi (training_equivalence.h re-exports it).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "comm/communicator.h"

namespace mt::mpi_test {

// The world communicator, alive between the environment's SetUp and TearDown.
inline std::unique_ptr<comm::Communicator>& world_holder() {
  static std::unique_ptr<comm::Communicator> world;
  return world;
}
inline comm::Communicator& world() { return *world_holder(); }

class WorldEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { world_holder() = comm::make_world_communicator(); }
  void TearDown() override { world_holder().reset(); }
};

}  // namespace mt::mpi_test
