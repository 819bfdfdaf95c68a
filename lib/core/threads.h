// Threads per rank and the OpenMP runtime settings. One OpenMP runtime (libgomp, which oneDNN
// also uses) serves mt's kernels and GEMMs; idle threads wait passively so oversubscribed MPI
// ranks do not spin against each other. Tested in tests/unit/core/test_threads.cpp and, with the
// host-name exchange under mpirun, tests/mpi/test_communicator.cpp.
#pragma once

namespace mt {

// Ranks on this node: what the ranks found by exchanging host names once MPI started
// (comm::MpiRuntime::init records it through set_local_rank_count); before that, or without MPI,
// the launcher's environment (mpirun's OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, then srun's
// SLURM_STEP_TASKS_PER_NODE), else 1.
int local_rank_count();
// Records the ranks on this node as the ranks found them (comm/node_ranks.h); 0 forgets it, so
// the environment answers again.
void set_local_rank_count(int ranks);
// OMP_NUM_THREADS when set, else the CPUs in this process's affinity mask divided by the local
// ranks (at least 1).
int default_threads_per_rank();
// Applies default_threads_per_rank() to the OpenMP runtime; returns the count.
int configure_threads();
// True when the OpenMP runtime was started with OMP_WAIT_POLICY=passive (see tools/common).
bool openmp_waits_passively();

}  // namespace mt
