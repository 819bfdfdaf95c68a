// MPI process lifetime: started only under a launcher (mpirun/srun set PMIX_RANK or
// OMPI_COMM_WORLD_SIZE), never for --help/--version; a failing rank aborts the whole job. Once MPI
// has started the ranks exchange host names (node_ranks.h), so the ranks on this node, and with
// them the threads per rank (core/threads.h), come from the ranks themselves.
// Tested in tests/mpi/test_mpi_runtime.cpp (mpirun -np 2) and tests/tools/mt-train-mpi.bats (a
// faked Slurm step without a launcher).
#pragma once

#include <string>

namespace mt::comm {

// True when this process was started by an MPI launcher.
bool launched_under_mpi();

// Throws mt::UsageError when this process is one of several tasks that cannot form one world:
// Slurm started SLURM_STEP_NUM_TASKS > 1 tasks (srun --mpi=none -n 2) without the PMIx or OpenMPI
// variables MPI needs, so each would train alone, a copy of a one-rank run.
void refuse_unformed_world();

class MpiRuntime {
 public:
  // Initialises MPI when launched_under_mpi(), then exchanges host names over the world and
  // records the ranks on this node (set_local_rank_count); otherwise a world of one.
  static void init();
  static void finalize();
  static bool active();
  static int rank();
  static int size();
  // This rank's index among the world's ranks on its node, and their count (0 and 1 without MPI).
  static int local_rank();
  static int local_size();
  // Aborts every rank of the job (MPI_Abort) with the given exit code; a no-op without MPI.
  [[noreturn]] static void abort_job(int exit_code);
  static std::string library_version();
};

}  // namespace mt::comm
