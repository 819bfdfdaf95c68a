// Build provenance: version, git commit and build flags, for --version and the run record.
// Tested by tests/tools/conventions.bats (every tool's --version).
#pragma once

#include <string>

namespace mt {

struct BuildInfo {
  std::string version;
  std::string git_commit;
  std::string build_type;
  std::string compiler;
  bool cuda;
  bool nccl;
  bool mpi;
  std::string blas;  // the CPU GEMM library
};

const BuildInfo& build_info();

}  // namespace mt
