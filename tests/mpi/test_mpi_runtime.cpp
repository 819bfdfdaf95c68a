// MPI start-up under mpirun: every rank sees the launcher's world; a small-integer allreduce is
// exact in any reduction order. Run by CTest as `mpirun -np 2 --oversubscribe`.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_runtime.h"

using mt::comm::MpiRuntime;

TEST(MpiRuntime, StartsUnderTheLauncher) {
  ASSERT_TRUE(mt::comm::launched_under_mpi());
  ASSERT_TRUE(MpiRuntime::active());
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  EXPECT_EQ(MpiRuntime::size(), world);
  EXPECT_GE(world, 2);
}

TEST(MpiRuntime, AllreduceOfSmallIntegersIsExact) {
  int value = MpiRuntime::rank() + 1, sum = 0;
  MPI_Allreduce(&value, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  const int n = MpiRuntime::size();
  EXPECT_EQ(sum, n * (n + 1) / 2);
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MpiRuntime::init();
  // Only rank 0 prints gtest's report; every rank's result decides the exit code.
  if (MpiRuntime::rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0, any_failed = failed;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MpiRuntime::finalize();
  return any_failed;
}
