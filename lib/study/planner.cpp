// The layout planner (see planner.h).
#include "study/planner.h"

#include <algorithm>

#include "core/error.h"
#include "perf/flops.h"
#include "perf/peak.h"

namespace mt::study {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> list;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) list.push_back(d);
  }
  return list;
}

int64_t peak_bytes(const model::ModelConfig& m, const TrainingShape& shape, MemoryEstimate estimate) {
  if (estimate == MemoryEstimate::megatron) return static_cast<int64_t>(megatron_theoretical_memory(m, shape).total());
  // The first stage keeps the most micro-batches in flight, the last holds the logits; the
  // middle ones hold less than either.
  int64_t peak = predict_rank_memory(m, shape, 0).total();
  const int last = shape.parallel.pipeline_model_parallel_size - 1;
  if (last > 0) peak = std::max(peak, predict_rank_memory(m, shape, last).total());
  return peak;
}

}  // namespace

PlanResult plan_layouts(const model::ModelConfig& m, const PlanRequest& request) {
  m.validate();
  const Cluster& cluster = find_cluster(request.cluster);
  const perf::Device& device = perf::find_device(cluster.device);
  if (request.gpus < 1) throw UsageError("--world-size", "must be at least 1");
  if (request.global_batch_size < 1) throw UsageError("--global-batch-size", "must be at least 1");
  const double budget = request.memory_bytes > 0 ? request.memory_bytes : device.memory_gib * 1024 * 1024 * 1024;
  const double peak_flops = perf::device_peak_flops(device, request.precision == Precision::fp32 ? "fp32" : "bf16");
  using model::RecomputeGranularity;

  PlanResult result;
  std::vector<PlanCandidate> fitting;
  for (int tp = 1; tp <= std::min(request.gpus, cluster.gpus_per_node); tp *= 2) {
    for (int pp : divisors(request.gpus / tp)) {
      if (m.num_layers % pp != 0) continue;
      for (int vp = 1; vp <= (pp > 1 ? request.max_virtual_stages : 1); ++vp) {
        if (m.num_layers % (pp * vp) != 0) continue;
        for (int cp = 1; tp * pp * cp <= request.gpus; cp *= 2) {
          if (request.gpus % (tp * pp * cp) != 0) continue;
          const int dp = request.gpus / (tp * pp * cp);
          const std::vector<int> eps = m.num_experts > 0 ? divisors(m.num_experts) : std::vector<int>{1};
          for (int ep : eps) {
            for (int mbs : request.micro_batch_sizes) {
              for (RecomputeGranularity recompute :
                   {RecomputeGranularity::none, RecomputeGranularity::selective, RecomputeGranularity::full}) {
                for (int sharding = 0; sharding < (dp > 1 ? 3 : 1); ++sharding) {  // none, ZeRO-1, FSDP
                  if (sharding == 2 && pp > 1) continue;
                  TrainingShape shape;
                  parallel::ParallelConfig& parallel = shape.parallel;
                  parallel.tensor_model_parallel_size = tp;
                  parallel.pipeline_model_parallel_size = pp;
                  if (vp > 1) parallel.num_virtual_stages_per_pipeline_rank = vp;
                  parallel.expert_model_parallel_size = ep;
                  parallel.context_parallel_size = cp;
                  parallel.data_parallel_size = dp;
                  parallel.sequence_parallel = tp > 1;
                  parallel.use_distributed_optimizer = sharding == 1;
                  shape.fsdp = sharding == 2;
                  shape.micro_batch_size = mbs;
                  shape.global_batch_size = request.global_batch_size;
                  shape.recompute.granularity = recompute;
                  shape.precision = request.precision;
                  try {
                    shape.validate(m);
                  } catch (const UsageError&) {
                    continue;
                  }
                  ++result.enumerated;
                  PlanCandidate candidate;
                  candidate.shape = shape;
                  candidate.peak_bytes = peak_bytes(m, shape, request.memory);
                  if (static_cast<double>(candidate.peak_bytes) > budget) continue;
                  candidate.prediction = predict_step(m, shape, cluster);
                  const double flops =
                      perf::model_flops(m, request.global_batch_size, perf::FlopsConvention::megatron).total();
                  candidate.mfu =
                      perf::model_flops_utilization(flops, candidate.prediction.step_seconds, peak_flops * request.gpus);
                  fitting.push_back(candidate);
                }
              }
            }
          }
        }
      }
    }
  }
  if (result.enumerated == 0) {
    throw UsageError("--world-size " + std::to_string(request.gpus),
                     "no valid layout of " + m.name + " for a global batch of " +
                         std::to_string(request.global_batch_size) + " sequences");
  }
  result.fitting = static_cast<int64_t>(fitting.size());
  // Fastest first; among equals the one using less memory, then enumeration order.
  std::stable_sort(fitting.begin(), fitting.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    if (a.prediction.tokens_per_second != b.prediction.tokens_per_second) {
      return a.prediction.tokens_per_second > b.prediction.tokens_per_second;
    }
    return a.peak_bytes < b.peak_bytes;
  });
  if (static_cast<int>(fitting.size()) > request.top) fitting.resize(static_cast<size_t>(request.top));
  result.best = std::move(fitting);
  return result;
}

}  // namespace mt::study
