// mt-memreport: memory per rank by category (weights, grads and optimizer states from the layout
// table mt-train allocates from; activations, pipeline in-flight micro-batches, logits and
// communication buffers from the documented formula of study/memory_model.h) for mt-train's flags
// on --world-size ranks, Megatron's theoretical estimate beside it; from mt-train's JSONL
// (--from-log) the measured high-water marks beside the prediction and the error; the best layouts
// (--plan). Tested by tests/tools/mt-memreport.bats and tests/tools/conventions.bats.
#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "perf/memory.h"
#include "study/memory_model.h"
#include "train/trainer.h"
#include "tools/common/run_report.h"

namespace {

using mt::tools::Record;

struct MemreportOptions {
  mt::tools::ReportFlags report;
};

void define(mt::tools::ToolCli& cli, MemreportOptions& o) {
  cli.app().footer(
      "mt-train's flags describe the run (presets, Megatron spellings), plus --world-size ranks, so\n"
      "`mt-train ARGS` -> `mt-memreport ARGS --world-size N` works, also for layouts mt-train cannot run yet.\n"
      "Records (JSONL by default; bytes per rank):\n"
      "  memory           one per pipeline stage (every rank of a stage holds the same): weights (fp32\n"
      "                   master), gemm_weights (the bf16/fp16 copy), grads, optimizer (Adam's moments,\n"
      "                   sharded with --use-distributed-optimizer; with --use-megatron-fsdp and\n"
      "                   --data-parallel-sharding-strategy optim_grads_params weights, grads and moments\n"
      "                   are FSDP shards plus the root, two gathered layers and one layer's full grads;\n"
      "                   optim_grads shards grads and moments; expert tensors shard over expert-DP),\n"
      "                   activations kept by the in-flight\n"
      "                   micro-batches, recompute scratch, workspace, head (logits and loss, last stage),\n"
      "                   communication buffers, total. Activations follow docs/accounting.md's formula.\n"
      "  layer            what one layer keeps for backward per micro-batch, by part (recompute aside)\n"
      "  megatron_memory  Megatron's theoretical_memory_usage.py for the first stage, beside mt's\n"
      "  --from-log FILE|-: per pipeline stage, the memory record predicted for the log's run and memory_check\n"
      "                   records: per category (weights, grads, optimizer, activations, comm_buffers), the\n"
      "                   prediction, the high-water mark mt-train measured on the stage's most loaded rank\n"
      "                   (its memory records) and the relative error.\n"
      "  --plan CLUSTER:  the --top layouts of --world-size GPUs that fit (--memory-estimate mt|megatron).\n"
      "  --sweep FLAG=a,b,c (repeatable): every record once per combination, labelled in its sweep field;\n"
      "                   an empty value leaves the flag unset (recompute-granularity=,selective,full).");
  mt::tools::add_report_flags(cli, o.report, {"--peak-tflops", "--flops-convention", "--overlap-param-gather"},
                              "mt-train's backend, cpu (the default) or cuda; here it sets the bf16 GEMM copy: cpu as "
                              "this CPU's backend keeps it (bf16 bits where it multiplies bf16 natively, else "
                              "bf16-rounded fp32), cuda bf16 bits");
}

Record memory_record(const mt::study::RankMemory& m, int ranks_per_stage) {
  return Record{{"record", "memory"},
                {"stage", m.stage},
                {"ranks", ranks_per_stage},
                {"parameter_source", m.parameter_source},
                {"parameters", m.parameters},
                {"layers", m.layers},
                {"in_flight_microbatches", m.in_flight},
                {"weights_bytes", m.weights},
                {"gemm_weights_bytes", m.gemm_weights},
                {"grads_bytes", m.grads},
                {"optimizer_bytes", m.optimizer},
                {"activation_per_layer_bytes", m.activation_per_layer},
                {"activations_kept_bytes", m.activations_kept},
                {"activations_recompute_bytes", m.activations_recompute},
                {"workspace_bytes", m.workspace},
                {"head_bytes", m.head},
                {"activations_bytes", m.activations()},
                {"comm_buffers_bytes", m.comm_buffers},
                {"total_bytes", m.total()},
                {"total_gib", mt::tools::gib_value(m.total())}};
}

std::vector<Record> report_records(const mt::tools::RunConfig& config) {
  const mt::study::TrainingShape shape = mt::tools::training_shape(config);
  std::vector<Record> records;
  const int ranks_per_stage = config.world_size / shape.parallel.pipeline_model_parallel_size;
  for (const mt::study::RankMemory& stage : mt::study::predict_memory(config.model, shape)) {
    records.push_back(memory_record(stage, ranks_per_stage));
  }
  const mt::study::LayerActivations layer = mt::study::layer_activations(config.model, shape, 0);
  records.push_back(Record{{"record", "layer"},
                           {"residual_bytes", layer.residual},
                           {"norm_stats_bytes", layer.norm_stats},
                           {"attention_bytes", layer.attention},
                           {"core_attention_bytes", layer.core},
                           {"mlp_bytes", layer.mlp},
                           {"total_bytes", layer.bytes()}});
  const mt::study::MegatronMemory megatron = mt::study::megatron_theoretical_memory(config.model, shape);
  records.push_back(Record{{"record", "megatron_memory"},
                           {"stage", 0},
                           {"weights_and_optimizer_bytes", static_cast<int64_t>(megatron.weights_and_optimizer)},
                           {"activations_bytes", static_cast<int64_t>(megatron.activations)},
                           {"total_bytes", static_cast<int64_t>(megatron.total())},
                           {"total_gib", mt::tools::gib_value(static_cast<int64_t>(megatron.total()))}});
  return records;
}

// The largest value of `key` over `records`, -1 when none has it.
int64_t largest(const std::vector<Record>& records, const std::string& key) {
  int64_t peak = -1;
  for (const Record& record : records) {
    if (record.contains(key) && record[key].is_number_integer()) peak = std::max(peak, record[key].get<int64_t>());
  }
  return peak;
}

// A category compared: its name, the prediction and the key measuring it in a memory record and
// in a step record (empty: step records do not carry it).
struct Category {
  const char* name;
  int64_t predicted;
  const char* memory_key;
  const char* step_key;
};

// The log's run predicted stage by stage beside what mt-train measured there: its memory records
// (the last per stage: the summary's), or, in a log without them, the step records' high-water
// marks as the one stage's.
std::vector<Record> log_records(const mt::tools::TrainingLog& log) {
  const mt::tools::RunConfig config = mt::tools::run_config_from_log(log);
  const mt::study::TrainingShape shape = mt::tools::training_shape(config);
  const int stages = shape.parallel.pipeline_model_parallel_size;
  std::vector<std::vector<Record>> measured(static_cast<size_t>(stages));
  for (const Record& record : log.memory) {
    const int stage = record.value("stage", -1);
    if (stage < 0 || stage >= stages) {
      throw mt::UsageError("--from-log " + log.path, "a memory record names stage " + std::to_string(stage) +
                                                         " of a run with " + std::to_string(stages) + " pipeline stages");
    }
    measured[static_cast<size_t>(stage)] = {record};  // the last one wins
  }
  const bool from_steps = log.memory.empty();
  if (from_steps && stages > 1) {
    throw mt::UsageError("--from-log " + log.path, "holds no memory records (a pipeline run's stages need them)");
  }
  std::vector<Record> records;
  for (int stage = 0; stage < stages; ++stage) {
    const std::vector<Record>& mine = from_steps ? log.steps : measured[static_cast<size_t>(stage)];
    if (mine.empty()) {
      throw mt::UsageError("--from-log " + log.path, "holds no memory record of pipeline stage " + std::to_string(stage));
    }
    const mt::study::RankMemory predicted = mt::study::predict_rank_memory(config.model, shape, stage);
    records.push_back(memory_record(predicted, config.world_size / stages));
    // mt-train counts the GEMM copy under weights.
    const Category categories[] = {
        {"weights", predicted.weights + predicted.gemm_weights, "weights_bytes", "mem_weights_bytes"},
        {"grads", predicted.grads, "grads_bytes", "mem_grads_bytes"},
        {"optimizer", predicted.optimizer, "optim_bytes", "mem_optim_bytes"},
        {"activations", predicted.activations(), "activations_bytes", "mem_activations_bytes"},
        {"comm_buffers", predicted.comm_buffers, "comm_buffers_bytes", ""}};
    for (const Category& category : categories) {
      const std::string key = from_steps ? category.step_key : category.memory_key;
      if (key.empty()) continue;
      const int64_t bytes = largest(mine, key);
      if (bytes < 0) {
        throw mt::UsageError("--from-log " + log.path, std::string(from_steps ? "its step" : "its memory") +
                                                           " records lack " + key);
      }
      Record check{{"record", "memory_check"}, {"stage", stage}};
      if (!from_steps) check["rank"] = mine.front().value("rank", -1);
      check["category"] = category.name;
      check["predicted_bytes"] = category.predicted;
      check["measured_bytes"] = bytes;
      check["error"] = bytes > 0 ? static_cast<double>(category.predicted - bytes) / bytes : (category.predicted == 0 ? 0.0 : 1.0);
      records.push_back(std::move(check));
    }
  }
  return records;
}

// Every record of the invocation, computed before any is written, so bad input leaves stdout empty.
std::vector<Record> records_of(mt::tools::ToolCli& cli, MemreportOptions& parsed) {
  if (!parsed.report.from_log.empty()) {
    if (!parsed.report.sweeps.empty()) throw mt::UsageError("--sweep", "a log is one run (--from-log)");
    mt::tools::refuse_config_flags_with_log(cli.app(), {"--from-log", "--format", "--json"});
    const mt::tools::TrainingLog log = mt::tools::read_training_log(parsed.report.from_log);
    for (const std::string& warning : log.warnings) mt::log::warn("mt-memreport: " + warning);
    return log_records(log);
  }
  std::vector<Record> records;
  const std::function<void(mt::tools::ToolCli&, MemreportOptions&)> definer = define;
  for (auto& [o, label] : mt::tools::parse_sweep(cli, parsed, parsed.report.sweeps, definer)) {
    std::vector<Record> point;
    if (!o.report.plan.empty()) {
      point = mt::tools::plan_records(cli, o.report);
    } else {
      const mt::tools::RunConfig config = mt::tools::run_config_from_flags(o.report);
      for (const std::string& warning : config.warnings) mt::log::warn("mt-memreport: " + warning);
      // mt-train's closed-form floor first, before anything per layer is built (issue 28 C2).
      mt::perf::check_report_floor(config.model, mt::train::training_memory_options(config.train, config.parallel, 1, mt::backend::cpu_ops()),
                                   mt::perf::available_memory_bytes());
      point = report_records(config);
    }
    for (Record& record : point) {
      if (!label.empty()) record["sweep"] = label;
      records.push_back(std::move(record));
    }
  }
  return records;
}

}  // namespace

int main(int argc, char** argv) {
  MemreportOptions options;
  return mt::tools::tool_main(
      argc, argv, "mt-memreport",
      "Memory per rank by category for mt-train's flags on --world-size ranks, predicted exactly where mt-train "
      "allocates from a table and by a documented formula for activations; measured beside predicted from "
      "mt-train's JSONL (--from-log); the best layouts of a cluster (--plan).",
      [&](mt::tools::ToolCli& cli) { define(cli, options); },
      [&](mt::tools::ToolCli& cli) { return mt::tools::write_report(cli, records_of(cli, options)); });
}
