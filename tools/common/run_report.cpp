// The accounting tools' shared flags, configs, log reader, sweeps and planner (see run_report.h).
#include "tools/common/run_report.h"

#include <cmath>
#include <fstream>
#include <iostream>
#include <set>

#include "core/error.h"
#include "backend/registry.h"
#include "perf/memory.h"

namespace mt::tools {
namespace {

// Flags that cannot change any report: how data is loaded, saved and logged, the optimizer's
// and the schedule's values, initialisation and dropout, the MoE losses' weights and the expert
// bias's rate.
const std::vector<std::string> kNeverEffective = {
    "--split", "--data-cache-path", "--mock-data", "--eod-mask-loss", "--reset-position-ids",
    "--reset-attention-mask", "--save-init", "--save-final", "--train-iters", "--train-samples", "--lr", "--min-lr",
    "--lr-decay-style", "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-fraction", "--lr-decay-iters",
    "--lr-decay-samples", "--weight-decay", "--adam-beta1", "--adam-beta2", "--adam-eps", "--clip-grad", "--loss-scale",
    "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis", "--calculate-per-token-loss",
    "--check-for-nan-in-loss-and-grad", "--no-check-for-nan-in-loss-and-grad", "--max-consecutive-skipped-iters", "--seed", "--log-interval",
    "--log-throughput", "--eval-interval", "--eval-iters", "--norm-epsilon", "--rotary-base", "--init-method-std",
    "--hidden-dropout", "--attention-dropout", "--moe-per-layer-logging", "--moe-router-bias-update-rate",
    "--moe-aux-loss-coeff", "--moe-z-loss-coeff"};

// Options that describe the output or the tool's mode rather than the run.
const std::set<std::string> kNotSweepable = {"--sweep", "--from-log", "--format", "--json", "--help", "--version",
                                             "--plan", "--data-path", "--train-data-path", "--valid-data-path",
                                             "--test-data-path"};

constexpr size_t kMaxSweepPoints = 10000;

std::vector<std::string> split_values(const std::string& text) {
  std::vector<std::string> values;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    values.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return values;
    start = comma + 1;
  }
}

}  // namespace

void add_report_flags(ToolCli& cli, ReportFlags& f, const std::vector<std::string>& no_effect,
                      const std::string& device_help) {
  CLI::App& app = cli.app();
  add_model_flags(app, f.model, "Model");
  const std::string parallel_group =
      "Parallelism (any layout parallel::validate accepts on --world-size ranks, also those mt-train cannot run yet)";
  add_parallel_flags(app, f.parallel, parallel_group);
  add_flag(app, "--world-size", f.world_size)->capture_default_str()->group(parallel_group);
  add_training_flags(app, f.training, "Training");
  add_device_flag(app, f.device, "Device", device_help);
  const std::string data_group = "Data (read only for the vocabulary they give the model, as mt-train takes it)";
  add_data_path_flags(app, f.paths, data_group);
  add_flag(app, "--byte-data", f.byte_data)->group(data_group);
  add_flag(app, "--mock-data", f.mock_data);
  add_flag(app, "--eod-mask-loss", f.loader.eod_mask_loss);
  add_flag(app, "--reset-position-ids", f.loader.reset_position_ids);
  add_flag(app, "--reset-attention-mask", f.loader.reset_attention_mask);
  add_flag(app, "--save-init", f.save_init);
  add_flag(app, "--save-final", f.save_final);
  add_megatron_compat_flags(app, f.compat, kNoEffectGroup);
  for (const std::vector<std::string>* names : {&kNeverEffective, &no_effect}) {
    for (const std::string& name : *names) app.get_option(name)->group(kNoEffectGroup);
  }
  const std::string report_group = "Report";
  add_flag(app, "--from-log", f.from_log)->group(report_group);
  add_flag(app, "--sweep", f.sweeps)->group(report_group)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  add_flag(app, "--plan", f.plan)->group(report_group);
  add_flag(app, "--top", f.top)->capture_default_str()->group(report_group);
  add_flag(app, "--memory-estimate", f.memory_estimate)->capture_default_str()->group(report_group);
  cli.add_output_format(app);
}

model::ModelConfig report_model(const ReportFlags& f) {
  if (f.model.preset.empty() && !f.model.num_layers) {
    throw UsageError("--model", "give a preset or --num-layers and friends");
  }
  ModelFlags flags = f.model;
  if (!flags.vocab_size && f.paths.any()) {
    data::DataConfig data;
    apply_data_path_flags(f.paths, data);
    if (std::optional<int64_t> vocab = recorded_vocab_size(data::open_datasets(data))) flags.vocab_size = *vocab;
  }
  if (!flags.vocab_size && !f.byte_data.empty() && flags.preset.empty()) flags.vocab_size = 256;
  model::ModelConfig model = model_config(flags);
  if (model.vocab_size <= 0) {
    throw UsageError("--vocab-size", "needed (a preset's, or the one --data-path datasets record)");
  }
  model.validate();
  return model;
}

RunConfig run_config_from_flags(const ReportFlags& f) {
  RunConfig config;
  config.model = report_model(f);
  config.train = training_config(f.training);
  config.parallel = f.parallel;
  config.world_size = f.world_size;
  config.device = backend_device(f.device);
  config.warnings = validate_parallel(config.parallel, config.model, config.train, config.world_size);
  return config;
}

namespace {

// A step record's fields the reports read: an integer iteration and a positive step time.
void check_step_record(const std::string& what, int64_t line, const Record& record) {
  const std::string where = "line " + std::to_string(line) + ": ";
  const auto iteration = record.find("iteration");
  if (iteration == record.end() || !iteration->is_number_integer()) {
    throw UsageError(what, where + "the step record's iteration is " +
                               (iteration == record.end() ? std::string("missing") : iteration->dump()) +
                               ", not an integer");
  }
  const auto step_ms = record.find("step_ms");
  if (step_ms == record.end() || !step_ms->is_number() || !(step_ms->get<double>() > 0) ||
      !std::isfinite(step_ms->get<double>())) {
    throw UsageError(what, where + "the step record's step_ms is " +
                               (step_ms == record.end() ? std::string("missing") : step_ms->dump()) +
                               ", not a positive number of milliseconds");
  }
}

}  // namespace

TrainingLog read_training_log(const std::string& path) {
  TrainingLog log;
  log.path = path;
  const std::string what = "--from-log " + path;
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) throw UsageError(what, "cannot be read");
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Record record = Record::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object()) {
      if (in.eof()) {  // a last line without its newline: a run killed mid-write, or a live log
        log.warnings.push_back(what + ": line " + std::to_string(number) + ", the last, is cut (no newline, not JSON): ignored");
        break;
      }
      throw UsageError(what, "line " + std::to_string(number) + " is not a JSON record (give mt-train's JSONL stdout)");
    }
    const std::string kind = record.value("record", "");
    if (kind == "run") {
      if (!log.run.is_null()) throw UsageError(what, "holds more than one run record (one run per log)");
      if (record.value("tool", "") != "mt-train") {
        throw UsageError(what, "line " + std::to_string(number) + " is the run record of " +
                                   record.value("tool", "an unknown tool") + ", not mt-train");
      }
      log.run = std::move(record);
    } else if (kind == "step") {
      check_step_record(what, number, record);
      log.steps.push_back(std::move(record));
    } else if (kind == "memory") {
      log.memory.push_back(std::move(record));
    }
  }
  if (log.run.is_null()) throw UsageError(what, "holds no run record of mt-train (give its JSONL stdout)");
  if (log.steps.empty()) throw UsageError(what, "holds no step records");
  return log;
}

RunConfig run_config_from_log(const TrainingLog& log) {
  RunConfig config;
  try {
    // mt-train's run record adds what follows from the config (padded vocabulary, parameters).
    nlohmann::json model = log.run.at("model");
    model.erase("padded_vocab_size");
    model.erase("parameters");
    config.model = model::config_from_json(model);
    config.parallel = parallel::parallel_config_from_json(log.run.at("parallel"));
    config.train = train::train_config_from_json(log.run.at("train"));
    config.world_size = log.run.at("world_size").get<int>();
    if (log.run.contains("device")) config.device = backend::parse_device(log.run.at("device").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--from-log " + log.path, std::string("the run record lacks its configs: ") + e.what());
  }
  config.model.validate();
  config.warnings = validate_parallel(config.parallel, config.model, config.train, config.world_size);
  return config;
}

void refuse_given(const CLI::App& app, const std::vector<std::string>& names, const std::string& why) {
  for (const std::string& name : names) {
    if (app.count(name) > 0) throw UsageError(name, why);
  }
}

void refuse_config_flags_with_log(const CLI::App& app, const std::vector<std::string>& allowed) {
  const std::set<std::string> keep(allowed.begin(), allowed.end());
  for (const CLI::Option* option : app.get_options()) {
    const std::string name = option->get_name(false, true);
    if (option->count() == 0 || keep.count(name) || option->get_group() == kNoEffectGroup) continue;
    throw UsageError(name, "the configuration comes from the log (--from-log); run without it to account for flags");
  }
}

study::TrainingShape training_shape(const RunConfig& c) {
  study::TrainingShape shape;
  shape.parallel = c.parallel;
  shape.micro_batch_size = c.train.micro_batch_size;
  shape.global_batch_size = static_cast<int>(c.train.global_batch_size);
  shape.recompute = c.train.recompute;
  shape.precision = c.train.precision;
  // Megatron-FSDP (issue 25): optim_grads_params is the study's FSDP (the published rows' switch;
  // Megatron-FSDP forces the distributed optimizer, which Megatron's formula then counts), optim
  // the distributed optimizer; optim_grads and optim_grads_params take their weights, grads and
  // optimizer lines from mt-train's units (study::TrainingShape::fsdp_units).
  if (c.parallel.use_megatron_fsdp) {
    const std::string& strategy = c.parallel.data_parallel_sharding_strategy;
    shape.fsdp = strategy == "optim_grads_params";
    shape.fsdp_units = c.parallel.shards_grads();
    shape.fsdp_prefetch = !c.parallel.no_fsdp_prefetch;
    shape.parallel.use_distributed_optimizer = strategy != "no_shard";
  }
  // As mt-train allocates its GEMM copy: bf16 bits where the run's table multiplies bf16 natively
  // (the CPU's table answers for --device cpu); GPU tensor cores take bf16 bits (a modelled
  // cluster needs no CUDA table in this build).
  shape.native_bf16_gemm = c.device == BackendDevice::cuda ||
                           backend::backend_ops(c.device).gemm_operand_type(Precision::bf16) == DType::bf16;
  return shape;
}

void refuse_cpu_device(const ReportFlags& f, const std::string& mode) {
  if (f.device && backend_device(f.device) == BackendDevice::cpu) {
    throw UsageError("--device cpu", mode + " models the cluster's GPUs (give --device cuda or leave it out)");
  }
}

std::vector<SweepPoint> sweep_points(const CLI::App& app, const std::vector<std::string>& argv,
                                     const std::vector<std::string>& sweeps) {
  std::vector<SweepPoint> points{{argv, ""}};
  std::set<std::string> swept;
  for (const std::string& sweep : sweeps) {
    const size_t eq = sweep.find('=');
    std::string name = sweep.substr(0, eq);
    if (eq == std::string::npos || name.empty()) throw UsageError("--sweep " + sweep, "give FLAG=a,b,c");
    if (name.rfind("--", 0) != 0) name = "--" + name;
    const CLI::Option* option = app.get_option_no_throw(name);
    if (!option || kNotSweepable.count(name) || option->get_group() == kNoEffectGroup) {
      throw UsageError("--sweep " + sweep, option ? "cannot be swept" : "no such flag");
    }
    if (!swept.insert(name).second) throw UsageError("--sweep " + sweep, "sweeps " + name + " twice");
    const std::vector<std::string> values = split_values(sweep.substr(eq + 1));
    std::vector<SweepPoint> next;
    for (const SweepPoint& point : points) {
      for (const std::string& value : values) {
        SweepPoint extended = point;
        if (!value.empty()) extended.argv.push_back(name + "=" + value);
        const std::string shown = name.substr(2) + "=" + (value.empty() ? "(unset)" : value);
        extended.label += (extended.label.empty() ? "" : " ") + shown;
        next.push_back(std::move(extended));
      }
    }
    if (next.size() > kMaxSweepPoints) {
      throw UsageError("--sweep", "more than " + std::to_string(kMaxSweepPoints) + " combinations");
    }
    points = std::move(next);
  }
  return points;
}

void parse_sweep_arguments(ToolCli& cli, const SweepPoint& point) {
  std::vector<const char*> args;
  for (const std::string& arg : point.argv) args.push_back(arg.c_str());
  try {
    cli.app().parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    throw UsageError("--sweep " + point.label, e.what());
  }
}

int write_report(const ToolCli& cli, const std::vector<Record>& records) {
  RecordWriter writer(cli.output_format());
  writer.write_run(run_record(cli));
  for (const Record& record : records) writer.write(record);
  return 0;
}

double gib_value(int64_t bytes) {
  return std::round(static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0) * 100) / 100;
}

std::vector<Record> plan_records(const ToolCli& cli, const ReportFlags& f) {
  static const std::vector<std::string> chosen = {
      "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
      "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--sequence-parallel",
      "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
      "--use-distributed-optimizer", "--micro-batch-size", "--recompute-granularity", "--recompute-method",
      "--recompute-num-layers"};
  refuse_given(cli.app(), chosen, "chosen by --plan (give the model, --world-size and --global-batch-size)");
  refuse_cpu_device(f, "--plan " + f.plan);
  if (!f.training.config.global_batch_size) {
    throw UsageError("--plan", "needs --global-batch-size (sequences per step)");
  }
  const model::ModelConfig model = report_model(f);
  // The whole model's closed-form floor over the cluster's GPUs first: the planner builds every
  // candidate's per-layer tables (issue 28 C2).
  perf::MemoryOptions floor_options;
  floor_options.precision = training_config(f.training).precision;
  perf::check_report_floor(model, floor_options, perf::available_memory_bytes(), f.world_size);
  study::PlanRequest request;
  request.gpus = f.world_size;
  request.cluster = f.plan;
  request.global_batch_size = static_cast<int>(f.training.config.global_batch_size);
  request.precision = training_config(f.training).precision;
  request.memory = f.memory_estimate == "megatron" ? study::MemoryEstimate::megatron : study::MemoryEstimate::mt;
  request.top = f.top;
  const study::PlanResult result = study::plan_layouts(model, request);
  std::vector<Record> records;
  int rank = 0;
  for (const study::PlanCandidate& c : result.best) {
    const study::TrainingShape& s = c.shape;
    const study::StepPrediction& p = c.prediction;
    const char* recompute = s.recompute.granularity == model::RecomputeGranularity::full        ? "full"
                            : s.recompute.granularity == model::RecomputeGranularity::selective ? "selective"
                                                                                                 : "none";
    records.push_back(Record{{"record", "plan"},
                             {"rank", ++rank},
                             {"tp", s.parallel.tensor_model_parallel_size},
                             {"pp", s.parallel.pipeline_model_parallel_size},
                             {"vp", s.parallel.virtual_pipeline_size(model.num_layers)},
                             {"cp", s.parallel.context_parallel_size},
                             {"ep", s.parallel.expert_model_parallel_size},
                             {"dp", s.parallel.data_parallel_size},
                             {"sp", s.parallel.sequence_parallel},
                             {"micro_batch_size", s.micro_batch_size},
                             {"recompute", recompute},
                             {"sharding", s.fsdp                                 ? "fsdp"
                                          : s.parallel.use_distributed_optimizer ? "distributed-optimizer"
                                                                                 : "none"},
                             {"peak_gib", gib_value(c.peak_bytes)},
                             {"step_seconds", p.step_seconds},
                             {"tokens_per_s", p.tokens_per_second},
                             {"mfu", c.mfu}});
  }
  records.push_back(Record{{"record", "plan_summary"},
                           {"model", model.name},
                           {"cluster", f.plan},
                           {"gpus", f.world_size},
                           {"global_batch_size", request.global_batch_size},
                           {"memory_estimate", f.memory_estimate},
                           {"layouts", result.enumerated},
                           {"fitting", result.fitting},
                           {"shown", static_cast<int64_t>(result.best.size())}});
  return records;
}

}  // namespace mt::tools
