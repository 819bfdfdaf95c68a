// The grouped GEMM (--moe-grouped-gemm) against the loop over experts (Megatron's SequentialMLP):
// one forward and backward of a MoE layer's local experts (model/moe/experts.h) on the CPU table,
// each path timed in the same rounds (interleaved, which runs first alternating), medians of the
// milliseconds, and the ratio loop / grouped (above 1: the grouped GEMM is faster). Cases: every
// local expert receiving {0, 1, 7, 64, 1024} tokens, and one split of 8 x 64 tokens with 90% of
// them on one expert, at the widths of tiny-mixtral (hidden 64, expert ffn 128, 8 experts) and of
// the benchmark model (hidden 1024, expert ffn 3584, 8 experts), fp32 and bf16. The first lines
// name the CPU, the ISA level and the OpenMP threads. A benchmark, never a test: run by hand,
//   OMP_WAIT_POLICY=passive build/tests/mt_bench_grouped_gemm [--model tiny|bench|all]
//       [--rounds N] [--ffn F (the benchmark model's expert ffn)] [--max-tokens N]
// (tests/bench/bench_grouped_gemm.sh runs it with the environment it needs).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "kernels/cpu/isa.h"
#include "model/moe/experts.h"
#include "model/precision_gemm.h"

using namespace mt;
using namespace mt::model;

namespace {

struct Options {
  std::string model = "all";
  int rounds = 5;
  int64_t bench_ffn = 3584;
  int64_t max_tokens = 1024;
};

struct Widths {
  const char* name;
  int64_t hidden, ffn, experts;
};

// One routing of tokens onto the local experts.
struct Split {
  std::string name;
  std::vector<int64_t> counts;
};

std::vector<Split> splits(int64_t experts, int64_t max_tokens) {
  std::vector<Split> list;
  for (int64_t tokens : {0, 1, 7, 64, 1024}) {
    if (tokens > max_tokens) continue;
    list.push_back({std::to_string(tokens) + " per expert", std::vector<int64_t>(experts, tokens)});
  }
  const int64_t total = 64 * experts, hot = total * 9 / 10;
  Split skewed{"90% of " + std::to_string(total) + " on one", std::vector<int64_t>(experts, 0)};
  skewed.counts[0] = hot;
  for (int64_t e = 1, left = total - hot; e < experts; ++e) {
    skewed.counts[e] = left / (experts - e);
    left -= skewed.counts[e];
  }
  list.push_back(skewed);
  return list;
}

std::vector<float> uniform(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = dist(rng);
  return values;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

// The weights, inputs and buffers of one (widths, split, precision), shared by both paths.
struct Bench {
  const backend::Ops& ops = backend::cpu_ops();
  LocalExpertsShape shape;
  Precision precision;
  std::vector<int64_t> counts;
  int64_t rows = 0;
  std::vector<float> params, grads, x, probs, d_out, out, d_x, d_probs, saved_block, workspace_block;
  GemmWeights weights;

  Bench(const Widths& w, const Split& split, Precision p)
      : precision(p), counts(split.counts), weights(ops, p, 3 * w.experts * w.hidden * w.ffn) {
    shape = {w.experts, w.hidden, w.ffn, 0, 2 * w.ffn * w.hidden, 2 * w.experts * w.ffn * w.hidden, w.hidden * w.ffn};
    for (int64_t c : counts) rows += c;
    params = uniform(3 * w.experts * w.hidden * w.ffn, 1, 0.02f);
    grads.assign(params.size(), 0.0f);
    weights.refresh(params.data());
    x = uniform(rows * w.hidden, 2, 1.0f);
    probs = uniform(rows, 3, 1.0f);
    d_out = uniform(rows * w.hidden, 4, 1.0f);
    out.resize(x.size());
    d_x.resize(x.size());
    d_probs.resize(probs.size());
  }

  // Milliseconds of one forward and backward on `path`.
  double time(ExpertGemmPath path) {
    const LocalExperts experts(shape, path);
    saved_block.resize(experts.saved_floats(rows));
    workspace_block.resize(experts.workspace_floats(rows, precision));
    BufferSource saved_source(saved_block.data()), workspace_source(workspace_block.data());
    const ExpertsSaved saved = experts.lay_out_saved(saved_source, rows);
    const ExpertsWorkspace workspace = experts.lay_out_workspace(workspace_source, rows, precision);
    const ExpertsContext ctx{ops, ops.default_stream(), weights, params.data(), grads.data()};
    const ExpertRows in{x.data(), probs.data(), counts.data(), rows};
    const double start = now_ms();
    experts.forward(ctx, in, saved, workspace, out.data());
    experts.backward(ctx, in, saved, workspace, d_out.data(), d_x.data(), d_probs.data());
    return now_ms() - start;
  }
};

std::string cpu_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

void run(const Widths& w, const Options& options) {
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    for (const Split& split : splits(w.experts, options.max_tokens)) {
      Bench bench(w, split, precision);
      bench.time(ExpertGemmPath::loop);  // warm-up: oneDNN's first calls, the pages of every buffer
      bench.time(ExpertGemmPath::grouped);
      std::vector<double> loop, grouped;
      for (int round = 0; round < options.rounds; ++round) {
        const bool loop_first = round % 2 == 0;  // alternate, so neither path always runs on the other's caches
        if (!loop_first) grouped.push_back(bench.time(ExpertGemmPath::grouped));
        loop.push_back(bench.time(ExpertGemmPath::loop));
        if (loop_first) grouped.push_back(bench.time(ExpertGemmPath::grouped));
      }
      const double loop_ms = median(loop), grouped_ms = median(grouped);
      // Under a microsecond both paths only check their counts: no ratio worth printing.
      const std::string ratio =
          loop_ms < 1e-3 && grouped_ms < 1e-3 ? "-" : std::to_string(loop_ms / grouped_ms).substr(0, 4);
      std::printf("%-28s %-5s %-22s %12.3f %12.3f %8s\n", w.name, precision_name(precision), split.name.c_str(),
                  loop_ms, grouped_ms, ratio.c_str());
      std::fflush(stdout);
    }
  }
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_grouped_gemm: %s needs a value\n", flag.c_str());
      std::exit(2);
    }
    const char* value = argv[++i];
    if (flag == "--model") {
      options.model = value;
    } else if (flag == "--rounds") {
      options.rounds = std::max(1, std::atoi(value));
    } else if (flag == "--ffn") {
      options.bench_ffn = std::max(1, std::atoi(value));
    } else if (flag == "--max-tokens") {
      options.max_tokens = std::atoll(value);
    } else {
      std::fprintf(stderr, "bench_grouped_gemm: unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  if (options.model != "tiny" && options.model != "bench" && options.model != "all") {
    std::fprintf(stderr, "bench_grouped_gemm: --model is tiny, bench or all, not %s\n", options.model.c_str());
    std::exit(2);
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  std::printf("cpu: %s, isa %s, %d OpenMP threads, bf16 GEMM operands %s, medians of %d rounds\n", cpu_name().c_str(),
              kernels::isa_name(kernels::active_isa()), omp_get_max_threads(),
              dtype_name(backend::cpu_ops().gemm_operand_type(Precision::bf16)), options.rounds);
  std::printf("%-28s %-5s %-22s %12s %12s %8s\n", "widths", "prec", "tokens", "loop ms", "grouped ms", "ratio");
  const std::string bench_name = "bench (1024, " + std::to_string(options.bench_ffn) + ", 8)";
  const Widths tiny{"tiny-mixtral (64, 128, 8)", 64, 128, 8};
  const Widths bench{bench_name.c_str(), 1024, options.bench_ffn, 8};
  try {
    if (options.model != "bench") run(tiny, options);
    if (options.model != "tiny") run(bench, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_grouped_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
