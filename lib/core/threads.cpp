// Threads per rank (see threads.h).
#include "core/threads.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>

namespace mt {
namespace {

int positive_int_env(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return 0;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  return parsed > 0 ? static_cast<int>(parsed) : 0;
}

std::atomic<int> g_exchanged_local_ranks{0};  // 0: not exchanged

}  // namespace

void set_local_rank_count(int ranks) { g_exchanged_local_ranks.store(ranks > 0 ? ranks : 0); }

int local_rank_count() {
  if (int n = g_exchanged_local_ranks.load()) return n;
  if (int n = positive_int_env("OMPI_COMM_WORLD_LOCAL_SIZE")) return n;
  if (int n = positive_int_env("MPI_LOCALNRANKS")) return n;
  // Under srun: SLURM_STEP_TASKS_PER_NODE looks like "4" or "4(x2)"; the leading count is ours
  // on a homogeneous allocation.
  if (int n = positive_int_env("SLURM_STEP_TASKS_PER_NODE")) return n;
  return 1;
}

int default_threads_per_rank() {
  if (int n = positive_int_env("OMP_NUM_THREADS")) return n;
  cpu_set_t mask;
  int cpus = 1;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) cpus = std::max(1, CPU_COUNT(&mask));
  return std::max(1, cpus / local_rank_count());
}

int configure_threads() {
  const int threads = default_threads_per_rank();
  omp_set_num_threads(threads);
  return threads;
}

bool openmp_waits_passively() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (!policy) return false;
  std::string value(policy);
  std::transform(value.begin(), value.end(), value.begin(), [](unsigned char c) { return std::tolower(c); });
  return value == "passive";
}

}  // namespace mt
