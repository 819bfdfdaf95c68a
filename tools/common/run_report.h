// What the accounting tools (mt-mfu, mt-memreport) share: mt-train's model, parallel, training and
// --device flags (the same add_*_flags mt-train uses) plus --world-size, with every flag that cannot change
// a report listed under "accepted for compatibility with mt-train, no effect here"; the run's
// configs from those flags or from mt-train's JSONL (--from-log); sweeps (--sweep FLAG=a,b,c:
// the arguments parsed once per combination); and the layout planner (--plan CLUSTER). Layouts
// mt-train cannot run yet are accounted for: only parallel::validate's rules apply. Tested by
// tests/tools/mt-mfu.bats and tests/tools/mt-memreport.bats.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"
#include "model/config.h"
#include "parallel/parallel_config.h"
#include "study/memory_model.h"
#include "study/planner.h"
#include "tools/common/flags.h"
#include "tools/common/records.h"
#include "tools/common/tool_main.h"
#include "train/trainer.h"

namespace mt::tools {

inline constexpr const char* kNoEffectGroup = "accepted for compatibility with mt-train, no effect here";

struct ReportFlags {
  ModelFlags model;
  parallel::ParallelConfig parallel;
  TrainingFlags training;
  std::optional<std::string> device;  // mt-train's --device; each tool's --help says what it changes there
  int world_size = 1;
  std::string from_log;
  std::vector<std::string> sweeps;
  std::string plan;
  int top = 10;
  std::string memory_estimate = "mt";
  // mt-train's data flags: only the vocabulary they imply is used (--data-path datasets that record
  // one, --byte-data's 256); the rest has no effect.
  DataPathFlags paths;
  std::string byte_data;
  bool mock_data = false;
  data::LoaderOptions loader;
  std::string save_init, save_final;
  MegatronCompatFlags compat;
};

// Adds mt-train's flags and the shared report flags to `cli`; `no_effect` names the shared flags
// that cannot change this tool's report (moved into kNoEffectGroup beside the data-loading,
// saving and compatibility flags); `device_help` says what --device changes in this tool.
void add_report_flags(ToolCli& cli, ReportFlags& flags, const std::vector<std::string>& no_effect,
                      const std::string& device_help);

// A run's configs as mt-train would run them, on `world_size` ranks.
struct RunConfig {
  model::ModelConfig model;
  parallel::ParallelConfig parallel;  // validated: data_parallel_size set
  train::TrainConfig train;
  int world_size = 1;
  BackendDevice device = BackendDevice::cpu;  // --device; a log's is its run record's device (cpu without one)
  std::vector<std::string> warnings;          // parallel::validate's, for stderr
};

// The model of the flags, its vocabulary resolved as mt-train resolves it (--vocab-size, the
// datasets' recorded vocabulary, --byte-data's 256, the preset's), validated.
model::ModelConfig report_model(const ReportFlags& flags);
// The whole configuration; throws mt::UsageError naming the flags of the first rule broken.
RunConfig run_config_from_flags(const ReportFlags& flags);

// mt-train's JSONL records: its run record (with the model, parallel and train configs), its
// step records and its memory records (one per pipeline stage after the first step and before
// the summary; absent from logs of mt-train before they existed), in order.
struct TrainingLog {
  std::string path;
  Record run;
  std::vector<Record> steps;
  std::vector<Record> memory;
  std::vector<std::string> warnings;  // for the tool to print: a cut last line it ignored
};
// Reads `path` ("-": stdin). Throws mt::UsageError("--from-log PATH", ...) naming the line that is
// not JSON (a cut last line, without its newline, is ignored with a warning: a killed or live
// run's log), a step record without an integer iteration or a positive step_ms, or saying the run
// record or the step records are missing.
TrainingLog read_training_log(const std::string& path);
RunConfig run_config_from_log(const TrainingLog& log);
// With --from-log the configuration is the log's: any other flag of `app` given is refused by
// name, except those listed in `allowed`.
void refuse_config_flags_with_log(const CLI::App& app, const std::vector<std::string>& allowed);
// Refuses every flag of `names` given on the command line: "<flag>: <why>".
void refuse_given(const CLI::App& app, const std::vector<std::string>& names, const std::string& why);

// The study's view of the run: its parallel layout, batch, recompute and precision, and the GEMM
// copy its backend keeps (bf16 bits where the CPU multiplies bf16 natively, and on cuda).
study::TrainingShape training_shape(const RunConfig& config);
// Refuses --device cpu for what models a cluster's GPUs (--plan, --predict): "<flag> predicts
// the cluster's GPUs".
void refuse_cpu_device(const ReportFlags& flags, const std::string& mode);

// One combination of --sweep: the tool's arguments with the values appended, and the values as
// "flag=value ..." for the records.
struct SweepPoint {
  std::vector<std::string> argv;
  std::string label;
};
// Every combination of `sweeps` ("FLAG=a,b,c", FLAG with or without its dashes, an option of
// `app` that takes one value or a toggle; an empty value leaves the flag as the other arguments
// set it). One point without a label when `sweeps` is empty. Throws mt::UsageError naming the
// sweep that is malformed.
std::vector<SweepPoint> sweep_points(const CLI::App& app, const std::vector<std::string>& argv,
                                     const std::vector<std::string>& sweeps);

// Parses a point's arguments; a value a flag refuses is mt::UsageError naming the sweep.
void parse_sweep_arguments(ToolCli& cli, const SweepPoint& point);

// The tool's options parsed once per sweep point (all parsed before any output, so a bad value
// in the last combination is a usage error before the first record).
template <typename Options>
std::vector<std::pair<Options, std::string>> parse_sweep(const ToolCli& cli, const Options& parsed,
                                                         const std::vector<std::string>& sweeps,
                                                         const std::function<void(ToolCli&, Options&)>& define) {
  std::vector<std::pair<Options, std::string>> points;
  if (sweeps.empty()) {
    points.emplace_back(parsed, "");
    return points;
  }
  for (const SweepPoint& point : sweep_points(cli.app(), cli.argv(), sweeps)) {
    Options options;
    ToolCli fresh(cli.name(), "");
    define(fresh, options);
    parse_sweep_arguments(fresh, point);
    points.emplace_back(std::move(options), point.label);
  }
  return points;
}

// The planner's top layouts as records ("plan", ranked) and a "plan_summary"; `flags` give the
// model, --world-size devices, --global-batch-size, the precision, --top and --memory-estimate.
// Parallel, micro-batch and recompute flags given are refused (the planner chooses them), and so
// is --device cpu (the planner plans the cluster's GPUs).
std::vector<Record> plan_records(const ToolCli& cli, const ReportFlags& flags);

// Writes the run record and `records` in the tool's format; returns 0.
int write_report(const ToolCli& cli, const std::vector<Record>& records);

// "12.34" GiB of `bytes`, rounded to 2 decimals.
double gib_value(int64_t bytes);

}  // namespace mt::tools
