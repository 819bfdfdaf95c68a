// Published runs: CSV, self-consistency, predictions and the fit (see published_runs.h).
#include "study/published_runs.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "perf/parameters.h"
#include "study/rank_parameters.h"

namespace mt::study {

namespace {

// RFC 4180 records: fields separated by commas, optionally double-quoted ("" inside quotes).
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quoted) {
      if (ch == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (ch == '"') {
        quoted = false;
      } else {
        field += ch;
      }
      continue;
    }
    if (ch == '"') {
      quoted = true;
      any = true;
    } else if (ch == ',') {
      row.push_back(field);
      field.clear();
      any = true;
    } else if (ch == '\n' || ch == '\r') {
      if (ch == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) {
        row.push_back(field);
        rows.push_back(row);
      }
      row.clear();
      field.clear();
      any = false;
    } else {
      field += ch;
      any = true;
    }
  }
  if (quoted) throw Error("published runs CSV", "a quoted field is not closed");
  if (any || !field.empty()) {
    row.push_back(field);
    rows.push_back(row);
  }
  return rows;
}

std::optional<double> number(const std::string& cell, const std::string& where) {
  if (cell.empty()) return std::nullopt;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(cell, &used);
  } catch (const std::exception&) {
    throw Error(where, "'" + cell + "' is not a number");
  }
  if (used != cell.size() || !std::isfinite(value)) throw Error(where, "'" + cell + "' is not a number");
  return value;
}

int integer(const std::string& cell, const std::string& where, int fallback) {
  const auto value = number(cell, where);
  if (!value) return fallback;
  if (*value != std::floor(*value) || *value < 0) throw Error(where, "'" + cell + "' is not a count");
  return static_cast<int>(*value);
}

// "num_layers=40;hidden_size=5120": the shape fields a published run may change.
void apply_overrides(model::ModelConfig& m, const std::string& overrides, const std::string& where) {
  std::stringstream in(overrides);
  std::string item;
  while (std::getline(in, item, ';')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw Error(where, "override '" + item + "' is not name=value");
    const std::string key = item.substr(0, eq);
    const int value = integer(item.substr(eq + 1), where, 0);
    if (key == "num_layers") m.num_layers = value;
    else if (key == "hidden_size") m.hidden_size = value;
    else if (key == "ffn_hidden_size") m.ffn_hidden_size = value;
    else if (key == "num_attention_heads") m.num_attention_heads = value;
    else if (key == "num_query_groups") m.num_query_groups = value;
    else if (key == "seq_length") m.seq_length = m.max_position_embeddings = value;
    else if (key == "vocab_size") m.vocab_size = value;
    else throw Error(where, "unknown override '" + key + "'");
  }
}

const std::vector<std::string> kColumns = {
    "id", "source", "model", "model_overrides", "flops_per_token", "cluster", "gpus", "tp", "pp", "vp", "cp", "ep",
    "dp", "fsdp", "sp", "micro_batch", "global_batch", "seq_length", "first_last_stage_layers", "recompute",
    "distributed_optimizer", "fused_elementwise", "fsdp_reduce", "tp_embedding", "baseline", "reported_mfu", "reported_tflops_per_gpu", "reported_tokens_per_s",
    "reported_step_seconds", "reported_relative_step_time", "reported_speedup", "reported_scaling_efficiency",
    "convention", "peak_tflops", "verdict", "reason", "role", "assumptions", "predicted"};

// The run's FLOPs per token as its source counted them: with a published layout, the logits over
// the vocabulary Megatron pads to a multiple of --make-vocab-size-divisible-by x TP.
double flops_per_token_of(const PublishedRun& run) {
  if (run.flops_per_token) return *run.flops_per_token;
  if (!run.shape) return perf::flops_per_token(run.model, run.convention);
  return perf::flops_per_token(run.model, run.convention,
                         megatron_padded_vocab(run.model, run.shape->parallel.tensor_model_parallel_size));
}

bool has_model(const PublishedRun& run) { return run.model_name != "-" || run.flops_per_token.has_value(); }

const PublishedRun* find_run(const std::vector<PublishedRun>& all, const std::string& id) {
  for (const PublishedRun& run : all) {
    if (run.id == id) return &run;
  }
  return nullptr;
}

const Cluster& cluster_in(const std::vector<Cluster>& clusters, const std::string& name) {
  for (const Cluster& cluster : clusters) {
    if (cluster.name == name) return cluster;
  }
  return find_cluster(name);
}

}  // namespace

std::vector<PublishedRun> parse_published_runs(const std::string& csv_text) {
  const auto rows = parse_csv(csv_text);
  if (rows.empty() || rows[0] != kColumns) {
    throw Error("published runs CSV", "the header must be exactly: id,source,model,... (" +
                                          std::to_string(kColumns.size()) + " columns)");
  }
  std::vector<PublishedRun> runs;
  for (size_t r = 1; r < rows.size(); ++r) {
    const auto& cells = rows[r];
    const std::string where = "published runs CSV row " + std::to_string(r + 1);
    if (cells.size() != kColumns.size()) {
      throw Error(where, std::to_string(cells.size()) + " fields, the header has " + std::to_string(kColumns.size()));
    }
    std::map<std::string, std::string> c;
    for (size_t i = 0; i < kColumns.size(); ++i) c[kColumns[i]] = cells[i];
    PublishedRun run;
    run.id = c["id"];
    run.source = c["source"];
    run.model_name = c["model"];
    run.model_overrides = c["model_overrides"];
    run.cluster = c["cluster"];
    if (run.model_name != "-") {
      run.model = model::preset(run.model_name);
      apply_overrides(run.model, run.model_overrides, where);
      if (!c["seq_length"].empty()) run.model.seq_length = integer(c["seq_length"], where, 0);
      run.model.validate();
    }
    run.flops_per_token = number(c["flops_per_token"], where);
    run.gpus = integer(c["gpus"], where, 0);
    run.seq_length = integer(c["seq_length"], where, 0);
    run.global_batch = integer(c["global_batch"], where, 0);
    if (!c["tp"].empty() && run.model_name != "-") {
      TrainingShape shape;
      parallel::ParallelConfig& parallel = shape.parallel;
      parallel.tensor_model_parallel_size = integer(c["tp"], where, 1);
      parallel.pipeline_model_parallel_size = integer(c["pp"], where, 1);
      if (const int vp = integer(c["vp"], where, 1); vp > 1) parallel.num_virtual_stages_per_pipeline_rank = vp;
      parallel.context_parallel_size = integer(c["cp"], where, 1);
      parallel.expert_model_parallel_size = integer(c["ep"], where, 1);
      parallel.data_parallel_size = integer(c["dp"], where, 1);
      shape.fsdp = c["fsdp"] == "1";
      parallel.sequence_parallel = c["sp"] == "1";
      shape.micro_batch_size = integer(c["micro_batch"], where, 1);
      shape.global_batch_size = integer(c["global_batch"], where, 0);
      if (const int first_last = integer(c["first_last_stage_layers"], where, 0); first_last > 0) {
        parallel.decoder_first_pipeline_num_layers = parallel.decoder_last_pipeline_num_layers = first_last;
      }
      if (c["recompute"] == "full") shape.recompute.granularity = model::RecomputeGranularity::full;
      else if (c["recompute"] == "selective") shape.recompute.granularity = model::RecomputeGranularity::selective;
      else if (c["recompute"] != "none") throw Error(where, "recompute must be none, selective or full");
      parallel.use_distributed_optimizer = c["distributed_optimizer"] == "1";
      // How the run's software works where stacks differ (predict.h RunOptions); empty: as mt does.
      if (c["fused_elementwise"] == "0") run.options.fused_elementwise = false;
      else if (!c["fused_elementwise"].empty() && c["fused_elementwise"] != "1") throw Error(where, "fused_elementwise must be 1 or 0");
      if (c["fsdp_reduce"] == "step") run.options.fsdp_reduce_every_microbatch = false;
      else if (!c["fsdp_reduce"].empty() && c["fsdp_reduce"] != "microbatch") {
        throw Error(where, "fsdp_reduce must be microbatch or step");
      }
      if (!c["fsdp_reduce"].empty() && !shape.fsdp) throw Error(where, "fsdp_reduce is given without fsdp");
      if (c["tp_embedding"] == "replicated") run.options.tp_sharded_embedding = false;
      else if (!c["tp_embedding"].empty() && c["tp_embedding"] != "vocab-parallel") {
        throw Error(where, "tp_embedding must be vocab-parallel or replicated");
      }
      shape.precision = Precision::bf16;
      if (shape.world_size() != run.gpus) {
        throw Error(where, "TP x PP x CP x DP = " + std::to_string(shape.world_size()) + ", not the " +
                               std::to_string(run.gpus) + " GPUs");
      }
      shape.validate(run.model);
      run.shape = shape;
      run.global_batch = shape.global_batch();
    }
    run.baseline = c["baseline"];
    run.reported_mfu = number(c["reported_mfu"], where);
    run.reported_tflops_per_gpu = number(c["reported_tflops_per_gpu"], where);
    run.reported_tokens_per_s = number(c["reported_tokens_per_s"], where);
    run.reported_step_seconds = number(c["reported_step_seconds"], where);
    run.reported_relative_step_time = number(c["reported_relative_step_time"], where);
    run.reported_speedup = number(c["reported_speedup"], where);
    run.reported_scaling_efficiency = number(c["reported_scaling_efficiency"], where);
    run.convention = perf::parse_flops_convention(c["convention"]);
    run.peak_tflops = number(c["peak_tflops"], where).value_or(0);
    run.verdict = c["verdict"];
    run.reason = c["reason"];
    run.role = c["role"];
    run.assumptions = c["assumptions"];
    run.predicted = number(c["predicted"], where);
    runs.push_back(std::move(run));
  }
  return runs;
}

std::vector<PublishedRun> read_published_runs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, "cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return parse_published_runs(text.str());
}

Verdict check_self_consistency(const PublishedRun& run, const std::vector<PublishedRun>& all) {
  // Each pair: two figures of the row that must agree, the second worked out from the first.
  struct Pair {
    std::string what;
    double reported, implied;
  };
  std::vector<Pair> pairs;
  const double peak = run.peak_tflops * 1e12;
  const bool flops_known = has_model(run);
  const double fpt = flops_known ? flops_per_token_of(run) : 0;
  const double tokens_per_step = static_cast<double>(run.global_batch) * run.seq_length;
  const auto& mfu = run.reported_mfu;
  const auto& tflops = run.reported_tflops_per_gpu;
  const auto& tokens = run.reported_tokens_per_s;
  const auto& step = run.reported_step_seconds;
  if (mfu && tflops && peak > 0) pairs.push_back({"MFU from TFLOP/s per GPU", *mfu, *tflops * 1e12 / peak});
  if (mfu && tokens && flops_known && peak > 0) {
    pairs.push_back({"MFU from tokens/s", *mfu, *tokens / run.gpus * fpt / peak});
  }
  if (tflops && tokens && flops_known) {
    pairs.push_back({"TFLOP/s per GPU from tokens/s", *tflops, *tokens / run.gpus * fpt / 1e12});
  }
  if (step && tokens && tokens_per_step > 0) pairs.push_back({"tokens/s from the step time", *tokens, tokens_per_step / *step});
  if (step && tflops && tokens_per_step > 0 && flops_known) {
    pairs.push_back({"TFLOP/s per GPU from the step time", *tflops, tokens_per_step * fpt / *step / run.gpus / 1e12});
  }
  if (run.reported_relative_step_time && run.reported_speedup) {
    pairs.push_back({"speedup from the relative step time", *run.reported_speedup, 1 / *run.reported_relative_step_time});
  }
  const PublishedRun* base = run.baseline.empty() ? nullptr : find_run(all, run.baseline);
  if (base && run.reported_scaling_efficiency) {
    if (run.reported_speedup) {
      pairs.push_back({"efficiency from the speedup", *run.reported_scaling_efficiency,
                       *run.reported_speedup * base->gpus / run.gpus});
    }
    if (mfu && base->reported_mfu) {
      pairs.push_back({"efficiency from the MFUs", *run.reported_scaling_efficiency, *mfu / *base->reported_mfu});
    }
  }
  Verdict v;
  if (pairs.empty()) {
    v.verdict = "not-checkable";
    v.detail = "no two figures to compare";
    return v;
  }
  v.verdict = "consistent";
  double worst = -1;
  for (const Pair& pair : pairs) {
    const double error = std::fabs(pair.implied / pair.reported - 1);
    char text[200];
    std::snprintf(text, sizeof text, "%s: reported %.4g, implied %.4g (%+.1f%%)", pair.what.c_str(), pair.reported,
                  pair.implied, 100 * (pair.implied / pair.reported - 1));
    if (error > worst) {
      worst = error;
      v.detail = text;
    }
    if (error > 0.05) v.verdict = "inconsistent";
  }
  return v;
}

std::optional<Figure> compared_figure(const PublishedRun& run) {
  if (run.reported_tokens_per_s) return Figure{"tokens_per_s", *run.reported_tokens_per_s};
  if (run.reported_tflops_per_gpu) return Figure{"tflops_per_gpu", *run.reported_tflops_per_gpu};
  if (run.reported_mfu) return Figure{"mfu", *run.reported_mfu};
  if (run.reported_relative_step_time) return Figure{"relative_step_time", *run.reported_relative_step_time};
  if (run.reported_scaling_efficiency) return Figure{"scaling_efficiency", *run.reported_scaling_efficiency};
  return std::nullopt;
}

std::optional<double> predicted_figure(const PublishedRun& run, const std::vector<PublishedRun>& all,
                                       const PredictorConstants& constants, const std::vector<Cluster>& clusters) {
  const auto figure = compared_figure(run);
  if (!run.shape || !figure) return std::nullopt;
  auto predict = [&](const PublishedRun& r) {
    return predict_step(r.model, *r.shape, cluster_in(clusters, r.cluster), constants, r.options);
  };
  const StepPrediction p = predict(run);
  const double tokens_per_gpu = p.tokens_per_second / run.gpus;
  if (figure->name == "tokens_per_s") return p.tokens_per_second;
  if (figure->name == "tflops_per_gpu") return tokens_per_gpu * flops_per_token_of(run) / 1e12;
  if (figure->name == "mfu") return tokens_per_gpu * flops_per_token_of(run) / (run.peak_tflops * 1e12);
  const PublishedRun* base = find_run(all, run.baseline);
  if (!base || !base->shape) return std::nullopt;
  const StepPrediction b = predict(*base);
  if (figure->name == "relative_step_time") return p.step_seconds / b.step_seconds;
  // Scaling efficiency: MFU against the baseline's (per-GPU throughput for one model).
  const double mfu = tokens_per_gpu * flops_per_token_of(run) / (run.peak_tflops * 1e12);
  const double base_mfu = b.tokens_per_second / base->gpus * flops_per_token_of(*base) / (base->peak_tflops * 1e12);
  return mfu / base_mfu;
}

Fit fit_predictor(const std::vector<PublishedRun>& runs) {
  Fit fit;
  fit.constants = fitted_constants();
  fit.clusters = cluster_table();
  // Starting points away from the answer, so the fit is seen to find it.
  fit.constants.gemm_efficiency = 0.6;
  for (Cluster& cluster : fit.clusters) {
    for (const PublishedRun& run : runs) {
      if (run.cluster == cluster.name && run.role.rfind("fitted ", 0) == 0) {
        if (run.role == "fitted nvlink_gbps") cluster.nvlink_gbps = 100;
        if (run.role == "fitted network_gbps") cluster.network_gbps = 10;
      }
    }
  }
  auto error_of = [&](const PublishedRun& run) {
    const auto figure = compared_figure(run);
    const auto predicted = predicted_figure(run, runs, fit.constants, fit.clusters);
    if (!figure || !predicted) throw Error("fitted run " + run.id, "has no figure to fit on");
    return *predicted / figure->reported - 1;
  };
  // Predicted throughput rises with each constant, so bisection finds the zero of the error.
  auto solve = [&](const PublishedRun& run, double& value, double low, double high) {
    for (int i = 0; i < 60; ++i) {
      value = (low + high) / 2;
      (error_of(run) > 0 ? high : low) = value;
    }
  };
  for (int sweep = 0; sweep < 4; ++sweep) {
    fit.log.clear();
    for (const PublishedRun& run : runs) {
      char line[200];
      if (run.role == "fitted gemm_efficiency") {
        solve(run, fit.constants.gemm_efficiency, 0.3, 1.0);
        std::snprintf(line, sizeof line, "gemm_efficiency = %.4f from %s", fit.constants.gemm_efficiency, run.id.c_str());
      } else if (run.role == "fitted nvlink_gbps" || run.role == "fitted network_gbps") {
        for (Cluster& cluster : fit.clusters) {
          if (cluster.name != run.cluster) continue;
          const bool nvlink = run.role == "fitted nvlink_gbps";
          solve(run, nvlink ? cluster.nvlink_gbps : cluster.network_gbps, 1, 1000);
          std::snprintf(line, sizeof line, "%s %s = %.2f GB/s from %s", cluster.name.c_str(),
                        nvlink ? "nvlink_gbps" : "network_gbps", nvlink ? cluster.nvlink_gbps : cluster.network_gbps,
                        run.id.c_str());
        }
      } else {
        continue;
      }
      fit.log.push_back(line);
    }
  }
  return fit;
}

}  // namespace mt::study
