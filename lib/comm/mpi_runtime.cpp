// MPI process lifetime (see mpi_runtime.h).
#include "comm/mpi_runtime.h"

#include <mpi.h>

#include <cstdlib>
#include <string>

#include "comm/mpi_communicator.h"
#include "comm/node_ranks.h"
#include "core/error.h"
#include "core/threads.h"

namespace mt::comm {
namespace {
bool g_active = false;
int g_rank = 0;
int g_size = 1;
NodeRanks g_node;
}  // namespace

bool launched_under_mpi() { return std::getenv("PMIX_RANK") || std::getenv("OMPI_COMM_WORLD_SIZE"); }

void refuse_unformed_world() {
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  if (!tasks || launched_under_mpi()) return;
  char* end = nullptr;
  const long count = std::strtol(tasks, &end, 10);
  if (end == tasks || count <= 1) return;
  throw UsageError("SLURM_STEP_NUM_TASKS=" + std::string(tasks),
                   "started as " + std::to_string(count) +
                       " tasks without PMIx or OpenMPI variables, so they cannot form one world (each would "
                       "train alone); launch with srun --mpi=pmix or mpirun");
}

void MpiRuntime::init() {
  if (g_active || !launched_under_mpi()) return;
  // MPI_THREAD_MULTIPLE: the communicators' progress thread polls MPI while the caller computes
  // and calls MPI itself (comm/progress_thread.h). A library that provides less still works, with
  // progress only inside the caller's MPI calls.
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    throw Error("MPI_Init", "failed to initialise MPI");
  }
  g_active = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  MpiCommunicatorOptions exchange_only;
  exchange_only.progress_thread = false;
  g_node = exchange_node_ranks(*make_mpi_communicator(MPI_COMM_WORLD, exchange_only));
  set_local_rank_count(g_node.local_count);
}

void MpiRuntime::finalize() {
  if (!g_active) return;
  MPI_Finalize();
  g_active = false;
}

int MpiRuntime::local_rank() { return g_node.local_rank; }
int MpiRuntime::local_size() { return g_node.local_count; }

bool MpiRuntime::active() { return g_active; }
int MpiRuntime::rank() { return g_rank; }
int MpiRuntime::size() { return g_size; }

void MpiRuntime::abort_job(int exit_code) {
  if (g_active) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

std::string MpiRuntime::library_version() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string text(version, static_cast<size_t>(length));
  if (auto comma = text.find(','); comma != std::string::npos) text.resize(comma);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

}  // namespace mt::comm
