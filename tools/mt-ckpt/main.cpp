// mt-ckpt: look into and check mt's layout-independent HDF5 checkpoints (lib/io/checkpoint.h).
//   inspect PATH  a `checkpoint` record (iteration, counters, loss scaler, seed, configs) and one
//                 `tensor` record per tensor (name, shape, dtype, bytes, stored checksum)
//   verify PATH   recomputes every checksum, scans for NaN/Inf and checks the tensors against the
//                 stored model config (every parameter, and the Adam moments when saved, with its
//                 global shape; nothing else): one `tensor` record each and a `verify` summary;
//                 exit 3 when a check fails
// PATH is a checkpoint file or a --save directory (the iteration its tracker names). Tested by
// tests/tools/mt-ckpt.bats and tests/tools/conventions.bats.
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/layout.h"
#include "tools/common/tool_main.h"

namespace {

using mt::tools::Record;

struct Options {
  std::string path;
  CLI::App* inspect = nullptr;
  CLI::App* verify = nullptr;
};

// A checkpoint file, or the one a --save directory's tracker names.
std::string checkpoint_file(const std::string& path) {
  if (!std::filesystem::is_directory(path)) return path;
  const std::optional<int64_t> iteration = mt::io::read_tracker(path);
  if (!iteration) throw mt::Error(path, "holds no " + mt::io::tracker_path(path) + " (give a checkpoint file)");
  return mt::io::checkpoint_path(path, *iteration);
}

nlohmann::json parsed(const std::string& text, const std::string& path, const char* field) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw mt::Error(path, std::string("attribute ") + field + " is not JSON");
  }
}

Record checkpoint_record(const mt::io::CheckpointReader& reader) {
  const mt::io::CheckpointState& s = reader.state();
  return Record{{"record", "checkpoint"},
                {"path", reader.path()},
                {"format_version", s.format_version},
                {"iteration", s.iteration},
                {"consumed_train_samples", s.consumed_train_samples},
                {"consumed_valid_samples", s.consumed_valid_samples},
                {"skipped_iterations", s.skipped_iters},
                {"nan_iterations", s.nan_iters},
                {"loss_scale", s.loss_scale},
                {"loss_scale_growth_tracker", s.loss_scale_growth_tracker},
                {"loss_scale_hysteresis_tracker", s.loss_scale_hysteresis_tracker},
                {"seed", s.seed},
                {"resumable", s.resumable},
                {"optimizer", s.has_optimizer},
                {"optimizer_step", s.has_optimizer ? Record(s.optimizer_step) : Record(nullptr)},
                {"bytes", static_cast<int64_t>(std::filesystem::file_size(reader.path()))},
                {"model", parsed(s.model_config, reader.path(), "model_config")},
                {"parallel", parsed(s.parallel_config, reader.path(), "parallel_config")},
                {"train", parsed(s.train_config, reader.path(), "train_config")}};
}

Record tensor_record(const mt::io::TensorInfo& t) {
  int64_t elements = 1;
  for (int64_t d : t.shape) elements *= d;
  return Record{{"record", "tensor"},
                {"name", t.name},
                {"shape", t.shape},
                {"dtype", t.dtype},
                {"elements", elements},
                {"bytes", t.bytes},
                {"checksum", t.checksum ? Record(mt::io::checksum_text(*t.checksum)) : Record(nullptr)}};
}

int run_inspect(mt::tools::ToolCli& cli, const std::string& path) {
  const mt::io::CheckpointReader reader(checkpoint_file(path));
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  writer.write(checkpoint_record(reader));
  for (const mt::io::TensorInfo& tensor : reader.tensors()) writer.write(tensor_record(tensor));
  writer.finish();
  return 0;
}

// The tensors the stored model config says a checkpoint holds, with their global shapes.
std::map<std::string, std::vector<int64_t>> expected_tensors(const mt::io::CheckpointReader& reader) {
  mt::model::ModelConfig model;
  try {
    model = mt::model::config_from_json(parsed(reader.state().model_config, reader.path(), "model_config"));
  } catch (const mt::Error& e) {
    throw mt::Error(reader.path(), std::string("attribute model_config: ") + e.what());
  }
  std::map<std::string, std::vector<int64_t>> expected;
  for (const mt::model::ParamEntry& entry : mt::model::build_layout(model).entries) {
    if (entry.replica != 0) continue;
    expected["model/" + entry.name] = entry.global_shape;
    if (reader.state().has_optimizer) {
      expected["optimizer/exp_avg/" + entry.name] = entry.global_shape;
      expected["optimizer/exp_avg_sq/" + entry.name] = entry.global_shape;
    }
  }
  return expected;
}

int run_verify(mt::tools::ToolCli& cli, const std::string& path) {
  const mt::io::CheckpointReader reader(checkpoint_file(path));
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  std::map<std::string, std::vector<int64_t>> expected = expected_tensors(reader);
  int64_t failed = 0, checked = 0;
  std::string first_problem;
  auto fail = [&](const std::string& name, const std::string& problem) {
    if (failed++ == 0) first_problem = name + ": " + problem;
  };
  for (const mt::io::TensorInfo& tensor : reader.tensors()) {
    ++checked;
    Record record = tensor_record(tensor);
    std::vector<std::string> problems;
    const auto wanted = expected.find(tensor.name);
    if (wanted == expected.end()) {
      problems.push_back("not a tensor of the stored model");
    } else {
      if (wanted->second != tensor.shape) problems.push_back("shape differs from the stored model config's");
      expected.erase(wanted);
    }
    if (tensor.dtype != "float32") problems.push_back("dtype " + tensor.dtype + ", expected float32");
    if (!tensor.checksum) problems.push_back("no checksum attribute");
    if (tensor.dtype == "float32") {
      const mt::io::CheckpointReader::Scan scan = reader.scan(tensor);
      record["checksum_computed"] = mt::io::checksum_text(scan.checksum);
      record["nonfinite"] = scan.nonfinite;
      if (tensor.checksum && scan.checksum != *tensor.checksum) problems.push_back("checksum mismatch");
      if (scan.nonfinite > 0) problems.push_back(std::to_string(scan.nonfinite) + " NaN/Inf values");
    }
    record["ok"] = problems.empty();
    std::string joined;
    for (const std::string& problem : problems) joined += (joined.empty() ? "" : "; ") + problem;
    record["problem"] = problems.empty() ? Record(nullptr) : Record(joined);
    if (!problems.empty()) fail(tensor.name, joined);
    writer.write(record);
  }
  for (const auto& [name, shape] : expected) {
    writer.write(Record{{"record", "tensor"}, {"name", name}, {"ok", false}, {"problem", "missing"}});
    fail(name, "missing");
  }
  writer.write(Record{{"record", "verify"},
                      {"path", reader.path()},
                      {"iteration", reader.state().iteration},
                      {"tensors", checked},
                      {"failed", failed},
                      {"ok", failed == 0}});
  writer.finish();
  if (failed == 0) return 0;
  mt::log::info("mt-ckpt: verify: " + reader.path() + ": " + std::to_string(failed) + " check(s) failed, first " +
                first_problem);
  return 3;
}

void define(mt::tools::ToolCli& cli, Options& o) {
  CLI::App& app = cli.app();
  app.require_subcommand(0, 1);
  app.footer(
      "PATH is a checkpoint file (DIR/iter_NNNNNNN/checkpoint.h5, or a --save-final file) or a --save directory\n"
      "(the iteration its latest_checkpointed_iteration.txt names). The file's layout is in docs/DESIGN.md; h5py\n"
      "reads every tensor by name (f['model/<name>'], f['optimizer/exp_avg/<name>']).\n"
      "Exit codes: 0 ok, 1 unreadable or not an mt checkpoint, 2 usage, 3 verify found a problem.\n"
      "Not built yet: diff, convert, export/import of Hugging Face safetensors.");
  o.inspect = app.add_subcommand("inspect", "Records of the checkpoint (state, configs) and of each tensor");
  o.verify = app.add_subcommand(
      "verify", "Recompute every checksum, scan for NaN/Inf, check tensors against the stored model config (exit 3)");
  for (CLI::App* command : {o.inspect, o.verify}) {
    command->add_option("path", o.path, "Checkpoint file or --save directory")->required();
    cli.add_output_format(*command);
  }
}

int run(mt::tools::ToolCli& cli, Options& o) {
  if (o.inspect->parsed()) return run_inspect(cli, o.path);
  if (o.verify->parsed()) return run_verify(cli, o.path);
  throw mt::UsageError("subcommand", "inspect or verify is required (see mt-ckpt --help)");
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  return mt::tools::tool_main(
      argc, argv, "mt-ckpt", "Inspect and verify mt's layout-independent HDF5 checkpoints; JSONL records on stdout.",
      [&](mt::tools::ToolCli& cli) { define(cli, options); }, [&](mt::tools::ToolCli& cli) { return run(cli, options); });
}
