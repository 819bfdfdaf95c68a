// mt-mfu: model FLOPs per step, TFLOP/s per device and MFU of a configuration, from mt-train's
// flags plus --step-time, or from mt-train's JSONL (--from-log), under a selectable FLOPs
// convention against a dense peak (--peak-tflops, --peak-device, or with --device cpu, the
// default, this CPU's FMA probe); the step time and MFU predicted on a named cluster (--predict)
// and the best layouts (--plan).
// Tested by tests/tools/mt-mfu.bats and tests/tools/conventions.bats.
#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "perf/flops.h"
#include "study/predict.h"
#include "tools/common/peak_source.h"
#include "tools/common/run_report.h"

namespace {

using mt::tools::Record;

struct MfuOptions {
  mt::tools::ReportFlags report;
  std::optional<double> step_time;
  std::string peak_device;
  std::string predict;
};

void define(mt::tools::ToolCli& cli, MfuOptions& o) {
  CLI::App& app = cli.app();
  app.footer(
      "mt-train's flags describe the run (presets, Megatron spellings), plus --world-size ranks, so\n"
      "`mt-train ARGS` -> `mt-mfu ARGS --world-size N --step-time S` works. Records (JSONL by default):\n"
      "  mfu        FLOPs per step (the convention's model FLOPs and the hardware FLOPs with recompute),\n"
      "             and with --step-time: tokens/s, tflops_per_device = FLOPs / (step time x world size)\n"
      "             as Megatron's 'throughput per GPU', MFU = model FLOPs / (step time x peak x world size),\n"
      "             HFU likewise with the hardware FLOPs; on this CPU the GEMM efficiency (the 2048^3 GEMM\n"
      "             rate / the FMA-probe peak) is reported beside, never as the peak.\n"
      "  The peak: --peak-tflops, else --peak-device NAME (a GPU model of the dense peak table: h100, a100,\n"
      "             ...), else this CPU's FMA probe. --device names mt-train's backend (cpu, cuda), never a\n"
      "             GPU model: --device cuda needs one of the first two, --device cpu takes the probe.\n"
      "  --from-log FILE|-: one mfu record per step record of mt-train's JSONL (its run record gives the\n"
      "             configs, world size and peak) and an mfu_summary over the steps after the first.\n"
      "  --predict CLUSTER: a prediction record (study/predict.h; clusters in docs/accounting.md).\n"
      "  --plan CLUSTER: the --top layouts of --world-size GPUs, fastest first (plan records), and a\n"
      "             plan_summary; --format table prints them as a table.\n"
      "  --sweep FLAG=a,b,c (repeatable): every record once per combination, labelled in its sweep field.\n"
      "Conventions (--flops-convention): megatron (Megatron-LM's num_floating_point_operations, the default),\n"
      "megatron-2024, narayanan, 6N, 6N+12LCT, 6N+6LCT; formulas in docs/accounting.md.");
  mt::tools::add_report_flags(cli, o.report, {},
                              "mt-train's backend, cpu (the default) or cuda; here it picks the peak of --step-time: "
                              "cpu this CPU's FMA probe, cuda needs --peak-device or --peak-tflops (FLOPs do not "
                              "depend on it)");
  const std::string group = "Report";
  mt::tools::add_flag(app, "--step-time", o.step_time)->group(group);
  mt::tools::add_flag(app, "--peak-device", o.peak_device)->group(group);
  mt::tools::add_flag(app, "--predict", o.predict)->group(group);
}

// FLOPs of one step of `config` under `convention`, with the throughput fields when the step time
// and peak are known.
Record mfu_record(const mt::tools::RunConfig& config, mt::perf::FlopsConvention convention,
                  std::optional<double> step_seconds, const mt::tools::PeakSource* peak) {
  const mt::model::ModelConfig& model = config.model;
  const mt::study::TrainingShape shape = mt::tools::training_shape(config);
  const double sequences = shape.global_batch();
  const double tokens = sequences * model.seq_length;
  const double flops = mt::perf::model_flops(model, sequences, convention).total();
  const int layers_per_chunk = model.num_layers / (shape.parallel.pipeline_model_parallel_size *
                                                   shape.parallel.virtual_pipeline_size(model.num_layers));
  const double hardware = mt::perf::hardware_flops(model, sequences, shape.recompute, std::max(1, layers_per_chunk));
  Record record{{"record", "mfu"},
                {"model", model.name},
                {"world_size", config.world_size},
                {"global_batch_size", shape.global_batch()},
                {"seq_length", model.seq_length},
                {"precision", mt::precision_name(shape.precision)},
                {"flops_convention", mt::perf::convention_name(convention)},
                {"flops_per_token", flops / tokens},
                {"model_flops_per_step", flops},
                {"hardware_flops_per_step", hardware}};
  if (!step_seconds) return record;
  const double world_peak = peak->flops_per_device * config.world_size;
  record["step_ms"] = *step_seconds * 1e3;
  record["tokens_per_s"] = tokens / *step_seconds;
  record["tflops_per_device"] = mt::perf::tflops_per_device(flops, *step_seconds, config.world_size);
  record["mfu"] = mt::perf::model_flops_utilization(flops, *step_seconds, world_peak);
  record["hfu"] = mt::perf::model_flops_utilization(hardware, *step_seconds, world_peak);
  mt::tools::add_peak_fields(record, *peak);
  return record;
}

// A model FLOPs utilisation above 1 (or one too large for a double) cannot be: the step time or the
// peak is wrong. The record is still printed, with a warning naming both.
void warn_if_impossible(const Record& record) {
  const Record& mfu = record.at("mfu");
  if (mfu.is_number() && mfu.get<double>() <= 1.0) return;
  mt::log::warn("mt-mfu: mfu " + mfu.dump() + " exceeds 1: a step of " + record.at("step_ms").dump() +
                " ms at a peak of " + record.at("peak_tflops").dump() +
                " TFLOP/s per device is impossible; check the step time and the peak");
}

// The peak of a run on this machine's CPU (each rank's cores) unless a flag names one: a backend of
// cuda needs one named, and a named accelerator contradicts --device cpu.
mt::tools::PeakSource flags_peak(const MfuOptions& o, mt::Precision precision) {
  const mt::tools::BackendDevice device = mt::tools::backend_device(o.report.device);
  const bool named = o.report.training.peak_tflops || !o.peak_device.empty();
  if (device == mt::tools::BackendDevice::cuda && !named) {
    throw mt::UsageError("--device cuda", "a peak needs --peak-device NAME or --peak-tflops (the FMA probe measures "
                                          "this CPU)");
  }
  if (o.report.device && device == mt::tools::BackendDevice::cpu && !o.peak_device.empty()) {
    throw mt::UsageError("--peak-device " + o.peak_device,
                         "contradicts --device cpu (the CPU's peak is its FMA probe)");
  }
  return mt::tools::resolve_peak(o.report.training.peak_tflops, o.peak_device, precision,
                                 mt::default_threads_per_rank());
}

Record prediction_record(const mt::tools::RunConfig& config, mt::perf::FlopsConvention convention,
                         const std::string& cluster_name) {
  const mt::study::Cluster& cluster = mt::study::find_cluster(cluster_name);
  const mt::study::TrainingShape shape = mt::tools::training_shape(config);
  // Megatron-FSDP's optim_grads (issue 25): its memory is mt-memreport's; its time is not modelled.
  if (shape.fsdp_units && !shape.fsdp) {
    throw mt::UsageError("--data-parallel-sharding-strategy optim_grads",
                         "not modelled by the time prediction yet (its per-micro-batch reduce-scatters); give "
                         "optim_grads_params, optim or no_shard");
  }
  mt::study::RunOptions options;
  options.overlap_grad_reduce = config.parallel.overlap_grad_reduce;
  options.overlap_param_gather = config.parallel.overlap_param_gather;
  if (config.parallel.ddp_bucket_size) options.bucket_elements = *config.parallel.ddp_bucket_size;
  const mt::study::StepPrediction p =
      mt::study::predict_step(config.model, shape, cluster, mt::study::fitted_constants(), options);
  const double flops = mt::perf::model_flops(config.model, shape.global_batch(), convention).total();
  const mt::perf::Device& device = mt::perf::find_device(cluster.device);
  const double peak = mt::perf::device_peak_flops(device, shape.precision == mt::Precision::fp32 ? "fp32" : "bf16");
  return Record{{"record", "prediction"},
                {"model", config.model.name},
                {"cluster", cluster.name},
                {"device", device.name},
                {"world_size", p.world_size},
                {"flops_convention", mt::perf::convention_name(convention)},
                {"step_ms", p.step_seconds * 1e3},
                {"tokens_per_s", p.tokens_per_second},
                {"tflops_per_device", mt::perf::tflops_per_device(flops, p.step_seconds, config.world_size)},
                {"mfu", mt::perf::model_flops_utilization(flops, p.step_seconds, peak * config.world_size)},
                {"slowest_stage", p.slowest_stage},
                {"gemm_ms", p.gemm * 1e3},
                {"attention_ms", p.attention * 1e3},
                {"elementwise_ms", p.elementwise * 1e3},
                {"tp_comm_ms", p.tp_comm * 1e3},
                {"cp_comm_ms", p.cp_comm * 1e3},
                {"ep_comm_ms", p.ep_comm * 1e3},
                {"pp_comm_ms", p.pp_comm * 1e3},
                {"dp_comm_ms", p.dp_comm * 1e3},
                {"bubble_ms", p.bubble * 1e3},
                {"optimizer_ms", p.optimizer * 1e3}};
}

// One mfu record per step of the log and their summary over the steady steps (after the first).
std::vector<Record> log_records(mt::tools::ToolCli& cli, const MfuOptions& o) {
  std::vector<Record> records;
  const mt::tools::TrainingLog log = mt::tools::read_training_log(o.report.from_log);
  for (const std::string& warning : log.warnings) mt::log::warn("mt-mfu: " + warning);
  const mt::tools::RunConfig config = mt::tools::run_config_from_log(log);
  const mt::perf::FlopsConvention convention =
      cli.app().count("--flops-convention") > 0 ? mt::perf::parse_flops_convention(o.report.training.flops_convention)
                                                : config.train.flops_convention;
  mt::tools::PeakSource peak;
  if (o.report.training.peak_tflops || !o.peak_device.empty()) {
    peak = flags_peak(o, config.train.precision);
  } else if (log.run.contains("peak_tflops") && log.run["peak_tflops"].is_number()) {
    peak.flops_per_device = log.run["peak_tflops"].get<double>() * 1e12;
    peak.source = "the log: " + log.run.value("peak_source", std::string("mt-train's"));
    if (log.run.contains("gemm_tflops")) peak.gemm_flops = log.run["gemm_tflops"].get<double>() * 1e12;
  } else {
    throw mt::UsageError("--from-log " + log.path,
                         "its run record has no peak_tflops: give --peak-tflops or --peak-device");
  }
  std::vector<double> steady_ms;
  for (const Record& step : log.steps) {
    const double ms = step.at("step_ms").get<double>();
    Record record = mfu_record(config, convention, ms / 1e3, &peak);
    record["iteration"] = step.at("iteration");
    if (step.contains("mfu")) record["mt_train_mfu"] = step["mfu"];
    records.push_back(record);
    if (step.at("iteration").get<int64_t>() > log.steps.front().at("iteration").get<int64_t>()) steady_ms.push_back(ms);
  }
  if (steady_ms.empty()) steady_ms.push_back(log.steps.front().at("step_ms").get<double>());
  const double mean_ms = std::accumulate(steady_ms.begin(), steady_ms.end(), 0.0) / static_cast<double>(steady_ms.size());
  Record summary = mfu_record(config, convention, mean_ms / 1e3, &peak);
  summary["record"] = "mfu_summary";
  summary["steps_averaged"] = steady_ms.size();
  warn_if_impossible(summary);
  records.push_back(summary);
  return records;
}

// Every record of the invocation, computed before any is written, so bad input leaves stdout empty.
std::vector<Record> records_of(mt::tools::ToolCli& cli, MfuOptions& parsed) {
  std::vector<Record> records;
  if (!parsed.report.from_log.empty()) {
    if (!parsed.report.sweeps.empty()) throw mt::UsageError("--sweep", "a log is one run (--from-log)");
    mt::tools::refuse_config_flags_with_log(cli.app(), {"--from-log", "--format", "--json", "--peak-tflops",
                                                        "--flops-convention", "--peak-device"});
    return log_records(cli, parsed);
  }
  const std::function<void(mt::tools::ToolCli&, MfuOptions&)> definer = define;
  for (auto& [o, label] : mt::tools::parse_sweep(cli, parsed, parsed.report.sweeps, definer)) {
    auto labelled = [&label = label](Record record) {
      if (!label.empty()) record["sweep"] = label;
      return record;
    };
    if (!o.report.plan.empty()) {
      mt::tools::refuse_given(cli.app(), {"--step-time", "--predict"}, "a --plan ranks layouts by prediction");
      for (const Record& record : mt::tools::plan_records(cli, o.report)) records.push_back(labelled(record));
      continue;
    }
    const mt::tools::RunConfig config = mt::tools::run_config_from_flags(o.report);
    for (const std::string& warning : config.warnings) mt::log::warn("mt-mfu: " + warning);
    const mt::perf::FlopsConvention convention = mt::perf::parse_flops_convention(o.report.training.flops_convention);
    if (!o.predict.empty()) {
      mt::tools::refuse_given(cli.app(), {"--peak-device", "--peak-tflops"}, "the --predict cluster names its device");
      mt::tools::refuse_cpu_device(o.report, "--predict " + o.predict);
      records.push_back(labelled(prediction_record(config, convention, o.predict)));
    }
    if (o.step_time) {
      const mt::tools::PeakSource peak = flags_peak(o, config.train.precision);
      records.push_back(labelled(mfu_record(config, convention, o.step_time, &peak)));
      warn_if_impossible(records.back());
    } else if (o.predict.empty()) {
      mt::tools::refuse_given(cli.app(), {"--peak-device", "--peak-tflops"}, "a peak needs --step-time");
      records.push_back(labelled(mfu_record(config, convention, std::nullopt, nullptr)));
    }
  }
  return records;
}

}  // namespace

int main(int argc, char** argv) {
  MfuOptions options;
  return mt::tools::tool_main(
      argc, argv, "mt-mfu",
      "Model FLOPs per step, TFLOP/s per device and MFU of a run from mt-train's flags plus --step-time, or from "
      "mt-train's JSONL (--from-log); predicted on a cluster (--predict) and the best layouts (--plan).",
      [&](mt::tools::ToolCli& cli) { define(cli, options); },
      [&](mt::tools::ToolCli& cli) { return mt::tools::write_report(cli, records_of(cli, options)); });
}
