// Shared tool entry point (see tool_main.h).
#include "tools/common/tool_main.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "backend/backend_info.h"
#include "comm/mpi_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "core/version.h"
#include "io/hdf5_info.h"
#include "tools/common/signals.h"

namespace mt::tools {
namespace {

std::string version_text(const std::string& name) {
  const BuildInfo& info = build_info();
  std::string text = name + " " + info.version + " (git " + info.git_commit + ")\n";
  text += "build: " + info.build_type + ", " + info.compiler + "; cuda=" + (info.cuda ? "on" : "off") +
          " nccl=" + (info.nccl ? "on" : "off") + " mpi=" + (info.mpi ? "on" : "off") + " blas=" + info.blas;
  return text;
}

// Whether `tool` runs OpenMP parallel regions. mt-tokenize does not (its workers are std::threads,
// core/ordered_pipeline.h; it calls no kernel, GEMM or OpenMP loop), so no OpenMP thread of it
// can spin and it skips the re-execution below: a second load of every shared library, 0.16 s of
// the 0.36 s of CPU a `mt-tokenize --help` took, paid by every rank of `--partitions`.
bool runs_openmp(const std::string& tool) { return tool != "mt-tokenize"; }

// libgomp reads OMP_WAIT_POLICY once, when it is loaded, before main() (a setenv in the
// executable's .preinit_array is undone by libc's own start-up, which comes after it). Without
// it, idle OpenMP threads of oversubscribed MPI ranks spin; so a tool that runs OpenMP and was
// started without it re-executes itself with OMP_WAIT_POLICY=passive (same pid, so MPI launchers
// do not notice). A user's explicit setting is respected.
void ensure_passive_openmp(const std::string& tool, char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || !runs_openmp(tool)) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);
  // execv failed (no /proc): run on with the runtime's default policy.
}

std::string iso_time_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

std::string host_name() {
  char buffer[256] = {};
  gethostname(buffer, sizeof buffer - 1);
  return buffer;
}

// One line on stderr for an error; aborts the whole MPI job from the failing rank.
int report_error(const std::string& tool, const std::string& message, int code) {
  std::fprintf(stderr, "%s%s: error: %s\n", log::rank_prefix().c_str(), tool.c_str(), message.c_str());
  std::fflush(stderr);
  if (comm::MpiRuntime::active() && comm::MpiRuntime::size() > 1) comm::MpiRuntime::abort_job(code);
  return code;
}

}  // namespace

ToolCli::ToolCli(std::string name, std::string description) : name_(name), app_(std::move(description), name) {
  app_.set_version_flag("--version", version_text(name), "Print version, git commit and build flags, then exit");
  app_.set_help_flag("-h,--help", "Print this help and exit");
  // A flag given twice: the last one wins in every tool (and its subcommands), as argparse does
  // for Megatron's flags.
  app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void ToolCli::add_output_format(CLI::App& command) {
  format_name_ = format_name(OutputFormat::jsonl);
  static const FlagSpec format =
      text_flag("--format", "Output format of the records on stdout", {"table", "json", "jsonl", "csv"});
  add_flag(command, format, format_name_)->capture_default_str();
  command.add_flag("--json", json_, "Shorthand for --format json");
}

OutputFormat ToolCli::output_format() const { return json_ ? OutputFormat::json : parse_format(format_name_); }

Record run_record(const ToolCli& cli) {
  const BuildInfo& info = build_info();
  Record record;
  record["record"] = "run";
  record["tool"] = cli.name();
  record["version"] = info.version;
  record["git"] = info.git_commit;
  record["time"] = iso_time_now();
  record["argv"] = cli.argv();
  record["host"] = host_name();
  record["world_size"] = comm::MpiRuntime::size();
  record["threads_per_rank"] = default_threads_per_rank();
  record["cpu_isa"] = backend::cpu_isa();
  record["openmp_wait_policy"] =
      !runs_openmp(cli.name()) ? "unused" : openmp_waits_passively() ? "passive" : "default";
  Record libraries;
  libraries["mpi"] = comm::MpiRuntime::library_version();
  libraries["hdf5"] = io::hdf5_version();
  libraries["gemm"] = backend::gemm_library();
  for (const auto& [library, version] : backend::device_library_versions()) libraries[library] = version;
  record["libraries"] = libraries;
  for (const char* variable : {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_RESTART_COUNT"}) {
    if (const char* value = std::getenv(variable)) {
      std::string key(variable);
      for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      record[key] = value;
    }
  }
  return record;
}

int tool_main(int argc, char** argv, const std::string& name, const std::string& description,
              const std::function<void(ToolCli&)>& define, const std::function<int(ToolCli&)>& run) {
  ensure_passive_openmp(name, argv);
  block_signals();  // before MPI, OpenMP or mt start a thread: they all inherit the block (signals.h)
  // A write past `ulimit -f` then fails with EFBIG, which the writer reports ("File too large").
  std::signal(SIGXFSZ, SIG_IGN);
  ignore_broken_pipes();  // a closed stdout is a write error to report, not a silent death (issue 28 L5)
  ToolCli cli(name, description);
  cli.set_argv(std::vector<std::string>(argv, argv + argc));
  int code = 0;
  try {
    define(cli);
    try {
      cli.app().parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      std::fputs(cli.app().help().c_str(), stdout);
      return 0;
    } catch (const CLI::CallForAllHelp&) {
      std::fputs(cli.app().help("", CLI::AppFormatMode::All).c_str(), stdout);
      return 0;
    } catch (const CLI::CallForVersion&) {
      std::fputs((version_text(name) + "\n").c_str(), stdout);
      return 0;
    } catch (const CLI::ValidationError& e) {
      return report_error(name, e.what(), 2);  // flags.h wrote it: "--workers: must be at least 1 (got 0)"
    } catch (const CLI::ParseError& e) {
      std::string message = e.what();
      for (char& c : message) if (c == '\n') c = ' ';
      while (!message.empty() && message.back() == ' ') message.pop_back();
      return report_error(name, "usage: " + message + " (see " + name + " --help)", 2);
    }
    comm::MpiRuntime::init();
    if (comm::MpiRuntime::size() > 1) log::set_rank_prefix("[rank " + std::to_string(comm::MpiRuntime::rank()) + "] ");
    configure_threads();
    backend::cpu_isa();  // a bad MT_CPU_ISA is a usage error before any work starts
    handle_signals(name, SignalMode::immediate);
    code = run(cli);
  } catch (const Error& e) {
    code = report_error(name, e.what(), static_cast<int>(e.code()));
  } catch (const std::bad_alloc&) {
    code = report_error(name, "out of memory", 1);
  } catch (const std::exception& e) {
    code = report_error(name, e.what(), 1);
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    code = report_error(name, "stdout: write failed", 1);
  }
  comm::MpiRuntime::finalize();
  return code;
}

}  // namespace mt::tools

namespace mt::tools {

int not_built_main(int argc, char** argv, const std::string& name, const std::string& job, const std::string& will_do,
                   int issue) {
  const std::string lands = "not built yet (lands with issue #" + std::to_string(issue) + ")";
  return tool_main(
      argc, argv, name, name + " is " + lands + ": it will " + will_do + ". Until then it only says so and exits 1.",
      [](ToolCli& cli) {
        cli.app().allow_extras();  // every argument gets the same answer
        cli.app().footer("Any arguments other than --help and --version exit 1 with \"not built yet\".");
      },
      [&](ToolCli&) -> int { throw Error(job, lands); });
}

}  // namespace mt::tools
