// Threads per rank and the OpenMP runtime settings. One OpenMP runtime (libgomp, which oneDNN
// also uses) serves mt's kernels and GEMMs; idle threads wait passively so oversubscribed MPI
// ranks do not spin against each other. Tested in tests/unit/core/test_threads.cpp.
#pragma once

namespace mt {

// Ranks on this node, from the launcher's environment (mpirun, then srun), else 1.
int local_rank_count();
// OMP_NUM_THREADS when set, else the CPUs in this process's affinity mask divided by the local
// ranks (at least 1).
int default_threads_per_rank();
// Applies default_threads_per_rank() to the OpenMP runtime; returns the count.
int configure_threads();
// True when the OpenMP runtime was started with OMP_WAIT_POLICY=passive (see tools/common).
bool openmp_waits_passively();

}  // namespace mt
