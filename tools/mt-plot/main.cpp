// mt-plot: pictures of runs without TensorBoard or Python. `training` draws mt-train's step records
// (loss, learning rate, grad norm, tokens/s against iteration), one line per run, several runs
// overlaid (layouts side by side; a resumed run given as its logs in order, the last record of an
// iteration winning as in TensorBoard); `memory` draws mt-memreport --from-log's memory_check
// records as stacked bars by category, predicted beside measured, per pipeline stage. The SVG goes
// to --output (written under a temporary name, then renamed); stdout holds the run record and one
// `plot` record. Tested by tests/tools/mt-plot.bats, tests/unit/tools/test_svg_chart.cpp and
// tests/tools/conventions.bats.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/temporary_file.h"
#include "tools/common/tool_main.h"
#include "tools/mt-plot/svg_chart.h"

namespace {

using mt::tools::Record;

struct Options {
  CLI::App* training = nullptr;
  CLI::App* memory = nullptr;
  std::vector<std::string> runs;  // training: each FILE[,FILE...]
  std::vector<std::string> labels;
  std::string report;  // memory
  std::string output;
  std::string title;
};

// The JSON records of a JSONL file ("-": stdin); a line that is not a JSON object is an error
// naming the file and line.
std::vector<nlohmann::json> read_records(const std::string& path) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) throw mt::Error(path, "cannot open");
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::vector<nlohmann::json> records;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object()) {
      throw mt::UsageError(path + ":" + std::to_string(number), "not a JSON record");
    }
    records.push_back(std::move(record));
  }
  return records;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t comma; (comma = text.find(',', start)) != std::string::npos; start = comma + 1) {
    parts.push_back(text.substr(start, comma - start));
  }
  parts.push_back(text.substr(start));
  return parts;
}

double number_or_nan(const nlohmann::json& record, const char* key) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>() : std::nan("");
}

// One run's step records by iteration, from its logs in order (a resumed run's later log
// replaces the iterations it repeats).
std::map<int64_t, nlohmann::json> run_steps(const std::string& run) {
  std::map<int64_t, nlohmann::json> steps;
  for (const std::string& path : split_commas(run)) {
    if (path.empty()) throw mt::UsageError("run " + run, "an empty file name");
    for (nlohmann::json& record : read_records(path)) {
      if (record.value("record", "") != "step") continue;
      if (!record.contains("iteration") || !record["iteration"].is_number_integer()) {
        throw mt::UsageError(path, "a step record without an integer iteration");
      }
      const int64_t iteration = record["iteration"].get<int64_t>();
      steps[iteration] = std::move(record);
    }
  }
  if (steps.empty()) throw mt::UsageError("run " + run, "holds no step records (is it mt-train's JSONL?)");
  return steps;
}

std::string default_label(const std::string& run) {
  return std::filesystem::path(split_commas(run).front()).stem().string();
}

void write_svg(const std::string& path, const std::string& svg) {
  mt::TemporaryFile temporary(path);
  std::FILE* file = std::fopen(temporary.path().c_str(), "wb");
  if (!file) throw mt::Error(path, "cannot write");
  const bool written = std::fwrite(svg.data(), 1, svg.size(), file) == svg.size();
  if (std::fclose(file) != 0 || !written) throw mt::Error(path, "cannot write");
  temporary.commit();
}

int run_training(mt::tools::ToolCli& cli, const Options& o) {
  if (!o.labels.empty() && o.labels.size() != o.runs.size()) {
    throw mt::UsageError("--label", "give one per run (" + std::to_string(o.runs.size()) + " runs, " +
                                        std::to_string(o.labels.size()) + " labels)");
  }
  mt::check_writable("--output", o.output);
  struct Curve {
    const char* key;
    const char* title;
    const char* y_label;
  };
  const Curve curves[] = {{"lm_loss", "lm loss", "loss"},
                          {"lr", "learning rate", "learning rate"},
                          {"grad_norm", "grad norm", "grad norm"},
                          {"tokens_per_s", "tokens/s", "tokens per second"}};
  std::vector<mt::plot::LinePanel> panels;
  for (const Curve& c : curves) panels.push_back({c.title, "iteration", c.y_label, {}});
  int64_t points = 0;
  for (size_t r = 0; r < o.runs.size(); ++r) {
    const std::map<int64_t, nlohmann::json> steps = run_steps(o.runs[r]);
    const std::string label = o.labels.empty() ? default_label(o.runs[r]) : o.labels[r];
    for (size_t c = 0; c < panels.size(); ++c) {
      mt::plot::Series series{label, {}, {}};
      for (const auto& [iteration, record] : steps) {
        series.x.push_back(static_cast<double>(iteration));
        series.y.push_back(number_or_nan(record, curves[c].key));
      }
      points += static_cast<int64_t>(series.x.size());
      panels[c].series.push_back(std::move(series));
    }
  }
  write_svg(o.output, mt::plot::line_chart_svg(o.title.empty() ? "mt-train" : o.title, panels));
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  writer.write(Record{{"record", "plot"}, {"kind", "training"}, {"output", o.output}, {"runs", o.runs.size()},
                      {"panels", panels.size()}, {"points", points}});
  writer.finish();
  return 0;
}

int run_memory(mt::tools::ToolCli& cli, const Options& o) {
  mt::check_writable("--output", o.output);
  std::map<int, mt::plot::BarGroup> stages;
  std::map<int, std::pair<mt::plot::Bar, mt::plot::Bar>> bars;  // stage -> (predicted, measured)
  for (const nlohmann::json& record : read_records(o.report)) {
    if (record.value("record", "") != "memory_check") continue;
    for (const char* key : {"stage", "category", "predicted_bytes", "measured_bytes"}) {
      if (!record.contains(key)) throw mt::UsageError(o.report, std::string("a memory_check record without ") + key);
    }
    const int stage = record["stage"].get<int>();
    auto& [predicted, measured] = bars[stage];
    predicted.label = "predicted";
    measured.label = "measured";
    const std::string category = record["category"].get<std::string>();
    predicted.segments.push_back({category, record["predicted_bytes"].get<double>()});
    measured.segments.push_back({category, record["measured_bytes"].get<double>()});
    stages[stage].label = "stage " + std::to_string(stage) +
                          (record.contains("rank") ? ", rank " + std::to_string(record["rank"].get<int>()) : "");
  }
  if (bars.empty()) {
    throw mt::UsageError(o.report, "holds no memory_check records (give it mt-memreport --from-log's output)");
  }
  mt::plot::BarPanel panel{"memory per rank by category: predicted beside measured", "MiB", 1 << 20, {}};
  int64_t segments = 0;
  for (auto& [stage, pair] : bars) {
    mt::plot::BarGroup group = stages[stage];
    segments += static_cast<int64_t>(pair.first.segments.size() + pair.second.segments.size());
    group.bars = {pair.first, pair.second};
    panel.groups.push_back(std::move(group));
  }
  write_svg(o.output, mt::plot::bar_chart_svg(o.title.empty() ? "mt-memreport" : o.title, panel));
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  writer.write(Record{{"record", "plot"}, {"kind", "memory"}, {"output", o.output}, {"stages", panel.groups.size()},
                      {"segments", segments}});
  writer.finish();
  return 0;
}

void define(mt::tools::ToolCli& cli, Options& o) {
  CLI::App& app = cli.app();
  app.require_subcommand(0, 1);
  app.footer(
      "The SVG is plain (no scripts, no fonts beyond sans-serif); each panel carries its axis transform as data-*\n"
      "attributes. Exit codes: 0 ok, 1 unreadable input, 2 usage. Run mt-plot SUBCOMMAND --help for details.");
  o.training = app.add_subcommand("training", "mt-train's step records: loss, learning rate, grad norm, tokens/s");
  o.training->add_option("runs", o.runs, "One run per argument: FILE, or FILE,FILE,... for a resumed run's logs in order")
      ->required();
  o.training->add_option("--label", o.labels, "A legend label per run, in order (default: the first file's stem)");
  o.training->footer(
      "Several runs are overlaid (one colour each): layouts of one model, runs with other flags. A resumed run is its\n"
      "logs in order (first.jsonl,second.jsonl): the later log's record of an iteration wins. Non-finite values\n"
      "(a skipped step's grad norm) are left out of the line.");
  o.memory = app.add_subcommand("memory", "mt-memreport --from-log's memory_check records as stacked bars");
  o.memory->add_option("report", o.report, "mt-memreport --from-log's JSONL (- for stdin)")->required();
  for (CLI::App* command : {o.training, o.memory}) {
    command->add_option("--output,-o", o.output, "The SVG file to write")->required();
    command->add_option("--title", o.title, "The picture's title");
    cli.add_output_format(*command);
  }
}

int run(mt::tools::ToolCli& cli, const Options& o) {
  if (o.training->parsed()) return run_training(cli, o);
  if (o.memory->parsed()) return run_memory(cli, o);
  throw mt::UsageError("subcommand", "one of training, memory is required (see mt-plot --help)");
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  return mt::tools::tool_main(
      argc, argv, "mt-plot",
      "Draw mt-train's JSONL (loss, learning rate, grad norm, tokens/s against iteration; several runs overlaid) "
      "or mt-memreport's predicted and measured memory as an SVG; a plot record on stdout.",
      [&](mt::tools::ToolCli& cli) { define(cli, options); }, [&](mt::tools::ToolCli& cli) { return run(cli, options); });
}
