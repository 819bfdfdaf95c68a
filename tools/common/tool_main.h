// The one entry point of every mt-* tool: the shared CLI (CLI11), --help/--version, the output
// format options, MPI start-up under a launcher, threads per rank, and the translation of
// exceptions into `mt-x: error: <what>: <why>` plus the exit codes of DESIGN.md section 5. A flag
// given twice takes its last value in every tool, as argparse does.
// Tested by tests/tools/conventions.bats over every tool.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tools/common/flags.h"
#include "tools/common/records.h"

namespace mt::tools {

class ToolCli {
 public:
  ToolCli(std::string name, std::string description);
  CLI::App& app() { return app_; }
  const CLI::App& app() const { return app_; }
  const std::string& name() const { return name_; }
  // Registers --format table|json|jsonl|csv and --json (= --format json) on `command`. Records on
  // stdout are JSONL by default in every tool (tables on request).
  void add_output_format(CLI::App& command);
  OutputFormat output_format() const;
  const std::vector<std::string>& argv() const { return argv_; }
  void set_argv(std::vector<std::string> argv) { argv_ = std::move(argv); }

 private:
  std::string name_;
  CLI::App app_;
  std::string format_name_;
  bool json_ = false;
  std::vector<std::string> argv_;
};

// The `run` provenance record (DESIGN.md section 4): tool, version, git, time, argv, host, world
// size, threads per rank, CPU ISA, library versions, Slurm job facts when present.
Record run_record(const ToolCli& cli);

// Runs a tool: `define` adds its options; `run` does the work and returns an exit code.
int tool_main(int argc, char** argv, const std::string& name, const std::string& description,
              const std::function<void(ToolCli&)>& define, const std::function<int(ToolCli&)>& run);

}  // namespace mt::tools

namespace mt::tools {

// The main of a tool whose job has not landed: --help says it is not built yet (and what it will
// do, and which issue brings it), --version works, and any other arguments give one line on
// stderr, "<name>: error: <job>: not built yet (lands with issue #N)", exit 1 and nothing on
// stdout, instead of parsing flags of features that do not exist.
int not_built_main(int argc, char** argv, const std::string& name, const std::string& job,
                   const std::string& will_do, int issue);

}  // namespace mt::tools
