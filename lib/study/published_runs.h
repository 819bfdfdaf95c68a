// Published throughput and MFU figures as data (data/perf/published_runs.csv): each run's
// configuration, its figures as reported, the FLOPs convention and peak its authors used, a
// self-consistency verdict (are the reported MFU, throughput and step time the same
// measurement under that convention and peak, within 5%?) and the predictor's figure beside it.
// The predictor's fitted constants come from the rows whose role is "fitted"; "held-out" rows
// test it. Tested in tests/unit/study/test_published_runs.cpp, which reads the CSV.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "perf/flops.h"
#include "study/memory_model.h"
#include "study/predict.h"

namespace mt::study {

// One row of the CSV; optional figures are empty cells.
struct PublishedRun {
  std::string id, source, model_name, model_overrides, cluster;
  model::ModelConfig model;              // the preset with its overrides applied
  std::optional<double> flops_per_token; // given when the shape is not published
  int gpus = 0;
  int seq_length = 0;    // tokens per sequence (0: not given)
  int global_batch = 0;  // sequences per step (0: not given)
  std::optional<TrainingShape> shape;    // empty when the source gives no layout to predict from
  RunOptions options;                    // fused element-wise work, when FSDP reduce-scatters, TP's embedding
  std::string baseline;                  // the row relative figures are relative to
  std::optional<double> reported_mfu, reported_tflops_per_gpu, reported_tokens_per_s, reported_step_seconds;
  std::optional<double> reported_relative_step_time, reported_speedup, reported_scaling_efficiency;
  perf::FlopsConvention convention = perf::FlopsConvention::megatron;
  double peak_tflops = 0;
  std::string verdict;  // consistent | inconsistent | not-checkable
  std::string reason, role, assumptions;
  std::optional<double> predicted;  // as stored in the CSV (see predicted_figure())
};

// Parses the CSV text (RFC 4180 quoting); throws mt::Error naming the line on a bad row.
std::vector<PublishedRun> parse_published_runs(const std::string& csv_text);
std::vector<PublishedRun> read_published_runs(const std::string& path);

// The self-consistency verdict worked out from the row's figures (the CSV's verdict must agree),
// with the figures that decided it.
struct Verdict {
  std::string verdict;
  std::string detail;
};
Verdict check_self_consistency(const PublishedRun& run, const std::vector<PublishedRun>& all);

// The figure a prediction is compared with: the first of tokens/s (whole run), TFLOP/s per
// GPU, MFU and relative step time the row reports.
struct Figure {
  std::string name;
  double reported = 0;
};
std::optional<Figure> compared_figure(const PublishedRun& run);
// The predictor's value of that figure (the same convention and peak as the source), or empty
// when the row has no layout to predict from.
std::optional<double> predicted_figure(const PublishedRun& run, const std::vector<PublishedRun>& all,
                                       const PredictorConstants& constants, const std::vector<Cluster>& clusters);

// The fit behind fitted_constants() and the fitted cluster entries: one constant per fitted row,
// each solved by bisection on the row where it dominates, swept until they settle (the large-GEMM
// efficiency on a single-GPU run, a cluster's NVLink on a TP run inside its nodes, its network on
// an FSDP run across nodes). Returns the constants and the clusters with fitted values.
struct Fit {
  PredictorConstants constants;
  std::vector<Cluster> clusters;
  std::vector<std::string> log;  // "gemm_efficiency = 0.80 from <run id>"
};
Fit fit_predictor(const std::vector<PublishedRun>& runs);

}  // namespace mt::study
