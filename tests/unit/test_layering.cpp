// The layering rule, checked on the source tree: every quoted #include in kernels/, lib/ and tools/
// must point down `tools -> lib -> kernels`, and inside lib along the module order MT_LIB_MODULES
// (from lib/CMakeLists.txt); lib/model, lib/optim and lib/train reach kernels only through the
// backend op table (bar the header-only kernels/common). Include roots are unambiguous: kernels and tools headers are named
// from the repository root ("kernels/cpu/ops.h", "tools/common/records.h"), lib headers by module
// ("core/dtype.h"). Only lib/comm and checkpoint I/O use MPI directly. The checkers themselves
// are tested on made-up edges and files first, so they can fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::vector<std::string> lib_modules() {
  std::vector<std::string> modules;
  std::istringstream in(MT_LIB_MODULES);
  std::string module;
  while (std::getline(in, module, ',')) modules.push_back(module);
  return modules;
}

std::optional<size_t> module_rank(const std::string& module) {
  const auto modules = lib_modules();
  const auto it = std::find(modules.begin(), modules.end(), module);
  if (it == modules.end()) return std::nullopt;
  return static_cast<size_t>(it - modules.begin());
}

std::string first_component(const std::string& path) { return path.substr(0, path.find('/')); }

// Why `target` may not be included from the file at `from` (a path relative to the repository
// root), or an empty string when the edge is allowed.
std::string layering_violation(const std::string& from, const std::string& target) {
  const std::string from_top = first_component(from);
  const std::string to_top = first_component(target);
  if (target.find("..") != std::string::npos || target.find('/') == std::string::npos) {
    return "includes must be rooted (\"kernels/...\", \"<module>/...\", \"tools/...\"), not relative";
  }
  if (from_top == "kernels") {
    return to_top == "kernels" ? "" : "kernels/ may include only kernels/";
  }
  if (from_top == "lib") {
    const auto from_rank = module_rank(first_component(from.substr(4)));
    if (!from_rank) return "file outside a lib module";
    if (to_top == "kernels") {
      // The modules that run the model's compute reach kernels only through the backend op
      // table; the header-only code shared by host and device (kernels/common) is open to all.
      const std::string module = lib_modules()[*from_rank];
      const bool compute = module == "model" || module == "optim" || module == "train";
      const bool shared = target.rfind("kernels/common/", 0) == 0;
      return compute && !shared ? "lib/" + module + " reaches kernels through backend/ops.h" : "";
    }
    const auto to_rank = module_rank(to_top);
    if (!to_rank) return "lib may include only lib modules and kernels/";
    if (*to_rank > *from_rank) return "lib/" + to_top + " comes after lib/" + lib_modules()[*from_rank];
    return "";
  }
  if (from_top == "tools") {
    if (to_top == "kernels") return "tools reach kernels only through lib";
    if (to_top == "tools") {
      const bool from_common = from.rfind("tools/common/", 0) == 0;
      const bool to_common = target.rfind("tools/common/", 0) == 0;
      return to_common || (!from_common && first_component(from.substr(6)) == first_component(target.substr(6)))
                 ? ""
                 : "a tool includes only tools/common and its own folder";
    }
    return module_rank(to_top) ? "" : "tools may include only lib modules and tools/";
  }
  return "not under kernels/, lib/ or tools/";
}

struct Edge {
  std::string from, target;
};

std::vector<Edge> quoted_includes(const fs::path& root) {
  static const std::regex include_line(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<Edge> edges;
  for (const char* top : {"kernels", "lib", "tools"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      const auto ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".inc" && ext != ".cu" && ext != ".cuh")) {
        continue;
      }
      std::ifstream in(entry.path());
      std::string line;
      std::smatch match;
      while (std::getline(in, line)) {
        if (std::regex_search(line, match, include_line)) {
          edges.push_back({fs::relative(entry.path(), root).generic_string(), match[1].str()});
        }
      }
    }
  }
  return edges;
}

// Where a quoted include resolves among the include roots (lib/, the repository root, and the
// generated build_info header); more than one is an ambiguity.
int resolutions(const fs::path& root, const std::string& target) {
  if (target == "core/build_info.h") return 1;
  return static_cast<int>(fs::exists(root / "lib" / target)) + static_cast<int>(fs::exists(root / target));
}

TEST(LayeringChecker, AllowsDownwardEdges) {
  EXPECT_EQ(layering_violation("lib/train/trainer.cpp", "model/layout.h"), "");
  EXPECT_EQ(layering_violation("lib/backend/cpu_backend.cpp", "kernels/cpu/ops.h"), "");
  EXPECT_EQ(layering_violation("lib/model/init.cpp", "kernels/common/philox.h"), "");
  EXPECT_EQ(layering_violation("lib/io/checkpoint.cpp", "io/hdf5_attributes.h"), "");
  EXPECT_EQ(layering_violation("tools/mt-train/main.cpp", "tools/common/tool_main.h"), "");
  EXPECT_EQ(layering_violation("tools/mt-train/main.cpp", "train/trainer.h"), "");
  EXPECT_EQ(layering_violation("kernels/cpu/ops.cpp", "kernels/cpu/ops.h"), "");
  // The study sits above training: it may read the trainer's run-time accounting and the trainer.
  EXPECT_EQ(layering_violation("lib/study/memory_model.cpp", "perf/parameters.h"), "");
  EXPECT_EQ(layering_violation("lib/study/predict.cpp", "train/trainer.h"), "");
  EXPECT_EQ(layering_violation("tools/mt-mfu/main.cpp", "study/predict.h"), "");
}

TEST(LayeringChecker, RefusesUpwardAndSkippingEdges) {
  EXPECT_NE(layering_violation("lib/io/checkpoint.cpp", "train/trainer.h"), "");
  EXPECT_NE(layering_violation("lib/data/token_dataset.cpp", "text/tokenizer.h"), "");
  EXPECT_NE(layering_violation("lib/core/tensor.h", "backend/backend_info.h"), "");
  EXPECT_NE(layering_violation("kernels/cpu/ops.cpp", "core/error.h"), "");
  EXPECT_NE(layering_violation("lib/model/layout.cpp", "tools/common/records.h"), "");
  EXPECT_NE(layering_violation("tools/mt-train/main.cpp", "kernels/cpu/gemm.h"), "");
  EXPECT_NE(layering_violation("tools/common/records.cpp", "tools/mt-train/options.h"), "");
  EXPECT_NE(layering_violation("tools/mt-train/main.cpp", "tools/mt-shard/options.h"), "");
  EXPECT_NE(layering_violation("lib/data/x.cpp", "../core/error.h"), "");
  EXPECT_NE(layering_violation("lib/data/x.cpp", "common/half.h"), "");
  EXPECT_NE(layering_violation("lib/model/stage.cpp", "kernels/cpu/ops.h"), "");  // only through backend/ops.h
  EXPECT_NE(layering_violation("lib/optim/adamw.cpp", "kernels/cpu/gemm.h"), "");
  EXPECT_NE(layering_violation("lib/train/trainer.cpp", "kernels/cpu/ops.h"), "");
  // Training and its run-time accounting never reach the study.
  EXPECT_NE(layering_violation("lib/train/trainer.cpp", "study/memory_model.h"), "");
  EXPECT_NE(layering_violation("lib/perf/memory.cpp", "study/predict.h"), "");
}

TEST(Layering, EveryIncludeInTheTreePointsDown) {
  const fs::path root = MT_SOURCE_DIR;
  const auto edges = quoted_includes(root);
  ASSERT_GT(edges.size(), 100u) << "the scan found too few includes to be reading the tree";
  for (const auto& edge : edges) {
    EXPECT_EQ(layering_violation(edge.from, edge.target), "") << edge.from << " includes \"" << edge.target << "\"";
    EXPECT_EQ(resolutions(root, edge.target), 1)
        << edge.from << " includes \"" << edge.target << "\", which resolves to "
        << resolutions(root, edge.target) << " files among the include roots";
  }
}

// MPI stays behind lib/comm: a file outside lib/comm and checkpoint I/O (lib/io/checkpoint.cpp,
// whose parallel HDF5 takes an MPI communicator) that includes <mpi.h> or a comm header exposing
// MPI types, or calls an MPI function, breaks it (tools and the rest of lib go through the
// communicators: a control-group barrier, not MPI_Barrier). Line comments are not read, so a
// comment may name an MPI call; an environment variable named MPI_... is no call.
std::string mpi_violation(const std::string& path, const std::string& text) {
  if (path.rfind("lib/comm/", 0) == 0 || path == "lib/io/checkpoint.cpp") return "";
  static const std::regex mpi_header(R"re(^\s*#\s*include\s*(<mpi\.h>|"comm/mpi_communicator\.h"|"comm/progress_thread\.h"))re");
  static const std::regex mpi_call(R"re(\bP?MPI_[A-Za-z0-9_]+\s*\()re");
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string code = line.substr(0, line.find("//"));
    if (std::regex_search(code, mpi_header) || std::regex_search(code, mpi_call)) {
      return path + ":" + std::to_string(number) + " uses MPI outside lib/comm: " + line;
    }
  }
  return "";
}

TEST(Layering, OnlyCommAndCheckpointIoUseMpi) {
  // The checker on made-up files first.
  EXPECT_NE(mpi_violation("tools/mt-x/main.cpp", "#include <mpi.h>\n"), "");
  EXPECT_NE(mpi_violation("tools/mt-x/main.cpp", "int x;\n  if (a) MPI_Barrier(MPI_COMM_WORLD);\n"), "");
  EXPECT_NE(mpi_violation("lib/train/x.cpp", "#include \"comm/mpi_communicator.h\"\n"), "");
  EXPECT_NE(mpi_violation("lib/io/x.cpp", "MPI_Comm_rank (comm, &rank);\n"), "");
  EXPECT_EQ(mpi_violation("lib/comm/x.cpp", "#include <mpi.h>\nMPI_Barrier(comm);\n"), "");
  EXPECT_EQ(mpi_violation("lib/io/checkpoint.cpp", "#include \"comm/mpi_communicator.h\"\n"), "");
  EXPECT_EQ(mpi_violation("lib/core/threads.cpp", "positive_int_env(\"MPI_LOCALNRANKS\");\n"), "");
  EXPECT_EQ(mpi_violation("tools/mt-x/main.cpp", "world->barrier();  // not MPI_Barrier(MPI_COMM_WORLD)\n"), "");
  // Then the tree.
  const fs::path root = MT_SOURCE_DIR;
  int files = 0;
  for (const char* top : {"kernels", "lib", "tools"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      const auto ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".inc" && ext != ".cu" && ext != ".cuh")) {
        continue;
      }
      std::ifstream in(entry.path());
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_EQ(mpi_violation(fs::relative(entry.path(), root).generic_string(), text), "");
      ++files;
    }
  }
  EXPECT_GT(files, 100) << "the scan found too few files to be reading the tree";
}

}  // namespace
