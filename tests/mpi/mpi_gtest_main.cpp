// main() for GoogleTest suites under mpirun: MPI started through MpiRuntime, gtest's report from
// rank 0 and only the failures from the other ranks (prefixed with their rank), and a non-zero
// exit on every rank when any rank failed. Suites that need MPI
// objects across tests make them in a ::testing::Environment (SetUp runs after MPI starts,
// TearDown before it finishes).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "comm/mpi_runtime.h"

namespace {

// Prints a failed assertion of a rank other than 0 where rank 0's report would.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: %s\n", rank_, test_.c_str(), result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  mt::comm::MpiRuntime::init();
  if (mt::comm::MpiRuntime::rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(mt::comm::MpiRuntime::rank()));
  }
  int failed = RUN_ALL_TESTS() != 0, any_failed = failed;
  // Started without a launcher (the GPU machine has no mpirun), MPI is not running: the suite's
  // tests skip themselves, and there is no other rank to ask.
  int mpi_running = 0;
  MPI_Initialized(&mpi_running);
  if (mpi_running) MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  mt::comm::MpiRuntime::finalize();
  return any_failed;
}
