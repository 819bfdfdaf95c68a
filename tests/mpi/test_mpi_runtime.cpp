// mt's MPI process lifetime (lib/comm/mpi_runtime.h): a world of one until init() and without a
// launcher; under mpirun, launch detection from the launcher's variables, rank and size equal to
// the launcher's and distinct across ranks, an idempotent init(), the library's version line,
// and a finalize() that ends MPI once. CTest runs the binary twice: under `mpirun -np 2
// --oversubscribe` and directly (the WithoutALauncher tests). A failing rank aborting the job
// is tested through a tool in tests/tools/mpi.bats.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi_runtime.h"

using mt::comm::MpiRuntime;

namespace {

// What MpiRuntime said before main() called init().
struct World {
  bool active = true;
  int rank = -1, size = -1;
};
World g_before_init;

std::optional<std::string> get_env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::optional<std::string>(value) : std::nullopt;
}

void set_env(const char* name, const std::optional<std::string>& value) {
  if (value) {
    setenv(name, value->c_str(), 1);
  } else {
    unsetenv(name);
  }
}

int env_int(const char* name) {
  const auto value = get_env(name);
  return value ? std::atoi(value->c_str()) : -1;
}

}  // namespace

TEST(MpiRuntime, IsAWorldOfOneBeforeInit) {
  EXPECT_FALSE(g_before_init.active);
  EXPECT_EQ(g_before_init.rank, 0);
  EXPECT_EQ(g_before_init.size, 1);
}

TEST(MpiRuntime, DetectsTheLauncherFromEitherVariable) {
  ASSERT_TRUE(mt::comm::launched_under_mpi());
  const auto pmix = get_env("PMIX_RANK"), world = get_env("OMPI_COMM_WORLD_SIZE");
  unsetenv("PMIX_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_FALSE(mt::comm::launched_under_mpi());
  setenv("PMIX_RANK", "0", 1);
  EXPECT_TRUE(mt::comm::launched_under_mpi()) << "PMIX_RANK alone (srun, PMIx launchers)";
  unsetenv("PMIX_RANK");
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_TRUE(mt::comm::launched_under_mpi()) << "OMPI_COMM_WORLD_SIZE alone (Open MPI's mpirun)";
  set_env("PMIX_RANK", pmix);
  set_env("OMPI_COMM_WORLD_SIZE", world);
}

TEST(MpiRuntime, RankAndSizeAreTheLaunchersAndDistinct) {
  ASSERT_TRUE(MpiRuntime::active());
  EXPECT_EQ(MpiRuntime::size(), env_int("OMPI_COMM_WORLD_SIZE"));
  EXPECT_EQ(MpiRuntime::rank(), env_int("OMPI_COMM_WORLD_RANK"));
  EXPECT_GE(MpiRuntime::size(), 2);
  const int rank = MpiRuntime::rank();
  std::vector<int> ranks(static_cast<size_t>(MpiRuntime::size()), -1);
  MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::sort(ranks.begin(), ranks.end());
  for (int r = 0; r < MpiRuntime::size(); ++r) EXPECT_EQ(ranks[static_cast<size_t>(r)], r);
}

TEST(MpiRuntime, InitAgainKeepsTheWorld) {
  const int rank = MpiRuntime::rank(), size = MpiRuntime::size();
  EXPECT_NO_THROW(MpiRuntime::init());  // a second MPI_Init would be an MPI error
  EXPECT_TRUE(MpiRuntime::active());
  EXPECT_EQ(MpiRuntime::rank(), rank);
  EXPECT_EQ(MpiRuntime::size(), size);
}

TEST(MpiRuntime, LibraryVersionIsTheFirstClauseOfMpis) {
  char raw[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(raw, &length);
  const std::string full(raw, static_cast<size_t>(length));
  const std::string version = MpiRuntime::library_version();
  EXPECT_FALSE(version.empty());
  EXPECT_EQ(full.rfind(version, 0), 0u) << full;  // a prefix of MPI's own text
  EXPECT_EQ(version.find_first_of(",\n"), std::string::npos) << version;
  EXPECT_EQ(version, full.substr(0, full.find(','))) << full;
}

TEST(MpiRuntimeWithoutALauncher, InitLeavesAWorldOfOne) {
  ASSERT_FALSE(mt::comm::launched_under_mpi()) << "run without mpirun";
  MpiRuntime::init();
  EXPECT_FALSE(MpiRuntime::active());
  EXPECT_EQ(MpiRuntime::rank(), 0);
  EXPECT_EQ(MpiRuntime::size(), 1);
  int initialized = 1;
  MPI_Initialized(&initialized);
  EXPECT_FALSE(initialized) << "MPI was started without a launcher";
  MpiRuntime::finalize();  // a no-op without MPI
  EXPECT_FALSE(MpiRuntime::active());
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_before_init = {MpiRuntime::active(), MpiRuntime::rank(), MpiRuntime::size()};
  // Each run holds the tests of its setting (unless --gtest_filter chose others).
  const bool launched = mt::comm::launched_under_mpi();
  if (::testing::GTEST_FLAG(filter) == "*") {
    ::testing::GTEST_FLAG(filter) = launched ? "MpiRuntime.*" : "MpiRuntime.IsAWorldOfOneBeforeInit:MpiRuntimeWithoutALauncher.*";
  }
  if (!launched) return RUN_ALL_TESTS();
  MpiRuntime::init();
  // Only rank 0 prints gtest's report; every rank's result decides the exit code.
  if (MpiRuntime::rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0, any_failed = failed;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  // finalize() ends MPI once: inactive afterwards, and a second call is a no-op.
  MpiRuntime::finalize();
  MpiRuntime::finalize();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (MpiRuntime::active() || !finalized) {
    std::fprintf(stderr, "MpiRuntime::finalize: active %d, MPI_Finalized %d\n", MpiRuntime::active(), finalized);
    return 1;
  }
  return any_failed;
}
