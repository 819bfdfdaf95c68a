// Threads per rank: OMP_NUM_THREADS first, else affinity CPUs divided by the local ranks; the
// local ranks the host-name exchange recorded win over the launcher's variables. (The exchange
// itself runs under mpirun in tests/mpi/test_communicator.cpp.)
#include <gtest/gtest.h>

#include <sched.h>

#include <cstdlib>

#include "core/threads.h"

namespace {
struct EnvGuard {
  const char* name;
  std::string saved;
  bool had;
  explicit EnvGuard(const char* n) : name(n), had(std::getenv(n) != nullptr) {
    if (had) saved = std::getenv(n);
  }
  ~EnvGuard() {
    if (had) setenv(name, saved.c_str(), 1);
    else unsetenv(name);
  }
};
}  // namespace

TEST(Threads, OmpNumThreadsWins) {
  EnvGuard guard("OMP_NUM_THREADS");
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(mt::default_threads_per_rank(), 3);
}

TEST(Threads, AffinityDividedByLocalRanks) {
  EnvGuard omp("OMP_NUM_THREADS"), local("OMPI_COMM_WORLD_LOCAL_SIZE");
  unsetenv("OMP_NUM_THREADS");
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  const int cpus = CPU_COUNT(&mask);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
  EXPECT_EQ(mt::default_threads_per_rank(), cpus);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "64", 1);
  EXPECT_EQ(mt::default_threads_per_rank(), std::max(1, cpus / 64));
  EXPECT_EQ(mt::local_rank_count(), 64);
}

TEST(Threads, ExchangedLocalRanksWinOverTheEnvironment) {
  EnvGuard omp("OMP_NUM_THREADS"), local("OMPI_COMM_WORLD_LOCAL_SIZE");
  unsetenv("OMP_NUM_THREADS");
  cpu_set_t mask;
  ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  const int cpus = CPU_COUNT(&mask);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "64", 1);
  mt::set_local_rank_count(1);
  EXPECT_EQ(mt::local_rank_count(), 1);
  EXPECT_EQ(mt::default_threads_per_rank(), cpus);
  mt::set_local_rank_count(0);  // forgotten: the environment again
  EXPECT_EQ(mt::local_rank_count(), 64);
}

TEST(Threads, PassivePolicyIsDetected) {
  EnvGuard guard("OMP_WAIT_POLICY");
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  EXPECT_TRUE(mt::openmp_waits_passively());
  setenv("OMP_WAIT_POLICY", "active", 1);
  EXPECT_FALSE(mt::openmp_waits_passively());
}
